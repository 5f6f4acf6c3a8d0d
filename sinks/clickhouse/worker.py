"""The sink worker: Kafka (verdicts, window summaries) -> ClickHouse, at least once, never lost.

The loop (after Vector's ClickHouse sink, with Kafka's commit discipline) is
the one every plain consumer shares, :mod:`eroica.kafka.loop`; this
module is its handler (decode into rows, INSERT):

1. consume ``eroica.verdicts`` and ``eroica.window-summaries`` in the worker's own
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
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import Consumer, Message, Producer

from eroica.kafka.admin import ensure_topics
from eroica.kafka.client import consumer_conf, producer_conf
from eroica.kafka.loop import Batch, ConsumeLoop, Entry, LoopSettings, Rejected, Retry
from eroica.runtime import metrics

from .client import ClickHouseError, ClickHouseUnavailableError
from .config import RetryPolicy
from .endpoint import TOKEN_FILE, ensure_token_file, remove_endpoint_file, write_endpoint_file
from .messages import RejectedMessage, decode_summaries, decode_verdicts
from .schema import SUMMARY_NAMES, VERDICT_NAMES
from .shaping import batched
from .sink import VerdictSink
from .worker_config import SinkWorkerConfig

__all__ = ["SinkWorker", "SinkStats", "serve"]

log = logging.getLogger("eroica.sink")
COMPONENT = "sink"  # the `component` label of this worker's Prometheus metrics (eroica.runtime.metrics)

_IDLE_SLICE_S = 0.2
_DEADLETTER_FLUSH_S = 10.0
_TIMESTAMP_NOT_AVAILABLE = 0


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

    The loop itself (poll, decode, dead letters, pause on back-pressure, commit
    after the write) is the shared :class:`~eroica.kafka.loop.ConsumeLoop`;
    this class is its handler: decoding into rows and the INSERT.
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
        self._clock = clock
        self.stats = SinkStats()
        self.loop = ConsumeLoop(
            self, deadletter_topic=config.kafka.deadletter_topic, consumer=consumer,
            producer_factory=self._make_producer, stats=self.stats, component=COMPONENT, clock=clock,
            settings=LoopSettings(max_poll_messages=config.max_poll_messages,
                                  flush_interval_s=config.flush_interval_s,
                                  batch_size=self._ch_config.batch_size,
                                  shutdown_timeout_s=config.shutdown_timeout_s,
                                  backoff=self._backoff.delay, idle_slice_s=_IDLE_SLICE_S,
                                  deadletter_flush_s=_DEADLETTER_FLUSH_S))
        self.loop.producer = producer
        self._http: Any = None
        self._endpoint_dir: str | None = None
        self.ready = threading.Event()  # set once consuming (tests, orchestration)

    # -- lifecycle ------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler or another thread)."""
        self.loop.stop()

    @property
    def stopping(self) -> bool:
        return self.loop.stopping.is_set()

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
            if self.stopping:
                return self.stats
            if self.config.create_topics:
                ensure_topics(self.config.kafka, self.config.topics, log=log)
            self._open_kafka()

            def ready() -> None:
                self.ready.set()
                log.info("sink consuming %s (group %s) into %s", ", ".join(self.config.topics),
                         self.config.group_id, self._ch_config.target)

            self.loop.run(list(self.config.topics), on_ready=ready)
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
        while not self.stopping:
            try:
                self.sink.ensure_schema()
                self.stats.clickhouse = "up"
                return
            except ClickHouseUnavailableError as exc:
                failures += 1
                self._note_down(exc, failures)
                self.loop.stopping.wait(self._backoff.delay(failures))

    def _open_kafka(self) -> None:
        if self.loop.consumer is None:
            self.loop.consumer = Consumer(consumer_conf(self.config.kafka, "sink", self.config.group_id,
                                                        session_timeout_ms=self.config.session_timeout_ms))

    def _make_producer(self) -> Producer:
        return Producer(producer_conf(self.config.kafka, "sink-deadletter", **{"linger.ms": 5,
                                                                               "message.timeout.ms": 30000}))

    def _close(self) -> None:
        self.loop.close()  # leaves the group now: a restart need not wait a session timeout
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

    # -- the loop's handler: decoding ---------------------------------------------------
    def decode(self, msg: Message) -> tuple[tuple[list[tuple], list[tuple]], int]:
        """(verdict rows, summary rows) of one message and their count; RejectedMessage -> dead letter."""
        value = msg.value()
        try:
            if msg.topic() == self.config.window_summaries_topic:
                summary_rows = decode_summaries(value, _version_ns(msg))
                return ([], summary_rows), len(summary_rows)
            decoded = decode_verdicts(value)
        except RejectedMessage as exc:
            raise Rejected(str(exc)) from None
        for v, _row in decoded:  # the detector's delay, as the verdicts record it
            metrics.detection_delay(COMPONENT, (v.detected_at_ns - v.window_end_ns) / 1e9)
        return ([row for _, row in decoded], []), len(decoded)

    # -- the loop's handler: storing ----------------------------------------------------
    def write(self, batch: Batch) -> None:
        """Insert the batch's rows; Retry while ClickHouse is away; refused messages become dead letters."""
        assert self.sink is not None
        entries = batch.values()
        verdict_rows = [r for e in entries for r in e.value[0]]
        summary_rows = [r for e in entries for r in e.value[1]]
        t0 = time.perf_counter()
        self.stats.insert_started_ns = time.time_ns()
        try:
            if verdict_rows or summary_rows:
                try:
                    self._insert(verdict_rows, summary_rows)
                except ClickHouseUnavailableError:
                    raise
                except ClickHouseError as exc:
                    log.warning("ClickHouse refused a batch (%s); inserting message by message", exc)
                    self._insert_one_by_one(entries)
        except ClickHouseUnavailableError as exc:
            raise Retry(str(exc)) from exc
        finally:
            self.stats.insert_started_ns = None
        took_ms = (time.perf_counter() - t0) * 1000.0
        stored = batch.values()
        n_verdicts = sum(len(e.value[0]) for e in stored)
        n_summaries = sum(len(e.value[1]) for e in stored)
        s = self.stats
        s.clickhouse = "up"
        s.batches += 1
        s.verdicts += n_verdicts
        s.summaries += n_summaries
        s.record_insert(took_ms)
        metrics.sink_insert(COMPONENT, took_ms / 1000.0)
        cfg = self._ch_config
        metrics.records_out(COMPONENT, cfg.verdicts_table, n_verdicts)
        metrics.records_out(COMPONENT, cfg.summaries_table, n_summaries)

    def _insert(self, verdict_rows: list[tuple], summary_rows: list[tuple]) -> None:
        assert self.sink is not None
        _chaos_check()
        client, cfg = self.sink.client, self._ch_config
        for chunk in batched(verdict_rows, cfg.batch_size):
            client.insert(cfg.verdicts, VERDICT_NAMES, chunk)
        for chunk in batched(summary_rows, cfg.batch_size):
            client.insert(cfg.summaries, SUMMARY_NAMES, chunk)

    def _insert_one_by_one(self, entries: list[Entry]) -> None:
        """Find the messages ClickHouse refuses; dead-letter them, keep the rest."""
        for e in entries:
            if not e.size:
                continue
            try:
                self._insert(*e.value)
            except ClickHouseUnavailableError:
                raise
            except ClickHouseError as exc:
                e.reject(f"ClickHouse refused the rows: {exc}")
                log.warning("dead letter %s[%d]@%d: %s", e.topic, e.partition, e.offset, e.reason)

    def on_write_failed(self, exc: Retry, failures: int) -> None:
        self.stats.insert_failures += 1
        metrics.sink_insert_failure(COMPONENT)
        self._note_down(exc, failures)

    def _note_down(self, exc: BaseException, failures: int) -> None:
        if getattr(exc, "downstream", getattr(exc, "clickhouse", True)):
            self.stats.clickhouse = "down"
        self.stats.last_error = str(exc)
        if failures == 1 or failures % 10 == 0:
            log.warning("cannot store (attempt %d, retrying, nothing committed): %s", failures, exc)


def _chaos_check() -> None:
    """Fault injection for the chaos tests: while the file named by ``EROICA_SINK_CHAOS_BLOCK_FILE``
    exists, every insert fails as if ClickHouse were down (unset in production: one getenv per batch)."""
    path = os.environ.get("EROICA_SINK_CHAOS_BLOCK_FILE")
    if path and os.path.exists(path):
        raise ClickHouseUnavailableError(f"ClickHouse writes blocked by {path} (chaos test)")


def _version_ns(msg: Message) -> int:
    """A summary's row version: its Kafka timestamp, so a re-read message rewrites an identical row."""
    kind, ms = msg.timestamp()
    if kind == _TIMESTAMP_NOT_AVAILABLE or ms is None or ms <= 0:
        return time.time_ns()
    return int(ms) * 1_000_000


def serve(config: SinkWorkerConfig, log_level: str = "info") -> int:
    """Run one sink worker in the foreground until SIGTERM or SIGINT; returns the exit status.

    Logs to stderr, one line per kind of error every 30 s while the broker or
    ClickHouse is away; a signal finishes the current batch (inserted and
    committed) before it returns 0; 1 when ClickHouse fails for good. Both
    ``eroica sink`` and ``python -m eroica.sinks.clickhouse`` run it.
    """
    from eroica.runtime.logfilter import install as limit_repeats

    logging.basicConfig(level=getattr(logging, log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s eroica sink %(levelname)s: %(message)s")
    limit_repeats()
    worker = SinkWorker(config)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("%s: finishing the current batch", signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stats = worker.run()
    except ClickHouseError as exc:
        print(f"eroica sink: {exc}", file=sys.stderr)
        return 1
    print(f"eroica sink: stopped; {stats.consumed} messages, {stats.verdicts} verdict rows, "
          f"{stats.summaries} summary rows, {stats.deadletters} dead letters, {stats.commits} commits",
          file=sys.stderr)
    return 0
