//! Micro-benchmarks of the core: content hash, HLC tick, reference-model projection, the
//! projection index built from rows against the same index loaded from a snapshot, and a
//! durable SQLite append of a 100-record batch.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use ctxlog_core::backend::HlcClock;
use ctxlog_core::backend::index::{IndexRow, ProjectionIndex};
use ctxlog_core::backend::snapshot;
use ctxlog_core::testing::model;
use ctxlog_core::{Entry, Hlc, Record, Store, StoreOptions, SystemClock, WriterId};

fn record(i: usize) -> Record {
    let mut r = Record::text(
        format!("msg-{i:08}"),
        "bot-1",
        format!("session-{}", i % 97),
        if i.is_multiple_of(2) { "user" } else { "assistant" },
        "x".repeat(600),
    );
    r.metadata = Some(serde_json::json!({"turn": i, "model": "m-1"}));
    r
}

fn entries(n: usize) -> Vec<Entry> {
    let shards: Vec<_> = (0..4)
        .map(|w| WriterId::new(format!("w{w}")).unwrap().shard_id())
        .collect();
    (0..n)
        .map(|i| {
            let record = record(i);
            Entry {
                shard: shards[i % 4],
                seq: (i / 4 + 1) as u64,
                epoch: 1,
                hlc: Hlc(i as u64),
                content_hash: record.content_hash(),
                record,
                purged: false,
            }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let r = record(1);
    let mut g = c.benchmark_group("core");
    g.throughput(Throughput::Bytes(600));
    g.bench_function("content_hash_600B", |b| b.iter(|| black_box(&r).content_hash()));
    g.throughput(Throughput::Elements(1));
    let mut clock = HlcClock::new(Arc::new(SystemClock), Hlc::ZERO);
    g.bench_function("hlc_tick", |b| b.iter(|| clock.tick()));

    let es = entries(10_000);
    g.throughput(Throughput::Elements(es.len() as u64));
    g.bench_function("reference_model_project_10k", |b| {
        b.iter(|| model::project(black_box(&es)))
    });
    g.bench_function("projection_index_apply_10k", |b| {
        b.iter(|| {
            let mut idx = ProjectionIndex::new();
            for e in &es {
                idx.apply(IndexRow::of(e));
            }
            idx
        })
    });
    g.finish();

    // What a snapshot saves a cold replica in memory: loading the index (checksum, one check
    // of every record, no decode) against building it from the rows, at the same size.
    let es = entries(100_000);
    let mut built = ProjectionIndex::new();
    for e in &es {
        built.apply(IndexRow::of(e));
    }
    let bytes = snapshot::encode(&mut built, "bench", Vec::new(), 0);
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(10);
    g.throughput(Throughput::Elements(es.len() as u64));
    g.bench_function("index_from_rows_100k", |b| {
        b.iter(|| {
            let mut idx = ProjectionIndex::new();
            idx.reserve(es.len());
            for e in &es {
                idx.apply(IndexRow::of(e));
            }
            idx
        })
    });
    // The same rows applied by one thread per part of the index (one per core).
    g.bench_function("index_from_rows_100k_parallel", |b| {
        b.iter(|| {
            let mut idx = ProjectionIndex::new();
            idx.reserve(es.len());
            let threads = idx.parts();
            let (_, done) = idx.apply_in_parallel(threads, es.chunks(1024), |chunk, applier| {
                chunk.iter().for_each(|e| applier.apply(IndexRow::of(e)));
                Ok::<(), ()>(())
            });
            done.unwrap();
            idx
        })
    });
    g.bench_function("index_from_snapshot_100k", |b| {
        b.iter_batched(
            || bytes.clone(),
            |bytes| snapshot::decode(black_box(bytes), "bench").map(|l| l.index).unwrap(),
            criterion::BatchSize::LargeInput,
        )
    });
    g.finish();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let store = rt
        .block_on(ctxlog_sqlite::SqliteStore::open(
            dir.path().join("bench.db"),
            StoreOptions::default(),
        ))
        .unwrap();
    let mut shard = rt.block_on(store.open_shard(&WriterId::new("bench").unwrap())).unwrap();
    let mut next = 0usize;
    let mut g = c.benchmark_group("sqlite");
    g.throughput(Throughput::Elements(100));
    g.bench_function("durable_append_batch_100", |b| {
        b.iter_batched(
            || {
                next += 100;
                (next - 100..next).map(record).collect::<Vec<_>>()
            },
            |batch| rt.block_on(shard.append(batch)).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
