"""Typed errors, one per kind of problem the server answers (RFC 9457 `type`).

What a caller does with each:

- `InvalidInput` (and `MalformedRequest`, `TooLarge`): fix the input; nothing was written.
- `Indeterminate`: the write may have landed (`written == "unknown"`); retry with the same
  ids, always safe. The client does this itself for appends, a bounded number of times.
- `Fenced`: this replica no longer writes; write through another one.
- `Unauthorized` / `Forbidden`: the token is missing, wrong, or not for this bot or right.
- `NotFound`: no such record (or session, or route).
- `StorageError`, `Unavailable`, `ReplicaUnavailable`: the replica or its storage failed
  definitely (nothing written): retrying later is safe.
"""

from __future__ import annotations

from typing import Any

PREFIX = "urn:ctxlog:problem:"


class CtxlogError(Exception):
    """A failed call: the server's problem details, or a transport failure."""

    def __init__(
        self, message: str, *, status: int | None = None, problem: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.problem: dict[str, Any] = problem or {}

    @property
    def type(self) -> str:
        return str(self.problem.get("type", ""))

    @property
    def written(self) -> str:
        """`"nothing"` (definite) or `"unknown"` (may have landed)."""
        return str(self.problem.get("written", "unknown"))


class InvalidInput(CtxlogError):
    """A field of the request is not acceptable; nothing was written."""

    @property
    def field(self) -> str | None:
        f = self.problem.get("field")
        return None if f is None else str(f)

    @property
    def record(self) -> int | None:
        r = self.problem.get("record")
        return None if r is None else int(r)


class MalformedRequest(InvalidInput):
    """The body was not JSON of the expected shape."""


class TooLarge(InvalidInput):
    """The body was larger than the server accepts."""


class Unauthorized(CtxlogError):
    """No valid bearer token."""


class Forbidden(CtxlogError):
    """The token does not grant this right on this bot."""


class NotFound(CtxlogError):
    """No such record, session or route."""


class Fenced(CtxlogError):
    """Another process claimed this replica's writer id: write through another replica."""


class Indeterminate(CtxlogError):
    """The operation may have landed: retry with the same ids (always safe)."""


class StorageError(CtxlogError):
    """The storage failed; nothing was written."""


class Unavailable(CtxlogError):
    """The storage throttled or could not be reached; nothing was written."""


class ReplicaUnavailable(CtxlogError):
    """The replica is shutting down or overloaded; nothing was written."""


class TooManyWatchers(CtxlogError):
    """The token has as many watch streams open as it may."""


class WatchEnded(CtxlogError):
    """The server ended a watch stream and said it cannot be resumed from where it was
    (`reason`, e.g. the position fell behind what the store keeps): read the session
    afresh, then watch from that read's position. `position` is where the stream ended."""

    @property
    def reason(self) -> str:
        return str(self.problem.get("reason", ""))

    @property
    def position(self) -> str | None:
        p = self.problem.get("position")
        return None if p is None else str(p)


class LocalServerError(CtxlogError):
    """A local replica (`ctxlog.serve`, `Client.local`) could not be started or stopped.
    `exit_code` is the child's, if it exited (negative: the signal that ended it);
    `stderr` the last lines it wrote there. Nothing was written through it."""

    def __init__(self, message: str, *, exit_code: int | None = None, stderr: str = "") -> None:
        super().__init__(message, problem={"written": "nothing"})
        self.exit_code = exit_code
        self.stderr = stderr


class BinaryNotFound(LocalServerError):
    """No `ctxlog` binary to run: neither `$CTXLOG_BIN`, nor one installed next to this
    Python (its scripts directory, where the wheel puts it), nor one on `$PATH`."""


class WriterInUse(LocalServerError):
    """The writer id is held by another local replica of this store on this machine (or
    every `local-N` the picker may take is): starting one would fence it."""


class WriterRequired(InvalidInput):
    """The store is not a local SQLite file, so no writer id can be picked safely: name
    one (`writer=`) that no other process serving that store uses."""


_BY_TYPE: dict[str, type[CtxlogError]] = {
    "invalid-input": InvalidInput,
    "malformed-request": MalformedRequest,
    "too-large": TooLarge,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "not-found": NotFound,
    "fenced": Fenced,
    "timeout": StorageError,
    "storage-error": StorageError,
    "storage-unavailable": Unavailable,
    "storage-access-denied": StorageError,
    "corrupt-store": StorageError,
    "store-unusable": StorageError,
    "replica-unavailable": ReplicaUnavailable,
    "too-many-watchers": TooManyWatchers,
}


def from_problem(status: int, problem: dict[str, Any]) -> CtxlogError:
    """The exception for a problem response. Anything that may have landed is
    `Indeterminate`, whatever its type: that is what the caller must act on."""
    kind = str(problem.get("type", "")).removeprefix(PREFIX)
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    if problem.get("written") == "unknown":
        return Indeterminate(detail, status=status, problem=problem)
    cls = _BY_TYPE.get(kind, CtxlogError)
    return cls(detail, status=status, problem=problem)
