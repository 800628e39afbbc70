//! The store's schema: its tables and the covering index the projector reads, the check
//! that a file is a ctxlog store this build can open, and the one way an entry row is
//! written.

use rusqlite::{Connection, OptionalExtension, Statement, TransactionBehavior, params};

use ctxlog_core::backend::canonical_json;
use ctxlog_core::{Body, ContentHash, Epoch, Hlc, Record, Seq};

/// The newest store format this build writes: 3, a store whose record ids are scoped by bot
/// (rule 6) and that may hold summaries (rule 21). Recorded in `ctxlog_meta` under `format`;
/// a store is created at format 3.
pub(crate) const FORMAT: &str = "3";

/// Every format this build opens: 1 (before summaries) and 2 (summaries), both with record
/// ids grouped across the whole store, written by earlier releases; 3; 4 (forks); and 5
/// (embeddings).
pub(crate) const READS: [&str; 5] = ["1", "2", "3", "4", "5"];

/// The format that holds summaries with ids grouped across the store: where the first
/// summary takes a store of format 1.
pub(crate) const SUMMARIES: &str = "2";

/// The migrations from each older format to the next, applied in order inside the write
/// transaction that first needs the newer format (rule 22): a store is never rewritten
/// wholesale, and one that never needs a newer format keeps its own, so that earlier
/// releases still open it. 1 → 2: summaries (`kind` 2) store their coverage with their body
/// in `body_bytes` (`Record::stored_body`), so no column changes: only the format number.
/// 2 → 3: record ids scoped by bot; the entries are read differently, not stored
/// differently, so only the number changes — by `ctxlog upgrade`, never by an append
/// (`upgrade_to_ids_by_bot`), since it changes views where one id is under two bots.
/// 3 → 4: links (`kind` 3 and 4) are rows like any other, a fork's position framed in its
/// body as a summary's is: only the number changes, with the first link.
/// 4 → 5: embeddings (`kind` 5) are rows like any other, their vector in `body_bytes`: only
/// the number changes, with the first embedding (a release that reads 4 must not misread
/// kind 5).
const MIGRATIONS: [(&str, &str, &str); 4] = [
    ("1", "2", "UPDATE ctxlog_meta SET value = '2' WHERE key = 'format'"),
    ("2", "3", "UPDATE ctxlog_meta SET value = '3' WHERE key = 'format'"),
    ("3", "4", "UPDATE ctxlog_meta SET value = '4' WHERE key = 'format'"),
    ("4", "5", "UPDATE ctxlog_meta SET value = '5' WHERE key = 'format'"),
];

/// The store's format as `tx` sees it, refused (definite) when this build does not read it:
/// checked inside every append's transaction, so that a long-running writer never writes
/// into a store another release moved on (rule 22).
pub(crate) fn format_in(tx: &rusqlite::Connection) -> std::result::Result<String, FormatError> {
    let now: Option<String> = tx
        .query_row("SELECT value FROM ctxlog_meta WHERE key = 'format'", [], |r| r.get(0))
        .optional()?;
    match now {
        Some(f) if READS.contains(&f.as_str()) => Ok(f),
        Some(f) => Err(FormatError::Unknown(f)),
        None => Err(FormatError::Unknown("none".into())),
    }
}

/// The store's format as a number (`format_in`).
pub(crate) fn format_number(c: &rusqlite::Connection) -> std::result::Result<u32, FormatError> {
    let f = format_in(c)?;
    f.parse().map_err(|_| FormatError::Unknown(f))
}

/// Move the store from format `from` to `to` in one write transaction, if it is at `from`
/// (a compare-and-set, rule 22). `Ok(Some(now))` when it was not.
pub(crate) fn set_format(
    c: &mut rusqlite::Connection,
    from: u32,
    to: u32,
) -> std::result::Result<Option<u32>, FormatError> {
    let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = format_number(&tx)?;
    if now != from {
        return Ok(Some(now));
    }
    tx.execute(
        "UPDATE ctxlog_meta SET value = ?1 WHERE key = 'format'",
        [to.to_string()],
    )?;
    tx.commit()?;
    Ok(None)
}

/// Why a store's format cannot be used.
pub(crate) enum FormatError {
    Sql(rusqlite::Error),
    /// A format this build does not read (a newer release wrote it).
    Unknown(String),
    /// A format that cannot hold what the batch holds (links or embeddings in a store whose
    /// ids are grouped across bots): the store's format.
    TooOld(String),
}

/// Bring the store to format `to` (4 for links, rule 25; 5 for embeddings, rule 27) inside
/// `tx`: from 3 only (what needs it needs ids scoped by bot).
pub(crate) fn upgrade_scoped(tx: &rusqlite::Transaction<'_>, to: u32) -> std::result::Result<(), FormatError> {
    let now = format_in(tx)?;
    if now.parse::<u32>().ok() < Some(3) {
        return Err(FormatError::TooOld(now));
    }
    upgrade(tx, &to.to_string())
}

impl From<rusqlite::Error> for FormatError {
    fn from(e: rusqlite::Error) -> Self {
        FormatError::Sql(e)
    }
}

/// Bring the store to format `to` inside `tx` (a write transaction), applying each
/// migration from its current format on. Does nothing when it is there already or past
/// it, and refuses a format it does not know: a marker is never moved down.
pub(crate) fn upgrade(tx: &rusqlite::Transaction<'_>, to: &str) -> std::result::Result<(), FormatError> {
    let mut now = format_in(tx)?;
    for (from, next, sql) in MIGRATIONS {
        if now.parse::<u32>().ok() >= to.parse::<u32>().ok() {
            break;
        }
        if now == from {
            tx.execute_batch(sql)?;
            now = next.to_string();
        }
    }
    Ok(())
}

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS ctxlog_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS shards (
    shard_no INTEGER PRIMARY KEY,
    shard    BLOB NOT NULL UNIQUE,
    writer   TEXT NOT NULL,
    epoch    INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    max_hlc  INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    session_no INTEGER PRIMARY KEY,
    bot_id     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    UNIQUE (bot_id, session_id)
);
CREATE TABLE IF NOT EXISTS entries (
    shard_no     INTEGER NOT NULL,
    seq          INTEGER NOT NULL,
    epoch        INTEGER NOT NULL,
    hlc          INTEGER NOT NULL,
    kind         INTEGER NOT NULL,
    session_no   INTEGER NOT NULL,
    content_hash BLOB NOT NULL,
    id           TEXT NOT NULL,
    role         TEXT NOT NULL,
    content_type TEXT NOT NULL,
    body_text    TEXT,
    body_bytes   BLOB,
    metadata     TEXT,
    created_at   INTEGER
);
-- The projection's covering index: a first scan reads this b-tree only, never bodies.
-- Its (shard_no, seq, epoch) prefix is unique: appends take seqs inside the epoch-checked
-- transaction.
CREATE INDEX IF NOT EXISTS entries_projection
    ON entries (shard_no, seq, epoch, hlc, kind, session_no, content_hash, id);
";

/// The one way an entry row is written (appends, and the test-only injection).
pub(crate) const INSERT_ENTRY: &str =
    "INSERT INTO entries (shard_no, seq, epoch, hlc, kind, session_no, content_hash, id, role, content_type,
                          body_text, body_bytes, metadata, created_at)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)";

/// What a SQLite file holds, read through a read-only connection.
pub(crate) enum Holds {
    Store,
    NoSchema,
    OtherTables(Vec<String>),
    OtherFormat(String),
}

/// The names of the database's own objects (tables, indexes, views, triggers).
fn objects(c: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = c.prepare("SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' ORDER BY name")?;
    stmt.query_map([], |r| r.get(0))?.collect()
}

pub(crate) fn holds(c: &Connection) -> rusqlite::Result<Holds> {
    let names = objects(c)?;
    if names.iter().any(|n| n == "ctxlog_meta") {
        let format: Option<String> = c
            .query_row("SELECT value FROM ctxlog_meta WHERE key = 'format'", [], |r| r.get(0))
            .optional()?;
        return Ok(match format {
            Some(f) if READS.contains(&f.as_str()) => Holds::Store,
            Some(f) => Holds::OtherFormat(f),
            None => Holds::OtherFormat("none".into()),
        });
    }
    Ok(if names.is_empty() {
        Holds::NoSchema
    } else {
        Holds::OtherTables(names)
    })
}

/// Create the schema, under the write lock, unless another creator did; refuse (writing
/// nothing) if the file gained other tables meanwhile.
pub(crate) fn create_schema(conn: &mut Connection) -> std::result::Result<(), SchemaError> {
    // Before the first table, or never: pages freed by a purge or a tombstoned log's gc can
    // then be returned to the file system a bounded number at a time (`gc`, rule 15). On a
    // file that already has tables this does nothing.
    conn.execute_batch("PRAGMA auto_vacuum = INCREMENTAL")?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    match holds(&tx)? {
        Holds::Store => return Ok(()),
        Holds::NoSchema => {}
        refused => return Err(SchemaError::Refused(refused)),
    }
    tx.execute_batch(SCHEMA)?;
    // A new store scopes ids by bot (format 3): earlier releases refuse it rather than read
    // it with the ids of all bots in one namespace.
    tx.execute("INSERT INTO ctxlog_meta (key, value) VALUES ('format', ?1)", [FORMAT])?;
    tx.commit()?;
    Ok(())
}

/// Why the schema could not be put in place.
pub(crate) enum SchemaError {
    Sql(rusqlite::Error),
    /// The file turned out to be something else once locked for writing.
    Refused(Holds),
}

impl From<rusqlite::Error> for SchemaError {
    fn from(e: rusqlite::Error) -> Self {
        SchemaError::Sql(e)
    }
}

/// One entry row, bound to [`INSERT_ENTRY`].
pub(crate) struct EntryRow<'a> {
    pub shard_no: i64,
    pub seq: Seq,
    pub epoch: Epoch,
    pub hlc: Hlc,
    pub session_no: i64,
    pub hash: &'a ContentHash,
    pub record: &'a Record,
}

/// Insert one entry row (appends, and the test-only injection). HLCs and seqs are stored
/// as the bits of a u64 in SQLite's i64.
pub(crate) fn insert_entry(stmt: &mut Statement<'_>, row: EntryRow<'_>) -> rusqlite::Result<()> {
    let r = row.record;
    let stored = r.stored_body();
    let (text, bytes) = match &*stored {
        Body::Text(t) => (Some(t.as_str()), None),
        Body::Bytes(b) => (None, Some(b.as_slice())),
    };
    stmt.execute(params![
        row.shard_no,
        row.seq as i64,
        row.epoch as i64,
        row.hlc.0 as i64,
        r.kind.as_u8(),
        row.session_no,
        &row.hash.0[..],
        r.id,
        r.role,
        r.content_type,
        text,
        bytes,
        r.metadata.as_ref().map(canonical_json),
        r.created_at.and_then(|t| t.timestamp_nanos_opt()),
    ])?;
    Ok(())
}
