//! Where a store keeps its saved search indexes ([`persist`](super::persist)), and how a
//! searcher loads the newest that passes every check and saves a new one.
//!
//! Naming:
//! - [`SavedIndexes`] is a store's place for them (a backend gives one through
//!   [`Store::saved_indexes`]): named blobs, newest first, the newest [`KEEP`] kept, and a
//!   *purge mark* that every purge changes;
//! - [`DirIndexes`] keeps them as files in a local directory (SQLite: beside the store file;
//!   Lance on a local disk: under the dataset), [`MemoryIndexes`] in memory (the reference
//!   store).
//!
//! Forgetting (rule 26): a saved index holds the terms and vectors of the records that were
//! live when it was saved. Every purge first changes the purge mark, then deletes every saved
//! index; a save that saw the mark change while it ran deletes what it put. So after a purge
//! no saved index holds a record the purge erased, and the next save (after a catch-up past
//! the tombstones) holds none of them either.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use super::persist;
use super::{Cells, Searcher};
use crate::backend::projector::SnapshotBlobs;
use crate::entry::Checkpoint;
use crate::error::{Error, Result, Written, with_deadline};
use crate::hlc::PhysicalClock;
use crate::traits::Store;

/// How many saved indexes a store keeps: a replica still loading the older one finishes.
pub const KEEP: usize = 2;

pub use crate::traits::SavedIndexes;

/// Change the purge mark, then delete every saved index: what a purge does, so that no saved
/// index holds what it erased. How many were deleted.
pub async fn forget(saved: &dyn SavedIndexes) -> Result<usize> {
    saved.remark().await?;
    let names = saved.names().await?;
    for name in &names {
        saved.delete(name).await?;
    }
    Ok(names.len())
}

/// A purge around its `erase`: every saved index forgotten before (an error then: nothing
/// erased) and after it (an error then: erased, `Written::Unknown`), so that none outlives
/// it, whichever save overlapped it.
pub async fn around_purge<T>(
    saved: Option<Arc<dyn SavedIndexes>>,
    backend: &'static str,
    erase: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    if let Some(s) = &saved {
        forget(&**s).await?;
    }
    let erased = erase.await?;
    if let Some(s) = &saved {
        forget(&**s)
            .await
            .map_err(|e| Error::backend(backend, "forget the saved search indexes", None, Written::Unknown, e))?;
    }
    Ok(erased)
}

/// The tag of a purge mark a saved index's name ends with: a saved index whose tag is not the
/// current mark's was begun before the last purge, and may hold what it erased.
pub fn tag(mark: Option<&str>) -> String {
    let hash = blake3::hash(mark.unwrap_or("").as_bytes());
    hash.to_hex()[..16].to_string()
}

/// The tag a saved index's name ends with.
fn tag_of(name: &str) -> Option<&str> {
    name.strip_suffix(SUFFIX)?.rsplit_once('-').map(|(_, t)| t)
}

/// Delete every saved index begun before the last purge (its tag is not the mark's): what
/// `gc` runs, so that a save that died between its put and its look at the mark leaves no
/// byte past the next `gc`. How many were deleted.
pub async fn sweep(saved: &dyn SavedIndexes) -> Result<usize> {
    let now = tag(saved.mark().await?.as_deref());
    let mut deleted = 0;
    for name in saved.names().await? {
        if tag_of(&name) != Some(now.as_str()) {
            saved.delete(&name).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Saved indexes as files `<millis>-<uuid>.idx` in a directory (made on the first save),
/// each written to a temporary file, synced and renamed into place; the purge mark a file
/// `purged`. The store's identity is its projection snapshots' ([`SnapshotBlobs`]).
#[derive(Clone)]
pub struct DirIndexes {
    dir: PathBuf,
    backend: &'static str,
    identity: Arc<dyn SnapshotBlobs>,
    clock: Arc<dyn PhysicalClock>,
}

impl std::fmt::Debug for DirIndexes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirIndexes")
            .field("dir", &self.dir)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

const SUFFIX: &str = ".idx";

impl DirIndexes {
    /// Saved indexes in `dir`, for `backend` (its errors name it), bound to the identity
    /// of `identity`'s store, named by `clock`'s time.
    pub fn new(
        dir: impl Into<PathBuf>,
        backend: &'static str,
        identity: Arc<dyn SnapshotBlobs>,
        clock: Arc<dyn PhysicalClock>,
    ) -> Self {
        DirIndexes {
            dir: dir.into(),
            backend,
            identity,
            clock,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    async fn blocking<T: Send + 'static>(
        &self,
        op: &'static str,
        written: Written,
        f: impl FnOnce(PathBuf) -> std::io::Result<T> + Send + 'static,
    ) -> Result<T> {
        let dir = self.dir.clone();
        let backend = self.backend;
        match tokio::task::spawn_blocking(move || f(dir)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Error::backend(backend, op, None, written, e)),
            Err(e) => Err(Error::backend(backend, op, None, written, e)),
        }
    }
}

fn names_in(dir: &std::path::Path) -> std::io::Result<Vec<String>> {
    let mut names = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(SUFFIX) && !name.starts_with('.') {
            names.push(name);
        }
    }
    names.sort_unstable_by(|a, b| b.cmp(a));
    Ok(names)
}

/// Write `bytes` to `dir/name` whole or not at all: a temporary file, synced, renamed, the
/// directory synced.
fn write_whole(dir: &std::path::Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    // Private to the store's owner: a saved index holds every bot's words.
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let tmp = dir.join(format!(".tmp-{}", uuid::Uuid::new_v4()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

fn remove(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[async_trait]
impl SavedIndexes for DirIndexes {
    async fn identity(&self, create: bool) -> Result<Option<String>> {
        self.identity.store_identity(create).await
    }

    async fn names(&self) -> Result<Vec<String>> {
        self.blocking("list saved search indexes", Written::Nothing, |dir| names_in(&dir))
            .await
    }

    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        if name.contains('/') || !name.ends_with(SUFFIX) {
            return Ok(None);
        }
        let name = name.to_string();
        self.blocking(
            "read a saved search index",
            Written::Nothing,
            move |dir| match std::fs::read(dir.join(name)) {
                Ok(bytes) => Ok(Some(bytes)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
        )
        .await
    }

    async fn put(&self, bytes: Vec<u8>, tag: &str) -> Result<String> {
        let name = format!(
            "{:020}-{}-{tag}{SUFFIX}",
            self.clock.now_millis(),
            uuid::Uuid::new_v4().simple()
        );
        let named = name.clone();
        self.blocking("save a search index", Written::Unknown, move |dir| {
            write_whole(&dir, &named, &bytes)?;
            for old in names_in(&dir)?.into_iter().skip(KEEP) {
                remove(&dir.join(old))?;
            }
            Ok(())
        })
        .await?;
        Ok(name)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        if name.contains('/') {
            return Ok(());
        }
        let name = name.to_string();
        self.blocking("delete a saved search index", Written::Unknown, move |dir| {
            remove(&dir.join(name))
        })
        .await
    }

    async fn mark(&self) -> Result<Option<String>> {
        self.blocking(
            "read the purge mark",
            Written::Nothing,
            |dir| match std::fs::read_to_string(dir.join("purged")) {
                Ok(mark) => Ok(Some(mark)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            },
        )
        .await
    }

    /// Also deletes every temporary file (a crashed save's, or one being written now, whose
    /// save then fails): it may hold what the purge erases.
    async fn remark(&self) -> Result<()> {
        self.blocking("change the purge mark", Written::Unknown, |dir| {
            write_whole(&dir, "purged", uuid::Uuid::new_v4().to_string().as_bytes())?;
            for entry in std::fs::read_dir(&dir)? {
                let path = entry?.path();
                if path
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-"))
                {
                    remove(&path)?;
                }
            }
            Ok(())
        })
        .await
    }
}

/// Saved indexes in memory (the reference store's).
#[derive(Debug, Default)]
pub struct MemoryIndexes {
    held: Mutex<Held>,
    identity: String,
}

#[derive(Debug, Default)]
struct Held {
    /// Name and bytes, oldest first.
    blobs: Vec<(String, Vec<u8>)>,
    mark: Option<String>,
    puts: u64,
}

impl MemoryIndexes {
    /// Saved indexes of the store `identity`.
    pub fn new(identity: impl Into<String>) -> Self {
        MemoryIndexes {
            held: Mutex::default(),
            identity: identity.into(),
        }
    }
}

#[async_trait]
impl SavedIndexes for MemoryIndexes {
    async fn identity(&self, _create: bool) -> Result<Option<String>> {
        Ok(Some(self.identity.clone()))
    }

    async fn names(&self) -> Result<Vec<String>> {
        let held = self.held.lock().expect("saved indexes");
        Ok(held.blobs.iter().rev().map(|(n, _)| n.clone()).collect())
    }

    async fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let held = self.held.lock().expect("saved indexes");
        Ok(held.blobs.iter().find(|(n, _)| n == name).map(|(_, b)| b.clone()))
    }

    async fn put(&self, bytes: Vec<u8>, tag: &str) -> Result<String> {
        let mut held = self.held.lock().expect("saved indexes");
        held.puts += 1;
        let name = format!("{:020}-{tag}{SUFFIX}", held.puts);
        held.blobs.push((name.clone(), bytes));
        let extra = held.blobs.len().saturating_sub(KEEP);
        held.blobs.drain(..extra);
        Ok(name)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        self.held
            .lock()
            .expect("saved indexes")
            .blobs
            .retain(|(n, _)| n != name);
        Ok(())
    }

    async fn mark(&self) -> Result<Option<String>> {
        Ok(self.held.lock().expect("saved indexes").mark.clone())
    }

    async fn remark(&self) -> Result<()> {
        self.held.lock().expect("saved indexes").mark = Some(uuid::Uuid::new_v4().to_string());
        Ok(())
    }
}

/// What [`load`] did: the saved index it loaded, if any, and why each newer one was not used.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    /// The name of the saved index loaded.
    pub name: Option<String>,
    /// Each saved index passed over, and why.
    pub refused: Vec<(String, String)>,
}

/// A searcher of `cells` for `store` from its newest saved index that is whole, of this
/// format, of this store, of these cells, holds nothing past `to`, and whose tails the store
/// still holds; `None` if no saved index passes (the searcher then builds from the log).
/// Failing to list or read one is a reason to pass it over, never an error: the index is
/// derived data.
pub async fn load(store: &dyn Store, cells: Cells, to: &Checkpoint) -> (Option<Searcher>, Loaded) {
    let mut report = Loaded::default();
    let Some(saved) = store.saved_indexes() else {
        return (None, report);
    };
    let after = store.options().timeout;
    let names = match with_deadline(
        "list saved search indexes",
        after,
        None,
        Written::Nothing,
        saved.names(),
    )
    .await
    {
        Ok(names) => names,
        Err(e) => {
            report.refused.push((String::new(), e.to_string()));
            return (None, report);
        }
    };
    if names.is_empty() {
        return (None, report);
    }
    let identity = match with_deadline(
        "read the store identity",
        after,
        None,
        Written::Nothing,
        saved.identity(false),
    )
    .await
    {
        Ok(Some(id)) => id,
        Ok(None) => {
            report.refused.push((String::new(), "the store has no identity".into()));
            return (None, report);
        }
        Err(e) => {
            report.refused.push((String::new(), e.to_string()));
            return (None, report);
        }
    };
    // A saved index begun before the last purge may hold what it erased: passed over
    // (`gc` deletes it).
    let now = match with_deadline("read the purge mark", after, None, Written::Nothing, saved.mark()).await {
        Ok(mark) => tag(mark.as_deref()),
        Err(e) => {
            report.refused.push((String::new(), e.to_string()));
            return (None, report);
        }
    };
    for name in names {
        if tag_of(&name) != Some(now.as_str()) {
            report.refused.push((name, "begun before the last purge".into()));
            continue;
        }
        let read = saved.read(&name);
        let bytes = match with_deadline("read a saved search index", after, None, Written::Nothing, read).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(e) => {
                report.refused.push((name, e.to_string()));
                continue;
            }
        };
        // Checked and decoded off the async workers (seconds for a large index).
        let id = identity.clone();
        let decoded = match tokio::task::spawn_blocking(move || persist::decode(&bytes, &id, cells)).await {
            Ok(Ok(d)) => d,
            Ok(Err(why)) => {
                report.refused.push((name, why.to_string()));
                continue;
            }
            Err(e) => {
                report.refused.push((name, e.to_string()));
                continue;
            }
        };
        if let Some((shard, seq)) = decoded.searcher.at.first_beyond(to) {
            report.refused.push((
                name,
                format!("it holds seq {seq} of shard {shard}, past the position asked"),
            ));
            continue;
        }
        let tails = async { Ok(Searcher::holds_tails(store, &decoded.tails).await) };
        match with_deadline(
            "check a saved search index's tails",
            after,
            None,
            Written::Nothing,
            tails,
        )
        .await
        .and_then(|r| r)
        {
            Ok(Ok(())) => {
                report.name = Some(name);
                return (Some(decoded.searcher), report);
            }
            Ok(Err(why)) => report.refused.push((name, why.to_string())),
            Err(e) => report.refused.push((name, e.to_string())),
        }
    }
    (None, report)
}

/// What [`save`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Saved {
    /// Saved under this name, of this many bytes.
    Put {
        /// Its name.
        name: String,
        /// Its size.
        bytes: usize,
    },
    /// The store keeps no saved indexes (an in-memory store).
    Nowhere,
    /// A purge ran while it was saved: what it put is deleted again (it may hold what the
    /// purge erased).
    Withdrawn,
}

/// Catch `searcher` up to every entry `store` holds now, and save it as the store's newest
/// saved index. A purge that runs meanwhile withdraws it ([`Saved::Withdrawn`]).
pub async fn save(searcher: &mut Searcher, store: &dyn Store) -> Result<Saved> {
    let Some(begun) = begin(searcher, store).await? else {
        return Ok(Saved::Nowhere);
    };
    let bytes = encode(searcher, store, &begun).await?;
    put(store, begun, bytes).await
}

/// A save begun: where it goes and the purge mark it began under.
pub struct Begun {
    saved: Arc<dyn SavedIndexes>,
    mark: Option<String>,
}

/// Begin a save: look at the purge mark, then catch `searcher` up to every entry `store`
/// holds now. `None`: the store keeps no saved indexes. (With [`encode`] and [`put`], what
/// [`save`] does, in steps a caller can hold its locks around.)
pub async fn begin(searcher: &mut Searcher, store: &dyn Store) -> Result<Option<Begun>> {
    let Some(saved) = store.saved_indexes() else {
        return Ok(None);
    };
    let after = store.options().timeout;
    let mark = with_deadline("read the purge mark", after, None, Written::Nothing, saved.mark()).await?;
    let mut end = Checkpoint::default();
    for shard in store.shards().await? {
        end.0.insert(shard.shard, shard.last_seq);
    }
    searcher.catch_up(store, &end).await?;
    Ok(Some(Begun { saved, mark }))
}

/// The bytes of `searcher` (caught up by [`begin`]) as a saved index of `store`.
pub async fn encode(searcher: &Searcher, store: &dyn Store, begun: &Begun) -> Result<Vec<u8>> {
    let after = store.options().timeout;
    let tails = with_deadline("read the tails", after, None, Written::Nothing, searcher.tails(store)).await?;
    let identity = with_deadline(
        "make the store identity",
        after,
        None,
        Written::Unknown,
        begun.saved.identity(true),
    )
    .await?
    .ok_or_else(|| Error::invalid("store", None, "the store gives saved indexes no identity"))?;
    searcher.encode(&identity, store.options().clock.now_millis(), tails)
}

/// Put `bytes` as the newest saved index, named with the mark the save began under, and
/// withdraw it if a purge changed the mark meanwhile; then delete the saved indexes begun
/// before the last purge ([`sweep`]).
pub async fn put(store: &dyn Store, begun: Begun, bytes: Vec<u8>) -> Result<Saved> {
    let (saved, after) = (begun.saved, store.options().timeout);
    let len = bytes.len();
    let tag = tag(begun.mark.as_deref());
    let name = with_deadline(
        "save a search index",
        after,
        None,
        Written::Unknown,
        saved.put(bytes, &tag),
    )
    .await?;
    let now = with_deadline("read the purge mark", after, None, Written::Unknown, saved.mark()).await;
    if now.as_ref().ok() != Some(&begun.mark) {
        // Whether the mark moved or could not be read: what was put may hold what a purge
        // erased.
        with_deadline(
            "withdraw a saved search index",
            after,
            None,
            Written::Unknown,
            saved.delete(&name),
        )
        .await?;
        now?;
        return Ok(Saved::Withdrawn);
    }
    with_deadline(
        "sweep saved search indexes",
        after,
        None,
        Written::Unknown,
        sweep(&*saved),
    )
    .await?;
    Ok(Saved::Put { name, bytes: len })
}
