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


def test_an_empty_checkpoint_id_means_the_latest(server: Server) -> None:
    """As LangGraph's own savers (and this saver's `list()`): `checkpoint_id: ""`."""
    saver = CtxlogSaver(server.url)
    config = {"configurable": {"thread_id": "empty-id"}}
    graph(saver, "a").invoke({"steps": ["start"]}, config)
    latest = saver.get_tuple(config)
    empty = {"configurable": {"thread_id": "empty-id", "checkpoint_ns": "", "checkpoint_id": ""}}
    assert latest is not None and saver.get_tuple(empty) == latest  # type: ignore[arg-type]


async def test_re_putting_a_checkpoint_with_other_content_is_a_conflict(server: Server) -> None:
    """A checkpoint's record is written once (rule 6): a put of an existing checkpoint id
    with other content is refused as `CheckpointConflict` (SqliteSaver would overwrite it;
    this log would keep the first, so the caller is told); the same content again is a
    retry and lands once."""
    from langgraph.checkpoint.base import empty_checkpoint

    from ctxlog.langgraph import CheckpointConflict

    saver = CtxlogSaver(server.url)
    config = {"configurable": {"thread_id": "re-put", "checkpoint_ns": ""}}
    cp = empty_checkpoint()
    saver.put(config, cp, {"step": 0}, {})  # type: ignore[arg-type]
    saver.put(config, cp, {"step": 0}, {})  # type: ignore[arg-type]
    changed = {**cp, "channel_values": {"steps": ["other"]}}
    with pytest.raises(CheckpointConflict) as e:
        saver.put(config, changed, {"step": 0}, {})  # type: ignore[arg-type]
    assert e.value.checkpoint_id == cp["id"]
    with pytest.raises(CheckpointConflict):
        await saver.aput(config, changed, {"step": 0}, {})  # type: ignore[arg-type]
    got = saver.get_tuple({"configurable": {**config["configurable"], "checkpoint_id": cp["id"]}})  # type: ignore[arg-type]
    assert got is not None and got.checkpoint["channel_values"] == {}
    assert len(list(saver.list(config))) == 1  # type: ignore[arg-type]


ADVANCE = """
import operator, sys
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph
from ctxlog.langgraph import CtxlogSaver

class State(TypedDict):
    steps: Annotated[list[str], operator.add]

url, name, checkpoint_id = sys.argv[1:]
g = StateGraph(State)
g.add_node("step", lambda s: {"steps": [name]})
g.add_edge(START, "step")
g.add_edge("step", END)
config = {"configurable": {"thread_id": "lineage", "checkpoint_ns": "",
                           "checkpoint_id": checkpoint_id}}
g.compile(checkpointer=CtxlogSaver(url)).invoke({"steps": ["from " + name]}, config)
"""


def test_reads_follow_the_first_writer_s_lineage_from_two_processes(
    store: str, servers: list[Server]
) -> None:
    """Two processes advance one checkpoint, one after the other (through two replicas):
    the thread keeps the first writer's lineage, whichever branch is newer, in both."""
    import subprocess
    import sys

    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    config = {"configurable": {"thread_id": "lineage"}}
    graph(CtxlogSaver(a.url), "a").invoke({"steps": ["start"]}, config)
    head = CtxlogSaver(a.url).get_tuple(config)  # type: ignore[arg-type]
    assert head is not None
    pinned = head.config["configurable"]["checkpoint_id"]
    for url, name in ((a.url, "first"), (b.url, "second")):
        subprocess.run([sys.executable, "-c", ADVANCE, url, name, pinned], check=True, timeout=120)
    for url in (a.url, b.url):
        saver = CtxlogSaver(url)
        assert saver.forks(), "two runs advanced one checkpoint and no conflict says so"
        state = graph(saver, "x").get_state(config)  # type: ignore[arg-type]
        assert state.values["steps"] == ["start", "a", "from first", "first"], url
