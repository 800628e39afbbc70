//! Mapping Lance errors to ctxlog's typed errors — by variant, never by message text.

use ctxlog_core::{Error, ShardId, Written};

pub(crate) const BACKEND: &str = "lance";

/// Map a Lance error of operation `op`. Fences are handled where the writer's identity is
/// known (see `shard.rs`); here they become indeterminate backend errors.
pub(crate) fn lance_err(op: &'static str, shard: Option<ShardId>, written: Written, e: lance::Error) -> Error {
    match e.find_root() {
        lance::Error::DatasetNotFound { path, .. } => Error::NotFound {
            what: format!("no ctxlog store (Lance dataset) at {path}"),
        },
        lance::Error::CorruptFile { path, .. } => Error::Corrupt {
            shard,
            what: format!("corrupt file {path}"),
        },
        _ => Error::backend(BACKEND, op, shard, written, e),
    }
}

/// Whether `e` says a dataset does not exist (yet).
pub(crate) fn is_not_found(e: &lance::Error) -> bool {
    matches!(
        e.find_root(),
        lance::Error::DatasetNotFound { .. } | lance::Error::NotFound { .. }
    )
}
