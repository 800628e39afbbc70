//! `cargo xtask tidy` (also part of `test`): keeps docs and code in step.
//!
//! - every Rust source file is named in ARCHITECTURE.md's code map;
//! - every Rust source file starts with a `//!` doc saying what it is for;
//! - every conformance case (`pub async fn …(ctx: Ctx)` under `conformance/src/`) is listed
//!   by `case!(…)`, so that it runs;
//! - no file points outside the repository (the contract lives in `docs/contract.md`);
//! - every repository path a Markdown file names (in backticks, or as a relative link)
//!   exists;
//! - no two modules of a crate use each other, directly or around a cycle (`imports`);
//! - every crate's clippy configuration carries the root `clippy.toml`'s bans, and the
//!   crates that hold SQLite handles in their process carry SQLite's file-open bans too
//!   (clippy reads only the nearest `clippy.toml` and merges nothing, so a crate's own file
//!   silently drops the root's bans).

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::cargo;

pub(crate) fn run() -> Result<()> {
    let started = std::time::Instant::now();
    let root = cargo::root();
    let files = tracked_files(&root)?;
    let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).context("read ARCHITECTURE.md")?;
    let problems = check(&root, &files, &architecture)?;
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("xtask: tidy: {p}");
        }
        bail!("tidy found {} problem(s)", problems.len());
    }
    eprintln!(
        "xtask: tidy … ok ({} files, {:.1} s)",
        files.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The files git tracks, and the untracked ones it does not ignore.
fn tracked_files(root: &Path) -> Result<Vec<String>> {
    let out = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard"])
        .current_dir(root)
        .output()
        .context("git ls-files")?;
    if !out.status.success() {
        bail!("git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut files: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|f| root.join(f).is_file())
        .map(String::from)
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}

fn check(root: &Path, files: &[String], architecture: &str) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    let mut cases_listed = String::new();
    let mut cases_defined: Vec<(String, String)> = Vec::new();
    // Each crate's `src/`, its files by module, for the import check.
    let mut crates: std::collections::BTreeMap<&str, Vec<(String, String)>> = Default::default();
    for f in files {
        let text = std::fs::read_to_string(root.join(f)).unwrap_or_default();
        // Nothing points outside the repository.
        if f != "xtask/src/tidy.rs" && (text.contains("../shared") || text.contains("DESIGN.md")) {
            problems.push(format!("{f} refers to a file outside the repository"));
        }
        if f.ends_with(".md") {
            for missing in missing_paths(root, f, &text) {
                problems.push(format!("{f} names `{missing}`, which does not exist"));
            }
        }
        if !f.ends_with(".rs") {
            continue;
        }
        if let Some(i) = f.find("src/").filter(|i| *i == 0 || f[..*i].ends_with('/')) {
            crates
                .entry(&f[..i + 4])
                .or_default()
                .push((f[i + 4..].to_string(), text.clone()));
        }
        if !architecture.contains(f.as_str()) {
            problems.push(format!("{f} is missing from ARCHITECTURE.md's code map"));
        }
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        // An example is shown in the README as it is, and `include!`d by the test that
        // runs it, where an inner doc is out of place: a plain comment says what it is for.
        let example = f.contains("/examples/") && first.starts_with("// ");
        if !first.starts_with("//!") && !example {
            problems.push(format!("{f} does not start with a `//!` doc saying what it is for"));
        }
        if f.starts_with("conformance/src/") {
            cases_listed.push_str(&text);
            for line in text.lines() {
                let line = line.trim();
                if let Some(rest) = line.strip_prefix("pub async fn ")
                    && rest.contains("(ctx: Ctx)")
                {
                    let name = rest.split('(').next().unwrap_or("").to_string();
                    cases_defined.push((f.clone(), name));
                }
            }
        }
    }
    // No import cycles.
    for (src, files) in crates {
        for cycle in crate::imports::cycles(&files) {
            problems.push(format!("{src}: {cycle}"));
        }
    }
    for (f, case) in cases_defined {
        let listed =
            cases_listed.contains(&format!("case!({case})")) || cases_listed.contains(&format!("case!({case},"));
        if !listed {
            problems.push(format!(
                "conformance case `{case}` ({f}) is not listed by `case!({case})`, so it never runs"
            ));
        }
    }
    problems.extend(clippy_bans(root, files));
    Ok(problems)
}

/// Crates that open SQLite stores in their own process: a file of the store opened beside
/// SQLite there drops SQLite's locks (see `backends/sqlite/clippy.toml`).
const SQLITE_IN_PROCESS: [&str; 4] = [
    "backends/sqlite",
    "crates/ctxlog",
    "crates/ctxlog-cli",
    "crates/ctxlog-server",
];

/// The banned paths (`path = "…"`) of a clippy.toml.
fn banned(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split("path = \"").nth(1)?.split('"').next().map(String::from))
        .collect()
}

/// Every crate's nearest clippy.toml holds the bans it must carry.
fn clippy_bans(root: &Path, files: &[String]) -> Vec<String> {
    let read = |f: &str| std::fs::read_to_string(root.join(f)).unwrap_or_default();
    let everywhere = banned(&read("clippy.toml"));
    let beside_sqlite = banned(&read("backends/sqlite/clippy.toml"));
    let mut problems = Vec::new();
    for manifest in files.iter().filter(|f| f.ends_with("/Cargo.toml")) {
        let dir = manifest.trim_end_matches("/Cargo.toml");
        let nearest = Path::new(dir)
            .ancestors()
            .map(|d| d.join("clippy.toml"))
            .find(|c| root.join(c).is_file())
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let has = banned(&read(&nearest));
        let mut must: Vec<&String> = everywhere.iter().collect();
        if SQLITE_IN_PROCESS.contains(&dir) {
            must.extend(&beside_sqlite);
        }
        for ban in must.into_iter().filter(|b| !has.contains(b)) {
            problems.push(format!(
                "{dir}: its clippy configuration ({nearest}) does not ban `{ban}`"
            ));
        }
    }
    problems
}

/// The directories at the repository's top that a path in the docs starts with.
const TOP: [&str; 11] = [
    "crates/",
    "backends/",
    "conformance/",
    "testkits/",
    "chaos/",
    "benches/",
    "xtask/",
    "docs/",
    "python/",
    ".ci/",
    ".config/",
];

/// The repository paths Markdown file `f` names that do not exist: `` `dir/…` `` spans
/// starting with a top directory, and relative link targets. Patterns (`*`, `{…}`, `<…>`,
/// `…`) are not paths.
fn missing_paths(root: &Path, f: &str, text: &str) -> Vec<String> {
    let base = Path::new(f).parent().unwrap_or(Path::new(""));
    let mut named: Vec<(String, bool)> = text
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| !span.contains(char::is_whitespace))
        .map(|span| (span.to_string(), false))
        .collect();
    for link in text.split("](").skip(1) {
        let target = link.split([')', '#', ' ']).next().unwrap_or("");
        if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
            named.push((target.to_string(), true));
        }
    }
    let mut missing = Vec::new();
    for (path, relative) in named {
        let path = path.trim_end_matches(['.', ',', ':', ';']);
        if ["*", "{", "<", "…", "|"].iter().any(|c| path.contains(c)) {
            continue;
        }
        let at = if relative {
            root.join(base).join(path)
        } else if TOP.iter().any(|t| path.starts_with(t)) {
            root.join(path)
        } else {
            continue;
        };
        if !at.exists() {
            missing.push(path.to_string());
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rule_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("conformance/src")).unwrap();
        std::fs::write(root.join("a.rs"), "//! Documented.\nfn main() {}\n").unwrap();
        std::fs::write(root.join("b.rs"), "fn undocumented() {}\n").unwrap();
        std::fs::write(
            root.join("conformance/src/r.rs"),
            "//! Cases.\npub fn cases() { case!(listed) }\npub async fn listed(ctx: Ctx) {}\npub async fn forgotten(ctx: Ctx) {}\n",
        )
        .unwrap();
        std::fs::write(
            root.join("README.md"),
            "see ../shared/DESIGN.md, `conformance/src/r.rs`, `docs/gone.md`, [a](a.rs), [b](docs/x.md) and `crates/*/src`\n",
        )
        .unwrap();
        let files: Vec<String> = ["a.rs", "b.rs", "conformance/src/r.rs", "README.md"]
            .map(String::from)
            .to_vec();
        let problems = check(root, &files, "a.rs conformance/src/r.rs").unwrap();
        let all = problems.join("\n");
        assert!(all.contains("b.rs is missing from ARCHITECTURE.md"), "{all}");
        assert!(all.contains("b.rs does not start with"), "{all}");
        assert!(all.contains("`forgotten`"), "{all}");
        assert!(!all.contains("`listed`"), "{all}");
        assert!(all.contains("README.md refers to a file outside"), "{all}");
        assert!(all.contains("README.md names `docs/gone.md`"), "{all}");
        assert!(all.contains("README.md names `docs/x.md`"), "{all}");
        assert_eq!(problems.len(), 6, "{all}");
    }

    #[test]
    fn a_crate_whose_clippy_toml_drops_a_ban_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let ban = |paths: &[&str]| {
            let entries: Vec<String> = paths
                .iter()
                .map(|p| format!("  {{ path = \"{p}\", reason = \"r\" }},"))
                .collect();
            format!(
                "# {{ path = \"commented::out\" }}\ndisallowed-methods = [\n{}\n]\n",
                entries.join("\n")
            )
        };
        for d in ["backends/sqlite", "crates/ctxlog-cli", "crates/other", "crates/own"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
            std::fs::write(root.join(d).join("Cargo.toml"), "").unwrap();
        }
        std::fs::write(root.join("clippy.toml"), ban(&["clock::now"])).unwrap();
        std::fs::write(
            root.join("backends/sqlite/clippy.toml"),
            ban(&["clock::now", "fs::read"]),
        )
        .unwrap();
        // Its own file, which forgets the root's ban.
        std::fs::write(root.join("crates/own/clippy.toml"), ban(&["fs::read"])).unwrap();
        let files: Vec<String> = ["backends/sqlite", "crates/ctxlog-cli", "crates/other", "crates/own"]
            .map(|d| format!("{d}/Cargo.toml"))
            .to_vec();
        let problems = clippy_bans(root, &files);
        let all = problems.join("\n");
        // The CLI reads the root file only: it lacks SQLite's file-open ban.
        assert!(
            all.contains("crates/ctxlog-cli: its clippy configuration (clippy.toml) does not ban `fs::read`"),
            "{all}"
        );
        assert!(
            all.contains("crates/own: its clippy configuration (crates/own/clippy.toml) does not ban `clock::now`"),
            "{all}"
        );
        assert_eq!(problems.len(), 2, "{all}");
    }
}
