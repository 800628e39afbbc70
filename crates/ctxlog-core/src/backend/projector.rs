//! A projector generic over how a backend reads its entries: the backend supplies the
//! scanning ([`IndexSource`]); the projection's rules live in the index, once.

use std::time::Duration;

use async_trait::async_trait;

use crate::backend::index::{ProjectionIndex, RowRef};
use crate::entry::{Checkpoint, Entry, OrderKey, SessionSummary};
use crate::error::{Result, Written, with_deadline};
use crate::hlc::Hlc;
use crate::options::RefreshReport;
use crate::projection::{Projection, ProjectionStats};
use crate::traits::Projector;

/// How a backend feeds its projector.
#[async_trait]
pub trait IndexSource: Send + Sync + 'static {
    /// Where the last catch-up stopped, beyond what the index's own checkpoint says.
    type Cursor: Default + Send + Sync + 'static;

    /// Apply every entry past `cursor` to `index` and advance `cursor`. If this fails or is
    /// cancelled, `cursor` and `index` must still agree (both advanced, or both reset to
    /// their defaults).
    async fn catch_up(&self, cursor: &mut Self::Cursor, index: &mut ProjectionIndex) -> Result<CatchUp>;

    /// Full entries for `keys`, in the same order, each with the location the backend gave
    /// its row. `cursor` is the state the keys were indexed with.
    async fn fetch(&self, cursor: &Self::Cursor, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>>;

    /// The deadline of one operation.
    fn timeout(&self) -> Duration;
}

/// What one catch-up did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CatchUp {
    /// Entries read from storage.
    pub read: u64,
    /// Entries the index did not hold yet.
    pub applied: u64,
}

/// A [`Projector`] over any [`IndexSource`].
pub struct IndexedProjector<S: IndexSource> {
    source: std::sync::Arc<S>,
    cursor: S::Cursor,
    index: ProjectionIndex,
    scanned: bool,
}

impl<S: IndexSource> IndexedProjector<S> {
    /// A projector over `source`; its first refresh is a first scan.
    pub fn new(source: std::sync::Arc<S>) -> Self {
        IndexedProjector {
            source,
            cursor: S::Cursor::default(),
            index: ProjectionIndex::new(),
            scanned: false,
        }
    }

    async fn ensure_scanned(&mut self) -> Result<()> {
        if !self.scanned {
            self.refresh().await?;
        }
        Ok(())
    }

    async fn fetch(&self, keys: &[(OrderKey, RowRef)]) -> Result<Vec<Entry>> {
        with_deadline(
            "read entries",
            self.source.timeout(),
            None,
            Written::Nothing,
            self.source.fetch(&self.cursor, keys),
        )
        .await
    }
}

#[async_trait]
impl<S: IndexSource> Projector for IndexedProjector<S> {
    async fn refresh(&mut self) -> Result<RefreshReport> {
        let first_scan = !self.scanned;
        // Until this refresh completes, the projector counts as not scanned: a source may
        // reset the index when a catch-up fails or is cancelled (rather than leave it torn),
        // and the next read must then scan again instead of answering from an empty index.
        self.scanned = false;
        let timeout = self.source.timeout();
        let source = self.source.clone();
        let result = with_deadline(
            "refresh",
            timeout,
            None,
            Written::Nothing,
            source.catch_up(&mut self.cursor, &mut self.index),
        )
        .await;
        let done = result?;
        self.scanned = true;
        Ok(RefreshReport {
            entries_read: done.read,
            new_entries: done.applied,
            first_scan,
        })
    }

    async fn session(&mut self, bot_id: &str, session_id: &str) -> Result<Vec<Entry>> {
        self.ensure_scanned().await?;
        let keys = self.index.session_keys(bot_id, session_id);
        self.fetch(&keys).await
    }

    async fn get(&mut self, id: &str) -> Result<Option<Entry>> {
        self.ensure_scanned().await?;
        match self.index.live(id) {
            None => Ok(None),
            Some(key) => Ok(self.fetch(&[key]).await?.pop()),
        }
    }

    async fn sessions(&mut self, bot_id: &str) -> Result<Vec<SessionSummary>> {
        self.ensure_scanned().await?;
        Ok(self.index.sessions(bot_id))
    }

    fn stats(&self) -> ProjectionStats {
        self.index.stats()
    }

    fn checkpoint(&self) -> Checkpoint {
        self.index.checkpoint()
    }

    fn projection(&self) -> Projection {
        self.index.projection()
    }

    fn max_hlc(&self) -> Hlc {
        self.index.max_hlc()
    }
}
