//! Named failpoints: the places in a backend's own code where a test may stop an operation
//! (as a crash there would) or hold it (as a lost acknowledgement or a slow commit would).
//! One mechanism for every backend; the object-store fault wrapper of the Lance backend is
//! another matter (it injects what storage does, not what the backend's code does).
//!
//! A backend marks a point with [`hit`] (async code) or [`hit_blocking`] (code on a
//! blocking thread), naming the point (`"sqlite.append.after_commit"`) and the store it is
//! in (its path or URI, computed only when some point is armed). Unarmed, a hit is one
//! atomic load. A test arms a point for one store (feature `testing`, [`arm`]): the
//! operation that reaches it then fails with [`Stopped`] ([`Action::Fail`]) or waits until
//! the test drops its [`Armed`] guard ([`Action::Pause`]), never longer than
//! [`LONGEST_PAUSE`]: nothing hangs, not even a test. [`Armed::reached`] lets the test wait
//! until an operation is at the point.

// Points are armed only through the `testing` feature; without it, only hits are compiled.
#![cfg_attr(not(feature = "testing"), allow(dead_code))]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What an armed point does to the operation that reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Stop the operation there: [`hit`] returns [`Stopped`].
    Fail,
    /// Hold the operation there until the test drops its guard.
    Pause,
}

/// The operation was stopped at a failpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stopped {
    /// The point's name.
    pub point: &'static str,
}

/// Longest an operation is held at a paused point.
pub const LONGEST_PAUSE: Duration = Duration::from_secs(120);

struct Point {
    id: u64,
    name: &'static str,
    scope: String,
    action: Action,
    /// Operations that reached the point since it was armed.
    reached: u64,
    /// Whether only the first operation that reaches the point is acted on.
    once: bool,
}

struct Registry {
    next: u64,
    points: Vec<Point>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    points: Vec::new(),
});
/// How many points are armed: the fast path of every hit.
static ARMED: AtomicUsize = AtomicUsize::new(0);
/// Woken on every change (armed, disarmed, reached): blocking waiters.
static CHANGED: std::sync::Condvar = std::sync::Condvar::new();
/// Woken on every change: async waiters.
static CHANGED_ASYNC: std::sync::LazyLock<tokio::sync::watch::Sender<u64>> =
    std::sync::LazyLock::new(|| tokio::sync::watch::channel(0).0);

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

fn changed() {
    CHANGED.notify_all();
    CHANGED_ASYNC.send_modify(|n| *n = n.wrapping_add(1));
}

/// What a hit at `name` in `scope` meets: the armed point's id and action, counted as reached.
fn reach(name: &str, scope: &str) -> Option<(u64, Action)> {
    let mut r = registry();
    let p = r
        .points
        .iter_mut()
        .find(|p| p.name == name && p.scope == scope && !(p.once && p.reached > 0))?;
    p.reached += 1;
    let found = (p.id, p.action);
    drop(r);
    changed();
    Some(found)
}

fn is_armed(id: u64) -> bool {
    registry().points.iter().any(|p| p.id == id)
}

/// What a hit meets: nothing, a stop, or a pause at the armed point with this id.
enum Met {
    Pass,
    Stop(Stopped),
    Pause(u64),
}

fn meet(name: &'static str, scope: impl FnOnce() -> String) -> Met {
    if ARMED.load(Ordering::Acquire) == 0 {
        return Met::Pass;
    }
    match reach(name, &scope()) {
        None => Met::Pass,
        Some((_, Action::Fail)) => Met::Stop(Stopped { point: name }),
        Some((id, Action::Pause)) => Met::Pause(id),
    }
}

/// Mark failpoint `name` in async code; `scope` names the store, computed only when some
/// point is armed.
pub async fn hit(name: &'static str, scope: impl FnOnce() -> String) -> Result<(), Stopped> {
    match meet(name, scope) {
        Met::Pass => Ok(()),
        Met::Stop(s) => Err(s),
        Met::Pause(id) => {
            let mut changes = CHANGED_ASYNC.subscribe();
            let _ = tokio::time::timeout(LONGEST_PAUSE, changes.wait_for(|_| !is_armed(id))).await;
            Ok(())
        }
    }
}

/// [`hit`] for code on a blocking thread.
pub fn hit_blocking(name: &'static str, scope: impl FnOnce() -> String) -> Result<(), Stopped> {
    match meet(name, scope) {
        Met::Pass => Ok(()),
        Met::Stop(s) => Err(s),
        Met::Pause(id) => {
            let until = Instant::now() + LONGEST_PAUSE;
            let mut r = registry();
            while r.points.iter().any(|p| p.id == id) {
                let now = Instant::now();
                if now >= until {
                    break;
                }
                r = CHANGED
                    .wait_timeout(r, until - now)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Ok(())
        }
    }
}

/// An armed failpoint; dropping it disarms the point and lets a held operation go on.
#[derive(Debug)]
#[must_use = "the point is disarmed when the guard drops"]
pub struct Armed {
    id: u64,
}

impl Drop for Armed {
    fn drop(&mut self) {
        let mut r = registry();
        r.points.retain(|p| p.id != self.id);
        ARMED.store(r.points.len(), Ordering::Release);
        drop(r);
        changed();
    }
}

impl Armed {
    /// Wait until an operation has reached the point (at most `within`); whether one did.
    pub async fn reached(&self, within: Duration) -> bool {
        let id = self.id;
        let reached = move || registry().points.iter().any(|p| p.id == id && p.reached > 0);
        let mut changes = CHANGED_ASYNC.subscribe();
        tokio::time::timeout(within, changes.wait_for(|_| reached()))
            .await
            .is_ok()
    }
}

/// Arm failpoint `name` for the store `scope` (as the backend names it at its hits): every
/// operation that reaches it meets `action`.
#[cfg(feature = "testing")]
pub fn arm(name: &'static str, scope: impl Into<String>, action: Action) -> Armed {
    arm_with(name, scope.into(), action, false)
}

/// [`arm`] for the first operation that reaches the point only; later ones pass.
#[cfg(feature = "testing")]
pub fn arm_once(name: &'static str, scope: impl Into<String>, action: Action) -> Armed {
    arm_with(name, scope.into(), action, true)
}

#[cfg(feature = "testing")]
fn arm_with(name: &'static str, scope: String, action: Action, once: bool) -> Armed {
    let mut r = registry();
    r.next += 1;
    let id = r.next;
    r.points.push(Point {
        id,
        name,
        scope,
        action,
        reached: 0,
        once,
    });
    ARMED.store(r.points.len(), Ordering::Release);
    drop(r);
    changed();
    Armed { id }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use super::*;

    /// Unarmed, a hit passes; armed to fail, it fails in that scope only; armed to pause, it
    /// holds the operation until the guard drops, and `reached` sees it there.
    #[tokio::test]
    async fn a_point_fails_or_holds_only_where_it_is_armed() {
        assert_eq!(hit("t.fail", || "a".into()).await, Ok(()));
        let armed = arm("t.fail", "a", Action::Fail);
        assert_eq!(hit("t.fail", || "a".into()).await, Err(Stopped { point: "t.fail" }));
        assert_eq!(hit("t.fail", || "b".into()).await, Ok(()), "another store");
        assert_eq!(hit_blocking("t.fail", || "a".into()), Err(Stopped { point: "t.fail" }));
        drop(armed);
        assert_eq!(hit("t.fail", || "a".into()).await, Ok(()));

        let armed = arm("t.pause", "a", Action::Pause);
        let held = tokio::spawn(hit("t.pause", || "a".into()));
        assert!(
            armed.reached(Duration::from_secs(30)).await,
            "the operation reached the point"
        );
        assert!(!held.is_finished(), "held while armed");
        drop(armed);
        let done = tokio::time::timeout(Duration::from_secs(30), held).await;
        assert_eq!(done.expect("released").unwrap(), Ok(()));

        // Once: the first operation is held, the next passes.
        let armed = arm_once("t.once", "a", Action::Fail);
        assert!(hit("t.once", || "a".into()).await.is_err());
        assert_eq!(hit("t.once", || "a".into()).await, Ok(()));
        drop(armed);

        let armed = arm("t.pause", "blocking", Action::Pause);
        let held = std::thread::spawn(|| hit_blocking("t.pause", || "blocking".into()));
        assert!(armed.reached(Duration::from_secs(30)).await);
        assert!(!held.is_finished(), "held while armed");
        drop(armed);
        assert_eq!(held.join().unwrap(), Ok(()));
    }
}
