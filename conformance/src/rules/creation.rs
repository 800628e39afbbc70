//! Rule 12: safe creation.

use crate::prelude::*;

/// The rule(s) this module checks, as the report groups them.
pub const RULE: &str = "Rule 12: safe creation";

/// The cases of this module, next to their functions.
pub fn cases() -> Vec<Case> {
    vec![case!(concurrent_create_in_process)]
}

// ---- Rule 12: concurrent create ------------------------------------------------------

/// Many tasks creating the same missing store at once all succeed and share it.
pub async fn concurrent_create_in_process(ctx: Ctx) -> anyhow::Result<()> {
    const N: usize = 6;
    let mut tasks = Vec::new();
    for i in 0..N {
        let (uri, opts, open) = (ctx.uri.clone(), ctx.options(), ctx.backend.open);
        tasks.push(tokio::spawn(async move {
            let store = open(uri, opts).await?;
            let mut s = store.open_shard(&w(&format!("creator-{i}"))).await?;
            s.append(vec![rec(format!("c{i}"), "s", "hello")]).await?;
            s.close().await?;
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let store = ctx.store().await?;
    ensure!(store.shards().await?.len() == N, "one store, every writer in it");
    ensure!(store.projector().session("bot", "s").await?.len() == N);
    Ok(())
}
