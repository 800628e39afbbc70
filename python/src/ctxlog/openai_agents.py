"""An OpenAI Agents SDK session backed by a ctxlog session (`pip install "ctxlog[openai-agents]"`).

```python
from agents import Agent, Runner
from ctxlog.openai_agents import CtxlogSession

session = CtxlogSession("user-42", "http://127.0.0.1:7070")
await Runner.run(agent, "hi", session=session)
```

Without a server: `CtxlogSession.local("user-42", "agents.db")` runs one as a child of this
process (`ctxlog.LocalServer`), stopped by `await session.close()`, at exit, or when the
process dies. One server per session: for many sessions, make one
`client = ctxlog.AsyncClient.local("agents.db")` and give it to each
`CtxlogSession(session_id, client)` (then `await client.close()` stops it).

Each item is a record of the ctxlog session (bot `bot`, default `openai-agents`), its JSON
as the body. The session's items are its **context view** (rule 21): every item its
governing summary does not cover, in the log's order, with the summary's items in the place
of the newest item it covers. A summary is one record whose body is a JSON array of items
(`SUMMARY_CONTENT_TYPE`).

What the SDK's own sessions cannot promise, and this one does:

- **Order across replicas.** Items keep the log's order (rule 8) whichever replica each
  process writes through, and every process reads the same history.
- **A retried `add_items` never duplicates.** The items' ids are made once per call, and an
  answer that may have landed is retried with the same ids: the log counts them once.
- **Compaction loses nothing appended meanwhile.** A compaction writes one summary record
  covering the position of the context view it read; nothing is tombstoned or rewritten.
  An item another process appends between that read and the summary is not covered: it
  stays in `get_items()`, raw, after the summary's items (which stand where the newest
  item they cover stood).
- **`pop_item` removes what it read.** It reads the context view, then removes exactly its
  newest item: a record's is tombstoned; an item of the governing summary is removed by a
  new summary of that view without it (covering the same read). An item another process
  appended after that read is not removed (it stays the newest); the item returned is the
  one that was removed. (Two processes that pop a summary's newest item at once may both
  return it: a summary cannot be refused as a second tombstone of one id is.)
- **`clear_session` ends every item it saw** (one batch of tombstones of every live record,
  summaries and what they cover included); an item appended after its read stays.

Compaction with `OpenAIResponsesCompactionSession`
--------------------------------------------------

Wrap this session in the SDK's compaction session as any other::

    from agents.memory import OpenAIResponsesCompactionSession
    session = OpenAIResponsesCompactionSession("user-42", CtxlogSession("user-42", url))

That wrapper's generic path clears the underlying session and adds the compacted items
(`clear_session()` then `add_items()`): an item another process appended between its read
and the clear would be tombstoned with the rest, and lost. The SDK (0.24) lets a store
replace history itself through three hooks of the underlying session, which this one
provides, so that a compaction writes one summary instead:

- `_read_compaction_items(limit)`: the compaction's input, read from the context view (the
  latest `limit` items; without one, the session's item limit); the read's position is
  kept for the replacement. (The SDK then reads the input afresh each
  time instead of from its in-process cache, which cannot see other processes' appends.)
- `_atomic_replace_items(items)` (manual `run_compaction()`): one summary of `items`
  covering that read's position (when a wrapper such as the SDK's `EncryptedSession` reads
  the input through `get_items` instead, the position of the first context read since this
  object last wrote; after only tail reads, `get_items(limit)`, the view as it is then).
  Nothing else is written.
- `_get_compaction_snapshot(limit)` (automatic compaction after a `Runner` turn): the newest
  `limit` items of one context read; its `replace_suffix(start, output)` writes one
  summary covering that read, whose items are the view's items before `start` and then
  `output`. It declines (the SDK keeps the history) when the view it read has changed in
  the meantime other than by appends: an item removed, or another summary governing.

These hooks are the SDK's private protocol (its own SQLite, SQLAlchemy and Redis stores
implement them); the package pins the SDK below 0.25. Without the SDK's wrapper,
`CtxlogSession.compact(summarize)` does the same with any summariser.

The session assumes its ctxlog session holds only its own records: a record of another
content type is not an item, and a summary written by another tool (another content type)
stands for what it covers but gives no item.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents.memory.session import _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from ._async_client import AsyncClient, AsyncSession, owning_local
from ._errors import NotFound
from ._ids import new_id
from ._types import Record

CONTENT_TYPE = "application/vnd.openai.agents.item+json"
"""The content type of a record holding one item (its JSON)."""

SUMMARY_CONTENT_TYPE = "application/vnd.openai.agents.items+json"
"""The content type of a summary: a JSON array of the items that stand for what it covers."""

# The most records one `?last=` read returns.
MAX_TAIL = 1000


def _role(item: Any) -> str:
    """The record's role: the item's role, or its type (a tool call, a reasoning item)."""
    if isinstance(item, dict):
        return str(item.get("role") or item.get("type") or "item")
    return "item"


def _items(r: Record) -> list[Any]:
    """The items a record holds: one for an item's record, a list for a summary's."""
    if r.text is None:
        return []
    if r.content_type == CONTENT_TYPE:
        return [json.loads(r.text)]
    if r.content_type == SUMMARY_CONTENT_TYPE:
        items = json.loads(r.text)
        return list(items) if isinstance(items, list) else []
    return []


@dataclass(frozen=True)
class _View:
    """One read of the context view: its items, and for each the record it came from and
    whether that record is a summary; the read's covers token (its position, bound to the
    session), the governing summary and the ids of every record in the view."""

    items: list[Any]
    # Per item: its record's id, whether that record is a summary, and whether the record
    # is the session's own (else a fork inherits it, contract rule 25).
    origins: list[tuple[str, bool, bool]]
    covers: str
    summary: str | None
    record_ids: list[str]
    position: str


class CtxlogSession:
    """The SDK's `Session` protocol over one ctxlog session (see the module docs)."""

    def __init__(
        self,
        session_id: str,
        client: AsyncClient | str,
        *,
        bot: str = "openai-agents",
        session_settings: SessionSettings | dict[str, Any] | None = None,
        token: str | None = None,
    ) -> None:
        self.session_id = session_id
        # As the SDK's own sessions: a dict of settings is taken too.
        self.session_settings = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(session_settings)
        )
        self._client = AsyncClient(client, token=token) if isinstance(client, str) else client
        # A client made here (from a URL, or by `local()`) is closed by `close()`; one
        # given is the caller's.
        self._owns_client = isinstance(client, str)
        self._session: AsyncSession = self._client.session(bot, session_id)
        # The position of the compaction's input read (`_read_compaction_items`), and of the
        # first read since this object last wrote: what `_atomic_replace_items` covers.
        self._compaction_read: str | None = None
        self._first_read: str | None = None

    @classmethod
    def local(
        cls,
        session_id: str,
        store: str | os.PathLike[str],
        *,
        writer: str | None = None,
        bot: str = "openai-agents",
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> CtxlogSession:
        """A session over a local replica of `store` that it owns (`ctxlog.LocalServer`:
        a plain path is a SQLite file, whose writer id `local-N` is picked when not given),
        stopped by `close()`. Blocks while the server starts (a fraction of a second for a
        SQLite file); usable from any event loop after."""
        session = owning_local(
            store,
            writer,
            lambda client: cls(session_id, client, bot=bot, session_settings=session_settings),
        )
        session._owns_client = True
        return session

    async def close(self) -> None:
        """Close the client this session made (from a URL, or `local()`'s, stopping its
        server); a client given is left open. Idempotent."""
        if self._owns_client:
            await self._client.close()

    def _read(self, position: str) -> None:
        if self._first_read is None:
            self._first_read = position

    def _wrote(self) -> None:
        self._compaction_read = self._first_read = None

    async def _view(self) -> _View:
        ctx = await self._session.context()
        self._read(ctx.covers)
        items: list[Any] = []
        origins: list[tuple[str, bool, bool]] = []
        for r in ctx.records:
            got = _items(r)
            items.extend(got)
            origins.extend(
                [(r.id, r.kind == "summary", r.session_id == self.session_id)] * len(got)
            )
        return _View(
            items, origins, ctx.covers, ctx.summary, [r.id for r in ctx.records], ctx.position
        )

    async def _summarize(self, items: list[Any], covers: str) -> None:
        """One summary record: `items` stand for everything the view at `covers` held."""
        await self._session.summarize(
            json.dumps(items, separators=(",", ":")),
            covers,
            id=new_id(),
            content_type=SUMMARY_CONTENT_TYPE,
        )
        self._wrote()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The context view's items, in its order; with a limit, the latest `limit`."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and n <= 0:
            return []
        if n is not None and n <= MAX_TAIL:
            # The server reads only the last `n` records. Without a summary among them,
            # none is covered (a summary covers only records before it in the log's order)
            # and the governing summary stands before them: they are the view's last `n`.
            page = await self._session.tail(n)
            if not any(r.kind == "summary" for r in page.records):
                items = [item for r in page.records for item in _items(r)]
                if len(items) >= n or not page.has_more:
                    return items[-n:]
        items = (await self._view()).items
        return items if n is None else items[-n:]

    async def add_items(self, items: list[Any]) -> None:
        """Append the items as one atomic batch (retried with the same ids if its answer may
        have been lost)."""
        if not items:
            return
        await self._session.append(
            [
                {
                    "id": new_id(),
                    "role": _role(item),
                    "content_type": CONTENT_TYPE,
                    "text": json.dumps(item, separators=(",", ":")),
                }
                for item in items
            ]
        )
        self._wrote()

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item this call read (see the module docs)."""
        # Another process may remove the same item between the read and the tombstone: then
        # read again (a few times at most) and take the newest left.
        for _ in range(3):
            view = await self._view()
            if not view.items:
                return None
            record_id, in_summary, own = view.origins[-1]
            if in_summary:
                await self._summarize(view.items[:-1], view.covers)
                return view.items[-1]
            if not own:
                # Inherited from the session this one forks: left out here only.
                await self._session.hide(record_id)
                self._wrote()
                return view.items[-1]
            try:
                await self._session.delete(record_id)
            except NotFound:
                continue
            self._wrote()
            return view.items[-1]
        return None

    async def clear_session(self) -> None:
        """Tombstone every live record this call read (summaries and what they cover), in
        one batch."""
        ends: list[dict[str, Any]] = [
            # The session's own records end; those a fork inherits are hidden here only.
            {"id": r.id, "role": "item", "kind": "tombstone"}
            if r.session_id == self.session_id
            else {"id": new_id(), "role": "hide", "kind": "hide", "text": r.id}
            async for r in self._session.iter_records()
            if r.content_type in (CONTENT_TYPE, SUMMARY_CONTENT_TYPE)
        ]
        if ends:
            await self._session.append(ends)
        self._wrote()

    async def fork(self, session_id: str, *, before_item: int | None = None) -> CtxlogSession:
        """A new session that continues this one (contract rule 25), as the SDK's
        `AdvancedSQLiteSession` branches do, but without copying this session's items and
        without changing it: it holds this session's items as one read of `get_items()`
        saw them — those before index `before_item` (e.g. to run a turn again), all when not
        given — then its own. One atomic batch: the fork at that read's position, and a hide
        of each record after the cut. Items it pops or clears are left out of it only. A cut
        inside a summary's items, or before a summary, raises `ValueError` (a summary's items
        stand for records compacted away: they fork together), as does a `session_id` that
        holds records already."""
        fork = type(self)(
            session_id, self._client, bot=self._session.bot, session_settings=self.session_settings
        )
        if (await fork._session.records(limit=1)).records:
            raise ValueError(f"session {session_id!r} holds records already: fork into a new one")
        view = await self._view()
        n = len(view.items) if before_item is None else before_item
        if not 0 <= n <= len(view.items):
            raise ValueError(
                f"before_item {before_item} is not an index of the {len(view.items)} items"
            )
        if n == 0:
            return fork
        after = view.origins[n:]
        if after and after[0][0] == view.origins[n - 1][0]:
            raise ValueError(f"item {n} is inside a summary: a summary's items fork together")
        if any(in_summary for _, in_summary, _ in after):
            raise ValueError(f"a summary follows item {n}: a summary's items fork together")
        hidden = list(dict.fromkeys(record_id for record_id, _, _ in after))
        batch: list[dict[str, Any]] = [
            {
                "id": new_id(),
                "kind": "fork",
                "role": "fork",
                "text": self.session_id,
                "covers": view.position,
            }
        ]
        batch.extend(
            {"id": new_id(), "kind": "hide", "role": "hide", "text": record_id}
            for record_id in hidden
        )
        await fork._session.append(batch)
        return fork

    async def compact(self, summarize: Callable[[list[Any]], Awaitable[list[Any]]]) -> list[Any]:
        """Compact the context view: read it, and write `await summarize(items)` as one
        summary covering that read. Items appended by anyone after the read stay, after
        the summary's items. Returns the summary's items."""
        view = await self._view()
        out = await summarize(view.items)
        await self._summarize(out, view.covers)
        return out

    # ---- the SDK's compaction hooks (see the module docs) -----------------------------------

    async def _read_compaction_items(self, limit: int | None) -> tuple[list[Any], bool]:
        """The compaction's input: the context view's latest `limit` items (without one,
        the session's item limit, `SessionSettings(limit=…)`, as the SDK's own sessions
        read it through `get_items()`), and whether they are all of it. The read's position
        is what the summary will cover."""
        view = await self._view()
        self._compaction_read = view.covers
        n = resolve_session_limit(limit, self.session_settings)
        if n is None:
            return view.items, True
        return view.items[-n:] if n > 0 else [], len(view.items) <= n

    async def _atomic_replace_items(self, items: list[Any]) -> bool:
        """Replace the compaction's input by `items`: one summary covering the position of
        the read that gave that input; items appended after it stay."""
        covers = self._compaction_read or self._first_read
        if covers is None:
            # Its input came from a tail read (`get_items(limit)`), whose position is the
            # whole view's: cover the view as it is now.
            covers = (await self._session.context()).covers
        await self._summarize(items, covers)
        return True

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> _CompactionSnapshot:
        """The latest `limit` items of one context read, replaced (from an index on) by one
        summary covering that read. `prune_prefix` drops the oldest items of the retained
        prefix it says have expired (the SDK's encrypted session)."""
        view = await self._view()
        start0 = max(0, len(view.items) - limit)
        items = view.items[start0:]

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            if start >= len(items):
                return False
            now = await self._view()
            if now.summary != view.summary or not set(view.record_ids) <= set(now.record_ids):
                # An item was removed, or another summary governs: keep the history.
                return False
            retained = view.items[: start0 + start]
            drop = 0
            if prune_prefix is not None:
                while drop < len(retained) and prune_prefix(retained[drop]):
                    drop += 1
            await self._summarize(retained[drop:] + list(output), view.covers)
            return True

        return _CompactionSnapshot(items, start0 == 0, replace_suffix)
