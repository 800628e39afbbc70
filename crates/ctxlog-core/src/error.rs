//! The typed errors of every ctxlog operation (contract rules 4 and 5).
//!
//! Every variant says whether anything was written ([`Written`]). Callers branch on the
//! variant and on [`Error::written`], never on message text.

use std::time::Duration;

use crate::ids::{Epoch, ShardId};

/// A result whose error is ctxlog's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Whether a failed operation may have written anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// Definite: nothing of the operation was or will become visible.
    Nothing,
    /// Indeterminate: the write may have landed. The shard handle is poisoned; reopen the
    /// shard and retry with the same record ids (always safe, rule 6).
    Unknown,
}

impl std::fmt::Display for Written {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Written::Nothing => f.write_str("nothing was written"),
            Written::Unknown => f.write_str("the write may have landed: reopen the shard and retry with the same ids"),
        }
    }
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

#[derive(Debug, thiserror::Error)]
/// Every failure of a ctxlog operation, by kind (rule 5).
#[non_exhaustive]
pub enum Error {
    /// Bad input, rejected before anything was written (rule 11).
    #[error("invalid input: `{field}`{}: {reason}; nothing was written", at(*.index))]
    InvalidInput {
        /// The offending field (`id`, `bot_id`, `metadata`, `body`, `uri`, ...).
        field: &'static str,
        /// Index of the offending record in its batch, when there is one.
        index: Option<usize>,
        /// Why it was refused.
        reason: String,
    },

    /// The URI names a scheme no backend understands. `uri` is redacted (no query string,
    /// no credentials): errors are printed.
    #[error("unknown store URI scheme `{scheme}` in `{uri}`; nothing was written")]
    UnknownScheme {
        /// The URI, redacted.
        uri: String,
        /// The scheme it names.
        scheme: String,
    },

    /// The URI names a backend this build does not include. `uri` is redacted.
    #[error(
        "store `{uri}` needs the {backend} backend, which is not compiled in: enable cargo feature `{feature}`; nothing was written"
    )]
    BackendNotCompiled {
        /// The URI, redacted.
        uri: String,
        /// The backend it needs.
        backend: &'static str,
        /// The cargo feature that compiles it in.
        feature: &'static str,
    },

    /// The location holds something that is not a ctxlog store this build can open (another
    /// SQLite database, another Lance dataset, a foreign file, a newer store format). It was
    /// left exactly as it was.
    #[error("{location} is not a ctxlog store this build can open: {reason}; nothing was written")]
    NotAStore {
        /// The path or URI (redacted).
        location: String,
        /// What is there instead.
        reason: String,
    },

    /// A newer `open_shard` of the same writer claimed the shard (rule 3).
    #[error("shard {shard} (writer `{writer}`) is fenced: epoch {epoch} was superseded{}; {written}", newer(*.current))]
    Fenced {
        /// The fenced shard.
        shard: ShardId,
        /// Its writer id.
        writer: String,
        /// The epoch this handle had.
        epoch: Epoch,
        /// The epoch that superseded ours, when the backend knows it.
        current: Option<Epoch>,
        /// Whether anything of the append may have been written.
        written: Written,
    },

    /// A previous indeterminate error poisoned this shard handle (rule 4).
    #[error(
        "shard {shard} handle is poisoned by an earlier indeterminate error; reopen the shard and retry; nothing was written"
    )]
    Poisoned {
        /// The poisoned shard handle's shard.
        shard: ShardId,
    },

    /// The handle was closed.
    #[error("shard {shard} handle is closed; nothing was written")]
    Closed {
        /// The closed handle's shard.
        shard: ShardId,
    },

    /// The store, a shard or a record is not there.
    #[error("not found: {what}")]
    NotFound {
        /// What is missing, and where.
        what: String,
    },

    /// The operation missed its deadline.
    #[error("{op} timed out after {after:?}{}; {written}", on_shard(*.shard))]
    Timeout {
        /// The operation.
        op: &'static str,
        /// Its deadline.
        after: Duration,
        /// The shard, for shard operations.
        shard: Option<ShardId>,
        /// Whether anything may have been written.
        written: Written,
    },

    /// The storage engine failed.
    #[error("{op} failed in the {backend} backend{}: {source}; {written}", on_shard(*.shard))]
    Backend {
        /// `"sqlite"`, `"lance"`, ….
        backend: &'static str,
        /// The operation.
        op: &'static str,
        /// The shard, for shard operations.
        shard: Option<ShardId>,
        /// Whether anything may have been written.
        written: Written,
        #[source]
        /// What the engine said.
        source: Source,
    },

    /// Stored data is not what ctxlog wrote (or can read).
    #[error("corrupt store{}: {what}", on_shard(*.shard))]
    Corrupt {
        /// The shard, when one is at fault.
        shard: Option<ShardId>,
        /// What is wrong, and where.
        what: String,
    },

    /// The storage refused this process access (credentials, permissions).
    #[error("{op}: access denied{}: {what}; {written}", on_shard(*.shard))]
    AccessDenied {
        /// The operation.
        op: &'static str,
        /// The shard, for shard operations.
        shard: Option<ShardId>,
        /// What was refused.
        what: String,
        /// Whether anything may have been written.
        written: Written,
    },

    /// The storage service throttled the request or could not be reached.
    #[error("{op}: the storage service {reason}{}: {what}; {written}", on_shard(*.shard))]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The shard, for shard operations.
        shard: Option<ShardId>,
        /// Throttled or unreachable.
        reason: Unavailability,
        /// What the service said.
        what: String,
        /// Whether anything may have been written.
        written: Written,
    },
}

/// Why a storage service did not serve a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailability {
    /// It answered "slow down" / "service unavailable" (HTTP 429, 503) until retries ran out.
    Throttled,
    /// It could not be reached (connection refused, name not resolved, connection reset).
    Unreachable,
}

impl std::fmt::Display for Unavailability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Unavailability::Throttled => "is throttling requests",
            Unavailability::Unreachable => "cannot be reached",
        })
    }
}

fn at(index: Option<usize>) -> String {
    index.map(|i| format!(" of record {i}")).unwrap_or_default()
}

fn newer(current: Option<Epoch>) -> String {
    current.map(|e| format!(" by epoch {e}")).unwrap_or_default()
}

fn on_shard(shard: Option<ShardId>) -> String {
    shard.map(|s| format!(" on shard {s}")).unwrap_or_default()
}

impl Error {
    /// Bad input in `field` (of record `index` of a batch).
    pub fn invalid(field: &'static str, index: Option<usize>, reason: impl Into<String>) -> Self {
        Error::InvalidInput {
            field,
            index,
            reason: reason.into(),
        }
    }

    /// A storage engine failure of operation `op`.
    pub fn backend(
        backend: &'static str,
        op: &'static str,
        shard: Option<ShardId>,
        written: Written,
        source: impl Into<Source>,
    ) -> Self {
        Error::Backend {
            backend,
            op,
            shard,
            written,
            source: source.into(),
        }
    }

    /// Whether anything may have been written (rule 4).
    pub fn written(&self) -> Written {
        match self {
            Error::Fenced { written, .. }
            | Error::Timeout { written, .. }
            | Error::Backend { written, .. }
            | Error::AccessDenied { written, .. }
            | Error::Unavailable { written, .. } => *written,
            Error::InvalidInput { .. }
            | Error::UnknownScheme { .. }
            | Error::BackendNotCompiled { .. }
            | Error::NotAStore { .. }
            | Error::Poisoned { .. }
            | Error::Closed { .. }
            | Error::NotFound { .. }
            | Error::Corrupt { .. } => Written::Nothing,
        }
    }

    /// Definite: nothing was written, the caller may act on that.
    pub fn is_definite(&self) -> bool {
        self.written() == Written::Nothing
    }

    /// Bad input of any kind (rule 11), including URIs and missing backends.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidInput { .. } | Error::UnknownScheme { .. } | Error::BackendNotCompiled { .. }
        )
    }
}

/// Run `fut` under a deadline; a miss becomes a typed [`Error::Timeout`].
pub async fn with_deadline<T>(
    op: &'static str,
    after: Duration,
    shard: Option<ShardId>,
    written_on_timeout: Written,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(after, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Timeout {
            op,
            after,
            shard,
            written: written_on_timeout,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message names the field and the record at fault, the shard, the epoch that won, and
    /// whether anything was written — what an operator reads in a log.
    #[test]
    fn messages_say_what_is_at_fault_and_what_was_written() {
        let shard = ShardId::from_bytes([7; 16]);
        let invalid = Error::InvalidInput {
            field: "id",
            index: Some(3),
            reason: "empty".into(),
        };
        assert_eq!(
            invalid.to_string(),
            "invalid input: `id` of record 3: empty; nothing was written"
        );
        let fenced = Error::Fenced {
            shard,
            writer: "w".into(),
            epoch: 2,
            current: Some(5),
            written: Written::Unknown,
        };
        let msg = fenced.to_string();
        assert!(msg.contains(&format!("shard {shard} (writer `w`)")), "{msg}");
        assert!(msg.contains("epoch 2 was superseded by epoch 5;"), "{msg}");
        assert!(msg.ends_with(&Written::Unknown.to_string()), "{msg}");
        let throttled = Error::Unavailable {
            op: "append",
            shard: Some(shard),
            reason: Unavailability::Throttled,
            what: "503".into(),
            written: Written::Nothing,
        };
        assert_eq!(
            throttled.to_string(),
            format!("append: the storage service is throttling requests on shard {shard}: 503; nothing was written")
        );
        let unreachable = Unavailability::Unreachable.to_string();
        assert_eq!(unreachable, "cannot be reached");
    }

    /// Bad input of every kind is classified as such, and nothing else is.
    #[test]
    fn invalid_input_is_classified_by_kind() {
        let unknown = Error::UnknownScheme {
            uri: "x://".into(),
            scheme: "x".into(),
        };
        let missing = Error::BackendNotCompiled {
            uri: "s3://b".into(),
            backend: "lance",
            feature: "lance",
        };
        let invalid = Error::InvalidInput {
            field: "id",
            index: None,
            reason: "empty".into(),
        };
        for e in [&unknown, &missing, &invalid] {
            assert!(e.is_invalid_input() && e.is_definite(), "{e}");
        }
        assert!(!invalid.to_string().contains("of record"), "no index, no record named");
        let poisoned = Error::Poisoned {
            shard: ShardId::from_bytes([1; 16]),
        };
        assert!(!poisoned.is_invalid_input(), "{poisoned}");
    }
}
