//! The entry table's Arrow schema, and conversions between entries and record batches.
//!
//! One typed column per entry field. The unenforced primary key is `(shard, epoch, seq)`:
//! unique per entry, so Lance's newest-per-key resolution never collapses two entries, not
//! even a stale writer's. De-duplication by record id is ctxlog's job (rule 6).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use arrow_array::builder::{
    FixedSizeBinaryBuilder, Int64Builder, LargeBinaryBuilder, LargeStringBuilder, StringBuilder, UInt8Builder,
    UInt64Builder,
};
use arrow_array::cast::AsArray;
use arrow_array::types::{Int64Type, UInt8Type, UInt64Type};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use ctxlog_core::backend::canonical_json;
use ctxlog_core::backend::history::{StoredBody, StoredRow};
use ctxlog_core::backend::index::{IndexRow, RowRef};
use ctxlog_core::{Body, ContentHash, Entry, Epoch, Error, Hlc, Kind, OrderKey, Record, Result, ShardId};
use uuid::Uuid;

pub(crate) const SHARD: &str = "shard";
pub(crate) const EPOCH: &str = "epoch";
pub(crate) const SEQ: &str = "seq";
pub(crate) const HLC: &str = "hlc";
pub(crate) const KIND: &str = "kind";
pub(crate) const ID: &str = "id";
pub(crate) const BOT_ID: &str = "bot_id";
pub(crate) const SESSION_ID: &str = "session_id";
pub(crate) const CONTENT_HASH: &str = "content_hash";
pub(crate) const ROLE: &str = "role";
pub(crate) const CONTENT_TYPE: &str = "content_type";
pub(crate) const BODY_TEXT: &str = "body_text";
pub(crate) const BODY_BYTES: &str = "body_bytes";
pub(crate) const METADATA: &str = "metadata";
pub(crate) const CREATED_AT: &str = "created_at";
pub(crate) const WRITER: &str = "writer";

/// The primary key, in key order.
pub(crate) const PRIMARY_KEY: [&str; 3] = [SHARD, EPOCH, SEQ];

/// What the projection reads: everything but bodies and other payload.
pub(crate) const INDEX_COLUMNS: [&str; 9] = [SHARD, EPOCH, SEQ, HLC, KIND, ID, BOT_ID, SESSION_ID, CONTENT_HASH];

/// What the recovery of a shard's position reads.
pub(crate) const POSITION_COLUMNS: [&str; 4] = [SHARD, SEQ, HLC, EPOCH];

fn pk(position: &str) -> HashMap<String, String> {
    HashMap::from([
        ("lance-schema:unenforced-primary-key".to_string(), "true".to_string()),
        (
            "lance-schema:unenforced-primary-key:position".to_string(),
            position.to_string(),
        ),
    ])
}

static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        // Lance does not accept FixedSizeBinary key columns: the shard id is its UUID text.
        Field::new(SHARD, DataType::Utf8, false).with_metadata(pk("1")),
        Field::new(EPOCH, DataType::UInt64, false).with_metadata(pk("2")),
        Field::new(SEQ, DataType::UInt64, false).with_metadata(pk("3")),
        Field::new(HLC, DataType::UInt64, false),
        Field::new(KIND, DataType::UInt8, false),
        Field::new(ID, DataType::Utf8, false),
        Field::new(BOT_ID, DataType::Utf8, false),
        Field::new(SESSION_ID, DataType::Utf8, false),
        Field::new(CONTENT_HASH, DataType::FixedSizeBinary(32), false),
        Field::new(ROLE, DataType::Utf8, false),
        Field::new(CONTENT_TYPE, DataType::Utf8, false),
        // Bodies may reach the body limit (16 MiB) in batches of thousands: 64-bit offsets.
        Field::new(BODY_TEXT, DataType::LargeUtf8, true),
        Field::new(BODY_BYTES, DataType::LargeBinary, true),
        Field::new(METADATA, DataType::Utf8, true),
        Field::new(CREATED_AT, DataType::Int64, true),
        Field::new(WRITER, DataType::Utf8, false),
    ]))
});

pub(crate) fn schema() -> SchemaRef {
    SCHEMA.clone()
}

/// One entry to write: the record with everything the writer stamps on it.
pub(crate) struct Stamped<'a> {
    pub shard: ShardId,
    pub epoch: Epoch,
    pub seq: u64,
    pub hlc: Hlc,
    pub hash: ContentHash,
    pub record: &'a Record,
}

/// A record batch of entries, in the table's schema.
pub(crate) fn to_batch(writer: &str, entries: &[Stamped<'_>]) -> Result<RecordBatch> {
    let n = entries.len();
    let mut shard = StringBuilder::with_capacity(n, n * 36);
    let mut epoch = UInt64Builder::with_capacity(n);
    let mut seq = UInt64Builder::with_capacity(n);
    let mut hlc = UInt64Builder::with_capacity(n);
    let mut kind = UInt8Builder::with_capacity(n);
    let mut id = StringBuilder::new();
    let mut bot = StringBuilder::new();
    let mut session = StringBuilder::new();
    let mut hash = FixedSizeBinaryBuilder::with_capacity(n, 32);
    let mut role = StringBuilder::new();
    let mut content_type = StringBuilder::new();
    let mut text = LargeStringBuilder::new();
    let mut bytes = LargeBinaryBuilder::new();
    let mut metadata = StringBuilder::new();
    let mut created = Int64Builder::with_capacity(n);
    let mut writers = StringBuilder::new();
    let shard_text: HashMap<ShardId, String> = entries.iter().map(|e| (e.shard, e.shard.to_string())).collect();
    for e in entries {
        let r = e.record;
        shard.append_value(&shard_text[&e.shard]);
        epoch.append_value(e.epoch);
        seq.append_value(e.seq);
        hlc.append_value(e.hlc.0);
        kind.append_value(r.kind.as_u8());
        id.append_value(&r.id);
        bot.append_value(&r.bot_id);
        session.append_value(&r.session_id);
        hash.append_value(e.hash.0).map_err(arrow_err)?;
        role.append_value(&r.role);
        content_type.append_value(&r.content_type);
        match &*r.stored_body() {
            Body::Text(t) => {
                text.append_value(t);
                bytes.append_null();
            }
            Body::Bytes(b) => {
                text.append_null();
                bytes.append_value(b);
            }
        }
        metadata.append_option(r.metadata.as_ref().map(canonical_json));
        created.append_option(r.created_at.and_then(|t| t.timestamp_nanos_opt()));
        writers.append_value(writer);
    }
    let columns: Vec<ArrayRef> = vec![
        Arc::new(shard.finish()),
        Arc::new(epoch.finish()),
        Arc::new(seq.finish()),
        Arc::new(hlc.finish()),
        Arc::new(kind.finish()),
        Arc::new(id.finish()),
        Arc::new(bot.finish()),
        Arc::new(session.finish()),
        Arc::new(hash.finish()),
        Arc::new(role.finish()),
        Arc::new(content_type.finish()),
        Arc::new(text.finish()),
        Arc::new(bytes.finish()),
        Arc::new(metadata.finish()),
        Arc::new(created.finish()),
        Arc::new(writers.finish()),
    ];
    RecordBatch::try_new(schema(), columns).map_err(arrow_err)
}

pub(crate) fn arrow_err(e: arrow_schema::ArrowError) -> Error {
    Error::Corrupt {
        shard: None,
        what: format!("entry data does not fit the entry schema: {e}"),
    }
}

fn corrupt(what: String) -> Error {
    Error::Corrupt { shard: None, what }
}

fn column<'a>(batch: &'a RecordBatch, name: &str) -> Result<&'a ArrayRef> {
    batch
        .column_by_name(name)
        .ok_or_else(|| corrupt(format!("stored entries lack the `{name}` column")))
}

/// Typed views of the columns of a batch; works on the table schema and on MemWAL's storage
/// schema (nullable payload columns, an extra `_tombstone`).
pub(crate) struct Columns<'a> {
    epoch: &'a arrow_array::PrimitiveArray<UInt64Type>,
    seq: &'a arrow_array::PrimitiveArray<UInt64Type>,
    hlc: Option<&'a arrow_array::PrimitiveArray<UInt64Type>>,
    kind: Option<&'a arrow_array::PrimitiveArray<UInt8Type>>,
    id: Option<&'a arrow_array::StringArray>,
    bot: Option<&'a arrow_array::StringArray>,
    session: Option<&'a arrow_array::StringArray>,
    hash: Option<&'a arrow_array::FixedSizeBinaryArray>,
    role: Option<&'a arrow_array::StringArray>,
    content_type: Option<&'a arrow_array::StringArray>,
    text: Option<&'a arrow_array::LargeStringArray>,
    bytes: Option<&'a arrow_array::LargeBinaryArray>,
    metadata: Option<&'a arrow_array::StringArray>,
    created: Option<&'a arrow_array::PrimitiveArray<Int64Type>>,
    tombstone: Option<&'a arrow_array::BooleanArray>,
    /// The distinct shards of the batch (a few), each parsed once...
    shards: Vec<ShardId>,
    /// ...and which of them each row belongs to.
    shard_of: Vec<u16>,
    len: usize,
}

macro_rules! opt_col {
    ($batch:expr, $name:expr, $as:ident) => {
        match $batch.column_by_name($name) {
            None => None,
            Some(c) => Some(
                c.$as()
                    .ok_or_else(|| corrupt(format!("column `{}` has type {}", $name, c.data_type())))?,
            ),
        }
    };
}

impl<'a> Columns<'a> {
    pub(crate) fn new(batch: &'a RecordBatch) -> Result<Self> {
        let typed = |name: &str| corrupt(format!("column `{name}` has an unexpected type"));
        let shard = column(batch, SHARD)?
            .as_string_opt::<i32>()
            .ok_or_else(|| typed(SHARD))?;
        let epoch = column(batch, EPOCH)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| typed(EPOCH))?;
        let seq = column(batch, SEQ)?
            .as_primitive_opt::<UInt64Type>()
            .ok_or_else(|| typed(SEQ))?;
        // Rows of one shard come in runs, and shards are few: compare with the previous
        // row, then with the shards seen, and parse a UUID only once per shard.
        let mut shards: Vec<ShardId> = Vec::new();
        let mut texts: Vec<&str> = Vec::new();
        let mut shard_of: Vec<u16> = Vec::with_capacity(batch.num_rows());
        let mut last: Option<(&str, u16)> = None;
        for i in 0..batch.num_rows() {
            let text = shard.value(i);
            let no = match last {
                Some((t, no)) if t == text => no,
                _ => {
                    let no = match texts.iter().position(|t| *t == text) {
                        Some(no) => no as u16,
                        None => {
                            let id = Uuid::parse_str(text)
                                .map_err(|e| corrupt(format!("shard `{text}` is not a UUID: {e}")))?;
                            shards.push(ShardId(id));
                            texts.push(text);
                            u16::try_from(texts.len() - 1)
                                .map_err(|_| corrupt("more than 65536 shards in one batch".into()))?
                        }
                    };
                    last = Some((text, no));
                    no
                }
            };
            shard_of.push(no);
        }
        Ok(Columns {
            epoch,
            seq,
            hlc: opt_col!(batch, HLC, as_primitive_opt),
            kind: opt_col!(batch, KIND, as_primitive_opt),
            id: opt_col!(batch, ID, as_string_opt),
            bot: opt_col!(batch, BOT_ID, as_string_opt),
            session: opt_col!(batch, SESSION_ID, as_string_opt),
            hash: opt_col!(batch, CONTENT_HASH, as_fixed_size_binary_opt),
            role: opt_col!(batch, ROLE, as_string_opt),
            content_type: opt_col!(batch, CONTENT_TYPE, as_string_opt),
            text: opt_col!(batch, BODY_TEXT, as_string_opt),
            bytes: opt_col!(batch, BODY_BYTES, as_binary_opt),
            metadata: opt_col!(batch, METADATA, as_string_opt),
            created: opt_col!(batch, CREATED_AT, as_primitive_opt),
            tombstone: opt_col!(batch, "_tombstone", as_boolean_opt),
            shards,
            shard_of,
            len: batch.num_rows(),
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A MemWAL delete marker (ctxlog never writes one; skipped when present).
    pub(crate) fn is_lance_tombstone(&self, i: usize) -> bool {
        self.tombstone.is_some_and(|t| t.is_valid(i) && t.value(i))
    }

    pub(crate) fn shard(&self, i: usize) -> ShardId {
        self.shards[self.shard_of[i] as usize]
    }

    pub(crate) fn epoch(&self, i: usize) -> u64 {
        self.epoch.value(i)
    }

    pub(crate) fn seq(&self, i: usize) -> u64 {
        self.seq.value(i)
    }

    fn need<T>(c: Option<T>, name: &str) -> Result<T> {
        c.ok_or_else(|| corrupt(format!("stored entries lack the `{name}` column")))
    }

    pub(crate) fn hlc(&self, i: usize) -> Result<Hlc> {
        Ok(Hlc(Self::need(self.hlc, HLC)?.value(i)))
    }

    fn kind(&self, i: usize) -> Result<Kind> {
        let v = Self::need(self.kind, KIND)?.value(i);
        Kind::from_u8(v).ok_or_else(|| corrupt(format!("unknown kind {v}")))
    }

    fn hash(&self, i: usize) -> Result<ContentHash> {
        let h = Self::need(self.hash, CONTENT_HASH)?;
        ContentHash::from_slice(h.value(i)).ok_or_else(|| corrupt("content hash is not 32 bytes".into()))
    }

    /// The columns the projection reads, checked once per batch rather than per row.
    pub(crate) fn index_view(&self) -> Result<IndexView<'_, 'a>> {
        Ok(IndexView {
            cols: self,
            hlc: Self::need(self.hlc, HLC)?,
            kind: Self::need(self.kind, KIND)?,
            id: Self::need(self.id, ID)?,
            bot: Self::need(self.bot, BOT_ID)?,
            session: Self::need(self.session, SESSION_ID)?,
            hash: Self::need(self.hash, CONTENT_HASH)?,
        })
    }

    /// Row `i` as a full check reads it, borrowed from the batch's columns.
    pub(crate) fn stored_row(&self, i: usize) -> Result<StoredRow<'_>> {
        let text = Self::need(self.text, BODY_TEXT)?;
        let bytes = Self::need(self.bytes, BODY_BYTES)?;
        let body = match (text.is_valid(i), bytes.is_valid(i)) {
            (true, false) => StoredBody::Text(text.value(i)),
            (false, true) => StoredBody::Bytes(bytes.value(i)),
            (false, false) => StoredBody::Purged,
            (true, true) => return Err(corrupt(format!("entry seq {} has two bodies", self.seq(i)))),
        };
        let metadata = Self::need(self.metadata, METADATA)?;
        Ok(StoredRow {
            shard: self.shard(i),
            seq: self.seq(i),
            epoch: self.epoch(i),
            hlc: self.hlc(i)?,
            kind: self.kind(i)?,
            id: Self::need(self.id, ID)?.value(i),
            bot_id: Self::need(self.bot, BOT_ID)?.value(i),
            session_id: Self::need(self.session, SESSION_ID)?.value(i),
            role: Self::need(self.role, ROLE)?.value(i),
            content_type: Self::need(self.content_type, CONTENT_TYPE)?.value(i),
            body,
            metadata: metadata.is_valid(i).then(|| metadata.value(i)),
            content_hash: self.hash(i)?,
        })
    }

    /// The full entry of row `i`.
    pub(crate) fn entry(&self, i: usize) -> Result<Entry> {
        let created = Self::need(self.created, CREATED_AT)?;
        let created_at = created
            .is_valid(i)
            .then(|| chrono::DateTime::from_timestamp_nanos(created.value(i)));
        self.stored_row(i)?
            .to_entry(created_at)
            .map_err(|e| corrupt(format!("entry seq {}: metadata is not JSON: {e}", self.seq(i))))
    }
}

/// The projection's columns of one batch.
pub(crate) struct IndexView<'c, 'a> {
    cols: &'c Columns<'a>,
    hlc: &'a arrow_array::PrimitiveArray<UInt64Type>,
    kind: &'a arrow_array::PrimitiveArray<UInt8Type>,
    id: &'a arrow_array::StringArray,
    bot: &'a arrow_array::StringArray,
    session: &'a arrow_array::StringArray,
    hash: &'a arrow_array::FixedSizeBinaryArray,
}

impl<'a> IndexView<'_, 'a> {
    /// The projection's view of row `i`, borrowing the batch's strings.
    pub(crate) fn row(&self, i: usize) -> Result<IndexRow<'a>> {
        let c = self.cols;
        let kind =
            Kind::from_u8(self.kind.value(i)).ok_or_else(|| corrupt(format!("unknown kind at seq {}", c.seq(i))))?;
        Ok(IndexRow {
            key: OrderKey {
                hlc: Hlc(self.hlc.value(i)),
                shard: c.shard(i),
                seq: c.seq(i),
                epoch: c.epoch(i),
            },
            id: self.id.value(i),
            kind,
            hash: ContentHash::from_slice(self.hash.value(i))
                .ok_or_else(|| corrupt("content hash is not 32 bytes".into()))?,
            bot_id: self.bot.value(i),
            session_id: self.session.value(i),
            at: RowRef::default(),
        })
    }
}

/// The row ids of a scanned batch (`_rowid`).
pub(crate) fn row_ids(batch: &RecordBatch) -> Result<&arrow_array::UInt64Array> {
    batch
        .column_by_name("_rowid")
        .and_then(|c| c.as_primitive_opt::<UInt64Type>())
        .ok_or_else(|| corrupt("scan returned no row ids".into()))
}
