"""Chaos on Apache Kafka, one broker (``eroica up --broker kafka``): every verdict stored once, whatever is killed.

Cases (each its own job; stored verdict ids == ``eroica analyze``'s, none doubled):

- SIGKILL of the summariser, of the detector, of the sink, each mid-replay (the supervisor restarts it);
- the broker SIGKILLed mid-replay and restarted by the supervisor (data kept on disk);
- ClickHouse writes failing for ``EROICA_CHAOS_CLICKHOUSE_DOWN_S`` (60 s) mid-stream: nothing is
  committed meanwhile, everything lands once it is back (no ClickHouse server on these machines:
  the stack's chdb sink has its inserts failing as "unavailable", ``EROICA_SINK_CHAOS_BLOCK_FILE``);
- poison messages on every topic the pipeline consumes, around a valid job.

Without java or the Kafka jars: skipped locally, a failure under ``CI``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from chaos.harness import ChaosStack, require_chdb, blocked_clickhouse, check_job, make_jobs, replay_with
from chaos.attacks import attack_case
from chaos.poison import poison_case

BROKER = "kafka-1"
JOBS = ["kill-summariser", "kill-detector", "kill-sink", "kill-broker", "clickhouse-down", "poison-kafka-1",
        "attacks-kafka-1"]
CLICKHOUSE_DOWN_S = float(os.environ.get("EROICA_CHAOS_CLICKHOUSE_DOWN_S", "60"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, apache_kafka_installed: None):
    require_chdb()
    base = tmp_path_factory.mktemp("chaos-kafka")
    s = ChaosStack(base / "stack", broker="kafka",
                   extra_env={"EROICA_SINK_CHAOS_BLOCK_FILE": str(base / "clickhouse-blocked")})
    s.jobs = make_jobs(base, JOBS)  # type: ignore[attr-defined]
    s.start()
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.parametrize("service", ["summariser", "detector", "sink"])
def test_sigkill_mid_stream(stack: ChaosStack, service: str) -> None:
    job = stack.jobs[f"kill-{service}"]  # type: ignore[attr-defined]
    t0 = time.monotonic()
    killed: list[int] = []
    replay_with(stack, job, [(1.5, lambda: killed.append(stack.sigkill(service)))])
    stack.wait_restarted(service, killed[0])
    check_job(stack, job, f"SIGKILL {service} mid-stream", BROKER, t0)


def test_broker_killed_and_restarted_mid_stream(stack: ChaosStack) -> None:
    job = stack.jobs["kill-broker"]  # type: ignore[attr-defined]
    before = stack.state()["kafka"]["restarts"]
    t0 = time.monotonic()
    replay_with(stack, job, [(1.5, stack.kill_broker)])
    assert stack.state()["kafka"]["restarts"] > before
    check_job(stack, job, "broker SIGKILL + restart mid-stream", BROKER, t0, timeout_s=150)


def test_clickhouse_down_mid_stream(stack: ChaosStack) -> None:
    job = stack.jobs["clickhouse-down"]  # type: ignore[attr-defined]
    flag = Path(stack.extra_env["EROICA_SINK_CHAOS_BLOCK_FILE"])
    t0 = time.monotonic()
    with blocked_clickhouse(flag):
        replay_with(stack, job, [])
        time.sleep(max(0.0, CLICKHOUSE_DOWN_S - (time.monotonic() - t0)))
        assert stack.stored(job.name) == set(), "verdicts stored while ClickHouse was down"
    check_job(stack, job, f"ClickHouse down {CLICKHOUSE_DOWN_S:.0f} s", BROKER, t0)


def test_poison_on_every_topic(stack: ChaosStack) -> None:
    poison_case(stack, stack.jobs["poison-kafka-1"], BROKER)  # type: ignore[attr-defined]


def test_attacks_on_the_query_surface_mid_stream(stack: ChaosStack) -> None:
    attack_case(stack, stack.jobs["attacks-kafka-1"], BROKER)  # type: ignore[attr-defined]
