"""The client against a real `ctxlog serve`: the session surface, sync and async; every
problem type as its exception; an indeterminate append retried lands once; watch resumes
without a gap or a duplicate across a server restart."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
from pathlib import Path

import httpx
import pytest
from conftest import LosesFirstAnswer, Server, start

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


async def test_the_async_twin(server: Server) -> None:
    async with ctxlog.AsyncClient(server.url) as c:
        s = c.session("helpdesk", "t-2")
        ack = await s.append([{"role": "user", "text": "hi"}])
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
