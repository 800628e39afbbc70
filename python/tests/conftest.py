"""A real `ctxlog serve` per test, on 127.0.0.1, on SQLite and (when `CTXLOG_S3_ENDPOINT`
names the loopback S3 server) on Lance on S3. `CTXLOG_BIN` is the `ctxlog` binary."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

import ctxlog

BIN = os.environ.get("CTXLOG_BIN", "ctxlog")
S3 = os.environ.get("CTXLOG_S3_ENDPOINT")
BACKENDS = ["sqlite"] + (["lance_s3"] if S3 else [])


def store_uri(backend: str, root: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:{root / 'store.db'}"
    assert S3
    bucket = f"ctxlog-py-{uuid.uuid4().hex[:20]}"
    httpx.put(f"{S3}/{bucket}", timeout=30).raise_for_status()
    options = {
        "aws_endpoint": S3,
        "aws_region": "us-east-1",
        "aws_access_key_id": "ctxlog-test",
        "aws_secret_access_key": "ctxlog-test-secret",
        "aws_allow_http": "true",
    }
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in options.items())
    return f"s3://{bucket}/store.lance?{query}"


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    store: str
    writer: str

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)


def start(store: str, writer: str, *extra: str, listen: str = "127.0.0.1:0") -> Server:
    proc = subprocess.Popen(
        [
            BIN,
            "--store",
            store,
            "--timeout",
            "30",
            "serve",
            "--writer",
            writer,
            "--listen",
            listen,
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        raise RuntimeError(f"ctxlog serve exited {proc.returncode} before it listened")
    return Server(proc, "http://" + json.loads(line)["listening"], store, writer)


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return store_uri(str(request.param), tmp_path)


@pytest.fixture
def servers(store: str) -> Iterator[list[Server]]:
    """Replicas started with `servers.append(start(store, writer))`; all stopped after."""
    started: list[Server] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.kill()


@pytest.fixture
def server(store: str, servers: list[Server]) -> Server:
    s = start(store, "replica-a")
    servers.append(s)
    return s


def spying_client(url: str) -> tuple[ctxlog.AsyncClient, list[httpx.URL]]:
    """An async client of `url`, and the list every URL it requests is added to."""
    requests: list[httpx.URL] = []
    real = httpx.AsyncHTTPTransport()

    class Spy(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            requests.append(request.url)
            return await real.handle_async_request(request)

    http = httpx.AsyncClient(base_url=url, transport=Spy())
    return ctxlog.AsyncClient(url, http=http), requests


class LosesFirstAnswer(httpx.BaseTransport):
    """A transport that loses the answer of the first POST after it landed (a proxy that
    drops it): the request reached the server, the client sees a read error. `lost` counts
    the answers lost; `then` runs once the answer is lost (before the client's retry)."""

    def __init__(self, then: Callable[[], object] | None = None) -> None:
        self.real = httpx.HTTPTransport()
        self.lost = 0
        self.then = then

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.real.handle_request(request)
        if request.method == "POST" and self.lost == 0:
            self.lost += 1
            resp.read()
            if self.then is not None:
                self.then()
            raise httpx.ReadError("the answer was lost", request=request)
        return resp


class AsyncLosesFirstAnswer(httpx.AsyncBaseTransport):
    """The async twin of `LosesFirstAnswer`."""

    def __init__(self, then: Callable[[], object] | None = None) -> None:
        self.real = httpx.AsyncHTTPTransport()
        self.lost = 0
        self.then = then

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        resp = await self.real.handle_async_request(request)
        if request.method == "POST" and self.lost == 0:
            self.lost += 1
            await resp.aread()
            if self.then is not None:
                self.then()
            raise httpx.ReadError("the answer was lost", request=request)
        return resp


class CutsFirstWatch(httpx.BaseTransport):
    """A transport that cuts the first watch stream right after its `position` event (a
    proxy that drops the connection before any record), runs `then` (appends while the
    client is away), and lets later streams through. `cut` is set once it did."""

    def __init__(self, then: Callable[[], object]) -> None:
        self.real = httpx.HTTPTransport()
        self.then = then
        self.cut = threading.Event()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        resp = self.real.handle_request(request)
        if not request.url.path.endswith("/watch") or self.cut.is_set():
            return resp
        transport = self

        class Cut(httpx.SyncByteStream):
            def __iter__(self) -> Iterator[bytes]:
                seen = b""
                for chunk in resp.stream:
                    seen += chunk
                    at = seen.find(b"event: position")
                    end = seen.find(b"\n\n", at) if at >= 0 else -1
                    if end < 0:
                        yield chunk
                        continue
                    yield chunk[: len(chunk) - (len(seen) - end - 2)]
                    transport.then()
                    transport.cut.set()
                    raise httpx.ReadError("the stream was cut", request=request)

            def close(self) -> None:
                resp.close()

        return httpx.Response(resp.status_code, headers=resp.headers, stream=Cut())
