//! `ctxlog demo`: three replicas of a help-desk agent write one log at once.
//!
//! Two replicas serve the same ticket turn by turn (each observes the other's last HLC, so
//! the session reads in causal order), one replica retries a write whose ack it "lost", one
//! replica regenerates a turn that another already answered (a divergent put: the first
//! writer wins), and a user asks to forget a message (a tombstone).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctxlog::{Body, Conflict, Hlc, OrderKey, Record, Store, StoreOptions, WriterId};
use tokio::sync::mpsc;

use crate::Failure;

const BOT: &str = "helpdesk";

fn msg(session: &str, n: u32, role: &str, text: &str) -> Record {
    let mut r = Record::text(format!("{session}/m{n:02}"), BOT, session, role, text);
    r.metadata = Some(serde_json::json!({"turn": n}));
    r.created_at = Some(chrono::Utc::now());
    r
}

fn tool_call(session: &str, n: u32, tool: &str, payload: serde_json::Value) -> Record {
    let mut r = msg(session, n, "tool", "");
    r.content_type = "application/json".into();
    r.body = Body::Text(payload.to_string());
    r.metadata = Some(serde_json::json!({"turn": n, "tool": tool}));
    r
}

/// What one replica did, for the timing report.
#[derive(Default)]
struct Tally {
    batches: u64,
    records: u64,
    latencies: Vec<Duration>,
}

struct Replica {
    shard: Box<dyn ctxlog::Shard>,
    tally: Tally,
}

impl Replica {
    async fn open(store: &Arc<dyn Store>, name: &str) -> Result<Self, Failure> {
        let shard = store.open_shard(&WriterId::new(name)?).await?;
        Ok(Replica {
            shard,
            tally: Tally::default(),
        })
    }

    async fn write(&mut self, records: Vec<Record>) -> Result<Hlc, Failure> {
        let n = records.len() as u64;
        let started = Instant::now();
        let ack = self.shard.append(records).await?;
        self.tally.latencies.push(started.elapsed());
        self.tally.batches += 1;
        self.tally.records += n;
        Ok(ack.last_hlc)
    }

    async fn finish(self) -> Result<Tally, Failure> {
        self.shard.close().await?;
        Ok(self.tally)
    }
}

/// Replica A opens ticket-1042 and hands turns to replica B through `baton`.
async fn replica_a(
    store: Arc<dyn Store>,
    to_b: mpsc::Sender<Hlc>,
    mut from_b: mpsc::Receiver<Hlc>,
) -> Result<Tally, Failure> {
    let t = "ticket-1042";
    let mut r = Replica::open(&store, "replica-a").await?;
    let hlc = r
        .write(vec![
            msg(t, 1, "user", "Hi, I was charged twice for order 8812."),
            msg(t, 2, "assistant", "Sorry about that! Let me look up order 8812."),
        ])
        .await?;
    r.write(vec![tool_call(
        t,
        3,
        "lookup_order",
        serde_json::json!({"order": 8812, "charges": [49.0, 49.0]}),
    )])
    .await?;
    let _ = to_b.send(hlc).await;
    // B answers turns 4-5; A continues after observing B's last write.
    if let Some(seen) = from_b.recv().await {
        r.shard.observe(seen)?;
    }
    r.write(vec![
        msg(t, 6, "user", "Great. Also, my number changed: it's +1 555 0100."),
        msg(t, 7, "assistant", "Thanks, I've noted it on your ticket."),
    ])
    .await?;
    r.write(vec![msg(t, 8, "user", "Actually, please forget that number.")])
        .await?;
    // The user's request: a tombstone hides turn 6 for good.
    let mut forget = Record::tombstone(format!("{t}/m06"), BOT, t);
    forget.created_at = Some(chrono::Utc::now());
    r.write(vec![
        forget,
        msg(t, 9, "assistant", "Done, it's gone from this conversation."),
    ])
    .await?;
    r.finish().await
}

/// Replica B takes over ticket-1042 mid-conversation and retries one write.
async fn replica_b(
    store: Arc<dyn Store>,
    mut from_a: mpsc::Receiver<Hlc>,
    to_a: mpsc::Sender<Hlc>,
) -> Result<Tally, Failure> {
    let t = "ticket-1042";
    let mut r = Replica::open(&store, "replica-b").await?;
    // Meanwhile, its own onboarding session.
    let o = "onboarding-7";
    r.write(vec![
        msg(o, 1, "user", "How do I connect my calendar?"),
        msg(
            o,
            2,
            "assistant",
            "Open Settings → Integrations and choose Google or Outlook.",
        ),
    ])
    .await?;
    if let Some(seen) = from_a.recv().await {
        r.shard.observe(seen)?;
    }
    let refund = msg(
        t,
        4,
        "assistant",
        "I see two charges of $49. I've refunded the duplicate.",
    );
    r.write(vec![refund.clone()]).await?;
    // The ack was "lost" (say, a proxy timed out): the replica retries with the same id.
    // Same content, so the projection keeps one copy (rule 6).
    let mut retry = refund;
    retry.created_at = Some(chrono::Utc::now());
    r.write(vec![retry]).await?;
    let hlc = r
        .write(vec![msg(
            t,
            5,
            "assistant",
            "You'll see it on your statement in 3–5 business days.",
        )])
        .await?;
    let _ = to_a.send(hlc).await;
    r.write(vec![msg(o, 3, "user", "Connected, thanks!")]).await?;
    r.finish().await
}

/// Replica C serves ticket-1043, and regenerates a turn of ticket-1042 that replica B has
/// (or will have) written: a divergent put. The earliest write in HLC order wins.
async fn replica_c(store: Arc<dyn Store>) -> Result<Tally, Failure> {
    let t = "ticket-1043";
    let mut r = Replica::open(&store, "replica-c").await?;
    r.write(vec![
        msg(t, 1, "user", "Can I change the shipping address on order 9120?"),
        msg(t, 2, "assistant", "Yes, until it ships. What's the new address?"),
    ])
    .await?;
    r.write(vec![msg(t, 3, "user", "221B Baker Street, London.")]).await?;
    r.write(vec![msg(
        "ticket-1042",
        5,
        "assistant",
        "Refunds usually take up to 10 days.",
    )])
    .await?;
    r.write(vec![msg(
        t,
        4,
        "assistant",
        "Updated. You'll get a confirmation email shortly.",
    )])
    .await?;
    r.finish().await
}

pub(crate) async fn run(store_uri: Option<&str>, options: StoreOptions) -> Result<ExitCode, Failure> {
    let uri = match store_uri {
        Some(u) => u.to_string(),
        None => {
            let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S");
            let path = std::env::temp_dir().join(format!("ctxlog-demo-{stamp}-{}.db", std::process::id()));
            format!("sqlite:{}", path.display())
        }
    };
    let store = ctxlog::open(&uri, options).await?;
    // Never print a URI's query string: it carries storage options (credentials).
    let shown = ctxlog::redact_uri(&uri);
    println!("ctxlog demo — store {shown} ({} backend)\n", store.backend());

    let started = Instant::now();
    let (a_to_b, b_from_a) = mpsc::channel(1);
    let (b_to_a, a_from_b) = mpsc::channel(1);
    let (a, b, c) = tokio::join!(
        tokio::spawn(replica_a(store.clone(), a_to_b, a_from_b)),
        tokio::spawn(replica_b(store.clone(), b_from_a, b_to_a)),
        tokio::spawn(replica_c(store.clone())),
    );
    let wall = started.elapsed();
    let mut tallies = Vec::new();
    for (name, joined) in [("replica-a", a), ("replica-b", b), ("replica-c", c)] {
        match joined {
            Ok(t) => tallies.push((name, t?)),
            Err(e) => {
                return Err(ctxlog::Error::backend("demo", "writer task", None, ctxlog::Written::Unknown, e).into());
            }
        }
    }
    let records: u64 = tallies.iter().map(|(_, t)| t.records).sum();
    let batches: u64 = tallies.iter().map(|(_, t)| t.batches).sum();
    let mut lat: Vec<Duration> = tallies.iter().flat_map(|(_, t)| t.latencies.iter().copied()).collect();
    lat.sort();
    println!(
        "3 replicas appended {records} records in {batches} durable batches, concurrently, in {:.1} ms",
        ms(wall)
    );
    println!(
        "append latency: p50 {:.2} ms, max {:.2} ms\n",
        ms(lat[lat.len() / 2]),
        ms(*lat.last().expect("batches were written"))
    );

    let writers: HashMap<ctxlog::ShardId, String> = store
        .shards()
        .await?
        .into_iter()
        .map(|s| (s.shard, s.writer.to_string()))
        .collect();
    let who = |k: &OrderKey| format!("{}#{}", writers.get(&k.shard).map_or("?", String::as_str), k.seq);

    let mut projector = store.projector();
    let t0 = Instant::now();
    projector.refresh().await?;
    let first_scan = t0.elapsed();

    for session in ["ticket-1042", "ticket-1043", "onboarding-7"] {
        let view = projector.session(BOT, session).await?;
        println!(
            "── {BOT} / {session}: {} live records, in (hlc, shard, seq) order",
            view.len()
        );
        for e in &view {
            let text = match &e.record.body {
                Body::Text(t) => t.clone(),
                Body::Bytes(b) => format!("<{} bytes>", b.len()),
            };
            println!("  {:<12} {:<10} {}", who(&e.key()), e.record.role, text);
        }
        println!();
    }

    let t1 = Instant::now();
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    let discovery = t1.elapsed();
    println!("── conflict report: {} found", conflicts.len());
    for c in &conflicts {
        match c {
            Conflict::DivergentPut { id, winner, entry, .. } => println!(
                "  divergent_put       {id}: {} wrote it first and stands; {} wrote other content, ignored",
                who(winner),
                who(entry)
            ),
            Conflict::WriteAfterDelete {
                id, tombstone, entry, ..
            } => println!(
                "  write_after_delete  {id}: {} wrote after the tombstone {}; it stays deleted",
                who(entry),
                who(tombstone)
            ),
            other => println!("  {:<19} {}", other.kind().as_str(), crate::json::conflict_json(other)),
        }
    }
    let stats = projector.stats();
    println!(
        "\n── projection: {} entries from {} shards → {} live records in {} sessions; {} retried duplicate(s) ignored, {} tombstoned",
        stats.entries, stats.shards, stats.live, stats.sessions, stats.duplicates, stats.tombstoned
    );
    println!(
        "── timings: first scan {:.2} ms, conflict discovery {:.2} ms",
        ms(first_scan),
        ms(discovery)
    );
    let hidden = projector.get(BOT, "ticket-1042/m06").await?;
    println!(
        "── the forgotten message ticket-1042/m06 is {}",
        if hidden.is_none() {
            "gone from every view"
        } else {
            "STILL VISIBLE (bug!)"
        }
    );
    // `cargo run` puts no `ctxlog` on the PATH: show commands that work as printed.
    println!(
        "\nTry it yourself (from the repository; or `cargo install --path crates/ctxlog-cli` and use `ctxlog`):\n  \
         cargo run --release -- --store {shown} session --bot {BOT} --session ticket-1042\n  \
         cargo run --release -- --store {shown} conflicts"
    );
    Ok(ExitCode::SUCCESS)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
