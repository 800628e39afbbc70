# Vendored from the langgraph 1.2.24 sdist (pinned in requirements-test.txt), tests/test_time_travel.py.
# Copyright (c) 2024 LangChain, Inc., MIT License: see LICENSE-langgraph beside this file.
# Changes: only the tests named here were kept (time travel: replays and forks from older
# checkpoints, which a saver must follow as the thread's latest), after the module's
# opening as released; the `sync_checkpointer` / `async_checkpointer` fixtures are the
# ctxlog saver (conftest.py). Test bodies are as released.
"""Tests for time travel (replay and fork) behavior.

Covers the intersection of replay vs fork across graph structures:
- Replay & fork basics (no interrupt, no subgraph)
- Replay & fork with interrupts (no subgraph)
- Multiple / sequential interrupts
- Subgraph without interrupt
- Subgraph with interrupt
- __copy__ / update_state(None)
- Observability (get_state, config access)

Key concepts:
- Replay (invoke with checkpoint_id): Re-executes nodes after the checkpoint.
  Interrupts re-fire on replay.
- Fork (update_state then invoke): Creates a new checkpoint without cached
  pending writes. Nodes re-execute and interrupts DO re-fire.
"""

import operator
from typing import Annotated

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from typing_extensions import TypedDict

from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt


class State(TypedDict):
    value: Annotated[list[str], operator.add]


def _checkpoint_summary(history: list) -> list[dict]:
    """Summarize checkpoint history into a readable format for assertions.

    Returns a list of dicts (newest-first, matching get_state_history order) with:
      - id: short checkpoint id suffix (last 6 chars)
      - parent_id: short parent checkpoint id suffix or None
      - source: checkpoint metadata source (input, loop, fork, update)
      - next: tuple of next node names
      - values: channel values snapshot
    """
    summaries = []
    for s in history:
        cid = s.config["configurable"]["checkpoint_id"]
        pid = (
            s.parent_config["configurable"]["checkpoint_id"]
            if s.parent_config
            else None
        )
        summaries.append(
            {
                "id": cid[-6:],
                "parent_id": pid[-6:] if pid else None,
                "source": s.metadata.get("source"),
                "next": s.next,
                "values": s.values,
            }
        )
    return summaries


# ---------------------------------------------------------------------------
# Section 1: Replay & fork basics (no interrupt, no subgraph)
# ---------------------------------------------------------------------------


def test_replay_from_before_interrupt_then_resume(
    sync_checkpointer: BaseCheckpointSaver,
) -> None:
    """Replay from checkpoint before interrupt node, then resume with a new
    answer and verify the graph completes with the new value.

    Graph: START --> node_a --> ask_human (interrupt) --> node_b --> END

    Original run:
      source=input  next=(__start__,)  values=[]
      source=loop   next=(node_a,)     values=[]
      source=loop   next=(ask_human,)  values=[a]            <-- replay from here
      source=loop   next=(node_b,)     values=[a, human:old_answer]
      source=loop   next=()            values=[a, human:old_answer, b]

    After replay (fork created) + resume with "new_answer":
      source=input  next=(__start__,)  values=[]
      source=loop   next=(node_a,)     values=[]
      source=loop   next=(ask_human,)  values=[a]            <-- branch point
      source=loop   next=(node_b,)     values=[a, human:old_answer]
      source=loop   next=()            values=[a, human:old_answer, b]  (old branch)
      source=fork   next=(ask_human,)  values=[a]            <-- fork from branch point
      source=loop   next=(node_b,)     values=[a, human:new_answer]
      source=loop   next=()            values=[a, human:new_answer, b]  (new branch)
    """

    called: list[str] = []

    def node_a(state: State) -> State:
        called.append("node_a")
        return {"value": ["a"]}

    def ask_human(state: State) -> State:
        called.append("ask_human")
        answer = interrupt("What is your input?")
        return {"value": [f"human:{answer}"]}

    def node_b(state: State) -> State:
        called.append("node_b")
        return {"value": ["b"]}

    graph = (
        StateGraph(State)
        .add_node("node_a", node_a)
        .add_node("ask_human", ask_human)
        .add_node("node_b", node_b)
        .add_edge(START, "node_a")
        .add_edge("node_a", "ask_human")
        .add_edge("ask_human", "node_b")
        .compile(checkpointer=sync_checkpointer)
    )

    config = {"configurable": {"thread_id": "1"}}

    # --- Original run: invoke until interrupt, then resume to complete ---
    graph.invoke({"value": []}, config)
    graph.invoke(Command(resume="old_answer"), config)

    original_history = list(graph.get_state_history(config))
    original = _checkpoint_summary(original_history)
    assert [(s["source"], s["next"], s["values"]) for s in original] == [
        ("loop", (), {"value": ["a", "human:old_answer", "b"]}),
        ("loop", ("node_b",), {"value": ["a", "human:old_answer"]}),
        ("loop", ("ask_human",), {"value": ["a"]}),
        ("loop", ("node_a",), {"value": []}),
        ("input", ("__start__",), {"value": []}),
    ]

    # --- Replay from checkpoint before ask_human ---
    before_ask = next(s for s in original_history if s.next == ("ask_human",))

    called.clear()
    replay_result = graph.invoke(None, before_ask.config)
    assert replay_result["__interrupt__"][0].value == "What is your input?"
    assert "ask_human" in called
    assert "node_a" not in called  # before the replay point, not re-executed

    # A fork checkpoint is now the latest — it branches from the replay point
    post_replay = _checkpoint_summary(list(graph.get_state_history(config)))
    assert [(s["source"], s["next"]) for s in post_replay] == [
        ("fork", ("ask_human",)),  # <-- new fork (latest)
        ("loop", ()),  # original done
        ("loop", ("node_b",)),
        ("loop", ("ask_human",)),  # branch point
        ("loop", ("node_a",)),
        ("input", ("__start__",)),
    ]

    # --- Resume with a new answer ---
    called.clear()
    final_result = graph.invoke(Command(resume="new_answer"), config)
    assert final_result["value"] == ["a", "human:new_answer", "b"]
    assert "ask_human" in called
    assert "node_b" in called

    final = _checkpoint_summary(list(graph.get_state_history(config)))
    assert [(s["source"], s["next"], s["values"]) for s in final] == [
        # New branch (from fork)
        ("loop", (), {"value": ["a", "human:new_answer", "b"]}),
        ("loop", ("node_b",), {"value": ["a", "human:new_answer"]}),
        ("fork", ("ask_human",), {"value": ["a"]}),
        # Original branch (preserved)
        ("loop", (), {"value": ["a", "human:old_answer", "b"]}),
        ("loop", ("node_b",), {"value": ["a", "human:old_answer"]}),
        ("loop", ("ask_human",), {"value": ["a"]}),
        ("loop", ("node_a",), {"value": []}),
        ("input", ("__start__",), {"value": []}),
    ]


def test_replay_creates_branch_preserving_old_checkpoints(
    sync_checkpointer: BaseCheckpointSaver,
) -> None:
    """Replaying from a mid-run checkpoint creates a new branch of checkpoints
    while the original checkpoint sequence is preserved (append-only).

    Original run (newest first):
      C4  next=()          values=[a, b1, c]     parent=C3
      C3  next=(node_c,)   values=[a, b1]        parent=C2
      C2  next=(node_b,)   values=[a]            parent=C1
      C1  next=(node_a,)   values=[]             parent=C0
      C0  next=(__start__,) values={}             parent=None

    After replay from C2 (newest first):
      C6  next=()          values=[a, b2, c]     parent=C5   <- new branch tip
      C5  next=(node_c,)   values=[a, b2]        parent=C2   <- branches from C2
      C4  next=()          values=[a, b1, c]     parent=C3   <- old branch preserved
      C3  next=(node_c,)   values=[a, b1]        parent=C2
      C2  next=(node_b,)   values=[a]            parent=C1
      C1  next=(node_a,)   values=[]             parent=C0
      C0  next=(__start__,) values={}             parent=None
    """

    call_count = 0

    def node_a(state: State) -> State:
        return {"value": ["a"]}

    def node_b(state: State) -> State:
        nonlocal call_count
        call_count += 1
        return {"value": [f"b{call_count}"]}

    def node_c(state: State) -> State:
        return {"value": ["c"]}

    graph = (
        StateGraph(State)
        .add_node("node_a", node_a)
        .add_node("node_b", node_b)
        .add_node("node_c", node_c)
        .add_edge(START, "node_a")
        .add_edge("node_a", "node_b")
        .add_edge("node_b", "node_c")
        .compile(checkpointer=sync_checkpointer)
    )

    config = {"configurable": {"thread_id": "1"}}
    result = graph.invoke({"value": []}, config)
    assert result == {"value": ["a", "b1", "c"]}

    # -- Original checkpoint history (newest first) --
    original_history = list(graph.get_state_history(config))
    original_summary = _checkpoint_summary(original_history)
    assert len(original_summary) == 5
    # Verify the shape: next tuples newest->oldest
    assert [s["next"] for s in original_summary] == [
        (),
        ("node_c",),
        ("node_b",),
        ("node_a",),
        ("__start__",),
    ]
    # Verify values at each checkpoint
    assert [s["values"] for s in original_summary] == [
        {"value": ["a", "b1", "c"]},
        {"value": ["a", "b1"]},
        {"value": ["a"]},
        {"value": []},
        {"value": []},
    ]
    original_ids = {s.config["configurable"]["checkpoint_id"] for s in original_history}

    # Find checkpoint before node_b and replay from it
    before_b = next(s for s in original_history if s.next == ("node_b",))
    before_b_id = before_b.config["configurable"]["checkpoint_id"]
    replay_result = graph.invoke(None, before_b.config)
    assert replay_result == {"value": ["a", "b2", "c"]}

    # -- Post-replay checkpoint history (newest first) --
    post_replay_history = list(graph.get_state_history(config))
    post_summary = _checkpoint_summary(post_replay_history)
    # 5 original + 1 fork + 2 new branch checkpoints = 8
    assert len(post_summary) == 8

    # Verify the full shape after replay
    assert [s["next"] for s in post_summary] == [
        (),  # new branch tip
        ("node_c",),  # new branch
        ("node_b",),  # fork from replay point
        (),  # old branch tip
        ("node_c",),  # old
        ("node_b",),  # branch point (C2)
        ("node_a",),  # old (C1)
        ("__start__",),  # old (C0)
    ]
    assert [s["values"] for s in post_summary] == [
        {"value": ["a", "b2", "c"]},  # new branch tip
        {"value": ["a", "b2"]},  # new: node_b re-ran with call_count=2
        {"value": ["a"]},  # fork from replay point
        {"value": ["a", "b1", "c"]},  # old branch tip preserved
        {"value": ["a", "b1"]},  # old
        {"value": ["a"]},  # branch point
        {"value": []},  # old
        {"value": []},  # old
    ]

    # All original checkpoint IDs still exist (append-only)
    post_ids = {s.config["configurable"]["checkpoint_id"] for s in post_replay_history}
    assert original_ids.issubset(post_ids)

    # New branch's oldest checkpoint parent is the branch point
    new_checkpoints = [
        s
        for s in post_replay_history
        if s.config["configurable"]["checkpoint_id"] not in original_ids
    ]
    oldest_new = sorted(new_checkpoints, key=lambda s: s.created_at)[0]
    assert oldest_new.parent_config is not None
    assert oldest_new.parent_config["configurable"]["checkpoint_id"] == before_b_id

    # get_state returns the new branch tip
    latest = graph.get_state(config)
    assert latest.values == {"value": ["a", "b2", "c"]}
    assert latest.config["configurable"]["checkpoint_id"] not in original_ids


def test_fork_creates_branch_preserving_old_checkpoints(
    sync_checkpointer: BaseCheckpointSaver,
) -> None:
    """Forking (update_state + invoke) from a mid-run checkpoint creates a new
    branch of checkpoints while the original sequence is preserved.

    Original run (newest first):
      C4  next=()          values=[a, b1, c]     parent=C3
      C3  next=(node_c,)   values=[a, b1]        parent=C2
      C2  next=(node_b,)   values=[a]            parent=C1
      C1  next=(node_a,)   values=[]             parent=C0
      C0  next=(__start__,) values={}             parent=None

    After fork from C2 with update {"value": ["x"]} (newest first):
      C7  next=()          values=[a, x, b2, c]  parent=C6
      C6  next=(node_c,)   values=[a, x, b2]     parent=C5
      C5  next=(node_b,)   values=[a, x]         parent=C2   <- fork checkpoint
      C4  next=()          values=[a, b1, c]     parent=C3   <- old branch preserved
      C3  next=(node_c,)   values=[a, b1]        parent=C2
      C2  next=(node_b,)   values=[a]            parent=C1   <- fork point
      C1  next=(node_a,)   values=[]             parent=C0
      C0  next=(__start__,) values={}             parent=None
    """

    call_count = 0

    def node_a(state: State) -> State:
        return {"value": ["a"]}

    def node_b(state: State) -> State:
        nonlocal call_count
        call_count += 1
        return {"value": [f"b{call_count}"]}

    def node_c(state: State) -> State:
        return {"value": ["c"]}

    graph = (
        StateGraph(State)
        .add_node("node_a", node_a)
        .add_node("node_b", node_b)
        .add_node("node_c", node_c)
        .add_edge(START, "node_a")
        .add_edge("node_a", "node_b")
        .add_edge("node_b", "node_c")
        .compile(checkpointer=sync_checkpointer)
    )

    config = {"configurable": {"thread_id": "1"}}
    result = graph.invoke({"value": []}, config)
    assert result == {"value": ["a", "b1", "c"]}

    # -- Original checkpoint history (newest first) --
    original_history = list(graph.get_state_history(config))
    original_summary = _checkpoint_summary(original_history)
    assert len(original_summary) == 5
    assert [s["next"] for s in original_summary] == [
        (),
        ("node_c",),
        ("node_b",),
        ("node_a",),
        ("__start__",),
    ]
    assert [s["values"] for s in original_summary] == [
        {"value": ["a", "b1", "c"]},
        {"value": ["a", "b1"]},
        {"value": ["a"]},
        {"value": []},
        {"value": []},
    ]
    original_ids = {s.config["configurable"]["checkpoint_id"] for s in original_history}

    # Fork from before node_b with modified state
    before_b = next(s for s in original_history if s.next == ("node_b",))
    before_b_id = before_b.config["configurable"]["checkpoint_id"]
    fork_config = graph.update_state(before_b.config, {"value": ["x"]})
    fork_result = graph.invoke(None, fork_config)
    assert fork_result == {"value": ["a", "x", "b2", "c"]}

    # -- Post-fork checkpoint history (newest first) --
    post_fork_history = list(graph.get_state_history(config))
    post_summary = _checkpoint_summary(post_fork_history)
    # 5 original + 1 fork checkpoint (update_state) + 2 new nodes (node_b, node_c)
    assert len(post_summary) == 8

    assert [s["next"] for s in post_summary] == [
        (),  # new branch tip (C7)
        ("node_c",),  # new branch (C6)
        ("node_b",),  # fork checkpoint from update_state (C5)
        (),  # old branch tip (C4)
        ("node_c",),  # old (C3)
        ("node_b",),  # fork point (C2)
        ("node_a",),  # old (C1)
        ("__start__",),  # old (C0)
    ]
    assert [s["values"] for s in post_summary] == [
        {"value": ["a", "x", "b2", "c"]},  # new branch tip
        {"value": ["a", "x", "b2"]},  # new: node_b re-ran
        {"value": ["a", "x"]},  # fork: state updated with "x"
        {"value": ["a", "b1", "c"]},  # old branch tip preserved
        {"value": ["a", "b1"]},  # old
        {"value": ["a"]},  # fork point
        {"value": []},  # old
        {"value": []},  # old
    ]

    # All original checkpoint IDs still exist (append-only)
    post_ids = {s.config["configurable"]["checkpoint_id"] for s in post_fork_history}
    assert original_ids.issubset(post_ids)

    # Fork checkpoint's parent is the branch point
    new_checkpoints = [
        s
        for s in post_fork_history
        if s.config["configurable"]["checkpoint_id"] not in original_ids
    ]
    oldest_new = sorted(new_checkpoints, key=lambda s: s.created_at)[0]
    assert oldest_new.parent_config is not None
    assert oldest_new.parent_config["configurable"]["checkpoint_id"] == before_b_id

    # get_state returns the new branch tip
    latest = graph.get_state(config)
    assert latest.values == {"value": ["a", "x", "b2", "c"]}
    assert latest.config["configurable"]["checkpoint_id"] not in original_ids


def test_subgraph_called_in_loop_loads_state_on_replay(
    sync_checkpointer: BaseCheckpointSaver,
) -> None:
    """Parent calls a subgraph node multiple times per invocation via a
    conditional loop. Replay should restore the subgraph's accumulated state
    from the correct point in the parent's timeline."""
    observed: list[tuple[str, dict]] = []

    class SubState(TypedDict):
        sub_trail: Annotated[list[str], operator.add]

    class ParentState(TypedDict):
        counter: int
        results: Annotated[list[str], operator.add]

    def inc(state: ParentState) -> ParentState:
        return {"counter": state["counter"] + 1, "results": [f"inc:{state['counter']}"]}

    def sub_step(state: SubState) -> SubState:
        observed.append(("sub_step", dict(state)))
        return {"sub_trail": ["s"]}

    def should_loop(state: ParentState) -> str:
        return "inc" if state["counter"] < 2 else "__end__"

    sub = (
        StateGraph(SubState)
        .add_node("sub_step", sub_step)
        .add_edge(START, "sub_step")
        .compile(checkpointer=True)
    )

    graph = (
        StateGraph(ParentState)
        .add_node("inc", inc)
        .add_node("sub_node", sub)
        .add_edge(START, "inc")
        .add_edge("inc", "sub_node")
        .add_conditional_edges("sub_node", should_loop, ["inc", "__end__"])
        .compile(checkpointer=sync_checkpointer)
    )

    config = {"configurable": {"thread_id": "1"}}

    # 1st invocation: loop runs inc->sub->inc->sub->end
    # counter goes 0->1->2, subgraph called twice
    graph.invoke({"counter": 0, "results": []}, config)
    assert len(observed) == 2
    assert observed[0] == ("sub_step", {"sub_trail": []})
    assert observed[1] == ("sub_step", {"sub_trail": ["s"]})

    # 2nd invocation: loop runs again, subgraph sees accumulated state
    observed.clear()
    graph.invoke({"counter": 0, "results": []}, config)
    assert len(observed) == 2
    assert observed[0] == ("sub_step", {"sub_trail": ["s", "s"]})
    assert observed[1] == ("sub_step", {"sub_trail": ["s", "s", "s"]})

    # Replay from the START of the 2nd invocation's loop (counter=0).
    # History has two inc checkpoints with counter=0: 2nd invocation's (newer)
    # and 1st invocation's (older). Pick the newer one.
    history = list(graph.get_state_history(config))
    start_of_loop_2nd = [
        s for s in history if s.next == ("inc",) and s.values["counter"] == 0
    ][0]

    observed.clear()
    graph.invoke(None, start_of_loop_2nd.config)

    # Full loop re-runs (2 sub calls). Subgraph loads state from end of
    # 1st invocation (2 × "s"), same as the original 2nd invocation.
    assert len(observed) == 2
    assert observed[0] == ("sub_step", {"sub_trail": ["s", "s"]})
    assert observed[1] == ("sub_step", {"sub_trail": ["s", "s", "s"]})

    # Also test replay from MID-loop (counter=1) in the 2nd invocation.
    # Only one loop iteration remains, and the subgraph should load state
    # that includes the first loop iteration of the 2nd invocation (3 × "s").
    mid_loop_2nd = [
        s for s in history if s.next == ("inc",) and s.values["counter"] == 1
    ][0]

    observed.clear()
    graph.invoke(None, mid_loop_2nd.config)

    assert len(observed) == 1
    assert observed[0] == ("sub_step", {"sub_trail": ["s", "s", "s"]})

