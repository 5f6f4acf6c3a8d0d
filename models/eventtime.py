"""Bounds on a record's event time: a clock far off cannot close, open or stretch a job's windows.

Windows close on event time (each stream's mark), so one record stamped decades
ahead would close every window of its job, and one stamped 1970 would open a
window half a century before the job. Two bounds keep a record's ``ts_ns``
inside what the stack can believe, the same in the stream (the summariser) and
in batch (the reader under ``analyze``, ``whatif``, ``report``):

- **not after its arrival** by more than :data:`FUTURE_SLACK_NS`: no record can
  describe an event that has not happened yet when it is read. The hour is
  Kafka's own bound on message timestamps (``log.message.timestamp.after.max.ms``,
  3,600,000 since Kafka 3.6): clocks kept by NTP differ by milliseconds, an hour
  still admits a clock that was never synced but runs roughly right, and a clock
  further ahead (a local time zone taken for UTC, an RTC reset to 2100) is wrong,
  not skewed. A file analysed later than it was written only moves this bound
  further out, so batch and stream agree on every record a stream could receive.
- **not before its job's start** by more than :data:`PAST_SLACK_NS`, when the
  job's ``job`` record gives its start (``ts_ns``, optional in the contract):
  the ranks' clocks differ from the clock that stamped the job record by the
  same skew the first bound allows. Without a job record (or before it is seen)
  only the windows already closed bound the past (their records are late).

A record outside the bounds is rejected with its reason (a dead letter on the
stream, an invalid record in batch): never kept, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .columns import Columns
from .records import JobRecord

__all__ = ["FUTURE_SLACK_NS", "PAST_SLACK_NS", "TimeBounds", "Outside"]

NS_PER_HOUR = 3_600_000_000_000
FUTURE_SLACK_NS = NS_PER_HOUR  # Kafka's log.message.timestamp.after.max.ms default (module docstring)
PAST_SLACK_NS = NS_PER_HOUR  # the same clock skew, measured against the job record's clock


@dataclass(frozen=True)
class Outside:
    """The rows of one batch outside the bounds, and why (one reason per batch: its first bound broken)."""

    rows: np.ndarray  # indices into the batch
    reason: str


@dataclass
class TimeBounds:
    """Each job's start (from its job record) and the bound checks; ``now_ns``: the arrival, None for none."""

    starts: dict[str, int] = field(default_factory=dict)

    def job(self, record: JobRecord) -> None:
        """A job record: its ``ts_ns`` (when given) is the job's start; the earliest seen is kept.

        The earliest, because a job record repeated later (a restarted rank 0)
        must not turn the job's earlier records into records "before its start".
        """
        if record.ts_ns is not None:
            prev = self.starts.get(record.job)
            self.starts[record.job] = record.ts_ns if prev is None else min(prev, record.ts_ns)

    def outside(self, cols: Columns, now_ns: int | None) -> Outside | None:
        """The records of ``cols`` (any jobs) outside the bounds, or None when every record is inside."""
        if not len(cols):
            return None
        ts = cols.arrays["ts_ns"]
        bad = np.zeros(ts.size, dtype=bool)
        reasons: list[str] = []
        if now_ns is not None:
            ahead = ts > now_ns + FUTURE_SLACK_NS
            if ahead.any():
                bad |= ahead
                worst = int(ts[ahead].max()) - now_ns
                reasons.append(f"ts_ns {_span(worst)} after its arrival (more than "
                               f"{FUTURE_SLACK_NS // NS_PER_HOUR} h: a clock running ahead)")
        if self.starts:
            codes = cols.arrays["job"]
            vocab = cols.vocab["job"]
            for code in np.unique(codes).tolist():
                start = self.starts.get(vocab[code])
                if start is None:
                    continue
                before = (codes == code) & (ts < start - PAST_SLACK_NS)
                if before.any():
                    bad |= before
                    worst = start - int(ts[before].min())
                    reasons.append(f"ts_ns {_span(worst)} before its job's start (the job record's ts_ns; "
                                   f"more than {PAST_SLACK_NS // NS_PER_HOUR} h: a clock running behind)")
        if not bad.any():
            return None
        return Outside(np.flatnonzero(bad), "; ".join(reasons))


def _span(ns: int) -> str:
    """A duration for a reason: hours up to two days, then days, then years."""
    hours = ns / NS_PER_HOUR
    if hours < 48:
        return f"{hours:.1f} h"
    days = hours / 24
    return f"{days:.0f} days" if days < 730 else f"{days / 365.25:.0f} years"
