//! The store's format number (rule 22), in `_ctxlog/format` beside the dataset: absent in
//! a store of format 1 (every store written before summaries, and every store of that
//! release until its first summary), `2` once a summary may be in it, `3` once record ids
//! are scoped by bot. A store is created at format 3 (the marker written before the
//! dataset, so that nobody sees the dataset without it); a store of format 1 moves to 2 with
//! its first summary, recorded before the batch is written (no summary is ever in a store
//! that says format 1); one of format 1 or 2 moves to 3 only by `ctxlog upgrade`. Neither
//! needs a new column (a summary's coverage is stored with its body; the grouping of ids is
//! how entries are read), so the entry schema is the same in every format: writers of each
//! share every WAL entry, generation and base table, and a store is never rewritten.
//!
//! A marker is only ever moved up, and only from the format that was read: from 1 (absent)
//! with a put-if-absent; from 2 by a put after reading 2 (object stores here offer no
//! conditional overwrite; two upgrades at once both write the same number). Readers read it
//! at every refresh, writers with every fence check: a process of this release stops
//! writing into a store that a newer release moved on.

use std::sync::atomic::Ordering;

use ctxlog_core::backend::with_deadline;
use ctxlog_core::{Error, IdScope, Result, Written, redact_uri};
use object_store::ObjectStoreExt as _;
use object_store::path::Path;

use crate::error::{is_not_found, lance_err, store_err};
use crate::store::Shared;

/// The newest format this build writes: ids scoped by bot, summaries allowed.
pub const FORMAT: &str = "3";

/// Every format this build opens.
pub const READS: [&str; 5] = ["1", "2", "3", "4", "5"];

/// The format whose ids are scoped by bot: what links and embeddings need first.
pub(crate) const IDS_BY_BOT: u32 = 3;

fn path(base: &Path) -> Path {
    Path::from(format!("{base}/_ctxlog/format"))
}

/// The format the store says it has ("1" when it says nothing).
async fn read(shared: &Shared) -> Result<String> {
    let (store, base) = shared.objects().await?;
    match store.read_one_all(&path(&base)).await {
        Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).trim().to_string()),
        Err(e) if is_not_found(&e) => Ok("1".to_string()),
        Err(e) => Err(lance_err("read the store format", None, Written::Nothing, e)),
    }
}

fn refused(shared: &Shared, found: &str) -> Error {
    Error::NotAStore {
        location: redact_uri(&shared.uri),
        reason: format!(
            "ctxlog store format {found}; this build reads formats {} (and writes format {FORMAT}): a newer release wrote it",
            READS.join(", ")
        ),
    }
}

/// The store's format; refuses one this build cannot read, naming both.
pub(crate) async fn check(shared: &Shared) -> Result<String> {
    let found = read(shared).await?;
    if !READS.contains(&found.as_str()) {
        return Err(refused(shared, &found));
    }
    if found != "1" {
        shared.summaries_allowed.store(true, Ordering::Relaxed);
    }
    Ok(found)
}

/// The store's format as a number (`check`).
pub(crate) async fn number(shared: &Shared) -> Result<u32> {
    let found = check(shared).await?;
    found.parse().map_err(|_| refused(shared, &found))
}

/// Which ids are one record in the store now.
pub(crate) async fn id_scope(shared: &Shared) -> Result<IdScope> {
    Ok(IdScope::of_format(number(shared).await?))
}

/// Record the format of a new store, before its dataset exists.
pub(crate) async fn record_new(store: &lance_io::object_store::ObjectStore, base: &Path) -> Result<()> {
    match store
        .put_if_absent(&path(base), FORMAT.as_bytes().to_vec().into())
        .await
    {
        Ok(()) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
        Err(e) => Err(store_err("record the store format", None, Written::Nothing, e)),
    }
}

/// Record format 2 before the first summary is written through this handle, if the store
/// is at format 1 (absent marker); a store at 2 or 3 already holds summaries.
pub(crate) async fn upgrade_for_summaries(shared: &Shared) -> Result<()> {
    if shared.summaries_allowed.load(Ordering::Relaxed) {
        return Ok(());
    }
    with_deadline(
        "record the store format",
        shared.timeout(),
        None,
        Written::Unknown,
        async {
            let (store, base) = shared.objects().await?;
            match store.put_if_absent(&path(&base), b"2".to_vec().into()).await {
                Ok(()) => {}
                // Another process recorded a format first: this one must be readable.
                Err(object_store::Error::AlreadyExists { .. }) => {
                    check(shared).await?;
                }
                Err(e) => return Err(store_err("record the store format", None, Written::Nothing, e)),
            }
            shared.summaries_allowed.store(true, Ordering::Relaxed);
            Ok(())
        },
    )
    .await
}

/// [`number`] within the store's deadline.
async fn number_within(shared: &Shared) -> Result<u32> {
    with_deadline(
        "read the store format",
        shared.timeout(),
        None,
        Written::Nothing,
        number(shared),
    )
    .await
}

/// The newest format: where the first link or embedding takes a store of format 3.
const NEWEST: u32 = 5;

/// Make the store's format hold a batch that needs format `needs` (4: links, rule 25; 5:
/// embeddings, rule 27) before it is written through this handle; a store of format 1 or 2
/// is refused (its ids are grouped across bots: `ctxlog upgrade` first), nothing written.
/// The marker is overwritten without a condition (a local store has none), so every move
/// writes the same value, [`NEWEST`]: two processes moving it at once — one for a link, one
/// for an embedding — can never leave it below what either wrote. A store of format 3 thus
/// moves to 5 with its first link; one of format 4 with its first embedding.
pub(crate) async fn upgrade_scoped(shared: &Shared, needs: u32) -> Result<()> {
    if shared.scoped_format.load(Ordering::Relaxed) >= needs {
        return Ok(());
    }
    let mut at = number_within(shared).await?;
    if at < IDS_BY_BOT {
        return Err(ctxlog_core::needs_ids_by_bot(at));
    }
    // Twice at most: a process moving the marker between this one's read and its write
    // (another of this release to 5, or one of an earlier release from 3 to 4) fails the
    // first move; the second starts from where that process left it.
    for attempt in 0..2 {
        if at >= needs {
            break;
        }
        match set(shared, at, NEWEST).await {
            Ok(()) => at = NEWEST,
            Err(e) => {
                at = number_within(shared).await?;
                if at < needs && attempt == 1 {
                    return Err(e);
                }
            }
        }
    }
    shared.scoped_format.fetch_max(at, Ordering::Relaxed);
    Ok(())
}

/// What a fence check does with the format it read (`found`): a marker below what this
/// handle moved it to or saw was moved down by a process of an earlier release (its moves
/// overwrite without a condition, as ours do), while the store may hold entries that need
/// the higher format (rule 22): it is moved up again, once a second at most (the fence
/// check's interval) — the window in which a reader of that release may meet them.
pub(crate) async fn keep_floor(shared: &Shared, found: &str) -> Result<()> {
    let floor = shared.scoped_format.load(Ordering::Relaxed);
    let Ok(now) = found.parse::<u32>() else { return Ok(()) };
    if now >= floor || floor == 0 {
        return Ok(());
    }
    tracing::warn!(
        found = now,
        floor,
        "the store's format marker was moved down (a process of an earlier release?): moving it back up"
    );
    shared.scoped_format.store(0, Ordering::Relaxed);
    upgrade_scoped(shared, floor).await
}

/// Move the store from format `from` to `to` (`ctxlog upgrade`), if it is at `from`.
pub(crate) async fn set(shared: &Shared, from: u32, to: u32) -> Result<()> {
    if to < from || !READS.contains(&to.to_string().as_str()) {
        return Err(Error::invalid(
            "format",
            None,
            format!("cannot move format {from} to {to}"),
        ));
    }
    with_deadline("upgrade", shared.timeout(), None, Written::Unknown, async {
        let now = number(shared).await?;
        let moved = || {
            Error::invalid(
                "format",
                None,
                format!("the store is at format {now} now, not {from}: another process moved it"),
            )
        };
        if now != from {
            return Err(moved());
        }
        let (store, base) = shared.objects().await?;
        let bytes = to.to_string().into_bytes();
        if from == 1 {
            match store.put_if_absent(&path(&base), bytes.into()).await {
                Ok(()) => {}
                Err(object_store::Error::AlreadyExists { .. }) => return Err(moved()),
                Err(e) => return Err(store_err("upgrade", None, Written::Nothing, e)),
            }
        } else {
            store
                .inner
                .put(&path(&base), bytes.into())
                .await
                .map_err(|e| store_err("upgrade", None, Written::Nothing, e))?;
        }
        shared.summaries_allowed.store(true, Ordering::Relaxed);
        Ok(())
    })
    .await
}
