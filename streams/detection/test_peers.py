"""The peer test on hand-built patterns: one rank's function against the same function on its role's other ranks."""

from __future__ import annotations

import numpy as np

from eroica.models.records import UNTRACED_FN

from .patterns import K_COLL, K_IO, K_KERNEL, K_LOADER, K_MEMCPY, K_PYTHON, Patterns
from .peers import (MIN_PEERS, abnormal_cells, category_of, host_category_cells, node_cells, role_ratio, stage_agnostic,
                    stage_agnostic_cells)

MS = 1e6
STEP_NS = 1000 * MS


def patterns(per_step: np.ndarray, kinds: list[int], steps: int = 10) -> Patterns:
    """Ranks 0..R-1, functions f0..f(F-1) of ``kinds``; per_step[r, f] ns per step, every step 1 s."""
    n_r, n_f = per_step.shape
    return Patterns(
        ranks=np.arange(n_r), fn_names=[f"f{i}" for i in range(n_f)], fn_stacks=[""] * n_f,
        fn_kinds=np.array(kinds, dtype=np.int64), count=np.full((n_r, n_f), steps), total_ns=per_step * steps,
        excl_ns=per_step * steps, median_ns=per_step, p90_ns=per_step, p99_ns=per_step, per_step_ns=per_step,
        low_ns=per_step, beta=per_step / STEP_NS, steps=np.full(n_r, steps), step_time_ns=np.full(n_r, STEP_NS),
        window_ns=int(steps * STEP_NS), sporadic=np.zeros((n_r, n_f), dtype=bool))


def noisy(n_r: int, n_f: int, level_ms: float = 100.0) -> np.ndarray:
    """Healthy peers: about ``level_ms`` each, within +-1%."""
    jitter = np.linspace(-0.01, 0.01, n_r)[:, None] * np.ones((1, n_f))
    return level_ms * (1.0 + jitter) * MS


def one_role(n: int) -> dict[int, np.ndarray]:
    return {0: np.arange(n)}


def test_a_clearly_slower_rank_is_abnormal_its_peers_are_not():
    m = noisy(8, 1)
    m[3, 0] = 130 * MS   # 30% slower than the median of the 7 others
    cells = abnormal_cells(patterns(m, [K_KERNEL]), one_role(8))
    assert [(c.slot, c.fn) for c in cells] == [(3, 0)]
    c = cells[0]
    assert c.ratio > 1.25 and c.z >= 5 and c.n_peers == 7
    assert c.excess == c.value - c.peer_median


def test_below_ten_percent_slower_is_not_abnormal():
    # 8% over peers that agree within 1%: under MIN_RATIO (and the z scale's floor of 2% of
    # the median keeps it under MIN_Z too: tight peers never make a small excess significant)
    m = noisy(8, 1)
    m[3, 0] = 108 * MS
    assert abnormal_cells(patterns(m, [K_KERNEL]), one_role(8)) == []
    m[3, 0] = 112 * MS
    assert [c.slot for c in abnormal_cells(patterns(m, [K_KERNEL]), one_role(8))] == [3]


def test_a_function_that_costs_peers_nothing_is_judged_against_a_floor_of_the_step():
    # Peers spend ~0: ratio and z use a floor of 0.1% of the step (1 ms), so 3 ms more is
    # 3 floors (z < 5) and no alarm, while 10 ms more is; the ratio stays finite.
    m = noisy(8, 1, level_ms=0.01)
    m[3, 0] = 3.0 * MS
    assert abnormal_cells(patterns(m, [K_PYTHON]), one_role(8)) == []
    m[3, 0] = 10.0 * MS
    cells = abnormal_cells(patterns(m, [K_PYTHON]), one_role(8))
    assert [c.slot for c in cells] == [3]
    assert np.isfinite(cells[0].ratio) and abs(cells[0].ratio - 10.0) < 0.01


def test_collectives_are_never_compared():
    # the culprit of a collective waits least; its victims' long collectives point at nobody here
    m = noisy(8, 2)
    m[:, 1] = 300 * MS
    m[5, 1] = 10 * MS    # the one the others waited for
    m[0, 1] = 900 * MS   # a victim
    assert abnormal_cells(patterns(m, [K_KERNEL, K_COLL]), one_role(8)) == []


def test_roles_compare_inside_themselves_and_small_roles_are_skipped():
    m = noisy(12, 1)
    m[8:, 0] = 200 * MS          # a whole role (ranks 8..11) twice as slow: alike inside itself
    roles = {0: np.arange(8), 1: np.arange(8, 12)}
    assert abnormal_cells(patterns(m, [K_KERNEL]), roles) == []
    m[10, 0] = 300 * MS          # one of them 50% slower than its own role
    assert [c.slot for c in abnormal_cells(patterns(m, [K_KERNEL]), roles)] == [10]
    small = {0: np.arange(MIN_PEERS - 1)}
    m2 = noisy(MIN_PEERS - 1, 1)
    m2[0, 0] = 500 * MS
    assert abnormal_cells(patterns(m2, [K_KERNEL]), small) == []


def test_the_kernels_switch_restricts_the_test():
    m = noisy(8, 2)
    m[2, 0] = 150 * MS   # a kernel
    m[6, 1] = 150 * MS   # a host function
    p = patterns(m, [K_KERNEL, K_PYTHON])
    assert {c.slot for c in abnormal_cells(p, one_role(8))} == {2, 6}
    assert [c.slot for c in abnormal_cells(p, one_role(8), kernels=True)] == [2]
    assert [c.slot for c in abnormal_cells(p, one_role(8), kernels=False)] == [6]


def test_categories():
    assert category_of(K_KERNEL) == "kernel"
    assert category_of(K_MEMCPY) == "memcpy"
    assert category_of(K_LOADER) == category_of(K_IO) == "loader"
    assert category_of(K_PYTHON) == "host"


def test_role_ratio_sums_the_functions_against_the_other_ranks_median():
    m = noisy(5, 2)
    m[4] = [150 * MS, 150 * MS]
    p = patterns(m, [K_KERNEL, K_KERNEL])
    members = np.arange(5)
    assert abs(role_ratio(p, members, np.array([0, 1]), 4) - 1.5) < 0.01
    assert abs(role_ratio(p, members, np.array([0, 1]), 0) - 1.0) < 0.02
    assert role_ratio(p, members, np.array([], dtype=np.int64), 4) == 1.0


# --- a node that holds half its role (peers.node_cells) ---------------------------------------

def _two_nodes(n: int = 16) -> dict[int, str]:
    return {r: ("node-a" if r < n // 2 else "node-b") for r in range(n)}


def test_half_a_role_on_one_slow_node_hides_from_the_plain_test_but_not_from_the_node_test():
    m = noisy(16, 1, level_ms=10.0)
    m[8:, 0] = 500 * MS       # every rank of node-b, half the role, 50x slower host frames
    p, roles = patterns(m, [K_PYTHON]), one_role(16)
    assert abnormal_cells(p, roles) == []           # the median is theirs: nobody stands out
    cells = node_cells(p, roles, _two_nodes())
    assert sorted(c.slot for c in cells) == list(range(8, 16))
    assert all(c.other_nodes and c.n_peers == 8 and abs(c.peer_median - 10 * MS) < 0.2 * MS for c in cells)


def test_the_node_test_is_one_sided_and_leaves_small_shares_to_the_plain_test():
    m = noisy(16, 1, level_ms=10.0)
    m[8:, 0] = 500 * MS
    # the fast half (node-a) is never "slower" than node-b
    assert all(c.slot >= 8 for c in node_cells(patterns(m, [K_PYTHON]), one_role(16), _two_nodes()))
    # a node with under half the role: the plain peer test's case, not this one's
    nodes = {r: ("node-a" if r < 12 else "node-b") for r in range(16)}
    m = noisy(16, 1, level_ms=10.0)
    m[12:, 0] = 500 * MS
    assert node_cells(patterns(m, [K_PYTHON]), one_role(16), nodes) == []
    assert sorted(c.slot for c in abnormal_cells(patterns(m, [K_PYTHON]), one_role(16))) == [12, 13, 14, 15]


def test_two_healthy_nodes_that_differ_by_noise_are_not_abnormal():
    m = noisy(16, 1, level_ms=10.0)
    m[8:, 0] *= 1.05          # 5% apart: under MIN_RATIO, and within the z floor of 2% of the median
    assert node_cells(patterns(m, [K_PYTHON]), one_role(16), _two_nodes()) == []


def test_many_short_host_functions_slower_together_are_found_by_their_sum():
    # A CPU-starved node: six 1-3 ms host frames each 3-4x slower on 8 of 32 ranks. Each one's
    # excess (2-7 ms) is within a few floors of 0.1% of a step (1 ms): under the peer test's z alone,
    # but their sum (~20 ms a step) is far outside the role's spread.
    levels = np.array([0.9, 1.6, 0.5, 1.0, 0.3, 1.2])
    m = np.tile(levels * MS, (32, 1)) * (1 + np.linspace(-0.01, 0.01, 32))[:, None]
    m = np.hstack([m, np.full((32, 1), 400 * MS)])              # a kernel: not host, not summed
    slow = list(range(16, 24))
    m[slow, :6] *= 3.5
    p = patterns(m, [K_PYTHON] * 6 + [K_KERNEL])
    per_fn = {c.slot for c in abnormal_cells(p, one_role(32), kernels=False)}
    assert not set(slow) <= per_fn                                  # the per-function test sees some at most
    cells = host_category_cells(p, one_role(32))
    assert {c.slot for c in cells} == set(slow)
    # each frame above the per-cell crumb (0.2% of the step: 2 ms) is a cell, with the sum's z
    big = [0, 1, 3, 5]
    assert all(sorted(c.fn for c in cells if c.slot == r) == big for r in slow)
    assert all(c.ratio >= 2 and c.z >= 5 for c in cells)
    want = 2.5 * levels[big].sum() * MS
    assert all(abs(sum(c.excess for c in cells if c.slot == r) - want) < 0.05 * want for r in slow)
    # healthy: nothing; one rank 5% slower in every host frame: under MIN_RATIO, nothing
    healthy = patterns(np.tile(levels * MS, (32, 1)) * (1 + np.linspace(-0.01, 0.01, 32))[:, None], [K_PYTHON] * 6)
    assert host_category_cells(healthy, one_role(32)) == []
    m2 = np.tile(levels * MS, (32, 1)) * (1 + np.linspace(-0.01, 0.01, 32))[:, None]
    m2[5] *= 1.05
    assert host_category_cells(patterns(m2, [K_PYTHON] * 6), one_role(32)) == []


def test_stage_agnostic_work_of_ranks_without_role_peers_is_compared_job_wide():
    """Four pipeline stages of one rank each: no role has peers, yet every rank loads batches and runs
    its loop alike; rank 2's slow loader and untraced loop time stand out job-wide, its model does not."""
    m = noisy(8, 3)
    m[2, 0] = 160 * MS      # loader
    m[2, 1] = 150 * MS      # the loop's own code outside any traced call
    m[5, 2] = 300 * MS      # its model (stage-specific work): not compared across stages
    p = patterns(m, [K_LOADER, K_PYTHON, K_PYTHON])
    p.fn_names[1] = UNTRACED_FN
    stages = {s: np.array([s]) for s in range(8)}
    assert abnormal_cells(p, stages) == []
    cells = stage_agnostic_cells(p, stages)
    assert sorted((c.slot, c.fn) for c in cells) == [(2, 0), (2, 1)] and all(c.job_wide for c in cells)
    # roles big enough for the peer test are left to it
    assert stage_agnostic_cells(p, {0: np.arange(8)}) == []
    assert stage_agnostic(p, 0) and stage_agnostic(p, 1) and not stage_agnostic(p, 2)
