//! The context log as an MCP server: the same operations as the HTTP routes, as tools a model
//! calls and resources a client attaches.
//!
//! Names:
//!
//! - [`Tools`] — one MCP server handler over a [`Replica`]: its tools (each one route's
//!   operation, through the same functions, so a tool and its route cannot disagree) and a
//!   resource per session (its context view).
//! - *Caller* — who a call is from. Over HTTP (`/mcp` on `ctxlog serve`) it is the bearer
//!   token of the very HTTP request that carries the call: each call is judged by its own
//!   token, as a route is. Over stdio (`ctxlog mcp`) it is whoever launched the process,
//!   with every right on the bots it was started for.
//!
//! Errors are tool errors (`isError`), never protocol errors, so the model reads them —
//! object arguments not of the tool's shape too (`invalid-input`, the field by its path): the
//! structured content is the route's problem (RFC 9457 fields: `type`, `written`, `field`,
//! …). `written` says whether anything may have landed; a failed append also names the ids
//! it used, so a retry with them counts once.
//!
//! Over HTTP the server is stateless (no MCP session is kept between calls): any replica
//! answers any call, and a client that opens a thousand sessions costs nothing.

use std::sync::Arc;

use ctxlog::{Body, Kind, Record};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, Extensions, Implementation,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource, ResourceContents, ResourceTemplate,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler, tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::Replica;
use crate::auth::{Grant, Right};
use crate::problem::Problem;
use crate::routes::{self, PageQuery, SessionsQuery};

/// The URI of a session's resource: `ctxlog://bots/{bot}/sessions/{session}`, each name
/// percent-encoded.
const RESOURCE_TEMPLATE: &str = "ctxlog://bots/{bot}/sessions/{session}";
/// Sessions listed as resources per bot and page.
const RESOURCES_PER_PAGE: usize = 100;

/// Tools that write: a grant without `write` on any bot does not see them listed.
const WRITE_TOOLS: [&str; 3] = ["append_records", "write_summary", "forget_record"];

/// One MCP server over a replica (see the module's overview).
#[derive(Clone)]
pub(crate) struct Tools {
    replica: Arc<Replica>,
    /// The caller's grant when it is fixed (stdio); `None`: each call's HTTP token.
    local: Option<Grant>,
    tool_router: ToolRouter<Self>,
}

/// A bot and a page of its sessions.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListSessionsArgs {
    /// The bot (agent or application) whose sessions to list.
    bot: String,
    /// The `next` of the previous page, to continue after it.
    #[serde(default)]
    after: Option<String>,
    /// At most this many sessions (1 to 1000, default 100).
    #[serde(default)]
    limit: Option<usize>,
    /// Read as of this position (an earlier answer's `position`): what was there then,
    /// less what was forgotten since.
    #[serde(default)]
    at: Option<String>,
}

/// A session of a bot.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    /// The bot.
    bot: String,
    /// The session (conversation) id.
    session: String,
    /// Read as of this position (an earlier answer's `position`): what was there then,
    /// less what was forgotten since.
    #[serde(default)]
    at: Option<String>,
}

/// A page of a session's raw records.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadRecordsArgs {
    /// The bot.
    bot: String,
    /// The session id.
    session: String,
    /// The `next` of the previous page, to continue after it.
    #[serde(default)]
    after: Option<String>,
    /// At most this many records (1 to 1000, default 100).
    #[serde(default)]
    limit: Option<usize>,
    /// Instead of `after`/`limit`: only the last this many records (1 to 1000).
    #[serde(default)]
    last: Option<usize>,
    /// Read as of this position (an earlier answer's `position`): what was there then,
    /// less what was forgotten since.
    #[serde(default)]
    at: Option<String>,
}

/// One record to append.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NewRecord {
    /// Who speaks: `user`, `assistant`, `tool`, `system`, ….
    role: String,
    /// The record's text.
    text: String,
    /// A JSON object stored with the record.
    #[serde(default)]
    metadata: Option<serde_json::Map<String, Value>>,
    /// An id of your choosing (unique within the bot). Leave it out and one is made; to retry
    /// a call whose outcome is unknown, give the ids the failed call reported: a record whose
    /// id is already written is not written again.
    #[serde(default)]
    id: Option<String>,
}

/// Records to append to a session, as one atomic batch.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct AppendArgs {
    /// The bot.
    bot: String,
    /// The session id (a new id starts a new session).
    session: String,
    /// The records, in order (1 to 10,000).
    records: Vec<NewRecord>,
}

/// A summary of a context view that was just read.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SummaryArgs {
    /// The bot.
    bot: String,
    /// The session id.
    session: String,
    /// The `covers` of the `read_context` result this summary was made from.
    covers: String,
    /// The summary's text.
    text: String,
    /// An id of your choosing (see `append_records`); one is made if left out.
    #[serde(default)]
    id: Option<String>,
}

/// A search of a bot's live records: by words, by a vector, or both.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// The bot.
    bot: String,
    /// Words, `"exact phrases"` and `prefix*`es; a record holding any of them is a hit, the
    /// best (BM25) first. At most 1024 bytes, 32 clauses, 4 prefixes.
    #[serde(default)]
    query: Option<String>,
    /// A vector to find the nearest records of, among those embedded by `model` (the
    /// embedder's: ctxlog calls none); with `query` too, both rankings fused.
    #[serde(default)]
    vector: Option<Vec<f32>>,
    /// The model `vector` was made by (required with it).
    #[serde(default)]
    model: Option<String>,
    /// Only this session's records.
    #[serde(default)]
    session: Option<String>,
    /// Only records of these roles (`user`, `assistant`, …; at most 16).
    #[serde(default)]
    roles: Vec<String>,
    /// Only records appended at or after this time (RFC 3339).
    #[serde(default)]
    since: Option<String>,
    /// Only records appended before this time (RFC 3339).
    #[serde(default)]
    until: Option<String>,
    /// Only records whose metadata has each of these keys with exactly this value.
    #[serde(default)]
    metadata: std::collections::BTreeMap<String, Value>,
    /// At most this many hits (1 to 100, default 10).
    #[serde(default)]
    k: Option<usize>,
    /// The `next` of the previous answer, for the hits after it.
    #[serde(default)]
    after: Option<String>,
}

/// One record of a bot, by id.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RecordArgs {
    /// The bot.
    bot: String,
    /// The record's id.
    id: String,
}

impl Tools {
    /// A handler whose every call is judged by the token of the HTTP request carrying it.
    pub(crate) fn over_http(replica: Arc<Replica>) -> Self {
        Tools {
            replica,
            local: None,
            tool_router: Self::tool_router(),
        }
    }

    /// A handler for the process's own user: every right on `bots` (patterns as in a tokens
    /// file; `*` for all).
    pub(crate) fn local(replica: Arc<Replica>, bots: Vec<String>) -> Self {
        Tools {
            replica,
            local: Some(Grant::local(bots)),
            tool_router: Self::tool_router(),
        }
    }

    /// The caller's grant: the fixed one, or the token of the HTTP request of this call.
    fn grant(&self, ext: &Extensions) -> Result<Grant, Problem> {
        if let Some(g) = &self.local {
            return Ok(g.clone());
        }
        match ext.get::<axum::http::request::Parts>() {
            Some(parts) => routes::grant(&self.replica, &parts.headers),
            // Not over HTTP and not local: nothing is granted.
            None => Err(Problem::unauthorized()),
        }
    }

    /// The grant, if it covers `bot` with `right`, and `bot` a name a record could have
    /// (checked first, as the HTTP routes check their path before the token's scope).
    fn grant_for(&self, ext: &Extensions, bot: &str, right: Right) -> Result<Grant, Problem> {
        self.check_name("bot", bot)?;
        let g = self.grant(ext)?;
        if !g.allows(bot, right) {
            return Err(Problem::forbidden(right.as_str()));
        }
        Ok(g)
    }

    fn check_name(&self, field: &str, name: &str) -> Result<(), Problem> {
        crate::problem::check_name(field, name.as_bytes(), self.replica.store.options().limits.max_id_bytes)
    }
}

/// A tool's answer: the value as structured content (and as JSON text), or the problem as a
/// tool error.
fn answer<T: serde::Serialize>(result: Result<T, Problem>) -> CallToolResult {
    match result.and_then(|v| {
        serde_json::to_value(v).map_err(|e| Problem::replica_unavailable(e.to_string(), ctxlog::Written::Unknown))
    }) {
        Ok(value) => CallToolResult::structured(value),
        Err(problem) => failed(&problem, None),
    }
}

/// A problem as a tool error; `ids`: the ids an append used, for its retry.
fn failed(problem: &Problem, ids: Option<&[String]>) -> CallToolResult {
    // The HTTP answer of a tool error is a 200: the metrics do not see it, the log does.
    if problem.status >= 500 {
        tracing::warn!(kind = problem.kind, status = problem.status, detail = %problem.detail, "an MCP tool call failed");
    }
    let mut value = serde_json::to_value(problem).unwrap_or_else(|_| json!({"detail": problem.detail}));
    if let (Some(ids), Some(map)) = (ids, value.as_object_mut()) {
        map.insert("ids".into(), json!(ids));
    }
    CallToolResult::structured_error(value)
}

#[tool_router]
impl Tools {
    #[tool(
        description = "List a bot's sessions (conversations) that have live records, by session id, a page at a \
                       time. Each has its number of live records. Continue with `after` = the answer's `next`.",
        annotations(read_only_hint = true)
    )]
    async fn list_sessions(&self, Parameters(a): Parameters<ListSessionsArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Read)?;
            let q = SessionsQuery {
                after: a.after,
                limit: a.limit,
                at: a.at,
            };
            routes::sessions_page(&self.replica, &a.bot, &q).await
        };
        answer(result.await)
    }

    #[tool(
        description = "Read a session's context view: what to give a model as the conversation so far. It is the \
                       session's latest summary (if any) followed by every live record that summary does not cover, \
                       oldest first. `covers` in the answer is what `write_summary` needs to summarise exactly this \
                       view; `position` says how far the view reaches.",
        annotations(read_only_hint = true)
    )]
    async fn read_context(&self, Parameters(a): Parameters<SessionArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Read)?;
            self.check_name("session_id", &a.session)?;
            routes::context_view(&self.replica, &a.bot, &a.session, a.at.as_deref()).await
        };
        answer(result.await)
    }

    #[tool(
        description = "Read a page of a session's raw live records, oldest first (summaries included, nothing left \
                       out). Continue with `after` = the answer's `next`, or give `last` for the most recent records \
                       only.",
        annotations(read_only_hint = true)
    )]
    async fn read_records(&self, Parameters(a): Parameters<ReadRecordsArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Read)?;
            self.check_name("session_id", &a.session)?;
            let q = PageQuery {
                after: a.after,
                limit: a.limit,
                last: a.last,
                at: a.at,
            };
            routes::records_page(&self.replica, &a.bot, &a.session, &q).await
        };
        answer(result.await)
    }

    #[tool(
        description = "Append records (messages, tool results, notes) to a session, as one atomic batch: all are \
                       written, durably, or none. The answer lists the records' ids. If the call fails with \
                       `written: \"unknown\"`, it may have landed: call again with the same records and the `ids` \
                       the error names, and each is written at most once.",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn append_records(&self, Parameters(a): Parameters<AppendArgs>, ext: Extensions) -> CallToolResult {
        // The ids are made once, here, for this call: whatever happens below, they are the ones
        // a failure reports and a retry gives back.
        let ids: Vec<String> = a
            .records
            .iter()
            .map(|r| r.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string()))
            .collect();
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Write)?;
            self.check_name("session_id", &a.session)?;
            if a.records.is_empty() {
                return Err(Problem::invalid("records", None, "give at least one record"));
            }
            let records = a
                .records
                .into_iter()
                .zip(&ids)
                .map(|(r, id)| Record {
                    id: id.clone(),
                    bot_id: a.bot.clone(),
                    session_id: a.session.clone(),
                    role: r.role,
                    content_type: "text/plain".into(),
                    body: Body::Text(r.text),
                    metadata: r.metadata.map(Value::Object),
                    created_at: None,
                    kind: Kind::Put,
                    covers: None,
                })
                .collect();
            routes::append_records(self.replica.clone(), records).await
        };
        match result.await {
            Ok(ack) => answer(Ok(ack)),
            Err(problem) => failed(&problem, Some(&ids)),
        }
    }

    #[tool(
        description = "Write a summary of a session's context view that you just read with `read_context`: give \
                       that answer's `covers`. From then on the context view is this summary followed by whatever \
                       was appended after the view you summarised (nothing appended meanwhile is lost).",
        annotations(read_only_hint = false, destructive_hint = false, idempotent_hint = false)
    )]
    async fn write_summary(&self, Parameters(a): Parameters<SummaryArgs>, ext: Extensions) -> CallToolResult {
        let id = a.id.clone().unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Write)?;
            self.check_name("session_id", &a.session)?;
            let covers = crate::cursor::parse_covers("covers", &a.covers, &a.bot, &a.session)?;
            let record = Record {
                id: id.clone(),
                bot_id: a.bot.clone(),
                session_id: a.session.clone(),
                role: "summary".into(),
                content_type: "text/plain".into(),
                body: Body::Text(a.text),
                metadata: None,
                created_at: None,
                kind: Kind::Summary,
                covers: Some(covers),
            };
            routes::append_records(self.replica.clone(), vec![record]).await
        };
        match result.await {
            Ok(ack) => answer(Ok(ack)),
            Err(problem) => failed(&problem, Some(std::slice::from_ref(&id))),
        }
    }

    #[tool(
        description = "Get one live record of a bot by its id.",
        annotations(read_only_hint = true)
    )]
    async fn get_record(&self, Parameters(a): Parameters<RecordArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Read)?;
            self.check_name("id", &a.id)?;
            let entry = routes::live_record(&self.replica, &a.bot, &a.id).await?;
            Ok(crate::api::EntryOut::from(&entry))
        };
        answer(result.await)
    }

    #[tool(
        description = "Search a bot's live records by words (`query`): the best matches first (BM25), each with a \
                       snippet and the query terms it holds; or by a `vector` of an embedding `model` (the nearest \
                       first); or both, fused. Forgotten records are never found. Narrow it to a session, roles, a \
                       time range or metadata; continue with `after` = the answer's `next`.",
        annotations(read_only_hint = true)
    )]
    async fn search(&self, Parameters(a): Parameters<SearchArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Read)?;
            let input = crate::api::SearchIn {
                query: a.query,
                vector: a.vector,
                model: a.model,
                k: a.k,
                after: a.after,
                session: a.session,
                roles: a.roles,
                since: a.since,
                until: a.until,
                metadata: a.metadata,
            };
            self.replica.search.search(&self.replica, &a.bot, input).await
        };
        answer(result.await)
    }

    #[tool(
        description = "Forget one record of a bot: it leaves every view at once and for good (its id is never \
                       used again). The bytes are erased from storage by the operator's next purge.",
        annotations(read_only_hint = false, destructive_hint = true, idempotent_hint = true)
    )]
    async fn forget_record(&self, Parameters(a): Parameters<RecordArgs>, ext: Extensions) -> CallToolResult {
        let result = async {
            self.grant_for(&ext, &a.bot, Right::Write)?;
            self.check_name("id", &a.id)?;
            routes::forget(self.replica.clone(), &a.bot, &a.id).await
        };
        answer(result.await)
    }
}

/// `ctxlog://bots/{bot}/sessions/{session}` for these names.
fn resource_uri(bot: &str, session: &str) -> String {
    format!("ctxlog://bots/{}/sessions/{}", encode(bot), encode(session))
}

/// The bot and session a resource URI names.
fn parse_resource_uri(uri: &str) -> Option<(String, String)> {
    let rest = uri.strip_prefix("ctxlog://bots/")?;
    let (bot, session) = rest.split_once("/sessions/")?;
    if bot.contains('/') || session.contains('/') {
        return None;
    }
    let decode = |s: &str| String::from_utf8(routes::percent_decode(s)).ok();
    Some((decode(bot)?, decode(session)?))
}

/// Percent-encode everything but RFC 3986's unreserved characters.
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where a listing of resources goes on: the index of a bot among the grant's named bots,
/// and the session cursor within it.
#[derive(serde::Serialize, Deserialize)]
struct ResourceCursor {
    bot: usize,
    after: Option<String>,
}

/// Whether `args` have the shape of tool `name`'s arguments: if not, the problem (400
/// `invalid-input`, nothing written) naming the field at fault by its path
/// (`records[0].role`, an unknown key by its own name; `arguments` for a field missing at
/// the top). rmcp's own check would answer a protocol error with neither, which a model does
/// not read. An unknown tool passes: the router answers it. Arguments that are not a JSON
/// object are refused by rmcp before this (a protocol error).
fn shape(name: &str, args: Option<&rmcp::model::JsonObject>) -> Result<(), Problem> {
    /// Bytes of a field's path or of serde's reason kept: serde quotes a value of the wrong
    /// type whole, and the problem goes back twice (structured and as text).
    const KEPT: usize = 256;
    fn clip(mut s: String) -> String {
        if s.len() > KEPT {
            let mut end = KEPT;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            s.push('…');
        }
        s
    }
    fn check<T: serde::de::DeserializeOwned>(args: Option<&rmcp::model::JsonObject>) -> Result<(), Problem> {
        // A copy: the arguments are bounded by the request's body limit, and the router
        // takes them after this.
        let value = Value::Object(args.cloned().unwrap_or_default());
        serde_path_to_error::deserialize::<_, T>(value).map(drop).map_err(|e| {
            let path = e.path().to_string();
            let field = if path == "." {
                "arguments".to_string()
            } else {
                clip(path)
            };
            Problem::invalid(field, None, clip(e.inner().to_string()))
        })
    }
    match name {
        "list_sessions" => check::<ListSessionsArgs>(args),
        "read_context" => check::<SessionArgs>(args),
        "read_records" => check::<ReadRecordsArgs>(args),
        "append_records" => check::<AppendArgs>(args),
        "write_summary" => check::<SummaryArgs>(args),
        "search" => check::<SearchArgs>(args),
        "get_record" | "forget_record" => check::<RecordArgs>(args),
        _ => Ok(()),
    }
}

fn problem_error(p: Problem) -> ErrorData {
    let data = serde_json::to_value(&p).ok();
    match p.status {
        401 | 403 => ErrorData::invalid_request(p.detail, data),
        404 => ErrorData::resource_not_found(p.detail, data),
        400 => ErrorData::invalid_params(p.detail, data),
        _ => ErrorData::internal_error(p.detail, data),
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().enable_resources().build())
            .with_server_info(Implementation::new("ctxlog", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "A durable, append-only context log. A bot's sessions are conversations; `read_context` gives \
                 what to send a model, `append_records` adds to a session, `write_summary` replaces what a view \
                 held with a summary of it. Errors say in `written` whether anything may have landed.",
            )
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Err(p) = shape(&request.name, request.arguments.as_ref()) {
            return Ok(failed(&p, None).into());
        }
        self.tool_router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let grant = self.grant(&context.extensions).map_err(problem_error)?;
        let writes = grant.has(Right::Write);
        let tools: Vec<Tool> = self
            .tool_router
            .list_all()
            .into_iter()
            .filter(|t| writes || !WRITE_TOOLS.contains(&t.name.as_ref()))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_router.get(name).cloned()
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new(RESOURCE_TEMPLATE, "session")
                .with_description("A session's context view (its latest summary and the records it does not cover)")
                .with_mime_type("application/json"),
        ]))
    }

    /// The sessions of the bots the caller is granted by name (a pattern such as `team-*`
    /// names no bot to list; its sessions are reached through the template).
    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let grant = self.grant(&context.extensions).map_err(problem_error)?;
        let bots: Vec<&str> = grant.named_bots().collect();
        let mut at = match request.and_then(|r| r.cursor) {
            None => ResourceCursor { bot: 0, after: None },
            Some(c) => serde_json::from_str(&c)
                .map_err(|_| ErrorData::invalid_params("not a cursor this server gave out", None))?,
        };
        let mut resources = Vec::new();
        while let Some(bot) = bots.get(at.bot) {
            if !grant.allows(bot, Right::Read) {
                at = ResourceCursor {
                    bot: at.bot + 1,
                    after: None,
                };
                continue;
            }
            let q = SessionsQuery {
                after: at.after.take(),
                limit: Some(RESOURCES_PER_PAGE),
                at: None,
            };
            let page = routes::sessions_page(&self.replica, bot, &q)
                .await
                .map_err(problem_error)?;
            for s in &page.sessions {
                resources.push(
                    Resource::new(resource_uri(bot, &s.session_id), format!("{bot}/{}", s.session_id))
                        .with_description(format!(
                            "session `{}` of bot `{bot}`: {} live records",
                            s.session_id, s.records
                        ))
                        .with_mime_type("application/json"),
                );
            }
            at = match page.next {
                Some(next) => ResourceCursor {
                    bot: at.bot,
                    after: Some(next),
                },
                None => ResourceCursor {
                    bot: at.bot + 1,
                    after: None,
                },
            };
            if resources.len() >= RESOURCES_PER_PAGE {
                break;
            }
        }
        let mut result = ListResourcesResult::with_all_items(resources);
        if at.bot < bots.len() {
            result.next_cursor = Some(serde_json::to_string(&at).unwrap_or_default());
        }
        Ok(result)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let Some((bot, session)) = parse_resource_uri(&request.uri) else {
            return Err(ErrorData::resource_not_found(
                format!("not a ctxlog resource: {} (expected {RESOURCE_TEMPLATE})", request.uri),
                None,
            ));
        };
        let view = async {
            self.grant_for(&context.extensions, &bot, Right::Read)?;
            self.check_name("session_id", &session)?;
            routes::context_view(&self.replica, &bot, &session, None).await
        }
        .await
        .map_err(problem_error)?;
        let text = serde_json::to_string(&view).map_err(|e| ErrorData::internal_error(e.to_string(), None))?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(text, request.uri).with_mime_type("application/json"),
        ])
        .into())
    }
}

/// The `/mcp` endpoint: stateless (no session kept between calls; any replica answers any
/// call), plain JSON answers, bodies up to the server's limit, ended with the replica. Without
/// a tokens file (loopback only) the `Host` must be a loopback name, so that a web page whose
/// name resolves to 127.0.0.1 cannot drive it (DNS rebinding); with tokens, the token decides.
pub(crate) fn service(replica: &Arc<Replica>) -> StreamableHttpService<Tools, LocalSessionManager> {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(replica.options.max_body_bytes);
    if replica.tokens.required() {
        config = config.disable_allowed_hosts();
    }
    // Ended after the shutdown grace, not when shutdown begins: a call in flight finishes
    // and answers (its append may commit), while `during_shutdown` refuses new ones with a
    // typed problem. Ended at once, rmcp would answer a bare 500 to a write that may land.
    let cancel = config.cancellation_token.clone();
    let mut stop = replica.shutdown.clone();
    let grace = replica.options.shutdown_grace;
    tokio::spawn(async move {
        crate::stopped(&mut stop).await;
        tokio::time::sleep(grace).await;
        cancel.cancel();
    });
    let tools = Tools::over_http(replica.clone());
    StreamableHttpService::new(move || Ok(tools.clone()), Arc::default(), config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_uri_round_trips_any_name() {
        for (bot, session) in [("helpdesk", "t-1"), ("a/b", "c d%"), ("é", "?#&")] {
            let uri = resource_uri(bot, session);
            assert_eq!(
                parse_resource_uri(&uri),
                Some((bot.to_string(), session.to_string())),
                "{uri}"
            );
        }
        assert_eq!(parse_resource_uri("ctxlog://bots/a/sessions/b/c"), None);
        assert_eq!(parse_resource_uri("file:///etc/passwd"), None);
    }
}
