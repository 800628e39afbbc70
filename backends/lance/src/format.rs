//! The store's format number (rule 22), in `_ctxlog/format` beside the dataset: absent in
//! a store of format 1 (every store written before summaries, and every store until its
//! first summary), `2` once a summary may be in it. A store is upgraded by the first append
//! of a summary, which records format 2 before it writes: no summary is ever in a store
//! that says format 1. Summaries need no new column (their coverage is stored with their
//! body, `Record::stored_body`), so the entry schema is the same in both formats: Lance
//! writers of either format share every WAL entry, generation and base table, and a store
//! is never rewritten.

use std::sync::atomic::Ordering;

use ctxlog_core::{Error, Result, Written, redact_uri};
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::error::{is_not_found, lance_err, store_err};
use crate::store::Shared;

/// The newest format this build writes: a store that may hold summaries.
pub const FORMAT: &str = "2";

/// Every format this build opens.
pub const READS: [&str; 2] = ["1", "2"];

fn path(base: &Path) -> Path {
    Path::from(format!("{base}/_ctxlog/format"))
}

/// The store's format; refuses one this build cannot read, naming both.
pub(crate) async fn check(shared: &Shared) -> Result<String> {
    let (store, base) = shared.objects().await?;
    let found = match store.read_one_all(&path(&base)).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_string(),
        Err(e) if is_not_found(&e) => "1".to_string(),
        Err(e) => return Err(lance_err("read the store format", None, Written::Nothing, e)),
    };
    if !READS.contains(&found.as_str()) {
        return Err(Error::NotAStore {
            location: redact_uri(&shared.uri),
            reason: format!(
                "ctxlog store format {found}; this build reads formats {} (and writes format {FORMAT}): a newer release wrote it",
                READS.join(" and ")
            ),
        });
    }
    if found == FORMAT {
        shared.summaries_allowed.store(true, Ordering::Relaxed);
    }
    Ok(found)
}

/// Record format 2 before the first summary is written through this handle.
pub(crate) async fn upgrade_for_summaries(shared: &Shared) -> Result<()> {
    if shared.summaries_allowed.load(Ordering::Relaxed) {
        return Ok(());
    }
    let (store, base) = shared.objects().await?;
    store
        .inner
        .put(&path(&base), FORMAT.as_bytes().to_vec().into())
        .await
        .map_err(|e| store_err("record the store format", None, Written::Nothing, e))?;
    shared.summaries_allowed.store(true, Ordering::Relaxed);
    Ok(())
}
