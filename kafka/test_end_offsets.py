"""EndOffsets through a broker SIGKILL and restart (Apache Kafka, one KRaft node of the test's own).

The summariser probes the broker with it every second to learn of outages
(``streams/cores/summariser_core.py`` ``InputDrain``): it must say "no answer"
while the broker is down, not block past its timeout, and answer again with
the same end offsets once the broker is back (librdkafka reconnects by itself;
the probe's client is never rebuilt).
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from eroica.kafka.admin import EndOffsets, create_topics
from eroica.kafka.config import KafkaConfig


@pytest.fixture
def own_broker(apache_kafka_installed: None, tmp_path):
    from eroica.stack.apache_kafka import KafkaCluster

    cluster = KafkaCluster(1, data_dir=tmp_path / "kafka")
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)


def test_end_offsets_say_unknown_while_the_broker_is_down_and_recover(own_broker) -> None:
    config = KafkaConfig(bootstrap=own_broker.bootstrap)
    create_topics(config, {"probe": 1}, timeout_s=30)
    producer = Producer({"bootstrap.servers": own_broker.bootstrap, "acks": "all"})
    for i in range(3):
        producer.produce("probe", value=b"x%d" % i)
    assert producer.flush(30) == 0
    del producer  # no reconnect noise from it while the broker is down
    probe = EndOffsets(config, "probe", timeout_s=1.0)
    try:
        assert probe([0]) == {0: 3}
        own_broker.kill(0)
        t0 = time.monotonic()
        assert probe([0]) is None
        assert time.monotonic() - t0 < 5.0, "a probe of a dead broker must not block past its timeout"
        own_broker.restart(0)
        deadline = time.monotonic() + 60
        ends = None
        while ends is None and time.monotonic() < deadline:
            ends = probe([0])
        assert ends == {0: 3}, "the probe never saw the broker again"
    finally:
        probe.close()
