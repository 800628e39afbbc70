//! Canonical JSON: object keys sorted, no whitespace. Used for metadata in the content hash
//! and for the byte-for-byte comparison of projections across backends. It does not rely
//! on serde_json's map ordering, which a `preserve_order` feature elsewhere could change.

use serde_json::Value;

/// Canonical JSON of `v`: keys sorted at every level, no whitespace.
pub fn canonical_json(v: &Value) -> String {
    let mut out = Vec::new();
    write_canonical(&mut out, v);
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// Canonical JSON of `v` appended to `out`. Keys and scalars are written by serde_json
/// straight into `out`: a full check canonicalises the metadata of every entry it cannot
/// check as stored, so this allocates nothing per key or value.
pub(crate) fn write_canonical(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's map iterates in key order unless some crate in the build turns on
            // `preserve_order`: sort only when it does not.
            if map.keys().is_sorted() {
                write_members(out, map.iter());
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_by_key(|(k, _)| *k);
                write_members(out, members.into_iter());
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(out, item);
            }
            out.push(b']');
        }
        scalar => write_json(out, scalar),
    }
}

fn write_members<'v>(out: &mut Vec<u8>, members: impl Iterator<Item = (&'v String, &'v Value)>) {
    for (i, (k, v)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_json(out, k.as_str());
        out.push(b':');
        write_canonical(out, v);
    }
}

/// serde_json's compact form of a string or a scalar (what `Value`'s `Display` prints).
fn write_json<T: serde::Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) {
    serde_json::to_writer(out, v).expect("strings and JSON scalars always serialise into memory");
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

    /// The writer before it stopped allocating per key and value: the hash of every stored
    /// entry depends on these bytes, so the new one must write exactly the same.
    fn allocating_reference(out: &mut String, v: &Value) {
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
                    allocating_reference(out, &map[k]);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    allocating_reference(out, item);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    fn arb_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(Value::from),
            any::<String>().prop_map(Value::String),
            r#"[\\"\x{0}-\x{1f}\x{7f}-\x{a0}a-c]{0,6}"#.prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(any::<String>(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest::proptest! {
        #[test]
        fn writes_what_the_allocating_writer_wrote(v in arb_json()) {
            let mut expected = String::new();
            allocating_reference(&mut expected, &v);
            proptest::prop_assert_eq!(canonical_json(&v), expected);
        }
    }

    #[test]
    fn separates_array_items_and_keeps_their_order() {
        let v: Value = serde_json::from_str(r#"[3, {"b": [], "a": null}, "x", [1, 2]]"#).unwrap();
        assert_eq!(canonical_json(&v), r#"[3,{"a":null,"b":[]},"x",[1,2]]"#);
    }
}
