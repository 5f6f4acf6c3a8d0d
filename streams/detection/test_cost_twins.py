"""Issue 33: every fault's verdict carries the cost its fault-free twin shows, at 64 ranks too.

The simulator re-run without its fault (same seed: the same jitter) is the ground truth
(``eroica bench cost``). Before: a half-speed NIC at 8 x 8 read "costs the job 0%" (S_X 1.00-1.01
against 1.16 measured: the rail ring was a tensor-parallel position's whole peer group), GC pauses and
the job's last window of NCCL over TCP carried no cost at all.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from eroica.bench.cost import _step_time, estimate, job_windows
from eroica.producers.simulator import SimConfig, write_jsonl

W = 20 * 10**9


def _twins(tmp_path: Path, nodes: int, fault: str, steps: int = 60) -> tuple[float, list]:
    """(true S over the analysed steps, every confident slow verdict of the faulty run)."""
    with_it = dict(write_jsonl(SimConfig(nodes=nodes, gpus=8, steps=steps, faults=[fault], seed=1),
                               tmp_path / "f.jsonl", truth_path=False))
    without = dict(write_jsonl(SimConfig(nodes=nodes, gpus=8, steps=steps, faults=[], seed=1),
                               tmp_path / "h.jsonl", truth_path=False))
    windows = job_windows(tmp_path / "f.jsonl", W)
    # the steps the windows compare (the cost's own), as eroica bench cost weighs them
    est = [e for e in (estimate(jw, meta, vs) for jw, meta, vs in windows) if e is not None]
    steps_seen = np.unique(np.concatenate([e.steps for e in est]))
    s_true = _step_time(with_it, steps_seen) / _step_time(without, steps_seen)
    verdicts = [v for _, _, vs in windows for v in vs if v.kind == "slow" and v.confidence >= 0.5]
    return s_true, verdicts


@pytest.mark.parametrize("fault, component", [("nic:node=2,nic=3", "nic"), ("gc", "python")])
def test_a_confident_verdict_states_its_twins_cost(tmp_path: Path, fault: str, component: str) -> None:
    nodes = 8 if component == "nic" else 4
    s_true, verdicts = _twins(tmp_path, nodes, fault)
    mine = [v for v in verdicts if v.component == component]
    assert mine, f"no confident {component} verdict"
    assert all(v.cost is not None for v in verdicts), [(v.component, v.summary[:60]) for v in verdicts]
    median = float(np.median([v.cost for v in mine]))
    assert median == pytest.approx(s_true, rel=0.05), (median, s_true)


def test_a_window_too_short_to_price_keeps_its_incidents_last_cost(tmp_path: Path) -> None:
    """The job's last window (too few complete steps for the waits) states the cost its incident had."""
    _, verdicts = _twins(tmp_path, 4, "nccl_tcp", steps=45)
    config = [v for v in verdicts if v.component == "config"]
    assert len(config) >= 2 and all(v.cost is not None for v in config)
    carried = [v for v in config if "cost_from_window_ns" in v.evidence]
    assert all(v.cost == next(c.cost for c in config if c.window_start_ns == v.evidence["cost_from_window_ns"])
               for v in carried)
