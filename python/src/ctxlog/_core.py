"""What the sync and async clients share: building requests and reading answers. Neither
does I/O here."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from ._errors import CtxlogError, Indeterminate, ReplicaUnavailable, from_problem
from ._ids import new_id
from ._types import Ack, Context, Page, Record, SessionInfo

RecordInput = Mapping[str, Any]


def seg(s: str) -> str:
    """One path segment, escaped."""
    return quote(s, safe="")


JSON_HEADERS = {"content-type": "application/json"}


def encode(body: dict[str, Any]) -> bytes:
    """A request body as compact JSON, encoded once (a retry sends the same bytes)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def records_body(records: Iterable[RecordInput]) -> dict[str, Any]:
    """The append body: every record with an id (made here when missing, once)."""
    out = []
    for r in records:
        item = {k: v for k, v in r.items() if v is not None}
        if "bytes" in item:
            item["bytes_b64"] = base64.b64encode(item.pop("bytes")).decode()
        if "id" not in item:
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
        problem = {"detail": resp.text[:500], "written": "nothing"}
    raise from_problem(resp.status_code, problem)


def retryable(e: Exception) -> bool:
    """Whether an append may be retried with the same ids: it may have landed, or the
    replica did not take it (shutting down, overloaded); never a definite refusal."""
    if isinstance(e, (Indeterminate, ReplicaUnavailable)):
        return True
    return isinstance(e, httpx.TransportError)


def transport_error(e: httpx.TransportError) -> Indeterminate:
    return Indeterminate(f"transport error: {e}", problem={"written": "unknown"})


def page(v: dict[str, Any]) -> Page:
    return Page(
        records=[Record.from_json(r) for r in v["records"]],
        next=v.get("next"),
        has_more=bool(v["has_more"]),
        position=v["position"],
    )


def context(v: dict[str, Any]) -> Context:
    return Context(
        records=[Record.from_json(r) for r in v["records"]],
        summary=v.get("summary"),
        covered=int(v.get("covered", 0)),
        position=v["position"],
    )


def summary_record(
    body: str | bytes,
    covers: str,
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
        "covers": covers,
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


def headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


__all__ = ["CtxlogError"]
