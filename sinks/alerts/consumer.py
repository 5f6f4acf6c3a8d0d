"""The alert consumer: verdict topic -> incidents -> webhook, never losing or repeating an alert.

The loop (the sink worker's commit discipline, with a webhook instead of an
INSERT; both run the shared :mod:`eroica.kafka.loop`):

1. consume ``eroica.verdicts`` (JSON verdicts, key = job) and, as the jobs'
   event-time clock, ``eroica.window-summaries`` (one msgpack list of window
   summaries per analysed window) in the consumer's own group, auto-commit off;
2. apply each message to the :class:`~eroica.sinks.alerts.incidents.IncidentTracker`
   (pure, idempotent); a job-end marker on the verdict topic
   (:mod:`eroica.models.job_end`) resolves the job's incidents at once; once a
   second, ask it for due resolutions and reminders;
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
from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, Message, Producer, TopicPartition

from eroica.models.job_end import decode_job_end
from eroica.models.limits import MAX_VERDICT_BYTES, LimitError, check_msgpack, failure_reason
from eroica.models.verdict import Verdict, decode_verdict_message as _decode_verdicts
from eroica.kafka.admin import ensure_topics
from eroica.kafka.client import consumer_conf, producer_conf
from eroica.kafka.loop import Batch, ConsumeLoop, Entry, LoopSettings, Rejected, Retry
from eroica.runtime import metrics

from .config import AlertConfig
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
        return _decode_verdicts(value)  # the one decoder of verdict messages (models/verdict.py)
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
    job_ends: int = 0      # job-end markers read (each resolves the job's incidents)
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

    The loop (poll, decode, dead letters, pause while the webhook is away, commit
    after the write) is the shared :class:`~eroica.kafka.loop.ConsumeLoop`;
    this class is its handler: a message is applied to the incident tracker
    when decoded, and the *write* delivers the queued notifications and saves
    the state file. ``consumer``, ``producer`` (dead letters), ``sender`` (the
    webhook POST) and ``clock`` (wall ns) may be injected by tests.
    """

    def __init__(self, config: AlertConfig, *, consumer: Consumer | None = None, producer: Producer | None = None,
                 sender: Callable[..., Delivery] = post, clock: Callable[[], int] = time.time_ns,
                 serve_metrics: bool = False) -> None:
        self.config = config
        self._send = sender
        self._clock = clock
        self._serve_metrics = serve_metrics
        self.stats = AlertStats()
        self.state: AlertState | None = None
        self._dirty = False
        self._last_checkpoint = time.monotonic()
        self._next_tick = 0.0
        self._next_prune = 0.0
        self._committed: dict[tuple[str, int], int] = {}
        self.loop = ConsumeLoop(
            self, deadletter_topic=config.kafka.deadletter_topic, consumer=consumer,
            producer_factory=self._make_producer, stats=self.stats, component=COMPONENT,
            settings=LoopSettings(max_poll_messages=config.max_poll_messages,
                                  flush_interval_s=config.checkpoint_interval_s, batch_size=1 << 62,
                                  shutdown_timeout_s=config.shutdown_timeout_s, backoff=config.backoff,
                                  idle_slice_s=_IDLE_SLICE_S, deadletter_flush_s=_DEADLETTER_FLUSH_S))
        self.loop.producer = producer
        self.ready = threading.Event()

    @property
    def _consumer(self) -> Consumer | None:
        return self.loop.consumer

    # -- lifecycle ------------------------------------------------------------------------
    def stop(self) -> None:
        self.loop.stop()

    def run(self) -> AlertStats:
        cfg = self.config
        self.state = AlertState.load(cfg.state_file, cfg.tracker_settings(), cfg.group_id)
        self.state.lock()
        try:
            if self._serve_metrics:
                metrics.serve(COMPONENT)
            if cfg.create_topics:
                ensure_topics(cfg.kafka, cfg.topics, log=log)
            if self.loop.consumer is None:
                self.loop.consumer = Consumer(consumer_conf(cfg.kafka, "alert", cfg.group_id,
                                                            session_timeout_ms=cfg.session_timeout_ms))

            def ready() -> None:
                self.ready.set()
                log.info("alerting on %s (group %s) -> %s as %s; state %s", ", ".join(cfg.topics), cfg.group_id,
                         cfg.webhook, cfg.fmt, cfg.state_file)
                if self.state is not None and self.state.outbox:
                    log.info("%d notification(s) left undelivered by the last run: sending them first",
                             len(self.state.outbox))

            self.loop.run(cfg.topics, on_ready=ready)
            return self.stats
        finally:
            try:
                self.loop.close()  # leaves the group; its revoke callback commits nothing now
            finally:
                if self.state is not None:
                    self.state.unlock()

    def _make_producer(self) -> Producer:
        return Producer(producer_conf(self.config.kafka, "alert-deadletter"))

    # -- the loop's handler: decoding (= applying to the tracker, idempotent) ----------------------
    def decode(self, msg: Message) -> tuple[None, int]:
        assert self.state is not None
        now = self._clock()
        self._dirty = True
        try:
            if msg.topic() == self.config.kafka.verdicts_topic:
                end = decode_job_end(msg.value())
                if end is not None:  # the job ended: its incidents resolve now (models/job_end.py)
                    self.stats.job_ends += 1
                    self.state.enqueue(self.state.tracker.observe_job_end(end.job, now))
                else:
                    for v in decode_verdict_message(msg.value()):
                        self.stats.verdicts += 1
                        self.state.enqueue(self.state.tracker.observe_verdict(v, now))
            else:
                for job, start, end in decode_window_message(msg.value()):
                    self.stats.windows += 1
                    self.state.tracker.observe_window(job, start, end, now)
        except _Rejected as exc:
            raise Rejected(str(exc)) from None
        self._committed.pop((msg.topic(), msg.partition()), None)
        return None, 1

    def on_rejected(self, entry: Entry) -> None:
        self.stats.invalid += 1

    # -- time passing ------------------------------------------------------------------------------
    def tick(self) -> None:
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

    def has_work(self) -> bool:
        """Notifications to send now, or state changed by the clock to save (even with no message read)."""
        if self.state is None:
            return False
        return bool(self.state.outbox) or (
            self._dirty and time.monotonic() - self._last_checkpoint >= self.config.checkpoint_interval_s)

    def can_write_in_rebalance(self) -> bool:
        return self.state is not None and not self.state.outbox

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

    # -- the loop's handler: writing = delivering, then the state file -------------------------------
    def write(self, batch: Batch) -> None:
        """Deliver the queue in order (Retry at the first transient failure), then save the state file.

        The loop commits the batch's offsets only after this returns: the state
        file then holds every effect of the messages they cover.
        """
        self._deliver_all()
        self._checkpoint(batch)

    def _deliver_all(self) -> None:
        assert self.state is not None
        cfg = self.config
        while self.state.outbox:
            n = self.state.outbox[0]
            if n.notification_id in self.state.delivered:
                self.state.outbox.pop(0)
                self.stats.duplicates_skipped += 1
                metrics.ALERT_NOTIFICATIONS.labels(n.event, "duplicate").inc()
                continue
            t0 = time.perf_counter()
            result = self._send(cfg.webhook, render(n, cfg.fmt, reminder_ns=cfg.reminder_ns,
                                                    report_url_base=cfg.report_url_base),
                                n.notification_id, timeout_s=cfg.timeout_s)
            if result.outcome == "transient":
                self.stats.delivery_failures += 1
                self.stats.webhook = "down"
                self.stats.last_error = f"webhook: {result.detail or result.status}"
                metrics.ALERT_DELIVERY_FAILURES.labels("transient").inc()
                raise Retry(f"webhook did not accept {n.event} {n.notification_id}: {result.detail or result.status}")
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
            self.state.mark(n, result.outcome, now)
            self.state.save(now)  # before anything else: a restart must know it was sent
            self._dirty = True

    def _checkpoint(self, batch: Batch) -> None:
        """The state file (the loop commits the batch's offsets right after)."""
        assert self.state is not None
        self.state.save(self._clock())
        self._dirty = False
        self._last_checkpoint = time.monotonic()

    def on_write_failed(self, exc: Retry, failures: int) -> None:
        if failures == 1 or failures % 10 == 0:
            log.warning("%s (attempt %d, retrying, nothing committed)", exc, failures)

    def on_gave_up(self, batch: Batch) -> None:
        assert self.state is not None
        log.warning("stopping with %d notification(s) undelivered; they are kept in %s and sent "
                    "at the next start", len(self.state.outbox), self.config.state_file)
        self.state.save(self._clock())

    def on_revoke(self, partitions: list[Any]) -> None:
        for p in partitions:
            self._committed.pop((p.topic, p.partition), None)
