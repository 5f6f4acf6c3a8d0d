"""Problems every rank shares, on hand-built patterns: loader, host Python, GC pauses, NCCL off its RDMA path."""

from __future__ import annotations

import numpy as np

from eroica.models.columns import OP_CODE

from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary
from .expected import (BW_CONFIG, BW_DEGRADED, CNP_PER_PACKET_MAX, LOADER_BETA, PAUSES_FN, PYTHON_BETA,
                       ROCE_MTU_MIN_B, expected_findings, pause_findings)
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
    assert [(f.component, f.scope, f.fn) for f in out] == [("python", "job", PAUSES_FN)]
    ev = out[0].evidence[PAUSES_FN]
    assert ev["ranks_pausing"] == 3 and ev["functions"] == {"f1": 1.0} and out[0].culprits == []
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
    assert [f.fn for f in out] == [PAUSES_FN] and out[0].evidence[PAUSES_FN]["ranks_pausing"] == 4


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


def every_step(pauses: dict[tuple[int, int], float], enclosing_ms: float = 0.0, steps: int = 10,
               gaps: dict[int, float] | None = None) -> Patterns:
    """A kernel, three host functions that run once every step (0.2 ms each), and a frame that encloses GPU
    work (f4: 400 ms a call, 1 ms of it its own); ``pauses``: (rank, function 1-3) -> one call ``ms`` longer,
    in the function's own time (the interpreter stopped inside it); ``enclosing_ms``: one call of f4 that long
    more on every rank, spent waiting in the GPU work it encloses; ``gaps``: rank -> one call of f4 ``ms`` longer
    in its own time (a gap between the work it encloses: a stall the tracer did not see)."""
    m = np.zeros((N, 5))
    m[:, 0] = 500 * MS
    m[:, 1:4] = 0.2 * MS
    m[:, 4] = 1 * MS
    p = patterns(m, [K_KERNEL, K_PYTHON, K_PYTHON, K_PYTHON, K_PYTHON], steps=steps)
    for name in ("total_ns", "excl_ns", "median_ns", "p90_ns", "p99_ns", "per_step_ns", "low_ns"):
        setattr(p, name, getattr(p, name).copy())   # patterns() shares one matrix among them
    p.total_ns[:, 4] = 400 * MS * steps + enclosing_ms * MS
    p.median_ns[:, 4] = p.p90_ns[:, 4] = 400 * MS
    p.p99_ns[:, 4] = (400 + enclosing_ms) * MS
    p.median_ns[:, 1:4] = p.p90_ns[:, 1:4] = p.p99_ns[:, 1:4] = 0.2 * MS
    for r, ms in (gaps or {}).items():
        p.excl_ns[r, 4] += ms * MS
        p.total_ns[r, 4] += ms * MS
        p.p99_ns[r, 4] += ms * MS
    for (r, f), ms in pauses.items():
        p.excl_ns[r, f] += ms * MS
        p.total_ns[r, f] += ms * MS
        p.p99_ns[r, f] = (0.2 + ms) * MS
    return p


def test_pauses_inside_every_step_functions_on_varying_ranks_are_one_job_finding():
    # the collector stops whichever function runs: ranks 0 and 3 in f1, 2 and 6 in f2, 5 and 7 in f3
    # (600 ms each of a 10 s window); a per-function test sees two ranks each, the pooled one six
    out, now = pause_findings(every_step({(0, 1): 600, (3, 1): 600, (2, 2): 600, (6, 2): 600,
                                          (5, 3): 600, (7, 3): 600}), STEP_NS)
    assert [(f.component, f.scope, f.fn) for f in out] == [("python", "job", PAUSES_FN)]
    ev = out[0].evidence[PAUSES_FN]
    assert ev["ranks_pausing"] == 6 and set(ev["functions"]) == {"f1", "f2", "f3"}
    assert abs(ev["median_pause_ns"] - 600 * MS) < 1 * MS
    assert {(r.rank, r.fn) for r in now.records} == {(0, "f1"), (3, "f1"), (2, "f2"), (6, "f2"), (5, "f3"), (7, "f3")}
    # ... and over windows, wherever they land, the finding keeps its function (its streak)
    _, w1 = pause_findings(every_step({(1, 1): 600, (4, 2): 600}), STEP_NS)
    _, w2 = pause_findings(every_step({(3, 2): 600, (2, 3): 600}), STEP_NS)
    out, _ = pause_findings(every_step({(0, 3): 600, (6, 1): 600}), STEP_NS, [w1, w2])
    assert [f.fn for f in out] == [PAUSES_FN] and out[0].evidence[PAUSES_FN]["ranks_pausing"] == 6


def test_long_calls_that_wait_for_gpu_work_or_sit_on_one_rank_or_are_short_are_not_pauses():
    # a frame enclosing GPU work, 300 ms longer once on every rank: its own time did not grow
    out, now = pause_findings(every_step({}, enclosing_ms=300), STEP_NS)
    assert out == [] and now.records == []
    # ... nor do the gaps of such a frame, long on every rank now and then (a job-wide loader stall, a
    # neighbour's contention: whatever the tracer does not record lands between the frame's children)
    out, now = pause_findings(every_step({}, gaps={r: 300 for r in range(N)}), STEP_NS)
    assert out == [] and now.records == []
    # one rank pausing in every function: that rank's problem (the peer test's)
    assert pause_findings(every_step({(0, 1): 600, (0, 2): 600, (0, 3): 600}), STEP_NS)[0] == []
    # calls 20 ms longer (2% of a step): jitter, not pauses
    assert pause_findings(every_step({(r, 1 + r % 3): 20 for r in range(N)}), STEP_NS)[0] == []


def congested_rails(cnp_per_s: float, window_s: float = 10.0) -> CounterSummary:
    c = rails()
    for m in c.nic.values():
        m["cnp_sent_inc"] = cnp_per_s * window_s
        m["xmit_wait_inc"] = 1e6 * window_s if cnp_per_s > 1 else 0.0
    return c


def test_congestion_marks_on_every_node_are_the_fabric_without_a_quieter_port():
    p = shares(0.5, 0.0, K_PYTHON)      # ten 1 s steps: a 10 s window
    # 1 GB in 40 ms is 25 GB/s on 50 GB/s rails: half the wire, under BW_DEGRADED
    assert 1e9 / 0.040 / 50e9 < BW_DEGRADED
    # every rail of both nodes marks 10k CNPs a second: 0.4% of the packets it receives (5 GB/s, half of it
    # received, counted at 1 KB), whatever the other ports do
    share = 1e4 / (0.5 * 5e9 / ROCE_MTU_MIN_B)
    assert share > CNP_PER_PACKET_MAX
    out = expected_findings(p, LAYOUT, congested_rails(1e4), dp_rings(40.0), [], STEP_NS)
    assert [(f.component, f.scope) for f in out] == [("network", "job")]
    assert set(out[0].evidence["cnp_above_expected"]["nodes"]) == {"node-0", "node-1"}
    # the same marks with collectives at 80% of the wire: the fabric keeps up, nothing to blame
    assert expected_findings(p, LAYOUT, congested_rails(1e4), dp_rings(25.0), [], STEP_NS) == []
    # a healthy fabric's few marks (0.03 or 30 a second) under slowed collectives: not congestion
    for rate in (0.03, 30.0):
        assert [f.component for f in expected_findings(p, LAYOUT, congested_rails(rate), dp_rings(40.0), [],
                                                       STEP_NS)] == [], rate


def test_a_few_stray_marks_far_above_quieter_ports_are_not_congestion():
    # "Far above the others" alone: 0.03 CNP/s beside 0 on the other rails is no reason for slow
    # collectives (NVLink unused slowed these rings in the nodes); 5,000 CNPs a transfer-second are.
    from .expected import CNP_PER_TRANSFER_S_MIN, _material_marks
    from .links import NicAnomaly
    a = NicAnomaly("node-0", "mlx5_0", "congested", {}, 1.0)
    window_s, duty = 10.0, 0.2                       # 2 s of inter-node transfer in the window
    c = CounterSummary(nic={("node-0", "mlx5_0"): {"cnp_sent_inc": 0.3}})
    assert not _material_marks(a, c, window_s, duty)
    c.nic[("node-0", "mlx5_0")]["cnp_sent_inc"] = 2 * CNP_PER_TRANSFER_S_MIN * 5
    assert _material_marks(a, c, window_s, duty)
    # no CNP counter (xmit-wait only: a vendor's tick, no absolute scale) or no transfer time: the relative reading stands
    assert _material_marks(a, CounterSummary(nic={("node-0", "mlx5_0"): {"xmit_wait_inc": 1e6}}), window_s, duty)
    assert _material_marks(a, c, window_s, float("nan"))
