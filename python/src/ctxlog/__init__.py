"""Python client for `ctxlog serve`: a durable, append-only context log for AI agents.

`Client` and `AsyncClient` have the same surface; errors are typed (`ctxlog.errors`).
A session's `context()` is what an agent sends its model (its governing summary and the
records it does not cover); `summarize(body, covers=context)` writes a summary of that view.
`Client.local("agents.db")` (and `AsyncClient.local`, `ctxlog.serve`) runs the server as a
child of this process: a single-process app needs no separate server."""

from ._async_client import AsyncClient, AsyncSession
from ._client import Client, Session
from ._core import embedding
from ._errors import (
    BinaryNotFound,
    CtxlogError,
    Fenced,
    Forbidden,
    Indeterminate,
    InvalidInput,
    LocalServerError,
    MalformedRequest,
    NotFound,
    ReplicaUnavailable,
    StorageError,
    TooLarge,
    TooManyWatchers,
    Unauthorized,
    Unavailable,
    WatchEnded,
    WriterInUse,
    WriterRequired,
)
from ._ids import new_id
from ._local import LocalServer, serve
from ._types import Ack, Context, Event, Fork, Hit, Page, Record, Retry, SearchPage, SessionInfo

__all__ = [
    "Ack",
    "AsyncClient",
    "AsyncSession",
    "BinaryNotFound",
    "Client",
    "Context",
    "CtxlogError",
    "Event",
    "Fork",
    "Fenced",
    "Forbidden",
    "Hit",
    "Indeterminate",
    "InvalidInput",
    "LocalServer",
    "LocalServerError",
    "MalformedRequest",
    "NotFound",
    "Page",
    "Record",
    "ReplicaUnavailable",
    "Retry",
    "SearchPage",
    "Session",
    "SessionInfo",
    "StorageError",
    "TooLarge",
    "TooManyWatchers",
    "Unauthorized",
    "Unavailable",
    "WatchEnded",
    "WriterInUse",
    "WriterRequired",
    "embedding",
    "new_id",
    "serve",
]
