"""The full engine: every simulator fault at small scale, stability, history and the real traces."""

from __future__ import annotations

import subprocess
import sys

import pytest

from eroica.bench.accuracy import Scenario, run_scenario, scenarios
from eroica.models.reader import read_batches
from eroica.streams.detection import analyze
from eroica.streams.detection.detector import SIGN_STEPS

WINDOW_NS = 20 * 10**9


@pytest.mark.parametrize("sc", scenarios(4, 8, seed=11), ids=lambda s: s.name)
def test_every_fault_is_localised_on_a_seed_the_benchmark_does_not_use(tmp_path, sc):
    r = run_scenario("small", 11, sc, tmp_path)
    assert r.passed, (r.score, [(v.component, v.scope, v.node, v.rank, v.confidence) for v in r.verdicts])


def test_one_off_spikes_and_rank0_logging_stay_below_alarm(tmp_path):
    """Healthy runs carry spikes and rank 0's periodic logging; any verdict stays under 0.5."""
    r = run_scenario("small", 12, Scenario("healthy", []), tmp_path)
    assert all(v.confidence < 0.5 for v in r.verdicts)


def test_persisting_problem_keeps_one_incident_and_a_verdict_id_per_window(tmp_path):
    r = run_scenario("small", 13, Scenario("gpu_throttle", ["gpu_throttle:rank=7"]), tmp_path)
    mine = [v for v in r.verdicts if v.rank == 7 and v.component == "gpu"]
    assert len(mine) >= 3
    assert len({v.incident_id for v in mine}) == 1
    assert len({v.verdict_id for v in mine}) == len(mine) == len({v.window_start_ns for v in mine})
    # the job's first window holds its warm-up steps and many after them: it is judged on those
    # (a steady throttle in every one of them confirms itself by the sign test) and the streak
    # counts windows and steps from it on
    persistence = [v.evidence["persistence"] for v in mine]
    assert [p["consecutive_windows"] for p in persistence] == list(range(1, len(mine) + 1))
    shown = [p["steps_shown"] for p in persistence]
    assert shown == sorted(shown) and shown[0] >= 2 * SIGN_STEPS, shown
    assert all(v.confidence >= 0.5 for v in mine)


def test_regression_is_found_against_the_jobs_own_history(tmp_path):
    r = run_scenario("small", 14, Scenario("kr", ["kernel_regression:fn=flash_bwd_kernel,factor=1.4,start=45"]),
                     tmp_path)
    sw = [v for v in r.verdicts if v.component == "software" and v.confidence >= 0.5]
    assert sw and all(v.fn == "flash_bwd_kernel" and v.scope == "job" for v in sw)
    # nothing before the regression started
    first = min(v.window_start_ns for v in r.verdicts if v.component == "software")
    assert all(v.window_start_ns >= first for v in sw)


def _import(kind: str, args: list[str], out) -> None:
    subprocess.run([sys.executable, "-m", "eroica.cli", "import", kind, *args, "-o", str(out)],
                   check=True, capture_output=True)


def test_real_straggler_trace_names_the_last_stage_as_workload(tmp_path, shared_dir):
    out = tmp_path / "st.jsonl"
    _import("optable", [str(shared_dir / "data/stragglers/trace-ST.parquet")], out)
    verdicts = list(analyze(read_batches(out), WINDOW_NS))
    alarms = [v for v in verdicts if v.confidence >= 0.5]
    assert alarms
    assert {v.component for v in verdicts} == {"workload"}  # no hardware blame, not even below the alarm level
    named = {v.rank for v in alarms if v.scope == "rank"}
    assert named == {6, 7}


@pytest.mark.parametrize("files", [["sampled_rank-0.json.gz", "sampled_rank-1.json.gz"], ["control.json.gz"],
                                   ["test.json.gz"]])
def test_real_kineto_traces_import_and_analyse(tmp_path, shared_dir, files):
    out = tmp_path / "k.jsonl"
    _import("kineto", [str(shared_dir / "data/kineto" / f) for f in files], out)
    res = subprocess.run([sys.executable, "-m", "eroica.cli", "analyze", str(out), "--format", "json"],
                         capture_output=True, check=True)
    assert res.stdout.strip().startswith(b"[")


@pytest.mark.parametrize("seed", [3, 21])
def test_a_job_window_of_one_or_two_steps_still_names_nccl_off_rdma_and_nothing_else(tmp_path, seed):
    """Two steps in all: no job window reaches the three steps a comparison needs (steps past the
    stall bound give such windows). NCCL over TCP is still named from the collectives' bandwidth;
    the same job without the fault gets no verdict at all."""
    from eroica.producers.simulator import SimConfig, write_jsonl

    found = {}
    for faults in ([], ["nccl_tcp"]):
        path = tmp_path / f"run-{len(faults)}.jsonl"
        write_jsonl(SimConfig(nodes=4, gpus=8, steps=2, faults=faults, seed=seed), path, truth_path=False)
        found[bool(faults)] = [(v.scope, v.component, v.fn) for v in analyze(read_batches(path), WINDOW_NS)]
    assert found[False] == []
    assert found[True] and set(found[True]) == {("job", "config", "nccl")}
