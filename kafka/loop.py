"""The one at-least-once consume-decode-write-commit loop of Eroica's plain Kafka consumers.

Shared by the ClickHouse sink worker (``sinks/clickhouse/worker.py``) and the
alert consumer (``sinks/alerts/consumer.py``); any other plain consumer should
use it too. What a consumer supplies is a :class:`Handler`: how to decode one
message, and how to *write* a batch (INSERT it, deliver the notifications it
caused and save the state file...). The loop owns everything else:

1. consume the subscribed topics in the consumer's group, auto-commit off
   (:func:`eroica.kafka.client.consumer_conf`);
2. decode each message (``Handler.decode``); one that raises -- any exception:
   :class:`Rejected` with its reason, or RecursionError, MemoryError... -- is
   queued for the dead-letter topic **whole** (``raw``, or past 900 KiB a
   durable reference: topic/partition@offset, size and SHA-256; see
   ``models/deadletter.py``) with its reason, and the loop goes on: no message
   can stop the consumer or make it crash-loop;
3. write the batch when it holds ``batch_size`` units, when its oldest message
   has waited ``flush_interval_s``, or when the handler has work of its own
   (``Handler.has_work``);
4. deliver the batch's dead letters, then **commit, synchronously, exactly the
   offsets of the messages the write covered** -- never before.

Back-pressure: a write that raises :class:`Retry` (ClickHouse or the webhook
away, the dead-letter topic unreachable) is retried with the handler's
backoff; meanwhile every assigned partition is **paused** (the consumer keeps
polling, so it stays a live group member and serves rebalances, but fetches
nothing more) and nothing is committed. Once the write succeeds the
partitions are resumed. A crash at any point loses nothing: whatever was not
committed is read again, and every handler's write is idempotent.

Rebalance: on revoke, the batch is written and committed once if that can be
done at once (no retry inside the callback); otherwise the revoked
partitions' messages are dropped from the batch, uncommitted, for their next
owner to read again.

Stop (``stop()``, safe from a signal handler): the loop stops consuming and
writes the last batch within ``shutdown_timeout_s``; past it the batch stays
uncommitted and is read again at the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from eroica.models.limits import failure_reason
from eroica.runtime.backoff import delay as backoff_delay

from .deadletter import deadletter_message

__all__ = ["ConsumeLoop", "Handler", "Entry", "Batch", "Retry", "Rejected", "LoopSettings"]

log = logging.getLogger("eroica.kafka.loop")


class Retry(Exception):
    """The write failed in a way that waiting can fix; ``downstream``: the store itself is away (not Kafka)."""

    def __init__(self, message: str, *, downstream: bool = True) -> None:
        super().__init__(message)
        self.downstream = downstream


class Rejected(ValueError):
    """A message that can never be processed; its ``str`` is the dead letter's reason."""


@dataclass
class Entry:
    """One consumed message: its position, raw bytes and what decoding made of it."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    raw: bytes | None
    value: Any = None
    size: int = 0                    # units counted against batch_size (rows, records...)
    deadletter: bytes | None = None  # set when rejected
    # Dead-letter delivery: None (not sent), "inflight", "delivered" or "failed" (send again).
    deadletter_state: str | None = None
    reason: str | None = None

    def reject(self, reason: str) -> None:
        """Turn this entry into a dead letter (whole raw payload + reason); its value is dropped."""
        self.reason = reason
        self.value, self.size = None, 0
        self.deadletter = deadletter_message(self.topic, self.partition, self.offset, self.key, self.raw, reason)


@dataclass
class Batch:
    """Messages consumed since the last commit, and per partition the offset to commit after their write."""

    entries: list[Entry] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    started_at: float | None = None
    size: int = 0

    def add(self, entry: Entry, now: float) -> None:
        if self.started_at is None:
            self.started_at = now
        self.entries.append(entry)
        self.size += entry.size
        tp = (entry.topic, entry.partition)
        self.offsets[tp] = max(self.offsets.get(tp, 0), entry.offset + 1)

    def __len__(self) -> int:
        return len(self.entries)

    def values(self) -> list[Entry]:
        """The entries that decoded (not rejected)."""
        return [e for e in self.entries if e.deadletter is None]

    def deadletters(self) -> list[Entry]:
        return [e for e in self.entries if e.deadletter is not None]

    def drop_partitions(self, partitions: Iterable[tuple[str, int]]) -> int:
        gone = set(partitions)
        keep = [e for e in self.entries if (e.topic, e.partition) not in gone]
        dropped = len(self.entries) - len(keep)
        self.entries = keep
        self.offsets = {tp: o for tp, o in self.offsets.items() if tp not in gone}
        self.size = sum(e.size for e in keep)
        if not keep:
            self.started_at = None
        return dropped


class Handler(Protocol):
    """What one consumer does with its messages (the loop calls these on its own thread)."""

    def decode(self, msg: Any) -> tuple[Any, int]:
        """(value, size) of one message; any exception dead-letters it (``Rejected``: its reason)."""

    def write(self, batch: Batch) -> None:
        """Store everything the batch holds (idempotently); :class:`Retry` to be called again later.

        May ``entry.reject(reason)`` messages the store refuses for good: they
        are dead-lettered and committed past like undecodable ones.
        """


class _DefaultHooks:
    """Optional handler methods and what the loop does without them."""

    @staticmethod
    def has_work() -> bool:
        return False

    @staticmethod
    def tick() -> None:
        pass

    @staticmethod
    def can_write_in_rebalance() -> bool:
        return True

    @staticmethod
    def on_write_failed(exc: Retry, failures: int) -> None:
        pass

    @staticmethod
    def on_gave_up(batch: Batch) -> None:
        pass

    @staticmethod
    def on_rejected(entry: Entry) -> None:
        pass

    @staticmethod
    def on_assign(partitions: Sequence[Any]) -> None:
        pass

    @staticmethod
    def on_revoke(partitions: Sequence[Any]) -> None:
        pass


@dataclass(frozen=True)
class LoopSettings:
    max_poll_messages: int = 1000
    flush_interval_s: float = 0.5
    batch_size: int = 10_000
    shutdown_timeout_s: float = 10.0
    backoff: Callable[[int], float] = backoff_delay  # 0.5 s doubling to 30 s (runtime/backoff.py)
    idle_slice_s: float = 0.2
    deadletter_flush_s: float = 10.0


def _bump(stats: Any, name: str, n: int = 1) -> None:
    if stats is not None and hasattr(stats, name):
        setattr(stats, name, getattr(stats, name) + n)


def _set(stats: Any, name: str, value: Any) -> None:
    if stats is not None and hasattr(stats, name):
        setattr(stats, name, value)


class ConsumeLoop:
    """One consumer group member running a :class:`Handler`, at least once, until :meth:`stop`.

    ``consumer`` (a confluent-kafka ``Consumer`` or anything with ``subscribe``,
    ``consume``, ``commit``, ``assignment``, ``pause``, ``resume``, ``close``)
    and ``producer_factory`` (for dead letters; called at the first one) may be
    set after construction. ``stats``: any object; the loop keeps its fields
    ``consumed``, ``deadletters``, ``commits``, ``write_failures``, ``pending``,
    ``pending_since_ns``, ``last_commit_ns``, ``last_error`` and ``assigned``
    current where it has them.
    """

    def __init__(self, handler: Any, *, deadletter_topic: str, settings: LoopSettings = LoopSettings(),
                 consumer: Any = None, producer_factory: Callable[[], Any] | None = None,
                 stats: Any = None, component: str = "consumer",
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.handler = handler
        self.deadletter_topic = deadletter_topic
        self.settings = settings
        self.consumer = consumer
        self._producer_factory = producer_factory
        self.producer: Any = None
        self.stats = stats
        self.component = component
        self._clock = clock
        self._sleep = sleep
        self.batch = Batch()
        self.stopping = threading.Event()
        self.stop_at: float | None = None
        self.paused: list[Any] = []
        self._writing = False
        self.closing = False
        self.failures = 0

    def _hook(self, name: str) -> Callable[..., Any]:
        return getattr(self.handler, name, None) or getattr(_DefaultHooks, name)

    # -- lifecycle -----------------------------------------------------------------------
    def stop(self) -> None:
        if not self.stopping.is_set():
            self.stop_at = self._clock()
            self.stopping.set()

    def deadline(self) -> float | None:
        return None if self.stop_at is None else self.stop_at + self.settings.shutdown_timeout_s

    def subscribe(self, topics: Sequence[str]) -> None:
        self.consumer.subscribe(list(topics), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)

    def run(self, topics: Sequence[str] | None = None, on_ready: Callable[[], None] | None = None) -> None:
        """Subscribe (when ``topics``), then consume and write until stopped; the last write on the way out."""
        if topics is not None:
            self.subscribe(topics)
        if on_ready is not None:
            on_ready()
        while not self.stopping.is_set():
            self.step()
        self.flush()

    def step(self) -> None:
        """One turn: poll, let the handler's clock tick, write when due."""
        self.poll(self._poll_timeout())
        self._hook("tick")()
        if self.due():
            self.flush()

    def close(self) -> None:
        """Leave the group (a revoke now commits nothing) and flush the dead-letter producer."""
        self.closing = True
        try:
            if self.consumer is not None:
                consumer, self.consumer = self.consumer, None
                consumer.close()
        except Exception as exc:  # KafkaException, RuntimeError
            log.warning("closing the consumer: %s", exc)
        if self.producer is not None:
            try:
                self.producer.flush(2.0)
            except Exception as exc:  # noqa: BLE001
                log.warning("flushing dead letters: %s", exc)
            self.producer = None

    # -- consuming ---------------------------------------------------------------------------
    def _poll_timeout(self) -> float:
        started = self.batch.started_at
        if started is None:
            return self.settings.idle_slice_s
        left = started + self.settings.flush_interval_s - self._clock()
        return max(0.0, min(self.settings.idle_slice_s, left))

    def poll(self, timeout_s: float) -> int:
        """Read what is there (up to ``max_poll_messages``, waiting at most ``timeout_s``) into the batch."""
        from confluent_kafka import KafkaError, KafkaException

        n = 0
        for msg in self.consumer.consume(self.settings.max_poll_messages, timeout_s):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.fatal():
                    raise KafkaException(err)
                _set(self.stats, "last_error", f"kafka: {err.str()}")
                log.warning("Kafka consumer: %s", err.str())
                continue
            self.handle(msg)
            n += 1
        return n

    def handle(self, msg: Any) -> Entry:
        """Decode one message into the batch, or queue its dead letter."""
        from eroica.runtime import metrics

        entry = Entry(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value())
        _bump(self.stats, "consumed")
        metrics.records_in(self.component, entry.topic)
        try:
            entry.value, entry.size = self.handler.decode(msg)
        except Exception as exc:  # Rejected, or anything else: dead-lettered, committed past, never a crash loop
            self._reject(entry, str(exc) if isinstance(exc, Rejected) else f"processing failed: {failure_reason(exc)}")
        if not self.batch.entries:
            _set(self.stats, "pending_since_ns", time.time_ns())
        self.batch.add(entry, self._clock())
        _set(self.stats, "pending", len(self.batch))
        return entry

    def _reject(self, entry: Entry, reason: str) -> None:
        from eroica.runtime import metrics

        entry.reject(reason)
        metrics.invalid(self.component, reason)
        log.warning("dead letter %s[%d]@%d: %s", entry.topic, entry.partition, entry.offset, reason)
        self._hook("on_rejected")(entry)
        self._send_deadletters([entry], flush_s=0.0, strict=False)

    def due(self) -> bool:
        b = self.batch
        if self._hook("has_work")():
            return True
        if b.started_at is None:
            return False
        return b.size >= self.settings.batch_size or self._clock() - b.started_at >= self.settings.flush_interval_s

    # -- writing and committing -------------------------------------------------------------------
    def flush(self) -> bool:
        """Write the batch, deliver its dead letters, commit its offsets; True once committed.

        Retries :class:`Retry` failures with backoff, partitions paused, until the
        write succeeds, the batch is revoked by a rebalance, or (stopping) the
        shutdown deadline passes.
        """
        batch = self.batch
        if not batch.entries and not self._hook("has_work")():
            return True
        self._writing = True
        try:
            while batch is self.batch:
                try:
                    self.write_once(batch)
                    break
                except Retry as exc:
                    self.failures += 1
                    _bump(self.stats, "write_failures")
                    _set(self.stats, "last_error", str(exc))
                    self._hook("on_write_failed")(exc, self.failures)
                    self.pause()
                    delay = self.settings.backoff(self.failures)
                    deadline = self.deadline()
                    if deadline is not None and self._clock() + delay > deadline:
                        log.warning("stopping with %d message(s) not written; they stay uncommitted and are "
                                    "read again at the next start", len(batch))
                        self._hook("on_gave_up")(batch)
                        return False
                    self.idle(delay)
            if batch is not self.batch:
                return False  # revoked meanwhile: the next owner reads it again
            self.failures = 0
            self.commit(batch)
            self.batch = Batch()
            return True
        finally:
            self._writing = False
            _set(self.stats, "pending", len(self.batch))
            if not self.batch.entries:
                _set(self.stats, "pending_since_ns", None)
            self.resume()

    def write_once(self, batch: Batch) -> None:
        """The handler's write, then the dead letters; Retry if either must wait."""
        self.handler.write(batch)
        for e in batch.deadletters():
            if e.deadletter_state is None:  # rejected by the write itself
                self._hook("on_rejected")(e)
        self._send_deadletters(batch.deadletters(), flush_s=self.settings.deadletter_flush_s, strict=True)

    def _send_deadletters(self, entries: list[Entry], *, flush_s: float, strict: bool) -> None:
        pending = [e for e in entries if e.deadletter_state != "delivered"]
        if not pending:
            return
        if self.producer is None:
            if self._producer_factory is None:
                raise RuntimeError("dead letters to send and no producer")
            self.producer = self._producer_factory()

        def report(e: Entry) -> Callable[[Any, Any], None]:
            def cb(err: Any, _msg: Any) -> None:
                e.deadletter_state = "delivered" if err is None else "failed"
                if err is None:
                    _bump(self.stats, "deadletters")
            return cb

        for e in pending:
            if e.deadletter_state in (None, "failed"):
                e.deadletter_state = "inflight"
                try:
                    self.producer.produce(self.deadletter_topic, e.deadletter, e.key, on_delivery=report(e))
                except Exception as exc:  # BufferError, KafkaException
                    e.deadletter_state = "failed"
                    if strict:
                        raise Retry(f"dead-letter topic {self.deadletter_topic}: {exc}", downstream=False) from exc
                    _set(self.stats, "last_error", f"dead letter: {exc}")
        if flush_s:
            self.producer.flush(flush_s)
        else:
            self.producer.poll(0)
        if strict:
            undelivered = [e for e in pending if e.deadletter_state != "delivered"]
            if undelivered:
                raise Retry(f"{len(undelivered)} dead letter(s) not delivered to {self.deadletter_topic}",
                            downstream=False)

    def commit(self, batch: Batch) -> bool:
        """Synchronously commit exactly the batch's offsets (called only after its write)."""
        from confluent_kafka import TopicPartition

        from eroica.runtime import metrics

        if not batch.offsets or self.consumer is None:
            return True
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(batch.offsets.items())]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except Exception as exc:  # KafkaException
            # Written already: an uncommitted offset only means it is read and written again (idempotent).
            _set(self.stats, "last_error", f"commit: {exc}")
            log.warning("offset commit failed (%s); the batch will be read and written again, idempotently", exc)
            return False
        _bump(self.stats, "commits")
        _set(self.stats, "last_commit_ns", time.time_ns())
        metrics.offset_commit(self.component)
        return True

    # -- back-pressure --------------------------------------------------------------------------
    def pause(self) -> None:
        """Pause every assigned partition (once): polling goes on, fetching stops."""
        if self.consumer is None or self.paused:
            return
        try:
            self.paused = list(self.consumer.assignment())
            if self.paused:
                self.consumer.pause(self.paused)
        except Exception as exc:  # KafkaException
            log.warning("pausing partitions: %s", exc)
            self.paused = []

    def resume(self) -> None:
        if self.consumer is None or not self.paused:
            return
        try:
            self.consumer.resume(self.paused)
        except Exception as exc:  # KafkaException
            log.warning("resuming partitions: %s", exc)
        self.paused = []

    def idle(self, seconds: float) -> None:
        """Wait while staying a live group member (poll serves rebalances); early out past the deadline."""
        end = self._clock() + seconds
        while True:
            now = self._clock()
            deadline = self.deadline()
            if now >= end or (deadline is not None and now >= deadline):
                return
            if self.consumer is not None:
                self.poll(min(self.settings.idle_slice_s, end - now))
            else:
                self._sleep(min(self.settings.idle_slice_s, end - now))

    # -- rebalance callbacks (run inside consume) ---------------------------------------------------
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        _set(self.stats, "assigned", sorted(f"{p.topic}[{p.partition}]" for p in partitions))
        log.info("assigned %s", ", ".join(f"{p.topic}[{p.partition}]" for p in partitions) or "nothing")
        self._hook("on_assign")(partitions)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        """Write and commit what we hold while we may still commit it (once, no retry); else drop it."""
        if (not self._writing and not self.closing and self.batch.entries
                and self._hook("can_write_in_rebalance")()):
            try:
                self.write_once(self.batch)
                self.commit(self.batch)
                self.batch = Batch()
            except Retry as exc:
                log.warning("rebalance while the write must wait (%s): the batch is left for re-reading", exc)
        self._drop([(p.topic, p.partition) for p in partitions])
        self._hook("on_revoke")(partitions)
        _set(self.stats, "assigned", [])

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self._drop([(p.topic, p.partition) for p in partitions])
        self._hook("on_revoke")(partitions)
        _set(self.stats, "assigned", [])

    def _drop(self, partitions: list[tuple[str, int]]) -> None:
        gone = set(partitions)
        self.paused = [p for p in self.paused if (p.topic, p.partition) not in gone]
        if self.batch.drop_partitions(gone):
            # A new object, so a flush in progress sees that its batch was revoked.
            remaining, self.batch = self.batch, Batch()
            for e in remaining.entries:
                self.batch.add(e, remaining.started_at if remaining.started_at is not None else self._clock())
        _set(self.stats, "pending", len(self.batch))
        if not self.batch.entries:
            _set(self.stats, "pending_since_ns", None)
