"""The LangGraph checkpointer over ctxlog: the published conformance suite in full, and a
thread advanced from one checkpoint by two processes, which a plain saver forks silently
and ctxlog reports as a conflict."""

from __future__ import annotations

import asyncio
import operator
from collections.abc import AsyncGenerator
from typing import Annotated, Any, TypedDict

import httpx
import pytest
from conftest import AsyncLosesFirstAnswer, LosesFirstAnswer, Server, start
from langgraph.channels.delta import DeltaChannel  # noqa: E402
from langgraph.checkpoint.base import empty_checkpoint  # noqa: E402
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402

import ctxlog  # noqa: E402
from ctxlog.langgraph import CtxlogSaver  # noqa: E402


# On SQLite only: the suite drives the saver through HTTP, whose answers are the same on every
# backend (the Rust conformance suite proves the server's backends alike); on Lance over the
# loopback S3 server it took over two minutes, the price of a whole serve soak.
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
async def test_the_conformance_suite_passes(server: Server) -> None:
    @checkpointer_test(name="CtxlogSaver")
    async def factory() -> AsyncGenerator[CtxlogSaver, None]:
        yield CtxlogSaver(server.url)

    report = await validate(factory)
    report.print_report()
    failures = {cap: r.failures for cap, r in report.results.items() if r.passed is False}
    assert report.passed_all_base(), failures
    assert not failures, failures
    # The saver implements every capability, base and extended: each must be detected and
    # pass. One the suite skipped (`passed is None`, e.g. a method that went missing) fails
    # here as a failed one does.
    not_passed = {
        cap.value: None if r is None else (r.detected, r.passed, r.tests_skipped)
        for cap in ALL_CAPABILITIES
        if (r := report.results.get(cap.value)) is None or r.passed is not True
    }
    assert not not_passed, (
        f"capabilities not passed (detected, passed, tests skipped): {not_passed}"
    )


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
import sys
from langgraph.checkpoint.base import create_checkpoint
from ctxlog.langgraph import CtxlogSaver

url, name = sys.argv[1:]
saver = CtxlogSaver(url)
head = saver.get_tuple({"configurable": {"thread_id": "lineage", "checkpoint_ns": ""}})
print("read", flush=True)
sys.stdin.readline()
step = head.metadata["step"] + 1
checkpoint = create_checkpoint(head.checkpoint, None, step)
saver.put(head.config, checkpoint, {"source": "loop", "step": step, "writer": name}, {})
print(checkpoint["id"], flush=True)
"""


def test_reads_follow_the_first_writer_s_lineage_from_two_processes(
    store: str, servers: list[Server]
) -> None:
    """Two processes read the thread's head, then each advances it (through two replicas,
    one after the other): the thread keeps the first writer's lineage, in both, though the
    second's checkpoint is newer; a conflict says so; the second's stays readable by id."""
    import subprocess
    import sys

    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    config = {"configurable": {"thread_id": "lineage"}}
    graph(CtxlogSaver(a.url), "a").invoke({"steps": ["start"]}, config)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ADVANCE, url, name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for url, name in ((a.url, "first"), (b.url, "second"))
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "read\n"
        made = []
        for p in procs:
            out, _ = p.communicate("go\n", timeout=120)
            assert p.returncode == 0
            made.append(out.strip())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    first, second = made
    assert second > first  # time-ordered ids: the second branch is the newer
    for url in (a.url, b.url):
        saver = CtxlogSaver(url)
        latest = saver.get_tuple(config)  # type: ignore[arg-type]
        assert latest is not None and latest.checkpoint["id"] == first, url
        assert latest.metadata["writer"] == "first"
        assert saver.forks(), "two runs advanced one checkpoint and no conflict says so"
        pinned = {
            "configurable": {"thread_id": "lineage", "checkpoint_ns": "", "checkpoint_id": second}
        }
        assert saver.get_tuple(pinned) is not None  # type: ignore[arg-type]


def test_a_fork_from_an_older_checkpoint_is_the_thread_s_latest(server: Server) -> None:
    """LangGraph's time travel: resuming from a checkpoint that was advanced already is a
    deliberate fork; the new branch is the thread's latest, and no conflict is reported."""
    saver = CtxlogSaver(server.url)
    config = {"configurable": {"thread_id": "travel"}}
    g = graph(saver, "a")
    g.invoke({"steps": ["one"]}, config)
    head = saver.get_tuple(config)  # type: ignore[arg-type]
    assert head is not None
    g.invoke({"steps": ["two"]}, config)
    assert g.invoke({"steps": ["fork"]}, head.config)["steps"] == ["one", "a", "fork", "a"]
    assert g.get_state(config).values["steps"] == ["one", "a", "fork", "a"]  # type: ignore[arg-type]
    assert not saver.forks()


def test_a_put_whose_answer_was_lost_is_stored_once(server: Server) -> None:
    """The answers of the first POST of a sync put and of an async put are lost after they
    landed: each retry lands nothing new, and the thread holds each checkpoint once, with
    its writes once."""
    loses, aloses = LosesFirstAnswer(), AsyncLosesFirstAnswer()
    saver = CtxlogSaver(
        server.url,
        client=ctxlog.Client(
            server.url, http=httpx.Client(base_url=server.url, transport=loses, timeout=30)
        ),
        aclient=ctxlog.AsyncClient(
            server.url, http=httpx.AsyncClient(base_url=server.url, transport=aloses, timeout=30)
        ),
    )
    config: Any = {"configurable": {"thread_id": "lost", "checkpoint_ns": ""}}
    first = empty_checkpoint()
    stored = saver.put(config, first, {"step": 0}, {})
    assert loses.lost == 1
    saver.put_writes(stored, [("steps", ["a"])], "task-1")
    second = empty_checkpoint()
    asyncio.run(saver.aput(stored, second, {"step": 1}, {}))
    assert aloses.lost == 1
    history = list(saver.list(config))
    assert [h.checkpoint["id"] for h in history] == [second["id"], first["id"]]
    [one] = [h for h in history if h.checkpoint["id"] == first["id"]]
    assert [(task, channel, value) for task, channel, value in one.pending_writes or []] == [
        ("task-1", "steps", ["a"])
    ]
