"""The LangGraph checkpointer over ctxlog: the published conformance suite in full, and a
thread advanced from one checkpoint by two processes, which a plain saver forks silently
and ctxlog reports as a conflict."""

from __future__ import annotations

import operator
from collections.abc import AsyncGenerator
from typing import Annotated, TypedDict

import pytest
from conftest import Server, start

pytest.importorskip("langgraph")

from langgraph.channels.delta import DeltaChannel  # noqa: E402
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

from ctxlog.langgraph import CtxlogSaver  # noqa: E402


async def test_the_conformance_suite_passes(server: Server) -> None:
    @checkpointer_test(name="CtxlogSaver")
    async def factory() -> AsyncGenerator[CtxlogSaver, None]:
        yield CtxlogSaver(server.url)

    report = await validate(factory)
    report.print_report()
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is False}
    assert report.passed_all_base(), failures
    assert not failures, failures


class State(TypedDict):
    steps: Annotated[list[str], operator.add]


def graph(saver: CtxlogSaver, name: str):  # type: ignore[no-untyped-def]
    g = StateGraph(State)
    g.add_node("step", lambda s: {"steps": [name]})
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g.compile(checkpointer=saver)


def test_a_graph_run_and_resumed(server: Server) -> None:
    saver = CtxlogSaver(server.url)
    config = {"configurable": {"thread_id": "run-1"}}
    g = graph(saver, "a")
    assert g.invoke({"steps": ["start"]}, config)["steps"] == ["start", "a"]
    assert g.invoke({"steps": ["again"]}, config)["steps"] == ["start", "a", "again", "a"]
    history = list(saver.list(config))
    assert len(history) >= 4 and history[0].config["configurable"]["checkpoint_id"] == max(
        h.config["configurable"]["checkpoint_id"] for h in history
    )


def test_two_processes_advancing_one_thread_leave_a_conflict(
    store: str, servers: list[Server]
) -> None:
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    sa, sb = CtxlogSaver(a.url), CtxlogSaver(b.url)
    config = {"configurable": {"thread_id": "shared"}}
    graph(sa, "a").invoke({"steps": ["start"]}, config)
    # Both processes read the same latest checkpoint, then each advances the thread from it.
    head = sa.get_tuple(config)
    assert head is not None and sb.get_tuple(config) == head
    pinned = head.config
    graph(sa, "a").invoke({"steps": ["from a"]}, pinned)
    graph(sb, "b").invoke({"steps": ["from b"]}, pinned)
    forks = sa.forks()
    assert forks, "two runs advanced one checkpoint and no conflict says so"
    assert all(f["id"].startswith("next:shared:") for f in forks)


def _concat(state: list[str] | None, writes: list[list[str]]) -> list[str]:
    return (state or []) + [x for w in writes for x in w]


class DeltaState(TypedDict):
    steps: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def delta_graph(saver: CtxlogSaver):  # type: ignore[no-untyped-def]
    g = StateGraph(DeltaState)
    g.add_node("step", lambda s: {"steps": ["step"]})
    g.add_edge(START, "step")
    g.add_edge("step", END)
    return g.compile(checkpointer=saver)


def test_prune_keeps_what_a_delta_channel_is_rebuilt_from(server: Server) -> None:
    saver = CtxlogSaver(server.url)
    config = {"configurable": {"thread_id": "delta"}}
    g = delta_graph(saver)
    for i in range(4):
        g.invoke({"steps": [f"in{i}"]}, config)
    before = g.get_state(config).values["steps"]
    assert len(before) == 8
    total = len(list(saver.list(config)))
    saver.prune(["delta"], strategy="keep_latest")
    kept = len(list(saver.list(config)))
    # Pruned something, and kept the chain back to the last snapshot of `steps`.
    assert 1 < kept < total, (kept, total)
    assert delta_graph(CtxlogSaver(server.url)).get_state(config).values["steps"] == before
