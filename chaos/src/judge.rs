//! The final check's verdict, apart from any I/O: what the writers were promised (their ack
//! logs) against what a fresh reader sees, so that every way a run can fail is tested here
//! on made-up histories.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result};
use ctxlog::{Conflict, ShardId};
use serde_json::{Value, json};

/// Sessions whose name starts with this are written once and then left idle: retention may
/// end them (a maintenance tombstone for each of their records). Every other session is
/// written all the time and must never lose a record.
pub(crate) const COLD: &str = "cold-";
/// The bot of every cold session (and of no other): what `cargo xtask chaos` runs `ctxlog
/// retain --bot` for.
pub(crate) const COLD_BOT: &str = "chaos-cold";

/// One acknowledged batch, as its writer logged it before going on.
#[derive(Clone, Debug)]
pub(crate) struct Ack {
    pub(crate) ids: Vec<String>,
    pub(crate) hashes: Vec<String>,
    pub(crate) session: String,
    /// The shard, as `ShardId`'s display.
    pub(crate) shard: String,
    pub(crate) epoch: u64,
    pub(crate) first_seq: u64,
    pub(crate) last_seq: u64,
}

impl Ack {
    /// An ack line; `None` for a torn last line of a killed writer (never synced, never a
    /// promise).
    pub(crate) fn parse(line: &str) -> Option<Result<Ack>> {
        let v: Value = serde_json::from_str(line).ok()?;
        Some(Self::from_json(&v))
    }

    fn from_json(v: &Value) -> Result<Ack> {
        let strings = |key: &str| -> Result<Vec<String>> {
            v[key]
                .as_array()
                .with_context(|| format!("an ack line without `{key}`"))?
                .iter()
                .map(|s| s.as_str().map(str::to_string).context("a string"))
                .collect()
        };
        let num = |key: &str| v[key].as_u64().with_context(|| format!("an ack line without `{key}`"));
        Ok(Ack {
            ids: strings("ids")?,
            hashes: strings("hashes")?,
            session: v["session"].as_str().context("session")?.to_string(),
            shard: v["shard"].as_str().context("shard")?.to_string(),
            epoch: num("epoch")?,
            first_seq: num("first_seq")?,
            last_seq: num("last_seq")?,
        })
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({"ids": self.ids, "hashes": self.hashes, "session": self.session, "shard": self.shard,
               "epoch": self.epoch, "first_seq": self.first_seq, "last_seq": self.last_seq})
    }
}

/// What a fresh reader found in the store.
#[derive(Default)]
pub(crate) struct Found {
    /// Live id → content hash (hex).
    pub(crate) live: BTreeMap<String, String>,
    /// Ids the maintenance writer tombstoned.
    pub(crate) retained: BTreeSet<String>,
    pub(crate) conflicts: Vec<Conflict>,
    /// Whether a second fresh reader gave the same projection byte for byte.
    pub(crate) readers_identical: bool,
}

/// The verdict on one store: `ok` and the counts behind it.
pub(crate) fn judge(acks: &[Ack], found: &Found) -> Value {
    let mut promised: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for a in acks {
        for (id, hash) in a.ids.iter().zip(&a.hashes) {
            promised.insert(id, (hash, &a.session));
        }
    }
    let (mut lost, mut changed, mut ended) = (Vec::new(), Vec::new(), 0u64);
    for (id, (hash, session)) in &promised {
        match found.live.get(*id) {
            Some(h) if h == hash => {}
            Some(_) => changed.push(id.to_string()),
            // Retention may end a cold session: its ids end by a maintenance tombstone.
            None if session.starts_with(COLD) && found.retained.contains(*id) => ended += 1,
            None => lost.push(id.to_string()),
        }
    }
    let acked_at = |shard: ShardId, seq: u64, epoch: u64| {
        let shard = shard.to_string();
        acks.iter()
            .any(|a| a.shard == shard && a.epoch == epoch && (a.first_seq..=a.last_seq).contains(&seq))
    };
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    let mut unexpected = Vec::new();
    for c in &found.conflicts {
        *by_kind.entry(c.kind().as_str()).or_default() += 1;
        let explained = match c {
            // A fenced writer's write that landed after its successor's claim: never one
            // that was acknowledged (an acknowledged range is never superseded).
            Conflict::StaleEpoch { shard, seq, epoch, .. } => !acked_at(*shard, *seq, *epoch),
            // A retried put of a cold session that retention had already ended.
            Conflict::WriteAfterDelete { id, .. } => {
                found.retained.contains(id) && promised.get(id.as_str()).is_some_and(|(_, s)| s.starts_with(COLD))
            }
            _ => false,
        };
        if !explained {
            unexpected.push(format!("{c:?}"));
        }
    }
    let ok = lost.is_empty() && changed.is_empty() && unexpected.is_empty() && found.readers_identical;
    json!({
        "ok": ok,
        "acked_batches": acks.len(),
        "acked_ids": promised.len(),
        "live_ids": found.live.len(),
        "ended_by_retention": ended,
        "lost": lost.len(),
        "lost_examples": lost.iter().take(10).collect::<Vec<_>>(),
        "changed": changed.len(),
        "changed_examples": changed.iter().take(10).collect::<Vec<_>>(),
        "conflicts": by_kind,
        "unexpected_conflicts": unexpected.iter().take(10).collect::<Vec<_>>(),
        "unexpected_conflict_count": unexpected.len(),
        "readers_identical": found.readers_identical,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxlog::{Hlc, OrderKey, WriterId};

    fn shard() -> ShardId {
        ShardId::for_writer(&WriterId::new("chaos-w0").unwrap())
    }

    fn ack(ids: &[&str], session: &str, epoch: u64, first_seq: u64) -> Ack {
        Ack {
            ids: ids.iter().map(|s| s.to_string()).collect(),
            hashes: ids.iter().map(|s| format!("h-{s}")).collect(),
            session: session.into(),
            shard: shard().to_string(),
            epoch,
            first_seq,
            last_seq: first_seq + ids.len() as u64 - 1,
        }
    }

    /// A store holding exactly what `acks` promised.
    fn faithful(acks: &[Ack]) -> Found {
        Found {
            live: acks
                .iter()
                .flat_map(|a| a.ids.iter().zip(&a.hashes).map(|(i, h)| (i.clone(), h.clone())))
                .collect(),
            readers_identical: true,
            ..Found::default()
        }
    }

    fn key(seq: u64, epoch: u64) -> OrderKey {
        OrderKey {
            hlc: Hlc::ZERO,
            shard: shard(),
            seq,
            epoch,
        }
    }

    #[test]
    fn a_faithful_store_passes_and_an_ack_line_round_trips() {
        let acks = vec![ack(&["a", "b"], "s0", 1, 1), ack(&["c"], "cold-x", 1, 3)];
        let line = acks[0].to_json().to_string();
        let back = Ack::parse(&line).unwrap().unwrap();
        assert_eq!(
            (back.ids, back.shard, back.last_seq),
            (acks[0].ids.clone(), shard().to_string(), 2)
        );
        assert!(Ack::parse("{\"ids\": [\"a\"").is_none(), "a torn line is no promise");
        assert_eq!(judge(&acks, &faithful(&acks))["ok"], true);
    }

    #[test]
    fn a_lost_ack_fails() {
        let acks = vec![ack(&["a", "b"], "s0", 1, 1)];
        let mut found = faithful(&acks);
        found.live.remove("b");
        let v = judge(&acks, &found);
        assert_eq!((v["ok"].clone(), v["lost"].clone()), (json!(false), json!(1)));
    }

    #[test]
    fn a_changed_hash_fails() {
        let acks = vec![ack(&["a"], "s0", 1, 1)];
        let mut found = faithful(&acks);
        found.live.insert("a".into(), "other".into());
        let v = judge(&acks, &found);
        assert_eq!((v["ok"].clone(), v["changed"].clone()), (json!(false), json!(1)));
    }

    #[test]
    fn retention_may_end_only_cold_sessions_and_only_by_a_maintenance_tombstone() {
        let acks = vec![ack(&["hot"], "s0", 1, 1), ack(&["cold"], "cold-w0-1", 1, 2)];
        let mut found = faithful(&acks);
        found.live.remove("cold");
        assert_eq!(judge(&acks, &found)["ok"], false, "gone without a tombstone");
        found.retained.insert("cold".into());
        assert_eq!(judge(&acks, &found)["ok"], true);
        found.live.remove("hot");
        found.retained.insert("hot".into());
        assert_eq!(judge(&acks, &found)["ok"], false, "a hot session was ended");
    }

    #[test]
    fn a_stale_epoch_is_allowed_only_where_nothing_acknowledged_was_superseded() {
        let acks = vec![ack(&["a", "b"], "s0", 1, 1), ack(&["c"], "s0", 2, 3)];
        let mut found = faithful(&acks);
        // The fenced incarnation (epoch 1) wrote seq 3 too, unacknowledged: explained.
        found.conflicts = vec![Conflict::StaleEpoch {
            shard: shard(),
            seq: 3,
            epoch: 1,
            superseded_by: 2,
        }];
        assert_eq!(judge(&acks, &found)["ok"], true);
        // Seq 2 of epoch 1 was acknowledged: superseding it broke a promise.
        found.conflicts = vec![Conflict::StaleEpoch {
            shard: shard(),
            seq: 2,
            epoch: 1,
            superseded_by: 2,
        }];
        assert_eq!(judge(&acks, &found)["ok"], false);
    }

    #[test]
    fn other_conflicts_and_disagreeing_readers_fail() {
        let acks = vec![ack(&["a"], "cold-1", 1, 1)];
        let mut found = faithful(&acks);
        found.conflicts = vec![Conflict::WriteAfterDelete {
            bot_id: "bot".into(),
            id: "a".into(),
            tombstone: key(5, 1),
            entry: key(1, 1),
        }];
        assert_eq!(
            judge(&acks, &found)["ok"],
            false,
            "no maintenance tombstone explains it"
        );
        found.retained.insert("a".into());
        found.live.clear();
        assert_eq!(judge(&acks, &found)["ok"], true);
        found.conflicts = vec![Conflict::SeqGap {
            shard: shard(),
            missing_from: 2,
            missing_to: 3,
        }];
        assert_eq!(judge(&acks, &found)["ok"], false);
        found.conflicts.clear();
        found.readers_identical = false;
        assert_eq!(judge(&acks, &found)["ok"], false);
    }
}
