"""The OpenAI Agents SDK session over ctxlog: the SDK's own `SQLiteSession` is the
reference (the same operations give the same answers), and the cases that session cannot
handle across processes: two replicas, one session, interleaved and retried writes."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest
from agents.memory import Session, SQLiteSession
from conftest import Server, spying_client, start

import ctxlog
from ctxlog.openai_agents import CtxlogSession

pytest.importorskip("agents")


def item(i: int) -> dict[str, object]:
    role = ("user", "assistant")[i % 2]
    return {"role": role, "content": f"message {i}"}


async def test_it_answers_as_the_sdk_s_sqlite_session_does(server: Server) -> None:
    ours = CtxlogSession("conv-1", server.url)
    theirs = SQLiteSession("conv-1")
    assert isinstance(ours, Session)
    rng = random.Random(7)
    n = 0
    for step in range(60):
        op = rng.choice(
            ["add", "add", "get", "get_limit", "pop", "clear"]
            if step > 40
            else ["add", "add", "get", "get_limit", "pop"]
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
    records = await sa._records()  # A's read
    await sb.add_items([item(2)])  # B appends in between
    record_id, popped = records[-1]
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
