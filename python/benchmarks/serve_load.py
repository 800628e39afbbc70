"""The Python row of `cargo xtask bench serve`: what the client and each adapter cost on top
of raw HTTP. Prints one JSON object; `cargo xtask bench serve` runs it against a fresh
`ctxlog serve` and sets its figures beside `ctxlog-http-load`'s of the same run.

    python serve_load.py append --url URL --batch 100 --requests 200 --run R
    python serve_load.py read --url URL --bot load --session s0 --times 500
    python serve_load.py adapters --url URL --calls 300 --run R
    python serve_load.py mcp --url URL --ctxlog BIN --store URI --calls 300 --run R

The records are those of `ctxlog-http-load` (200 characters of text, the same ids scheme),
so the two clients send the same bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ctxlog import AsyncClient, Client


def _us(started: float) -> int:
    return int((time.perf_counter() - started) * 1_000_000)


def append(url: str, batch: int, requests: int, run: str) -> dict[str, Any]:
    text = "x" * 200
    latencies = []
    with Client(url) as c:
        s = c.session("load", "s0")
        started = time.perf_counter()
        for j in range(requests):
            records = [
                {"id": f"{run}-c0-{j}-{i}", "role": "user", "text": text} for i in range(batch)
            ]
            t = time.perf_counter()
            s.append(records)
            latencies.append(_us(t))
        seconds = time.perf_counter() - started
    return {"records": batch * requests, "seconds": seconds, "latencies_us": latencies}


def read(url: str, bot: str, session: str, times: int) -> dict[str, Any]:
    latencies = []
    n = 0
    with Client(url) as c:
        s = c.session(bot, session)
        for _ in range(times):
            t = time.perf_counter()
            n = len(s.records(limit=1000).records)
            latencies.append(_us(t))
    return {"records": n, "latencies_us": latencies}


async def _timed(calls: int, f: Callable[[int], Awaitable[Any]]) -> list[int]:
    out = []
    for i in range(calls):
        t = time.perf_counter()
        await f(i)
        out.append(_us(t))
    return out


def _timed_sync(calls: int, f: Callable[[int], Any]) -> list[int]:
    out = []
    for i in range(calls):
        t = time.perf_counter()
        f(i)
        out.append(_us(t))
    return out


async def adapters(url: str, calls: int, run: str) -> dict[str, Any]:
    """Each adapter's hot call, one record's worth, against the bare client appending one
    record with the same flavour (async for the Agents SDK and ADK, sync for LangGraph's
    `put`)."""
    from google.adk.events import Event
    from google.genai import types
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import empty_checkpoint

    from ctxlog.adk import CtxlogSessionService
    from ctxlog.langgraph import CtxlogSaver
    from ctxlog.openai_agents import CtxlogSession

    text = "x" * 200
    out: dict[str, Any] = {}
    async with AsyncClient(url) as ac:
        bare = ac.session("load", f"{run}-bare-async")
        out["client append (async)"] = await _timed(
            calls,
            lambda i: bare.append([{"id": f"{run}-a-{i}", "role": "user", "text": text}]),
        )
        agents = CtxlogSession(f"{run}-agents", ac)
        out["openai-agents add_items"] = await _timed(
            calls, lambda i: agents.add_items([{"role": "user", "content": text}])
        )
        adk = CtxlogSessionService(ac)
        session = await adk.create_session(app_name="bench", user_id="u", session_id=f"{run}-adk")

        def event(i: int) -> Event:
            content = types.Content(role="user", parts=[types.Part(text=text)])
            return Event(author="user", invocation_id=f"inv-{i}", content=content)

        out["adk append_event"] = await _timed(calls, lambda i: adk.append_event(session, event(i)))
    with Client(url) as c:
        bare_sync = c.session("load", f"{run}-bare-sync")
        out["client append (sync)"] = _timed_sync(
            calls,
            lambda i: bare_sync.append([{"id": f"{run}-s-{i}", "role": "user", "text": text}]),
        )
        saver = CtxlogSaver(url, client=c)
        config: RunnableConfig = {"configurable": {"thread_id": f"{run}-lg", "checkpoint_ns": ""}}

        def put(i: int) -> None:
            nonlocal config
            cp = empty_checkpoint()
            cp["channel_values"] = {"messages": [text]}
            config = saver.put(config, cp, {"step": i}, {})

        out["langgraph put"] = _timed_sync(calls, put)
    return {"latencies_us": out}


async def mcp(url: str, ctxlog: str, store: str, calls: int, run: str) -> dict[str, Any]:
    """`read_context` of a 20-record session over MCP stdio (`ctxlog mcp`, the official
    client) against the HTTP route it wraps (`GET …/context`, raw `httpx`), one client,
    `calls` each. The server at `url` serves `store`; the MCP process is a second replica
    of it (writer `bench-mcp`), so both read the same session."""
    import httpx
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    bot, session = "load", f"{run}-mcp"
    with Client(url) as c:
        c.session(bot, session).append(
            [{"role": "user", "text": f"turn {i} " + "x" * 200} for i in range(20)]
        )
    path = f"/v1/bots/{bot}/sessions/{session}/context"
    with httpx.Client(base_url=url, timeout=30) as h:
        http = _timed_sync(calls, lambda i: h.get(path).raise_for_status())
    params = StdioServerParameters(
        command=ctxlog, args=["--store", store, "mcp", "--writer", "bench-mcp"]
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as mc:
        await mc.initialize()

        async def call(i: int) -> None:
            r = await mc.call_tool("read_context", {"bot": bot, "session": session})
            if r.is_error:
                raise RuntimeError(f"read_context failed: {r.content}")
            if i == 0:  # once: the view is the whole session, not an empty answer
                records = (r.structured_content or {}).get("records", [])
                if len(records) != 20:
                    raise RuntimeError(f"read_context answered {len(records)} records, not 20")

        await call(0)  # the MCP replica's first scan, not measured
        stdio = await _timed(calls, call)
    return {"latencies_us": {"http": http, "mcp stdio": stdio}}


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("append")
    a.add_argument("--url", required=True)
    a.add_argument("--batch", type=int, default=100)
    a.add_argument("--requests", type=int, default=100)
    a.add_argument("--run", default=str(time.time_ns()))
    r = sub.add_parser("read")
    r.add_argument("--url", required=True)
    r.add_argument("--bot", default="load")
    r.add_argument("--session", default="s0")
    r.add_argument("--times", type=int, default=500)
    d = sub.add_parser("adapters")
    d.add_argument("--url", required=True)
    d.add_argument("--calls", type=int, default=300)
    d.add_argument("--run", default=str(time.time_ns()))
    m = sub.add_parser("mcp")
    m.add_argument("--url", required=True)
    m.add_argument("--ctxlog", required=True)
    m.add_argument("--store", required=True)
    m.add_argument("--calls", type=int, default=300)
    m.add_argument("--run", default=str(time.time_ns()))
    args = p.parse_args()
    if args.what == "append":
        v = append(args.url, args.batch, args.requests, args.run)
    elif args.what == "read":
        v = read(args.url, args.bot, args.session, args.times)
    elif args.what == "mcp":
        v = asyncio.run(mcp(args.url, args.ctxlog, args.store, args.calls, args.run))
    else:
        v = asyncio.run(adapters(args.url, args.calls, args.run))
    print(json.dumps(v))


if __name__ == "__main__":
    main()
