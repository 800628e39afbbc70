//! Bearer tokens, scoped by bot.
//!
//! The tokens file holds hashes, never tokens: `{"tokens": [{"name", "hash", "bots",
//! "rights"}]}`, where `hash` is `blake3:` and the hex BLAKE3 hash of the token, `bots` are
//! names or prefixes (`team-*`, `*` for every bot) and `rights` any of `read`, `write`,
//! `admin`. A presented token is hashed and compared with each entry in constant time
//! (`blake3::Hash` equality). A token that does not grant a bot is refused the same way
//! whether or not the bot or its sessions exist, so it learns nothing about them.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Right {
    /// Read records, sessions, and watch.
    Read,
    /// Append and tombstone.
    Write,
    /// Maintenance, store-wide reads (conflicts, stats, shards, the store's watch), metrics.
    Admin,
}

impl Right {
    /// The name a tokens file and an error use.
    pub fn as_str(self) -> &'static str {
        match self {
            Right::Read => "read",
            Right::Write => "write",
            Right::Admin => "admin",
        }
    }
}

/// One entry of the tokens file.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenEntry {
    /// A name for logs and limits (never the token).
    pub name: String,
    /// `blake3:<hex>` of the token.
    pub hash: String,
    /// Bot names or prefixes (`team-*`; `*` is every bot).
    pub bots: Vec<String>,
    /// What it may do.
    pub rights: Vec<Right>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    tokens: Vec<TokenEntry>,
}

/// The hash a tokens file holds for `token`.
pub fn hash_token(token: &str) -> String {
    format!("blake3:{}", blake3::hash(token.as_bytes()).to_hex())
}

/// A new random token: 32 random bytes (two UUIDv4s), URL-safe base64.
pub fn new_token() -> String {
    use base64::Engine;
    let mut bytes = Vec::with_capacity(32);
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    bytes.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// What a request may do: everything (no tokens file), or one token's grant.
#[derive(Clone, Debug)]
pub struct Grant {
    /// The token's name (`local` without a tokens file).
    pub name: String,
    bots: Vec<String>,
    rights: Vec<Right>,
}

impl Grant {
    fn everything() -> Self {
        Grant {
            name: "local".into(),
            bots: vec!["*".into()],
            rights: vec![Right::Read, Right::Write, Right::Admin],
        }
    }

    /// Read and write on `bots` (patterns as in a tokens file): the grant of whoever started
    /// a local MCP server (`ctxlog mcp`).
    pub(crate) fn local(bots: Vec<String>) -> Self {
        Grant {
            name: "local".into(),
            bots,
            rights: vec![Right::Read, Right::Write],
        }
    }

    /// The bots the grant names exactly (not by a pattern).
    pub(crate) fn named_bots(&self) -> impl Iterator<Item = &str> {
        self.bots.iter().map(String::as_str).filter(|b| !b.ends_with('*'))
    }

    /// Whether the grant covers `bot` with `right`.
    pub fn allows(&self, bot: &str, right: Right) -> bool {
        self.has(right) && self.bots.iter().any(|p| matches_bot(p, bot))
    }

    /// Whether the grant has `right` (on some bot).
    pub fn has(&self, right: Right) -> bool {
        self.rights.contains(&right)
    }

    /// Whether the grant covers every bot (a store-wide read needs it).
    pub fn all_bots(&self) -> bool {
        self.bots.iter().any(|p| p == "*")
    }
}

fn matches_bot(pattern: &str, bot: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => bot.starts_with(prefix),
        None => pattern == bot,
    }
}

/// The tokens a server accepts; none configured means every request may do everything
/// (the server then listens on loopback only).
#[derive(Clone, Debug, Default)]
pub struct Tokens {
    entries: Option<Vec<(blake3::Hash, TokenEntry)>>,
}

impl Tokens {
    /// No tokens file: everything allowed.
    pub fn open() -> Self {
        Tokens { entries: None }
    }

    /// Read a tokens file.
    // The tokens file is the operator's, never one of a store's files.
    #[allow(clippy::disallowed_methods)]
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        Self::parse(&text)
    }

    /// Parse a tokens file's contents.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: TokensFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut entries = Vec::with_capacity(file.tokens.len());
        for t in file.tokens {
            let hex = t
                .hash
                .strip_prefix("blake3:")
                .ok_or_else(|| format!("token `{}`: `hash` must be `blake3:<hex>`", t.name))?;
            let hash = blake3::Hash::from_hex(hex).map_err(|e| format!("token `{}`: `hash`: {e}", t.name))?;
            if t.bots.is_empty() || t.rights.is_empty() {
                return Err(format!("token `{}` grants no bot or no right", t.name));
            }
            entries.push((hash, t));
        }
        Ok(Tokens { entries: Some(entries) })
    }

    /// These tokens and `token`, which may do everything (named `owner`). Tokens become
    /// required if they were not. Refused when an entry is named `owner` already: limits
    /// (watch streams) and logs go by name.
    pub fn with_owner(self, token: &str) -> Result<Self, String> {
        if self.entries.iter().flatten().any(|(_, e)| e.name == "owner") {
            return Err("token `owner`: that name is the owner token's (--owner-token)".into());
        }
        let entry = TokenEntry {
            name: "owner".into(),
            hash: hash_token(token),
            bots: vec!["*".into()],
            rights: vec![Right::Read, Right::Write, Right::Admin],
        };
        let mut entries = self.entries.unwrap_or_default();
        entries.push((blake3::hash(token.as_bytes()), entry));
        Ok(Tokens { entries: Some(entries) })
    }

    /// Whether requests need a token.
    pub fn required(&self) -> bool {
        self.entries.is_some()
    }

    /// The grant of the bearer token in `authorization` (the header's value), or `None`
    /// when tokens are required and it is missing or matches none.
    pub fn grant(&self, authorization: Option<&str>) -> Option<Grant> {
        let Some(entries) = &self.entries else {
            return Some(Grant::everything());
        };
        // The scheme is case-insensitive (RFC 7235), and one or more spaces follow it.
        let (scheme, token) = authorization?.trim().split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        let token = token.trim();
        let presented = blake3::hash(token.as_bytes());
        // Every entry is compared (in constant time each), so the time taken does not say
        // which one matched.
        let mut found = None;
        for (hash, entry) in entries {
            if *hash == presented && found.is_none() {
                found = Some(entry);
            }
        }
        found.map(|e| Grant {
            name: e.name.clone(),
            bots: e.bots.clone(),
            rights: e.rights.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_grants_its_bots_and_rights_only() {
        let token = new_token();
        let file = serde_json::json!({"tokens": [
            {"name": "a", "hash": hash_token(&token), "bots": ["helpdesk", "team-*"], "rights": ["read"]},
        ]})
        .to_string();
        let tokens = Tokens::parse(&file).unwrap();
        assert!(tokens.required());
        assert!(tokens.grant(None).is_none());
        assert!(tokens.grant(Some("Bearer wrong")).is_none());
        assert!(tokens.grant(Some(&token)).is_none(), "the scheme is required");
        assert!(tokens.grant(Some(&format!("Basic {token}"))).is_none());
        for scheme in ["bearer", "BEARER", "bEaReR  "] {
            assert!(tokens.grant(Some(&format!("{scheme} {token}"))).is_some(), "{scheme}");
        }
        let g = tokens.grant(Some(&format!("Bearer {token}"))).unwrap();
        assert!(g.allows("helpdesk", Right::Read) && g.allows("team-x", Right::Read));
        assert!(!g.allows("helpdesk", Right::Write), "read only");
        assert!(!g.allows("helpdesk2", Right::Read) && !g.allows("other", Right::Read));
        assert!(!g.all_bots() && !g.has(Right::Admin));
        assert!(Tokens::open().grant(None).unwrap().all_bots());
    }

    #[test]
    fn an_owner_token_makes_tokens_required_and_may_do_everything() {
        let owner = Tokens::open().with_owner("secret").unwrap();
        assert!(owner.required());
        assert!(owner.grant(None).is_none() && owner.grant(Some("Bearer other")).is_none());
        let g = owner.grant(Some("Bearer secret")).unwrap();
        assert!(g.all_bots() && g.has(Right::Admin) && g.allows("any", Right::Write));
        // Beside a tokens file: its tokens keep their scope; a second `owner` is refused.
        let hash = hash_token("reader");
        let file = format!(r#"{{"tokens": [{{"name": "r", "hash": "{hash}", "bots": ["a"], "rights": ["read"]}}]}}"#);
        let both = Tokens::parse(&file).unwrap().with_owner("secret").unwrap();
        let r = both.grant(Some("Bearer reader")).unwrap();
        assert!(r.allows("a", Right::Read) && !r.allows("a", Right::Write) && !r.allows("b", Right::Read));
        assert!(both.grant(Some("Bearer secret")).unwrap().has(Right::Admin));
        let named = file.replace(r#""name": "r""#, r#""name": "owner""#);
        assert!(Tokens::parse(&named).unwrap().with_owner("secret").is_err());
    }

    #[test]
    fn a_malformed_tokens_file_is_refused() {
        for bad in [
            r#"{"tokens": [{"name": "a", "hash": "deadbeef", "bots": ["*"], "rights": ["read"]}]}"#,
            r#"{"tokens": [{"name": "a", "hash": "blake3:zz", "bots": ["*"], "rights": ["read"]}]}"#,
            r#"{"tokens": [{"name": "a", "hash": "blake3:00", "bots": [], "rights": ["read"]}]}"#,
            r#"{"tokens": [{"name": "a", "token": "plain", "bots": ["*"], "rights": ["read"]}]}"#,
            r#"{"tokens": [{"name": "a", "hash": "blake3:00", "bots": ["*"], "rights": ["root"]}]}"#,
        ] {
            assert!(Tokens::parse(bad).is_err(), "{bad}");
        }
    }
}
