//! What a caller appends: a record, its body, its kind.

use chrono::{DateTime, Utc};

/// What a record asks for: a value (`Put`) or its permanent removal (`Tombstone`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A value for the id.
    Put,
    /// The permanent removal of the id.
    Tombstone,
}

impl Kind {
    /// The stored code (0 put, 1 tombstone).
    pub fn as_u8(self) -> u8 {
        match self {
            Kind::Put => 0,
            Kind::Tombstone => 1,
        }
    }

    /// From the stored code.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Kind::Put),
            1 => Some(Kind::Tombstone),
            _ => None,
        }
    }
}

/// The payload of a record: text or opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// UTF-8 text.
    Text(String),
    /// Opaque bytes.
    Bytes(Vec<u8>),
}

impl Body {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::Text(s) => s.len(),
            Body::Bytes(b) => b.len(),
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Body {
    fn default() -> Self {
        Body::Text(String::new())
    }
}

/// What a caller appends. `id` is the idempotency key.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Caller-chosen; the idempotency key (rule 6).
    pub id: String,
    /// The bot the record belongs to.
    pub bot_id: String,
    /// The session (conversation) within the bot.
    pub session_id: String,
    /// Who speaks: `user`, `assistant`, `tool`, ….
    pub role: String,
    /// The body's media type.
    pub content_type: String,
    /// The payload.
    pub body: Body,
    /// A JSON object, or nothing.
    pub metadata: Option<serde_json::Value>,
    /// Caller's timestamp; stored but not covered by the content hash.
    pub created_at: Option<DateTime<Utc>>,
    /// Put or tombstone.
    pub kind: Kind,
}

impl Record {
    /// A text `Put` with content type `text/plain` and no metadata.
    pub fn text(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        role: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: role.into(),
            content_type: "text/plain".into(),
            body: Body::Text(text.into()),
            metadata: None,
            created_at: None,
            kind: Kind::Put,
        }
    }

    /// A tombstone for `id`.
    pub fn tombstone(id: impl Into<String>, bot_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: String::new(),
            content_type: String::new(),
            body: Body::Text(String::new()),
            metadata: None,
            created_at: None,
            kind: Kind::Tombstone,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored kind codes (0 put, 1 tombstone) read back; any other code is refused.
    #[test]
    fn kinds_read_back_from_their_stored_codes() {
        for k in [Kind::Put, Kind::Tombstone] {
            assert_eq!(Kind::from_u8(k.as_u8()), Some(k));
        }
        assert_eq!(Kind::from_u8(2), None);
    }

    #[test]
    fn a_body_is_empty_when_it_has_no_bytes() {
        assert!(Body::Text(String::new()).is_empty() && Body::Bytes(Vec::new()).is_empty());
        assert!(!Body::Text("a".into()).is_empty() && !Body::Bytes(vec![0]).is_empty());
        assert_eq!(Body::Text("ab".into()).len(), 2);
    }
}
