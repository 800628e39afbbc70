//! A projector generic over how a backend reads its entries: the backend supplies the
//! scanning ([`IndexSource`]); the projection's rules live in the index, once.

use async_trait::async_trait;

pub use crate::backend::index::CatchUp;
use crate::backend::index::{ProjectionIndex, RowRef, SummarisedSession};
use crate::backend::snapshot::{self, Rejected};
use crate::context::{self, ContextView};
use crate::entry::{Checkpoint, Entry, OrderKey, SessionSummary};
use crate::error::{Result, Written, with_deadline};
use crate::hlc::Hlc;
use crate::ids::IdScope;
use crate::options::{RefreshReport, SnapshotReport, StoreOptions};
use crate::projection::{Projection, ProjectionStats};
use crate::record::Kind;
use crate::traits::Projector;

/// Where a backend keeps projection snapshots (rule 17): a few named blobs and the store's
/// identity. The snapshot's format and every check it passes live in the core
/// ([`snapshot`]); a backend only stores bytes.
#[async_trait]
pub trait SnapshotBlobs: Send + Sync + 'static {
    /// The identity snapshots of this store are bound to; with `create`, made (and stored)
    /// if the store has none yet. `None`: the store has none.
    async fn store_identity(&self, create: bool) -> Result<Option<String>>;

    /// The names of the stored snapshots, newest first.
    async fn snapshot_names(&self) -> Result<Vec<String>>;

    /// The bytes of the snapshot called `name`; `None` if it is gone (a newer one replaced it).
    async fn read_snapshot(&self, name: &str) -> Result<Option<Vec<u8>>>;

    /// Store a snapshot, then drop all but the newest [`snapshot::KEEP`].
    async fn put_snapshot(&self, bytes: Vec<u8>) -> Result<()>;
}

/// How a backend feeds its projector: scanning (catch-up, fetch, the cursor a snapshot
/// keeps), over a store that also keeps snapshot blobs.
#[async_trait]
pub trait IndexSource: SnapshotBlobs {
    /// Where the last catch-up stopped, beyond what the index's own checkpoint says.
    type Cursor: Default + Send + Sync + 'static;

    /// Apply every entry past `cursor` to `index` and advance `cursor`. If this fails or is
    /// cancelled, `cursor` and `index` must still agree (both advanced, the index holding
    /// every entry up to where the cursor resumes; or both reset to their defaults): an
    /// entry below the cursor that the index lacks is never read again.
    async fn catch_up(&self, cursor: &mut Self::Cursor, index: &mut ProjectionIndex) -> Result<CatchUp>;

    /// Full entries for `keys`, in the same order, each with the location the backend gave
    /// its row. `cursor` is the state the keys were indexed with.
    async fn fetch(&self, cursor: &Self::Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>>;

    /// The store's options: the deadline of one operation, whether a first scan may start
    /// from a snapshot, the clock a snapshot is dated by.
    fn options(&self) -> &StoreOptions;

    /// Which ids are one record in the store now: what its format says (rule 22), read
    /// again on every refresh (another process may have upgraded the store meanwhile); and
    /// refused when the store moved to a format this build does not read.
    async fn id_scope(&self) -> Result<IdScope>;

    /// What a snapshot keeps of `cursor` (beyond the index's own per-shard positions).
    fn save_cursor(&self, cursor: &Self::Cursor) -> Vec<u8>;

    /// The cursor `save_cursor` saved, ready for a catch-up from the snapshot's index; or
    /// why it cannot be (it names data that is gone).
    async fn resume_cursor(&self, saved: &[u8]) -> std::result::Result<Self::Cursor, Rejected>;
}

/// Most steps one session's view is composed of (rule 25): itself and the sessions its
/// forks continue, 64 in all; what a deeper fork would inherit is not in the view.
pub const MAX_FORK_DEPTH: u32 = 64;

/// A session's view as [`IndexedProjector::composed`] makes it.
struct Composed {
    session: SummarisedSession,
    /// Which step of the composition each record and summary came from; `None`: the
    /// session has no link entry (every one is its own, step 0).
    levels: Option<std::collections::HashMap<OrderKey, u32>>,
}

/// The position a fork at `fork` inherits at, for a reader as of `at` (`None`: now): the
/// fork's `position` met with `at`, and below the fork record in its own shard (rule 25).
pub fn inherited_position(position: &Checkpoint, at: Option<&Checkpoint>, fork: &OrderKey) -> Checkpoint {
    Checkpoint(
        position
            .0
            .iter()
            .map(|(shard, seq)| {
                let mut seq = *seq;
                if let Some(at) = at {
                    seq = seq.min(at.get(*shard));
                }
                if *shard == fork.shard {
                    seq = seq.min(fork.seq.saturating_sub(1));
                }
                (*shard, seq)
            })
            .filter(|(_, seq)| *seq > 0)
            .collect(),
    )
}

/// A [`Projector`] over any [`IndexSource`].
pub struct IndexedProjector<S: IndexSource> {
    source: std::sync::Arc<S>,
    cursor: S::Cursor,
    index: ProjectionIndex,
    scanned: bool,
}

impl<S: IndexSource> IndexedProjector<S> {
    /// A projector over `source`; its first refresh is a first scan.
    pub fn new(source: std::sync::Arc<S>) -> Self {
        IndexedProjector {
            source,
            cursor: S::Cursor::default(),
            index: ProjectionIndex::new(),
            scanned: false,
        }
    }

    /// The source (`backend::history`).
    pub(crate) fn source(&self) -> &S {
        &self.source
    }

    /// The index (`backend::history`).
    pub(crate) fn index(&self) -> &ProjectionIndex {
        &self.index
    }

    /// The index, for a history check that adds the entries it read (`backend::history`).
    pub(crate) fn index_mut(&mut self) -> &mut ProjectionIndex {
        &mut self.index
    }

    async fn ensure_scanned(&mut self) -> Result<()> {
        if !self.scanned {
            self.refresh().await?;
        }
        Ok(())
    }

    /// Start from the newest stored snapshot that passes every check (rule 17): its index and
    /// cursor replace the empty ones, and the catch-up that follows reads only what is past
    /// them. Returns when it was taken; `None` (a full scan follows) when there is none or
    /// none is usable — each refusal logged with its reason, never an error: a snapshot
    /// only ever saves work.
    async fn load_snapshot(&mut self) -> Option<u64> {
        let source = self.source.clone();
        let timeout = source.options().timeout;
        // The identity and the list at once: on an object store each is a round trip.
        let listed = with_deadline("read snapshots", timeout, None, Written::Nothing, async {
            let (id, names) = tokio::try_join!(source.store_identity(false), source.snapshot_names())?;
            Ok(id.map(|id| (id, names)))
        })
        .await;
        let (id, names) = match listed {
            Ok(Some(found)) => found,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e, "projection snapshots could not be listed; scanning in full");
                return None;
            }
        };
        for name in names {
            let read = with_deadline(
                "read a snapshot",
                timeout,
                None,
                Written::Nothing,
                source.read_snapshot(&name),
            )
            .await;
            let bytes = match read {
                Ok(Some(b)) => b,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(snapshot = %name, error = %e, "a projection snapshot could not be read");
                    continue;
                }
            };
            let loaded = match snapshot::decode(bytes, &id) {
                Ok(l) => l,
                Err(why) => {
                    tracing::warn!(snapshot = %name, %why, "a projection snapshot was not used");
                    continue;
                }
            };
            // Saved before the store's format changed how ids group (rule 22).
            if loaded.index.scope() != self.index.scope() {
                tracing::warn!(snapshot = %name, "a projection snapshot of another id grouping was not used");
                continue;
            }
            // Resuming may read storage (Lance reopens the versions the cursor pins).
            let resumed = with_deadline("resume from a snapshot", timeout, None, Written::Nothing, async {
                Ok(source.resume_cursor(&loaded.cursor).await)
            })
            .await;
            match resumed {
                Ok(Ok(cursor)) => {
                    self.index = loaded.index;
                    self.cursor = cursor;
                    return Some(loaded.taken_millis);
                }
                Ok(Err(why)) => tracing::warn!(snapshot = %name, %why, "a projection snapshot was not used"),
                Err(e) => tracing::warn!(snapshot = %name, error = %e, "a projection snapshot could not be resumed"),
            }
        }
        None
    }

    pub(crate) async fn fetch(&self, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        with_deadline(
            "read entries",
            self.source.options().timeout,
            None,
            Written::Nothing,
            self.source.fetch(&self.cursor, keys),
        )
        .await
    }

    /// A session's view as rule 25 composes it, now or as of `at` (rule 24): its own live
    /// records but its links, then, if a live fork is among those links (the first in
    /// contract order), the view of the session it continues as of the fork's position —
    /// met with `at`, and short of the fork record itself, so that every step reads less
    /// and a chain of forks ends — less every record its hides (and those of every session
    /// between) leave out; merged into contract order. `levels` says which step each
    /// record and summary came from (0: the session's own), so that a summary reaches only
    /// its own step's records and those it inherited (rule 25). A session without any link
    /// entry is its own records, read without a body.
    async fn composed(&mut self, bot_id: &str, session_id: &str, at: Option<&Checkpoint>) -> Result<Composed> {
        self.scanned_up_to(at).await?;
        let mut part = self.index.session_with_summaries_at(bot_id, session_id, at);
        if part.links.is_empty() {
            return Ok(Composed {
                session: part,
                levels: None,
            });
        }
        let mut out = SummarisedSession::default();
        let mut levels: std::collections::HashMap<OrderKey, u32> = std::collections::HashMap::new();
        let mut hidden: std::collections::HashSet<OrderKey> = std::collections::HashSet::new();
        let mut level_at = at.cloned();
        for level in 0u32.. {
            let link_keys: Vec<(OrderKey, RowRef)> =
                part.keys.iter().filter(|(k, _)| part.is_link(k)).copied().collect();
            let links = self.fetch(&link_keys).await?;
            for (k, r) in part
                .keys
                .iter()
                .filter(|(k, _)| !part.is_link(k) && !hidden.contains(k))
            {
                // A record met again (a chain that comes back to a session) keeps its first
                // step.
                if let std::collections::hash_map::Entry::Vacant(v) = levels.entry(*k) {
                    v.insert(level);
                    out.keys.push((*k, *r));
                }
            }
            // Which entries are summaries; a summary's step is the one it is live at (set
            // above): one that is not live here may be live at a later step, as of an
            // earlier position (the winner as of a position is the first put held there).
            out.summaries
                .extend(part.summaries.iter().filter(|k| !hidden.contains(k)));
            let mut fork = None;
            for e in &links {
                match (e.record.kind, e.record.link_target()) {
                    (Kind::Hide, Some(id)) => hidden.extend(self.index.put_keys(bot_id, id)),
                    (Kind::Fork, Some(from)) if fork.is_none() => {
                        fork = e.record.covers.as_ref().map(|p| (e.key(), from.to_owned(), p.clone()));
                    }
                    _ => {}
                }
            }
            let Some((key, from, position)) = fork else { break };
            // A chain inherits through at most this many forks: deeper ones add nothing.
            if level + 1 >= MAX_FORK_DEPTH {
                break;
            }
            let next = inherited_position(&position, level_at.as_ref(), &key);
            part = self.index.session_with_summaries_at(bot_id, &from, Some(&next));
            level_at = Some(next);
        }
        out.keys.sort_by_key(|k| k.0);
        out.summaries.sort();
        out.summaries.dedup();
        Ok(Composed {
            session: out,
            levels: Some(levels),
        })
    }

    /// A page of a session's live records, now or as of `at` (rule 24).
    async fn page(
        &mut self,
        bot_id: &str,
        session_id: &str,
        at: Option<&Checkpoint>,
        after: Option<&OrderKey>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool)> {
        let mut keys = self.composed(bot_id, session_id, at).await?.session.keys;
        if let Some(after) = after {
            keys.retain(|(k, _)| k > after);
        }
        let more = keys.len() > limit;
        keys.truncate(limit);
        Ok((self.fetch(&keys).await?, more))
    }

    /// A bot's sessions with a live entry of their own, now or as of `at`, each with its own
    /// records (rule 25: links and what a fork inherits are not counted): from the index
    /// alone, whatever the forks, reading no body.
    async fn sessions_of(&mut self, bot_id: &str, at: Option<&Checkpoint>) -> Result<Vec<SessionSummary>> {
        self.scanned_up_to(at).await?;
        let mut out = Vec::new();
        for s in self.index.sessions_at(bot_id, at) {
            if !self.index.has_links(bot_id, &s.session_id) {
                out.push(s);
                continue;
            }
            let own = self.index.session_with_summaries_at(bot_id, &s.session_id, at);
            let records: Vec<OrderKey> = own.keys.iter().map(|(k, _)| *k).filter(|k| !own.is_link(k)).collect();
            out.push(SessionSummary {
                records: records.len() as u64,
                first_hlc: records.iter().map(|k| k.hlc).min(),
                last_hlc: records.iter().map(|k| k.hlc).max(),
                ..s
            });
        }
        Ok(out)
    }

    /// Scanned, and holding `at` if given: a read as of a position this projector does not
    /// hold is refused (rule 24), since it would answer with less than that position's
    /// reader saw.
    async fn scanned_up_to(&mut self, at: Option<&Checkpoint>) -> Result<()> {
        self.ensure_scanned().await?;
        at.map_or(Ok(()), |at| self.check_held(at))
    }

    /// [`IndexedProjector::scanned_up_to`]'s refusal.
    fn check_held(&self, at: &Checkpoint) -> Result<()> {
        match at.0.iter().find(|(shard, seq)| **seq > self.index.position(**shard)) {
            None => Ok(()),
            Some((shard, seq)) => Err(crate::Error::invalid(
                "at",
                None,
                format!(
                    "names seq {seq} of shard {shard}, past what this reader holds: refresh, or not a position of this store"
                ),
            )),
        }
    }

    /// The context view of rule 21, now or as of `at` (rule 24).
    async fn context_of(&mut self, bot_id: &str, session_id: &str, at: Option<&Checkpoint>) -> Result<ContextView> {
        // Sorted vectors, no hashing: a long session has thousands of live records.
        let Composed { session, levels } = self.composed(bot_id, session_id, at).await?;
        let level = |k: &OrderKey| levels.as_ref().and_then(|l| l.get(k).copied()).unwrap_or(0);
        let reach = |s: &OrderKey, k: &OrderKey| level(k) >= level(s);
        // What the reader holds: the index's positions, or exactly `at`.
        let index = &self.index;
        let held = |s| at.map_or_else(|| index.position(s), |at| at.get(s));
        let live: Vec<OrderKey> = session.keys.iter().map(|(k, _)| *k).collect();
        let row = |k: &OrderKey| (*k, session.row(k).unwrap_or_default());
        // The summaries, latest first, until one is trusted: usually the first. Everything
        // after a summary in the order is newer than it, so none of it is covered: it is
        // read with the summary, in one read (a round trip on object storage).
        let mut read: std::collections::HashMap<OrderKey, Entry> = std::collections::HashMap::new();
        for (i, k) in live.iter().enumerate().rev().filter(|(_, k)| session.is_summary(k)) {
            let wanted: Vec<(OrderKey, RowRef)> = live[i..]
                .iter()
                .filter(|k| !read.contains_key(k) && (*k == &live[i] || !session.is_summary(k)))
                .map(row)
                .collect();
            for e in self.fetch(&wanted).await? {
                read.insert(e.key(), e);
            }
            let trusted = read.get(k).and_then(|e| e.record.covers.as_ref()).is_some_and(|c| {
                c.0.iter().all(|(shard, seq)| *seq <= held(*shard))
                    && context::implausible_within(k, c, &live, &reach).is_none()
            });
            if trusted {
                break;
            }
        }
        let (view, _) = context::select_within(
            &live,
            |k| session.is_summary(k),
            held,
            |k| Ok::<_, std::convert::Infallible>(read.get(k).and_then(|e| e.record.covers.clone())),
            &reach,
        )
        .unwrap_or_else(|never| match never {});
        // What is still to read: uncovered records older than the summary (appended by
        // writers it had not read), or everything when no summary governs.
        let rest: Vec<(OrderKey, RowRef)> = view.keys.iter().filter(|k| !read.contains_key(k)).map(row).collect();
        for e in self.fetch(&rest).await? {
            read.insert(e.key(), e);
        }
        let entries = view
            .keys
            .iter()
            .map(|k| {
                read.remove(k).ok_or_else(|| crate::Error::Corrupt {
                    shard: Some(k.shard),
                    what: format!("entry seq {} epoch {} is indexed but was not read", k.seq, k.epoch),
                })
            })
            .collect::<Result<Vec<Entry>>>()?;
        Ok(ContextView {
            entries,
            summary: view.summary,
            covered: view.covered,
        })
    }
}

#[async_trait]
impl<S: IndexSource> Projector for IndexedProjector<S> {
    async fn refresh(&mut self) -> Result<RefreshReport> {
        let timeout = self.source.options().timeout;
        let source = self.source.clone();
        let mut first_scan = !self.scanned;
        // Until this refresh completes, the projector counts as not scanned: a source may
        // reset the index when a catch-up fails or is cancelled (rather than leave it torn),
        // and the next read must then scan again instead of answering from an empty index;
        // a refresh abandoned at any await (the format's read too) makes the next read
        // refresh.
        self.scanned = false;
        // The store's format decides which ids are one record. An index built under another
        // grouping (the store was upgraded meanwhile, rule 22) answers nothing more: start
        // again with a first scan.
        let scope = with_deadline("refresh", timeout, None, Written::Nothing, source.id_scope()).await?;
        if scope != self.index.scope() {
            self.index = ProjectionIndex::scoped(scope);
            self.cursor = S::Cursor::default();
            first_scan = true;
        }
        let mut from_snapshot = None;
        if first_scan && self.index.entries() == 0 && self.source.options().read_snapshots {
            from_snapshot = self.load_snapshot().await;
        }
        let result = with_deadline(
            "refresh",
            timeout,
            None,
            Written::Nothing,
            source.catch_up(&mut self.cursor, &mut self.index),
        )
        .await;
        let done = result?;
        self.scanned = true;
        Ok(RefreshReport {
            entries_read: done.read,
            new_entries: done.applied,
            first_scan,
            from_snapshot,
        })
    }

    async fn session(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>> {
        let keys = self.composed(bot_id, session_id, None).await?.session.keys;
        self.fetch(&keys).await
    }

    async fn get(&mut self, bot_id: &str, id: &str) -> Result<Option<Entry>> {
        self.ensure_scanned().await?;
        match self.index.live(bot_id, id) {
            None => Ok(None),
            Some(key) => Ok(self.fetch(&[key]).await?.pop()),
        }
    }

    async fn session_page(
        &mut self,
        bot_id: &str,
        session_id: &str,
        after: Option<&OrderKey>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool)> {
        self.page(bot_id, session_id, None, after, limit).await
    }

    async fn session_page_at(
        &mut self,
        bot_id: &str,
        session_id: &str,
        at: &Checkpoint,
        after: Option<&OrderKey>,
        limit: usize,
    ) -> Result<(Vec<Entry>, bool)> {
        self.page(bot_id, session_id, Some(at), after, limit).await
    }

    async fn context_at(&mut self, bot_id: &str, session_id: &str, at: &Checkpoint) -> Result<ContextView> {
        self.context_of(bot_id, session_id, Some(at)).await
    }

    async fn sessions_at(&mut self, bot_id: &str, at: &Checkpoint) -> Result<Vec<SessionSummary>> {
        self.sessions_of(bot_id, Some(at)).await
    }

    async fn view_keys(&mut self, bot_id: &str, session_id: &str, at: Option<&Checkpoint>) -> Result<Vec<OrderKey>> {
        let keys = self.composed(bot_id, session_id, at).await?.session.keys;
        Ok(keys.into_iter().map(|(k, _)| k).collect())
    }

    async fn own_entries(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>> {
        self.ensure_scanned().await?;
        let keys = self.index.session_keys(bot_id, session_id);
        self.fetch(&keys).await
    }

    async fn session_tail(&mut self, bot_id: &str, session_id: &str, n: usize) -> Result<(Vec<Entry>, bool)> {
        let mut keys = self.composed(bot_id, session_id, None).await?.session.keys;
        let older = keys.len() > n;
        let tail = keys.split_off(keys.len().saturating_sub(n));
        Ok((self.fetch(&tail).await?, older))
    }

    async fn context(&mut self, bot_id: &str, session_id: &str) -> Result<ContextView> {
        self.context_of(bot_id, session_id, None).await
    }

    fn live_key(&self, bot_id: &str, id: &str) -> Option<OrderKey> {
        self.index.live(bot_id, id).map(|(key, _)| key)
    }

    async fn sessions(&mut self, bot_id: &str) -> Result<Vec<SessionSummary>> {
        self.sessions_of(bot_id, None).await
    }

    async fn save_snapshot(&mut self) -> Result<SnapshotReport> {
        self.ensure_scanned().await?;
        let source = self.source.clone();
        let timeout = source.options().timeout;
        let id = with_deadline("save a snapshot", timeout, None, Written::Nothing, async {
            Ok(source.store_identity(true).await?.unwrap_or_default())
        })
        .await?;
        let taken_millis = source.options().clock.now_millis();
        let cursor = source.save_cursor(&self.cursor);
        let bytes = snapshot::encode(&mut self.index, &id, cursor, taken_millis);
        let report = SnapshotReport {
            entries: self.index.entries(),
            bytes: bytes.len() as u64,
            taken_millis,
        };
        with_deadline(
            "save a snapshot",
            timeout,
            None,
            Written::Unknown,
            source.put_snapshot(bytes),
        )
        .await?;
        Ok(report)
    }

    fn stats(&self) -> ProjectionStats {
        self.index.stats()
    }

    fn checkpoint(&self) -> Checkpoint {
        self.index.checkpoint()
    }

    fn projection(&self) -> Projection {
        self.index.projection()
    }

    fn max_hlc(&self) -> Hlc {
        self.index.max_hlc()
    }
}
