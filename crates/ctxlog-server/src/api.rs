//! The JSON shapes of the HTTP API. Field names match the CLI's (`text` or `bytes_b64`,
//! `metadata`, `created_at`, `kind`); a record's bot and session come from the route.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, SecondsFormat, Utc};
use ctxlog::{AppendAck, Body, Entry, Kind, Record, SessionSummary};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::problem::Problem;

/// Put (the default), tombstone, summary, fork, hide or embedding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum KindJson {
    /// A record.
    #[default]
    Put,
    /// The end of an id: final (rule 7).
    Tombstone,
    /// A summary of the session's records up to `covers` (rule 21).
    Summary,
    /// The session continues another as of a position (rule 25): its `text` is that
    /// session, its `covers` the position. `POST …/fork` writes one with its checks.
    Fork,
    /// The session leaves out the inherited record whose id is its `text` (rule 25).
    Hide,
    /// A vector of the record of the same id under `model`, compared by `metric` (rule 27);
    /// a later one of the id and model replaces it. In no view; the id's tombstone ends it.
    Embedding,
}

/// A fork: continue session `from` of the route's bot as the route's session, as of a
/// position (rule 25). One record, whatever the length of `from`.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkIn {
    /// The session to continue.
    pub from: String,
    /// The position to continue from: a page's, a context view's or a stream's `position`.
    /// Without it (and without `through`), the replica's fresh view now.
    #[serde(default)]
    pub at: Option<String>,
    /// Continue from just after this record of `from`'s view: every record of the view up
    /// to it in order, none after (e.g. to retry the turn after it).
    #[serde(default)]
    pub through: Option<String>,
    /// The fork record's id: the idempotency key of the fork (a retry with the same id
    /// counts once). Default: a new random id.
    #[serde(default)]
    pub id: Option<String>,
}

/// What a fork wrote.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ForkOut {
    /// The fork record's append.
    pub ack: AckOut,
    /// The position the fork continues from.
    pub at: String,
}

/// One record to append to the route's (bot, session).
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordIn {
    /// Caller-chosen; the idempotency key: a retry with the same id counts once.
    pub id: String,
    /// Who speaks: `user`, `assistant`, `tool`, …. Required for a put, summary or link;
    /// none for an embedding (its `model` is its role as stored) or a tombstone.
    #[serde(default)]
    pub role: String,
    /// The body's media type (default `text/plain`; an embedding's is set by its `metric`).
    #[serde(default)]
    pub content_type: Option<String>,
    /// An embedding's model (rule 27): 1 to 128 printable ASCII characters, no space.
    #[serde(default)]
    pub model: Option<String>,
    /// An embedding's metric: `cosine`, `dot` or `l2` (rule 27).
    #[serde(default)]
    pub metric: Option<String>,
    /// An embedding's vector: 1 to 4096 finite numbers (stored as `f32`).
    #[serde(default)]
    pub vector: Option<Vec<f32>>,
    /// A text body.
    #[serde(default)]
    pub text: Option<String>,
    /// A binary body, base64.
    #[serde(default)]
    pub bytes_b64: Option<String>,
    /// A JSON object.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// The caller's timestamp, RFC 3339 (not part of the content hash).
    #[serde(default)]
    pub created_at: Option<String>,
    /// Put (default), tombstone or summary.
    #[serde(default)]
    pub kind: KindJson,
    /// What a summary covers: the `covers` token of the context view of this session its
    /// writer read (a page's or a stream's `position` is refused). For a fork, the position
    /// it continues from (a page's, a view's or a stream's `position`). Required for a
    /// summary and a fork, refused for anything else.
    #[serde(default)]
    pub covers: Option<String>,
    /// The record's session: required by the bot-wide append (one atomic batch across
    /// sessions of one bot); on a session's route, the route's session if given.
    #[serde(default)]
    pub session_id: Option<String>,
}

/// An append: one atomic batch.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AppendIn {
    /// The records, in order (1 to 10,000).
    pub records: Vec<RecordIn>,
}

impl RecordIn {
    /// The record, in `bot`'s `session`; record `index` of its request for errors.
    pub(crate) fn into_record(self, bot: &str, session: &str, index: usize) -> Result<Record, Problem> {
        if self.session_id.as_deref().is_some_and(|s| s != session) {
            return Err(Problem::invalid(
                "session_id",
                Some(index),
                "differs from the route's session",
            ));
        }
        if self.kind == KindJson::Embedding {
            return self.into_embedding(bot, session, index);
        }
        for (field, given) in [
            ("model", self.model.is_some()),
            ("metric", self.metric.is_some()),
            ("vector", self.vector.is_some()),
        ] {
            if given {
                return Err(Problem::invalid(field, Some(index), "only an embedding has one"));
            }
        }
        let body = match (self.text, self.bytes_b64) {
            (Some(_), Some(_)) => {
                return Err(Problem::invalid(
                    "bytes_b64",
                    Some(index),
                    "give either `text` or `bytes_b64`, not both",
                ));
            }
            (Some(t), None) => Body::Text(t),
            (None, Some(b)) => Body::Bytes(
                B64.decode(b.as_bytes())
                    .map_err(|e| Problem::invalid("bytes_b64", Some(index), format!("not base64: {e}")))?,
            ),
            (None, None) => Body::Text(String::new()),
        };
        let created_at = match self.created_at {
            None => None,
            Some(s) => Some(
                DateTime::parse_from_rfc3339(&s)
                    .map_err(|e| Problem::invalid("created_at", Some(index), format!("not RFC 3339: {e}")))?
                    .with_timezone(&Utc),
            ),
        };
        let covers = match (self.kind, self.covers) {
            (KindJson::Summary, Some(c)) => Some(crate::cursor::parse_covers("covers", &c, bot, session).map_err(
                |mut p| {
                    p.record = Some(index);
                    p
                },
            )?),
            // A fork in a batch of its own choosing (e.g. with the records that name it):
            // its `covers` is the position it continues from (a page's, a view's or a
            // stream's `position`). `POST …/fork` is the checked way (one fork per session,
            // retries answered with the fork that landed).
            (KindJson::Fork, Some(c)) => Some(crate::cursor::parse_position("covers", &c).map_err(|mut p| {
                p.record = Some(index);
                p
            })?),
            (KindJson::Fork, None) => {
                return Err(Problem::invalid(
                    "covers",
                    Some(index),
                    "a fork needs the position it continues from in `covers`",
                ));
            }
            (KindJson::Summary, None) => {
                return Err(Problem::invalid(
                    "covers",
                    Some(index),
                    "a summary needs the `covers` of the context view it summarises",
                ));
            }
            (_, Some(_)) => return Err(Problem::invalid("covers", Some(index), "only a summary covers records")),
            (_, None) => None,
        };
        Ok(Record {
            covers,
            id: self.id,
            bot_id: bot.to_string(),
            session_id: session.to_string(),
            role: self.role,
            content_type: self.content_type.unwrap_or_else(|| "text/plain".into()),
            body,
            metadata: self.metadata.filter(|m| !m.is_null()),
            created_at,
            kind: match self.kind {
                KindJson::Put => Kind::Put,
                KindJson::Tombstone => Kind::Tombstone,
                KindJson::Summary => Kind::Summary,
                KindJson::Fork => Kind::Fork,
                KindJson::Hide => Kind::Hide,
                KindJson::Embedding => unreachable!("an embedding is made above"),
            },
        })
    }

    /// An embedding of record `self.id` (rule 27): `model`, `metric` and `vector`, nothing of
    /// a put's.
    fn into_embedding(self, bot: &str, session: &str, index: usize) -> Result<Record, Problem> {
        let invalid = |field: &str, detail: &str| Err(Problem::invalid(field, Some(index), detail.to_string()));
        for (field, given) in [
            ("role", !self.role.is_empty()),
            ("content_type", self.content_type.is_some()),
            ("text", self.text.is_some()),
            ("bytes_b64", self.bytes_b64.is_some()),
            ("metadata", self.metadata.as_ref().is_some_and(|m| !m.is_null())),
            ("covers", self.covers.is_some()),
            ("created_at", self.created_at.is_some()),
        ] {
            if given {
                return invalid(field, "an embedding has none: give `model`, `metric` and `vector`");
            }
        }
        let Some(model) = self.model else {
            return invalid("model", "an embedding names the model that made it");
        };
        let Some(metric) = self.metric else {
            return invalid("metric", "an embedding names its metric: cosine, dot or l2");
        };
        let Some(metric) = ctxlog::Metric::of_name(&metric) else {
            return invalid("metric", "is not one of cosine, dot, l2");
        };
        let Some(vector) = self.vector else {
            return invalid("vector", "an embedding holds a vector");
        };
        if let Err(why) = ctxlog::search::check_model(&model) {
            return invalid("model", &why);
        }
        let r = Record::embedding(self.id, bot, session, model, metric, &vector);
        // The core checks the vector as the record's body; the caller gave it as `vector`.
        if let Err(ctxlog::Error::InvalidInput {
            field: "body", reason, ..
        }) = ctxlog::Limits::default().validate(&r)
        {
            return invalid("vector", &reason);
        }
        Ok(r)
    }
}

/// What an append wrote: durable when this is returned.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct AckOut {
    /// The replica's shard.
    pub shard: String,
    /// The epoch it was written under.
    pub epoch: u64,
    /// The first entry's seq in the shard.
    pub first_seq: u64,
    /// The last entry's seq.
    pub last_seq: u64,
    /// The ids, in order.
    pub ids: Vec<String>,
}

impl From<&AppendAck> for AckOut {
    fn from(a: &AppendAck) -> Self {
        AckOut {
            shard: a.shard.to_string(),
            epoch: a.epoch,
            first_seq: a.first_seq,
            last_seq: a.last_seq,
            ids: a.ids.clone(),
        }
    }
}

/// A record as stored: the input fields, its bot and session, and where it is in the log.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct EntryOut {
    /// The record id.
    pub id: String,
    /// Its bot.
    pub bot_id: String,
    /// Its session.
    pub session_id: String,
    /// Who spoke.
    pub role: String,
    /// The body's media type.
    pub content_type: String,
    /// A text body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A binary body, base64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes_b64: Option<String>,
    /// A JSON object.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// The caller's timestamp.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at: Option<String>,
    /// Put, tombstone or summary.
    pub kind: KindJson,
    /// What a summary covers, as a position (rule 21).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub covers: Option<String>,
    /// Whether purge erased its body and metadata.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub purged: bool,
    /// The shard that wrote it.
    pub shard: String,
    /// Its seq in that shard.
    pub seq: u64,
    /// The epoch it was written under.
    pub epoch: u64,
    /// Its hybrid logical clock value.
    pub hlc: u64,
}

impl From<&Entry> for EntryOut {
    fn from(e: &Entry) -> Self {
        let r = &e.record;
        let (text, bytes_b64) = match &r.body {
            Body::Text(t) => (Some(t.clone()), None),
            Body::Bytes(b) => (None, Some(B64.encode(b))),
        };
        EntryOut {
            id: r.id.clone(),
            bot_id: r.bot_id.clone(),
            session_id: r.session_id.clone(),
            role: r.role.clone(),
            content_type: r.content_type.clone(),
            text,
            bytes_b64,
            metadata: r.metadata.clone(),
            created_at: r.created_at.map(|t| t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
            kind: match r.kind {
                Kind::Put => KindJson::Put,
                Kind::Tombstone => KindJson::Tombstone,
                Kind::Summary => KindJson::Summary,
                Kind::Fork => KindJson::Fork,
                Kind::Hide => KindJson::Hide,
                Kind::Embedding => KindJson::Embedding,
            },
            covers: r.covers.as_ref().map(crate::cursor::position),
            purged: e.purged,
            shard: e.shard.to_string(),
            seq: e.seq,
            epoch: e.epoch,
            hlc: e.hlc.0,
        }
    }
}

/// A page of a session's live records, in the contract's order.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RecordsPage {
    /// The records.
    pub records: Vec<EntryOut>,
    /// Give as `after` for the next page (absent on the last page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Whether more records follow (with `last`: whether older ones precede).
    pub has_more: bool,
    /// The view's position when this page was read: watch from it to miss nothing after it.
    pub position: String,
}

/// A session's context view (rule 21): its governing summary and every live record that
/// summary does not cover, in the contract's order — what an agent sends its model.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ContextOut {
    /// The governing summary (if any) and the records it does not cover.
    pub records: Vec<EntryOut>,
    /// The governing summary's record id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Live records the summary stands for (left out).
    pub covered: u64,
    /// The view's position when it was read: watch from it.
    pub position: String,
    /// The same position bound to this bot and session: give it as `covers` of a summary of
    /// this view (the only thing `covers` takes).
    pub covers: String,
}

/// A session of a bot with live records.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SessionOut {
    /// The session id.
    pub session_id: String,
    /// Live records.
    pub records: u64,
    /// The HLC of its first live record.
    pub first_hlc: Option<u64>,
    /// The HLC of its last live record.
    pub last_hlc: Option<u64>,
}

impl From<&SessionSummary> for SessionOut {
    fn from(s: &SessionSummary) -> Self {
        SessionOut {
            session_id: s.session_id.clone(),
            records: s.records,
            first_hlc: s.first_hlc.map(|h| h.0),
            last_hlc: s.last_hlc.map(|h| h.0),
        }
    }
}

/// A page of a bot's sessions, by session id.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SessionsPage {
    /// The sessions.
    pub sessions: Vec<SessionOut>,
    /// Give as `after` for the next page (absent on the last page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Whether more sessions follow.
    pub has_more: bool,
}

/// The conflicts of the log (every one, or those involving entries past `after`).
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ConflictsOut {
    /// Each conflict as `ctxlog conflicts` prints it (`kind` and its fields).
    #[schema(value_type = Vec<Object>)]
    pub conflicts: Vec<Value>,
    /// Give as `after` to ask only about what comes later.
    pub position: String,
}

/// A maintenance operation's report, as the CLI prints it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ReportOut {
    /// The operation.
    pub op: String,
    /// Its report.
    #[schema(value_type = Object)]
    pub report: Value,
}

/// Options of an admin operation (each takes the fields it knows; all optional).
#[derive(Clone, Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdminIn {
    /// `gc`: never delete anything younger than this many seconds (default 600).
    #[serde(default)]
    pub grace_seconds: Option<u64>,
    /// `gc`: most objects deleted in one pass.
    #[serde(default)]
    pub max_objects: Option<u64>,
    /// `purge`: most tombstoned ids purged in one pass.
    #[serde(default)]
    pub max_ids: Option<u64>,
    /// `retain`: end sessions idle for longer than this many seconds (required).
    #[serde(default)]
    pub older_than_seconds: Option<u64>,
    /// `retain`: only this bot's sessions.
    #[serde(default)]
    pub bot: Option<String>,
    /// `retain`: most sessions ended in one pass.
    #[serde(default)]
    pub max_sessions: Option<usize>,
    /// `upgrade`: move to ids scoped by bot also when an id is under several bots (whose
    /// views then change).
    #[serde(default)]
    pub accept_changed_views: Option<bool>,
}

/// Whether the replica takes writes and serves reads.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct ReadyOut {
    /// Ready for both.
    pub ready: bool,
    /// The writer identity.
    pub writer: String,
    /// The writer identity's shard was claimed past this replica's epoch: it never takes a
    /// write again (it still serves reads). A successor holds the id, or a claim of this
    /// replica's own whose answer was lost moved the shard on (it cannot tell the two
    /// apart); only a new process claims afresh — start one where no successor runs.
    pub fenced: bool,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Parse a JSON body, every failure a problem that says where.
pub(crate) fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    serde_json::from_slice(body).map_err(|e| {
        let at = format!("line {} column {}", e.line(), e.column());
        match e.classify() {
            serde_json::error::Category::Data => Problem::malformed(format!("{e} ({at})")),
            _ => Problem::malformed(format!("not valid JSON: {e}")),
        }
    })
}

/// A search of a bot's live records: words (rule 26), a vector (rule 27), or both.
#[derive(Clone, Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SearchIn {
    /// Words, `"phrases"` and `prefix*`es (rule 26: a word of several terms is a phrase); a
    /// record holding any of them is a hit. At most 1024 bytes, 32 clauses, 4 prefixes.
    /// With `vector` too, a hybrid search (rule 27).
    #[serde(default)]
    pub query: Option<String>,
    /// A vector search (rule 27): the records nearest this vector among those embedded by
    /// `model`, by the metric the model declares — approximate (the nearest cells of the
    /// model's vectors are probed; at most 512 hits over all pages), the same on every
    /// replica. Of the model's dimension.
    #[serde(default)]
    pub vector: Option<Vec<f32>>,
    /// The model `vector` was made by (required with it).
    #[serde(default)]
    pub model: Option<String>,
    /// At most this many hits (1 to 100, default 10).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub k: Option<usize>,
    /// The `next` of the previous page.
    #[serde(default)]
    pub after: Option<String>,
    /// Only this session's records.
    #[serde(default)]
    pub session: Option<String>,
    /// Only records of these roles (at most 16).
    #[serde(default)]
    #[schema(max_items = 16)]
    pub roles: Vec<String>,
    /// Only records appended at or after this time (RFC 3339; the log's clock, rule 8).
    #[serde(default)]
    pub since: Option<String>,
    /// Only records appended before this time (RFC 3339; the log's clock, rule 8).
    #[serde(default)]
    pub until: Option<String>,
    /// Only records whose metadata has each of these keys (at most 16) with exactly this
    /// value (JSON equality: `1` and `1.0` differ).
    #[serde(default)]
    #[schema(value_type = Object)]
    pub metadata: std::collections::BTreeMap<String, Value>,
}

/// One search result.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct HitOut {
    /// The record.
    pub record: EntryOut,
    /// Its score, higher first (equal scores in the contract's order): BM25 for a text
    /// search, the model's similarity for a vector search (cosine, dot, or the negated L2
    /// distance), the reciprocal rank fusion of both for a hybrid one.
    pub score: f64,
    /// The query's terms it holds.
    pub matched: Vec<String>,
    /// A short part of its text around the first matched word (empty for a record of bytes,
    /// found by its vectors).
    pub snippet: String,
}

/// A page of search results, best first.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct SearchOut {
    /// The hits.
    pub hits: Vec<HitOut>,
    /// Give as `after` for the next page (absent on the last page).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// The position of the entries searched: every record acknowledged before the request.
    pub position: String,
}
