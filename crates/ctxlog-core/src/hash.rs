//! The content hash: blake3 over a canonical encoding of every record field except
//! `created_at`. Two records with the same hash are the same write (rule 6).

use std::fmt;

use serde::{Serialize, Serializer};

use crate::canonical::canonical_json;
use crate::record::{Body, Record};

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
        let mut h = blake3::Hasher::new();
        field(&mut h, ENCODING_VERSION);
        field(&mut h, record.id.as_bytes());
        field(&mut h, record.bot_id.as_bytes());
        field(&mut h, record.session_id.as_bytes());
        field(&mut h, record.role.as_bytes());
        field(&mut h, record.content_type.as_bytes());
        field(&mut h, &[record.kind.as_u8()]);
        match &record.body {
            Body::Text(t) => {
                field(&mut h, b"t");
                field(&mut h, t.as_bytes());
            }
            Body::Bytes(b) => {
                field(&mut h, b"b");
                field(&mut h, b);
            }
        }
        match &record.metadata {
            None => field(&mut h, b"-"),
            Some(v) => {
                field(&mut h, b"m");
                field(&mut h, canonical_json(v).as_bytes());
            }
        }
        ContentHash(*h.finalize().as_bytes())
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
    use crate::record::Kind;

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
        b.created_at = Some(chrono::Utc::now());
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

    #[test]
    fn hex_round_trips() {
        let h = rec().content_hash();
        assert_eq!(ContentHash::from_hex(&h.to_hex()), Some(h));
    }
}
