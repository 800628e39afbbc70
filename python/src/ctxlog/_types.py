"""What the API returns, as plain dataclasses."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Record:
    """A record as stored: its fields, and where it is in the log."""

    id: str
    bot_id: str
    session_id: str
    role: str
    content_type: str
    kind: str
    shard: str
    seq: int
    epoch: int
    hlc: int
    text: str | None = None
    bytes: bytes | None = None
    metadata: dict[str, Any] | None = None
    created_at: str | None = None
    purged: bool = False

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Record:
        raw = v.get("bytes_b64")
        return cls(
            id=v["id"],
            bot_id=v["bot_id"],
            session_id=v["session_id"],
            role=v["role"],
            content_type=v["content_type"],
            kind=v["kind"],
            shard=v["shard"],
            seq=int(v["seq"]),
            epoch=int(v["epoch"]),
            hlc=int(v["hlc"]),
            text=v.get("text"),
            bytes=None if raw is None else base64.b64decode(raw),
            metadata=v.get("metadata"),
            created_at=v.get("created_at"),
            purged=bool(v.get("purged", False)),
        )


@dataclass(frozen=True)
class Ack:
    """What an append wrote: durable when returned."""

    shard: str
    epoch: int
    first_seq: int
    last_seq: int
    ids: list[str]

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Ack:
        return cls(
            v["shard"], int(v["epoch"]), int(v["first_seq"]), int(v["last_seq"]), list(v["ids"])
        )


@dataclass(frozen=True)
class Page:
    """A page of a session's live records, in the log's order."""

    records: list[Record]
    next: str | None
    has_more: bool
    position: str


@dataclass(frozen=True)
class SessionInfo:
    """A session of a bot with live records."""

    session_id: str
    records: int
    first_hlc: int | None
    last_hlc: int | None


@dataclass(frozen=True)
class Event:
    """One watch event: `record` or `tombstone`, and the position to resume after it."""

    kind: str
    record: Record
    position: str


@dataclass
class Retry:
    """How an append that may have landed is retried (same ids): at most `attempts` tries
    in all, waiting `backoff` seconds before the second, doubling up to `max_backoff`."""

    attempts: int = 4
    backoff: float = 0.05
    max_backoff: float = 1.0
    extra: dict[str, Any] = field(default_factory=dict)
