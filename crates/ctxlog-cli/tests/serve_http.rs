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
        let anon = f.server.client();
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
            (Method::GET, "/v1/bots/b/records/b-1".into(), Value::Null),
            (Method::GET, "/v1/bots/b/records/missing".into(), Value::Null),
            (Method::DELETE, "/v1/bots/b/records/b-1".into(), Value::Null),
            (Method::GET, "/v1/bots/b/sessions".into(), Value::Null),
            (Method::GET, "/v1/conflicts".into(), Value::Null),
            (Method::GET, "/v1/stats".into(), Value::Null),
            (Method::GET, "/v1/shards".into(), Value::Null),
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
            for (who, client, status) in [
                ("no token", &anon, StatusCode::UNAUTHORIZED),
                ("a wrong token", &wrong, StatusCode::UNAUTHORIZED),
                ("bot a's writer", &writer, StatusCode::FORBIDDEN),
                ("bot a's reader", &reader, StatusCode::FORBIDDEN),
            ] {
                let answer = send(client, m, path, body).await?;
                ensure!(
                    answer.status == status,
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
        ensure!(
            reader.watch("/v1/bots/b/sessions/s/watch", None).await.is_err(),
            "a reader of a watched bot b"
        );
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

/// Does `value` fit `schema` (a JSON Schema of the OpenAPI document, `$ref`s resolved
/// against `doc`)? Types, required properties, and no property the schema does not name.
fn fits(doc: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return fits(doc, &doc["components"]["schemas"][name], value, at);
    }
    if let Some(options) = schema["oneOf"].as_array().or(schema["anyOf"].as_array()) {
        return if options.iter().any(|o| fits(doc, o, value, at).is_ok()) {
            Ok(())
        } else {
            Err(format!("{at}: {value} fits none of {schema}"))
        };
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    let type_ok = types.is_empty()
        || types.iter().any(|t| match *t {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            "null" => value.is_null(),
            _ => true,
        });
    if !type_ok {
        return Err(format!("{at}: {value} is not of type {types:?}"));
    }
    if let (Some(obj), Some(props)) = (value.as_object(), schema["properties"].as_object()) {
        for req in schema["required"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !obj.contains_key(req) {
                return Err(format!("{at}: required `{req}` missing in {value}"));
            }
        }
        for (k, v) in obj {
            let Some(p) = props.get(k) else {
                return Err(format!("{at}: `{k}` is not in the schema"));
            };
            fits(doc, p, v, &format!("{at}.{k}"))?;
        }
    }
    if let (Some(items), Some(arr)) = (schema.get("items"), value.as_array()) {
        for (i, v) in arr.iter().enumerate() {
            fits(doc, items, v, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_fit_the_openapi_document() -> anyhow::Result<()> {
    bounded(async {
        let f = fixture(&[]).await?;
        let c = f.admin.clone();
        let doc = c.get("/openapi.json").await?.json;
        ensure!(doc["openapi"].is_string(), "no OpenAPI document");
        for (method, path) in ctxlog_server::routes::ROUTES {
            ensure!(
                doc["paths"][path][method].is_object(),
                "{method} {path} is not documented"
            );
        }
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
            ("/v1/bots/{bot}/sessions", "get", c.get("/v1/bots/a/sessions").await?),
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
        ];
        for (path, method, answer) in calls {
            let status = answer.status.as_u16().to_string();
            let response = &doc["paths"][path][method]["responses"][&status];
            ensure!(
                response.is_object(),
                "{method} {path}: status {status} is not documented ({})",
                answer.text
            );
            let content = response["content"].as_object().context("content")?;
            let (_, media) = content.iter().next().context("a media type")?;
            fits(
                &doc,
                &media["schema"],
                &answer.json,
                &format!("{method} {path} {status}"),
            )
            .map_err(anyhow::Error::msg)?;
        }
        Ok(())
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
