"""Edge digests: one node's raw records -> time-window digests, on the node (pure: no Kafka, no clock).

In *digest mode* a producer on the node (``eroica replay --edge-digests``,
``eroica agent --edge-digests``) runs this instead of publishing raw frames:
it cuts the node's records into the same epoch-aligned windows
(``[k*W, (k+1)*W)``, :class:`~eroica.streams.detection.windows.WindowAssembler`)
with the same lateness rule as the central summariser
(:mod:`eroica.streams.cores.summariser_core`: per job, each stream ``(key, record
type)`` has an event-time mark, the oldest record of its latest batch; the
watermark is the slowest active stream's mark, unless it lags the most
advanced by more than ``max_skew_ns``; window ``k`` closes once the watermark
passes ``(k + 1) * W + lateness``), digests each window with the very same
:func:`~eroica.streams.detection.summarise.digest_window`, and hands back
summaries-topic messages (:mod:`eroica.streams.cores.digest_messages`) exactly as a
summariser partition would send them. The detector cannot tell the modes
apart: a node is one more *source* whose digest covers its ranks, merged with
the other sources' digests of the window by concatenation.

Completeness with many producers is the detector's existing rule, unchanged:
every message carries the source's ``keys`` (the Kafka keys it would have
used in raw mode: ``job/rank`` for each rank it holds, ``job/node`` for its
node-level counters) and ``closed_through_ns``; a window is complete once
every key the detector expects (``world_size`` ranks from the job record, the
nodes of ``rank_nodes`` for the first window, every key any source reported)
is covered by a source that closed it. A window that closes without data
sends a ``progress`` message; :meth:`EdgeDigester.end` flushes every window
and sends ``end`` with ``job_keys`` when the caller knows the job's total key
count (a replay does; a live agent does not, and then every expected key must
end). A source must claim only keys whose records it holds *all* of (pass
``keys`` to claim a fixed set: a node agent that digests its GPU samples
while the ranks' tracers send their functions raw claims its node key only).

Messages come back as :class:`EdgeMessage` (Kafka key and value bytes): the
producer that publishes them needs no type from this layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eroica.kafka.framing import NODE_LEVEL, frame_key
from eroica.models.columns import Columns
from eroica.models.records import JobRecord
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import JobWindow, WindowAssembler
from eroica.streams.cores.digest_messages import DigestMsg, EndMsg, JobMsg, ProgressMsg, encode_message


@dataclass(frozen=True)
class EdgeMessage:
    """One summaries-topic message: keyed by job, like every summariser message."""

    key: bytes
    value: bytes
    kind: str      # digest | progress | end | job
    records: int = 0  # raw records the digest summarises


@dataclass
class EdgeStats:
    records: int = 0
    late_records: int = 0
    digests: int = 0
    progress: int = 0
    ends: int = 0
    bytes: int = 0


class _Assembler(WindowAssembler):
    """The core's assembler with the watermark set from the stream marks (as the summariser does)."""

    def add_quiet(self, cols: Columns) -> None:
        wm = dict(self._watermark)
        self.add(cols)
        self._watermark = wm

    def set_watermark(self, job: str, ns: int) -> None:
        self._watermark[job] = ns

    def closed(self, job: str) -> int:
        return self._closed.get(job, -1)

    def close_through(self, job: str, index: int) -> None:
        if index > self._closed.get(job, -1):
            self._closed[job] = index


@dataclass
class _EdgeJob:
    marks: dict[tuple[str, str], int] = field(default_factory=dict)  # (key, type) -> oldest record of its latest batch
    declared: set[tuple[str, str]] = field(default_factory=set)  # streams whose producer declares its mark
    keys: set[str] = field(default_factory=set)
    closed_through: int = -1    # highest window index closed (with or without data)
    reported_through: int = -1  # highest closed index the detector has been told about


def _stream_lows(cols: Columns, job_code: int) -> dict[str, int]:
    """Per Kafka key of one job in ``cols``: its oldest record (one numpy grouping pass)."""
    arr = cols.arrays
    sel = arr["job"] == job_code
    node_level = cols.type in NODE_LEVEL
    ids = (arr["node"] if node_level else arr["rank"])[sel].astype(np.int64)
    ts = arr["ts_ns"][sel]
    uniq, inv = np.unique(ids, return_inverse=True)
    lows = np.full(uniq.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(lows, inv, ts)
    job = cols.vocab["job"][job_code]
    nodes = cols.vocab["node"]
    if node_level:
        return {frame_key(job, -1, nodes[int(u)]): int(lo) for u, lo in zip(uniq, lows)}
    return {frame_key(job, int(u)): int(lo) for u, lo in zip(uniq, lows)}


class EdgeDigester:
    """The window digests of the records one producer holds (a node's, or a fixed set of keys).

    ``source`` names the producer in every message (unique per job: the
    detector keeps one digest per source and window). ``window_ns``,
    ``lateness_ns`` and ``max_skew_ns`` must be the central summariser's
    (``EROICA_WINDOW_S``, ``EROICA_LATENESS_S``, ``EROICA_MAX_SKEW_S``).
    """

    def __init__(self, source: str, window_ns: int, lateness_ns: int, max_skew_ns: int,
                 keys: list[str] | None = None, declared_lateness_ns: int | None = None) -> None:
        self.source = source
        self.window_ns = int(window_ns)
        self.lateness_ns = int(lateness_ns)
        self.max_skew_ns = int(max_skew_ns)
        # None: declarations are ignored (every mark is a guess, closed ``lateness_ns`` behind)
        self.declared_lateness_ns = declared_lateness_ns
        self.fixed_keys = sorted(keys) if keys is not None else None
        self.asm = _Assembler(self.window_ns, self.lateness_ns)
        self.jobs: dict[str, _EdgeJob] = {}
        self.stats = EdgeStats()

    # -- input ---------------------------------------------------------------

    def job(self, record: JobRecord) -> list[EdgeMessage]:
        """The job's contract record, forwarded as the summariser forwards it."""
        self.asm.add_meta(record)
        return [self._msg(record.job, JobMsg(job=record.job, record=record), "job")]

    def add(self, *batch: Columns, declared_ns: int | None = None) -> list[EdgeMessage]:
        """Records of this producer (any types, one or several jobs); the windows this closes.

        ``declared_ns``: the producer vouches that nothing of these records'
        streams older than it is still to come (the tracer's open spans, the
        agent's sample time), as a frame's ``wm`` does for the summariser; such
        a stream's windows close ``declared_lateness_ns`` after the mark passes
        them, not ``lateness_ns`` (:meth:`_watermark`).
        """
        declare = declared_ns is not None and self.declared_lateness_ns is not None
        touched: list[str] = []
        for cols in batch:
            if not len(cols):
                continue
            codes = np.unique(cols.arrays["job"])
            for code in codes.tolist():
                job = cols.vocab["job"][code]
                js = self._job(job)
                if job not in touched:
                    touched.append(job)
                for key, lo in _stream_lows(cols, code).items():
                    js.keys.add(key)
                    slot = (key, cols.type)
                    if declare:
                        js.declared.add(slot)
                        lo = int(declared_ns)  # type: ignore[arg-type]  # the promise, not its records
                    elif slot in js.declared:
                        continue  # a declaring stream's mark moves with its declarations only
                    if lo > js.marks.get(slot, np.iinfo(np.int64).min):
                        js.marks[slot] = lo
            late = self.asm.late_records
            self.asm.add_quiet(cols)
            self.stats.late_records += self.asm.late_records - late
            self.stats.records += len(cols)
        out: list[EdgeMessage] = []
        for job in touched:
            out.extend(self._advance(job))
        return out

    def end(self, job_keys: dict[str, int] | None = None) -> list[EdgeMessage]:
        """End of this producer's input: every window closes, then ``end`` per job.

        ``job_keys``: per job, the total number of keys of *all* its producers,
        when known (it lets the detector finish the job without its record).
        """
        out: list[EdgeMessage] = []
        for job, js in sorted(self.jobs.items()):
            windows = self.asm.flush(job)
            through = max([js.closed_through, *(w.start_ns // self.window_ns for w in windows)])
            out.extend(self._close(job, js, windows, through))
            msg = EndMsg(job=job, source=self.source, keys=self.keys(job),
                         closed_through_ns=js.closed_through * self.window_ns,
                         job_keys=(job_keys or {}).get(job))
            out.append(self._msg(job, msg, "end"))
            self.stats.ends += 1
        return out

    def keys(self, job: str) -> list[str]:
        """The keys this producer vouches for in ``job``."""
        return list(self.fixed_keys) if self.fixed_keys is not None else sorted(self.jobs[job].keys)

    # -- closing -------------------------------------------------------------

    def _job(self, job: str) -> _EdgeJob:
        js = self.jobs.get(job)
        if js is None:
            js = self.jobs[job] = _EdgeJob()
        return js

    def _watermark(self, js: _EdgeJob) -> int | None:
        """The summariser's rule (``summariser_core``): the slowest stream's mark unless it lags the most
        advanced by more than ``max_skew_ns``; a declared mark counts the lateness it does not need ahead."""
        if not js.marks:
            return None
        ahead = max(0, self.lateness_ns - (self.declared_lateness_ns or 0))
        marks = [m + ahead if slot in js.declared else m for slot, m in js.marks.items()]
        return max(min(marks), max(marks) - self.max_skew_ns)

    def _advance(self, job: str) -> list[EdgeMessage]:
        js = self.jobs[job]
        wm = self._watermark(js)
        if wm is None:
            return []
        through = (wm - self.lateness_ns) // self.window_ns - 1  # highest window index now complete
        if through <= js.closed_through:
            return []
        self.asm.set_watermark(job, wm)
        return self._close(job, js, self.asm.complete(), through)

    def _close(self, job: str, js: _EdgeJob, windows: list[JobWindow], through: int) -> list[EdgeMessage]:
        self.asm.close_through(job, through)
        js.closed_through = max(js.closed_through, through)
        closed_ns = js.closed_through * self.window_ns
        keys = self.keys(job)
        out: list[EdgeMessage] = []
        for i, w in enumerate(windows):
            records = w.records
            through_ns = closed_ns if i == len(windows) - 1 else w.start_ns
            msg = DigestMsg(job=job, start_ns=w.start_ns, end_ns=w.end_ns, source=self.source, keys=keys,
                            closed_through_ns=through_ns, records=records, digest=digest_window(w))
            out.append(self._msg(job, msg, "digest", records))
            self.stats.digests += 1
        if not windows and js.closed_through > js.reported_through:
            out.append(self._msg(job, ProgressMsg(job=job, source=self.source, keys=keys,
                                                  closed_through_ns=closed_ns), "progress"))
            self.stats.progress += 1
        js.reported_through = js.closed_through
        return out

    def _msg(self, job: str, msg: object, kind: str, records: int = 0) -> EdgeMessage:
        value = encode_message(msg)  # type: ignore[arg-type]
        self.stats.bytes += len(value)
        return EdgeMessage(job.encode(), value, kind, records)

