"""Slow links on hand-built communicator stats: groups compared only with groups of the same shape."""

from __future__ import annotations

import numpy as np

from eroica.models.columns import OP_CODE

from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary
from .links import MIN_RATIO, families, nic_anomalies, slow_groups

MS = 1_000_000
STEP_NS = 1000.0 * MS
AR, AG = OP_CODE["all_reduce"], OP_CODE["all_gather"]


def group(name: str, ranks: list[int], transfer_ms: float, nbytes: float = 1e9, intra: bool = False,
          op: int = AR, p2p: bool = False) -> GroupStats:
    return GroupStats(name, np.array(ranks), intra, transfer_ms * MS, nbytes, 10, p2p=p2p, op=op)


def rings(transfers: list[float], nbytes: float = 1e9) -> list[GroupStats]:
    """Rail-aligned DP rings over 4 nodes of 8 GPUs: ring i holds GPU i of every node."""
    return [group(f"dp{i}", [i + 8 * n for n in range(4)], t, nbytes) for i, t in enumerate(transfers)]


def stats(groups: list[GroupStats]) -> CollectiveStats:
    return CollectiveStats(np.arange(32), np.zeros(32), np.zeros(32), groups)


def test_one_ring_slower_than_its_siblings_is_slow():
    out = slow_groups(stats(rings([100.0] * 7 + [200.0])), STEP_NS)
    assert [(s.group.name, s.peer_groups) for s in out] == [("dp7", 7)]
    assert out[0].ratio == 2.0 and out[0].excess_ns == 100 * MS and out[0].z >= 5


def test_a_slow_ring_is_found_whatever_the_unit_of_its_cost():
    # NVLink rings at ~230 GB/s: seconds per byte of ~4e-12, below robust_z's absolute floor, which
    # once capped a 1.8x slower ring's z at 3.4. The same family in any unit gives the same z.
    for nbytes in (1e9, 230e9, 1e12):
        out = slow_groups(stats(rings([100.0 * (1 + 0.01 * (i % 3)) for i in range(7)] + [180.0], nbytes)), STEP_NS)
        assert [s.group.name for s in out] == ["dp7"], nbytes
        assert out[0].z >= 5


def test_below_the_ratio_or_the_material_bar_is_not_slow():
    assert slow_groups(stats(rings([100.0] * 7 + [100.0 * (MIN_RATIO - 0.05)])), STEP_NS) == []
    # twice as slow, but 10 ms more of a 1 s step (< 2%)
    assert slow_groups(stats(rings([10.0] * 7 + [20.0])), STEP_NS) == []


def test_groups_of_another_shape_are_never_compared():
    # the TP groups inside a node take 20x longer than the rings: another family, not a slow link
    tp = [group(f"tp{n}", list(range(8 * n, 8 * n + 8)), 2000.0, intra=True) for n in range(4)]
    ag = [group(f"ag{i}", [i + 8 * n for n in range(4)], 900.0, op=AG) for i in range(3)]
    pp = [group(f"pp{i}", [i, i + 8], 5000.0, p2p=True) for i in range(4)]
    fams = families(rings([100.0] * 8) + tp + ag + pp)
    assert sorted(sorted(g.name for g in f) for f in fams) == [
        [f"ag{i}" for i in range(3)], [f"dp{i}" for i in range(8)], [f"tp{n}" for n in range(4)]]
    assert slow_groups(stats(rings([100.0] * 8) + tp + ag + pp), STEP_NS) == []


def test_too_small_a_family_compares_nothing():
    assert slow_groups(stats(rings([100.0, 400.0])), STEP_NS) == []


def test_without_bytes_groups_over_other_stages_are_not_compared():
    # stage 1's rings reduce more gradients (more layers): longer, not slower
    stage = {r: (1 if r % 8 >= 4 else 0) for r in range(32)}
    rs = rings([100.0] * 4 + [300.0] * 4, nbytes=float("nan"))
    assert slow_groups(stats(rs), STEP_NS, stage) == []
    assert slow_groups(stats(rs), STEP_NS) == []   # even mixed in one family, a 4 v 4 split has no outlier
    rs = rings([100.0] * 4 + [300.0] * 3 + [600.0], nbytes=float("nan"))
    assert [s.group.name for s in slow_groups(stats(rs), STEP_NS, stage)] == ["dp7"]


def rail_fleet(speed: dict[tuple[str, str], float] | None = None, errors: dict[tuple[str, str], float] | None = None,
               nodes: int = 4, rails: int = 4) -> CounterSummary:
    nic = {}
    for n in range(nodes):
        for i in range(rails):
            key = (f"node-{n}", f"mlx5_{i}")
            nic[key] = {"link_gbps": (speed or {}).get(key, 400.0), "throughput_Bps": 5e9, "throughput_cv": 0.5,
                        "link_up_min": 1.0, "rx_errors_inc": (errors or {}).get(key, 2.0), "symbol_errors_inc": 0.0,
                        "link_downed_inc": 0.0, "tx_discards_inc": 0.0, "retransmits_inc": 0.0,
                        "cnp_sent_inc": 10.0, "xmit_wait_inc": 100.0}
    return CounterSummary(nic=nic)


def test_a_rail_slower_than_the_same_rail_elsewhere_and_its_node_mates_is_degraded():
    out = nic_anomalies(rail_fleet(speed={("node-2", "mlx5_1"): 200.0}))
    assert [(a.node, a.nic, a.kind) for a in out] == [("node-2", "mlx5_1", "degraded")]
    assert out[0].strength == 1.5


def test_errors_far_above_the_fleets_are_flaky_a_few_are_noise():
    assert nic_anomalies(rail_fleet(errors={("node-1", "mlx5_3"): 15.0})) == []          # under ERROR_FLOOR
    out = nic_anomalies(rail_fleet(errors={("node-1", "mlx5_3"): 500.0}))
    assert [(a.node, a.nic, a.kind) for a in out] == [("node-1", "mlx5_3", "flaky")]
