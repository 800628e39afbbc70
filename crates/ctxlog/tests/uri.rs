//! Store URIs: unknown schemes, names that say no backend, and missing stores all fail
//! before anything is written (rules 11, 12).

use ctxlog::{Error, StoreOptions};

#[tokio::test]
async fn bad_uris_fail_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let opts = StoreOptions::default();
    match ctxlog::open("ftp://example.com/log", opts.clone()).await {
        Err(e @ Error::UnknownScheme { .. }) => assert!(e.is_definite() && e.is_invalid_input()),
        other => panic!("ftp:// must be an unknown scheme, got {:?}", other.err()),
    }
    let nameless = dir.path().join("no-extension");
    match ctxlog::open(&nameless.to_string_lossy(), opts.clone()).await {
        Err(Error::InvalidInput { field: "uri", .. }) => {}
        other => panic!("a path naming no backend: {:?}", other.err()),
    }
    assert!(!nameless.exists(), "nothing was created");
    let timeout = opts.clone().with_timeout(std::time::Duration::ZERO);
    match ctxlog::open("sqlite:x.db", timeout).await {
        Err(Error::InvalidInput { field: "timeout", .. }) => {}
        other => panic!("a zero deadline: {:?}", other.err()),
    }
    for uri in [
        format!("sqlite:{}", dir.path().join("missing.db").display()),
        #[cfg(feature = "lance")]
        dir.path().join("missing.lance").display().to_string(),
    ] {
        let err = ctxlog::open(&uri, opts.clone().with_create_if_missing(false))
            .await
            .err()
            .unwrap_or_else(|| panic!("opening a missing store without create must fail: {uri}"));
        assert!(matches!(err, Error::NotFound { .. }), "{uri}: {err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing was created");
}
