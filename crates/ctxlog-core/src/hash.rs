//! The content hash: blake3 over a canonical encoding of every record field except
//! `created_at`. Two records with the same hash are the same write (rule 6).

use std::fmt;

use serde::{Serialize, Serializer};

use crate::canonical::write_canonical;
use crate::record::{Body, Kind, Record};

impl Record {
    /// The record's content hash (every field but `created_at`).
    pub fn content_hash(&self) -> ContentHash {
        ContentHash::of(self)
    }
}

/// Bumped if the encoding ever changes; part of every hash.
const ENCODING_VERSION: &[u8] = b"ctxlog-content-v1";

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
/// A record's content hash: 32 bytes of blake3.
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    /// The content hash of `record`.
    pub fn of(record: &Record) -> Self {
        // What is stored is what is hashed: a summary's coverage is in its stored body.
        let stored = record.stored_body();
        let (text, body): (bool, &[u8]) = match &*stored {
            Body::Text(t) => (true, t.as_bytes()),
            Body::Bytes(b) => (false, b),
        };
        let metadata = record.metadata.as_ref().map(|v| {
            let mut out = Vec::new();
            write_canonical(&mut out, v);
            out
        });
        Covered {
            id: record.id.as_bytes(),
            bot_id: record.bot_id.as_bytes(),
            session_id: record.session_id.as_bytes(),
            role: record.role.as_bytes(),
            content_type: record.content_type.as_bytes(),
            kind: record.kind,
            text,
            body,
        }
        .hash(metadata.as_deref())
    }

    /// From 32 stored bytes (`None` for any other length).
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        Some(ContentHash(bytes.try_into().ok()?))
    }

    /// 64 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        let mut s = String::with_capacity(64);
        for b in self.0 {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    /// From 64 hex digits.
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
            let pair = std::str::from_utf8(chunk).ok()?;
            out[i] = u8::from_str_radix(pair, 16).ok()?;
        }
        Some(ContentHash(out))
    }
}

/// The fields a content hash covers, as bytes: a record's, or a stored row's as read.
pub(crate) struct Covered<'a> {
    pub(crate) id: &'a [u8],
    pub(crate) bot_id: &'a [u8],
    pub(crate) session_id: &'a [u8],
    pub(crate) role: &'a [u8],
    pub(crate) content_type: &'a [u8],
    pub(crate) kind: Kind,
    /// Whether the body is text (else bytes).
    pub(crate) text: bool,
    pub(crate) body: &'a [u8],
}

impl Covered<'_> {
    /// The hash of these fields with `metadata`, the canonical JSON of the metadata object.
    pub(crate) fn hash(&self, metadata: Option<&[u8]>) -> ContentHash {
        let mut h = blake3::Hasher::new();
        field(&mut h, ENCODING_VERSION);
        field(&mut h, self.id);
        field(&mut h, self.bot_id);
        field(&mut h, self.session_id);
        field(&mut h, self.role);
        field(&mut h, self.content_type);
        field(&mut h, &[self.kind.as_u8()]);
        field(&mut h, if self.text { b"t" } else { b"b" });
        field(&mut h, self.body);
        match metadata {
            None => field(&mut h, b"-"),
            Some(m) => {
                field(&mut h, b"m");
                field(&mut h, m);
            }
        }
        ContentHash(*h.finalize().as_bytes())
    }
}

/// Length-prefixed, so that no two different field sequences encode the same bytes.
fn field(h: &mut blake3::Hasher, bytes: &[u8]) {
    h.update(&(bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

impl fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ContentHash({})", &self.to_hex()[..16])
    }
}

impl fmt::Display for ContentHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl Serialize for ContentHash {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_hex())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec() -> Record {
        Record::text("id-1", "bot", "s1", "user", "hello")
    }

    #[test]
    fn a_hash_reads_back_from_its_bytes_and_its_hex() {
        let h = rec().content_hash();
        assert_eq!(ContentHash::from_slice(&h.0), Some(h));
        assert_eq!(ContentHash::from_slice(&h.0[..31]), None, "31 bytes are no hash");
        assert_eq!(h.to_string(), h.to_hex());
        assert_eq!(ContentHash::from_hex(&h.to_string()), Some(h));
        assert_eq!(format!("{h:?}"), format!("ContentHash({})", &h.to_hex()[..16]));
    }

    #[test]
    fn created_at_is_not_covered() {
        let a = rec();
        let mut b = rec();
        b.created_at = chrono::DateTime::from_timestamp(1_780_000_000, 0);
        assert_eq!(a.content_hash(), b.content_hash());
    }

    #[test]
    fn every_other_field_is_covered() {
        let base = rec().content_hash();
        let mut variants: Vec<Record> = Vec::new();
        let mut r = rec();
        r.id.push('x');
        variants.push(r);
        let mut r = rec();
        r.bot_id.push('x');
        variants.push(r);
        let mut r = rec();
        r.session_id.push('x');
        variants.push(r);
        let mut r = rec();
        r.role.push('x');
        variants.push(r);
        let mut r = rec();
        r.content_type.push('x');
        variants.push(r);
        let mut r = rec();
        r.body = Body::Text("hellO".into());
        variants.push(r);
        let mut r = rec();
        r.body = Body::Bytes(b"hello".to_vec());
        variants.push(r);
        let mut r = rec();
        r.metadata = Some(serde_json::json!({}));
        variants.push(r);
        let mut r = rec();
        r.kind = Kind::Tombstone;
        variants.push(r);
        for v in variants {
            assert_ne!(v.content_hash(), base, "{v:?}");
        }
    }

    #[test]
    fn field_boundaries_matter() {
        let a = Record::text("ab", "c", "s", "r", "");
        let b = Record::text("a", "bc", "s", "r", "");
        assert_ne!(a.content_hash(), b.content_hash());
    }

    #[test]
    fn metadata_key_order_does_not_matter() {
        let mut a = rec();
        a.metadata = Some(serde_json::from_str(r#"{"b":1,"a":{"y":2,"x":[1,2]}}"#).unwrap());
        let mut b = rec();
        b.metadata = Some(serde_json::from_str(r#"{"a":{"x":[1,2],"y":2},"b":1}"#).unwrap());
        assert_eq!(a.content_hash(), b.content_hash());
    }

    /// The encoding is part of every stored entry: a change to it (or to canonical JSON)
    /// would make every entry written before read as corrupt. Pinned to the bytes of v1.
    #[test]
    fn the_encoding_is_pinned() {
        let mut r = rec();
        r.metadata = Some(serde_json::json!({"z": [1, 2.5, null], "a": {"q": "\u{1}\"", "b": true}}));
        assert_eq!(
            r.content_hash().to_hex(),
            "9905eeb20a5f3fc80848aafcc55341b733c7ef04fc6ca892a766ad57b315aaec"
        );
        let mut b = Record::tombstone("id-2", "bot", "s2");
        b.body = Body::Bytes(vec![0, 255]);
        assert_eq!(
            b.content_hash().to_hex(),
            "292f1443d265552ad5bf4e4bf22888d1ec49e5112a4969dabb16e493dccb2b24"
        );
    }

    #[test]
    fn hex_round_trips() {
        let h = rec().content_hash();
        assert_eq!(ContentHash::from_hex(&h.to_hex()), Some(h));
    }
}
