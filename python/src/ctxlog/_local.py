"""A local replica: `ctxlog serve` run as a child of this process, so that a single-process
app needs no separate server.

```python
import ctxlog

with ctxlog.Client.local("agents.db") as client:  # starts `ctxlog serve`, stops it on close
    client.session("helpdesk", "t-1").append([{"role": "user", "text": "hi"}])
```

The child listens on a free port of 127.0.0.1 and is stopped by `stop()` (of the server, or
of the client, session or saver that owns it), by an `atexit` hook of this module if the
process ends without that, and — since it is started with `--until-stdin-closes` and this
process holds the only writer of its standard input — by the end of this process, however
it ends (even SIGKILL): the kernel closes the pipe, and the server shuts down gracefully.

The server listens on loopback only, and answers only requests that carry the token it
made for this process (`ctxlog serve --owner-token` prints it to this process alone, on the
pipe of its standard output): other users of the machine, and web pages that reach
127.0.0.1 through a browser, cannot use it. `LocalServer.token` is that token, for a client
of one's own (`ctxlog.Client(server.url, token=server.token)`); the `.local()`
constructors pass it.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import queue
import re
import shutil
import signal
import subprocess
import sysconfig
import threading
from collections.abc import Callable
from typing import IO, TypeVar

from ._errors import (
    BinaryNotFound,
    InvalidInput,
    LocalServerError,
    WriterInUse,
    WriterRequired,
)

log = logging.getLogger("ctxlog.local")

START_TIMEOUT = 60.0
"""Seconds a local server has to print its address (opening a store on object storage can
take a while; a SQLite file, well under one)."""

STOP_TIMEOUT = 20.0
"""Seconds a local server has to shut down gracefully (it lets appends in flight finish)
before it is killed."""

MAX_LOCAL_WRITERS = 1000
"""The most `local-N` writer ids the picker tries: that many local replicas of one store at
once."""

# A child that exits or is killed is waited for at most this long (it cannot take longer
# unless the kernel is stuck); its output threads are joined for at most this long.
_REAP_TIMEOUT = 10.0
_JOIN_TIMEOUT = 5.0
# What is kept of the child's stderr for an error: its last lines, each cut to a bound.
_TAIL_LINES = 40
_MAX_LINE = 8192
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_LOCAL_WRITER = re.compile(r"^local-([1-9][0-9]*)$")


def find_binary() -> str:
    """The `ctxlog` binary to run: `$CTXLOG_BIN` if set (a path, or a name on `$PATH`),
    else the `ctxlog` installed next to the running interpreter (its scripts directory,
    where the wheel puts it), else `ctxlog` on `$PATH`. Raises `BinaryNotFound`."""
    named = os.environ.get("CTXLOG_BIN")
    if named:
        found = shutil.which(named)
        if found is None:
            raise BinaryNotFound(f"CTXLOG_BIN={named!r} is not an executable file")
        return found
    scripts = sysconfig.get_path("scripts")
    if scripts:
        beside = os.path.join(scripts, "ctxlog")
        if os.path.isfile(beside) and os.access(beside, os.X_OK):
            return beside
    found = shutil.which("ctxlog")
    if found is None:
        raise BinaryNotFound(
            "no `ctxlog` binary: set CTXLOG_BIN, install the ctxlog wheel into this "
            f"environment ({scripts}), or put `ctxlog` on PATH"
        )
    return found


def store_uri(store: str | os.PathLike[str]) -> tuple[str, str | None]:
    """The URI the binary is given for `store`, and the path of its SQLite file when it is
    one (where the writer locks live). A plain path (`"agents.db"`, a `Path`) is a SQLite
    file, made absolute (a `*.lance` path is a local Lance dataset); a URI with a scheme
    (`sqlite:`, `lance:`, `s3://`, `file://`, …) is passed through as it is."""
    if isinstance(store, os.PathLike):
        text, plain = os.fspath(store), True
    else:
        text, plain = store, not _SCHEME.match(store)
    if not text:
        raise InvalidInput("the store is empty", problem={"field": "store", "written": "nothing"})
    if plain:
        absolute = os.path.abspath(text)
        if absolute.endswith(".lance"):
            return f"lance:{absolute}", None
        return f"sqlite:{absolute}", os.path.realpath(absolute)
    if text.startswith("sqlite:"):
        # As the binary reads it: `sqlite:PATH`, `sqlite://PATH` (relative to the working
        # directory, which the child shares).
        path = text.removeprefix("sqlite:")
        path = path.removeprefix("//")
        if path and path != ":memory:":
            return text, os.path.realpath(path)
    return text, None


# Why a writer id is picked this way, not made afresh per run: a writer owns one shard of
# the store, and shards never go away, so a random id per run would add a shard per run
# for ever. `local-1` is taken again by the next run; but two processes serving one store
# at once must never share an id, since the second would fence the first (which then takes
# no more writes). So each `local-N` has a lock file beside the store, held with `flock`
# for the server's whole life, and the first N whose lock this process can take is its
# id. The kernel drops the lock when the holder dies, whatever kills it, so a crash leaves
# nothing stale; the lock's descriptor is handed to the server too, so a server that
# outlives its parent (shutting down) still holds it. Lock files are never deleted:
# deleting one while another process opens it would let two processes hold "the" lock.
# Only the lock files are opened here, never the store's own files (SQLite's locks on
# them belong to the process: opening and closing one outside SQLite would drop them).


def _lock_path(store_path: str, n: int) -> str:
    return f"{store_path}.ctxlog-writer-{n}.lock"


def _try_lock(path: str) -> int | None:
    """A descriptor holding `path`'s exclusive lock, or None if another holds it."""
    import fcntl  # POSIX only: imported here so that the client imports anywhere.

    try:
        # Read-only is enough for flock, and lets users who share the store share its locks.
        fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise LocalServerError(f"cannot open the writer lock {path}: {e}") from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as e:
        os.close(fd)
        raise LocalServerError(f"cannot lock the writer lock {path}: {e}") from e
    return fd


def pick_writer(store_path: str | None, writer: str | None) -> tuple[str, int | None]:
    """The writer id to serve as, and the descriptor of its lock (held until the server
    stops), for a store whose SQLite file is `store_path` (None: not a local file)."""
    if writer is not None:
        m = _LOCAL_WRITER.match(writer)
        if store_path is None or m is None:
            return writer, None
        # `local-N` is the picker's: given explicitly, it takes the same lock, so that it
        # neither fences a picked one nor is fenced by one.
        fd = _try_lock(_lock_path(store_path, int(m.group(1))))
        if fd is None:
            raise WriterInUse(
                f"writer {writer!r} of {store_path} is held by another local replica "
                "(starting this one would fence it)"
            )
        return writer, fd
    if store_path is None:
        raise WriterRequired(
            "a local replica of a store that is not a local SQLite file needs a writer id "
            "(writer=…), one that no other process serving the store uses: none can be "
            "picked safely for it",
            problem={"field": "writer", "written": "nothing"},
        )
    for n in range(1, MAX_LOCAL_WRITERS + 1):
        fd = _try_lock(_lock_path(store_path, n))
        if fd is not None:
            return f"local-{n}", fd
    raise WriterInUse(
        f"local-1 to local-{MAX_LOCAL_WRITERS} of {store_path} are all held by running "
        "local replicas"
    )


# Every server this process started and has not stopped; stopped at exit.
_running: set[LocalServer] = set()
_running_lock = threading.Lock()


class LocalServer:
    """`ctxlog serve` for `store`, run as a child of this process on a free port of
    127.0.0.1 (started by the constructor; `ctxlog.serve()` is the same). `url` is its
    address for a client, `token` the bearer token it requires (every right on every bot;
    `ctxlog.Client(server.url, token=server.token)`), `writer` the writer id it serves as.

    `writer`: the caller's, if given; else, for a SQLite file, the first `local-N` whose
    lock file (`<store path>.ctxlog-writer-N.lock`) this process can hold — so a restart
    reuses its shard, and two processes at once never share one. Another store needs an
    explicit writer (`WriterRequired`). `binary`: the `ctxlog` to run (else
    `find_binary()`). Starting waits for the server's address at most `start_timeout`
    seconds; a child that exits first, or does not answer in time, raises
    `LocalServerError` with its exit code and the end of its stderr. What the child writes
    on stderr (warnings, by default) is logged to the `ctxlog.local` logger.

    `stop()` (or leaving a `with` block) stops it: idempotent, and safe from several
    threads at once. A server not stopped is stopped at exit, and dies with this process
    anyway (its standard input closes).
    """

    def __init__(
        self,
        store: str | os.PathLike[str],
        writer: str | None = None,
        *,
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        self.store, store_path = store_uri(store)
        self.writer, self._lock_fd = pick_writer(store_path, writer)
        try:
            exe = os.fspath(binary) if binary is not None else find_binary()
        except BaseException:
            self._release()
            raise
        self._lock = threading.Lock()
        self._stopped = False
        self._owner = os.getpid()
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._tail_lock = threading.Lock()
        argv = [
            exe,
            "--store",
            self.store,
            "serve",
            "--writer",
            self.writer,
            "--listen",
            "127.0.0.1:0",
            "--until-stdin-closes",
            "--owner-token",
        ]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=() if self._lock_fd is None else (self._lock_fd,),
                # Not in the terminal's process group: a Ctrl-C is this process's to
                # handle (it may still write through the server while it does).
                start_new_session=True,
            )
        except OSError as e:
            self._release()
            raise LocalServerError(f"cannot run {exe}: {e}") from e
        # The child's output pipes, each with the thread that drains it (once started).
        self._readers: list[tuple[IO[bytes], threading.Thread]] = []
        try:
            with _running_lock:
                _running.add(self)
            first: queue.Queue[bytes | None] = queue.Queue()
            assert self._proc.stdout is not None and self._proc.stderr is not None
            for stream, target, args in (
                (self._proc.stdout, self._read_stdout, (self._proc.stdout, first)),
                (self._proc.stderr, self._read_stderr, (self._proc.stderr,)),
            ):
                reader = threading.Thread(target=target, args=args, daemon=True)
                reader.start()
                self._readers.append((stream, reader))
            self.address, self.token = self._listening(first, start_timeout)
        except BaseException:
            self._abort()
            raise
        self.url = f"http://{self.address}"

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else f"pid {self._proc.pid}"
        url = getattr(self, "url", "(starting)")
        return f"<LocalServer {self.store} as {self.writer} at {url}, {state}>"

    def __enter__(self) -> LocalServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self._proc.pid

    @property
    def exit_code(self) -> int | None:
        """The server's exit code once it exited (negative: the signal that ended it)."""
        return self._proc.poll()

    @property
    def stderr_tail(self) -> str:
        """The last lines the server wrote on stderr."""
        with self._tail_lock:
            return "\n".join(self._tail)

    # ---- the child's output ----------------------------------------------------------------

    def _read_stdout(self, stream: IO[bytes], first: queue.Queue[bytes | None]) -> None:
        """The first line (its address) to `first` (None if the child closed stdout
        first); anything after it is drained (a full pipe would block the server)."""
        try:
            line = stream.readline(_MAX_LINE)
            first.put(line or None)
            for more in iter(lambda: stream.readline(_MAX_LINE), b""):
                log.warning("ctxlog serve (%s) stdout: %s", self.writer, _text(more))
        except (OSError, ValueError):
            first.put(None)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        """Every line the child writes on stderr, logged, and the last ones kept."""
        try:
            for raw in iter(lambda: stream.readline(_MAX_LINE), b""):
                line = _text(raw)
                with self._tail_lock:
                    self._tail.append(line)
                log.warning("ctxlog serve (%s): %s", self.writer, line)
        except (OSError, ValueError):
            pass

    def _listening(self, first: queue.Queue[bytes | None], timeout: float) -> tuple[str, str]:
        """The address and token the child printed; raises if it exited first or took too
        long."""
        try:
            line = first.get(timeout=timeout)
        except queue.Empty:
            self._abort()
            raise self._error(f"did not print its address within {timeout:g} s") from None
        if line is None:
            self._abort()
            raise self._error("exited before it listened")
        try:
            v = json.loads(line)
            address, token = str(v["listening"]), v["token"]
            if not isinstance(token, str) or not token:
                raise TypeError
        except (ValueError, KeyError, TypeError):
            self._abort()
            raise self._error(f"printed {_text(line)!r}, not its address and token") from None
        if v.get("writer") not in (None, self.writer):
            self._abort()
            raise self._error(f"serves as writer {v.get('writer')!r}, not {self.writer!r}")
        return address, token

    def _error(self, what: str) -> LocalServerError:
        code = self._proc.returncode
        tail = self.stderr_tail
        last = "\n".join(tail.splitlines()[-10:])
        status = "" if code is None else f" (exit code {code})"
        return LocalServerError(
            f"ctxlog serve for {self.store} as {self.writer} {what}{status}"
            + (f":\n{last}" if last else ""),
            exit_code=code,
            stderr=tail,
        )

    # ---- stopping ----------------------------------------------------------------------------

    def _signal(self) -> None:
        """Ask the child to shut down gracefully: its stdin closes, and SIGTERM."""
        stdin = self._proc.stdin
        if stdin is not None:
            try:
                stdin.close()
            except (OSError, ValueError):
                pass
        if self._proc.poll() is None:
            try:
                self._proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    def _reap(self, timeout: float) -> None:
        """Wait for the child at most `timeout` seconds, then kill it and wait for that."""
        try:
            self._proc.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            log.warning(
                "ctxlog serve (%s, pid %d) did not stop within %g s: killed",
                self.writer,
                self._proc.pid,
                timeout,
            )
        self._proc.kill()
        try:
            self._proc.wait(_REAP_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise self._error(f"did not die within {_REAP_TIMEOUT:g} s of SIGKILL") from e

    def _release(self) -> None:
        """Let go of the writer lock (the child, dead by now, held it too)."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)

    def _finish(self) -> None:
        busy = set()
        for stream, reader in self._readers:
            reader.join(_JOIN_TIMEOUT)
            if reader.is_alive():
                # Still blocked (something the child started holds the pipe): its stream
                # is left to it, since closing it would wait for that read. It ends with
                # the pipe.
                busy.add(id(stream))
        for pipe in (self._proc.stdout, self._proc.stderr):
            if pipe is not None and id(pipe) not in busy:
                try:
                    pipe.close()
                except (OSError, ValueError):
                    pass
        self._release()
        self._stopped = True
        with _running_lock:
            _running.discard(self)

    def _abort(self) -> None:
        """A start that failed: the child killed (if alive), reaped, and forgotten."""
        with self._lock:
            if self._stopped:
                return
            if self._proc.poll() is None:
                self._proc.kill()
            try:
                self._proc.wait(_REAP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
            self._finish()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Shut the server down gracefully (appends in flight finish), waiting at most
        `timeout` seconds before killing it; then release its writer id. Idempotent; a
        second caller waits for the first. Raises `LocalServerError` only if the child
        outlives SIGKILL."""
        with self._lock:
            if self._stopped:
                return
            if os.getpid() != self._owner:
                # A forked copy of this object: the server is the parent's to stop.
                self._stopped = True
                return
            self._signal()
            self._reap(timeout)
            self._finish()
        if self._proc.returncode not in (0, None):
            log.warning("ctxlog serve (%s) exited with code %s", self.writer, self._proc.returncode)

    def _after_fork(self) -> None:
        """In a forked child: this process does not own the server. Its copy of the
        server's stdin is replaced by /dev/null (so the server still sees EOF when its
        real parent dies, whatever this child does), and its copy of the writer lock is
        closed (so the lock is free once the parent stops the server). Nothing here may
        take a lock another thread of the parent held at the fork."""
        self._lock = threading.Lock()
        self._tail_lock = threading.Lock()
        self._stopped = True
        stdin = self._proc.stdin
        if stdin is not None:
            try:
                fd = stdin.fileno()
            except (OSError, ValueError):
                fd = -1
            if fd >= 0:
                null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                os.dup2(null, fd, inheritable=False)
                os.close(null)
        lock, self._lock_fd = self._lock_fd, None
        if lock is not None:
            os.close(lock)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace").rstrip("\r\n")


def serve(
    store: str | os.PathLike[str],
    writer: str | None = None,
    *,
    binary: str | os.PathLike[str] | None = None,
    start_timeout: float = START_TIMEOUT,
) -> LocalServer:
    """Start a local replica of `store` (see `LocalServer`): `ctxlog serve` as a child of
    this process, on a free port of 127.0.0.1, stopped by its `stop()`, at exit, or when
    this process dies."""
    return LocalServer(store, writer, binary=binary, start_timeout=start_timeout)


def _stop_all() -> None:
    """At exit: every server still running is asked to stop at once, then each is waited
    for (so that exit waits for the slowest, not for their sum)."""
    with _running_lock:
        servers = list(_running)
    for s in servers:
        with s._lock:
            if not s._stopped and os.getpid() == s._owner:
                s._signal()
    for s in servers:
        try:
            s.stop()
        except LocalServerError as e:
            log.warning("%s", e)


def _forget_after_fork() -> None:
    global _running_lock
    # Another thread may have held it at the fork: the child's copy would stay held.
    _running_lock = threading.Lock()
    servers = list(_running)
    _running.clear()
    for s in servers:
        s._after_fork()


atexit.register(_stop_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


_T = TypeVar("_T")


def owning(
    store: str | os.PathLike[str], writer: str | None, make: Callable[[str, str], _T]
) -> tuple[_T, LocalServer]:
    """A local replica of `store` and `make(its url, its token)`; the replica stopped if
    `make` fails."""
    server = LocalServer(store, writer)
    try:
        return make(server.url, server.token), server
    except BaseException:
        server.stop()
        raise
