//! `ctxlog-http-load`: the client side of `cargo xtask bench serve`. One measurement per
//! process, JSON out; talks HTTP/1 to `ctxlog serve` replicas on loopback.
//!
//! - `append`: C concurrent clients, each on its own connection, appending batches of B
//!   records with ids of their own; throughput and per-request latency.
//! - `read`: one client reading one session's first page N times; latency.
//! - `watch`: a watcher on replica B, records appended one at a time through replica A;
//!   the time from each append's send to its event's arrival.
//! - `hold`: open N watch streams and keep them until stdin closes (for the server's RSS).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Concurrent appends.
    Append {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        clients: usize,
        #[arg(long)]
        batch: usize,
        /// Requests per client.
        #[arg(long)]
        requests: usize,
        /// Distinguishes this run's ids from another's on the same store.
        #[arg(long, default_value = "r")]
        run: String,
    },
    /// Repeated reads of one session's first page.
    Read {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        bot: String,
        #[arg(long)]
        session: String,
        #[arg(long)]
        times: usize,
    },
    /// Watch latency: append through `--from`, watch on `--to`.
    Watch {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        records: usize,
    },
    /// Hold `--streams` idle watch streams open until stdin closes.
    Hold {
        #[arg(long)]
        addr: String,
        #[arg(long)]
        streams: usize,
    },
}

const DEADLINE: Duration = Duration::from_secs(60);

type Http = Client<HttpConnector, Full<Bytes>>;

fn client() -> Http {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(256)
        .build_http()
}

async fn send(c: &Http, method: Method, url: &str, body: Option<&Value>) -> Result<(StatusCode, Bytes)> {
    let bytes = body.map(serde_json::to_vec).transpose()?.unwrap_or_default();
    let req = Request::builder()
        .method(method)
        .uri(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let go = async {
        let resp = c.request(req).await?;
        let status = resp.status();
        let body = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(DEADLINE, go)
        .await
        .map_err(|_| anyhow!("{url}: no answer within {DEADLINE:?}"))?
}

fn record(id: &str, text: &str) -> Value {
    json!({"id": id, "role": "user", "text": text})
}

async fn append(addr: &str, clients: usize, batch: usize, requests: usize, run: &str) -> Result<Value> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for k in 0..clients {
        let (addr, run) = (addr.to_string(), run.to_string());
        tasks.push(tokio::spawn(async move {
            // A connection per client, as separate agents have.
            let c = client();
            let mut lat = Vec::with_capacity(requests);
            let body_text = "x".repeat(200);
            for j in 0..requests {
                let records: Vec<Value> = (0..batch)
                    .map(|i| record(&format!("{run}-c{k}-{j}-{i}"), &body_text))
                    .collect();
                let url = format!("http://{addr}/v1/bots/load/sessions/s{}/records", k % 16);
                let t = Instant::now();
                let (status, body) = send(&c, Method::POST, &url, Some(&json!({ "records": records }))).await?;
                ensure!(
                    status == StatusCode::OK,
                    "append: {status} {}",
                    String::from_utf8_lossy(&body)
                );
                lat.push(t.elapsed().as_micros() as u64);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut latencies_us = Vec::new();
    for t in tasks {
        latencies_us.extend(t.await??);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(json!({"records": clients * requests * batch, "seconds": seconds, "latencies_us": latencies_us}))
}

async fn read(addr: &str, bot: &str, session: &str, times: usize) -> Result<Value> {
    let c = client();
    let url = format!("http://{addr}/v1/bots/{bot}/sessions/{session}/records?limit=1000");
    let mut latencies_us = Vec::with_capacity(times);
    let mut records = 0;
    for _ in 0..times {
        let t = Instant::now();
        let (status, body) = send(&c, Method::GET, &url, None).await?;
        ensure!(status == StatusCode::OK, "read: {status}");
        latencies_us.push(t.elapsed().as_micros() as u64);
        let v: Value = serde_json::from_slice(&body)?;
        records = v["records"].as_array().map_or(0, Vec::len);
    }
    Ok(json!({"records": records, "latencies_us": latencies_us}))
}

/// The events of one stream, as they arrive.
struct Stream {
    body: hyper::body::Incoming,
    buf: String,
}

impl Stream {
    async fn open(c: &Http, url: &str) -> Result<Stream> {
        let req = Request::builder()
            .uri(url)
            .header("accept", "text/event-stream")
            .body(Full::new(Bytes::new()))?;
        let resp = tokio::time::timeout(DEADLINE, c.request(req))
            .await
            .map_err(|_| anyhow!("{url}: no answer"))??;
        ensure!(resp.status() == StatusCode::OK, "watch: {}", resp.status());
        Ok(Stream {
            body: resp.into_body(),
            buf: String::new(),
        })
    }

    /// The data of the next `record` event.
    async fn next_record(&mut self) -> Result<Value> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                if block.lines().any(|l| l == "event: record") {
                    let data = block
                        .lines()
                        .find_map(|l| l.strip_prefix("data: "))
                        .context("an event without data")?;
                    return Ok(serde_json::from_str(data)?);
                }
                continue;
            }
            match tokio::time::timeout(DEADLINE, self.body.frame()).await {
                Ok(Some(frame)) => {
                    if let Ok(d) = frame?.into_data() {
                        self.buf.push_str(&String::from_utf8_lossy(&d));
                    }
                }
                Ok(None) => bail!("the stream ended"),
                Err(_) => bail!("no event within {DEADLINE:?}"),
            }
        }
    }
}

async fn watch(from: &str, to: &str, records: usize) -> Result<Value> {
    let c = client();
    let session = format!("w-{}", std::process::id());
    let mut stream = Stream::open(&c, &format!("http://{to}/v1/bots/load/sessions/{session}/watch")).await?;
    let url = format!("http://{from}/v1/bots/load/sessions/{session}/records");
    let mut latencies_us = Vec::with_capacity(records);
    for i in 0..records {
        let t = Instant::now();
        let (status, _) = send(
            &c,
            Method::POST,
            &url,
            Some(&json!({"records": [record(&format!("{session}-{i}"), "x")]})),
        )
        .await?;
        ensure!(status == StatusCode::OK, "append: {status}");
        let got = stream.next_record().await?;
        ensure!(got["id"] == format!("{session}-{i}"), "out of order: {got}");
        latencies_us.push(t.elapsed().as_micros() as u64);
    }
    Ok(json!({"records": records, "latencies_us": latencies_us}))
}

async fn hold(addr: &str, streams: usize) -> Result<Value> {
    let c = client();
    let mut open = Vec::with_capacity(streams);
    for i in 0..streams {
        open.push(Stream::open(&c, &format!("http://{addr}/v1/bots/load/sessions/idle-{i}/watch")).await?);
    }
    println!("{}", json!({"open": open.len()}));
    // Until the parent closes stdin.
    let mut sink = String::new();
    let _ = tokio::task::spawn_blocking(move || std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink)).await;
    drop(open);
    Ok(json!({"closed": streams}))
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ctxlog-http-load: {e}");
            return std::process::ExitCode::from(4);
        }
    };
    let out = rt.block_on(async {
        match cli.cmd {
            Cmd::Append {
                addr,
                clients,
                batch,
                requests,
                run,
            } => append(&addr, clients, batch, requests, &run).await,
            Cmd::Read {
                addr,
                bot,
                session,
                times,
            } => read(&addr, &bot, &session, times).await,
            Cmd::Watch { from, to, records } => watch(&from, &to, records).await,
            Cmd::Hold { addr, streams } => hold(&addr, streams).await,
        }
    });
    match out {
        Ok(v) => {
            println!("{v}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ctxlog-http-load: {e:#}");
            std::process::ExitCode::from(4)
        }
    }
}
