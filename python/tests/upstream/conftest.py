"""The frameworks' own tests, vendored (a lean, pinned subset; see each file's header and
the licences beside them), run against the ctxlog adapters: the OpenAI Agents SDK's
`SQLiteSession` is swapped for `CtxlogSession` (one bot per database path, so databases
stay isolated), and LangGraph's `sync_checkpointer` / `async_checkpointer` fixtures are
`CtxlogSaver`, each on a real `ctxlog serve` (the `server` fixture of ../conftest.py).

What of the upstream suites cannot apply here, and why, is said in `NOT_APPLICABLE`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Server

NOT_APPLICABLE = """
openai-agents tests/memory/test_session.py: the tests of SQLiteSession's own machinery —
its per-thread connections and their reaping, its file lock, rollbacks of failed SQLite
transactions, rows corrupted in its tables, closing (`close()` then a refused write) —
reach into attributes only that class has (`_connections`, `_locked_connection`, ...).
tests/memory/test_compaction_suffix.py and test_openai_responses_compaction_session.py:
tests that edit SQLiteSession's tables or patch its `_insert_items`, and the tests of the
compaction wrapper's generic clear-then-add restore path, which CtxlogSession replaces by
one summary (its documented compaction hooks); and test_new_backend_write_invalidates_
snapshot, which expects a compaction to decline when an item was appended meanwhile,
where this adapter compacts what it read and keeps the appended item (module docs).
langgraph: tests that need Docker (Postgres, Redis), pytest-mock or syrupy snapshots.
"""


def _bot(db_path: Any) -> str:
    if db_path is None or str(db_path) == ":memory:":
        return f"db-{uuid.uuid4().hex}"
    return "db-" + uuid.uuid5(uuid.NAMESPACE_URL, str(Path(db_path).resolve())).hex


@pytest.fixture(autouse=True)
def _sqlite_session_is_ctxlog(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, server: Server
) -> None:
    module = request.module
    if not hasattr(module, "SQLiteSession"):
        return
    from ctxlog.openai_agents import CtxlogSession

    class CtxlogAsSQLiteSession(CtxlogSession):
        """`SQLiteSession`'s constructor over the adapter: a database path is a bot."""

        def __init__(
            self,
            session_id: str,
            db_path: Any = ":memory:",
            sessions_table: str = "agent_sessions",
            messages_table: str = "agent_messages",
            session_settings: Any = None,
        ) -> None:
            super().__init__(
                session_id, server.url, bot=_bot(db_path), session_settings=session_settings
            )

        def close(self) -> None:
            """SQLiteSession's `close()`: the adapter holds nothing to release at once."""

    monkeypatch.setattr(module, "SQLiteSession", CtxlogAsSQLiteSession)


@pytest.fixture
def sync_checkpointer(server: Server) -> Iterator[Any]:
    from ctxlog.langgraph import CtxlogSaver

    yield CtxlogSaver(server.url, bot=f"lg-{uuid.uuid4().hex}")


@pytest.fixture
async def async_checkpointer(server: Server) -> AsyncIterator[Any]:
    from ctxlog.langgraph import CtxlogSaver

    yield CtxlogSaver(server.url, bot=f"lg-{uuid.uuid4().hex}")
