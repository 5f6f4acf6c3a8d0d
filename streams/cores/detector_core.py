"""The detector's core, one digests partition: digests in, verdicts out (pure: no Kafka, no faust).

All messages of a job are keyed by the job, so they meet on one partition and
one detector owns the job. Per job it collects the digests of each window
from the raw partitions (*sources*) that hold its ranks, and runs the core
(:func:`~eroica.streams.detection.detector.detect_step`) on the merged
digest once the window is **complete**, its windows strictly **in order**:

- complete: every key the job is expected to have (``job/rank`` for each rank
  of ``world_size`` when the job record is known, every key any source has
  reported, and for the job's first window every node of ``rank_nodes``) is
  covered by a source that closed the window (``closed_through_ns``); or every
  key sent its end-of-stream marker (``job_keys`` of them); or, failing both,
  ``grace_s`` of wall clock passed since the window's first digest. Without a
  job record, the first window always waits for the grace period (the record
  may still be on its way; it changes attribution).
  The grace does not run out while the caller holds it (:meth:`DetectorCore.hold_grace`:
  the broker away, and for the producers' delivery timeout after it is back).
- a digest for a window at or before the last one analysed is dropped and
  counted (``late_windows``): the job's history has moved on.
- a source that sends the same window twice (a summariser re-reading after a
  restart) is kept once, the copy built from more records winning.

What must survive a restart is the per-job :class:`JobState` (history, the
last window done, the job record, sources' progress and end markers); the
caller persists each state this module hands back before acknowledging the
messages it covers. Digests themselves are not persisted: their tokens are
held until their window is analysed, so a restarted detector re-reads them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import msgspec

from eroica.models.digest import WindowDigest, decoder, encoder, merge_digests
from eroica.models.job_end import JobEnd, encode_job_end
from eroica.models.eventtime import NS_PER_HOUR, PAST_SLACK_NS
from eroica.models.limits import MAX_VERDICT_BYTES
from eroica.models.records import JobRecord
from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict, encode_verdict
from eroica.streams.detection.budget import MAX_FN_IDENTITIES, fold_fns
from eroica.streams.detection.detector import detect_step, flush_job
from eroica.streams.detection.history import JobHistory
from eroica.streams.detection.window_summaries import window_summaries
from eroica.runtime import metrics

from .coverage import Coverage
from .digest_messages import DigestMsg, EndMsg, JobMsg, MessageError, decode_message
from .step import PATTERNS, VERDICTS, Send, Step, dead_letter

__all__ = ["DetectorCore", "DetectorStats", "JobState", "SourceProgress", "encode_state", "decode_state",
           "encode_patterns", "encode_patterns_messages", "VERDICTS", "PATTERNS", "JOB_END", "Step"]

log = logging.getLogger(__name__)

# -- job end (issue 36 item 4) ---------------------------------------------------------------------------
# The role of the job-end marker (models/job_end.py): the glue sends it to the *verdict* topic, keyed by
# the job, after the job's last verdicts (same partition, so readers see it after every verdict of the
# job). A role of its own, not VERDICTS, so that code reading the VERDICTS role as contract verdicts
# only (tests, benches) never meets it.
JOB_END = "job_end"
# -----------------------------------------------------------------------------------------------------

STATE_VERSION = 1


# A job's persisted state must fit one message of the state topic or table changelog: the producers'
# max.request.size and Eroica's topics' max.message.bytes (16 MiB: streams/faust/workers.py, kafka/admin.py),
# with room for the record batch's framing.
STATE_BYTES = MAX_VERDICT_BYTES * 9 // 10
# Below this many function rows held a state is far under STATE_BYTES (~80-170 bytes a row): not encoded to check.
STATE_CHECK_ROWS = 50_000


class SourceProgress(msgspec.Struct):
    keys: list[str] = []
    closed_through_ns: int = -1


class JobState(msgspec.Struct, kw_only=True):
    """What the detector remembers of a job between windows (persisted; msgpack)."""

    job: str
    partition: int = -1
    history: JobHistory = msgspec.field(default_factory=JobHistory)
    done_through_ns: int = -1  # start of the last window analysed (or skipped as empty)
    meta: JobRecord | None = None
    sources: dict[str, SourceProgress] = {}
    ended: list[str] = []
    job_keys: int | None = None
    late_windows: int = 0
    ended_through_ns: int = -1  # done_through_ns when every key had ended: windows analysed at the job's end
    v: int = STATE_VERSION


_state_encoder = encoder()  # the history's digests' columns are arrays (models.digest)
_state_decoder: msgspec.msgpack.Decoder[JobState] = decoder(JobState)
_patterns_encoder = msgspec.msgpack.Encoder()


def encode_state(s: JobState) -> bytes:
    return _state_encoder.encode(s)


def decode_state(data: bytes) -> JobState:
    s = _state_decoder.decode(data)
    if s.v != STATE_VERSION:
        raise msgspec.DecodeError(f"unknown detector state version {s.v}")
    return s


def encode_patterns(rows: list[WindowSummary]) -> bytes:
    """The patterns-topic message: a msgpack list of WindowSummary maps."""
    return _patterns_encoder.encode(rows)


# A job window's summaries grow with the job (~6.3 KB a rank: 16 MiB at ~2,500 ranks), so
# they go out in messages of at most this size: Kafka's default max.message.bytes
# (1,048,588), less room for the record's key and headers. Each message is a list of
# whole rows the sink inserts on its own; rows are keyed, so the split changes nothing.
PATTERNS_MESSAGE_BYTES = 1_000_000


def encode_patterns_messages(rows: list[WindowSummary], max_bytes: int = PATTERNS_MESSAGE_BYTES) -> list[bytes]:
    """``rows`` as patterns-topic messages of at most ``max_bytes`` each (rows in order, none split)."""
    data = encode_patterns(rows)
    if len(data) <= max_bytes or len(rows) <= 1:
        return [data]  # a single row above the bound is left to the producer's own bound
    n = -(-len(data) // max_bytes) + 1  # rows differ in size: one chunk more than the mean needs
    size = -(-len(rows) // n)
    return [m for i in range(0, len(rows), size) for m in encode_patterns_messages(rows[i:i + size], max_bytes)]


@dataclass
class DetectorStats:
    digests: int = 0
    duplicate_digests: int = 0
    windows: int = 0
    empty_windows: int = 0
    forced_windows: int = 0  # analysed on the grace timeout, not complete
    failed_windows: int = 0  # the core raised on them (logged)
    late_windows: int = 0
    refused_windows: int = 0  # before the job's start (its job record) or analysed at its end: dead-lettered
    verdicts: int = 0
    folded_functions: int = 0  # functions folded beyond a job's budget, summed over windows
    pattern_rows: int = 0
    corrupt: int = 0
    job_records: int = 0


@dataclass
class _Pending:
    start_ns: int
    end_ns: int
    first_seen: float
    digests: dict[str, tuple[int, WindowDigest]] = field(default_factory=dict)
    tokens: list[Any] = field(default_factory=list)
    closed_at_ns: int | None = None  # the latest close of the window at a summariser (wall clock): verdict delay


@dataclass
class _Job:
    state: JobState
    pending: dict[int, _Pending] = field(default_factory=dict)
    coverage: Coverage = field(default_factory=Coverage)  # completeness, kept per message (not persisted)
    coverage_first: bool = True  # whether it was built for the job's first window (rank_nodes expected)


def _before_start(meta: JobRecord | None, msg: DigestMsg) -> str | None:
    """Why a window lies before its job's start (bound of :mod:`eroica.models.eventtime`), or None.

    The summariser drops such records when its partition holds the job record;
    the job record goes to one partition only, so the detector, which every
    partition's windows reach, applies the same bound to whole windows.
    """
    if meta is None or meta.ts_ns is None or msg.end_ns > meta.ts_ns - PAST_SLACK_NS:
        return None
    return (f"window starting {msg.start_ns} ends more than {PAST_SLACK_NS // NS_PER_HOUR} h before its "
            f"job's start (the job record's ts_ns {meta.ts_ns}): records of a clock running behind")


class DetectorCore:
    """Per-job window collection and in-order detection for the partitions one worker owns."""

    def __init__(self, grace_s: float, wall_ns: Callable[[], int] = time.time_ns) -> None:
        self.grace_s = float(grace_s)
        self.wall_ns = wall_ns
        self.jobs: dict[str, _Job] = {}
        self.stats = DetectorStats()
        self.grace_held_until = float("-inf")

    def hold_grace(self, until: float, replace: bool = False) -> None:
        """No window is analysed incomplete before ``until`` (monotonic seconds; inf: until told again).

        The caller holds the grace while the broker is away and for the
        producers' delivery timeout after it answers again: the digests an
        incomplete window waits for may be held up by the outage, not lost.
        """
        self.grace_held_until = until if replace else max(self.grace_held_until, until)

    # -- state ---------------------------------------------------------------

    def restore(self, state: JobState) -> None:
        """A persisted state (at start-up or when a partition is assigned); pending windows are not kept."""
        self.jobs[state.job] = _Job(state)

    def drop_partitions(self, partitions: set[int]) -> None:
        """Forget the jobs of revoked partitions (their next owner restores them)."""
        for job in [j for j, js in self.jobs.items() if js.state.partition in partitions]:
            del self.jobs[job]

    def pending_windows(self) -> int:
        return sum(len(js.pending) for js in self.jobs.values())

    # -- input -----------------------------------------------------------------

    def on_message(self, value: bytes | None, token: Any, partition: int, now: float, offset: int = -1,
                   source: str = "digests", key: bytes | None = None) -> Step:
        """One digests-topic message (``source``: the topic's name); ``now`` is monotonic seconds (grace timing)."""
        try:
            if value is None:
                raise MessageError("empty message (no value)")
            msg = decode_message(value)
        except MessageError as exc:
            self.stats.corrupt += 1
            return dead_letter(source, partition, offset, key, value, str(exc), token)
        js = self._job(msg.job, partition)
        st = js.state
        if isinstance(msg, DigestMsg):
            early = _before_start(st.meta, msg)
            if early is None and msg.start_ns <= st.ended_through_ns:
                early = (f"window starting {msg.start_ns} of job {msg.job!r} arrived after its end-of-stream, when "
                         f"windows through {st.done_through_ns} were already analysed: send a job's records before "
                         f"its end markers (one replay)")
            if early is None and st.ended and msg.start_ns > st.done_through_ns and self._ended(st):
                # every key had ended and a new window comes: the job is back (a second replay, a restarted
                # job); its keys are live again until they end again, so its windows wait for every source
                st.ended, st.job_keys = [], None
                js.coverage.invalidate()
            if early is not None:  # before its job's start (a wrong clock), or after its end: a dead letter, a reason
                self.stats.refused_windows += 1
                self._progress(js, msg.source, msg.keys, msg.closed_through_ns)  # its progress still holds
                out = dead_letter(source, partition, offset, key, value, early, token)
                out.persist.append(st)
                return out.extend(self._run(js, now))
            return self._on_digest(js, msg, token, now)
        out = Step(persist=[st], acks=[token])
        if isinstance(msg, JobMsg):
            self.stats.job_records += 1
            st.meta = msg.record
            js.coverage.invalidate()
        else:
            self._progress(js, msg.source, msg.keys, msg.closed_through_ns)
            if isinstance(msg, EndMsg):
                st.ended = sorted(set(st.ended) | set(msg.keys))
                js.coverage.end(msg.keys)
                if msg.job_keys:
                    st.job_keys = msg.job_keys
        return out.extend(self._run(js, now))

    def due(self, now: float) -> Step:
        """Windows whose grace period has passed (call a few times a second)."""
        out = Step()
        for js in list(self.jobs.values()):
            if js.pending:
                out.extend(self._run(js, now))
        return out

    # -- internals -------------------------------------------------------------

    def _job(self, job: str, partition: int) -> _Job:
        js = self.jobs.get(job)
        if js is None:
            js = self.jobs[job] = _Job(JobState(job=job, partition=partition, history=JobHistory(job=job)))
        js.state.partition = partition
        return js

    @staticmethod
    def _progress(js: _Job, source: str, keys: list[str], closed_through_ns: int) -> None:
        st = js.state
        sp = st.sources.get(source)
        if sp is None:
            st.sources[source] = SourceProgress(list(keys), closed_through_ns)
            js.coverage.add(keys, closed_through_ns)  # a new source: its keys are expected from now on
            return
        grown = len(keys) > len(sp.keys) or bool(set(keys) - set(sp.keys))
        if grown:
            sp.keys = sorted(set(sp.keys) | set(keys))
        sp.closed_through_ns = max(sp.closed_through_ns, closed_through_ns)
        if grown:  # new keys join the expected set (and advance with the rest)
            js.coverage.add(sp.keys, sp.closed_through_ns)
        else:
            js.coverage.advance(sp.keys, sp.closed_through_ns)

    def _on_digest(self, js: _Job, msg: DigestMsg, token: Any, now: float) -> Step:
        st = js.state
        self.stats.digests += 1
        self._progress(js, msg.source, msg.keys, msg.closed_through_ns)
        if msg.start_ns <= st.done_through_ns:
            self.stats.late_windows += 1
            st.late_windows += 1
            if st.late_windows == 1 or st.late_windows % 100 == 0:
                log.warning("job %s: digest of window %d from %s arrived after window %d was analysed: "
                            "dropped (%d so far)", msg.job, msg.start_ns, msg.source, st.done_through_ns,
                            st.late_windows)
            return Step(acks=[token])
        p = js.pending.get(msg.start_ns)
        if p is None:
            p = js.pending[msg.start_ns] = _Pending(msg.start_ns, msg.end_ns, now)
        old = p.digests.get(msg.source)
        if old is not None:
            self.stats.duplicate_digests += 1
        if old is None or msg.records > old[0]:
            p.digests[msg.source] = (msg.records, msg.digest)
        if msg.closed_at_ns is not None and (p.closed_at_ns is None or msg.closed_at_ns > p.closed_at_ns):
            p.closed_at_ns = msg.closed_at_ns  # verdict delay (issue 36 item 3): from the last close
        p.tokens.append(token)
        return self._run(js, now)

    def _expected(self, st: JobState) -> set[str] | None:
        keys = {k for sp in st.sources.values() for k in sp.keys}
        meta = st.meta
        if meta is None:
            return None if st.done_through_ns < 0 else keys
        keys.update(f"{st.job}/{r}" for r in range(meta.world_size))
        if st.done_through_ns < 0 and meta.rank_nodes:
            keys.update(f"{st.job}/{n}" for n in set(meta.rank_nodes))
        return keys

    def _complete(self, js: _Job, start_ns: int) -> bool:
        """Every expected key covered by a source that closed the window, or ended (see :mod:`.coverage`)."""
        st = js.state
        if st.job_keys and len(st.ended) >= st.job_keys:
            return True
        first = st.done_through_ns < 0
        cov = js.coverage
        if cov.stale or js.coverage_first != first:
            cov.rebuild(self._expected(st), ((sp.keys, sp.closed_through_ns) for sp in st.sources.values()),
                        st.ended)
            js.coverage_first = first
        return cov.covered_through(start_ns)

    def _run(self, js: _Job, now: float) -> Step:
        out = Step()
        st = js.state
        while js.pending:
            start = min(js.pending)
            p = js.pending[start]
            complete = self._complete(js, start)
            if not complete and (now - p.first_seen < self.grace_s or now < self.grace_held_until):
                break
            if not complete:
                self.stats.forced_windows += 1
                log.info("job %s window %d: analysed after the %.0f s grace with %d source(s)",
                         st.job, start, self.grace_s, len(p.digests))
            del js.pending[start]
            try:
                out.sends.extend(self._detect(st, p))
            except Exception:  # a window the core cannot analyse is skipped, not retried forever
                self.stats.failed_windows += 1
                log.exception("job %s window %d: detection failed; window skipped", st.job, start)
            st.done_through_ns = start
            out.acks.extend(p.tokens)
            if all(s is not st for s in out.persist):
                out.persist.append(st)
        if not js.pending and st.history.pending and self._ended(st):
            # every key has ended: the job's last steps are complete, analyse what waits for more
            out.sends.extend(self._flush(st))
            if all(s is not st for s in out.persist):
                out.persist.append(st)
        if st.done_through_ns > st.ended_through_ns and self._ended(st):
            st.ended_through_ns = st.done_through_ns
            if not js.pending:  # job end (issue 36 item 4): once per ending, after the job's last verdicts above
                out.sends.append(Send(JOB_END, st.job.encode(), encode_job_end(JobEnd(
                    job=st.job, last_window_start_ns=st.done_through_ns, detected_at_ns=self.wall_ns()))))
                if all(s is not st for s in out.persist):
                    out.persist.append(st)
        return out

    def _ended(self, st: JobState) -> bool:
        if st.job_keys and len(st.ended) >= st.job_keys:
            return True
        expected = self._expected(st)
        return bool(expected) and expected <= set(st.ended)  # type: ignore[operator]

    def _flush(self, st: JobState) -> list[Send]:
        verdicts, st.history = flush_job(st.meta, st.history, detected_at_ns=self.wall_ns())
        return self._verdict_sends(st, verdicts)

    def _verdict_sends(self, st: JobState, verdicts: list[Verdict]) -> list[Send]:
        """The verdicts as messages keyed by the job, counted."""
        self.stats.verdicts += len(verdicts)
        metrics.records_out("detector", VERDICTS, len(verdicts))
        key = st.job.encode()
        return [Send(VERDICTS, key, encode_verdict(v)) for v in verdicts]

    def _fit_state(self, st: JobState) -> None:
        """Fold the digests a job's state holds until its encoding fits a state message (:data:`STATE_BYTES`).

        The state (waiting time windows, the carried incomplete steps) is
        persisted after every window; a job with thousands of functions on
        hundreds of ranks would make it larger than the broker takes, and the
        detector would fail on every restart. Checked only past
        :data:`STATE_CHECK_ROWS` held rows (encoding costs), folded in
        proportion to the excess: only such a job is touched.
        """
        h = st.history
        held = [*h.pending, *([h.carry] if h.carry is not None else [])]
        rows = sum(len(d.fns) for d in held)
        if rows < STATE_CHECK_ROWS:
            return
        size = len(encode_state(st))
        for _ in range(4):
            if size <= STATE_BYTES:
                return
            per = max(1, int(rows * STATE_BYTES / size * 0.8) // len(held))
            before = sum(d.folded for d in held)
            h.pending = [fold_fns(d, max_rows=per) for d in h.pending]
            if h.carry is not None:
                h.carry = fold_fns(h.carry, max_rows=per)
            held = [*h.pending, *([h.carry] if h.carry is not None else [])]
            self.stats.folded_functions += sum(d.folded for d in held) - before
            rows = sum(len(d.fns) for d in held)
            size = len(encode_state(st))

    def _detect(self, st: JobState, p: _Pending) -> list[Send]:
        # a digest built from records, or from continuations alone (every rank of a source
        # inside one span longer than the window: it reports 0 records received, like a
        # source's empty progress digest, but carries rows batch analyses too)
        parts = [d for _src, (n, d) in sorted(p.digests.items()) if n > 0 or len(d.fns)]
        if not parts:
            self.stats.empty_windows += 1
            return []
        merged = merge_digests(parts)
        merged = fold_fns(merged)  # partitions each within the budget may still exceed it together
        if merged.folded:
            self.stats.folded_functions += merged.folded
            log.warning("job %r window %d: about %d functions beyond the budget of %d folded into '(other ...)' "
                        "rows (their time kept per rank)", st.job, merged.start_ns, merged.folded, MAX_FN_IDENTITIES)
        verdicts, st.history = detect_step(merged, st.meta, st.history, detected_at_ns=self.wall_ns())
        self._fit_state(st)
        rows = window_summaries(merged, st.meta)
        self.stats.windows += 1
        metrics.window_closed("detector")
        # issue 36 item 3: detection_delay is the data's age (event time: a replay of old files shows it);
        # verdict_delay what the pipeline took, from the window's last close at a summariser (wall clock),
        # the window end only for digests without it (edge digests, older summarisers)
        now_ns = self.wall_ns()
        metrics.detection_delay("detector", (now_ns - merged.end_ns) / 1e9)
        metrics.verdict_delay("detector", (now_ns - (merged.end_ns if p.closed_at_ns is None
                                                     else p.closed_at_ns)) / 1e9)
        self.stats.pattern_rows += len(rows)
        sends = self._verdict_sends(st, verdicts)
        if rows:
            sends.extend(Send(PATTERNS, st.job.encode(), m) for m in encode_patterns_messages(rows))
        return sends
