"""Stored window summaries: each cell's slowdown against the other ranks of its role (hand-built digests)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from eroica.models.digest import INTERIOR, FnRows, RankRows, WindowDigest
from eroica.models.records import JobRecord
from eroica.streams.detection.patterns import build_patterns
from eroica.streams.detection.window_summaries import window_summaries

STEP = 1_000_000_000


def _digest(gemm_ms: dict[int, float]) -> WindowDigest:
    d = WindowDigest("j", 0, 30 * STEP)
    ranks = sorted(gemm_ms)
    d.ranks = RankRows(rank=ranks, node=[f"n{r // 4}" for r in ranks], steps=[10] * len(ranks),
                       step_time_ns=[float(STEP)] * len(ranks), step=[INTERIOR] * len(ranks),
                       start_ns=[0] * len(ranks), end_ns=[0] * len(ranks))
    f = SimpleNamespace(**{k: [] for k in FnRows.__struct_fields__})  # columns as lists while built
    for r in ranks:
        ns = gemm_ms[r] * 1e6
        for field, value in (("rank", r), ("fn", "gemm"), ("stack", ""), ("kind", 1), ("count", 10),
                             ("total_ns", 10 * ns), ("excl_ns", 10 * ns), ("median_ns", ns), ("p90_ns", ns),
                             ("p99_ns", ns), ("per_step_ns", ns), ("step", INTERIOR), ("steps", 10), ("low_ns", ns)):
            getattr(f, field).append(value)
    d.fns = FnRows(**vars(f))
    return d


def test_a_cell_is_compared_with_the_other_ranks_of_its_stage_leave_one_out():
    # stage 0 (ranks 0-3) computes 100 ms, stage 1 (ranks 4-7) 200 ms by design; rank 5 is 30% slow
    ms = {0: 100.0, 1: 100.0, 2: 100.0, 3: 100.0, 4: 200.0, 5: 260.0, 6: 200.0, 7: 200.0}
    d = _digest(ms)
    assert build_patterns(d).fn_kinds.tolist() == [1]
    meta = JobRecord(job="j", world_size=8, rank_stages=[0, 0, 0, 0, 1, 1, 1, 1])
    slow = {r.rank: r.slowdown_vs_peers for r in window_summaries(d, meta)}
    assert np.isclose(slow[5], 1.3)                       # against 200 ms, never against itself
    assert all(np.isclose(slow[r], 1.0) for r in (0, 1, 2, 3, 4, 6, 7))  # a heavier stage is not slow
    # without the stages, every rank is one role: the heavier stage reads slow (what the job record prevents)
    flat = {r.rank: r.slowdown_vs_peers for r in window_summaries(d, None)}
    assert flat[4] > 1.3 and flat[0] < 1.0
