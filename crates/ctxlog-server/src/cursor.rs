//! Opaque cursors: what a client hands back to continue where it stopped. Each is
//! URL-safe base64 of a small text form; clients never look inside.
//!
//! - A *page cursor* is the order key of the last record of a page: the next page starts
//!   after it in the contract's order, whatever was appended meanwhile.
//! - A *position* is a checkpoint, per shard the last seq delivered: a watch resumes from it
//!   with no gap and no duplicate (every shard is read as a prefix), and a conflicts call
//!   reports only what involves entries past it.
//! - A *covers token* is a context view's position bound to that view's bot and session:
//!   the only thing a summary's `covers` takes. A page's or a stream's position is the whole
//!   store's, not what the page returned, so a summary covering it would hide records its
//!   writer never read; and a view of one session says nothing of another's. The token
//!   names its session by a hash (clients never look inside; the check is against misuse,
//!   not forgery: a forged one still has to cover only held positions).
//! - A *name cursor* is the last session id of a listing.
//! - A *hit cursor* is the score and order key of the last hit of a search page (rule 26):
//!   the next page starts after it, in the order of score and then the contract's order.

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

fn seqs(checkpoint: &Checkpoint) -> String {
    let parts: Vec<String> = checkpoint
        .0
        .iter()
        .filter(|(_, seq)| **seq > 0)
        .map(|(s, seq)| format!("{s}={seq}"))
        .collect();
    parts.join(",")
}

fn parse_seqs(field: &str, body: &str, bad: impl Fn() -> Problem) -> Result<Checkpoint, Problem> {
    let mut map = BTreeMap::new();
    for part in body.split(',').filter(|p| !p.is_empty()) {
        let (s, seq) = part.split_once('=').ok_or_else(&bad)?;
        let shard = shard(s).ok_or_else(&bad)?;
        // A shard named twice has no one position: refused, never one of them picked.
        if map.insert(shard, seq.parse().map_err(|_| bad())?).is_some() {
            return Err(Problem::invalid(field, None, format!("names shard {shard} twice")));
        }
    }
    Ok(Checkpoint(map))
}

/// A position for `checkpoint`.
pub(crate) fn position(checkpoint: &Checkpoint) -> String {
    B64.encode(format!("p1.{}", seqs(checkpoint)))
}

/// The checkpoint of a position given in `field`.
pub(crate) fn parse_position(field: &str, cursor: &str) -> Result<Checkpoint, Problem> {
    let text = decode(field, cursor)?;
    let bad = || Problem::invalid(field, None, "not a position this server gave out");
    parse_seqs(field, text.strip_prefix("p1.").ok_or_else(bad)?, bad)
}

/// The hash that binds a covers token to its bot and session (length-prefixed, so no two
/// pairs read alike).
fn session_tag(bot: &str, session: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(&(bot.len() as u64).to_le_bytes());
    h.update(bot.as_bytes());
    h.update(session.as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// The covers token of a context view of `bot`'s `session` at `checkpoint`.
pub(crate) fn covers(bot: &str, session: &str, checkpoint: &Checkpoint) -> String {
    B64.encode(format!("c1.{}.{}", session_tag(bot, session), seqs(checkpoint)))
}

/// The checkpoint of a covers token given in `field` for a summary of `bot`'s `session`:
/// only a context view of that same session gave it out.
pub(crate) fn parse_covers(field: &str, token: &str, bot: &str, session: &str) -> Result<Checkpoint, Problem> {
    let text = decode(field, token)?;
    let bad = || Problem::invalid(field, None, "not a covers token this server gave out");
    if text.starts_with("p1.") {
        return Err(Problem::invalid(
            field,
            None,
            "a page's or a stream's position is not what a summary covers: give the `covers` of \
             a context view of this session",
        ));
    }
    let (tag, body) = text
        .strip_prefix("c1.")
        .and_then(|t| t.split_once('.'))
        .ok_or_else(bad)?;
    if tag != session_tag(bot, session) {
        return Err(Problem::invalid(
            field,
            None,
            "the covers of another session's context view: a summary covers only a view of its own \
             session",
        ));
    }
    parse_seqs(field, body, bad)
}

/// A hit cursor for the hit that ended a page.
///
/// `search` names the search it continues (see `Search::binding`): a cursor handed to another
/// search — another bot, query or filter — is refused rather than answered with a page that
/// belongs to no list.
pub(crate) fn hit(search: u64, after: &ctxlog::search::After) -> String {
    let k = &after.key;
    B64.encode(format!(
        "h2.{search:016x}.{:016x}.{}.{}.{}.{}",
        after.score.to_bits(),
        k.hlc.0,
        k.shard,
        k.seq,
        k.epoch
    ))
}

/// Where a hit cursor given in `field` says the next page starts.
/// It must continue the search `search` names.
pub(crate) fn parse_hit(field: &str, cursor: &str, search: u64) -> Result<ctxlog::search::After, Problem> {
    let text = decode(field, cursor)?;
    let bad = || Problem::invalid(field, None, "not a cursor this server gave out");
    let rest = text.strip_prefix("h2.").ok_or_else(bad)?;
    let (of, rest) = rest.split_once('.').ok_or_else(bad)?;
    if u64::from_str_radix(of, 16).map_err(|_| bad())? != search {
        return Err(Problem::invalid(
            field,
            None,
            "the cursor of another search (another bot, query or filter): continue a search with its own `next`",
        ));
    }
    let (score, key) = rest.split_once('.').ok_or_else(bad)?;
    let score = f64::from_bits(u64::from_str_radix(score, 16).map_err(|_| bad())?);
    if !score.is_finite() {
        return Err(bad());
    }
    let key = parse_page(field, &B64.encode(format!("k1.{key}")))?;
    Ok(ctxlog::search::After { score, key })
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

    #[test]
    fn a_covers_token_is_taken_only_for_its_own_session_and_never_as_a_position() {
        let s = ShardId::for_writer(&ctxlog::WriterId::new("w").unwrap());
        let cp = Checkpoint([(s, 9)].into_iter().collect());
        let token = covers("bot", "s-1", &cp);
        assert_eq!(parse_covers("covers", &token, "bot", "s-1").unwrap(), cp);
        // Another session, another bot, or the same text split differently.
        for (bot, session) in [("bot", "s-2"), ("other", "s-1"), ("bots", "-1"), ("bo", "ts-1")] {
            let e = parse_covers("covers", &token, bot, session).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("covers"), "{bot}/{session}");
        }
        // A shard named twice is refused in a covers token as in a position.
        let tag = session_tag("bot", "s-1");
        let twice = B64.encode(format!("c1.{tag}.{s}=1,{s}=2"));
        assert!(parse_covers("covers", &twice, "bot", "s-1").is_err());
        // A page's position is refused as covers, and a covers token as a position.
        assert!(parse_covers("covers", &position(&cp), "bot", "s-1").is_err());
        assert!(parse_position("after", &token).is_err());
    }
}
