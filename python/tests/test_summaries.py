"""Summaries through the client, against a real `ctxlog serve`: the context view a summary
governs, what it covers (the position its writer read, never what was appended after),
a chain of summaries, summaries in the bot-wide append and in watch streams, a retried
summary landing once, and every wrong `covers` as `InvalidInput` naming the field."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import LosesFirstAnswer, Server, start

import ctxlog


def ids(records: list[ctxlog.Record]) -> list[str]:
    return [r.id for r in records]


def test_a_summary_governs_the_context_view(server: Server) -> None:
    with ctxlog.Client(server.url) as c:
        s = c.session("helpdesk", "long")
        old = s.append([{"role": "user", "text": f"m{i}"} for i in range(3)]).ids
        ctx = s.context()
        assert ids(ctx.records) == old and ctx.summary is None and ctx.covered == 0
        # Appended by someone else while the summariser works: after the read, not covered.
        late = s.append([{"role": "user", "text": "late"}]).ids
        ack = s.summarize("m0..m2 in short", ctx, metadata={"model": "small"})
        (summary_id,) = ack.ids

        now = s.context()
        assert now.summary == summary_id and now.covered == 3
        # The summary stands where the newest record it covers stood, so before the late
        # record; the covered records are left out.
        assert ids(now.records) == [summary_id] + late
        summary = now.records[0]
        assert summary.kind == "summary" and summary.covers == ctx.position
        assert summary.role == "summary" and summary.text == "m0..m2 in short"
        assert summary.content_type == "text/plain" and summary.metadata == {"model": "small"}
        assert now.records[1].kind == "put" and now.records[1].covers is None
        # The full view still lists every live record, the summary among them.
        assert sorted(ids(list(s.iter_records()))) == sorted(old + late + [summary_id])
        assert s.get(summary_id) == summary

        # A summary of that view governs in its turn; the earlier one is left out and not
        # counted (it is a summary, not a record it stands for).
        more = s.append([{"role": "assistant", "text": "after"}]).ids
        second = s.summarize(b"\x00binary", now, id="sum-2", role="memory").ids
        assert second == ["sum-2"]
        last = s.context()
        assert last.summary == "sum-2" and last.covered == 4
        assert ids(last.records) == ["sum-2"] + more
        assert last.records[0].bytes == b"\x00binary" and last.records[0].role == "memory"

        # Tombstoning the governing summary gives the view back to the earlier one.
        s.delete("sum-2")
        back = s.context()
        assert back.summary == summary_id and back.covered == 3
        assert ids(back.records) == [summary_id] + late + more


async def test_the_async_twin(server: Server) -> None:
    async with ctxlog.AsyncClient(server.url) as c:
        s = c.session("helpdesk", "async")
        old = (await s.append([{"role": "user", "text": f"m{i}"} for i in range(2)])).ids
        ctx = await s.context()
        assert ids(ctx.records) == old and ctx.summary is None
        late = (await s.append([{"role": "user", "text": "late"}])).ids
        (summary_id,) = (await s.summarize("short", covers=ctx)).ids
        now = await s.context()
        assert now.summary == summary_id and now.covered == 2
        assert ids(now.records) == [summary_id] + late
        assert now.records[0].kind == "summary" and now.records[0].covers == ctx.position
        assert sorted([r.id async for r in s.iter_records()]) == sorted(old + late + [summary_id])
        with pytest.raises(ctxlog.InvalidInput) as e:
            await s.summarize("bad", covers="not-a-position")
        assert e.value.field == "covers" and e.value.written == "nothing"


def test_wrong_covers_is_invalid_input_naming_the_field(
    store: str, servers: list[Server], tmp_path: Path
) -> None:
    a = start(store, "replica-a")
    # Another store, further along: its positions name seqs this store does not hold.
    elsewhere = start(f"sqlite:{tmp_path / 'elsewhere.db'}", "replica-x")
    servers.extend([a, elsewhere])
    with ctxlog.Client(a.url) as c, ctxlog.Client(elsewhere.url) as x:
        s = c.session("b", "s")
        s.append([{"role": "user", "text": "hi"}])
        other = x.session("b", "s")
        other.append([{"role": "user", "text": str(i)} for i in range(5)])
        foreign = other.context()
        cases = [
            lambda: s.summarize("x", "not-a-position"),
            lambda: s.summarize("x", foreign),
            # A page's position, and the covers of another session's or bot's view.
            lambda: s.summarize("x", s.records().position),
            lambda: s.summarize("x", c.session("b", "t").context()),
            lambda: s.summarize("x", c.session("c", "s").context()),
            # A summary without `covers`, and `covers` on a record that is not a summary.
            lambda: s.append([{"role": "summary", "kind": "summary", "text": "x"}]),
            lambda: s.append(
                [{"role": "user", "text": "ok"}, {"role": "user", "covers": s.context().position}]
            ),
        ]
        for i, case in enumerate(cases):
            with pytest.raises(ctxlog.InvalidInput) as e:
                case()
            assert e.value.field == "covers", (i, e.value.problem)
            assert e.value.written == "nothing" and e.value.status == 400, i
        assert e.value.record == 1
        # Nothing of those was written.
        assert [r.text for r in s.iter_records()] == ["hi"]
        assert s.context().summary is None


def test_a_summary_cannot_cover_a_page(server: Server) -> None:
    """A page's position is the whole view's: a summary written from a 2-record page of a
    5-record session would hide all 5. Neither the page nor its position is taken."""
    with ctxlog.Client(server.url) as c:
        s = c.session("b", "paged")
        written = s.append([{"role": "user", "text": str(i)} for i in range(5)]).ids
        page = s.records(limit=2)
        with pytest.raises(ctxlog.InvalidInput) as e:
            s.summarize("the first two", page.position)
        assert e.value.field == "covers" and e.value.written == "nothing"
        with pytest.raises(TypeError):
            s.summarize("the first two", page)  # type: ignore[arg-type]
        view = s.context()
        assert view.summary is None and ids(view.records) == written


def test_a_retried_summary_lands_once(server: Server) -> None:
    """The first answer of a summary's append is lost after it landed: the client retries
    with the same id, and there is one summary."""
    loses = LosesFirstAnswer()
    with ctxlog.Client(server.url) as plain:
        plain.session("b", "r").append([{"role": "user", "text": "hi"}])
    http = httpx.Client(base_url=server.url, transport=loses, timeout=30)
    with ctxlog.Client(server.url, http=http) as c:
        s = c.session("b", "r")
        ack = s.summarize("short", s.context())
        assert loses.lost == 1
        summaries = [r for r in s.iter_records() if r.kind == "summary"]
        assert ids(summaries) == ack.ids
        assert s.context().summary == ack.ids[0]


def test_the_bot_wide_append_takes_summaries(server: Server) -> None:
    with ctxlog.Client(server.url) as c:
        one, two = c.session("b", "one"), c.session("b", "two")
        one.append([{"role": "user", "text": "1"}])
        two.append([{"role": "user", "text": "2"}])
        p1, p2 = one.context().covers, two.context().covers
        ack = c.append_many(
            "b",
            [
                {"session_id": s, "role": "summary", "kind": "summary", "covers": p, "text": t}
                for s, p, t in [("one", p1, "s1"), ("two", p2, "s2")]
            ],
        )
        for s, summary_id, text in [(one, ack.ids[0], "s1"), (two, ack.ids[1], "s2")]:
            ctx = s.context()
            assert ctx.summary == summary_id and ctx.covered == 1
            assert [r.text for r in ctx.records] == [text]


async def test_a_summary_arrives_in_a_watch_stream(server: Server) -> None:
    async with ctxlog.AsyncClient(server.url) as c:
        s = c.session("b", "w")
        await s.append([{"role": "user", "text": "hi"}])
        ctx = await s.context()
        events = s.watch(after=ctx.position)
        (summary_id,) = (await s.summarize("short", ctx)).ids
        ev = await asyncio.wait_for(anext(events), 30)
        await events.aclose()
        assert ev.kind == "record" and ev.record.id == summary_id
        assert ev.record.kind == "summary" and ev.record.covers == ctx.position
