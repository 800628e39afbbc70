"""The OpenAI Agents SDK session over ctxlog: the SDK's own `SQLiteSession` is the
reference (the same operations give the same answers), and the cases that session cannot
handle across processes: two replicas, one session, interleaved and retried writes."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import httpx
from agents import Agent, RunConfig, Runner
from agents.items import ModelResponse
from agents.memory import OpenAIResponsesCompactionSession, Session, SQLiteSession
from agents.models.interface import Model
from agents.usage import Usage
from conftest import Server, spying_client, start
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

import ctxlog
from ctxlog.openai_agents import SUMMARY_CONTENT_TYPE, CtxlogSession


def item(i: int) -> dict[str, object]:
    role = ("user", "assistant")[i % 2]
    return {"role": role, "content": f"message {i}"}


def summarise_now(items: list[Any]) -> list[Any]:
    """A summariser: a note of what it read, and the newest item kept as it is."""
    return [{"role": "assistant", "content": f"summary of {len(items)}"}] + items[-1:]


async def summarise(items: list[Any]) -> list[Any]:
    return summarise_now(items)


async def test_it_answers_as_the_sdk_s_sqlite_session_does(server: Server) -> None:
    ours = CtxlogSession("conv-1", server.url)
    theirs = SQLiteSession("conv-1")
    assert isinstance(ours, Session)
    rng = random.Random(7)
    n = 0
    for step in range(80):
        op = rng.choice(
            ["add", "add", "get", "get_limit", "pop", "compact"] + (["clear"] if step > 60 else [])
        )
        if op == "add":
            batch = [item(n + i) for i in range(rng.randint(0, 3))]
            n += len(batch)
            await ours.add_items(batch)
            await theirs.add_items(batch)
        elif op == "get":
            assert await ours.get_items() == await theirs.get_items(), step
        elif op == "get_limit":
            k = rng.randint(0, 4)
            assert await ours.get_items(limit=k) == await theirs.get_items(limit=k), (step, k)
        elif op == "pop":
            assert await ours.pop_item() == await theirs.pop_item(), step
        elif op == "compact":
            # Ours writes one summary; theirs rewrites its table with the same items.
            summary = await ours.compact(summarise)
            assert summary == summarise_now(await theirs.get_items()), step
            await theirs.clear_session()
            await theirs.add_items(summary)
        else:
            await ours.clear_session()
            await theirs.clear_session()
    assert await ours.get_items() == await theirs.get_items()
    theirs.close()


async def test_two_replicas_one_session_no_loss_no_duplicate(
    store: str, servers: list[Server]
) -> None:
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    sa, sb = CtxlogSession("shared", a.url), CtxlogSession("shared", b.url)

    async def writer(s: CtxlogSession, name: str) -> None:
        for i in range(10):
            await s.add_items([{"role": "user", "content": f"{name}-{i}"}])

    await asyncio.gather(writer(sa, "a"), writer(sb, "b"))
    seen_a, seen_b = await sa.get_items(), await sb.get_items()
    assert seen_a == seen_b, "two replicas disagree on the history"
    contents = [i["content"] for i in seen_a]
    assert sorted(contents) == sorted([f"a-{i}" for i in range(10)] + [f"b-{i}" for i in range(10)])
    # Each writer's items keep its order.
    for name in "ab":
        mine = [c for c in contents if c.startswith(name)]
        assert mine == [f"{name}-{i}" for i in range(10)]


async def test_a_retried_add_items_never_duplicates(server: Server) -> None:
    """The first answer of an append is lost after it landed: the client retries with the
    same ids, and the items are there once."""
    lost = {"n": 0}
    real = httpx.AsyncHTTPTransport()

    class LosesFirstAnswer(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            resp = await real.handle_async_request(request)
            if request.method == "POST" and lost["n"] == 0:
                lost["n"] += 1
                await resp.aread()
                raise httpx.ReadError("lost", request=request)
            return resp

    client = ctxlog.AsyncClient(
        server.url,
        http=httpx.AsyncClient(base_url=server.url, transport=LosesFirstAnswer(), timeout=30),
    )
    s = CtxlogSession("retry", client)
    await s.add_items([item(0), item(1)])
    assert lost["n"] == 1
    assert await s.get_items() == [item(0), item(1)]
    await client.close()


async def test_pop_item_removes_what_it_read_not_a_later_append(
    store: str, servers: list[Server]
) -> None:
    """A pops while B appends between A's read and A's tombstone (forced here by reading
    first): A removes the item it read; B's newer item stays, and is the newest."""
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    sa, sb = CtxlogSession("pop", a.url), CtxlogSession("pop", b.url)
    await sa.add_items([item(0), item(1)])
    view = await sa._view()  # A's read
    await sb.add_items([item(2)])  # B appends in between
    (record_id, _, _), popped = view.origins[-1], view.items[-1]
    await sa._session.delete(record_id)  # A's tombstone, of what it read
    assert popped == item(1)
    assert await sb.get_items() == [item(0), item(2)]
    # And through the API: the newest now is B's item.
    assert await sa.pop_item() == item(2)
    assert await sb.get_items() == [item(0)]


async def test_get_items_with_a_limit_reads_only_those(server: Server) -> None:
    await CtxlogSession("long", server.url).add_items([item(i) for i in range(30)])
    spied, requests = spying_client(server.url)
    got = await CtxlogSession("long", spied).get_items(limit=3)
    assert got == [item(i) for i in range(27, 30)]
    assert requests and all(u.params.get("last") == "3" for u in requests), requests


# ---- summaries: the context view, and compaction -------------------------------------------


async def context_items(url: str, session_id: str) -> list[Any]:
    """The session's context view as items, read with the plain client."""
    async with ctxlog.AsyncClient(url) as c:
        ctx = await c.session("openai-agents", session_id).context()
    out: list[Any] = []
    for r in ctx.records:
        assert r.text is not None
        if r.kind == "summary":
            out.extend(json.loads(r.text))
        else:
            out.append(json.loads(r.text))
    return out


async def live_records(url: str, session_id: str) -> list[ctxlog.Record]:
    async with ctxlog.AsyncClient(url) as c:
        return [r async for r in c.session("openai-agents", session_id).iter_records()]


class Compactor:
    """The OpenAI client's `responses.compact`, offline: it answers `output`, after running
    `meanwhile` (another process appending while the model compacts)."""

    def __init__(
        self, output: list[Any], meanwhile: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        self.output, self.meanwhile = output, meanwhile
        self.calls: list[dict[str, Any]] = []
        self.responses = self

    async def compact(self, **kw: Any) -> SimpleNamespace:
        self.calls.append(kw)
        if self.meanwhile is not None:
            await self.meanwhile()
        return SimpleNamespace(output=list(self.output), usage=None)


class Replies(Model):
    """A model, offline: one assistant message per call, with a response id. It keeps the
    input of each call."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        **kw: Any,
    ) -> ModelResponse:
        self.inputs.append(input)
        n = len(self.inputs)
        text = ResponseOutputText(type="output_text", text=f"reply {n}", annotations=[])
        message = ResponseOutputMessage(
            id=f"msg_{n}", type="message", role="assistant", status="completed", content=[text]
        )
        return ModelResponse(output=[message], usage=Usage(), response_id=f"resp_{n}")

    def stream_response(self, *args: Any, **kw: Any) -> Any:
        raise NotImplementedError


def compaction(n: int) -> dict[str, Any]:
    return {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": f"opaque {n}"}


async def test_get_items_is_the_context_view(server: Server) -> None:
    s = CtxlogSession("view", server.url)
    await s.add_items([item(i) for i in range(5)])
    async with ctxlog.AsyncClient(server.url) as c:
        chat = c.session("openai-agents", "view")
        ctx = await chat.context()
        await s.add_items([item(5)])  # after the summariser's read: not covered
        summary = [{"role": "assistant", "content": "summary of 0..4"}, item(4)]
        await chat.summarize(json.dumps(summary), ctx, content_type=SUMMARY_CONTENT_TYPE)
        await s.add_items([item(6), item(7)])
        full = await context_items(server.url, "view")
        assert full == summary + [item(5), item(6), item(7)]
        assert await s.get_items() == full
        # `limit`: the newest items of the context view, through a tail read when it holds
        # no summary, through the whole view when it does.
        for k in range(len(full) + 2):
            assert await s.get_items(limit=k) == (full[-k:] if k else []), k


async def test_a_compaction_writes_one_summary_and_keeps_what_was_appended_meanwhile(
    store: str, servers: list[Server]
) -> None:
    """A manual `run_compaction()` through the SDK's compaction session, while a process on
    another replica appends: one summary record covering the compaction's read replaces the
    items it read; the item appended meanwhile stays; nothing is tombstoned."""
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    ours, theirs = CtxlogSession("compact", a.url), CtxlogSession("compact", b.url)
    await ours.add_items([item(i) for i in range(6)])
    before = {r.id for r in await live_records(a.url, "compact")}

    compactor = Compactor([compaction(1)], meanwhile=lambda: theirs.add_items([item(100)]))
    session = OpenAIResponsesCompactionSession("compact", ours, client=compactor)
    await session.run_compaction({"force": True})

    assert [c["input"] for c in compactor.calls] == [[item(i) for i in range(6)]]
    got = await ours.get_items()
    assert got == [compaction(1), item(100)]
    assert got == await theirs.get_items() == await session.get_items()
    assert got == await context_items(b.url, "compact")
    records = await live_records(b.url, "compact")
    summaries = [r for r in records if r.kind == "summary"]
    assert len(summaries) == 1 and summaries[0].content_type == SUMMARY_CONTENT_TYPE
    assert summaries[0].text is not None and json.loads(summaries[0].text) == [compaction(1)]
    assert before < {r.id for r in records}, "a record was tombstoned"


async def test_automatic_compaction_after_runner_turns(store: str, servers: list[Server]) -> None:
    """The SDK compacts after each `Runner` turn (its snapshot hook) while another process
    appends during the compaction: each turn's model input is the context view; the item
    appended meanwhile outlives the compaction it raced, and the next one covers it."""
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    ours, theirs = CtxlogSession("auto", a.url), CtxlogSession("auto", b.url)
    turn = {"n": 0}

    async def meanwhile() -> None:
        turn["n"] += 1
        await theirs.add_items([{"role": "user", "content": f"meanwhile {turn['n']}"}])

    compactor = Compactor([], meanwhile=meanwhile)
    session = OpenAIResponsesCompactionSession(
        "auto", ours, client=compactor, should_trigger_compaction=lambda ctx: True
    )
    model = Replies()
    agent = Agent(name="helper", model=model)
    config = RunConfig(tracing_disabled=True)

    compactor.output = [compaction(1)]
    result = await Runner.run(agent, "hi", session=session, run_config=config)
    assert result.final_output == "reply 1"
    assert [c.get("previous_response_id") for c in compactor.calls] == ["resp_1"]
    first = await ours.get_items()
    assert first == [compaction(1), {"role": "user", "content": "meanwhile 1"}]
    assert first == await context_items(b.url, "auto")

    compactor.output = [compaction(2)]
    await Runner.run(agent, "again", session=session, run_config=config)
    assert model.inputs[1][:2] == first, "the second turn's input is not the context view"
    assert await ours.get_items() == [compaction(2), {"role": "user", "content": "meanwhile 2"}]
    assert await theirs.get_items() == await context_items(a.url, "auto")
    records = await live_records(a.url, "auto")
    assert sum(r.kind == "summary" for r in records) == 2
    assert sum(r.kind == "put" for r in records) == 6, "a record was tombstoned"


async def test_a_snapshot_replaces_a_suffix_and_declines_a_changed_view(
    store: str, servers: list[Server]
) -> None:
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    ours, theirs = CtxlogSession("snap", a.url), CtxlogSession("snap", b.url)
    await ours.add_items([item(i) for i in range(4)])
    snap = await ours._get_compaction_snapshot(3)
    assert snap.items == [item(1), item(2), item(3)] and not snap.complete
    await theirs.add_items([item(9)])  # an append does not stop it, and stays
    # From the snapshot's second item on: what precedes it stays, in the summary.
    assert await snap.replace_suffix(1, [compaction(1)])
    assert await ours.get_items() == [item(0), item(1), compaction(1), item(9)]

    snap = await ours._get_compaction_snapshot(10)
    assert snap.complete and snap.items == await ours.get_items()
    assert await theirs.pop_item() == item(9)  # removed after the snapshot's read
    kept = await ours.get_items()
    assert not await snap.replace_suffix(0, [compaction(2)])
    assert await ours.get_items() == kept == [item(0), item(1), compaction(1)]


async def test_pop_and_clear_after_a_compaction(store: str, servers: list[Server]) -> None:
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    ours, theirs = CtxlogSession("pop-clear", a.url), CtxlogSession("pop-clear", b.url)
    await ours.add_items([item(i) for i in range(4)])

    async def racing_summariser(items: list[Any]) -> list[Any]:
        await theirs.add_items([item(50)])  # while the summariser works
        return summarise_now(items)

    summary = await ours.compact(racing_summariser)
    assert summary == [{"role": "assistant", "content": "summary of 4"}, item(3)]
    assert await theirs.get_items() == summary + [item(50)]
    await ours.add_items([item(4)])
    assert await theirs.pop_item() == item(4)  # a record: tombstoned
    assert await theirs.pop_item() == item(50)
    assert await theirs.pop_item() == item(3)  # the summary's: a new summary without it
    assert await ours.get_items() == [summary[0]]
    assert await ours.get_items() == await context_items(b.url, "pop-clear")
    await theirs.add_items([item(5)])
    await ours.clear_session()
    assert await ours.get_items() == [] and await live_records(a.url, "pop-clear") == []


async def test_the_compaction_input_applies_the_session_s_item_limit(server: Server) -> None:
    """As the SDK's own sessions: `_read_compaction_items(None)` reads at most the session's
    `SessionSettings(limit=…)` items, and says whether that is all of them."""
    from agents.memory import SessionSettings

    ours = CtxlogSession("limited", server.url, session_settings=SessionSettings(limit=3))
    theirs = SQLiteSession("limited", session_settings=SessionSettings(limit=3))
    for s in (ours, theirs):
        await s.add_items([item(i) for i in range(5)])
    # The SDK's compaction reads a session without the hook by `get_items()` (limited).
    want = await theirs.get_items()
    assert want == [item(i) for i in (2, 3, 4)]
    assert await ours._read_compaction_items(None) == (want, False)
    assert await ours._read_compaction_items(5) == ([item(i) for i in range(5)], True)
    theirs.close()
