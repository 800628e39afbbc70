//! Input validation shared by every backend (rule 11). A batch is checked whole before
//! anything is written; the first bad field is named in the error.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::types::Record;

/// Configurable input limits.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Longest record id, bot id and session id, in bytes.
    pub max_id_bytes: usize,
    /// Largest body, in bytes.
    pub max_body_bytes: usize,
    /// Most records in one append.
    pub max_batch_records: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_id_bytes: 512,
            max_body_bytes: 16 * 1024 * 1024,
            max_batch_records: 10_000,
        }
    }
}

impl Limits {
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
        for (i, r) in records.iter().enumerate() {
            self.validate(r).map_err(|e| match e {
                Error::InvalidInput { field, reason, .. } => Error::InvalidInput {
                    field,
                    index: Some(i),
                    reason,
                },
                other => other,
            })?;
        }
        Ok(())
    }

    pub fn validate(&self, r: &Record) -> Result<()> {
        self.check_id("id", &r.id)?;
        self.check_id("bot_id", &r.bot_id)?;
        self.check_id("session_id", &r.session_id)?;
        if r.role.len() > self.max_id_bytes {
            return Err(too_long("role", r.role.len(), self.max_id_bytes));
        }
        if r.content_type.len() > self.max_id_bytes {
            return Err(too_long("content_type", r.content_type.len(), self.max_id_bytes));
        }
        if let Some(m) = &r.metadata
            && !m.is_object()
        {
            return Err(Error::invalid(
                "metadata",
                None,
                format!("must be a JSON object, got {}", json_kind(m)),
            ));
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
        Ok(())
    }

    fn check_id(&self, field: &'static str, v: &str) -> Result<()> {
        if v.is_empty() {
            return Err(Error::invalid(field, None, "must not be empty"));
        }
        if v.len() > self.max_id_bytes {
            return Err(too_long(field, v.len(), self.max_id_bytes));
        }
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Body;

    fn field_of(e: Error) -> (&'static str, Option<usize>) {
        match e {
            Error::InvalidInput { field, index, .. } => (field, index),
            other => panic!("expected InvalidInput, got {other:?}"),
        }
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
}
