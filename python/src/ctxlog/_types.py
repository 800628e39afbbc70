"""What the API returns, as plain dataclasses."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Record:
    """A record as stored: its fields, and where it is in the log. A summary (`kind ==
    "summary"`) also names what it `covers`: the position of the view its writer read."""

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
    covers: str | None = None

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
            covers=v.get("covers"),
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
class Fork:
    """What a fork wrote (contract rule 25): its record's ack, and the position it
    continues from (as `at` of reads of the session it continues)."""

    ack: Ack
    at: str

    @classmethod
    def from_json(cls, v: dict[str, Any]) -> Fork:
        return cls(Ack.from_json(v["ack"]), str(v["at"]))


@dataclass(frozen=True)
class Hit:
    """One search result (contract rules 26, 27): the record; its score (BM25 for words, the
    model's similarity for a vector, reciprocal rank fusion for both); the query's terms it
    holds, and a short part of its text around the first of them."""

    record: Record
    score: float
    matched: list[str]
    snippet: str


@dataclass(frozen=True)
class SearchPage:
    """A page of search results, best first; `next` (give as `after`) when more follow;
    `position` the position of the entries searched."""

    hits: list[Hit]
    next: str | None
    position: str


@dataclass(frozen=True)
class Page:
    """A page of a session's live records, in the log's order."""

    records: list[Record]
    next: str | None
    has_more: bool
    position: str


@dataclass(frozen=True)
class Context:
    """A session's context view: its governing summary (if any) and every live record that
    summary does not cover, in the log's order — what an agent sends its model.

    `summary` is the governing summary's record id (it is among `records`), `covered` how
    many live records it stands for (left out), `position` the view's position when it was
    read (watch from it), and `covers` that position bound to this bot and session: a summary
    of this view covers it (`summarize(body, covers=context)`; records appended after the
    read are not covered, so never lost)."""

    records: list[Record]
    summary: str | None
    covered: int
    position: str
    covers: str


@dataclass(frozen=True)
class SessionInfo:
    """A session of a bot with live records."""

    session_id: str
    records: int
    first_hlc: int | None
    last_hlc: int | None


@dataclass(frozen=True)
class Event:
    """One watch event: `record`, `tombstone` or `link` (a fork or hide of the session,
    contract rule 25), and the position to resume after it."""

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
