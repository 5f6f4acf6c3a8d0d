"""The job's own best bus bandwidth as a floor under the counted link capacity (bus_reference.py)."""

from __future__ import annotations

import msgspec
import numpy as np

from eroica.models.columns import OP_CODE

from .bus_reference import PHASES, SAME_BYTES, best_bus_Bps, inter_node_groups, remember_bus
from .collectives import GroupStats
from .expected import MIN_COLL_BYTES, bus_bandwidth, expected_findings
from .history import JobHistory, decode_history, encode_history
from .patterns import K_PYTHON
from .test_expected import LAYOUT, STEP_NS, congested_rails, dp_rings, shares


def _g(name: str, bw_Bps: float, nbytes: float = 1e9, intra: bool = False, p2p: bool = False) -> GroupStats:
    return GroupStats(name, np.array([0, 4]), intra, nbytes / bw_Bps * 1e9, nbytes, 10, op=OP_CODE["all_reduce"],
                      p2p=p2p)


def test_the_floor_is_a_level_two_windows_reached_and_only_rises():
    ref = remember_bus({}, [_g("dp0", 40e9)], {"dp0": 40e9})
    assert best_bus_Bps(ref, [_g("dp0", 40e9)]) == {}                  # one window: no floor yet
    ref = remember_bus(ref, [_g("dp0", 52e9)], {"dp0": 52e9})          # one window reading high ...
    assert best_bus_Bps(ref, [_g("dp0", 40e9)]) == {"dp0": 40e9}        # ... does not set it
    ref = remember_bus(ref, [_g("dp0", 45e9)], {"dp0": 45e9})
    ref = remember_bus(ref, [_g("dp0", 20e9)], {"dp0": 20e9})          # a slowed window never lowers it
    assert ref == {"dp0": [52e9, 45e9, 1e9]}
    same = 1e9 * (1 + SAME_BYTES / 2)
    assert best_bus_Bps(ref, [_g("dp0", 20e9, nbytes=same)]) == {"dp0": 45e9}
    assert best_bus_Bps(ref, [_g("dp1", 20e9)]) == {}


def test_workload_phases_keep_their_own_floors():
    train, evals = 1e9, 1e9 * (1 + 3 * SAME_BYTES)
    ref: dict[str, list[float]] = {}
    for nbytes, bw in [(train, 40e9), (evals, 10e9), (train, 41e9), (evals, 11e9), (train, 42e9)]:
        ref = remember_bus(ref, [_g("dp0", bw, nbytes=nbytes)], {"dp0": bw})
    assert best_bus_Bps(ref, [_g("dp0", 1e9, nbytes=train)]) == {"dp0": 41e9}
    assert best_bus_Bps(ref, [_g("dp0", 1e9, nbytes=evals)]) == {"dp0": 10e9}
    for k in range(2 * PHASES):                                         # many other phases: the oldest go
        ref = remember_bus(ref, [_g("dp0", 5e9, nbytes=1e10 * (2 + k))], {"dp0": 5e9})
    assert len(ref["dp0"]) == 3 * PHASES and best_bus_Bps(ref, [_g("dp0", 1e9, nbytes=train)]) == {}


def test_only_inter_node_collectives_of_material_size_measure_the_fabric():
    groups = [_g("dp0", 40e9), _g("tp0", 200e9, intra=True), _g("pp0", 10e9, p2p=True),
              _g("tiny", 1e9, nbytes=MIN_COLL_BYTES / 2)]
    from .collectives import CollectiveStats
    coll = CollectiveStats(np.arange(8), np.zeros(8), np.zeros(8), groups)
    assert [g.name for g in inter_node_groups(coll, MIN_COLL_BYTES)] == ["dp0"]


def test_congestion_is_judged_against_the_jobs_own_best_when_the_count_is_low():
    p = shares(0.5, 0.0, K_PYTHON)
    marks = congested_rails(1e4)
    # 1 GB in 25 ms: 40 GB/s, 80% of the counted 50 GB/s rails: by the count the fabric keeps up
    assert expected_findings(p, LAYOUT, marks, dp_rings(25.0), [], STEP_NS) == []
    # the same rings moved the same bytes at 80 GB/s before: the count was low, and now they run at half that
    before = {g.name: bus_bandwidth(g) for g in dp_rings(12.5).groups}
    out = expected_findings(p, LAYOUT, marks, dp_rings(25.0), [], STEP_NS, best_bus=before)
    assert [(f.component, f.scope) for f in out] == [("network", "job")]
    share = out[0].evidence["inter_node_bandwidth_share_of_link"]
    assert share["median"] == 0.8 and share["of_job_best"] == 0.5      # of the links, and of the job's best
    assert "of their own best" in out[0].summary
    # a best below the count changes nothing (the count stays the capacity)
    slower = {g.name: bus_bandwidth(g) for g in dp_rings(50.0).groups}
    assert expected_findings(p, LAYOUT, marks, dp_rings(25.0), [], STEP_NS, best_bus=slower) == []
    # and without marks a slower window is no congestion, however it compares
    assert expected_findings(p, LAYOUT, congested_rails(0.03), dp_rings(25.0), [], STEP_NS, best_bus=before) == []


def test_whether_nccl_left_rdma_is_judged_on_the_links_not_on_the_jobs_best():
    # 1 GB in 80 ms: 12.5 GB/s, a quarter of the 50 GB/s links (RDMA's range is above BW_CONFIG's
    # 20%): not TCP, however far below a best of 80 GB/s (15.6% of it) it runs, with no marks either
    p = shares(0.5, 0.0, K_PYTHON)
    before = {g.name: bus_bandwidth(g) for g in dp_rings(12.5).groups}
    assert expected_findings(p, LAYOUT, congested_rails(0.03), dp_rings(80.0), [], STEP_NS, best_bus=before) == []
    # 1 GB in 200 ms (10% of the links) is still NCCL's config, with or without a best
    for best in (None, before):
        out = expected_findings(p, LAYOUT, congested_rails(0.03), dp_rings(200.0), [], STEP_NS, best_bus=best)
        assert [(f.component, f.fn) for f in out] == [("config", "nccl")]
        assert "10.0% of the 400 Gb/s links" in out[0].summary


def test_the_reference_travels_with_the_history_and_old_histories_read_without_it():
    h = JobHistory(job="j", bus_reference={"dp0": [45e9, 1e9]})
    assert decode_history(encode_history(h)).bus_reference == {"dp0": [45e9, 1e9]}
    old = msgspec.msgpack.encode({"job": "j", "windows": 3})       # written before the field existed
    assert decode_history(old).bus_reference == {}
