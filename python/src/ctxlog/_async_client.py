"""The asynchronous client: the same surface as `Client`, every call awaited."""

from __future__ import annotations

import asyncio
import os
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Any, TypeVar

import httpx
from httpx_sse import aconnect_sse

from . import _core
from ._core import RecordInput, seg
from ._errors import CtxlogError
from ._ids import new_id
from ._local import LocalServer, owning
from ._types import Ack, Context, Event, Fork, Page, Record, Retry, SearchPage, SessionInfo

_T = TypeVar("_T")


class AsyncClient:
    """An asynchronous client of one `ctxlog serve` replica, usable from any event loop.

    `retry` bounds how an append that may have landed is retried with the same ids; a
    definite failure is never retried. `verify` is httpx's: for a server with a private CA,
    an `ssl.SSLContext` that trusts it.

    An `httpx.AsyncClient` is bound to the loop it first ran on, so this client keeps one
    per running loop, made on first use there: one object serves a second `asyncio.run`, a
    thread with its own loop, or a framework's `run_sync`, as the frameworks' own SQLite
    and in-memory stores do. `close()` closes the current loop's and those of loops still
    running; a closed loop's is dropped (its connections cannot be closed any more). An
    `http` client given here is used as it is, from its own loop only.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retry: Retry | None = None,
        verify: ssl.SSLContext | bool = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._given = http
        self._options: dict[str, Any] = {
            "base_url": base_url,
            "timeout": timeout,
            "headers": _core.headers(token),
            "verify": verify,
        }
        self._per_loop: dict[asyncio.AbstractEventLoop, httpx.AsyncClient] = {}
        self._lock = threading.Lock()
        self.retry = retry or Retry()
        self._server: LocalServer | None = None

    @classmethod
    def local(
        cls, store: str | os.PathLike[str], writer: str | None = None, **client_kwargs: Any
    ) -> AsyncClient:
        """A client of a local replica of `store` that it owns: `ctxlog serve` started as
        a child of this process (see `ctxlog.LocalServer`: a plain path is a SQLite file,
        whose writer id `local-N` is picked when not given), stopped by `close()`.
        `client_kwargs` are the constructor's (`timeout`, `retry`).

        Not a coroutine: it blocks while the child starts, until it prints its address —
        for a SQLite file, a small fraction of a second; on object storage, as long as
        opening the store takes (at most a minute). Inside a running loop that must not
        wait that long, call it as `await asyncio.to_thread(AsyncClient.local, store)`.
        The client is bound to no loop: it serves any loop, one after another or at once,
        as `AsyncClient` does; `close()` stops the server on a worker thread, not blocking
        the loop."""
        client, server = owning(
            store, writer, lambda url, token: cls(url, token=token, **client_kwargs)
        )
        client._server = server
        return client

    @property
    def server(self) -> LocalServer | None:
        """The local replica this client owns (`AsyncClient.local`), if any."""
        return self._server

    @property
    def _http(self) -> httpx.AsyncClient:
        """The HTTP client of the running loop."""
        if self._given is not None:
            return self._given
        loop = asyncio.get_running_loop()
        with self._lock:
            http = self._per_loop.get(loop)
            if http is None:
                for closed in [other for other in self._per_loop if other.is_closed()]:
                    del self._per_loop[closed]
                http = self._per_loop[loop] = httpx.AsyncClient(**self._options)
            return http

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections, and stop the local replica this client owns (if any;
        on a worker thread, so the loop goes on meanwhile). Idempotent."""
        try:
            await self._close_http()
        finally:
            if self._server is not None:
                await asyncio.to_thread(self._server.stop)

    async def _close_http(self) -> None:
        if self._given is not None:
            await self._given.aclose()
            return
        here = asyncio.get_running_loop()
        with self._lock:
            clients, self._per_loop = self._per_loop, {}
        for loop, http in clients.items():
            if loop is here:
                await http.aclose()
            elif loop.is_running():
                # Closed on its own loop (an httpx client cannot be closed from another).
                asyncio.run_coroutine_threadsafe(http.aclose(), loop)

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            resp = await self._http.request(method, path, **kw)
        except httpx.TransportError as e:
            raise _core.transport_error(e) from e
        return _core.check(resp)

    async def _append(self, path: str, body: dict[str, Any]) -> Ack:
        """POST one batch; an answer that may have been lost is retried with the same body
        (the same ids, counted once), a bounded number of times; a definite one never.
        Once any attempt may have landed, the error raised says `written == "unknown"`
        whatever later attempts answered."""
        return _core.ack(await self._post_retried(path, body))

    async def _post_retried(self, path: str, body: dict[str, Any]) -> Any:
        """`_append`'s retries for any write keyed by the ids in its body: the answer."""
        wait = self.retry.backoff
        content = _core.encode(body)
        unknown: CtxlogError | None = None
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return await self._call("POST", path, content=content, headers=_core.JSON_HEADERS)
            except CtxlogError as e:
                if e.written == "unknown":
                    unknown = e
                if attempt == self.retry.attempts or not _core.retryable(e):
                    if e is unknown or unknown is None:
                        raise
                    raise _core.unknown_after(e, unknown) from e
            await asyncio.sleep(wait)
            wait = min(wait * 2, self.retry.max_backoff)
        raise AssertionError("unreachable")

    def session(self, bot: str, session_id: str) -> AsyncSession:
        """One session of one bot."""
        return AsyncSession(self, bot, session_id)

    async def sessions(
        self, bot: str, *, limit: int = 1000, at: str | None = None
    ) -> AsyncIterator[SessionInfo]:
        """Every session of `bot` with live records, by session id (as of `at`, if given:
        see `Session.context`)."""
        after: str | None = None
        while True:
            params: dict[str, Any] = {"limit": limit}
            if after:
                params["after"] = after
            if at is not None:
                params["at"] = at
            infos, after = _core.sessions(
                await self._call("GET", f"/v1/bots/{seg(bot)}/sessions", params=params)
            )
            for info in infos:
                yield info
            if not after:
                return

    async def append_many(self, bot: str, records: Iterable[RecordInput]) -> Ack:
        """Append one atomic batch across sessions of `bot` (each record names its
        `session_id`): all are written or none. Retried as `Session.append` is."""
        return await self._append(f"/v1/bots/{seg(bot)}/records", _core.records_body(records))

    async def search(
        self,
        bot: str,
        query: str | None = None,
        *,
        vector: Sequence[float] | None = None,
        model: str | None = None,
        k: int | None = None,
        after: str | None = None,
        session: str | None = None,
        roles: Iterable[str] | None = None,
        since: str | None = None,
        until: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> SearchPage:
        """Search `bot`'s live records, best first: full text (contract rule 26: words,
        `"phrases"` and `prefix*`es, BM25-ranked), the records nearest `vector` among those
        embedded by `model` (rule 27: by the metric the model declares, approximate — the
        nearest cells probed, at most 512 hits over all pages — and the same on every replica;
        see `embedding`), or both (reciprocal rank fusion). At most `k` (default 10, up to
        100), the next page with `after=page.next`. Filters: one `session`, `roles`,
        `since`/`until` (RFC 3339, the log's clock), `metadata` keys with exactly these
        values. Sees every append acknowledged before the call; never a forgotten record."""
        body = _core.search_body(
            query,
            vector=vector,
            model=model,
            k=k,
            after=after,
            session=session,
            roles=roles,
            since=since,
            until=until,
            metadata=metadata,
        )
        v = await self._call(
            "POST",
            f"/v1/bots/{seg(bot)}/search",
            content=_core.encode(body),
            headers=_core.JSON_HEADERS,
        )
        return _core.search_page(v)

    async def get(self, bot: str, record_id: str) -> Record | None:
        """The live record `record_id` of `bot`, or None."""
        try:
            v = await self._call("GET", f"/v1/bots/{seg(bot)}/records/{seg(record_id)}")
        except CtxlogError as e:
            if e.status == 404:
                return None
            raise
        return Record.from_json(v)

    async def conflicts(self, *, after: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """The log's conflicts (admin), and the position to ask `after` next time."""
        v = await self._call("GET", "/v1/conflicts", params={"after": after} if after else None)
        return list(v["conflicts"]), str(v["position"])

    async def stats(self) -> dict[str, Any]:
        """Counts of what the replica's view holds (admin)."""
        return dict(await self._call("GET", "/v1/stats"))

    async def shards(self) -> list[dict[str, Any]]:
        """Every shard of the store (admin)."""
        return list(await self._call("GET", "/v1/shards"))

    async def admin(self, op: str, **options: Any) -> dict[str, Any]:
        """A maintenance operation (admin): `compact`, `gc`, `purge`, `retain`, `snapshot`."""
        v = await self._call("POST", f"/v1/admin/{seg(op)}", json=options or None)
        return dict(v["report"])

    async def ready(self) -> bool:
        try:
            await self._call("GET", "/readyz")
            return True
        except CtxlogError:
            return False


class AsyncSession:
    """One session of one bot, through an [`AsyncClient`]."""

    def __init__(self, client: AsyncClient, bot: str, session_id: str) -> None:
        self.client, self.bot, self.session_id = client, bot, session_id
        self._path = f"/v1/bots/{seg(bot)}/sessions/{seg(session_id)}"

    async def append(self, records: Iterable[RecordInput]) -> Ack:
        """Append one atomic batch; durable when it returns. Records without an `id` get
        one here, once: a retry after an answer that may have landed sends the same ids
        (counted once by the log), a bounded number of times."""
        return await self.client._append(f"{self._path}/records", _core.records_body(records))

    async def records(
        self, *, after: str | None = None, limit: int = 100, at: str | None = None
    ) -> Page:
        """One page of live records in the log's order; `page.next` is the next `after`.
        `at`: as of that position (see `context`), the same with every page."""
        params: dict[str, Any] = {"limit": limit}
        if after:
            params["after"] = after
        if at is not None:
            params["at"] = at
        return _core.page(await self.client._call("GET", f"{self._path}/records", params=params))

    async def tail(self, n: int) -> Page:
        """The last `n` live records (1 to 1000), in the log's order; `page.has_more` says
        whether older ones precede them. The server reads only those `n`."""
        return _core.page(
            await self.client._call("GET", f"{self._path}/records", params={"last": n})
        )

    async def context(self, *, at: str | None = None) -> Context:
        """The session's context view: its governing summary (if any) and every live record
        it does not cover, in the log's order, with the view's `position` (to watch from)
        and `covers` (what a summary written from this view covers: give the view).
        `at`: a position given out earlier (a view's or a page's `position`): the view as
        its reader saw it, less what was forgotten since (contract rule 24); a position the
        server does not hold raises `InvalidInput` (`field == "at"`)."""
        params = {"at": at} if at is not None else None
        return _core.context(await self.client._call("GET", f"{self._path}/context", params=params))

    async def fork(
        self,
        from_session: str,
        *,
        at: str | None = None,
        through: str | None = None,
        id: str | None = None,
    ) -> Fork:
        """Make this session continue `from_session` (of the same bot) as of a position
        (contract rule 25): one record, whatever the length of `from_session`, which does
        not change. Its view is then `from_session`'s as of there, followed by its own
        records. `at`: a position given out earlier (a view's, a page's or an event's);
        `through`: a record id of `from_session`'s view, to continue from just after it (to
        retry the turn that followed); neither: now. The fork record's id is made here if
        not given, once: a retry after an answer that may have landed sends the same one."""
        body: dict[str, Any] = {"from": from_session, "id": id or new_id()}
        if at is not None:
            body["at"] = at
        if through is not None:
            body["through"] = through
        return Fork.from_json(await self.client._post_retried(f"{self._path}/fork", body))

    async def hide(self, record_id: str, *, id: str | None = None) -> Ack:
        """Leave the inherited record `record_id` out of this session's view (a fork's, rule
        25), without touching the session it lies in; `delete` of the hide's id shows it
        again."""
        record = {"id": id or new_id(), "kind": "hide", "text": record_id, "role": "hide"}
        return await self.client._append(f"{self._path}/records", {"records": [record]})

    async def summarize(
        self,
        body: str | bytes,
        covers: Context | str,
        *,
        id: str | None = None,
        role: str = "summary",
        content_type: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Ack:
        """Append a summary of the records the context view `covers` held (the view its
        writer read, or its `covers` token; a page is refused, since its position is the
        whole view's): it stands for them in the context view from then on. Records
        appended after that read are not covered, so never lost. The id is made here if not
        given, once: a retry after an answer that may have landed sends the same one. A
        `covers` of another session, or not given out by this store, raises `InvalidInput`
        (`field == "covers"`)."""
        record = _core.summary_record(
            body, covers, id=id, role=role, content_type=content_type, metadata=metadata
        )
        return await self.client._append(f"{self._path}/records", _core.records_body([record]))

    async def iter_records(
        self, *, page_size: int = 1000, at: str | None = None
    ) -> AsyncIterator[Record]:
        """Every live record, page after page (as of `at`, if given: see `context`)."""
        after: str | None = None
        while True:
            p = await self.records(after=after, limit=page_size, at=at)
            for r in p.records:
                yield r
            if not p.next:
                return
            after = p.next

    async def get(self, record_id: str) -> Record | None:
        """The live record `record_id` if it is in this session."""
        r = await self.client.get(self.bot, record_id)
        return r if r is not None and r.session_id == self.session_id else None

    async def delete(self, record_id: str) -> Ack:
        """Tombstone `record_id` (final)."""
        v = await self.client._call("DELETE", f"/v1/bots/{seg(self.bot)}/records/{seg(record_id)}")
        return _core.ack(v)

    async def watch(
        self,
        *,
        after: str | None = None,
        until: str | None = None,
        reconnects: int = 5,
        backoff: float = 0.2,
    ) -> AsyncIterator[Event]:
        """New records as they arrive (after `after`, a position from a page or an event;
        without one, from the position the first stream started at, which the server
        sends first). A dropped or ended stream is reopened from the last position it
        gave: nothing is missed or seen twice. A stream the replica could not serve (it
        ended it, or answered 5xx) is reopened after a pause that grows; gives up after
        `reconnects` tries in a row that brought no record; raises `WatchEnded` if the
        server ends the stream as not resumable.

        With `until` (a position), the changes between `after` and `until` (contract rule
        24): what was appended, tombstoned, summarised or linked past `after` and at or
        below `until`, in the log's order; the iterator ends there."""
        state = _core.Watch(after, until)
        failures = 0
        while True:
            opened = progressed = False
            try:
                async with aconnect_sse(
                    self.client._http,
                    "GET",
                    f"{self._path}/watch",
                    params=state.params(),
                    headers=state.headers(),
                ) as source:
                    if source.response.status_code >= 400:
                        await source.response.aread()
                        _core.check(source.response)
                    opened = True
                    async for sse in source.aiter_sse():
                        event = state.on(sse.event, sse.id, sse.data)
                        if event is not None:
                            progressed = True
                            yield event
                        elif state.done:
                            return
                        elif state.ended:
                            break
            except (httpx.TransportError, httpx.RemoteProtocolError):
                pass
            except CtxlogError as e:
                if not _core.Watch.reopen_after(e):
                    raise
            failures, pause = state.next_try(
                failures,
                opened=opened,
                progressed=progressed,
                reconnects=reconnects,
                backoff=backoff,
            )
            if pause:
                await asyncio.sleep(pause)


def owning_local(
    store: str | os.PathLike[str], writer: str | None, make: Callable[[AsyncClient], _T]
) -> _T:
    """`make(AsyncClient.local(store, writer))`, the local replica stopped if `make`
    fails: what the async adapters' `local()` build on."""
    client = AsyncClient.local(store, writer)
    try:
        return make(client)
    except BaseException:
        if client.server is not None:
            client.server.stop()
        raise
