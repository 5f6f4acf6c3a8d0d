"""Pipeline-stage imbalance on hand-built patterns: stages compared with each other on their compute."""

from __future__ import annotations

import numpy as np

from eroica.models.records import UNTRACED_FN

from .attribution import CLOCK_RATIO_LOW
from .counters import CounterSummary
from .layout import Layout
from .patterns import K_KERNEL, K_PYTHON, Patterns
from .stages import compute_functions, stage_findings

MS = 1e6
STEP_NS = 1000 * MS


def patterns(per_step: np.ndarray, kinds: list[int]) -> Patterns:
    n_r, n_f = per_step.shape
    return Patterns(
        ranks=np.arange(n_r), fn_names=[f"f{i}" for i in range(n_f)], fn_stacks=[""] * n_f,
        fn_kinds=np.array(kinds, dtype=np.int64), count=np.full((n_r, n_f), 10), total_ns=per_step * 10,
        excl_ns=per_step * 10, median_ns=per_step, p90_ns=per_step, p99_ns=per_step, per_step_ns=per_step,
        low_ns=per_step, beta=per_step / STEP_NS, steps=np.full(n_r, 10), step_time_ns=np.full(n_r, STEP_NS),
        window_ns=int(10 * STEP_NS), sporadic=np.zeros((n_r, n_f), dtype=bool))


def pipeline(stage_ms: list[float], ranks_per_stage: int = 4, node_size: int = 4) -> tuple[Patterns, Layout]:
    """Stage s holds ranks s*k..s*k+k-1 with stage_ms[s] of kernels per step; a host function alike everywhere."""
    n = len(stage_ms) * ranks_per_stage
    m = np.zeros((n, 2))
    for s, ms in enumerate(stage_ms):
        m[s * ranks_per_stage:(s + 1) * ranks_per_stage, 0] = ms * MS
    m[:, 1] = 50 * MS
    layout = Layout(rank_node={r: f"node-{r // node_size}" for r in range(n)},
                    rank_stage={r: r // ranks_per_stage for r in range(n)})
    return patterns(m, [K_KERNEL, K_PYTHON]), layout


def clocks(ranks: range, ratio: float) -> CounterSummary:
    return CounterSummary(gpu={r: {"clock_ratio": ratio, "sm_clock_mhz": 1980 * ratio, "max_sm_clock_mhz": 1980.0}
                               for r in ranks})


def test_a_whole_stage_slower_with_normal_clocks_is_workload_per_node_it_fills():
    p, layout = pipeline([400, 400, 600, 400])
    out = stage_findings(p, layout, clocks(range(16), 1.0), STEP_NS)
    assert [(f.component, f.scope, f.node, f.rank) for f in out] == [("workload", "node", "node-2", -1)]
    f = out[0]
    assert f.culprits == [8, 9, 10, 11] and 8 not in f.peers and 0 in f.peers
    assert f.slowdown == 1.5 and f.fn == "stage 2 compute"
    assert f.evidence["compute_ns_per_step"]["other_stages_median"] == 400 * MS


def test_a_stage_on_part_of_a_node_is_blamed_per_rank():
    p, layout = pipeline([400, 400, 600, 400], node_size=8)   # stage 2 shares node-1 with stage 3
    out = stage_findings(p, layout, CounterSummary(), STEP_NS)
    assert [(f.scope, f.node, f.rank) for f in out] == [("rank", "node-1", r) for r in (8, 9, 10, 11)]


def test_a_whole_stage_throttled_is_left_to_the_hardware_tests():
    p, layout = pipeline([400, 400, 600, 400])
    c = clocks(range(16), 1.0)
    c.gpu.update(clocks(range(8, 12), CLOCK_RATIO_LOW - 0.1).gpu)
    assert stage_findings(p, layout, c, STEP_NS) == []


def test_small_or_immaterial_differences_are_not_imbalance():
    # 15% longer: under MIN_RATIO (1.2)
    p, layout = pipeline([400, 400, 460, 400])
    assert stage_findings(p, layout, CounterSummary(), STEP_NS) == []
    # 50% longer but 20 ms of a 1 s step: under MIN_MATERIAL (5%)
    p, layout = pipeline([40, 40, 60, 40])
    assert stage_findings(p, layout, CounterSummary(), STEP_NS) == []
    # host functions are not compute: a stage with slower Python is no stage imbalance
    p, layout = pipeline([400, 400, 400, 400])
    p.per_step_ns[8:12, 1] = 600 * MS
    assert stage_findings(p, layout, CounterSummary(), STEP_NS) == []


def test_one_stage_compares_with_nothing():
    p, layout = pipeline([600])
    assert stage_findings(p, layout, CounterSummary(), STEP_NS) == []


def test_a_cpu_only_job_compares_its_stages_on_host_work():
    """No kernels at all (a gloo job on CPUs): the host work is the compute, the loop's own code outside
    any traced call is not (every stage runs it alike)."""
    m = np.zeros((8, 3))
    m[:, 0] = 40 * MS
    m[4:, 0] = 90 * MS             # stage 1's model work: 2.25x stage 0's
    m[:, 1] = 5 * MS
    m[:4, 2] = 200 * MS            # stage 0's loop code outside any traced call: not compute
    p = patterns(m, [K_PYTHON, K_PYTHON, K_PYTHON])
    p.fn_names[2] = UNTRACED_FN
    assert compute_functions(p).tolist() == [True, True, False]
    layout = Layout(rank_node={r: "node-0" if r < 4 else "node-1" for r in range(8)},
                    rank_stage={r: r // 4 for r in range(8)})
    found = stage_findings(p, layout, CounterSummary(), STEP_NS)
    assert {(f.scope, f.node) for f in found} == {("node", "node-1")} and all(f.component == "workload" for f in found)
    # with kernels the kernels alone are the compute
    q = patterns(m, [K_KERNEL, K_PYTHON, K_PYTHON])
    assert compute_functions(q).tolist() == [True, False, False]
