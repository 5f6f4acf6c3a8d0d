"""The dead letter's form: its raw part (the whole rejected payload, or a durable reference) and its reader.

Every producer of dead letters (the reader's rejects, the stream workers, the
ClickHouse sink, the alert consumer) encodes through ``kafka/deadletter.py``,
which builds on :func:`encode_with_raw` here, so they all have one form (that
module documents the layout). :func:`decode_deadletter` reads it back, and
also the form the stream workers wrote before issue 14 (a consumed message as
a "line": ``source`` ``topic/partition``, ``line`` the offset).
"""

from __future__ import annotations

import base64
import hashlib
import re
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


class DeadLetter(msgspec.Struct, kw_only=True, forbid_unknown_fields=False):
    """One dead letter, read back; ``topic``/``partition``/``offset`` are set for a consumed Kafka message."""

    source: str
    line: int
    reason: str
    raw: str = ""
    raw_encoding: str = "text"
    raw_bytes: int = 0
    raw_sha256: str = ""
    raw_truncated: bool = False
    partition: int | None = None
    offset: int | None = None
    key: str | None = None
    topic: str | None = None  # not on the wire: ``source`` when ``partition`` is set

    def payload(self) -> bytes:
        """The rejected bytes as stored (only their head when ``raw_truncated``)."""
        return base64.b64decode(self.raw) if self.raw_encoding == "base64" else self.raw.encode("utf-8")


_letter = msgspec.json.Decoder(DeadLetter)
_OLD_MESSAGE_SOURCE = re.compile(r"^([A-Za-z0-9._-]+)/(\d+)$")  # a Kafka topic name has no "/"


def decode_deadletter(data: bytes) -> DeadLetter:
    """A dead letter of either form (``msgspec`` errors for anything else).

    The stream workers' former form of a consumed message, ``source``
    ``topic/partition`` and ``line`` its offset, is read as the current one:
    ``topic``, ``partition`` and ``offset`` filled in, ``source`` the topic
    (a file whose relative path is ``name/<digits>`` would read so too).
    """
    d = _letter.decode(data)
    if d.partition is None:
        m = _OLD_MESSAGE_SOURCE.match(d.source)
        if m is None:
            return d  # a line of a file or of an ingest message
        d.source, d.partition, d.offset = m.group(1), int(m.group(2)), d.line
    d.topic = d.source
    return d
