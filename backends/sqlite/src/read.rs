//! Reading: shard listings, full entries, and the projector's and history checker's scans.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;
use ctxlog_core::backend::history::{HistoryChecker, HistorySource, StoredBody, StoredRow};
use ctxlog_core::backend::index::{IndexRow, PartApplier, ProjectionIndex, Router, RowRef};
use ctxlog_core::backend::projector::{CatchUp, IndexSource};
use ctxlog_core::backend::snapshot::Rejected;
use ctxlog_core::{
    Checkpoint, ContentHash, Entry, Error, Hlc, Kind, OrderKey, Result, ShardId, ShardInfo, StoreOptions, WriterId,
    Written,
};
use rusqlite::{Connection, Row, params};

use crate::conn::{Access, Conn, sql_error};

pub(crate) fn shards(c: &mut Connection) -> rusqlite::Result<Vec<ShardInfo>> {
    let mut stmt = c.prepare(
        "SELECT s.shard, s.writer, s.epoch, s.last_seq,
                (SELECT count(*) FROM entries e WHERE e.shard_no = s.shard_no)
         FROM shards s",
    )?;
    let mut out = stmt
        .query_map([], |r| {
            Ok(ShardInfo {
                shard: shard_id(r, 0)?,
                writer: WriterId::new(r.get::<_, String>(1)?)
                    .map_err(|e| rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Text, e.into()))?,
                epoch: r.get::<_, i64>(2)? as u64,
                last_seq: r.get::<_, i64>(3)? as u64,
                entries: r.get::<_, i64>(4)? as u64,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    out.sort_by_key(|s| s.shard);
    Ok(out)
}

fn shard_id(r: &Row<'_>, i: usize) -> rusqlite::Result<ShardId> {
    let bytes: [u8; 16] = r.get(i)?;
    Ok(ShardId::from_bytes(bytes))
}

/// The columns of a full entry, joined with its shard and session.
const ENTRY_COLUMNS: &str = "sh.shard, e.seq, e.epoch, e.hlc, e.kind, s.bot_id, s.session_id, e.content_hash, e.id,
     e.role, e.content_type, e.body_text, e.body_bytes, e.metadata, e.created_at";
const ENTRY_JOIN: &str = "FROM entries e JOIN shards sh ON sh.shard_no = e.shard_no
     JOIN sessions s ON s.session_no = e.session_no";

/// Decode one full entry. A row that cannot be decoded is corrupt, and the error says which.
fn entry(r: &Row<'_>) -> Result<Entry> {
    let row = stored_row(r)?;
    let created_at = r
        .get::<_, Option<i64>>(14)
        .map_err(unreadable)?
        .map(DateTime::from_timestamp_nanos);
    row.to_entry(created_at).map_err(|e| Error::Corrupt {
        shard: Some(row.shard),
        what: format!("entry seq {} epoch {}: metadata is not JSON: {e}", row.seq, row.epoch),
    })
}

fn unreadable(e: rusqlite::Error) -> Error {
    Error::Corrupt {
        shard: None,
        what: format!("unreadable entry row: {e}"),
    }
}

/// One row as stored, borrowed from SQLite's buffers (a full check reads every row this
/// way, allocating nothing per row). A row that cannot be decoded is corrupt, and the error
/// says which; metadata is not parsed here (a full check reports text that is not JSON as
/// a corrupt entry, `entry` refuses it).
fn stored_row<'r>(r: &'r Row<'_>) -> Result<StoredRow<'r>> {
    let shard = shard_id(r, 0).map_err(unreadable)?;
    let seq = r.get::<_, i64>(1).map_err(unreadable)? as u64;
    let epoch = r.get::<_, i64>(2).map_err(unreadable)? as u64;
    let at = |what: &str| Error::Corrupt {
        shard: Some(shard),
        what: format!("entry seq {seq} epoch {epoch}: {what}"),
    };
    let text = |i: usize| -> Result<&'r str> { r.get_ref(i).and_then(|v| Ok(v.as_str()?)).map_err(unreadable) };
    let kind = Kind::from_u8(r.get::<_, u8>(4).map_err(unreadable)?).ok_or_else(|| at("unknown kind"))?;
    let hash = r.get_ref(7).and_then(|v| Ok(v.as_blob()?)).map_err(unreadable)?;
    let content_hash = ContentHash::from_slice(hash).ok_or_else(|| at("content hash is not 32 bytes"))?;
    let body = match (
        r.get_ref(11)
            .and_then(|v| Ok(v.as_str_or_null()?))
            .map_err(unreadable)?,
        r.get_ref(12)
            .and_then(|v| Ok(v.as_blob_or_null()?))
            .map_err(unreadable)?,
    ) {
        (Some(t), None) => StoredBody::Text(t),
        (None, Some(b)) => StoredBody::Bytes(b),
        (None, None) => StoredBody::Purged,
        (Some(_), Some(_)) => return Err(at("body must be text or bytes, not both")),
    };
    Ok(StoredRow {
        shard,
        seq,
        epoch,
        hlc: Hlc(r.get::<_, i64>(3).map_err(unreadable)? as u64),
        kind,
        id: text(8)?,
        bot_id: text(5)?,
        session_id: text(6)?,
        role: text(9)?,
        content_type: text(10)?,
        body,
        metadata: r
            .get_ref(13)
            .and_then(|v| Ok(v.as_str_or_null()?))
            .map_err(unreadable)?,
        content_hash,
    })
}

pub(crate) fn read_shard(c: &mut Connection, shard: ShardId, after_seq: u64, limit: usize) -> Result<Vec<Entry>> {
    let err = |e| sql_error("read shard", Some(shard), Written::Nothing, e);
    let mut stmt = c
        .prepare_cached(&format!(
            "SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE sh.shard = ?1 AND e.seq > ?2 ORDER BY e.seq, e.epoch LIMIT ?3"
        ))
        .map_err(err)?;
    let mut rows = stmt
        .query(params![
            &shard.as_bytes()[..],
            after_seq as i64,
            limit.min(i64::MAX as usize) as i64
        ])
        .map_err(err)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next().map_err(err)? {
        out.push(entry(r)?);
    }
    Ok(out)
}

/// A lazily opened read connection for a projector or checker.
struct ReadConn {
    path: PathBuf,
    options: StoreOptions,
    /// Async, held while opening: callers that ask at once (a cold start reads the store's
    /// identity and its snapshot list together) share one connection.
    conn: tokio::sync::Mutex<Option<Conn>>,
}

impl ReadConn {
    fn new(path: PathBuf, options: StoreOptions) -> Self {
        ReadConn {
            path,
            options,
            conn: tokio::sync::Mutex::new(None),
        }
    }

    async fn get(&self) -> Result<Conn> {
        // Waiting here is bounded: whoever holds the lock is opening under a deadline.
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        // Readers never create a store (a missing file is NotFound) and never write to one.
        let timeout = self.options.timeout;
        let conn = Conn::open_by(&self.path, Access::Read, timeout, tokio::time::Instant::now() + timeout).await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }
}

/// What the projector's source remembers between catch-ups.
#[derive(Default)]
pub(crate) struct Cursor {
    /// shard_no -> shard id.
    shards: HashMap<i64, ShardId>,
    /// (bot, session) by session_no (dense from 1), for the sessions seen so far.
    sessions: Vec<Option<(String, String)>>,
    max_session_no: i64,
}

pub(crate) struct SqliteIndex {
    conn: Arc<ReadConn>,
}

impl SqliteIndex {
    pub(crate) fn new(path: PathBuf, options: StoreOptions) -> Self {
        SqliteIndex {
            conn: Arc::new(ReadConn::new(path, options)),
        }
    }
}

#[async_trait]
impl IndexSource for SqliteIndex {
    type Cursor = Cursor;

    async fn catch_up(&self, cursor: &mut Cursor, index: &mut ProjectionIndex) -> Result<CatchUp> {
        let conn = self.conn.get().await?;
        // Move both into the blocking task and back; if the task is cancelled by the
        // deadline, both stay at their defaults, which agree (the next refresh is a first scan).
        let mut cur = std::mem::take(cursor);
        let mut idx = std::mem::take(index);
        let (cur, idx, n) = conn
            .run("refresh", None, Written::Nothing, move |c| {
                let n = catch_up(c, &mut cur, &mut idx);
                Ok((cur, idx, n))
            })
            .await?;
        *cursor = cur;
        *index = idx;
        n.map_err(|e| sql_error("refresh", None, Written::Nothing, e))
    }

    async fn fetch(&self, _cursor: &Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        let conn = self.conn.get().await?;
        let keys = keys.to_vec();
        conn.run("read entries", None, Written::Nothing, move |c| fetch(c, &keys))
            .await
    }

    fn timeout(&self) -> Duration {
        self.conn.options.timeout
    }

    fn read_snapshots(&self) -> bool {
        self.conn.options.read_snapshots
    }

    async fn store_identity(&self, create: bool) -> Result<Option<String>> {
        let reader = self.conn.get().await?;
        crate::snapshots::identity(&reader, &self.conn.path, &self.conn.options, create).await
    }

    // Through the projector's own read connection: a cold start opens the file once.
    async fn snapshot_names(&self) -> Result<Vec<String>> {
        crate::snapshots::names(&self.conn.get().await?).await
    }

    async fn read_snapshot(&self, name: &str) -> Result<Option<Vec<u8>>> {
        crate::snapshots::read(&self.conn.get().await?, name).await
    }

    async fn put_snapshot(&self, bytes: Vec<u8>) -> Result<()> {
        crate::snapshots::put(&self.conn.path, &self.conn.options, bytes).await
    }

    /// Nothing: a catch-up reads past the index's own per-shard positions, and the shard
    /// and session tables whole.
    fn save_cursor(&self, _cursor: &Cursor) -> Vec<u8> {
        Vec::new()
    }

    async fn resume_cursor(&self, saved: &[u8]) -> std::result::Result<Cursor, Rejected> {
        if !saved.is_empty() {
            return Err(Rejected::Corrupt(format!("a SQLite cursor of {} bytes", saved.len())));
        }
        Ok(Cursor::default())
    }
}

/// Apply every entry past the index's checkpoint, in one read transaction so that every
/// shard is read at the same snapshot.
fn catch_up(c: &mut Connection, cursor: &mut Cursor, index: &mut ProjectionIndex) -> rusqlite::Result<CatchUp> {
    let tx = c.transaction()?;
    // Entries the store holds, by its shards' last seqs: only a hint (a damaged store may say
    // anything), for how much room to reserve and how many threads to apply on.
    let mut stored: u64 = 0;
    {
        let mut stmt = tx.prepare_cached("SELECT shard_no, shard, last_seq FROM shards")?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            cursor.shards.insert(r.get(0)?, shard_id(r, 1)?);
            stored = stored.saturating_add(u64::try_from(r.get::<_, i64>(2)?).unwrap_or(0));
        }
        let mut stmt =
            tx.prepare_cached("SELECT session_no, bot_id, session_id FROM sessions WHERE session_no > ?1")?;
        let mut rows = stmt.query([cursor.max_session_no])?;
        while let Some(r) = rows.next()? {
            let no: i64 = r.get(0)?;
            // Session numbers are rowids handed out densely from 1 and never deleted. The
            // table is indexed by them, so an implausible number (a damaged or crafted
            // store) is refused before it can size an allocation.
            let plausible = cursor.sessions.len().max(1).saturating_mul(2) + MAX_SESSION_SLACK;
            let slot = usize::try_from(no)
                .ok()
                .filter(|s| *s < plausible)
                .ok_or(rusqlite::Error::IntegralValueOutOfRange(0, no))?;
            if cursor.sessions.len() <= slot {
                cursor.sessions.resize(slot + 1, None);
            }
            cursor.sessions[slot] = Some((r.get(1)?, r.get(2)?));
            cursor.max_session_no = cursor.max_session_no.max(no);
        }
    }
    if index.entries() == 0 {
        // A first scan: make room for the ids at once instead of growing (and moving) the
        // index as it fills. The stored counts are only a hint, and may be damaged: the
        // reservation is capped, and the index grows past it as rows arrive.
        index.reserve(usize::try_from(stored).unwrap_or(0).min(MAX_RESERVE));
    }
    let shards: Vec<(i64, ShardId, u64)> = cursor
        .shards
        .iter()
        .map(|(&no, &shard)| (no, shard, index.position(shard)))
        .collect();
    // This thread reads rows (SQLite); others apply them to the index. When there are many
    // rows to apply (a first scan, a catch-up from an old snapshot), one per core but the
    // one this thread takes (an index has a part per core); else one. Each row goes to the
    // thread of its id. On two cores, a second applying thread made a 1m first scan
    // slower (median of 9 runs 449.8 ms against 435.9 ms with one).
    let behind = stored.saturating_sub(shards.iter().map(|s| s.2).sum());
    let threads = if behind >= PARALLEL_FROM { index.parts() - 1 } else { 1 };
    let router = index.router(threads);
    let sessions = &cursor.sessions;
    let done = std::thread::scope(|scope| {
        let (sends, queues) = (0..router.threads())
            .map(|_| std::sync::mpsc::sync_channel::<Vec<Raw>>(4))
            .unzip();
        let applier = scope.spawn(move || index.apply_routed(queues, |c, a| apply_chunk(c, sessions, a)));
        let read = read_rows(&tx, &shards, &router, sends);
        // A panic there is a bug: let it surface as the blocking task's panic.
        let (done, applied) = applier.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        // A read error explains an apply that stopped early; report it first.
        read.and(applied).map(|()| done)
    })?;
    tx.commit()?;
    Ok(done)
}

/// One entry as the reading thread hands it over. Its id is allocated here, on the reading
/// thread, and kept by the index as it is.
struct Raw {
    key: OrderKey,
    id: Box<str>,
    kind: Kind,
    hash: ContentHash,
    session_no: i64,
}

const CHUNK: usize = 1024;

/// Rows behind the index from which a catch-up applies them on several threads.
const PARALLEL_FROM: u64 = 10_000;

/// Most ids a first scan reserves room for up front (about 250 MiB of index at most).
const MAX_RESERVE: usize = 2_000_000;
/// How far past twice the sessions read so far a session number may be.
const MAX_SESSION_SLACK: usize = 1 << 20;

/// Read every entry past each shard's position, in chunks, into the queue of the thread
/// that applies its id.
fn read_rows(
    tx: &rusqlite::Transaction<'_>,
    shards: &[(i64, ShardId, u64)],
    router: &Router,
    sends: Vec<std::sync::mpsc::SyncSender<Vec<Raw>>>,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "SELECT seq, epoch, hlc, kind, session_no, content_hash, id FROM entries INDEXED BY entries_projection
         WHERE shard_no = ?1 AND seq > ?2 ORDER BY seq, epoch",
    )?;
    let mut chunks: Vec<Vec<Raw>> = sends.iter().map(|_| Vec::with_capacity(CHUNK)).collect();
    for &(shard_no, shard, after) in shards {
        let mut rows = stmt.query(params![shard_no, after as i64])?;
        while let Some(r) = rows.next()? {
            let kind = Kind::from_u8(r.get(3)?)
                .ok_or_else(|| rusqlite::Error::InvalidColumnType(3, "kind".into(), rusqlite::types::Type::Integer))?;
            let hash = ContentHash::from_slice(r.get_ref(5)?.as_blob()?).ok_or_else(|| {
                rusqlite::Error::InvalidColumnType(5, "content_hash".into(), rusqlite::types::Type::Blob)
            })?;
            let id = r.get_ref(6)?.as_str()?;
            let t = router.thread_of(id);
            chunks[t].push(Raw {
                key: OrderKey {
                    hlc: Hlc(r.get::<_, i64>(2)? as u64),
                    shard,
                    seq: r.get::<_, i64>(0)? as u64,
                    epoch: r.get::<_, i64>(1)? as u64,
                },
                id: id.into(),
                kind,
                hash,
                session_no: r.get(4)?,
            });
            if chunks[t].len() == CHUNK
                && sends[t]
                    .send(std::mem::replace(&mut chunks[t], Vec::with_capacity(CHUNK)))
                    .is_err()
            {
                return Ok(()); // an applying thread stopped: its error says why
            }
        }
    }
    for (chunk, send) in chunks.into_iter().zip(&sends) {
        if !chunk.is_empty() {
            let _ = send.send(chunk);
        }
    }
    Ok(())
}

/// Apply one chunk of rows on the thread its ids were routed to.
fn apply_chunk(
    chunk: Vec<Raw>,
    sessions: &[Option<(String, String)>],
    applier: &mut PartApplier<'_>,
) -> rusqlite::Result<()> {
    for raw in chunk {
        let (bot_id, session_id) = usize::try_from(raw.session_no)
            .ok()
            .and_then(|i| sessions.get(i))
            .and_then(Option::as_ref)
            .ok_or_else(|| {
                rusqlite::Error::InvalidColumnType(
                    4,
                    format!("session_no {}", raw.session_no),
                    rusqlite::types::Type::Integer,
                )
            })?;
        let row = IndexRow {
            key: raw.key,
            id: "",
            kind: raw.kind,
            hash: raw.hash,
            bot_id,
            session_id,
            at: RowRef::default(),
        };
        applier.apply_owned(row, raw.id);
    }
    Ok(())
}

fn fetch(c: &mut Connection, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
    let err = |e| sql_error("read entries", None, Written::Nothing, e);
    let tx = c.transaction().map_err(err)?;
    let mut out = Vec::with_capacity(keys.len());
    {
        let mut stmt = tx
            .prepare_cached(&format!(
                "SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE sh.shard = ?1 AND e.seq = ?2 AND e.epoch = ?3"
            ))
            .map_err(err)?;
        for (k, _) in keys {
            let mut rows = stmt
                .query(params![&k.shard.as_bytes()[..], k.seq as i64, k.epoch as i64])
                .map_err(err)?;
            match rows.next().map_err(err)? {
                Some(r) => out.push(entry(r)?),
                None => {
                    return Err(Error::Corrupt {
                        shard: Some(k.shard),
                        what: format!("entry seq {} epoch {} is indexed but missing", k.seq, k.epoch),
                    });
                }
            }
        }
    }
    tx.commit().map_err(err)?;
    Ok(out)
}

pub(crate) struct SqliteHistory {
    conn: Arc<ReadConn>,
}

impl SqliteHistory {
    /// A history source on the read connection of `index` (a check after a checkpoint uses
    /// both in turn: the file is opened once).
    pub(crate) fn beside(index: &SqliteIndex) -> Self {
        SqliteHistory {
            conn: index.conn.clone(),
        }
    }
}

#[async_trait]
impl HistorySource for SqliteHistory {
    async fn visit_all(&self, checker: &mut HistoryChecker) -> Result<()> {
        let conn = self.conn.get().await?;
        let mut ch = std::mem::take(checker);
        let ch = conn
            .run("conflict discovery", None, Written::Nothing, move |c| {
                let err = |e| sql_error("conflict discovery", None, Written::Nothing, e);
                let tx = c.transaction().map_err(err)?;
                {
                    let mut stmt = tx
                        .prepare(&format!("SELECT {ENTRY_COLUMNS} {ENTRY_JOIN}"))
                        .map_err(err)?;
                    let mut rows = stmt.query([]).map_err(err)?;
                    while let Some(r) = rows.next().map_err(err)? {
                        ch.visit_row(stored_row(r)?);
                    }
                }
                tx.commit().map_err(err)?;
                Ok(ch)
            })
            .await?;
        *checker = ch;
        Ok(())
    }

    /// One range read per shard, on the entries' primary-key order `(shard_no, seq, …)`.
    async fn read_after(&self, after: &Checkpoint, quiet: &HashSet<ShardId>) -> Result<Vec<Entry>> {
        let conn = self.conn.get().await?;
        let after = after.clone();
        let quiet = quiet.clone();
        conn.run("conflict discovery", None, Written::Nothing, move |c| {
            let err = |e| sql_error("conflict discovery", None, Written::Nothing, e);
            let tx = c.transaction().map_err(err)?;
            let mut out = Vec::new();
            {
                let shards: Vec<(i64, ShardId)> = tx
                    .prepare_cached("SELECT shard_no, shard FROM shards")
                    .map_err(err)?
                    .query_map([], |r| Ok((r.get(0)?, shard_id(r, 1)?)))
                    .map_err(err)?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(err)?;
                let mut stmt = tx
                    .prepare(&format!(
                        "SELECT {ENTRY_COLUMNS} {ENTRY_JOIN} WHERE e.shard_no = ?1 AND e.seq > ?2"
                    ))
                    .map_err(err)?;
                for (no, shard) in shards.into_iter().filter(|(_, s)| !quiet.contains(s)) {
                    let mut rows = stmt.query(params![no, after.get(shard) as i64]).map_err(err)?;
                    while let Some(r) = rows.next().map_err(err)? {
                        out.push(entry(r)?);
                    }
                }
            }
            tx.commit().map_err(err)?;
            Ok(out)
        })
        .await
    }

    fn timeout(&self) -> Duration {
        self.conn.options.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctxlog_core::{Record, Store};

    /// A catch-up of many rows applies them on several threads, each row routed by the
    /// reading thread to the thread of its id: the same index, and the same counts, as one
    /// applying thread. (On a two-core machine a store's own index has two parts and one
    /// applying thread, so the routed path with more threads only runs here.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catch_up_on_several_threads_equals_one_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = crate::SqliteStore::open(&path, StoreOptions::default()).await.unwrap();
        for w in 0..3u64 {
            let mut shard = store
                .open_shard(&WriterId::new(format!("w{w}")).unwrap())
                .await
                .unwrap();
            for b in 0..4u64 {
                // Ids shared across writers with other text (divergent puts), some deleted,
                // across 37 sessions.
                let records = (0..1000u64)
                    .map(|i| {
                        let n = b * 1000 + i;
                        let (id, session) = (format!("id{}", n % 2600), format!("s{}", n % 37));
                        if n % 101 == w {
                            Record::tombstone(id, "bot", session)
                        } else {
                            Record::text(id, "bot", session, "user", format!("w{w}"))
                        }
                    })
                    .collect();
                shard.append(records).await.unwrap();
            }
        }
        const { assert!(12_000 >= PARALLEL_FROM, "enough rows to apply on several threads") };
        let mut c = Connection::open(&path).unwrap();
        let mut index_of = |parts: usize| {
            let mut index = ProjectionIndex::with_parts(parts);
            let done = catch_up(&mut c, &mut Cursor::default(), &mut index).unwrap();
            (index, done)
        };
        let (mut one, on_one) = index_of(1);
        let (mut four, on_three) = index_of(4);
        assert_eq!(on_one.applied, 12_000);
        assert_eq!(on_three, on_one);
        assert_eq!(four.projection().canonical_json(), one.projection().canonical_json());
        assert_eq!(four.sessions("bot"), one.sessions("bot"));
        for s in 0..37 {
            let session = format!("s{s}");
            assert_eq!(four.session_keys("bot", &session), one.session_keys("bot", &session));
        }
        assert!(one.stats().divergent_puts > 0 && one.stats().tombstoned > 0);
    }
}
