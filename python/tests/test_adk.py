"""The Google ADK session service over ctxlog: ADK's own `InMemorySessionService` is the
reference (the same operations give the same sessions), `get_session` with
`num_recent_events` reads only those events, and two replicas share one session."""

from __future__ import annotations

import random

import httpx
import pytest
from conftest import Server, spying_client, start
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.errors.session_not_found_error import SessionNotFoundError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.memory import InMemoryMemoryService  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.sessions.base_session_service import GetSessionConfig  # noqa: E402
from google.adk.sessions.session import Session  # noqa: E402

import ctxlog  # noqa: E402
from ctxlog.adk import CtxlogMemoryService, CtxlogSessionService  # noqa: E402


def view(s: Session | None) -> object:
    """What a caller sees of a session (the store's own timestamps aside)."""
    if s is None:
        return None
    return (
        s.app_name,
        s.user_id,
        s.id,
        dict(sorted(s.state.items())),
        [(e.id, e.author, e.actions.state_delta if e.actions else None) for e in s.events],
    )


# On SQLite only: on Lance on S3 its hundreds of round trips outgrow the test's timeout in CI
# (the adapter's other tests run on both backends).
@pytest.mark.parametrize("store", ["sqlite"], indirect=True)
async def test_it_answers_as_adk_s_in_memory_service_does(server: Server) -> None:
    ours, theirs = CtxlogSessionService(server.url), InMemorySessionService()
    rng = random.Random(5)
    sessions: list[tuple[str, str]] = []
    clock = 1_000.0
    for step in range(80):
        op = rng.choice(["create", "append", "append", "append", "get", "list", "delete"])
        if op == "create" or not sessions:
            user, sid = rng.choice(["u1", "u2"]), f"s{step}"
            state = {"k": step, "app:shared": step, "user:pref": f"p{step}", "temp:x": 1}
            for svc in (ours, theirs):
                await svc.create_session(app_name="app", user_id=user, state=state, session_id=sid)
            sessions.append((user, sid))
        elif op == "append":
            user, sid = rng.choice(sessions)
            clock += 1
            delta = {"k": step, f"user:u{step % 3}": step, f"app:a{step % 2}": step, "temp:t": 1}
            for svc in (ours, theirs):
                s = await svc.get_session(app_name="app", user_id=user, session_id=sid)
                assert s is not None
                e = Event(
                    id=f"e{step}",
                    author=rng.choice(["user", "model"]),
                    invocation_id="i",
                    timestamp=clock,
                    actions=EventActions(state_delta=dict(delta)),
                )
                await svc.append_event(s, e)
                assert "temp:t" in s.state, "temp state is applied to the live session"
        elif op == "get":
            user, sid = rng.choice(sessions)
            config = rng.choice(
                [
                    None,
                    GetSessionConfig(num_recent_events=2),
                    GetSessionConfig(num_recent_events=0),
                    GetSessionConfig(after_timestamp=clock - 2),
                ]
            )
            got = [
                await svc.get_session(app_name="app", user_id=user, session_id=sid, config=config)
                for svc in (ours, theirs)
            ]
            assert view(got[0]) == view(got[1]), (step, config)
        elif op == "list":
            user = rng.choice([None, "u1", "u2"])
            ls = [await svc.list_sessions(app_name="app", user_id=user) for svc in (ours, theirs)]
            assert sorted(view(s) for s in ls[0].sessions) == sorted(
                view(s) for s in ls[1].sessions
            )
        else:
            user, sid = sessions.pop(rng.randrange(len(sessions)))
            for svc in (ours, theirs):
                await svc.delete_session(app_name="app", user_id=user, session_id=sid)
                assert await svc.get_session(app_name="app", user_id=user, session_id=sid) is None
    assert await ours.get_user_state(app_name="app", user_id="u1") == await theirs.get_user_state(
        app_name="app", user_id="u1"
    )


async def test_errors_as_adk_s_own(server: Server) -> None:
    svc = CtxlogSessionService(server.url)
    await svc.create_session(app_name="app", user_id="u", session_id="s")
    with pytest.raises(AlreadyExistsError):
        await svc.create_session(app_name="app", user_id="u", session_id="s")
    ghost = Session(app_name="app", user_id="u", id="ghost")
    with pytest.raises(SessionNotFoundError):
        await svc.append_event(ghost, Event(author="user", invocation_id="i"))


async def test_num_recent_events_reads_only_those(server: Server) -> None:
    svc = CtxlogSessionService(server.url)
    s = await svc.create_session(app_name="app", user_id="u", session_id="long")
    for i in range(30):
        await svc.append_event(
            s, Event(id=f"e{i}", author="user", invocation_id="i", timestamp=1_000.0 + i)
        )
    client, requests = spying_client(server.url)
    spied = CtxlogSessionService(client)
    got = await spied.get_session(
        app_name="app", user_id="u", session_id="long", config=GetSessionConfig(num_recent_events=3)
    )
    assert got is not None and [e.id for e in got.events] == ["e27", "e28", "e29"]
    event_reads = [u for u in requests if "/u/long/records" in str(u.path).replace("%2F", "/")]
    assert event_reads and all(u.params.get("last") == "3" for u in event_reads), event_reads


async def test_two_replicas_one_session(store: str, servers: list[Server]) -> None:
    a, b = start(store, "replica-a"), start(store, "replica-b")
    servers.extend([a, b])
    sa, sb = CtxlogSessionService(a.url), CtxlogSessionService(b.url)
    await sa.create_session(app_name="app", user_id="u", session_id="s", state={"n": 0})
    for i in range(5):
        for svc, who in ((sa, "a"), (sb, "b")):
            s = await svc.get_session(app_name="app", user_id="u", session_id="s")
            assert s is not None
            e = Event(
                id=f"{who}{i}",
                author=who,
                invocation_id="i",
                actions=EventActions(state_delta={f"last_{who}": i}),
            )
            await svc.append_event(s, e)
            # A retried append (same event) counts once.
            await svc.append_event(s, e)
    seen = [await svc.get_session(app_name="app", user_id="u", session_id="s") for svc in (sa, sb)]
    assert view(seen[0]) == view(seen[1])
    assert seen[0] is not None
    assert [e.id for e in seen[0].events] == [f"{w}{i}" for i in range(5) for w in "ab"]
    assert seen[0].state == {"n": 0, "last_a": 4, "last_b": 4}


async def test_an_event_the_store_did_not_take_leaves_the_session_unchanged(
    server: Server,
) -> None:
    class Down(httpx.AsyncBaseTransport):
        """Reads reach the server; every append is lost on the way."""

        def __init__(self) -> None:
            self.real = httpx.AsyncHTTPTransport()

        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            if request.method == "POST":
                raise httpx.ConnectError("down", request=request)
            return await self.real.handle_async_request(request)

    svc = CtxlogSessionService(server.url)
    s = await svc.create_session(app_name="app", user_id="u", session_id="d", state={"n": 0})
    broken = CtxlogSessionService(
        ctxlog.AsyncClient(
            server.url,
            http=httpx.AsyncClient(base_url=server.url, transport=Down()),
            retry=ctxlog.Retry(attempts=2, backoff=0.01),
        )
    )
    e = Event(id="e1", author="a", invocation_id="i", actions=EventActions(state_delta={"n": 1}))
    with pytest.raises(ctxlog.Indeterminate):
        await broken.append_event(s, e)
    assert s.events == [] and s.state == {"n": 0}
    # The same event through a working service: stored once, the session object follows.
    await svc.append_event(s, e)
    assert [x.id for x in s.events] == ["e1"] and s.state == {"n": 1}
    got = await svc.get_session(app_name="app", user_id="u", session_id="d")
    assert got is not None and [x.id for x in got.events] == ["e1"] and got.state == {"n": 1}


async def test_a_deleted_session_id_can_be_created_again(server: Server) -> None:
    """As ADK's own services allow: the re-created session is there, with its new state,
    none of the old events, and takes events (and `user:` state) of its own."""
    svc = CtxlogSessionService(server.url)
    s = await svc.create_session(
        app_name="app", user_id="u", session_id="again", state={"n": 1, "user:u": 1}
    )
    await svc.append_event(s, Event(id="e1", author="a", invocation_id="i"))
    await svc.delete_session(app_name="app", user_id="u", session_id="again")
    assert await svc.get_session(app_name="app", user_id="u", session_id="again") is None
    new = await svc.create_session(
        app_name="app", user_id="u", session_id="again", state={"n": 2, "user:u": 2}
    )
    got = await svc.get_session(app_name="app", user_id="u", session_id="again")
    assert got is not None and got.events == [] and got.state == {"n": 2, "user:u": 2}
    await svc.append_event(new, Event(id="e1", author="a", invocation_id="i"))
    got = await svc.get_session(app_name="app", user_id="u", session_id="again")
    assert got is not None and [e.id for e in got.events] == ["e1"]
    listed = (await svc.list_sessions(app_name="app", user_id="u")).sessions
    assert [x.id for x in listed] == ["again"]


async def test_last_update_time_is_the_last_event_s(server: Server) -> None:
    """ADK's `test_append_event_complete`: the session's time is its last event's, even an
    event stamped before the session's creation time."""
    svc = CtxlogSessionService(server.url)
    s = await svc.create_session(app_name="app", user_id="u", session_id="t")
    stamped = s.last_update_time - 100.0
    await svc.append_event(s, Event(id="e1", author="a", invocation_id="i", timestamp=stamped))
    got = await svc.get_session(app_name="app", user_id="u", session_id="t")
    assert got is not None and got.last_update_time == stamped
    (listed,) = (await svc.list_sessions(app_name="app", user_id="u")).sessions
    assert listed.last_update_time == stamped


async def test_memory_answers_keyword_searches_as_adk_s_in_memory_service_does(
    server: Server,
) -> None:
    """ADK's `InMemoryMemoryService` is the reference for which events a keyword search
    finds (case, scripts, words inside other words, events without text, deletion); ranking
    differs by design (BM25 against a count of matched words), so hits are compared as
    sets (fewer than ten match each query)."""
    from google.genai import types

    def event(eid: str, text: str | None, at: float) -> Event:
        part = (
            types.Part(text=text)
            if text is not None
            else types.Part(function_call=types.FunctionCall(name="lookup", args={"q": "paris"}))
        )
        return Event(
            id=eid,
            author="user",
            invocation_id="i",
            timestamp=at,
            content=types.Content(role="user", parts=[part]),
        )

    session = Session(
        id="s1",
        app_name="app",
        user_id="u1",
        events=[
            event("e1", "The weather in Paris is sunny", 1.0),
            event("e2", "I love Python programming", 2.0),
            event("e3", "私はPythonを使う", 3.0),
            event("e4", None, 4.0),
            event("e5", "東京の天気", 5.0),
            event("e6", "Email O'Brien at example.com about version 3.14", 6.0),
        ],
    )
    other_user = Session(
        id="s2", app_name="app", user_id="u2", events=[event("x1", "weather in Rome", 6.0)]
    )
    ours, theirs = CtxlogMemoryService(server.url), InMemoryMemoryService()
    for svc in (ours, theirs):
        await svc.add_session_to_memory(session)
        await svc.add_session_to_memory(session)  # again: nothing twice
        await svc.add_session_to_memory(other_user)

    async def found(svc: object, query: str) -> set[str | None]:
        got = await svc.search_memory(app_name="app", user_id="u1", query=query)  # type: ignore[attr-defined]
        return {m.id for m in got.memories}

    queries = ["weather", "PYTHON", "thon", "paris sunny", "nothing here", "東京", 'a "b *']
    # What users type: apostrophes and dots inside words, underscores only, a long run of
    # Japanese, more words and bytes than a query may hold.
    queries += [
        "O'Brien",
        "example.com",
        "3.14",
        "___",
        "東京の天気はとても良いですね今日は本当に暑い",
    ]
    queries += [" ".join(["weather"] + [f"w{i}" for i in range(40)]), "x" * 2000]
    for query in queries:
        assert await found(ours, query) == await found(theirs, query), query
    mine = await ours.search_memory(app_name="app", user_id="u1", query="sunny")
    assert mine.memories[0].content == session.events[0].content
    assert mine.memories[0].author == "user" and mine.memories[0].timestamp
    for svc in (ours, theirs):
        await svc.delete_memory(app_name="app", user_id="u1", memory_id="e1")
        await svc.delete_memory(app_name="app", user_id="u1", memory_id="never-added")
        await svc.add_session_to_memory(session)
    assert await found(ours, "weather") == await found(theirs, "weather") == set()
