"""A Kafka producer with a bounded local queue and an explicit queue-full policy.

librdkafka already batches (``linger.ms``), compresses and retries; what it
leaves to us is the question every telemetry producer must answer: *what
happens when the broker is away?* Messages pile up in librdkafka's local queue
until ``queue.buffering.max.messages`` / ``queue.buffering.max.kbytes`` (the
memory bound), then ``produce`` raises ``BufferError``. From there:

``block_timeout_s=None`` (replay: **block, never drop**)
    The caller waits, serving delivery reports, until there is room. It cannot
    wait forever: a message the broker has not acknowledged within
    ``delivery_timeout_ms`` fails, which frees room and is counted in
    ``stats.failed``; the replay aborts on the first failure, because a
    replay with holes (and end-of-stream markers that lie) is worse than none.

``block_timeout_s=0`` (live agent inside a training job: **drop the new message**)
    The training job must never stall on its telemetry, so a message that
    finds the queue full is dropped at once, counted in ``stats.dropped``, and
    reported by a warning (the first drop, then at most one every 10 s with
    the running count). librdkafka cannot evict an already-queued message, so
    it is the newest that goes, never the oldest.

``block_timeout_s=T > 0``
    Wait up to ``T`` seconds for room, then drop and count as above (for
    producers that can afford a short stall).

Delivery reports are served on the caller's thread (by ``publish``, ``poll``
and ``flush``), so the counters need no lock.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from types import TracebackType

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from eroica.runtime import metrics

from .config import KafkaConfig

log = logging.getLogger(__name__)

DROP_WARNING_INTERVAL_S = 10.0
_BLOCK_POLL_S = 0.05


@dataclass
class PublisherStats:
    """Counters of one publisher; ``produced - delivered - failed`` are still in flight."""

    produced: int = 0  # accepted into the local queue
    delivered: int = 0  # acknowledged by the broker
    failed: int = 0  # delivery reported an error (timeout, purged at close) or produce refused it
    refused: int = 0  # part of ``failed``: produce() refused the message, it never queued
    dropped: int = 0  # never queued: the queue stayed full past the block timeout
    delivered_bytes: int = 0  # value bytes acknowledged (before compression)
    # Records carried by the messages (publish(..., records=N)): what the broker acknowledged, and
    # what failed or was refused/dropped; the rest is still in flight.
    delivered_records: int = 0
    failed_records: int = 0
    blocked_s: float = 0.0  # time callers spent waiting for queue room
    last_error: str | None = None

    @property
    def in_flight(self) -> int:
        return self.produced - self.delivered - self.failed + self.refused


class FramePublisher:
    """Publishes opaque messages (frames, dead letters) with counted outcomes.

    Use :meth:`for_replay` or :meth:`for_live_agent` rather than choosing
    ``block_timeout_s`` by hand; ``producer_conf`` overrides any librdkafka
    setting (tests use it to shrink the queue).
    """

    def __init__(self, config: KafkaConfig, *, block_timeout_s: float | None = None,
                 client_id: str = "eroica", producer_conf: dict | None = None) -> None:
        self.config = config
        self.block_timeout_s = block_timeout_s
        self.stats = PublisherStats()
        self._last_drop_warning = float("-inf")
        self._closed = False
        from .client import producer_conf as base_conf

        role = client_id.removeprefix("eroica-") if client_id.startswith("eroica-") else client_id
        # idempotent, acks=all: no duplicates or reordering on retry (client.py)
        conf = base_conf(config, role)
        conf.update({
            "compression.type": config.compression,
            "linger.ms": config.linger_ms,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": config.queue_max_messages,
            "queue.buffering.max.kbytes": config.queue_max_kbytes,
            "message.timeout.ms": config.delivery_timeout_ms,
            "on_delivery": self._on_delivery,
            "error_cb": self._on_error,
        })
        conf.update(producer_conf or {})
        self._producer = Producer(conf)

    @classmethod
    def for_replay(cls, config: KafkaConfig, **kwargs: object) -> "FramePublisher":
        """Block while the queue is full; never drop (failures abort the replay instead)."""
        return cls(config, block_timeout_s=None, client_id="eroica-replay", **kwargs)  # type: ignore[arg-type]

    @classmethod
    def for_live_agent(cls, config: KafkaConfig, **kwargs: object) -> "FramePublisher":
        """Never block the training job: drop (and count) what the full queue cannot take."""
        return cls(config, block_timeout_s=0.0, client_id="eroica-agent", **kwargs)  # type: ignore[arg-type]

    # -- callbacks (run inside poll/flush on the caller's thread) --

    counts_records = True  # publish() takes records=N (replay uses it to report delivered records)

    def _on_delivery(self, err: KafkaError | None, msg: Message, records: int = 0) -> None:
        if err is None:
            self.stats.delivered += 1
            self.stats.delivered_bytes += len(msg.value() or b"")
            self.stats.delivered_records += records
        else:
            self.stats.failed_records += records
            self.stats.failed += 1
            self.stats.last_error = f"{msg.topic()}: {err.str()}"
            if self.stats.failed == 1:
                log.warning("Kafka delivery failed: %s", self.stats.last_error)

    def _on_error(self, err: KafkaError) -> None:
        self.stats.last_error = err.str()
        if err.fatal():
            log.error("Kafka producer fatal error: %s", err.str())

    # -- publishing --

    def publish(self, topic: str, value: bytes, key: str | bytes | None = None, *, records: int = 0) -> bool:
        """Queue one message; False when it was dropped or refused (counted in stats).

        ``records``: how many records the message carries, for the delivered/failed record counts.
        """
        if self._closed:
            raise RuntimeError("publisher is closed")
        queued = self._try_produce(topic, value, key, records)
        if queued is not None:
            return queued
        if self.block_timeout_s is not None and self.block_timeout_s <= 0:
            self._drop(topic)
            self.stats.failed_records += records
            return False
        start = time.monotonic()
        deadline = None if self.block_timeout_s is None else start + self.block_timeout_s
        try:
            while True:
                self._producer.poll(_BLOCK_POLL_S)
                queued = self._try_produce(topic, value, key, records)
                if queued is not None:
                    return queued
                if deadline is not None and time.monotonic() >= deadline:
                    self._drop(topic)
                    self.stats.failed_records += records
                    return False
        finally:
            self.stats.blocked_s += time.monotonic() - start

    def _try_produce(self, topic: str, value: bytes, key: str | bytes | None, records: int = 0) -> bool | None:
        """True if queued, None if the queue is full, False if refused outright (counted as failed)."""
        try:
            if records:
                self._producer.produce(topic, value, key,
                                       on_delivery=lambda err, msg: self._on_delivery(err, msg, records))
            else:
                self._producer.produce(topic, value, key)
        except BufferError:
            return None
        except KafkaException as exc:  # e.g. MSG_SIZE_TOO_LARGE: retrying cannot help
            self.stats.failed += 1
            self.stats.refused += 1
            self.stats.failed_records += records
            self.stats.last_error = f"{topic}: {exc.args[0].str() if exc.args else exc}"
            log.warning("Kafka refused a message: %s", self.stats.last_error)
            return False
        self.stats.produced += 1
        self._producer.poll(0)
        return True

    def _drop(self, topic: str) -> None:
        self.stats.dropped += 1
        metrics.queue_drop("publisher")  # eroica_producer_queue_drops_total (runtime/metrics.py)
        now = time.monotonic()
        if now - self._last_drop_warning >= DROP_WARNING_INTERVAL_S:
            self._last_drop_warning = now
            log.warning("Kafka producer queue full (broker %s unreachable or slow): dropped message "
                        "for %s; %d dropped so far", self.config.bootstrap, topic, self.stats.dropped)

    def poll(self, timeout_s: float = 0.0) -> int:
        """Serve delivery reports; returns how many were served."""
        return self._producer.poll(timeout_s)

    @property
    def queued(self) -> int:
        """Messages in the local queue or in flight to the broker."""
        return len(self._producer)

    def flush(self, timeout_s: float = 30.0) -> int:
        """Wait for every queued message to be delivered or fail; returns how many remain."""
        return self._producer.flush(timeout_s)

    def close(self, timeout_s: float = 30.0) -> PublisherStats:
        """Flush up to ``timeout_s``, purge what is left (counted as failed), release connections.

        ``Producer.close()`` alone would flush without a bound when the broker
        is gone; an open connection also keeps tansu from stopping on SIGTERM.
        """
        if not self._closed:
            self._closed = True
            remaining = self.flush(timeout_s)
            if remaining:
                log.warning("Kafka producer closing with %d undelivered messages (purged)", remaining)
                self._producer.purge(in_queue=True, in_flight=True, blocking=False)
                self._producer.flush(0)
            self._producer.close()
        return self.stats

    def __enter__(self) -> "FramePublisher":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(timeout_s=30.0 if exc_type is None else 1.0)
