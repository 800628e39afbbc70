//! Summaries and the context view (rule 21): which summary of a session governs, and what
//! it stands for. Pure functions of what a reader holds, shared by every projector and the
//! history checker; the reference model (`testing::model`) writes the same rules again, for
//! clarity.
//!
//! Names: a summary *covers* an entry when the entry's seq is at or below the summary's
//! position for the entry's shard. A summary is *plausible* when everything it covers could
//! have been in the view its writer read: it covers no entry of its own shard at or after
//! itself, and every live record of its session that it covers has a clock below its own (a
//! summariser observes the clock of the view it read, rule 8). It is *trusted* when it is
//! plausible and the reader holds every position it names. The *governing* summary of a
//! session is its live, trusted summary latest in contract order.

use serde::Serialize;

use crate::entry::{Checkpoint, Entry, OrderKey};
use crate::ids::{Seq, ShardId};

/// What an agent sends its model for one session: the governing summary and every live
/// record it does not cover, in contract order (rule 21).
#[derive(Clone, Debug, PartialEq)]
pub struct ContextView {
    /// Every live record of the session the governing summary does not cover, in contract
    /// order, and the governing summary (if any) in the place of the newest record it covers
    /// (its own place when it covers none). Summaries that do not govern are left out; what
    /// they cover and the governing one does not is here, raw.
    pub entries: Vec<Entry>,
    /// The governing summary's position in the order.
    pub summary: Option<OrderKey>,
    /// Live records of the session the governing summary stands for (not in `entries`).
    pub covered: u64,
}

/// The order keys of a context view: what [`ContextView`] holds, without bodies; the same
/// for every backend and replica that holds the same entries (rule 9).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ContextKeys {
    /// The governing summary.
    pub summary: Option<OrderKey>,
    /// The keys of the view's entries, in the view's order.
    pub keys: Vec<OrderKey>,
    /// Live records the governing summary stands for.
    pub covered: u64,
}

/// Refuse a batch whose summaries cover a position past `held` (what the store holds, as a
/// fresh view saw it): no reader was ever given such a position (rule 21). `InvalidInput`
/// on field `covers`, naming the record; before anything is written.
pub fn check_covers_held(records: &[crate::record::Record], held: &Checkpoint) -> crate::error::Result<()> {
    for (i, r) in records.iter().enumerate() {
        if let Some((shard, seq)) = r.covers.as_ref().and_then(|c| c.first_beyond(held)) {
            return Err(crate::error::Error::invalid(
                "covers",
                Some(i),
                format!(
                    // Not how far the shard is: a reader of one bot learns no writer's volume.
                    "names seq {seq} of shard {shard}, past what the store holds: not a position of this store"
                ),
            ));
        }
    }
    Ok(())
}

/// Whether `covers` covers the entry at `key`.
pub fn covers(covers: &Checkpoint, key: &OrderKey) -> bool {
    key.seq <= covers.get(key.shard)
}

/// Why a summary is implausible: the first thing it covers that its writer cannot have
/// read. `None` when it is plausible. `live` is the session's live records, in order.
pub fn implausible(summary: &OrderKey, coverage: &Checkpoint, live: &[OrderKey]) -> Option<Implausible> {
    implausible_within(summary, coverage, live, &|_, _| true)
}

/// [`implausible`] in a view composed of several sessions' records (rule 25), where
/// `reach(summary, entry)` says whether the summary can cover the entry at all: a summary
/// inherited from a session a fork continues does not reach the fork's own records.
pub fn implausible_within(
    summary: &OrderKey,
    coverage: &Checkpoint,
    live: &[OrderKey],
    reach: &dyn Fn(&OrderKey, &OrderKey) -> bool,
) -> Option<Implausible> {
    if coverage.get(summary.shard) >= summary.seq {
        return Some(Implausible::CoversItself);
    }
    // `live` is in order, which starts with the clock: only records from the first whose
    // clock is not below the summary's on can be covered and too new.
    let from = live.partition_point(|k| k.hlc < summary.hlc);
    live[from..]
        .iter()
        .find(|k| *k != summary && reach(summary, k) && covers(coverage, k))
        .map(|k| Implausible::CoversLater(*k))
}

/// What makes a summary implausible.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Implausible {
    /// It covers itself or a later entry of its own shard.
    CoversItself,
    /// It covers this live record, whose clock is not below its own.
    CoversLater(OrderKey),
}

/// Whether a summary may govern: plausible, and every position it names is held
/// (`position`: the highest seq the reader holds of a shard).
pub fn trusted(
    summary: &OrderKey,
    coverage: &Checkpoint,
    position: impl Fn(ShardId) -> Seq,
    live: &[OrderKey],
) -> bool {
    coverage.0.iter().all(|(shard, seq)| *seq <= position(*shard)) && implausible(summary, coverage, live).is_none()
}

/// The context view's keys for a session whose live records are `live` (contract order),
/// of which `is_summary` says which are summaries, given a way to read a summary's coverage.
/// The governing summary is the latest trusted one; summaries are read latest first, until
/// one is trusted.
pub fn select<E>(
    live: &[OrderKey],
    is_summary: impl Fn(&OrderKey) -> bool,
    position: impl Fn(ShardId) -> Seq,
    coverage: impl FnMut(&OrderKey) -> Result<Option<Checkpoint>, E>,
) -> Result<(ContextKeys, Option<Checkpoint>), E> {
    select_within(live, is_summary, position, coverage, &|_, _| true)
}

/// [`select`] in a view composed of several sessions' records (rule 25): `reach(summary,
/// entry)` says whether the summary can cover the entry at all ([`implausible_within`]).
pub fn select_within<E>(
    live: &[OrderKey],
    is_summary: impl Fn(&OrderKey) -> bool,
    position: impl Fn(ShardId) -> Seq,
    mut coverage: impl FnMut(&OrderKey) -> Result<Option<Checkpoint>, E>,
    reach: &dyn Fn(&OrderKey, &OrderKey) -> bool,
) -> Result<(ContextKeys, Option<Checkpoint>), E> {
    let mut governing = None;
    for k in live.iter().rev().filter(|k| is_summary(k)) {
        if let Some(c) = coverage(k)?
            && c.0.iter().all(|(shard, seq)| *seq <= position(*shard))
            && implausible_within(k, &c, live, reach).is_none()
        {
            governing = Some((*k, c));
            break;
        }
    }
    let mut view = ContextKeys::default();
    // The summary stands in for what it covers: in the place of the newest of it.
    let mut place = None;
    for k in live {
        match &governing {
            Some((g, _)) if g == k => place = place.or(Some(view.keys.len())),
            _ if is_summary(k) => {}
            Some((g, c)) if reach(g, k) && covers(c, k) => {
                view.covered += 1;
                place = Some(view.keys.len());
            }
            _ => view.keys.push(*k),
        }
    }
    if let (Some((g, _)), Some(at)) = (&governing, place) {
        view.keys.insert(at, *g);
    }
    view.summary = governing.as_ref().map(|(k, _)| *k);
    Ok((view, governing.map(|(_, c)| c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hlc::Hlc;

    fn key(shard: u8, seq: u64, hlc: u64) -> OrderKey {
        OrderKey {
            hlc: Hlc(hlc),
            shard: ShardId::from_bytes([shard; 16]),
            seq,
            epoch: 1,
        }
    }

    fn cp(pairs: &[(u8, u64)]) -> Checkpoint {
        Checkpoint(pairs.iter().map(|(s, q)| (ShardId::from_bytes([*s; 16]), *q)).collect())
    }

    /// A chain: the later summary governs; records past its coverage stay; the earlier
    /// summary is left out.
    #[test]
    fn the_latest_trusted_summary_governs() {
        let live = [
            key(1, 1, 10),
            key(1, 2, 20),
            key(2, 1, 25),
            key(1, 3, 30),
            key(1, 4, 40),
            key(1, 5, 50),
        ];
        let summaries = [live[2], live[4]];
        let coverage = |k: &OrderKey| -> Result<Option<Checkpoint>, ()> {
            Ok(Some(if *k == live[2] {
                cp(&[(1, 2)])
            } else {
                cp(&[(1, 3), (2, 1)])
            }))
        };
        let (view, c) = select(&live, |k| summaries.contains(k), |_| 9, coverage).unwrap();
        assert_eq!(view.summary, Some(live[4]));
        assert_eq!(view.keys, vec![live[4], live[5]]);
        assert_eq!(view.covered, 3);
        assert_eq!(c, Some(cp(&[(1, 3), (2, 1)])));
        // Without the reader holding shard 1 up to 3, the later one is not trusted.
        let (view, _) = select(
            &live,
            |k| summaries.contains(k),
            |s| if s.as_bytes()[0] == 1 { 2 } else { 9 },
            coverage,
        )
        .unwrap();
        assert_eq!(view.summary, Some(live[2]));
        // It stands where the newest record it covers (1:2) stood.
        assert_eq!(view.keys, vec![live[2], live[3], live[5]]);
    }

    /// A summary covering a record whose clock is not below its own, or itself, is not
    /// trusted: everything shows raw.
    #[test]
    fn an_implausible_summary_does_not_govern() {
        let live = [key(1, 1, 10), key(1, 2, 50), key(2, 1, 60)];
        let s = live[1];
        let (view, _) = select(&live, |k| *k == s, |_| 9, |_| Ok::<_, ()>(Some(cp(&[(1, 1), (2, 1)])))).unwrap();
        assert_eq!(view.summary, None);
        assert_eq!(
            view.keys,
            vec![live[0], live[2]],
            "no summary governs; the summary itself is left out"
        );
        assert_eq!(
            implausible(&s, &cp(&[(2, 1)]), &live),
            Some(Implausible::CoversLater(live[2]))
        );
        // A record with the summary's own clock, ordered before it by shard, is too new.
        let same = [key(0, 1, 50), s];
        assert_eq!(
            implausible(&s, &cp(&[(0, 1)]), &same),
            Some(Implausible::CoversLater(same[0]))
        );
        assert_eq!(implausible(&s, &cp(&[(1, 2)]), &live), Some(Implausible::CoversItself));
        assert_eq!(implausible(&s, &cp(&[(1, 1)]), &live), None);
    }
}
