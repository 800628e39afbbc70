//! The loopback S3 server itself: every later result on `lance_s3` means something only if
//! the server honours conditional writes as S3 does — a second put-if-absent of a key, and
//! a put whose `If-Match` names another version, both fail with 412.
#![cfg(feature = "s3")]

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};

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
