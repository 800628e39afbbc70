//! `ctxlog serve` replicas over real HTTP on 127.0.0.1, on every backend compiled in
//! (`<backend>::<case>`): two replicas with one killed mid-load, a watch across replicas
//! resumed after a disconnect, fencing of a second process with the same writer id,
//! clients that disconnect mid-append, a graceful shutdown, and summaries written from one
//! replica's view through another.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, anyhow, ensure};
use common::{Http, Server, rec};
use ctxlog_conformance::{Backend, Case, Ctx};
use hyper::StatusCode;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const RULE: &str = "ctxlog serve: replicas over HTTP";

fn cases() -> Vec<Case> {
    vec![
        ctxlog_conformance::case!(serve_two_replicas_keep_every_ack_through_a_sigkill),
        ctxlog_conformance::case!(serve_watch_on_another_replica_resumes_without_gap_or_duplicate),
        ctxlog_conformance::case!(serve_same_writer_fences_the_older_for_good),
        ctxlog_conformance::case!(serve_clients_that_disconnect_mid_append_never_tear_a_batch),
        ctxlog_conformance::case!(serve_sigterm_ends_streams_keeps_acks_and_exits_zero),
        ctxlog_conformance::case!(serve_a_summary_written_through_another_replica_covers_only_what_was_read),
        ctxlog_conformance::case!(serve_a_fork_or_a_search_through_one_replica_agrees_with_another),
    ]
}

fn backends() -> Vec<Backend> {
    common::process_backends()
}

fn main() -> std::process::ExitCode {
    ctxlog_conformance::run_trials(&backends(), &cases())
}

/// Start a replica of the case's store.
async fn replica(ctx: &Ctx, writer: &str) -> anyhow::Result<Server> {
    Server::start(&ctx.uri, writer, ctx.backend.op_timeout, &[]).await
}

/// A watch of `path` from `last` (an event id): its first event says where it starts, at
/// once — that position itself when one was given.
async fn watch(client: &Http, path: &str, last: Option<&str>, within: Duration) -> anyhow::Result<common::Events> {
    let mut events = client.watch(path, last).await?;
    let first = events.next(within).await?;
    ensure!(
        first.event == "position" && first.data["position"] == first.id.as_str() && !first.id.is_empty(),
        "a watch starts with its position: {first:?}"
    );
    if let Some(last) = last {
        ensure!(first.id == last, "a watch from {last} starts at {first:?}");
    }
    Ok(events)
}

/// What the clients were promised: id → (session, text).
type Acked = Arc<std::sync::Mutex<BTreeMap<String, (String, String)>>>;

/// Every acknowledged id is served exactly once, with its content, by `client`; nothing is
/// served that no client sent.
async fn check_served(client: &Http, sessions: &[&str], acked: &Acked, sent: &BTreeSet<String>) -> anyhow::Result<()> {
    let acked = acked.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut seen = BTreeMap::new();
    for s in sessions {
        for r in client.session("bot", s).await? {
            let id = r["id"].as_str().context("id")?.to_string();
            ensure!(
                seen.insert(
                    id.clone(),
                    (s.to_string(), r["text"].as_str().unwrap_or("").to_string())
                )
                .is_none(),
                "{id} is served twice"
            );
            ensure!(sent.contains(&id), "{id} is served but no client sent it");
        }
    }
    for (id, promised) in &acked {
        match seen.get(id) {
            Some(got) if got == promised => {}
            Some(got) => return Err(anyhow!("{id} is served as {got:?}, acknowledged as {promised:?}")),
            None => return Err(anyhow!("acknowledged {id} is not served ({} acked)", acked.len())),
        }
    }
    Ok(())
}

/// Two replicas on one store, clients appending to the same sessions through both; one
/// replica SIGKILLed mid-load (its clients retry the same ids on the other) and started
/// again. Every acknowledged id is served exactly once by both, with its content; a retry
/// never grows a session.
async fn serve_two_replicas_keep_every_ack_through_a_sigkill(ctx: Ctx) -> anyhow::Result<()> {
    const CLIENTS: usize = 6;
    const BATCHES: usize = 8;
    const PER: usize = 5;
    const SESSIONS: [&str; 3] = ["s0", "s1", "s2"];
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let b = replica(&ctx, "replica-b").await?;
    let (ca, cb) = (a.client(), b.client());
    let acked: Acked = Arc::default();
    let count = Arc::new(AtomicUsize::new(0));
    let half = Arc::new(tokio::sync::Notify::new());
    let mut sent = BTreeSet::new();
    let mut tasks = Vec::new();
    for k in 0..CLIENTS {
        let (ca, cb, acked, count, half) = (ca.clone(), cb.clone(), acked.clone(), count.clone(), half.clone());
        let ids: Vec<Vec<String>> = (0..BATCHES)
            .map(|j| (0..PER).map(|i| format!("c{k}-b{j}-{i}")).collect())
            .collect();
        sent.extend(ids.iter().flatten().cloned());
        tasks.push(tokio::spawn(async move {
            for (j, batch) in ids.into_iter().enumerate() {
                let session = SESSIONS[(k + j) % SESSIONS.len()];
                let records: Vec<Value> = batch.iter().map(|id| rec(id, &format!("text of {id}"))).collect();
                // Half the batches go to each replica; a failed one is retried, same ids,
                // on the other (up to three times in all).
                let order = if (k + j) % 2 == 0 {
                    [&ca, &cb, &ca]
                } else {
                    [&cb, &ca, &cb]
                };
                let mut ok = false;
                for client in order {
                    match client.append("bot", session, &records).await {
                        Ok(answer) if answer.status == StatusCode::OK => {
                            ok = true;
                            break;
                        }
                        _ => continue,
                    }
                }
                anyhow::ensure!(ok, "client {k} batch {j} failed on both replicas");
                let mut map = acked.lock().unwrap_or_else(|p| p.into_inner());
                for id in &batch {
                    map.insert(id.clone(), (session.to_string(), format!("text of {id}")));
                }
                drop(map);
                if count.fetch_add(1, Ordering::AcqRel) + 1 == CLIENTS * BATCHES / 2 {
                    half.notify_one();
                }
            }
            anyhow::Ok(())
        }));
    }
    // Mid-load: replica A dies without a word.
    tokio::time::timeout(ctx.backend.op_timeout * 6, half.notified())
        .await
        .map_err(|_| anyhow!("the clients did not get half their batches acknowledged"))?;
    a.kill().await?;
    for t in tasks {
        tokio::time::timeout(ctx.backend.op_timeout * 12, t)
            .await
            .map_err(|_| anyhow!("a client did not finish"))???;
    }
    // A again (its shard continues), and a few more batches through both.
    let a = replica(&ctx, "replica-a").await?;
    let ca = a.client();
    for (j, client) in [&ca, &cb, &ca].into_iter().enumerate() {
        let ids: Vec<String> = (0..PER).map(|i| format!("after-{j}-{i}")).collect();
        sent.extend(ids.iter().cloned());
        let records: Vec<Value> = ids.iter().map(|id| rec(id, &format!("text of {id}"))).collect();
        let answer = client.append("bot", "s0", &records).await?;
        ensure!(answer.status == StatusCode::OK, "after the restart: {}", answer.text);
        let mut map = acked.lock().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            map.insert(id.clone(), ("s0".into(), format!("text of {id}")));
        }
    }
    check_served(&cb, &SESSIONS, &acked, &sent).await?;
    check_served(&ca, &SESSIONS, &acked, &sent).await?;
    // A retry of an acknowledged batch, through either replica, does not grow its session.
    let before = cb.session("bot", "s0").await?.len();
    let again: Vec<Value> = (0..PER).map(|i| rec(&format!("after-0-{i}"), "text of x")).collect();
    for client in [&ca, &cb] {
        let answer = client.append("bot", "s0", &again).await?;
        ensure!(answer.status == StatusCode::OK, "{}", answer.text);
    }
    ensure!(
        cb.session("bot", "s0").await?.len() == before,
        "a retry grew the session"
    );
    Ok(())
}

/// A watcher on replica B sees every record appended through replica A, in session order;
/// cut off and reconnected with its last event id, it misses nothing and sees nothing twice.
async fn serve_watch_on_another_replica_resumes_without_gap_or_duplicate(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let b = replica(&ctx, "replica-b").await?;
    let (ca, cb) = (a.client(), b.client());
    let within = ctx.backend.op_timeout * 2;
    let path = "/v1/bots/bot/sessions/w/watch";
    let mut events = watch(&cb, path, None, within).await?;
    let mut ids: Vec<String> = Vec::new();
    let batch = |from: usize| -> Vec<Value> { (from..from + 5).map(|i| rec(&format!("w-{i:02}"), "x")).collect() };
    for j in 0..5 {
        let answer = ca.append("bot", "w", &batch(j * 5)).await?;
        ensure!(answer.status == StatusCode::OK, "{}", answer.text);
    }
    // Another session's records are not this stream's.
    ensure!(ca.append("bot", "other", &[rec("o-1", "x")]).await?.status == StatusCode::OK);
    let mut last = String::new();
    for _ in 0..20 {
        let e = events.next(within).await?;
        ensure!(e.event == "record", "{e:?}");
        ids.push(e.data["id"].as_str().context("id")?.to_string());
        last = e.id;
    }
    drop(events); // the connection is cut
    for j in 5..10 {
        let answer = ca.append("bot", "w", &batch(j * 5)).await?;
        ensure!(answer.status == StatusCode::OK, "{}", answer.text);
    }
    let mut events = watch(&cb, path, Some(&last), within).await?;
    for _ in 0..30 {
        let e = events.next(within).await?;
        ids.push(e.data["id"].as_str().context("id")?.to_string());
    }
    let want: Vec<String> = (0..50).map(|i| format!("w-{i:02}")).collect();
    ensure!(ids == want, "the watcher saw {ids:?}");
    // And nothing more of what it saw: the next event is the next record.
    ensure!(ca.append("bot", "w", &[rec("w-end", "x")]).await?.status == StatusCode::OK);
    let e = events.next(within).await?;
    ensure!(e.data["id"] == "w-end", "after the 50, the stream sent {e:?}");
    // A tombstone is an event too.
    ensure!(ca.delete("/v1/bots/bot/records/w-end").await?.status == StatusCode::OK);
    let e = events.next(within).await?;
    ensure!(e.event == "tombstone" && e.data["id"] == "w-end", "{e:?}");
    // A position past what the store holds — a seq beyond the shard's end, or a shard named
    // twice — would hide that shard's records: refused, naming the field that gave it.
    let shard = ca.append("bot", "w", &[rec("w-last", "x")]).await?.json["shard"]
        .as_str()
        .context("shard")?
        .to_string();
    for (forged, why) in [
        (format!("p1.{shard}=18446744073709551615"), "past what the store holds"),
        (format!("p1.{shard}=1,{shard}=2"), "twice"),
    ] {
        let forged = base64_encode(&forged);
        let refused = cb.get(&format!("{path}?after={forged}")).await?;
        ensure!(
            refused.status == StatusCode::BAD_REQUEST && refused.json["field"] == "after" && refused.text.contains(why),
            "a watch after {forged}: {} {}",
            refused.status,
            refused.text
        );
        let refused = cb
            .watch(path, Some(&forged))
            .await
            .err()
            .context("a forged Last-Event-ID is refused")?;
        let refused = refused.to_string();
        ensure!(
            refused.contains("400") && refused.contains("Last-Event-ID") && refused.contains(why),
            "a watch with Last-Event-ID {forged}: {refused}"
        );
    }
    Ok(())
}

/// A second process with the same writer id takes the shard: the first answers every
/// append with a typed `fenced` problem, says so in `/readyz`, and never takes the shard
/// back; every record either acknowledged is served once.
async fn serve_same_writer_fences_the_older_for_good(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let old = replica(&ctx, "same").await?;
    let co = old.client();
    ensure!(co.append("bot", "s", &[rec("old-1", "x")]).await?.status == StatusCode::OK);
    let new = replica(&ctx, "same").await?;
    let cn = new.client();
    ensure!(cn.append("bot", "s", &[rec("new-1", "x")]).await?.status == StatusCode::OK);
    for attempt in 0..3 {
        let answer = co.append("bot", "s", &[rec(&format!("late-{attempt}"), "x")]).await?;
        ensure!(
            answer.status == StatusCode::CONFLICT && answer.json["type"] == "urn:ctxlog:problem:fenced",
            "attempt {attempt} through the fenced replica: {} {}",
            answer.status,
            answer.text
        );
        ensure!(answer.content_type.starts_with("application/problem+json"));
        ensure!(answer.json["written"] == "nothing", "{}", answer.text);
    }
    let ready = co.get("/readyz").await?;
    ensure!(
        ready.status == StatusCode::SERVICE_UNAVAILABLE && ready.json["fenced"] == true,
        "{} {}",
        ready.status,
        ready.text
    );
    // The newer one keeps the shard: the fenced one never claimed it back.
    ensure!(cn.append("bot", "s", &[rec("new-2", "x")]).await?.status == StatusCode::OK);
    let ready = cn.get("/readyz").await?;
    ensure!(
        ready.status == StatusCode::OK && ready.json["fenced"] == false,
        "{}",
        ready.text
    );
    let ids: Vec<String> = cn
        .session("bot", "s")
        .await?
        .iter()
        .map(|r| r["id"].as_str().unwrap_or("").to_string())
        .collect();
    ensure!(ids == ["old-1", "new-1", "new-2"], "served {ids:?}");
    Ok(())
}

/// Clients that send an append and hang up without reading the answer: first a few that
/// hang up once the replica has taken their batch (so these must land), then many at a time
/// that hang up at once (each lands or not). Every batch is wholly there or wholly absent,
/// the taken ones are there, nothing is served that no client sent, and the replica keeps
/// serving.
async fn serve_clients_that_disconnect_mid_append_never_tear_a_batch(ctx: Ctx) -> anyhow::Result<()> {
    const TAKEN: usize = 4;
    const CLIENTS: usize = 16;
    const PER: usize = 40;
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let ca = a.client();
    let addr = a.addr.clone();
    let send = move |client: String| {
        let addr = addr.clone();
        async move {
            let records: Vec<Value> = (0..PER).map(|i| rec(&format!("{client}-{i}"), "gone")).collect();
            let body = json!({ "records": records }).to_string();
            let request = format!(
                "POST /v1/bots/bot/sessions/d/records HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut stream = tokio::net::TcpStream::connect(&addr).await?;
            stream.write_all(request.as_bytes()).await?;
            stream.flush().await?;
            anyhow::Ok(stream)
        }
    };
    // The replica counts a request among those it took in the step that hands its batch to
    // the writer's own task, which no disconnect cuts short: once counted, it lands.
    for k in 0..TAKEN {
        let stream = send(format!("t{k}")).await?;
        tokio::time::timeout(ctx.backend.op_timeout, appends_taken(&ca, k + 1))
            .await
            .map_err(|_| anyhow!("the replica did not take batch t{k}"))??;
        drop(stream);
    }
    let mut tasks = Vec::new();
    for k in 0..CLIENTS {
        let send = send.clone();
        tasks.push(tokio::spawn(async move {
            // Hang up without reading the answer.
            drop(send(format!("d{k}")).await?);
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t)
            .await
            .map_err(|_| anyhow!("a client did not finish sending"))???;
    }
    // The replica keeps serving, and its writer is whole.
    let answer = ca.append("bot", "d", &[rec("after", "x")]).await?;
    ensure!(
        answer.status == StatusCode::OK,
        "after the disconnects: {}",
        answer.text
    );
    for round in 0..2 {
        let served = ca.session("bot", "d").await?;
        let mut per_client: BTreeMap<String, usize> = BTreeMap::new();
        for r in &served {
            let id = r["id"].as_str().unwrap_or("");
            if id == "after" {
                continue;
            }
            let client = id.split_once('-').map(|(c, _)| c).unwrap_or(id);
            let sent = client
                .strip_prefix('t')
                .map(|k| (k, TAKEN))
                .or_else(|| client.strip_prefix('d').map(|k| (k, CLIENTS)))
                .is_some_and(|(k, n)| k.parse::<usize>().is_ok_and(|k| k < n));
            ensure!(sent, "round {round}: {id} is served but no client sent it");
            *per_client.entry(client.to_string()).or_default() += 1;
        }
        for (client, n) in &per_client {
            ensure!(
                *n == PER,
                "round {round}: {n} of {PER} records of {client}'s batch are served"
            );
        }
        for k in 0..TAKEN {
            ensure!(
                per_client.contains_key(&format!("t{k}")),
                "round {round}: batch t{k}, taken before its client hung up, is not served"
            );
        }
        ensure!(served.iter().any(|r| r["id"] == "after"));
    }
    ensure!(ca.get("/healthz").await?.status == StatusCode::OK);
    Ok(())
}

/// Wait until the replica has taken `n` append requests (its `/metrics` count of them).
async fn appends_taken(client: &Http, n: usize) -> anyhow::Result<()> {
    loop {
        let metrics = client.get("/metrics").await?;
        let taken = metrics
            .text
            .lines()
            .find_map(|l| l.strip_prefix("ctxlog_append_request_records_count "))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .with_context(|| format!("no count of append requests in {}", metrics.text))?;
        if taken >= n {
            return Ok(());
        }
        tokio::task::yield_now().await;
    }
}

/// SIGTERM while a watcher is connected: the watch stream ends, the process exits 0 within
/// its bound, and every acknowledged append is there for the next replica.
async fn serve_sigterm_ends_streams_keeps_acks_and_exits_zero(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let ca = a.client();
    let mut events = watch(&ca, "/v1/bots/bot/sessions/t/watch", None, ctx.backend.op_timeout).await?;
    let records: Vec<Value> = (0..20).map(|i| rec(&format!("t-{i}"), "x")).collect();
    ensure!(ca.append("bot", "t", &records).await?.status == StatusCode::OK);
    let first = events.next(ctx.backend.op_timeout).await?;
    ensure!(first.data["id"] == "t-0", "{first:?}");
    let status = a.terminate(ctx.backend.op_timeout + Duration::from_secs(10)).await?;
    ensure!(status.success(), "the server exited {status} on SIGTERM");
    // The stream ended with the process: its remaining events, then an `end` that says why
    // and where to resume from.
    let mut last = first;
    let mut rest = 0;
    let end = loop {
        let e = events
            .next(Duration::from_secs(10))
            .await
            .context("the stream ended without an `end` event")?;
        if e.event == "end" {
            break e;
        }
        rest += 1;
        ensure!(rest <= 19, "more events than records");
        last = e;
    };
    ensure!(
        end.data["reason"] == "shutdown" && end.data["resume"] == true && end.id == last.id,
        "the stream ended with {end:?} after {last:?}"
    );
    let b = replica(&ctx, "replica-b").await?;
    let served = b.client().session("bot", "t").await?;
    ensure!(served.len() == 20, "{} of 20 acknowledged records served", served.len());
    Ok(())
}

/// Rule 21 over HTTP: records are appended through replica B, a client reads the session's
/// context through B, records keep arriving through replica A while it summarises, and it
/// writes the summary through A with the position B gave it (A takes it only once its view
/// holds that position: the deterministic case is the server's own test of two replicas). Both replicas then serve the same context view: the
/// summary, and every record appended after B's read; B's watchers see the summary arrive
/// as a record of kind `summary`. A summary naming positions no replica gave out is refused.
async fn serve_a_summary_written_through_another_replica_covers_only_what_was_read(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let b = replica(&ctx, "replica-b").await?;
    let (ca, cb) = (a.client(), b.client());
    let within = ctx.backend.op_timeout * 2;
    let before: Vec<Value> = (0..6).map(|i| rec(&format!("before-{i}"), "x")).collect();
    ensure!(cb.append("bot", "c", &before).await?.status == StatusCode::OK);
    let read = cb.get("/v1/bots/bot/sessions/c/context").await?;
    ensure!(read.status == StatusCode::OK, "{}", read.text);
    ensure!(
        read.json["records"].as_array().map(Vec::len) == Some(6),
        "{}",
        read.text
    );
    let path = "/v1/bots/bot/sessions/c/watch";
    let mut events = watch(&cb, path, read.json["position"].as_str(), within).await?;
    // While the summariser works, more records arrive through A.
    let during: Vec<Value> = (0..4).map(|i| rec(&format!("during-{i}"), "x")).collect();
    ensure!(ca.append("bot", "c", &during).await?.status == StatusCode::OK);
    let summary = json!({"id": "sum", "role": "summary", "text": "six records", "kind": "summary",
                         "covers": read.json["covers"]});
    let ack = ca.append("bot", "c", &[summary]).await?;
    ensure!(ack.status == StatusCode::OK, "{}", ack.text);
    for c in [&ca, &cb] {
        let view = c.get("/v1/bots/bot/sessions/c/context").await?;
        ensure!(view.status == StatusCode::OK, "{}", view.text);
        let ids: BTreeSet<&str> = view.json["records"]
            .as_array()
            .context("records")?
            .iter()
            .filter_map(|r| r["id"].as_str())
            .collect();
        let want: BTreeSet<&str> = ["sum", "during-0", "during-1", "during-2", "during-3"].into();
        ensure!(ids == want, "the context view holds {ids:?}");
        ensure!(
            view.json["summary"] == "sum" && view.json["covered"] == 6,
            "{}",
            view.text
        );
        // The full session view keeps every record.
        ensure!(c.session("bot", "c").await?.len() == 11);
    }
    let mut seen = Vec::new();
    while seen.len() < 5 {
        let e = events.next(within).await?;
        seen.push((e.data["id"].as_str().unwrap_or("").to_string(), e.data["kind"].clone()));
    }
    ensure!(
        seen.iter().any(|(id, kind)| id == "sum" && kind == "summary"),
        "the watcher saw {seen:?}"
    );
    // A covers token no replica gave out (this view's, its seq far past the shard's end) is
    // refused.
    let shard = ack.json["shard"].as_str().context("shard")?;
    let token = String::from_utf8(base64_decode(read.json["covers"].as_str().context("covers")?)?)?;
    let (scope, _) = token.rsplit_once('.').context("a covers token")?;
    let forged = base64_encode(&format!("{scope}.{shard}=1000000"));
    let bad = json!({"id": "forged", "role": "summary", "text": "x", "kind": "summary", "covers": forged});
    let refused = ca.append("bot", "c", &[bad]).await?;
    ensure!(
        refused.status == StatusCode::BAD_REQUEST
            && refused.json["field"] == "covers"
            && refused.text.contains("past what the store holds"),
        "{}",
        refused.text
    );
    Ok(())
}

/// Rule 25 across processes: replica A forks session `p` while replica B appends to it; B's
/// read of `p` as of the fork's position is exactly what the fork inherited, both replicas
/// serve the fork byte for byte alike, and `p` keeps every record. Rule 26 across
/// processes: a record acknowledged by A is found by B's next search, both answer byte for
/// byte alike, and a tombstone through B takes it out of A's; A's saved search index is
/// where a cold replica C's first search starts.
async fn serve_a_fork_or_a_search_through_one_replica_agrees_with_another(ctx: Ctx) -> anyhow::Result<()> {
    ctx.store().await?;
    let a = replica(&ctx, "replica-a").await?;
    let b = replica(&ctx, "replica-b").await?;
    let (ca, cb) = (a.client(), b.client());
    let first: Vec<Value> = (0..5).map(|i| rec(&format!("p-{i}"), "x")).collect();
    ensure!(cb.append("bot", "p", &first).await?.status == StatusCode::OK);
    let appender = {
        let cb = cb.clone();
        tokio::spawn(async move {
            for i in 0..20 {
                let r = cb.append("bot", "p", &[rec(&format!("late-{i}"), "y")]).await?;
                ensure!(r.status == StatusCode::OK, "{}", r.text);
            }
            anyhow::Ok(())
        })
    };
    let forked = ca
        .post("/v1/bots/bot/sessions/f/fork", &json!({"from": "p", "id": "fork-1"}))
        .await?;
    ensure!(forked.status == StatusCode::OK, "{}", forked.text);
    ensure!(ca.append("bot", "f", &[rec("f-0", "own")]).await?.status == StatusCode::OK);
    appender.await??;
    let at = forked.json["at"].as_str().context("at")?;
    let inherited = cb
        .get(&format!("/v1/bots/bot/sessions/p/records?limit=1000&at={at}"))
        .await?;
    ensure!(inherited.status == StatusCode::OK, "{}", inherited.text);
    let mut want = inherited.json["records"].as_array().context("records")?.clone();
    ensure!(want.len() >= 5, "B as of the fork's position: {}", inherited.text);
    let fork_a = ca.session("bot", "f").await?;
    let fork_b = cb.session("bot", "f").await?;
    ensure!(fork_a == fork_b, "the replicas serve the fork differently");
    ensure!(
        fork_a.last().and_then(|r| r["id"].as_str()) == Some("f-0"),
        "{fork_a:?}"
    );
    want.push(fork_a.last().cloned().context("the fork's own record")?);
    ensure!(
        fork_a == want,
        "the fork is not B's view of p as of its position, then its own: {fork_a:?}"
    );
    ensure!(cb.session("bot", "p").await?.len() == 25, "the parent lost records");
    ensure!(
        ca.append("bot", "q", &[rec("needle", "a zanzibar needle")])
            .await?
            .status
            == StatusCode::OK
    );
    let query = json!({"query": "zanzibar needle"});
    let found_b = cb.post("/v1/bots/bot/search", &query).await?;
    let found_a = ca.post("/v1/bots/bot/search", &query).await?;
    ensure!(
        found_b.json["hits"][0]["record"]["id"] == "needle",
        "B's search: {}",
        found_b.text
    );
    ensure!(
        found_a.json["hits"] == found_b.json["hits"],
        "{} vs {}",
        found_a.text,
        found_b.text
    );
    ensure!(cb.delete("/v1/bots/bot/records/needle").await?.status == StatusCode::OK);
    let gone = ca.post("/v1/bots/bot/search", &query).await?;
    ensure!(gone.json["hits"] == json!([]), "A still finds it: {}", gone.text);
    // A saves its search index (rule 26's derived data); a cold replica C starts from it and
    // reads only what came after (its count of entries read), answering as A does.
    let saved = ca.post("/v1/admin/snapshot", &json!({})).await?;
    ensure!(
        saved.status == StatusCode::OK && saved.json["report"]["search_index"]["saved"].is_string(),
        "A's snapshot: {}",
        saved.text
    );
    ensure!(cb.append("bot", "q", &[rec("later", "a zanzibar later")]).await?.status == StatusCode::OK);
    let c = replica(&ctx, "replica-c").await?;
    let cc = c.client();
    let query = json!({"query": "zanzibar"});
    let found_c = cc.post("/v1/bots/bot/search", &query).await?;
    let found_a = ca.post("/v1/bots/bot/search", &query).await?;
    ensure!(
        found_c.json["hits"][0]["record"]["id"] == "later",
        "C's search: {}",
        found_c.text
    );
    ensure!(
        found_c.json["hits"] == found_a.json["hits"],
        "{} vs {}",
        found_c.text,
        found_a.text
    );
    let metrics = cc.get("/metrics").await?;
    let read = metrics
        .text
        .lines()
        .find_map(|l| l.strip_prefix("ctxlog_search_entries_read_total "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .with_context(|| format!("no count of entries searched in {}", metrics.text))?;
    ensure!(
        read == 1,
        "the cold replica's searcher read {read} entries, not the 1 past A's saved index"
    );
    Ok(())
}

/// A position as the server encodes one (URL-safe base64 of its text, no padding).
fn base64_encode(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    use base64::Engine;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(text)?)
}
