//! Input validation shared by every backend (rule 11). A batch is checked whole before
//! anything is written; the first bad field is named in the error.

use crate::error::{Error, Result};
use crate::ids::WriterId;
use crate::record::{Kind, Record};

/// The longest writer id, in bytes.
pub const MAX_WRITER_ID_BYTES: usize = 512;

impl WriterId {
    /// A writer id must be non-empty and at most [`MAX_WRITER_ID_BYTES`] bytes (rule 11).
    pub fn new(id: impl Into<String>) -> Result<Self> {
        let id = id.into();
        if id.is_empty() {
            return Err(Error::invalid("writer", None, "must not be empty"));
        }
        if id.len() > MAX_WRITER_ID_BYTES {
            return Err(too_long("writer", id.len(), MAX_WRITER_ID_BYTES));
        }
        Ok(WriterId::new_unchecked(id))
    }
}

/// Configurable input limits.
///
/// The defaults keep every stored column of every backend far from its limits: Lance keeps
/// ids, metadata and other short strings in columns with 32-bit offsets (2 GiB per batch),
/// and a batch is bounded to 64 MiB in all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest record id, bot id, session id, role and content type, in bytes.
    pub max_id_bytes: usize,
    /// Largest body, in bytes.
    pub max_body_bytes: usize,
    /// Largest metadata, in bytes of its canonical JSON.
    pub max_metadata_bytes: usize,
    /// Largest record: every id, the body and the metadata together, in bytes.
    pub max_record_bytes: usize,
    /// Most records in one append.
    pub max_batch_records: usize,
    /// Largest append: the bytes of all its records together.
    pub max_batch_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_id_bytes: 512,
            max_body_bytes: 16 * 1024 * 1024,
            max_metadata_bytes: 1024 * 1024,
            max_record_bytes: 18 * 1024 * 1024,
            max_batch_records: 10_000,
            max_batch_bytes: 64 * 1024 * 1024,
        }
    }
}

impl Limits {
    /// Check a whole batch before anything of it is written (rule 11): every record, then the
    /// batch's count and total size. The error names the field and the record.
    pub fn validate_batch(&self, records: &[Record]) -> Result<()> {
        if records.is_empty() {
            return Err(Error::invalid("records", None, "an append needs at least one record"));
        }
        if records.len() > self.max_batch_records {
            return Err(Error::invalid(
                "records",
                None,
                format!(
                    "{} records in one append, the limit is {}",
                    records.len(),
                    self.max_batch_records
                ),
            ));
        }
        let mut total = 0usize;
        for (i, r) in records.iter().enumerate() {
            let size = self.validate(r).map_err(|e| match e {
                Error::InvalidInput { field, reason, .. } => Error::InvalidInput {
                    field,
                    index: Some(i),
                    reason,
                },
                other => other,
            })?;
            total = total.saturating_add(size);
            if total > self.max_batch_bytes {
                return Err(Error::invalid(
                    "records",
                    Some(i),
                    format!(
                        "the batch reaches {total} bytes at this record, the limit is {} bytes per append",
                        self.max_batch_bytes
                    ),
                ));
            }
        }
        // One id of one bot twice with different content contradicts itself: the first would
        // win and the second be a divergent put the caller cannot see (rule 6). Refused.
        // Embeddings are not values (rule 27): one of an id beside its put is what a caller
        // appending a record with its vector sends; two of one id and model that differ are
        // refused as two values would be.
        type Key<'a> = (&'a str, &'a str, Option<&'a str>);
        let mut seen: std::collections::HashMap<Key<'_>, (usize, &Record)> = std::collections::HashMap::new();
        for (i, r) in records.iter().enumerate() {
            let model = (r.kind == Kind::Embedding).then_some(r.role.as_str());
            if let Some((first, earlier)) = seen.insert((&r.bot_id, &r.id, model), (i, r))
                && !same_content(earlier, r)
            {
                return Err(Error::invalid(
                    "id",
                    Some(i),
                    format!(
                        "`{}` is record {first} of this batch too, with other content: one batch cannot write an id twice differently",
                        r.id
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Check one record; returns its size in bytes (ids, body and metadata).
    pub fn validate(&self, r: &Record) -> Result<usize> {
        self.check_id("id", &r.id)?;
        self.check_id("bot_id", &r.bot_id)?;
        self.check_id("session_id", &r.session_id)?;
        if r.role.len() > self.max_id_bytes {
            return Err(too_long("role", r.role.len(), self.max_id_bytes));
        }
        // A tombstone carries no role; a value says who spoke.
        if r.role.is_empty() && r.kind != Kind::Tombstone {
            return Err(Error::invalid("role", None, "must not be empty"));
        }
        no_nul("role", &r.role)?;
        if r.content_type.len() > self.max_id_bytes {
            return Err(too_long("content_type", r.content_type.len(), self.max_id_bytes));
        }
        let mut metadata_bytes = 0;
        if let Some(m) = &r.metadata {
            if !m.is_object() {
                return Err(Error::invalid(
                    "metadata",
                    None,
                    format!("must be a JSON object, got {}", json_kind(m)),
                ));
            }
            metadata_bytes = json_len(m, self.max_metadata_bytes);
            if metadata_bytes > self.max_metadata_bytes {
                return Err(Error::invalid(
                    "metadata",
                    None,
                    format!(
                        "is more than {} bytes as JSON, the limit is {}",
                        self.max_metadata_bytes, self.max_metadata_bytes
                    ),
                ));
            }
        }
        if r.body.len() > self.max_body_bytes {
            return Err(too_long("body", r.body.len(), self.max_body_bytes));
        }
        // Stored as nanoseconds since the epoch (both backends): years 1677 to 2262.
        if let Some(t) = r.created_at
            && t.timestamp_nanos_opt().is_none()
        {
            return Err(Error::invalid(
                "created_at",
                None,
                format!("{t} is outside the storable range (years 1677 to 2262)"),
            ));
        }
        let coverage_bytes = check_covers(r)?;
        self.check_link(r)?;
        check_embedding(r)?;
        let size = [&r.id, &r.bot_id, &r.session_id, &r.role, &r.content_type]
            .iter()
            .map(|s| s.len())
            .sum::<usize>()
            + r.body.len()
            + metadata_bytes
            + coverage_bytes;
        if size > self.max_record_bytes {
            return Err(Error::invalid(
                "record",
                None,
                format!(
                    "is {size} bytes (ids, body and metadata), the limit is {}",
                    self.max_record_bytes
                ),
            ));
        }
        Ok(size)
    }

    /// Check an id, bot id or session id: non-empty, within the limit, no NUL. Also what a
    /// server checks of every such name in a request's path, read or write alike.
    pub fn check_id(&self, field: &'static str, v: &str) -> Result<()> {
        if v.is_empty() {
            return Err(Error::invalid(field, None, "must not be empty"));
        }
        if v.len() > self.max_id_bytes {
            return Err(too_long(field, v.len(), self.max_id_bytes));
        }
        no_nul(field, v)
    }
}

/// Names never hold NUL: C strings, logs and terminals end there, and two names that differ
/// after it would print alike.
fn no_nul(field: &'static str, v: &str) -> Result<()> {
    match v.find('\0') {
        Some(at) => Err(Error::invalid(field, None, format!("holds a NUL byte at {at}"))),
        None => Ok(()),
    }
}

/// Whether two records of one id have the same content (what their content hash covers).
fn same_content(a: &Record, b: &Record) -> bool {
    crate::hash::ContentHash::of(a) == crate::hash::ContentHash::of(b)
}

/// The length of `v` as compact JSON (the canonical form has the same length: only its key
/// order differs), counted without building the string; serialising stops at the first
/// write past `cap`.
fn json_len(v: &serde_json::Value, cap: usize) -> usize {
    struct Count {
        n: usize,
        cap: usize,
    }
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.n += buf.len();
            if self.n > self.cap {
                // Stop serialising: the answer is "too long" whatever follows.
                return Err(std::io::Error::other("over the cap"));
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count { n: 0, cap };
    let _ = serde_json::to_writer(&mut count, v);
    count.n
}

fn too_long(field: &'static str, len: usize, limit: usize) -> Error {
    Error::invalid(field, None, format!("is {len} bytes, the limit is {limit}"))
}

fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

impl Limits {
    /// A link names what it links to as text (rule 25): a fork another session of its bot,
    /// a hide a record id; each as an id would be.
    fn check_link(&self, r: &Record) -> Result<()> {
        if !r.kind.is_link() {
            return Ok(());
        }
        let crate::record::Body::Text(target) = &r.body else {
            return Err(Error::invalid("body", None, "a link names its target as text"));
        };
        let what = if r.kind == Kind::Fork { "session_id" } else { "id" };
        self.check_id("body", target).map_err(|e| match e {
            Error::InvalidInput { reason, .. } => Error::invalid("body", None, format!("the {what} it names {reason}")),
            other => other,
        })?;
        if r.kind == Kind::Fork && *target == r.session_id {
            return Err(Error::invalid("body", None, "a session cannot continue itself"));
        }
        Ok(())
    }
}

/// Longest model name, in bytes.
pub const MAX_MODEL_BYTES: usize = 128;

/// A model's name (rule 27): 1 to [`MAX_MODEL_BYTES`] printable ASCII characters, no space
/// (`text-embedding-3-small`, `sentence-transformers/all-MiniLM-L6-v2`, `nomic:v1.5`);
/// why not, otherwise.
pub fn check_model(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > MAX_MODEL_BYTES {
        return Err(format!("is {} bytes: 1 to {MAX_MODEL_BYTES}", name.len()));
    }
    match name.bytes().position(|c| !c.is_ascii_graphic()) {
        Some(at) => Err(format!("holds a character other than printable ASCII at byte {at}")),
        None => Ok(()),
    }
}

/// Most dimensions of an embedding (rule 27).
pub const MAX_DIMENSIONS: usize = 4096;

/// An embedding names its model as its role, its metric as its content type, and holds a
/// whole vector of finite values (rule 27); nothing but an embedding names a vector's metric.
fn check_embedding(r: &Record) -> Result<()> {
    let metric = crate::record::Metric::of_content_type(&r.content_type);
    if r.kind != Kind::Embedding {
        return match metric {
            Some(_) => Err(Error::invalid(
                "content_type",
                None,
                "is an embedding's: only a record of kind embedding holds a vector",
            )),
            None => Ok(()),
        };
    }
    if metric.is_none() {
        return Err(Error::invalid(
            "content_type",
            None,
            "an embedding's is `application/vnd.ctxlog.vector; metric=` and one of cosine, dot, l2",
        ));
    }
    check_model(&r.role).map_err(|why| Error::invalid("role", None, format!("the model {why}")))?;
    if r.metadata.is_some() {
        return Err(Error::invalid("metadata", None, "an embedding carries none"));
    }
    let crate::record::Body::Bytes(b) = &r.body else {
        return Err(Error::invalid(
            "body",
            None,
            "an embedding's vector is bytes (little-endian f32s)",
        ));
    };
    if b.is_empty() || b.len() % 4 != 0 || b.len() / 4 > MAX_DIMENSIONS {
        return Err(Error::invalid(
            "body",
            None,
            format!(
                "is {} bytes: a vector is 1 to {MAX_DIMENSIONS} little-endian f32s (4 bytes each)",
                b.len()
            ),
        ));
    }
    if let Some(at) = b
        .chunks_exact(4)
        .position(|c| !f32::from_le_bytes(c.try_into().expect("four bytes")).is_finite())
    {
        return Err(Error::invalid(
            "body",
            None,
            format!("value {at} of the vector is not finite"),
        ));
    }
    Ok(())
}

/// Most shards one summary's coverage may name (24 bytes each as stored).
pub const MAX_COVERED_SHARDS: usize = 65_536;

/// A summary names what it covers, and only a summary does (rule 21); returns the bytes the
/// coverage takes as stored.
fn check_covers(r: &Record) -> Result<usize> {
    match (r.kind, &r.covers) {
        (Kind::Summary, None) => Err(Error::invalid(
            "covers",
            None,
            "a summary needs the checkpoint of the view it summarises",
        )),
        (Kind::Fork, None) => Err(Error::invalid(
            "covers",
            None,
            "a fork needs the position of the view it continues",
        )),
        (Kind::Summary | Kind::Fork, Some(c)) => {
            if c.0.len() > MAX_COVERED_SHARDS {
                return Err(Error::invalid(
                    "covers",
                    None,
                    format!("names {} shards, the limit is {MAX_COVERED_SHARDS}", c.0.len()),
                ));
            }
            if let Some((shard, _)) = c.0.iter().find(|(_, seq)| **seq == 0) {
                return Err(Error::invalid(
                    "covers",
                    None,
                    format!("shard {shard} at seq 0: a covered position is a seq from 1 (leave the shard out)"),
                ));
            }
            Ok(c.0.len() * 24)
        }
        (_, Some(_)) => Err(Error::invalid(
            "covers",
            None,
            "only a summary or a fork names a position",
        )),
        (_, None) => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Body;

    fn field_of(e: Error) -> (&'static str, Option<usize>) {
        match e {
            Error::InvalidInput { field, index, .. } => (field, index),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    /// Names never hold NUL, a value has a role (a tombstone needs none), and a batch that
    /// writes one id of one bot twice differently contradicts itself (rule 6).
    #[test]
    fn nul_empty_roles_and_contradictory_ids_are_refused() {
        let l = Limits::default();
        let ok = Record::text("a", "b", "s", "user", "x");
        for (field, bad) in [
            ("id", Record::text("a\0b", "b", "s", "user", "x")),
            ("bot_id", Record::text("a", "b\0", "s", "user", "x")),
            ("session_id", Record::text("a", "b", "\0s", "user", "x")),
            ("role", Record::text("a", "b", "s", "us\0er", "x")),
            ("role", Record::text("a", "b", "s", "", "x")),
        ] {
            assert_eq!(field_of(l.validate(&bad).unwrap_err()).0, field, "{bad:?}");
        }
        l.validate(&Record::tombstone("a", "b", "s")).unwrap();
        let other = Record::text("a", "b", "s", "user", "y");
        assert_eq!(
            field_of(l.validate_batch(&[ok.clone(), other]).unwrap_err()),
            ("id", Some(1))
        );
        // The same record twice is a retry inside one batch; the same id of another bot is
        // another record.
        l.validate_batch(&[ok.clone(), ok.clone()]).unwrap();
        l.validate_batch(&[ok.clone(), Record::text("a", "c", "s", "user", "y")])
            .unwrap();
    }

    #[test]
    fn names_the_bad_field_and_record() {
        let l = Limits::default();
        let ok = Record::text("a", "b", "s", "user", "x");
        let mut bad = ok.clone();
        bad.session_id.clear();
        assert_eq!(
            field_of(l.validate_batch(&[ok.clone(), bad]).unwrap_err()),
            ("session_id", Some(1))
        );

        let mut r = ok.clone();
        r.id = "x".repeat(513);
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "id");
        let mut r = ok.clone();
        r.bot_id.clear();
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "bot_id");
        let mut r = ok.clone();
        r.metadata = Some(serde_json::json!([1]));
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "metadata");
        let small = Limits {
            max_body_bytes: 4,
            ..Limits::default()
        };
        let mut r = ok.clone();
        r.body = Body::Bytes(vec![0; 5]);
        assert_eq!(field_of(small.validate(&r).unwrap_err()).0, "body");
        r.body = Body::Bytes(vec![0; 4]);
        small.validate(&r).unwrap();
        assert_eq!(field_of(l.validate_batch(&[]).unwrap_err()).0, "records");
        let mut r = ok.clone();
        r.created_at = chrono::DateTime::from_timestamp(-20_000_000_000, 0);
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "created_at");
        l.validate(&ok).unwrap();
    }

    #[test]
    fn metadata_record_and_batch_sizes_are_bounded() {
        let l = Limits {
            max_metadata_bytes: 32,
            max_record_bytes: 64,
            max_batch_bytes: 100,
            ..Limits::default()
        };
        let mut r = Record::text("a", "b", "s", "user", "x");
        // {"k":"vvvvvvvvvvvvvvvvvvvvvvvvv"} is 33 bytes: one over.
        r.metadata = Some(serde_json::json!({"k": "v".repeat(25)}));
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "metadata");
        r.metadata = Some(serde_json::json!({"k": "v".repeat(24)}));
        assert_eq!(l.validate(&r).unwrap(), 1 + 1 + 1 + 4 + 10 + 1 + 32);

        let mut big = Record::text("a", "b", "s", "user", "x".repeat(50));
        assert_eq!(field_of(l.validate(&big).unwrap_err()).0, "record");
        big.body = Body::Text("x".repeat(47));
        assert_eq!(l.validate(&big).unwrap(), 64);

        // Two records of 64 bytes: the second pushes the batch over 100.
        let err = l.validate_batch(&[big.clone(), big.clone()]).unwrap_err();
        assert_eq!(field_of(err), ("records", Some(1)));
        l.validate_batch(std::slice::from_ref(&big)).unwrap();
        // A batch of exactly the limit is accepted: 64 + 36 = 100.
        let mut rest = big.clone();
        rest.id = "c".into();
        rest.body = Body::Text("x".repeat(47 - 28));
        assert_eq!(l.validate(&rest).unwrap(), 36);
        l.validate_batch(&[big.clone(), rest]).unwrap();

        let many = vec![Record::text("a", "b", "s", "r", ""); 3];
        let few = Limits {
            max_batch_records: 2,
            ..Limits::default()
        };
        assert_eq!(field_of(few.validate_batch(&many).unwrap_err()).0, "records");
        few.validate_batch(&many[..2]).unwrap();
    }

    /// Role and content type are bounded like ids: at the limit accepted, one over refused;
    /// metadata that is not an object is refused naming what it is.
    #[test]
    fn role_content_type_and_metadata_kind_are_checked() {
        let l = Limits {
            max_id_bytes: 8,
            ..Limits::default()
        };
        let mut r = Record::text("a", "b", "s", "r".repeat(8), "x");
        r.content_type = "t".repeat(8);
        l.validate(&r).unwrap();
        r.role.push('r');
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "role");
        r.role.pop();
        r.content_type.push('t');
        assert_eq!(field_of(l.validate(&r).unwrap_err()).0, "content_type");
        let mut r = Record::text("a", "b", "s", "user", "x");
        r.content_type = "t".into();
        for (v, kind) in [
            (serde_json::json!(null), "null"),
            (serde_json::json!(true), "a boolean"),
            (serde_json::json!(1), "a number"),
            (serde_json::json!("s"), "a string"),
            (serde_json::json!([]), "an array"),
        ] {
            r.metadata = Some(v);
            let err = l.validate(&r).unwrap_err();
            assert!(
                err.to_string().contains(&format!("must be a JSON object, got {kind}")),
                "{err}"
            );
        }
    }

    #[test]
    fn metadata_length_stops_counting_past_the_cap() {
        // Many values: serialising stops at the first write past the cap.
        let many = serde_json::Value::Object((0..10_000).map(|i| (format!("k{i}"), serde_json::json!(i))).collect());
        let n = json_len(&many, 100);
        assert!(n > 100 && n < 1000, "{n}");
        assert_eq!(
            json_len(&serde_json::json!({"a": [1, 2]}), 1000),
            r#"{"a":[1,2]}"#.len()
        );
    }

    /// An embedding is checked whole (rule 27): its model, metric, vector and no metadata;
    /// beside its own put in one batch it is no divergent write, two of one model that
    /// differ are; nothing but an embedding names a vector's metric.
    #[test]
    fn an_embedding_names_a_model_and_metric_and_holds_a_finite_vector() {
        use crate::record::Metric;
        let l = Limits::default();
        let ok = Record::embedding("a", "b", "s", "minilm/v2", Metric::Cosine, &[1.0, 0.5]);
        l.validate(&ok).unwrap();
        let bad = |f: &dyn Fn(&mut Record)| {
            let mut r = ok.clone();
            f(&mut r);
            field_of(l.validate(&r).unwrap_err()).0
        };
        assert_eq!(bad(&|r| r.role = "mini lm".into()), "role");
        assert_eq!(bad(&|r| r.role = "m".repeat(MAX_MODEL_BYTES + 1)), "role");
        assert_eq!(
            bad(&|r| r.content_type = "application/vnd.ctxlog.vector".into()),
            "content_type"
        );
        assert_eq!(bad(&|r| r.metadata = Some(serde_json::json!({}))), "metadata");
        assert_eq!(bad(&|r| r.body = Body::Text("1.0".into())), "body");
        assert_eq!(bad(&|r| r.body = Body::Bytes(vec![0; 6])), "body");
        assert_eq!(bad(&|r| r.body = Body::Bytes(Vec::new())), "body");
        assert_eq!(
            bad(&|r| r.body = Body::Bytes(vec![0; 4 * (MAX_DIMENSIONS + 1)])),
            "body"
        );
        assert_eq!(bad(&|r| r.body = Body::Bytes(f32::NAN.to_le_bytes().to_vec())), "body");
        assert_eq!(bad(&|r| r.kind = Kind::Put), "content_type");
        let put = Record::text("a", "b", "s", "user", "x");
        l.validate_batch(&[put.clone(), ok.clone()]).unwrap();
        let other_model = Record::embedding("a", "b", "s", "e5", Metric::L2, &[2.0]);
        l.validate_batch(&[put.clone(), ok.clone(), other_model]).unwrap();
        let again = Record::embedding("a", "b", "s", "minilm/v2", Metric::Cosine, &[0.0, 1.0]);
        assert_eq!(
            field_of(l.validate_batch(&[put, ok.clone(), again]).unwrap_err()),
            ("id", Some(2))
        );
    }
}
