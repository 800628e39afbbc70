"""`ctxlog mcp` (stdio) and `/mcp` on `ctxlog serve` (streamable HTTP), driven by the
official MCP Python SDK as a client would: tools listed and called, a summary of a context
read while another process appends, tokens of other bots and read tokens refused, bad
arguments refused with nothing written."""

from __future__ import annotations

import json
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from conftest import BIN, Server, start
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, TextResourceContents

import ctxlog

ALL_TOOLS = {
    "list_sessions",
    "read_context",
    "read_records",
    "append_records",
    "write_summary",
    "get_record",
    "forget_record",
    "search",
}
READ_TOOLS = {"list_sessions", "read_context", "read_records", "get_record", "search"}


@pytest.fixture
def store(tmp_path: Path) -> str:
    # SQLite only: what is proven here is the MCP surface, not the backend (the tools run the
    # routes' own operations, which every backend's suite covers).
    return f"sqlite:{tmp_path / 'store.db'}"


@asynccontextmanager
async def stdio(store: str, *bots: str) -> AsyncIterator[Client]:
    args = ["--store", store, "--timeout", "30", "mcp", "--writer", "mcp-stdio"]
    for b in bots:
        args += ["--bot", b]
    async with Client(StdioServerParameters(command=BIN, args=args), read_timeout_seconds=60) as c:
        yield c


@asynccontextmanager
async def over_http(url: str, token: str | None = None) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(headers=headers, timeout=60)
    async with (
        http,
        Client(
            streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=60
        ) as c,
    ):
        yield c


def result(r: CallToolResult) -> dict[str, Any]:
    assert not r.is_error, r
    assert r.structured_content is not None
    return r.structured_content


def problem(r: CallToolResult) -> dict[str, Any]:
    assert r.is_error, r
    assert r.structured_content is not None
    return r.structured_content


def tokens_file(path: Path, grants: dict[str, tuple[str, str]]) -> dict[str, str]:
    """A tokens file granting each name (bots, rights); returns each name's token."""
    entries, tokens = [], {}
    for name, (bots, rights) in grants.items():
        out = subprocess.run(
            [BIN, "token", "--name", name, "--bots", bots, "--rights", rights],
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        )
        made = json.loads(out.stdout)
        tokens[name] = made["token"]
        entries.append(made["entry"])
    path.write_text(json.dumps({"tokens": entries}))
    return tokens


async def exercise(c: Client, other_writer: Callable[[str], object]) -> None:
    """The tools in the order an agent uses them; `other_writer(text)` appends a record to
    the session through another process."""
    listed = {t.name for t in (await c.list_tools()).tools}
    assert listed == ALL_TOOLS
    ack = result(
        await c.call_tool(
            "append_records",
            {
                "bot": "helpdesk",
                "session": "t-1",
                "records": [
                    {"role": "user", "text": "hello"},
                    {"role": "assistant", "text": "hi", "id": "m2", "metadata": {"k": 1}},
                ],
            },
        )
    )
    assert (
        len(ack["ids"]) == 2 and ack["ids"][1] == "m2" and ack["last_seq"] == ack["first_seq"] + 1
    )
    view = result(await c.call_tool("read_context", {"bot": "helpdesk", "session": "t-1"}))
    assert [r["text"] for r in view["records"]] == ["hello", "hi"]
    # Another process appends after the view was read: the summary covers the view, and
    # what came after it stays in the session's context.
    other_writer("meanwhile")
    result(
        await c.call_tool(
            "write_summary",
            {"bot": "helpdesk", "session": "t-1", "covers": view["covers"], "text": "greetings"},
        )
    )
    after = result(await c.call_tool("read_context", {"bot": "helpdesk", "session": "t-1"}))
    assert [(r["kind"], r["text"]) for r in after["records"]] == [
        ("summary", "greetings"),
        ("put", "meanwhile"),
    ]
    assert after["covered"] == 2
    # As of the first view's position (rule 24): what was read then, no summary.
    then = {"bot": "helpdesk", "session": "t-1", "at": view["position"]}
    as_of = result(await c.call_tool("read_context", then))
    assert [r["text"] for r in as_of["records"]] == ["hello", "hi"] and "summary" not in as_of
    as_of_page = result(await c.call_tool("read_records", then))
    assert [r["text"] for r in as_of_page["records"]] == ["hello", "hi"]
    page = result(
        await c.call_tool("read_records", {"bot": "helpdesk", "session": "t-1", "last": 10})
    )
    assert [r["text"] for r in page["records"]] == ["hello", "hi", "meanwhile", "greetings"]
    got = result(await c.call_tool("get_record", {"bot": "helpdesk", "id": "m2"}))
    assert got["text"] == "hi" and got["metadata"] == {"k": 1}
    # Search (rule 26): the same answer as the route; what is forgotten is never found.
    found = result(await c.call_tool("search", {"bot": "helpdesk", "query": "hi meanwhile"}))
    assert sorted(h["record"]["id"] for h in found["hits"]) == sorted(
        ["m2", page["records"][2]["id"]]
    )
    assert all(h["snippet"] and h["matched"] for h in found["hits"])
    bad_query = problem(await c.call_tool("search", {"bot": "helpdesk", "query": "a* b* c* d* e*"}))
    assert bad_query["field"] == "query" and bad_query["written"] == "nothing", bad_query
    result(await c.call_tool("forget_record", {"bot": "helpdesk", "id": "m2"}))
    found = result(await c.call_tool("search", {"bot": "helpdesk", "query": "hi"}))
    assert found["hits"] == []
    gone = problem(await c.call_tool("get_record", {"bot": "helpdesk", "id": "m2"}))
    assert gone["type"] == "urn:ctxlog:problem:not-found"
    sessions = result(await c.call_tool("list_sessions", {"bot": "helpdesk"}))
    assert [s["session_id"] for s in sessions["sessions"]] == ["t-1"]
    # Bad arguments: nothing written, and the error says so.
    before = result(
        await c.call_tool("read_records", {"bot": "helpdesk", "session": "t-1", "last": 100})
    )
    for bad in [
        {"bot": "helpdesk", "session": "t-1", "records": []},
        {"bot": "", "session": "t-1", "records": [{"role": "user", "text": "x"}]},
        {
            "bot": "helpdesk",
            "session": "t-1",
            "records": [{"role": "user", "text": "x", "id": "a\u0000b"}],
        },
    ]:
        p = problem(await c.call_tool("append_records", bad))
        assert p["written"] == "nothing" and p["type"] == "urn:ctxlog:problem:invalid-input", p
    wrong_session = problem(
        await c.call_tool(
            "write_summary",
            {"bot": "helpdesk", "session": "t-2", "covers": view["covers"], "text": "stolen"},
        )
    )
    assert wrong_session["written"] == "nothing" and wrong_session["field"] == "covers"
    # Not the tool's shape: a typed tool error naming the field by its path, nothing written.
    shapeless = problem(await c.call_tool("append_records", {"bot": "helpdesk", "session": "t-1"}))
    assert shapeless["field"] == "arguments" and shapeless["written"] == "nothing", shapeless
    assert shapeless["type"] == "urn:ctxlog:problem:invalid-input", shapeless
    wrong = {"bot": "helpdesk", "session": "t-1", "records": [{"role": 5, "text": "x"}]}
    wrong_type = problem(await c.call_tool("append_records", wrong))
    assert wrong_type["field"] == "records[0].role", wrong_type
    assert wrong_type["written"] == "nothing", wrong_type
    too_many = problem(await c.call_tool("search", {"bot": "helpdesk", "query": "x", "k": -1}))
    assert too_many["field"] == "k", too_many
    # serde quotes a value of the wrong type: not echoed back whole.
    huge = problem(
        await c.call_tool("search", {"bot": "helpdesk", "query": "x", "k": "q" * 100_000})
    )
    assert huge["field"] == "k" and len(huge["detail"]) < 1000, len(huge["detail"])
    now = result(
        await c.call_tool("read_records", {"bot": "helpdesk", "session": "t-1", "last": 100})
    )
    assert now["records"] == before["records"]
    # The session as a resource, its contents the context view.
    resources = await c.list_resources()
    assert [r.uri for r in resources.resources] == ["ctxlog://bots/helpdesk/sessions/t-1"]
    read = await c.read_resource("ctxlog://bots/helpdesk/sessions/t-1")
    contents = read.contents[0]
    assert isinstance(contents, TextResourceContents)
    assert [r["text"] for r in json.loads(contents.text)["records"]] == ["greetings", "meanwhile"]


async def test_mcp_over_stdio(store: str, servers: list[Server]) -> None:
    other = start(store, "other-replica")
    servers.append(other)

    def append(text: str) -> None:
        with ctxlog.Client(other.url) as client:
            client.session("helpdesk", "t-1").append([{"role": "user", "text": text}])

    async with stdio(store, "helpdesk") as c:
        await exercise(c, append)
        # By vector (rule 27): embeddings another replica appended, found by this one.
        with ctxlog.Client(other.url) as client:
            client.session("helpdesk", "t-9").append(
                [
                    {"role": "user", "text": "north", "id": "n"},
                    {"role": "user", "text": "east", "id": "e"},
                    ctxlog.embedding("n", "m", [0.0, 1.0]),
                    ctxlog.embedding("e", "m", [1.0, 0.0]),
                ]
            )
        up = {"bot": "helpdesk", "vector": [0.1, 0.9], "model": "m"}
        near = result(await c.call_tool("search", up))
        assert [h["record"]["id"] for h in near["hits"]] == ["n", "e"], near
        # Both rankings fused: `e` first by words and second by vector beats `n`, first by
        # vector only.
        both = result(await c.call_tool("search", {**up, "query": "east"}))
        assert [h["record"]["id"] for h in both["hits"]] == ["e", "n"], both
        flat = problem(await c.call_tool("search", {**up, "vector": [1.0, 0.0, 0.0]}))
        assert flat["field"] == "vector" and flat["written"] == "nothing", flat
        nameless = problem(await c.call_tool("search", {"bot": "helpdesk", "vector": [1.0, 0.0]}))
        assert nameless["field"] == "model" and nameless["written"] == "nothing", nameless
        # Started for `helpdesk` only: another bot is refused, nothing written.
        p = problem(
            await c.call_tool(
                "append_records",
                {"bot": "other", "session": "s", "records": [{"role": "user", "text": "x"}]},
            )
        )
        assert p["type"] == "urn:ctxlog:problem:forbidden" and p["written"] == "nothing"


async def test_mcp_over_http_under_tokens(
    store: str, servers: list[Server], tmp_path: Path
) -> None:
    tokens = tokens_file(
        tmp_path / "tokens.json",
        {
            "writer": ("helpdesk", "read,write"),
            "reader": ("helpdesk", "read"),
            "stranger": ("other", "read,write"),
        },
    )
    server = start(store, "replica-a", "--tokens", str(tmp_path / "tokens.json"))
    servers.append(server)

    def append(text: str) -> None:
        with ctxlog.Client(server.url, token=tokens["writer"]) as client:
            client.session("helpdesk", "t-1").append([{"role": "user", "text": text}])

    async with over_http(server.url, tokens["writer"]) as c:
        await exercise(c, append)
    async with over_http(server.url, tokens["reader"]) as c:
        assert {t.name for t in (await c.list_tools()).tools} == READ_TOOLS
        view = result(await c.call_tool("read_context", {"bot": "helpdesk", "session": "t-1"}))
        assert [r["text"] for r in view["records"]] == ["greetings", "meanwhile"]
        found = result(await c.call_tool("search", {"bot": "helpdesk", "query": "meanwhile"}))
        assert [h["record"]["text"] for h in found["hits"]] == ["meanwhile"], found
        # Not listed, and refused if called anyway.
        p = problem(
            await c.call_tool(
                "append_records",
                {"bot": "helpdesk", "session": "t-1", "records": [{"role": "user", "text": "x"}]},
            )
        )
        assert p["type"] == "urn:ctxlog:problem:forbidden" and p["written"] == "nothing"
    async with over_http(server.url, tokens["stranger"]) as c:
        for tool, args in [
            ("read_context", {"bot": "helpdesk", "session": "t-1"}),
            ("get_record", {"bot": "helpdesk", "id": "m2"}),
            ("forget_record", {"bot": "helpdesk", "id": "m2"}),
            ("list_sessions", {"bot": "helpdesk"}),
            ("search", {"bot": "helpdesk", "query": "hello"}),
            (
                "append_records",
                {"bot": "helpdesk", "session": "t-1", "records": [{"role": "user", "text": "x"}]},
            ),
            (
                "write_summary",
                {"bot": "helpdesk", "session": "t-1", "covers": "x", "text": "stolen"},
            ),
        ]:
            p = problem(await c.call_tool(tool, args))
            assert p["type"] == "urn:ctxlog:problem:forbidden", (tool, p)
        with pytest.raises(MCPError) as refused:
            await c.read_resource("ctxlog://bots/helpdesk/sessions/t-1")
        assert refused.value.data["type"] == "urn:ctxlog:problem:forbidden", refused.value.data
        assert (await c.list_resources()).resources == []
    # No token, or a wrong one: the HTTP request is refused before MCP reads it.
    async with httpx.AsyncClient(timeout=30) as h:
        for headers in [{}, {"Authorization": "Bearer wrong"}]:
            r = await h.post(
                f"{server.url}/mcp",
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={**headers, "Accept": "application/json, text/event-stream"},
            )
            assert r.status_code == 401, r.text
    with ctxlog.Client(server.url, token=tokens["writer"]) as client:
        texts = [r.text for r in client.session("helpdesk", "t-1").records().records]
    assert texts == ["hello", "meanwhile", "greetings"]
