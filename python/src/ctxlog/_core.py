"""What the sync and async clients share: building requests and reading answers. Neither
does I/O here."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from ._errors import (
    CtxlogError,
    Indeterminate,
    InvalidInput,
    ReplicaUnavailable,
    WatchEnded,
    from_problem,
)
from ._ids import new_id
from ._types import Ack, Context, Event, Hit, Page, Record, SearchPage, SessionInfo

RecordInput = Mapping[str, Any]


def seg(s: str) -> str:
    """One path segment, escaped."""
    return quote(s, safe="")


JSON_HEADERS = {"content-type": "application/json"}


def encode(body: dict[str, Any]) -> bytes:
    """A request body as compact JSON, encoded once (a retry sends the same bytes)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def finite_vector(vector: Sequence[float]) -> list[float]:
    """`vector` as JSON numbers; a value that is not finite (JSON has no NaN) refused here,
    naming the field, nothing sent."""
    out = [float(x) for x in vector]
    for i, x in enumerate(out):
        if not math.isfinite(x):
            raise InvalidInput(
                f"vector: value {i} is not finite",
                problem={
                    "field": "vector",
                    "written": "nothing",
                    "detail": f"value {i} is not finite",
                },
            )
    return out


def embedding(
    record_id: str,
    model: str,
    vector: Sequence[float],
    *,
    metric: str = "cosine",
    session_id: str | None = None,
) -> dict[str, Any]:
    """An embedding to append (contract rule 27): the vector that `model` (the caller's:
    ctxlog never calls one) made of record `record_id`, compared by `metric` (`cosine`,
    `dot` or `l2`). Append it in the record's own batch or later, to the record's session
    (`session_id` for a bot-wide append); a later one of the same record and model replaces
    it, and forgetting the record forgets its vectors. Search it with
    `search(bot, vector=…, model=model)`."""
    out: dict[str, Any] = {
        "id": record_id,
        "kind": "embedding",
        "model": model,
        "metric": metric,
        "vector": finite_vector(vector),
    }
    if session_id is not None:
        out["session_id"] = session_id
    return out


def records_body(records: Iterable[RecordInput]) -> dict[str, Any]:
    """The append body: every record with an id (made here when missing, once)."""
    out = []
    for r in records:
        item = {k: v for k, v in r.items() if v is not None}
        if "bytes" in item:
            item["bytes_b64"] = base64.b64encode(item.pop("bytes")).decode()
        if "id" not in item:
            if item.get("kind") == "embedding":
                # An embedding's id is the id of the record it embeds (rule 27).
                raise TypeError("an embedding names the id of the record it embeds")
            item["id"] = new_id()
        out.append(item)
    return {"records": out}


def check(resp: httpx.Response) -> Any:
    """The JSON of a successful answer; the typed error otherwise."""
    if resp.status_code < 400:
        return resp.json() if resp.content else None
    try:
        problem = resp.json()
        if not isinstance(problem, dict):
            problem = {}
    except ValueError:
        problem = {}
    if not problem:
        problem = {"detail": resp.text[:500]}
    if "written" not in problem:
        # Not a replica's problem: a proxy or load balancer answered. A timeout or a server
        # error there may have come after the replica committed, so it is unknown (the
        # caller retries with the same ids); a refusal before forwarding wrote nothing.
        maybe_landed = resp.status_code >= 500 or resp.status_code == 408
        problem["written"] = "unknown" if maybe_landed else "nothing"
    raise from_problem(resp.status_code, problem)


def retryable(e: Exception) -> bool:
    """Whether an append may be retried with the same ids: it may have landed, or the
    replica did not take it (shutting down, overloaded); never a definite refusal."""
    if isinstance(e, (Indeterminate, ReplicaUnavailable)):
        return True
    return isinstance(e, httpx.TransportError)


def unknown_after(e: CtxlogError, earlier_unknown: CtxlogError) -> Indeterminate:
    """What a retried append's caller is told when its last attempt was refused definitely
    (`e`) after an earlier one that may have landed: the refusal does not undo that
    attempt, so the outcome is unknown (the caller must not retry with new ids)."""
    return Indeterminate(
        f"{e} (an earlier attempt may have landed: {earlier_unknown})",
        status=e.status,
        problem={**e.problem, "written": "unknown"},
    )


def transport_error(e: httpx.TransportError) -> Indeterminate:
    return Indeterminate(f"transport error: {e}", problem={"written": "unknown"})


def page(v: dict[str, Any]) -> Page:
    return Page(
        records=[Record.from_json(r) for r in v["records"]],
        next=v.get("next"),
        has_more=bool(v["has_more"]),
        position=v["position"],
    )


def search_body(
    query: str | None,
    *,
    vector: Sequence[float] | None,
    model: str | None,
    k: int | None,
    after: str | None,
    session: str | None,
    roles: Iterable[str] | None,
    since: str | None,
    until: str | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    if query is None and vector is None:
        raise TypeError("a search needs a query, a vector (with its model), or both")
    if (vector is None) != (model is None):
        raise TypeError("a vector search needs both `vector` and `model`")
    body: dict[str, Any] = {}
    if vector is not None:
        body["vector"] = finite_vector(vector)
    for name, value in (
        ("query", query),
        ("model", model),
        ("k", k),
        ("after", after),
        ("session", session),
        ("since", since),
        ("until", until),
    ):
        if value is not None:
            body[name] = value
    if isinstance(roles, str):
        raise TypeError("roles is a list of roles, not one string")
    if roles is not None:
        body["roles"] = list(roles)
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return body


def search_page(v: dict[str, Any]) -> SearchPage:
    return SearchPage(
        hits=[
            Hit(
                record=Record.from_json(h["record"]),
                score=float(h["score"]),
                matched=list(h["matched"]),
                snippet=str(h["snippet"]),
            )
            for h in v["hits"]
        ],
        next=v.get("next"),
        position=v["position"],
    )


def context(v: dict[str, Any]) -> Context:
    return Context(
        records=[Record.from_json(r) for r in v["records"]],
        summary=v.get("summary"),
        covered=int(v.get("covered", 0)),
        position=v["position"],
        covers=v["covers"],
    )


def covers_token(covers: Context | str) -> str:
    """What a summary's `covers` sends: a context view's token, never a page's position (a
    page's position is the whole view's, so a summary covering it would hide records the
    page did not hold); the server refuses a token of another session."""
    if isinstance(covers, Context):
        return covers.covers
    if isinstance(covers, str):
        return covers
    raise TypeError(
        f"covers takes a context view (or its `covers` token), not {type(covers).__name__}"
    )


def summary_record(
    body: str | bytes,
    covers: Context | str,
    *,
    id: str | None,
    role: str,
    content_type: str | None,
    metadata: dict[str, Any] | None,
) -> dict[str, Any]:
    """The record input of a summary covering `covers` (a text or binary body)."""
    return {
        "id": id,
        "role": role,
        "kind": "summary",
        "covers": covers_token(covers),
        "content_type": content_type,
        "metadata": metadata,
        ("bytes" if isinstance(body, bytes) else "text"): body,
    }


def sessions(v: dict[str, Any]) -> tuple[list[SessionInfo], str | None]:
    infos = [
        SessionInfo(s["session_id"], int(s["records"]), s.get("first_hlc"), s.get("last_hlc"))
        for s in v["sessions"]
    ]
    return infos, v.get("next")


def ack(v: dict[str, Any]) -> Ack:
    return Ack.from_json(v)


class Watch:
    """Where a watch stream stands, the same for the sync and async clients (the protocol
    of the server's streams): the first event of every stream is `position` (where it
    starts: resuming from it misses nothing even if the stream drops before any record);
    `record` and `tombstone` events carry entries; `end` closes a stream the server had to
    stop, with the position it went through and whether to resume from there; a stream
    given `until` ends with `end` of reason `until` once it went through it (`done`)."""

    def __init__(self, after: str | None, until: str | None = None) -> None:
        self.last = after
        self.until = until
        self.ended = False
        self.done = False
        self.opened = False
        self.reason = ""

    def params(self) -> dict[str, str]:
        return {"until": self.until} if self.until is not None else {}

    def headers(self) -> dict[str, str]:
        self.ended = False
        self.reason = ""
        self.opened = False
        return {"last-event-id": self.last} if self.last else {}

    def next_try(
        self, failures: int, *, opened: bool, progressed: bool, reconnects: int, backoff: float
    ) -> tuple[int, float]:
        """The failed tries in a row and the pause before the next stream, after one that
        `opened` (or not) and brought a record (`progressed`) or not; raises `CtxlogError`
        when `reconnects` tries in a row failed. A shutdown's end is taken up almost at once
        (another replica, or this one restarted, serves the next stream); a stream that
        brought records and then ended, after one pause; every other end (a replica that
        could not serve the stream now would end the next one at once too), an answer that
        refused the stream, and a stream that could not open are failed tries, each paused
        longer; a stream that ran and dropped counts afresh."""
        if self.ended and self.reason == "shutdown":
            return failures, min(backoff, 0.05)
        if progressed and self.ended:
            return 0, backoff
        if progressed or (opened and not self.ended):
            failures = 0
        failures += 1
        if failures > reconnects:
            raise CtxlogError(f"the watch stream could not be reopened {reconnects} times")
        return failures, backoff * failures

    @staticmethod
    def reopen_after(e: Exception) -> bool:
        """Whether a stream that could not be opened is tried again: the replica was
        unavailable, timed out or failed (a 5xx: reading it again is always safe), or the
        token's streams were all taken (a 429: the stream just ended may not have let go of
        its place yet); never a refusal of the request."""
        status = (e.status or 0) if isinstance(e, CtxlogError) else 0
        return status >= 500 or status == 429

    def on(self, kind: str, id: str | None, data: str) -> Event | None:
        """The event to hand the caller, if any; `ended` tells the caller to reconnect."""
        # `link`: a fork or hide of the session (contract rule 25): its view changed shape.
        if kind in ("record", "tombstone", "link"):
            self.last = id
            return Event(kind, Record.from_json(json.loads(data)), str(id))
        if kind == "position" and id:
            if self.until is not None and not self.opened:
                # A replica that ignored `until` would stream on past it, never ending.
                said = json.loads(data).get("until") if data else None
                if said is None:
                    raise CtxlogError(
                        "the replica does not take `until` (an older ctxlog serve?): "
                        "it would stream past it",
                        problem={"written": "nothing"},
                    )
            self.opened = True
            self.last = id
        elif kind == "end":
            end = json.loads(data) if data else {}
            if id:
                self.last = id
            self.reason = str(end.get("reason", ""))
            if self.until is not None and self.reason == "until":
                self.done = True
                return None
            if not end.get("resume", False):
                reason = str(end.get("reason", ""))
                raise WatchEnded(
                    f"the server ended the watch stream ({reason}) and it cannot be resumed",
                    problem={"reason": reason, "position": self.last, "written": "nothing"},
                )
            self.ended = True
        return None


def headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


__all__ = ["CtxlogError"]
