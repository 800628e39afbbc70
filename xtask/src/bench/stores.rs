//! Store URIs and the local files of a store: one place for the benches and the smoke test.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

/// The URI of a local store of `backend` (`sqlite` or `lance`) at `path`; any other name is
/// an error, never a guess.
pub(crate) fn store_uri(backend: &str, path: &Path) -> Result<String> {
    match backend {
        "sqlite" => Ok(format!("sqlite:{}", path.display())),
        "lance" => Ok(format!("lance:{}", path.display())),
        other => anyhow::bail!("no local store of backend `{other}` (have: sqlite, lance)"),
    }
}

/// The local path a store URI of [`store_uri`] names.
pub(crate) fn path_of(uri: &str) -> PathBuf {
    PathBuf::from(
        uri.strip_prefix("sqlite:")
            .or_else(|| uri.strip_prefix("lance:"))
            .unwrap_or(uri),
    )
}

/// A store URI for `path` of the same backend as `uri`.
fn store_uri_like(uri: &str, path: &Path) -> Result<String> {
    let backend = uri
        .split_once(':')
        .map(|(scheme, _)| scheme)
        .context("a local store URI names its backend (`sqlite:` or `lance:`)")?;
    store_uri(backend, path)
}

/// Copy a local store: a SQLite file consistently (the online backup API), a dataset
/// directory file by file.
pub(crate) fn copy_store(bin: &Path, uri: &str, scratch: &Path) -> Result<String> {
    let src = path_of(uri);
    let name = src.file_name().context("store has a name")?;
    let dst = scratch.join(format!("refresh-{}", name.to_string_lossy()));
    remove_store(&store_uri_like(uri, &dst)?);
    if src.is_dir() {
        super::restore::copy_dir(&src, &dst)?;
    } else {
        super::restore::copy_sqlite(bin, &src, &dst)?;
    }
    store_uri_like(uri, &dst)
}

/// Remove a local store (a SQLite file with its -wal and -shm, or a directory).
pub(crate) fn remove_store(uri: &str) {
    let p = path_of(uri);
    if p.is_dir() {
        let _ = std::fs::remove_dir_all(&p);
    } else {
        let _ = std::fs::remove_file(&p);
        for ext in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{ext}", p.display()));
        }
    }
}

/// What a generated bench store is reused by: the store format of the build that would
/// generate it (`format`), the generator's version (`generator`) and the generator's
/// parameters, defaults included (`params`), as `ctxlog-bench store-key` reports them. A
/// store whose marker holds another key is regenerated.
pub(crate) fn generated_key(format: &str, generator: u64, params: &Value) -> String {
    // The parameters as a fingerprint: a marker stays one short line.
    let hash = blake3::hash(params.to_string().as_bytes()).to_hex();
    let params = &hash.as_str()[..16];
    format!("format {format}; generator {generator}; params {params}")
}

/// What a marker holds: the key, and what the generator reported.
pub(crate) fn marker(key: &str, generated: &Value) -> String {
    serde_json::json!({"key": key, "generated": generated}).to_string()
}

/// Whether a store whose marker holds `marker` (`None`: no marker) may be reused as the
/// store of `key`. A marker of before keys (the generator's report alone), or one that is
/// not JSON, is not a match.
pub(crate) fn reusable(marker: Option<&str>, key: &str) -> bool {
    marker
        .and_then(|m| serde_json::from_str::<Value>(m).ok())
        .is_some_and(|m| m["key"].as_str() == Some(key))
}

fn with_command<'a>(command: &'a str, args: &[&'a str]) -> Vec<&'a str> {
    std::iter::once(command).chain(args.iter().copied()).collect()
}

/// The key of the store that `ctxlog-bench generate <args>` would build at `uri` with this
/// binary (its `store-key`, which reads and writes nothing).
pub(crate) fn generated_key_of(bin: &Path, uri: &str, args: &[&str]) -> Result<String> {
    let v = super::probe::probe(bin, uri, false, &with_command("store-key", args))?;
    let format = v["format"].as_str().with_context(|| format!("no format in {v}"))?;
    let generator = v["generator"]
        .as_u64()
        .with_context(|| format!("no generator in {v}"))?;
    Ok(generated_key(format, generator, &v["params"]))
}

/// The store at `uri`, generated with `ctxlog-bench generate <args>`, or reused when its
/// marker `done` holds the key of what this binary would generate now. `generating` shows
/// progress while it generates.
pub(crate) fn generate_or_reuse(
    bin: &Path,
    uri: &str,
    done: &Path,
    args: &[&str],
    generating: impl FnOnce() -> indicatif::ProgressBar,
) -> Result<()> {
    let key = generated_key_of(bin, uri, args)?;
    if reusable(std::fs::read_to_string(done).ok().as_deref(), &key) && path_of(uri).exists() {
        return Ok(());
    }
    // No marker while the store is not the one it names.
    let _ = std::fs::remove_file(done);
    remove_store(uri);
    let pb = generating();
    let v = super::probe::probe(bin, uri, false, &with_command("generate", args))?;
    pb.finish_and_clear();
    std::fs::write(done, marker(&key, &v)).with_context(|| format!("write {}", done.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A backend name xtask does not know is an error, not a Lance store.
    #[test]
    fn a_store_of_an_unknown_backend_is_an_error() {
        let p = Path::new("/tmp/x");
        assert_eq!(store_uri("sqlite", p).unwrap(), "sqlite:/tmp/x");
        assert_eq!(store_uri("lance", p).unwrap(), "lance:/tmp/x");
        assert!(store_uri("sqlight", p).is_err());
        assert_eq!(store_uri_like("lance:/a", p).unwrap(), "lance:/tmp/x");
        assert!(store_uri_like("/a/b.db", p).is_err());
    }

    /// Fails when the key ignores the store format, the generator's version or its
    /// parameters: a store generated before any of them changed would be reused.
    #[test]
    fn a_generated_store_is_reused_only_for_the_same_format_generator_and_parameters() {
        let params = json!({"entries": 1000, "writers": 2, "seed": 42, "compact": true});
        let key = generated_key("sqlite 1 schema 00ff", 1, &params);
        let done = marker(&key, &json!({"entries": 1000, "seconds": 0.5}));
        assert!(reusable(Some(&done), &key));
        assert_eq!(
            key,
            generated_key("sqlite 1 schema 00ff", 1, &params),
            "a key is deterministic"
        );
        for (other, what) in [
            (generated_key("sqlite 2 schema 00ff", 1, &params), "the store format"),
            (
                generated_key("sqlite 1 schema 0100", 1, &params),
                "the store format (schema)",
            ),
            (generated_key("lance 1 schema 00ff", 1, &params), "the backend's format"),
            (
                generated_key("sqlite 1 schema 00ff", 2, &params),
                "the generator version",
            ),
            (
                generated_key(
                    "sqlite 1 schema 00ff",
                    1,
                    &json!({"entries": 1000, "writers": 2, "seed": 43, "compact": true}),
                ),
                "the generator's parameters",
            ),
        ] {
            assert_ne!(other, key, "the key ignores {what}");
            assert!(!reusable(Some(&done), &other), "reused across a change of {what}");
        }
        // No marker, a marker of before keys (the generator's report alone), not JSON.
        assert!(!reusable(None, &key));
        assert!(!reusable(Some(r#"{"entries":1000,"seconds":0.5}"#), &key));
        assert!(!reusable(Some("not json"), &key));
        assert!(!reusable(Some(""), &key));
    }
}
