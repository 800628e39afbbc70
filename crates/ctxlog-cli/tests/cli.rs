//! The CLI's interface: command names, JSON field names and exit codes are what scripts
//! rely on. Every process runs under a deadline.
// This test process opens no store itself (every store is opened by a `ctxlog` child), so
// the files it writes and reads (inputs, tokens, reports) cannot drop a SQLite lock of its own.
#![allow(clippy::disallowed_methods)]

use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const DEADLINE: Duration = Duration::from_secs(60);

/// A `ctxlog` process with `args`, its stdin, stdout and stderr piped, killed when dropped.
fn spawn_ctxlog<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> tokio::process::Child {
    Command::new(env!("CARGO_BIN_EXE_ctxlog"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ctxlog")
}

async fn ctxlog(store: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = spawn_ctxlog(["--store", store, "--timeout", "20"].iter().chain(args));
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("ctxlog {args:?} hung"))
        .unwrap()
}

fn lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("`{l}`: {e}")))
        .collect()
}

fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    k.sort();
    k
}

#[tokio::test]
async fn append_then_read_with_the_documented_fields_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let input = [
        r#"{"id":"m1","bot_id":"b","session_id":"s","role":"user","text":"hello","metadata":{"k":1},"created_at":"2026-11-29T10:00:00Z"}"#,
        r#"{"id":"m2","bot_id":"b","session_id":"s","role":"assistant","bytes_b64":"AAEC","content_type":"application/octet-stream"}"#,
        r#"{"id":"m3","bot_id":"b","session_id":"s","role":"user","text":"bye"}"#,
    ]
    .join("\n");
    let out = ctxlog(&store, &["append", "--writer", "w1", "--batch", "2"], &input).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let acks = lines(&out);
    assert_eq!(acks.len(), 2, "one ack per batch");
    assert_eq!(keys(&acks[0]), ["epoch", "first_seq", "ids", "last_seq", "shard"]);
    assert_eq!(acks[0]["first_seq"], 1);
    assert_eq!(acks[1]["last_seq"], 3);
    assert_eq!(acks[1]["ids"], serde_json::json!(["m3"]));

    let out = ctxlog(&store, &["get", "--bot", "b", "m1"], "").await;
    assert!(out.status.success());
    let rec = &lines(&out)[0];
    assert_eq!(rec["text"], "hello");
    assert_eq!(rec["metadata"]["k"], 1);
    assert_eq!(rec["created_at"], "2026-11-29T10:00:00Z");
    for k in [
        "id",
        "bot_id",
        "session_id",
        "role",
        "content_type",
        "kind",
        "shard",
        "seq",
        "epoch",
        "hlc",
    ] {
        assert!(rec.get(k).is_some(), "field {k} missing from {rec}");
    }
    assert_eq!(
        ctxlog(&store, &["get", "--bot", "b", "nope"], "").await.status.code(),
        Some(1)
    );

    let out = ctxlog(&store, &["session", "--bot", "b", "--session", "s"], "").await;
    let view = lines(&out);
    assert_eq!(
        view.iter().map(|r| r["id"].as_str().unwrap()).collect::<Vec<_>>(),
        ["m1", "m2", "m3"]
    );
    assert_eq!(view[1]["bytes_b64"], "AAEC");

    let out = ctxlog(&store, &["sessions", "--bot", "b"], "").await;
    assert_eq!(lines(&out)[0]["records"], 3);
    let out = ctxlog(&store, &["shards"], "").await;
    let shards = lines(&out);
    assert_eq!(keys(&shards[0]), ["entries", "epoch", "last_seq", "shard", "writer"]);
    assert_eq!(shards[0]["writer"], "w1");
    assert_eq!(shards[0]["entries"], 3);

    // A divergent put and a tombstone, then the conflict report.
    let more = [
        r#"{"id":"m1","bot_id":"b","session_id":"s","role":"user","text":"changed"}"#,
        r#"{"id":"m3","bot_id":"b","session_id":"s","kind":"tombstone"}"#,
    ]
    .join("\n");
    assert!(
        ctxlog(&store, &["append", "--writer", "w2"], &more)
            .await
            .status
            .success()
    );
    let out = ctxlog(&store, &["conflicts"], "").await;
    let conflicts = lines(&out);
    assert_eq!(conflicts.len(), 1);
    assert_eq!(conflicts[0]["kind"], "divergent_put");
    assert_eq!(conflicts[0]["bot_id"], "b", "a conflict names its bot");
    assert_eq!(
        ctxlog(&store, &["get", "--bot", "b", "m3"], "").await.status.code(),
        Some(1)
    );
    // Ids are scoped by bot: the same id under another bot is another record.
    assert_eq!(
        ctxlog(&store, &["get", "--bot", "other", "m1"], "").await.status.code(),
        Some(1)
    );
    assert_eq!(
        ctxlog(&store, &["get", "m1"], "").await.status.code(),
        Some(2),
        "--bot is required"
    );
    let out = ctxlog(&store, &["stats"], "").await;
    let stats = &lines(&out)[0];
    assert_eq!(stats["live"], 2);
    assert_eq!(stats["tombstoned"], 1);
}

#[tokio::test]
async fn bad_input_exits_2_names_the_field_and_writes_nothing_of_its_batch() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let input = [
        r#"{"id":"ok1","bot_id":"b","session_id":"s","role":"user","text":"fine"}"#,
        r#"{"id":"ok2","bot_id":"b","session_id":"s","role":"user","text":"fine"}"#,
        r#"{"id":"bad","bot_id":"b","session_id":"s","role":"user","metadata":[1,2]}"#,
    ]
    .join("\n");
    let out = ctxlog(&store, &["append", "--writer", "w1", "--batch", "1"], &input).await;
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("`metadata`") && stderr.contains("line 3"), "{stderr}");
    assert!(stderr.contains("2 records before it were durably appended"), "{stderr}");
    let out = ctxlog(&store, &["shards"], "").await;
    assert_eq!(lines(&out)[0]["entries"], 2);

    let out = ctxlog(
        &store,
        &["append", "--writer", "w1"],
        "{\"id\": \"x\", \"bot_id\": \"b\"}\n",
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`session_id`"));
    let out = ctxlog(&store, &["append", "--writer", ""], "").await;
    assert_eq!(out.status.code(), Some(2));
}

#[tokio::test]
async fn store_uris_map_to_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let out = ctxlog("ftp://host/x", &["shards"], "").await;
    assert_eq!(out.status.code(), Some(2), "unknown scheme is usage");
    assert!(String::from_utf8_lossy(&out.stderr).contains("ftp"));
    let missing = format!("sqlite:{}", dir.path().join("missing.db").display());
    assert_eq!(ctxlog(&missing, &["shards"], "").await.status.code(), Some(1));
    assert!(!dir.path().join("missing.db").exists(), "reading never creates a store");
    assert_eq!(
        ctxlog(&missing, &["--timeout", "0", "shards"], "").await.status.code(),
        Some(2)
    );
}

#[tokio::test]
async fn demo_runs_the_quickstart_on_a_fresh_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("demo.db").display());
    let out = ctxlog(&store, &["demo"], "").await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("divergent_put"), "{text}");
    assert!(text.contains("1 retried duplicate(s) ignored"), "{text}");
    assert!(text.contains("gone from every view"), "{text}");
    // Every command it suggests works as printed after `cargo run` (no `ctxlog` on the PATH).
    let suggested: Vec<&str> = text
        .split("Try it yourself")
        .nth(1)
        .expect("the demo suggests commands")
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        !suggested.is_empty()
            && suggested
                .iter()
                .all(|l| l.starts_with("cargo run --release -- --store")),
        "the suggested commands must run from the repository: {suggested:?}"
    );
    // The demo's store is a real store: the CLI reads it back.
    let out = ctxlog(&store, &["conflicts"], "").await;
    assert_eq!(lines(&out).len(), 1);
    let out = ctxlog(
        &store,
        &["session", "--bot", "helpdesk", "--session", "ticket-1043"],
        "",
    )
    .await;
    assert_eq!(lines(&out).len(), 4);
}

/// An over-long input line is refused with exit 2 and its line number, without being read
/// whole (the input below is longer than any valid record can be, and never ends).
#[tokio::test]
async fn an_over_long_line_is_refused_with_its_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let mut child = spawn_ctxlog(["--store", &store, "--timeout", "20", "append", "--writer", "w1"]);
    let mut input = child.stdin.take().unwrap();
    let feeder = tokio::spawn(async move {
        let first = br#"{"id":"m1","bot_id":"b","session_id":"s","role":"user","text":"fine"}"#;
        input.write_all(first).await?;
        input.write_all(b"\n{\"id\":\"m2\",\"text\":\"").await?;
        let chunk = vec![b'x'; 1 << 20];
        // Up to 1 GiB: far past the cap; the reader stops long before (broken pipe here).
        for _ in 0..1024 {
            input.write_all(&chunk).await?;
        }
        std::io::Result::Ok(())
    });
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .expect("ctxlog hung on an over-long line")
        .unwrap();
    let _ = feeder.await;
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(stderr.contains("longer than"), "{stderr}");
}

/// Options out of range are usage errors (exit 2) naming the range, never a panic.
#[tokio::test]
async fn out_of_range_options_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    for args in [
        vec!["--timeout", "1e20", "stats"],
        vec!["--timeout", "0", "stats"],
        vec!["--timeout", "NaN", "stats"],
        vec!["--timeout", "-5", "stats"],
        vec!["append", "--writer", "w", "--batch", "0"],
        vec!["append", "--writer", "w", "--batch", "18446744073709551615"],
    ] {
        let mut child = spawn_ctxlog(["--store", store.as_str()].into_iter().chain(args.iter().copied()));
        // No input: stdin closes at once.
        let _ = child.stdin.take();
        let out = tokio::time::timeout(DEADLINE, child.wait_with_output())
            .await
            .expect("hung")
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}

/// A file that is not a ctxlog store: exit 2, the path named, the file untouched.
#[tokio::test]
async fn a_foreign_file_is_refused_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.db");
    {
        let store = format!("sqlite:{}", path.display());
        let out = ctxlog(&store, &["stats"], "").await;
        assert_eq!(out.status.code(), Some(1), "a missing store is not found");
    }
    std::fs::write(&path, b"SQLite format 3\0 but then garbage, not a database").unwrap();
    let before = std::fs::read(&path).unwrap();
    let store = format!("sqlite:{}", path.display());
    for args in [vec!["stats"], vec!["conflicts"], vec!["append", "--writer", "w1"]] {
        let out = ctxlog(
            &store,
            &args,
            r#"{"id":"m1","bot_id":"b","session_id":"s","role":"user","text":"x"}"#,
        )
        .await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("other.db"), "{args:?} names the file: {stderr}");
    }
    assert_eq!(std::fs::read(&path).unwrap(), before);
}

#[tokio::test]
async fn retain_purge_and_gc_print_their_reports_on_every_local_backend() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let input = [
        r#"{"id":"m1","bot_id":"b","session_id":"old","role":"user","text":"private","metadata":{"k":"private"}}"#,
        r#"{"id":"m2","bot_id":"b","session_id":"old","role":"user","text":"also private"}"#,
    ]
    .join("\n");
    let out = ctxlog(&store, &["append", "--writer", "w1"], &input).await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // Nothing is a day old yet; then everything is older than zero seconds.
    let out = ctxlog(&store, &["retain", "--older-than", "1d"], "").await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        keys(&lines(&out)[0]),
        [
            "sessions_ended",
            "sessions_remaining",
            "sessions_skipped_active",
            "tombstones"
        ]
    );
    assert_eq!(lines(&out)[0]["tombstones"], 0);
    let out = ctxlog(&store, &["retain", "--older-than", "0s", "--bot", "b"], "").await;
    let report = &lines(&out)[0];
    assert_eq!(report["tombstones"], 2, "{report}");
    assert_eq!(report["sessions_ended"][0]["session_id"], "old");

    let out = ctxlog(&store, &["purge"], "").await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = &lines(&out)[0];
    assert_eq!(
        keys(report),
        ["entries_purged", "erased", "ids_purged", "ids_remaining", "note"]
    );
    assert_eq!(
        (report["ids_purged"].as_u64(), report["entries_purged"].as_u64()),
        (Some(2), Some(4))
    );
    let out = ctxlog(&store, &["gc", "--grace", "0s"], "").await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        keys(&lines(&out)[0]),
        ["bytes_reclaimed", "note", "objects_deleted", "objects_pending"]
    );
    let out = ctxlog(&store, &["gc", "--grace", "ten minutes"], "").await;
    assert_eq!(out.status.code(), Some(2), "a bad duration is a usage error");

    if ctxlog::compiled_backends().contains(&"lance") {
        let lance = dir.path().join("s.lance").display().to_string();
        let out = ctxlog(&lance, &["append", "--writer", "w1"], &input).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for args in [
            &["retain", "--older-than", "0s"][..],
            &["purge"],
            &["gc", "--grace", "0s"],
        ] {
            let out = ctxlog(&lance, args, "").await;
            assert!(
                out.status.success(),
                "{args:?} on lance: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let out = ctxlog(&lance, &["session", "--bot", "b", "--session", "old"], "").await;
        assert!(out.status.success() && out.stdout.is_empty(), "the session was ended");
    }
}

#[tokio::test]
async fn snapshot_saves_the_projection_and_readers_start_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = vec![format!("sqlite:{}", dir.path().join("s.db").display())];
    if ctxlog::compiled_backends().contains(&"lance") {
        stores.push(dir.path().join("s.lance").display().to_string());
    }
    for store in stores {
        let input = (0..5)
            .map(|i| format!(r#"{{"id":"m{i}","bot_id":"b","session_id":"s","role":"user","text":"t{i}"}}"#))
            .collect::<Vec<_>>()
            .join("\n");
        let out = ctxlog(&store, &["append", "--writer", "w1"], &input).await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let out = ctxlog(&store, &["snapshot"], "").await;
        assert!(
            out.status.success(),
            "{store}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = &lines(&out)[0];
        assert_eq!(
            keys(report),
            ["bytes", "entries", "entries_read", "from_snapshot", "taken_millis"],
            "{store}"
        );
        assert_eq!(report["entries"], 5, "{store}: {report}");
        assert!(
            report["from_snapshot"].is_null(),
            "{store}: the first snapshot had none to start from"
        );
        // The next one starts from the first, and reads nothing new.
        let out = ctxlog(&store, &["snapshot"], "").await;
        let report = &lines(&out)[0];
        assert!(report["from_snapshot"].is_u64(), "{store}: {report}");
        assert_eq!(report["entries_read"], 0, "{store}: {report}");
        let out = ctxlog(&store, &["session", "--bot", "b", "--session", "s"], "").await;
        assert_eq!(lines(&out).len(), 5, "{store}");
        // With `--search`, the search index too (rule 26); `ctxlog search` starts from it.
        let out = ctxlog(&store, &["snapshot", "--search"], "").await;
        assert!(
            out.status.success(),
            "{store}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let saved = &lines(&out)[0]["search_index"];
        assert!(
            saved["saved"].is_string() && saved["bytes"].as_u64().is_some_and(|b| b > 0),
            "{store}: {saved}"
        );
        let out = ctxlog(&store, &["search", "--bot", "b", "--query", "t3"], "").await;
        let hits = lines(&out);
        assert_eq!(hits.len(), 1, "{store}: {hits:?}");
        assert_eq!(hits[0]["record"]["id"], "m3", "{store}");
    }
}

/// Copy a directory tree (a Lance store) or a file (a SQLite store).
fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    if from.is_file() {
        std::fs::copy(from, to).unwrap();
        return;
    }
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        copy_tree(&e.path(), &to.join(e.file_name()));
    }
}

/// Rule 22: a store written by the release before summaries (format 1, the fixtures in
/// `tests/fixtures/format-1`, made by its `make.sh`) opens and serves with this build, its
/// every view byte-identical to what that release printed; the first summary written to it
/// upgrades it in place, and every view but the summarised session's stays the same. A
/// store of a format this build does not know is refused, naming both formats.
#[tokio::test]
async fn a_format_1_store_opens_byte_identical_and_upgrades_with_its_first_summary() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-1");
    for ext in ["db", "lance"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("store.{ext}"));
        copy_tree(&fixtures.join(format!("store.{ext}")), &path);
        let store = path.display().to_string();
        let expected = fixtures.join(format!("expected-{ext}"));
        let views: [(&str, Vec<&str>); 8] = [
            (
                "session-ticket-1",
                vec!["session", "--bot", "support", "--session", "ticket-1"],
            ),
            (
                "session-ticket-2",
                vec!["session", "--bot", "support", "--session", "ticket-2"],
            ),
            (
                "session-ticket-3",
                vec!["session", "--bot", "support", "--session", "ticket-3"],
            ),
            ("session-other-s", vec!["session", "--bot", "other", "--session", "s"]),
            ("sessions-support", vec!["sessions", "--bot", "support"]),
            ("conflicts", vec!["conflicts"]),
            ("shards", vec!["shards"]),
            ("get-m2", vec!["get", "--bot", "support", "m2"]),
        ];
        let read = |name: &str| std::fs::read_to_string(expected.join(format!("{name}.jsonl"))).unwrap();
        for (name, args) in &views {
            let out = ctxlog(&store, args, "").await;
            assert!(
                out.status.success(),
                "{ext} {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                read(name),
                "{ext}: {name} differs from format 1's"
            );
        }
        // Search keeps rules 6 and 7 per bot: a store whose ids are grouped across bots is
        // refused (nothing read, nothing written), never answered by the wrong grouping.
        let out = ctxlog(&store, &["search", "--bot", "support", "--query", "order"], "").await;
        assert_eq!(out.status.code(), Some(2), "{ext}: search on format 1");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("format"),
            "{ext}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The context view of a session without summaries is its session view.
        let out = ctxlog(&store, &["context", "--bot", "support", "--session", "ticket-1"], "").await;
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let context = &lines(&out)[0];
        let session: Vec<Value> = read("session-ticket-1")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(context["records"], Value::Array(session.clone()));
        assert_eq!(
            (context["summary"].clone(), context["covered"].clone()),
            (Value::Null, 0.into())
        );
        if ext == "lance" {
            assert!(!path.join("_ctxlog/format").exists(), "reading never upgrades");
        }

        // A summary of what that view held, then one more record.
        let summary = serde_json::json!({
            "id": "sum1", "bot_id": "support", "session_id": "ticket-1", "role": "summary",
            "text": "The customer's order is in transit.", "kind": "summary", "covers": context["position"],
        });
        let after = r#"{"id":"m6","bot_id":"support","session_id":"ticket-1","role":"user","text":"Any news?"}"#;
        let out = ctxlog(
            &store,
            &["append", "--writer", "summariser"],
            &format!("{summary}\n{after}\n"),
        )
        .await;
        assert!(out.status.success(), "{ext}: {}", String::from_utf8_lossy(&out.stderr));
        if ext == "lance" {
            assert_eq!(
                std::fs::read_to_string(path.join("_ctxlog/format")).unwrap(),
                "2",
                "upgraded in place"
            );
        }
        // Every view but the summarised session's, its conflicts, and every record by id
        // (the summarised session's too: a summary stands for records, never changes them).
        let unchanged: Vec<(&str, Vec<&str>)> = views[1..4].iter().chain(&views[5..6]).cloned().collect();
        same_as_before(ext, &store, &expected, &unchanged, "changed by the upgrade").await;
        gets_as_before(ext, &store, &expected, "changed by the upgrade").await;
        let out = ctxlog(&store, &["context", "--bot", "support", "--session", "ticket-1"], "").await;
        let context = &lines(&out)[0];
        let ids: Vec<&str> = context["records"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["sum1", "m6"], "{ext}: the summary and what came after it");
        assert_eq!(context["summary"], "sum1");
        assert_eq!(context["covered"], session.len());
        assert_eq!(context["records"][0]["kind"], "summary");
        let out = ctxlog(&store, &["session", "--bot", "support", "--session", "ticket-1"], "").await;
        assert_eq!(
            lines(&out).len(),
            session.len() + 2,
            "{ext}: the full session view keeps every record"
        );

        // No id is under two bots: ids scoped by bot change no view, and the store upgrades
        // to format 3 without being told to accept anything.
        let out = ctxlog(&store, &["upgrade"], "").await;
        assert!(out.status.success(), "{ext}: {}", String::from_utf8_lossy(&out.stderr));
        let report = &lines(&out)[0];
        assert_eq!(
            (
                report["from"].clone(),
                report["to"].clone(),
                report["shared_ids"].clone()
            ),
            (2.into(), 3.into(), serde_json::json!([])),
            "{ext}: {report}"
        );
        same_as_before(ext, &store, &expected, &views[1..4], "changed by ids scoped by bot").await;
        gets_as_before(ext, &store, &expected, "changed by ids scoped by bot").await;
        // The same conflicts, each now naming the bot whose id it is.
        let out = ctxlog(&store, &["conflicts"], "").await;
        let scoped: Vec<Value> = read("conflicts")
            .lines()
            .map(|l| {
                let mut c: Value = serde_json::from_str(l).unwrap();
                c["bot_id"] = "support".into();
                c
            })
            .collect();
        assert_eq!(lines(&out), scoped, "{ext}: conflicts changed by ids scoped by bot");
        if ext == "lance" {
            assert_eq!(std::fs::read_to_string(path.join("_ctxlog/format")).unwrap(), "3");
            // A format from a later release: refused by name, never read.
            std::fs::write(path.join("_ctxlog/format"), "6").unwrap();
            let out = ctxlog(&store, &["session", "--bot", "support", "--session", "ticket-1"], "").await;
            assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("format 6") && err.contains("1, 2, 3, 4, 5"), "{err}");
        }
    }
}

/// Every view of `views` prints what `expected` holds for it.
async fn same_as_before(ext: &str, store: &str, expected: &std::path::Path, views: &[(&str, Vec<&str>)], why: &str) {
    for (name, args) in views {
        let out = ctxlog(store, args, "").await;
        assert!(
            out.status.success(),
            "{ext} {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let want = std::fs::read_to_string(expected.join(format!("{name}.jsonl"))).unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), want, "{ext}: {name} {why}");
    }
}

/// Every live record of format 1's session views, by id (`get`), prints the line its
/// session view held.
async fn gets_as_before(ext: &str, store: &str, expected: &std::path::Path, why: &str) {
    let mut got = 0;
    for session in ["session-ticket-1", "session-ticket-2", "session-ticket-3"] {
        let view = std::fs::read_to_string(expected.join(format!("{session}.jsonl"))).unwrap();
        for line in view.lines() {
            let id = serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string();
            let out = ctxlog(store, &["get", "--bot", "support", &id], "").await;
            assert!(
                out.status.success(),
                "{ext} get {id}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("{line}\n"),
                "{ext}: get {id} {why}"
            );
            got += 1;
        }
    }
    assert_eq!(got, 7, "{ext}: the fixture's records");
}

/// Rule 22 with rule 6: a store written by the release before ids were scoped by bot
/// (format 2, with a summary; the fixtures in `tests/fixtures/format-2`, made by its
/// `make.sh`), in which id `m2` is under two bots, opens with every view byte-identical to
/// what that release printed (ids still one namespace: alpha's `m2` wins, beta's is a
/// divergent put). `ctxlog upgrade` lists the shared id and changes nothing (exit 2) until
/// told to accept the changed views; then beta's `m2` is its own record, and alpha's views
/// stay as they were.
#[tokio::test]
async fn a_format_2_store_with_an_id_under_two_bots_upgrades_only_when_told() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/format-2");
    for ext in ["db", "lance"] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("store.{ext}"));
        copy_tree(&fixtures.join(format!("store.{ext}")), &path);
        let store = path.display().to_string();
        let expected = fixtures.join(format!("expected-{ext}"));
        let views: [(&str, Vec<&str>); 7] = [
            ("session-alpha-s1", vec!["session", "--bot", "alpha", "--session", "s1"]),
            ("session-beta-t1", vec!["session", "--bot", "beta", "--session", "t1"]),
            ("context-alpha-s1", vec!["context", "--bot", "alpha", "--session", "s1"]),
            ("sessions-beta", vec!["sessions", "--bot", "beta"]),
            ("conflicts", vec!["conflicts"]),
            ("shards", vec!["shards"]),
            ("get-m2", vec!["get", "--bot", "alpha", "m2"]),
        ];
        same_as_before(ext, &store, &expected, &views, "differs from format 2's").await;
        let beta_m2 = ["get", "--bot", "beta", "m2"];
        assert_eq!(
            ctxlog(&store, &beta_m2, "").await.status.code(),
            Some(1),
            "{ext}: beta's m2 lost to alpha's"
        );

        let out = ctxlog(&store, &["upgrade"], "").await;
        assert_eq!(
            out.status.code(),
            Some(2),
            "{ext}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report = &lines(&out)[0];
        assert_eq!(
            report["shared_ids"],
            serde_json::json!([{"id": "m2", "bots": ["alpha", "beta"]}])
        );
        assert_eq!((report["from"].clone(), report["to"].clone()), (2.into(), 2.into()));
        same_as_before(ext, &store, &expected, &views, "changed by a refused upgrade").await;

        let out = ctxlog(&store, &["upgrade", "--accept-changed-views"], "").await;
        assert!(out.status.success(), "{ext}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(lines(&out)[0]["to"], 3);
        if ext == "lance" {
            assert_eq!(std::fs::read_to_string(path.join("_ctxlog/format")).unwrap(), "3");
        }
        // Alpha's views stay; beta's m2 is its own record now, and no longer a conflict.
        let alpha: Vec<(&str, Vec<&str>)> = [0, 2, 5, 6].iter().map(|i| views[*i].clone()).collect();
        same_as_before(ext, &store, &expected, &alpha, "changed by the upgrade").await;
        let out = ctxlog(&store, &beta_m2, "").await;
        assert!(out.status.success(), "{ext}: beta's m2 after the upgrade");
        assert_eq!(lines(&out)[0]["text"], "Beta's own m2.");
        let out = ctxlog(&store, &["session", "--bot", "beta", "--session", "t1"], "").await;
        let ids: Vec<String> = lines(&out)
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["m2", "b1"], "{ext}");
        let out = ctxlog(&store, &["conflicts"], "").await;
        assert!(
            lines(&out).is_empty(),
            "{ext}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        if ext == "lance" {
            // A summary in a store of format 3 never moves its marker down to 2.
            let out = ctxlog(&store, &["context", "--bot", "alpha", "--session", "s1"], "").await;
            let view = dir.path().join("view.json");
            std::fs::write(&view, &out.stdout).unwrap();
            let args = [
                "summarize",
                "--writer",
                "summariser-2",
                "--from",
                view.to_str().unwrap(),
                "--id",
                "sum-2",
                "--text",
                "again",
            ];
            let out = ctxlog(&store, &args, "").await;
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            assert_eq!(std::fs::read_to_string(path.join("_ctxlog/format")).unwrap(), "3");
        }
        let out = ctxlog(&store, &["upgrade"], "").await;
        assert!(out.status.success(), "{ext}: a second upgrade is a no-op");
        assert_eq!(
            (lines(&out)[0]["from"].clone(), lines(&out)[0]["to"].clone()),
            (3.into(), 3.into())
        );
    }
}

/// The README's summary example, run as written (its first `sh` block after the heading)
/// with this build's `ctxlog` on the PATH: the summary covers what `context` read, and the
/// record appended after that read stays in the context view.
#[tokio::test]
async fn the_readme_summary_example_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let section = readme
        .split_once("## Summaries and the context view")
        .expect("the README has the section")
        .1;
    let block = section
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("an sh block")
        .0;
    let out = run_sh_block(block).await.expect("the README example hung");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let last = lines(&out).pop().expect("the context view printed last");
    let ids: Vec<&str> = last["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["sum-1", "m3"], "{last}");
    assert_eq!(
        (last["summary"].as_str(), last["covered"].as_u64()),
        (Some("sum-1"), Some(2))
    );
}

/// Every `sh` block of the README runs as written: `bash -euo pipefail` in an empty
/// directory, with this build's `ctxlog` first on the PATH and no `CTXLOG_STORE`, the ports
/// 7070 and 7071 moved to free ones. Lines that run `cargo` (the two commands, build
/// instructions) are left out: this build is what they make. A block must end by itself; its
/// process group is killed after it, so nothing it started outlives it. What a block shows
/// as output (a whole-line comment `# {…}` or `# […]`, `…` standing for any text within a
/// line) is what it printed, in order.
#[tokio::test]
async fn every_readme_sh_block_runs_as_written() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let blocks: Vec<String> = readme
        .split("```sh\n")
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .map(|block| {
            block
                .lines()
                .filter(|l| l.split_whitespace().next() != Some("cargo"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|block| {
            block
                .lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        })
        .collect();
    assert!(blocks.len() >= 3, "the README's sh blocks: {}", blocks.len());
    for (i, block) in blocks.iter().enumerate() {
        let mut block = block.clone();
        for port in ["7070", "7071"] {
            let free = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            block = block.replace(port, &free.to_string());
        }
        let out = run_sh_block(&block)
            .await
            .unwrap_or_else(|| panic!("README sh block {} hung:\n{block}", i + 1));
        assert!(
            out.status.success(),
            "README sh block {} failed ({}):\n{block}\n--- stderr:\n{}",
            i + 1,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        let mut from = 0;
        for shown in block.lines().filter_map(|l| l.trim().strip_prefix("# ")) {
            if !(shown.starts_with('{') || shown.starts_with('[')) {
                continue;
            }
            from = shown_at(&printed, from, shown).unwrap_or_else(|| {
                panic!(
                    "README sh block {} shows `{shown}`, which it did not print:\n{printed}",
                    i + 1
                )
            });
        }
    }
}

/// Where the first match of `shown` in `printed` at or after byte `from` ends, `…` standing
/// for any text within a line (curl prints no newline, so a match need not be a whole line);
/// `None` if there is none.
fn shown_at(printed: &str, from: usize, shown: &str) -> Option<usize> {
    let mut parts = shown.split('…');
    let first = parts.next().unwrap_or("");
    let rest: Vec<&str> = parts.collect();
    'start: for (at, _) in printed[from..].match_indices(first) {
        let mut pos = from + at + first.len();
        for part in &rest {
            let line_end = printed[pos..].find('\n').map_or(printed.len(), |n| pos + n);
            match printed[pos..line_end].find(part) {
                Some(k) => pos += k + part.len(),
                None => continue 'start,
            }
        }
        return Some(pos);
    }
    None
}

/// Run a README `sh` block as written: `bash -euo pipefail` in an empty directory, with
/// this build's `ctxlog` first on the PATH and no `CTXLOG_STORE`; its process group is
/// killed after it, so nothing it started outlives it. `None`: it did not end in time.
async fn run_sh_block(block: &str) -> Option<Output> {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_ctxlog"))
        .parent()
        .unwrap()
        .to_path_buf();
    let path = std::env::join_paths(
        std::iter::once(bin).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new("bash")
        .args(["-euo", "pipefail", "-c", block])
        .current_dir(dir.path())
        .env("PATH", &path)
        .env_remove("CTXLOG_STORE")
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let group = child.id().expect("running") as libc::pid_t;
    let out = tokio::time::timeout(DEADLINE, child.wait_with_output()).await;
    // SAFETY: a signal to the process group this test started; no memory is touched.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    out.ok().map(|o| o.unwrap())
}
