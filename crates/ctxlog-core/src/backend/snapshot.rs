//! Projection snapshots (rule 17): the projection index and the reader's cursor, saved in
//! the store so that a new reader starts from them and reads only the entries past them.
//!
//! A snapshot is one byte string: a magic, a format number, a BLAKE3 checksum of the rest,
//! then the length of a small header (postcard: the store's identity, when it was taken,
//! the backend's own cursor bytes, the index's tables and counts), the header, and the
//! index's ids in fixed-width records (`backend::frozen`) that the loaded index reads where
//! they lie: loading checks the bytes once and decodes nothing per id. Loading refuses
//! anything that is not exactly a snapshot of this format of this store — [`Rejected`] says
//! why — and the projector then scans in full: a snapshot can make a first scan cheaper,
//! never different.

use serde::{Deserialize, Serialize};

use crate::backend::frozen::Shape;
use crate::backend::index::ProjectionIndex;

/// The first bytes of every snapshot.
pub const MAGIC: &[u8; 8] = b"CTXLOGPS";

/// The snapshot format this build writes and reads (1: the index decoded whole, postcard;
/// 2: the ids in fixed-width records, read in place; 3: and the summary entries; 4: ids
/// keyed in their namespace, with the index's id scope; 5: and the link entries, rule 25;
/// 6: and each id's embedding entries, rule 27). A reader skips a snapshot of another format
/// and scans in full (rule 17).
pub const FORMAT: u32 = 6;

/// How many snapshots a store keeps: a reader still loading the older one finishes.
pub const KEEP: usize = 2;

const HEADER: usize = MAGIC.len() + 4 + 32;

/// Why a stored snapshot was not used (the reader scans in full instead).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    /// Too short, or another kind of file.
    #[error("not a projection snapshot ({0})")]
    NotASnapshot(String),
    /// Written by a build with another snapshot format.
    #[error("snapshot format {found}, this build reads format {FORMAT}")]
    UnknownFormat {
        /// The format the snapshot says it has.
        found: u32,
    },
    /// The checksum does not match, or the payload does not decode into a valid index.
    #[error("corrupt snapshot: {0}")]
    Corrupt(String),
    /// Taken of another store.
    #[error("snapshot of another store (`{found}`, this store is `{expected}`)")]
    Foreign {
        /// This store's identity.
        expected: String,
        /// The snapshot's.
        found: String,
    },
    /// Names data that is gone (reclaimed since it was taken) or that the backend cannot
    /// resume from.
    #[error("stale snapshot: {0}")]
    Stale(String),
}

#[derive(Serialize, Deserialize)]
struct Meta {
    store_id: String,
    taken_millis: u64,
    cursor: Vec<u8>,
    shape: Shape,
}

/// A snapshot that passed every check.
pub struct Loaded {
    /// The index as it was saved.
    pub index: ProjectionIndex,
    /// The backend's cursor bytes as it saved them.
    pub cursor: Vec<u8>,
    /// When it was taken (milliseconds since the epoch, the store's clock).
    pub taken_millis: u64,
}

/// Encode `index` and the backend's `cursor` bytes as a snapshot of store `store_id`.
pub fn encode(index: &mut ProjectionIndex, store_id: &str, cursor: Vec<u8>, taken_millis: u64) -> Vec<u8> {
    let (shape, sections) = index.freeze();
    let meta = Meta {
        store_id: store_id.to_string(),
        taken_millis,
        cursor,
        shape,
    };
    assemble(&meta, &sections)
}

fn assemble(meta: &Meta, sections: &[u8]) -> Vec<u8> {
    let meta = postcard::to_stdvec(meta).expect("a header always encodes");
    let mut out = Vec::with_capacity(HEADER + 4 + meta.len() + sections.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(&[0; 32]);
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&meta);
    out.extend_from_slice(sections);
    let sum = blake3::hash(&out[HEADER..]);
    out[12..HEADER].copy_from_slice(sum.as_bytes());
    out
}

/// Decode a snapshot of store `store_id`, checking everything. The loaded index keeps
/// `bytes` and reads its ids from them.
pub fn decode(bytes: Vec<u8>, store_id: &str) -> Result<Loaded, Rejected> {
    if bytes.len() < HEADER || &bytes[..MAGIC.len()] != MAGIC {
        return Err(Rejected::NotASnapshot(format!(
            "{} bytes without the magic",
            bytes.len()
        )));
    }
    let format = u32::from_le_bytes(bytes[8..12].try_into().expect("four bytes"));
    if format != FORMAT {
        return Err(Rejected::UnknownFormat { found: format });
    }
    // The header is read before the checksum is known (it places the sections), and the
    // checksum is computed while the sections are checked; nothing is used unless both pass.
    let (meta, base) = match header(&bytes) {
        Ok(found) => found,
        Err(_) if !checksum_matches(&bytes) => return Err(mismatch()),
        Err(why) => return Err(why),
    };
    let (verified, index) = ProjectionIndex::from_frozen(meta.shape, bytes, base, checksum_matches);
    if !verified {
        return Err(mismatch());
    }
    if meta.store_id != store_id {
        return Err(Rejected::Foreign {
            expected: store_id.to_string(),
            found: meta.store_id,
        });
    }
    let index = index.map_err(Rejected::Corrupt)?;
    Ok(Loaded {
        index,
        cursor: meta.cursor,
        taken_millis: meta.taken_millis,
    })
}

/// Below this size a snapshot is read on one thread (threads cost more than they save).
const PARALLEL_READ_FROM: usize = 8 << 20;

/// How many readers [`read_in_parts`] should get for a snapshot of `len` bytes: one per
/// core (at most four), one for a small snapshot.
pub fn read_parts(len: usize) -> usize {
    if len < PARALLEL_READ_FROM {
        return 1;
    }
    std::thread::available_parallelism().map_or(1, |n| n.get().min(4))
}

/// A snapshot of `len` bytes read by every reader at once, reader `k` of `n` filling the
/// `k`-th of `n` consecutive parts of one buffer with `read(reader, offset, part)`; the
/// first error is returned. Panics without a reader (nothing would fill the buffer).
///
/// Why: a snapshot is read into fresh memory, and most of reading tens of megabytes on one
/// thread is the kernel faulting in and clearing that memory page by page, then copying
/// into it. The buffer comes zeroed from the allocator without being written (a large
/// zeroed allocation is fresh pages), so each page is faulted in by the reader that fills
/// it, and the readers do that side by side.
pub fn read_in_parts<R: Send, E: Send>(
    len: usize,
    mut readers: Vec<R>,
    read: impl Fn(&mut R, u64, &mut [u8]) -> Result<(), E> + Sync,
) -> Result<Vec<u8>, E> {
    assert!(!readers.is_empty(), "a snapshot read needs a reader");
    let mut bytes = vec![0u8; len];
    let part = len.div_ceil(readers.len()).max(1);
    let read = &read;
    std::thread::scope(|s| {
        let mut running = Vec::new();
        let mut parts = bytes.chunks_mut(part).zip(readers.iter_mut()).enumerate();
        // The first part on this thread, the others on threads of their own.
        let first = parts.next();
        for (k, (chunk, reader)) in parts {
            running.push(s.spawn(move || read(reader, (k * part) as u64, chunk)));
        }
        let mine = first.map_or(Ok(()), |(_, (chunk, reader))| read(reader, 0, chunk));
        running
            .into_iter()
            .map(|t| t.join().expect("a snapshot reader does not panic"))
            .fold(mine, Result::and)
    })?;
    Ok(bytes)
}

fn checksum_matches(bytes: &[u8]) -> bool {
    blake3::hash(&bytes[HEADER..]).as_bytes() == &bytes[12..HEADER]
}

fn mismatch() -> Rejected {
    Rejected::Corrupt("checksum mismatch".into())
}

/// The header of a snapshot, and where its sections start.
fn header(bytes: &[u8]) -> Result<(Meta, usize), Rejected> {
    let len = bytes
        .get(HEADER..HEADER + 4)
        .map(|b| u32::from_le_bytes(b.try_into().expect("four bytes")) as usize)
        .ok_or_else(|| Rejected::Corrupt("no header length".into()))?;
    let base = HEADER + 4 + len;
    let raw = bytes
        .get(HEADER + 4..base)
        .ok_or_else(|| Rejected::Corrupt(format!("a header of {len} bytes past the end")))?;
    match postcard::take_from_bytes::<Meta>(raw) {
        Ok((meta, [])) => Ok((meta, base)),
        Ok((_, rest)) => Err(Rejected::Corrupt(format!("{} bytes after the header", rest.len()))),
        Err(e) => Err(Rejected::Corrupt(format!("header: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::index::tests::{arb_entries, index_of, unique_positions as unique};
    use crate::backend::index::{IndexRow, RowRef};
    use crate::entry::{Entry, OrderKey};
    use proptest::prelude::*;

    fn session_keys(idx: &mut ProjectionIndex) -> Vec<Vec<(OrderKey, RowRef)>> {
        (0..2).map(|s| idx.session_keys("bot", &format!("s{s}"))).collect()
    }

    /// Rows as a backend that fetches by location feeds them (`with_at`), or by key.
    fn row(e: &Entry, with_at: bool) -> IndexRow<'_> {
        let at = if with_at {
            RowRef(e.seq, e.hlc.0)
        } else {
            RowRef::default()
        };
        IndexRow { at, ..IndexRow::of(e) }
    }

    fn index_of_rows(entries: &[Entry], with_at: bool) -> ProjectionIndex {
        let mut idx = ProjectionIndex::new();
        for e in entries {
            idx.apply(row(e, with_at));
        }
        idx
    }

    proptest! {
        /// Snapshot at any point, then the rest applied: the same answers as one pass over
        /// everything (what a reader from a snapshot plus its delta must give, rule 17).
        #[test]
        fn a_snapshot_plus_the_rest_equals_one_pass(
            entries in arb_entries(),
            split in 0usize..40,
            with_at in any::<bool>(),
            threads in 0usize..4,
        ) {
            let entries = unique(entries);
            let split = split.min(entries.len());
            let mut saved = index_of_rows(&entries[..split], with_at);
            let bytes = encode(&mut saved, "store-a", b"cursor".to_vec(), 7);
            let loaded = decode(bytes, "store-a").expect("a fresh snapshot decodes");
            prop_assert_eq!(&loaded.cursor, b"cursor");
            prop_assert_eq!(loaded.taken_millis, 7);
            let mut resumed = loaded.index;
            if threads == 0 {
                for e in &entries[split..] {
                    resumed.apply(row(e, with_at));
                }
            } else {
                // Thawed on the threads that apply the parts.
                let (_, applied) = resumed.apply_in_parallel(threads, entries[split..].chunks(3), |b, a| {
                    b.iter().for_each(|e| a.apply(row(e, with_at)));
                    Ok::<(), ()>(())
                });
                prop_assert_eq!(applied, Ok(()));
            }
            // What the snapshot held, frozen or copied out, is held: nothing applies twice.
            for e in &entries {
                prop_assert!(!resumed.apply(row(e, with_at)), "an entry the index held was applied again");
            }
            let mut whole = index_of_rows(&entries, with_at);
            // Saved again from the loaded index (frozen ids, thawed ones and new ones), then
            // loaded: the same index.
            let again = encode(&mut resumed, "store-a", Vec::new(), 8);
            let mut reloaded = decode(again, "store-a").expect("a snapshot of a loaded index decodes").index;
            prop_assert_eq!(reloaded.projection().canonical_json(), whole.projection().canonical_json());
            prop_assert_eq!(session_keys(&mut reloaded), session_keys(&mut whole));
            prop_assert_eq!(resumed.projection().canonical_json(), whole.projection().canonical_json());
            prop_assert_eq!(resumed.stats(), whole.stats());
            prop_assert_eq!(resumed.checkpoint(), whole.checkpoint());
            prop_assert_eq!(resumed.max_hlc(), whole.max_hlc());
            prop_assert_eq!(resumed.entries(), whole.entries());
            prop_assert_eq!(session_keys(&mut resumed), session_keys(&mut whole));
            let conflicts = |i: &ProjectionIndex| crate::projection::canonical_conflicts(i.id_conflicts());
            prop_assert_eq!(conflicts(&resumed), conflicts(&whole));
        }
    }

    /// A snapshot of many ids finds each by binary search — ids with one put, with other
    /// puts, with a tombstone — and no id it does not hold (before, between and after them).
    /// The property test above draws from six ids, too few to exercise the search.
    #[test]
    fn every_id_of_a_large_snapshot_is_found_and_no_other() {
        use crate::record::Kind;
        let entry = |seq: u64, id: &str, text: &str, kind: Kind| stored(seq, id, &format!("s{}", seq % 2), text, kind);
        let (mut held, mut seq) = (Vec::new(), 0);
        for i in 0..700u64 {
            // Even numbers only: the odd ones lie between held ids.
            let id = format!("id{:05}", 2 * i + 2);
            for p in 0..=i % 3 {
                seq += 1;
                let kind = if i % 5 == 0 && p == i % 3 {
                    Kind::Tombstone
                } else {
                    Kind::Put
                };
                held.push(entry(seq, &id, &format!("v{p}"), kind));
            }
        }
        for with_at in [false, true] {
            let mut saved = index_of_rows(&held, with_at);
            let whole = saved.projection().canonical_json();
            let bytes = encode(&mut saved, "store-a", Vec::new(), 1);
            let mut loaded = decode(bytes, "store-a").expect("a fresh snapshot decodes").index;
            for e in &held {
                assert!(!loaded.apply(row(e, with_at)), "{} was not found", e.record.id);
            }
            assert_eq!(loaded.projection().canonical_json(), whole);
            let absent: Vec<Entry> = (0..=701u64)
                .map(|i| {
                    seq += 1;
                    entry(seq, &format!("id{:05}", 2 * i + 1), "new", Kind::Put)
                })
                .collect();
            for e in &absent {
                assert!(loaded.apply(row(e, with_at)), "{} was found", e.record.id);
            }
            let mut all = held.clone();
            all.extend(absent);
            assert_eq!(
                loaded.projection().canonical_json(),
                index_of_rows(&all, with_at).projection().canonical_json()
            );
        }
    }

    /// The parts cover the buffer exactly, each read at its own offset, for any number of
    /// readers and any length (shorter than the readers, not a multiple of them); an error
    /// of any reader is the result.
    #[test]
    fn parts_fill_the_whole_buffer_or_fail() {
        let source: Vec<u8> = (0..10_007u32).map(|i| (i * 7 % 251) as u8).collect();
        for readers in 1..=5 {
            for len in [0, 1, 3, 4, 5, 10_007] {
                let got = read_in_parts(len, vec![(); readers], |_, at, part| {
                    let at = at as usize;
                    part.copy_from_slice(&source[at..at + part.len()]);
                    Ok::<(), ()>(())
                });
                assert_eq!(got.as_deref(), Ok(&source[..len]), "{readers} readers, {len} bytes");
            }
        }
        let failing = read_in_parts(100, vec![0, 1, 2], |k, _, _| if *k > 0 { Err(*k) } else { Ok(()) });
        assert_eq!(failing, Err(1));
        assert_eq!(read_parts(1 << 20), 1, "a small snapshot is read on one thread");
    }

    /// Without a reader nothing would fill the buffer: refused, never a buffer of zeros.
    #[test]
    #[should_panic(expected = "needs a reader")]
    fn a_read_without_a_reader_is_refused() {
        let _ = read_in_parts(10, Vec::<()>::new(), |_, _, _| Ok::<(), ()>(()));
    }

    fn sample() -> Vec<u8> {
        let entries: Vec<Entry> = proptest::strategy::ValueTree::current(
            &arb_entries()
                .new_tree(&mut proptest::test_runner::TestRunner::deterministic())
                .expect("a tree"),
        );
        let mut idx = index_of(&unique(entries));
        encode(&mut idx, "store-a", Vec::new(), 1)
    }

    /// Every single flipped bit anywhere in a snapshot, and every truncation, is refused.
    #[test]
    fn every_flipped_bit_and_every_truncation_is_refused() {
        let bytes = sample();
        assert!(decode(bytes.clone(), "store-a").is_ok());
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode(b, "store-a").is_err(),
                    "bit {bit} of byte {i} flipped was accepted"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(
                decode(bytes[..len].to_vec(), "store-a").is_err(),
                "truncated to {len} was accepted"
            );
        }
    }

    /// A damaged header is reported as the checksum mismatch it is; a header that passes
    /// the checksum but does not parse (a crafted one) is reported as what is wrong with it.
    #[test]
    fn a_bad_header_says_whether_the_checksum_matched() {
        let bytes = sample();
        let (meta, base) = header(&bytes).expect("a fresh header");
        let mut damaged = bytes.clone();
        damaged[HEADER..HEADER + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(damaged, "store-a").err(), Some(mismatch()));
        let mut crafted = assemble(&meta, &bytes[base..]);
        crafted[HEADER..HEADER + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let sum = blake3::hash(&crafted[HEADER..]);
        crafted[12..HEADER].copy_from_slice(sum.as_bytes());
        match decode(crafted, "store-a") {
            Err(Rejected::Corrupt(why)) => assert!(why.contains("past the end"), "{why}"),
            other => panic!("expected a corrupt header, got {:?}", other.err()),
        }
    }

    #[test]
    fn foreign_and_unknown_format_snapshots_say_why() {
        let bytes = sample();
        assert!(matches!(
            decode(bytes.clone(), "store-b"),
            Err(Rejected::Foreign { .. })
        ));
        let mut other = bytes.clone();
        other[8..12].copy_from_slice(&(FORMAT + 1).to_le_bytes());
        assert_eq!(
            decode(other, "store-a").err(),
            Some(Rejected::UnknownFormat { found: FORMAT + 1 })
        );
        assert!(matches!(
            decode(b"SQLite format 3\0".to_vec(), "store-a"),
            Err(Rejected::NotASnapshot(_))
        ));
    }

    /// A checksummed snapshot whose numbers point outside the index, whose id offsets are
    /// out of order, past the ids or inside a character, or whose ids are out of order (a
    /// crafted snapshot) is refused rather than trusted — never a panic.
    #[test]
    fn numbers_out_of_range_are_refused() {
        // (what, section, byte offset in it, bytes written there)
        // The index holds one shard and one session: number 1 is the first out of range.
        let crafted: [(&str, &str, usize, Vec<u8>); 9] = [
            (
                "a session number out of range",
                "winners",
                28,
                9u32.to_le_bytes().to_vec(),
            ),
            (
                "the session number one past the last",
                "winners",
                28,
                1u32.to_le_bytes().to_vec(),
            ),
            ("a shard number out of range", "winners", 8, 9u32.to_le_bytes().to_vec()),
            (
                "the shard number one past the last",
                "winners",
                8,
                1u32.to_le_bytes().to_vec(),
            ),
            ("offsets out of order", "offsets", 4, 9u32.to_le_bytes().to_vec()),
            ("offsets not from zero", "offsets", 0, 1u32.to_le_bytes().to_vec()),
            (
                "an offset inside a character",
                "offsets",
                4,
                1u32.to_le_bytes().to_vec(),
            ),
            ("ids out of order", "arena", 5, b"0".to_vec()),
            (
                "a session list past the ids",
                "session_ids",
                0,
                9u32.to_le_bytes().to_vec(),
            ),
        ];
        refuses_crafted(&arb_entries_fixed(), &crafted);
    }

    /// Each patch (what, section, byte offset in it, bytes) written into a fresh, valid
    /// snapshot of `entries` (its checksum made to match) must be refused as corrupt.
    fn refuses_crafted(entries: &[Entry], crafted: &[(&str, &str, usize, Vec<u8>)]) {
        let mut idx = index_of(entries);
        let bytes = encode(&mut idx, "store-a", Vec::new(), 0);
        assert!(
            decode(bytes.clone(), "store-a").is_ok(),
            "the snapshot unpatched is used"
        );
        let (meta, base) = header(&bytes).expect("a fresh header");
        for (what, section, at, patch) in crafted {
            let start = crate::backend::frozen::Frozen::section(&meta.shape, base, section) + at;
            let mut sections = bytes[base..].to_vec();
            sections[start - base..start - base + patch.len()].copy_from_slice(patch);
            let crafted = assemble(&meta, &sections);
            assert!(
                matches!(decode(crafted, "store-a"), Err(Rejected::Corrupt(_))),
                "{what} was not refused as corrupt"
            );
        }
    }

    /// Crafted extras (other puts and tombstones) and session lists are refused too: rows out
    /// of order or past the ids, ranges that do not follow each other, an other put without a
    /// session, shard numbers out of range, session lists out of order or past the ids.
    #[test]
    fn crafted_extras_and_session_lists_are_refused() {
        use crate::record::Kind;
        // Ids a, b, c (numbers 0, 1, 2); extras rows: a (one other put), b (one tombstone),
        // c (one embedding); sessions s0 and s1.
        let entries = [
            stored(1, "a", "s0", "x", Kind::Put),
            stored(2, "a", "s0", "y", Kind::Put),
            stored(3, "b", "s0", "x", Kind::Put),
            stored(4, "b", "s0", "", Kind::Tombstone),
            stored(5, "c", "s1", "x", Kind::Put),
            stored(6, "c", "s1", "", Kind::Embedding),
        ];
        let u = |v: u32| v.to_le_bytes().to_vec();
        refuses_crafted(
            &entries,
            &[
                ("extras rows out of order", "extras", 28, u(0)),
                ("an extras row past the ids", "extras", 28, u(3)),
                ("other puts not following each other", "extras", 4, u(1)),
                ("tombstones not following each other", "extras", 28 + 12, u(1)),
                ("embeddings not following each other", "extras", 56 + 20, u(1)),
                ("an embedding counted twice", "extras", 56 + 24, u(2)),
                ("an extras row with nothing", "extras", 8, u(0)),
                ("an other put without a session", "others", 28, u(u32::MAX)),
                ("an other put's session out of range", "others", 28, u(2)),
                ("an other put's shard out of range", "others", 8, u(1)),
                ("a tombstone's shard out of range", "tombstones", 8, u(1)),
                ("an embedding's shard out of range", "embeddings", 8, u(1)),
                ("session starts not from zero", "session_starts", 0, u(1)),
                ("session lists out of order", "session_starts", 4, u(4)),
                ("a session list past the ids", "session_ids", 0, u(3)),
            ],
        );
    }

    fn arb_entries_fixed() -> Vec<Entry> {
        // Ids of two-byte characters: an offset can fall inside one.
        (1..4u64)
            .map(|seq| stored(seq, &format!("é{seq}"), "s0", "x", crate::record::Kind::Put))
            .collect()
    }

    /// Entry `seq` of writer `w`'s shard (epoch 1, HLC = seq), its hash matching its content.
    fn stored(seq: u64, id: &str, session: &str, text: &str, kind: crate::record::Kind) -> Entry {
        let mut record = crate::record::Record::text(id, "bot", session, "user", text);
        record.kind = kind;
        Entry {
            shard: crate::ids::WriterId::new("w").unwrap().shard_id(),
            seq,
            epoch: 1,
            hlc: crate::hlc::Hlc(seq),
            content_hash: record.content_hash(),
            record,
            purged: false,
        }
    }
}
