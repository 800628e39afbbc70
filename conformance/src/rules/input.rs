//! Rule 11: bad input.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 11: bad input";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![case!(bad_input_rejected_before_write)]
}

// ---- Rule 11: bad input --------------------------------------------------------------

/// Every kind of bad input is rejected, names its field and record, and writes nothing.
pub async fn bad_input_rejected_before_write(ctx: Ctx) -> anyhow::Result<()> {
    let mut options = ctx.options();
    options.limits.max_body_bytes = 1024;
    options.limits.max_metadata_bytes = 256;
    options.limits.max_record_bytes = 2048;
    options.limits.max_batch_records = 8;
    options.limits.max_batch_bytes = 4096;
    let store = ctx.store_with(options).await?;
    let mut shard = store.open_shard(&w("w1")).await?;
    let good = shard.append(recs("ok", "s", 2)).await?;
    let snapshot = |store: Arc<dyn Store>| async move {
        let mut p = store.projector();
        p.refresh().await?;
        anyhow::Ok((
            p.projection().canonical_json(),
            all_entries(store.as_ref()).await?.len(),
        ))
    };
    let before = snapshot(store.clone()).await?;

    type Spoil = fn(&mut Record);
    let cases: Vec<(&str, Spoil)> = vec![
        ("id", |r| r.id.clear()),
        ("id", |r| r.id = "x".repeat(513)),
        ("bot_id", |r| r.bot_id.clear()),
        ("bot_id", |r| r.bot_id = "b".repeat(513)),
        ("session_id", |r| r.session_id.clear()),
        ("metadata", |r| {
            r.metadata = Some(serde_json::json!(["not", "an", "object"]))
        }),
        ("metadata", |r| r.metadata = Some(serde_json::json!("text"))),
        ("role", |r| r.role = "r".repeat(513)),
        ("content_type", |r| r.content_type = "c".repeat(513)),
        ("metadata", |r| {
            r.metadata = Some(serde_json::json!({"k": "v".repeat(300)}))
        }),
        ("body", |r| r.body = Body::Text("x".repeat(1025))),
        ("body", |r| r.body = Body::Bytes(vec![7; 1025])),
        // Every part within its limit, the record over its own.
        ("record", |r| {
            r.body = Body::Text("x".repeat(1000));
            r.metadata = Some(serde_json::json!({"k": "v".repeat(240)}));
            r.id = "i".repeat(500);
            r.bot_id = "b".repeat(500);
        }),
        ("created_at", |r| {
            r.created_at = chrono::DateTime::from_timestamp(-20_000_000_000, 0)
        }),
    ];
    for (field, spoil) in cases {
        let mut batch = recs("bad", "s", 3);
        spoil(&mut batch[2]);
        match shard.append(batch).await {
            Err(Error::InvalidInput {
                field: f,
                index: Some(2),
                ..
            }) if f == field => {}
            other => bail!("spoiled {field}: expected InvalidInput naming it, got {other:?}"),
        }
    }
    match shard.append(Vec::new()).await {
        Err(e @ Error::InvalidInput { field: "records", .. }) => ensure!(e.is_definite()),
        other => bail!("an empty batch: {other:?}"),
    }
    match shard.append(recs("many", "s", 9)).await {
        Err(e @ Error::InvalidInput { field: "records", .. }) => ensure!(e.is_definite()),
        other => bail!("9 records over a limit of 8: expected InvalidInput, got {other:?}"),
    }
    // Each record fits; together they pass the batch's byte limit (4096) at the fifth.
    let mut big = recs("big", "s", 5);
    for r in &mut big {
        r.body = Body::Bytes(vec![3; 1000]);
    }
    match shard.append(big).await {
        Err(
            e @ Error::InvalidInput {
                field: "records",
                index: Some(4),
                ..
            },
        ) => ensure!(e.is_definite()),
        other => bail!("a batch over its byte limit: expected InvalidInput at record 4, got {other:?}"),
    }
    ensure!(WriterId::new("").is_err(), "an empty writer id is rejected");
    match WriterId::new("w".repeat(513)) {
        Err(Error::InvalidInput { field: "writer", .. }) => {}
        other => bail!("a writer id over 512 bytes: expected InvalidInput, got {other:?}"),
    }
    ensure!(WriterId::new("w".repeat(512)).is_ok());
    ensure!(snapshot(store.clone()).await? == before, "bad input changed the store");
    let next = shard.append(recs("after", "s", 1)).await?;
    ensure!(next.first_seq == good.last_seq + 1, "no seq was consumed");
    // Exactly at the limit is fine.
    let mut edge = rec("edge", "s", "");
    edge.body = Body::Bytes(vec![1; 1024]);
    edge.id = "e".repeat(512);
    shard.append(vec![edge]).await?;
    Ok(())
}
