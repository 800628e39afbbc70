//! The test-only lost acknowledgement: an append that committed, then waits while its
//! store is stalled (see `testing::stall_writes`). Inert unless a test arms it — one atomic
//! load per append.
// Armed only through the `testing` feature; without it, only `after_commit` is used.
#![cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]

use std::path::Path;

use ctxlog_core::{Error, Result, Written};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// Stores whose appends stall after their commit, and a fast check that there are any.
static STALLED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WOKEN: Condvar = Condvar::new();
static ANY_STALLED: AtomicBool = AtomicBool::new(false);

/// Longest a stalled append waits for its guard to drop: nothing hangs, even a test.
const MOST_STALL: Duration = Duration::from_secs(120);

/// Keeps appends to one store stalled after their commit until dropped.
pub struct WriteStall {
    path: PathBuf,
}

impl Drop for WriteStall {
    fn drop(&mut self) {
        let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = stalled.iter().position(|p| *p == self.path) {
            stalled.swap_remove(i);
        }
        ANY_STALLED.store(!stalled.is_empty(), Ordering::Release);
        WOKEN.notify_all();
    }
}

pub(crate) fn arm(path: &Path) -> Result<WriteStall> {
    let path = std::fs::canonicalize(path).map_err(|e| Error::backend("sqlite", "stall", None, Written::Nothing, e))?;
    let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
    stalled.push(path.clone());
    ANY_STALLED.store(true, Ordering::Release);
    Ok(WriteStall { path })
}

/// Called by an append after its commit: waits while the store is stalled.
pub(crate) fn after_commit(path: &Path) {
    if !ANY_STALLED.load(Ordering::Acquire) {
        return;
    }
    let Ok(path) = std::fs::canonicalize(path) else { return };
    let until = Instant::now() + MOST_STALL;
    let mut stalled = STALLED.lock().unwrap_or_else(|p| p.into_inner());
    while stalled.contains(&path) {
        let now = Instant::now();
        if now >= until {
            return;
        }
        stalled = WOKEN
            .wait_timeout(stalled, until - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}
