"""A Google ADK session service backed by ctxlog (`pip install "ctxlog[adk]"`).

```python
from google.adk.runners import Runner
from ctxlog.adk import CtxlogSessionService

runner = Runner(agent=agent, app_name="helpdesk",
                session_service=CtxlogSessionService("http://127.0.0.1:7070"))
```

Without a server: `CtxlogSessionService.local("agents.db")` runs one as a child of this
process (`ctxlog.LocalServer`), stopped by `await service.close()` (or leaving an
`async with` block), at exit, or when the process dies.

It behaves as ADK's own services do (`InMemorySessionService` is its reference in the
tests), on a log that many replicas share. An app is a ctxlog bot (`adk:<app>`); per ADK
session two ctxlog sessions hold its events and its state (its creation and each event's
session-scoped state delta), and per user and per app one holds the `user:` and `app:`
state deltas. An event, its state delta and its `user:`/`app:` deltas are appended as one
atomic batch (a bot-wide append), so state never runs ahead of or behind its events; `temp:`
state is never stored. Every record's id is derived from what it is (the event's id, within
one creation of the session), so a retried `append_event` counts once. `get_session` with
`num_recent_events` reads the state records and those events only, never the whole session.

A session's creation record has an id of its own (made once per `create_session`), and the
ids of its events and state deltas name that creation: `delete_session` tombstones them
for good, and `create_session` with the same session id then starts a new session whose
records no tombstone hides (ADK's own services allow re-using an id). Two processes that
create one session id at once may both succeed (each check reads no creation); their
states merge. `last_update_time` is the time of the session's last state record in the
log's order: its last event's timestamp, or its creation time.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Self
from urllib.parse import quote, unquote

from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from google.genai import types

from ._async_client import AsyncClient, owning_local
from ._errors import InvalidInput, NotFound
from ._ids import new_id
from ._types import Record

EVENT = "application/vnd.google.adk.event+json"
MEMORY = "text/plain"
MEMORY_RESULTS = 10
STATE = "application/vnd.google.adk.state+json"
MAX_BATCH = 5_000


def _q(s: str) -> str:
    return quote(s, safe="")


class _Service:
    """What both ADK services share: the client, and whether closing them closes it."""

    def __init__(self, client: AsyncClient | str, *, token: str | None = None) -> None:
        self.client = AsyncClient(client, token=token) if isinstance(client, str) else client
        # A client made here (from a URL, or by `local()`) is closed by `close()`; one
        # given is the caller's.
        self._owns_client = isinstance(client, str)

    @classmethod
    def local(cls, store: str | os.PathLike[str], writer: str | None = None) -> Self:
        """A service over a local replica of `store` that it owns (`ctxlog.LocalServer`:
        a plain path is a SQLite file, whose writer id `local-N` is picked when not given),
        stopped by `close()`. Blocks while the server starts (a fraction of a second for a
        SQLite file); usable from any event loop after."""
        service = owning_local(store, writer, cls)
        service._owns_client = True
        return service

    async def close(self) -> None:
        """Close the client this service made (from a URL, or `local()`'s, stopping its
        server); a client given is left open. Idempotent."""
        if self._owns_client:
            await self.client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class CtxlogSessionService(_Service, BaseSessionService):
    """ADK's `BaseSessionService` over ctxlog."""

    # ---- where things are -----------------------------------------------------------------

    @staticmethod
    def _bot(app: str) -> str:
        return f"adk:{app}"

    @staticmethod
    def _events(user: str, sid: str) -> str:
        return f"{_q(user)}/{_q(sid)}"

    @staticmethod
    def _state(user: str, sid: str) -> str:
        return f"{_q(user)}/{_q(sid)}!state"

    @staticmethod
    def _user(user: str) -> str:
        return f"{_q(user)}!user"

    APP = "!app"

    @staticmethod
    def _prefix(app: str, user: str, sid: str) -> str:
        return f"adk:{_q(app)}:{_q(user)}:{_q(sid)}"

    @classmethod
    def _created_id(cls, app: str, user: str, sid: str) -> str:
        """A new creation record's id: a fresh one per creation, so that no tombstone of an
        earlier session with this id hides it."""
        return f"{cls._prefix(app, user, sid)}:created:{new_id()}"

    @classmethod
    def _creation_prefix(cls, app: str, user: str, sid: str, created_id: str) -> str:
        """The prefix of the ids of a creation's events and deltas (a store written before
        creations had ids of their own uses the session's)."""
        base = cls._prefix(app, user, sid)
        generation = created_id.removeprefix(f"{base}:created").removeprefix(":")
        return f"{base}:{generation}" if generation else base

    # ---- reading ---------------------------------------------------------------------------

    async def _records(self, app: str, session: str) -> list[Record]:
        s = self.client.session(self._bot(app), session)
        return [r async for r in s.iter_records()]

    async def _fold(self, app: str, session: str) -> tuple[dict[str, Any], float, bool]:
        """The state the records of `session` build, the time of the last one (in the
        log's order), and whether it holds a creation record."""
        state: dict[str, Any] = {}
        last, created = 0.0, False
        for r in await self._records(app, session):
            if r.content_type != STATE or r.text is None:
                continue
            body = json.loads(r.text)
            created |= body.get("created", False)
            state.update(body.get("delta", {}))
            if "time" in body:
                last = float(body["time"])
        return state, last, created

    async def _creation(self, app: str, user: str, sid: str) -> str | None:
        """The id of the live creation record of a session, if it exists."""
        s = self.client.session(self._bot(app), self._state(user, sid))
        # The creation is the session's first state record (its events' come after it):
        # one record read, the whole session only when something else comes first.
        first = (await s.records(limit=1)).records
        if not first:
            return None
        if self._is_creation(first[0]):
            return first[0].id
        async for r in s.iter_records():
            if self._is_creation(r):
                return r.id
        return None

    @staticmethod
    def _is_creation(r: Record) -> bool:
        return (
            r.content_type == STATE
            and r.text is not None
            and bool(json.loads(r.text).get("created", False))
        )

    async def _merge(self, app: str, user: str, session: Session) -> Session:
        app_state, _, _ = await self._fold(app, self.APP)
        user_state, _, _ = await self._fold(app, self._user(user))
        for k, v in app_state.items():
            session.state[State.APP_PREFIX + k] = v
        for k, v in user_state.items():
            session.state[State.USER_PREFIX + k] = v
        return session

    # ---- the service -----------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        sid = session_id.strip() if session_id else None
        sid = sid or str(uuid.uuid4())
        bot = self._bot(app_name)
        if await self._creation(app_name, user_id, sid) is not None:
            raise AlreadyExistsError(f"Session with id {sid} already exists.")
        created_id = self._created_id(app_name, user_id, sid)
        prefix = self._creation_prefix(app_name, user_id, sid, created_id)
        deltas = _session_util.extract_state_delta(state or {})
        now = time.time()
        records = [
            {
                "id": created_id,
                "session_id": self._state(user_id, sid),
                "role": "state",
                "content_type": STATE,
                "text": json.dumps({"created": True, "delta": deltas["session"], "time": now}),
            }
        ]
        records += self._scoped(prefix, user_id, "created", deltas, now)
        await self.client.append_many(bot, records)
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=sid,
            state=dict(deltas["session"]),
            last_update_time=now,
        )
        return await self._merge(app_name, user_id, session)

    def _scoped(
        self, prefix: str, user: str, key: str, deltas: dict[str, Any], now: float
    ) -> list[dict[str, Any]]:
        """Records of the `user:` and `app:` deltas (ids under the creation's `prefix`)."""
        out = []
        for scope, session in (("user", self._user(user)), ("app", self.APP)):
            if deltas[scope]:
                out.append(
                    {
                        "id": f"{prefix}:{scope}:{key}",
                        "session_id": session,
                        "role": "state",
                        "content_type": STATE,
                        "text": json.dumps({"delta": deltas[scope], "time": now}),
                    }
                )
        return out

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        sid = session_id.strip() if session_id else session_id
        state, last, created = await self._fold(app_name, self._state(user_id, sid))
        if not created:
            return None
        events_session = self.client.session(self._bot(app_name), self._events(user_id, sid))
        if config is not None and config.num_recent_events == 0:
            records: list[Record] = []
        elif config is not None and config.num_recent_events is not None:
            n = config.num_recent_events
            if n <= 1000:
                # Only those events are read: the server reads the bodies of these `n` only.
                records = (await events_session.tail(n)).records
            else:
                # Beyond one page (1,000), every event is read.
                records = [r async for r in events_session.iter_records()][-n:]
        else:
            records = [r async for r in events_session.iter_records()]
        events = [
            Event.model_validate_json(r.text)
            for r in records
            if r.content_type == EVENT and r.text is not None
        ]
        if config is not None and config.after_timestamp is not None:
            i = len(events) - 1
            while i >= 0 and events[i].timestamp >= config.after_timestamp:
                i -= 1
            events = events[i + 1 :]
        session = Session(
            app_name=app_name,
            user_id=user_id,
            id=sid,
            state=state,
            events=events,
            last_update_time=last,
        )
        return await self._merge(app_name, user_id, session)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        out = []
        async for info in self.client.sessions(self._bot(app_name)):
            name = info.session_id
            if not name.endswith("!state"):
                continue
            user_q, _, sid_q = name.removesuffix("!state").partition("/")
            user, sid = unquote(user_q), unquote(sid_q)
            if user_id is not None and user != user_id:
                continue
            state, last, created = await self._fold(app_name, name)
            if not created:
                continue
            session = Session(
                app_name=app_name, user_id=user, id=sid, state=state, last_update_time=last
            )
            out.append(await self._merge(app_name, user, session))
        out.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=out)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        sid = session_id.strip() if session_id else session_id
        bot = self._bot(app_name)
        stones = []
        for name in (self._events(user_id, sid), self._state(user_id, sid)):
            for r in await self._records(app_name, name):
                stones.append({"id": r.id, "session_id": name, "role": r.role, "kind": "tombstone"})
        for i in range(0, len(stones), MAX_BATCH):
            await self.client.append_many(bot, stones[i : i + MAX_BATCH])

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        state, _, _ = await self._fold(app_name, self._user(user_id))
        return state

    async def append_event(self, session: Session, event: Event) -> Event:
        if event.partial:
            return event
        if any(e.id == event.id for e in session.events):
            return event  # in the session already: a retry counts once
        app, user, sid = session.app_name, session.user_id, session.id
        bot = self._bot(app)
        created_id = await self._creation(app, user, sid)
        if created_id is None:
            raise SessionNotFoundError(f"Session {sid} not found.")
        prefix = self._creation_prefix(app, user, sid, created_id)
        event_id = f"{prefix}:e:{event.id}"
        # As ADK's own services: temp state reaches this session object, never the store.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        records: list[dict[str, Any]] = [
            {
                "id": event_id,
                "session_id": self._events(user, sid),
                "role": event.author or "event",
                "content_type": EVENT,
                "text": event.model_dump_json(exclude_none=True),
            }
        ]
        delta = event.actions.state_delta if event.actions else {}
        deltas = _session_util.extract_state_delta(delta or {})
        records.append(
            {
                "id": f"{prefix}:s:{event.id}",
                "session_id": self._state(user, sid),
                "role": "state",
                "content_type": STATE,
                "text": json.dumps({"delta": deltas["session"], "time": event.timestamp}),
            }
        )
        records += self._scoped(prefix, user, event.id, deltas, event.timestamp)
        # Ids are the event's: a retry after an answer that was lost lands once. The session
        # object changes only once the store has the event.
        await self.client.append_many(bot, records)
        session.last_update_time = event.timestamp
        return self._commit_event_to_session(session, event)


def _memory_query(query: str) -> str:
    """A user's text as a search query (contract rule 26) that the server takes: its words
    as written (split at spaces, so `O'Brien`, `example.com` and `3.14` stay whole as the
    index has them), without the query language's `"` and trailing `*`; a long run of other
    than ASCII without spaces (Japanese, Chinese) cut into pieces of 16 characters (a phrase
    has at most 16 terms); at most 32 words and 1024 bytes. A query the server still refuses
    finds nothing."""
    words: list[str] = []
    size = 0
    for raw in query.split():
        word = raw.replace('"', "").rstrip("*")
        long_run = len(word) > 16 and not word.isascii()
        pieces = [word[i : i + 16] for i in range(0, len(word), 16)] if long_run else [word]
        for piece in pieces:
            n = len(piece.encode()) + 1
            if not piece or piece in words:
                continue
            if len(words) == 32 or size + n > 1024:
                return " ".join(words)
            words.append(piece)
            size += n
    return " ".join(words)


class CtxlogMemoryService(_Service, BaseMemoryService):
    """ADK's `BaseMemoryService` over ctxlog's full-text search (contract rule 26).

    ```python
    runner = Runner(agent=agent, app_name="helpdesk", session_service=sessions,
                    memory_service=CtxlogMemoryService("http://127.0.0.1:7070"))
    ```

    A memory is an event's text: one record per event with text parts, in the app's bot
    (`adk:<app>`) and a session of its own per user (`<user>!memory`), its id derived from
    the event's (adding a session again, or retrying, counts once), the event's content,
    author and time in its metadata. `search_memory` is a search of that session: the words
    of the query (quotes and operators are taken as words), BM25-ranked, at most ten, the
    same from every replica. `delete_memory` tombstones the memory for good, so adding its
    session again does not bring it back (as ADK's own `InMemoryMemoryService` keeps deleted
    ids out). Unlike that service, adding a session again never removes memories of events
    the session no longer holds: the log only grows; delete them by id."""

    @staticmethod
    def _where(app: str, user: str) -> tuple[str, str]:
        return f"adk:{app}", f"{_q(user)}!memory"

    @staticmethod
    def _id(user: str, event_id: str) -> str:
        return f"memory:{_q(user)}:{event_id}"

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(
            app_name=session.app_name,
            user_id=session.user_id,
            events=session.events,
            session_id=session.id,
        )

    async def add_events_to_memory(
        self,
        *,
        app_name: str,
        user_id: str,
        events: Sequence[Event],
        session_id: str | None = None,
        custom_metadata: Mapping[str, object] | None = None,
    ) -> None:
        bot, memories = self._where(app_name, user_id)
        records: list[dict[str, Any]] = []
        for event in events:
            texts = [p.text for p in (event.content.parts or [])] if event.content else []
            text = " ".join(t for t in texts if t)
            if not text:
                continue
            adk: dict[str, Any] = {
                "content": event.content.model_dump(mode="json", exclude_none=True)
                if event.content
                else None,
                "author": event.author,
                "timestamp": event.timestamp,
                "session_id": session_id,
                "event_id": event.id,
            }
            if custom_metadata:
                adk["custom_metadata"] = dict(custom_metadata)
            records.append(
                {
                    "id": self._id(user_id, event.id),
                    "role": event.author or "event",
                    "content_type": MEMORY,
                    "text": text,
                    "metadata": {"adk": adk},
                }
            )
        session = self.client.session(bot, memories)
        for start in range(0, len(records), MAX_BATCH):
            await session.append(records[start : start + MAX_BATCH])

    async def search_memory(
        self, *, app_name: str, user_id: str, query: str
    ) -> SearchMemoryResponse:
        bot, memories = self._where(app_name, user_id)
        q = _memory_query(query)
        if not q:
            return SearchMemoryResponse()
        try:
            page = await self.client.search(bot, q, k=MEMORY_RESULTS, session=memories)
        except InvalidInput as e:
            # What a user typed is never a syntax error: a query of no word is no match.
            if e.field == "query":
                return SearchMemoryResponse()
            raise
        out = []
        for hit in page.hits:
            adk = (hit.record.metadata or {}).get("adk", {})
            timestamp = adk.get("timestamp")
            out.append(
                MemoryEntry(
                    id=adk.get("event_id"),
                    content=types.Content.model_validate(adk["content"]),
                    author=adk.get("author"),
                    timestamp=None
                    if timestamp is None
                    else datetime.fromtimestamp(timestamp).isoformat(),
                    custom_metadata=adk.get("custom_metadata") or {},
                )
            )
        return SearchMemoryResponse(memories=out)

    async def delete_memory(
        self, *, app_name: str, user_id: str, memory_id: str | None = None
    ) -> None:
        if not memory_id:
            return
        bot, memories = self._where(app_name, user_id)
        try:
            await self.client.session(bot, memories).delete(self._id(user_id, memory_id))
        except NotFound:
            # As ADK's own service: deleting what is not there does nothing.
            return
