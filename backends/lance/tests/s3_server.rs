//! The loopback S3 server itself: every later result on `lance_s3` means something only if
//! the server honours conditional writes as S3 does — a second put-if-absent of a key, and
//! a put whose `If-Match` names another version, both fail with 412.
#![cfg(feature = "s3")]

use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, UpdateVersion};

#[tokio::test]
async fn the_loopback_server_honours_conditional_writes() {
    let server = s3_loopback::shared().expect("the loopback S3 server");
    let root = tempfile::tempdir().unwrap();
    let bucket = s3_loopback::bucket_for(root.path());
    server.create_bucket(&bucket).unwrap();
    let mut builder = AmazonS3Builder::new().with_bucket_name(&bucket);
    for (k, v) in server.storage_options() {
        builder = builder.with_config(k.parse().unwrap(), v);
    }
    let s3 = builder.build().unwrap();
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
