"""The client against a real `ctxlog serve`: the session surface, sync and async; every
problem type as its exception; an indeterminate append retried lands once; watch resumes
without a gap or a duplicate across a server restart."""

from __future__ import annotations

import asyncio
import datetime
import http.server
import ipaddress
import json
import ssl
import threading
from pathlib import Path

import httpx
import pytest
from conftest import AsyncLosesFirstAnswer, CutsFirstWatch, LosesFirstAnswer, Server, start

import ctxlog


def test_a_session_round_trip(server: Server) -> None:
    with ctxlog.Client(server.url) as c:
        s = c.session("helpdesk", "t-1")
        ack = s.append(
            [
                {"role": "user", "text": "hi"},
                {"role": "assistant", "text": "hello"},
                {"role": "tool", "bytes": b"\x00\x01", "metadata": {"k": 1}},
            ]
        )
        assert len(ack.ids) == 3 and ack.last_seq - ack.first_seq == 2
        got = list(s.iter_records(page_size=2))
        assert [r.id for r in got] == ack.ids
        assert got[0].text == "hi" and got[2].bytes == b"\x00\x01" and got[2].metadata == {"k": 1}
        page = s.records(limit=2)
        assert page.has_more and page.next and len(page.records) == 2
        assert s.records(after=page.next).records[0].id == ack.ids[2]
        assert s.get(ack.ids[1]) is not None and s.get("missing") is None
        s.delete(ack.ids[0])
        assert [r.id for r in s.iter_records()] == ack.ids[1:]
        assert [i.session_id for i in c.sessions("helpdesk")] == ["t-1"]
        assert c.stats()["live"] == 2 and len(c.shards()) == 1
        conflicts, position = c.conflicts()
        assert conflicts == [] and position
        assert c.admin("compact") is not None


def _beyond(position: str) -> str:
    """`position` with every seq a thousand further: a position no reader was given."""
    import base64

    text = base64.urlsafe_b64decode(position + "=" * (-len(position) % 4)).decode()
    head, seqs = text.split(".", 1)
    bumped = ",".join(f"{s}={int(q) + 1000}" for s, q in (p.split("=") for p in seqs.split(",")))
    return base64.urlsafe_b64encode(f"{head}.{bumped}".encode()).decode().rstrip("=")


def test_reads_as_of_a_position_show_what_its_reader_saw_less_what_was_forgotten(
    server: Server,
) -> None:
    """Contract rule 24 through the API: a view's position, given back as `at`."""
    with ctxlog.Client(server.url) as c:
        s = c.session("helpdesk", "as-of")
        first = s.append([{"role": "user", "text": f"turn {i}"} for i in range(3)]).ids
        then = s.context()
        s.append([{"role": "user", "text": "later"}])
        c.session("helpdesk", "new").append([{"role": "user", "text": "elsewhere"}])
        s.summarize("all of it", s.context())
        s.delete(first[0])
        view = s.context(at=then.position)
        assert [r.id for r in view.records] == first[1:] and view.summary is None
        assert view.position == then.position
        assert [r.id for r in s.iter_records(page_size=1, at=then.position)] == first[1:]
        assert [i.session_id for i in c.sessions("helpdesk", at=then.position)] == ["as-of"]
        now = s.context()
        assert now.summary is not None and len(now.records) == 1
        # `last` reads the newest records now: not with `at`.
        tail_then = httpx.get(
            f"{server.url}/v1/bots/helpdesk/sessions/as-of/records",
            params={"last": 1, "at": then.position},
            timeout=30,
        )
        assert tail_then.status_code == 400 and tail_then.json()["field"] == "last"
        for read in (
            lambda: s.context(at=_beyond(then.position)),
            lambda: s.records(at=_beyond(then.position)),
            lambda: list(c.sessions("helpdesk", at=_beyond(then.position))),
        ):
            with pytest.raises(ctxlog.InvalidInput) as e:
                read()
            assert e.value.field == "at"


def test_the_changes_between_two_positions_end_at_the_second(server: Server) -> None:
    """Rule 24's changes: a watch from one position until another sends what was
    appended, summarised and tombstoned in between, then ends; nothing before or after."""
    with ctxlog.Client(server.url) as c:
        s = c.session("helpdesk", "changes")
        first = s.append([{"role": "user", "text": f"turn {i}"} for i in range(2)]).ids
        a = s.context()
        more = s.append([{"role": "user", "text": "more"}]).ids
        summary = s.summarize("two turns", a)
        s.delete(first[0])
        b = s.context().position
        s.append([{"role": "user", "text": "after b"}])
        seen = [(e.kind, e.record.id) for e in s.watch(after=a.position, until=b)]
        assert seen == [
            ("record", more[0]),
            ("record", summary.ids[0]),
            ("tombstone", first[0]),
        ]
        assert list(s.watch(after=b, until=b)) == []
        with pytest.raises(ctxlog.InvalidInput) as e:
            list(s.watch(after=a.position, until=_beyond(b)))
        assert e.value.field == "until"
        with pytest.raises(ctxlog.InvalidInput) as e:
            list(s.watch(until=b))
        assert e.value.field == "after"


def test_a_stream_until_a_position_refuses_a_replica_that_ignores_until() -> None:
    """An older replica that ignores `until` would stream past it and never end: the first
    `position` of every stream must say `until` back; a resumed one is checked again."""
    from ctxlog import _core

    state = _core.Watch("p0", "p9")
    state.headers()
    with pytest.raises(ctxlog.CtxlogError):
        state.on("position", "p0", '{"position": "p0"}')
    state = _core.Watch("p0", "p9")
    state.headers()
    assert state.on("position", "p0", '{"position": "p0", "until": "p9"}') is None
    assert state.on("position", "p3", '{"position": "p3"}') is None
    state.on("end", "p3", '{"reason": "shutdown", "resume": true}')
    assert state.ended and not state.done
    state.headers()
    with pytest.raises(ctxlog.CtxlogError):
        state.on("position", "p3", '{"position": "p3"}')
    state.headers()
    state.on("position", "p3", '{"position": "p3", "until": "p9"}')
    state.on("end", "p9", '{"reason": "until", "resume": false}')
    assert state.done and state.last == "p9"


async def test_the_async_twin(server: Server) -> None:
    async with ctxlog.AsyncClient(server.url) as c:
        s = c.session("helpdesk", "t-2")
        ack = await s.append([{"role": "user", "text": "hi"}])
        then = await s.context()
        await s.append([{"role": "user", "text": "later"}])
        assert [r.id async for r in s.iter_records(at=then.position)] == ack.ids
        assert [r.id for r in (await s.context(at=then.position)).records] == ack.ids
        assert [i.session_id async for i in c.sessions("helpdesk", at=then.position)] == ["t-2"]
        changes = s.watch(after=then.position, until=(await s.context()).position)
        assert [e.record.text async for e in changes] == ["later"]
        await s.delete((await s.records()).records[-1].id)
        assert [r.id async for r in s.iter_records()] == ack.ids
        assert (await s.get(ack.ids[0])) is not None
        assert [i.session_id async for i in c.sessions("helpdesk")] == ["t-2"]
        await s.delete(ack.ids[0])
        assert (await s.records()).records == []


def test_every_problem_type_is_its_exception(
    store: str, servers: list[Server], tmp_path: object
) -> None:
    s = start(store, "replica-a", "--max-body-bytes", "2000")
    servers.append(s)
    with ctxlog.Client(s.url) as c:
        chat = c.session("b", "s")
        with pytest.raises(ctxlog.InvalidInput) as e:
            chat.append([{"role": "user", "text": "ok"}, {"id": "x" * 600, "role": "user"}])
        assert e.value.field == "id" and e.value.record == 1 and e.value.written == "nothing"
        with pytest.raises(ctxlog.MalformedRequest):
            chat.append([{"role": "user", "colour": "red"}])
        with pytest.raises(ctxlog.TooLarge):
            chat.append([{"role": "user", "text": "x" * 5000}])
        with pytest.raises(ctxlog.NotFound):
            chat.delete("missing")
        with pytest.raises(ctxlog.InvalidInput):
            chat.records(after="not-a-cursor")
    # Fenced: a second replica with the same writer id.
    newer = start(store, "replica-a")
    servers.append(newer)
    with ctxlog.Client(s.url) as c:
        with pytest.raises(ctxlog.Fenced) as f:
            c.session("b", "s").append([{"role": "user", "text": "late"}])
        assert f.value.written == "nothing" and f.value.status == 409


def test_indeterminate_is_retried_with_the_same_ids_and_lands_once(server: Server) -> None:
    """The first answer is lost after the append landed (a proxy that drops it): the client
    retries with the same ids, and the record is there once."""
    loses = LosesFirstAnswer()
    http = httpx.Client(base_url=server.url, transport=loses, timeout=30)
    c = ctxlog.Client(server.url, http=http)
    ack = c.session("b", "s").append([{"role": "user", "text": "once"}])
    assert loses.lost == 1
    records = list(c.session("b", "s").iter_records())
    assert [r.id for r in records] == ack.ids and len(records) == 1
    c.close()


def test_a_definite_failure_is_never_retried(server: Server) -> None:
    sent = {"n": 0}
    real = httpx.HTTPTransport()

    class Counts(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            sent["n"] += 1
            return real.handle_request(request)

    c = ctxlog.Client(server.url, http=httpx.Client(base_url=server.url, transport=Counts()))
    with pytest.raises(ctxlog.InvalidInput):
        c.session("b", "s").append([{"id": "", "role": "user"}])
    assert sent["n"] == 1
    c.close()


def test_a_proxy_s_gateway_timeout_is_unknown_and_retried_with_the_same_ids(server: Server) -> None:
    """A proxy in front of the replica forwards the first append, which lands, then answers
    504 with an HTML page of its own: that is no problem of the replica's, and may have come
    after the commit, so the client treats it as unknown and retries with the same ids."""
    real = httpx.HTTPTransport()
    answered = {"n": 0}

    class GatewayTimesOut(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            resp = real.handle_request(request)
            resp.read()
            answered["n"] += 1
            if answered["n"] == 1:
                html = {"content-type": "text/html"}
                return httpx.Response(504, headers=html, content=b"<h1>504</h1>")
            return resp

    http = httpx.Client(base_url=server.url, transport=GatewayTimesOut())
    c = ctxlog.Client(server.url, http=http)
    c.session("b", "proxy").append([{"id": "p-1", "role": "user", "text": "once"}])
    assert [r.id for r in c.session("b", "proxy").iter_records()] == ["p-1"]
    assert answered["n"] >= 2
    c.close()


def test_a_definite_refusal_after_an_indeterminate_attempt_is_unknown(
    store: str, servers: list[Server]
) -> None:
    """Attempt 1 lands and its answer is lost; before attempt 2 another process takes the
    replica's writer id, so attempt 2 is refused as `Fenced`. Attempt 1 may have landed
    (it did): the caller is told `written == "unknown"`, never "nothing"."""
    old = start(store, "replica-a")
    servers.append(old)
    loses = LosesFirstAnswer(then=lambda: servers.append(start(store, "replica-a")))
    c = ctxlog.Client(old.url, http=httpx.Client(base_url=old.url, transport=loses, timeout=30))
    with pytest.raises(ctxlog.Indeterminate) as e:
        c.session("b", "s").append([{"id": "r-1", "role": "user", "text": "once"}])
    assert e.value.written == "unknown" and isinstance(e.value.__cause__, ctxlog.Fenced)
    with ctxlog.Client(servers[-1].url) as newer:
        assert [r.id for r in newer.session("b", "s").iter_records()] == ["r-1"]
    c.close()


async def test_the_async_retry_after_an_indeterminate_attempt_is_unknown(
    store: str, servers: list[Server]
) -> None:
    old = start(store, "replica-a")
    servers.append(old)
    loses = AsyncLosesFirstAnswer(then=lambda: servers.append(start(store, "replica-a")))
    http = httpx.AsyncClient(base_url=old.url, transport=loses, timeout=30)
    async with ctxlog.AsyncClient(old.url, http=http) as c:
        with pytest.raises(ctxlog.Indeterminate) as e:
            await c.session("b", "s").append([{"id": "r-1", "role": "user", "text": "once"}])
    assert e.value.written == "unknown" and isinstance(e.value.__cause__, ctxlog.Fenced)


def test_watch_without_after_resumes_from_where_its_first_stream_started(server: Server) -> None:
    """The first stream drops right after the server said where it starts, before any
    record; a record appended while the client is away is still delivered (the reconnect
    resumes from that starting position, not from "now")."""
    writer = ctxlog.Client(server.url)
    chat = writer.session("bot", "from-start")
    appended: list[str] = []
    cut = CutsFirstWatch(
        then=lambda: appended.extend(chat.append([{"role": "user", "text": "away"}]).ids)
    )
    seen: list[str] = []
    done = threading.Event()

    def watch() -> None:
        http = httpx.Client(base_url=server.url, transport=cut, timeout=30)
        with ctxlog.Client(server.url, http=http) as c:
            for ev in c.session("bot", "from-start").watch(reconnects=100, backoff=0.02):
                seen.append(ev.record.id)
                if len(seen) == 2:
                    done.set()
                    return

    threading.Thread(target=watch, daemon=True).start()
    assert cut.cut.wait(30), "the stream sent no `position` event first"
    appended.extend(chat.append([{"role": "user", "text": "back"}]).ids)
    assert done.wait(30), f"the watch saw {seen} of {appended}"
    assert seen == appended
    writer.close()


class _EndingStreams(http.server.BaseHTTPRequestHandler):
    """Watch streams that a server had to stop: the first ends (resumable) past its last
    record, the second ends as not resumable. Each request's `Last-Event-ID` is kept."""

    asked: list[str | None] = []
    streams = [
        b"event: position\nid: P0\ndata: {}\n\n"
        b"event: record\nid: P1\ndata: %s\n\n"
        b'event: end\nid: P2\ndata: {"reason": "slow", "resume": true}\n\n',
        b"event: position\nid: P2\ndata: {}\n\n"
        b'event: end\nid: P2\ndata: {"reason": "behind", "resume": false}\n\n',
    ]

    def do_GET(self) -> None:
        n = len(self.asked)
        self.asked.append(self.headers.get("last-event-id"))
        _send(self, 200, "text/event-stream", self.streams[min(n, 1)])

    def log_message(self, *args: object) -> None:
        pass


def _send(h: http.server.BaseHTTPRequestHandler, status: int, kind: str, body: bytes) -> None:
    """Answer `h` with `body` (its `%s`: the record below as JSON)."""
    if b"%s" in body:
        body = body % json.dumps(_RECORD).encode()
    h.send_response(status)
    h.send_header("content-type", kind)
    h.send_header("content-length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


_RECORD = {
    "id": "r-1",
    "bot_id": "b",
    "session_id": "s",
    "role": "user",
    "content_type": "text/plain",
    "kind": "put",
    "shard": "x",
    "seq": 1,
    "epoch": 1,
    "hlc": 1,
    "text": "hi",
}


def test_an_ended_stream_is_resumed_from_its_end_and_a_final_end_raises() -> None:
    """A stream the server ends with `resume: true` is reopened from the end's position
    (past the last record), not counted as a failure; one that cannot be resumed raises
    `WatchEnded` naming the reason (a fake SSE server on 127.0.0.1: the real one ends
    streams only under shutdown or a slow reader)."""
    _EndingStreams.asked = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EndingStreams)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        with ctxlog.Client(url, timeout=10) as c:
            seen: list[str] = []
            with pytest.raises(ctxlog.WatchEnded) as e:
                for ev in c.session("b", "s").watch(reconnects=0):
                    seen.append(ev.record.id)
        assert seen == ["r-1"] and _EndingStreams.asked == [None, "P2"]
        assert e.value.reason == "behind" and e.value.position == "P2"
    finally:
        srv.shutdown()
        srv.server_close()


class _UnservedStreams(_EndingStreams):
    """What a replica whose view cannot serve a stream answers: a 503 at the open, a stream
    it ends as `unavailable` before any record; then one record and a shutdown's end, then
    an end that cannot be resumed. `streams` is set per test; the last one repeats."""

    asked: list[str | None] = []
    streams: list[bytes | None] = []

    def do_GET(self) -> None:
        n = len(self.asked)
        self.asked.append(self.headers.get("last-event-id"))
        body = self.streams[min(n, len(self.streams) - 1)]
        if body is None:
            problem = json.dumps(
                {
                    "type": "urn:ctxlog:problem:replica-unavailable",
                    "title": "Replica unavailable",
                    "status": 503,
                    "detail": "the replica's view cannot be refreshed",
                    "written": "nothing",
                }
            ).encode()
            _send(self, 503, "application/problem+json", problem)
            return
        _send(self, 200, "text/event-stream", body)


_UNAVAILABLE = (
    b"event: position\nid: P0\ndata: {}\n\n"
    b'event: end\nid: P0\ndata: {"reason": "unavailable", "resume": true}\n\n'
)


def _unserved(streams: list[bytes | None], reconnects: int) -> tuple[list[str], BaseException]:
    _UnservedStreams.asked, _UnservedStreams.streams = [], streams
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _UnservedStreams)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    seen: list[str] = []
    try:
        with ctxlog.Client(url, timeout=10) as c, pytest.raises(ctxlog.CtxlogError) as e:
            for ev in c.session("b", "s").watch(reconnects=reconnects, backoff=0):
                seen.append(ev.record.id)
        return seen, e.value
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_stream_the_replica_cannot_serve_is_reopened_then_given_up() -> None:
    """A 503 at the open and an `unavailable` end before any record are failed tries,
    reopened (not raised at once, as a 503 was); a record resets the count, and a
    shutdown's end is taken up at once; a replica that never serves the stream is given up
    after `reconnects` tries, not retried for ever (a fake SSE server on 127.0.0.1: the
    real one answers so only while its view cannot be refreshed)."""
    record_then_shutdown = (
        b"event: position\nid: P0\ndata: {}\n\n"
        b"event: record\nid: P1\ndata: %s\n\n"
        b'event: end\nid: P1\ndata: {"reason": "shutdown", "resume": true}\n\n'
    )
    behind = (
        b"event: position\nid: P1\ndata: {}\n\n"
        b'event: end\nid: P1\ndata: {"reason": "behind", "resume": false}\n\n'
    )
    seen, e = _unserved([None, _UNAVAILABLE, record_then_shutdown, behind], reconnects=2)
    assert seen == ["r-1"] and isinstance(e, ctxlog.WatchEnded) and e.reason == "behind"
    assert _UnservedStreams.asked == [None, None, "P0", "P1"]

    seen, e = _unserved([None, _UNAVAILABLE], reconnects=3)
    assert seen == [] and not isinstance(e, ctxlog.WatchEnded)
    assert len(_UnservedStreams.asked) == 4, _UnservedStreams.asked


def test_watch_resumes_across_a_server_restart(store: str, servers: list[Server]) -> None:
    """One `watch()` iterator through a restart of its server (same address): it reopens
    the stream from its last event by itself — no gap, no duplicate."""
    a = start(store, "replica-a")
    b = start(store, "replica-b")
    servers.extend([a, b])
    writer = ctxlog.Client(a.url)
    chat = writer.session("bot", "w")
    seen: list[str] = []
    first_half = threading.Event()
    done = threading.Event()

    def watch(after: str | None) -> None:
        with ctxlog.Client(b.url) as c:
            for ev in c.session("bot", "w").watch(after=after, reconnects=100, backoff=0.02):
                seen.append(ev.record.id)
                if len(seen) == 10:
                    first_half.set()
                if len(seen) == 20:
                    done.set()
                    return

    # From the position of a read before the appends: nothing appended after it is missed,
    # however late the stream opens.
    with ctxlog.Client(b.url) as reader:
        start_at = reader.session("bot", "w").records().position
    t = threading.Thread(target=watch, args=(start_at,), daemon=True)
    t.start()
    ids = [chat.append([{"role": "user", "text": str(i)}]).ids[0] for i in range(10)]
    assert first_half.wait(60)
    b.kill()
    more = [chat.append([{"role": "user", "text": str(i)}]).ids[0] for i in range(10, 20)]
    b2 = start(store, "replica-b", listen=b.url.removeprefix("http://"))
    servers.append(b2)
    assert done.wait(60), f"the watch saw {len(seen)} of 20 after the restart"
    t.join(60)
    assert seen == ids + more
    writer.close()


async def test_the_async_watch_resumes_across_a_server_restart(
    store: str, servers: list[Server]
) -> None:
    """The async twin of the case above: one `watch()` iterator through a restart."""
    a = start(store, "replica-a")
    b = start(store, "replica-b")
    servers.extend([a, b])
    seen: list[str] = []
    first_half = asyncio.Event()

    async def watch(after: str | None) -> None:
        async with ctxlog.AsyncClient(b.url) as c:
            async for ev in c.session("bot", "aw").watch(after=after, reconnects=100, backoff=0.02):
                seen.append(ev.record.id)
                if len(seen) == 10:
                    first_half.set()
                if len(seen) == 20:
                    return

    async with ctxlog.AsyncClient(a.url) as writer:
        chat = writer.session("bot", "aw")
        start_at = (await chat.records()).position
        task = asyncio.create_task(watch(start_at))
        ids = [(await chat.append([{"role": "user", "text": str(i)}])).ids[0] for i in range(10)]
        await asyncio.wait_for(first_half.wait(), 60)
        b.kill()
        more = [
            (await chat.append([{"role": "user", "text": str(i)}])).ids[0] for i in range(10, 20)
        ]
        b2 = start(store, "replica-b", listen=b.url.removeprefix("http://"))
        servers.append(b2)
        await asyncio.wait_for(task, 60)
    assert seen == ids + more


def _self_signed(dir: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made for this test."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ctxlog test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = dir / "cert.pem", dir / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_tls_from_a_certificate_and_key(store: str, servers: list[Server], tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    s = start(store, "replica-tls", "--tls-cert", str(cert), "--tls-key", str(key))
    servers.append(s)
    url = s.url.replace("http://", "https://")
    trusted = ssl.create_default_context(cafile=str(cert))
    with ctxlog.Client(url, verify=trusted) as c:
        chat = c.session("b", "tls")
        chat.append([{"id": "t-1", "role": "user", "text": "over TLS"}])
        assert [r.text for r in chat.iter_records()] == ["over TLS"]
    # A client that does not trust the certificate gets nothing through, and plain HTTP to
    # the TLS port is no answer.
    with ctxlog.Client(url) as c, pytest.raises(ctxlog.CtxlogError):
        c.session("b", "tls").records()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{s.url}/healthz", timeout=10)


def test_search_finds_live_records_of_its_bot_best_first(server: Server) -> None:
    """Contract rule 26 through the client: BM25 order (reasoned by hand: the shorter
    record holding `refund` first), filters, pages, and a tombstoned record gone."""
    with ctxlog.Client(server.url) as c:
        s = c.session("searcher", "s")
        s.append([{"id": "long", "role": "user", "text": "refund my order please now"}])
        c.session("searcher", "t").append([{"id": "short", "role": "tool", "text": "Refund it"}])
        c.session("other-bot", "s").append([{"id": "theirs", "role": "user", "text": "refund"}])
        page = c.search("searcher", "refund")
        assert [h.record.id for h in page.hits] == ["short", "long"]
        assert page.hits[0].snippet == "Refund it" and page.hits[0].matched == ["refund"]
        assert [h.record.id for h in c.search("searcher", "refund", roles=["user"]).hits] == [
            "long"
        ]
        first = c.search("searcher", "refund", k=1)
        assert first.next is not None
        rest = c.search("searcher", "refund", k=1, after=first.next)
        assert [h.record.id for h in rest.hits] == ["long"] and rest.next is None
        s.delete("long")
        assert [h.record.id for h in c.search("searcher", "refund").hits] == ["short"]
        with pytest.raises(ctxlog.InvalidInput) as e:
            c.search("searcher", '"unclosed')
        assert e.value.field == "query"


def test_vectors_are_the_callers_and_rank_by_their_models_metric(server: Server) -> None:
    """Contract rule 27 through the client: embeddings in a record's batch and later, a
    cosine ranking worked out by hand, embedding again replaces, a hybrid fused by
    reciprocal rank, a wrong dimension refused by field, embeddings in no view, and a
    forgotten record's vector gone."""
    with ctxlog.Client(server.url) as c:
        s = c.session("vectors", "s")
        s.append(
            [
                {"id": "a", "role": "user", "text": "refund my order"},
                ctxlog.embedding("a", "mini", [1.0, 0.0]),
                {"id": "b", "role": "user", "text": "refund refund order"},
                ctxlog.embedding("b", "mini", [0.6, 0.8]),
            ]
        )
        s.append([ctxlog.embedding("b", "mini", [0.0, 1.0])])  # replaces b's vector
        near = c.search("vectors", vector=[1.0, 0.0], model="mini")
        assert [(h.record.id, h.score) for h in near.hits] == [("a", 1.0), ("b", 0.0)]
        assert [r.id for r in s.iter_records()] == ["a", "b"], "embeddings are in no view"
        # Text ranks b (two `refund`s), a; vectors a, b: a = b = 1/61 + 1/62, the tie in
        # the log's order.
        both = c.search("vectors", "refund", vector=[1.0, 0.0], model="mini")
        assert [h.record.id for h in both.hits] == ["a", "b"]
        assert both.hits[0].score == 1 / 61 + 1 / 62 and both.hits[0].matched == ["refund"]
        with pytest.raises(ctxlog.InvalidInput) as e:
            c.search("vectors", vector=[1.0, 0.0, 0.0], model="mini")
        assert e.value.field == "vector" and e.value.written == "nothing"
        with pytest.raises(ctxlog.InvalidInput) as e:
            s.append([ctxlog.embedding("a", "mini", [1.0], metric="manhattan")])
        assert e.value.field == "metric"
        with pytest.raises(TypeError):
            c.search("vectors")
        with pytest.raises(ctxlog.InvalidInput) as e:
            c.search("vectors", vector=[float("nan"), 0.0], model="mini")
        assert e.value.field == "vector" and e.value.written == "nothing"
        s.delete("a")
        assert [h.record.id for h in c.search("vectors", vector=[1.0, 0.0], model="mini").hits] == [
            "b"
        ]


async def test_search_async_twin(server: Server) -> None:
    async with ctxlog.AsyncClient(server.url) as c:
        await c.session("searcher-2", "s").append([{"role": "user", "text": "where is my parcel"}])
        page = await c.search("searcher-2", "parc*")
        assert [h.record.text for h in page.hits] == ["where is my parcel"]
        assert page.hits[0].matched == ["parcel"]
        parcel = page.hits[0].record.id
        await c.session("searcher-2", "s").append([ctxlog.embedding(parcel, "m", [3.0, 4.0])])
        near = await c.search("searcher-2", vector=[0.0, 1.0], model="m")
        assert [(h.record.id, h.score) for h in near.hits] == [(parcel, 0.8)]
