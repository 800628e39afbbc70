//! The HTTP routes, and the OpenAPI document built from their types.
//!
//! Every route that touches a bot's records is under `/v1/bots/{bot}/…` and needs a token
//! that grants that bot (read or write); store-wide routes (conflicts, stats, shards, the
//! store's watch, maintenance, metrics) need `admin`. A token that does not grant a bot is
//! refused before anything is read, so it learns nothing of that bot's sessions.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ctxlog::{CompactOptions, GcOptions, PurgeOptions, Record, RetainOptions};
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa::{IntoParams, OpenApi};

use crate::Replica;
use crate::api::{
    AckOut, AdminIn, AppendIn, ConflictsOut, ContextOut, EntryOut, KindJson, ReadyOut, RecordIn, RecordsPage,
    ReportOut, SessionOut, SessionsPage, parse,
};
use crate::auth::{Grant, Right};
use crate::cursor;
use crate::metrics::{RouteLabels, RouteOnly};
use crate::problem::{Problem, WrittenAnswer, types};
use crate::watch::{self, Scope};

type Shared = State<Arc<Replica>>;

/// The most records a page returns, and the default.
const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 100;

/// The router of every route, with its limits and metrics.
pub(crate) fn router(replica: Arc<Replica>) -> Router {
    // Requests beyond the limit wait for one in flight to finish.
    let limits = tower::limit::GlobalConcurrencyLimitLayer::new(replica.options.max_concurrent_requests);
    let requests = Router::new()
        .route(
            "/v1/bots/{bot}/sessions/{session}/records",
            post(append).get(read_session),
        )
        .route("/v1/bots/{bot}/sessions/{session}/context", get(read_context))
        .route("/v1/bots/{bot}/records", post(append_bot))
        .route("/v1/bots/{bot}/records/{id}", get(get_record).delete(delete_record))
        .route("/v1/bots/{bot}/sessions", get(list_sessions))
        .route("/v1/conflicts", get(conflicts))
        .route("/v1/stats", get(stats))
        .route("/v1/shards", get(shards))
        .route("/v1/admin/{op}", post(admin))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi))
        .layer(limits);
    // Watch streams are long-lived: they have their own limit (per token), not the
    // request concurrency limit.
    let streams = Router::new()
        .route("/v1/bots/{bot}/sessions/{session}/watch", get(watch_session))
        .route("/v1/watch", get(watch_store));
    requests
        .merge(streams)
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(axum::extract::DefaultBodyLimit::max(replica.options.max_body_bytes))
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            replica.options.header_read_timeout * 3,
        ))
        .layer(axum::middleware::from_fn_with_state(replica.clone(), measure))
        .with_state(replica)
}

/// Count every request by route and status, and time it.
async fn measure(State(r): Shared, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |m| m.as_str().to_string());
    let started = Instant::now();
    let response = next.run(request).await;
    r.metrics
        .requests
        .get_or_create(&RouteLabels {
            route: route.clone(),
            status: response.status().as_u16().to_string(),
        })
        .inc();
    r.metrics
        .latency
        .get_or_create(&RouteOnly { route })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// The grant of the request's token.
fn grant(r: &Replica, headers: &HeaderMap) -> Result<Grant, Problem> {
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    r.tokens.grant(auth).ok_or_else(Problem::unauthorized)
}

/// The grant, if it covers `bot` with `right`.
fn grant_for(r: &Replica, headers: &HeaderMap, bot: &str, right: Right) -> Result<Grant, Problem> {
    let g = grant(r, headers)?;
    if g.allows(bot, right) {
        Ok(g)
    } else {
        Err(Problem::forbidden(right.as_str()))
    }
}

/// The grant, if it has `admin`.
fn admin_grant(r: &Replica, headers: &HeaderMap) -> Result<Grant, Problem> {
    let g = grant(r, headers)?;
    if g.has(Right::Admin) && g.all_bots() {
        Ok(g)
    } else {
        Err(Problem::forbidden("admin"))
    }
}

fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, Problem> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                types::TOO_LARGE,
                "Request too large",
                e.body_text(),
            )
        } else {
            Problem::malformed(e.body_text())
        }
    })
}

/// Run `f` on a task of its own: a client that disconnects never cuts it short.
async fn detached<T: Send + 'static>(
    f: impl std::future::Future<Output = Result<T, Problem>> + Send + 'static,
) -> Result<T, Problem> {
    tokio::spawn(f)
        .await
        .map_err(|_| Problem::replica_unavailable("the operation's task failed", ctxlog::Written::Unknown))?
}

/// Where a page starts and how long it is.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    /// The `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (1 to 1000, default 100).
    pub limit: Option<usize>,
    /// Instead: the last this many records (1 to 1000), reading only them.
    pub last: Option<usize>,
}

fn page_limit(limit: Option<usize>) -> Result<usize, Problem> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        n => Err(Problem::invalid(
            "limit",
            None,
            format!("{n} is not between 1 and {MAX_PAGE}"),
        )),
    }
}

/// Append a batch of records to a session: one atomic batch, durable when acknowledged.
#[utoipa::path(post, path = "/v1/bots/{bot}/sessions/{session}/records",
    params(("bot" = String, Path), ("session" = String, Path)),
    request_body = AppendIn,
    responses((status = 200, body = AckOut), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem), (status = 409, body = Problem), (status = 413, body = Problem),
              (status = 503, body = Problem), (status = 504, body = Problem)))]
async fn append(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let input: AppendIn = parse(&body(raw)?)?;
    let records = input
        .records
        .into_iter()
        .enumerate()
        .map(|(i, rec)| rec.into_record(&bot, &session, i))
        .collect::<Result<Vec<Record>, Problem>>()?;
    write(r, records).await
}

/// One batch through the replica's writer, counted in the metrics. A batch with summaries
/// waits for a view that holds every position they cover (rule 1: any position a replica
/// gave out is acknowledged, so a fresh view holds it) and is ordered after that view's
/// clock, so that every record a summary covers is older than it (rule 21).
async fn write(r: Arc<Replica>, records: Vec<Record>) -> Result<axum::Json<AckOut>, Problem> {
    r.metrics.append_records.observe(records.len() as f64);
    let mut after = ctxlog::Hlc::ZERO;
    if records.iter().any(|rec| rec.covers.is_some()) {
        let p = r.view.fresh().await?;
        ctxlog::check_covers_held(&records, &p.checkpoint())?;
        after = p.max_hlc();
    }
    let ack = detached(async move { r.writer.append(records, after).await }).await?;
    Ok(axum::Json(AckOut::from(&ack)))
}

/// Append one atomic batch whose records may belong to several sessions of one bot (each
/// names its `session_id`): all are written or none.
#[utoipa::path(post, path = "/v1/bots/{bot}/records",
    params(("bot" = String, Path)),
    request_body = AppendIn,
    responses((status = 200, body = AckOut), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem), (status = 409, body = Problem), (status = 413, body = Problem),
              (status = 503, body = Problem), (status = 504, body = Problem)))]
async fn append_bot(
    State(r): Shared,
    Path(bot): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let input: AppendIn = parse(&body(raw)?)?;
    let records = input
        .records
        .into_iter()
        .enumerate()
        .map(|(i, rec)| {
            let session = rec.session_id.clone().ok_or_else(|| {
                Problem::invalid("session_id", Some(i), "a bot-wide append names each record's session")
            })?;
            rec.into_record(&bot, &session, i)
        })
        .collect::<Result<Vec<Record>, Problem>>()?;
    write(r, records).await
}

/// A page of a session's live records, in the contract's order.
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions/{session}/records",
    params(("bot" = String, Path), ("session" = String, Path), PageQuery),
    responses((status = 200, body = RecordsPage), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn read_session(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<RecordsPage>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    let limit = page_limit(q.limit)?;
    let after = q.after.as_deref().map(|c| cursor::parse_page("after", c)).transpose()?;
    let last = q.last.map(|n| page_limit(Some(n))).transpose()?;
    if last.is_some() && (after.is_some() || q.limit.is_some()) {
        return Err(Problem::invalid(
            "last",
            None,
            "give `last` alone, or `after` and `limit`",
        ));
    }
    let mut p = r.view.fresh().await?;
    let position = cursor::position(&p.checkpoint());
    if let Some(n) = last {
        let (entries, older) = p.session_tail(&bot, &session, n).await.map_err(Problem::from)?;
        return Ok(axum::Json(RecordsPage {
            records: entries.iter().map(EntryOut::from).collect(),
            next: None,
            has_more: older,
            position,
        }));
    }
    let (entries, more) = p
        .session_page(&bot, &session, after.as_ref(), limit)
        .await
        .map_err(Problem::from)?;
    drop(p);
    let next = if more {
        entries.last().map(|e| cursor::page(&e.key()))
    } else {
        None
    };
    Ok(axum::Json(RecordsPage {
        records: entries.iter().map(EntryOut::from).collect(),
        next,
        has_more: more,
        position,
    }))
}

/// A session's context view (rule 21): its governing summary and every live record that
/// summary does not cover, in the contract's order, with the view's position (to watch
/// from) and its `covers` token (for a summary written from this view: bound to this
/// session, it is the only thing `covers` takes).
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions/{session}/context",
    params(("bot" = String, Path), ("session" = String, Path)),
    responses((status = 200, body = ContextOut), (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn read_context(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<ContextOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    let mut p = r.view.fresh().await?;
    let checkpoint = p.checkpoint();
    let view = p.context(&bot, &session).await.map_err(Problem::from)?;
    drop(p);
    let summary = view
        .summary
        .and_then(|k| view.entries.iter().find(|e| e.key() == k))
        .map(|e| e.record.id.clone());
    Ok(axum::Json(ContextOut {
        records: view.entries.iter().map(EntryOut::from).collect(),
        summary,
        covered: view.covered,
        position: cursor::position(&checkpoint),
        covers: cursor::covers(&bot, &session, &checkpoint),
    }))
}

/// The live record `id` of `bot`, from a fresh view. Ids are scoped by bot: another bot's
/// record of the same id is another record, and says nothing about this one.
async fn live_record(r: &Replica, bot: &str, id: &str) -> Result<ctxlog::Entry, Problem> {
    r.view
        .fresh()
        .await?
        .get(bot, id)
        .await
        .map_err(Problem::from)?
        .ok_or_else(|| Problem::not_found(format!("no live record `{id}` of bot `{bot}`")))
}

/// One live record of a bot, by id.
#[utoipa::path(get, path = "/v1/bots/{bot}/records/{id}",
    params(("bot" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = EntryOut), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem)))]
async fn get_record(
    State(r): Shared,
    Path((bot, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<EntryOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    let entry = live_record(&r, &bot, &id).await?;
    Ok(axum::Json(EntryOut::from(&entry)))
}

/// Tombstone one live record of a bot (final: its id stays ended).
#[utoipa::path(delete, path = "/v1/bots/{bot}/records/{id}",
    params(("bot" = String, Path), ("id" = String, Path)),
    responses((status = 200, body = AckOut), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 404, body = Problem), (status = 409, body = Problem)))]
async fn delete_record(
    State(r): Shared,
    Path((bot, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let entry = live_record(&r, &bot, &id).await?;
    let tombstone = RecordIn {
        id: id.clone(),
        role: entry.record.role.clone(),
        content_type: None,
        text: None,
        bytes_b64: None,
        metadata: None,
        created_at: None,
        kind: KindJson::Tombstone,
        covers: None,
        session_id: None,
    }
    .into_record(&bot, &entry.record.session_id, 0)?;
    let writer = r.clone();
    let ack = detached(async move { writer.writer.append(vec![tombstone], ctxlog::Hlc::ZERO).await }).await?;
    Ok(axum::Json(AckOut::from(&ack)))
}

/// A page of a bot's sessions with live records, by session id.
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions",
    params(("bot" = String, Path), PageQuery),
    responses((status = 200, body = SessionsPage), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn list_sessions(
    State(r): Shared,
    Path(bot): Path<String>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<SessionsPage>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    let limit = page_limit(q.limit)?;
    let after = q.after.as_deref().map(|c| cursor::parse_name("after", c)).transpose()?;
    let mut all = r.view.fresh().await?.sessions(&bot).await.map_err(Problem::from)?;
    all.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    let mut page: Vec<SessionOut> = all
        .iter()
        .filter(|s| after.as_ref().is_none_or(|a| s.session_id > *a))
        .take(limit + 1)
        .map(SessionOut::from)
        .collect();
    let has_more = page.len() > limit;
    page.truncate(limit);
    Ok(axum::Json(SessionsPage {
        next: if has_more {
            page.last().map(|s| cursor::name(&s.session_id))
        } else {
            None
        },
        sessions: page,
        has_more,
    }))
}

/// Where a watch or conflicts call starts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PositionQuery {
    /// A position (an event id, or a page's `position`); a watch without one starts now.
    pub after: Option<String>,
}

/// Where a watch starts, and the field that said so.
fn watch_from(q: &PositionQuery, headers: &HeaderMap) -> Result<Option<(&'static str, ctxlog::Checkpoint)>, Problem> {
    // A reconnecting EventSource says where it was in `Last-Event-ID`.
    let last = match headers.get("last-event-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .map_err(|_| Problem::invalid("Last-Event-ID", None, "not a position this server gave out"))?,
        ),
    };
    let given = match (last, q.after.as_deref()) {
        (Some(c), _) => Some(("Last-Event-ID", c)),
        (None, Some(c)) => Some(("after", c)),
        (None, None) => None,
    };
    given
        .map(|(field, c)| cursor::parse_position(field, c).map(|cp| (field, cp)))
        .transpose()
}

/// A session's new records as server-sent events (`record`, `tombstone`); each event's id
/// is a position to resume from.
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions/{session}/watch",
    params(("bot" = String, Path), ("session" = String, Path), PositionQuery,
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, content_type = "text/event-stream", body = EntryOut,
               description = "First `position` (where the stream starts), then `record` and `tombstone` (data an entry), each with a position as id; `end` (data `{reason, resume}`) when the stream must stop"),
              (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 429, body = Problem)))]
async fn watch_session(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    Query(q): Query<PositionQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let g = grant_for(&r, &headers, &bot, Right::Read)?;
    let from = watch_from(&q, &headers)?;
    let permit = r.watchers.admit(&g.name, r.options.max_watchers_per_token)?;
    Ok(watch::stream(r.clone(), Scope::Session { bot, session }, from, permit)
        .await?
        .into_response())
}

/// Every new record of the store as server-sent events (admin).
#[utoipa::path(get, path = "/v1/watch",
    params(PositionQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, content_type = "text/event-stream", body = EntryOut,
               description = "First `position` (where the stream starts), then `record` and `tombstone` (data an entry), each with a position as id; `end` (data `{reason, resume}`) when the stream must stop"),
              (status = 400, body = Problem), (status = 401, body = Problem), (status = 403, body = Problem),
              (status = 429, body = Problem)))]
async fn watch_store(
    State(r): Shared,
    Query(q): Query<PositionQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let g = admin_grant(&r, &headers)?;
    let from = watch_from(&q, &headers)?;
    let permit = r.watchers.admit(&g.name, r.options.max_watchers_per_token)?;
    Ok(watch::stream(r.clone(), Scope::Store, from, permit)
        .await?
        .into_response())
}

/// The conflicts of the log (admin); with `after`, only those involving entries past it.
#[utoipa::path(get, path = "/v1/conflicts", params(PositionQuery),
    responses((status = 200, body = ConflictsOut), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn conflicts(
    State(r): Shared,
    Query(q): Query<PositionQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<ConflictsOut>, Problem> {
    admin_grant(&r, &headers)?;
    let after = q
        .after
        .as_deref()
        .map(|c| cursor::parse_position("after", c))
        .transpose()?;
    // The view's position first: the conflicts found cover at least everything up to it.
    let position = cursor::position(&r.view.fresh().await?.checkpoint());
    let store = r.store.clone();
    let found = detached(async move {
        store
            .conflict_discovery()
            .conflicts(after.as_ref())
            .await
            .map_err(Problem::from)
    })
    .await?;
    Ok(axum::Json(ConflictsOut {
        conflicts: found
            .iter()
            .map(|c| serde_json::to_value(c).unwrap_or(Value::Null))
            .collect(),
        position,
    }))
}

/// Counts of what the view holds (admin).
#[utoipa::path(get, path = "/v1/stats",
    responses((status = 200, body = Object), (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn stats(State(r): Shared, headers: HeaderMap) -> Result<axum::Json<Value>, Problem> {
    admin_grant(&r, &headers)?;
    let p = r.view.fresh().await?;
    let mut v = serde_json::to_value(p.stats()).unwrap_or_else(|_| json!({}));
    v["backend"] = json!(r.store.backend());
    v["writer"] = json!(r.writer.writer().as_str());
    v["position"] = json!(cursor::position(&p.checkpoint()));
    Ok(axum::Json(v))
}

/// Every shard of the store (admin).
#[utoipa::path(get, path = "/v1/shards",
    responses((status = 200, body = Vec<Object>), (status = 401, body = Problem), (status = 403, body = Problem)))]
async fn shards(State(r): Shared, headers: HeaderMap) -> Result<axum::Json<Vec<Value>>, Problem> {
    admin_grant(&r, &headers)?;
    let shards = r.store.shards().await.map_err(Problem::from)?;
    Ok(axum::Json(
        shards
            .iter()
            .map(|s| {
                json!({"shard": s.shard.to_string(), "writer": s.writer.as_str(), "epoch": s.epoch,
                       "last_seq": s.last_seq, "entries": s.entries})
            })
            .collect(),
    ))
}

/// A maintenance operation (admin): `compact`, `gc`, `purge`, `retain`, `snapshot`, `upgrade`
/// (to ids scoped by bot; `accept_changed_views` when an id is under several bots). It runs
/// to its end whether or not the client waits.
#[utoipa::path(post, path = "/v1/admin/{op}",
    params(("op" = String, Path, description = "compact, gc, purge, retain, snapshot or upgrade")),
    request_body(content = Option<AdminIn>),
    responses((status = 200, body = ReportOut), (status = 400, body = Problem), (status = 401, body = Problem),
              (status = 403, body = Problem), (status = 404, body = Problem)))]
async fn admin(
    State(r): Shared,
    Path(op): Path<String>,
    headers: HeaderMap,
    raw: Result<Bytes, BytesRejection>,
) -> Result<axum::Json<ReportOut>, Problem> {
    admin_grant(&r, &headers)?;
    let raw = body(raw)?;
    let o: AdminIn = if raw.iter().all(u8::is_ascii_whitespace) {
        AdminIn::default()
    } else {
        parse(&raw)?
    };
    let replica = r.clone();
    let report = match op.as_str() {
        "compact" => {
            detached(async move {
                let c = replica.store.compact(&CompactOptions::default()).await?;
                Ok(
                    json!({"generations_merged": c.generations_merged, "entries_merged": c.entries_merged,
                          "generations_remaining": c.generations_remaining, "note": c.note}),
                )
            })
            .await?
        }
        "gc" => {
            let mut g = GcOptions::default();
            if let Some(s) = o.grace_seconds {
                g.grace = Duration::from_secs(s);
            }
            if let Some(m) = o.max_objects {
                g.max_objects = m;
            }
            detached(async move {
                let c = replica.store.gc(&g).await?;
                Ok(
                    json!({"objects_deleted": c.objects_deleted, "bytes_reclaimed": c.bytes_reclaimed,
                          "objects_pending": c.objects_pending, "note": c.note}),
                )
            })
            .await?
        }
        "purge" => {
            let mut p = PurgeOptions::default();
            if let Some(m) = o.max_ids {
                p.max_ids = m;
            }
            detached(async move {
                let c = replica.store.purge(&p).await?;
                Ok(json!({"ids_purged": c.ids_purged, "entries_purged": c.entries_purged,
                          "ids_remaining": c.ids_remaining, "erased": c.erased, "note": c.note}))
            })
            .await?
        }
        "retain" => {
            let older = o
                .older_than_seconds
                .ok_or_else(|| Problem::invalid("older_than_seconds", None, "retain needs it"))?;
            let mut ro = RetainOptions::older_than(Duration::from_secs(older));
            ro.bot_id = o.bot;
            if let Some(m) = o.max_sessions {
                ro.max_sessions = m;
            }
            detached(async move {
                let c = ctxlog::retain(replica.store.as_ref(), &ro).await?;
                Ok(json!({"sessions_ended": c.sessions_ended.iter().map(|(b, s)| json!({"bot_id": b, "session_id": s})).collect::<Vec<_>>(),
                          "tombstones": c.tombstones, "sessions_remaining": c.sessions_remaining,
                          "sessions_skipped_active": c.sessions_skipped_active}))
            })
            .await?
        }
        "upgrade" => {
            let accept = o.accept_changed_views.unwrap_or(false);
            detached(async move {
                let c = ctxlog::upgrade_ids_by_bot(replica.store.as_ref(), accept).await?;
                Ok(json!({"from": c.from, "to": c.to, "upgraded": c.upgraded(), "entries_read": c.entries_read,
                          "shared_ids": c.shared_ids.iter().map(|s| json!({"id": s.id, "bots": s.bots})).collect::<Vec<_>>()}))
            })
            .await?
        }
        "snapshot" => {
            detached(async move {
                let mut p = replica.view.fresh().await?;
                let c = p.save_snapshot().await?;
                Ok(json!({"entries": c.entries, "bytes": c.bytes, "taken_millis": c.taken_millis}))
            })
            .await?
        }
        other => return Err(Problem::not_found(format!("no admin operation `{other}`"))),
    };
    Ok(axum::Json(ReportOut { op, report }))
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", responses((status = 200, body = Object)))]
async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({"ok": true}))
}

/// The replica takes writes and serves reads: its shard is its own (not fenced) and usable
/// (not waiting to be reopened), its writer runs, its view has been read.
#[utoipa::path(get, path = "/readyz", responses((status = 200, body = ReadyOut), (status = 503, body = ReadyOut)))]
async fn readyz(State(r): Shared) -> Response {
    let writer = r.writer.writer().as_str().to_string();
    let reason = if let Some(why) = r.writer.unready() {
        Some(why)
    } else if *r.shutdown.borrow() {
        Some("shutting down".to_string())
    } else {
        None
    };
    let status = if reason.is_some() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    let ready = reason.is_none();
    (status, axum::Json(ReadyOut { ready, writer, reason })).into_response()
}

/// Prometheus text (admin when tokens are required).
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, content_type = "text/plain", body = String), (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn metrics(State(r): Shared, headers: HeaderMap) -> Result<Response, Problem> {
    admin_grant(&r, &headers)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        r.metrics.render(),
    )
        .into_response())
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", responses((status = 200, body = Object)))]
async fn openapi() -> axum::Json<utoipa::openapi::OpenApi> {
    axum::Json(ApiDoc::openapi())
}

/// The OpenAPI document of every route.
#[derive(OpenApi)]
#[openapi(
    info(title = "ctxlog", description = "The context log over HTTP: one writer per replica."),
    paths(
        append,
        append_bot,
        read_session,
        read_context,
        get_record,
        delete_record,
        list_sessions,
        watch_session,
        watch_store,
        conflicts,
        stats,
        shards,
        admin,
        healthz,
        readyz,
        metrics,
        openapi
    ),
    components(schemas(
        AppendIn,
        RecordIn,
        KindJson,
        AckOut,
        EntryOut,
        RecordsPage,
        ContextOut,
        SessionOut,
        SessionsPage,
        ConflictsOut,
        AdminIn,
        ReportOut,
        ReadyOut,
        Problem,
        WrittenAnswer
    ))
)]
pub struct ApiDoc;

/// Every route the router serves, as `(method, path)`: the OpenAPI document lists each.
pub const ROUTES: &[(&str, &str)] = &[
    ("post", "/v1/bots/{bot}/sessions/{session}/records"),
    ("get", "/v1/bots/{bot}/sessions/{session}/records"),
    ("get", "/v1/bots/{bot}/sessions/{session}/context"),
    ("post", "/v1/bots/{bot}/records"),
    ("get", "/v1/bots/{bot}/records/{id}"),
    ("delete", "/v1/bots/{bot}/records/{id}"),
    ("get", "/v1/bots/{bot}/sessions"),
    ("get", "/v1/bots/{bot}/sessions/{session}/watch"),
    ("get", "/v1/watch"),
    ("get", "/v1/conflicts"),
    ("get", "/v1/stats"),
    ("get", "/v1/shards"),
    ("post", "/v1/admin/{op}"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The document lists every route the router serves, with its method.
    #[test]
    fn the_openapi_document_lists_every_route() {
        let doc = serde_json::to_value(ApiDoc::openapi()).unwrap();
        for (method, path) in ROUTES {
            assert!(
                doc["paths"][path][method].is_object(),
                "{method} {path} is not in the OpenAPI document"
            );
        }
        let listed: usize = doc["paths"]
            .as_object()
            .unwrap()
            .values()
            .map(|p| p.as_object().unwrap().len())
            .sum();
        assert_eq!(
            listed,
            ROUTES.len(),
            "the document lists a route the router does not serve"
        );
    }
}
