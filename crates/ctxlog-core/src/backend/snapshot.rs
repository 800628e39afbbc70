//! Projection snapshots (rule 17): the projection index and the reader's cursor, saved in
//! the store so that a new reader starts from them and reads only the entries past them.
//!
//! A snapshot is one byte string: a magic, a format number, a BLAKE3 checksum of the rest,
//! then the payload (postcard): the store's identity, when it was taken, the
//! backend's own cursor bytes and the index. Loading refuses anything that is not exactly a
//! snapshot of this format of this store — [`Rejected`] says why — and the projector then
//! scans in full: a snapshot can make a first scan cheaper, never different.

use serde::{Deserialize, Serialize};

use crate::backend::index::{IndexImage, ProjectionIndex};

/// The first bytes of every snapshot.
pub const MAGIC: &[u8; 8] = b"CTXLOGPS";

/// The snapshot format this build writes and reads.
pub const FORMAT: u32 = 1;

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
struct Payload {
    store_id: String,
    taken_millis: u64,
    cursor: Vec<u8>,
    index: IndexImage,
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
    let payload = Payload {
        store_id: store_id.to_string(),
        taken_millis,
        cursor,
        index: index.image(),
    };
    let body = postcard::to_stdvec(&payload).expect("a payload always encodes");
    let mut out = Vec::with_capacity(HEADER + body.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT.to_le_bytes());
    out.extend_from_slice(blake3::hash(&body).as_bytes());
    out.extend_from_slice(&body);
    out
}

/// Decode a snapshot of store `store_id`, checking everything.
pub fn decode(bytes: &[u8], store_id: &str) -> Result<Loaded, Rejected> {
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
    let (sum, body) = bytes[12..].split_at(32);
    if blake3::hash(body).as_bytes() != sum {
        return Err(Rejected::Corrupt("checksum mismatch".into()));
    }
    let payload: Payload = postcard::from_bytes(body).map_err(|e| Rejected::Corrupt(format!("payload: {e}")))?;
    if payload.store_id != store_id {
        return Err(Rejected::Foreign {
            expected: store_id.to_string(),
            found: payload.store_id,
        });
    }
    let index = ProjectionIndex::from_image(payload.index).map_err(Rejected::Corrupt)?;
    Ok(Loaded {
        index,
        cursor: payload.cursor,
        taken_millis: payload.taken_millis,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::index::IndexRow;
    use crate::backend::index::tests::{arb_entries, index_of, unique_positions as unique};
    use crate::entry::{Entry, OrderKey};
    use proptest::prelude::*;

    fn session_keys(idx: &mut ProjectionIndex) -> Vec<Vec<OrderKey>> {
        (0..2)
            .map(|s| {
                idx.session_keys("bot", &format!("s{s}"))
                    .into_iter()
                    .map(|k| k.0)
                    .collect()
            })
            .collect()
    }

    proptest! {
        /// Snapshot at any point, then the rest applied: the same answers as one pass over
        /// everything (what a reader from a snapshot plus its delta must give, rule 17).
        #[test]
        fn a_snapshot_plus_the_rest_equals_one_pass(entries in arb_entries(), split in 0usize..40) {
            let entries = unique(entries);
            let split = split.min(entries.len());
            let mut saved = index_of(&entries[..split]);
            let bytes = encode(&mut saved, "store-a", b"cursor".to_vec(), 7);
            let loaded = decode(&bytes, "store-a").expect("a fresh snapshot decodes");
            prop_assert_eq!(&loaded.cursor, b"cursor");
            prop_assert_eq!(loaded.taken_millis, 7);
            let mut resumed = loaded.index;
            for e in &entries[split..] {
                resumed.apply(IndexRow::of(e));
            }
            // What the snapshot held, frozen or copied out, is held: nothing applies twice.
            for e in &entries {
                prop_assert!(!resumed.apply(IndexRow::of(e)), "an entry the index held was applied again");
            }
            let mut whole = index_of(&entries);
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
        assert!(decode(&bytes, "store-a").is_ok());
        for i in 0..bytes.len() {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[i] ^= 1 << bit;
                assert!(
                    decode(&b, "store-a").is_err(),
                    "bit {bit} of byte {i} flipped was accepted"
                );
            }
        }
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len], "store-a").is_err(),
                "truncated to {len} was accepted"
            );
        }
    }

    #[test]
    fn foreign_and_unknown_format_snapshots_say_why() {
        let bytes = sample();
        assert!(matches!(decode(&bytes, "store-b"), Err(Rejected::Foreign { .. })));
        let mut other = bytes.clone();
        other[8..12].copy_from_slice(&(FORMAT + 1).to_le_bytes());
        assert_eq!(
            decode(&other, "store-a").err(),
            Some(Rejected::UnknownFormat { found: FORMAT + 1 })
        );
        assert!(matches!(
            decode(b"SQLite format 3\0", "store-a"),
            Err(Rejected::NotASnapshot(_))
        ));
    }

    /// A checksummed payload whose numbers point outside the index, or whose id offsets are
    /// out of order, past the ids or inside a character (a crafted snapshot), is refused
    /// rather than trusted — never a panic.
    #[test]
    fn numbers_out_of_range_are_refused() {
        type Craft = fn(&mut IndexImage);
        let crafted: [(&str, Craft); 4] = [
            ("a session number out of range", |i| i.break_a_session_number()),
            ("offsets out of order", |i| i.set_offset(1, 9)),
            ("offsets not from zero", |i| i.set_offset(0, 1)),
            ("an offset inside a character", |i| i.set_offset(1, 1)),
        ];
        for (what, craft) in crafted {
            let mut idx = index_of(&unique(arb_entries_fixed()));
            let mut image = idx.image();
            craft(&mut image);
            assert!(
                matches!(decode(&checksummed(image), "store-a"), Err(Rejected::Corrupt(_))),
                "{what} was not refused as corrupt"
            );
        }
    }

    /// A snapshot of `image` with a valid header and checksum.
    fn checksummed(image: IndexImage) -> Vec<u8> {
        let payload = Payload {
            store_id: "store-a".into(),
            taken_millis: 0,
            cursor: Vec::new(),
            index: image,
        };
        let body = postcard::to_stdvec(&payload).unwrap();
        let mut bytes = MAGIC.to_vec();
        bytes.extend_from_slice(&FORMAT.to_le_bytes());
        bytes.extend_from_slice(blake3::hash(&body).as_bytes());
        bytes.extend_from_slice(&body);
        bytes
    }

    fn arb_entries_fixed() -> Vec<Entry> {
        let w = crate::ids::WriterId::new("w").unwrap().shard_id();
        (1..4u64)
            .map(|seq| {
                // Ids of two-byte characters: an offset can fall inside one.
                let record = crate::record::Record::text(format!("é{seq}"), "bot", "s0", "user", "x");
                Entry {
                    shard: w,
                    seq,
                    epoch: 1,
                    hlc: crate::hlc::Hlc(seq),
                    content_hash: record.content_hash(),
                    record,
                    purged: false,
                }
            })
            .collect()
    }
}
