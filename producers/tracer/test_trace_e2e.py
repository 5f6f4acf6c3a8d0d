"""A real torch.distributed job (gloo, 4 processes, DDP) with one slowed rank: trace it, analyze it, name it.

The job (:mod:`eroica.producers.tracer.ddp_job`) knows nothing of Eroica;
``eroica trace`` instruments it through ``sitecustomize``. Which rank is
slowed is drawn at random each run, so nothing here is tuned to one rank.
Two real slowdowns: extra compute in that rank's forward (host compute on a
CPU job: the detector says ``python`` or ``host_cpu``), and a slow input
pipeline (``dataloader``).

What must hold, for verdicts at or above the alarm level (confidence >= 0.5):

* the slowed rank is named, with that component, in most windows;
* wherever it is named, it is the main culprit: any other rank-scope alarm of
  that window claims a smaller slowdown;
* no other rank or node is blamed persistently (in two consecutive windows).

Four CPU-bound ranks share this machine's two cores (with whatever else runs
on it), so a single 2-second window now and then sees a peer's backward run
1.5x slow for a few dozen steps, and the detector's one-window "overwhelming"
rule turns that into a one-window alarm; a fault that is real persists, and
the noise does not. Job-scope verdicts blame no rank and are allowed: on a
CPU-only job the expected-behaviour test sees host code hold the critical
path on every rank (there is no GPU to hand it to).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

WINDOW_S = 2
STEPS = 300
# Issue 14: a test that passes only on a quiet machine is no test. CI runs each case this many times,
# each with a freshly drawn slowed rank, beside the rest of the suite (2 cores, load often > 4).
REPEAT = int(os.environ.get("EROICA_TRACE_REPEAT", "3"))


def trace_job(tmp_path: Path, slow_rank: int, *job_args: str) -> tuple[Path, subprocess.CompletedProcess]:
    run = tmp_path / "run.jsonl"
    cmd = [sys.executable, "-m", "eroica.cli.main", "trace", "--out", str(run), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           "-m", "eroica.producers.tracer.ddp_job", "--steps", str(STEPS), "--slow-rank", str(slow_rank), *job_args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return run, proc


def analyze(run: Path) -> list[dict]:
    proc = subprocess.run([sys.executable, "-m", "eroica.cli.main", "analyze", str(run), "--window", str(WINDOW_S),
                           "--format", "json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("fault, job_args, components", [
    # 2x the forward's work: at 1.5x (a few ms a step) a CI run's victim rank, slowed now and then by the
    # machine, drew as many (unconfirmed) findings as the slowed rank: the fault must be a straggler, not noise
    ("forward compute", ("--slow-factor", "2"), {"python", "host_cpu"}),
    ("input pipeline", ("--slow-data-ms", "8"), {"dataloader"}),
])
@pytest.mark.parametrize("attempt", range(REPEAT))
def test_trace_then_analyze_names_the_slowed_rank(tmp_path: Path, fault: str, job_args: tuple, components: set,
                                                  attempt: int) -> None:
    slow = random.randrange(4)
    run, proc = trace_job(tmp_path, slow, *job_args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == ""  # the job prints nothing, and neither may Eroica on stdout
    assert "from 4 rank(s) (world size 4)" in proc.stderr, proc.stderr[-2000:]

    lines = run.read_text().splitlines()
    job = json.loads(lines[0])
    assert job["type"] == "job" and job["world_size"] == 4 and len(job["rank_nodes"]) == 4
    kinds = {json.loads(line)["type"] for line in lines[1:200]}
    assert {"fn", "host"} <= kinds  # the node agent ran beside the job

    verdicts = analyze(run)
    alarms = [v for v in verdicts if v["confidence"] >= 0.5 and v["scope"] in ("rank", "node")]
    named = [v for v in alarms if v["scope"] == "rank" and v["rank"] == slow]
    why = f"slowed rank {slow} ({fault}); verdicts: " + json.dumps(
        [(v["window_start_ns"] // 10**9, v["scope"], v["rank"], v["component"], v["confidence"], v["slowdown"], v["fn"])
         for v in verdicts])
    # What the detector guarantees is persistence, not coverage: a loaded machine stretches
    # the job over more windows and dilutes a fixed fault, so "half the windows" measured the
    # machine's load. With other CPU-bound work beside the four ranks (seen: an accuracy bench),
    # the peers slow down now and then too, and the slowed rank's findings come in separate
    # windows, each held at 0.45 until one is overwhelming and steady. So: the slowed rank is
    # found (any confidence) in at least two windows, alarms in at least one, and both more
    # often than any other rank.
    found_windows = {v["window_start_ns"] for v in verdicts if v["scope"] == "rank" and v["rank"] == slow}
    assert len(found_windows) >= 2 and named, why
    for pool in (alarms, verdicts):
        per_rank = Counter(v["rank"] for v in pool if v["scope"] == "rank")
        assert all(n < per_rank[slow] for r, n in per_rank.items() if r != slow), why
    # The cause named is the slowdown's in most of the windows that alarm on the rank. Steps now confirm a
    # finding within one window (detector.SIGN_STEPS), so a window in which the loaded machine really ran
    # the slowed rank's forward slower for a dozen steps (seen once in a full-suite run: one 2 s window of
    # eight named `host_cpu`, the other seven `dataloader`) may name that too; it is the same rank.
    hits = Counter(v["component"] in components for v in named)
    assert hits[True] > hits[False], why
    assert all(v["kind"] == "slow" for v in named), why
    for v in named:
        rivals = [o for o in alarms if o["window_start_ns"] == v["window_start_ns"] and o["rank"] != slow]
        assert all(o["slowdown"] < v["slowdown"] for o in rivals), why
    step = WINDOW_S * 10**9
    for rank in {v["rank"] for v in alarms} - {slow}:
        seen = sorted({v["window_start_ns"] for v in alarms if v["rank"] == rank})
        assert not any(b - a == step for a, b in zip(seen, seen[1:])), why
    victims = {r for v in named for r in v["victims"]}
    assert slow not in victims and victims <= {0, 1, 2, 3} - {slow}, why
