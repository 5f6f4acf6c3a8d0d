"""Topic administration, in one place: waiting for a broker, creating topics.

Every part that creates topics (``eroica up``, the stream workers, the sink,
the alert consumer, ``eroica replay``) calls :func:`create_topics` here with
a :class:`~eroica.kafka.config.KafkaConfig` (or a bare bootstrap
string, which means plaintext with the defaults), so topics get the same
partitioning, replication and configs, over the same TLS/SASL connection as
everything else (:mod:`eroica.kafka.client`).

It also guards the topic renames of issue 14 (``eroica.summaries`` ->
``eroica.digests``, ``eroica.patterns`` -> ``eroica.window-summaries``): when
a process creates a renamed topic while the topic of its former name still
holds messages, :func:`legacy_topics_with_data` finds it and a warning is
logged, so an upgraded deployment never silently reads an empty topic.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Mapping
from typing import Any

from .client import admin_conf
from .config import KafkaConfig
from eroica.models.limits import MAX_VERDICT_BYTES

__all__ = ["BrokerError", "LARGE_MESSAGES", "admin_client", "wait_for_broker", "create_topics", "ensure_topics", "EndOffsets",
           "legacy_topics_with_data"]

log = logging.getLogger("eroica.kafka")

DEFAULT_WAIT_S = 20.0


class BrokerError(RuntimeError):
    """The broker could not be found, started, reached or configured."""


def _config(target: str | KafkaConfig) -> KafkaConfig:
    return target if isinstance(target, KafkaConfig) else KafkaConfig(bootstrap=target)


def admin_client(target: str | KafkaConfig, **conf: Any) -> Any:
    """A quiet confluent-kafka AdminClient (no librdkafka log while a broker is starting)."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(admin_conf(_config(target), **conf))


def wait_for_broker(target: str | KafkaConfig, timeout_s: float = DEFAULT_WAIT_S) -> None:
    """Return once a Kafka metadata request succeeds; BrokerError after ``timeout_s``.

    The bootstrap may list several ``host:port``: one that accepts a connection
    is enough, as for any Kafka client.
    """
    config = _config(target)
    bootstrap = config.bootstrap
    addresses = [a.strip().rpartition(":") for a in bootstrap.split(",") if a.strip()]
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            for i, (host, _, port) in enumerate(addresses):
                try:
                    with socket.create_connection((host, int(port)), timeout=0.5):
                        break
                except OSError:
                    if i == len(addresses) - 1:
                        raise
            admin_client(config).list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
            return
        except Exception as exc:  # refused socket or KafkaException: not up yet
            last = exc
            time.sleep(0.05)
    raise BrokerError(f"no Kafka broker answered a metadata request at {bootstrap} within {timeout_s:.0f} s: {last}")


# Topic config for Eroica's own topics: a job window's window summaries and a partition's digest
# grow with the job's ranks (~6.3 and ~11 KB a rank: `eroica bench live`) past Kafka's default
# 1 MiB `message.max.bytes` at ~160 ranks; the sink's bound on such a message is the ceiling.
LARGE_MESSAGES = {"max.message.bytes": str(MAX_VERDICT_BYTES)}


def create_topics(target: str | KafkaConfig, topics: Mapping[str, int], timeout_s: float = 15.0,
                  replication_factor: int = -1, config: Mapping[str, str] | None = None) -> None:
    """Create topics with the given partition counts; topics that already exist are fine.

    Explicit creation matters because auto-created topics (tansu: 4 partitions;
    real Kafka: whatever ``num.partitions`` says, or refused) would not have the
    partitioning the pipeline expects. ``replication_factor=-1`` takes the
    broker's ``default.replication.factor`` (CreateTopics v4+; tansu accepts it
    too): 1 on tansu and a one-node Kafka, 3 on the three-node test cluster,
    whatever production configured. ``config``: topic configs of new topics
    (e.g. ``retention.ms``); an existing topic keeps its own.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    if not topics:
        return
    kafka = _config(target)
    admin = admin_client(kafka)
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=int(p), replication_factor=replication_factor,
                  config=dict(config or {}))
         for name, p in topics.items()],
        operation_timeout=timeout_s, request_timeout=timeout_s)
    failed = []
    for name, fut in futures.items():
        # exception(), not result(): a raised error would tie this frame (and
        # its AdminClient) into a reference cycle, and the open connection it
        # keeps would stop tansu from exiting on SIGTERM until a GC pass.
        try:
            err = fut.exception(timeout=timeout_s)
        except Exception as exc:  # concurrent.futures.TimeoutError
            failed.append(f"{name}: {type(exc).__name__} {exc}")
            continue
        if err is None:
            continue
        kerr = err.args[0] if isinstance(err, KafkaException) and err.args else None
        if isinstance(kerr, KafkaError) and kerr.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            continue
        failed.append(f"{name}: {kerr or err}")
    if failed:
        raise BrokerError(f"could not create topics on {kafka.bootstrap}: " + "; ".join(failed))
    renamed = {new: old for new, old in kafka.legacy_topic_names().items() if new in topics}
    for new, (old, messages) in legacy_topics_with_data(kafka, renamed, admin=admin).items():
        log.warning("topic %s (the former name of %s, issue 14) still holds %d message(s) but this process uses %s: "
                    "set the topic variable to %s to keep reading it (see kafka/config.py), or let it drain "
                    "before upgrading", old, new, messages, new, old)


def legacy_topics_with_data(target: str | KafkaConfig, renamed: Mapping[str, str], *, admin: Any = None,
                            timeout_s: float = 5.0) -> dict[str, tuple[str, int]]:
    """New name -> (former name, messages on it) for each former-named topic that exists and holds messages.

    ``renamed`` maps a topic's current name to its former one
    (:meth:`KafkaConfig.legacy_topic_names`). Messages are counted from the
    watermarks (high - low per partition; tansu's high watermarks may be low,
    so there a non-empty topic can count fewer). Never raises: a broker that
    does not answer gives an empty answer.
    """
    if not renamed:
        return {}
    kafka = _config(target)
    try:
        from confluent_kafka import Consumer, TopicPartition

        from .client import _NullLogger, consumer_conf

        meta = (admin or admin_client(kafka)).list_topics(timeout=timeout_s)
        present = {old: meta.topics[old] for old in renamed.values() if old in meta.topics}
        if not present:
            return {}
        consumer = Consumer(consumer_conf(kafka, "legacy-topics", f"{kafka.client_id}-legacy-topics",
                                          logger=_NullLogger()))
        try:
            out = {}
            for new, old in renamed.items():
                if old not in present:
                    continue
                n = 0
                for p in present[old].partitions:
                    lo, hi = consumer.get_watermark_offsets(TopicPartition(old, p), timeout=timeout_s, cached=False)
                    n += max(0, int(hi) - max(0, int(lo)))
                if n > 0:
                    out[new] = (old, n)
            return out
        finally:
            consumer.close()
    except Exception:  # a check, never a failure of the caller
        log.debug("legacy topic check failed", exc_info=True)
        return {}


def ensure_topics(kafka: KafkaConfig, names: Any, *, timeout_s: float = 10.0, log: Any = None) -> bool:
    """Create ``names`` (each with ``kafka.partitions``) plus the dead-letter topic; False (logged) on failure.

    For consumers: a subscription to a missing topic waits forever, but a
    broker that refuses creation (ACLs) may still hold the topics, so a
    failure is a warning and consuming goes on.
    """
    wanted = {n: kafka.partitions for n in (*names, kafka.deadletter_topic)}
    try:
        create_topics(kafka, wanted, timeout_s=timeout_s)
        return True
    except BrokerError as exc:
        if log is not None:
            log.warning("%s; consuming anyway", exc)
        return False


class EndOffsets:
    """The end offsets (high watermarks) of one topic's partitions, asked of the broker.

    A stream worker uses it to tell "no more input" from "input held up": a
    partition whose records it has all read is drained, one with records past
    its read position is not, and a broker that does not answer means the
    input may be held up (never "drained"). One librdkafka consumer, never
    subscribed and never committing (its group id is never joined), opened on
    first use. On tansu, whose reported high watermarks are too *low*, a
    partition only ever looks drained: no worse than not asking.
    """

    def __init__(self, config: KafkaConfig, topic: str, timeout_s: float = 2.0) -> None:
        self.config, self.topic, self.timeout_s = config, topic, timeout_s
        self._consumer: Any = None

    def __call__(self, partitions: list[int]) -> dict[int, int] | None:
        """Partition -> end offset; None when the broker did not answer (blocking: run it in a thread)."""
        from confluent_kafka import Consumer, TopicPartition

        from .client import _NullLogger, consumer_conf

        try:
            if self._consumer is None:
                conf = consumer_conf(self.config, "end-offsets", f"{self.config.client_id}-end-offsets",
                                     logger=_NullLogger())
                self._consumer = Consumer(conf)
            return {p: int(self._consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                                timeout=self.timeout_s, cached=False)[1])
                    for p in partitions}
        except Exception:  # KafkaException (broker away, timeout): the answer is "unknown"
            return None

    def close(self) -> None:
        if self._consumer is not None:
            try:
                self._consumer.close()
            finally:
                self._consumer = None
