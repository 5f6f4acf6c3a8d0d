"""The alert consumer: verdict topic -> incidents -> webhook, never losing or repeating an alert.

The loop (the sink worker's commit discipline, with a webhook instead of an INSERT):

1. consume ``eroica.verdicts`` (JSON verdicts, key = job) and, as the jobs'
   event-time clock, ``eroica.patterns`` (one msgpack list of window
   summaries per analysed window) in the consumer's own group, auto-commit off;
2. apply each message to the :class:`~eroica.sinks.alerts.incidents.IncidentTracker`
   (pure, idempotent); once a second, ask it for due resolutions and reminders;
3. deliver every queued notification, oldest first, retrying transient
   failures with backoff (partitions paused, the consumer still polling so it
   keeps its group membership); after each accepted delivery record its id
   as delivered and **write the state file**;
4. **write the state file, then commit exactly the offsets read so far**, only
   when nothing is left to deliver.

A message that cannot be decoded (or applied) goes to the dead-letter topic
whole, with its reason (size and depth are bounded before decoding,
``models/limits.py``), and is committed past once that dead letter is
delivered: no message can stop the consumer or make it crash-loop.

Crash anywhere: the committed offsets never cover a message whose effect is
not in the state file, so nothing is lost; messages read again are applied
again without effect, and notifications regenerated from them carry ids
already recorded as delivered, so nothing is sent twice. The one window left
is between the webhook's 2xx and the state write (milliseconds): a crash
exactly there sends that notification again on restart, with the same
``Idempotency-Key``.

Resolution by event time waits until the consumer has caught up with every
assigned partition (no verdict can still be waiting), so reading a backlog in
any order never resolves an incident early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from eroica.models.deadletter import encode_with_raw
from eroica.models.limits import MAX_VERDICT_BYTES, LimitError, check_msgpack, failure_reason
from eroica.models.verdict import Verdict, decode_verdict, decode_verdicts
from eroica.producers.kafka.publisher import _RateLimitedLogger
from eroica.stack import metrics
from eroica.sinks.pausing import PartitionPause

from .config import AlertConfig
from .incidents import Notification
from .payloads import render
from .state import AlertState
from .webhook import Delivery, post

__all__ = ["AlertConsumer", "AlertStats"]

log = logging.getLogger("eroica.alert")

_IDLE_SLICE_S = 0.2
_TICK_S = 1.0
_PRUNE_S = 60.0
COMPONENT = "alert"


class _WindowRef(msgspec.Struct, forbid_unknown_fields=False):
    """The only fields of a window summary the alert consumer reads."""

    job: str
    window_start_ns: int
    window_end_ns: int


_windows = msgspec.msgpack.Decoder(list[_WindowRef])
_DEADLETTER_FLUSH_S = 5.0


class _Rejected(ValueError):
    pass


def decode_verdict_message(value: bytes | None) -> list[Verdict]:
    """The verdicts of one message; ``_Rejected`` with the reason for anything else (size and depth bounded)."""
    if not value:
        raise _Rejected("empty message")
    try:
        return decode_verdicts(value) if value.lstrip()[:1] == b"[" else [decode_verdict(value)]
    except Exception as exc:  # DecodeError with its reason; nothing else can escape (models/limits.py)
        raise _Rejected(f"invalid verdict: {' '.join(str(exc).split())[:500]}") from None


def decode_window_message(value: bytes | None) -> set[tuple[str, int, int]]:
    """The windows one patterns message covers; ``_Rejected`` with the reason for anything else."""
    if value is None:
        raise _Rejected("empty message")
    try:
        check_msgpack(value, MAX_VERDICT_BYTES, what="window summaries message")
        rows = _windows.decode(value)
    except LimitError as exc:
        raise _Rejected(f"invalid window summaries: {exc}") from None
    except msgspec.DecodeError as exc:
        raise _Rejected(f"invalid window summaries: {exc}") from None
    except Exception as exc:  # RecursionError, MemoryError...: a reason, never a crash
        raise _Rejected(f"invalid window summaries: {failure_reason(exc)}") from None
    return {(r.job, r.window_start_ns, r.window_end_ns) for r in rows}


@dataclass
class AlertStats:
    started_at_ns: int = field(default_factory=time.time_ns)
    consumed: int = 0
    verdicts: int = 0
    windows: int = 0
    invalid: int = 0
    deadletters: int = 0   # rejected messages delivered to the dead-letter topic
    delivered: dict[str, int] = field(default_factory=dict)   # event -> count
    refused: int = 0
    duplicates_skipped: int = 0
    delivery_failures: int = 0
    commits: int = 0
    open_incidents: int = 0
    webhook: str = "unknown"
    last_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class AlertConsumer:
    """One consumer, one state file, one loop; ``run()`` blocks until ``stop()``.

    ``consumer``, ``sender`` (the webhook POST) and ``clock`` (wall ns) may be
    injected by tests.
    """

    def __init__(self, config: AlertConfig, *, consumer: Consumer | None = None, producer: Producer | None = None,
                 sender: Callable[..., Delivery] = post, clock: Callable[[], int] = time.time_ns,
                 serve_metrics: bool = False) -> None:
        self.config = config
        self._consumer = consumer
        self._producer = producer          # dead letters only; made at the first one
        self._deadletters: list[list] = []  # [key, value, state] not yet delivered: offsets wait for them
        self._send = sender
        self._clock = clock
        self._serve_metrics = serve_metrics
        self.stats = AlertStats()
        self.state: AlertState | None = None
        self._pending: dict[tuple[str, int], int] = {}   # next offset to commit, per partition
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._next_tick = 0.0
        self._next_prune = 0.0
        self._paused = PartitionPause()
        self._committed: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self._stop_at: float | None = None
        self._failures = 0
        self._delivering = False
        self._closing = False
        self.ready = threading.Event()

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop_at = time.monotonic()
            self._stop.set()

    def run(self) -> AlertStats:
        cfg = self.config
        self.state = AlertState.load(cfg.state_file, cfg.tracker_settings(), cfg.group_id)
        self.state.lock()
        try:
            if self._serve_metrics:
                metrics.serve(COMPONENT)
            self._ensure_topics()
            self._open_kafka()
            assert self._consumer is not None
            self._consumer.subscribe(cfg.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
            self.ready.set()
            log.info("alerting on %s (group %s) -> %s as %s; state %s", ", ".join(cfg.topics), cfg.group_id,
                     cfg.webhook, cfg.fmt, cfg.state_file)
            if self.state.outbox:
                log.info("%d notification(s) left undelivered by the last run: sending them first",
                         len(self.state.outbox))
            while not self._stop.is_set():
                self._poll(_IDLE_SLICE_S)
                self._tick()
                if self.state.outbox:
                    self._deliver_all()
                if self._dirty and time.monotonic() - self._last_checkpoint >= cfg.checkpoint_interval_s:
                    self._checkpoint()
            # Stopping: one last try to deliver what is queued (bounded), then checkpoint.
            if self.state.outbox:
                self._deliver_all()
            if self._dirty or self._pending:
                self._checkpoint()
            return self.stats
        finally:
            self._close()

    def _ensure_topics(self) -> None:
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
        if self._consumer is not None:
            return
        cfg = self.config
        self._consumer = Consumer({
            "bootstrap.servers": cfg.kafka.bootstrap,
            "group.id": cfg.group_id,
            "client.id": "eroica-alert",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": cfg.session_timeout_ms,
            "heartbeat.interval.ms": max(500, cfg.session_timeout_ms // 5),
            "fetch.wait.max.ms": 100,
            "logger": _RateLimitedLogger(logging.getLogger("eroica.kafka.librdkafka")),
        })

    def _close(self) -> None:
        try:
            if self._consumer is not None:
                consumer, self._consumer = self._consumer, None
                self._closing = True
                consumer.close()  # leaves the group; its revoke callback commits nothing now
            if self._producer is not None:
                self._producer.flush(_DEADLETTER_FLUSH_S)
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer: %s", exc)
        finally:
            if self.state is not None:
                self.state.unlock()

    # -- consuming ------------------------------------------------------------------------------
    def _poll(self, timeout_s: float) -> None:
        assert self._consumer is not None
        for msg in self._consumer.consume(self.config.max_poll_messages, timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise KafkaException(err)
                self.stats.last_error = f"kafka: {err.str()}"
                log.warning("Kafka consumer: %s", err.str())
                continue
            self._handle(msg)

    def _handle(self, msg: Message) -> None:
        assert self.state is not None
        topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
        self.stats.consumed += 1
        metrics.records_in(COMPONENT, topic)
        now = self._clock()
        try:
            if topic == self.config.kafka.verdicts_topic:
                for v in decode_verdict_message(msg.value()):
                    self.stats.verdicts += 1
                    self.state.enqueue(self.state.tracker.observe_verdict(v, now))
            else:
                for job, start, end in decode_window_message(msg.value()):
                    self.stats.windows += 1
                    self.state.tracker.observe_window(job, start, end, now)
        except Exception as exc:  # _Rejected, or a failure applying it: dead-lettered, never a crash loop
            reason = str(exc) if isinstance(exc, _Rejected) else f"processing failed: {failure_reason(exc)}"
            self.stats.invalid += 1
            metrics.invalid(COMPONENT, reason)
            log.warning("dead letter %s[%d]@%d: %s", topic, partition, offset, reason)
            self._dead_letter(topic, partition, offset, msg.key(), msg.value(), reason)
        self._pending[(topic, partition)] = max(self._pending.get((topic, partition), 0), offset + 1)
        self._committed.pop((topic, partition), None)
        self._dirty = True

    # -- dead letters ------------------------------------------------------------------------------
    def _dead_letter(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None,
                     reason: str) -> None:
        """Queue the rejected message for the dead-letter topic (whole, or a reference past 900 KiB)."""
        doc = {"source": topic, "line": offset, "partition": partition, "offset": offset,
               "key": (key or b"").decode("utf-8", "replace"), "reason": reason}
        self._deadletters.append([key, encode_with_raw(doc, value), None])
        self._send_deadletters()

    def _send_deadletters(self, flush_s: float = 0.0) -> bool:
        """Produce what is queued; True once every dead letter is delivered (offsets may then be committed)."""
        if not self._deadletters:
            return True
        if self._producer is None:
            self._producer = Producer({"bootstrap.servers": self.config.kafka.bootstrap,
                                       "client.id": "eroica-alert-deadletter", "enable.idempotence": True,
                                       "logger": _RateLimitedLogger(logging.getLogger("eroica.kafka.librdkafka"))})
        topic = self.config.kafka.deadletter_topic

        def report(item: list) -> Callable[[Any, Any], None]:
            def cb(err: Any, _msg: Any) -> None:
                item[2] = "delivered" if err is None else "failed"
            return cb

        for item in self._deadletters:
            if item[2] in (None, "failed"):
                item[2] = "inflight"
                try:
                    self._producer.produce(topic, item[1], item[0], on_delivery=report(item))
                except (BufferError, KafkaException) as exc:
                    item[2] = "failed"
                    self.stats.last_error = f"dead letter: {exc}"
        self._producer.flush(flush_s) if flush_s else self._producer.poll(0)
        done = [i for i in self._deadletters if i[2] == "delivered"]
        self.stats.deadletters += len(done)
        self._deadletters = [i for i in self._deadletters if i[2] != "delivered"]
        return not self._deadletters

    # -- time passing ------------------------------------------------------------------------------
    def _tick(self) -> None:
        assert self.state is not None
        mono = time.monotonic()
        if mono < self._next_tick:
            return
        self._next_tick = mono + _TICK_S
        now = self._clock()
        tracker = self.state.tracker
        due = tracker.due(now, caught_up=tracker.could_resolve(now) and self._caught_up())
        if due:
            self.state.enqueue(due)
            self._dirty = True
        if mono >= self._next_prune:
            self._next_prune = mono + _PRUNE_S
            self.state.prune(now)
        self.stats.open_incidents = self.state.tracker.open_count()
        metrics.ALERT_OPEN_INCIDENTS.set(self.stats.open_incidents)

    def _caught_up(self) -> bool:
        """True when every assigned partition has been read up to its end (nothing can be waiting)."""
        c = self._consumer
        if c is None:
            return False
        try:
            assigned = c.assignment()
            if not assigned:
                return False
            positions = {(p.topic, p.partition): p.offset for p in c.position(assigned)}
            for tp in assigned:
                key = (tp.topic, tp.partition)
                low, high = c.get_watermark_offsets(tp, timeout=2.0, cached=False)
                pos = positions.get(key, OFFSET_INVALID)
                if pos < 0:
                    pos = self._committed_offset(tp, low)
                if pos < high:
                    return False
            return True
        except KafkaException as exc:
            self.stats.last_error = f"lag check: {exc}"
            return False

    def _committed_offset(self, tp: TopicPartition, low: int) -> int:
        """Where reading of a partition resumes when nothing was read from it yet in this run."""
        key = (tp.topic, tp.partition)
        if key not in self._committed:
            assert self._consumer is not None
            got = self._consumer.committed([TopicPartition(tp.topic, tp.partition)], timeout=5.0)
            off = got[0].offset if got else OFFSET_INVALID
            self._committed[key] = off if off >= 0 else low
        return self._committed[key]

    # -- delivering --------------------------------------------------------------------------------------
    def _deadline_passed(self) -> bool:
        return self._stop_at is not None and time.monotonic() >= self._stop_at + self.config.shutdown_timeout_s

    def _deliver_all(self) -> None:
        """Send the queue in order; returns when it is empty or (stopping) past the shutdown deadline."""
        assert self.state is not None
        cfg = self.config
        self._delivering = True
        try:
            while self.state.outbox:
                n = self.state.outbox[0]
                if n.notification_id in self.state.delivered:
                    self.state.outbox.pop(0)
                    self.stats.duplicates_skipped += 1
                    metrics.ALERT_NOTIFICATIONS.labels(n.event, "duplicate").inc()
                    continue
                t0 = time.perf_counter()
                result = self._send(cfg.webhook, render(n, cfg.fmt, reminder_ns=cfg.reminder_ns),
                                    n.notification_id, timeout_s=cfg.timeout_s)
                if result.outcome == "transient":
                    self._failures += 1
                    self.stats.delivery_failures += 1
                    self.stats.webhook = "down"
                    self.stats.last_error = f"webhook: {result.detail or result.status}"
                    metrics.ALERT_DELIVERY_FAILURES.labels("transient").inc()
                    if self._failures == 1 or self._failures % 10 == 0:
                        log.warning("webhook did not accept %s %s (attempt %d, retrying, nothing committed): %s",
                                    n.event, n.notification_id, self._failures, result.detail or result.status)
                    self._pause()
                    delay = cfg.backoff(self._failures)
                    if self._stop.is_set() and (self._deadline_passed() or
                                                time.monotonic() + delay > self._stop_at + cfg.shutdown_timeout_s):
                        log.warning("stopping with %d notification(s) undelivered; they are kept in %s and sent "
                                    "at the next start", len(self.state.outbox), cfg.state_file)
                        self.state.save(self._clock())
                        return
                    self._idle(delay)
                    continue
                now = self._clock()
                if result.outcome == "accepted":
                    self.stats.delivered[n.event] = self.stats.delivered.get(n.event, 0) + 1
                    self.stats.webhook = "up"
                    metrics.ALERT_DELIVERY.observe(time.perf_counter() - t0)
                    metrics.ALERT_NOTIFICATIONS.labels(n.event, "delivered").inc()
                    metrics.records_out(COMPONENT, "webhook")
                    log.info("delivered %s %s (incident %s #%d, job %s)", n.event, n.notification_id,
                             n.incident_id, n.occurrence, n.job)
                else:
                    self.stats.refused += 1
                    self.stats.last_error = f"webhook refused {n.notification_id}: {result.detail}"
                    metrics.ALERT_DELIVERY_FAILURES.labels("refused").inc()
                    metrics.ALERT_NOTIFICATIONS.labels(n.event, "refused").inc()
                    log.error("webhook refused %s %s (%s); not retrying it", n.event, n.notification_id,
                              result.detail)
                self._failures = 0
                self.state.mark(n, result.outcome, now)
                self.state.save(now)  # before anything else: a restart must know it was sent
                self._dirty = True
            self._resume()
        finally:
            self._delivering = False

    def _checkpoint(self) -> None:
        """State file, then offsets: only with nothing left to deliver."""
        assert self.state is not None
        if self.state.outbox:
            return
        if not self._send_deadletters(_DEADLETTER_FLUSH_S):
            log.warning("%d dead letter(s) not delivered yet; offsets not committed", len(self._deadletters))
            return
        self.state.save(self._clock())
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        if not self._pending or self._consumer is None:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(self._pending.items())]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self.stats.last_error = f"commit: {exc}"
            log.warning("offset commit failed (%s); the messages will be read again, without effect", exc)
            return
        self._pending.clear()
        self.stats.commits += 1
        metrics.offset_commit(COMPONENT)

    # -- waiting while the webhook is down -------------------------------------------------------------------
    def _pause(self) -> None:
        self._paused.pause(self._consumer)

    def _resume(self) -> None:
        self._paused.resume(self._consumer)

    def _idle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            if now >= end or self._deadline_passed():
                return
            self._poll(min(_IDLE_SLICE_S, end - now))

    # -- rebalance callbacks ----------------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.info("assigned %s", ", ".join(sorted(f"{p.topic}[{p.partition}]" for p in partitions)) or "nothing")

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if (not self._delivering and not self._closing and self.state is not None and not self.state.outbox
                and self._pending):
            self._checkpoint()
        self._forget([(p.topic, p.partition) for p in partitions])

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget([(p.topic, p.partition) for p in partitions])

    def _forget(self, partitions: list[tuple[str, int]]) -> None:
        for key in partitions:
            self._pending.pop(key, None)
            self._committed.pop(key, None)
        gone = set(partitions)
        self._paused.forget(gone)
