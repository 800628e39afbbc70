//! The state of a writer's shard handle, and the one sequence every append goes through,
//! for every backend: rules 3 (typed fencing) and 4 (poisoning) are implemented here once.
//!
//! ```text
//! stage (usable? validate, seqs, clock, hashes) → begin → write (the backend) → settle
//! ```
//!
//! The types keep the order: only [`WriterState::stage`] makes a [`Staged`] batch (and it
//! refuses a closed, poisoned or fenced handle first), only [`WriterState::begin`] turns it
//! into the [`InFlight`] batch the backend writes, and only an `InFlight` batch settles
//! into an ack. `begin` marks the handle poisoned until `settle` says otherwise: if the
//! caller drops the append's future while the write is in flight, the batch may still
//! land, and the next append must not reuse its seqs. `settle` turns the backend's outcome
//! into the ack, or into the error with the handle's state updated (poisoned after an
//! indeterminate error, fenced after a `Fenced` one).

use crate::entry::AppendAck;
use crate::error::{Error, Result, Written};
use crate::hash::ContentHash;
use crate::hlc::{Hlc, HlcClock};
use crate::ids::{Epoch, Seq, ShardId, WriterId};
use crate::record::Record;
use crate::validate::Limits;

/// The [`Shard`](crate::Shard) methods that every backend answers from its handle's
/// [`WriterState`], which must be a field named `state`: `shard_id`, `writer`, `epoch` and
/// `observe`. Use it inside `impl Shard for …`.
#[macro_export]
macro_rules! shard_methods_from_writer_state {
    () => {
        fn shard_id(&self) -> $crate::ShardId {
            self.state.shard()
        }

        fn writer(&self) -> &$crate::WriterId {
            self.state.writer()
        }

        fn epoch(&self) -> $crate::Epoch {
            self.state.epoch()
        }

        fn observe(&mut self, hlc: $crate::Hlc) -> $crate::Result<()> {
            self.state.observe(hlc)
        }
    };
}

/// One shard handle's view of its shard.
#[derive(Debug)]
pub struct WriterState {
    shard: ShardId,
    writer: WriterId,
    epoch: Epoch,
    clock: HlcClock,
    limits: Limits,
    last_seq: Seq,
    poisoned: bool,
    /// A successor's claim was seen (and the epoch that made it, when known).
    fenced_by: Option<Option<Epoch>>,
    closed: bool,
}

/// A batch ready to write: every entry stamped, nothing of the handle changed yet.
#[derive(Debug)]
pub struct Staged {
    /// The batch, in order.
    pub entries: Vec<StagedEntry>,
    clock: HlcClock,
}

/// One record with what the writer stamps on it.
#[derive(Debug)]
pub struct StagedEntry {
    /// The entry's seq.
    pub seq: Seq,
    /// The entry's HLC.
    pub hlc: Hlc,
    /// The record's content hash.
    pub hash: ContentHash,
    /// The record as given.
    pub record: Record,
}

/// A batch being written: what [`WriterState::begin`] hands the backend, and what the
/// backend hands back to [`WriterState::settle`] once it is written.
#[derive(Debug)]
#[must_use = "a batch in flight is settled, or the handle stays poisoned"]
pub struct InFlight(Staged);

impl std::ops::Deref for InFlight {
    type Target = Staged;

    fn deref(&self) -> &Staged {
        &self.0
    }
}

impl Staged {
    /// The store format the batch needs (rule 22): the most any of its records needs
    /// ([`crate::Kind::needs_format`]).
    pub fn needs_format(&self) -> u32 {
        self.entries
            .iter()
            .map(|e| e.record.kind.needs_format())
            .max()
            .unwrap_or(1)
    }

    /// The first seq of the batch.
    pub fn first_seq(&self) -> Seq {
        self.entries.first().map_or(0, |e| e.seq)
    }

    /// The last seq of the batch.
    pub fn last_seq(&self) -> Seq {
        self.entries.last().map_or(0, |e| e.seq)
    }
}

impl WriterState {
    /// A handle that claimed `epoch`, continuing after `last_seq` with a clock past
    /// `max_hlc` (both recovered from the shard).
    pub fn new(
        writer: WriterId,
        epoch: Epoch,
        mut clock: HlcClock,
        limits: Limits,
        last_seq: Seq,
        max_hlc: Hlc,
    ) -> Self {
        clock.resume_after(max_hlc);
        WriterState {
            shard: writer.shard_id(),
            writer,
            epoch,
            clock,
            limits,
            last_seq,
            poisoned: false,
            fenced_by: None,
            closed: false,
        }
    }

    /// The shard the handle writes.
    pub fn shard(&self) -> ShardId {
        self.shard
    }

    /// The writer id that owns the shard.
    pub fn writer(&self) -> &WriterId {
        &self.writer
    }

    /// The epoch the handle claimed.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The last seq the handle wrote (or recovered).
    pub fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Whether an indeterminate error (or an append in flight) poisoned the handle.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned
    }

    /// The successor's epoch, if a successor's claim was seen.
    pub fn fenced_by(&self) -> Option<Option<Epoch>> {
        self.fenced_by
    }

    /// Refuse at once what must not be attempted: a closed, poisoned or fenced handle.
    pub fn check_usable(&self) -> Result<()> {
        if self.closed {
            return Err(Error::Closed { shard: self.shard });
        }
        if self.poisoned {
            return Err(Error::Poisoned { shard: self.shard });
        }
        if let Some(current) = self.fenced_by {
            return Err(self.fenced(current, Written::Nothing));
        }
        Ok(())
    }

    /// Move the clock past something read (rule 8); far-future values are refused.
    pub fn observe(&mut self, hlc: Hlc) -> Result<()> {
        self.clock.observe(hlc)
    }

    /// Refuse a closed, poisoned or fenced handle, validate the batch (rule 11) and stamp
    /// every record: the next seqs, strictly increasing HLCs, content hashes. Changes
    /// nothing of the handle.
    pub fn stage(&self, records: Vec<Record>) -> Result<Staged> {
        self.check_usable()?;
        self.limits.validate_batch(&records)?;
        let mut clock = self.clock.clone();
        let mut entries = Vec::with_capacity(records.len());
        for (i, record) in records.into_iter().enumerate() {
            let seq = self
                .last_seq
                .checked_add(i as u64 + 1)
                .filter(|s| *s <= i64::MAX as u64)
                .ok_or_else(|| Error::Corrupt {
                    shard: Some(self.shard),
                    what: format!("the shard's last seq {} leaves no room for this batch", self.last_seq),
                })?;
            let hlc = clock.tick().map_err(|e| self.on_shard(e))?;
            entries.push(StagedEntry {
                seq,
                hlc,
                hash: record.content_hash(),
                record,
            });
        }
        Ok(Staged { entries, clock })
    }

    /// The write starts: until [`WriterState::settle`], the handle counts as poisoned.
    pub fn begin(&mut self, staged: Staged) -> InFlight {
        self.poisoned = true;
        InFlight(staged)
    }

    /// The write's outcome: the batch it wrote, or why not. Ok: the handle moves past the
    /// batch and the ack is built. An error: a `Fenced` one marks the handle fenced, an
    /// indeterminate one leaves it poisoned, a definite one frees the batch's seqs again.
    pub fn settle(&mut self, outcome: Result<InFlight>) -> Result<AppendAck> {
        match outcome {
            Ok(InFlight(staged)) => {
                self.poisoned = false;
                let (first_seq, last_seq) = (staged.first_seq(), staged.last_seq());
                self.last_seq = last_seq;
                self.clock = staged.clock;
                let first_hlc = staged.entries.first().map_or(Hlc::ZERO, |e| e.hlc);
                let last_hlc = staged.entries.last().map_or(Hlc::ZERO, |e| e.hlc);
                Ok(AppendAck {
                    shard: self.shard,
                    epoch: self.epoch,
                    first_seq,
                    last_seq,
                    first_hlc,
                    last_hlc,
                    ids: staged.entries.into_iter().map(|e| e.record.id).collect(),
                })
            }
            Err(e) => {
                if let Error::Fenced { current, .. } = &e {
                    self.fenced_by = Some(*current);
                }
                self.poisoned = !e.is_definite();
                Err(e)
            }
        }
    }

    /// Keep the handle poisoned although its last error was definite (a backend whose
    /// writer cannot go on, whatever the outcome of this append).
    pub fn poison(&mut self) {
        self.poisoned = true;
    }

    /// A successor's claim was seen outside an append (during close, say).
    pub fn mark_fenced(&mut self, current: Option<Epoch>) {
        self.fenced_by = Some(current);
    }

    /// The handle was closed: every later append fails with `Closed`.
    pub fn mark_closed(&mut self) {
        self.closed = true;
    }

    /// The `Fenced` error of this handle.
    pub fn fenced(&self, current: Option<Epoch>, written: Written) -> Error {
        Error::Fenced {
            shard: self.shard,
            writer: self.writer.to_string(),
            epoch: self.epoch,
            current,
            written,
        }
    }

    /// A clock error of this shard's handle, naming the shard.
    fn on_shard(&self, e: Error) -> Error {
        match e {
            Error::Corrupt { shard: None, what } => Error::Corrupt {
                shard: Some(self.shard),
                what,
            },
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ManualClock;

    fn state() -> WriterState {
        let clock = HlcClock::new(ManualClock::new(1_000), Hlc::ZERO);
        WriterState::new(
            WriterId::new("w").unwrap(),
            3,
            clock,
            Limits::default(),
            10,
            Hlc::from_parts(2_000, 4),
        )
    }

    fn batch(n: usize) -> Vec<Record> {
        (0..n)
            .map(|i| Record::text(format!("r{i}"), "b", "s", "u", "x"))
            .collect()
    }

    #[test]
    fn an_acknowledged_batch_moves_seqs_and_clock_on() {
        let mut s = state();
        let staged = s.stage(batch(3)).unwrap();
        assert_eq!((staged.first_seq(), staged.last_seq()), (11, 13));
        assert!(
            staged.entries[0].hlc > Hlc::from_parts(2_000, 4),
            "past the recovered clock"
        );
        assert!(staged.entries.windows(2).all(|w| w[0].hlc < w[1].hlc));
        let in_flight = s.begin(staged);
        let ack = s.settle(Ok(in_flight)).unwrap();
        assert_eq!((ack.first_seq, ack.last_seq, ack.epoch), (11, 13, 3));
        assert_eq!(ack.ids, ["r0", "r1", "r2"]);
        assert!(!s.is_poisoned());
        assert_eq!(s.last_seq(), 13);
        let next = s.stage(batch(1)).unwrap();
        assert_eq!(next.first_seq(), 14);
        assert!(next.entries[0].hlc > ack.last_hlc);
    }

    #[test]
    fn outcomes_set_the_state() {
        let mut s = state();
        // A definite failure frees the seqs again.
        let staged = s.stage(batch(2)).unwrap();
        let _in_flight = s.begin(staged);
        assert!(s.is_poisoned(), "in flight counts as poisoned");
        let _ = s.settle(Err(Error::invalid("x", None, "no")));
        assert!(!s.is_poisoned());
        assert_eq!(s.stage(batch(1)).unwrap().first_seq(), 11);

        // An indeterminate one poisons.
        let staged = s.stage(batch(1)).unwrap();
        let _in_flight = s.begin(staged);
        let err = Error::Timeout {
            op: "append",
            after: std::time::Duration::from_secs(1),
            shard: None,
            written: Written::Unknown,
        };
        assert!(s.settle(Err(err)).is_err());
        assert!(matches!(s.check_usable(), Err(Error::Poisoned { .. })));

        // A fence is remembered: every later append fails at once, definitely.
        let mut s = state();
        let staged = s.stage(batch(1)).unwrap();
        let _in_flight = s.begin(staged);
        let fenced = s.fenced(Some(4), Written::Nothing);
        assert!(s.settle(Err(fenced)).is_err());
        match s.check_usable() {
            Err(Error::Fenced {
                epoch: 3,
                current: Some(4),
                written: Written::Nothing,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        let mut s = state();
        s.mark_closed();
        assert!(matches!(s.check_usable(), Err(Error::Closed { .. })));
    }

    /// Marks set outside an append (a backend whose writer cannot go on; a successor seen
    /// while closing) stick: every later append is refused at once, with the right error.
    #[test]
    fn poison_and_fence_marks_outside_an_append_stick() {
        let mut s = state();
        assert_eq!((s.last_seq(), s.fenced_by()), (10, None));
        s.mark_fenced(Some(7));
        assert_eq!(s.fenced_by(), Some(Some(7)));
        assert!(matches!(s.check_usable(), Err(Error::Fenced { current: Some(7), .. })));

        let mut s = state();
        let staged = s.stage(batch(1)).unwrap();
        let _in_flight = s.begin(staged);
        let _ = s.settle(Err(Error::invalid("x", None, "no")));
        assert!(s.check_usable().is_ok(), "a definite error leaves the handle usable");
        s.poison();
        assert!(s.is_poisoned());
        assert!(matches!(s.check_usable(), Err(Error::Poisoned { .. })));
    }

    #[test]
    fn a_dropped_append_leaves_the_handle_poisoned() {
        let mut s = state();
        let staged = s.stage(batch(1)).unwrap();
        let _in_flight = s.begin(staged);
        // The future was dropped here: settle never ran.
        assert!(matches!(s.check_usable(), Err(Error::Poisoned { .. })));
    }

    #[test]
    fn bad_input_is_refused_before_anything_is_stamped() {
        let s = state();
        let mut b = batch(2);
        b[1].id.clear();
        assert!(matches!(
            s.stage(b),
            Err(Error::InvalidInput {
                field: "id",
                index: Some(1),
                ..
            })
        ));
    }
}
