//! The loopback S3 server itself: every later result on `lance_s3` means something only if
//! the server honours conditional writes as S3 does — a second put-if-absent of a key, and
//! a put whose `If-Match` names another version, both fail with 412, and of writers racing
//! one such write exactly one wins.
#![cfg(feature = "s3")]

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, PutResult, UpdateVersion};

/// A client of a new bucket on the shared loopback server.
fn fresh_bucket() -> AmazonS3 {
    let server = s3_loopback::shared().expect("the loopback S3 server");
    let root = tempfile::tempdir().unwrap();
    let bucket = s3_loopback::bucket_for(root.path());
    server.create_bucket(&bucket).unwrap();
    let mut builder = AmazonS3Builder::new().with_bucket_name(&bucket);
    for (k, v) in server.storage_options() {
        builder = builder.with_config(k.parse().unwrap(), v);
    }
    builder.build().unwrap()
}

/// A server of its own with a latency: each request waits it out and is counted once.
#[tokio::test]
async fn a_dedicated_server_delays_and_counts_each_request() {
    let latency = Duration::from_millis(50);
    let server = tokio::task::spawn_blocking(move || s3_loopback::dedicated(latency))
        .await
        .unwrap()
        .expect("a dedicated loopback S3 server");
    server.create_bucket("counted").unwrap();
    let mut builder = AmazonS3Builder::new().with_bucket_name("counted");
    for (k, v) in server.storage_options() {
        builder = builder.with_config(k.parse().unwrap(), v);
    }
    let s3 = builder.build().unwrap();
    let before = server.requests().unwrap();
    let started = std::time::Instant::now();
    s3.put(&Path::from("k"), "v".into()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(server.requests().unwrap() - before, 1, "one put, one request");
    assert!(
        took >= latency,
        "a put answered in {took:?}, under the latency of {latency:?}"
    );
}

#[tokio::test]
async fn the_loopback_server_honours_conditional_writes() {
    let s3 = fresh_bucket();
    let key = Path::from("k");
    let create = |body: &'static str| {
        let s3 = &s3;
        let key = &key;
        async move { s3.put_opts(key, body.into(), PutOptions::from(PutMode::Create)).await }
    };
    let first = create("first").await.expect("a first put-if-absent succeeds");
    match create("second").await {
        Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => {}
        other => panic!("a second put-if-absent must fail with 412, got {other:?}"),
    }
    let stale = UpdateVersion {
        e_tag: Some("\"not-the-etag\"".into()),
        version: None,
    };
    match s3
        .put_opts(&key, "third".into(), PutOptions::from(PutMode::Update(stale)))
        .await
    {
        Err(object_store::Error::Precondition { .. }) => {}
        other => panic!("a put with a stale If-Match must fail with 412, got {other:?}"),
    }
    let current = UpdateVersion {
        e_tag: first.e_tag.clone(),
        version: None,
    };
    s3.put_opts(&key, "fourth".into(), PutOptions::from(PutMode::Update(current)))
        .await
        .expect("a put whose If-Match names the current version succeeds");
    let body = s3.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(&body[..], b"fourth");
}

/// The harness serves a range GET by reading only the range (moto itself reads the whole
/// object, see `s3_loopback`): every kind of range must still answer what S3 answers, on an
/// object large enough to live in moto's spooled file and on a small one held in memory.
#[tokio::test]
async fn the_loopback_server_answers_ranges_as_s3_does() {
    use object_store::GetRange;
    let s3 = fresh_bucket();
    for len in [6 << 20, 1000] {
        let body: Vec<u8> = (0..len)
            .map(|i: usize| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let key = Path::from(format!("object-{len}"));
        s3.put(&key, body.clone().into()).await.unwrap();
        let n = len as u64;
        let ranges = [
            (GetRange::Bounded(0..1), 0..1),
            (GetRange::Bounded(17..n / 2 + 3), 17..len / 2 + 3),
            (GetRange::Bounded(n - 5..n), len - 5..len),
            (GetRange::Bounded(n - 5..n + 100), len - 5..len),
            (GetRange::Offset(n - 9), len - 9..len),
            (GetRange::Suffix(11), len - 11..len),
        ];
        for (range, expected) in ranges {
            let got = s3
                .get_opts(
                    &key,
                    object_store::GetOptions {
                        range: Some(range.clone()),
                        ..Default::default()
                    },
                )
                .await
                .unwrap_or_else(|e| panic!("{len}-byte object, {range:?}: {e}"))
                .bytes()
                .await
                .unwrap();
            assert!(
                got[..] == body[expected.clone()],
                "{len}-byte object, {range:?}: wrong bytes"
            );
        }
        assert!(
            s3.get_range(&key, n + 1..n + 2).await.is_err(),
            "a range past the end is refused"
        );
        let whole = s3.get(&key).await.unwrap().bytes().await.unwrap();
        assert!(whole[..] == body[..], "{len}-byte object: the whole object");
    }
}

/// Writers racing one conditional write, and rounds of each race.
const WRITERS: usize = 16;
const ROUNDS: usize = 40;
/// Over moto's in-memory limit for an object (5 MiB less 1 KiB): moto writes such a body to a
/// temporary file, releasing Python's lock mid-write, which is where an unguarded
/// check-then-write lets a second writer through. Every other round uses small bodies.
const LARGE: usize = 6 << 20;
/// The deadline of one round (two races of `WRITERS` writes, a check and a clean-up).
const ROUND_DEADLINE: Duration = Duration::from_secs(180);

/// Each writer's result when all start together on `key` with `mode`, one body each.
async fn race(
    s3: &Arc<AmazonS3>,
    key: &Path,
    mode: &PutMode,
    bodies: &[PutPayload],
) -> Vec<object_store::Result<PutResult>> {
    let start = Arc::new(tokio::sync::Barrier::new(bodies.len()));
    let writers: Vec<_> = bodies
        .iter()
        .map(|body| {
            let (s3, key, start) = (Arc::clone(s3), key.clone(), Arc::clone(&start));
            let (body, options) = (body.clone(), PutOptions::from(mode.clone()));
            tokio::spawn(async move {
                start.wait().await;
                s3.put_opts(&key, body, options).await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(writers.len());
    for w in writers {
        results.push(w.await.expect("a writer panicked"));
    }
    results
}

/// The one winner of a race; every other writer must have lost with 412.
async fn one_winner(s3: &AmazonS3, key: &Path, what: &str, results: Vec<object_store::Result<PutResult>>) {
    let mut won = Vec::new();
    let mut lost = 0;
    for r in results {
        match r {
            Ok(put) => won.push(put),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }) => lost += 1,
            Err(e) => panic!("{what}: a writer failed otherwise than with 412: {e}"),
        }
    }
    assert!(
        won.len() == 1 && lost == WRITERS - 1,
        "{what}: {} of {WRITERS} writers won and {lost} lost with 412; exactly one must win",
        won.len()
    );
    let stored = s3.head(key).await.unwrap_or_else(|e| panic!("{what}: head: {e}"));
    assert_eq!(stored.e_tag, won[0].e_tag, "{what}: the stored object is the winner's");
}

/// Many writers racing a put-if-absent of one new key, and many racing an `If-Match` put
/// naming the key's one current ETag, round after round: exactly one wins each race, as on
/// S3 (moto alone checks the condition and then writes with nothing held between, and let
/// two through; the harness's launcher makes each key's check and write one step).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_writers_racing_a_conditional_write_exactly_one_wins() {
    let s3 = Arc::new(fresh_bucket());
    // Distinct bodies, so that a winner's ETag is no other writer's.
    let bodies_of = |len: usize| -> Vec<PutPayload> {
        (0..WRITERS)
            .map(|w| {
                let mut body = format!("writer {w} ").into_bytes();
                body.resize(len.max(body.len()), w as u8);
                PutPayload::from(body)
            })
            .collect()
    };
    let (large, small) = (bodies_of(LARGE), bodies_of(0));
    for round in 0..ROUNDS {
        let bodies = if round % 2 == 0 { &large } else { &small };
        let size = bodies[0].content_length();
        let round_of = async {
            let key = Path::from(format!("create-{round}"));
            let what = format!("round {round}, put-if-absent of {size}-byte bodies");
            let results = race(&s3, &key, &PutMode::Create, bodies).await;
            one_winner(&s3, &key, &what, results).await;
            s3.delete(&key).await.unwrap();

            let key = Path::from(format!("update-{round}"));
            let what = format!("round {round}, If-Match put of {size}-byte bodies");
            let current = s3.put(&key, "initial".into()).await.unwrap();
            let mode = PutMode::Update(UpdateVersion {
                e_tag: current.e_tag,
                version: None,
            });
            let results = race(&s3, &key, &mode, bodies).await;
            one_winner(&s3, &key, &what, results).await;
            s3.delete(&key).await.unwrap();
        };
        tokio::time::timeout(ROUND_DEADLINE, round_of)
            .await
            .unwrap_or_else(|_| panic!("round {round} did not finish within {ROUND_DEADLINE:?}"));
    }
}
