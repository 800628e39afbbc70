//! Reading: shard listings, full entries, and the projector's and history checker's scans.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;
use ctxlog_core::backend::history::{HistoryChecker, HistorySource, StoredBody, StoredRow};
use ctxlog_core::backend::index::{IndexRow, PartApplier, ProjectionIndex, Router, RowRef};
use ctxlog_core::backend::projector::{CatchUp, IndexSource, SnapshotBlobs};
use ctxlog_core::backend::snapshot::Rejected;
use ctxlog_core::{
    Checkpoint, ContentHash, Entry, Error, Hlc, IdScope, Kind, OrderKey, Result, ShardId, ShardInfo, StoreOptions,
    WriterId, Written,
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
    /// The projector's cursor and index while a catch-up works on them on its blocking
    /// thread, and where one abandoned at its deadline (still queued, or outlasting the
    /// projector's own deadline) leaves them when it ends: the next catch-up resumes from
    /// them instead of starting over from an empty index (a first scan, which on a slow
    /// replica may never fit in a deadline again).
    parked: Parked,
    forced: Forced,
}

type Parked = Arc<std::sync::Mutex<Slot>>;

/// See [`SqliteIndex::parked`].
#[derive(Default)]
struct Slot {
    state: Option<(Cursor, ProjectionIndex)>,
    /// A blocking call holds the state (it may outlive the refresh that started it).
    busy: bool,
}

fn slot(parked: &Parked) -> std::sync::MutexGuard<'_, Slot> {
    parked.lock().unwrap_or_else(|p| p.into_inner())
}

impl SqliteIndex {
    pub(crate) fn new(path: PathBuf, options: StoreOptions) -> Self {
        SqliteIndex {
            conn: Arc::new(ReadConn::new(path, options)),
            parked: Parked::default(),
            forced: Forced::default(),
        }
    }
}

/// What only tests set: how a catch-up is made to run where a test needs it, whatever the
/// machine. Inert otherwise.
#[derive(Default)]
struct Forced {
    /// Parts of the index a first scan builds, instead of one per core: a large catch-up
    /// then applies on several threads on a machine of any size.
    parts: Option<usize>,
    /// Rows after which the next catch-up's reading thread waits out its call's deadline, so
    /// that the deadline interrupts the read part-way, as on a slow disk; taken by that
    /// catch-up (0: none).
    stall_after: AtomicU64,
}

impl Forced {
    fn take_stall(&self) -> Option<u64> {
        Some(self.stall_after.swap(0, Ordering::AcqRel)).filter(|n| *n > 0)
    }
}

#[async_trait]
impl IndexSource for SqliteIndex {
    type Cursor = Cursor;

    async fn catch_up(&self, cursor: &mut Cursor, index: &mut ProjectionIndex) -> Result<CatchUp> {
        let conn = self.conn.get().await?;
        // Tests only (see `Forced`).
        if let Some(parts) = self.forced.parts
            && index.entries() == 0
            && index.parts() != parts
        {
            *index = ProjectionIndex::with_parts(parts, index.scope());
        }
        let stall_after = self.forced.take_stall();
        // An abandoned catch-up left its work: resume from it (unless the projector started
        // over under another id grouping meanwhile, rule 22). One still at work on it: wait
        // for it (this refresh fails, changing nothing) rather than start over without it.
        {
            let mut parked = slot(&self.parked);
            if parked.busy {
                return Err(Error::Timeout {
                    op: "refresh",
                    after: self.conn.options.timeout,
                    shard: None,
                    written: Written::Nothing,
                });
            }
            if let Some((c, i)) = parked.state.take()
                && i.scope() == index.scope()
            {
                *cursor = c;
                *index = i;
            }
            // The state goes to the slot, the blocking call works on it there, and it comes
            // back from it; if this refresh is abandoned, it stays there (both at their
            // defaults here meanwhile, which agree) and the call puts it back when it ends.
            // A call that finds no state (a later refresh's call took and returned it first:
            // calls on the connection are not run in the order they came) does nothing.
            parked.state = Some((std::mem::take(cursor), std::mem::take(index)));
        }
        let parked = self.parked.clone();
        let ran = conn
            .run("refresh", None, Written::Nothing, move |c| {
                let Some((mut cur, mut idx)) = ({
                    let mut s = slot(&parked);
                    s.busy = s.state.is_some();
                    s.state.take()
                }) else {
                    return Ok(None);
                };
                let n = catch_up(c, &mut cur, &mut idx, stall_after);
                let mut s = slot(&parked);
                s.state = Some((cur, idx));
                s.busy = false;
                Ok(Some(n))
            })
            .await;
        if let Some((c, i)) = slot(&self.parked).state.take() {
            *cursor = c;
            *index = i;
        }
        let Some(n) = ran? else {
            return Err(Error::Timeout {
                op: "refresh",
                after: self.conn.options.timeout,
                shard: None,
                written: Written::Nothing,
            });
        };
        n.map_err(|e| sql_error("refresh", None, Written::Nothing, e))
    }

    async fn fetch(&self, _cursor: &Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        let conn = self.conn.get().await?;
        let keys = keys.to_vec();
        conn.run("read entries", None, Written::Nothing, move |c| fetch(c, &keys))
            .await
    }

    fn options(&self) -> &StoreOptions {
        &self.conn.options
    }

    async fn id_scope(&self) -> Result<IdScope> {
        let conn = self.conn.get().await?;
        let path = self.conn.path.clone();
        conn.run("refresh", None, Written::Nothing, move |c| {
            crate::schema::format_number(c)
                .map(IdScope::of_format)
                .map_err(|e| crate::conn::format_error(e, "refresh", None, &path))
        })
        .await
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

#[async_trait]
impl SnapshotBlobs for SqliteIndex {
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
}

/// Apply every entry past the index's checkpoint, in one read transaction so that every
/// shard is read at the same snapshot.
///
/// A catch-up that fails leaves the index and its per-shard positions (the cursor of the
/// next one, which reads only past them) agreeing: every row read before a read error (the
/// deadline, an undecodable row) is applied, so each shard's rows applied are the ones up to
/// its position; an apply error resets both (the index emptied), since the other threads
/// went on applying later rows than the failed thread's. With `stall_after` (tests only: see
/// [`Forced`]), the reading thread waits out its call's deadline after that many rows.
fn catch_up(
    c: &mut Connection,
    cursor: &mut Cursor,
    index: &mut ProjectionIndex,
    stall_after: Option<u64>,
) -> rusqlite::Result<CatchUp> {
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
    // thread of its id. Not one per core: reading keeps this thread busy, and an applying
    // thread on its core competes with it for that core — on two cores a second applying
    // thread made a first scan slower, not faster (docs/benchmarks.md).
    let behind = stored.saturating_sub(shards.iter().map(|s| s.2).sum());
    let threads = if behind >= PARALLEL_FROM { index.parts() - 1 } else { 1 };
    let router = index.router(threads);
    let sessions = &cursor.sessions;
    // Lent to the applying thread for the scope only: an apply error empties it below.
    let applying = &mut *index;
    let (read, done, applied) = std::thread::scope(|scope| {
        let (sends, queues) = (0..router.threads())
            .map(|_| std::sync::mpsc::sync_channel::<Vec<Raw>>(4))
            .unzip();
        let applier = scope.spawn(move || applying.apply_routed(queues, |c, a| apply_chunk(c, sessions, a)));
        let read = read_rows(&tx, &shards, &router, sessions, sends, stall_after);
        // A panic there is a bug: let it surface as the blocking task's panic.
        let (done, applied) = applier.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        (read, done, applied)
    });
    if applied.is_err() {
        // A thread that stopped at a row it could not apply dropped the rows queued for it,
        // while the others went on: the index holds rows past those, and its positions
        // with them. Keeping it would hide the dropped rows from every later catch-up;
        // emptied, the next one reads everything again (and meets the same row).
        *index = ProjectionIndex::with_parts(index.parts(), index.scope());
        *cursor = Cursor::default();
    }
    // A read error explains an apply that stopped early; report it first.
    read.and(applied)?;
    tx.commit()?;
    Ok(done)
}

/// One entry as the reading thread hands it over, its id copied out of SQLite's row.
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
/// that applies its id. Every row read is handed over, also when the read stops early.
fn read_rows(
    tx: &rusqlite::Transaction<'_>,
    shards: &[(i64, ShardId, u64)],
    router: &Router,
    sessions: &[Option<(String, String)>],
    sends: Vec<std::sync::mpsc::SyncSender<Vec<Raw>>>,
    stall_after: Option<u64>,
) -> rusqlite::Result<()> {
    let mut chunks: Vec<Vec<Raw>> = sends.iter().map(|_| Vec::with_capacity(CHUNK)).collect();
    let read = read_into(tx, shards, router, sessions, &sends, &mut chunks, stall_after);
    // The chunks not full yet are sent whether or not the read went to the end: a thread may
    // have applied a full chunk of later rows of the same shard, and raised the shard's
    // position past rows kept here. Dropped, they would be holes below that position, which
    // the next catch-up (reading past it) never reads again.
    for (chunk, send) in chunks.into_iter().zip(&sends) {
        if !chunk.is_empty() {
            let _ = send.send(chunk); // a thread that stopped has an error to say why
        }
    }
    read
}

/// Read rows into `chunks`, sending each full one to its thread.
///
/// The rows of one seq (a fenced writer's entry and its successor's share it) are handed on
/// together, once a row of a later seq or the shard's end shows the group whole: a read cut
/// between two of them hands on none, so the shard's position never passes a seq whose rows
/// were not all applied.
fn read_into(
    tx: &rusqlite::Transaction<'_>,
    shards: &[(i64, ShardId, u64)],
    router: &Router,
    sessions: &[Option<(String, String)>],
    sends: &[std::sync::mpsc::SyncSender<Vec<Raw>>],
    chunks: &mut [Vec<Raw>],
    stall_after: Option<u64>,
) -> rusqlite::Result<()> {
    let mut stmt = tx.prepare_cached(
        "SELECT seq, epoch, hlc, kind, session_no, content_hash, id FROM entries INDEXED BY entries_projection
         WHERE shard_no = ?1 AND seq > ?2 ORDER BY seq, epoch",
    )?;
    // Hand the rows of `group` on to their threads; false when a thread stopped.
    let mut hand_on = |group: &mut Vec<(usize, Raw)>| {
        for (t, raw) in group.drain(..) {
            chunks[t].push(raw);
            if chunks[t].len() == CHUNK
                && sends[t]
                    .send(std::mem::replace(&mut chunks[t], Vec::with_capacity(CHUNK)))
                    .is_err()
            {
                return false;
            }
        }
        true
    };
    let mut rows_read: u64 = 0;
    let mut group: Vec<(usize, Raw)> = Vec::new();
    for &(shard_no, shard, after) in shards {
        let mut rows = stmt.query(params![shard_no, after as i64])?;
        while let Some(r) = rows.next()? {
            let kind = Kind::from_u8(r.get(3)?)
                .ok_or_else(|| rusqlite::Error::InvalidColumnType(3, "kind".into(), rusqlite::types::Type::Integer))?;
            let hash = ContentHash::from_slice(r.get_ref(5)?.as_blob()?).ok_or_else(|| {
                rusqlite::Error::InvalidColumnType(5, "content_hash".into(), rusqlite::types::Type::Blob)
            })?;
            let id = r.get_ref(6)?.as_str()?;
            let session_no: i64 = r.get(4)?;
            // Routed by the id in its namespace (its bot's, in a store of format 3); a
            // session number the table lacks fails where the row is applied.
            let bot_id = usize::try_from(session_no)
                .ok()
                .and_then(|i| sessions.get(i))
                .and_then(Option::as_ref)
                .map_or("", |(b, _)| b.as_str());
            let thread = router.thread_of(bot_id, id);
            let raw = Raw {
                key: OrderKey {
                    hlc: Hlc(r.get::<_, i64>(2)? as u64),
                    shard,
                    seq: r.get::<_, i64>(0)? as u64,
                    epoch: r.get::<_, i64>(1)? as u64,
                },
                id: id.into(),
                kind,
                hash,
                session_no,
            };
            if group.first().is_some_and(|(_, g)| g.key.seq != raw.key.seq) && !hand_on(&mut group) {
                return Ok(()); // an applying thread stopped: its error says why
            }
            group.push((thread, raw));
            rows_read += 1;
            if Some(rows_read) == stall_after {
                wait_out_deadline();
            }
        }
        if !hand_on(&mut group) {
            return Ok(());
        }
    }
    Ok(())
}

/// Wait until the deadline of the call this thread runs has passed, so that the running
/// statement's next steps are interrupted by it (tests only: see [`Forced`]). Outside a call
/// there is no deadline to wait for.
fn wait_out_deadline() {
    if let Some(deadline) = crate::conn::call_deadline() {
        std::thread::sleep(deadline.saturating_duration_since(std::time::Instant::now()));
    }
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
            id: &raw.id,
            kind: raw.kind,
            hash: raw.hash,
            bot_id,
            session_id,
            at: RowRef::default(),
        };
        applier.apply_routed(row);
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
    use ctxlog_core::backend::projector::IndexedProjector;
    use ctxlog_core::{Projector, Record, Store};

    /// A catch-up of many rows applies them on several threads, each row routed by the
    /// reading thread to the thread of its id: the same index, and the same counts, as one
    /// applying thread. (On a two-core machine a store's own index has two parts and one
    /// applying thread, so the routed path with more threads only runs in these tests.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catch_up_on_several_threads_equals_one_on_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = crate::SqliteStore::open(&path, StoreOptions::default()).await.unwrap();
        // What every batch so far acknowledged: what the summaries cover.
        let mut acked = ctxlog_core::Checkpoint::default();
        for w in 0..3u64 {
            let mut shard = store
                .open_shard(&WriterId::new(format!("w{w}")).unwrap())
                .await
                .unwrap();
            for b in 0..4u64 {
                // Ids shared across writers with other text (divergent puts), some deleted,
                // across 37 sessions; summaries of their own ids covering every earlier batch.
                let records = (0..1000u64)
                    .map(|i| {
                        let n = b * 1000 + i;
                        let (id, session) = (format!("id{}", n % 2600), format!("s{}", n % 37));
                        if i % 97 == 5 {
                            Record::summary(format!("sum{w}-{n}"), "bot", session, "so far", acked.clone())
                        } else if n % 101 == w {
                            Record::tombstone(id, "bot", session)
                        } else {
                            Record::text(id, "bot", session, "user", format!("w{w}"))
                        }
                    })
                    .collect();
                let ack = shard.append(records).await.unwrap();
                acked.advance(ack.shard, ack.first_seq + 999);
            }
        }
        const { assert!(12_000 >= PARALLEL_FROM, "enough rows to apply on several threads") };
        let mut c = Connection::open(&path).unwrap();
        let mut index_of = |parts: usize| {
            let mut index = ProjectionIndex::with_parts(parts, IdScope::Bot);
            let done = catch_up(&mut c, &mut Cursor::default(), &mut index, None).unwrap();
            (index, done)
        };
        let (mut one, on_one) = index_of(1);
        let (mut four, on_three) = index_of(4);
        assert_eq!(on_one.applied, 12_000);
        assert_eq!(on_three, on_one);
        assert_eq!(four.projection().canonical_json(), one.projection().canonical_json());
        assert_eq!(four.sessions("bot"), one.sessions("bot"));
        let mut summaries = 0;
        for s in 0..37 {
            let session = format!("s{s}");
            assert_eq!(four.session_keys("bot", &session), one.session_keys("bot", &session));
            // Rule 21's bookkeeping: which entries are summaries, on either path.
            let of = |i: &mut ProjectionIndex| i.session_with_summaries("bot", &session).summaries;
            assert_eq!(of(&mut four), of(&mut one), "session {session}");
            summaries += of(&mut one).len();
        }
        assert_eq!(summaries, 3 * 4 * 11, "every summary written is one");
        assert!(one.stats().divergent_puts > 0 && one.stats().tombstoned > 0);
    }

    /// A store of `writers` shards of `each` entries, every id written once; one in 500 a
    /// summary covering every earlier batch.
    async fn store_of(path: &std::path::Path, writers: u64, each: u64) -> crate::SqliteStore {
        let options = StoreOptions::default().with_timeout(Duration::from_secs(10));
        let store = crate::SqliteStore::open(path, options).await.unwrap();
        let mut acked = ctxlog_core::Checkpoint::default();
        for w in 0..writers {
            let mut shard = store
                .open_shard(&WriterId::new(format!("w{w}")).unwrap())
                .await
                .unwrap();
            for first in (0..each).step_by(1000) {
                let records: Vec<Record> = (first..each.min(first + 1000))
                    .map(|i| {
                        let (id, session) = (format!("w{w}-{i}"), format!("s{}", i % 7));
                        if i % 500 == 499 {
                            Record::summary(id, "bot", session, "so far", acked.clone())
                        } else {
                            Record::text(id, "bot", session, "user", "text")
                        }
                    })
                    .collect();
                let n = records.len() as u64;
                let ack = shard.append(records).await.unwrap();
                acked.advance(ack.shard, ack.first_seq + n - 1);
            }
            shard.close().await.unwrap();
        }
        store
    }

    /// A reader whose index has four parts, so that a large catch-up applies on three
    /// threads whatever the machine's cores; its first catch-up's reading thread waits out
    /// the deadline after `stall_after` rows (0: never).
    fn four_part_reader(path: &std::path::Path, timeout: Duration, stall_after: u64) -> IndexedProjector<SqliteIndex> {
        let options = StoreOptions::default()
            .with_create_if_missing(false)
            .with_timeout(timeout)
            .with_read_snapshots(false);
        IndexedProjector::new(Arc::new(SqliteIndex {
            conn: Arc::new(ReadConn::new(path.to_path_buf(), options)),
            parked: Parked::default(),
            forced: Forced {
                parts: Some(4),
                stall_after: AtomicU64::new(stall_after),
            },
        }))
    }

    /// Every step of a test ends, whatever the code under test does.
    async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
        tokio::time::timeout(Duration::from_secs(60), f)
            .await
            .unwrap_or_else(|_| panic!("{what} hung"))
    }

    /// The index holds exactly the entries up to each shard's position: seqs are dense from
    /// 1 and every id is written once, so it holds as many as the positions add up to.
    fn assert_index_and_positions_agree(p: &dyn Projector, when: &str) {
        let held = p.stats().entries;
        let positions: u64 = p.checkpoint().0.values().sum();
        assert_eq!(
            held, positions,
            "{when}: the index holds {held} entries, its positions say {positions}"
        );
    }

    async fn assert_same_view(p: &mut dyn Projector, full: &mut dyn Projector, who: &str) {
        assert_eq!(p.stats(), full.stats(), "{who}");
        assert_eq!(p.checkpoint(), full.checkpoint(), "{who}");
        assert_eq!(
            p.projection().canonical_json(),
            full.projection().canonical_json(),
            "{who}"
        );
        assert_eq!(
            p.sessions("bot").await.unwrap(),
            full.sessions("bot").await.unwrap(),
            "{who}"
        );
        // Rule 21: the summaries each session holds, and which of them governs.
        for s in 0..7 {
            let session = format!("s{s}");
            let (mine, theirs) = (
                p.context("bot", &session).await.unwrap(),
                full.context("bot", &session).await.unwrap(),
            );
            assert!(
                mine.summary.is_some(),
                "{who}: session {session} has a governing summary"
            );
            assert_eq!(mine, theirs, "{who}: session {session}");
        }
    }

    /// A large catch-up on several applying threads that the deadline cuts short keeps what
    /// it applied and its positions agreeing, so the next refresh reads every row it missed;
    /// a snapshot saved afterwards hands a new reader every entry. (The reading thread hands
    /// rows over in chunks: a chunk still filling when the read stops holds rows below those
    /// other threads have applied.)
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_catch_up_cut_short_on_several_threads_leaves_no_holes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        let store = store_of(&path, 2, 10_000).await;
        const { assert!(20_000 >= PARALLEL_FROM, "enough rows to apply on several threads") };

        // Cut after three quarters of the rows: past the first shard read, in the middle of
        // the second.
        let mut cut = four_part_reader(&path, Duration::from_secs(3), 15_000);
        match bounded("the cut refresh", cut.refresh()).await {
            Err(Error::Timeout { .. }) => {}
            other => panic!("the deadline cuts the catch-up: expected Timeout, got {other:?}"),
        }
        assert_index_and_positions_agree(&cut, "after the cut catch-up");
        // Every row read before the cut is kept: the reading thread waited out the deadline
        // after the first three quarters.
        let held = cut.stats().entries;
        assert!(
            (15_000..20_000).contains(&held),
            "the catch-up was cut part-way, what it read kept ({held} entries)"
        );

        let report = bounded("the next refresh", cut.refresh()).await.unwrap();
        assert_eq!(report.new_entries, 20_000 - held);
        let mut full = four_part_reader(&path, Duration::from_secs(30), 0);
        bounded("a full scan", full.refresh()).await.unwrap();
        assert_eq!(full.stats().entries, 20_000);
        assert_same_view(&mut cut, &mut full, "the reader cut short, caught up").await;

        bounded("saving a snapshot", cut.save_snapshot()).await.unwrap();
        let mut next = store.projector();
        let report = bounded("a reader from the snapshot", next.refresh()).await.unwrap();
        assert!(report.from_snapshot.is_some(), "{report:?}");
        assert_eq!(report.new_entries, 0);
        assert_same_view(&mut *next, &mut full, "a reader from its snapshot").await;
    }

    /// A catch-up whose refresh is abandoned (its deadline fired before SQLite's own one
    /// could interrupt the read, or it was still queued) keeps what it read: the next
    /// refresh resumes from it instead of reading the store again from the start.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_catch_up_is_resumed_not_started_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        store_of(&path, 2, 10_000).await;
        let mut cut = four_part_reader(&path, Duration::from_secs(4), 15_000);
        // Dropped while its catch-up reads (reading the format takes milliseconds): the
        // blocking read goes on, waits out its deadline after three quarters of the rows, and
        // ends interrupted.
        let abandoned = tokio::time::timeout(Duration::from_millis(1_500), cut.refresh()).await;
        assert!(abandoned.is_err(), "the refresh was abandoned: {abandoned:?}");
        // The next refreshes queue behind it; one whose call's deadline passed in the queue
        // never ran (and changes nothing).
        let mut report = None;
        for _ in 0..3 {
            match bounded("a refresh after the abandoned one", cut.refresh()).await {
                Ok(r) => {
                    report = Some(r);
                    break;
                }
                Err(Error::Timeout { .. }) => assert_index_and_positions_agree(&cut, "after a timeout"),
                Err(e) => panic!("{e}"),
            }
        }
        let report = report.expect("a refresh succeeds within three");
        assert!(
            report.entries_read <= 5_000,
            "the refresh after an abandoned one read {} entries: it started over",
            report.entries_read
        );
        let mut full = four_part_reader(&path, Duration::from_secs(30), 0);
        bounded("a full scan", full.refresh()).await.unwrap();
        assert_same_view(&mut cut, &mut full, "the reader resumed").await;
    }

    /// A row that one applying thread cannot apply stops that thread while the others go on
    /// past it: the index and its positions are emptied together, so the next refresh meets
    /// the row again instead of reading past it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_apply_error_on_several_threads_is_met_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        store_of(&path, 1, 12_000).await;
        // A session number the sessions table does not hold (a damaged store).
        let c = Connection::open(&path).unwrap();
        c.execute("UPDATE entries SET session_no = 999 WHERE seq = 3000", [])
            .unwrap();
        drop(c);

        let mut p = four_part_reader(&path, Duration::from_secs(30), 0);
        for attempt in 0..2 {
            match bounded("a refresh", p.refresh()).await {
                Err(Error::Corrupt { .. }) => {}
                other => panic!("attempt {attempt}: expected Corrupt, got {other:?}"),
            }
            assert_index_and_positions_agree(&p, "after an apply error");
        }
    }
}
