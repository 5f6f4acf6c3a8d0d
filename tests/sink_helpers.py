"""Helpers for the sink worker's integration tests (real broker, real ClickHouse).

Not a test module: imported by ``sinks/clickhouse/test_worker*.py`` and the
CLI tests (``tests`` is on sys.path through the root conftest).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eroica.kafka.config import KafkaConfig
from eroica.sinks.clickhouse import ClickHouseConfig, RetryPolicy
from eroica.sinks.clickhouse.worker import SinkWorker
from eroica.sinks.clickhouse.worker_config import SinkWorkerConfig

# tansu's JoinGroup waits half the session timeout: a short one keeps each
# worker start near a second (real Kafka would refuse < 6 s; tests use tansu).
TEST_SESSION_TIMEOUT_MS = int(os.environ.get("EROICA_TEST_SESSION_TIMEOUT_MS", "2000"))
PARTITIONS = 2


def wait_for(pred: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition",
             interval_s: float = 0.1) -> Any:
    """Poll ``pred`` until truthy (returned); AssertionError naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what} (last: {last!r})")


def kafka_for(bootstrap: str, prefix: str) -> KafkaConfig:
    return KafkaConfig(bootstrap=bootstrap, partitions=PARTITIONS).with_topic_prefix(prefix)


def worker_config(kafka: KafkaConfig, clickhouse: ClickHouseConfig, **kw: Any) -> SinkWorkerConfig:
    """A worker on the test's own topics and a fresh group, flushing often, failing fast."""
    base: dict[str, Any] = dict(
        kafka=kafka,
        clickhouse=clickhouse.replace(retry=RetryPolicy(attempts=1, initial_s=0.1, max_s=0.5, deadline_s=1.0)),
        group_id=f"sink-{uuid.uuid4().hex[:8]}",
        flush_interval_s=0.1,
        session_timeout_ms=TEST_SESSION_TIMEOUT_MS,
        shutdown_timeout_s=3.0,
    )
    base.update(kw)
    return SinkWorkerConfig(**base)


@contextmanager
def running_worker(config: SinkWorkerConfig, **kw: Any) -> Iterator[SinkWorker]:
    """A SinkWorker in a thread, assigned its partitions; stopped (and checked) on exit."""
    worker = SinkWorker(config, **kw)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="sink-worker", daemon=True)
    thread.start()
    try:
        wait_for(lambda: errors or worker.stats.assigned, 30, "the worker to get its partitions")
        if errors:
            raise errors[0]
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "sink worker did not stop"
    if errors:
        raise errors[0]


def publish(bootstrap: str, topic: str, messages: Sequence[tuple[bytes | None, bytes | None]],
            per_s: float | None = None) -> list[tuple[int, int]]:
    """Produce (key, value) pairs; returns each one's (partition, offset) in order."""
    from confluent_kafka import Producer

    positions: list[tuple[int, int] | None] = [None] * len(messages)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    t0 = time.monotonic()
    for i, (key, value) in enumerate(messages):
        def cb(err: Any, msg: Any, i: int = i) -> None:
            assert err is None, err
            positions[i] = (msg.partition(), msg.offset())

        producer.produce(topic, value, key, on_delivery=cb)
        producer.poll(0)
        if per_s:
            ahead = t0 + (i + 1) / per_s - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
                producer.poll(0)
    assert producer.flush(30) == 0
    assert all(p is not None for p in positions)
    return positions  # type: ignore[return-value]


def end_offsets(positions: Sequence[tuple[int, int]]) -> dict[int, int]:
    """Per partition, the offset after the last message (what a full commit must equal)."""
    out: dict[int, int] = {}
    for p, o in positions:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def committed(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> dict[int, int]:
    """The group's committed offsets on ``topic`` (partitions without one are left out)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        c.close()
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def sink_subprocess(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``eroica sink`` as a child process (its own session), output to ``log``."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "eroica.cli", "sink", "--log-level", "info"],
                                env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def sink_env(config: SinkWorkerConfig, clickhouse_url: str, http_port: int) -> dict[str, str]:
    """The environment that makes ``eroica sink`` equal to ``config`` (the documented variables)."""
    k = config.kafka
    ch = config.clickhouse
    return {
        "EROICA_KAFKA_BOOTSTRAP": k.bootstrap,
        "EROICA_KAFKA_TOPIC_VERDICTS": k.verdicts_topic,
        "EROICA_KAFKA_TOPIC_DEADLETTER": k.deadletter_topic,
        "EROICA_KAFKA_TOPIC_WINDOW_SUMMARIES": k.window_summaries_topic,
        "EROICA_KAFKA_PARTITIONS": str(k.partitions),
        "EROICA_SINK_GROUP": config.group_id,
        "EROICA_SINK_FLUSH_MS": str(int(config.flush_interval_s * 1000)),
        "EROICA_SINK_HTTP_PORT": str(http_port),
        "EROICA_SINK_SESSION_TIMEOUT_MS": str(config.session_timeout_ms),
        "EROICA_CLICKHOUSE_URL": clickhouse_url,
        "EROICA_CLICKHOUSE_DATABASE": ch.database,
        "EROICA_CLICKHOUSE_BATCH_SIZE": str(ch.batch_size),
        "EROICA_CLICKHOUSE_RETRY_INITIAL_S": "0.1",
        "EROICA_CLICKHOUSE_RETRY_MAX_S": "0.5",
    }


def clickhouse_url(config: ClickHouseConfig) -> str:
    """The URL form of a test config (its database is passed separately)."""
    if config.backend == "chdb":
        return f"chdb://{config.chdb_path}"
    return f"clickhouse://{config.host}:{config.port}/{config.database}"


def stop_stack(up: subprocess.Popen) -> None:
    """End an ``eroica up`` child: SIGTERM and a minute to stop cleanly, then kill its group."""
    if up.poll() is None:
        up.send_signal(signal.SIGTERM)
    try:
        up.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(up.pid, signal.SIGKILL)
