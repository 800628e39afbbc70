//! The README's Rust example, run as written: its one `rust` block is this crate's
//! `examples/readme.rs`, byte for byte, and it runs against a fresh store.
#![cfg(feature = "sqlite")]

/// The example as written; `run` calls its `main`.
mod example {
    include!("../examples/readme.rs");

    pub(super) fn run() -> ctxlog::Result<()> {
        main()
    }
}

use ctxlog::StoreOptions;

/// Every block of `lang` in a Markdown text.
fn blocks<'a>(markdown: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    markdown
        .split(fence.as_str())
        .skip(1)
        .filter_map(|rest| rest.split_once("```").map(|(block, _)| block))
        .collect()
}

#[test]
fn the_readme_rust_example_runs_as_written() {
    let readme = include_str!("../../../README.md");
    assert_eq!(
        blocks(readme, "rust"),
        [include_str!("../examples/readme.rs")],
        "the README's one rust block is examples/readme.rs"
    );
    assert_eq!(
        readme.matches("```rust").count(),
        1,
        "a rust block the test would not see"
    );
    // The example opens `sqlite:agents.db` where it runs: in a directory of its own (a test
    // binary runs each test in a process of its own under nextest).
    let dir = tempfile::tempdir().unwrap();
    std::env::set_current_dir(dir.path()).unwrap();
    example::run().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = ctxlog::open("sqlite:agents.db", StoreOptions::default()).await.unwrap();
        let mut view = store.projector();
        let m1 = view
            .get("helpdesk", "m1")
            .await
            .unwrap()
            .expect("the example's record is in the store");
        assert_eq!(
            (m1.record.session_id.as_str(), m1.record.role.as_str()),
            ("t-1", "user")
        );
    });
}
