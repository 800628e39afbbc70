//! The OpenAPI document checked in beside the crate is the one the routes generate, and no
//! route reaches the router without being in it.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use super::{DOCUMENT, document};

/// How to bring `openapi.json` up to date (the workspace's one feature set, as every build).
const BLESS: &str = "CTXLOG_BLESS=1 cargo nextest run --workspace --all-features \
                     -E 'test(the_checked_in_openapi_document_is_the_generated_one)'";

/// A change to the API is a change to `openapi.json`: the test fails, naming what differs,
/// until the file is regenerated (`CTXLOG_BLESS=1`) and the change is committed with it.
#[test]
fn the_checked_in_openapi_document_is_the_generated_one() {
    let generated = serde_json::to_string_pretty(&document()).expect("the document serialises") + "\n";
    if generated == DOCUMENT {
        return;
    }
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json");
    if std::env::var_os("CTXLOG_BLESS").is_some() {
        #[allow(clippy::disallowed_methods)] // the checked-in document, not a store file
        std::fs::write(&file, &generated).unwrap_or_else(|e| panic!("write {}: {e}", file.display()));
        eprintln!("wrote {}", file.display());
        return;
    }
    let generated: Value = serde_json::from_str(&generated).expect("the generated document is JSON");
    let what = match serde_json::from_str::<Value>(DOCUMENT) {
        Err(e) => format!("openapi.json is not JSON: {e}"),
        Ok(checked_in) => {
            let mut found = Vec::new();
            differences(String::new(), &checked_in, &generated, &mut found);
            if found.is_empty() {
                "the same document, laid out differently".to_string()
            } else {
                let shown = found.len().min(40);
                let mut out = found[..shown].join("\n");
                if found.len() > shown {
                    let _ = write!(out, "\n… and {} more", found.len() - shown);
                }
                out
            }
        }
    };
    panic!(
        "{} is not the document the routes generate:\n{what}\n\nIf the change to the API is meant, \
         regenerate the file and commit it with the change:\n  {BLESS}",
        file.display()
    );
}

/// Where `checked_in` and `generated` differ, one line each, by path into the document.
fn differences(at: String, checked_in: &Value, generated: &Value, out: &mut Vec<String>) {
    match (checked_in, generated) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, va) in a {
                match b.get(k) {
                    Some(vb) => differences(format!("{at}[{k:?}]"), va, vb, out),
                    None => out.push(format!("{at}[{k:?}]: only in openapi.json: {}", short(va))),
                }
            }
            for (k, vb) in b.iter().filter(|(k, _)| !a.contains_key(*k)) {
                out.push(format!("{at}[{k:?}]: only in the generated document: {}", short(vb)));
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (va, vb)) in a.iter().zip(b).enumerate() {
                differences(format!("{at}[{i}]"), va, vb, out);
            }
        }
        _ if checked_in != generated => out.push(format!(
            "{at}: openapi.json has {}, the generated document {}",
            short(checked_in),
            short(generated)
        )),
        _ => {}
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s,
    }
}

/// `routes!` takes a route's path and methods from its handler's `#[utoipa::path]`, so what
/// it registers is in the document. A route registered by a call that takes a path of its
/// own would be served undocumented: no source file of the crate makes one.
#[test]
fn every_route_is_registered_through_its_documentation() {
    // Spelt in pieces, so that this file does not match itself.
    let calls = [
        concat!(".", "route("),
        concat!(".", "route_service("),
        concat!(".", "nest("),
        concat!(".", "nest_service("),
        concat!(".", "fallback_service("),
    ];
    let mut found = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the crate's sources") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                #[allow(clippy::disallowed_methods)] // a source file, not a store file
                let text = std::fs::read_to_string(&path).expect("read a source file");
                for (n, line) in text.lines().enumerate() {
                    // The one exception: MCP's endpoint speaks JSON-RPC, described by its
                    // own `tools/list`, not by the OpenAPI document.
                    let mcp = path.ends_with("listen.rs") && line.contains(r#"("/mcp", crate::mcp::service("#);
                    if calls.iter().any(|c| line.contains(c)) && !mcp {
                        found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                    }
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a route registered outside `routes!` is not in the OpenAPI document:\n{}",
        found.join("\n")
    );
}
