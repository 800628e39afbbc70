"""Record ids made on the client: time-ordered (UUIDv7 layout), so that ids sort by when
they were made, and made once per append so that a retry reuses them."""

from __future__ import annotations

import os
import time
import uuid


def new_id() -> str:
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version 7
    value |= ((rand >> 68) & 0xFFF) << 64
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))
