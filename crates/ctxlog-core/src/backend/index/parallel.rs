//! Applying rows on several threads at once: the index's ids are split into parts by the
//! hash of the id, and each applying thread ([`PartApplier`]) owns some parts, so the
//! threads share no lock; what they leave is merged into the index afterwards.

use indexmap::IndexMap;

use super::apply::{Numbering, Part, apply_to, session_no};
use super::{
    CatchUp, Hasher, Ids, IndexRow, Positions, ProjectionIndex, SessionRef, SessionState, Sessions, part_of, raise,
};
use crate::backend::frozen::Frozen;
use crate::backend::id_state;
use crate::entry::OrderKey;
use crate::ids::IdScope;
use crate::record::Kind;

/// Applies rows to some of an index's parts, on a thread of its own: see
/// [`ProjectionIndex::apply_in_parallel`]. Rows of ids in other parts are skipped.
pub struct PartApplier<'a> {
    scope: IdScope,
    /// The parts of the index, `Some` for those this applier owns.
    mine: Vec<Option<&'a mut Ids>>,
    hasher: &'a Hasher,
    frozen: &'a Frozen,
    numbers: FoundSessions<'a>,
    last_session: Option<u32>,
    done: Finished,
}

/// What a [`PartApplier`] leaves to merge into its index.
#[derive(Default)]
struct Finished {
    parts: Vec<usize>,
    new_sessions: Vec<(Box<str>, Box<str>)>,
    unfiled: Vec<(u32, u32)>,
    thawed: Vec<u32>,
    positions: Positions,
    counts: CatchUp,
    summaries: Vec<(u32, OrderKey)>,
    links: Vec<(u32, OrderKey)>,
}

impl PartApplier<'_> {
    /// Apply `row` if its id is in a part of this applier's.
    pub fn apply(&mut self, row: IndexRow<'_>) {
        self.apply_inner(row);
    }

    /// Apply a row routed to this applier's thread ([`ProjectionIndex::apply_routed`]).
    /// Panics if the row's id is not in a part of this applier's (it was routed to the wrong
    /// thread): skipping it would lose it.
    pub fn apply_routed(&mut self, row: IndexRow<'_>) {
        assert!(self.apply_inner(row), "a row routed to the wrong thread");
    }

    /// Whether the row's id is in a part of this applier's.
    fn apply_inner(&mut self, row: IndexRow<'_>) -> bool {
        let namespace = self.scope.namespace(row.bot_id);
        let hash = id_state::hash_of(self.hasher, namespace, row.id);
        let part = part_of(hash, self.mine.len());
        if self.mine[part].is_none() {
            return false;
        }
        let session = session_no(&mut self.numbers, &mut self.last_session, row.bot_id, row.session_id);
        let ids = self.mine[part].as_deref_mut().expect("checked above");
        let d = &mut self.done;
        d.counts.read += 1;
        let part = Part {
            ids,
            no: part,
            frozen: self.frozen,
            thawed: &mut d.thawed,
            unfiled: &mut d.unfiled,
        };
        if apply_to(part, hash, namespace, &row, session) {
            d.counts.applied += 1;
            raise(&mut d.positions, row.key.shard, row.key.seq);
            if row.kind == Kind::Summary {
                d.summaries.push((session, row.key));
            }
            if row.kind.is_link() {
                d.links.push((session, row.key));
            }
        }
        true
    }

    fn finish(self) -> Finished {
        let mut done = self.done;
        done.new_sessions = self.numbers.new.into_keys().collect();
        done
    }
}

/// What a [`PartApplier`] numbers sessions by: the index's sessions when the parallel apply
/// began, read-only (a session found there keeps its number), and the ones it found,
/// numbered from `base` and renumbered when the appliers are merged.
struct FoundSessions<'a> {
    known: &'a Sessions,
    base: u32,
    new: IndexMap<(Box<str>, Box<str>), (), Hasher>,
}

impl Numbering for FoundSessions<'_> {
    fn key(&self, no: u32) -> (&str, &str) {
        let key = match no.checked_sub(self.base) {
            None => self.known.get_index(no as usize).map(|(k, _)| k),
            Some(i) => self.new.get_index(i as usize).map(|(k, _)| k),
        };
        let (b, s) = key.expect("numbered by this applier");
        (b, s)
    }

    fn find(&self, key: &SessionRef<'_>) -> Option<u32> {
        match self.known.get_index_of(key) {
            Some(i) => Some(i as u32),
            None => self.new.get_index_of(key).map(|i| self.base + i as u32),
        }
    }

    fn add(&mut self, key: (Box<str>, Box<str>)) -> u32 {
        self.base + self.new.insert_full(key, ()).0 as u32
    }
}

/// Which applying thread the rows of an id go to: see [`ProjectionIndex::apply_routed`].
#[derive(Clone, Debug)]
pub struct Router {
    scope: IdScope,
    hasher: Hasher,
    parts: usize,
    threads: usize,
}

impl Router {
    /// How many applying threads (and so queues) there are.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The thread the rows of `id` of bot `bot_id` go to.
    pub fn thread_of(&self, bot_id: &str, id: &str) -> usize {
        part_of(
            id_state::hash_of(&self.hasher, self.scope.namespace(bot_id), id),
            self.parts,
        ) % self.threads
    }
}

/// Wait for the applying threads and collect what each left, and the first error: this
/// thread's (`mine`), then theirs in order.
fn joined<E>(
    first: Finished,
    mine: Result<(), E>,
    threads: Vec<std::thread::ScopedJoinHandle<'_, (Finished, Result<(), E>)>>,
) -> (Vec<Finished>, Result<(), E>) {
    let mut results = vec![first];
    let mut result = mine;
    for t in threads {
        // A panic there is a bug: let it surface here.
        let (done, r) = t.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        results.push(done);
        if result.is_ok() {
            result = r;
        }
    }
    (results, result)
}

/// Batches queued for each part's thread in [`ProjectionIndex::apply_in_parallel`].
const PART_QUEUE: usize = 4;

impl ProjectionIndex {
    /// Apply every row `each` finds in `batches` on `threads` threads, each applying its
    /// share of the index's parts (at most one thread per part; only this one when
    /// `threads` is 1). `each` runs on every thread for every batch, and hands its rows to
    /// the thread's [`PartApplier`], which keeps those of its own parts: a part is only ever
    /// changed by one thread, so the threads share no lock. This thread hands the batches
    /// out and applies its share too.
    /// For a source whose batches are cheap to share and whose rows are decoded where they
    /// are applied (Arrow batches); see [`ProjectionIndex::apply_routed`] for the other kind.
    ///
    /// The first error stops the apply (this thread stops reading `batches`) and is
    /// returned; the rows applied until then stay applied and the index stays whole.
    pub fn apply_in_parallel<B, E>(
        &mut self,
        threads: usize,
        batches: impl IntoIterator<Item = B>,
        each: impl Fn(&B, &mut PartApplier<'_>) -> Result<(), E> + Sync,
    ) -> (CatchUp, Result<(), E>)
    where
        B: Send + Sync,
        E: Send,
    {
        let each = &each;
        self.with_appliers(threads, |appliers| {
            let mut appliers = appliers.into_iter();
            let mut first = appliers.next().expect("at least one thread");
            std::thread::scope(|scope| {
                let mut queues = Vec::new();
                let mut threads = Vec::new();
                for mut a in appliers {
                    let (queue, batches) = std::sync::mpsc::sync_channel::<std::sync::Arc<B>>(PART_QUEUE);
                    queues.push(queue);
                    threads.push(scope.spawn(move || {
                        // Stops at the first error, dropping `batches`: the next send fails.
                        let r = batches.iter().try_for_each(|b| each(&b, &mut a));
                        (a.finish(), r)
                    }));
                }
                let mut mine = Ok(());
                for b in batches {
                    let b = std::sync::Arc::new(b);
                    // A part's thread that stopped has an error to say why: stop handing out.
                    if queues.iter().any(|q| q.send(b.clone()).is_err()) {
                        break;
                    }
                    mine = each(&b, &mut first);
                    if mine.is_err() {
                        break;
                    }
                }
                drop(queues);
                joined(first.finish(), mine, threads)
            })
        })
    }

    /// Which of `threads` applying threads the rows of an id go to in
    /// [`ProjectionIndex::apply_routed`].
    pub fn router(&self, threads: usize) -> Router {
        Router {
            scope: self.scope,
            hasher: self.hasher.clone(),
            parts: self.parts.len(),
            threads: threads.clamp(1, self.parts.len()),
        }
    }

    /// Apply what `each` makes of the batches of `queues`, one applying thread per queue
    /// (this one takes the first): the source has routed each row to its thread with
    /// [`ProjectionIndex::router`] (with `queues.len()` threads), so every thread gets only
    /// rows it keeps ([`PartApplier::apply_routed`]). For a source that decodes rows on a
    /// thread of its own.
    ///
    /// The first error stops its thread (dropping its queue: the source's next send to it
    /// fails) and is returned; the rows applied until then stay applied and the index
    /// stays whole. The other threads go on with what was queued for them, so the rows
    /// applied are then no prefix of the rows sent: a source that resumes past the index's
    /// positions must not keep such an index as it is.
    pub fn apply_routed<B, E>(
        &mut self,
        queues: Vec<std::sync::mpsc::Receiver<B>>,
        each: impl Fn(B, &mut PartApplier<'_>) -> Result<(), E> + Sync,
    ) -> (CatchUp, Result<(), E>)
    where
        B: Send,
        E: Send,
    {
        assert_eq!(
            queues.len(),
            self.router(queues.len()).threads,
            "one queue per thread of a router"
        );
        let each = &each;
        self.with_appliers(queues.len(), |appliers| {
            let mut pairs = appliers.into_iter().zip(queues);
            let (mut first, mine) = pairs.next().expect("at least one queue");
            std::thread::scope(|scope| {
                let threads: Vec<_> = pairs
                    .map(|(mut a, queue)| {
                        scope.spawn(move || {
                            let r = queue.into_iter().try_for_each(|b| each(b, &mut a));
                            (a.finish(), r)
                        })
                    })
                    .collect();
                let r = mine.into_iter().try_for_each(|b| each(b, &mut first));
                joined(first.finish(), r, threads)
            })
        })
    }

    /// Split the index's parts among `threads` appliers, let `run` run them, and merge what
    /// they leave, also when one failed.
    fn with_appliers<E>(
        &mut self,
        threads: usize,
        run: impl for<'a> FnOnce(Vec<PartApplier<'a>>) -> (Vec<Finished>, Result<(), E>),
    ) -> (CatchUp, Result<(), E>) {
        let threads = threads.clamp(1, self.parts.len());
        let base = self.sessions.len() as u32;
        let mut appliers: Vec<PartApplier<'_>> = (0..threads)
            .map(|_| PartApplier {
                scope: self.scope,
                mine: Vec::new(),
                hasher: &self.hasher,
                frozen: &self.frozen,
                numbers: FoundSessions {
                    known: &self.sessions,
                    base,
                    new: IndexMap::with_hasher(self.hasher.clone()),
                },
                last_session: None,
                done: Finished::default(),
            })
            .collect();
        for (p, ids) in self.parts.iter_mut().enumerate() {
            // The router's rule: part `p` is applied by thread `p % threads`.
            let owner = p % threads;
            let mut ids = Some(ids);
            for (t, a) in appliers.iter_mut().enumerate() {
                a.mine.push(if t == owner { ids.take() } else { None });
            }
            appliers[owner].done.parts.push(p);
        }
        // A panic on an applying thread (a bug) leaves its parts holding sessions the index
        // never numbered: empty the index (a later catch-up reads everything again) rather
        // than leave it torn, then let the panic go on.
        let (results, result) = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(appliers))) {
            Ok(done) => done,
            Err(panic) => {
                *self = ProjectionIndex::with_parts(self.parts.len(), self.scope);
                std::panic::resume_unwind(panic)
            }
        };
        let mut counts = CatchUp::default();
        for done in results {
            counts += done.counts;
            self.merge(done, base);
        }
        (counts, result)
    }

    /// Number the sessions an applier found into the index's, renumber what it applied if
    /// that changed their numbers, and take in the rest of what it left.
    fn merge(&mut self, done: Finished, base: u32) {
        let renumbered: Vec<u32> = done
            .new_sessions
            .into_iter()
            .map(|key| match self.sessions.get_index_of(&key) {
                Some(i) => i as u32,
                None => self.sessions.insert_full(key, SessionState::default()).0 as u32,
            })
            .collect();
        let renumber = |s: u32| s.checked_sub(base).map_or(s, |i| renumbered[i as usize]);
        let mut unfiled = done.unfiled;
        // The first applier merged numbers its sessions as the index does: no walk.
        if renumbered.iter().enumerate().any(|(i, s)| *s != base + i as u32) {
            for p in &done.parts {
                for state in self.parts[*p].values_mut() {
                    if let Some(w) = &mut state.winner {
                        w.session = renumber(w.session);
                    }
                    if let Some(extra) = &mut state.extra {
                        for o in &mut extra.others {
                            o.session = renumber(o.session);
                        }
                    }
                }
            }
            for u in &mut unfiled {
                u.0 = renumber(u.0);
            }
        }
        self.summaries
            .extend(done.summaries.into_iter().map(|(s, k)| (renumber(s), k)));
        self.links.extend(done.links.into_iter().map(|(s, k)| (renumber(s), k)));
        self.unfiled.extend(unfiled);
        self.thawed.extend(done.thawed);
        self.entries += done.counts.applied;
        for (shard, seq) in done.positions {
            raise(&mut self.positions, shard, seq);
        }
    }
}
