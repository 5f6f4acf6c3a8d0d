"""What one call of a stream core produces: messages to send, job states to persist, tokens to acknowledge.

One type for both cores (the summariser's and the detector's; they were
``Step`` and ``Output`` before), applied by the faust glue in this order:
send every message and wait for the broker, persist every job state, then
acknowledge the tokens (the faust events), so a committed offset never passes
work whose effect is not on an output topic. ``Send.topic`` is a *role*
(:data:`SUMMARIES`, :data:`DEADLETTER`, ...); the glue maps roles to the
configured topic names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eroica.kafka.deadletter import deadletter_message

# Output roles (the glue maps each to a topic of KafkaConfig).
RAW = "raw"                # frames (ingest -> raw topic)
SUMMARIES = "summaries"    # digests, progress, job and end messages (KafkaConfig.digests_topic)
VERDICTS = "verdicts"      # one contract verdict per message
PATTERNS = "patterns"      # window summaries, the rows of the ``summaries`` table (KafkaConfig.window_summaries_topic)
DEADLETTER = "deadletter"


@dataclass
class Send:
    """One message to produce: ``topic`` is a role (SUMMARIES, DEADLETTER, ...), not a name."""

    topic: str
    key: bytes
    value: bytes


@dataclass
class Step:
    """Messages to send, then job states to persist, then tokens to acknowledge (in that order)."""

    sends: list[Send] = field(default_factory=list)
    acks: list[Any] = field(default_factory=list)
    persist: list[Any] = field(default_factory=list)  # the detector's JobStates (each once, by identity)

    def extend(self, other: "Step") -> "Step":
        self.sends.extend(other.sends)
        for s in other.persist:
            if all(p is not s for p in self.persist):
                self.persist.append(s)
        self.acks.extend(other.acks)
        return self


def dead_letter(topic: str, partition: int, offset: int, key: bytes | str | None, value: bytes | None,
                reason: str, token: Any) -> Step:
    """A consumed message that cannot be processed: its dead letter (``kafka/deadletter.py``), then its ack."""
    k = key.encode() if isinstance(key, str) else key
    dl = deadletter_message(topic, partition, offset, k, value, reason)
    return Step([Send(DEADLETTER, f"{topic}/{partition}".encode(), dl)], [token])
