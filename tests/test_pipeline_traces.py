"""The pipeline trace generator (``bench/pipeline_traces.py``): its timestamps obey the schedule's dependencies.

Why: ``eroica bench cost --reference`` measures ``eroica whatif`` against the
study's reference analyzer on these tables; a table whose timestamps did not
follow its dependencies (a forward before the previous stage's forward of
the same micro-batch, a rank running two ops at once, a collective ending
before its last member arrived) would measure nothing.
"""

from __future__ import annotations

import numpy as np
import pytest

from eroica.bench.pipeline_traces import CULPRITS, SCHEDULES, TraceSpec, execute, schedule_order, specs

EPS = 1e-9  # float rounding of the relative timestamps (s)


def _compute(cols: dict[str, np.ndarray], step: int) -> dict[tuple[str, int, int, int, int], tuple[float, float]]:
    """(F|B, stage, dp, mb, chunk) -> (start, end) of the compute ops of one step."""
    out = {}
    for i in np.flatnonzero((cols["step"] == step) & (cols["mb_id"] >= 0)):
        kind = "F" if cols["optype"][i] == "forward-compute" else "B"
        key = (kind, int(cols["stage"][i]), int(cols["dp_rank"][i]), int(cols["mb_id"][i]), int(cols["mc"][i]))
        out[key] = (float(cols["start_ts"][i]), float(cols["start_ts"][i] + cols["duration"][i]))
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_compute_follows_the_pipeline_dependencies(schedule):
    spec = TraceSpec(pp=4, dp=2, mb=8, schedule=schedule, culprit="worker", seed=7, vpp=2)
    cols = execute(spec)
    vpp = 2 if schedule == "interleaved" else 1
    last = spec.pp * vpp - 1
    for step in range(spec.steps):
        comp = _compute(cols, step)
        assert len(comp) == 2 * spec.pp * spec.dp * spec.mb * vpp
        for (kind, s, d, m, c), (start, _) in comp.items():
            virt = c * spec.pp + s
            if kind == "F" and virt > 0:
                ps, pc = (virt - 1) % spec.pp, (virt - 1) // spec.pp
                assert start >= comp[("F", ps, d, m, pc)][1] - EPS, (kind, s, d, m, c)
            if kind == "B" and virt < last:
                ns, nc = (virt + 1) % spec.pp, (virt + 1) // spec.pp
                assert start >= comp[("B", ns, d, m, nc)][1] - EPS, (kind, s, d, m, c)
            if kind == "B" and virt == last:
                assert start >= comp[("F", s, d, m, c)][1] - EPS


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_each_rank_runs_its_ops_one_at_a_time_in_its_schedule_order(schedule):
    spec = TraceSpec(pp=2, dp=2, mb=4, schedule=schedule, culprit="stage", seed=3, vpp=2)
    cols = execute(spec)
    vpp = 2 if schedule == "interleaved" else 1
    for r in range(spec.pp * spec.dp):
        for step in range(spec.steps):
            sel = np.flatnonzero((cols["rank"] == r) & (cols["step"] == step))
            o = sel[np.lexsort((cols["seq_id"][sel], cols["start_ts"][sel]))]
            start, end = cols["start_ts"][o], cols["start_ts"][o] + cols["duration"][o]
            # rows issued together (a batched send + recv) start and end together; no other overlap
            together = (np.abs(start[1:] - start[:-1]) < EPS) & (np.abs(end[1:] - end[:-1]) < EPS)
            assert np.all((start[1:] >= end[:-1] - EPS) | together)
            # the compute ops come in the schedule's order
            comp = [i for i in o if cols["mb_id"][i] >= 0]
            got = [("F" if cols["optype"][i].startswith("forward") else "B", int(cols["mb_id"][i]), int(cols["mc"][i]))
                   for i in comp]
            assert got == schedule_order(schedule, spec.pp, r // spec.dp, spec.mb, vpp)


def test_collectives_wait_for_their_slowest_member_and_the_culprit_is_slow():
    spec = TraceSpec(pp=2, dp=4, mb=4, schedule="1f1b", culprit="worker", seed=11, factor=2.0)
    cols = execute(spec)
    end = cols["start_ts"] + cols["duration"]
    for step in range(spec.steps):
        for stage in range(spec.pp):
            sel = np.flatnonzero((cols["step"] == step) & (cols["stage"] == stage)
                                 & (cols["optype"] == "grads-reduce-scatter"))
            assert sel.size == spec.dp
            assert np.ptp(end[sel]) < EPS and end[sel][0] >= cols["start_ts"][sel].max()
    # one rank computes twice as long as its peers of the same stage
    fwd = cols["optype"] == "forward-compute"
    per_rank = {r: float(np.median(cols["duration"][fwd & (cols["rank"] == r)])) for r in range(8)}
    slow = max(per_rank, key=lambda r: per_rank[r])
    peers = [per_rank[r] for r in per_rank if r // spec.dp == slow // spec.dp and r != slow]
    assert per_rank[slow] / np.median(peers) == pytest.approx(2.0, rel=0.05)


def test_deterministic_and_covers_the_shapes():
    spec = TraceSpec(pp=2, dp=2, mb=4, schedule="gpipe", culprit="several", seed=5)
    a, b = execute(spec), execute(spec)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    drawn = specs(60)
    assert {s.schedule for s in drawn} == set(SCHEDULES) and {s.culprit for s in drawn} == set(CULPRITS)
    assert all(2 <= s.pp <= 8 and 2 <= s.dp <= 32 and 4 <= s.mb <= 64 for s in drawn)
    assert specs(60) == drawn
