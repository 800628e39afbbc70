//! Rules 8–9: order, clocks, determinism.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rules 8–9: order, clocks, determinism";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![
        case!(session_order_follows_hlc_across_skew),
        case!(hlc_never_goes_backwards_across_reopen),
        case!(determinism_across_read_orders),
        case!(differential_against_reference_model),
    ]
}

// ---- Rule 8: order -------------------------------------------------------------------

/// A writer whose clock is an hour behind still orders after what it has read.
pub async fn session_order_follows_hlc_across_skew(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let behind = ctx
        .store_with(ctx.options().with_clock(SkewedClock::new(-3_600_000)))
        .await?;
    let mut a = store.open_shard(&w("fast")).await?;
    let mut b = behind.open_shard(&w("slow")).await?;
    a.append(vec![rec("1", "s", "question")]).await?;
    // B reads the session before answering, and moves its clock past what it read.
    let mut p = behind.projector();
    p.refresh().await?;
    b.observe(p.max_hlc())?;
    let b_ack = b
        .append(vec![rec("2", "s", "answer"), rec("3", "s", "follow-up")])
        .await?;
    a.observe(b_ack.last_hlc)?;
    a.append(vec![rec("4", "s", "thanks")]).await?;
    // A writer that does not observe is ordered by its (skewed) clock: first.
    let mut c = behind.open_shard(&w("unaware")).await?;
    c.append(vec![rec("0", "s", "early by its clock")]).await?;

    let view = store.projector().session("bot", "s").await?;
    ensure!(ids(&view) == ["0", "1", "2", "3", "4"], "{:?}", ids(&view));
    for pair in view.windows(2) {
        ensure!(
            pair[0].key() < pair[1].key(),
            "strictly in (hlc, shard, seq, epoch) order"
        );
    }
    Ok(())
}

/// A writer's HLC never goes backwards, also across a reopen with a clock in the past.
pub async fn hlc_never_goes_backwards_across_reopen(ctx: Ctx) -> anyhow::Result<()> {
    let ahead = ctx
        .store_with(ctx.options().with_clock(SkewedClock::new(3_600_000)))
        .await?;
    let mut s = ahead.open_shard(&w("w1")).await?;
    let before = s.append(recs("a", "s", 5)).await?;
    s.close().await?;
    let behind = ctx
        .store_with(ctx.options().with_clock(SkewedClock::new(-3_600_000)))
        .await?;
    let mut s = behind.open_shard(&w("w1")).await?;
    let after = s.append(recs("b", "s", 5)).await?;
    ensure!(
        after.first_hlc > before.last_hlc,
        "{:?} then {:?}",
        before.last_hlc,
        after.first_hlc
    );
    ensure!(after.first_seq == before.last_seq + 1);
    let view = behind.projector().session("bot", "s").await?;
    ensure!(
        view.windows(2).all(|p| p[0].hlc < p[1].hlc),
        "hlc increases along the shard"
    );
    s.close().await?;
    Ok(())
}

// ---- Rule 9: determinism -------------------------------------------------------------

/// The same entries give the same canonical projection and conflicts, whether scanned at
/// once or caught up incrementally, and the same as the reference model.
pub async fn determinism_across_read_orders(ctx: Ctx) -> anyhow::Result<()> {
    let store = ctx.store().await?;
    let mut incremental = store.projector();
    let mut shards = Vec::new();
    for name in ["w3", "w1", "w2"] {
        shards.push(store.open_shard(&w(name)).await?);
    }
    for round in 0..6 {
        for (i, shard) in shards.iter_mut().enumerate() {
            let mut batch = recs(&format!("r{round}w{i}"), &format!("s{}", (round + i) % 3), 3);
            if round % 2 == 1 {
                // a divergent put and a duplicate of ids another shard wrote
                batch.push(rec(format!("r{}w{}-0", round - 1, (i + 1) % 3), "s0", "other"));
                batch.push(rec(
                    format!("r{}w{}-1", round - 1, i),
                    "s1",
                    format!("message 1 of r{}w{i}", round - 1),
                ));
            }
            if round == 4 {
                batch.push(Record::tombstone(format!("r0w{i}-2"), "bot", "s2"));
            }
            shard.append(batch).await?;
            incremental.refresh().await?;
        }
    }
    let mut once = store.projector();
    once.refresh().await?;
    let entries = all_entries(store.as_ref()).await?;
    let model = model::project(&entries).canonical_json();
    ensure!(
        once.projection().canonical_json() == model,
        "first scan differs from the model"
    );
    ensure!(
        incremental.projection().canonical_json() == model,
        "incremental refresh differs from the model"
    );
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    ensure!(
        conflicts == model::conflicts(&entries),
        "conflicts differ from the model"
    );
    ensure!(!conflicts.is_empty(), "the history has conflicts to compare");
    Ok(())
}

pub use crate::differential::differential_against_reference_model;
