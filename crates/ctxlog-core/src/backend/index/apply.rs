//! Applying one row: the one place a row changes an id's state, and the one numbering of
//! sessions, shared by the index and its parallel appliers.

use indexmap::map::raw_entry_v1::{RawEntryApiV1, RawEntryMut};

use super::{IdState, Ids, IndexRow, Put, SessionRef, SessionState, Sessions, id_no};
use crate::backend::frozen::Frozen;
use crate::backend::id_state;
use crate::record::Kind;

/// The part of an index a row goes to, and where applying it leaves what the index files
/// later.
pub(super) struct Part<'a, T> {
    /// The ids of the part.
    pub(super) ids: &'a mut Ids,
    /// Which part it is.
    pub(super) no: usize,
    /// The ids a snapshot held.
    pub(super) frozen: &'a Frozen,
    /// Receives the number of a frozen id the row copies into the part.
    pub(super) thawed: &'a mut T,
    /// Receives a new `(session, id number)` pair.
    pub(super) unfiled: &'a mut Vec<(u32, u32)>,
}

/// The one place a row changes an id: `part` is the part that the `hash` of the row's id
/// in `namespace` picked. Returns false when the id already held the row.
pub(super) fn apply_to(
    part: Part<'_, impl Extend<u32>>,
    hash: u64,
    namespace: &str,
    row: &IndexRow<'_>,
    session: u32,
) -> bool {
    let Part {
        ids,
        no: part,
        frozen,
        thawed,
        unfiled,
    } = part;
    let id = row.id;
    // One lookup per row: most ids are new, and a lookup-then-insert would probe twice.
    let (local, state) = match ids
        .raw_entry_mut_v1()
        .from_hash(hash, |k| id_state::is_key(k, namespace, id))
    {
        RawEntryMut::Occupied(e) => (e.index(), e.into_mut()),
        RawEntryMut::Vacant(e) => {
            let local = e.index();
            let key = id_state::key(namespace, id);
            // The first row of an id a snapshot held starts from what the snapshot held.
            let state = match (frozen.len() > 0).then(|| frozen.find(&key)).flatten() {
                Some(b) => {
                    let state = frozen.state(b);
                    let mut sessions: Vec<u32> = state.sessions().collect();
                    sessions.sort_unstable();
                    sessions.dedup();
                    unfiled.extend(sessions.into_iter().map(|s| (s, id_no(local, part))));
                    thawed.extend([b as u32]);
                    state
                }
                None => IdState::default(),
            };
            (local, e.insert_hashed_nocheck(hash, key, state).1)
        }
    };
    if state.has(&row.key) {
        return false;
    }
    match row.kind {
        Kind::Tombstone => state.extra().tombstones.push(row.key),
        // Not a value (rule 27): held for the history checks (seqs, epochs), in no view.
        Kind::Embedding => state.extra().embeddings.push(row.key),
        Kind::Put | Kind::Summary | Kind::Fork | Kind::Hide => {
            let known_here = state.sessions().any(|s| s == session);
            let put = Put {
                key: row.key,
                hash: row.hash,
                session,
                at: row.at,
            };
            match state.winner {
                None => state.winner = Some(put),
                Some(w) if put.key < w.key => {
                    state.extra().others.push(w);
                    state.winner = Some(put);
                }
                Some(_) => state.extra().others.push(put),
            }
            if !known_here {
                unfiled.push((session, id_no(local, part)));
            }
        }
    }
    true
}

/// Where session numbers come from: the index's own sessions, or what a parallel applier
/// sees of them plus the sessions it found.
pub(super) trait Numbering {
    /// The session numbered `no`.
    fn key(&self, no: u32) -> (&str, &str);
    /// The number of a session already numbered.
    fn find(&self, key: &SessionRef<'_>) -> Option<u32>;
    /// Number a new session.
    fn add(&mut self, key: (Box<str>, Box<str>)) -> u32;
}

/// The number of session `(bot_id, session_id)`, one rule for the index and its appliers:
/// rows of one session tend to come together, so the `last` one is tried first; then a
/// lookup by borrowed key, allocating only for a new session.
pub(super) fn session_no(numbers: &mut impl Numbering, last: &mut Option<u32>, bot_id: &str, session_id: &str) -> u32 {
    if let Some(l) = *last
        && numbers.key(l) == (bot_id, session_id)
    {
        return l;
    }
    let no = match numbers.find(&SessionRef(bot_id, session_id)) {
        Some(no) => no,
        None => numbers.add((bot_id.into(), session_id.into())),
    };
    *last = Some(no);
    no
}

impl Numbering for Sessions {
    fn key(&self, no: u32) -> (&str, &str) {
        let ((b, s), _) = self.get_index(no as usize).expect("numbered");
        (b, s)
    }

    fn find(&self, key: &SessionRef<'_>) -> Option<u32> {
        self.get_index_of(key).map(|i| i as u32)
    }

    fn add(&mut self, key: (Box<str>, Box<str>)) -> u32 {
        self.insert_full(key, SessionState::default()).0 as u32
    }
}
