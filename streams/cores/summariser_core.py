"""The summariser's core, one raw partition: frames in, window digests out (pure: no Kafka, no faust, no clock).

The faust agent (``streams/faust/workers.py``) owns one :class:`PartitionSummariser` per
assigned partition of the raw topic and hands it each message with an opaque
*token* (the faust event). Every call returns a :class:`~.step.Step`: messages to send
and the tokens that may be acknowledged **once those messages are delivered**.
A frame's token is held until every window its records reach has been sent
as a digest, so the consumer's committed offset never passes a record whose
digest is not on the summaries topic: after a crash, the next owner re-reads
whatever was not yet summarised (see the package docstring on delivery).

Windows are cut by :class:`~eroica.streams.detection.windows.WindowAssembler`
(epoch-aligned, the same windows as ``eroica analyze``). What this module adds
is *when* a window closes:

- **watermark**: per job, each stream (a Kafka key, ``job/rank`` or
  ``job/node``, and a record type) has its own event-time mark, the oldest
  record of its latest frame; the job's watermark on this partition is the
  *slowest* active stream's mark, so a rank's GPU samples or a node's NIC
  counters arriving a little behind its functions never lose records as late.
  A stream that lags the most advanced one by more than ``max_skew_ns`` (a
  hung or dead rank) stops holding windows open. A window ``k`` closes once
  the watermark passes ``(k + 1) * W + lateness``, and ``hold_s`` of wall
  clock later (a burst of frames of several types is then all in).
- **end of stream**: once every key of a job on this partition has sent its
  end-of-stream marker, all the job's windows close and an ``end`` message
  tells the detector.
- **event-time bounds**: a record stamped far after its arrival or before its
  job's start (:mod:`eroica.models.eventtime`) would close or open windows it
  has no part in; such records go to the dead-letter topic with the reason
  (as a frame of just those rows) and the rest of their frame is kept, as
  the reader does for ``analyze``.
- **idle**: :meth:`PartitionSummariser.idle` closes the windows of a job that
  has been silent (wall clock, passed in by the caller) for a while.

Decoding is columnar (``np.frombuffer`` views, numpy reductions per frame):
no Python work per record. A message that is not a valid frame goes to the
dead-letter topic with its reason and is acknowledged; it never stops the
partition.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica.models.columns import Columns
from eroica.models.eventtime import TimeBounds
from eroica.models.frames import (
    DECLARED_LATENESS_NS,
    COLUMNS,
    END_OF_STREAM,
    FrameError,
    decode_end_of_stream,
    decode_frame,
    decode_job,
    encode_frame,
    frame_kind,
)
from eroica.kafka.framing import NODE_LEVEL, frame_key
from eroica.models.limits import MAX_VERDICT_BYTES
from eroica.streams.detection.budget import fold_fns
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import JobWindow, WindowAssembler
from eroica.runtime import metrics

from .digest_messages import DigestMsg, EndMsg, JobMsg, ProgressMsg, encode_message
from .step import DEADLETTER, SUMMARIES, Send, Step, dead_letter

__all__ = ["PartitionSummariser", "JobClock", "InputDrain", "SummariserStats", "RECOVERY_GRACE_S",
           "SUMMARIES", "DEADLETTER", "Send", "Step"]

# A digest message must fit the summaries topic's max.message.bytes (kafka/admin.py LARGE_MESSAGES, 16 MiB)
# with room for the record batch's own framing: 90% of it.
DIGEST_BYTES = MAX_VERDICT_BYTES * 9 // 10
_NO_MARK = np.iinfo(np.int64).min
_MAX_MARK = np.iinfo(np.int64).max


@dataclass
class SummariserStats:
    frames: int = 0
    records: int = 0
    late_records: int = 0
    repeated_records: int = 0  # copies of records already in their window (delivered twice), dropped
    out_of_time: int = 0  # records outside the event-time bounds, dead-lettered
    after_end: int = 0  # records for windows analysed at their job's end, sent after it: dead-lettered
    folded_functions: int = 0  # functions folded to fit a digest into its message (streams/detection/budget.py)
    corrupt: int = 0
    job_records: int = 0
    end_markers: int = 0
    digests: int = 0
    digest_records: int = 0
    progress: int = 0
    ends: int = 0
    idle_closes: int = 0

    def add(self, other: "SummariserStats") -> None:
        for k, v in vars(other).items():
            setattr(self, k, getattr(self, k) + v)


class _Assembler(WindowAssembler):
    """The core's assembler, with the watermark and the closed mark set from outside."""

    def set_watermark(self, job: str, ns: int) -> None:
        self._watermark[job] = ns

    def add_frame(self, cols: Columns, job: str, lo: int, hi: int) -> int:
        """Add one job's records (oldest ``lo``, newest ``hi``) without moving its watermark.

        A frame inside one window (nearly all of them) skips the core's
        grouping pass; the result is the same as :meth:`add`. Returns the last
        window the frame's records reach, spans included (their continuations).
        """
        win = lo // self.window_ns
        last = hi // self.window_ns
        if win == last:
            reach = self.add_continuations(cols)
            if win <= self._closed.get(job, -1):
                self.late_records += len(cols)
            else:
                self._parts.setdefault((job, win), {}).setdefault(cols.type, []).append(cols)
            return max(last, reach)
        wm = self._watermark.get(job)
        reach = self.add(cols)
        if wm is None:
            self._watermark.pop(job, None)
        else:
            self._watermark[job] = wm
        return max(last, reach)

    def closed(self, job: str) -> int:
        return self._closed.get(job, -1)

    def close_through(self, job: str, index: int) -> None:
        """Windows up to ``index`` count as analysed: later records for them are late."""
        if index > self._closed.get(job, -1):
            self._closed[job] = index


class _Job:
    """One job on one partition: event-time marks per (key, record type), end markers, held tokens.

    Marks are kept per (key, type) because a collector (or a replay) sends each
    record type of a rank in its own frames, a sparse type (GPU samples) lagging
    the dense one (functions): the slowest stream of a key holds the window.
    """

    def __init__(self) -> None:
        self.slots: dict[tuple[str, str], int] = {}
        self.key_slots: dict[str, list[int]] = {}
        self.marks = np.full(8, _NO_MARK, dtype=np.int64)  # oldest record of each stream's latest frame
        self.active = np.zeros(8, dtype=bool)
        self.declared = np.zeros(8, dtype=bool)  # streams whose producer declares its watermark (frame meta "wm")
        self.ended: set[str] = set()
        self.job_keys: int | None = None
        self.held: dict[int, list[Any]] = defaultdict(list)  # last window index a frame reaches -> tokens
        self.end_tokens: list[Any] = []
        self.closed_through = -1  # highest window index closed (with or without data)
        self.ended_through: int | None = None  # closed_through when every key had ended (None: never ended)
        self.reported_through = -1  # highest closed index the detector has been told about
        self.due: list[tuple[int, int, float]] = []  # (through, watermark, since): closes waiting for the hold
        self.last_seen = 0.0

    def key(self, key: str) -> None:
        self.key_slots.setdefault(key, [])

    def slot(self, key: str, type_: str) -> int:
        s = self.slots.get((key, type_))
        if s is None:
            s = self.slots[(key, type_)] = len(self.slots)
            self.key_slots.setdefault(key, []).append(s)
            if s >= self.marks.size:
                self.marks = np.concatenate([self.marks, np.full(self.marks.size, _NO_MARK, dtype=np.int64)])
                self.active = np.concatenate([self.active, np.zeros(self.active.size, dtype=bool)])
                self.declared = np.concatenate([self.declared, np.zeros(self.declared.size, dtype=bool)])
            self.active[s] = key not in self.ended
        return s

    def end(self, key: str) -> None:
        self.key(key)
        self.ended.add(key)
        for s in self.key_slots[key]:
            self.active[s] = False

    def revive(self, key: str) -> None:
        """A key that ended sends again (a restarted producer): it is live again."""
        self.ended.discard(key)
        for s in self.key_slots.get(key, ()):
            self.active[s] = True

    def watermark(self, max_skew_ns: int, lateness_ns: int = 0, declared_lateness_ns: int = 0) -> int | None:
        """The slowest active stream's mark, unless it lags the most advanced by more than ``max_skew_ns``.

        A stream's mark is the oldest record of its latest frame, not the
        newest: frames are sent roughly in order of their oldest record, so a
        stream seen for the first time (a rank's first GPU samples) cannot
        start behind a watermark that other streams' long frames (a sparse
        rank's 1000 records can span 30 s) pushed ahead. It costs one frame
        span of latency (live collectors flush every 250-500 ms).

        Such a mark is only a guess, so windows close ``lateness_ns`` behind
        it. A stream whose producer *declares* its watermark (every record
        older than it has been sent: the tracer knows its open spans) needs
        only ``declared_lateness_ns``: its mark counts the difference ahead
        of a guessed one. The result is on the guessed marks' scale (windows
        close ``lateness_ns`` behind it), so a job whose every stream
        declares closes its windows ``declared_lateness_ns`` after the
        slowest declaration passes them.
        """
        n = len(self.slots)
        act = self.active[:n]
        marks = self.marks[:n][act]
        if not marks.size:
            return None
        declared = self.declared[:n][act]
        # Python ints: a stream without a mark yet is int64's minimum, which must not wrap
        lows, highs = [], []
        ahead = max(0, lateness_ns - declared_lateness_ns)
        if declared.any():
            lows.append(int(marks[declared].min()) + ahead)
            highs.append(int(marks[declared].max()) + ahead)
        if not declared.all():
            lows.append(int(marks[~declared].min()))
            highs.append(int(marks[~declared].max()))
        return max(min(lows), max(highs) - max_skew_ns)

    def all_ended(self) -> bool:
        return bool(self.key_slots) and len(self.ended) >= len(self.key_slots)

    def keys(self) -> list[str]:
        return sorted(self.key_slots)

    def take_held(self, through: int | None = None) -> list[Any]:
        """Tokens of frames whose records all lie in windows up to ``through`` (None: all)."""
        out: list[Any] = []
        for idx in [i for i in self.held if through is None or i <= through]:
            out.extend(self.held.pop(idx))
        return out


class JobClock:
    """Last arrival (wall clock) of each job's frames, across the partitions one worker holds.

    A partition counts a job as idle only when the whole job is silent on the
    worker: a partition holding only a node's sparse NIC samples, or a hung
    rank, must not close the job's windows early while its other partitions
    still receive data. (Event time is deliberately not shared across
    partitions: while a worker catches up on a backlog it may read one
    partition far ahead of another.)
    """

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def saw(self, job: str, now: float) -> None:
        self.seen[job] = now


# After the broker answers again, a publisher needs up to librdkafka's reconnect backoff
# (reconnect.backoff.max.ms, 10 s) to reach it and resend what it held, and longer on a
# loaded machine. The sound bound is the publishers' delivery timeout (message.timeout.ms):
# a message produced before the broker came back is delivered or given up within that long
# of being produced, so once the broker has been up that long nothing held can still come.
# The worker passes its configured delivery timeout; this is the floor.
RECOVERY_GRACE_S = 20.0


class InputDrain:
    """Which partitions have no input left, from the broker's end offsets and the read positions.

    Idle closing must tell "no more input" from "input held up": a broker that
    restarts takes longer than the idle timeout, and the records it held would
    then arrive after their windows closed, as late records, and be dropped.
    A broker that does not answer (``ends`` None) drains nothing; once it
    answers again nothing is drained for ``recovery_grace_s`` and every job
    gets a fresh idle period (what the publishers held is still on its way:
    they reconnect and resend); after that a partition is drained when every
    record up to its end offset has been read.

    The worker must learn of an outage even when no idle close is at stake
    (one shorter than the idle timeout ends before anyone asks, and the
    publishers' backlog arrives after the next idle period): it reports
    every periodic probe of the broker with :meth:`observe`.
    """

    def __init__(self, clock: JobClock, recovery_grace_s: float = RECOVERY_GRACE_S) -> None:
        self.clock = clock
        self.recovery_grace_s = max(RECOVERY_GRACE_S, float(recovery_grace_s))
        self.held = False
        self.recovered_at = float("-inf")
        self.outages = 0

    def observe(self, answered: bool, now: float) -> None:
        """One probe of the broker: it answered, or not (an outage starts or goes on)."""
        if not answered:
            if not self.held:
                self.outages += 1
            self.held = True
            return
        if self.held:
            self.held = False
            self.recovered_at = now
            for job in list(self.clock.seen):
                self.clock.saw(job, now)

    def drained(self, ends: dict[int, int] | None, read_to: dict[int, int], now: float) -> set[int]:
        self.observe(ends is not None, now)
        if ends is None or self.held or now - self.recovered_at < self.recovery_grace_s:
            return set()
        return {p for p, end in ends.items() if read_to.get(p, 0) >= end}


class PartitionSummariser:
    """Window state of one partition of the raw topic; ``source`` names it in every digest.

    ``hold_s`` delays each close by that much wall clock after the watermark
    passed it: frames of other record types sent in the same burst (a replay
    publishes a file batch type by type) still make it into the window.
    """

    def __init__(self, source: str, window_ns: int, lateness_ns: int, max_skew_ns: int,
                 hold_s: float = 0.0, clock: JobClock | None = None,
                 declared_lateness_ns: int = DECLARED_LATENESS_NS, counted_to: int = -1) -> None:
        self.source = source
        # the highest offset whose records the figures count: a message read again (at-least-once, after a
        # restart or a rebalance re-reads from the commit point) is processed again but never counted twice
        self.counted_to = int(counted_to)
        self.window_ns = int(window_ns)
        self.lateness_ns = int(lateness_ns)
        self.declared_lateness_ns = min(int(declared_lateness_ns), self.lateness_ns)
        self.max_skew_ns = int(max_skew_ns)
        self.hold_s = float(hold_s)
        self.clock = clock if clock is not None else JobClock()
        self.asm = _Assembler(self.window_ns, self.lateness_ns)
        self.bounds = TimeBounds()
        self.jobs: dict[str, _Job] = {}
        self.stats = SummariserStats()

    # -- entry points --------------------------------------------------------

    def on_message(self, key: bytes | str | None, value: bytes | None, token: Any, now: float,
                   offset: int = -1, arrival_ns: int | None = None) -> Step:
        """One raw-topic message (``now``: monotonic seconds, for the hold and idle closing).

        ``arrival_ns`` (epoch ns, the worker's wall clock when it read the
        message) bounds its records' event time from above; None: no such bound.
        """
        if value is None:
            return self._dead(key, b"", offset, "empty message (no value)", token)
        try:
            kind = frame_kind(value)
        except FrameError as exc:
            return self._dead(key, value, offset, str(exc), token)
        k = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
        try:
            if kind == COLUMNS:
                return self._on_frame(k, value, token, now, offset, arrival_ns)
            if kind == END_OF_STREAM:
                return self._on_end(k, value, token, now)
            return self._on_job(value, token)
        except FrameError as exc:
            return self._dead(key, value, offset, str(exc), token)

    def tick(self, now: float, idle_s: float | None = None) -> Step:
        """Closes whose hold has passed, and (``idle_s``) every window of jobs silent that long."""
        step = Step()
        pending = set(self.asm.pending_jobs())
        for job, js in self.jobs.items():
            if idle_s is not None and self._idle(job, js, pending, now, idle_s):
                self.stats.idle_closes += 1
                step.extend(self._flush(job, js, end=js.all_ended()))
            elif js.due:
                step.extend(self._close_due(job, js, now))
        return step

    def idle_due(self, now: float, idle_s: float) -> bool:
        """Whether :meth:`tick` with ``idle_s`` would close some job's windows as idle.

        The worker asks first, so it checks the broker (is the input drained or
        held up?) only when an idle close is at stake.
        """
        pending = set(self.asm.pending_jobs())
        return any(self._idle(job, js, pending, now, idle_s) for job, js in self.jobs.items())

    def _idle(self, job: str, js: "_Job", pending: set[str], now: float, idle_s: float) -> bool:
        last = max(js.last_seen, self.clock.seen.get(job, 0.0))
        return bool(js.held or js.end_tokens or job in pending) and now - last >= idle_s

    def pending_tokens(self) -> int:
        return sum(len(v) for js in self.jobs.values() for v in js.held.values()) + \
            sum(len(js.end_tokens) for js in self.jobs.values())

    # -- message kinds -------------------------------------------------------

    def _on_frame(self, key: str | None, value: bytes, token: Any, now: float, offset: int,
                  arrival_ns: int | None) -> Step:
        cols, _meta = decode_frame(value)
        n = len(cols)
        if n == 0:
            return Step(acks=[token])
        codes = cols.arrays["job"]
        c0 = int(codes[0])
        if n > 1 and (int(codes.min()) != c0 or int(codes.max()) != c0):
            return self._dead(key, value, offset, "frame mixes records of several jobs (one key per frame)", token)
        job = cols.vocab["job"][c0]
        out = self.bounds.outside(cols, arrival_ns)
        rejected = Step()
        if out is not None:  # those rows to the dead-letter topic, the rest of the frame goes on
            self.stats.out_of_time += out.rows.size
            metrics.records_dropped("summariser", "out_of_time", out.rows.size)
            outside = np.zeros(n, dtype=bool)
            outside[out.rows] = True
            kept = self._divert(rejected, key, value, cols, _meta, outside, offset, out.reason, token)
            if kept is None:
                return rejected
            cols, n = kept, len(kept)
        if key is None:  # a keyless frame: the key its producer would have given it (kafka.framing)
            if cols.type not in NODE_LEVEL:
                key = frame_key(job, int(cols.arrays["rank"][0]))
            else:
                key = frame_key(job, -1, cols.vocab["node"][int(cols.arrays["node"][0])])
        js = self._job(job)
        if js.ended_through is not None:  # the job ended and comes back: what it sends for analysed windows
            after_end = cols.arrays["ts_ns"] // self.window_ns <= js.ended_through
            if after_end.any():
                reason = (f"record of job {job!r} after its end-of-stream, in a window already analysed at its end "
                          f"(through {(js.ended_through + 1) * self.window_ns} ns): send a job's records before "
                          f"its end markers (one replay), or replay this dead letter's records into a new job id")
                self.stats.after_end += int(after_end.sum())
                kept = self._divert(rejected, key, None if out is not None else value, cols, _meta, after_end,
                                    offset, reason, token)
                if kept is None:
                    return rejected
                cols, n = kept, len(kept)
        js.last_seen = now
        if key in js.ended:
            js.revive(key)
        slot = js.slot(key, cols.type)
        ts = cols.arrays["ts_ns"]
        lo, hi = int(ts.min()), int(ts.max())
        if offset < 0 or offset > self.counted_to:
            self.counted_to = max(self.counted_to, offset)
            self.stats.frames += 1
            self.stats.records += n
            metrics.records_in("summariser", cols.type, n)
        late_before = self.asm.late_records
        # held until the last window its records reach, spans included, is summarised
        last_window = self.asm.add_frame(cols, job, lo, hi)
        late = self.asm.late_records - late_before
        self.stats.late_records += late
        metrics.records_dropped("summariser", "late", late)
        if last_window <= self.asm.closed(job):  # every record was late: nothing to wait for
            rejected.acks.append(token)
            return rejected
        declared = _meta.get("wm")
        if isinstance(declared, int) and not isinstance(declared, bool):
            # the producer's promise: nothing of this stream older than "wm" is still to come
            js.declared[slot] = True
            if declared > js.marks[slot]:
                js.marks[slot] = min(declared, _MAX_MARK)
        elif not js.declared[slot] and lo > js.marks[slot]:
            js.marks[slot] = lo
        self.clock.saw(job, now)
        js.held[last_window].append(token)
        rejected.extend(self._advance(job, js, now))
        return rejected

    def _on_end(self, key: str | None, value: bytes, token: Any, now: float) -> Step:
        eos = decode_end_of_stream(value)
        self.stats.end_markers += 1
        if key is None:
            key = frame_key(eos.job, eos.rank, eos.node)
        js = self._job(eos.job)
        js.last_seen = now
        js.end(key)
        job_keys = eos.meta.get("job_keys")
        if isinstance(job_keys, int) and job_keys > 0:
            js.job_keys = job_keys
        js.end_tokens.append(token)
        if js.all_ended():
            return self._flush(eos.job, js, end=True)
        return self._advance(eos.job, js, now)

    def _on_job(self, value: bytes, token: Any) -> Step:
        record = decode_job(value)
        self.stats.job_records += 1
        self.asm.add_meta(record)
        self.bounds.job(record)
        msg = JobMsg(job=record.job, record=record)
        return Step([Send(SUMMARIES, record.job.encode(), encode_message(msg))], [token])

    # -- closing windows -----------------------------------------------------

    def _job(self, job: str) -> _Job:
        js = self.jobs.get(job)
        if js is None:
            js = self.jobs[job] = _Job()
        return js

    def _advance(self, job: str, js: _Job, now: float) -> Step:
        wm = js.watermark(self.max_skew_ns, self.lateness_ns, self.declared_lateness_ns)
        if wm is None:
            return Step()
        through = (wm - self.lateness_ns) // self.window_ns - 1  # highest window index now complete
        if through > max(js.closed_through, js.due[-1][0] if js.due else -1):
            js.due.append((through, wm, now))
        return self._close_due(job, js, now) if js.due else Step()

    def _close_due(self, job: str, js: _Job, now: float) -> Step:
        ready = [d for d in js.due if now - d[2] >= self.hold_s]
        if not ready:
            return Step()
        through, wm, _since = ready[-1]
        js.due = js.due[len(ready):]
        self.asm.set_watermark(job, wm)
        windows = self.asm.complete()
        assert all(w.job == job for w in windows), "only this job's watermark moved"
        return self._close(job, js, windows, through)

    def _flush(self, job: str, js: _Job, end: bool) -> Step:
        windows = self.asm.flush(job)
        js.due = []
        through = max([js.closed_through, *js.held.keys(), *(w.start_ns // self.window_ns for w in windows)])
        step = self._close(job, js, windows, through, end=end)
        if end:
            js.ended_through = js.closed_through
        # idle or ended: everything before the held end markers is summarised
        step.acks.extend(js.end_tokens)
        js.end_tokens = []
        return step

    def _close(self, job: str, js: _Job, windows: list[JobWindow], through: int, end: bool = False) -> Step:
        # counted per released window, as late records are counted per frame
        repeated = sum(w.repeated for w in windows)
        if repeated:
            metrics.records_dropped("summariser", "repeated", repeated)
            self.stats.repeated_records += repeated
        self.asm.close_through(job, through)
        js.closed_through = max(js.closed_through, through)
        closed_ns = js.closed_through * self.window_ns
        keys = js.keys()
        key_bytes = job.encode()
        step = Step()
        closed_at_ns = time.time_ns()  # wall clock of the close: the detector's verdict delay starts here
        for i, w in enumerate(windows):
            records = w.records
            # a digest vouches for the windows up to its own; the last one for all that closed
            through_ns = closed_ns if i == len(windows) - 1 else w.start_ns
            msg = DigestMsg(job=job, start_ns=w.start_ns, end_ns=w.end_ns, source=self.source, keys=keys,
                            closed_through_ns=through_ns, records=records, digest=digest_window(w),
                            closed_at_ns=closed_at_ns)
            step.sends.append(Send(SUMMARIES, key_bytes, self._bounded(msg)))
            self.stats.digests += 1
            self.stats.digest_records += records
            metrics.window_closed("summariser")
            metrics.records_out("summariser", SUMMARIES)
        if end:
            msg_end = EndMsg(job=job, source=self.source, keys=keys, closed_through_ns=closed_ns,
                             job_keys=js.job_keys)
            step.sends.append(Send(SUMMARIES, key_bytes, encode_message(msg_end)))
            self.stats.ends += 1
        elif not windows and js.closed_through > js.reported_through:
            msg_p = ProgressMsg(job=job, source=self.source, keys=keys, closed_through_ns=closed_ns)
            step.sends.append(Send(SUMMARIES, key_bytes, encode_message(msg_p)))
            self.stats.progress += 1
        js.reported_through = js.closed_through
        step.acks.extend(js.take_held(js.closed_through))
        return step

    def _bounded(self, msg: DigestMsg) -> bytes:
        """The digest message, its function rows folded further while it exceeds :data:`DIGEST_BYTES`.

        Only a job with many functions on many ranks of one partition gets here:
        the message could not be sent as it is (the topic refuses it, and the
        worker would retry it forever). Rows are cut in proportion to the excess,
        with a margin, so one or two passes fit it.
        """
        data = encode_message(msg)
        for _ in range(4):
            if len(data) <= DIGEST_BYTES or len(msg.digest.fns) == 0:
                break
            rows = int(len(msg.digest.fns) * DIGEST_BYTES / len(data) * 0.8)
            before = msg.digest.folded
            msg.digest = fold_fns(msg.digest, max_rows=max(rows, 1))
            self.stats.folded_functions += msg.digest.folded - before
            data = encode_message(msg)
        return data

    def _divert(self, step: Step, key: bytes | str | None, value: bytes | None, cols: Columns, meta: dict[str, Any],
                rows: np.ndarray, offset: int, reason: str, token: Any) -> Columns | None:
        """The ``rows`` (bool mask) of a frame's ``cols`` to the dead-letter topic with ``reason``, added to ``step``;
        the rest of the frame, or None when no row is left (the token is then acknowledged with the letter).

        ``value``: the message as read while ``cols`` is all of it (the letter keeps it whole), None once
        rows were already split off (the letter is then a frame of what is left: no row lettered twice).
        """
        if rows.all():
            step.extend(self._letter(key, value if value is not None else encode_frame(cols, meta), offset, reason,
                                     token))
            return None
        letter = self._letter(key, encode_frame(cols.take(rows), meta), offset, reason, None)
        letter.acks.clear()  # the token waits for the kept records' windows
        step.extend(letter)
        return cols.take(~rows)

    def _dead(self, key: bytes | str | None, value: bytes, offset: int, reason: str, token: Any) -> Step:
        self.stats.corrupt += 1
        metrics.invalid("summariser", reason)
        return self._letter(key, value, offset, reason, token)

    def _letter(self, key: bytes | str | None, value: bytes, offset: int, reason: str, token: Any) -> Step:
        topic, _, part = self.source.rpartition("/")  # ``source`` is ``topic/partition``
        if not topic or not part.isdigit():
            topic, part = self.source, "-1"
        return dead_letter(topic, int(part), offset, key, value, reason, token)  # whole: the encoder bounds it
