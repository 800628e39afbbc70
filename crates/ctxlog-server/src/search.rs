//! Search on a replica (rules 26, 27: text, vectors, both): the replica's one [`Searcher`], caught up with
//! the store to the position of a fresh view before each search, so that a search sees
//! every append acknowledged before it (rule 1), on any replica.
//!
//! The searcher reads entries with their bodies from the store (`read_shard`), shard by
//! shard past what it holds, without the view held (indexing a large store holds up no
//! other read). Scoring runs on a blocking thread under a shared lock; the hits' records are
//! then read from a fresh view: a record tombstoned since the searcher read is left out
//! (forgetting wins). The index is in memory, of every bot the store holds, built by the
//! replica's first search. Scoring gives up after `search_timeout` (`Timeout`, nothing
//! written).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use ctxlog::search::{After, Ask, Deadline, Filter, Nearest, Query, Searcher, snippet};
use ctxlog::{Body, Checkpoint};
use tokio::sync::RwLock;

use crate::Replica;
use crate::api::{EntryOut, HitOut, SearchIn, SearchOut};
use crate::cursor;
use crate::problem::Problem;

/// Hits a page holds by default, and at most.
const DEFAULT_K: usize = 10;
const MAX_K: usize = 100;

/// A search request's body at most: a query is at most 1 KiB, a vector of 4,096
/// dimensions about 50 KiB of JSON, the filter small.
pub(crate) const MAX_BODY_BYTES: usize = 128 << 10;

/// Metadata keys a filter names at most.
const MAX_METADATA_KEYS: usize = 16;

/// Roles a filter names at most: the filter is checked for every scored doc, so its size is
/// bounded like the query's (a search over MCP is not bound by this route's body limit).
const MAX_ROLES: usize = 16;

/// The replica's searcher: caught up by one search at a time, read by many at once.
#[derive(Default)]
pub(crate) struct Search {
    searcher: Arc<RwLock<Searcher>>,
}

/// What names one search for its cursors: the bot, the query as written and the filter (the
/// roles as a set), hashed alike by every replica. `k` is not part of it: a page may be
/// longer or shorter than the one before.
fn binding(bot: &str, query: Option<&str>, near: Option<&Nearest>, f: &Filter) -> u64 {
    let roles: std::collections::BTreeSet<&String> = f.roles.iter().collect();
    // A vector by its values' bits: JSON's decimal form of an `f32` is not one per value.
    let near = near.map(|n| (&n.model, n.vector.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()));
    let named = serde_json::json!([
        bot,
        query,
        near,
        f.session,
        roles,
        f.since_millis,
        f.until_millis,
        f.metadata
    ]);
    let hash = blake3::hash(named.to_string().as_bytes());
    u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// Milliseconds of the log's clock at an RFC 3339 time given in `field`.
fn millis(field: &'static str, t: Option<&str>) -> Result<Option<u64>, Problem> {
    t.map(|t| {
        let at = DateTime::parse_from_rfc3339(t)
            .map_err(|e| Problem::invalid(field, None, format!("not RFC 3339: {e}")))?
            .with_timezone(&Utc);
        Ok(u64::try_from(at.timestamp_millis()).unwrap_or(0))
    })
    .transpose()
}

impl Search {
    /// Catch the searcher up to `to` (nothing past what it holds is read twice).
    async fn catch_up(&self, r: &Replica, to: &Checkpoint) -> Result<(), Problem> {
        // Holding all of `to` already, and settled (a catch-up cancelled half-way is not):
        // no exclusive lock, which would queue every other search behind the searches
        // scoring now.
        {
            let s = self.searcher.read().await;
            if to.first_beyond(s.position()).is_none() && s.settled() {
                return Ok(());
            }
        }
        let mut s = self.searcher.write().await;
        let fed = s.catch_up(&*r.store, to).await.map_err(Problem::from)?;
        r.metrics.search_entries_read.inc_by(fed as u64);
        Ok(())
    }

    /// Save the replica's searcher as the store's newest saved index (caught up to the
    /// store's end first), if it has read anything: a replica that never searched builds no
    /// index here. Searches wait while it catches up, not while it is encoded or put.
    pub(crate) async fn save(&self, r: &Replica) -> Result<Option<ctxlog::search::saved::Saved>, Problem> {
        use ctxlog::search::saved;
        let mut s = self.searcher.write().await;
        if s.position().0.is_empty() {
            return Ok(None);
        }
        // Caught up under the exclusive lock; encoded under a shared one (searches go on);
        // put with no lock held.
        let Some(begun) = saved::begin(&mut s, &*r.store).await.map_err(Problem::from)? else {
            return Ok(Some(saved::Saved::Nowhere));
        };
        let s = s.downgrade();
        let bytes = saved::encode(&s, &*r.store, &begun).await.map_err(Problem::from)?;
        drop(s);
        Ok(Some(saved::put(&*r.store, begun, bytes).await.map_err(Problem::from)?))
    }

    /// One page of `bot`'s hits for `input`.
    ///
    /// The view is held only to take its position and, afterwards, to read the page's
    /// records: scoring runs on a blocking thread under a shared lock of the searcher, so one
    /// tenant's costly query holds up no other tenant's reads (other searches share it).
    pub(crate) async fn search(&self, r: &Replica, bot: &str, input: SearchIn) -> Result<SearchOut, Problem> {
        let query = input
            .query
            .as_deref()
            .map(Query::parse)
            .transpose()
            .map_err(Problem::from)?;
        let near = match (input.vector, input.model) {
            (None, None) => None,
            (Some(_), None) => return Err(Problem::invalid("model", None, "a vector search names its model")),
            (None, Some(_)) => return Err(Problem::invalid("vector", None, "a model without a vector to search")),
            (Some(vector), Some(model)) => Some(Nearest::new(model, vector).map_err(Problem::from)?),
        };
        if query.is_none() && near.is_none() {
            return Err(Problem::invalid(
                "query",
                None,
                "a search needs a `query`, a `vector` (with its `model`), or both",
            ));
        }
        let k = match input.k.unwrap_or(DEFAULT_K) {
            n @ 1..=MAX_K => n,
            n => return Err(Problem::invalid("k", None, format!("{n}: from 1 to {MAX_K}"))),
        };
        if input.roles.len() > MAX_ROLES {
            return Err(Problem::invalid(
                "roles",
                None,
                format!("{} roles; at most {MAX_ROLES}", input.roles.len()),
            ));
        }
        let max_name = r.store.options().limits.max_id_bytes;
        if let Some(s) = &input.session {
            crate::problem::check_name("session", s.as_bytes(), max_name)?;
        }
        for role in &input.roles {
            crate::problem::check_name("roles", role.as_bytes(), max_name)?;
        }
        if input.metadata.len() > MAX_METADATA_KEYS {
            return Err(Problem::invalid(
                "metadata",
                None,
                format!("{} keys; at most {MAX_METADATA_KEYS}", input.metadata.len()),
            ));
        }
        let filter = Filter {
            session: input.session,
            roles: input.roles,
            since_millis: millis("since", input.since.as_deref())?,
            until_millis: millis("until", input.until.as_deref())?,
            metadata: input.metadata,
        };
        let binding = binding(bot, input.query.as_deref(), near.as_ref(), &filter);
        let after: Option<After> = input
            .after
            .as_deref()
            .map(|c| cursor::parse_hit("after", c, binding))
            .transpose()?;
        // Most of the catch-up without the view held (a first search reads the store), then
        // the rest up to a fresh view's position: every append acknowledged before (rule 1).
        let now = r.view.current().await.checkpoint();
        self.catch_up(r, &now).await?;
        let at = r.view.fresh().await?.checkpoint();
        self.catch_up(r, &at).await?;
        let held = self.searcher.clone().read_owned().await;
        let searched = held.position().clone();
        let position = cursor::position(&searched);
        let owned = bot.to_string();
        // A costly query over a large corpus gives up (a typed timeout, nothing written)
        // rather than holding a blocking thread and the searcher's lock, behind which the
        // next catch-up and its searches wait.
        let deadline = Deadline::after(r.options.search_timeout);
        let (hits, more) = tokio::task::spawn_blocking(move || {
            let ask = match (&query, &near) {
                (Some(q), Some(n)) => Ask::Hybrid(q, n),
                (Some(q), None) => Ask::Text(q),
                (None, Some(n)) => Ask::Vector(n),
                (None, None) => unreachable!("refused above"),
            };
            held.index().find_by(&owned, ask, &filter, after.as_ref(), k, &deadline)
        })
        .await
        .map_err(|e| Problem::replica_unavailable(format!("a search failed: {e}"), ctxlog::Written::Nothing))?
        .map_err(Problem::from)?;
        let next = hits.last().filter(|_| more).map(|h| {
            cursor::hit(
                binding,
                &After {
                    score: h.score,
                    key: h.key,
                },
            )
        });
        // The hits' records from the view, which holds at least what the searcher read (it
        // was fresh at `at`; only a failed refresh since can have emptied it: then a fresh
        // one). A record forgotten since (or whose id another put won since) is left out.
        let mut p = r.view.current().await;
        if searched.first_beyond(&p.checkpoint()).is_some() {
            drop(p);
            p = r.view.fresh().await?;
        }
        let mut out = Vec::with_capacity(hits.len());
        for h in hits {
            let Some(e) = p.get(bot, &h.id).await.map_err(Problem::from)? else {
                continue;
            };
            if e.key() != h.key {
                continue;
            }
            let text = match &e.record.body {
                Body::Text(t) => snippet(t, &h.matched),
                Body::Bytes(_) => String::new(),
            };
            out.push(HitOut {
                record: EntryOut::from(&e),
                score: h.score,
                matched: h.matched,
                snippet: text,
            });
        }
        Ok(SearchOut {
            hits: out,
            next,
            position,
        })
    }
}
