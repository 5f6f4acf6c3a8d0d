"""The window cost estimator on hand-built digests (no simulator)."""

from __future__ import annotations

import numpy as np
import pytest

from eroica.models.columns import KIND_CODE
from eroica.models.digest import INTERIOR, CollRows, FnRows, RankRows, WindowDigest

from .cost import (NVLINK_BUS_Bps, RDMA_BUS_SHARE, copy_ns_per_step, declared_excess_ns, finding_costs,
                   lost_gpu_hours_per_hour, network_excess_ns, slow_copy_ranks, wait_matrix, window_cost)
from .findings import Finding

MS = 1_000_000


def digest(waits: np.ndarray, step_ms: float = 1000.0, transfer_ms: float = 10.0, order=None) -> WindowDigest:
    """Ranks 0..R-1 in one communicator; waits[r, s] ms of waiting in step s; every step step_ms long."""
    n_r, n_s = waits.shape
    rows = [(r, s) for r in range(n_r) for s in range(n_s)]
    if order is not None:
        rows = [rows[i] for i in order]
    colls = CollRows(rank=[r for r, _ in rows], group=["dp"] * len(rows), step=[s for _, s in rows],
                     dur_ns=[int((transfer_ms + waits[r, s]) * MS) for r, s in rows], bytes=[1e9] * len(rows),
                     calls=[1] * len(rows), p2p=[False] * len(rows), op=[0] * len(rows))
    ranks = RankRows(rank=list(range(n_r)), node=[f"node-{r // 2}" for r in range(n_r)], steps=[n_s] * n_r,
                     step_time_ns=[step_ms * MS] * n_r, step=[INTERIOR] * n_r, start_ns=[0] * n_r,
                     end_ns=[int(n_s * step_ms * MS)] * n_r)
    return WindowDigest("j", 0, int(n_s * step_ms * MS), ranks=ranks, colls=colls)


def one_role(n: int) -> dict[int, np.ndarray]:
    return {0: np.arange(n)}


def test_one_straggler_costs_its_excess():
    # rank 2 does 100 ms more work per 1 s step: the three others wait 100 ms for it
    w = np.full((4, 6), 100.0)
    w[2] = 0.0
    wc = window_cost(digest(w), np.arange(4), one_role(4))
    assert wc is not None
    assert wc.step_ns == pytest.approx(1000 * MS)
    assert wc.ideal_ns == pytest.approx(900 * MS)
    assert wc.slowdown == pytest.approx(1000 / 900)
    assert wc.cost_of([2]) == pytest.approx(1000 / 900)
    assert wc.cost_of([0]) == pytest.approx(1.0)
    assert wc.cost_of([0, 1, 3]) == pytest.approx(1.0)


def test_healthy_noise_is_kept_in_the_ideal():
    # every rank jitters a little around the others: the slowest of them paces a healthy job too
    rng = np.random.default_rng(1)
    w = 20.0 + rng.normal(0.0, 3.0, size=(8, 30))
    wc = window_cost(digest(w - w.min(axis=0)), np.arange(8), one_role(8))
    # (a rank's median over 30 noisy steps is a little off its peers': that small bias is all that remains)
    assert wc.slowdown == pytest.approx(1.0, abs=2e-3)
    assert max(wc.cost_of([r]) for r in range(8)) == pytest.approx(1.0, abs=2e-3)


def test_a_one_off_pause_is_an_outlier_and_costs():
    # rank 5 pauses 300 ms in step 4 (a GC pass): everyone else waits for it in that step only
    rng = np.random.default_rng(2)
    w = 20.0 + rng.normal(0.0, 1.0, size=(8, 10))
    w[:, 4] += 300.0
    w[5, 4] -= 300.0
    w = w - w.min(axis=0)
    wc = window_cost(digest(w), np.arange(8), one_role(8))
    # the pause delays one step of ten by ~300 ms: ~30 ms per step on average
    assert 1.02 < wc.slowdown < 1.04
    assert wc.cost_of([5]) == pytest.approx(wc.slowdown, rel=2e-3)
    assert max(wc.cost_of([r]) for r in range(8) if r != 5) < 1.003


def test_roles_have_their_own_typical_level():
    # two roles that wait differently by design (a pipeline's stages): no straggler in either
    w = np.zeros((6, 5))
    w[3:] = 200.0
    roles = {0: np.arange(3), 1: np.arange(3, 6)}
    assert window_cost(digest(w), np.arange(6), roles).slowdown == pytest.approx(1.0)


def test_row_order_changes_nothing():
    rng = np.random.default_rng(3)
    w = np.abs(rng.normal(50.0, 20.0, size=(6, 8)))
    w[1] = 0.0
    a = window_cost(digest(w), np.arange(6), one_role(6))
    b = window_cost(digest(w, order=rng.permutation(48)), np.arange(6), one_role(6))
    assert (a.slowdown, a.cost_of([1])) == (b.slowdown, b.cost_of([1]))
    np.testing.assert_array_equal(wait_matrix(digest(w), np.arange(6))[1],
                                  wait_matrix(digest(w, order=rng.permutation(48)), np.arange(6))[1])


def test_too_few_steps_or_no_collectives():
    assert window_cost(digest(np.zeros((4, 2))), np.arange(4), one_role(4)) is None
    d = digest(np.zeros((4, 5)))
    d.colls = CollRows()
    assert window_cost(d, np.arange(4), one_role(4)) is None


def slow(scope="rank", culprits=(2,), evidence=None, kind="slow") -> Finding:
    return Finding(kind=kind, component="gpu", scope=scope, culprits=list(culprits), evidence=evidence or {})


def test_verdict_fields():
    w = np.full((4, 6), 100.0)
    w[2] = 0.0
    wc = window_cost(digest(w), np.arange(4), one_role(4))
    rank, hang, everyone = finding_costs(wc, [slow(), slow(kind="hang"), slow(culprits=range(4))], world=64)
    assert rank == {"job_slowdown": 1.1111, "cost": 1.1111, "gpu_hours_lost_per_hour": round(64 * (1 - 1 / 1.1111), 4)}
    assert hang["cost"] is None and hang["job_slowdown"] == 1.1111
    assert everyone["cost"] is None   # every rank alike, nothing declared: a job-wide cause the waits cannot price
    assert finding_costs(None, [slow()], 64) == [{"job_slowdown": None, "cost": None, "gpu_hours_lost_per_hour": None}]
    assert lost_gpu_hours_per_hour(4096, 1.25) == pytest.approx(819.2)


def test_job_wide_causes_add_their_declared_excess():
    # rank 2's 100 ms straggle, and every rank's loader on the critical path for 10% of the step
    w = np.full((4, 6), 100.0)
    w[2] = 0.0
    wc = window_cost(digest(w), np.arange(4), one_role(4))
    loader = slow(scope="job", culprits=range(4), evidence={"loader_beta": {"median": 0.1, "expected_max": 0.1}})
    rank, job = finding_costs(wc, [slow(), loader], world=4)
    ideal = 900.0 - 100.0   # ms: the straggle and the loader's 100 ms (10% of the measured 1 s step) removed
    assert job["job_slowdown"] == round(1000.0 / ideal, 4) == rank["job_slowdown"]
    assert job["cost"] == round((ideal + 100.0) / ideal, 4)
    assert rank["cost"] == round((ideal + 100.0) / ideal, 4)


def test_declared_excess():
    assert declared_excess_ns({"stage": {"culprit": 0}, "compute_ns_per_step": {
        "culprit": 800, "other_stages_median": 500, "ratio": 1.6}}, 1000) == 300
    assert declared_excess_ns({"loader_beta": {"median": 0.25}}, 1000) == 250
    assert declared_excess_ns({"k1": {"now_ns_per_step": 15, "reference_ns_per_step": 10},
                               "k2": {"now_ns_per_step": 9, "reference_ns_per_step": 10}}, 1000) == 5
    assert declared_excess_ns({"inter_node_bandwidth_share_of_link": {"median": 0.04}}, 1000) is None
    assert declared_excess_ns({"loader_beta": {"median": "x"}}, 1000) is None


def test_one_cause_declared_by_several_findings_counts_once():
    # a slow stage spread over two nodes: one finding per node, the same stage and excess
    w = np.zeros((4, 6))
    wc = window_cost(digest(w), np.arange(4), one_role(4))
    ev = {"stage": {"culprit": 0, "stages": 2},
          "compute_ns_per_step": {"culprit": 300 * MS, "other_stages_median": 200 * MS}}
    a, b = finding_costs(wc, [slow(scope="node", culprits=(0, 1), evidence=ev),
                              slow(scope="node", culprits=(2, 3), evidence=ev)], world=4)
    assert a["job_slowdown"] == b["job_slowdown"] == round(1000 / 900, 4)
    assert a["cost"] == b["cost"] == round(1000 / 900, 4)


def test_simulated_window_cost_ignores_row_order(tmp_path):
    """Batch and streaming merge a job window's rows in different orders: the cost must not move."""
    import msgspec

    from eroica.bench.cost import job_windows
    from eroica.producers.simulator import SimConfig, write_jsonl

    from .layout import infer_layout
    from .patterns import build_patterns

    path = tmp_path / "run.jsonl"
    write_jsonl(SimConfig(nodes=2, gpus=4, steps=16, faults=["gpu_throttle:rank=5"], seed=4), path, truth_path=False)
    (jw, meta, verdicts), *_ = job_windows(path, 5 * 10**9)
    rng = np.random.default_rng(0)

    def shuffled(rows):
        n = len(getattr(rows, type(rows).__struct_fields__[0]))
        idx = rng.permutation(n).tolist()
        return type(rows)(**{f: [getattr(rows, f)[i] for i in idx] for f in type(rows).__struct_fields__})

    other = msgspec.structs.replace(jw, colls=shuffled(jw.colls), ranks=shuffled(jw.ranks))
    costs = []
    for d in (jw, other):
        p = build_patterns(d)
        wc = window_cost(d, p.ranks, infer_layout(d, meta).peer_groups(p.ranks))
        costs.append((wc.slowdown, wc.ideal_ns, [wc.cost_of([r]) for r in p.ranks.tolist()]))
    assert costs[0] == costs[1]
    assert max(range(8), key=lambda r: costs[0][2][r]) == 5


# --- the network's job-wide causes, priced from the link share (hand-built evidence) -------------------

def net_evidence(share: float, transfer_ms: float, exposed_ms: float, waiting_ms: float = 0.0,
                 congested: bool = False, nvlink: tuple[float, float] | None = None) -> dict:
    ev = {"inter_node_bandwidth_share_of_link": {"median": share, "link_Bps": 50e9, "groups": ["dp"],
                                                 "transfer_ns_per_step": int(transfer_ms * MS)},
          "collective_ns_per_step": {"exposed": int(exposed_ms * MS), "waiting": int(waiting_ms * MS)}}
    if congested:
        ev["congested_nodes"] = {"culprit": ["node-0", "node-1"]}
    if nvlink is not None:
        ev["nvlink_Bps"] = {"median": 0.0, "intra_node_transfer_ns_per_step": int(nvlink[0] * MS),
                            "intra_node_bus_Bps": nvlink[1]}
    return ev


def test_a_slow_fabric_costs_its_transfers_at_the_healthy_bandwidth():
    # 400 ms of inter-node transfer per step at 35% of the wire; a healthy RDMA path moves the same bytes
    # at RDMA_BUS_SHARE of it: 400 x 0.35 / 0.875 = 160 ms, so 240 ms per step are the fabric's
    ev = net_evidence(0.35, 400.0, exposed_ms=600.0, waiting_ms=60.0, congested=True)
    name, excess = network_excess_ns(ev, kept_wait_ns=0.0)
    assert name == "inter-node bandwidth"
    assert excess == pytest.approx(400 * MS * (1 - 0.35 / RDMA_BUS_SHARE))
    # the rings finish apart: the waiting the waits' ideal keeps shrinks with the transfers
    _, excess = network_excess_ns(ev, kept_wait_ns=50 * MS)
    assert excess == pytest.approx(450 * MS * (1 - 0.35 / RDMA_BUS_SHARE))


def test_nccl_off_rdma_and_nvlink_both_count():
    # TCP sockets at 4% of the wire, and the intra-node all-reduce over shared memory at 20 GB/s
    ev = net_evidence(0.04, 2000.0, exposed_ms=3000.0, nvlink=(700.0, 20e9))
    name, excess = network_excess_ns(ev)
    assert name == "inter-node bandwidth + nvlink"
    assert excess == pytest.approx(2000 * MS * (1 - 0.04 / RDMA_BUS_SHARE) + 700 * MS * (1 - 20e9 / NVLINK_BUS_Bps))
    # a config finding that names NVLink only (the inter-node path above BW_CONFIG) prices NVLink only
    name, excess = network_excess_ns(net_evidence(0.5, 2000.0, exposed_ms=3000.0, nvlink=(700.0, 20e9)))
    assert name == "nvlink" and excess == pytest.approx(700 * MS * (1 - 20e9 / NVLINK_BUS_Bps))
    # nothing to price: neither named
    assert network_excess_ns(net_evidence(0.5, 2000.0, exposed_ms=3000.0)) is None


def test_overlapped_collectives_cost_only_their_exposed_part():
    # 400 ms of slow transfer, but compute hides all but 100 ms of the collectives; 30 ms of that is waiting
    # for a straggler (priced by the waits, not the network's)
    ev = net_evidence(0.04, 400.0, exposed_ms=100.0, waiting_ms=30.0)
    assert network_excess_ns(ev)[1] == pytest.approx(70 * MS)
    # a healthy share prices nothing
    assert network_excess_ns(net_evidence(0.9, 400.0, exposed_ms=400.0, congested=True))[1] == 0.0


def test_old_evidence_without_transfer_times_stays_unpriced():
    ev = net_evidence(0.04, 400.0, exposed_ms=400.0)
    del ev["collective_ns_per_step"]
    assert declared_excess_ns(ev, 1000 * MS) is None


def test_a_slow_network_is_priced_beyond_the_2x_cap():
    # every rank alike (no straggler): 800 ms of each 1 s step are inter-node transfers over sockets
    wc = window_cost(digest(np.zeros((4, 6))), np.arange(4), one_role(4))
    cfg = Finding(kind="slow", component="config", scope="job", culprits=[],
                  evidence=net_evidence(0.04, 800.0, exposed_ms=850.0))
    (out,) = finding_costs(wc, [cfg], world=4)
    ideal = 1000.0 - 800.0 * (1 - 0.04 / RDMA_BUS_SHARE)
    assert out["job_slowdown"] == round(1000.0 / ideal, 4) == out["cost"]
    assert out["job_slowdown"] > 2.0


# --- a communicator paced by one member's slow data path ---------------------------------------------

def ring_digest(copy_ms: dict[int, float] | None = None, n_s: int = 6, step_ms: float = 1000.0) -> WindowDigest:
    """12 ranks: three rings of 4 (ranks 0-3, 4-7, 8-11; ring 0-3 moves its data 100 ms slower) and four
    groups of 3 that join a member of each ring (r, r+4, r+8), in which the fast rings' members wait for the
    slow ring. ``copy_ms``: memcpy time per step of some ranks (others: 5 ms)."""
    rows = []
    for s in range(n_s):
        for ring in range(3):
            for k in range(4):
                rows.append((ring * 4 + k, f"ring{ring}", s, 110.0 if ring == 0 else 10.0))
        for k in range(4):
            for ring in range(3):
                rows.append((ring * 4 + k, f"sync{k}", s, 5.0 + (0.0 if ring == 0 else 100.0)))
    colls = CollRows(rank=[r for r, *_ in rows], group=[g for _, g, *_ in rows], step=[s for _, _, s, _ in rows],
                     dur_ns=[int(ms * MS) for *_, ms in rows], bytes=[1e9] * len(rows), calls=[1] * len(rows),
                     p2p=[False] * len(rows), op=[0] * len(rows))
    n_r = 12
    ranks = RankRows(rank=list(range(n_r)), node=[f"node-{r % 4}" for r in range(n_r)], steps=[n_s] * n_r,
                     step_time_ns=[step_ms * MS] * n_r, step=[INTERIOR] * n_r, start_ns=[0] * n_r,
                     end_ns=[int(n_s * step_ms * MS)] * n_r)
    copies = {r: 5.0 for r in range(n_r)} | (copy_ms or {})
    fns = FnRows(rank=list(range(n_r)), fn=["Memcpy HtoD"] * n_r, stack=[""] * n_r, kind=[KIND_CODE["memcpy"]] * n_r,
                 count=[n_s] * n_r, total_ns=[copies[r] * MS * n_s for r in range(n_r)],
                 excl_ns=[copies[r] * MS * n_s for r in range(n_r)], median_ns=[copies[r] * MS for r in range(n_r)],
                 p90_ns=[copies[r] * MS for r in range(n_r)], p99_ns=[copies[r] * MS for r in range(n_r)],
                 per_step_ns=[copies[r] * MS for r in range(n_r)], step=[INTERIOR] * n_r, steps=[n_s] * n_r,
                 low_ns=[copies[r] * MS for r in range(n_r)])
    return WindowDigest("j", 0, int(n_s * step_ms * MS), ranks=ranks, fns=fns, colls=colls)


def test_a_slow_ring_without_a_pacer_costs_all_its_members_alike():
    # a slow link (a NIC, the fabric): nobody's own path is slow, the ring's members are alike
    wc = window_cost(ring_digest(), np.arange(12), one_role(12))
    assert wc.slowdown == pytest.approx(1000 / 900)
    assert wc.paced == ()
    assert wc.cost_of([0]) == wc.cost_of([2]) == pytest.approx(1000 / 900)
    assert wc.cost_of([4]) == pytest.approx(1.0)


def test_a_ring_paced_by_one_members_slow_copies_is_that_members_cost():
    # rank 2 copies at a quarter of the speed (its PCIe link trained down): the ring's excess is its
    wc = window_cost(ring_digest({2: 20.0}), np.arange(12), one_role(12))
    assert wc.slowdown == pytest.approx(1000 / 900)   # S does not change, only who is charged
    assert wc.cost_of([2]) == pytest.approx(1000 / 900)
    assert wc.cost_of([0]) == pytest.approx(1.0)
    assert wc.cost_of([0, 1, 3]) == pytest.approx(1.0)
    assert wc.cost_of([0, 1, 2, 3]) == pytest.approx(1000 / 900)
    # copies a little slower (jitter, a busier host) mark no pacer
    assert window_cost(ring_digest({2: 6.0}), np.arange(12), one_role(12)).paced == ()


def test_copy_time_per_step_ignores_row_order():
    d = ring_digest({2: 20.0, 7: 6.5})
    rev = msgspec_replace_fns(d, list(reversed(range(12))))
    np.testing.assert_array_equal(copy_ns_per_step(d, np.arange(12)), copy_ns_per_step(rev, np.arange(12)))
    assert slow_copy_ranks(copy_ns_per_step(d, np.arange(12)), one_role(12)).nonzero()[0].tolist() == [2]


def msgspec_replace_fns(d: WindowDigest, idx: list[int]) -> WindowDigest:
    import msgspec

    f = d.fns
    return msgspec.structs.replace(d, fns=type(f)(**{k: [getattr(f, k)[i] for i in idx]
                                                      for k in type(f).__struct_fields__}))
