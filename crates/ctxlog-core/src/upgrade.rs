//! Moving a store written by earlier releases (format 1 or 2, record ids one namespace for
//! the whole store) to format 3, where ids are scoped by bot (rules 6 and 22). Written once
//! over the traits; every backend gets it.
//!
//! The grouping changes no view of a store in which no id is under two bots: the upgrade
//! first reads every entry and lists the ids that are (each such id was one record across
//! bots and becomes one record per bot). With any, it changes nothing unless the caller
//! accepts that those views change; the report names them either way.

use std::collections::{BTreeMap, BTreeSet};

use crate::error::Result;
use crate::traits::Store;

/// The format whose record ids are scoped by bot.
pub const IDS_BY_BOT: u32 = 3;

/// The refusal of a link or embedding by a store whose ids are grouped across bots (format 1
/// or 2): both belong to an id of one bot (rules 25, 27). Nothing written.
pub fn needs_ids_by_bot(format: impl std::fmt::Display) -> crate::Error {
    crate::Error::invalid(
        "kind",
        None,
        format!(
            "a fork, hide or embedding needs a store of format 3 or later (ids scoped by bot); this store is at format {format}: run `ctxlog upgrade` first"
        ),
    )
}

/// Entries read per call while listing ids.
const READ_PAGE: usize = 2_000;

/// Passes over the shards at most: each reads what landed during the one before.
const RESCANS: usize = 8;

/// An id that is under more than one bot: one record before the upgrade, one per bot after.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharedId {
    /// The record id.
    pub id: String,
    /// The bots it is under, sorted.
    pub bots: Vec<String>,
}

/// What an upgrade found and did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct UpgradeReport {
    /// The store's format before.
    pub from: u32,
    /// Its format after.
    pub to: u32,
    /// Ids under more than one bot, sorted: their views change with the upgrade.
    pub shared_ids: Vec<SharedId>,
    /// Entries read.
    pub entries_read: u64,
}

impl UpgradeReport {
    /// Whether the store moved to a new format.
    pub fn upgraded(&self) -> bool {
        self.to != self.from
    }
}

/// Move `store` to format 3 (ids scoped by bot) unless it is there already. When some id is
/// under several bots, the store is left as it is unless `accept_changed_views`; the report
/// lists those ids either way. Run it once every process that writes the store runs this
/// release: an earlier release refuses a store of format 3 when it opens it, and a running
/// one of this release notices at its next refresh (and scans again). What is appended
/// during the upgrade is read by the next pass over the shards, until one finds nothing new;
/// what lands between that pass and the format's change is not (run it when the store is
/// quiet, or accept that window).
pub async fn upgrade_ids_by_bot(store: &dyn Store, accept_changed_views: bool) -> Result<UpgradeReport> {
    let from = store.format().await?;
    let mut report = UpgradeReport {
        from,
        to: from,
        ..Default::default()
    };
    if from >= IDS_BY_BOT {
        return Ok(report);
    }
    let mut bots: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // Read until a pass finds nothing new: an entry written while the upgrade reads (by a
    // process still grouping ids store-wide) is read too, up to the last pass.
    let mut scanned: std::collections::HashMap<crate::ids::ShardId, u64> = std::collections::HashMap::new();
    for _ in 0..RESCANS {
        let mut moved = false;
        for shard in store.shards().await? {
            let mut after = scanned.get(&shard.shard).copied().unwrap_or(0);
            loop {
                let page = store.read_shard(shard.shard, after, READ_PAGE).await?;
                let Some(last) = page.last().map(|e| e.seq) else { break };
                moved = true;
                report.entries_read += page.len() as u64;
                for e in page {
                    bots.entry(e.record.id).or_default().insert(e.record.bot_id);
                }
                after = last;
            }
            scanned.insert(shard.shard, after);
        }
        if !moved {
            break;
        }
    }
    report.shared_ids = bots
        .into_iter()
        .filter(|(_, b)| b.len() > 1)
        .map(|(id, b)| SharedId {
            id,
            bots: b.into_iter().collect(),
        })
        .collect();
    if report.shared_ids.is_empty() || accept_changed_views {
        store.set_format(from, IDS_BY_BOT).await?;
        report.to = IDS_BY_BOT;
    }
    Ok(report)
}
