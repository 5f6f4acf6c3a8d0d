"""The raw part of every dead letter: the whole rejected payload, or a durable reference to it.

Shared by every producer of dead letters (the reader's rejects through
``kafka/deadletter.py``, the stream workers, the ClickHouse sink,
the alert consumer), so they all have one form; see that module for the
message layout.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

import msgspec

MAX_DEADLETTER_BYTES = 900 * 1024
HEAD_BYTES = 4096

_encoder = msgspec.json.Encoder()


def _as_text(raw: bytes) -> tuple[str, str]:
    try:
        return raw.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return base64.b64encode(raw).decode("ascii"), "base64"


def _head(raw: bytes, n: int) -> tuple[str, str]:
    """The first ``n`` bytes as text when they are UTF-8 (a character cut at the end is dropped)."""
    head = raw[:n]
    for cut in range(4):
        try:
            return head[:len(head) - cut].decode("utf-8"), "text"
        except UnicodeDecodeError:
            continue
    return base64.b64encode(head).decode("ascii"), "base64"


def encode_with_raw(doc: dict[str, Any], raw: bytes | None, max_bytes: int = MAX_DEADLETTER_BYTES,
                    head_bytes: int = HEAD_BYTES) -> bytes:
    """``doc`` plus the raw fields above, encoded: the whole payload, or a reference past ``max_bytes``."""
    raw = bytes(raw or b"")
    text, encoding = _as_text(raw)
    doc = {**doc, "raw": text, "raw_encoding": encoding, "raw_bytes": len(raw),
           "raw_sha256": hashlib.sha256(raw).hexdigest(), "raw_truncated": False}
    out = _encoder.encode(doc)
    if len(out) <= max_bytes:
        return out
    doc["raw"], doc["raw_encoding"] = _head(raw, head_bytes)
    doc["raw_truncated"] = True
    out = _encoder.encode(doc)
    if len(out) > max_bytes:  # only a huge reason or source could do this: cut them too
        doc["reason"] = str(doc.get("reason", ""))[:1000]
        doc["source"] = str(doc.get("source", ""))[:1000]
        out = _encoder.encode(doc)
    return out
