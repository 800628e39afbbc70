"""A local replica (`ctxlog.serve`, `Client.local`, the adapters' `.local`): `ctxlog serve`
run as a child of the test process on a SQLite file. The writer picker gives `local-1` to
the first and `local-2` to a concurrent second (two replicas that keep the contract), and
`local-1` again once the first stopped; a server whose parent is SIGKILLed exits by itself;
a missing binary, a child that exits or stays silent, and one that ignores SIGTERM are
errors or kills with a deadline. Every wait here has a deadline."""

from __future__ import annotations

import asyncio
import fcntl
import json
import operator
import os
import queue
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict, TypeVar

import httpx
import pytest
from conftest import BIN

import ctxlog
from ctxlog import _local

T = TypeVar("T")

# The namespace of the UUIDv5 that maps a writer id to its shard (ctxlog-core's ids.rs).
SHARD_NAMESPACE = uuid.UUID("6c0d9a3e-54c1-4b7e-9f0a-c7a10d3b5e21")
SRC = str(Path(ctxlog.__file__).resolve().parents[1])
# Resolved before any test changes PATH.
REAL_BIN = shutil.which(BIN)


def shard_of(writer: str) -> str:
    return str(uuid.uuid5(SHARD_NAMESPACE, writer))


def eventually(check: Callable[[], T], timeout: float = 30.0, what: str = "") -> T:
    """`check()`'s first truthy answer, polled until `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie nobody reaped yet counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def refuses(url: str) -> bool:
    try:
        httpx.get(f"{url}/readyz", timeout=2)
    except httpx.TransportError:
        return True
    return False


def lock_is_free(store: Path, n: int) -> bool:
    """Whether `local-n`'s lock file of `store` can be taken (and is let go at once)."""
    fd = os.open(f"{store}.ctxlog-writer-{n}.lock", os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def has_until_stdin_closes() -> bool:
    out = subprocess.run([BIN, "serve", "--help"], capture_output=True, text=True, timeout=30)
    return "--until-stdin-closes" in out.stdout


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "agents.db"


@pytest.fixture
def served() -> Iterator[list[ctxlog.LocalServer]]:
    """Servers a test started: stopped after it, whatever it did."""
    started: list[ctxlog.LocalServer] = []
    yield started
    for s in started:
        s.stop(timeout=5)


def fake_binary(dir: Path, body: str) -> Path:
    """An executable shell script standing in for `ctxlog` (for what the real one does
    not do: stay silent, ignore SIGTERM)."""
    path = dir / "fake-ctxlog"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return path


# ---- one local client ------------------------------------------------------------------------


def test_a_local_client_appends_and_reads_back(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(db.parent)
    with ctxlog.Client.local("agents.db") as c:  # a plain relative path: a SQLite file
        server = c.server
        assert server is not None
        assert server.writer == "local-1" and server.store == f"sqlite:{db}"
        chat = c.session("helpdesk", "t-1")
        ack = chat.append([{"role": "user", "text": "hi"}])
        assert ack.shard == shard_of("local-1")
        assert [r.text for r in chat.iter_records()] == ["hi"]
        assert not lock_is_free(db, 1)
    # Stopped gracefully by close(), and its writer id let go.
    assert server.exit_code == 0 and gone(server.pid)
    assert refuses(server.url) and lock_is_free(db, 1)
    server.stop()  # idempotent
    with ctxlog.Client.local(db) as again:  # a Path: the same file, the same shard
        assert again.server is not None and again.server.writer == "local-1"
        assert [r.text for r in again.session("helpdesk", "t-1").iter_records()] == ["hi"]
        assert len(again.shards()) == 1


# ---- the writer picker -------------------------------------------------------------------------


def test_a_local_server_answers_only_the_process_that_started_it(
    db: Path, served: list[ctxlog.LocalServer]
) -> None:
    """Another user of the machine (or a web page reaching 127.0.0.1) finds the port, not
    the token: refused, nothing written."""
    s = ctxlog.serve(db)
    served.append(s)
    record = {"id": "r", "role": "user", "text": "x"}
    for token in (None, "wrong", s.token + "x"):
        with ctxlog.Client(s.url, token=token, retry=ctxlog.Retry(attempts=1)) as c:
            with pytest.raises(ctxlog.Unauthorized):
                c.session("bot", "s").append([record])
            with pytest.raises(ctxlog.Unauthorized):
                list(c.sessions("bot"))
    for headers in ({}, {"authorization": "Bearer wrong"}):
        mcp = httpx.post(f"{s.url}/mcp", json={}, headers=headers, timeout=10)
        assert mcp.status_code == 401, mcp.text
    with ctxlog.Client.local(db) as owner:  # a second local replica, with its own token
        assert owner.server is not None and owner.server.token != s.token
        assert list(owner.session("bot", "s").iter_records()) == []
    with ctxlog.Client(s.url, token=s.token) as c:
        c.session("bot", "s").append([record])
        assert [r.id for r in c.session("bot", "s").iter_records()] == ["r"]


def test_concurrent_local_replicas_pick_their_own_writers_and_a_restart_reuses_one(
    db: Path, served: list[ctxlog.LocalServer]
) -> None:
    a = ctxlog.serve(db)
    served.append(a)
    b = ctxlog.serve(str(db))
    served.append(b)
    assert (a.writer, b.writer) == ("local-1", "local-2")
    ca, cb = ctxlog.Client(a.url, token=a.token), ctxlog.Client(b.url, token=b.token)
    try:
        # Each one's ack names its own shard, and what one wrote is read through the other
        # (replicas converge within their poll interval).
        from_a = ca.session("bot", "s").append([{"id": "via-a", "role": "user", "text": "a"}])
        from_b = cb.session("bot", "s").append([{"id": "via-b", "role": "user", "text": "b"}])
        assert (from_a.shard, from_b.shard) == (shard_of("local-1"), shard_of("local-2"))

        def ids(c: ctxlog.Client) -> set[str]:
            return {r.id for r in c.session("bot", "s").iter_records()}

        eventually(lambda: ids(ca) == ids(cb) == {"via-a", "via-b"}, what="each one's in both")
        writers = {s["shard"]: s["writer"] for s in ca.shards()}
        assert writers == {shard_of("local-1"): "local-1", shard_of("local-2"): "local-2"}
    finally:
        ca.close()
    a.stop()
    # The first one's id is free again: a new replica takes it (its shard, not a third).
    c = ctxlog.serve(db)
    served.append(c)
    assert c.writer == "local-1"
    with ctxlog.Client(c.url, token=c.token) as cc:
        ack = cc.session("bot", "s").append([{"id": "via-c", "role": "user", "text": "c"}])
        assert ack.shard == shard_of("local-1")
        assert len(cc.shards()) == 2
    # Neither fenced the other: b still writes.
    assert cb.session("bot", "s").append([{"role": "user", "text": "b2"}]).shard == shard_of(
        "local-2"
    )
    cb.close()


def test_an_explicit_local_writer_takes_the_pickers_lock(
    db: Path, served: list[ctxlog.LocalServer]
) -> None:
    a = ctxlog.serve(db)
    served.append(a)
    assert a.writer == "local-1"
    # Taking `local-1` explicitly would fence `a`: refused, nothing started.
    with pytest.raises(ctxlog.WriterInUse):
        ctxlog.serve(db, writer="local-1")
    # Another id is the caller's to choose; `local-N` ids are still the picker's.
    named = ctxlog.serve(db, writer="app-1")
    served.append(named)
    assert named.writer == "app-1"
    taken = ctxlog.serve(db, writer="local-3")
    served.append(taken)
    picked = ctxlog.serve(db)
    served.append(picked)
    assert picked.writer == "local-2"
    assert not lock_is_free(db, 3)


def test_a_store_that_is_not_a_local_file_needs_a_writer(db: Path) -> None:
    for store in ["s3://bucket/agents.lance?region=eu-west-1", "memory://x", str(db) + ".lance"]:
        with pytest.raises(ctxlog.WriterRequired) as e:
            ctxlog.serve(store)
        assert e.value.field == "writer" and e.value.written == "nothing"
        assert isinstance(e.value, ctxlog.InvalidInput)


def test_store_arguments(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(db.parent)
    real = os.path.realpath(db)
    assert _local.store_uri("agents.db") == (f"sqlite:{db}", real)
    assert _local.store_uri(Path("agents.db")) == (f"sqlite:{db}", real)
    assert _local.store_uri(db) == (f"sqlite:{db}", real)
    assert _local.store_uri(f"sqlite:{db}") == (f"sqlite:{db}", real)
    assert _local.store_uri("sqlite:agents.db") == ("sqlite:agents.db", real)
    assert _local.store_uri(f"sqlite://{db}") == (f"sqlite://{db}", real)
    assert _local.store_uri("x.lance") == (f"lance:{db.parent / 'x.lance'}", None)
    for uri in ["s3://b/x.lance?region=r", "lance:/data/x.lance", "file:///data/x.db"]:
        assert _local.store_uri(uri) == (uri, None)
    with pytest.raises(ctxlog.InvalidInput):
        _local.store_uri("")


# ---- the binary ----------------------------------------------------------------------------------


def test_a_missing_binary_raises_the_typed_error(
    db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CTXLOG_BIN", str(tmp_path / "no-such-ctxlog"))
    with pytest.raises(ctxlog.BinaryNotFound) as e:
        ctxlog.Client.local(db)
    assert "CTXLOG_BIN" in str(e.value) and isinstance(e.value, ctxlog.LocalServerError)
    # Without CTXLOG_BIN: none beside the interpreter, none on PATH.
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    monkeypatch.delenv("CTXLOG_BIN")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(sysconfig, "get_path", lambda name, *a, **k: str(scripts))
    with pytest.raises(ctxlog.BinaryNotFound):
        ctxlog.AsyncClient.local(db)
    assert lock_is_free(db, 1)  # nothing was held for it
    # The one the wheel installs beside the interpreter is found.
    real = REAL_BIN
    assert real is not None, f"{BIN} is not an executable"
    (scripts / "ctxlog").symlink_to(real)
    assert _local.find_binary() == str(scripts / "ctxlog")
    with ctxlog.serve(db) as s, ctxlog.Client(s.url, token=s.token) as c:
        assert c.ready()


def test_a_server_that_exits_before_listening_is_an_error_with_its_exit_code_and_stderr(
    tmp_path: Path,
) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not a SQLite database, not even close" * 100)
    started = time.monotonic()
    with pytest.raises(ctxlog.LocalServerError) as e:
        ctxlog.serve(junk)
    assert time.monotonic() - started < 30
    assert e.value.exit_code not in (None, 0), e.value
    assert e.value.stderr and e.value.stderr.splitlines()[-1] in str(e.value)
    assert lock_is_free(junk, 1)  # the failed start let its writer id go


def test_a_silent_child_is_killed_at_the_start_deadline(tmp_path: Path, db: Path) -> None:
    pidfile = tmp_path / "pid"
    fake = fake_binary(tmp_path, f'echo $$ > "{pidfile}"\nexec sleep 600')
    started = time.monotonic()
    with pytest.raises(ctxlog.LocalServerError) as e:
        ctxlog.serve(db, binary=fake, start_timeout=1)
    assert time.monotonic() - started < 20
    assert "within 1 s" in str(e.value) and e.value.exit_code == -signal.SIGKILL
    assert gone(int(pidfile.read_text()))
    assert lock_is_free(db, 1)


def test_a_server_that_ignores_sigterm_is_killed_at_the_stop_deadline(
    tmp_path: Path, db: Path
) -> None:
    # Ignores SIGTERM and never reads stdin: only the kill stops it.
    fake = fake_binary(
        tmp_path,
        'trap \'\' TERM\necho \'{"listening": "127.0.0.1:9", "token": "t"}\'\nexec sleep 600',
    )
    s = ctxlog.serve(db, binary=fake)
    assert s.url == "http://127.0.0.1:9" and s.exit_code is None
    errors: list[BaseException] = []

    def stop() -> None:
        try:
            s.stop(timeout=1)
        except BaseException as e:  # noqa: BLE001 - handed to the test's thread
            errors.append(e)

    # Several threads stop it at once: one kills it, the others wait for that.
    started = time.monotonic()
    threads = [threading.Thread(target=stop) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    assert time.monotonic() - started < 20
    assert s.exit_code == -signal.SIGKILL and gone(s.pid)
    assert lock_is_free(db, 1)


# ---- dying with the parent -----------------------------------------------------------------------


def readline_within(stream: Any, timeout: float) -> str:
    got: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: got.put(stream.readline()), daemon=True).start()
    try:
        return got.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no line within {timeout:g} s") from None


def test_a_sigkilled_parent_leaves_no_server_running(db: Path) -> None:
    if not has_until_stdin_closes():
        pytest.skip(f"{BIN} serve has no --until-stdin-closes (`serve --help` does not name it)")
    script = (
        "import json, sys, ctxlog\n"
        "s = ctxlog.serve(sys.argv[1])\n"
        "print(json.dumps({'pid': s.pid, 'url': s.url}), flush=True)\n"
        "sys.stdin.read()\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = readline_within(parent.stdout, 60)
        assert line, f"the parent exited {parent.wait(30)} before it served"
        server = json.loads(line)
        assert ctxlog.Client(server["url"]).ready()
        parent.kill()  # no atexit, no stop(): only the closed stdin tells the server
        parent.wait(30)
        eventually(lambda: gone(server["pid"]), what="the orphaned server to exit")
        assert refuses(server["url"])
        # The server held the writer lock until it exited; it is free now.
        assert lock_is_free(db, 1)
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)


def test_a_forked_child_neither_stops_nor_holds_the_parents_server(db: Path) -> None:
    """A child forked after the start (a multiprocessing worker, say) that exits, or calls
    `stop()`, does not stop the parent's server; while it lives on, it holds neither the
    writer lock nor the server's stdin (the server still dies with the parent)."""
    s = ctxlog.serve(db)
    try:
        done_r, done_w = os.pipe()
        hold_r, hold_w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads
            pid = os.fork()
        if pid == 0:  # the child: what its exit would do, then live on
            try:
                os.close(done_r)
                os.close(hold_w)  # so that the parent's close is the EOF it waits for
                _local._stop_all()
                s.stop()
                os.write(done_w, b"done\n")
                os.read(hold_r, 1)
            finally:
                os._exit(0)
        os.close(done_w)
        os.close(hold_r)
        done = os.fdopen(done_r)
        try:
            assert readline_within(done, 30) == "done\n", "the forked child did not finish"
            with ctxlog.Client(s.url, token=s.token) as c:
                assert c.ready() and s.exit_code is None
            if has_until_stdin_closes():
                stdin = s._proc.stdin
                assert stdin is not None
                stdin.close()  # the parent's end only: EOF, though the child lives
                eventually(lambda: s.exit_code is not None, what="EOF with a fork alive")
            s.stop()
            assert lock_is_free(db, 1)
        finally:
            os.close(hold_w)
            done.close()
            try:
                eventually(lambda: os.waitpid(pid, os.WNOHANG)[0] == pid, what="the fork's exit")
            except AssertionError:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise
    finally:
        s.stop()


# ---- async, and the adapters ---------------------------------------------------------------------


def test_the_async_local_client_works_from_two_event_loops(db: Path) -> None:
    async def make() -> ctxlog.AsyncClient:
        return ctxlog.AsyncClient.local(db)  # made inside one loop, used by others

    c = asyncio.run(make())
    server = c.server
    assert server is not None
    s = c.session("b", "loops")
    first = asyncio.run(s.append([{"role": "user", "text": "1"}])).ids
    second = asyncio.run(s.append([{"role": "user", "text": "2"}])).ids

    async def read() -> list[str]:
        return [r.id async for r in s.iter_records()]

    assert asyncio.run(read()) == first + second
    asyncio.run(c.close())
    assert server.exit_code == 0 and lock_is_free(db, 1)
    asyncio.run(c.close())  # idempotent


async def test_the_async_local_client_stops_its_server_without_blocking_the_loop(
    tmp_path: Path, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A server that takes a second to shut down: the loop runs on meanwhile.
    fake = fake_binary(
        tmp_path,
        "trap 'sleep 1; exit 0' TERM\n"
        'echo \'{"listening": "127.0.0.1:9", "token": "t"}\'\n'
        "while :; do sleep 0.05; done",
    )
    monkeypatch.setenv("CTXLOG_BIN", str(fake))
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    async with ctxlog.AsyncClient.local(db) as c:
        server = c.server
        assert server is not None
        ticker = asyncio.create_task(tick())
        started = time.monotonic()
    took = time.monotonic() - started
    ticker.cancel()
    assert server.exit_code == 0 and took >= 0.9
    assert ticks >= 20, f"the loop ticked {ticks} times in the {took:.2f} s of close()"


def test_the_langgraph_saver_local(db: Path) -> None:
    from langgraph.graph import END, START, StateGraph

    from ctxlog.langgraph import CtxlogSaver

    class State(TypedDict):
        steps: Annotated[list[str], operator.add]

    g = StateGraph(State)
    g.add_node("hello", lambda s: {"steps": ["hello"]})
    g.add_edge(START, "hello")
    g.add_edge("hello", END)
    with CtxlogSaver.local(db) as saver:
        server = saver.server
        assert server is not None and server.writer == "local-1"
        graph = g.compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "t-1"}}
        assert graph.invoke({"steps": []}, config) == {"steps": ["hello"]}
        assert saver.get_tuple(config) is not None
    assert server.exit_code == 0 and lock_is_free(db, 1)
    saver.close()  # idempotent

    async def in_a_loop() -> None:
        async with CtxlogSaver.local(db) as again:
            assert await again.aget_tuple(config) is not None
            assert again.server is not None
            server2 = again.server
        assert server2.exit_code == 0

    asyncio.run(in_a_loop())


def test_the_openai_agents_session_local(db: Path) -> None:
    from ctxlog.openai_agents import CtxlogSession

    session = CtxlogSession.local("user-42", db, bot="agents")
    server = session._client.server
    assert server is not None and server.writer == "local-1"
    asyncio.run(session.add_items([{"role": "user", "content": "hi"}]))
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "hi"}]
    asyncio.run(session.close())
    assert server.exit_code == 0 and lock_is_free(db, 1)
    asyncio.run(session.close())  # idempotent
    # Its records are the session's and bot's the caller named.
    with ctxlog.Client.local(db) as c:
        assert [i.session_id for i in c.sessions("agents")] == ["user-42"]


def test_the_adk_session_service_local(db: Path) -> None:
    from ctxlog.adk import CtxlogSessionService

    async def run() -> ctxlog.LocalServer:
        async with CtxlogSessionService.local(db) as service:
            made = await service.create_session(app_name="a", user_id="u", state={"k": 1})
            got = await service.get_session(app_name="a", user_id="u", session_id=made.id)
            assert got is not None and got.state == {"k": 1}
            assert service.client.server is not None
            return service.client.server

    server = asyncio.run(run())
    assert server.exit_code == 0 and lock_is_free(db, 1)
    service = CtxlogSessionService.local(db)
    asyncio.run(service.close())
    asyncio.run(service.close())  # idempotent
