//! The CLI's JSON interface: input records on stdin, every shape it prints on stdout.
//! Field names are part of the interface; scripts rely on them. Nothing else in the CLI
//! builds JSON.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use chrono::{DateTime, SecondsFormat, Utc};
use ctxlog::{
    AppendAck, Body, Checkpoint, CompactReport, Conflict, ContextView, Entry, Error, GcReport, Kind, ProjectionStats,
    PurgeReport, Record, RefreshReport, Result, RetainReport, SessionSummary, ShardId, ShardInfo, SnapshotReport,
};
use serde_json::{Map, Value, json};

/// An embedding's line (rule 27): `id`, `bot_id`, `session_id`, `model`, `metric` and
/// `vector` (a JSON array of numbers), as over HTTP; nothing else.
fn parse_embedding(mut obj: Map<String, Value>, body: Body) -> Result<Record> {
    if body != Body::default() {
        return Err(Error::invalid(
            "vector",
            None,
            "an embedding's vector is `vector`, not a body",
        ));
    }
    let model = take_string(&mut obj, "model")?.unwrap_or_default();
    let metric = take_string(&mut obj, "metric")?.unwrap_or_default();
    let metric = ctxlog::Metric::of_name(&metric)
        .ok_or_else(|| Error::invalid("metric", None, "is not one of cosine, dot, l2"))?;
    let vector: Vec<f32> = match obj.remove("vector") {
        Some(v) => serde_json::from_value(v)
            .map_err(|e| Error::invalid("vector", None, format!("not an array of numbers: {e}")))?,
        None => return Err(Error::invalid("vector", None, "an embedding holds a vector")),
    };
    let record = Record::embedding(
        take_string(&mut obj, "id")?.unwrap_or_default(),
        take_string(&mut obj, "bot_id")?.unwrap_or_default(),
        take_string(&mut obj, "session_id")?.unwrap_or_default(),
        model,
        metric,
        &vector,
    );
    if let Some(unknown) = obj.keys().next() {
        return Err(Error::invalid(
            "record",
            None,
            format!("unknown field `{unknown}` of an embedding"),
        ));
    }
    Ok(record)
}

/// Parse one input line into a record. Every problem names its field.
pub(crate) fn parse_record(line: &str) -> Result<Record> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| Error::invalid("record", None, format!("not valid JSON: {e}")))?;
    let Value::Object(mut obj) = value else {
        return Err(Error::invalid("record", None, "each line must be a JSON object"));
    };
    let text = take_string(&mut obj, "text")?;
    let bytes = take_string(&mut obj, "bytes_b64")?;
    let body = match (text, bytes) {
        (Some(_), Some(_)) => {
            return Err(Error::invalid(
                "bytes_b64",
                None,
                "give either `text` or `bytes_b64`, not both",
            ));
        }
        (Some(t), None) => Body::Text(t),
        (None, Some(b)) => Body::Bytes(
            B64.decode(b.as_bytes())
                .map_err(|e| Error::invalid("bytes_b64", None, format!("not base64: {e}")))?,
        ),
        (None, None) => Body::Text(String::new()),
    };
    let kind = match take_string(&mut obj, "kind")?.as_deref() {
        None | Some("put") => Kind::Put,
        Some("tombstone") => Kind::Tombstone,
        Some("summary") => Kind::Summary,
        Some("fork") => Kind::Fork,
        Some("hide") => Kind::Hide,
        Some("embedding") => Kind::Embedding,
        Some(other) => {
            return Err(Error::invalid(
                "kind",
                None,
                format!("`{other}` is not `put`, `tombstone`, `summary`, `fork`, `hide` or `embedding`"),
            ));
        }
    };
    let covers = obj
        .remove("covers")
        .filter(|c| !c.is_null())
        .map(|v| parse_position(v, "covers"))
        .transpose()?;
    let created_at = match take_string(&mut obj, "created_at")? {
        None => None,
        Some(s) => Some(
            DateTime::parse_from_rfc3339(&s)
                .map_err(|e| Error::invalid("created_at", None, format!("not RFC 3339: {e}")))?
                .with_timezone(&Utc),
        ),
    };
    if kind == Kind::Embedding {
        for (field, given) in [("covers", covers.is_some()), ("created_at", created_at.is_some())] {
            if given {
                return Err(Error::invalid(field, None, "an embedding has none"));
            }
        }
        return parse_embedding(obj, body);
    }
    let record = Record {
        id: take_string(&mut obj, "id")?.unwrap_or_default(),
        bot_id: take_string(&mut obj, "bot_id")?.unwrap_or_default(),
        session_id: take_string(&mut obj, "session_id")?.unwrap_or_default(),
        role: take_string(&mut obj, "role")?.unwrap_or_default(),
        content_type: take_string(&mut obj, "content_type")?.unwrap_or_else(|| "text/plain".into()),
        body,
        metadata: obj.remove("metadata").filter(|m| !m.is_null()),
        created_at,
        kind,
        covers,
    };
    if let Some(unknown) = obj.keys().next() {
        let field: &'static str = "record";
        return Err(Error::invalid(field, None, format!("unknown field `{unknown}`")));
    }
    Ok(record)
}

/// A position as `context` prints it: `{"<shard>": <last seq>, …}`.
fn parse_position(v: Value, field: &'static str) -> Result<Checkpoint> {
    let bad = |why: String| Error::invalid(field, None, why);
    let Value::Object(map) = v else {
        return Err(bad(
            "must be an object of shard ids and seqs, as `context` prints `position`".into(),
        ));
    };
    let mut out = Checkpoint::default();
    for (shard, seq) in map {
        let id = ShardId::parse(&shard).ok_or_else(|| bad(format!("`{shard}` is not a shard id")))?;
        let seq = seq
            .as_u64()
            .ok_or_else(|| bad(format!("the seq of shard {shard} is not a number")))?;
        out.0.insert(id, seq);
    }
    Ok(out)
}

/// `--at`: a position as `context` (or a page) printed it, `{"<shard>": <last seq>, …}`.
pub(crate) fn parse_at(text: &str) -> Result<Checkpoint> {
    let v: Value = serde_json::from_str(text.trim())
        .map_err(|e| Error::invalid("at", None, format!("not a position as `context` prints it: {e}")))?;
    parse_position(v, "at")
}

/// The session and position of what `context` printed (and a caller kept).
pub(crate) fn parse_context(text: &str) -> Result<(String, String, Checkpoint)> {
    let bad = |why: &str| Error::invalid("from", None, format!("not what `ctxlog context` printed: {why}"));
    let v: Value = serde_json::from_str(text.trim()).map_err(|e| bad(&e.to_string()))?;
    let field = |name: &str| {
        v[name]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| bad(&format!("no `{name}`")))
    };
    let (bot, session) = (field("bot_id")?, field("session_id")?);
    let position = parse_position(v["position"].clone(), "covers").map_err(|_| bad("no `position`"))?;
    Ok((bot, session, position))
}

/// A position (per shard, the last seq read), as `context` prints it.
pub(crate) fn position_json(cp: &Checkpoint) -> Value {
    Value::Object(
        cp.0.iter()
            .filter(|(_, seq)| **seq > 0)
            .map(|(s, seq)| (s.to_string(), json!(seq)))
            .collect(),
    )
}

/// A context view as `context` prints it, with its session and the position of the view it
/// was read from.
pub(crate) fn context_json(bot: &str, session: &str, view: &ContextView, position: &Checkpoint) -> Value {
    let summary = view
        .summary
        .and_then(|k| view.entries.iter().find(|e| e.key() == k))
        .map(|e| e.record.id.clone());
    json!({
        "bot_id": bot,
        "session_id": session,
        "summary": summary,
        "covered": view.covered,
        "position": position_json(position),
        "records": view.entries.iter().map(entry_json).collect::<Vec<_>>(),
    })
}

fn take_string(obj: &mut Map<String, Value>, field: &'static str) -> Result<Option<String>> {
    match obj.remove(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(Error::invalid(field, None, "must be a string")),
    }
}

/// An entry as printed: the input fields plus `shard`, `seq`, `epoch`, `hlc`.
pub(crate) fn entry_json(e: &Entry) -> Value {
    let r = &e.record;
    let mut obj = Map::new();
    obj.insert("id".into(), json!(r.id));
    obj.insert("bot_id".into(), json!(r.bot_id));
    obj.insert("session_id".into(), json!(r.session_id));
    obj.insert("role".into(), json!(r.role));
    obj.insert("content_type".into(), json!(r.content_type));
    match &r.body {
        Body::Text(t) => obj.insert("text".into(), json!(t)),
        Body::Bytes(b) => obj.insert("bytes_b64".into(), json!(B64.encode(b))),
    };
    if let Some(m) = &r.metadata {
        obj.insert("metadata".into(), m.clone());
    }
    if let Some(t) = r.created_at {
        obj.insert(
            "created_at".into(),
            json!(t.to_rfc3339_opts(SecondsFormat::AutoSi, true)),
        );
    }
    obj.insert(
        "kind".into(),
        json!(match r.kind {
            Kind::Put => "put",
            Kind::Tombstone => "tombstone",
            Kind::Summary => "summary",
            Kind::Fork => "fork",
            Kind::Hide => "hide",
            Kind::Embedding => "embedding",
        }),
    );
    if let Some(c) = &r.covers {
        obj.insert("covers".into(), position_json(c));
    }
    if e.purged {
        obj.insert("purged".into(), json!(true));
    }
    obj.insert("shard".into(), json!(e.shard.to_string()));
    obj.insert("seq".into(), json!(e.seq));
    obj.insert("epoch".into(), json!(e.epoch));
    obj.insert("hlc".into(), json!(e.hlc.0));
    Value::Object(obj)
}

/// One durable batch, as `append` acknowledges it.
pub(crate) fn ack_json(ack: &AppendAck) -> Value {
    json!({
        "shard": ack.shard.to_string(),
        "epoch": ack.epoch,
        "first_seq": ack.first_seq,
        "last_seq": ack.last_seq,
        "ids": ack.ids,
    })
}

/// One session, as `sessions` lists it.
pub(crate) fn session_json(s: &SessionSummary) -> Value {
    json!({
        "bot_id": s.bot_id,
        "session_id": s.session_id,
        "records": s.records,
        "first_hlc": s.first_hlc.map(|h| h.0),
        "last_hlc": s.last_hlc.map(|h| h.0),
    })
}

/// One shard, as `shards` lists it.
pub(crate) fn shard_json(s: &ShardInfo) -> Value {
    json!({
        "shard": s.shard.to_string(),
        "writer": s.writer.as_str(),
        "epoch": s.epoch,
        "last_seq": s.last_seq,
        "entries": s.entries,
    })
}

/// One conflict: its canonical form (the same on every backend).
pub(crate) fn conflict_json(c: &Conflict) -> Value {
    serde_json::to_value(c).unwrap_or_else(|e| json!({"kind": c.kind().as_str(), "unprintable": e.to_string()}))
}

/// The projection's counts, the backend, and how long the first scan took.
pub(crate) fn stats_json(stats: &ProjectionStats, backend: &str, first_scan: std::time::Duration) -> Value {
    let mut v = serde_json::to_value(stats).unwrap_or_else(|_| json!({}));
    v["backend"] = json!(backend);
    v["first_scan_ms"] = json!(first_scan.as_secs_f64() * 1000.0);
    v
}

/// What a compaction pass did.
pub(crate) fn compact_json(r: &CompactReport) -> Value {
    json!({
        "generations_merged": r.generations_merged,
        "entries_merged": r.entries_merged,
        "generations_remaining": r.generations_remaining,
        "note": r.note,
    })
}

/// What a reclaim pass did.
pub(crate) fn gc_json(r: &GcReport) -> Value {
    json!({
        "objects_deleted": r.objects_deleted,
        "bytes_reclaimed": r.bytes_reclaimed,
        "objects_pending": r.objects_pending,
        "note": r.note,
    })
}

/// What a saved snapshot holds, and how the scan before it started.
pub(crate) fn snapshot_json(r: &SnapshotReport, refreshed: &RefreshReport) -> Value {
    json!({
        "entries": r.entries,
        "bytes": r.bytes,
        "taken_millis": r.taken_millis,
        "entries_read": refreshed.entries_read,
        "from_snapshot": refreshed.from_snapshot,
    })
}

/// Where a saved search index went.
pub(crate) fn saved_index_json(s: &ctxlog::search::saved::Saved) -> Value {
    use ctxlog::search::saved::Saved;
    match s {
        Saved::Put { name, bytes } => json!({"saved": name, "bytes": bytes}),
        Saved::Nowhere => json!({"saved": null, "why": "the store keeps no saved search indexes"}),
        Saved::Withdrawn => json!({"saved": null, "why": "a purge ran meanwhile; run it again"}),
    }
}

/// What a purge pass did.
pub(crate) fn purge_json(r: &PurgeReport) -> Value {
    json!({
        "ids_purged": r.ids_purged,
        "entries_purged": r.entries_purged,
        "ids_remaining": r.ids_remaining,
        "erased": r.erased,
        "note": r.note,
    })
}

/// What a retention pass did.
pub(crate) fn retain_json(r: &RetainReport) -> Value {
    let ended: Vec<Value> = r
        .sessions_ended
        .iter()
        .map(|(bot, session)| json!({"bot_id": bot, "session_id": session}))
        .collect();
    json!({
        "sessions_ended": ended,
        "tombstones": r.tombstones,
        "sessions_remaining": r.sessions_remaining,
        "sessions_skipped_active": r.sessions_skipped_active,
    })
}

/// What `ctxlog upgrade` prints.
pub(crate) fn upgrade_json(r: &ctxlog::UpgradeReport) -> Value {
    json!({
        "from": r.from,
        "to": r.to,
        "upgraded": r.upgraded(),
        "entries_read": r.entries_read,
        "shared_ids": r.shared_ids.iter().map(|s| json!({"id": s.id, "bots": s.bots})).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(e: Error) -> &'static str {
        match e {
            Error::InvalidInput { field, .. } => field,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn parses_the_documented_fields() {
        let r = parse_record(
            r#"{"id":"m1","bot_id":"b","session_id":"s","role":"user","text":"hi","metadata":{"k":1},"created_at":"2026-01-02T03:04:05Z","kind":"put"}"#,
        )
        .unwrap();
        assert_eq!(r.id, "m1");
        assert_eq!(r.content_type, "text/plain");
        assert_eq!(r.body, Body::Text("hi".into()));
        let r =
            parse_record(r#"{"id":"m1","bot_id":"b","session_id":"s","bytes_b64":"AAE=","kind":"tombstone"}"#).unwrap();
        assert_eq!(r.body, Body::Bytes(vec![0, 1]));
        assert_eq!(r.kind, Kind::Tombstone);
    }

    #[test]
    fn names_the_bad_field() {
        assert_eq!(field(parse_record(r#"{"id":1}"#).unwrap_err()), "id");
        assert_eq!(
            field(parse_record(r#"{"id":"a","kind":"upsert"}"#).unwrap_err()),
            "kind"
        );
        assert_eq!(
            field(parse_record(r#"{"id":"a","bytes_b64":"%%"}"#).unwrap_err()),
            "bytes_b64"
        );
        assert_eq!(
            field(parse_record(r#"{"id":"a","created_at":"yesterday"}"#).unwrap_err()),
            "created_at"
        );
        assert_eq!(field(parse_record("[1]").unwrap_err()), "record");
        assert_eq!(field(parse_record(r#"{"id":"a","txt":"typo"}"#).unwrap_err()), "record");
    }

    #[test]
    fn output_round_trips_through_input() {
        let mut rec = Record::text("m1", "b", "s", "user", "hi");
        rec.metadata = Some(json!({"k": [1, 2]}));
        rec.created_at = Some(
            DateTime::parse_from_rfc3339("2026-01-02T03:04:05.123Z")
                .unwrap()
                .with_timezone(&Utc),
        );
        let e = Entry {
            shard: ctxlog::WriterId::new("w").unwrap().shard_id(),
            seq: 1,
            epoch: 1,
            hlc: ctxlog::Hlc(7),
            content_hash: rec.content_hash(),
            record: rec.clone(),
            purged: false,
        };
        let mut v = entry_json(&e);
        let obj = v.as_object_mut().unwrap();
        for k in ["shard", "seq", "epoch", "hlc"] {
            obj.remove(k);
        }
        assert_eq!(parse_record(&v.to_string()).unwrap(), rec);
    }
}
