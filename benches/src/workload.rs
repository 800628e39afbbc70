//! The deterministic workload: what W writers of an agent platform append.
//!
//! Bodies are log-normal around 600 bytes, 1 % are over 16 KiB and 5 % are binary; every
//! record has a metadata object. 1 % of appends retry an earlier record (same content, a
//! later `created_at`), 0.1 % rewrite an earlier id with other content (a divergent put),
//! 1 % delete an earlier id (a tombstone). The same seed gives the same records.

use ctxlog_core::{Body, Record};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, LogNormal};

#[derive(Clone, Debug)]
pub(crate) struct Workload {
    pub entries: usize,
    pub writers: usize,
    pub bots: usize,
    pub sessions_per_bot: usize,
    pub seed: u64,
}

/// The generator's version: bump it whenever the same parameters give other records, or
/// another store, than before — a change here (the mix, sizes, ids, metadata, timestamps,
/// [`WINDOW`], the RNG) or in how `ctxlog-bench generate` appends them (writer names, batch
/// size, the fold afterwards). `cargo xtask bench` reuses a store it generated only while
/// this version, the generator's parameters and the backend's store format are unchanged.
pub(crate) const GENERATOR: u32 = 4;

/// How far back a retry, rewrite or tombstone reaches at least: more than any batch the
/// benchmarks append.
const NEAR: usize = 1_000;

/// Earlier records a writer's retries, rewrites and tombstones pick from: all of them up to
/// this many (every log of up to 1m entries with 4 writers), then the newest this many.
pub(crate) const WINDOW: usize = 250_000;

/// One writer's records, generated on demand (see [`Workload::stream`]).
pub(crate) struct Records {
    workload: Workload,
    rng: StdRng,
    sizes: LogNormal<f64>,
    name: String,
    n: usize,
    i: usize,
    fresh: usize,
    earlier: std::collections::VecDeque<Record>,
    /// The ids retried, rewritten or tombstoned, and when last (record number).
    picked: std::collections::HashMap<String, usize>,
}

impl Records {
    /// The next at most `max` records (none once all are out).
    pub(crate) fn next_chunk(&mut self, max: usize) -> Vec<Record> {
        let mut out = Vec::with_capacity(max.min(self.n - self.i));
        while out.len() < max && self.i < self.n {
            let i = self.i;
            let rng = &mut self.rng;
            let p: f64 = rng.random();
            // Only records at least `NEAR` back are retried, rewritten or tombstoned: a batch
            // (of at most `NEAR` records) never holds one id twice with other content, which
            // an append refuses (rule 6).
            // Nor is an id picked again within `NEAR` records of its last pick: two retries of
            // one record carry two `created_at`s, other content (the same whatever the chunks).
            let eligible = self.earlier.len().saturating_sub(NEAR);
            let picked = &self.picked;
            let earlier = (eligible > 0)
                .then(|| rng.random_range(0..eligible))
                .filter(|&j| picked.get(&self.earlier[j].id).is_none_or(|&at| i - at >= NEAR))
                // A tombstone is never picked again: its rewrite would be a put without a role.
                .filter(|&j| self.earlier[j].kind != ctxlog_core::Kind::Tombstone);
            let mut r = match earlier {
                // A retry: the same record again.
                Some(j) if p < 0.01 => self.earlier[j].clone(),
                // A divergent put: an earlier id, other content.
                Some(j) if p < 0.011 => {
                    let mut r = self.earlier[j].clone();
                    r.body = Body::Text(format!("rewritten answer {i}"));
                    r.kind = ctxlog_core::Kind::Put;
                    r
                }
                // A tombstone for an earlier id.
                Some(j) if p < 0.021 => {
                    let prev = &self.earlier[j];
                    Record::tombstone(prev.id.clone(), prev.bot_id.clone(), prev.session_id.clone())
                }
                _ => {
                    self.fresh += 1;
                    self.workload.fresh(rng, &self.sizes, &self.name, self.fresh)
                }
            };
            if earlier.is_some() && p < 0.021 {
                self.picked.insert(r.id.clone(), i);
            }
            r.created_at = chrono::DateTime::from_timestamp(1_780_000_000 + i as i64, 0);
            if self.earlier.len() == WINDOW {
                self.earlier.pop_front();
            }
            self.earlier.push_back(r.clone());
            out.push(r);
            self.i += 1;
        }
        out
    }
}

const WORDS: &[&str] = &[
    "the", "order", "refund", "please", "tool", "result", "customer", "ticket", "agent", "calendar", "invoice",
    "shipping", "address", "thanks", "error", "retry", "summary", "context", "model", "answer", "question", "account",
    "password", "reset", "status", "pending", "approved", "declined", "meeting", "schedule",
];

impl Workload {
    /// How many entries writer `w` appends (the remainder goes to writer 0).
    pub(crate) fn entries_of(&self, w: usize) -> usize {
        let each = self.entries / self.writers;
        if w == 0 {
            each + self.entries % self.writers
        } else {
            each
        }
    }

    /// The records writer `w` appends, in order: `name` is its writer id.
    pub(crate) fn records(&self, w: usize, name: &str) -> Vec<Record> {
        let mut stream = self.stream(w, name);
        stream.next_chunk(usize::MAX)
    }

    /// [`Workload::records`] a chunk at a time, holding at most [`WINDOW`] earlier records
    /// (what retries, rewrites and tombstones pick from): a 10M-entry log is generated in
    /// bounded memory. Logs of up to `WINDOW` entries per writer are the same either way.
    pub(crate) fn stream(&self, w: usize, name: &str) -> Records {
        Records {
            workload: self.clone(),
            rng: StdRng::seed_from_u64(self.seed ^ (0x9e37_79b9_7f4a_7c15u64.wrapping_mul(w as u64 + 1))),
            sizes: LogNormal::new((600f64).ln(), 0.6).expect("valid log-normal"),
            name: name.to_string(),
            n: self.entries_of(w),
            i: 0,
            fresh: 0,
            earlier: std::collections::VecDeque::new(),
            picked: std::collections::HashMap::new(),
        }
    }

    /// What a record holds, as the bounded-storage figures count it: its id, its body and
    /// its metadata (as JSON).
    pub(crate) fn logical_bytes(r: &Record) -> u64 {
        let metadata = r.metadata.as_ref().map_or(0, |m| m.to_string().len());
        (r.id.len() + r.body.len() + metadata) as u64
    }

    fn fresh(&self, rng: &mut StdRng, sizes: &LogNormal<f64>, name: &str, n: usize) -> Record {
        let bot = rng.random_range(0..self.bots);
        let session = rng.random_range(0..self.sessions_per_bot);
        let size = if rng.random_bool(0.01) {
            rng.random_range(16 * 1024 + 1..64 * 1024)
        } else {
            (sizes.sample(rng) as usize).clamp(16, 16 * 1024)
        };
        let role = ["user", "assistant", "tool"][rng.random_range(0..3)];
        let body = if rng.random_bool(0.05) {
            Body::Bytes((0..size).map(|_| rng.random::<u8>()).collect())
        } else {
            let mut text = String::with_capacity(size + 16);
            while text.len() < size {
                text.push_str(WORDS[rng.random_range(0..WORDS.len())]);
                text.push(' ');
            }
            text.truncate(size);
            Body::Text(text)
        };
        let mut r = Record::text(
            format!("{name}-{n:08}"),
            format!("bot-{bot}"),
            format!("s-{session:04}"),
            role,
            "",
        );
        if let Body::Bytes(_) = body {
            r.content_type = "application/octet-stream".into();
        }
        r.body = body;
        r.metadata = Some(serde_json::json!({
            "turn": n,
            "model": format!("m-{}", rng.random_range(0..3)),
            "tokens": rng.random_range(1..2000),
        }));
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_records_and_the_documented_mix() {
        let w = Workload {
            entries: 20_000,
            writers: 2,
            bots: 3,
            sessions_per_bot: 10,
            seed: 7,
        };
        let a = w.records(1, "w1");
        assert_eq!(a, w.records(1, "w1"));
        assert_ne!(a, w.records(0, "w0"));
        let tombstones = a.iter().filter(|r| r.kind == ctxlog_core::Kind::Tombstone).count();
        assert!((50..200).contains(&tombstones), "{tombstones}");
        let big = a.iter().filter(|r| r.body.len() > 16 * 1024).count();
        assert!((40..200).contains(&big), "{big}");
        let mean = a.iter().map(|r| r.body.len()).sum::<usize>() / a.len();
        assert!((500..1500).contains(&mean), "{mean}");
        // In chunks, the same records.
        let mut stream = w.stream(1, "w1");
        let mut chunked = Vec::new();
        loop {
            let c = stream.next_chunk(7);
            if c.is_empty() {
                break;
            }
            chunked.extend(c);
        }
        assert_eq!(chunked, a);
    }
}
