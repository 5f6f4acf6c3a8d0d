"""The sink worker: Kafka (verdicts, window summaries) -> ClickHouse, at least once, never lost.

The loop (after Vector's ClickHouse sink, with Kafka's commit discipline):

1. consume ``eroica.verdicts`` and ``eroica.patterns`` in the worker's own
   consumer group, auto-commit off;
2. decode and validate each message (``messages.py``, pure); a message that
   cannot become rows goes to ``eroica.deadletter`` with its reason and is
   skipped, never retried and never allowed to block the partition;
3. insert the batch when it holds ``batch_size`` rows or its oldest message has
   waited ``flush_interval_s``;
4. **commit, synchronously, exactly the offsets the batch covers, and only
   after the INSERT (and the batch's dead letters) succeeded.**

While ClickHouse is unreachable the batch is retried with backoff, the
assigned partitions are paused (the consumer keeps polling, so it stays in the
group, but nothing more is read into memory), and nothing is committed. A
crash at any point therefore loses nothing: whatever was not committed is
read again. It duplicates nothing visible either: both tables are
ReplacingMergeTree keyed by the verdict id / summary cell, reads use FINAL,
and a re-read summary carries the same version (its Kafka timestamp).

A batch that ClickHouse *refuses* (not a transient error) is inserted message
by message, and the messages it still refuses are dead-lettered: one bad row
cannot stall the pipeline.

SIGTERM (``stop()``): the loop stops consuming, inserts and commits the
last batch (within ``shutdown_timeout_s``; past it the batch stays
uncommitted and is read again at the next start), leaves the group, exits.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from eroica.models.limits import failure_reason
from eroica.producers.kafka.publisher import _RateLimitedLogger
from eroica.stack import metrics
from eroica.sinks.pausing import PartitionPause

from .client import ClickHouseError, ClickHouseUnavailableError
from .config import RetryPolicy
from .endpoint import TOKEN_FILE, ensure_token_file, remove_endpoint_file, write_endpoint_file
from .messages import DecodedMessage, PendingBatch, RejectedMessage, deadletter_value, decode_summaries, decode_verdicts
from .schema import SUMMARY_NAMES, VERDICT_NAMES
from .shaping import batched
from .sink import VerdictSink
from .worker_config import SinkWorkerConfig

__all__ = ["SinkWorker", "SinkStats"]

log = logging.getLogger("eroica.sink")
COMPONENT = "sink"  # the `component` label of this worker's Prometheus metrics (eroica.stack.metrics)

_IDLE_SLICE_S = 0.2
_DEADLETTER_FLUSH_S = 10.0
_TIMESTAMP_NOT_AVAILABLE = 0


class _TransientError(Exception):
    """Storing the batch failed in a way that waiting can fix (ClickHouse or Kafka away)."""

    def __init__(self, message: str, *, clickhouse: bool = True) -> None:
        super().__init__(message)
        self.clickhouse = clickhouse


@dataclass
class SinkStats:
    """Counters served by ``/health`` and returned by :meth:`SinkWorker.run`."""

    pid: int = field(default_factory=os.getpid)
    started_at_ns: int = field(default_factory=time.time_ns)
    consumed: int = 0  # messages read
    verdicts: int = 0  # verdict rows inserted (re-inserts after a retry count again)
    summaries: int = 0  # summary rows inserted
    deadletters: int = 0  # messages rejected and delivered to the dead-letter topic
    batches: int = 0  # successful batch inserts
    commits: int = 0  # successful offset commits
    insert_failures: int = 0  # failed batch attempts (each one retried)
    last_insert_ms: float | None = None  # duration of the last successful batch insert
    max_insert_ms: float | None = None
    last_commit_ns: int | None = None
    last_insert_ns: int | None = None  # wall time of the last successful batch insert
    insert_started_ns: int | None = None  # an insert in progress since (None: none running)
    pending: int = 0  # messages read and not yet stored
    pending_since_ns: int | None = None  # wall time the oldest of them was read
    clickhouse: str = "unknown"  # "up" after a successful statement, "down" while failing
    last_error: str | None = None
    assigned: list[str] = field(default_factory=list)
    recent_insert_ms: deque[float] = field(default_factory=lambda: deque(maxlen=256))

    def record_insert(self, ms: float) -> None:
        self.last_insert_ns = time.time_ns()
        self.last_insert_ms = ms
        self.max_insert_ms = max(ms, self.max_insert_ms or 0.0)
        self.recent_insert_ms.append(ms)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready counters, with p50/p99 of the last 256 batch inserts instead of the raw list."""
        doc = asdict(self)
        recent = sorted(doc.pop("recent_insert_ms"))
        doc["insert_ms_p50"] = recent[len(recent) // 2] if recent else None
        doc["insert_ms_p99"] = recent[min(len(recent) - 1, int(len(recent) * 0.99))] if recent else None
        return doc

    def stuck(self, after_s: float, now_ns: int | None = None) -> list[str]:
        """What keeps storing from progressing for ``after_s`` or more (empty: nothing)."""
        now = time.time_ns() if now_ns is None else now_ns
        limit = int(after_s * 1e9)
        out = []
        if self.insert_started_ns is not None and now - self.insert_started_ns >= limit:
            out.append(f"an insert into ClickHouse has been running for {(now - self.insert_started_ns) / 1e9:.0f} s "
                       f"(ClickHouse frozen or overloaded?)")
        if self.pending and self.pending_since_ns is not None and now - self.pending_since_ns >= limit:
            last = ("never" if self.last_insert_ns is None
                    else f"{(now - self.last_insert_ns) / 1e9:.0f} s ago")
            out.append(f"{self.pending} messages waiting for {(now - self.pending_since_ns) / 1e9:.0f} s; "
                       f"last successful insert {last}" + (f"; last error: {self.last_error}"
                                                            if self.last_error else ""))
        return out


class SinkWorker:
    """One consumer, one ClickHouse client, one loop; ``run()`` blocks until ``stop()``.

    ``sink``/``consumer``/``producer`` may be injected (tests); otherwise they
    are created from ``config`` when ``run()`` starts.
    """

    def __init__(self, config: SinkWorkerConfig, *, sink: VerdictSink | None = None,
                 consumer: Consumer | None = None, producer: Producer | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        # The worker owns retrying (forever, with the policy's backoff), so each
        # ClickHouse operation is tried once: a stop request is never stuck
        # behind a minute of the client's own retries.
        self._ch_config = config.clickhouse.replace(retry=RetryPolicy(attempts=1, deadline_s=0.0))
        self._backoff = config.clickhouse.retry
        self.sink = sink
        self._own_sink = sink is None
        self._consumer = consumer
        self._producer = producer
        self._clock = clock
        self.stats = SinkStats()
        self._batch = PendingBatch()
        self._stop = threading.Event()
        self._stop_at: float | None = None
        self._flushing = False
        self._paused = PartitionPause()
        self._http: Any = None
        self._endpoint_dir: str | None = None
        self.ready = threading.Event()  # set once consuming (tests, orchestration)

    # -- lifecycle ------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler or another thread)."""
        if not self._stop.is_set():
            self._stop_at = self._clock()
            self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def http_url(self) -> str | None:
        return self._http.url if self._http is not None else None

    def run(self) -> SinkStats:
        """Consume until stopped; returns the counters. Raises on a fatal setup error."""
        try:
            metrics.serve(COMPONENT)  # once per process; EROICA_METRICS_PORT (0 = any free port, off)
            self._open_sink()
            self._start_http()
            self._ensure_schema()
            if self._stop.is_set():
                return self.stats
            self._ensure_topics()
            self._open_kafka()
            assert self._consumer is not None
            self._consumer.subscribe(list(self.config.topics), on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_lost)
            self.ready.set()
            log.info("sink consuming %s (group %s) into %s", ", ".join(self.config.topics),
                     self.config.group_id, self._ch_config.target)
            while not self._stop.is_set():
                self._poll(self._poll_timeout())
                if self._batch.due(self._clock(), self._ch_config.batch_size, self.config.flush_interval_s):
                    self._flush()
            self._flush()  # the last batch, within the shutdown deadline
            return self.stats
        finally:
            self._close()

    def _open_sink(self) -> None:
        if self.sink is None:
            self.sink = VerdictSink(self._ch_config)

    def _start_http(self) -> None:
        if self.config.http_port is None:
            return
        from .http_api import QueryServer

        assert self.sink is not None
        on_chdb_dir = self._ch_config.backend == "chdb" and self._ch_config.chdb_path != ":memory:"
        token_file = self.config.token_file
        if token_file is None:
            if on_chdb_dir:
                token_file = os.path.join(self._ch_config.chdb_path, TOKEN_FILE)
            else:
                import tempfile

                token_file = os.path.join(tempfile.mkdtemp(prefix="eroica-sink-"), TOKEN_FILE)
        token = ensure_token_file(token_file)
        self._http = QueryServer(self.sink, self.config.http_port, health=self.health, token=token).start()
        if on_chdb_dir:
            self._endpoint_dir = self._ch_config.chdb_path
            write_endpoint_file(self._endpoint_dir, self._http.url, self._ch_config.target, token_file)
        log.info("sink query endpoint on %s (token in %s)", self._http.url, token_file)

    def _ensure_schema(self) -> None:
        """Create the tables, waiting (with backoff) for a server that is not up yet."""
        assert self.sink is not None
        failures = 0
        while not self._stop.is_set():
            try:
                self.sink.ensure_schema()
                self.stats.clickhouse = "up"
                return
            except ClickHouseUnavailableError as exc:
                failures += 1
                self._note_down(exc, failures)
                self._stop.wait(self._backoff.delay(failures))

    def _ensure_topics(self) -> None:
        """Create the input and dead-letter topics if missing (a subscription to a missing topic waits forever)."""
        if not self.config.create_topics:
            return
        from eroica.stack.tansu import BrokerError, create_topics

        k = self.config.kafka
        try:
            create_topics(k.bootstrap, {t: k.partitions for t in (*self.config.topics, k.deadletter_topic)},
                          timeout_s=10.0)
        except BrokerError as exc:
            log.warning("%s; consuming anyway", exc)

    def _open_kafka(self) -> None:
        k = self.config.kafka
        logger = _RateLimitedLogger(logging.getLogger("eroica.kafka.librdkafka"))
        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": k.bootstrap,
                "group.id": self.config.group_id,
                "client.id": "eroica-sink",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": self.config.session_timeout_ms,
                "heartbeat.interval.ms": max(500, self.config.session_timeout_ms // 5),
                "fetch.wait.max.ms": 100,  # tansu: faust's 1.5 s default added seconds of lag
                "logger": logger,
            })
        if self._producer is None:
            self._producer = Producer({
                "bootstrap.servers": k.bootstrap,
                "client.id": "eroica-sink-deadletter",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 5,
                "message.timeout.ms": 30000,
                "logger": logger,
            })

    def _close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()  # leaves the group now: a restart need not wait a session timeout
            except (KafkaException, RuntimeError) as exc:
                log.warning("closing the consumer: %s", exc)
            self._consumer = None
        if self._producer is not None:
            self._producer.flush(2.0)
            self._producer = None
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._endpoint_dir is not None:
            remove_endpoint_file(self._endpoint_dir)
            self._endpoint_dir = None
        if self.sink is not None and self._own_sink:
            self.sink.close()
            self.sink = None

    def health(self) -> dict[str, Any]:
        """``/health``'s body: the counters, plus ``state`` ``up`` or ``degraded`` with what is stuck."""
        doc = self.stats.as_dict()
        stuck = self.stats.stuck(self.config.stuck_after_s)
        doc["state"] = "degraded" if stuck else "up"
        doc["stuck"] = stuck
        return doc

    # -- consuming ------------------------------------------------------------------
    def _poll_timeout(self) -> float:
        started = self._batch.started_at
        if started is None:
            return _IDLE_SLICE_S
        left = started + self.config.flush_interval_s - self._clock()
        return max(0.0, min(_IDLE_SLICE_S, left))

    def _poll(self, timeout_s: float) -> None:
        assert self._consumer is not None
        for msg in self._consumer.consume(self.config.max_poll_messages, timeout_s):
            err = msg.error()
            if err is not None:
                self._on_kafka_error(err)
                continue
            self._handle(msg)

    def _on_kafka_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal():
            raise KafkaException(err)
        self.stats.last_error = f"kafka: {err.str()}"
        log.warning("Kafka consumer: %s", err.str())

    def _handle(self, msg: Message) -> None:
        """Decode one message into the pending batch (rows, or a dead letter)."""
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        key, value = msg.key(), msg.value()
        self.stats.consumed += 1
        metrics.records_in(COMPONENT, topic)
        out = DecodedMessage(topic, partition, offset, key, raw=value)
        try:
            if topic == self.config.patterns_topic:
                out.summary_rows = decode_summaries(value, _version_ns(msg))
            else:
                decoded = decode_verdicts(value)
                out.verdict_rows = [row for _, row in decoded]
                for v, _row in decoded:  # the detector's delay, as the verdicts record it
                    metrics.detection_delay(COMPONENT, (v.detected_at_ns - v.window_end_ns) / 1e9)
        except Exception as exc:  # RejectedMessage, or anything else: dead-lettered, committed past, never a crash loop
            reason = str(exc) if isinstance(exc, RejectedMessage) else f"processing failed: {failure_reason(exc)}"
            out.verdict_rows, out.summary_rows = [], []
            out.deadletter = deadletter_value(topic, partition, offset, key, value, reason)
            metrics.invalid(COMPONENT, reason)
            log.warning("dead letter %s[%d]@%d: %s", topic, partition, offset, reason)
        if not self._batch.messages:
            self.stats.pending_since_ns = time.time_ns()
        self._batch.add(out, self._clock())
        self.stats.pending = len(self._batch.messages)

    # -- storing ----------------------------------------------------------------------
    def _deadline(self) -> float | None:
        return None if self._stop_at is None else self._stop_at + self.config.shutdown_timeout_s

    def _flush(self) -> bool:
        """Store the pending batch, then commit its offsets; True when committed.

        Retries transient failures with backoff until it succeeds, the batch is
        revoked by a rebalance, or (when stopping) the shutdown deadline passes.
        """
        batch = self._batch
        if not batch.messages:
            return True
        failures = 0
        self._flushing = True
        try:
            while batch is self._batch and batch.messages:
                try:
                    self._store(batch)
                    break
                except _TransientError as exc:
                    failures += 1
                    self.stats.insert_failures += 1
                    metrics.sink_insert_failure(COMPONENT)
                    self._note_down(exc, failures)
                    self._pause()
                    delay = self._backoff.delay(failures)
                    deadline = self._deadline()
                    if deadline is not None and self._clock() + delay > deadline:
                        log.warning("stopping with %d messages not stored; they stay uncommitted and are "
                                    "read again at the next start", len(batch))
                        return False
                    self._idle(delay)
            if batch is not self._batch or not batch.messages:
                return False  # revoked meanwhile: the next owner reads it again
            self._commit(batch)
            self._batch = PendingBatch()
            return True
        finally:
            self._flushing = False
            self.stats.pending = len(self._batch.messages)
            if not self.stats.pending:
                self.stats.pending_since_ns = None
            self._resume()

    def _store(self, batch: PendingBatch) -> None:
        """Insert the batch's rows and deliver its dead letters; _TransientError if that must wait."""
        assert self.sink is not None
        t0 = time.perf_counter()
        self.stats.insert_started_ns = time.time_ns()
        try:
            try:
                self._insert(batch.verdict_rows(), batch.summary_rows())
            except ClickHouseUnavailableError:
                raise
            except ClickHouseError as exc:
                log.warning("ClickHouse refused a batch (%s); inserting message by message", exc)
                self._insert_one_by_one(batch)
        except ClickHouseUnavailableError as exc:
            raise _TransientError(str(exc)) from exc
        finally:
            self.stats.insert_started_ns = None
        took_ms = (time.perf_counter() - t0) * 1000.0
        self._send_deadletters(batch)
        s = self.stats
        s.clickhouse = "up"
        s.batches += 1
        s.verdicts += sum(len(m.verdict_rows) for m in batch.messages)
        s.summaries += sum(len(m.summary_rows) for m in batch.messages)
        s.record_insert(took_ms)
        metrics.sink_insert(COMPONENT, took_ms / 1000.0)
        cfg = self._ch_config
        metrics.records_out(COMPONENT, cfg.verdicts_table, sum(len(m.verdict_rows) for m in batch.messages))
        metrics.records_out(COMPONENT, cfg.summaries_table, sum(len(m.summary_rows) for m in batch.messages))

    def _insert(self, verdict_rows: list[tuple], summary_rows: list[tuple]) -> None:
        assert self.sink is not None
        client, cfg = self.sink.client, self._ch_config
        for chunk in batched(verdict_rows, cfg.batch_size):
            client.insert(cfg.verdicts, VERDICT_NAMES, chunk)
        for chunk in batched(summary_rows, cfg.batch_size):
            client.insert(cfg.summaries, SUMMARY_NAMES, chunk)

    def _insert_one_by_one(self, batch: PendingBatch) -> None:
        """Find the messages ClickHouse refuses; dead-letter them, keep the rest."""
        for m in batch.messages:
            if not m.rows:
                continue
            try:
                self._insert(m.verdict_rows, m.summary_rows)
            except ClickHouseUnavailableError:
                raise
            except ClickHouseError as exc:
                reason = f"ClickHouse refused the rows: {exc}"
                m.deadletter = deadletter_value(m.topic, m.partition, m.offset, m.key, m.raw, reason)
                m.verdict_rows, m.summary_rows = [], []
                log.warning("dead letter %s[%d]@%d: %s", m.topic, m.partition, m.offset, reason)

    def _send_deadletters(self, batch: PendingBatch) -> None:
        """Deliver every rejected message of the batch before its offset may be committed."""
        pending = [m for m in batch.deadletters() if m.deadletter_state != "delivered"]
        if not pending:
            return
        assert self._producer is not None
        topic = self.config.kafka.deadletter_topic

        def report(m: DecodedMessage) -> Callable[[KafkaError | None, Message], None]:
            def cb(err: KafkaError | None, _msg: Message) -> None:
                m.deadletter_state = "delivered" if err is None else "failed"
                if err is None:
                    self.stats.deadletters += 1
            return cb

        for m in pending:
            if m.deadletter_state in (None, "failed"):
                m.deadletter_state = "inflight"
                try:
                    self._producer.produce(topic, m.deadletter, m.key, on_delivery=report(m))
                except (BufferError, KafkaException) as exc:
                    m.deadletter_state = "failed"
                    raise _TransientError(f"dead-letter topic {topic}: {exc}", clickhouse=False) from exc
        self._producer.flush(_DEADLETTER_FLUSH_S)
        undelivered = [m for m in pending if m.deadletter_state != "delivered"]
        if undelivered:
            raise _TransientError(f"{len(undelivered)} dead letters not delivered to {topic}", clickhouse=False)

    def _commit(self, batch: PendingBatch) -> None:
        """Synchronously commit exactly the batch's offsets (called only after it is stored)."""
        assert self._consumer is not None
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(batch.offsets.items())]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # The rows are stored; an uncommitted offset only means they are read
            # and written again (idempotent), e.g. after a rebalance.
            self.stats.last_error = f"commit: {exc}"
            log.warning("offset commit failed (%s); the batch will be re-read and rewritten idempotently", exc)
            return
        self.stats.commits += 1
        self.stats.last_commit_ns = time.time_ns()
        metrics.offset_commit(COMPONENT)

    def _note_down(self, exc: BaseException, failures: int) -> None:
        if getattr(exc, "clickhouse", True):
            self.stats.clickhouse = "down"
        self.stats.last_error = str(exc)
        if failures == 1 or failures % 10 == 0:
            log.warning("cannot store (attempt %d, retrying, nothing committed): %s", failures, exc)

    # -- waiting while paused --------------------------------------------------------
    def _pause(self) -> None:
        self._paused.pause(self._consumer)

    def _resume(self) -> None:
        self._paused.resume(self._consumer)

    def _idle(self, seconds: float) -> None:
        """Wait while staying a live group member (poll serves rebalances); early out past the deadline."""
        end = self._clock() + seconds
        while True:
            now = self._clock()
            deadline = self._deadline()
            if now >= end or (deadline is not None and now >= deadline):
                return
            if self._consumer is not None:
                self._poll(min(_IDLE_SLICE_S, end - now))
            else:
                time.sleep(min(_IDLE_SLICE_S, end - now))

    # -- rebalance callbacks (run inside consume) -------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.stats.assigned = sorted(f"{p.topic}[{p.partition}]" for p in partitions)
        log.info("assigned %s", ", ".join(self.stats.assigned) or "nothing")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Store what we hold for these partitions while we may still commit it; else drop it."""
        if not self._flushing and self._batch.messages:
            try:
                self._store(self._batch)
                self._commit(self._batch)
                self._batch = PendingBatch()
            except _TransientError as exc:
                log.warning("rebalance while ClickHouse is away (%s): the batch is left for re-reading", exc)
        self._drop([(p.topic, p.partition) for p in partitions])
        self._paused.forget((q.topic, q.partition) for q in partitions)
        self.stats.assigned = []

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._drop([(p.topic, p.partition) for p in partitions])
        self.stats.assigned = []

    def _drop(self, partitions: list[tuple[str, int]]) -> None:
        if self._batch.drop_partitions(partitions):
            # Replace the object so a flush loop in progress sees it was revoked.
            remaining = self._batch
            self._batch = PendingBatch()
            for m in remaining.messages:
                self._batch.add(m, remaining.started_at)
        self.stats.pending = len(self._batch.messages)
        if not self.stats.pending:
            self.stats.pending_since_ns = None


def _version_ns(msg: Message) -> int:
    """A summary's row version: its Kafka timestamp, so a re-read message rewrites an identical row."""
    kind, ms = msg.timestamp()
    if kind == _TIMESTAMP_NOT_AVAILABLE or ms is None or ms <= 0:
        return time.time_ns()
    return int(ms) * 1_000_000
