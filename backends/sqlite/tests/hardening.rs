//! What only the SQLite backend can get wrong: files that are not stores, readers that must
//! not write, compaction beside live writers and readers, damaged stored values, and copies
//! of a live store. Each test has its own directory and deadlines.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ctxlog_core::testing::outside;
use ctxlog_core::{CompactOptions, Error, GcOptions, PurgeOptions, Record, Store, StoreOptions, WriterId};
use ctxlog_sqlite::SqliteStore;
use rusqlite::Connection;

fn options(timeout: Duration) -> StoreOptions {
    StoreOptions::default().with_timeout(timeout)
}

fn reading() -> StoreOptions {
    options(Duration::from_secs(10)).with_create_if_missing(false)
}

fn recs(prefix: &str, n: usize) -> Vec<Record> {
    (0..n)
        .map(|i| Record::text(format!("{prefix}-{i}"), "bot", "s", "user", format!("message {i}")))
        .collect()
}

fn w(name: &str) -> WriterId {
    WriterId::new(name).unwrap()
}

/// Write a file that no connection of this process has open (a foreign file, before any
/// store is opened on it).
#[expect(
    clippy::disallowed_methods,
    reason = "no connection of this process has this file open"
)]
fn write_foreign(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

/// Every file in `dir` with its bytes (read by another process).
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = outside::read_file(&p).unwrap();
            (p, bytes)
        })
        .collect();
    out.sort();
    out
}

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), fut)
        .await
        .unwrap_or_else(|_| panic!("{what} hung"))
}

/// A store with `n` entries, every handle closed.
async fn store_with_entries(path: &Path, n: usize) {
    let store = SqliteStore::open(path, options(Duration::from_secs(10))).await.unwrap();
    let mut shard = store.open_shard(&w("writer")).await.unwrap();
    for chunk in recs("e", n).chunks(500) {
        shard.append(chunk.to_vec()).await.unwrap();
    }
    shard.close().await.unwrap();
}

/// A reader in the middle of a long scan, and `compact` meanwhile: a writer with a short
/// deadline keeps appending, every append succeeds, and `compact` returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compact_never_stalls_writers_beside_a_long_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    store_with_entries(&path, 2000).await;

    // A reader holding one read transaction, as a long scan does.
    let reader = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let n: i64 = reader
        .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2000);

    let store = Arc::new(
        SqliteStore::open(&path, options(Duration::from_millis(800)))
            .await
            .unwrap(),
    );
    let mut shard = store.open_shard(&w("live")).await.unwrap();
    // More WAL for the checkpoint to wait on.
    shard.append(recs("before", 200)).await.unwrap();

    let compactor = {
        let path = path.clone();
        tokio::spawn(async move {
            let store = SqliteStore::open(&path, options(Duration::from_secs(4))).await?;
            store.compact(&CompactOptions::default()).await
        })
    };
    let mut appends = 0;
    while appends < 20 || !compactor.is_finished() {
        bounded("append", shard.append(recs(&format!("during-{appends}"), 5)))
            .await
            .unwrap_or_else(|e| panic!("append {appends} beside compact failed: {e}"));
        appends += 1;
        assert!(appends < 100_000, "compact never finished");
    }
    let report = bounded("compact", compactor).await.unwrap().unwrap();
    assert!(report.note.contains("checkpoint"), "{report:?}");
    // The reader still sees its snapshot, and a new reader sees everything.
    let n: i64 = reader
        .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2000);
    reader.execute_batch("COMMIT").unwrap();
    let mut p = store.projector();
    p.refresh().await.unwrap();
    assert_eq!(p.stats().live as usize, 2000 + 200 + 5 * appends);
    shard.close().await.unwrap();
}

/// Opening anything that is not a ctxlog store — another SQLite database (in rollback or
/// WAL mode), a file of other bytes, a directory — fails with `NotAStore` naming the path,
/// and leaves every byte as it was, also with create-if-missing.
#[tokio::test]
async fn foreign_files_are_refused_and_left_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let rollback = dir.path().join("app.db");
    let c = Connection::open(&rollback).unwrap();
    c.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (name) VALUES ('ada');")
        .unwrap();
    drop(c);
    let junk = dir.path().join("notes.db");
    write_foreign(&junk, b"these are notes, not a database at all");
    let before = snapshot(dir.path());

    for path in [&rollback, &junk] {
        for create in [true, false] {
            let opts = options(Duration::from_secs(5)).with_create_if_missing(create);
            match SqliteStore::open(path, opts).await {
                Err(Error::NotAStore { location, .. }) => {
                    assert!(
                        location.contains(&*path.to_string_lossy()),
                        "names the path: {location}"
                    )
                }
                Err(other) => panic!("{}: expected NotAStore, got {other}", path.display()),
                Ok(_) => panic!("{}: opened a foreign file as a store", path.display()),
            }
        }
    }
    assert_eq!(
        snapshot(dir.path()),
        before,
        "a foreign file was changed or a file was added"
    );

    // A foreign database in WAL mode: its file stays byte for byte as it was.
    let wal_dir = tempfile::tempdir().unwrap();
    let wal = wal_dir.path().join("wal.db");
    let c = Connection::open(&wal).unwrap();
    c.execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t (x); INSERT INTO t VALUES (1);")
        .unwrap();
    drop(c);
    let bytes = outside::read_file(&wal).unwrap();
    for create in [true, false] {
        let opts = options(Duration::from_secs(5)).with_create_if_missing(create);
        assert!(matches!(
            SqliteStore::open(&wal, opts).await,
            Err(Error::NotAStore { .. })
        ));
    }
    assert_eq!(outside::read_file(&wal).unwrap(), bytes);

    // A directory is not a store either; an empty file is where a store may be created.
    assert!(matches!(
        SqliteStore::open(dir.path(), options(Duration::from_secs(5))).await,
        Err(Error::NotAStore { .. })
    ));
    let empty = dir.path().join("empty.db");
    write_foreign(&empty, b"");
    assert!(matches!(
        SqliteStore::open(&empty, reading()).await,
        Err(Error::NotFound { .. })
    ));
    SqliteStore::open(&empty, options(Duration::from_secs(5)))
        .await
        .unwrap();
}

/// Reading never writes to the store's file: open, first scan, views, conflicts and shard
/// listings leave it byte for byte as it was.
#[tokio::test]
async fn readers_never_write_the_store_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    store_with_entries(&path, 300).await;
    // A writer that died with committed pages still in the WAL: the next connection to close
    // last would checkpoint them into the store file — unless it is a reader.
    let crashed = Connection::open(&path).unwrap();
    crashed
        .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
        .unwrap();
    crashed
        .execute_batch("PRAGMA wal_autocheckpoint = 0; INSERT INTO ctxlog_meta (key, value) VALUES ('note', 'x');")
        .unwrap();
    drop(crashed);
    let wal = std::fs::metadata(format!("{}-wal", path.display())).unwrap().len();
    assert!(wal > 0, "the WAL holds pages");
    let before = outside::read_file(&path).unwrap();
    {
        let store = SqliteStore::open(&path, reading()).await.unwrap();
        let mut p = store.projector();
        p.refresh().await.unwrap();
        assert_eq!(p.stats().live, 300);
        assert_eq!(p.session("bot", "s").await.unwrap().len(), 300);
        assert!(store.conflict_discovery().conflicts(None).await.unwrap().is_empty());
        assert_eq!(store.shards().await.unwrap().len(), 1);
    }
    assert_eq!(
        outside::read_file(&path).unwrap(),
        before,
        "a reader changed the store file"
    );
}

/// Damaged stored values (a crafted `--restore` source) are typed errors or harmless,
/// never an abort: a huge `last_seq` only caps a reservation; a huge session number is
/// `Corrupt`.
#[tokio::test]
async fn implausible_stored_values_never_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    store_with_entries(&path, 10).await;
    let c = Connection::open(&path).unwrap();
    c.execute("UPDATE shards SET last_seq = 100000000000", []).unwrap();
    drop(c);
    let store = SqliteStore::open(&path, reading()).await.unwrap();
    let mut p = store.projector();
    p.refresh().await.unwrap();
    assert_eq!(p.stats().live, 10);

    let c = Connection::open(&path).unwrap();
    c.execute_batch(
        "INSERT INTO sessions (session_no, bot_id, session_id) VALUES (100000000000, 'bot', 'far');
         UPDATE entries SET session_no = 100000000000 WHERE seq = 3;",
    )
    .unwrap();
    drop(c);
    let store = SqliteStore::open(&path, reading()).await.unwrap();
    match store.projector().refresh().await {
        Err(Error::Corrupt { .. }) => {}
        other => panic!("an implausible session number: expected Corrupt, got {other:?}"),
    }
}

/// A copy of a live store — writers appending and checkpointing all along — is one
/// consistent snapshot: it opens, and its history checks find nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copies_of_a_live_store_are_never_torn() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.db");
    store_with_entries(&path, 100).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (path.clone(), stop.clone());
        tokio::spawn(async move {
            let store = SqliteStore::open(&path, options(Duration::from_secs(10)))
                .await
                .unwrap();
            let mut shard = store.open_shard(&w("live")).await.unwrap();
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                shard.append(recs(&format!("l{n}"), 20)).await.unwrap();
                store.compact(&CompactOptions::default()).await.unwrap();
                n += 1;
            }
            shard.close().await.unwrap();
            n
        })
    };
    for i in 0..60 {
        let copy = dir.path().join(format!("copy-{i}.db"));
        let (src, dst) = (path.clone(), copy.clone());
        tokio::task::spawn_blocking(move || ctxlog_sqlite::copy_store(&src, &dst, Duration::from_secs(30)))
            .await
            .unwrap()
            .unwrap();
        let store = SqliteStore::open(&copy, reading()).await.unwrap();
        let conflicts = store.conflict_discovery().conflicts(None).await.unwrap();
        assert!(conflicts.is_empty(), "copy {i} is torn: {conflicts:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let rounds = bounded("writer", writer).await.unwrap();
    assert!(rounds > 0);
    // A copy never overwrites.
    let err = ctxlog_sqlite::copy_store(&path, &dir.path().join("copy-0.db"), Duration::from_secs(5)).unwrap_err();
    assert!(!err.is_invalid_input() && err.is_definite(), "{err}");
}

/// Why a store is copied through the backup API: copying the database file and then its
/// WAL, with a checkpoint and more commits in between, joins two points in time. The
/// interleaving is forced here step by step: the file-by-file copy is torn, `copy_store`
/// taken at either point is whole.
#[tokio::test]
async fn a_file_by_file_copy_tears_where_the_backup_api_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.db");
    let store = SqliteStore::open(&path, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut shard = store.open_shard(&w("live")).await.unwrap();
    for b in 0..20 {
        shard.append(recs(&format!("a{b}"), 50)).await.unwrap();
    }
    // Copy step 1 of the old way: the database file (its WAL holds most of the log).
    let torn = dir.path().join("torn.db");
    outside::copy_file(&path, &torn).unwrap();
    let before = dir.path().join("before.db");
    ctxlog_sqlite::copy_store(&path, &before, Duration::from_secs(10)).unwrap();
    // A checkpoint moves the WAL into the file and restarts the WAL; more commits follow.
    store.compact(&CompactOptions::default()).await.unwrap();
    let raw = Connection::open(&path).unwrap();
    raw.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .unwrap();
    drop(raw);
    for b in 20..25 {
        shard.append(recs(&format!("a{b}"), 50)).await.unwrap();
    }
    // Copy step 2 of the old way: the WAL, from the later point in time.
    outside::copy_file(
        Path::new(&format!("{}-wal", path.display())),
        Path::new(&format!("{}-wal", torn.display())),
    )
    .unwrap();
    let after = dir.path().join("after.db");
    ctxlog_sqlite::copy_store(&path, &after, Duration::from_secs(10)).unwrap();
    shard.close().await.unwrap();

    for (copy, live) in [(&before, 1000), (&after, 1250)] {
        let s = SqliteStore::open(copy, reading()).await.unwrap();
        let mut p = s.projector();
        p.refresh().await.unwrap();
        assert_eq!(p.stats().live, live, "{}", copy.display());
        assert!(s.conflict_discovery().conflicts(None).await.unwrap().is_empty());
    }
    let torn_view: ctxlog_core::Result<(u64, usize)> = async {
        let s = SqliteStore::open(&torn, reading()).await?;
        let mut p = s.projector();
        p.refresh().await?;
        let conflicts = s.conflict_discovery().conflicts(None).await?;
        Ok((p.stats().live, conflicts.len()))
    }
    .await;
    match torn_view {
        Ok((1000, 0)) | Ok((1250, 0)) => panic!("the file-by-file copy happened to be whole: {torn_view:?}"),
        other => eprintln!("the file-by-file copy is torn, as expected: {other:?}"),
    }
}

/// Purge and gc never wait for a reader: with a read transaction holding the WAL they
/// return (reporting the WAL as still in use) instead of waiting for it; once the reader is
/// gone, gc truncates the WAL to nothing, so no frame keeps an erased byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_and_gc_never_wait_for_a_reader_and_truncate_the_wal_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    store_with_entries(&path, 50).await;
    // A long store deadline: waiting for the reader would hang until the test's bound.
    let store = SqliteStore::open(&path, options(Duration::from_secs(120)))
        .await
        .unwrap();
    let mut shard = store.open_shard(&w("writer")).await.unwrap();
    shard
        .append(vec![
            Record::tombstone("e-3", "bot", "s"),
            Record::tombstone("e-4", "bot", "s"),
        ])
        .await
        .unwrap();
    // The writer stays open throughout: its connection keeps SQLite from deleting the WAL
    // file on a last close, so only a truncation empties it.
    let reader = Connection::open(&path).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let n: i64 = reader
        .query_row("SELECT count(*) FROM entries", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 52);
    let purged = tokio::time::timeout(Duration::from_secs(20), store.purge(&PurgeOptions::default()))
        .await
        .expect("purge waited for a reader")
        .unwrap();
    assert_eq!((purged.ids_purged, purged.entries_purged), (2, 4), "{purged:?}");
    assert!(
        !purged.erased,
        "the reader still holds the WAL: not erased yet ({purged:?})"
    );
    let held = tokio::time::timeout(Duration::from_secs(20), store.gc(&GcOptions::default()))
        .await
        .expect("gc waited for a reader")
        .unwrap();
    assert!(
        held.objects_pending > 0,
        "expected the WAL reported in use, got {held:?}"
    );
    let wal = dir.path().join("store.db-wal");
    assert!(std::fs::metadata(&wal).unwrap().len() > 0);
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    let done = bounded("gc", store.gc(&GcOptions::default())).await.unwrap();
    assert_eq!(done.objects_pending, 0, "{done:?}");
    assert_eq!(
        std::fs::metadata(&wal).unwrap().len(),
        0,
        "the WAL keeps frames after gc"
    );
    shard
        .append(recs("after", 1))
        .await
        .expect("the writer goes on after gc");
    shard.close().await.unwrap();
}

/// After a purge erased large bodies, gc gives their pages back to the file system and says
/// so (pages returned, bytes the file and its WAL shrank by); a second pass has nothing left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_returns_the_pages_a_purge_freed_and_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open(&path, options(Duration::from_secs(20)))
        .await
        .unwrap();
    let mut shard = store.open_shard(&w("writer")).await.unwrap();
    let big: Vec<Record> = (0..16)
        .map(|i| Record::text(format!("big-{i}"), "bot", "s", "user", "x".repeat(64 * 1024)))
        .collect();
    bounded("append", shard.append(big)).await.unwrap();
    let tombstones = (0..16)
        .map(|i| Record::tombstone(format!("big-{i}"), "bot", "s"))
        .collect();
    bounded("append", shard.append(tombstones)).await.unwrap();
    shard.close().await.unwrap();
    let purged = bounded("purge", store.purge(&PurgeOptions::default())).await.unwrap();
    assert_eq!(purged.ids_purged, 16, "{purged:?}");

    let done = bounded("gc", store.gc(&GcOptions::default())).await.unwrap();
    // 16 bodies of 64 KiB on 4 KiB pages: at least 16 × 16 pages.
    assert!(done.objects_deleted >= 256, "{done:?}");
    assert!(done.bytes_reclaimed >= 16 * 64 * 1024, "{done:?}");
    assert_eq!(done.objects_pending, 0, "{done:?}");
    let again = bounded("gc", store.gc(&GcOptions::default())).await.unwrap();
    assert_eq!((again.objects_deleted, again.objects_pending), (0, 0), "{again:?}");
}

/// A snapshot is saved while writers commit: its write transaction takes the write lock
/// first (waiting for it within the deadline) instead of starting as a read and failing at
/// once when a writer committed in between (SQLite's `BUSY_SNAPSHOT`, which the busy
/// handler never sees).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_are_saved_beside_writers() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    store_with_entries(&path, 2_000).await;
    let store = Arc::new(
        SqliteStore::open(&path, options(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2)
        .map(|k| {
            let (store, stop) = (store.clone(), stop.clone());
            tokio::spawn(async move {
                let mut shard = store.open_shard(&w(&format!("busy-{k}"))).await.unwrap();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    shard.append(recs(&format!("busy-{k}-{n}"), 1)).await.unwrap();
                    n += 1;
                }
                shard.close().await.unwrap();
                n
            })
        })
        .collect();
    let mut p = store.projector();
    let mut saved = 0;
    let mut failed = Vec::new();
    for _ in 0..40 {
        match bounded("save a snapshot", p.save_snapshot()).await {
            Ok(_) => saved += 1,
            Err(e) => failed.push(e.to_string()),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut appended = 0;
    for t in writers {
        appended += bounded("a writer stops", t).await.unwrap();
    }
    assert!(appended > 0, "the writers wrote nothing beside the snapshots");
    assert!(
        failed.is_empty(),
        "{} of 40 saves failed beside writers: {:?}",
        failed.len(),
        &failed[..failed.len().min(3)]
    );
    assert_eq!(saved, 40);
}

/// Rule 22 on SQLite: a format-1 store (the CLI's fixture, written by the release before
/// summaries) keeps format 1 while it is only read and written without summaries, moves to
/// format 2 in the transaction of its first summary, and a store of a format this build
/// does not know is refused, naming both, and left as it was.
#[tokio::test]
async fn a_store_moves_to_format_2_with_its_first_summary_and_a_newer_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/ctxlog-cli/tests/fixtures/format-1/store.db");
    outside::copy_file(&fixture, &path).unwrap();
    let format = |path: &Path| -> String {
        let c = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
        c.query_row("SELECT value FROM ctxlog_meta WHERE key = 'format'", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(format(&path), "1");
    let store = SqliteStore::open(path.to_str().unwrap(), options(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut shard = store.open_shard(&w("w")).await.unwrap();
    shard.append(recs("plain", 2)).await.unwrap();
    assert_eq!(
        format(&path),
        "1",
        "no summary, no upgrade: earlier releases still open it"
    );
    let mut p = store.projector();
    p.refresh().await.unwrap();
    shard.observe(p.max_hlc()).unwrap();
    let summary = Record::summary("sum", "bot", "s", "both messages", p.checkpoint());
    shard.append(vec![summary]).await.unwrap();
    assert_eq!(format(&path), "2", "the first summary upgraded it");
    p.refresh().await.unwrap();
    let view = p.context("bot", "s").await.unwrap();
    assert_eq!(view.entries.len(), 1, "the summary stands for both records");
    assert_eq!(view.covered, 2);
    // Another release moves the store on while this writer runs: its next append is
    // refused, writing nothing (the format is checked in every append's transaction).
    let set = |f: &str| {
        let c = Connection::open(&path).unwrap();
        c.execute("UPDATE ctxlog_meta SET value = ?1 WHERE key = 'format'", [f])
            .unwrap();
    };
    set("6");
    match shard.append(recs("late", 1)).await {
        Err(e @ Error::NotAStore { .. }) => assert_eq!(e.written(), ctxlog_core::Written::Nothing),
        other => panic!("a writer wrote into a store of format 6: {other:?}"),
    }
    set("2");
    shard.close().await.unwrap();
    drop((p, store));

    let newer = dir.path().join("newer.db");
    outside::copy_file(&path, &newer).unwrap();
    {
        let c = Connection::open(&newer).unwrap();
        c.execute("UPDATE ctxlog_meta SET value = '6' WHERE key = 'format'", [])
            .unwrap();
    }
    // The database file itself: SQLite's read-only check of a WAL-mode file may leave its
    // (empty) `-wal` and `-shm` companions beside it.
    let before = outside::read_file(&newer).unwrap();
    let refused = SqliteStore::open(newer.to_str().unwrap(), options(Duration::from_secs(10))).await;
    match refused {
        Err(Error::NotAStore { reason, .. }) => {
            assert!(
                reason.contains("format 6") && reason.contains("1, 2, 3, 4, 5"),
                "{reason}"
            )
        }
        other => panic!("a format-4 store was not refused: {:?}", other.map(|_| ())),
    }
    assert!(
        outside::read_file(&newer).unwrap() == before,
        "a refused store is left as it was"
    );
}

/// A saved search index of a store that was then restored from an older copy, and took other
/// appends at the same seqs, is not used: the entries at its position are not the store's
/// (rule 26). The older saved index, whose position the copy still holds, is.
#[tokio::test]
async fn a_saved_search_index_of_a_rolled_back_store_is_passed_over() {
    use ctxlog_core::search::saved::{self, Saved};
    use ctxlog_core::search::{Filter, Query, Searcher};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.db");
    let text = |id: &str, t: &str| Record::text(id, "bot", "s", "user", t);
    // The store's own files (not the saved indexes' directory beside them).
    let files = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("s.db")))
            .map(|p| {
                let bytes = outside::read_file(&p).unwrap();
                (p, bytes)
            })
            .collect()
    };
    let save = |store: Arc<SqliteStore>| async move {
        let got = saved::save(&mut Searcher::new(), store.as_ref()).await.unwrap();
        assert!(matches!(got, Saved::Put { .. }), "{got:?}");
    };
    let store = Arc::new(
        SqliteStore::open(&path, options(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    let mut shard = store.open_shard(&w("a")).await.unwrap();
    shard.append(vec![text("r1", "refund one")]).await.unwrap();
    shard.close().await.unwrap();
    bounded("the first save", save(store.clone())).await;
    drop(store);
    let copy = files(dir.path());
    let store = Arc::new(
        SqliteStore::open(&path, options(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    let mut shard = store.open_shard(&w("a")).await.unwrap();
    shard.append(vec![text("r2", "refund two")]).await.unwrap();
    shard.close().await.unwrap();
    bounded("the second save", save(store.clone())).await;
    drop(store);
    // Restored from the copy (the saved indexes beside it stay), then written again.
    for (p, _) in files(dir.path()) {
        std::fs::remove_file(p).unwrap();
    }
    for (p, bytes) in &copy {
        write_foreign(p, bytes);
    }
    let store = SqliteStore::open(&path, options(Duration::from_secs(10)))
        .await
        .unwrap();
    let mut shard = store.open_shard(&w("a")).await.unwrap();
    shard.append(vec![text("r3", "the weather")]).await.unwrap();
    shard.close().await.unwrap();
    let mut p = store.projector();
    p.refresh().await.unwrap();
    let mut searcher = Searcher::new();
    let fed = bounded("a cold catch-up", searcher.catch_up(&store, &p.checkpoint()))
        .await
        .unwrap();
    assert_eq!(fed, 1, "the cold searcher did not start from the first saved index");
    let ids = |q: &str| -> Vec<String> {
        let (hits, _) = searcher
            .index()
            .search("bot", &Query::parse(q).unwrap(), &Filter::default(), None, 10);
        hits.into_iter().map(|h| h.id).collect()
    };
    assert_eq!(ids("refund"), ["r1"], "a record the store no longer holds is found");
    assert_eq!(ids("weather"), ["r3"]);
}
