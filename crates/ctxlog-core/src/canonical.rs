//! Canonical JSON: object keys sorted, no whitespace. Used for metadata in the content hash
//! and for the byte-for-byte comparison of projections across backends. It does not rely
//! on serde_json's map ordering, which a `preserve_order` feature elsewhere could change.

use serde_json::Value;

/// Canonical JSON of `v`: keys sorted at every level, no whitespace.
pub fn canonical_json(v: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, v);
    out
}

fn write_value(out: &mut String, v: &Value) {
    match v {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_value(out, &map[k]);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Canonical JSON of any serialisable value (a projection, a conflict list).
pub(crate) fn to_canonical_json<T: serde::Serialize>(value: &T) -> String {
    let v = serde_json::to_value(value).expect("ctxlog values always serialise");
    canonical_json(&v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_nested_keys() {
        let v: Value = serde_json::from_str(r#"{"z":1,"a":[{"q":1,"b":2}],"m":"x\"y"}"#).unwrap();
        assert_eq!(canonical_json(&v), r#"{"a":[{"b":2,"q":1}],"m":"x\"y","z":1}"#);
    }

    #[test]
    fn serialisable_values_are_written_canonically() {
        #[derive(serde::Serialize)]
        struct S {
            z: u8,
            a: Vec<&'static str>,
        }
        let s = S {
            z: 1,
            a: vec!["p", "q"],
        };
        assert_eq!(to_canonical_json(&s), r#"{"a":["p","q"],"z":1}"#);
    }

    #[test]
    fn separates_array_items_and_keeps_their_order() {
        let v: Value = serde_json::from_str(r#"[3, {"b": [], "a": null}, "x", [1, 2]]"#).unwrap();
        assert_eq!(canonical_json(&v), r#"[3,{"a":null,"b":[]},"x",[1,2]]"#);
    }
}
