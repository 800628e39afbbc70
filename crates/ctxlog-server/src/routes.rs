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
use axum::extract::{FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use ctxlog::{CompactOptions, GcOptions, PurgeOptions, Record, RetainOptions};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use utoipa::{IntoParams, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::Replica;
use crate::api::{
    AckOut, AdminIn, AppendIn, ConflictsOut, ContextOut, EntryOut, ForkIn, ForkOut, KindJson, ReadyOut, RecordIn,
    RecordsPage, ReportOut, SearchIn, SearchOut, SessionOut, SessionsPage, parse,
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

/// The router of every route, with its limits and metrics; `mcp` is the MCP endpoint's
/// router (`/mcp`), put behind the same limits.
pub(crate) fn router(replica: Arc<Replica>, mcp: Router<Arc<Replica>>) -> Router {
    // Requests beyond the limit wait for one in flight to finish (MCP calls count too).
    let in_flight = Arc::new(tokio::sync::Semaphore::new(replica.options.max_concurrent_requests));
    let limits = tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(in_flight.clone());
    let (requests, _) = request_routes()
        .layer(limits)
        .layer(axum::middleware::from_fn_with_state(replica.clone(), during_shutdown))
        .split_for_parts();
    // Watch streams are long-lived: they have their own limit (per token), not the
    // request concurrency limit.
    let (streams, _) = stream_routes().split_for_parts();
    // Bodies are read by `body` (after the grant is checked, within the body budget and
    // deadline), never by an extractor.
    // MCP (streamable HTTP): one route, its calls judged by their own token each (see
    // `mcp`); a request without a valid token is refused before MCP reads it.
    let mcp = mcp
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(in_flight))
        .layer(axum::middleware::from_fn_with_state(replica.clone(), during_shutdown))
        .layer(axum::middleware::from_fn_with_state(replica.clone(), mcp_token));
    requests
        .merge(streams)
        .route_layer(axum::middleware::from_fn_with_state(replica.clone(), check_path))
        .merge(mcp)
        .fallback(|| async { Problem::not_found("no such route") })
        .method_not_allowed_fallback(|method: Method| async move {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                types::METHOD_NOT_ALLOWED,
                "Method not allowed",
                format!("this route does not take {method}"),
            )
        })
        .layer(axum::middleware::from_fn_with_state(replica.clone(), measure))
        .with_state(replica)
}

// A route is registered only through `routes!`, which takes its path and methods from the
// handler's `#[utoipa::path]`: what the router serves and what the document says are one
// list. (`routes!` with handlers of two paths would serve both on each: one path a call.)

/// Every route but the watch streams, with the document's info and shared schemas.
fn request_routes() -> OpenApiRouter<Arc<Replica>> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(append, read_session))
        .routes(routes!(read_context))
        .routes(routes!(append_bot))
        .routes(routes!(fork_session))
        .routes(routes!(get_record, delete_record))
        .routes(routes!(list_sessions))
        .routes(routes!(search_bot))
        .routes(routes!(conflicts))
        .routes(routes!(stats))
        .routes(routes!(shards))
        .routes(routes!(admin))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .routes(routes!(openapi))
}

/// The watch streams.
fn stream_routes() -> OpenApiRouter<Arc<Replica>> {
    OpenApiRouter::default()
        .routes(routes!(watch_session))
        .routes(routes!(watch_store))
}

/// The OpenAPI document of every route the router serves, generated from the handlers'
/// declarations. The repository holds it as `openapi.json` (what `/openapi.json` serves); a
/// test fails while the two differ, so a change to the API is a visible change.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = request_routes().merge(stream_routes()).into_openapi();
    problems_as_problem_json(&mut doc);
    doc
}

/// Every answer whose body is a [`Problem`] is documented as `application/problem+json`, the
/// media type it is served with (RFC 9457): one pass over the document, not a media type on
/// every error of every route.
fn problems_as_problem_json(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::RefOr;
    const JSON: &str = "application/json";
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for operation in operations.into_iter().flatten() {
            for response in operation.responses.responses.values_mut() {
                let RefOr::T(response) = response else { continue };
                let problem = response.content.len() == 1
                    && response.content.get(JSON).is_some_and(|c| {
                        matches!(&c.schema, Some(RefOr::Ref(r)) if r.ref_location == "#/components/schemas/Problem")
                    });
                if problem && let Some(content) = response.content.shift_remove(JSON) {
                    response.content.insert("application/problem+json".to_string(), content);
                }
            }
        }
    }
}

/// The checked-in document (`crates/ctxlog-server/openapi.json`).
pub const DOCUMENT: &str = include_str!("../openapi.json");

/// How many header timeouts a body has to arrive in, in all.
const BODY_TIMEOUTS: u32 = 3;

/// The budget of request bodies in flight, counted in KiB (a semaphore counts at most
/// `u32::MAX` at once).
pub(crate) fn body_budget(options: &crate::ServeOptions) -> Arc<tokio::sync::Semaphore> {
    let kib = options
        .max_body_bytes_in_flight
        .div_ceil(1024)
        .clamp(1, tokio::sync::Semaphore::MAX_PERMITS.min(u32::MAX as usize));
    Arc::new(tokio::sync::Semaphore::new(kib))
}

/// On shutdown, a request still waiting is answered at once when nothing of it can have
/// been written (a read: 503, `written: nothing`); a write gets the shutdown grace to
/// finish, then is answered `written: unknown` (it may be in a commit). Streams end on
/// their own (they are not behind this layer).
async fn during_shutdown(State(r): Shared, request: Request, next: Next) -> Response {
    // A search is a POST that writes nothing.
    let search = request.extensions().get::<MatchedPath>().map(MatchedPath::as_str) == Some("/v1/bots/{bot}/search");
    let reads = request.method() == Method::GET || request.method() == Method::HEAD || search;
    let mut stop = r.shutdown.clone();
    let mut run = std::pin::pin!(next.run(request));
    tokio::select! {
        biased;
        response = &mut run => return response,
        _ = crate::stopped(&mut stop) => {}
    }
    if reads {
        return Problem::replica_unavailable("the replica is shutting down", ctxlog::Written::Nothing).into_response();
    }
    match tokio::time::timeout(r.options.shutdown_grace, run).await {
        Ok(response) => response,
        Err(_) => Problem::replica_unavailable(
            "the replica shut down before the operation finished; it may have been written",
            ctxlog::Written::Unknown,
        )
        .into_response(),
    }
}

/// `/mcp` needs a valid token (any grant; each tool checks its bot and right).
async fn mcp_token(State(r): Shared, request: Request, next: Next) -> Response {
    if let Err(p) = grant(&r, request.headers()) {
        return p.into_response();
    }
    // MCP's transport reads the body with no deadline and outside the body budget: it is
    // read here, as every route's is (`body`), and handed on whole; its room in the budget
    // is held until the answer is made (a plain JSON answer, not a stream).
    let (parts, data) = request.into_parts();
    match body(&r, Request::from_parts(parts.clone(), data)).await {
        Ok((bytes, room)) => {
            let response = next
                .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
                .await;
            drop(room);
            response
        }
        Err(p) => p.into_response(),
    }
}

/// Every path parameter (bot, session, record id) is checked on every route, read or write,
/// the way the core checks a record's: UTF-8, not empty, no NUL, within the id limit. So a
/// read answers a name no write could have made the same way a write does.
async fn check_path(State(r): Shared, request: Request, next: Next) -> Response {
    let Some(route) = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string())
    else {
        return next.run(request).await;
    };
    let max = r.store.options().limits.max_id_bytes;
    let path = request.uri().path().to_string();
    for (template, raw) in route.split('/').zip(path.split('/')) {
        let Some(name) = template.strip_prefix('{').and_then(|t| t.strip_suffix('}')) else {
            continue;
        };
        let field = match name {
            "bot" => "bot_id",
            "session" => "session_id",
            other => other,
        };
        if let Err(p) = crate::problem::check_name(field, &percent_decode(raw), max) {
            return p.into_response();
        }
    }
    next.run(request).await
}

/// A path segment's bytes, `%XX` decoded (a `%` not followed by two hex digits stays).
pub(crate) fn percent_decode(segment: &str) -> Vec<u8> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

/// A query string, refused as a problem (not axum's plain text) when it does not parse.
struct Query<T>(T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for Query<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| Query(q.0))
            .map_err(|e| Problem::malformed(e.body_text()))
    }
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

/// The grant of the request's token. Two `Authorization` headers are refused: which one
/// counts would depend on who reads them (a proxy, this server).
pub(crate) fn grant(r: &Replica, headers: &HeaderMap) -> Result<Grant, Problem> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let auth = values.next();
    if values.next().is_some() {
        return Err(Problem::unauthorized());
    }
    r.tokens
        .grant(auth.and_then(|v| v.to_str().ok()))
        .ok_or_else(Problem::unauthorized)
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

/// A request's body, read whole once the caller has checked its grant (so a client without
/// one never has its body read). Its bytes are first reserved in the replica's budget of
/// bodies in flight (its declared length, or the largest body when it declares none),
/// waiting for room at most a header timeout; the returned permit holds them — keep it
/// while the body and what is parsed from it live. The body has one deadline in all, counted
/// from here, however its bytes come; on shutdown the read is refused at once. Nothing is
/// written on any of these refusals.
async fn body(r: &Replica, request: Request) -> Result<(Bytes, tokio::sync::OwnedSemaphorePermit), Problem> {
    body_of_at_most(r, request, r.options.max_body_bytes).await
}

/// [`body`] with a bound of its own (a search's is small: it asks, it writes nothing).
async fn body_of_at_most(
    r: &Replica,
    request: Request,
    max: usize,
) -> Result<(Bytes, tokio::sync::OwnedSemaphorePermit), Problem> {
    use futures::StreamExt;
    // Room is waited for as long as headers may take; the body has the rest of its deadline.
    let room_within = r.options.header_read_timeout;
    let within = r.options.header_read_timeout * BODY_TIMEOUTS;
    let deadline = tokio::time::Instant::now() + within;
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            types::TOO_LARGE,
            "Request too large",
            format!("the body is larger than {max} bytes"),
        )
    };
    let shutting_down = || Problem::replica_unavailable("the replica is shutting down", ctxlog::Written::Nothing);
    let declared = match request.headers().get(header::CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| Problem::malformed("`content-length` is not a number"))?,
        ),
    };
    let reserve = match declared {
        Some(n) if n > max as u64 => {
            // A client that waits for `100 Continue` hears the refusal before it sends. One
            // that sends at once has up to `max` bytes read and dropped first (nothing kept),
            // so that it is reading, not still writing, when the refusal comes.
            if !expects_continue(request.headers()) {
                let mut stop = r.shutdown.clone();
                let mut data = request.into_body().into_data_stream();
                let mut dropped = 0;
                while dropped <= max {
                    tokio::select! {
                        biased;
                        _ = crate::stopped(&mut stop) => break,
                        _ = tokio::time::sleep_until(deadline) => break,
                        chunk = data.next() => match chunk {
                            Some(Ok(bytes)) => dropped += bytes.len(),
                            _ => break,
                        },
                    }
                }
            }
            return Err(too_large());
        }
        Some(n) => n as usize,
        None => max,
    };
    let kib = u32::try_from(reserve.div_ceil(1024))
        .unwrap_or(u32::MAX)
        .min(u32::try_from(r.options.max_body_bytes_in_flight.div_ceil(1024)).unwrap_or(u32::MAX))
        .max(1);
    let mut stop = r.shutdown.clone();
    let permit = tokio::select! {
        biased;
        _ = crate::stopped(&mut stop) => return Err(shutting_down()),
        permit = tokio::time::timeout(room_within, r.body_budget.clone().acquire_many_owned(kib)) => match permit {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return Err(shutting_down()),
            Err(_) => {
                return Err(Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    types::BUSY,
                    "Busy",
                    format!("the replica holds as many request bodies as it may; no room within {room_within:?}"),
                ));
            }
        },
    };
    let mut data = request.into_body().into_data_stream();
    let mut buf = bytes::BytesMut::with_capacity(declared.map_or(0, |_| reserve));
    loop {
        let chunk = tokio::select! {
            biased;
            _ = crate::stopped(&mut stop) => return Err(shutting_down()),
            _ = tokio::time::sleep_until(deadline) => {
                return Err(Problem::new(
                    StatusCode::REQUEST_TIMEOUT,
                    types::BODY_TIMEOUT,
                    "Body too slow",
                    format!("the body did not arrive within {within:?}"),
                ));
            }
            chunk = data.next() => chunk,
        };
        match chunk {
            None => return Ok((buf.freeze(), permit)),
            Some(Err(e)) => return Err(Problem::malformed(format!("reading the body failed: {e}"))),
            Some(Ok(bytes)) if buf.len() + bytes.len() > max => return Err(too_large()),
            Some(Ok(bytes)) => buf.extend_from_slice(&bytes),
        }
    }
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
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
    /// Read as of this position (a page's or a context view's `position`, rule 24): what its
    /// reader saw, less what was forgotten since. Give the same one with every page.
    pub at: Option<String>,
}

/// Which page of a bot's sessions.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// The `next` of the previous page.
    pub after: Option<String>,
    /// At most this many (1 to 1000, default 100).
    pub limit: Option<usize>,
    /// Read as of this position (a page's or a context view's `position`, rule 24): the
    /// sessions its reader saw, less what was forgotten since. Give the same one with every
    /// page.
    pub at: Option<String>,
}

/// Where a context view is read.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AtQuery {
    /// Read as of this position (a page's or a context view's `position`, rule 24): what its
    /// reader saw, less what was forgotten since.
    pub at: Option<String>,
}

/// The position of `at` (a query's), if given.
fn parse_at(at: Option<&str>) -> Result<Option<ctxlog::Checkpoint>, Problem> {
    at.map(|c| cursor::parse_position("at", c)).transpose()
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
    responses((status = 200, body = AckOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 409, body = Problem),
              (status = 413, body = Problem),
              (status = 503, body = Problem),
              (status = 504, body = Problem)))]
async fn append(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Request,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let (raw, _held) = body(&r, raw).await?;
    let input: AppendIn = parse(&raw)?;
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
    Ok(axum::Json(append_records(r, records).await?))
}

/// One batch through the replica's writer (the routes' and the MCP tools').
pub(crate) async fn append_records(r: Arc<Replica>, records: Vec<Record>) -> Result<AckOut, Problem> {
    r.metrics.append_records.observe(records.len() as f64);
    // Links and embeddings need a store whose ids are scoped by bot (rules 25, 27): refused
    // here, before the batch joins a group commit whose other batches the refusal would
    // fail too.
    if records.iter().any(|rec| rec.kind.needs_format() > ctxlog::IDS_BY_BOT) {
        let format = r.store.format().await.map_err(Problem::from)?;
        if format < ctxlog::IDS_BY_BOT {
            return Err(Problem::from(ctxlog::needs_ids_by_bot(format)));
        }
    }
    let mut after = ctxlog::Hlc::ZERO;
    if records.iter().any(|rec| rec.covers.is_some()) {
        let p = r.view.fresh().await?;
        ctxlog::check_covers_held(&records, &p.checkpoint())?;
        after = p.max_hlc();
    }
    let ack = detached(async move { r.writer.append(records, after).await }).await?;
    Ok(AckOut::from(&ack))
}

/// Continue session `from` as this session as of a position (rule 25): one record, whatever
/// the length of `from`; nothing in `from` changes. The position is `at`, or the position
/// just after record `through` of `from`'s view, or the replica's fresh view now.
#[utoipa::path(post, path = "/v1/bots/{bot}/sessions/{session}/fork",
    params(("bot" = String, Path), ("session" = String, Path)),
    request_body = ForkIn,
    responses((status = 200, body = ForkOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 409, body = Problem),
              (status = 413, body = Problem),
              (status = 503, body = Problem),
              (status = 504, body = Problem)))]
async fn fork_session(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    headers: HeaderMap,
    raw: Request,
) -> Result<axum::Json<ForkOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let (raw, _held) = body(&r, raw).await?;
    let input: ForkIn = parse(&raw)?;
    // `through` reads the continued session's view: it answers whether a record is there.
    if input.through.is_some() {
        grant_for(&r, &headers, &bot, Right::Read)?;
    }
    let limits = ctxlog::Limits::default();
    limits.check_id("from", &input.from)?;
    if input.from == session {
        return Err(Problem::invalid("from", None, "a session cannot continue itself"));
    }
    let id = match input.id {
        Some(id) => {
            limits.check_id("id", &id)?;
            id
        }
        None => format!("fork-{}", uuid::Uuid::new_v4()),
    };
    let at = {
        let mut p = r.view.fresh().await?;
        // A retry of a fork that landed (its answer lost) is answered with that fork; an id
        // that names anything else is refused.
        if let Some(e) = p.get(&bot, &id).await.map_err(Problem::from)? {
            let same = e.record.kind == ctxlog::Kind::Fork
                && e.record.session_id == session
                && e.record.link_target() == Some(input.from.as_str());
            return match (same, e.record.covers.as_ref()) {
                (true, Some(at)) => Ok(axum::Json(ForkOut {
                    ack: AckOut {
                        shard: e.shard.to_string(),
                        epoch: e.epoch,
                        first_seq: e.seq,
                        last_seq: e.seq,
                        ids: vec![id],
                    },
                    at: cursor::position(at),
                })),
                _ => Err(Problem::invalid(
                    "id",
                    None,
                    format!(
                        "names a record of this bot already, not a fork of {:?} into {session:?}",
                        input.from
                    ),
                )),
            };
        }
        // One fork per session: a later one would change nothing (rule 25).
        let own = p.own_entries(&bot, &session).await.map_err(Problem::from)?;
        if let Some(f) = own.iter().find(|e| e.record.kind == ctxlog::Kind::Fork) {
            return Err(Problem::invalid(
                "from",
                None,
                format!(
                    "session {session:?} continues {:?} already (fork {:?}): delete that record first",
                    f.record.link_target().unwrap_or_default(),
                    f.record.id
                ),
            ));
        }
        let held = p.checkpoint();
        match (input.at.as_deref(), input.through.as_deref()) {
            (Some(_), Some(_)) => return Err(Problem::invalid("through", None, "give `at` or `through`, not both")),
            (Some(at), None) => {
                let at = cursor::parse_position("at", at)?;
                if let Some((shard, seq)) = at.first_beyond(&held) {
                    return Err(Problem::invalid(
                        "at",
                        None,
                        format!(
                            "names seq {seq} of shard {shard}, past what the store holds: not a position of this store"
                        ),
                    ));
                }
                at
            }
            (None, Some(through)) => {
                let keys = p.view_keys(&bot, &input.from, None).await.map_err(Problem::from)?;
                let last = p.live_key(&bot, through).filter(|k| keys.binary_search(k).is_ok());
                let Some(last) = last else {
                    return Err(Problem::invalid(
                        "through",
                        None,
                        format!("no record {through:?} in the view of session {:?}", input.from),
                    ));
                };
                let at = position_through(&keys, &held, &last);
                // The view as of that position must be the prefix asked for: a link of the
                // continued session written after a record it keeps would be cut off too.
                let prefix: Vec<ctxlog::OrderKey> = keys.iter().copied().filter(|k| *k <= last).collect();
                let as_of = p.view_keys(&bot, &input.from, Some(&at)).await.map_err(Problem::from)?;
                if as_of != prefix {
                    return Err(Problem::invalid(
                        "through",
                        None,
                        format!(
                            "no position holds the view of {:?} up to {through:?} and nothing after (a fork or hide of it was written after a record it keeps): fork `at` a position instead",
                            input.from
                        ),
                    ));
                }
                at
            }
            (None, None) => held,
        }
    };
    let record = Record::fork(id, &bot, &session, &input.from, at.clone());
    let ack = append_records(r, vec![record]).await?;
    Ok(axum::Json(ForkOut {
        ack,
        at: cursor::position(&at),
    }))
}

/// The position that holds a session view (`view`, its keys in order) up to `through` and
/// nothing after it: per shard, what `held` holds short of the view's first record after
/// `through` there. In a shard the order follows the seq (a writer's clock only rises), so
/// each shard's records at or before `through` are a prefix of its seqs.
fn position_through(
    view: &[ctxlog::OrderKey],
    held: &ctxlog::Checkpoint,
    through: &ctxlog::OrderKey,
) -> ctxlog::Checkpoint {
    let mut at = held.clone();
    for k in view.iter().filter(|k| *k > through) {
        let seq = at.0.entry(k.shard).or_insert(0);
        *seq = (*seq).min(k.seq - 1);
    }
    at.0.retain(|_, seq| *seq > 0);
    at
}

/// Append one atomic batch whose records may belong to several sessions of one bot (each
/// names its `session_id`): all are written or none.
#[utoipa::path(post, path = "/v1/bots/{bot}/records",
    params(("bot" = String, Path)),
    request_body = AppendIn,
    responses((status = 200, body = AckOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 409, body = Problem),
              (status = 413, body = Problem),
              (status = 503, body = Problem),
              (status = 504, body = Problem)))]
async fn append_bot(
    State(r): Shared,
    Path(bot): Path<String>,
    headers: HeaderMap,
    raw: Request,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    let (raw, _held) = body(&r, raw).await?;
    let input: AppendIn = parse(&raw)?;
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
    responses((status = 200, body = RecordsPage),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn read_session(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<RecordsPage>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    Ok(axum::Json(records_page(&r, &bot, &session, &q).await?))
}

/// A page of a session's live records (the route's and the MCP tool's).
pub(crate) async fn records_page(r: &Replica, bot: &str, session: &str, q: &PageQuery) -> Result<RecordsPage, Problem> {
    let limit = page_limit(q.limit)?;
    let after = q.after.as_deref().map(|c| cursor::parse_page("after", c)).transpose()?;
    let last = q.last.map(|n| page_limit(Some(n))).transpose()?;
    if last.is_some() && (after.is_some() || q.limit.is_some() || q.at.is_some()) {
        return Err(Problem::invalid(
            "last",
            None,
            "give `last` alone, or `after`, `limit` and `at`",
        ));
    }
    let at = parse_at(q.at.as_deref())?;
    let mut p = r.view.fresh().await?;
    // As of a position, it is the page's position too.
    let position = cursor::position(at.as_ref().unwrap_or(&p.checkpoint()));
    if let Some(n) = last {
        let (entries, older) = p.session_tail(bot, session, n).await.map_err(Problem::from)?;
        return Ok(RecordsPage {
            records: entries.iter().map(EntryOut::from).collect(),
            next: None,
            has_more: older,
            position,
        });
    }
    let (entries, more) = match &at {
        None => p.session_page(bot, session, after.as_ref(), limit).await,
        Some(at) => p.session_page_at(bot, session, at, after.as_ref(), limit).await,
    }
    .map_err(Problem::from)?;
    drop(p);
    let next = if more {
        entries.last().map(|e| cursor::page(&e.key()))
    } else {
        None
    };
    Ok(RecordsPage {
        records: entries.iter().map(EntryOut::from).collect(),
        next,
        has_more: more,
        position,
    })
}

/// A session's context view (rule 21): its governing summary and every live record that
/// summary does not cover, in the contract's order, with the view's position (to watch
/// from) and its `covers` token (for a summary written from this view: bound to this
/// session, it is the only thing `covers` takes).
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions/{session}/context",
    params(("bot" = String, Path), ("session" = String, Path), AtQuery),
    responses((status = 200, body = ContextOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn read_context(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    Query(q): Query<AtQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<ContextOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    Ok(axum::Json(context_view(&r, &bot, &session, q.at.as_deref()).await?))
}

/// A session's context view from a fresh view, now or as of `at` (the route's and the MCP
/// tool's).
pub(crate) async fn context_view(
    r: &Replica,
    bot: &str,
    session: &str,
    at: Option<&str>,
) -> Result<ContextOut, Problem> {
    let at = parse_at(at)?;
    let mut p = r.view.fresh().await?;
    let (view, checkpoint) = match at {
        None => (p.context(bot, session).await.map_err(Problem::from)?, p.checkpoint()),
        Some(at) => (p.context_at(bot, session, &at).await.map_err(Problem::from)?, at),
    };
    drop(p);
    let summary = view
        .summary
        .and_then(|k| view.entries.iter().find(|e| e.key() == k))
        .map(|e| e.record.id.clone());
    Ok(ContextOut {
        records: view.entries.iter().map(EntryOut::from).collect(),
        summary,
        covered: view.covered,
        position: cursor::position(&checkpoint),
        covers: cursor::covers(bot, session, &checkpoint),
    })
}

/// Search a bot's live records: by words (rule 26, BM25), by a vector among those embedded
/// by a model (rule 27), or both (reciprocal rank fusion); best first, equal scores in the
/// contract's order; sees every append acknowledged before it.
#[utoipa::path(post, path = "/v1/bots/{bot}/search",
    params(("bot" = String, Path)),
    request_body = SearchIn,
    responses((status = 200, body = SearchOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 413, body = Problem),
              (status = 503, body = Problem),
              (status = 504, body = Problem)))]
async fn search_bot(
    State(r): Shared,
    Path(bot): Path<String>,
    headers: HeaderMap,
    raw: Request,
) -> Result<axum::Json<SearchOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    let (raw, held) = body_of_at_most(&r, raw, crate::search::MAX_BODY_BYTES).await?;
    let input: SearchIn = parse(&raw)?;
    drop((raw, held));
    Ok(axum::Json(r.search.search(&r, &bot, input).await?))
}

/// The live record `id` of `bot`, from a fresh view. Ids are scoped by bot: another bot's
/// record of the same id is another record, and says nothing about this one.
pub(crate) async fn live_record(r: &Replica, bot: &str, id: &str) -> Result<ctxlog::Entry, Problem> {
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
    responses((status = 200, body = EntryOut),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
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
    responses((status = 200, body = AckOut),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 404, body = Problem),
              (status = 409, body = Problem)))]
async fn delete_record(
    State(r): Shared,
    Path((bot, id)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<axum::Json<AckOut>, Problem> {
    grant_for(&r, &headers, &bot, Right::Write)?;
    Ok(axum::Json(forget(r, &bot, &id).await?))
}

/// Tombstone the live record `id` of `bot` (the route's and the MCP tool's).
pub(crate) async fn forget(r: Arc<Replica>, bot: &str, id: &str) -> Result<AckOut, Problem> {
    let entry = live_record(&r, bot, id).await?;
    let tombstone = RecordIn {
        id: id.to_string(),
        role: entry.record.role.clone(),
        content_type: None,
        text: None,
        bytes_b64: None,
        metadata: None,
        created_at: None,
        kind: KindJson::Tombstone,
        covers: None,
        session_id: None,
        model: None,
        metric: None,
        vector: None,
    }
    .into_record(bot, &entry.record.session_id, 0)?;
    let ack = detached(async move { r.writer.append(vec![tombstone], ctxlog::Hlc::ZERO).await }).await?;
    Ok(AckOut::from(&ack))
}

/// A page of a bot's sessions with live records, by session id.
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions",
    params(("bot" = String, Path), SessionsQuery),
    responses((status = 200, body = SessionsPage),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem)))]
async fn list_sessions(
    State(r): Shared,
    Path(bot): Path<String>,
    Query(q): Query<SessionsQuery>,
    headers: HeaderMap,
) -> Result<axum::Json<SessionsPage>, Problem> {
    grant_for(&r, &headers, &bot, Right::Read)?;
    Ok(axum::Json(sessions_page(&r, &bot, &q).await?))
}

/// A page of a bot's sessions (the route's and the MCP tool's).
pub(crate) async fn sessions_page(r: &Replica, bot: &str, q: &SessionsQuery) -> Result<SessionsPage, Problem> {
    let limit = page_limit(q.limit)?;
    let after = q.after.as_deref().map(|c| cursor::parse_name("after", c)).transpose()?;
    let at = parse_at(q.at.as_deref())?;
    let mut p = r.view.fresh().await?;
    let mut all = match at {
        None => p.sessions(bot).await,
        Some(at) => p.sessions_at(bot, &at).await,
    }
    .map_err(Problem::from)?;
    drop(p);
    all.sort_by(|a, b| a.session_id.cmp(&b.session_id));
    let mut page: Vec<SessionOut> = all
        .iter()
        .filter(|s| after.as_ref().is_none_or(|a| s.session_id > *a))
        .take(limit + 1)
        .map(SessionOut::from)
        .collect();
    let has_more = page.len() > limit;
    page.truncate(limit);
    Ok(SessionsPage {
        next: if has_more {
            page.last().map(|s| cursor::name(&s.session_id))
        } else {
            None
        },
        sessions: page,
        has_more,
    })
}

/// Where a conflicts call starts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PositionQuery {
    /// A position (an event id, or a page's `position`); without one, the whole log.
    pub after: Option<String>,
}

/// Where a watch starts, and where it ends if it does.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WatchQuery {
    /// A position (an event id, or a page's `position`); a watch without one starts now.
    pub after: Option<String>,
    /// A position the store holds: the stream sends the changes between where it starts
    /// and this (rule 24), then `end` with reason `until` and `"resume": false`.
    pub until: Option<String>,
}

/// Where a watch starts, and the field that said so.
fn watch_from(q: &WatchQuery, headers: &HeaderMap) -> Result<Option<(&'static str, ctxlog::Checkpoint)>, Problem> {
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

/// A session's new records as server-sent events (`record`, `tombstone`, `link`); each
/// event's id is a position to resume from. With `until`, the changes between two positions.
#[utoipa::path(get, path = "/v1/bots/{bot}/sessions/{session}/watch",
    params(("bot" = String, Path), ("session" = String, Path), WatchQuery,
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, content_type = "text/event-stream", body = EntryOut,
               description = "First `position` (where the stream starts, and the `until` it ends at), then `record`, `tombstone` and `link` (data an entry), each with a position as id, and `position` again where the stream went through entries it shows nothing of; `end` (data `{reason, resume}`) when the stream must stop, or with reason `until` once it went through `until`"),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 429, body = Problem)))]
async fn watch_session(
    State(r): Shared,
    Path((bot, session)): Path<(String, String)>,
    Query(q): Query<WatchQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let g = grant_for(&r, &headers, &bot, Right::Read)?;
    let from = watch_from(&q, &headers)?;
    let until = q
        .until
        .as_deref()
        .map(|c| cursor::parse_position("until", c))
        .transpose()?;
    let permit = r.watchers.admit(&g.name, r.options.max_watchers_per_token)?;
    Ok(
        watch::stream(r.clone(), Scope::Session { bot, session }, from, until, permit)
            .await?
            .into_response(),
    )
}

/// Every new record of the store as server-sent events (admin). With `until`, the changes
/// between two positions.
#[utoipa::path(get, path = "/v1/watch",
    params(WatchQuery, ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event")),
    responses((status = 200, content_type = "text/event-stream", body = EntryOut,
               description = "First `position` (where the stream starts, and the `until` it ends at), then `record`, `tombstone` and `link` (data an entry), each with a position as id, and `position` again where the stream went through entries it shows nothing of; `end` (data `{reason, resume}`) when the stream must stop, or with reason `until` once it went through `until`"),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 429, body = Problem)))]
async fn watch_store(State(r): Shared, Query(q): Query<WatchQuery>, headers: HeaderMap) -> Result<Response, Problem> {
    let g = admin_grant(&r, &headers)?;
    let from = watch_from(&q, &headers)?;
    let until = q
        .until
        .as_deref()
        .map(|c| cursor::parse_position("until", c))
        .transpose()?;
    let permit = r.watchers.admit(&g.name, r.options.max_watchers_per_token)?;
    Ok(watch::stream(r.clone(), Scope::Store, from, until, permit)
        .await?
        .into_response())
}

/// The conflicts of the log (admin); with `after`, only those involving entries past it.
#[utoipa::path(get, path = "/v1/conflicts", params(PositionQuery),
    responses((status = 200, body = ConflictsOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
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
    responses((status = 200, body = Object),
              (status = 401, body = Problem),
              (status = 403, body = Problem)))]
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
    responses((status = 200, body = Vec<Object>),
              (status = 401, body = Problem),
              (status = 403, body = Problem)))]
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
    responses((status = 200, body = ReportOut),
              (status = 400, body = Problem),
              (status = 401, body = Problem),
              (status = 403, body = Problem),
              (status = 404, body = Problem)))]
async fn admin(
    State(r): Shared,
    Path(op): Path<String>,
    headers: HeaderMap,
    raw: Request,
) -> Result<axum::Json<ReportOut>, Problem> {
    admin_grant(&r, &headers)?;
    let (raw, _held) = body(&r, raw).await?;
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
                drop(p);
                // The replica's search index too, if it has one (rule 26's derived data).
                // The projection snapshot is written: a failure to save the search index is
                // reported in the answer, not as the operation's failure.
                let search = match replica.search.save(&replica).await {
                    Ok(Some(ctxlog::search::saved::Saved::Put { name, bytes })) => json!({"saved": name, "bytes": bytes}),
                    Ok(Some(ctxlog::search::saved::Saved::Withdrawn)) => json!({"saved": null, "why": "a purge ran meanwhile"}),
                    Ok(Some(ctxlog::search::saved::Saved::Nowhere)) => json!({"saved": null, "why": "the store keeps no saved search indexes"}),
                    Ok(None) => json!({"saved": null, "why": "this replica has not searched"}),
                    Err(p) => json!({"saved": null, "error": p}),
                };
                Ok(json!({"entries": c.entries, "bytes": c.bytes, "taken_millis": c.taken_millis, "search_index": search}))
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
    // Read before the reason: fenced never turns false again, so a fenced answer always says
    // not ready (the reason, read after, says fenced too).
    let fenced = r.writer.fenced();
    let reason = if let Some(why) = r.writer.unready() {
        Some(why)
    } else if let Some(why) = r.view.failing() {
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
    (
        status,
        axum::Json(ReadyOut {
            ready,
            writer,
            fenced,
            reason,
        }),
    )
        .into_response()
}

/// Prometheus text (admin when tokens are required).
#[utoipa::path(get, path = "/metrics",
    responses((status = 200, content_type = "application/openmetrics-text", body = String),
              (status = 401, body = Problem),
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
async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], DOCUMENT).into_response()
}

/// The document's info and the schemas it names; its paths come from the router.
#[derive(OpenApi)]
#[openapi(
    info(title = "ctxlog", description = "The context log over HTTP: one writer per replica."),
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
struct ApiDoc;

#[cfg(test)]
mod tests;
