"""Rejected input goes to the dead-letter topic, never silently away (telemetry-v1).

The one dead-letter format of Eroica (every producer of dead letters encodes
through this module, and :func:`eroica.models.deadletter.decode_deadletter`
reads it). Each message is JSON keyed by its source, so one file's rejects
stay in order on one partition::

    {"source", "line", "reason",       # where and why (below)
     "raw",                            # the rejected bytes, whole (see below)
     "raw_encoding": "text"|"base64",  # base64 when the bytes are not UTF-8
     "raw_bytes", "raw_sha256",        # size and SHA-256 of the whole rejected payload
     "raw_truncated": bool,
     "partition", "offset", "key"}     # only for a whole consumed Kafka message

Two kinds of reject, one format:

- a **line** (:func:`encode_deadletter`: the reader's rejects, from a file or
  from within an ingest message): ``source`` is the file, or
  ``topic/partition@offset`` of the ingest message, and ``line`` the line
  number within it;
- a whole **consumed message** (:func:`deadletter_message`: the stream
  workers, the ClickHouse sink, the alert consumer): ``source`` is the topic,
  ``line`` the offset, plus ``partition``, ``offset`` and ``key`` (as text).

Before issue 14 the stream workers wrote a consumed message's dead letter as a
line (``source`` ``topic/partition``, no ``partition``/``offset``/``key``);
:func:`~eroica.models.deadletter.decode_deadletter` still reads those.

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

from eroica.models.deadletter import HEAD_BYTES, MAX_DEADLETTER_BYTES, encode_with_raw
from eroica.models.reader import Invalid

from .publisher import FramePublisher

__all__ = ["encode_deadletter", "deadletter_message", "publish_invalid", "HEAD_BYTES", "MAX_DEADLETTER_BYTES"]


def encode_deadletter(invalid: Invalid, max_bytes: int = MAX_DEADLETTER_BYTES) -> bytes:
    return encode_with_raw({"source": invalid.source, "line": invalid.line, "reason": invalid.reason},
                           invalid.raw, max_bytes)


def publish_invalid(publisher: FramePublisher, topic: str, invalid: Invalid) -> bool:
    """Send one reject to ``topic``; False if the publisher dropped it (see its policy)."""
    return publisher.publish(topic, encode_deadletter(invalid), key=invalid.source)


def deadletter_message(topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                       reason: str, max_bytes: int = MAX_DEADLETTER_BYTES) -> bytes:
    """The dead letter of one rejected Kafka message (JSON), as every consumer of Eroica writes it.

    ``source``/``line`` are the topic and offset (with ``partition``/``offset``
    and the key as text): the durable reference when ``raw`` had to be cut.
    """
    return encode_with_raw({"source": topic, "line": offset, "partition": partition, "offset": offset,
                            "key": (key or b"").decode("utf-8", "replace"), "reason": reason}, value, max_bytes)
