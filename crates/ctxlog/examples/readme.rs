// The README's Rust example (`cargo run --example readme`): append a record, read its session back.
use ctxlog::{Record, StoreOptions, WriterId};

#[tokio::main]
async fn main() -> ctxlog::Result<()> {
    let store = ctxlog::open("sqlite:agents.db", StoreOptions::default()).await?;
    let mut shard = store.open_shard(&WriterId::new("replica-1")?).await?; // one per process
    shard
        .append(vec![Record::text("m1", "helpdesk", "t-1", "user", "hi")])
        .await?; // durable on Ok

    let mut view = store.projector(); // first scan, then incremental refresh
    for entry in view.session("helpdesk", "t-1").await? {
        println!("{} {}", entry.record.role, entry.record.id);
    }
    let conflicts = store.conflict_discovery().conflicts(None).await?;
    println!("{} conflicts", conflicts.len());
    shard.close().await
}
