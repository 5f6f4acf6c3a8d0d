"""Pure shaping for the sink worker: Kafka message bytes -> rows, or a reason to reject.

No Kafka client and no ClickHouse here, so every rule is testable with plain
bytes. Two input kinds:

- **verdicts** (``eroica.verdicts``): one contract verdict as a JSON object per
  message (a JSON array of verdicts is accepted too), read by
  :func:`~eroica.models.verdict.decode_verdict_message`, the one decoder of
  verdict messages;
- **window summaries** (``eroica.window-summaries``): a msgpack list of
  :class:`~eroica.models.summary.WindowSummary` maps.

A message is valid only if every row in it is: shaping (``verdict_row`` /
``summary_row``) runs here, so a value ClickHouse cannot store (a negative
time, a rank outside Int32) is rejected at the door with its reason instead of
failing a whole INSERT later. Rejected messages become dead letters in the
one form of Eroica (``kafka/deadletter.py``, written by :mod:`eroica.kafka.loop`):
JSON ``{source, line, reason, raw}`` where ``source`` is the topic and ``line``
the offset, plus ``partition``/``offset``/``key`` for finding the original.

:class:`PendingBatch` is the unit of work: rows waiting for one INSERT and,
per partition, the offset to commit once that INSERT succeeded.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from eroica.models.limits import MAX_VERDICT_BYTES, LimitError, check_msgpack, failure_reason
from eroica.models.summary import WindowSummary
from eroica.models.job_end import decode_job_end
from eroica.models.verdict import Verdict, decode_verdict_message

from .shaping import summary_row, verdict_row

__all__ = [
    "RejectedMessage", "DecodedMessage", "PendingBatch", "decode_verdicts", "decode_summaries",
]

_summaries = msgspec.msgpack.Decoder(list[WindowSummary])
_json = msgspec.json.Encoder()


class RejectedMessage(ValueError):
    """The message cannot become rows; ``str(exc)`` is the reason a dead letter carries."""


def _first_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:500]


def decode_verdicts(value: bytes | None) -> list[tuple[Verdict, tuple]]:
    """Verdicts of one message with their rows; RejectedMessage with a reason otherwise.

    A job-end marker (:mod:`eroica.models.job_end`, the detector's "this job
    ended" on the verdict topic) is no verdict and no mistake: no row, no dead letter.
    """
    if not value:
        raise RejectedMessage("empty message (no verdict)")
    if decode_job_end(value) is not None:
        return []
    try:  # size and depth bounded before msgspec sees the bytes (models/limits.py)
        verdicts = decode_verdict_message(value)
    except Exception as exc:  # DecodeError with the reason; nothing else can escape
        raise RejectedMessage(f"invalid verdict: {_first_line(exc)}") from None
    if not verdicts:
        raise RejectedMessage("empty verdict list")
    out = []
    for v in verdicts:
        if not v.verdict_id:
            raise RejectedMessage("invalid verdict: empty verdict_id")
        if v.window_end_ns < v.window_start_ns:
            raise RejectedMessage(f"invalid verdict {v.verdict_id!r}: window ends before it starts")
        try:
            out.append((v, verdict_row(v)))
        except Exception as exc:  # ValueError, OverflowError, RecursionError...: a reason, never a crash
            raise RejectedMessage(f"invalid verdict: {failure_reason(exc, 'verdict')}") from None
    return out


def decode_summaries(value: bytes | None, written_at_ns: int) -> list[tuple]:
    """Rows of one window-summary message (version ``written_at_ns``); RejectedMessage otherwise.

    An empty list is valid (a window with nothing to report) and yields no row.
    """
    if value is None:
        raise RejectedMessage("empty message (no summary list)")
    try:
        check_msgpack(value, MAX_VERDICT_BYTES, what="window summaries message")
        summaries = _summaries.decode(value)
    except LimitError as exc:
        raise RejectedMessage(f"invalid window summaries: {exc}") from None
    except msgspec.DecodeError as exc:
        raise RejectedMessage(f"invalid window summaries: {_first_line(exc)}") from None
    except Exception as exc:  # RecursionError, MemoryError...: a reason, never a crash
        raise RejectedMessage(f"invalid window summaries: {failure_reason(exc)}") from None
    try:
        return [summary_row(s, written_at_ns) for s in summaries]
    except Exception as exc:  # ValueError, OverflowError...: a reason, never a crash
        raise RejectedMessage(f"invalid window summary: {failure_reason(exc, 'window summary')}") from None


@dataclass
class DecodedMessage:
    """One consumed message: its position and what it turned into."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    verdict_rows: list[tuple] = field(default_factory=list)
    summary_rows: list[tuple] = field(default_factory=list)
    deadletter: bytes | None = None  # set when the message was rejected
    # Dead-letter delivery: None (not sent), "inflight", "delivered" or "failed" (send again).
    deadletter_state: str | None = None
    raw: bytes | None = None  # the message value, for a dead letter should ClickHouse refuse its rows

    @property
    def rows(self) -> int:
        return len(self.verdict_rows) + len(self.summary_rows)


@dataclass
class PendingBatch:
    """Messages consumed since the last commit: rows to insert, dead letters to send, offsets.

    ``offsets`` maps (topic, partition) to the *next* offset to read, i.e. the
    value to commit once everything before it is stored. Messages of one
    partition arrive in order, so the highest offset seen + 1 covers all of them.
    """

    messages: list[DecodedMessage] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    started_at: float | None = None  # monotonic time of the first message
    rows: int = 0

    def add(self, msg: DecodedMessage, now: float | None = None) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic() if now is None else now
        self.messages.append(msg)
        self.rows += msg.rows
        tp = (msg.topic, msg.partition)
        self.offsets[tp] = max(self.offsets.get(tp, 0), msg.offset + 1)

    def __len__(self) -> int:
        return len(self.messages)

    def due(self, now: float, max_rows: int, max_age_s: float) -> bool:
        """Time to insert: enough rows, or the oldest message has waited long enough."""
        if self.started_at is None:
            return False
        return self.rows >= max_rows or now - self.started_at >= max_age_s

    def verdict_rows(self) -> list[tuple]:
        return [r for m in self.messages for r in m.verdict_rows]

    def summary_rows(self) -> list[tuple]:
        return [r for m in self.messages for r in m.summary_rows]

    def deadletters(self) -> list[DecodedMessage]:
        return [m for m in self.messages if m.deadletter is not None]

    def drop_partitions(self, partitions: Iterable[tuple[str, int]]) -> int:
        """Forget messages of revoked partitions (their offsets were not committed: re-read later)."""
        gone = set(partitions)
        keep = [m for m in self.messages if (m.topic, m.partition) not in gone]
        dropped = len(self.messages) - len(keep)
        self.messages = keep
        self.offsets = {tp: o for tp, o in self.offsets.items() if tp not in gone}
        self.rows = sum(m.rows for m in keep)
        if not keep:
            self.started_at = None
        return dropped


def jsonable(value: Any) -> Any:
    """msgspec ``enc_hook`` for query results (dates, decimals, UUIDs... as text)."""
    return str(value)
