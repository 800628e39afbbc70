//! Rule 10: history checks.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 10: history checks";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(history_checks_find_stale_gap_corrupt),
        case!(conflicts_after_checkpoint),
        case!(a_missing_body_is_corrupt_unless_its_id_has_a_tombstone),
    ]
}

// ---- Rule 10: history checks ---------------------------------------------------------

/// Stale epochs, seq gaps and corrupt entries — injected below the write path — are all
/// reported, exactly as the reference model reports them.
pub async fn history_checks_find_stale_gap_corrupt(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    store.open_shard(&w("w1")).await?.close().await?;
    let mut s = store.open_shard(&w("w1")).await?;
    let epoch = s.epoch();
    ensure!(epoch >= 2);
    let ack = s.append(recs("a", "s", 3)).await?;
    s.close().await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    w2.append(recs("z", "s", 1)).await?;
    w2.close().await?;
    ensure!(
        store.conflict_discovery().conflicts(None).await?.is_empty(),
        "a clean log has no conflicts"
    );

    let shard = w("w1").shard_id();
    let entry = |seq, epoch, record: Record| {
        let content_hash = record.content_hash();
        Entry {
            shard,
            seq,
            epoch,
            hlc: Hlc(ack.last_hlc.0 + seq),
            record,
            content_hash,
            purged: false,
        }
    };
    // A fenced writer's write that landed: epoch below the one at this seq.
    let stale = entry(3, epoch - 1, rec("stale", "s", "late write"));
    // A hole: seqs 4 and 5 missing. Its metadata is intact: checked as stored, it matches.
    let mut with_metadata = rec("gap", "s", "after the hole");
    with_metadata.metadata = Some(serde_json::json!({"z": [1, "x"], "a": {"b": null}}));
    let after_gap = entry(6, epoch, with_metadata);
    // Content that does not match its stored hash: the body, and the metadata.
    let mut corrupt = entry(7, epoch, rec("corrupt", "s", "original"));
    corrupt.record.body = Body::Text("tampered".into());
    let mut tagged = rec("corrupt-metadata", "s", "original");
    tagged.metadata = Some(serde_json::json!({"tag": "original"}));
    let mut corrupt_metadata = entry(8, epoch, tagged);
    corrupt_metadata.record.metadata = Some(serde_json::json!({"tag": "tampered"}));
    // A clock far past any plausible time (a damaged HLC).
    let mut far = entry(9, epoch, rec("far", "s", "from the future"));
    far.hlc = Hlc(u64::MAX - 7);
    for e in [stale, after_gap, corrupt, corrupt_metadata, far] {
        (ctx.backend.inject_raw_entry)(ctx.uri.clone(), e).await?;
    }

    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let entries = all_entries(store.as_ref()).await?;
    ensure!(
        conflicts == model::conflicts(&entries),
        "the checker differs from the model"
    );
    ensure!(
        kinds(&conflicts)
            == vec![
                ConflictKind::StaleEpoch,
                ConflictKind::SeqGap,
                ConflictKind::Corrupt,
                ConflictKind::Corrupt,
                ConflictKind::ImplausibleHlc
            ],
        "expected stale_epoch, seq_gap, corrupt (body), corrupt (metadata), implausible_hlc; got {conflicts:?}"
    );
    // A writer that reads the damaged clock refuses to be dragged to it.
    let mut p = store.projector();
    p.refresh().await?;
    let mut w3 = store.open_shard(&w("w3")).await?;
    match w3.observe(p.max_hlc()) {
        Err(Error::InvalidInput { field: "hlc", .. }) => {}
        other => bail!("observing an HLC far in the future: expected InvalidInput, got {other:?}"),
    }
    let next = w3.append(recs("now", "s", 1)).await?;
    ensure!(next.last_hlc.millis() <= Hlc::PLAUSIBLE_MILLIS, "{next:?}");
    w3.close().await?;
    match &conflicts[1] {
        Conflict::SeqGap {
            missing_from,
            missing_to,
            ..
        } => ensure!((*missing_from, *missing_to) == (4, 5)),
        other => bail!("{other:?}"),
    }
    // After a checkpoint, each of them is reported while an entry it involves is past it
    // (the stale write at 3, the entry after the hole at 6, …): exactly the full check's
    // conflicts that involve newer entries — from a discovery that keeps its index between
    // checks, and from a fresh one per checkpoint.
    let mut kept = store.conflict_discovery();
    let w2_shard = w("w2").shard_id();
    for (seen, involved) in [(0, 5), (2, 5), (3, 4), (5, 4), (6, 3), (7, 2), (8, 1), (9, 0)] {
        let mut cp = Checkpoint::default();
        cp.advance(shard, seen);
        cp.advance(w2_shard, 1);
        let want: Vec<Conflict> = conflicts
            .iter()
            .filter(|c| c.involves_entries_after(&cp))
            .cloned()
            .collect();
        ensure!(want.len() == involved, "after seq {seen}: {want:?}");
        for (how, got) in [
            ("kept", kept.conflicts(Some(&cp)).await?),
            ("fresh", store.conflict_discovery().conflicts(Some(&cp)).await?),
        ] {
            ensure!(
                got == want,
                "after w1 seq {seen}: expected {want:?}, got {got:?} ({how} discovery)"
            );
        }
    }
    Ok(())
}

/// With a checkpoint, only conflicts involving entries past it are reported.
pub async fn conflicts_after_checkpoint(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let a = w1.append(vec![rec("k", "s", "one")]).await?;
    w2.observe(a.last_hlc)?;
    w2.append(vec![rec("k", "s", "two")]).await?;
    let mut p = store.projector();
    p.refresh().await?;
    let checkpoint = p.checkpoint();
    ensure!(
        checkpoint.get(w1.shard_id()) == 1 && checkpoint.get(w2.shard_id()) == 1,
        "{checkpoint:?}"
    );
    let t = w1
        .append(vec![Record::tombstone("j", "bot", "s"), rec("m", "s", "x")])
        .await?;
    w2.observe(t.last_hlc)?;
    w2.append(vec![rec("j", "s", "after delete")]).await?;
    let mut cd = store.conflict_discovery();
    ensure!(kinds(&cd.conflicts(None).await?) == vec![ConflictKind::DivergentPut, ConflictKind::WriteAfterDelete]);
    ensure!(kinds(&cd.conflicts(Some(&checkpoint)).await?) == vec![ConflictKind::WriteAfterDelete]);
    p.refresh().await?;
    ensure!(cd.conflicts(Some(&p.checkpoint())).await?.is_empty());
    Ok(())
}

/// Rules 10 and 16: a row without a body is what a purge leaves of an entry of an id with a
/// tombstone — here in another shard, and below a checkpoint — and is then no conflict;
/// anywhere else (an id without a tombstone: damage that erased a live record's body) it is
/// `Corrupt`, in a full check and after a checkpoint, exactly as the reference model says.
/// A reader cannot tell it from a purge it has not seen yet: it serves it as purged (empty
/// text); the checker is what reports it.
pub async fn a_missing_body_is_corrupt_unless_its_id_has_a_tombstone(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut w1 = store.open_shard(&w("w1")).await?;
    let mut w2 = store.open_shard(&w("w2")).await?;
    let first = w1
        .append(vec![rec("keep", "s", "kept"), rec("forget", "s", "a secret")])
        .await?;
    // The tombstone, in another shard.
    w2.observe(first.last_hlc)?;
    let tombstone = w2.append(vec![Record::tombstone("forget", "bot", "s")]).await?;
    // A late retry of the forgotten put (a write after delete) and another live record.
    w1.observe(tombstone.last_hlc)?;
    let late = w1
        .append(vec![rec("forget", "s", "a secret"), rec("keep-2", "s", "kept too")])
        .await?;
    w1.close().await?;
    w2.close().await?;
    let report = store.purge(&ctxlog_core::PurgeOptions::default()).await?;
    ensure!(
        (report.ids_purged, report.entries_purged) == (1, 3),
        "expected 1 id and 3 entries purged (two puts and the tombstone), got {report:?}"
    );
    let purged = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        kinds(&purged) == vec![ConflictKind::WriteAfterDelete],
        "what a purge leaves is no conflict: expected only the write after delete, got {purged:?}"
    );

    // Damage: a live id's entry whose body is gone (both body columns empty).
    let shard = w("w1").shard_id();
    let record = rec("damaged", "s", "a body that is lost");
    let mut damaged = Entry {
        shard,
        seq: late.last_seq + 1,
        epoch: late.epoch,
        hlc: Hlc(late.last_hlc.0 + 1),
        content_hash: record.content_hash(),
        record,
        purged: false,
    };
    damaged.purge();
    (ctx.backend.inject_raw_entry)(ctx.uri.clone(), damaged.clone()).await?;

    let store = ctx.store().await?;
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let entries = all_entries(store.as_ref()).await?;
    let model = model::conflicts(&entries);
    ensure!(
        conflicts == model,
        "the checker differs from the model: got {conflicts:?}, the model says {model:?}"
    );
    let corrupt: Vec<(&str, u64)> = conflicts
        .iter()
        .filter_map(|c| match c {
            Conflict::Corrupt { id, seq, .. } => Some((id.as_str(), *seq)),
            _ => None,
        })
        .collect();
    ensure!(
        corrupt == vec![("damaged", damaged.seq)],
        "expected exactly the live id's entry without a body corrupt (not the purged ones), got {conflicts:?}"
    );
    ensure!(
        kinds(&conflicts) == vec![ConflictKind::WriteAfterDelete, ConflictKind::Corrupt],
        "expected the write after delete and the corrupt entry, got {conflicts:?}"
    );
    let read = entries
        .iter()
        .find(|e| e.record.id == "damaged")
        .ok_or_else(|| anyhow!("the injected entry is not stored"))?;
    ensure!(
        read.purged && read.record.body == Body::Text(String::new()),
        "expected the entry without a body to read back as purged, empty text: {read:?}"
    );
    let mut p = store.projector();
    let view = p.session("bot", "s").await?;
    ensure!(
        ids(&view) == ["keep", "keep-2", "damaged"],
        "expected the live records keep, keep-2, damaged, got {:?}",
        ids(&view)
    );
    ensure!(
        view[2].purged && view[2].record.body == Body::Text(String::new()),
        "expected the reader to serve the damaged record as purged, empty text, got {:?}",
        view[2]
    );

    // After a checkpoint: the tombstone (w2 seq 1) lies below it, in another shard; the
    // purged retry past it is no conflict but its write after delete, the damaged entry is
    // corrupt. Exactly the full check's conflicts involving entries past it, from a
    // discovery kept between checks and from a fresh one.
    let w2_shard = w("w2").shard_id();
    let mut kept = store.conflict_discovery();
    for (w1_seen, w2_seen, involved) in [
        (0, 0, 2),
        (first.last_seq, 0, 2),
        (first.last_seq, 1, 2),
        (late.first_seq, 1, 1),
        (late.last_seq, 1, 1),
        (damaged.seq, 1, 0),
    ] {
        let mut cp = Checkpoint::default();
        cp.advance(shard, w1_seen);
        cp.advance(w2_shard, w2_seen);
        let want: Vec<Conflict> = conflicts
            .iter()
            .filter(|c| c.involves_entries_after(&cp))
            .cloned()
            .collect();
        ensure!(want.len() == involved, "after {cp:?}: {want:?}");
        for (how, got) in [
            ("kept", kept.conflicts(Some(&cp)).await?),
            ("fresh", store.conflict_discovery().conflicts(Some(&cp)).await?),
        ] {
            ensure!(
                got == want,
                "after {cp:?}: expected {want:?}, got {got:?} ({how} discovery)"
            );
        }
    }
    Ok(())
}
