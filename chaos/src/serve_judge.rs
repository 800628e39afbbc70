//! The serve soak's verdict, apart from any I/O: what the clients were told (every write
//! and each of its attempts), what every watcher received, which process held which epoch,
//! how every SIGTERM ended, and what each replica serves at the end — each check a named
//! function of that history, with a test below for each way it fails.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Value, json};

/// What a write carried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum OpKind {
    /// A session's append (one record or a batch).
    Append,
    /// The bot-wide append (records of several sessions of one bot).
    BotAppend,
    /// A summary written from a context view.
    Summary,
    /// `DELETE …/records/{id}`: a tombstone.
    Delete,
}

/// One record a write carried.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Rec {
    pub(crate) bot: String,
    pub(crate) session: String,
    pub(crate) id: String,
    pub(crate) text: String,
}

/// How one attempt of a write was answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Attempt {
    /// 200.
    Acked,
    /// It may have landed: `written: unknown`, a timeout, a connection lost or cut by the
    /// client.
    Indeterminate(String),
    /// Nothing was written (fenced, replica unavailable, …): retried elsewhere.
    Nothing(String),
}

/// How a write ended, after all its attempts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Outcome {
    Acked {
        /// The process that answered.
        process: usize,
        shard: String,
        epoch: u64,
        first_seq: u64,
        /// When the acknowledged attempt was sent (ms since the soak began).
        sent_ms: u64,
    },
    /// A delete answered 404 after an earlier attempt that may have landed: the id is ended.
    Gone,
    /// Given up while still unknown.
    Unknown,
    /// A definite refusal no retry can change (invalid input, not found, …).
    Refused(String),
}

/// One write, with every attempt.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Op {
    pub(crate) kind: OpKind,
    pub(crate) records: Vec<Rec>,
    /// When its first attempt was sent (ms since the soak began).
    pub(crate) first_sent_ms: u64,
    pub(crate) attempts: Vec<Attempt>,
    pub(crate) outcome: Outcome,
}

impl Op {
    fn acked(&self) -> bool {
        matches!(self.outcome, Outcome::Acked { .. })
    }
    fn indeterminate(&self) -> bool {
        self.attempts.iter().any(|a| matches!(a, Attempt::Indeterminate(_)))
    }
}

/// One `ctxlog serve` process.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Process {
    pub(crate) writer: String,
    /// When it said it was listening (its claim came before), ms since the soak began.
    pub(crate) started_ms: u64,
    /// The shard's epoch `GET /v1/shards` showed right after it started: what it claimed.
    pub(crate) start_epoch: Option<u64>,
}

/// The shard's epoch as `GET /v1/shards` showed it, when the answer came.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct EpochSeen {
    pub(crate) at_ms: u64,
    pub(crate) shard: String,
    pub(crate) epoch: u64,
}

/// A SIGTERM the soak sent.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Term {
    pub(crate) process: usize,
    /// The exit code, `None` when it did not exit within the bound (then killed) or was
    /// ended by a signal.
    pub(crate) code: Option<i32>,
    pub(crate) seconds: f64,
    pub(crate) bound_seconds: f64,
}

/// What a watcher shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) enum Scope {
    Session { bot: String, session: String },
    Store,
}

impl Scope {
    fn keeps(&self, r: &Rec) -> bool {
        match self {
            Scope::Session { bot, session } => r.bot == *bot && r.session == *session,
            Scope::Store => true,
        }
    }
}

/// One record or tombstone event.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct WatchEvent {
    /// `record` or `tombstone`.
    pub(crate) event: String,
    pub(crate) rec: Rec,
    pub(crate) shard: String,
    pub(crate) seq: u64,
    pub(crate) epoch: u64,
}

/// One watcher, across all its reconnects.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Watcher {
    pub(crate) name: String,
    pub(crate) scope: Scope,
    /// When the position it started from was answered: every write first sent later lies
    /// past it.
    pub(crate) start_ms: u64,
    pub(crate) events: Vec<WatchEvent>,
    pub(crate) reconnects: u64,
}

/// What one replica serves at the end.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Final {
    pub(crate) process: usize,
    pub(crate) ready: bool,
    /// Why not, when not.
    pub(crate) reason: String,
    /// The final reads that got no answer (then `records` and `contexts` are partial).
    pub(crate) unread: Vec<String>,
    /// Every live record of every session of every bot, as listed (duplicates kept).
    pub(crate) records: Vec<Rec>,
    /// Per hot session (`bot/session`): its context view (summary, covered, ids and texts).
    pub(crate) contexts: BTreeMap<String, Value>,
}

/// Everything the soak saw.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct History {
    pub(crate) ops: Vec<Op>,
    pub(crate) processes: Vec<Process>,
    pub(crate) epochs: Vec<EpochSeen>,
    pub(crate) terms: Vec<Term>,
    pub(crate) watchers: Vec<Watcher>,
    pub(crate) finals: Vec<Final>,
    /// Sessions (`bot/session`) retention ended, as its reports said.
    pub(crate) retained: BTreeSet<String>,
    /// Whether some retention call's answer was lost (then any cold session may be ended).
    pub(crate) retain_unknown: bool,
    /// The bot whose sessions retention may end (and no other).
    pub(crate) cold_bot: String,
    /// Writer identities (slots) of the soak.
    pub(crate) writers: Vec<String>,
    /// Fault and load counters (kills, takeovers, maintenance, slow bursts, …).
    pub(crate) counts: BTreeMap<String, u64>,
    /// Replicas that exited without being told to.
    pub(crate) crashes: Vec<String>,
    /// Whether the replicas were told to inject object-store faults (then some must have).
    pub(crate) faults: bool,
}

/// One check's result.
#[derive(Debug, Serialize)]
pub(crate) struct Check {
    pub(crate) name: &'static str,
    pub(crate) ok: bool,
    pub(crate) detail: Value,
}

fn check(name: &'static str, problems: Vec<String>, counts: Value) -> Check {
    Check {
        name,
        ok: problems.is_empty(),
        detail: json!({"problems": problems.len(), "examples": problems.iter().take(8).collect::<Vec<_>>(), "counts": counts}),
    }
}

/// Every check, in order.
pub(crate) fn judge(h: &History) -> Vec<Check> {
    vec![
        acked_readable_once(h),
        watchers_saw_everything_once_in_order(h),
        no_write_after_fenced(h),
        no_fenced_claim_again(h),
        sigterm_exits_zero_in_bound(h),
        indeterminate_retried_to_definite(h),
        no_refusals(h),
        replicas_ready_at_end(h),
        context_views_identical(h),
        progress(h),
    ]
}

/// A record's identity: its bot and id.
type Key = (String, String);

fn key(r: &Rec) -> Key {
    (r.bot.clone(), r.id.clone())
}

/// Ids that a delete may have ended (acknowledged, gone, or still unknown), and those one
/// certainly ended.
fn deletes(h: &History) -> (BTreeSet<Key>, BTreeSet<Key>) {
    let (mut maybe, mut surely) = (BTreeSet::new(), BTreeSet::new());
    for op in h.ops.iter().filter(|o| o.kind == OpKind::Delete) {
        for r in &op.records {
            match op.outcome {
                Outcome::Acked { .. } | Outcome::Gone => {
                    surely.insert(key(r));
                    maybe.insert(key(r));
                }
                Outcome::Unknown => {
                    maybe.insert(key(r));
                }
                Outcome::Refused(_) => {}
            }
        }
    }
    (maybe, surely)
}

fn retained(h: &History, r: &Rec) -> bool {
    r.bot == h.cold_bot && (h.retain_unknown || h.retained.contains(&format!("{}/{}", r.bot, r.session)))
}

/// Every acknowledged record is listed exactly once, with its session and content, by every
/// replica at the end; every acknowledged delete's id by none; and nothing is listed that no
/// client wrote.
fn acked_readable_once(h: &History) -> Check {
    let (maybe_deleted, deleted) = deletes(h);
    let mut promised: BTreeMap<(String, String), &Rec> = BTreeMap::new();
    let mut written: BTreeSet<(String, String)> = BTreeSet::new();
    for op in h.ops.iter().filter(|o| o.kind != OpKind::Delete) {
        for r in &op.records {
            written.insert(key(r));
            if op.acked() {
                promised.insert(key(r), r);
            }
        }
    }
    let mut problems = Vec::new();
    for f in &h.finals {
        if !f.unread.is_empty() {
            problems.push(format!(
                "process {}: its listing is partial, {} final reads got no answer (replicas_ready_at_end says which)",
                f.process,
                f.unread.len()
            ));
            continue;
        }
        let mut listed: BTreeMap<(String, String), Vec<&Rec>> = BTreeMap::new();
        for r in &f.records {
            listed.entry(key(r)).or_default().push(r);
        }
        for (k, want) in &promised {
            let got = listed.get(k).map_or(&[][..], Vec::as_slice);
            match got {
                [] if maybe_deleted.contains(k) || retained(h, want) => {}
                [] => problems.push(format!(
                    "process {}: acknowledged {}/{} is not listed",
                    f.process, k.0, k.1
                )),
                [one] if one.text == want.text && one.session == want.session => {}
                [one] => problems.push(format!(
                    "process {}: {}/{} is listed in {} with other content than acknowledged",
                    f.process, k.0, k.1, one.session
                )),
                many => problems.push(format!(
                    "process {}: {}/{} is listed {} times",
                    f.process,
                    k.0,
                    k.1,
                    many.len()
                )),
            }
        }
        for k in &deleted {
            if listed.contains_key(k) {
                problems.push(format!(
                    "process {}: {}/{} is listed after its delete was acknowledged",
                    f.process, k.0, k.1
                ));
            }
        }
        for k in listed.keys().filter(|k| !written.contains(*k)) {
            problems.push(format!("process {}: {}/{} was never written", f.process, k.0, k.1));
        }
    }
    let counts = json!({"acknowledged_records": promised.len(), "deleted": deleted.len(), "replicas": h.finals.len()});
    check("acked_readable_once", problems, counts)
}

/// Every watcher received every record of its scope written after it started exactly once,
/// and per shard in seq order, across all its reconnects. A put is not required where the
/// watcher may rightly not show it: its id ended (a tombstone hides it from a stream that
/// reads it later), it was retried (an earlier attempt may have landed before the watcher's
/// start, or elsewhere), or the same id was written under another bot too.
fn watchers_saw_everything_once_in_order(h: &History) -> Check {
    let ended: BTreeSet<(String, String)> = {
        let listed: BTreeSet<(String, String)> = h
            .finals
            .first()
            .map(|f| f.records.iter().map(key).collect())
            .unwrap_or_default();
        let mut all = deletes(h).0;
        for op in h.ops.iter().filter(|o| o.kind != OpKind::Delete) {
            for r in &op.records {
                if !listed.contains(&key(r)) {
                    all.insert(key(r));
                }
            }
        }
        all
    };
    let mut bots_of: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for op in &h.ops {
        for r in &op.records {
            bots_of.entry(&r.id).or_default().insert(&r.bot);
        }
    }
    let shared = |r: &Rec| bots_of.get(r.id.as_str()).is_some_and(|b| b.len() > 1);
    // A write that landed twice (an attempt that may have landed, and its retry elsewhere)
    // may show twice: two tombstones are two events, and a put's winner may change.
    let retried: BTreeSet<(String, String)> = h
        .ops
        .iter()
        .filter(|o| o.attempts.len() > 1)
        .flat_map(|o| o.records.iter().map(key))
        .collect();
    let (mut problems, mut gaps, mut duplicates, mut disorder) = (Vec::new(), 0u64, 0u64, 0u64);
    let mut skipped = 0u64;
    let mut events = 0u64;
    for w in &h.watchers {
        events += w.events.len() as u64;
        let mut seen: BTreeMap<(String, String, &str), u64> = BTreeMap::new();
        let mut last: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for e in &w.events {
            *seen
                .entry((e.rec.bot.clone(), e.rec.id.clone(), e.event.as_str()))
                .or_default() += 1;
            let here = (e.seq, e.epoch);
            if let Some(prev) = last.get(e.shard.as_str())
                && (here.0 < prev.0 || here == *prev)
            {
                disorder += 1;
                problems.push(format!(
                    "{}: seq {} epoch {} of shard {} came after seq {} epoch {}",
                    w.name, here.0, here.1, e.shard, prev.0, prev.1
                ));
            }
            last.insert(&e.shard, here);
        }
        for ((bot, id, event), n) in &seen {
            if *n > 1 && !retried.contains(&(bot.clone(), id.clone())) {
                duplicates += n - 1;
                problems.push(format!("{}: {event} {bot}/{id} came {n} times", w.name));
            }
        }
        // A missing entry below a seq of its shard the watcher did receive was skipped (its
        // position moved past it); above, it never came (the stream stalled or ended).
        let newest: BTreeMap<&str, u64> = w.events.iter().fold(BTreeMap::new(), |mut m, e| {
            let n = m.entry(e.shard.as_str()).or_insert(0);
            *n = (*n).max(e.seq);
            m
        });
        let got = |r: &Rec, event: &'static str| seen.contains_key(&(r.bot.clone(), r.id.clone(), event));
        for op in h.ops.iter().filter(|o| o.acked() && o.first_sent_ms > w.start_ms) {
            let retried = op.attempts.len() > 1;
            let Outcome::Acked { shard, first_seq, .. } = &op.outcome else {
                continue;
            };
            for (i, r) in op.records.iter().enumerate().filter(|(_, r)| w.scope.keeps(r)) {
                let missing = match op.kind {
                    OpKind::Delete => !retried && !got(r, "tombstone"),
                    _ => !retried && !ended.contains(&key(r)) && !shared(r) && !got(r, "record"),
                };
                if missing {
                    gaps += 1;
                    let passed = newest.get(shard.as_str()).is_some_and(|n| *n > first_seq + i as u64);
                    skipped += u64::from(passed);
                    problems.push(format!(
                        "{}: {} {} {}/{} ({}), acknowledged after it started",
                        w.name,
                        if passed { "skipped" } else { "never received" },
                        if op.kind == OpKind::Delete {
                            "the tombstone of"
                        } else {
                            "record"
                        },
                        r.bot,
                        r.session,
                        r.id
                    ));
                }
            }
        }
    }
    let reconnects: u64 = h.watchers.iter().map(|w| w.reconnects).sum();
    let counts = json!({"watchers": h.watchers.len(), "events": events, "reconnects": reconnects,
                        "gaps": gaps, "skipped": skipped, "duplicates": duplicates, "out_of_order": disorder});
    check("watchers_saw_everything_once_in_order", problems, counts)
}

/// Processes of one writer id, oldest first.
fn by_writer(h: &History) -> BTreeMap<&str, Vec<usize>> {
    let mut out: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, p) in h.processes.iter().enumerate() {
        out.entry(&p.writer).or_default().push(i);
    }
    for v in out.values_mut() {
        v.sort_by_key(|i| h.processes[*i].started_ms);
    }
    out
}

/// No write was acknowledged under an epoch the shard had already left when it was sent: a
/// replica that `GET /v1/shards` showed superseded takes no more writes.
fn no_write_after_fenced(h: &History) -> Check {
    let mut problems = Vec::new();
    let mut checked = 0u64;
    for op in &h.ops {
        let Outcome::Acked {
            process,
            shard,
            epoch,
            sent_ms,
            ..
        } = &op.outcome
        else {
            continue;
        };
        checked += 1;
        if let Some(seen) = h
            .epochs
            .iter()
            .find(|s| s.shard == *shard && s.at_ms < *sent_ms && s.epoch > *epoch)
        {
            problems.push(format!(
                "process {process} acknowledged a write under epoch {epoch} of {shard}, sent at {sent_ms} ms, \
                 after the shard was seen at epoch {} ({} ms)",
                seen.epoch, seen.at_ms
            ));
        }
    }
    check("no_write_after_fenced", problems, json!({"acks": checked}))
}

/// A replica superseded by a younger process of its writer id never holds an epoch above
/// the younger one's claim: it never claims again (rule 4's reopen is the newest holder's
/// alone).
fn no_fenced_claim_again(h: &History) -> Check {
    let mut held: BTreeMap<usize, BTreeSet<u64>> = BTreeMap::new();
    for op in &h.ops {
        if let Outcome::Acked { process, epoch, .. } = op.outcome {
            held.entry(process).or_default().insert(epoch);
        }
    }
    let mut problems = Vec::new();
    let (mut takeovers, mut unjudged) = (0u64, 0u64);
    for procs in by_writer(h).values() {
        for (n, &older) in procs.iter().enumerate() {
            for &younger in &procs[n + 1..] {
                // The epoch it claimed as polled at its start, else the lowest it wrote under
                // (its claim or later); a process with neither cannot be judged, and says so.
                let lowest_acked = held.get(&younger).and_then(|e| e.first().copied());
                let Some(claim) = h.processes[younger].start_epoch.or(lowest_acked) else {
                    unjudged += 1;
                    continue;
                };
                takeovers += 1;
                for e in held.get(&older).into_iter().flatten().filter(|e| **e > claim) {
                    problems.push(format!(
                        "process {older} ({}) wrote under epoch {e}, above epoch {claim} that process {younger} claimed after it",
                        h.processes[older].writer
                    ));
                }
            }
        }
    }
    // The shard's epochs over time: one that went back means two claimants took turns.
    let mut last: BTreeMap<&str, &EpochSeen> = BTreeMap::new();
    let mut seen: Vec<&EpochSeen> = h.epochs.iter().collect();
    seen.sort_by_key(|s| s.at_ms);
    for s in seen {
        if let Some(prev) = last.get(s.shard.as_str())
            && s.epoch < prev.epoch
        {
            problems.push(format!(
                "shard {} went from epoch {} to {} between {} and {} ms",
                s.shard, prev.epoch, s.epoch, prev.at_ms, s.at_ms
            ));
        }
        last.insert(&s.shard, s);
    }
    check(
        "no_fenced_claim_again",
        problems,
        json!({"pairs": takeovers, "unjudged_pairs": unjudged, "epochs_seen": h.epochs.len()}),
    )
}

/// Every SIGTERM ended its process with exit code 0 within its bound.
fn sigterm_exits_zero_in_bound(h: &History) -> Check {
    let problems = h
        .terms
        .iter()
        .filter(|t| t.code != Some(0) || t.seconds > t.bound_seconds)
        .map(|t| {
            format!(
                "process {} after SIGTERM: exit {:?} in {:.1} s (bound {:.0} s)",
                t.process, t.code, t.seconds, t.bound_seconds
            )
        })
        .collect();
    let slowest = h.terms.iter().map(|t| t.seconds).fold(0.0, f64::max);
    check(
        "sigterm_exits_zero_in_bound",
        problems,
        json!({"sigterms": h.terms.len(), "slowest_seconds": slowest}),
    )
}

/// Every write that was answered "may have landed" was retried with the same ids until an
/// acknowledgement: a later definite refusal does not make the first answer "nothing".
fn indeterminate_retried_to_definite(h: &History) -> Check {
    let mut problems = Vec::new();
    let mut n = 0u64;
    for op in h.ops.iter().filter(|o| o.indeterminate()) {
        n += 1;
        if !matches!(op.outcome, Outcome::Acked { .. } | Outcome::Gone) {
            problems.push(format!(
                "{:?} of {} ended {:?} after {} attempts: {:?}",
                op.kind,
                op.records.first().map_or("?", |r| r.id.as_str()),
                op.outcome,
                op.attempts.len(),
                op.attempts.last()
            ));
        }
    }
    check(
        "indeterminate_retried_to_definite",
        problems,
        json!({"indeterminate_ops": n}),
    )
}

/// No write of the soak was refused: every one is valid, so a refusal is the server's fault.
fn no_refusals(h: &History) -> Check {
    let problems = h
        .ops
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Refused(why) => Some(format!(
                "{:?} of {} refused: {why}",
                op.kind,
                op.records.first().map_or("?", |r| r.id.as_str())
            )),
            _ => None,
        })
        .collect();
    check("no_refusals", problems, json!({"ops": h.ops.len()}))
}

/// The newest replica of every writer id is ready at the end, and none exited on its own.
fn replicas_ready_at_end(h: &History) -> Check {
    let mut problems: Vec<String> = h.crashes.clone();
    for w in &h.writers {
        let newest = by_writer(h).get(w.as_str()).and_then(|v| v.last().copied());
        match newest.and_then(|p| h.finals.iter().find(|f| f.process == p)) {
            Some(f) if f.ready => {}
            Some(f) => problems.push(format!("process {} ({w}) is not ready: {}", f.process, f.reason)),
            None => problems.push(format!("writer {w} has no replica at the end")),
        }
    }
    check(
        "replicas_ready_at_end",
        problems,
        json!({"replicas": h.finals.len(), "crashes": h.crashes.len()}),
    )
}

/// Every replica serves the same context view of every hot session.
fn context_views_identical(h: &History) -> Check {
    let mut problems = Vec::new();
    let mut sessions = 0u64;
    for f in h.finals.iter().filter(|f| !f.unread.is_empty()) {
        problems.push(format!(
            "process {}: its context views are partial, {} final reads got no answer",
            f.process,
            f.unread.len()
        ));
    }
    let mut complete = h.finals.iter().filter(|f| f.unread.is_empty());
    if let Some(first) = complete.next() {
        sessions = first.contexts.len() as u64;
        for f in complete {
            for (s, view) in &first.contexts {
                if f.contexts.get(s) != Some(view) {
                    problems.push(format!(
                        "{s}: process {} serves another context view than process {}",
                        f.process, first.process
                    ));
                }
            }
        }
    }
    check("context_views_identical", problems, json!({"sessions": sessions}))
}

/// The run did what a soak must: writes of every kind acknowledged, through every writer
/// id; every fault; every watcher received events and reconnected.
fn progress(h: &History) -> Check {
    let mut problems = Vec::new();
    let mut acked_by_kind: BTreeMap<String, u64> = BTreeMap::new();
    let mut acked_by_writer: BTreeMap<&str, u64> = BTreeMap::new();
    for op in &h.ops {
        if let Outcome::Acked { process, .. } = op.outcome {
            *acked_by_kind.entry(format!("{:?}", op.kind)).or_default() += 1;
            if let Some(p) = h.processes.get(process) {
                *acked_by_writer.entry(&p.writer).or_default() += 1;
            }
        }
    }
    for kind in ["Append", "BotAppend", "Summary", "Delete"] {
        if acked_by_kind.get(kind).copied().unwrap_or(0) == 0 {
            problems.push(format!("no {kind} was acknowledged"));
        }
    }
    for w in &h.writers {
        if acked_by_writer.get(w.as_str()).copied().unwrap_or(0) == 0 {
            problems.push(format!("writer {w} had nothing acknowledged"));
        }
    }
    for what in [
        "kills",
        "sigterms",
        "takeovers",
        "slow_bursts",
        "maintenance_ok",
        "disconnects",
    ] {
        if h.counts.get(what).copied().unwrap_or(0) == 0 {
            problems.push(format!("no {what}"));
        }
    }
    if h.faults && h.counts.get("faults_injected").copied().unwrap_or(0) == 0 {
        problems.push("no object-store fault was injected".into());
    }
    for w in &h.watchers {
        if w.events.is_empty() {
            problems.push(format!("{} received nothing", w.name));
        }
        if w.reconnects == 0 {
            problems.push(format!("{} never reconnected", w.name));
        }
    }
    if h.watchers.is_empty() || h.finals.is_empty() {
        problems.push("no watcher or no replica read at the end".into());
    }
    check(
        "progress",
        problems,
        json!({"acked_by_kind": acked_by_kind, "acked_by_writer": acked_by_writer, "counts": h.counts}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(bot: &str, session: &str, id: &str) -> Rec {
        Rec {
            bot: bot.into(),
            session: session.into(),
            id: id.into(),
            text: format!("text of {id}"),
        }
    }

    fn acked(kind: OpKind, records: Vec<Rec>, process: usize, epoch: u64, sent_ms: u64) -> Op {
        Op {
            kind,
            records,
            first_sent_ms: sent_ms,
            attempts: vec![Attempt::Acked],
            outcome: Outcome::Acked {
                process,
                shard: format!("shard-{}", process % 2),
                epoch,
                first_seq: 1,
                sent_ms,
            },
        }
    }

    /// A run that passed: two writer ids (processes 0 and 1; process 2 took writer 0 over
    /// at 500 ms with epoch 2), a put, a batch, a bot-wide append, a summary, a delete, two
    /// watchers that saw it all, and two replicas that agree.
    fn passing() -> History {
        let a = rec("alpha", "s0", "a1");
        let b = rec("alpha", "s0", "a2");
        let c = rec("beta", "s1", "b1");
        let s = rec("alpha", "s0", "sum1");
        let gone = rec("alpha", "s0", "a2");
        let ops = vec![
            acked(OpKind::Append, vec![a.clone()], 0, 1, 100),
            acked(OpKind::Append, vec![b.clone()], 1, 1, 200),
            acked(OpKind::BotAppend, vec![c.clone()], 1, 1, 300),
            acked(OpKind::Summary, vec![s.clone()], 2, 2, 600),
            acked(OpKind::Delete, vec![gone.clone()], 2, 2, 700),
        ];
        let ev = |event: &str, r: &Rec, seq: u64| WatchEvent {
            event: event.into(),
            rec: r.clone(),
            shard: "shard-0".into(),
            seq,
            epoch: 1,
        };
        let watchers = vec![
            Watcher {
                name: "session".into(),
                scope: Scope::Session {
                    bot: "alpha".into(),
                    session: "s0".into(),
                },
                start_ms: 50,
                events: vec![
                    ev("record", &a, 1),
                    ev("record", &b, 2),
                    ev("record", &s, 3),
                    ev("tombstone", &gone, 4),
                ],
                reconnects: 2,
            },
            Watcher {
                name: "store".into(),
                scope: Scope::Store,
                start_ms: 250,
                events: vec![ev("record", &c, 1), ev("record", &s, 2), ev("tombstone", &gone, 3)],
                reconnects: 1,
            },
        ];
        let context = json!({"summary": "sum1", "covered": 1, "records": [["sum1", "text of sum1"]]});
        let fin = |process: usize| Final {
            process,
            ready: true,
            reason: String::new(),
            unread: Vec::new(),
            records: vec![a.clone(), c.clone(), s.clone()],
            contexts: [("alpha/s0".to_string(), context.clone())].into_iter().collect(),
        };
        History {
            ops,
            processes: vec![
                Process {
                    writer: "w0".into(),
                    started_ms: 0,
                    start_epoch: Some(1),
                },
                Process {
                    writer: "w1".into(),
                    started_ms: 10,
                    start_epoch: Some(1),
                },
                Process {
                    writer: "w0".into(),
                    started_ms: 500,
                    start_epoch: Some(2),
                },
            ],
            epochs: vec![
                EpochSeen {
                    at_ms: 20,
                    shard: "shard-0".into(),
                    epoch: 1,
                },
                EpochSeen {
                    at_ms: 510,
                    shard: "shard-0".into(),
                    epoch: 2,
                },
            ],
            terms: vec![Term {
                process: 0,
                code: Some(0),
                seconds: 0.4,
                bound_seconds: 30.0,
            }],
            watchers,
            finals: vec![fin(1), fin(2)],
            retained: BTreeSet::new(),
            retain_unknown: false,
            cold_bot: "cold".into(),
            writers: vec!["w0".into(), "w1".into()],
            counts: [
                "kills",
                "sigterms",
                "takeovers",
                "slow_bursts",
                "maintenance_ok",
                "disconnects",
                "faults_injected",
            ]
            .into_iter()
            .map(|k| (k.to_string(), 1))
            .collect(),
            crashes: vec![],
            faults: true,
        }
    }

    /// The names of the checks that failed.
    fn failed(h: &History) -> Vec<&'static str> {
        judge(h).into_iter().filter(|c| !c.ok).map(|c| c.name).collect()
    }

    #[test]
    fn a_run_that_passed_passes() {
        assert_eq!(failed(&passing()), Vec::<&str>::new(), "{:#?}", judge(&passing()));
    }

    #[test]
    fn a_lost_a_duplicated_a_changed_a_resurrected_and_a_phantom_record_fail() {
        type Breaks = fn(&mut History);
        let broken: [(&str, Breaks); 6] = [
            ("lost", |h| h.finals[1].records.retain(|r| r.id != "a1")),
            ("listed twice", |h| {
                let again = h.finals[0].records[0].clone();
                h.finals[0].records.push(again)
            }),
            ("other content", |h| h.finals[0].records[0].text = "other".into()),
            ("in another session", |h| h.finals[0].records[0].session = "s9".into()),
            ("listed after its delete", |h| {
                h.finals[0].records.push(rec("alpha", "s0", "a2"))
            }),
            ("never written", |h| h.finals[1].records.push(rec("beta", "s1", "zz"))),
        ];
        for (what, breaks) in broken {
            let mut h = passing();
            breaks(&mut h);
            assert_eq!(failed(&h), vec!["acked_readable_once"], "{what}");
        }
        // Retention may end only the cold bot's sessions it reported.
        let mut h = passing();
        h.cold_bot = "beta".into();
        for f in &mut h.finals {
            f.records.retain(|r| r.bot != "beta");
        }
        assert!(failed(&h).contains(&"acked_readable_once"));
        h.retained.insert("beta/s1".into());
        assert_eq!(failed(&h), Vec::<&str>::new());
    }

    #[test]
    fn a_watch_gap_a_duplicate_and_disorder_fail() {
        type Breaks = fn(&mut History);
        let broken: [(&str, Breaks); 4] = [
            // The watch gap of issue 32: a record acknowledged after the start never came.
            ("gap", |h| {
                h.watchers[0].events.remove(2);
            }),
            ("missing tombstone", |h| {
                h.watchers[1].events.pop();
            }),
            ("duplicate after a reconnect", |h| {
                let again = h.watchers[1].events[0].clone();
                h.watchers[1].events.insert(1, again)
            }),
            ("out of order", |h| h.watchers[0].events.swap(0, 1)),
        ];
        for (what, breaks) in broken {
            let mut h = passing();
            breaks(&mut h);
            assert_eq!(failed(&h), vec!["watchers_saw_everything_once_in_order"], "{what}");
        }
        // What a watcher may rightly not show: a write sent before its start, a retried one.
        let mut h = passing();
        h.watchers[1].events.remove(0);
        h.watchers[1].start_ms = 300;
        assert_eq!(failed(&h), Vec::<&str>::new(), "sent before the start");
        let mut h = passing();
        h.watchers[0].events.remove(0);
        h.ops[0].attempts.insert(0, Attempt::Indeterminate("504".into()));
        assert_eq!(failed(&h), Vec::<&str>::new(), "retried");
    }

    #[test]
    fn a_write_acknowledged_under_a_superseded_epoch_fails() {
        let mut h = passing();
        // Process 0 (epoch 1) acknowledges a write sent after the shard was seen at epoch 2.
        let mut late = acked(OpKind::Append, vec![rec("alpha", "s0", "late")], 0, 1, 600);
        // Its first attempt went before any watcher started (they need not show it).
        late.first_sent_ms = 0;
        h.ops.push(late);
        for f in &mut h.finals {
            f.records.push(rec("alpha", "s0", "late"));
        }
        assert_eq!(failed(&h), vec!["no_write_after_fenced"]);
    }

    #[test]
    fn a_fenced_replica_that_claims_again_fails() {
        // The re-claim of issue 32: process 0, superseded by process 2 (epoch 2), writes
        // under epoch 3.
        let mut h = passing();
        let mut back = acked(OpKind::Append, vec![rec("alpha", "s0", "back")], 0, 3, 900);
        back.first_sent_ms = 0;
        h.ops.push(back);
        for f in &mut h.finals {
            f.records.push(rec("alpha", "s0", "back"));
        }
        assert_eq!(failed(&h), vec!["no_fenced_claim_again"]);
        // Seen in the shard's epochs too: two claimants taking turns.
        let mut h = passing();
        h.epochs.push(EpochSeen {
            at_ms: 900,
            shard: "shard-0".into(),
            epoch: 1,
        });
        assert_eq!(failed(&h), vec!["no_fenced_claim_again"]);
    }

    #[test]
    fn a_sigterm_that_fails_or_takes_too_long_fails() {
        for (code, seconds) in [(Some(1), 0.5), (None, 31.0), (Some(0), 40.0)] {
            let mut h = passing();
            h.terms[0].code = code;
            h.terms[0].seconds = seconds;
            assert_eq!(failed(&h), vec!["sigterm_exits_zero_in_bound"], "{code:?} {seconds}");
        }
    }

    #[test]
    fn an_unknown_answer_left_unknown_or_turned_into_nothing_fails() {
        // Given up while unknown; and "unknown, then fenced": the outcome stays unknown.
        for last in [Outcome::Unknown, Outcome::Refused("fenced".into())] {
            let mut h = passing();
            h.ops.push(Op {
                kind: OpKind::Append,
                records: vec![rec("alpha", "s0", "u1")],
                first_sent_ms: 800,
                attempts: vec![
                    Attempt::Indeterminate("504 written unknown".into()),
                    Attempt::Nothing("409 fenced".into()),
                ],
                outcome: last.clone(),
            });
            let f = failed(&h);
            assert!(f.contains(&"indeterminate_retried_to_definite"), "{last:?}: {f:?}");
        }
    }

    #[test]
    fn a_refused_write_fails() {
        let mut h = passing();
        h.ops.push(Op {
            kind: OpKind::Summary,
            records: vec![rec("alpha", "s0", "sum2")],
            first_sent_ms: 800,
            attempts: vec![Attempt::Nothing("400".into())],
            outcome: Outcome::Refused("400 invalid covers".into()),
        });
        assert_eq!(failed(&h), vec!["no_refusals"]);
    }

    #[test]
    fn a_replica_not_ready_missing_or_crashed_at_the_end_fails() {
        type Breaks = fn(&mut History);
        let broken: [(&str, Breaks); 3] = [
            ("fenced newest", |h| {
                h.finals[1].ready = false;
                h.finals[1].reason = "fenced".into();
            }),
            ("no replica of w1", |h| {
                h.finals.remove(0);
            }),
            ("crashed", |h| h.crashes.push("process 1 exited 101".into())),
        ];
        for (what, breaks) in broken {
            let mut h = passing();
            breaks(&mut h);
            assert_eq!(failed(&h), vec!["replicas_ready_at_end"], "{what}");
        }
    }

    /// A replica whose final reads went unanswered fails the checks of what it serves with
    /// one line each (not with every acknowledged id), and is judged on nothing it listed.
    #[test]
    fn a_replica_whose_final_reads_failed_fails_once_per_check() {
        let mut h = passing();
        h.finals[1].ready = false;
        h.finals[1].unread = vec!["GET /v1/bots/alpha/sessions: 503".into()];
        h.finals[1].records.clear();
        h.finals[1].contexts.clear();
        assert_eq!(
            failed(&h),
            vec![
                "acked_readable_once",
                "replicas_ready_at_end",
                "context_views_identical"
            ]
        );
        let verdict = judge(&h);
        for c in verdict.iter().filter(|c| !c.ok) {
            assert_eq!(c.detail["problems"], 1, "{}: {}", c.name, c.detail);
        }
    }

    #[test]
    fn replicas_that_serve_different_context_views_fail() {
        let mut h = passing();
        h.finals[1]
            .contexts
            .insert("alpha/s0".into(), json!({"summary": null, "covered": 0, "records": []}));
        assert_eq!(failed(&h), vec!["context_views_identical"]);
    }

    #[test]
    fn a_run_without_progress_fails() {
        type Breaks = fn(&mut History);
        let broken: [(&str, Breaks); 7] = [
            ("no summary", |h| h.ops.retain(|o| o.kind != OpKind::Summary)),
            ("a writer id without acks", |h| h.writers.push("w9".into())),
            ("no kills", |h| {
                h.counts.remove("kills");
            }),
            ("a silent watcher", |h| {
                h.watchers[1].events.clear();
                h.watchers[1].start_ms = 10_000;
            }),
            ("a watcher that never reconnected", |h| h.watchers[0].reconnects = 0),
            ("faults asked for, none injected", |h| {
                h.counts.remove("faults_injected");
            }),
            ("nothing read at the end", |h| {
                h.finals.clear();
                h.writers.clear();
            }),
        ];
        for (what, breaks) in broken {
            let mut h = passing();
            breaks(&mut h);
            let f = failed(&h);
            assert!(f.contains(&"progress"), "{what}: {f:?}");
        }
        let mut h = passing();
        h.ops.clear();
        h.watchers.clear();
        h.finals.clear();
        assert!(failed(&h).contains(&"progress"));
        // A run that injected no faults owes none.
        let mut h = passing();
        h.faults = false;
        h.counts.remove("faults_injected");
        assert!(!failed(&h).contains(&"progress"), "{:?}", failed(&h));
    }
}
