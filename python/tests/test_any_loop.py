"""Every async adapter works from any event loop, as the frameworks' own SQLite and
in-memory classes do: one object used by a second `asyncio.run`, by a thread with a loop
of its own, and by the SDKs' `run_sync`-style calls (a fresh loop per call)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from conftest import Server

import ctxlog

T = TypeVar("T")


def in_a_thread(make: Callable[[], Awaitable[T]]) -> T:
    """`asyncio.run(make())` on a thread of its own (so on a loop of its own)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(asyncio.run(make()))  # type: ignore[arg-type]
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert out, "the thread did not finish"
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]  # type: ignore[no-any-return]


def test_the_async_client_works_from_any_loop(server: Server) -> None:
    c = ctxlog.AsyncClient(server.url)
    s = c.session("b", "loops")
    first = asyncio.run(s.append([{"role": "user", "text": "1"}])).ids
    second = asyncio.run(s.append([{"role": "user", "text": "2"}])).ids
    third = in_a_thread(lambda: s.append([{"role": "user", "text": "3"}])).ids

    async def read() -> list[str]:
        return [r.id async for r in s.iter_records()]

    assert in_a_thread(read) == asyncio.run(read()) == first + second + third
    asyncio.run(c.close())


def test_the_openai_agents_session_works_from_any_loop(server: Server) -> None:
    from ctxlog.openai_agents import CtxlogSession

    session = CtxlogSession("loops", server.url)
    asyncio.run(session.add_items([{"role": "user", "content": "1"}]))
    asyncio.run(session.add_items([{"role": "assistant", "content": "2"}]))
    in_a_thread(lambda: session.add_items([{"role": "user", "content": "3"}]))
    want = [
        {"role": "user", "content": "1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "3"},
    ]
    assert asyncio.run(session.get_items()) == want
    assert in_a_thread(session.get_items) == want


def test_the_langgraph_saver_works_from_any_loop(server: Server) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    from ctxlog.langgraph import CtxlogSaver

    saver = CtxlogSaver(server.url)
    config: Any = {"configurable": {"thread_id": "loops", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    asyncio.run(saver.aput(config, first, {"step": 0}, {}))
    second = empty_checkpoint()
    in_a_thread(lambda: saver.aput(config, second, {"step": 1}, {}))

    async def latest() -> Any:
        tup = await saver.aget_tuple(config)
        return tup.checkpoint["id"] if tup else None

    assert asyncio.run(latest()) == in_a_thread(latest) == max(first["id"], second["id"])


def test_the_adk_service_works_from_any_loop(server: Server) -> None:
    from ctxlog.adk import CtxlogSessionService

    service = CtxlogSessionService(server.url)
    asyncio.run(service.create_session(app_name="a", user_id="u", session_id="s1"))
    in_a_thread(lambda: service.create_session(app_name="a", user_id="u", session_id="s2"))

    async def ids() -> list[str]:
        return [s.id for s in (await service.list_sessions(app_name="a")).sessions]

    assert sorted(asyncio.run(ids())) == sorted(in_a_thread(ids)) == ["s1", "s2"]
