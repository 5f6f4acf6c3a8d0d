"""Rejected input goes to the dead-letter topic, never silently away (telemetry-v1).

Each message is JSON keyed by its source, so one file's rejects stay in order
on one partition::

    {"source", "line", "reason",       # where (file, or topic/partition[@offset]) and why
     "raw",                            # the rejected bytes, whole (see below)
     "raw_encoding": "text"|"base64",  # base64 when the bytes are not UTF-8
     "raw_bytes", "raw_sha256",        # size and SHA-256 of the whole rejected payload
     "raw_truncated": bool}

``raw`` holds the **whole** rejected line or message, so a dead letter can be
replayed once its cause is fixed. Only when the dead letter would exceed
``MAX_DEADLETTER_BYTES`` (under Kafka's default ``message.max.bytes`` of 1 MiB,
so the dead letter itself is never refused by the broker) does it hold a
*durable reference* instead: ``raw`` is then the first ``HEAD_BYTES`` bytes,
``raw_truncated`` is true, and the original is found by ``source`` and
``line`` (the file and line number; or ``topic/partition@offset`` and the line
within an ingest message; or the topic/partition and offset of a Kafka
message), its size and SHA-256 telling it is the same bytes. A line over the
reader's own size bound is never held whole, so its ``raw`` is empty and
``source``/``line`` are the reference.
"""

from __future__ import annotations

import msgspec

from eroica.models.deadletter import HEAD_BYTES, MAX_DEADLETTER_BYTES, encode_with_raw
from eroica.models.reader import Invalid

from .publisher import FramePublisher

MAX_RAW_CHARS = HEAD_BYTES  # kept for callers of the former truncating form


def deadletter_record(invalid: Invalid, max_bytes: int = MAX_DEADLETTER_BYTES) -> dict:
    """The dead-letter form of one rejected line (a dict; see the module docstring)."""
    return msgspec.json.decode(encode_deadletter(invalid, max_bytes))


def encode_deadletter(invalid: Invalid, max_bytes: int = MAX_DEADLETTER_BYTES) -> bytes:
    return encode_with_raw({"source": invalid.source, "line": invalid.line, "reason": invalid.reason},
                           invalid.raw, max_bytes)


def publish_invalid(publisher: FramePublisher, topic: str, invalid: Invalid) -> bool:
    """Send one reject to ``topic``; False if the publisher dropped it (see its policy)."""
    return publisher.publish(topic, encode_deadletter(invalid), key=invalid.source)


def deadletter_message(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                       reason: str, max_bytes: int = MAX_DEADLETTER_BYTES) -> bytes:
    """The dead letter of one rejected Kafka message (JSON), as every plain consumer writes it.

    ``source``/``line`` are the topic and offset (with ``partition``/``offset``
    and the key as text): the durable reference when ``raw`` had to be cut.
    """
    return encode_with_raw({"source": topic, "line": offset, "partition": partition, "offset": offset,
                            "key": (key or b"").decode("utf-8", "replace"), "reason": reason}, value, max_bytes)
