"""A LangGraph checkpointer backed by ctxlog (`pip install "ctxlog[langgraph]"`).

```python
from ctxlog.langgraph import CtxlogSaver

graph = builder.compile(checkpointer=CtxlogSaver("http://127.0.0.1:7070"))
graph.invoke(inputs, {"configurable": {"thread_id": "t-1"}})
```

Without a server: `CtxlogSaver.local("agents.db")` runs one as a child of this process
(`ctxlog.LocalServer`), stopped by `saver.close()` (or `await saver.aclose()`, or leaving a
`with` block), at exit, or when the process dies.

A thread is a ctxlog session (of bot `bot`, default `langgraph`); every checkpoint and every
pending write is a record with an id of its own, derived from what it is — so a retried `put`
or `put_writes` counts once, and two processes cannot silently fork a thread:

- `cp:{thread}:{ns}:{checkpoint_id}` — the checkpoint (serialized with the saver's serde),
  its metadata and its parent.
- `next:{thread}:{ns}:{parent_id}` — which checkpoint follows `parent_id`. Two runs that
  advance one thread from the same checkpoint in two processes write this id with different
  content: the log keeps the first (rule 6) and reports a `divergent_put` conflict, where a
  plain database would fork the thread without a word. `CtxlogSaver.forks()` lists them.
  The thread keeps the first writer's lineage: its latest checkpoint (`get_tuple` without
  an id, or with `checkpoint_id: ""`) is the newest one whose every ancestor is the one its
  parent's `next:` record names (or a deliberate fork, below), so the branch of the run
  that lost stays readable by id and in `list()`, but is never the thread's latest, however
  new.
- `fork:{thread}:{ns}:{parent_id}:{checkpoint_id}` — a deliberate fork: a put whose parent
  this saver read (by `get_tuple` or `list`) when it had a successor already (LangGraph's
  time travel: a replay, or `update_state`, from an older checkpoint). A writer that read
  its parent as the thread's head and advanced it writes `next:` (and loses to an earlier
  one); one that knew its parent had a successor branches on purpose, and the new branch is
  the thread's latest, as in LangGraph's own savers. (What a saver read is kept per
  process: a put from a parent this object never read counts as an advance.)
- `w:{thread}:{ns}:{checkpoint_id}:{task_id}:{idx}` — a pending write (the first of an id
  wins, as in LangGraph's own savers); special writes (errors, interrupts; negative idx)
  are replaced by later ones, so theirs carry a unique suffix and the newest is used.

A checkpoint is written once. `put` of a checkpoint id the thread holds with other content
(LangGraph's `SqliteSaver` would overwrite it; this log would keep the first) raises
`CheckpointConflict` and writes nothing; the same content again is a retry and lands once.
(Two processes that put one id with two contents at the very same time both pass that
check: the log keeps the first and reports a `divergent_put` of the `cp:` id.)

`delete_thread` tombstones every record of the thread (final; `purge` then erases them).
The extended capabilities are there too: `copy_thread` is a fork of the thread's session
(contract rule 25: two records in one batch, whatever the thread's length): the copy is a view
of the source as it was, so what is later forgotten in the source (`delete_thread`, `prune`)
is gone from its copies too, while what is forgotten in a copy (hidden there, not tombstoned)
stays in the source; `prune` tombstones all but each namespace's
latest checkpoint — keeping, for channels whose values live in earlier checkpoints (LangGraph's
`DeltaChannel`), every ancestor back to the one that holds them — and `delete_for_runs`
tombstones a run's checkpoints, their writes and their lineage. `delete_for_runs` reads every
thread of the bot (the run id is in checkpoint metadata, which ctxlog does not index).
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import json
import os
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from ._async_client import AsyncClient
from ._client import Client
from ._errors import CtxlogError
from ._ids import new_id
from ._local import LocalServer, owning
from ._types import Record

CONTENT_TYPE = "application/vnd.langgraph.checkpoint+json"
LINEAGE_TYPE = "application/json"
# A copy of a thread (`copy_thread`) is a fork of its session (contract rule 25): this
# record, written in one batch with the fork, names the fork record's id; and one written in
# one batch with hides (what `prune` and `delete_for_runs` leave out of a copy only) names
# those: so that `delete_thread` ends every link of the thread too, which a session view
# does not show.
COPY_TYPE = "application/vnd.ctxlog.copy"
HIDES_TYPE = "application/vnd.ctxlog.hides"
MAX_BATCH = 5_000
# The checkpoints read whose successors a saver remembers (for telling a fork from an advance).
MAX_READS = 10_000
# A copy's records carry checkpoints: batches are bounded by size too.
MAX_BATCH_TEXT = 8 << 20

_Batch = list[dict[str, Any]]


class CheckpointConflict(CtxlogError):
    """A put of a checkpoint id the thread already holds with other content: refused,
    nothing written (a checkpoint is written once)."""

    def __init__(self, thread_id: str, checkpoint_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} holds checkpoint {checkpoint_id!r} with other content",
            problem={"written": "nothing", "field": "checkpoint"},
        )
        self.thread_id = thread_id
        self.checkpoint_id = checkpoint_id


def _pack(typed: tuple[str, bytes]) -> dict[str, str]:
    return {"t": typed[0], "b": base64.b64encode(typed[1]).decode()}


def _unpack(v: dict[str, str]) -> tuple[str, bytes]:
    return v["t"], base64.b64decode(v["b"])


class _Thread:
    """What one thread's records say, read once."""

    def __init__(self, records: list[Record]) -> None:
        # ns -> checkpoint id -> body
        self.checkpoints: dict[str, dict[str, dict[str, Any]]] = {}
        # (ns, checkpoint id) -> [(task id, idx, order, channel, value, task path)]
        self.writes: dict[tuple[str, str], list[tuple[str, int, int, str, Any, str]]] = {}
        # Every record of the thread this saver wrote, as stored (for copies).
        self.records: list[Record] = []
        # (ns, checkpoint id) -> the ids of its checkpoint, its writes, its lineage record
        self.owned: dict[tuple[str, str], list[str]] = {}
        # (ns, parent id) -> the checkpoint its live `next:` record names
        self.nexts: dict[tuple[str, str], str] = {}
        # (ns, checkpoint id) of deliberate forks
        self.forks: set[tuple[str, str]] = set()
        # The session each record lies in: the thread's own, or one a copy continues.
        self.session_of: dict[str, str] = {}
        # (session, record id) of every link the view's markers name, and of the markers.
        self.links: list[tuple[str, str]] = []
        lineage: list[tuple[str, str, str, bool]] = []
        for order, r in enumerate(records):
            self.session_of[r.id] = r.session_id
            if r.content_type in (COPY_TYPE, HIDES_TYPE) and r.text is not None:
                named = [r.text] if r.content_type == COPY_TYPE else list(json.loads(r.text))
                self.links.extend((r.session_id, rid) for rid in [*named, r.id])
                continue
            if r.role == "lineage" and r.content_type == LINEAGE_TYPE and r.text is not None:
                self.records.append(r)
                link = json.loads(r.text)
                lineage.append((r.id, link["parent"], link["next"], bool(link.get("fork"))))
                continue
            if r.content_type != CONTENT_TYPE or r.text is None:
                continue
            self.records.append(r)
            body = json.loads(r.text)
            if body["kind"] == "checkpoint":
                self.checkpoints.setdefault(body["ns"], {})[body["id"]] = body
                self.owned.setdefault((body["ns"], body["id"]), []).append(r.id)
            elif body["kind"] == "write":
                key = (body["ns"], body["checkpoint_id"])
                self.owned.setdefault(key, []).append(r.id)
                self.writes.setdefault(key, []).append(
                    (
                        body["task_id"],
                        body["idx"],
                        order,
                        body["channel"],
                        body["value"],
                        body.get("task_path", ""),
                    )
                )
        # A lineage record (`next:` or `fork:`) belongs to the checkpoint it names as next.
        for rid, parent, nxt, fork in lineage:
            target = self.find(nxt)
            if target is not None:
                self.owned.setdefault(target, []).append(rid)
                if fork:
                    self.forks.add(target)
                else:
                    self.nexts[(target[0], parent)] = nxt

    def advanced(self, ns: str, cid: str) -> bool:
        """Whether any checkpoint of the thread follows `cid`."""
        return any(body.get("parent") == cid for body in self.checkpoints.get(ns, {}).values())

    def latest(self, ns: str) -> str | None:
        """The newest checkpoint of `ns` on the first writer's lineage: every ancestor of
        it (as far as they are stored) is the checkpoint its parent's `next:` names."""
        cps = self.checkpoints.get(ns, {})
        on: dict[str, bool] = {}
        for cid in cps:
            chain: list[str] = []
            at: str | None = cid
            ok = True
            while at is not None and at in cps and at not in on:
                chain.append(at)
                parent = cps[at].get("parent")
                forked = (ns, at) in self.forks
                if parent and not forked and self.nexts.get((ns, parent), at) != at:
                    ok = False
                    break
                at = parent
            if ok and at is not None and at in on:
                ok = on[at]
            for c in chain:
                on[c] = ok
        kept = [cid for cid, ok in on.items() if ok]
        return max(kept) if kept else None

    def pending(self, ns: str, checkpoint_id: str) -> list[tuple[str, str, dict[str, str]]]:
        """The pending writes of a checkpoint: per (task, idx) the first (idx ≥ 0) or the
        newest (special writes), in LangGraph's order."""
        chosen: dict[tuple[str, int], tuple[str, int, int, str, Any, str]] = {}
        for w in self.writes.get((ns, checkpoint_id), []):
            key = (w[0], w[1])
            if key not in chosen or w[1] < 0:
                chosen[key] = w
        ordered = sorted(chosen.values(), key=lambda w: (w[5], w[0], w[1]))
        return [(w[0], w[3], w[4]) for w in ordered]

    @property
    def record_ids(self) -> list[str]:
        """Every record of the thread this saver wrote."""
        return [r.id for r in self.records]

    def own_ids(self, thread_id: str) -> list[str]:
        """Every record this saver wrote in the thread itself, its links (a copy's fork,
        hides) and their markers: what ends the thread without touching a thread it was
        copied from."""
        own = [r.id for r in self.records if r.session_id == thread_id]
        return own + [rid for session, rid in self.links if session == thread_id]

    def find(self, cid: str) -> tuple[str, str] | None:
        """The (ns, id) of checkpoint `cid`."""
        for ns, cps in self.checkpoints.items():
            if cid in cps:
                return ns, cid
        return None


class CtxlogSaver(BaseCheckpointSaver[str]):
    """LangGraph's `BaseCheckpointSaver` over ctxlog, sync and async."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        bot: str = "langgraph",
        client: Client | None = None,
        aclient: AsyncClient | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.bot = bot
        # (thread, ns, checkpoint id) -> whether it had a successor when this saver read it:
        # a put from it is then a deliberate fork (see the module docs).
        self._reads: OrderedDict[tuple[str, str, str], bool] = OrderedDict()
        self._reads_lock = threading.Lock()
        self.client = client or Client(url, token=token)
        self.aclient = aclient or AsyncClient(url, token=token)
        # What `close()` closes: the clients made here (a client given is the caller's),
        # and the local replica of `local()`.
        self._owns_client, self._owns_aclient = client is None, aclient is None
        self._server: LocalServer | None = None

    @classmethod
    def local(
        cls,
        store: str | os.PathLike[str],
        writer: str | None = None,
        *,
        bot: str = "langgraph",
        **kwargs: Any,
    ) -> CtxlogSaver:
        """A saver over a local replica of `store` that it owns (`ctxlog.LocalServer`: a
        plain path is a SQLite file, whose writer id `local-N` is picked when not given),
        stopped by `close()` / `aclose()`. `kwargs` are `BaseCheckpointSaver`'s (`serde`).
        Blocks while the server starts (a fraction of a second for a SQLite file)."""
        saver, server = owning(
            store, writer, lambda url, token: cls(url, bot=bot, token=token, **kwargs)
        )
        saver._server = server
        return saver

    @property
    def server(self) -> LocalServer | None:
        """The local replica this saver owns (`CtxlogSaver.local`), if any."""
        return self._server

    def close(self) -> None:
        """Close the clients this saver made and stop the local replica it owns (if any).
        Idempotent. The async client's connections are closed here only outside a running
        loop (those of loops that ended are dropped anyway): in async code, `aclose()`."""
        try:
            if self._owns_client:
                self.client.close()
            if self._owns_aclient:
                try:
                    asyncio.get_running_loop()
                except RuntimeError:
                    asyncio.run(self.aclient.close())
        finally:
            if self._server is not None:
                self._server.stop()

    async def aclose(self) -> None:
        """`close()` from async code: the local replica is stopped on a worker thread."""
        try:
            if self._owns_aclient:
                await self.aclient.close()
            if self._owns_client:
                self.client.close()
        finally:
            if self._server is not None:
                await asyncio.to_thread(self._server.stop)

    def __enter__(self) -> CtxlogSaver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> CtxlogSaver:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- what sync and async share -------------------------------------------------------

    def _tuple(self, t: _Thread, thread_id: str, ns: str, cid: str) -> CheckpointTuple:
        body = t.checkpoints[ns][cid]
        checkpoint: Checkpoint = self.serde.loads_typed(_unpack(body["checkpoint"]))
        metadata: CheckpointMetadata = self.serde.loads_typed(_unpack(body["metadata"]))
        parent = body.get("parent")
        return CheckpointTuple(
            config={
                "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
            },
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=(
                {
                    "configurable": {
                        "thread_id": thread_id,
                        "checkpoint_ns": ns,
                        "checkpoint_id": parent,
                    }
                }
                if parent
                else None
            ),
            pending_writes=[
                (task, channel, self.serde.loads_typed(_unpack(v)))
                for task, channel, v in t.pending(ns, cid)
            ],
        )

    def _get(self, t: _Thread, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        cps = t.checkpoints.get(ns, {})
        # An empty id is "the latest", as in LangGraph's own savers and in `list()`.
        cid = get_checkpoint_id(config) or t.latest(ns)
        if cid is None or cid not in cps:
            return None
        self._read(t, thread_id, ns, cid)
        return self._tuple(t, thread_id, ns, cid)

    def _read(self, t: _Thread, thread_id: str, ns: str, cid: str) -> None:
        """Remember whether checkpoint `cid` had a successor when it was read (a put from it
        is then a deliberate fork; see the module docs)."""
        with self._reads_lock:
            self._reads[(thread_id, ns, cid)] = t.advanced(ns, cid)
            self._reads.move_to_end((thread_id, ns, cid))
            while len(self._reads) > MAX_READS:
                self._reads.popitem(last=False)

    def _select(
        self,
        threads: dict[str, _Thread],
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> list[CheckpointTuple]:
        want_ns = config["configurable"].get("checkpoint_ns") if config else None
        want_id = get_checkpoint_id(config) if config else None
        before_id = get_checkpoint_id(before) if before else None
        out: list[CheckpointTuple] = []
        for thread_id, t in threads.items():
            for ns, cps in t.checkpoints.items():
                if want_ns is not None and ns != want_ns:
                    continue
                for cid in sorted(cps, reverse=True):
                    if want_id and cid != want_id:
                        continue
                    if before_id and cid >= before_id:
                        continue
                    tup = self._tuple(t, thread_id, ns, cid)
                    if filter and not all(tup.metadata.get(k) == v for k, v in filter.items()):
                        continue
                    if limit is not None and len(out) >= limit:
                        return out
                    self._read(t, thread_id, ns, cid)
                    out.append(tup)
        return out

    def _put_records(
        self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> tuple[list[dict[str, Any]], RunnableConfig]:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        parent = config["configurable"].get("checkpoint_id")
        cid = checkpoint["id"]
        body = {
            "kind": "checkpoint",
            "ns": ns,
            "id": cid,
            "parent": parent,
            "checkpoint": _pack(self.serde.dumps_typed(checkpoint)),
            "metadata": _pack(self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))),
        }
        records = [
            {
                "id": f"cp:{thread_id}:{ns}:{cid}",
                "role": "checkpoint",
                "content_type": CONTENT_TYPE,
                "text": json.dumps(body),
            }
        ]
        if parent:
            with self._reads_lock:
                fork = self._reads.get((thread_id, ns, parent), False)
            link: dict[str, Any] = {"parent": parent, "next": cid}
            if fork:
                link["fork"] = True
            records.append(
                {
                    "id": (
                        f"fork:{thread_id}:{ns}:{parent}:{cid}"
                        if fork
                        else f"next:{thread_id}:{ns}:{parent}"
                    ),
                    "role": "lineage",
                    "content_type": LINEAGE_TYPE,
                    "text": json.dumps(link),
                }
            )
        return records, {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
        }

    @staticmethod
    def _check_put(record: dict[str, Any], stored: Record | None, config: RunnableConfig) -> None:
        """Refuse a put of a checkpoint the thread holds with other content (see the module
        docs); the same content is a retry."""
        if stored is None or stored.text == record["text"]:
            return
        if json.loads(stored.text or "{}") == json.loads(record["text"]):
            return
        raise CheckpointConflict(
            config["configurable"]["thread_id"], json.loads(record["text"])["id"]
        )

    def _write_records(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> list[dict[str, Any]]:
        thread_id = config["configurable"]["thread_id"]
        ns = config["configurable"].get("checkpoint_ns", "")
        cid = config["configurable"]["checkpoint_id"]
        out = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            rid = f"w:{thread_id}:{ns}:{cid}:{task_id}:{idx}"
            if idx < 0:
                rid += f":{new_id()}"
            body = {
                "kind": "write",
                "ns": ns,
                "checkpoint_id": cid,
                "task_id": task_id,
                "idx": idx,
                "channel": channel,
                "task_path": task_path,
                "value": _pack(self.serde.dumps_typed(value)),
            }
            out.append(
                {"id": rid, "role": "write", "content_type": CONTENT_TYPE, "text": json.dumps(body)}
            )
        return out

    @staticmethod
    def _batches(records: builtins.list[dict[str, Any]]) -> builtins.list[_Batch]:
        """`records` in batches the server takes: bounded in count and in text size."""
        out: builtins.list[_Batch] = []
        size = 0
        for r in records:
            n = len(r.get("text") or "")
            if not out or len(out[-1]) >= MAX_BATCH or (out[-1] and size + n > MAX_BATCH_TEXT):
                out.append([])
                size = 0
            out[-1].append(r)
            size += n
        return out

    @classmethod
    def _tombstones(cls, ids: builtins.list[str]) -> builtins.list[_Batch]:
        return cls._batches([{"id": rid, "role": "checkpoint", "kind": "tombstone"} for rid in ids])

    @classmethod
    def _forget(cls, t: _Thread, thread_id: str, ids: builtins.list[str]) -> builtins.list[_Batch]:
        """Records of `ids` gone from the thread: its own tombstoned, those a copy continues
        (contract rule 25) hidden in this thread only (a tombstone would end them in the
        thread they were copied from too)."""
        out: builtins.list[dict[str, Any]] = []
        for rid in ids:
            if t.session_of.get(rid, thread_id) == thread_id:
                out.append({"id": rid, "role": "checkpoint", "kind": "tombstone"})
            else:
                out.append({"id": new_id(), "role": "hide", "kind": "hide", "text": rid})
        batches = cls._batches(out)
        # Each batch with hides names them in a marker of its own, in the same batch.
        for batch in batches:
            hides = [r["id"] for r in batch if r["kind"] == "hide"]
            if hides:
                batch.append(
                    {
                        "id": new_id(),
                        "role": "lineage",
                        "content_type": HIDES_TYPE,
                        "text": json.dumps(hides),
                    }
                )
        return batches

    @staticmethod
    def _copy_batch(source: str, target: str, position: str) -> builtins.list[dict[str, Any]]:
        """One atomic batch: the fork of `source` as of `position` into `target`, and the
        marker that names it."""
        fork_id = f"fork:{target}:{new_id()}"
        return [
            {"id": fork_id, "kind": "fork", "role": "fork", "text": source, "covers": position},
            {
                "id": f"copy:{target}:{new_id()}",
                "role": "lineage",
                "content_type": COPY_TYPE,
                "text": fork_id,
            },
        ]

    def _pruned(self, t: _Thread, strategy: str) -> builtins.list[str]:
        """The record ids `prune` tombstones in one thread."""
        if strategy == "delete":
            return t.record_ids
        if strategy != "keep_latest":
            raise ValueError(f"unknown prune strategy {strategy!r}: 'keep_latest' or 'delete'")
        keep: set[tuple[str, str]] = set()
        for ns, cps in t.checkpoints.items():
            latest = t.latest(ns) or max(cps)
            # Channels whose value the latest checkpoint does not hold (a `DeltaChannel`
            # between snapshots) are rebuilt from its ancestors and their writes: keep them,
            # back to one that holds the value.
            meta = self.serde.loads_typed(_unpack(cps[latest]["metadata"]))
            need = set(meta.get("counters_since_delta_snapshot") or {})
            cid: str | None = latest
            while cid is not None and cid in cps:
                keep.add((ns, cid))
                checkpoint = self.serde.loads_typed(_unpack(cps[cid]["checkpoint"]))
                need -= set(checkpoint["channel_values"])
                if not need:
                    break
                cid = cps[cid].get("parent")
        return [rid for key, ids in t.owned.items() if key not in keep for rid in ids]

    @staticmethod
    def _of_runs(t: _Thread, run_ids: set[str], serde: Any) -> builtins.list[str]:
        """The record ids of a thread's checkpoints made by one of `run_ids`."""
        out: builtins.list[str] = []
        for ns, cps in t.checkpoints.items():
            for cid, body in cps.items():
                if serde.loads_typed(_unpack(body["metadata"])).get("run_id") in run_ids:
                    out.extend(t.owned.get((ns, cid), []))
        return out

    # ---- sync ------------------------------------------------------------------------------

    def _thread(self, thread_id: str) -> _Thread:
        return _Thread(list(self.client.session(self.bot, thread_id).iter_records()))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._get(self._thread(config["configurable"]["thread_id"]), config)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        if config:
            ids = [config["configurable"]["thread_id"]]
        else:
            ids = [s.session_id for s in self.client.sessions(self.bot)]
        threads = {i: self._thread(i) for i in ids}
        yield from self._select(threads, config, filter, before, limit)

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        records, out = self._put_records(config, checkpoint, metadata)
        self._check_put(records[0], self.client.get(self.bot, records[0]["id"]), config)
        self.client.session(self.bot, config["configurable"]["thread_id"]).append(records)
        return out

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        records = self._write_records(config, writes, task_id, task_path)
        if records:
            self.client.session(self.bot, config["configurable"]["thread_id"]).append(records)

    def delete_thread(self, thread_id: str) -> None:
        self._send(thread_id, self._tombstones(self._thread(thread_id).own_ids(thread_id)))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """The target continues the source as it is now (contract rule 25): two records in
        one batch, whatever the source's length, instead of a copy of each. A copy is a
        view of its source: what is forgotten in the source (`delete_thread`, `prune`) is
        gone from its copies too; what is forgotten in a copy stays in its source."""
        position = self.client.session(self.bot, source_thread_id).records(limit=1).position
        batch = self._copy_batch(source_thread_id, target_thread_id, position)
        self.client.session(self.bot, target_thread_id).append(batch)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            t = self._thread(thread_id)
            self._send(thread_id, self._forget(t, thread_id, self._pruned(t, strategy)))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        if not runs:
            return
        for s in builtins.list(self.client.sessions(self.bot)):
            t = self._thread(s.session_id)
            doomed = self._of_runs(t, runs, self.serde)
            self._send(s.session_id, self._forget(t, s.session_id, doomed))

    def _send(self, thread_id: str, batches: builtins.list[_Batch]) -> None:
        session = self.client.session(self.bot, thread_id)
        for batch in batches:
            session.append(batch)

    # ---- async -----------------------------------------------------------------------------

    async def _athread(self, thread_id: str) -> _Thread:
        session = self.aclient.session(self.bot, thread_id)
        return _Thread([r async for r in session.iter_records()])

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._get(await self._athread(config["configurable"]["thread_id"]), config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        if config:
            ids = [config["configurable"]["thread_id"]]
        else:
            ids = [s.session_id async for s in self.aclient.sessions(self.bot)]
        threads = {i: await self._athread(i) for i in ids}
        for tup in self._select(threads, config, filter, before, limit):
            yield tup

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        records, out = self._put_records(config, checkpoint, metadata)
        stored = await self.aclient.get(self.bot, records[0]["id"])
        self._check_put(records[0], stored, config)
        await self.aclient.session(self.bot, config["configurable"]["thread_id"]).append(records)
        return out

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        records = self._write_records(config, writes, task_id, task_path)
        if records:
            session = self.aclient.session(self.bot, config["configurable"]["thread_id"])
            await session.append(records)

    async def adelete_thread(self, thread_id: str) -> None:
        t = await self._athread(thread_id)
        await self._asend(thread_id, self._tombstones(t.own_ids(thread_id)))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        source = self.aclient.session(self.bot, source_thread_id)
        position = (await source.records(limit=1)).position
        batch = self._copy_batch(source_thread_id, target_thread_id, position)
        await self.aclient.session(self.bot, target_thread_id).append(batch)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            t = await self._athread(thread_id)
            await self._asend(thread_id, self._forget(t, thread_id, self._pruned(t, strategy)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = set(run_ids)
        if not runs:
            return
        for session_id in [s.session_id async for s in self.aclient.sessions(self.bot)]:
            t = await self._athread(session_id)
            doomed = self._of_runs(t, runs, self.serde)
            await self._asend(session_id, self._forget(t, session_id, doomed))

    async def _asend(self, thread_id: str, batches: builtins.list[_Batch]) -> None:
        session = self.aclient.session(self.bot, thread_id)
        for batch in batches:
            await session.append(batch)

    def get_next_version(self, current: str | None, channel: None) -> str:
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{new_id()}"

    # ---- what ctxlog adds ------------------------------------------------------------------

    def forks(self) -> builtins.list[dict[str, Any]]:
        """Threads advanced twice from one checkpoint (by two processes): the `divergent_put`
        conflicts of `next:` records (admin token). The thread kept the first."""
        conflicts, _ = self.client.conflicts()
        return [
            c
            for c in conflicts
            if c.get("kind") == "divergent_put" and str(c.get("id", "")).startswith("next:")
        ]
