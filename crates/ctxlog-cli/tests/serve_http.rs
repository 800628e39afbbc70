//! `ctxlog serve` at the edge, on SQLite: tokens scoped by bot on every route, bad input of
//! every kind, a slow client, and responses checked against the server's own OpenAPI
//! document.

mod common;

use std::time::Duration;

use anyhow::{Context, ensure};
use common::{Http, Server, rec, tokens_file};
use hyper::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The problem types of a refused token, as the contract names them.
const UNAUTHORIZED: &str = "urn:ctxlog:problem:unauthorized";
const FORBIDDEN: &str = "urn:ctxlog:problem:forbidden";

/// Every test ends, whatever the server does.
async fn bounded<T>(f: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(Duration::from_secs(120), f)
        .await
        .context("the test missed its deadline")?
}

struct Fixture {
    _dir: tempfile::TempDir,
    server: Server,
    admin: Http,
    tokens: Vec<(String, String)>,
}

fn token_for(f: &Fixture, name: &str) -> String {
    f.tokens
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, t)| t.clone())
        .unwrap_or_default()
}

/// A SQLite store served with four tokens: `admin` (every bot, every right), `writer-a`
/// (bot `a`: read and write), `reader-a` (bot `a`: read) and `writer-b` (bot `b`: read and
/// write).
async fn fixture(extra: &[&str]) -> anyhow::Result<Fixture> {
    let dir = tempfile::tempdir()?;
    let mut tokens = Vec::new();
    let mut entries = Vec::new();
    for (name, bots, rights) in [
        ("admin", json!(["*"]), json!(["read", "write", "admin"])),
        ("writer-a", json!(["a"]), json!(["read", "write"])),
        ("reader-a", json!(["a"]), json!(["read"])),
        ("writer-b", json!(["b"]), json!(["read", "write"])),
    ] {
        let token = format!("token-of-{name}-{}", uuid_like());
        entries.push(
            json!({"name": name, "hash": format!("blake3:{}", blake3_hex(&token)), "bots": bots, "rights": rights}),
        );
        tokens.push((name.to_string(), token));
    }
    let path = tokens_file(dir.path(), &entries)?;
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let mut args = vec!["--tokens", path.to_str().context("utf-8 path")?];
    args.extend_from_slice(extra);
    let server = Server::start(&store, "edge", TIMEOUT, &args).await?;
    let admin = server.client().with_token(&tokens[0].1);
    Ok(Fixture {
        _dir: dir,
        server,
        admin,
        tokens,
    })
}

fn uuid_like() -> String {
    use std::hash::BuildHasher;
    // Randomly seeded per call: a fresh value, no clock needed.
    format!("{:x}", std::collections::hash_map::RandomState::new().hash_one(0u8))
}

/// The hash a tokens file holds, computed the way the server's `ctxlog token` does.
fn blake3_hex(token: &str) -> String {
    let out = std::process::Command::new(common::ctxlog_bin())
        .args(["token", "--name", "x", "--bots", "*"])
        .output()
        .expect("ctxlog token runs");
    // `ctxlog token` makes its own token; the hash function is checked against it once.
    let v: Value = serde_json::from_slice(&out.stdout).expect("ctxlog token prints JSON");
    let made = v["token"].as_str().expect("a token");
    let hash = v["entry"]["hash"]
        .as_str()
        .expect("a hash")
        .trim_start_matches("blake3:");
    assert_eq!(blake3::hash(made.as_bytes()).to_hex().as_str(), hash);
    blake3::hash(token.as_bytes()).to_hex().to_string()
}

/// Nothing of bot `b` and session `a/s` beyond what the test wrote itself.
async fn nothing_written(f: &Fixture, a_records: usize) -> anyhow::Result<()> {
    ensure!(
        f.admin.session("b", "s").await?.is_empty(),
        "something was written to bot b"
    );
    let a = f.admin.session("a", "s").await?;
    ensure!(
        a.len() == a_records,
        "bot a holds {} records, expected {a_records}",
        a.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_scope_every_route_by_bot_and_right() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let mut anon = f.server.client();
        // A watch that is not refused answers with a stream that never ends: its deadline
        // is the failure.
        anon.deadline = TIMEOUT;
        let wrong = anon.with_token("not-a-token");
        let writer = anon.with_token(&token_for(&f, "writer-a"));
        let reader = anon.with_token(&token_for(&f, "reader-a"));
        ensure!(writer.append("a", "s", &[rec("a-1", "x")]).await?.status == StatusCode::OK);
        ensure!(f.admin.append("b", "s2", &[rec("b-1", "secret of b")]).await?.status == StatusCode::OK);
        let routes: Vec<(Method, String, Value)> = vec![
            (
                Method::POST,
                "/v1/bots/b/sessions/s/records".into(),
                json!({"records": [rec("x-1", "x")]}),
            ),
            (
                Method::POST,
                "/v1/bots/b/records".into(),
                json!({"records": [{"id": "x-2", "role": "u", "session_id": "s"}]}),
            ),
            (Method::GET, "/v1/bots/b/sessions/s2/records".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions/s2/records?last=1".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions/none/records".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions/s2/context".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions/s2/watch".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions/none/watch".into(), Value::Null),
            (Method::GET, "/v1/bots/b/records/b-1".into(), Value::Null),
            (Method::GET, "/v1/bots/b/records/missing".into(), Value::Null),
            (Method::DELETE, "/v1/bots/b/records/b-1".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions".into(), Value::Null),
            (Method::POST, "/v1/bots/b/search".into(), json!({"query": "secret"})),
            (
                Method::POST,
                "/v1/bots/b/search".into(),
                json!({"query": "\"not closed"}),
            ),
            (Method::GET, "/v1/conflicts".into(), Value::Null),
            (Method::GET, "/v1/stats".into(), Value::Null),
            (Method::GET, "/v1/shards".into(), Value::Null),
            (Method::GET, "/v1/watch".into(), Value::Null),
            (Method::POST, "/v1/admin/compact".into(), Value::Null),
            (Method::GET, "/metrics".into(), Value::Null),
        ];
        let send = |client: &Http, m: &Method, path: &str, body: &Value| {
            let (client, m, path) = (client.clone(), m.clone(), path.to_string());
            let body = if body.is_null() {
                Vec::new()
            } else {
                serde_json::to_vec(body).unwrap_or_default()
            };
            async move { client.raw(m, &path, body).await }
        };
        for (m, path, body) in &routes {
            for (who, client, status, kind) in [
                ("no token", &anon, StatusCode::UNAUTHORIZED, UNAUTHORIZED),
                ("a wrong token", &wrong, StatusCode::UNAUTHORIZED, UNAUTHORIZED),
                ("bot a's writer", &writer, StatusCode::FORBIDDEN, FORBIDDEN),
                ("bot a's reader", &reader, StatusCode::FORBIDDEN, FORBIDDEN),
            ] {
                let answer = send(client, m, path, body).await?;
                ensure!(
                    answer.status == status && answer.json["type"] == kind,
                    "{who}: {m} {path}: {} {}",
                    answer.status,
                    answer.text
                );
                ensure!(
                    answer.content_type.starts_with("application/problem+json"),
                    "{who}: {m} {path}"
                );
                // The answer is the same whether or not the session or record exists: nothing
                // about bot b leaks.
                ensure!(
                    !answer.text.contains("secret") && !answer.text.contains("s2"),
                    "{who}: {}",
                    answer.text
                );
            }
        }
        // Existing and missing places of bot b get byte-identical refusals.
        let one = writer.get("/v1/bots/b/records/b-1").await?.text;
        let other = writer.get("/v1/bots/b/records/missing").await?.text;
        ensure!(one == other, "{one} vs {other}");
        // A read token cannot write its own bot; the writer can.
        let answer = reader.append("a", "s", &[rec("a-2", "x")]).await?;
        ensure!(answer.status == StatusCode::FORBIDDEN, "{}", answer.text);
        ensure!(reader.get("/v1/bots/a/sessions/s/records").await?.status == StatusCode::OK);
        nothing_written(&f, 1).await?;
        ensure!(
            f.admin.session("b", "s2").await?.len() == 1,
            "bot b's record was touched"
        );
        Ok(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_the_server_keeps_serving() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--max-body-bytes", "1048576", "--header-timeout", "1"]).await?;
        let c = f.admin.clone();
        let path = "/v1/bots/a/sessions/s/records";
        let problem = |a: &common::Answer, status: StatusCode, kind: &str| -> anyhow::Result<()> {
            ensure!(a.status == status && a.json["type"] == kind, "{} {}", a.status, a.text);
            ensure!(a.content_type.starts_with("application/problem+json"));
            ensure!(a.json["written"] == "nothing", "{}", a.text);
            Ok(())
        };
        problem(
            &c.raw(Method::POST, path, b"{not json".to_vec()).await?,
            StatusCode::BAD_REQUEST,
            "urn:ctxlog:problem:malformed-request",
        )?;
        problem(
            &c.raw(Method::POST, path, vec![b'{', 0xff, 0xfe, b'}']).await?,
            StatusCode::BAD_REQUEST,
            "urn:ctxlog:problem:malformed-request",
        )?;
        problem(
            &c.post(
                path,
                &json!({"records": [{"id": "x", "role": "user", "colour": "red"}]}),
            )
            .await?,
            StatusCode::BAD_REQUEST,
            "urn:ctxlog:problem:malformed-request",
        )?;
        let big = vec![b'x'; 2 << 20];
        problem(
            &c.raw(Method::POST, path, big).await?,
            StatusCode::PAYLOAD_TOO_LARGE,
            "urn:ctxlog:problem:too-large",
        )?;
        let many: Vec<Value> = (0..10_001)
            .map(|i| json!({"id": format!("m{i}"), "role": "u"}))
            .collect();
        let a = c.post(path, &json!({ "records": many })).await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        ensure!(a.json["field"] == "records", "{}", a.text);
        let long = "i".repeat(513);
        let a = c.append("a", "s", &[rec("ok-1", "x"), rec(&long, "x")]).await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        ensure!(a.json["field"] == "id" && a.json["record"] == 1, "{}", a.text);
        let a = c
            .append("a", "s", &[json!({"id": "b64", "role": "u", "bytes_b64": "***"})])
            .await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        let a = c.get("/v1/bots/a/sessions/s/records?after=bm9wZQ").await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        let a = c.get("/v1/bots/a/sessions/s/records?limit=0").await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        let a = c.get("/v1/bots/a/sessions/s/records?last=2&limit=5").await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        ensure!(a.json["field"] == "last", "{}", a.text);
        let a = c.get("/v1/bots/a/sessions/s/records?last=0").await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        // A record naming another session than its route's, and a bot-wide append with a
        // record that names none: refused whole, with the record at fault.
        let mut other = rec("ok-2", "x");
        other["session_id"] = json!("elsewhere");
        let a = c.append("a", "s", &[rec("ok-3", "x"), other]).await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        ensure!(a.json["field"] == "session_id" && a.json["record"] == 1, "{}", a.text);
        let mut named = rec("ok-4", "x");
        named["session_id"] = json!("s");
        let a = c
            .post("/v1/bots/a/records", &json!({"records": [named, rec("ok-5", "x")]}))
            .await?;
        problem(&a, StatusCode::BAD_REQUEST, "urn:ctxlog:problem:invalid-input")?;
        ensure!(a.json["field"] == "session_id" && a.json["record"] == 1, "{}", a.text);
        // A client that sends its headers a byte at a time is cut off at the header timeout.
        let mut slow = tokio::net::TcpStream::connect(&f.server.addr).await?;
        let started = std::time::Instant::now();
        let mut closed = false;
        for b in b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-slow: ".iter().cycle().take(400) {
            if slow.write_all(&[*b]).await.is_err() {
                closed = true;
                break;
            }
            let mut one = [0u8; 512];
            match tokio::time::timeout(Duration::from_millis(20), slow.read(&mut one)).await {
                Ok(Ok(0)) | Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                Ok(Ok(_)) => {
                    // An answer before the headers were complete: the timeout's 408.
                    closed = true;
                    break;
                }
                Err(_) => {}
            }
        }
        ensure!(
            closed,
            "a client sending headers byte by byte kept its connection for {:?}",
            started.elapsed()
        );
        ensure!(
            started.elapsed() < Duration::from_secs(6),
            "cut off only after {:?}",
            started.elapsed()
        );
        // Still serving, and nothing was written.
        ensure!(c.get("/healthz").await?.status == StatusCode::OK);
        nothing_written(&f, 0).await?;
        ensure!(c.append("a", "s", &[rec("fine", "x")]).await?.status == StatusCode::OK);
        Ok(())
    })
    .await
}

/// Where the validator finds the document.
const DOCUMENT_URL: &str = "file:///ctxlog/openapi.json";

/// `s` as one token of a JSON pointer.
fn pointer_token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Closes every object schema that names its properties to any other: a response field the
/// document does not name is an undocumented part of the API, and fails the check.
fn closed(schema: &mut Value) {
    match schema {
        Value::Object(o) => {
            if o.contains_key("properties") && !o.contains_key("additionalProperties") {
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            o.values_mut().for_each(closed);
        }
        Value::Array(a) => a.iter_mut().for_each(closed),
        _ => {}
    }
}

/// Real responses checked against the OpenAPI document by a JSON Schema (2020-12) validator
/// (`boon`, which knows every keyword of the draft): status, media type and body.
struct Responses {
    doc: Value,
    compiler: boon::Compiler,
    schemas: boon::Schemas,
    /// The operations checked, as `(method, path)`.
    checked: std::collections::BTreeSet<(String, String)>,
}

impl Responses {
    fn new(doc: &Value) -> anyhow::Result<Responses> {
        let mut closed_doc = doc.clone();
        closed(&mut closed_doc);
        let mut compiler = boon::Compiler::new();
        compiler.set_default_draft(boon::Draft::V2020_12);
        compiler.enable_format_assertions();
        compiler
            .add_resource(DOCUMENT_URL, closed_doc)
            .map_err(|e| anyhow::anyhow!("{e:#}"))?;
        Ok(Responses {
            doc: doc.clone(),
            compiler,
            schemas: boon::Schemas::new(),
            checked: Default::default(),
        })
    }

    /// `answer` is a response the document gives `method path`: its status, its media type,
    /// and a body the media type's schema accepts.
    fn check(&mut self, method: &str, path: &str, answer: &common::Answer) -> anyhow::Result<()> {
        let status = answer.status.as_u16().to_string();
        let response = &self.doc["paths"][path][method]["responses"][&status];
        ensure!(
            response.is_object(),
            "{method} {path}: status {status} is not documented ({})",
            answer.text
        );
        let media = answer.content_type.split(';').next().unwrap_or_default().trim();
        ensure!(
            response["content"][media].is_object(),
            "{method} {path} {status}: the media type `{media}` is not documented (the document has {})",
            response["content"]
        );
        let at = format!(
            "{DOCUMENT_URL}#/paths/{}/{method}/responses/{status}/content/{}/schema",
            pointer_token(path),
            pointer_token(media)
        );
        let schema = self
            .compiler
            .compile(&at, &mut self.schemas)
            .map_err(|e| anyhow::anyhow!("{at}: {e:#}"))?;
        let body = if media.ends_with("json") {
            answer.json.clone()
        } else {
            Value::String(answer.text.clone())
        };
        if let Err(e) = self.schemas.validate(&body, schema) {
            anyhow::bail!("{method} {path} {status}: {e:#}\nthe body: {}", answer.text);
        }
        self.checked.insert((method.to_string(), path.to_string()));
        Ok(())
    }
}

/// Every documented operation, as `(method, path)`.
fn operations(doc: &Value) -> anyhow::Result<std::collections::BTreeSet<(String, String)>> {
    let mut out = std::collections::BTreeSet::new();
    for (path, item) in doc["paths"].as_object().context("the document has paths")? {
        for method in item.as_object().context("a path item")?.keys() {
            out.insert((method.clone(), path.clone()));
        }
    }
    Ok(out)
}

/// What the server serves is the document checked in beside the server crate, and every
/// response of every documented operation, errors too, is one the document describes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_fit_the_openapi_document() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let c = f.admin.clone();
        let served = c.get("/openapi.json").await?;
        ensure!(
            served.text == ctxlog_server::routes::DOCUMENT,
            "/openapi.json is not the checked-in document"
        );
        let doc: Value = serde_json::from_str(ctxlog_server::routes::DOCUMENT)?;
        let mut responses = Responses::new(&doc)?;
        responses.check("get", "/openapi.json", &served)?;
        let ack = c
            .append(
                "a",
                "s",
                &[
                    rec("d-1", "x"),
                    json!({"id": "d-2", "role": "tool", "bytes_b64": "AAE=", "metadata": {"k": 1}}),
                ],
            )
            .await?;
        let mut in_s = rec("d-3", "x");
        in_s["session_id"] = json!("s");
        let mut in_t = rec("d-4", "x");
        in_t["session_id"] = json!("t");
        let bot_wide = c.post("/v1/bots/a/records", &json!({"records": [in_s, in_t]})).await?;
        ensure!(bot_wide.status == StatusCode::OK, "{}", bot_wide.text);
        // The newest of `s` (the bot-wide append's record), and that older ones precede it.
        let last = c.get("/v1/bots/a/sessions/s/records?last=1").await?;
        ensure!(
            last.json["records"][0]["id"] == "d-3" && last.json["has_more"] == true,
            "{}",
            last.text
        );
        let t = c.get("/v1/bots/a/sessions/t/records").await?;
        ensure!(t.json["records"][0]["id"] == "d-4", "{}", t.text);
        let context = c.get("/v1/bots/a/sessions/s/context").await?;
        let summary = json!({"id": "d-5", "role": "summary", "text": "all of it", "kind": "summary",
                             "covers": context.json["covers"]});
        let summarised = c.append("a", "s", &[summary]).await?;
        ensure!(summarised.status == StatusCode::OK, "{}", summarised.text);
        let bad_covers = c
            .append(
                "a",
                "s",
                &[json!({"id": "d-6", "role": "summary", "text": "x", "kind": "summary"})],
            )
            .await?;
        ensure!(bad_covers.json["field"] == "covers", "{}", bad_covers.text);
        let calls: Vec<(&str, &str, common::Answer)> = vec![
            ("/v1/bots/{bot}/sessions/{session}/records", "post", ack),
            ("/v1/bots/{bot}/records", "post", bot_wide),
            ("/v1/bots/{bot}/sessions/{session}/records", "post", summarised),
            ("/v1/bots/{bot}/sessions/{session}/records", "post", bad_covers),
            ("/v1/bots/{bot}/sessions/{session}/context", "get", context),
            (
                "/v1/bots/{bot}/sessions/{session}/context",
                "get",
                c.get("/v1/bots/a/sessions/s/context").await?,
            ),
            ("/v1/bots/{bot}/sessions/{session}/records", "get", last),
            (
                "/v1/bots/{bot}/sessions/{session}/records",
                "get",
                c.get("/v1/bots/a/sessions/s/records?limit=1").await?,
            ),
            (
                "/v1/bots/{bot}/records/{id}",
                "get",
                c.get("/v1/bots/a/records/d-2").await?,
            ),
            (
                "/v1/bots/{bot}/records/{id}",
                "get",
                c.get("/v1/bots/a/records/nope").await?,
            ),
            (
                "/v1/bots/{bot}/sessions/{session}/fork",
                "post",
                c.post("/v1/bots/a/sessions/f/fork", &json!({"from": "s", "through": "d-3"}))
                    .await?,
            ),
            (
                "/v1/bots/{bot}/sessions/{session}/fork",
                "post",
                c.post("/v1/bots/a/sessions/f/fork", &json!({"from": "s", "through": "nope"}))
                    .await?,
            ),
            ("/v1/bots/{bot}/sessions", "get", c.get("/v1/bots/a/sessions").await?),
            (
                "/v1/bots/{bot}/search",
                "post",
                c.post("/v1/bots/a/search", &json!({"query": "x", "k": 1})).await?,
            ),
            (
                "/v1/bots/{bot}/search",
                "post",
                c.post("/v1/bots/a/search", &json!({"query": "x", "k": 0})).await?,
            ),
            ("/v1/conflicts", "get", c.get("/v1/conflicts").await?),
            ("/v1/stats", "get", c.get("/v1/stats").await?),
            ("/v1/shards", "get", c.get("/v1/shards").await?),
            (
                "/v1/admin/{op}",
                "post",
                c.post("/v1/admin/compact", &Value::Null).await?,
            ),
            ("/v1/admin/{op}", "post", c.post("/v1/admin/retain", &json!({})).await?),
            (
                "/v1/bots/{bot}/records/{id}",
                "delete",
                c.delete("/v1/bots/a/records/d-1").await?,
            ),
            ("/readyz", "get", c.get("/readyz").await?),
            ("/healthz", "get", c.get("/healthz").await?),
            ("/metrics", "get", c.get("/metrics").await?),
            // A stream's events are the watch tests' subject; here, its refusal.
            (
                "/v1/bots/{bot}/sessions/{session}/watch",
                "get",
                c.get("/v1/bots/a/sessions/s/watch?after=nope").await?,
            ),
            ("/v1/watch", "get", c.get("/v1/watch?after=nope").await?),
        ];
        for (path, method, answer) in calls {
            responses.check(method, path, &answer)?;
        }
        let missed: Vec<_> = operations(&doc)?.difference(&responses.checked).cloned().collect();
        ensure!(missed.is_empty(), "no response of {missed:?} was checked");
        Ok(())
    })
    .await
}

/// A search that scores past `--search-timeout` answers a typed timeout (504 `timeout`,
/// nothing written), never a partial list. One record holding a word 200,000 times: a
/// phrase of it costs 400,000 position checks (scored, then matched), far above the 1 ms
/// given; without the deadline it answers 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_search_past_its_deadline_is_a_typed_timeout() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--search-timeout", "0.001"]).await?;
        let a = f.server.client().with_token(&token_for(&f, "writer-a"));
        let long = vec!["a"; 200_000].join(" ");
        ensure!(a.append("a", "s", &[rec("long", &long)]).await?.status == StatusCode::OK);
        let slow = a.post("/v1/bots/a/search", &json!({"query": "\"a a\""})).await?;
        ensure!(
            slow.status == StatusCode::GATEWAY_TIMEOUT
                && slow.json["type"] == "urn:ctxlog:problem:timeout"
                && slow.json["written"] == "nothing",
            "{} {} {}",
            slow.status,
            slow.json["type"],
            slow.json["hits"].as_array().map_or(0, Vec::len)
        );
        Ok(())
    })
    .await
}

/// Rule 26 over HTTP: a search sees every acknowledged record of its bot and nothing of
/// another bot's (not even in its scores), ranks as BM25 says (the order below is reasoned
/// by hand), pages on with `next`, and never returns a tombstoned record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_ranks_a_bots_live_records_and_nothing_else() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let a = f.server.client().with_token(&token_for(&f, "writer-a"));
        let b = f.server.client().with_token(&token_for(&f, "writer-b"));
        let search = |c: &Http, bot: &str, body: Value| {
            let (c, path) = (c.clone(), format!("/v1/bots/{bot}/search"));
            async move { c.post(&path, &body).await }
        };
        let ids = |answer: &common::Answer| -> Vec<String> {
            answer.json["hits"]
                .as_array()
                .map(|h| {
                    h.iter()
                        .map(|h| h["record"]["id"].as_str().unwrap_or("").to_string())
                        .collect()
                })
                .unwrap_or_default()
        };
        ensure!(
            a.append("a", "s", &[rec("a-long", "refund my order please now thanks")])
                .await?
                .status
                == StatusCode::OK
        );
        ensure!(
            a.append("a", "t", &[rec("a-short", "Refund order"), rec("a-none", "weather")])
                .await?
                .status
                == StatusCode::OK
        );
        let alone = search(&a, "a", json!({"query": "refund"})).await?;
        ensure!(ids(&alone) == ["a-short", "a-long"], "{}", alone.text);
        ensure!(alone.json["hits"][0]["snippet"] == "Refund order", "{}", alone.text);
        ensure!(alone.json["hits"][0]["matched"] == json!(["refund"]), "{}", alone.text);
        // Bot b's records with the same word: not returned to a, and a's scores unmoved.
        ensure!(
            b.append("b", "s", &[rec("b-1", "refund refund"), rec("b-2", "refund")])
                .await?
                .status
                == StatusCode::OK
        );
        let again = search(&a, "a", json!({"query": "refund"})).await?;
        ensure!(
            again.json["hits"] == alone.json["hits"],
            "{} vs {}",
            again.text,
            alone.text
        );
        ensure!(ids(&search(&b, "b", json!({"query": "refund"})).await?) == ["b-1", "b-2"]);
        // Filters, pages, and a tombstone.
        let t_only = search(&a, "a", json!({"query": "refund", "session": "t"})).await?;
        ensure!(ids(&t_only) == ["a-short"], "{}", t_only.text);
        let first = search(&a, "a", json!({"query": "refund order", "k": 1})).await?;
        let next = first.json["next"].as_str().context("a next page")?.to_string();
        let second = search(&a, "a", json!({"query": "refund order", "k": 1, "after": next})).await?;
        ensure!(
            ids(&first) == ["a-short"] && ids(&second) == ["a-long"],
            "{} {}",
            first.text,
            second.text
        );
        ensure!(second.json.get("next").is_none(), "{}", second.text);
        // A cursor continues its own search only: not another query, filter or bot (a page
        // of one list is not a page of another), whatever the page size.
        let wider = search(&a, "a", json!({"query": "refund order", "k": 5, "after": next})).await?;
        ensure!(ids(&wider) == ["a-long"], "{}", wider.text);
        for (c, bot, body) in [
            (&a, "a", json!({"query": "refund", "after": next})),
            (&a, "a", json!({"query": "refund order", "session": "s", "after": next})),
            (&b, "b", json!({"query": "refund order", "after": next})),
        ] {
            let refused = search(c, bot, body).await?;
            ensure!(
                refused.status == StatusCode::BAD_REQUEST && refused.json["field"] == "after",
                "{}",
                refused.text
            );
        }
        ensure!(a.delete("/v1/bots/a/records/a-short").await?.status == StatusCode::OK);
        let after_delete = search(&a, "a", json!({"query": "refund"})).await?;
        ensure!(ids(&after_delete) == ["a-long"], "{}", after_delete.text);
        // Rule 27: an embedding of a-long, a vector search, a hybrid's cursor bound to its
        // vector, and another bot's token refused.
        let emb = |v: Value| json!({"id": "a-long", "kind": "embedding", "model": "m", "metric": "dot", "vector": v});
        ensure!(a.append("a", "s", &[emb(json!([1.0, 2.0]))]).await?.status == StatusCode::OK);
        let near = search(&a, "a", json!({"vector": [1.0, 0.0], "model": "m"})).await?;
        ensure!(
            ids(&near) == ["a-long"] && near.json["hits"][0]["score"] == 1.0,
            "{}",
            near.text
        );
        ensure!(a.append("a", "t", &[rec("a-other", "refund")]).await?.status == StatusCode::OK);
        let hybrid = json!({"query": "refund", "vector": [1.0, 0.0], "model": "m", "k": 1});
        let first = search(&a, "a", hybrid.clone()).await?;
        let next = first.json["next"].as_str().context("a hybrid's next page")?.to_string();
        let mut moved = hybrid.clone();
        moved["vector"] = json!([1.0, 0.5]);
        moved["after"] = json!(next);
        let refused = search(&a, "a", moved).await?;
        ensure!(refused.json["field"] == "after", "{}", refused.text);
        let foreign = search(&b, "a", json!({"vector": [1.0, 0.0], "model": "m"})).await?;
        ensure!(foreign.status == StatusCode::FORBIDDEN, "{}", foreign.text);
        let with_role = a
            .append("a", "s", &[json!({"id": "a-long", "kind": "embedding", "role": "user", "model": "m", "metric": "dot", "vector": [1.0]})])
            .await?;
        ensure!(with_role.json["field"] == "role", "{}", with_role.text);
        let bad_model = a
            .append("a", "s", &[json!({"id": "a-long", "kind": "embedding", "model": "mini lm", "metric": "dot", "vector": [1.0]})])
            .await?;
        ensure!(
            bad_model.json["field"] == "model" && bad_model.json["written"] == "nothing",
            "{}",
            bad_model.text
        );
        for (body, field) in [
            (json!({}), "query"),
            (json!({"vector": [1.0]}), "model"),
            (json!({"model": "m"}), "vector"),
            (json!({"vector": [], "model": "m"}), "vector"),
            (json!({"vector": [1.0, 2.0, 3.0], "model": "m"}), "vector"),
            (json!({"vector": [1.0], "model": "no spaces"}), "model"),
            (json!({"query": "refund", "k": 101}), "k"),
            (json!({"query": "  "}), "query"),
            (json!({"query": "x", "since": "yesterday"}), "since"),
            (json!({"query": "x", "roles": (0..17).map(|i| format!("r{i}")).collect::<Vec<_>>()}), "roles"),
            (json!({"query": "x", "roles": ["user", ""]}), "roles"),
            (json!({"query": "x", "session": "s".repeat(1_000)}), "session"),
            (json!({"query": "x", "after": "bm9wZQ"}), "after"),
            (
                json!({"query": "x", "metadata": (0..17).map(|i| (format!("k{i}"), json!(i))).collect::<serde_json::Map<_, _>>()}),
                "metadata",
            ),
        ] {
            let refused = search(&a, "a", body).await?;
            ensure!(
                refused.status == StatusCode::BAD_REQUEST && refused.json["field"] == field,
                "{field}: {}",
                refused.text
            );
        }
        // A search asks, it writes nothing: its body is small (128 KiB: a vector of 4,096
        // dimensions fits), whatever a write may send.
        let big = search(&a, "a", json!({"query": "x", "metadata": {"k": "v".repeat(140_000)}})).await?;
        ensure!(big.status == StatusCode::PAYLOAD_TOO_LARGE, "{}", big.text);
        Ok(())
    })
    .await
}

/// The router serves exactly the documented methods of each documented path: each is routed
/// (a token-less request is refused by the route, 401, or answered), every other is 405.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_serves_the_documented_methods_and_no_other() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let anon = f.server.client();
        let doc: Value = serde_json::from_str(ctxlog_server::routes::DOCUMENT)?;
        let documented = operations(&doc)?;
        let paths: std::collections::BTreeSet<&String> = documented.iter().map(|(_, p)| p).collect();
        for path in paths {
            let concrete = ["{bot}", "{session}", "{id}", "{op}"]
                .iter()
                .fold(path.clone(), |p, param| p.replace(param, "x"));
            ensure!(!concrete.contains('{'), "{path}: a parameter this test does not fill");
            for method in [Method::GET, Method::POST, Method::PUT, Method::PATCH, Method::DELETE] {
                let name = method.as_str().to_ascii_lowercase();
                let answer = anon.raw(method, &concrete, Vec::new()).await?;
                if documented.contains(&(name.clone(), path.clone())) {
                    ensure!(
                        answer.status != StatusCode::METHOD_NOT_ALLOWED && answer.status != StatusCode::NOT_FOUND,
                        "{name} {path} is documented, and the router answers {} {}",
                        answer.status,
                        answer.text
                    );
                } else {
                    ensure!(
                        answer.status == StatusCode::METHOD_NOT_ALLOWED,
                        "{name} {path} is not documented, and the router answers {} {}",
                        answer.status,
                        answer.text
                    );
                }
            }
        }
        nothing_written(&f, 0).await
    })
    .await
}

/// Without a tokens file the server refuses any address but loopback, before it opens the
/// store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_only_loopback() -> anyhow::Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let store = format!("sqlite:{}", dir.path().join("s.db").display());
        let out = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new(common::ctxlog_bin())
                .args(["--store", &store, "serve", "--writer", "w", "--listen", "0.0.0.0:0"])
                .output(),
        )
        .await
        .context("ctxlog serve did not exit")??;
        ensure!(out.status.code() == Some(2), "{:?}", out.status);
        ensure!(String::from_utf8_lossy(&out.stderr).contains("loopback"));
        ensure!(!dir.path().join("s.db").exists(), "the store was created");
        Ok(())
    })
    .await
}

/// Rule 23 over HTTP, as a hostile tenant would try it: a token for bot `b` tombstones,
/// squats and probes ids that bot `a` holds — through every write route (a session append
/// of a tombstone, a bot-wide append, DELETE) — and changes, hides, pre-empts and learns
/// nothing of `a`'s records; a purge erases `b`'s bytes only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_for_one_bot_cannot_touch_another_bots_records() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let a = f.server.client().with_token(&token_for(&f, "writer-a"));
        let b = f.server.client().with_token(&token_for(&f, "writer-b"));
        // B writes m3 first; A writes m1, m2, m3 after it.
        ensure!(b.append("b", "t", &[rec("m3", "b's m3")]).await?.status == StatusCode::OK);
        let wrote = a
            .append(
                "a",
                "s",
                &[rec("m1", "a's m1"), rec("m2", "a's m2"), rec("m3", "a's m3")],
            )
            .await?;
        ensure!(wrote.status == StatusCode::OK, "{}", wrote.text);
        // B tombstones A's ids in its own session, bot-wide, and by DELETE.
        let tomb = b
            .append("b", "t", &[json!({"id": "m2", "role": "user", "kind": "tombstone"})])
            .await?;
        ensure!(tomb.status == StatusCode::OK, "{}", tomb.text);
        let wide = b
            .post(
                "/v1/bots/b/records",
                &json!({"records": [{"id": "m1", "session_id": "t", "role": "user", "kind": "tombstone"},
                                    {"id": "m9", "session_id": "t", "role": "user", "text": "b's m9"}]}),
            )
            .await?;
        ensure!(wide.status == StatusCode::OK, "{}", wide.text);
        let deleted = b.delete("/v1/bots/b/records/m1").await?;
        ensure!(
            deleted.status == StatusCode::NOT_FOUND,
            "b has no live m1: {}",
            deleted.text
        );
        // Probing: B's answer for an id A holds is the answer for an id nobody holds.
        let held = b.get("/v1/bots/b/records/m2").await?;
        let unheld = b.get("/v1/bots/b/records/never-written").await?;
        ensure!(
            held.status == StatusCode::NOT_FOUND && unheld.status == StatusCode::NOT_FOUND,
            "{} / {}",
            held.status,
            unheld.status
        );
        let probe = b.append("b", "t", &[rec("m1", "b's m1")]).await?;
        ensure!(probe.status == StatusCode::OK, "{}", probe.text);
        let m1 = b.get("/v1/bots/b/records/m1").await?;
        ensure!(
            m1.status == StatusCode::NOT_FOUND,
            "b's own m1 is tombstoned (by b), whatever a holds: {}",
            m1.text
        );
        let m3 = b.get("/v1/bots/b/records/m3").await?;
        ensure!(m3.json["text"] == "b's m3", "{}", m3.text);
        // A's records are all there, with A's content.
        for id in ["m1", "m2", "m3"] {
            let got = a.get(&format!("/v1/bots/a/records/{id}")).await?;
            ensure!(got.status == StatusCode::OK, "a's {id}: {}", got.text);
            ensure!(got.json["text"] == format!("a's {id}"), "a's {id}: {}", got.text);
        }
        let ids: Vec<String> = a
            .session("a", "s")
            .await?
            .iter()
            .map(|r| r["id"].as_str().unwrap_or_default().to_string())
            .collect();
        ensure!(ids == ["m1", "m2", "m3"], "a's session: {ids:?}");
        // B cannot even ask about A.
        ensure!(b.get("/v1/bots/a/records/m1").await?.status == StatusCode::FORBIDDEN);
        // Nothing of A's is a conflict; a purge erases B's tombstoned ids only.
        let conflicts = f.admin.get("/v1/conflicts").await?;
        let of_a: Vec<&Value> = conflicts.json["conflicts"]
            .as_array()
            .context("a conflict list")?
            .iter()
            .filter(|c| c["bot_id"] != "b")
            .collect();
        ensure!(of_a.is_empty(), "conflicts not of b: {of_a:?}");
        ensure!(f.admin.post("/v1/admin/purge", &json!({})).await?.status == StatusCode::OK);
        let m2 = a.get("/v1/bots/a/records/m2").await?;
        ensure!(m2.json["text"] == "a's m2", "a's m2 after a purge: {}", m2.text);
        Ok(())
    })
    .await
}

/// One HTTP/1.1 response read off a raw socket: status, head, and body as JSON (`Null`
/// when it is not JSON).
struct RawAnswer {
    status: u16,
    head: String,
    json: Value,
}

impl RawAnswer {
    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    fn is_problem(&self, status: u16, kind: &str) -> anyhow::Result<()> {
        ensure!(
            self.status == status && self.json["type"] == kind,
            "expected {status} {kind}: {} {}",
            self.head,
            self.json
        );
        ensure!(
            self.header("content-type") == Some("application/problem+json"),
            "{}",
            self.head
        );
        Ok(())
    }
}

/// Read one response (a `100 Continue` counts as one) from `s` within `within`.
async fn read_answer(s: &mut (impl tokio::io::AsyncRead + Unpin), within: Duration) -> anyhow::Result<RawAnswer> {
    let read = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        let end = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let n = s.read(&mut chunk).await?;
            ensure!(n > 0, "the connection closed before an answer");
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_string();
        let status: u16 = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("a status line")?;
        let mut answer = RawAnswer {
            status,
            head,
            json: Value::Null,
        };
        let length: usize = answer
            .header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let mut body = buf[end..].to_vec();
        while body.len() < length {
            let n = s.read(&mut chunk).await?;
            ensure!(n > 0, "the connection closed inside a body");
            body.extend_from_slice(&chunk[..n]);
        }
        answer.json = serde_json::from_slice(&body[..length.min(body.len())]).unwrap_or(Value::Null);
        anyhow::Ok(answer)
    };
    tokio::time::timeout(within, read)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within {within:?}"))?
}

/// Send `head` (a request's head, without the blank line that ends it) on a new connection
/// to `f`'s server, then `body`.
async fn send_raw(f: &Fixture, head: &str, body: &[u8]) -> anyhow::Result<tokio::net::TcpStream> {
    let mut s = tokio::net::TcpStream::connect(&f.server.addr).await?;
    s.write_all(format!("{head}\r\n\r\n").as_bytes()).await?;
    s.write_all(body).await?;
    Ok(s)
}

/// Whether the server has closed `s` (a read finds its end), waiting at most `within`.
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut one = [0u8; 256];
    let until_end = async {
        loop {
            match s.read(&mut one).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(within, until_end).await.is_ok()
}

/// An append body of about `bytes` bytes, for bot `a`, session `s`.
fn sized_append(id: &str, bytes: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({"records": [rec(id, &"x".repeat(bytes))]})).unwrap_or_default()
}

/// A token-less or ungranted upload is refused from its headers: the server answers without
/// starting to read the body (no `100 Continue` first), so it never holds one in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_are_refused_before_their_body_without_a_grant() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--max-body-bytes", "4194304", "--header-timeout", "2"]).await?;
        let head = "POST /v1/bots/b/sessions/s/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nexpect: 100-continue\r\ncontent-length: 4000000";
        let mut anon = send_raw(&f, head, b"").await?;
        read_answer(&mut anon, Duration::from_secs(20))
            .await?
            .is_problem(401, "urn:ctxlog:problem:unauthorized")?;
        let writer = token_for(&f, "writer-a");
        let mut other_bot = send_raw(&f, &format!("{head}\r\nauthorization: Bearer {writer}"), b"").await?;
        read_answer(&mut other_bot, Duration::from_secs(20))
            .await?
            .is_problem(403, "urn:ctxlog:problem:forbidden")?;
        let mut not_admin = send_raw(
            &f,
            &format!("{head}\r\nauthorization: Bearer {writer}").replace("/v1/bots/b/sessions/s/records", "/v1/admin/gc"),
            b"",
        )
        .await?;
        read_answer(&mut not_admin, Duration::from_secs(20))
            .await?
            .is_problem(403, "urn:ctxlog:problem:forbidden")?;
        nothing_written(&f, 0).await
    })
    .await
}

/// Bodies in flight share one budget of bytes: beyond it an upload waits, and is refused
/// (503 `busy`, nothing written) when no room frees up within the header timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_in_flight_share_one_budget() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[
            "--max-body-bytes",
            "1048576",
            "--max-body-bytes-in-flight",
            "1048576",
            "--header-timeout",
            "3",
        ])
        .await?;
        let writer = f.server.client().with_token(&token_for(&f, "writer-a"));
        let first = sized_append("big-1", 700_000);
        let head = format!(
            "POST /v1/bots/a/sessions/s/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             expect: 100-continue\r\nauthorization: Bearer {}\r\ncontent-length: {}",
            token_for(&f, "writer-a"),
            first.len()
        );
        let mut holder = send_raw(&f, &head, b"").await?;
        // `100 Continue` comes when the server starts reading the body: its bytes are
        // reserved from then on.
        let cont = read_answer(&mut holder, Duration::from_secs(20)).await?;
        ensure!(cont.status == 100, "{}", cont.head);
        let refused = writer
            .raw(
                Method::POST,
                "/v1/bots/a/sessions/s/records",
                sized_append("big-2", 700_000),
            )
            .await?;
        ensure!(
            refused.status == StatusCode::SERVICE_UNAVAILABLE
                && refused.json["type"] == "urn:ctxlog:problem:busy"
                && refused.json["written"] == "nothing",
            "{} {}",
            refused.status,
            refused.text
        );
        holder.write_all(&first).await?;
        let held = read_answer(&mut holder, Duration::from_secs(20)).await?;
        ensure!(held.status == 200, "{} {}", held.head, held.json);
        let after = writer
            .raw(
                Method::POST,
                "/v1/bots/a/sessions/s/records",
                sized_append("big-3", 700_000),
            )
            .await?;
        ensure!(after.status == StatusCode::OK, "{}", after.text);
        nothing_written(&f, 2).await
    })
    .await
}

/// A body has one deadline in all (three header timeouts), however often its bytes come:
/// on the routes and on MCP's endpoint alike (whose transport would wait for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_trickling_in_meets_one_deadline() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--header-timeout", "1"]).await?;
        for path in ["/v1/bots/a/sessions/s/records", "/mcp"] {
            let head = format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 accept: application/json, text/event-stream\r\n\
                 authorization: Bearer {}\r\ncontent-length: 400",
                token_for(&f, "writer-a")
            );
            let (mut rd, mut wr) = send_raw(&f, &head, b"").await?.into_split();
            // One byte every 200 ms: each well within the old per-chunk timeout, 80 s in all.
            let trickle = tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(200));
                for _ in 0..400 {
                    tick.tick().await;
                    if wr.write_all(b" ").await.is_err() {
                        return;
                    }
                }
            });
            let answer = read_answer(&mut rd, Duration::from_secs(40)).await;
            trickle.abort();
            let answer = answer.with_context(|| path.to_string())?;
            answer
                .is_problem(408, "urn:ctxlog:problem:body-timeout")
                .with_context(|| path.to_string())?;
            ensure!(answer.json["written"] == "nothing", "{path}: {}", answer.json);
        }
        nothing_written(&f, 0).await
    })
    .await
}

/// A connection that sends nothing is closed after the header timeout, one idle after a
/// request after the idle timeout; beyond `--max-connections`, a new connection waits until
/// one closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_close_and_connections_are_limited() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--header-timeout", "1"]).await?;
        let mut silent = tokio::net::TcpStream::connect(&f.server.addr).await?;
        ensure!(
            closed_within(&mut silent, Duration::from_secs(30)).await,
            "a connection that sent nothing was kept open"
        );
        // An HTTP/2 client that sends its preface and nothing more.
        let mut preface = tokio::net::TcpStream::connect(&f.server.addr).await?;
        preface.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await?;
        ensure!(
            closed_within(&mut preface, Duration::from_secs(30)).await,
            "a connection that sent only the HTTP/2 preface was kept open"
        );
        drop(f);
        let f = fixture(&["--header-timeout", "1", "--idle-timeout", "1", "--max-connections", "2"]).await?;
        let mut kept = send_raw(&f, "GET /healthz HTTP/1.1\r\nhost: x", b"").await?;
        ensure!(read_answer(&mut kept, Duration::from_secs(20)).await?.status == 200);
        ensure!(
            closed_within(&mut kept, Duration::from_secs(30)).await,
            "an idle keep-alive connection was kept open"
        );
        // Two silent connections take both places; a third is served only once the server
        // has closed one of them.
        let first = tokio::net::TcpStream::connect(&f.server.addr).await?;
        let second = tokio::net::TcpStream::connect(&f.server.addr).await?;
        let mut third = send_raw(&f, "GET /healthz HTTP/1.1\r\nhost: x", b"").await?;
        ensure!(read_answer(&mut third, Duration::from_secs(30)).await?.status == 200);
        let at_end = |s: &tokio::net::TcpStream| match s.try_read(&mut [0u8; 16]) {
            Ok(n) => n == 0,
            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
        };
        ensure!(
            at_end(&first) || at_end(&second),
            "a connection beyond --max-connections was served while both places were held"
        );
        Ok(())
    })
    .await
}

/// On SIGTERM an upload still sending its body is answered at once (503, nothing written),
/// idle connections are closed, and the process exits within the shutdown grace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_answers_what_waits_and_exits_within_the_grace() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&["--header-timeout", "5"]).await?;
        let head = format!(
            "POST /v1/bots/a/sessions/s/records HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             expect: 100-continue\r\nauthorization: Bearer {}\r\ncontent-length: 1000",
            token_for(&f, "writer-a")
        );
        let mut upload = send_raw(&f, &head, b"").await?;
        ensure!(read_answer(&mut upload, Duration::from_secs(20)).await?.status == 100);
        upload.write_all(b"{\"records\": [").await?;
        let mut idle = send_raw(&f, "GET /healthz HTTP/1.1\r\nhost: x", b"").await?;
        ensure!(read_answer(&mut idle, Duration::from_secs(20)).await?.status == 200);
        let answer = tokio::spawn(async move { read_answer(&mut upload, Duration::from_secs(60)).await });
        let status = f.server.terminate(Duration::from_secs(30)).await?;
        ensure!(status.success(), "{status:?}");
        let answer = answer.await??;
        answer.is_problem(503, "urn:ctxlog:problem:replica-unavailable")?;
        ensure!(answer.json["written"] == "nothing", "{}", answer.json);
        ensure!(
            closed_within(&mut idle, Duration::from_secs(5)).await,
            "an idle connection outlived the server"
        );
        Ok(())
    })
    .await
}

/// Every error is a problem, and path parameters are checked the same way on every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_a_problem_and_every_route_checks_its_path() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let token = token_for(&f, "admin");
        let ask = |head: String| {
            let f = &f;
            async move {
                let mut s = send_raw(f, &format!("{head}\r\nhost: x\r\nconnection: close"), b"").await?;
                read_answer(&mut s, Duration::from_secs(20)).await
            }
        };
        let auth = format!("authorization: Bearer {token}");
        let invalid = "urn:ctxlog:problem:invalid-input";
        ask(format!("GET /v1/bots/a/sessions/s/records?limit=abc HTTP/1.1\r\n{auth}"))
            .await?
            .is_problem(400, "urn:ctxlog:problem:malformed-request")?;
        ask(format!("GET /v1/bots/a/sessions?after=1&after=2 HTTP/1.1\r\n{auth}"))
            .await?
            .is_problem(400, "urn:ctxlog:problem:malformed-request")?;
        ask(format!("PUT /v1/stats HTTP/1.1\r\n{auth}"))
            .await?
            .is_problem(405, "urn:ctxlog:problem:method-not-allowed")?;
        ask(format!("PATCH /v1/bots/a/sessions/s/records HTTP/1.1\r\n{auth}"))
            .await?
            .is_problem(405, "urn:ctxlog:problem:method-not-allowed")?;
        let long = "b".repeat(513);
        for (path, field) in [
            ("/v1/bots/%FF/sessions/s/records".to_string(), "bot_id"),
            ("/v1/bots/a%00b/sessions/s/records".to_string(), "bot_id"),
            (format!("/v1/bots/{long}/sessions/s/records"), "bot_id"),
            (format!("/v1/bots/{long}/sessions/s/context"), "bot_id"),
            (format!("/v1/bots/{long}/sessions"), "bot_id"),
            (format!("/v1/bots/{long}/sessions/s/watch"), "bot_id"),
            (format!("/v1/bots/a/sessions/{long}/records"), "session_id"),
            ("/v1/bots/a/sessions/%FF%FE/context".to_string(), "session_id"),
            (format!("/v1/bots/a/records/{long}"), "id"),
            ("/v1/bots/a/records/x%00".to_string(), "id"),
        ] {
            let a = ask(format!("GET {path} HTTP/1.1\r\n{auth}")).await?;
            a.is_problem(400, invalid).with_context(|| path.clone())?;
            ensure!(a.json["field"] == field && a.json["written"] == "nothing", "{path}: {}", a.json);
        }
        // A write with the same bot answers the same way.
        let body = serde_json::to_vec(&json!({"records": [rec("w-1", "x")]}))?;
        let mut s = send_raw(
            &f,
            &format!(
                "POST /v1/bots/{long}/sessions/s/records HTTP/1.1\r\nhost: x\r\n{auth}\r\ncontent-type: application/json\r\ncontent-length: {}",
                body.len()
            ),
            &body,
        )
        .await?;
        let a = read_answer(&mut s, Duration::from_secs(20)).await?;
        a.is_problem(400, invalid)?;
        ensure!(a.json["field"] == "bot_id", "{}", a.json);
        // The scheme is case-insensitive (RFC 7235); two Authorization headers are refused.
        for scheme in ["bearer", "BEARER", "Bearer"] {
            let a = ask(format!("GET /v1/stats HTTP/1.1\r\nauthorization: {scheme} {token}")).await?;
            ensure!(a.status == 200, "{scheme}: {} {}", a.head, a.json);
        }
        ask(format!("GET /v1/stats HTTP/1.1\r\n{auth}\r\n{auth}"))
            .await?
            .is_problem(401, "urn:ctxlog:problem:unauthorized")?;
        nothing_written(&f, 0).await
    })
    .await
}

/// `ctxlog serve` logs to stderr (JSON lines with `--log-format json`), never to stdout,
/// whose first line stays the one a script reads; `--log-level debug` shows debug lines.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_logs_to_stderr_as_json_lines() -> anyhow::Result<()> {
    bounded(async {
        let dir = tempfile::tempdir()?;
        let store = format!("sqlite:{}", dir.path().join("s.db").display());
        let mut child = tokio::process::Command::new(common::ctxlog_bin())
            .args(["--store", &store, "serve", "--writer", "w", "--listen", "127.0.0.1:0"])
            .args(["--log-format", "json", "--log-level", "debug"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        use tokio::io::AsyncBufReadExt;
        let mut out = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
        let mut err = tokio::io::BufReader::new(child.stderr.take().context("stderr")?).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), out.next_line())
            .await
            .context("no first line")??
            .context("stdout ended")?;
        let listening: Value = serde_json::from_str(&first).with_context(|| first.clone())?;
        ensure!(listening["listening"].is_string(), "{first}");
        let logged = tokio::time::timeout(Duration::from_secs(60), async {
            let mut debug = false;
            while let Some(line) = err.next_line().await? {
                let v: Value = serde_json::from_str(&line).with_context(|| format!("not a JSON line: {line}"))?;
                debug |= v["level"] == "DEBUG";
                if v["level"] == "INFO" && v["fields"]["listen"] == listening["listening"] {
                    ensure!(debug, "no debug line before the start was logged");
                    return anyhow::Ok(v);
                }
            }
            anyhow::bail!("stderr ended without the server's start logged")
        })
        .await
        .context("nothing logged")??;
        ensure!(logged["fields"]["message"].is_string(), "{logged}");
        let pid = child.id().context("pid")?;
        // SAFETY: kill(2) with a pid of our own child and a valid signal number.
        ensure!(unsafe { libc::kill(pid as i32, libc::SIGTERM) } == 0);
        ensure!(
            tokio::time::timeout(Duration::from_secs(30), child.wait())
                .await??
                .success()
        );
        let rest = tokio::time::timeout(Duration::from_secs(10), out.next_line()).await??;
        ensure!(rest.is_none(), "stdout has more than its first line: {rest:?}");
        Ok(())
    })
    .await
}
