"""The pipeline on Apache Kafka (KRaft), started from the jars of ``.ci/install-kafka.sh``.

- the pom and the launcher agree on the version;
- one node: a confluent-kafka produce/consume round trip, topics created with
  the broker's replication factor (1), ``eroica up --broker kafka`` usage errors;
- three nodes (replication factor 3, ``min.insync.replicas=2``): Eroica's topics
  get 3 replicas; ``eroica up --kafka`` on the cluster with the leader of the raw
  topic's partition SIGKILLed mid-replay still stores exactly the verdict ids of
  ``eroica analyze``, each once.

The whole-stack test on one node is the ``kafka`` case of
``tests/test_streaming_equals_batch.py``. Without java or the jars these skip
locally and fail under ``CI`` (``kafka_fixtures.py``). Timings are printed
(``-s``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from kafka_fixtures import consume
from sink_helpers import stop_stack, wait_for

ROOT = Path(__file__).resolve().parents[1]
FAST_ENV = {"EROICA_SINK_SESSION_TIMEOUT_MS": "6000", "EROICA_SINK_FLUSH_MS": "100"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA"))}
    return {**env, **FAST_ENV}


def _eroica(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "eroica.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def test_pom_and_launcher_pin_the_same_kafka_version() -> None:
    from eroica.stack.apache_kafka import KAFKA_VERSION

    pom = (ROOT / "deploy" / "kafka" / "pom.xml").read_text()
    assert re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom).group(1) == KAFKA_VERSION  # type: ignore[union-attr]
    installer = (ROOT / ".ci" / "install-kafka.sh").read_text()
    assert "deploy/kafka/pom.xml" in installer and "kafka.version" in installer  # it reads the pom's version


def test_round_trip_on_one_node(kafka_broker, kafka_names) -> None:
    from confluent_kafka import Producer
    from eroica.kafka.admin import create_topics
    from eroica.stack.tansu import _quiet_admin

    bootstrap = kafka_broker.bootstrap
    topic = kafka_names.topic("roundtrip")
    create_topics(bootstrap, {topic: 3})
    md = _quiet_admin(bootstrap).list_topics(topic, timeout=5)
    assert sorted(md.topics[topic].partitions) == [0, 1, 2]
    assert all(p.replicas == [1] for p in md.topics[topic].partitions.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "compression.type": "lz4"})
    sent = {f"k{i}".encode(): f"value {i}".encode() * 10 for i in range(300)}
    t0 = time.monotonic()
    for k, v in sent.items():
        producer.produce(topic, v, key=k)
    assert producer.flush(15) == 0
    got = consume(bootstrap, topic, 3, lambda msgs: len(msgs) >= len(sent), timeout_s=20)
    print(f"\nround trip of {len(sent)} messages on Apache Kafka: {time.monotonic() - t0:.2f} s; "
          f"broker started in {kafka_broker.start_seconds:.1f} s")
    assert {m.key(): m.value() for m in got} == sent and len(got) == len(sent)
    # Kafka's end offsets are right (tansu's are not: streaming-notes.md).
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": kafka_names.group()})
    try:
        ends = sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1] for p in range(3))
    finally:
        c.close()
    assert ends == len(sent)


def test_up_refuses_kafka_and_broker_together(tmp_path: Path) -> None:
    r = _eroica("up", "--data-dir", str(tmp_path), "--kafka", "127.0.0.1:1", "--broker", "kafka", timeout=30)
    assert r.returncode == 2 and "only one" in r.stderr


def test_three_nodes_replicate_eroicas_topics(kafka_cluster, kafka_names) -> None:
    from confluent_kafka.admin import ConfigResource
    from eroica.kafka.config import KafkaConfig
    from eroica.kafka.admin import create_topics
    from eroica.stack.tansu import _quiet_admin

    config = KafkaConfig(bootstrap=kafka_cluster.bootstrap, partitions=4).with_topic_prefix(kafka_names.prefix)
    create_topics(config.bootstrap, config.topics())
    admin = _quiet_admin(config.bootstrap)
    md = admin.list_topics(timeout=5)
    for topic in config.topics():
        parts = md.topics[topic].partitions
        assert len(parts) == 4 and all(sorted(p.replicas) == [1, 2, 3] for p in parts.values()), topic
    res = ConfigResource(ConfigResource.Type.TOPIC, config.raw_topic)

    def min_isr() -> str | None:
        try:  # the broker asked may not know the new topic yet (metadata propagates)
            return admin.describe_configs([res])[res].result(timeout=10)["min.insync.replicas"].value
        except Exception:
            return None

    assert wait_for(min_isr, 20, "the raw topic's configuration", interval_s=0.2) == "2"


def test_a_killed_node_rejoins_and_acks_all_needs_two_live_replicas(kafka_cluster, kafka_names) -> None:
    from confluent_kafka import Producer
    from eroica.kafka.admin import create_topics
    from eroica.stack.tansu import _quiet_admin

    topic = kafka_names.topic("isr")
    create_topics(kafka_cluster.bootstrap, {topic: 1})
    victim = kafka_cluster.leader(topic, 0)

    def produce(n: int, start: int) -> None:
        p = Producer({"bootstrap.servers": kafka_cluster.bootstrap_of_live(), "acks": "all",
                      "enable.idempotence": True, "message.timeout.ms": 20000})
        for i in range(start, start + n):
            p.produce(topic, f"m{i}".encode())
        assert p.flush(25) == 0

    produce(50, 0)
    t0 = time.monotonic()
    kafka_cluster.kill(victim)
    produce(50, 50)  # two of three replicas in sync: acks=all still succeeds (min.insync.replicas=2)
    during = time.monotonic() - t0
    kafka_cluster.restart(victim)
    rejoined = wait_for(lambda: (p := _quiet_admin(kafka_cluster.bootstrap).list_topics(topic, timeout=5)
                                 .topics[topic].partitions[0]) and len(p.isrs) == 3 and p, 60,
                        "the restarted node back in the ISR", interval_s=0.3)
    print(f"\nproduce across a leader kill: {during:.1f} s; node {victim + 1} back in the ISR "
          f"{time.monotonic() - t0:.1f} s after the kill")
    assert victim + 1 in rejoined.isrs
    msgs = consume(kafka_cluster.bootstrap, topic, 1, lambda m: len(m) >= 100, timeout_s=20)
    assert [m.value() for m in msgs] == [f"m{i}".encode() for i in range(100)]


@pytest.fixture
def sim_run(tmp_path: Path) -> tuple[Path, list[dict]]:
    """A small two-fault run and ``eroica analyze``'s verdicts of it."""
    run = tmp_path / "run.jsonl"
    sim = _eroica("simulate", "--nodes", "2", "--gpus", "4", "--steps", "60", "--seed", "21", "--job", "kk-job",
                  "--fault", "gpu_throttle:rank=6", "--fault", "nic:node=1,nic=1", "-o", str(run))
    assert sim.returncode == 0, sim.stderr
    batch = _eroica("analyze", str(run), "--format", "json")
    assert batch.returncode == 0, batch.stderr
    verdicts = json.loads(batch.stdout)
    assert {"gpu", "nic"} <= {v["component"] for v in verdicts if v["confidence"] >= 0.5}
    return run, verdicts


def test_partition_leader_killed_mid_replay_loses_and_doubles_nothing(kafka_cluster, sim_run, tmp_path: Path) -> None:
    run, verdicts = sim_run
    expected = [v["verdict_id"] for v in verdicts]
    data = tmp_path / "stack"
    log_path = tmp_path / "up.log"
    log = open(log_path, "wb")
    t_up = time.monotonic()
    up = subprocess.Popen([sys.executable, "-m", "eroica.cli", "up", "--data-dir", str(data), "--stop-timeout", "5",
                           "--kafka", kafka_cluster.bootstrap], stdout=log, stderr=subprocess.STDOUT, env=_env(),
                          start_new_session=True)
    replay = None
    try:
        def running() -> bool:
            if up.poll() is not None:
                raise AssertionError(log_path.read_text()[-3000:])
            return "stack up" in log_path.read_text()

        wait_for(running, 120, "eroica up", interval_s=0.25)
        t_ready = time.monotonic()
        raw = "eroica.raw"
        victim = kafka_cluster.leader(raw, 0)
        # ~20k records at 4,000/s: about 5 s of replay; the leader dies about 1.5 s in.
        replay = subprocess.Popen([sys.executable, "-m", "eroica.cli", "replay", "--kafka", kafka_cluster.bootstrap,
                                   "--rate", "4000", str(run)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=_env())
        time.sleep(1.5)
        assert replay.poll() is None, "the replay ended before the broker was killed: slow it down"
        t_kill = time.monotonic()
        kafka_cluster.kill(victim)
        new_leader = wait_for(lambda: (lead := kafka_cluster.leader(raw, 0)) != victim and lead + 1, 30,
                              "a new leader of the raw topic's partition 0", interval_s=0.2) - 1
        failover = time.monotonic() - t_kill
        out, err = replay.communicate(timeout=180)
        assert replay.returncode == 0, err[-3000:]
        input_end = time.monotonic()

        def stored() -> list[str]:
            r = _eroica("verdicts", "--data-dir", str(data), "--job", "kk-job", "--limit", "10000", "--format",
                        "json", timeout=60)
            return [v["verdict_id"] for v in json.loads(r.stdout)] if r.returncode == 0 else []

        wait_for(lambda: set(stored()) >= set(expected), 120, "the batch verdict ids in ClickHouse", interval_s=1.0)
        delay = time.monotonic() - input_end
        time.sleep(3)  # anything extra or doubled would arrive about now
        got = stored()
        print(f"\nleader kill on 3 nodes (started in {kafka_cluster.start_seconds:.1f} s): "
              f"stack up in {t_ready - t_up:.1f} s; node {victim + 1} (leader of {raw}[0]) "
              f"killed {t_kill - t_ready:.1f} s after, node {new_leader + 1} leads {failover:.1f} s later; "
              f"{len(expected)} verdicts stored {delay:.1f} s after the input ended")
        assert sorted(got) == sorted(expected)  # none lost, none extra, none twice
        assert not kafka_cluster.is_running(victim)
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": kafka_cluster.bootstrap_of_live(), "group.id": f"probe-{uuid.uuid4()}"})
        try:  # the killed leader's partition did carry frames (so its loss was felt)
            assert c.get_watermark_offsets(TopicPartition(raw, 0), timeout=10)[1] > 0
        finally:
            c.close()
    finally:
        if replay is not None and replay.poll() is None:
            replay.kill()
            replay.wait(10)
        stop_stack(up)
        log.close()
