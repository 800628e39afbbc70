//! Errors as RFC 9457 problem details (`application/problem+json`).
//!
//! A client tells what to do from `type` and `written` alone, never from prose: retry with
//! the same ids (`written: "unknown"`, or a definite storage failure), fix its input
//! (`invalid-input`, naming the record and field; nothing was written), go to another
//! replica (`fenced`), or ask for rights (`unauthorized`, `forbidden`). Every error kind of
//! the core has its own type and a status other than 500.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use ctxlog::{Error, Written};
use serde::Serialize;
use utoipa::ToSchema;

/// The `type` URIs, one per kind of problem.
pub mod types {
    /// A field of the request is not acceptable (the record and field are named).
    pub const INVALID_INPUT: &str = "urn:ctxlog:problem:invalid-input";
    /// The request body is not JSON of the expected shape.
    pub const MALFORMED: &str = "urn:ctxlog:problem:malformed-request";
    /// The body is larger than the server accepts.
    pub const TOO_LARGE: &str = "urn:ctxlog:problem:too-large";
    /// The body did not arrive within its deadline (three header timeouts in all).
    pub const BODY_TIMEOUT: &str = "urn:ctxlog:problem:body-timeout";
    /// The replica holds as many request bodies as it may; retry later (`Retry-After`).
    pub const BUSY: &str = "urn:ctxlog:problem:busy";
    /// The route exists, but not with this method.
    pub const METHOD_NOT_ALLOWED: &str = "urn:ctxlog:problem:method-not-allowed";
    /// No valid bearer token.
    pub const UNAUTHORIZED: &str = "urn:ctxlog:problem:unauthorized";
    /// The token does not grant this right on this bot.
    pub const FORBIDDEN: &str = "urn:ctxlog:problem:forbidden";
    /// No such record, session or route.
    pub const NOT_FOUND: &str = "urn:ctxlog:problem:not-found";
    /// This replica's shard was claimed by another process with the same writer id: it
    /// takes no more writes. Write through another replica.
    pub const FENCED: &str = "urn:ctxlog:problem:fenced";
    /// The operation missed its deadline (`written` says whether it may have landed).
    pub const TIMEOUT: &str = "urn:ctxlog:problem:timeout";
    /// The storage failed (`written` says whether it may have landed).
    pub const STORAGE: &str = "urn:ctxlog:problem:storage-error";
    /// The storage throttled or could not be reached; retry later.
    pub const UNAVAILABLE: &str = "urn:ctxlog:problem:storage-unavailable";
    /// The storage refused the server's credentials.
    pub const STORAGE_DENIED: &str = "urn:ctxlog:problem:storage-access-denied";
    /// Stored data is not what ctxlog wrote.
    pub const CORRUPT: &str = "urn:ctxlog:problem:corrupt-store";
    /// The store cannot be used by this server (not a store, a backend not compiled in).
    pub const UNUSABLE: &str = "urn:ctxlog:problem:store-unusable";
    /// The replica is shutting down or its writer is not available.
    pub const UNAVAILABLE_REPLICA: &str = "urn:ctxlog:problem:replica-unavailable";
    /// Too many watch streams for this token.
    pub const TOO_MANY_WATCHERS: &str = "urn:ctxlog:problem:too-many-watchers";
}

/// What became of an operation that failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WrittenAnswer {
    /// Definite: nothing of it was or will be written.
    Nothing,
    /// Indeterminate: it may have landed; retry with the same ids (always safe).
    Unknown,
}

impl From<Written> for WrittenAnswer {
    fn from(w: Written) -> Self {
        match w {
            Written::Nothing => WrittenAnswer::Nothing,
            Written::Unknown => WrittenAnswer::Unknown,
        }
    }
}

/// An RFC 9457 problem: a stable `type`, a short `title`, the HTTP `status`, a `detail` for
/// people, and ctxlog's extensions.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct Problem {
    /// The kind of problem (see [`types`]).
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// A short, fixed summary of the kind.
    pub title: &'static str,
    /// The HTTP status.
    pub status: u16,
    /// What happened, for people.
    pub detail: String,
    /// Whether anything of the operation was written.
    pub written: WrittenAnswer,
    /// The offending field, for invalid input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The offending record's index in the request, for invalid input.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<usize>,
    /// The shard at fault, when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<String>,
}

impl Problem {
    /// A problem of kind `kind`; nothing was written.
    pub fn new(status: StatusCode, kind: &'static str, title: &'static str, detail: impl Into<String>) -> Self {
        Problem {
            kind,
            title,
            status: status.as_u16(),
            detail: detail.into(),
            written: WrittenAnswer::Nothing,
            field: None,
            record: None,
            shard: None,
        }
    }

    /// Invalid input in `field` (of record `record`); nothing was written.
    pub fn invalid(field: impl Into<String>, record: Option<usize>, detail: impl Into<String>) -> Self {
        Problem {
            field: Some(field.into()),
            record,
            ..Problem::new(StatusCode::BAD_REQUEST, types::INVALID_INPUT, "Invalid input", detail)
        }
    }

    /// A body that is not JSON of the expected shape.
    pub fn malformed(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::BAD_REQUEST, types::MALFORMED, "Malformed request", detail)
    }

    /// No valid bearer token.
    pub fn unauthorized() -> Self {
        Problem::new(
            StatusCode::UNAUTHORIZED,
            types::UNAUTHORIZED,
            "Unauthorized",
            "a valid bearer token is required",
        )
    }

    /// The token does not grant `right` here. Says nothing of what exists.
    pub fn forbidden(right: &str) -> Self {
        Problem::new(
            StatusCode::FORBIDDEN,
            types::FORBIDDEN,
            "Forbidden",
            format!("the token does not grant `{right}` here"),
        )
    }

    /// Nothing at this place.
    pub fn not_found(detail: impl Into<String>) -> Self {
        Problem::new(StatusCode::NOT_FOUND, types::NOT_FOUND, "Not found", detail)
    }

    /// The replica is not taking this request (shutting down, writer gone).
    pub fn replica_unavailable(detail: impl Into<String>, written: Written) -> Self {
        Problem {
            written: written.into(),
            ..Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                types::UNAVAILABLE_REPLICA,
                "Replica unavailable",
                detail,
            )
        }
    }
}

impl From<&Error> for Problem {
    fn from(e: &Error) -> Self {
        let written = e.written().into();
        let detail = e.to_string();
        let (status, kind, title, shard) = match e {
            Error::InvalidInput { field, index, .. } => {
                return Problem {
                    field: Some((*field).to_string()),
                    record: *index,
                    ..Problem::new(StatusCode::BAD_REQUEST, types::INVALID_INPUT, "Invalid input", detail)
                };
            }
            Error::NotFound { .. } => (StatusCode::NOT_FOUND, types::NOT_FOUND, "Not found", None),
            Error::Fenced { shard, .. } => (StatusCode::CONFLICT, types::FENCED, "Replica fenced", Some(*shard)),
            Error::Poisoned { shard } | Error::Closed { shard } => (
                StatusCode::SERVICE_UNAVAILABLE,
                types::UNAVAILABLE_REPLICA,
                "Replica unavailable",
                Some(*shard),
            ),
            Error::Timeout { shard, .. } => (StatusCode::GATEWAY_TIMEOUT, types::TIMEOUT, "Timeout", *shard),
            Error::Backend { shard, .. } => (StatusCode::BAD_GATEWAY, types::STORAGE, "Storage error", *shard),
            Error::Corrupt { shard, .. } => (StatusCode::BAD_GATEWAY, types::CORRUPT, "Corrupt store", *shard),
            Error::AccessDenied { shard, .. } => (
                StatusCode::BAD_GATEWAY,
                types::STORAGE_DENIED,
                "Storage access denied",
                *shard,
            ),
            Error::Unavailable { shard, .. } => (
                StatusCode::SERVICE_UNAVAILABLE,
                types::UNAVAILABLE,
                "Storage unavailable",
                *shard,
            ),
            Error::UnknownScheme { .. } | Error::BackendNotCompiled { .. } | Error::NotAStore { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, types::UNUSABLE, "Store unusable", None)
            }
            // A kind of a newer core: a storage error that says whether anything was written.
            _ => (StatusCode::BAD_GATEWAY, types::STORAGE, "Storage error", None),
        };
        Problem {
            written,
            shard: shard.map(|s| s.to_string()),
            ..Problem::new(status, kind, title, detail)
        }
    }
}

impl From<Error> for Problem {
    fn from(e: Error) -> Self {
        Problem::from(&e)
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        // A failure to answer (a storage error, a deadline missed) is logged, as an MCP
        // tool's is; a refusal under load or while not ready (503) is counted by the
        // metrics, not logged per request, which would flood the log when it matters.
        if self.status >= 500 && self.status != 503 {
            tracing::warn!(kind = self.kind, status = self.status, detail = %self.detail, "a request failed");
        }
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::BAD_GATEWAY);
        let mut response = (status, axum::Json(&self)).into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.kind == types::UNAVAILABLE || self.kind == types::BUSY {
            headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A name in a path or a body (bot, session, id, role): UTF-8, not empty, no NUL, at most
/// `max` bytes; the problem names `field`.
pub(crate) fn check_name(field: &str, bytes: &[u8], max: usize) -> Result<(), Problem> {
    let invalid = |detail: String| Err(Problem::invalid(field, None, detail));
    match std::str::from_utf8(bytes) {
        Err(_) => invalid("is not UTF-8".into()),
        Ok("") => invalid("must not be empty".into()),
        Ok(s) if s.contains('\0') => invalid("must not contain NUL".into()),
        Ok(s) if s.len() > max => invalid(format!("is {} bytes, the limit is {max}", s.len())),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of core error has a type of its own and a status that is not 500, and
    /// carries the core's `written` answer.
    #[test]
    fn every_core_error_kind_maps_to_its_own_type() {
        let shard = ctxlog::ShardId::for_writer(&ctxlog::WriterId::new("w").unwrap());
        let cases = [
            (Error::invalid("id", Some(3), "too long"), types::INVALID_INPUT, 400),
            (Error::NotFound { what: "x".into() }, types::NOT_FOUND, 404),
            (
                Error::Fenced {
                    shard,
                    writer: "w".into(),
                    epoch: 1,
                    current: Some(2),
                    written: Written::Nothing,
                },
                types::FENCED,
                409,
            ),
            (
                Error::Timeout {
                    op: "append",
                    after: std::time::Duration::from_secs(1),
                    shard: Some(shard),
                    written: Written::Unknown,
                },
                types::TIMEOUT,
                504,
            ),
            (
                Error::Corrupt {
                    shard: None,
                    what: "x".into(),
                },
                types::CORRUPT,
                502,
            ),
        ];
        for (e, kind, status) in cases {
            let p = Problem::from(&e);
            assert_eq!((p.kind, p.status), (kind, status), "{e}");
            assert_eq!(p.written, WrittenAnswer::from(e.written()), "{e}");
        }
        let p = Problem::from(&Error::invalid("id", Some(3), "too long"));
        assert_eq!((p.field.as_deref(), p.record), (Some("id"), Some(3)));
    }
}
