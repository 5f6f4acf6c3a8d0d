"""Replay contract JSONL files onto Kafka as columnar frames, as a live job would send them.

Valid fn/gpu/nic/host records become frames on the raw topic (full ones:
``framing.FrameAccumulator`` carries each key's remainder over to the next
reader batch), job records travel as their own small job messages keyed by
job (on whichever partition that key picks: not ordered with any rank's
frames), invalid lines go to the dead-letter topic. When every file is read, one
end-of-stream marker per key seen (each ``job/rank`` and ``job/node``) follows
the data on its partition, so consumers know the input is complete without
trusting end offsets (tansu reports them wrongly).

Replay blocks on a full producer queue and never drops (see publisher.py);
the first failed delivery aborts it with :class:`ReplayError`, because
markers that claim completeness over missing frames would mislead every
consumer downstream. The result counts what the broker *acknowledged*
(``delivered_records``, from the delivery reports) apart from what was read
and sent (``records``): after a broker loss the difference is what did not
arrive, and ``eroica replay`` exits non-zero. (A broker that acknowledged
records and then lost them, like tansu killed, cannot be seen from here.)

:func:`replay_digests` is *digest mode* (issue 13, edge digests): the input is
split per node, each node's records go through its own digester (the pure
``EdgeDigester`` of ``eroica.streams.edge``, handed in by the caller: producers
do not import the streams layer), and what goes on Kafka is the digesters'
summaries-topic messages (window digests, progress, end, the job record),
keyed by job, on the topic the detector reads; no raw record is published.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from eroica.kafka.admin import BrokerError, create_topics, wait_for_broker
from eroica.kafka.config import KafkaConfig
from eroica.kafka.deadletter import publish_invalid
from eroica.kafka.framing import NODE_LEVEL, FrameAccumulator, FrameSlice
from eroica.kafka.publisher import FramePublisher, PublisherStats
from eroica.models.columns import Columns
from eroica.models.frames import EndOfStream, encode_end_of_stream, encode_frame, encode_job
from eroica.models.reader import DEFAULT_BATCH, read_batches

log = logging.getLogger(__name__)

FLUSH_TIMEOUT_S = 60.0
# No frame spans more event time than this, and a key's held remainder goes out once it
# is this far behind the newest record: no frame reaches the stream processors after
# its windows closed (their lateness must exceed it; default window and lateness: 30 s).
MAX_LAG_NS = 5_000_000_000
# With declared watermarks the replay stands for a tracer publishing through ``KafkaSink``, which
# sends everything it holds at each flush (0.5 s) that declares a mark, and otherwise holds a frame
# at most its linger (1 s). Holding 5 s here added up to 4 s to every window's close that no live
# tracer adds (measured fault-to-verdict delay, README "Declared watermarks").
DECLARED_MAX_LAG_NS = 1_000_000_000


@dataclass
class ReplayResult:
    """What one replay sent (counts of records and of messages) and how long it took."""

    records: int = 0  # valid fn/gpu/nic/host records framed
    by_type: Counter = field(default_factory=Counter)
    jobs: int = 0  # job records sent as job messages
    invalid: int = 0  # lines sent to the dead-letter topic
    frames: int = 0
    end_of_stream: int = 0
    seconds: float = 0.0
    publisher: PublisherStats = field(default_factory=PublisherStats)
    aborted: bool = False  # stopped before the end of the input (a failed delivery)
    mode: str = "raw"  # raw: frames on the raw topic; digest: edge digests on the summaries topic
    digests: int = 0  # digest mode: window digests published (progress and end messages apart)
    messages: int = 0  # messages published (frames, job records, markers, digests...)
    message_bytes: int = 0  # their value + key bytes, before compression
    late_records: int = 0  # digest mode: records a node's digester found late (in no digest; none for ordered input)
    behind_s: float = 0.0  # clock pacing: the most a frame went out after its release time (0: kept real time)
    watermark_violations: int = 0  # declared watermarks: records older than their stream's declaration

    @property
    def delivered_records(self) -> int | None:
        """Records the broker acknowledged (None when the publisher does not count them)."""
        return self.publisher.delivered_records if self._counted else None

    @property
    def undelivered_records(self) -> int | None:
        """Records read and sent but not acknowledged (failed, purged, or never sent after an abort)."""
        return self.records - self.late_records - self.publisher.delivered_records if self._counted else None

    _counted: bool = False

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


class ReplayError(RuntimeError):
    """The replay could not deliver everything; ``result`` holds what it did send."""

    def __init__(self, message: str, result: ReplayResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass
class _KeyState:
    job: str
    rank: int
    node: str
    records: int = 0
    frames: int = 0


class _Pacer:
    """Holds the send rate to ``rate`` records/s by wall clock, one check per frame.

    Sleeping is done in short polls so delivery reports keep flowing.
    """

    def __init__(self, rate: float | None, publisher: FramePublisher) -> None:
        self.rate = rate if rate and rate > 0 else None
        self.publisher = publisher
        self.start = time.monotonic()
        self.sent = 0

    def after(self, records: int) -> None:
        self.sent += records
        if self.rate is None:
            return
        while True:
            ahead = self.start + self.sent / self.rate - time.monotonic()
            if ahead <= 0:
                return
            self.publisher.poll(min(ahead, 0.05))


class _ClockPacer:
    """Releases each frame once the wall clock reaches its newest record's event time plus ``offset_ns``.

    A live collector sends a record only after it happened: replaying a file
    this way puts the stream processors under a job's real event rate (every
    record, in time order, at the moment it occurred), which a records/s rate
    cannot do once the rate varies through the run. ``offset_ns`` maps event
    time to ``time.time_ns()``; ``behind_s`` keeps the worst lateness, so a
    replay that could not keep real time (a broker or reader too slow) says so.
    It also counts a key's remainder that the framing held back until the
    next batch was read (at most ``MAX_LAG_NS``, as a live collector may).
    """

    def __init__(self, offset_ns: int, publisher: FramePublisher,
                 clock: Callable[[], int] = time.time_ns) -> None:
        self.offset_ns = offset_ns
        self.publisher = publisher
        self.clock = clock
        self.behind_s = 0.0

    def before(self, newest_ns: int) -> None:
        """Wait (serving delivery reports) until a frame whose newest record is ``newest_ns`` may go."""
        release = newest_ns + self.offset_ns
        while True:
            ahead = (release - self.clock()) / 1e9
            if ahead <= 0:
                self.behind_s = max(self.behind_s, -ahead)
                return
            self.publisher.poll(min(ahead, 0.05))


def _check_pacing(rate: float | None, clock_offset_ns: int | None) -> None:
    """A replay paces by records/s or by event time: both at once would hold each send to the slower of two
    clocks, which is neither a job's real event rate nor the rate asked for."""
    if clock_offset_ns is not None and rate and rate > 0:
        raise ValueError("pace by rate or by event time (clock_offset_ns), not both")


class _Pacing:
    """One replay's pacing, the one home shared by :func:`replay` and :func:`replay_digests`.

    :meth:`before` holds a send until its newest record is due (event time
    plus ``clock_offset_ns``: :class:`_ClockPacer`) and keeps the worst
    lateness in ``result.behind_s``; :meth:`after` holds the records/s
    ``rate`` (:class:`_Pacer`). Call :func:`_check_pacing` first: only one
    of the two may be set.
    """

    def __init__(self, rate: float | None, clock_offset_ns: int | None, publisher: FramePublisher,
                 result: ReplayResult) -> None:
        self.rate = _Pacer(rate, publisher)
        self.clock = None if clock_offset_ns is None else _ClockPacer(clock_offset_ns, publisher)
        self.result = result

    def before(self, newest_ns: int) -> None:
        if self.clock is not None:
            self.clock.before(newest_ns)
            self.result.behind_s = self.clock.behind_s

    def after(self, records: int) -> None:
        self.rate.after(records)


def _time_ordered(frames: list[FrameSlice], last_start: dict[tuple[str, str], int]) -> list[FrameSlice]:
    """A batch's frames in event-time order across record types, as a live collector sends them.

    The reader hands a batch type by type (all function records, then GPU
    samples...); sent in that order, a paced replay would deliver a rank's GPU
    samples long after its functions of the same seconds, and stream processors
    would close windows without them. Frames are ordered by their oldest
    record, never before an earlier frame of the same key and type (whose
    order the consumers rely on).
    """
    order = []
    for i, f in enumerate(frames):
        k = (f.cols.type, f.key)
        t = max(int(f.cols.arrays["ts_ns"].min()), last_start.get(k, -1))
        last_start[k] = t
        order.append((t, i))
    order.sort()
    return [frames[i] for _, i in order]


def ensure_topics(config: KafkaConfig, timeout_s: float = 10.0, digests: bool = False) -> None:
    """Check the broker answers, then create the raw (``digests``: the digests) and dead-letter topics if missing.

    An unreachable broker is an error (better than blocking until the delivery
    timeout); a broker that refuses CreateTopics (ACLs, managed Kafka) is only
    a warning: the topics may exist already or be auto-created.
    """
    wait_for_broker(config, timeout_s=timeout_s)
    try:
        create_topics(config, {config.digests_topic if digests else config.raw_topic: config.partitions,
                               config.deadletter_topic: config.partitions}, timeout_s=timeout_s)
    except BrokerError as exc:
        log.warning("%s; publishing anyway", exc)


def _create_topics(config: KafkaConfig, timeout_s: float, result: ReplayResult, digests: bool = False) -> None:
    """:func:`ensure_topics` for a replay: an unreachable broker is a ReplayError that carries ``result``."""
    try:
        ensure_topics(config, timeout_s, digests=digests)
    except BrokerError as exc:
        raise ReplayError(str(exc), result) from exc


class _Delivery:
    """One replay's publishing: with or without record counts, aborted on a failed delivery, flushed
    and (when it made the publisher) closed at the end. Shared by raw and digest replays."""

    def __init__(self, config: KafkaConfig, publisher: FramePublisher | None, result: ReplayResult,
                 t0: float) -> None:
        self.own = publisher is None
        self.pub = publisher if publisher is not None else FramePublisher.for_replay(config)
        self.counted = bool(getattr(self.pub, "counts_records", False))
        self.result, self.t0 = result, t0
        result._counted = self.counted

    def check(self) -> None:
        if self.pub.stats.failed:
            raise ReplayError(f"delivery failed, replay aborted: {self.pub.stats.last_error}", self.result)

    def publish(self, topic: str, value: bytes, key: bytes | str, records: int) -> None:
        if self.counted:
            self.pub.publish(topic, value, key=key, records=records)
        else:
            self.pub.publish(topic, value, key=key)

    def drain(self) -> None:
        """Everything sent delivered, or a ReplayError that says how much was not."""
        remaining = self.pub.flush(FLUSH_TIMEOUT_S)
        self.check()
        if remaining:
            raise ReplayError(f"{remaining} messages still undelivered after {FLUSH_TIMEOUT_S:.0f} s", self.result)

    @contextmanager
    def running(self) -> Iterator[None]:
        try:
            yield
        except ReplayError:
            self.result.aborted = True
            raise
        finally:
            if self.own:
                self.pub.close(timeout_s=5.0)
            self.result.publisher = self.pub.stats
            self.result.seconds = time.monotonic() - self.t0


def replay(paths: Iterable[str | Path], config: KafkaConfig, rate: float | None = None, *,
           publisher: FramePublisher | None = None, batch_records: int = DEFAULT_BATCH,
           create: bool = True, connect_timeout_s: float = 10.0,
           clock_offset_ns: int | None = None, declare_watermarks: bool = False,
           frame_lag_s: float | None = None) -> ReplayResult:
    """Publish every record of ``paths`` (JSONL, gzip or ``-``); returns the counts.

    ``rate`` in records/s paces the replay (None or <= 0: as fast as the broker
    takes it). ``clock_offset_ns`` paces it by event time instead: a frame goes
    out once ``time.time_ns()`` reaches its newest record's ``ts_ns`` plus the
    offset (``result.behind_s``: how late the worst one was); not with ``rate``.
    ``declare_watermarks``: the input is in time order per rank (or node) and
    record type, as a live collector's output is (the simulator's is), so each
    frame may declare its newest record's time as its stream's watermark
    (frame meta ``wm``) and the summariser closes windows without the
    lateness allowance; a record older than its stream's declaration is
    counted in ``result.watermark_violations`` (it will be late there).
    ``frame_lag_s``: the most event time a frame spans, and how far behind
    its stream's newest record a held remainder may fall before it goes out
    (default ``DECLARED_MAX_LAG_NS`` when declaring, as a tracer flushing
    every 0.5 s with a 1 s linger, else ``MAX_LAG_NS``). Longer frames mean
    fewer of them (the summariser's cost is per frame, README "Throughput")
    and windows that close that much later; without declarations it must stay
    below the summariser's lateness, or frames arrive after their windows closed.
    A given ``publisher`` is flushed but not closed. ``create``
    first checks the broker answers within ``connect_timeout_s`` and creates
    the raw and dead-letter topics with ``config.partitions``.
    """
    _check_pacing(rate, clock_offset_ns)
    if frame_lag_s is not None and not frame_lag_s > 0:
        raise ValueError(f"frame_lag_s must be > 0 s, got {frame_lag_s}")
    max_lag_ns = (DECLARED_MAX_LAG_NS if declare_watermarks else MAX_LAG_NS) if frame_lag_s is None \
        else int(frame_lag_s * 1e9)
    result = ReplayResult()
    t0 = time.monotonic()
    if create:
        _create_topics(config, connect_timeout_s, result)
    out = _Delivery(config, publisher, result, t0)
    pub, check = out.pub, out.check
    producer_id = uuid.uuid4().hex[:12]
    keys: dict[str, _KeyState] = {}
    pacing = _Pacing(rate, clock_offset_ns, pub, result)
    frames = FrameAccumulator(config.frame_records, max_lag_ns=max_lag_ns)
    last_start: dict[tuple[str, str], int] = {}
    declared: dict[tuple[str, str], int] = {}

    def send(frame: FrameSlice) -> None:
        state = keys.get(frame.key)
        if state is None:
            state = keys[frame.key] = _KeyState(frame.job, frame.rank, frame.node)
        n = len(frame.cols)
        ts = frame.cols.arrays["ts_ns"]
        pacing.before(int(ts.max()))
        meta: dict[str, Any] = {"seq": state.frames, "producer": producer_id}
        if declare_watermarks:
            stream = (frame.key, frame.cols.type)
            before = declared.get(stream)
            if before is not None and int(ts.min()) < before:
                result.watermark_violations += int(np.count_nonzero(ts < before))
            meta["wm"] = declared[stream] = max(int(ts.max()), before if before is not None else int(ts.max()))
        value = encode_frame(frame.cols, meta)
        result.messages += 1
        result.message_bytes += len(value) + len(frame.key)
        out.publish(config.raw_topic, value, frame.key, n)
        state.frames += 1
        state.records += n
        result.frames += 1
        result.records += n
        result.by_type[frame.cols.type] += n
        pacing.after(n)
        check()

    with out.running():
        for path in paths:
            for batch in read_batches(path, batch_records=batch_records):
                for bad in batch.invalid:
                    publish_invalid(pub, config.deadletter_topic, bad)
                    result.invalid += 1
                for job in batch.jobs:
                    value = encode_job(job)
                    pub.publish(config.raw_topic, value, key=job.job)
                    result.jobs += 1
                    result.messages += 1
                    result.message_bytes += len(value) + len(job.job)
                ready = [frame for cols in batch.columns.values() for frame in frames.add(cols)]
                for frame in _time_ordered(ready, last_start):
                    send(frame)
        for frame in _time_ordered(list(frames.drain()), last_start):
            send(frame)
        per_job = Counter(s.job for s in keys.values())
        for key, s in keys.items():
            marker = EndOfStream(s.job, s.rank, s.node, s.records, s.frames,
                                 {"producer": producer_id, "job_keys": per_job[s.job]})
            value = encode_end_of_stream(marker)
            pub.publish(config.raw_topic, value, key=key)
            result.end_of_stream += 1
            result.messages += 1
            result.message_bytes += len(value) + len(key)
        out.drain()
    return result


def split_by_node(cols: Columns) -> dict[str, Columns]:
    """A batch's records per node (every record type names its node): what each node's producer holds."""
    if not len(cols):
        return {}
    codes = cols.arrays["node"]
    uniq = np.unique(codes)
    names = cols.vocab["node"]
    if uniq.size == 1:
        return {names[int(uniq[0])]: cols}
    return {names[int(u)]: cols.take(np.flatnonzero(codes == u)) for u in uniq.tolist()}


def in_order_mark(parts: Iterable[Columns]) -> int | None:
    """The watermark a producer whose streams each arrive in time order may declare after sending ``parts``.

    A stream is what a frame's key names: one rank's records of one type, or
    a node's samples of one type (``NODE_LEVEL``), of one job. Each stream's
    next record is no older than its newest here, so nothing older than the
    oldest of those newest records is still to come from any stream in
    ``parts``; a later mark would be a promise some stream may break. None
    when ``parts`` hold no record.
    """
    mark: int | None = None
    for cols in parts:
        if not len(cols):
            continue
        arr = cols.arrays
        ids = (arr["node"] if cols.type in NODE_LEVEL else arr["rank"]).astype(np.int64)
        key = arr["job"].astype(np.int64) * (int(ids.max()) + 2) + (ids + 1)  # (job, rank or node), dense enough
        uniq, inv = np.unique(key, return_inverse=True)
        newest = np.full(uniq.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(newest, inv, arr["ts_ns"])
        low = int(newest.min())
        mark = low if mark is None else min(mark, low)
    return mark


def replay_digests(paths: Iterable[str | Path], config: KafkaConfig, digester: Callable[[str], Any], *,
                   rate: float | None = None, publisher: FramePublisher | None = None,
                   batch_records: int = DEFAULT_BATCH, create: bool = True,
                   connect_timeout_s: float = 10.0, clock_offset_ns: int | None = None,
                   declare_watermarks: bool = False) -> ReplayResult:
    """Digest mode: every node of ``paths`` digests its own records; the digests go on the summaries topic.

    ``digester(source)`` makes one node's digester (``eroica.streams.edge.EdgeDigester``
    with the stream workers' window settings): ``job(record)``, ``add(*columns)``,
    ``end(job_keys)`` return messages with ``key``, ``value``, ``kind`` and
    ``records``; ``keys(job)`` and ``jobs`` say which keys it vouches for.
    Each node is source ``edge/<node>``; the job record is forwarded once by
    source ``edge/job-record``. Records are read and digested in the order of
    the files, batch by batch, as live nodes would close their windows;
    ``rate`` (records/s) paces the reading. ``clock_offset_ns`` paces it by
    event time instead, as :func:`replay` does: a batch is digested and its
    messages sent once ``time.time_ns()`` reaches its newest record's
    ``ts_ns`` plus the offset (``result.behind_s``: how late the worst one
    was); a batch's oldest records then wait for its newest, so live pacing
    wants a ``batch_records`` of about the input's records per flush of a live
    node. Invalid lines go to the dead-letter topic. A given ``publisher``
    (a ``FramePublisher`` or a subclass) is flushed but not closed.

    ``declare_watermarks``: the input is in time order per stream (as for
    :func:`replay`), so each node declares, with each batch, the mark
    :func:`in_order_mark` gives, as a live agent or tracer declares at its
    flush; digesters made to accept declarations (``declares``) then close a
    window the declared lateness after it is past, not the guessed one.
    Records older than a declaration are late at their node (counted in
    ``result.late_records``).
    """
    _check_pacing(rate, clock_offset_ns)
    result = ReplayResult(mode="digest")
    t0 = time.monotonic()
    if create:
        _create_topics(config, connect_timeout_s, result, digests=True)
    out = _Delivery(config, publisher, result, t0)
    pub, check = out.pub, out.check
    pacing = _Pacing(rate, clock_offset_ns, pub, result)
    nodes: dict[str, Any] = {}
    forwarder = digester("edge/job-record")

    def send(messages: list) -> None:
        for m in messages:
            out.publish(config.digests_topic, m.value, m.key, m.records)
            result.messages += 1
            result.message_bytes += len(m.value) + len(m.key)
            result.digests += m.kind == "digest"
        check()

    with out.running():
        for path in paths:
            for batch in read_batches(path, batch_records=batch_records):
                for bad in batch.invalid:
                    publish_invalid(pub, config.deadletter_topic, bad)
                    result.invalid += 1
                for job in batch.jobs:
                    send(forwarder.job(job))
                    result.jobs += 1
                newest = max((int(c.arrays["ts_ns"].max()) for c in batch.columns.values() if len(c)), default=None)
                if newest is not None:
                    pacing.before(newest)
                per_node: dict[str, list[Columns]] = {}
                for cols in batch.columns.values():
                    result.by_type[cols.type] += len(cols)
                    result.records += len(cols)
                    for node, part in split_by_node(cols).items():
                        per_node.setdefault(node, []).append(part)
                for node, parts in sorted(per_node.items()):
                    d = nodes.get(node)
                    if d is None:
                        d = nodes[node] = digester(f"edge/{node}")
                    send(d.add(*parts, declared_ns=in_order_mark(parts) if declare_watermarks else None))
                pacing.after(sum(len(c) for c in batch.columns.values()))
        job_keys: Counter = Counter()
        for d in nodes.values():
            for job in d.jobs:
                job_keys[job] += len(d.keys(job))
        for _node, d in sorted(nodes.items()):
            ends = d.end(dict(job_keys))
            result.late_records += d.stats.late_records
            result.end_of_stream += sum(m.kind == "end" for m in ends)
            send(ends)
        out.drain()
    result.frames = result.messages
    return result
