//! What the HTTP tests share: a `ctxlog serve` process on 127.0.0.1, a small HTTP client,
//! and a server-sent events reader. Every wait has a deadline.

#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use ctxlog_conformance::{Backend, FaultGuard};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The `ctxlog` binary cargo built for these tests.
pub fn ctxlog_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ctxlog"))
}

/// One `ctxlog serve` process.
pub struct Server {
    pub child: Child,
    pub addr: String,
    pub writer: String,
}

impl Server {
    /// Start `ctxlog serve` on `store` as `writer`, listening on a free loopback port, with
    /// `extra` arguments; returns once it listens.
    pub async fn start(store: &str, writer: &str, timeout: Duration, extra: &[&str]) -> anyhow::Result<Server> {
        let mut child = Command::new(ctxlog_bin())
            .args(["--store", store, "--timeout", &timeout.as_secs_f64().to_string()])
            .args(["serve", "--writer", writer, "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .context("spawn ctxlog serve")?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(timeout * 3, lines.next_line())
            .await
            .map_err(|_| anyhow!("ctxlog serve did not start within {:?}", timeout * 3))??
            .context("ctxlog serve exited before it listened")?;
        let v: Value = serde_json::from_str(&first).with_context(|| format!("first line `{first}`"))?;
        let addr = v["listening"].as_str().context("listening")?.to_string();
        Ok(Server {
            child,
            addr,
            writer: writer.to_string(),
        })
    }

    /// A client of this server.
    pub fn client(&self) -> Http {
        Http::new(&self.addr)
    }

    /// SIGKILL, and wait for the process to end.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .map_err(|_| anyhow!("a killed server did not exit"))??;
        Ok(())
    }

    /// SIGTERM, and its exit status within `within`.
    pub async fn terminate(mut self, within: Duration) -> anyhow::Result<std::process::ExitStatus> {
        let pid = self.child.id().context("the server already exited")?;
        // SAFETY: kill(2) with a pid of our own child and a valid signal number.
        if unsafe { libc::kill(pid as i32, libc::SIGTERM) } != 0 {
            bail!("SIGTERM failed: {}", std::io::Error::last_os_error());
        }
        tokio::time::timeout(within, self.child.wait())
            .await
            .map_err(|_| anyhow!("the server did not exit within {within:?} of SIGTERM"))?
            .map_err(Into::into)
    }
}

/// A response: status, `content-type`, body as JSON (or `Null` when it is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub content_type: String,
    pub json: Value,
    pub text: String,
}

/// A small HTTP/1 client with a deadline per request.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
    pub base: String,
    pub token: Option<String>,
    pub deadline: Duration,
}

impl Http {
    pub fn new(addr: &str) -> Http {
        Http {
            // A connection per request: these tests send requests a server answers and then
            // closes the connection of (a body over the limit), and a pooled connection the
            // server has just closed fails the next request that picks it.
            client: Client::builder(TokioExecutor::new())
                .pool_max_idle_per_host(0)
                .build_http(),
            base: format!("http://{addr}"),
            token: None,
            deadline: Duration::from_secs(60),
        }
    }

    pub fn with_token(&self, token: &str) -> Http {
        Http {
            token: Some(token.to_string()),
            ..self.clone()
        }
    }

    /// Send `method path` with `body` (raw bytes).
    pub async fn raw(&self, method: Method, path: &str, body: Vec<u8>) -> anyhow::Result<Answer> {
        let mut req = Request::builder().method(method).uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if !body.is_empty() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body)))?;
        let send = async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let content_type = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let bytes = resp.into_body().collect().await?.to_bytes();
            let text = String::from_utf8_lossy(&bytes).to_string();
            let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            anyhow::Ok(Answer {
                status,
                content_type,
                json,
                text,
            })
        };
        tokio::time::timeout(self.deadline, send)
            .await
            .map_err(|_| anyhow!("{path}: no answer within {:?}", self.deadline))?
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Answer> {
        self.raw(Method::GET, path, Vec::new()).await
    }

    pub async fn post(&self, path: &str, body: &Value) -> anyhow::Result<Answer> {
        self.raw(Method::POST, path, serde_json::to_vec(body)?).await
    }

    pub async fn delete(&self, path: &str) -> anyhow::Result<Answer> {
        self.raw(Method::DELETE, path, Vec::new()).await
    }

    /// Append `records` to `bot`/`session`.
    pub async fn append(&self, bot: &str, session: &str, records: &[Value]) -> anyhow::Result<Answer> {
        self.post(
            &format!("/v1/bots/{bot}/sessions/{session}/records"),
            &serde_json::json!({ "records": records }),
        )
        .await
    }

    /// Every live record of a session, following the pages.
    pub async fn session(&self, bot: &str, session: &str) -> anyhow::Result<Vec<Value>> {
        let mut out = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let path = match &after {
                None => format!("/v1/bots/{bot}/sessions/{session}/records?limit=1000"),
                Some(a) => format!("/v1/bots/{bot}/sessions/{session}/records?limit=1000&after={a}"),
            };
            let a = self.get(&path).await?;
            if a.status != StatusCode::OK {
                bail!("{path}: {} {}", a.status, a.text);
            }
            out.extend(a.json["records"].as_array().cloned().unwrap_or_default());
            match a.json["next"].as_str() {
                Some(n) => after = Some(n.to_string()),
                None => return Ok(out),
            }
        }
    }

    /// Open a watch stream at `path`, resuming after `last_event_id`.
    pub async fn watch(&self, path: &str, last_event_id: Option<&str>) -> anyhow::Result<Events> {
        let mut req = Request::builder()
            .method(Method::GET)
            .uri(format!("{}{path}", self.base))
            .header("accept", "text/event-stream");
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        let resp = tokio::time::timeout(self.deadline, self.client.request(req.body(Full::new(Bytes::new()))?))
            .await
            .map_err(|_| anyhow!("{path}: no answer within {:?}", self.deadline))??;
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            bail!("{path}: {status} {}", String::from_utf8_lossy(&body));
        }
        Ok(Events {
            body: resp.into_body(),
            buf: String::new(),
        })
    }
}

/// One server-sent event.
#[derive(Clone, Debug, Default)]
pub struct Event {
    pub event: String,
    pub id: String,
    pub data: Value,
}

/// A server-sent events stream.
pub struct Events {
    body: hyper::body::Incoming,
    buf: String,
}

impl Events {
    /// The next event (comments skipped) within `within`.
    pub async fn next(&mut self, within: Duration) -> anyhow::Result<Event> {
        tokio::time::timeout(within, self.next_inner())
            .await
            .map_err(|_| anyhow!("no event within {within:?}"))?
    }

    async fn next_inner(&mut self) -> anyhow::Result<Event> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Event::default();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        ev.id = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim_start());
                    }
                }
                if ev.event.is_empty() && data.is_empty() {
                    continue; // a comment (keep-alive)
                }
                ev.data = serde_json::from_str(&data).unwrap_or(Value::Null);
                return Ok(ev);
            }
            match self.body.frame().await {
                Some(frame) => {
                    if let Ok(data) = frame?.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&data));
                    }
                }
                None => bail!("the stream ended"),
            }
        }
    }
}

/// A text record `id` for an append.
pub fn rec(id: &str, text: &str) -> Value {
    serde_json::json!({"id": id, "role": "user", "text": text})
}

/// Write a tokens file under `dir`; returns its path.
// A tokens file, never one of a store's files.
#[allow(clippy::disallowed_methods)]
pub fn tokens_file(dir: &Path, entries: &[Value]) -> anyhow::Result<PathBuf> {
    let path = dir.join("tokens.json");
    std::fs::write(&path, serde_json::json!({ "tokens": entries }).to_string())?;
    Ok(path)
}

/// Not needed by the process cases (they write through the binary only).
fn unused<T>() -> ctxlog_conformance::BoxFuture<anyhow::Result<T>> {
    Box::pin(async { anyhow::bail!("the process cases inject no faults") })
}

/// Every backend compiled into this build, reached through the facade's URIs, for cases
/// that drive `ctxlog` processes (they inject no faults).
pub fn process_backends() -> Vec<Backend> {
    let mut out = vec![Backend {
        name: "sqlite",
        store_uri: |root| format!("sqlite:{}", root.join("store.db").display()),
        open: |uri, options| Box::pin(async move { ctxlog::open(&uri, options).await }),
        op_timeout: Duration::from_secs(10),
        case_timeout: Duration::from_secs(120),
        proptest_cases: 0,
        inject_raw_entry: |_, _| unused(),
        stall_writes: |_| unused::<FaultGuard>(),
        tamper_snapshots: |_, _| unused(),
        faults: None,
        files_in_root: true,
        decoded_values_containing: None,
    }];
    if ctxlog::compiled_backends().contains(&"lance") {
        out.push(Backend {
            name: "lance",
            store_uri: |root| root.join("store.lance").display().to_string(),
            op_timeout: Duration::from_secs(30),
            case_timeout: Duration::from_secs(170),
            ..out[0]
        });
    }
    // Lance on the loopback S3 server: the binary gets `--store 's3://…?endpoint=…'`.
    #[cfg(feature = "s3")]
    out.push(Backend {
        name: "lance_s3",
        store_uri: s3_loopback::store_uri_for,
        op_timeout: Duration::from_secs(30),
        // Below nextest's kill (.config/nextest.toml: 180 s): the case's own deadline fires
        // first and names the hang.
        case_timeout: Duration::from_secs(170),
        files_in_root: false,
        ..out[0]
    });
    out
}
