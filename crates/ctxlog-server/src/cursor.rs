//! Opaque cursors: what a client hands back to continue where it stopped. Each is
//! URL-safe base64 of a small text form; clients never look inside.
//!
//! - A *page cursor* is the order key of the last record of a page: the next page starts
//!   after it in the contract's order, whatever was appended meanwhile.
//! - A *position* is a checkpoint, per shard the last seq delivered: a watch resumes from it
//!   with no gap and no duplicate (every shard is read as a prefix), and a conflicts call
//!   reports only what involves entries past it.
//! - A *name cursor* is the last session id of a listing.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ctxlog::{Checkpoint, Hlc, OrderKey, ShardId};

use crate::problem::Problem;

fn decode(field: &str, cursor: &str) -> Result<String, Problem> {
    let bytes = B64
        .decode(cursor.as_bytes())
        .map_err(|_| Problem::invalid(field, None, "not a cursor this server gave out"))?;
    String::from_utf8(bytes).map_err(|_| Problem::invalid(field, None, "not a cursor this server gave out"))
}

fn shard(s: &str) -> Option<ShardId> {
    ShardId::parse(s)
}

/// A page cursor for `key`.
pub(crate) fn page(key: &OrderKey) -> String {
    B64.encode(format!("k1.{}.{}.{}.{}", key.hlc.0, key.shard, key.seq, key.epoch))
}

/// The order key of a page cursor given in `field`.
pub(crate) fn parse_page(field: &str, cursor: &str) -> Result<OrderKey, Problem> {
    let text = decode(field, cursor)?;
    let bad = || Problem::invalid(field, None, "not a cursor this server gave out");
    let mut parts = text.split('.');
    if parts.next() != Some("k1") {
        return Err(bad());
    }
    let mut next = || parts.next().ok_or_else(bad);
    let hlc = next()?.parse().map_err(|_| bad())?;
    let shard = shard(next()?).ok_or_else(bad)?;
    let seq = next()?.parse().map_err(|_| bad())?;
    let epoch = next()?.parse().map_err(|_| bad())?;
    Ok(OrderKey {
        hlc: Hlc(hlc),
        shard,
        seq,
        epoch,
    })
}

/// A position for `checkpoint`.
pub(crate) fn position(checkpoint: &Checkpoint) -> String {
    let parts: Vec<String> = checkpoint
        .0
        .iter()
        .filter(|(_, seq)| **seq > 0)
        .map(|(s, seq)| format!("{s}={seq}"))
        .collect();
    B64.encode(format!("p1.{}", parts.join(",")))
}

/// The checkpoint of a position given in `field`.
pub(crate) fn parse_position(field: &str, cursor: &str) -> Result<Checkpoint, Problem> {
    let text = decode(field, cursor)?;
    let bad = || Problem::invalid(field, None, "not a position this server gave out");
    let body = text.strip_prefix("p1.").ok_or_else(bad)?;
    let mut map = BTreeMap::new();
    for part in body.split(',').filter(|p| !p.is_empty()) {
        let (s, seq) = part.split_once('=').ok_or_else(bad)?;
        let shard = shard(s).ok_or_else(bad)?;
        // A shard named twice has no one position: refused, never one of them picked.
        if map.insert(shard, seq.parse().map_err(|_| bad())?).is_some() {
            return Err(Problem::invalid(field, None, format!("names shard {shard} twice")));
        }
    }
    Ok(Checkpoint(map))
}

/// A name cursor for `name`.
pub(crate) fn name(name: &str) -> String {
    B64.encode(format!("n1.{name}"))
}

/// The name of a name cursor given in `field`.
pub(crate) fn parse_name(field: &str, cursor: &str) -> Result<String, Problem> {
    decode(field, cursor)?
        .strip_prefix("n1.")
        .map(str::to_string)
        .ok_or_else(|| Problem::invalid(field, None, "not a cursor this server gave out"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_foreign_ones_are_invalid_input() {
        let s = ShardId::for_writer(&ctxlog::WriterId::new("w").unwrap());
        let key = OrderKey {
            hlc: Hlc(42),
            shard: s,
            seq: 7,
            epoch: 2,
        };
        assert_eq!(parse_page("after", &page(&key)).unwrap(), key);
        let cp = Checkpoint([(s, 9)].into_iter().collect());
        assert_eq!(parse_position("after", &position(&cp)).unwrap(), cp);
        assert_eq!(
            parse_position("after", &position(&Checkpoint::default())).unwrap(),
            Checkpoint::default()
        );
        assert_eq!(parse_name("after", &name("s-1")).unwrap(), "s-1");
        let twice = B64.encode(format!("p1.{s}=1,{s}=2"));
        for bad in [
            "",
            "!!",
            &B64.encode("k1.x"),
            &B64.encode("p1.nope=1"),
            &page(&key),
            &twice,
        ] {
            assert!(parse_position("after", bad).is_err(), "{bad}");
        }
        assert!(parse_page("after", &position(&cp)).is_err());
    }
}
