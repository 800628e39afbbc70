//! Rules 1–2: durable acknowledgement, atomic batches.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 1–2: durable acknowledgement, atomic batches";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(durable_ack_visible_to_new_readers),
        case!(atomic_batch_all_or_nothing),
        case!(atomic_batch_never_half_visible),
    ]
}

// ---- Rule 1: durable ack -------------------------------------------------------------

/// An acknowledged append is visible to a projector that refreshes and to a store opened
/// afterwards, with every field intact.
pub async fn durable_ack_visible_to_new_readers(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut reader = store.projector();
    reader.refresh().await?;
    ensure!(reader.stats().entries == 0, "a new store is empty");

    let mut batch = recs("a", "s1", 9);
    let mut binary = rec("a-bin", "s1", "");
    binary.body = Body::Bytes(vec![0, 159, 146, 150, 255]);
    binary.content_type = "application/octet-stream".into();
    binary.metadata = Some(serde_json::json!({"tool": "camera", "n": [1, 2.5, null]}));
    binary.created_at = Some(chrono::DateTime::from_timestamp_nanos(1_780_000_000_123_456_789));
    batch.push(binary);
    let mut shard = store.open_shard(&w("w1")).await?;
    let ack = shard.append(batch.clone()).await?;
    ensure!(
        ack.first_seq == 1 && ack.last_seq == 10,
        "seqs start at 1 and are dense: {ack:?}"
    );
    ensure!(ack.ids == ids_of(&batch), "the ack lists the ids in order");

    reader.refresh().await?;
    let view = reader.session("bot", "s1").await?;
    ensure!(view.len() == 10, "a refreshing reader sees the ack: {}", view.len());

    let other = ctx.store().await?;
    let view = other.projector().session("bot", "s1").await?;
    let got: Vec<Record> = view.iter().map(|e| e.record.clone()).collect();
    ensure!(got == batch, "a new reader sees exactly what was appended");
    for e in &view {
        ensure!(e.content_hash == e.record.content_hash(), "stored hash matches content");
        ensure!(e.epoch == shard.epoch(), "entries carry the writer's epoch");
    }
    shard.close().await?;
    Ok(())
}

// ---- Rule 2: atomic batch ------------------------------------------------------------

/// A batch with one bad record writes nothing, and consumes no seq.
pub async fn atomic_batch_all_or_nothing(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let mut batch = recs("x", "s1", 6);
    batch[3].session_id.clear();
    match shard.append(batch).await {
        Err(Error::InvalidInput {
            field: "session_id",
            index: Some(3),
            ..
        }) => {}
        other => bail!("expected InvalidInput on session_id of record 3, got {other:?}"),
    }
    let mut p = store.projector();
    p.refresh().await?;
    ensure!(p.stats().entries == 0, "nothing of the bad batch is visible");
    let ack = shard.append(recs("y", "s1", 4)).await?;
    ensure!(ack.first_seq == 1, "the rejected batch consumed no seq: {ack:?}");
    p.refresh().await?;
    ensure!(p.stats().entries == 4);
    Ok(())
}

/// A reader refreshing while batches land sees each batch entirely or not at all.
pub async fn atomic_batch_never_half_visible(ctx: Ctx) -> anyhow::Result<()> {
    const BATCHES: usize = 12;
    const SIZE: usize = 40;
    let store = ctx.store().await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let mut p = store.projector();
    p.refresh().await?; // the reader is open and warm before the first batch
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let (started_tx, mut started_rx) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(async move {
        let mut refreshes = 0u64;
        loop {
            let finished = *done_rx.borrow_and_update();
            p.refresh().await?;
            refreshes += 1;
            started_tx.send_replace(true);
            for s in p.sessions("bot").await? {
                ensure!(
                    s.records == SIZE as u64,
                    "session {} is half visible: {} of {SIZE}",
                    s.session_id,
                    s.records
                );
            }
            if finished {
                return anyhow::Ok((refreshes, p.stats().live));
            }
            tokio::task::yield_now().await;
        }
    });
    // The reader is refreshing before the first batch lands, and gets the chance to run
    // between batches however fast the backend appends.
    bounded(
        "the reader's first refresh",
        ctx.backend.op_timeout,
        started_rx.wait_for(|s| *s),
    )
    .await??;
    for b in 0..BATCHES {
        shard
            .append(recs(&format!("b{b}"), &format!("batch-{b}"), SIZE))
            .await?;
        tokio::task::yield_now().await;
    }
    done_tx.send(true)?;
    let (refreshes, live) = reader.await??;
    ensure!(
        live == (BATCHES * SIZE) as u64,
        "all batches visible at the end: {live}"
    );
    ensure!(refreshes > 1, "the reader ran while batches landed");
    Ok(())
}
