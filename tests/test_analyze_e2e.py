"""``eroica analyze`` end to end on simulator output: right culprit and component, no victim blamed.

Each test goes through the real path: the CLI simulates a contract file, the
CLI analyses it, the JSON on stdout is parsed as contract verdicts and scored
against the simulator's ground truth (alarms are verdicts with confidence >= 0.5).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eroica.bench.scoring import score_run
from eroica.models.verdict import decode_verdicts

EROICA = [sys.executable, "-m", "eroica.cli"]
LAYOUT = ["--nodes", "4", "--gpus", "8", "--steps", "70"]

SINGLE_CULPRIT = {
    "gpu_throttle": "gpu_throttle:rank=13",
    "gpu_memory": "gpu_memory:rank=6",
    "pcie": "pcie:rank=21",
    "nvlink": "nvlink:rank=9",
    "nic": "nic:node=2,nic=5",
    "nic_flaky": "nic_flaky:node=1,nic=3",
    "dataloader": "dataloader:node=3",
    "storage": "storage:node=0",
    "host_cpu": "host_cpu:node=1",
    "uneven_workload": "uneven_workload:rank=30",
    "hang": "hang:rank=17",
}


def _run(tmp: Path, faults: list[str], extra: list[str] | None = None, seed: int = 4) -> tuple[list, dict]:
    out = tmp / "run.jsonl"
    args = [*EROICA, "simulate", *LAYOUT, *(extra or []), "--seed", str(seed), "-o", str(out)]
    for f in faults:
        args += ["--fault", f]
    subprocess.run(args, check=True, capture_output=True)
    res = subprocess.run([*EROICA, "analyze", str(out), "--format", "json", "--window", "20"],
                         check=True, capture_output=True)
    verdicts = decode_verdicts(res.stdout)
    truth = json.loads((tmp / "run.truth.json").read_text())
    return verdicts, truth


@pytest.mark.parametrize("name", sorted(SINGLE_CULPRIT))
def test_single_culprit_fault_is_localised_without_blaming_victims(tmp_path, name):
    verdicts, truth = _run(tmp_path, [SINGLE_CULPRIT[name]])
    score = score_run(verdicts, truth)
    assert all(f.ok for f in score.faults), [(f.expected, f.found) for f in score.faults]
    assert score.victims_blamed == [] and score.false_alarms == []
    fault = truth["faults"][0]
    named = [v for v in verdicts if v.confidence >= 0.5 and v.component == fault["component"]]
    for v in named:  # every alarm names the culprit, and never lists it among the victims
        assert (v.rank in fault["ranks"]) if v.scope == "rank" else (v.node in fault["nodes"] or v.scope == "job")
        assert not set(v.victims) & set(fault["ranks"])


@pytest.mark.parametrize("extra", [[], ["--pp", "2"]], ids=["dp-tp", "pipeline"])
def test_healthy_run_is_silent(tmp_path, extra):
    verdicts, truth = _run(tmp_path, [], extra)
    assert truth["healthy"]
    assert [v for v in verdicts if v.confidence >= 0.5] == []


def test_json_output_is_only_a_verdict_array_and_table_has_summaries(tmp_path):
    _run(tmp_path, ["gpu_throttle:rank=2"])
    res = subprocess.run([*EROICA, "analyze", str(tmp_path / "run.jsonl"), "--format", "json"],
                         check=True, capture_output=True)
    data = json.loads(res.stdout)
    assert isinstance(data, list) and data and {"verdict_id", "summary", "evidence"} <= set(data[0])
    table = subprocess.run([*EROICA, "analyze", str(tmp_path / "run.jsonl")], check=True, capture_output=True,
                           env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert b"rank 2" in table.stdout and b"gpu" in table.stdout


def test_invalid_records_are_reported_and_do_not_stop_analysis(tmp_path):
    _run(tmp_path, ["gpu_throttle:rank=2"])
    path = tmp_path / "run.jsonl"
    lines = path.read_bytes().splitlines()
    lines.insert(5, b'{"type":"fn","job":"x"}')
    lines.insert(9, b"not json")
    path.write_bytes(b"\n".join(lines) + b"\n")
    res = subprocess.run([*EROICA, "analyze", str(path), "--format", "json"], capture_output=True)
    assert res.returncode == 0
    assert b"2 invalid record(s)" in res.stderr and b"missing required field" in res.stderr
    assert any(v["rank"] == 2 for v in json.loads(res.stdout))


def test_file_without_valid_record_exits_non_zero(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type":"fn"}\nnope\n')
    res = subprocess.run([*EROICA, "analyze", str(bad)], capture_output=True)
    assert res.returncode == 3 and b"no valid record" in res.stderr


def test_stdin_input(tmp_path):
    _run(tmp_path, ["gpu_throttle:rank=2"])
    with open(tmp_path / "run.jsonl", "rb") as f:
        res = subprocess.run([*EROICA, "analyze", "-", "--format", "json"], stdin=f, capture_output=True, check=True)
    assert any(v["rank"] == 2 and v["component"] == "gpu" for v in json.loads(res.stdout))
