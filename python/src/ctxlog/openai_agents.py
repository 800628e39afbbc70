"""An OpenAI Agents SDK session backed by a ctxlog session (`pip install "ctxlog[openai-agents]"`).

```python
from agents import Agent, Runner
from ctxlog.openai_agents import CtxlogSession

session = CtxlogSession("user-42", "http://127.0.0.1:7070")
await Runner.run(agent, "hi", session=session)
```

Each item is a record of the ctxlog session (bot `bot`, default `openai-agents`), its JSON
as the body. What the SDK's own sessions cannot promise, and this one does:

- **Order across replicas.** Items keep the log's order (rule 8) whichever replica each
  process writes through, and every process reads the same history.
- **A retried `add_items` never duplicates.** The items' ids are made once per call, and an
  answer that may have landed is retried with the same ids: the log counts them once.
- **`pop_item` removes what it read.** It reads the newest item, then tombstones exactly that
  record. An item another process appended after that read is not removed (it stays the
  newest); the item returned is the one that was removed.
- **`clear_session` ends every item it saw** (one batch of tombstones); an item appended after
  its read stays.
"""

from __future__ import annotations

import json
from typing import Any

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from ._async_client import AsyncClient, AsyncSession
from ._errors import NotFound
from ._ids import new_id

CONTENT_TYPE = "application/vnd.openai.agents.item+json"


# The most records one `?last=` read returns.
MAX_TAIL = 1000


def _role(item: Any) -> str:
    """The record's role: the item's role, or its type (a tool call, a reasoning item)."""
    if isinstance(item, dict):
        return str(item.get("role") or item.get("type") or "item")
    return "item"


class CtxlogSession:
    """The SDK's `Session` protocol over one ctxlog session."""

    def __init__(
        self,
        session_id: str,
        client: AsyncClient | str,
        *,
        bot: str = "openai-agents",
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        self._client = AsyncClient(client) if isinstance(client, str) else client
        self._session: AsyncSession = self._client.session(bot, session_id)

    async def _records(self) -> list[tuple[str, Any]]:
        out = []
        async for r in self._session.iter_records():
            if r.content_type == CONTENT_TYPE and r.text is not None:
                out.append((r.id, json.loads(r.text)))
        return out

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The history in the log's order; with a limit, the latest `limit` items."""
        n = resolve_session_limit(limit, self.session_settings)
        if n is not None and n <= 0:
            return []
        if n is not None and n <= MAX_TAIL:
            # The server reads only the last `n` records.
            page = await self._session.tail(n)
            return [
                json.loads(r.text)
                for r in page.records
                if r.content_type == CONTENT_TYPE and r.text is not None
            ]
        items = [item for _, item in await self._records()]
        return items if n is None else items[-n:]

    async def add_items(self, items: list[Any]) -> None:
        """Append the items as one atomic batch (retried with the same ids if its answer may
        have been lost)."""
        if not items:
            return
        await self._session.append(
            [
                {
                    "id": new_id(),
                    "role": _role(item),
                    "content_type": CONTENT_TYPE,
                    "text": json.dumps(item, separators=(",", ":")),
                }
                for item in items
            ]
        )

    async def pop_item(self) -> Any | None:
        """Remove and return the newest item this call read (see the module docs)."""
        # Another process may remove the same item between the read and the tombstone: then
        # read again (a few times at most) and take the newest left.
        for _ in range(3):
            records = await self._records()
            if not records:
                return None
            record_id, item = records[-1]
            try:
                await self._session.delete(record_id)
            except NotFound:
                continue
            return item
        return None

    async def clear_session(self) -> None:
        """Tombstone every item this call read, in one batch."""
        records = await self._records()
        if records:
            await self._session.append(
                [{"id": record_id, "role": "item", "kind": "tombstone"} for record_id, _ in records]
            )
