//! What a caller appends: a record, its body, its kind.

use chrono::{DateTime, Utc};

use crate::ids::Checkpoint;

/// What a record asks for: a value (`Put`), its permanent removal (`Tombstone`), a
/// summary of part of its session (`Summary`, rule 21): a value too, which also names the
/// entries it stands for; or a link of its session to another (rule 25): the session
/// continuing another as of a position (`Fork`), or leaving out a record it inherits
/// (`Hide`). Links are values of their own ids (retried, tombstoned and purged like puts)
/// that shape their session's view instead of appearing in it. An `Embedding` is none of
/// these: a vector the caller computed for the record of its id under a named model (rule
/// 27), kept under that id's identity so that the id's tombstone ends it and `purge` erases
/// it with the rest of the record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A value for the id.
    Put,
    /// The permanent removal of the id.
    Tombstone,
    /// A value for the id that summarises the session's records its writer read: the
    /// record's `covers` is the checkpoint of that view (rule 21).
    Summary,
    /// The session continues the session named by the body (same bot) as of the record's
    /// `covers` (rule 25): its view holds that session's view as of there, then its own.
    Fork,
    /// The session leaves out the record whose id is the body (rule 25), wherever in the
    /// sessions it continues that record lies; the record itself is untouched.
    Hide,
    /// A vector of the record of the same id (rule 27): the role names the model, the
    /// content type the metric ([`Metric`]), the body holds little-endian `f32`s. Not a value:
    /// it neither wins its id nor diverges from its put, and it is in no view.
    Embedding,
}

impl Kind {
    /// The stored code (0 put, 1 tombstone, 2 summary, 3 fork, 4 hide, 5 embedding).
    pub fn as_u8(self) -> u8 {
        match self {
            Kind::Put => 0,
            Kind::Tombstone => 1,
            Kind::Summary => 2,
            Kind::Fork => 3,
            Kind::Hide => 4,
            Kind::Embedding => 5,
        }
    }

    /// Whether the record gives its id a value (every kind but a tombstone and an
    /// embedding): what rule 6 calls a put.
    pub fn is_value(self) -> bool {
        !matches!(self, Kind::Tombstone | Kind::Embedding)
    }

    /// Whether the record is a link (rule 25): it shapes its session's view and is not in it.
    pub fn is_link(self) -> bool {
        matches!(self, Kind::Fork | Kind::Hide)
    }

    /// The store format a record of this kind needs (rule 22): 1 for a put or tombstone, 2
    /// for a summary, 4 for a link (rule 25), 5 for an embedding (rule 27). A store moves to
    /// 2 with its first summary, and from 3 on with the first record that needs more; a
    /// link or embedding needs ids scoped by bot (3) first.
    pub fn needs_format(self) -> u32 {
        match self {
            Kind::Put | Kind::Tombstone => 1,
            Kind::Summary => 2,
            Kind::Fork | Kind::Hide => 4,
            Kind::Embedding => 5,
        }
    }

    /// Whether the record names a position in `covers` (a summary or a fork).
    pub fn has_position(self) -> bool {
        matches!(self, Kind::Summary | Kind::Fork)
    }

    /// From the stored code.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            0 => Some(Kind::Put),
            1 => Some(Kind::Tombstone),
            2 => Some(Kind::Summary),
            3 => Some(Kind::Fork),
            4 => Some(Kind::Hide),
            5 => Some(Kind::Embedding),
            _ => None,
        }
    }
}

/// How an embedding's model compares vectors (rule 27): the similarity a vector search
/// ranks by, higher first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    /// The cosine of the angle: `a·b / (|a| |b|)`.
    Cosine,
    /// The dot product `a·b`.
    Dot,
    /// The negated Euclidean distance `−|a − b|`.
    L2,
}

impl Metric {
    /// Every metric.
    pub const ALL: [Metric; 3] = [Metric::Cosine, Metric::Dot, Metric::L2];

    /// The content type of an embedding under this metric.
    pub fn content_type(self) -> &'static str {
        match self {
            Metric::Cosine => "application/vnd.ctxlog.vector; metric=cosine",
            Metric::Dot => "application/vnd.ctxlog.vector; metric=dot",
            Metric::L2 => "application/vnd.ctxlog.vector; metric=l2",
        }
    }

    /// Its name: `cosine`, `dot` or `l2`.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
            Metric::L2 => "l2",
        }
    }

    /// The metric named `name`.
    pub fn of_name(name: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The metric an embedding's content type names (exactly one of
    /// [`Metric::content_type`]).
    pub fn of_content_type(ct: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.content_type() == ct)
    }
}

/// The payload of a record: text or opaque bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Body {
    /// UTF-8 text.
    Text(String),
    /// Opaque bytes.
    Bytes(Vec<u8>),
}

impl Body {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Body::Text(s) => s.len(),
            Body::Bytes(b) => b.len(),
        }
    }

    /// Whether the body is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for Body {
    fn default() -> Self {
        Body::Text(String::new())
    }
}

/// What a caller appends. `id` is the idempotency key.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Caller-chosen; the idempotency key (rule 6).
    pub id: String,
    /// The bot the record belongs to.
    pub bot_id: String,
    /// The session (conversation) within the bot.
    pub session_id: String,
    /// Who speaks: `user`, `assistant`, `tool`, ….
    pub role: String,
    /// The body's media type.
    pub content_type: String,
    /// The payload.
    pub body: Body,
    /// A JSON object, or nothing.
    pub metadata: Option<serde_json::Value>,
    /// Caller's timestamp; stored but not covered by the content hash.
    pub created_at: Option<DateTime<Utc>>,
    /// Put, tombstone, summary, fork, hide or embedding.
    pub kind: Kind,
    /// What a summary covers: per shard, the last seq of the view its writer summarised
    /// (rule 21); for a fork, the position of the view it continues (rule 25). `Some`
    /// exactly for a [`Kind::Summary`] and a [`Kind::Fork`] (empty once purged).
    pub covers: Option<Checkpoint>,
}

impl Record {
    /// A text `Put` with content type `text/plain` and no metadata.
    pub fn text(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        role: impl Into<String>,
        text: impl Into<String>,
    ) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: role.into(),
            content_type: "text/plain".into(),
            body: Body::Text(text.into()),
            metadata: None,
            created_at: None,
            kind: Kind::Put,
            covers: None,
        }
    }

    /// A text summary of session `session_id` covering `covers`: the checkpoint of the view
    /// its writer read (rule 21). Write it through a shard that has observed that view's
    /// clock ([`crate::Shard::observe`] with the projector's `max_hlc`).
    pub fn summary(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        text: impl Into<String>,
        covers: Checkpoint,
    ) -> Self {
        Record {
            kind: Kind::Summary,
            covers: Some(covers),
            ..Record::text(id, bot_id, session_id, "summary", text)
        }
    }

    /// Session `session_id` continues session `from_session` of the same bot as of the
    /// position `at` (rule 25): a record of O(1) size, whatever the length of what it
    /// continues. Write it through a shard that has observed that view's clock, as a summary.
    pub fn fork(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        from_session: impl Into<String>,
        at: Checkpoint,
    ) -> Self {
        Record {
            kind: Kind::Fork,
            covers: Some(at),
            ..Record::text(id, bot_id, session_id, "fork", from_session)
        }
    }

    /// Session `session_id` leaves out the record `hidden_id` it inherits (rule 25).
    pub fn hide(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        hidden_id: impl Into<String>,
    ) -> Self {
        Record {
            kind: Kind::Hide,
            ..Record::text(id, bot_id, session_id, "hide", hidden_id)
        }
    }

    /// What a link names (rule 25): a fork's session, a hide's record id; `None` for every
    /// other kind, or a link whose body is not text (purged).
    pub fn link_target(&self) -> Option<&str> {
        match (&self.kind, &self.body) {
            (Kind::Fork | Kind::Hide, Body::Text(t)) if !t.is_empty() => Some(t),
            _ => None,
        }
    }

    /// A vector of record `id` under `model` (rule 27), compared by `metric`: what an
    /// indexer appends once it embedded the record (or a caller beside the record, in its
    /// batch). A later embedding of the id under the same model replaces it.
    pub fn embedding(
        id: impl Into<String>,
        bot_id: impl Into<String>,
        session_id: impl Into<String>,
        model: impl Into<String>,
        metric: Metric,
        vector: &[f32],
    ) -> Self {
        Record {
            kind: Kind::Embedding,
            content_type: metric.content_type().into(),
            body: Body::Bytes(vector.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ..Record::text(id, bot_id, session_id, model, "")
        }
    }

    /// An embedding's model, metric and vector; `None` for another kind, or an embedding
    /// whose body is not a whole vector (purged: empty) or whose content type names no metric.
    pub fn vector(&self) -> Option<(&str, Metric, Vec<f32>)> {
        let (Kind::Embedding, Body::Bytes(b)) = (self.kind, &self.body) else {
            return None;
        };
        let metric = Metric::of_content_type(&self.content_type)?;
        if b.is_empty() || b.len() % 4 != 0 {
            return None;
        }
        let v = b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("four bytes")))
            .collect();
        Some((&self.role, metric, v))
    }

    /// A tombstone for `id`.
    pub fn tombstone(id: impl Into<String>, bot_id: impl Into<String>, session_id: impl Into<String>) -> Self {
        Record {
            id: id.into(),
            bot_id: bot_id.into(),
            session_id: session_id.into(),
            role: String::new(),
            content_type: String::new(),
            body: Body::Text(String::new()),
            metadata: None,
            created_at: None,
            kind: Kind::Tombstone,
            covers: None,
        }
    }
}

/// The first byte of a summary's stored body: the version of [`Record::stored_body`]'s frame.
const FRAME_V1: u8 = 1;

impl Record {
    /// The body as stored and hashed. A put's or tombstone's is its body; a summary's (and a
    /// fork's, whose `covers` is its position) is one
    /// frame of its coverage and body, so that a backend stores (and the history checker
    /// hashes) a summary in the body column it already has: `1u8`, the shard count (u32),
    /// per shard in shard order its 16 bytes and last seq (u64), then `t` and UTF-8 text or
    /// `b` and bytes. Integers little-endian.
    pub fn stored_body(&self) -> std::borrow::Cow<'_, Body> {
        match (&self.kind, &self.covers) {
            (Kind::Summary | Kind::Fork, Some(covers)) => {
                let (tag, bytes): (u8, &[u8]) = match &self.body {
                    Body::Text(t) => (b't', t.as_bytes()),
                    Body::Bytes(b) => (b'b', b),
                };
                let mut out = Vec::with_capacity(6 + covers.0.len() * 24 + bytes.len());
                out.push(FRAME_V1);
                out.extend_from_slice(&(covers.0.len() as u32).to_le_bytes());
                for (shard, seq) in &covers.0 {
                    out.extend_from_slice(shard.as_bytes());
                    out.extend_from_slice(&seq.to_le_bytes());
                }
                out.push(tag);
                out.extend_from_slice(bytes);
                std::borrow::Cow::Owned(Body::Bytes(out))
            }
            _ => std::borrow::Cow::Borrowed(&self.body),
        }
    }

    /// The body and coverage of a stored body of kind `kind` ([`Record::stored_body`]); why
    /// not, for a summary's frame that does not decode.
    pub fn from_stored_body(kind: Kind, stored: Body) -> Result<(Body, Option<Checkpoint>), String> {
        if !kind.has_position() {
            return Ok((stored, None));
        }
        let Body::Bytes(bytes) = stored else {
            return Err("a summary's stored body is not a frame".into());
        };
        let bad = |what: &str| format!("a summary's stored frame is damaged ({what})");
        let (&version, rest) = bytes.split_first().ok_or_else(|| bad("empty"))?;
        if version != FRAME_V1 {
            return Err(format!("a summary's stored frame has unknown version {version}"));
        }
        let count = rest.get(..4).ok_or_else(|| bad("no shard count"))?;
        let count = u32::from_le_bytes(count.try_into().expect("four bytes")) as usize;
        let mut at = 4;
        let mut covers = Checkpoint::default();
        for _ in 0..count {
            let shard = rest.get(at..at + 16).ok_or_else(|| bad("truncated coverage"))?;
            let seq = rest.get(at + 16..at + 24).ok_or_else(|| bad("truncated coverage"))?;
            let shard = crate::ids::ShardId::from_bytes(shard.try_into().expect("16 bytes"));
            if covers.0.last_key_value().is_some_and(|(last, _)| *last >= shard) {
                return Err(bad("shards out of order"));
            }
            covers
                .0
                .insert(shard, u64::from_le_bytes(seq.try_into().expect("eight bytes")));
            at += 24;
        }
        let (&tag, body) = rest
            .get(at..)
            .and_then(|r| r.split_first())
            .ok_or_else(|| bad("no body"))?;
        let body = match tag {
            b't' => Body::Text(String::from_utf8(body.to_vec()).map_err(|_| bad("text not UTF-8"))?),
            b'b' => Body::Bytes(body.to_vec()),
            _ => return Err(bad("unknown body tag")),
        };
        Ok((body, Some(covers)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored kind codes (0 put, 1 tombstone) read back; any other code is refused.
    #[test]
    fn kinds_read_back_from_their_stored_codes() {
        for k in [
            Kind::Put,
            Kind::Tombstone,
            Kind::Summary,
            Kind::Fork,
            Kind::Hide,
            Kind::Embedding,
        ] {
            assert_eq!(Kind::from_u8(k.as_u8()), Some(k));
        }
        assert_eq!(Kind::from_u8(6), None);
    }

    /// An embedding's vector reads back bit for bit; a purged (empty) or torn body and an
    /// unknown content type read as no vector.
    #[test]
    fn an_embedding_reads_back_its_model_metric_and_vector() {
        let v = [1.5f32, -0.0, f32::MIN_POSITIVE, 3.0e38];
        let mut r = Record::embedding("m1", "bot", "s", "minilm", Metric::Dot, &v);
        let (model, metric, back) = r.vector().expect("a vector");
        assert_eq!((model, metric), ("minilm", Metric::Dot));
        assert_eq!(
            back.iter().map(|f| f.to_bits()).collect::<Vec<_>>(),
            v.map(f32::to_bits).to_vec()
        );
        assert!(!r.kind.is_value() && !r.kind.is_link());
        r.body = Body::Bytes(vec![0; 7]);
        assert_eq!(r.vector(), None);
        r.body = Body::Bytes(Vec::new());
        assert_eq!(r.vector(), None);
        r.body = Body::Bytes(vec![0; 4]);
        r.content_type = "application/vnd.ctxlog.vector".into();
        assert_eq!(r.vector(), None);
        assert_eq!(Record::text("m1", "b", "s", "user", "x").vector(), None);
    }

    /// A summary's frame reads back as the coverage and body it was made of; a damaged
    /// one is refused, never misread.
    #[test]
    fn a_summary_frame_reads_back_and_damage_is_refused() {
        let (a, b) = (
            crate::ids::ShardId::from_bytes([1; 16]),
            crate::ids::ShardId::from_bytes([2; 16]),
        );
        let covers = Checkpoint([(a, 7), (b, 9)].into_iter().collect());
        for body in [Body::Text("sum".into()), Body::Bytes(vec![0, 1, 2])] {
            let mut r = Record::summary("s1", "bot", "s", "", covers.clone());
            r.body = body.clone();
            let stored = r.stored_body().into_owned();
            assert_ne!(stored, body, "a summary is stored as a frame");
            assert_eq!(
                Record::from_stored_body(Kind::Summary, stored.clone()),
                Ok((body, Some(covers.clone())))
            );
            let Body::Bytes(frame) = stored else { unreachable!() };
            for cut in 0..frame.len() - 1 {
                if cut == 0 || cut < 1 + 4 + 48 + 1 {
                    assert!(Record::from_stored_body(Kind::Summary, Body::Bytes(frame[..cut].to_vec())).is_err());
                }
            }
            let mut swapped = frame.clone();
            swapped[5..21].copy_from_slice(&[3; 16]);
            assert!(
                Record::from_stored_body(Kind::Summary, Body::Bytes(swapped)).is_err(),
                "out of order"
            );
        }
        let put = Record::text("p", "bot", "s", "user", "x");
        assert_eq!(*put.stored_body(), put.body, "a put is stored as it is");
    }

    #[test]
    fn a_body_is_empty_when_it_has_no_bytes() {
        assert!(Body::Text(String::new()).is_empty() && Body::Bytes(Vec::new()).is_empty());
        assert!(!Body::Text("a".into()).is_empty() && !Body::Bytes(vec![0]).is_empty());
        assert_eq!(Body::Text("ab".into()).len(), 2);
    }
}
