"""Forks (contract rule 25) through the client and the adapters, on a real server: a fork
shows its parent as of a position and its own records, the parent never changes, and what
the adapters forget in a fork stays in its parent."""

from __future__ import annotations

import asyncio
import operator
from typing import Annotated, TypedDict

import pytest
from conftest import Server
from langgraph.graph import END, START, StateGraph

import ctxlog
from ctxlog.langgraph import CtxlogSaver
from ctxlog.openai_agents import CtxlogSession


def ids(session: ctxlog.Session) -> list[str]:
    return [r.id for r in session.iter_records()]


def put(*names: str) -> list[dict[str, str]]:
    return [{"id": n, "role": "user", "text": n} for n in names]


def test_a_fork_is_its_parent_as_of_a_position_then_its_own(server: Server) -> None:
    client = ctxlog.Client(server.url)
    parent = client.session("bot", "p")
    parent.append(put("a", "b"))
    at = parent.context().position
    parent.append(put("c"))

    fork = client.session("bot", "f")
    made = fork.fork("p", at=at, id="fork-f")
    assert made.ack.ids == ["fork-f"]
    # A retry with the same id counts once: it is answered with the fork that landed.
    again = fork.fork("p", at=at, id="fork-f")
    assert again == made
    fork.append(put("f1"))
    assert ids(fork) == ["a", "b", "f1"]
    assert ids(parent) == ["a", "b", "c"], "the parent changed"
    assert [r.id for r in fork.context().records] == ["a", "b", "f1"]

    retry = client.session("bot", "r")
    retry.fork("p", through="a")
    assert ids(retry) == ["a"], "through a record: just after it"
    now = client.session("bot", "n")
    assert now.fork("p").at
    assert ids(now) == ["a", "b", "c"]

    # A hide leaves an inherited record out of the fork only.
    fork.hide("a")
    assert ids(fork) == ["b", "f1"] and ids(parent) == ["a", "b", "c"]
    # Forgetting in the parent reaches every fork.
    parent.delete("b")
    assert ids(fork) == ["f1"] and ids(retry) == ["a"] and ids(now) == ["a", "c"]
    # A fork of a fork.
    grand = client.session("bot", "g")
    grand.fork("f")
    assert ids(grand) == ["f1"]
    # A session list counts each session's own records (a fork's inherited ones are its
    # parent's).
    listed = {s.session_id: s.records for s in client.sessions("bot")}
    assert listed == {"p": 2, "f": 1, "r": 0, "n": 0, "g": 0}
    # One fork per session: another is refused, nothing written.
    with pytest.raises(ctxlog.InvalidInput) as e:
        fork.fork("n", id="fork-f-again")
    assert e.value.field == "from" and e.value.written == "nothing"


def test_a_fork_refuses_what_names_nothing(server: Server) -> None:
    client = ctxlog.Client(server.url)
    parent = client.session("bot", "p")
    parent.append(put("a"))
    fork = client.session("bot", "f")
    with pytest.raises(ctxlog.InvalidInput) as e:
        fork.fork("p", through="no-such-record")
    assert e.value.field == "through" and e.value.written == "nothing"
    with pytest.raises(ctxlog.InvalidInput) as e:
        parent.fork("p")
    assert e.value.field == "from" and e.value.written == "nothing"
    # An id that names another record is refused, not taken for a retry.
    with pytest.raises(ctxlog.InvalidInput) as e:
        fork.fork("p", id="a")
    assert e.value.field == "id" and e.value.written == "nothing"
    with pytest.raises(ctxlog.InvalidInput) as e:
        fork.fork("p", at=parent.context().position, through="a")
    assert e.value.field == "through"
    assert ids(fork) == []


def test_through_is_refused_when_no_position_holds_exactly_that_prefix(server: Server) -> None:
    client = ctxlog.Client(server.url)
    client.session("bot", "p").append(put("p1", "p2", "p3"))
    q = client.session("bot", "q")
    q.fork("p")
    q.append(put("q1"))
    q.hide("p2")  # written after q1: a position that holds p3 and not q1 misses it
    assert ids(q) == ["p1", "p3", "q1"]
    with pytest.raises(ctxlog.InvalidInput) as e:
        client.session("bot", "r").fork("q", through="p3")
    assert e.value.field == "through" and e.value.written == "nothing"
    s = client.session("bot", "s")
    s.fork("q", through="q1")
    assert ids(s) == ["p1", "p3", "q1"]


def test_the_async_twin_forks_and_a_watch_shows_the_link(server: Server) -> None:
    async def run() -> None:
        async with ctxlog.AsyncClient(server.url) as client:
            parent = client.session("bot", "p")
            await parent.append(put("a"))
            fork = client.session("bot", "f")
            position = (await fork.context()).position
            await fork.fork("p")
            assert [r.id async for r in fork.iter_records()] == ["a"]
            events = fork.watch(after=position)
            first = await anext(events)
            assert first.kind == "link" and first.record.kind == "fork"
            await events.aclose()

    asyncio.run(run())


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def test_copy_thread_is_a_fork_and_forgetting_in_the_copy_leaves_the_source(server: Server) -> None:
    saver = CtxlogSaver(server.url)
    g = StateGraph(State)
    g.add_node("step", lambda s: {"steps": ["step"]})
    g.add_edge(START, "step")
    g.add_edge("step", END)
    graph = g.compile(checkpointer=saver)
    source = {"configurable": {"thread_id": "source"}}
    for _ in range(5):
        graph.invoke({"steps": ["in"]}, source)
    before = [r.id for r in saver.client.session(saver.bot, "source").iter_records()]

    saver.copy_thread("source", "copy")
    copy = saver.client.session(saver.bot, "copy")
    own = [r for r in copy.iter_records() if r.session_id == "copy"]
    assert len(own) == 1, "a copy writes a marker and a fork, not the source's records"
    copied = {"configurable": {"thread_id": "copy"}}
    assert graph.get_state(copied).values == graph.get_state(source).values
    graph.invoke({"steps": ["more"]}, copied)
    assert (
        len(graph.get_state(copied).values["steps"])
        == len(graph.get_state(source).values["steps"]) + 2
    )

    # Pruning and deleting the copy leave the source as it was.
    saver.prune(["copy"], strategy="keep_latest")
    assert len(list(saver.list(copied))) == 1
    saver.delete_thread("copy")
    assert list(saver.list(copied)) == []
    after = [r.id for r in saver.client.session(saver.bot, "source").iter_records()]
    assert after == before, "forgetting in the copy reached the source"
    assert "copy" not in {s.session_id for s in saver.client.sessions(saver.bot)}
    # Copied again, the copy is whole: nothing of the first copy (its hides) is left.
    saver.copy_thread("source", "copy")
    assert len(list(saver.list(copied))) == len(list(saver.list(source)))
    # A copy is a view of its source: what is forgotten there is gone from the copy too.
    saver.delete_thread("source")
    assert list(saver.list(copied)) == []


def test_an_agents_fork_is_the_items_one_read_saw_even_with_a_summary_and_a_late_append(
    server: Server,
) -> None:
    """The cut is made in the context view's order: a record another handle appended while
    a compaction ran sorts before the summary in the log, after it in the view."""

    async def run() -> None:
        session = CtxlogSession("compacted", server.url)
        other = CtxlogSession("compacted", server.url)
        await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(3)])

        async def summarize(items: list[object]) -> list[object]:
            await other.add_items([{"role": "user", "content": "late"}])
            return [{"role": "assistant", "content": "summary"}]

        await session.compact(summarize)
        assert [i["content"] for i in await session.get_items()] == ["summary", "late"]
        cut = await session.fork("compacted-retry", before_item=1)
        assert [i["content"] for i in await cut.get_items()] == ["summary"]
        whole = await session.fork("compacted-all")
        assert [i["content"] for i in await whole.get_items()] == ["summary", "late"]
        with pytest.raises(ValueError):
            await session.fork("compacted-none", before_item=-1)
        with pytest.raises(ValueError):
            await session.fork("compacted-retry")  # holds records (inherited) already
        for s in (session, other, cut, whole):
            await s.close()

    asyncio.run(run())


def test_an_agents_session_forks_before_an_item_and_pops_in_the_fork_only(server: Server) -> None:
    async def run() -> None:
        session = CtxlogSession("conv", server.url)
        await session.add_items([{"role": "user", "content": f"m{i}"} for i in range(4)])
        retry = await session.fork("conv-retry", before_item=2)
        assert [i["content"] for i in await retry.get_items()] == ["m0", "m1"]
        await retry.add_items([{"role": "user", "content": "again"}])
        assert [i["content"] for i in await retry.get_items()] == ["m0", "m1", "again"]
        assert await retry.pop_item() == {"role": "user", "content": "again"}
        assert await retry.pop_item() == {"role": "user", "content": "m1"}
        await retry.clear_session()
        assert await retry.get_items() == []
        parent = [i["content"] for i in await session.get_items()]
        assert parent == ["m0", "m1", "m2", "m3"], "the fork's pops reached its parent"
        await session.close()
        await retry.close()

    asyncio.run(run())
