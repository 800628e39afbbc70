//! Store URIs as they may be printed. A URI's query string carries storage options
//! (credentials, endpoints, tokens) and its user info may carry a password: neither ever
//! reaches an error message, a log line, a report or a benchmark's JSON.

/// `uri` without its query string, fragment and user info. A query or user info that was
/// removed is marked, so that a reader sees that something was there.
///
/// ```
/// use ctxlog_core::redact::redact_uri;
/// assert_eq!(redact_uri("s3://b/log.lance?region=eu&secret=x"), "s3://b/log.lance?<redacted>");
/// assert_eq!(redact_uri("s3://key:pw@b/log.lance"), "s3://<redacted>@b/log.lance");
/// assert_eq!(redact_uri("/data/agents.db"), "/data/agents.db");
/// ```
pub fn redact_uri(uri: &str) -> String {
    let (rest, had_query) = match uri.find(['?', '#']) {
        Some(i) => (&uri[..i], true),
        None => (uri, false),
    };
    let mut out = match rest.split_once("://") {
        Some((scheme, tail)) => {
            let authority_end = tail.find('/').unwrap_or(tail.len());
            let (authority, path) = tail.split_at(authority_end);
            match authority.rfind('@') {
                Some(at) => format!("{scheme}://<redacted>{}{path}", &authority[at..]),
                None => rest.to_string(),
            }
        }
        None => rest.to_string(),
    };
    if had_query {
        out.push_str("?<redacted>");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_keeps_a_query_or_credentials() {
        for (uri, want) in [
            (
                "s3://bucket/a.lance?aws_secret_access_key=SECRET",
                "s3://bucket/a.lance?<redacted>",
            ),
            ("file:///x/a.lance#SECRET", "file:///x/a.lance?<redacted>"),
            ("az://user:SECRET@acct/c/a.lance", "az://<redacted>@acct/c/a.lance"),
            ("memory://scratch", "memory://scratch"),
            ("sqlite:agents.db", "sqlite:agents.db"),
            ("", ""),
        ] {
            let got = redact_uri(uri);
            assert_eq!(got, want, "{uri}");
            assert!(!got.contains("SECRET"));
        }
    }
}
