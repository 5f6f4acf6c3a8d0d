"""Rejected input goes to the dead-letter topic, never silently away (telemetry-v1).

Each message is JSON ``{"source", "line", "reason", "raw"}`` keyed by its
source, so one file's rejects stay in order on one partition. ``raw`` is text
(bytes that are not UTF-8 are replaced) and truncated to ``MAX_RAW_CHARS``: a
dead letter explains a reject, it is not a second copy of a 1 MiB line.
"""

from __future__ import annotations

import msgspec

from eroica.models.reader import Invalid

from .publisher import FramePublisher

MAX_RAW_CHARS = 2048

_encoder = msgspec.json.Encoder()


def deadletter_record(invalid: Invalid, max_raw_chars: int = MAX_RAW_CHARS) -> dict:
    """The dead-letter form of one rejected line."""
    raw = invalid.raw.decode("utf-8", errors="replace")
    return {"source": invalid.source, "line": invalid.line, "reason": invalid.reason,
            "raw": raw[:max_raw_chars]}


def encode_deadletter(invalid: Invalid, max_raw_chars: int = MAX_RAW_CHARS) -> bytes:
    return _encoder.encode(deadletter_record(invalid, max_raw_chars))


def publish_invalid(publisher: FramePublisher, topic: str, invalid: Invalid) -> bool:
    """Send one reject to ``topic``; False if the publisher dropped it (see its policy)."""
    return publisher.publish(topic, encode_deadletter(invalid), key=invalid.source)
