//! Mapping Lance errors to ctxlog's typed errors — by type, never by message text.
//!
//! What a user can act on gets its own variant with one clear line: a missing dataset or
//! bucket (`NotFound`), refused credentials (`AccessDenied`), a throttling or unreachable
//! service (`Unavailable`). Everything else is a `Backend` error whose message is one
//! cleaned-up line (no source locations of dependencies, no XML bodies, no query strings);
//! the full detail stays reachable as the error's `source()` (`--verbose`, tracing).

use std::error::Error as StdError;
use std::fmt;

use ctxlog_core::{Error, ShardId, Unavailability, Written};

use crate::faults::InjectedFault;

pub(crate) const BACKEND: &str = "lance";

/// Map a Lance error of operation `op`. Fences are handled where the writer's identity is
/// known (see `shard.rs`); here they become backend errors with the caller's `written`.
pub(crate) fn lance_err(op: &'static str, shard: Option<ShardId>, written: Written, e: lance::Error) -> Error {
    match e.find_root() {
        lance::Error::DatasetNotFound { path, .. } => {
            return Error::NotFound {
                what: format!("no ctxlog store (Lance dataset) at {}", clean(&path.to_string())),
            };
        }
        lance::Error::CorruptFile { path, .. } => {
            return Error::Corrupt {
                shard,
                what: format!("corrupt file {}", clean(path.as_ref())),
            };
        }
        _ => {}
    }
    match classify(&e) {
        Some(Class::NotFound) => Error::NotFound {
            what: format!("{op}: {}", summary(&e)),
        },
        Some(Class::Denied) => Error::AccessDenied {
            op,
            shard,
            what: summary(&e),
            written,
        },
        Some(Class::Unavailable(reason)) => Error::Unavailable {
            op,
            shard,
            reason,
            what: summary(&e),
            written,
        },
        None => Error::backend(BACKEND, op, shard, written, Failure::new(e)),
    }
}

/// Map an object-store error (the requests ctxlog makes itself).
pub(crate) fn store_err(op: &'static str, shard: Option<ShardId>, written: Written, e: object_store::Error) -> Error {
    lance_err(op, shard, written, lance::Error::io_source(Box::new(e)))
}

/// What a user can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    NotFound,
    Denied,
    Unavailable(Unavailability),
}

/// Walk the error's sources for a type that says what happened.
pub(crate) fn classify(e: &(dyn StdError + 'static)) -> Option<Class> {
    let mut next: Option<&(dyn StdError + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(os) = err.downcast_ref::<object_store::Error>() {
            match os {
                object_store::Error::NotFound { .. } => return Some(Class::NotFound),
                object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                    return Some(Class::Denied);
                }
                _ => {}
            }
        }
        if let Some(fault) = err.downcast_ref::<InjectedFault>()
            && *fault == InjectedFault::Throttled
        {
            return Some(Class::Unavailable(Unavailability::Throttled));
        }
        #[cfg(any(feature = "s3", feature = "gcs", feature = "azure"))]
        if let Some(http) = err.downcast_ref::<object_store::client::HttpError>()
            && matches!(
                http.kind(),
                object_store::client::HttpErrorKind::Connect | object_store::client::HttpErrorKind::Request
            )
        {
            return Some(Class::Unavailable(Unavailability::Unreachable));
        }
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            match io.kind() {
                std::io::ErrorKind::PermissionDenied => return Some(Class::Denied),
                std::io::ErrorKind::ConnectionRefused
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::HostUnreachable
                | std::io::ErrorKind::NetworkUnreachable => {
                    return Some(Class::Unavailable(Unavailability::Unreachable));
                }
                _ => {}
            }
        }
        next = err.source();
    }
    None
}

/// Whether `e` says a dataset does not exist (yet).
pub(crate) fn is_not_found(e: &lance::Error) -> bool {
    matches!(
        e.find_root(),
        lance::Error::DatasetNotFound { .. } | lance::Error::NotFound { .. }
    ) || classify(e) == Some(Class::NotFound)
}

/// A Lance error, shown as one clean line; the original is its `source()`.
#[derive(Debug)]
pub(crate) struct Failure {
    summary: String,
    detail: lance::Error,
}

impl Failure {
    pub(crate) fn new(detail: lance::Error) -> Self {
        Failure {
            summary: summary(&detail),
            detail,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)
    }
}

impl StdError for Failure {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.detail)
    }
}

/// One line of `e`'s message, cleaned (see [`clean`]).
fn summary(e: &lance::Error) -> String {
    clean(&e.to_string())
}

/// Make a dependency's message fit for a user: its first line, without response bodies
/// (`<?xml …`), source locations (`, /…/src/x.rs:12:5`), repeats of the same sentence, or
/// the query string of any URL in it.
pub(crate) fn clean(message: &str) -> String {
    let mut line = message.lines().next().unwrap_or("").to_string();
    if let Some(i) = line.find("<?xml") {
        line.truncate(i);
    }
    // Source locations: ", <path>.rs:<line>:<column>".
    while let Some(rs) = line.find(".rs:") {
        let start = line[..rs].rfind(", ").unwrap_or(rs);
        let tail = &line[rs + 4..];
        let digits = tail
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_digit() || *c == ':'))
            .map_or(tail.len(), |(i, _)| i);
        line.replace_range(start..rs + 4 + digits, "");
    }
    // Query strings of URLs: credentials and signatures travel there.
    let words: Vec<String> = line
        .split(' ')
        .map(|w| match (w.contains("://"), w.find('?')) {
            (true, Some(q)) => format!("{}?<redacted>", &w[..q]),
            _ => w.to_string(),
        })
        .collect();
    let mut line = words.join(" ");
    // "X: X: X" (a message repeated by each layer it passed through) becomes "X".
    let parts: Vec<&str> = line.split(": ").collect();
    let mut kept: Vec<&str> = Vec::new();
    for p in parts {
        if !kept.contains(&p) {
            kept.push(p);
        }
    }
    line = kept.join(": ");
    line.trim().trim_end_matches([',', ':', ' ']).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_lose_locations_bodies_and_queries() {
        let raw = "LanceError(IO): Generic S3 error: Error performing GET http://127.0.0.1:9/b?list-type=2&prefix=x \
                   in 1ms - Server returned non-2xx status code: 404 Not Found: <?xml version=\"1.0\"?><Error><Code>NoSuchBucket</Code>, \
                   /root/.cargo/registry/src/x/lance-io-14.0.2/src/object_store.rs:1576:42";
        let c = clean(raw);
        assert!(!c.contains(".rs:"), "{c}");
        assert!(!c.contains("<?xml"), "{c}");
        assert!(!c.contains("list-type"), "{c}");
        assert!(c.contains("404 Not Found"), "{c}");
        assert_eq!(clean("a: b, /x/y/src/z.rs:1:2\nsecond line"), "a: b");
    }

    #[test]
    fn typed_causes_are_found_in_the_chain() {
        let denied = lance::Error::io_source(Box::new(object_store::Error::PermissionDenied {
            path: "p".into(),
            source: "no".into(),
        }));
        assert!(matches!(
            lance_err("read", None, Written::Nothing, denied),
            Error::AccessDenied { .. }
        ));
        let throttled = lance::Error::io_source(Box::new(object_store::Error::Generic {
            store: "fault-injection",
            source: Box::new(InjectedFault::Throttled),
        }));
        assert!(matches!(
            lance_err("read", None, Written::Nothing, throttled),
            Error::Unavailable {
                reason: Unavailability::Throttled,
                ..
            }
        ));
        let missing = lance::Error::io_source(Box::new(object_store::Error::NotFound {
            path: "p".into(),
            source: "gone".into(),
        }));
        assert!(matches!(
            lance_err("read", None, Written::Nothing, missing),
            Error::NotFound { .. }
        ));
        let other = lance_err(
            "read",
            None,
            Written::Unknown,
            lance::Error::io_source(Box::new(std::io::Error::other("disk on fire"))),
        );
        assert!(
            matches!(
                other,
                Error::Backend {
                    written: Written::Unknown,
                    ..
                }
            ),
            "{other}"
        );
        assert!(!other.to_string().contains(".rs:"), "{other}");
    }
}
