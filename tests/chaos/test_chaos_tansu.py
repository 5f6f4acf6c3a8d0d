"""The chaos cases that apply on tansu (the embedded default broker of ``eroica up``).

tansu keeps everything in memory, so a broker kill loses the topics by design (README): only the worker
and sink SIGKILLs and the poison case apply. Each: stored verdict ids == ``eroica analyze``'s, none doubled.
The summariser, the detector and the sink are SIGKILLed one after the other within one replay (one case,
to keep the suite short; each is killed alone on Apache Kafka in ``test_chaos_kafka.py``). A job of
100,000 function names replayed beside a normal job (``heavy.py``) restarts nothing and holds it up by at
most two windows.
"""

from __future__ import annotations


import pytest

from chaos.harness import ChaosStack, kill_each_service_case, make_jobs, require_chdb
from chaos.attacks import attack_case
from chaos.heavy import heavy_job_case
from chaos.poison import poison_case

BROKER = "tansu"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    require_chdb()
    base = tmp_path_factory.mktemp("chaos-tansu")
    s = ChaosStack(base / "stack", broker="tansu")
    names = ["tansu-kill-all", "poison-tansu", "attacks-tansu", "heavy-neighbour-tansu"]
    s.jobs = make_jobs(base, names)  # type: ignore[attr-defined]
    s.start()
    try:
        yield s
    finally:
        s.stop()


def test_each_worker_and_the_sink_sigkilled_mid_stream(stack: ChaosStack) -> None:
    kill_each_service_case(stack, stack.jobs["tansu-kill-all"], BROKER)  # type: ignore[attr-defined]


def test_poison_on_every_topic(stack: ChaosStack) -> None:
    poison_case(stack, stack.jobs["poison-tansu"], BROKER)  # type: ignore[attr-defined]


def test_attacks_on_the_query_surface_mid_stream(stack: ChaosStack) -> None:
    attack_case(stack, stack.jobs["attacks-tansu"], BROKER)  # type: ignore[attr-defined]


def test_a_heavy_100k_function_job_beside_a_normal_one(stack: ChaosStack) -> None:
    heavy_job_case(stack, stack.jobs["heavy-neighbour-tansu"], BROKER)  # type: ignore[attr-defined]
