"""Problems every rank shares, on hand-built patterns: loader, host Python, GC pauses, NCCL off its RDMA path."""

from __future__ import annotations

import numpy as np

from eroica.models.columns import OP_CODE

from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary
from .expected import BW_CONFIG, LOADER_BETA, PYTHON_BETA, expected_findings, pause_findings
from .layout import Layout
from .patterns import K_KERNEL, K_LOADER, K_PYTHON, Patterns

MS = 1e6
STEP_NS = 1000 * MS
N = 8
LAYOUT = Layout(rank_node={r: f"node-{r // 4}" for r in range(N)}, rank_stage={r: 0 for r in range(N)})
NO_COLL = CollectiveStats(np.arange(N), np.zeros(N), np.zeros(N), [])


def patterns(per_step: np.ndarray, kinds: list[int], count: np.ndarray | None = None, steps: int = 10) -> Patterns:
    n_r, n_f = per_step.shape
    count = np.full((n_r, n_f), steps) if count is None else count
    return Patterns(
        ranks=np.arange(n_r), fn_names=[f"f{i}" for i in range(n_f)], fn_stacks=[""] * n_f,
        fn_kinds=np.array(kinds, dtype=np.int64), count=count, total_ns=per_step * steps,
        excl_ns=per_step * steps, median_ns=per_step * steps / np.maximum(count, 1), p90_ns=per_step,
        p99_ns=per_step, per_step_ns=per_step, low_ns=per_step, beta=per_step / STEP_NS, steps=np.full(n_r, steps),
        step_time_ns=np.full(n_r, STEP_NS), window_ns=int(steps * STEP_NS), sporadic=np.zeros((n_r, n_f), dtype=bool))


def shares(kernel: float, other: float, other_kind: int, ranks_with_other: range = range(N)) -> Patterns:
    m = np.zeros((N, 2))
    m[:, 0] = kernel * STEP_NS
    for r in ranks_with_other:
        m[r, 1] = other * STEP_NS
    return patterns(m, [K_KERNEL, other_kind])


def find(p: Patterns, counters: CounterSummary | None = None, coll: CollectiveStats = NO_COLL) -> list[tuple[str, str]]:
    return [(f.component, f.scope) for f in expected_findings(p, LAYOUT, counters or CounterSummary(), coll, [], STEP_NS)]


def test_the_loader_on_every_ranks_critical_path_is_config_or_storage():
    assert find(shares(0.7, LOADER_BETA + 0.05, K_LOADER)) == [("config", "job")]
    iowait = CounterSummary(host={"node-0": {"iowait_pct": 30.0}, "node-1": {"iowait_pct": 25.0}})
    assert find(shares(0.7, LOADER_BETA + 0.05, K_LOADER), iowait) == [("storage", "job")]
    # below the share, or on too few ranks (one node's loader: the peer test's, not a shared cause)
    assert find(shares(0.7, LOADER_BETA - 0.02, K_LOADER)) == []
    assert find(shares(0.7, 0.5, K_LOADER, ranks_with_other=range(4))) == []


def test_host_python_holding_the_step_while_the_gpu_idles():
    assert find(shares(0.5, PYTHON_BETA + 0.05, K_PYTHON)) == [("python", "job")]
    assert find(shares(0.5, PYTHON_BETA - 0.05, K_PYTHON)) == []
    # a CPU-only job: the host is the compute
    m = np.full((N, 1), 0.6 * STEP_NS)
    assert find(patterns(m, [K_PYTHON])) == []


def rails(nodes: int = 2, per_node: int = 4, gbps: float = 400.0) -> CounterSummary:
    nic = {(f"node-{n}", f"mlx5_{i}"): {"link_gbps": gbps, "throughput_Bps": 5e9, "throughput_cv": 0.5, "link_up_min": 1.0}
           for n in range(nodes) for i in range(per_node)}
    return CounterSummary(nic=nic)


def dp_rings(transfer_ms: float, nbytes: float = 1e9) -> CollectiveStats:
    """Four rail-aligned DP rings across the two nodes (ranks r and r + 4)."""
    groups = [GroupStats(f"dp{i}", np.array([i, i + 4]), False, transfer_ms * MS, nbytes, 10, op=OP_CODE["all_reduce"])
              for i in range(4)]
    return CollectiveStats(np.arange(N), np.zeros(N), np.full(N, transfer_ms * MS), groups)


def test_inter_node_collectives_far_below_link_speed_are_nccl_config():
    p = shares(0.5, 0.0, K_PYTHON)
    # 1 GB in 200 ms is 5 GB/s against 50 GB/s rails: 10% of the wire, under BW_CONFIG (TCP sockets)
    out = expected_findings(p, LAYOUT, rails(), dp_rings(200.0), [], STEP_NS)
    assert [(f.component, f.fn) for f in out] == [("config", "nccl")]
    share = out[0].evidence["inter_node_bandwidth_share_of_link"]["median"]
    assert share < BW_CONFIG and abs(share - 0.1) < 0.01
    # at RDMA speed (25 ms: 80% of the wire) nothing; without byte counts nothing can be said
    assert expected_findings(p, LAYOUT, rails(), dp_rings(25.0), [], STEP_NS) == []
    assert expected_findings(p, LAYOUT, rails(), dp_rings(200.0, nbytes=float("nan")), [], STEP_NS) == []


def gc(ms_by_rank: dict[int, float], n: int = N) -> Patterns:
    """One kernel every step, and a host function that ran once on the given ranks (ms each)."""
    m = np.zeros((n, 2))
    m[:, 0] = 500 * MS
    count = np.zeros((n, 2), dtype=np.int64)
    count[:, 0] = 10
    for r, ms in ms_by_rank.items():
        m[r, 1] = ms * MS / 10
        count[r, 1] = 1
    return patterns(m, [K_KERNEL, K_PYTHON], count=count)


def test_long_pauses_on_varying_ranks_stall_the_job():
    out, now = pause_findings(gc({0: 300, 2: 300, 5: 300}), STEP_NS)
    assert [(f.component, f.scope, f.fn) for f in out] == [("python", "job", "f1")]
    assert out[0].evidence["f1"]["ranks_pausing"] == 3 and out[0].culprits == []
    assert {r.rank for r in now.records} == {0, 2, 5}


def test_pauses_on_one_rank_or_mostly_one_rank_or_short_ones_are_not_gc():
    assert pause_findings(gc({0: 300, 2: 300}), STEP_NS)[0] == []             # fewer than 3 ranks
    assert pause_findings(gc({0: 2000, 2: 100, 5: 100}), STEP_NS)[0] == []    # one rank holds most of it
    assert pause_findings(gc({0: 20, 2: 20, 5: 20, 6: 20}), STEP_NS)[0] == []  # short, cheap pauses


def test_pauses_add_up_over_the_recent_windows():
    # two ranks now, one in each of the windows before: the pattern holds over three windows
    # (4 x 500 ms of 30 s: 6.7% of the job's time, over PAUSE_COST)
    _, w1 = pause_findings(gc({1: 500}), STEP_NS)
    _, w2 = pause_findings(gc({3: 500}), STEP_NS)
    assert pause_findings(gc({0: 500, 2: 500}), STEP_NS)[0] == []
    out, _ = pause_findings(gc({0: 500, 2: 500}), STEP_NS, [w1, w2])
    assert [f.fn for f in out] == ["f1"] and out[0].evidence["f1"]["ranks_pausing"] == 4


def test_a_pause_share_is_of_the_time_the_job_took_never_over_all_of_it():
    # pauses adding up to 2.8x the pause-free steps (4 ranks x 7 s beside 10 steps of 1 s): the
    # slowdown says how much longer the job took (3.8x); the share stays a share of its time (74%)
    out, _ = pause_findings(gc({r: 7000 for r in (0, 2, 5, 6)}), STEP_NS)
    assert len(out) == 1 and out[0].slowdown == 3.8
    pct = int(out[0].summary.split(" for ")[1].split("%")[0])
    assert pct <= 100 and abs(pct / 100 - (1 - 1 / out[0].slowdown)) < 0.01


def test_a_slow_host_frame_reports_its_duration_ratio_not_its_critical_path_ratio():
    # A host frame that encloses GPU work: 200 ms a step on the peers, of which the GPU leaves 5 ms
    # on the critical path; on rank 3 (a contended CPU) it takes 1000 ms, 600 ms of it exposed.
    # The peer test fires on the exposed time (120x); "runs Nx slower" is the duration, 5x.
    from .detector import rank_findings
    m = np.zeros((N, 2))
    m[:, 0] = 500 * MS
    m[:, 1] = 5 * MS
    m[3, 1] = 600 * MS
    p = patterns(m, [K_KERNEL, K_PYTHON])
    p.total_ns[:, 1] = 200 * MS * 10
    p.total_ns[3, 1] = 1000 * MS * 10
    [f] = rank_findings(p, LAYOUT, CounterSummary(), NO_COLL, STEP_NS)
    assert (f.rank, f.component, f.slowdown) == (3, "python", 5.0)
    assert "run 5.00x longer than on 7 peers (1000 ms vs 200 ms per step; 600 ms vs 5.0 ms" in f.summary
    assert f.evidence["duration_ns_per_step"]["ratio"] == 5.0 and f.evidence["f1"]["ratio"] == 120.0
