"""Like with like: port classes, rail anomalies, link capacity, communicator families, GPU classes, NVLink.

Hand-built counter summaries and communicator stats, one physical situation
per test: what a real node reports beside its rails must never read as a
degraded or flaky rail, and a real rail fault must still be found.
"""

from __future__ import annotations

import numpy as np
import pytest

from eroica.models.columns import OP_CODE, from_records
from eroica.models.records import NicRecord

from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary, summarise_nic
from .expected import bus_bandwidth, inter_node_bandwidth_ratio, link_capacity_Bps
from .layout import Layout
from .link_findings import nvlink_counter_findings
from .links import group_through, nic_anomalies, slow_groups
from .ports import FRONTEND, IDLE, RAIL, VIRTUAL, classify
from . import attribution as attr

RAIL_BPS = 5e9   # a rail's mean tx + rx over the window


def port(gbps: float | None, tput: float, errors: float = 0.0, up: float = 1.0, **extra: float) -> dict[str, float]:
    m = {"link_gbps": np.nan if gbps is None else gbps, "throughput_Bps": tput, "throughput_cv": 0.5,
         "link_up_min": up, "rx_errors_inc": errors, "symbol_errors_inc": 0.0, "link_downed_inc": 0.0,
         "tx_discards_inc": 0.0, "retransmits_inc": 0.0, "cnp_sent_inc": 10.0, "xmit_wait_inc": 100.0}
    m.update(extra)
    return m


def fleet(nodes: int = 4, rails: int = 8, frontend: bool = True, rail_gbps=lambda n, i: 400.0,
          rail_tput=lambda n, i: RAIL_BPS) -> CounterSummary:
    """Rails mlx5_0..; with ``frontend``, what a real node reports beside them."""
    nic: dict[tuple[str, str], dict[str, float]] = {}
    for n in range(nodes):
        node = f"node-{n}"
        for i in range(rails):
            nic[(node, f"mlx5_{i}")] = port(rail_gbps(n, i), rail_tput(n, i) * (1 + 0.02 * ((i + n) % 3)))
        if frontend:
            nic[(node, "eth0")] = port(100.0 if n % 2 == 0 else 200.0, 2e7, errors=300.0 if n % 2 else 0.0)
            nic[(node, "eno1")] = port(1.0, 5e4, errors=250.0)            # management, with its usual errors
            nic[(node, "bond0")] = port(50.0, 3e7)
            nic[(node, "ib0")] = port(400.0, 2e6)                          # IPoIB: a rail's speed, no traffic
            nic[(node, "lo")] = port(None, 5e7)
            nic[(node, "docker0")] = port(None, 0.0, up=0.0)
            nic[(node, "veth3f2a")] = port(10.0, 1e4)
    return CounterSummary(nic=nic)


def classes(c: CounterSummary) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for p in classify(c).ports.values():
        out.setdefault(p.cls, set()).add(p.nic)
    return out


# --- classification -----------------------------------------------------------

def test_rails_frontend_and_virtual_ports_are_told_apart_from_the_data():
    got = classes(fleet())
    assert got[RAIL] == {f"mlx5_{i}" for i in range(8)}
    assert got[FRONTEND] == {"eth0", "eno1", "bond0", "ib0"}       # ib0 has a rail's speed but not its traffic
    assert got[VIRTUAL] == {"lo", "docker0", "veth3f2a"}


def test_a_checkpoint_burst_on_one_nodes_front_end_does_not_make_it_a_rail():
    c = fleet()
    c.nic[("node-1", "eth0")]["throughput_Bps"] = 3 * RAIL_BPS      # busier than the rails, on one node
    c.nic[("node-1", "eth0")]["rx_errors_inc"] = 400.0
    assert classify(c).ports[("node-1", "eth0")].cls == FRONTEND
    assert nic_anomalies(c) == []


def test_front_end_carrying_the_collectives_on_every_node_is_the_rail():
    # NCCL over sockets on eth0, RDMA ports idle: the data says eth0 carries the job.
    nic = {}
    for n in range(3):
        nic[(f"n{n}", "eth0")] = port(100.0, 4e9)
        for i in range(2):
            nic[(f"n{n}", f"mlx5_{i}")] = port(400.0, 1e5)
    got = classes(CounterSummary(nic=nic))
    assert got[RAIL] == {"eth0"} and got[FRONTEND] == {"mlx5_0", "mlx5_1"}


def test_collectives_on_the_front_end_beside_idle_rdma_ports_are_a_bypassed_path():
    # NCCL over TCP: eth0 carries the rings (so it is the rail), the 400G RDMA ports sit idle.
    from .expected import BW_CONFIG, _bypassed_path
    from .ports import bypassed_ports
    nic = {}
    for n in range(4):
        nic[(f"node-{n}", "eth0")] = port(100.0, 1.2e10)
        nic[(f"node-{n}", "lo")] = port(None, 5e7)
        for i in range(8):
            nic[(f"node-{n}", f"mlx5_{i}")] = port(400.0, 1e4)
    c = CounterSummary(nic=nic)
    pm = classify(c)
    assert {p.nic for p in pm.rails} == {"eth0"}
    fast = bypassed_ports(pm, c)
    assert sorted(fast) == [f"node-{n}" for n in range(4)] and all(len(v) == 8 for v in fast.values())
    layout = Layout({r: f"node-{r // 8}" for r in range(32)}, {})
    rings = [_group(f"dp{i}", [i + 8 * k for k in range(4)], 1e9, nbytes=2e9) for i in range(8)]
    coll = CollectiveStats(np.arange(32), np.zeros(32), np.zeros(32), rings)
    ratio, _ = inter_node_bandwidth_ratio(coll, c, layout, pm)
    assert ratio > BW_CONFIG      # against eth0's own speed nothing is wrong ...
    got = _bypassed_path(pm, c, coll, layout, ratio * link_capacity_Bps(c, pm, {f"node-{n}": 8 for n in range(4)}))
    assert got is not None and got["share_of_link"] < BW_CONFIG     # ... against the idle 400G ports it is
    assert got["carrying"] == ["eth0"] and got["idle"] == [f"mlx5_{i}" for i in range(8)]
    # RDMA ports that are down are no path the job could have taken; and on a minority of nodes, no config
    for n in range(4):
        for i in range(8):
            c.nic[(f"node-{n}", f"mlx5_{i}")]["link_up_min"] = 0.0 if n < 3 else 1.0
    assert sorted(bypassed_ports(classify(c), c)) == ["node-3"]
    assert _bypassed_path(classify(c), c, coll, layout, 1e8) is None


def test_a_healthy_fleet_bypasses_nothing():
    # rails busy; eth0 slower, ib0 (IPoIB) at the rails' own speed: no faster idle path
    from .ports import bypassed_ports
    c = fleet()
    assert bypassed_ports(classify(c), c) == {}


def test_without_link_speeds_traffic_decides_and_without_traffic_speed_does():
    no_speed = fleet(frontend=False)
    for m in no_speed.nic.values():
        m["link_gbps"] = np.nan
    no_speed.nic[("node-0", "eth0")] = port(None, 1e7)
    assert classes(no_speed)[RAIL] == {f"mlx5_{i}" for i in range(8)}
    no_tput = fleet()
    for k, m in no_tput.nic.items():
        m["throughput_Bps"] = np.nan
    got = classes(no_tput)
    assert {f"mlx5_{i}" for i in range(8)} <= got[RAIL] and "eth0" not in got[RAIL]


def test_a_rail_that_went_down_here_stays_a_rail_an_idle_one_does_not():
    c = fleet()
    c.nic[("node-1", "mlx5_2")].update(throughput_Bps=1e5, link_up_min=0.0, link_downed_inc=1.0)
    c.nic[("node-2", "mlx5_6")].update(throughput_Bps=1e5)     # unused on this node, link fine
    pm = classify(c)
    assert pm.ports[("node-1", "mlx5_2")].cls == RAIL and pm.ports[("node-2", "mlx5_6")].cls == IDLE
    got = {(a.node, a.nic, a.kind) for a in nic_anomalies(c, pm)}
    assert got == {("node-1", "mlx5_2", "flaky")}


# --- rail anomalies --------------------------------------------------------------

def test_front_end_management_and_virtual_ports_are_never_blamed():
    assert nic_anomalies(fleet()) == []


def test_a_degraded_rail_is_found_beside_front_end_ports():
    c = fleet(rail_gbps=lambda n, i: 200.0 if (n, i) == (2, 3) else 400.0)
    got = [(a.node, a.nic, a.kind) for a in nic_anomalies(c)]
    assert got == [("node-2", "mlx5_3", "degraded")]


def test_a_node_type_with_slower_rails_is_not_degraded():
    # node-3 is another node type: all its rails at 200 (and its eth0 at 200 too).
    c = fleet(rail_gbps=lambda n, i: 200.0 if n == 3 else 400.0)
    assert nic_anomalies(c) == []
    # ... but one of its rails below its own others still is.
    c = fleet(rail_gbps=lambda n, i: (100.0 if i == 5 else 200.0) if n == 3 else 400.0)
    assert [(a.node, a.nic, a.kind) for a in nic_anomalies(c)] == [("node-3", "mlx5_5", "degraded")]


def test_a_rail_with_climbing_errors_is_flaky_management_errors_are_not():
    c = fleet()
    c.nic[("node-1", "mlx5_3")].update(symbol_errors_inc=80000.0, retransmits_inc=8000.0)
    got = [(a.node, a.nic, a.kind) for a in nic_anomalies(c)]
    assert got == [("node-1", "mlx5_3", "flaky")]


def test_congestion_is_judged_among_rails():
    c = fleet()
    for n in (1, 2):
        for i in range(8):
            c.nic[(f"node-{n}", f"mlx5_{i}")].update(cnp_sent_inc=50000.0, xmit_wait_inc=1e6)
    c.nic[("node-0", "eth0")]["cnp_sent_inc"] = 1e6      # a front-end port: not the job's fabric
    got = {(a.node, a.kind) for a in nic_anomalies(c)}
    assert got == {("node-1", "congested"), ("node-2", "congested")}


# --- capacity and bandwidth -----------------------------------------------------

def _group(name: str, ranks: list[int], t_ns: float, nbytes: float = np.nan, op: str = "all_reduce",
           intra: bool = False, p2p: bool = False) -> GroupStats:
    return GroupStats(name=name, ranks=np.array(ranks), intra_node=intra, transfer_per_step=t_ns,
                      bytes_per_step=nbytes, instances=10, p2p=p2p, op=OP_CODE[op])


def test_link_capacity_counts_rails_only_and_shares_a_node_among_its_ranks():
    assert link_capacity_Bps(fleet()) == pytest.approx(400e9 / 8)
    # 4 rails for 8 ranks per node: each rank gets half a rail.
    c = fleet(rails=4)
    assert link_capacity_Bps(c, ranks_per_node={f"node-{n}": 8 for n in range(4)}) == pytest.approx(200e9 / 8)


def test_bus_bandwidth_takes_the_algorithm_factor_out():
    g = _group("dp", [0, 8, 16, 24], 1e9, nbytes=4e9, op="reduce_scatter")
    assert bus_bandwidth(g) == pytest.approx(4e9 * 3 / 4)
    g = _group("dp", [0, 8, 16, 24], 1e9, nbytes=4e9, op="all_reduce")
    assert bus_bandwidth(g) == pytest.approx(4e9 * 2 * 3 / 4)


def test_inter_node_bandwidth_ratio_ignores_front_end_ports_and_p2p():
    c = fleet(rails=2)
    layout = Layout({r: f"node-{r // 2}" for r in range(8)}, {})
    rings = [_group(f"dp{i}", [i, 2 + i, 4 + i, 6 + i], 1e9, nbytes=40e9, op="all_reduce") for i in range(2)]
    p2p = _group("pp", [0, 2], 5e9, nbytes=1e6, op="send", p2p=True)
    coll = CollectiveStats(np.arange(8), np.zeros(8), np.zeros(8), rings + [p2p])
    ratio, names = inter_node_bandwidth_ratio(coll, c, layout)
    assert names == ["dp0", "dp1"]
    assert ratio == pytest.approx(40e9 * 1.5 / (400e9 / 8))   # busbw against one rail per rank


# --- communicator families --------------------------------------------------------

def _pp_dp_rings(bytes_known: bool) -> tuple[CollectiveStats, dict[int, int]]:
    """4 stages x 4 DP rings of 4 ranks; the last stage has 1.6x the layers, so 1.6x the gradient."""
    groups, stage = [], {}
    for s in range(4):
        scale = 1.6 if s == 3 else 1.0
        for t in range(4):
            ranks = [s * 16 + t + 4 * k for k in range(4)]
            stage.update({r: s for r in ranks})
            groups.append(_group(f"dp-s{s}-t{t}", ranks, scale * 1e8 * (1 + 0.01 * t),
                                 nbytes=scale * 4e9 if bytes_known else np.nan, op="reduce_scatter"))
    groups.append(_group("pp", [3, 19], 4e8, op="send", p2p=True))   # a long bubble
    return CollectiveStats(np.arange(64), np.zeros(64), np.zeros(64), groups), stage


def test_a_stage_with_more_layers_is_not_a_slow_link():
    step = 1e9
    for known in (True, False):
        coll, stage = _pp_dp_rings(known)
        assert slow_groups(coll, step, stage) == []
    coll, stage = _pp_dp_rings(False)
    # Without the stages, transfer times alone read the heavy stage's rings as slow links.
    assert {s.group.name for s in slow_groups(coll, step)} == {f"dp-s3-t{t}" for t in range(4)}
    coll.groups[1].transfer_per_step *= 2     # one ring of stage 0 really slow
    assert [s.group.name for s in slow_groups(coll, step, stage)] == ["dp-s0-t1"]


def test_the_same_communicator_names_a_nodes_link_problem_whichever_test_asks():
    coll, stage = _pp_dp_rings(True)
    coll.groups[2].transfer_per_step *= 1.8
    ranks = set(coll.groups[2].ranks.tolist())
    assert group_through(coll, ranks, stage) == "dp-s0-t2"
    assert group_through(coll, ranks | {0}, stage) == "dp-s0-t2"     # the slowest through the node, not the first
    assert group_through(coll, {999}, stage) == ""


# --- GPUs like with like -----------------------------------------------------------

def _gpus(spec: dict[int, tuple[float, float, float]]) -> CounterSummary:
    """rank -> (max clock, clock, throttle share); H100 SXM 1980 MHz / 700 W, H100 PCIe 1755 MHz / 350 W."""
    gpu = {}
    for r, (mx, clock, share) in spec.items():
        gpu[r] = {"max_sm_clock_mhz": mx, "sm_clock_mhz": clock, "clock_ratio": clock / mx,
                  "power_limit_w": 700.0 if mx > 1900 else 350.0, "throttle_share": share,
                  "mem_total_bytes": 80e9}
    return CounterSummary(gpu=gpu, gpu_index={r: r % 8 for r in spec})


def test_a_lower_ceiling_gpu_class_is_not_throttled():
    spec = {r: (1980.0, 1980.0, 0.0) for r in range(8)}
    spec.update({r: (1755.0, 1755.0, 0.8) for r in range(8, 16)})   # the whole class sits at its power cap
    c = _gpus(spec)
    peers = [r for r in range(16) if r != 9]
    comp, why = attr.kernel_component(c, 9, 0.2, 1.0, peers)
    # Its clock is at its own ceiling and its class sits at the power cap alike: not throttled.
    assert "SM clock 1755 of" not in why and "clock-event" not in why
    assert comp == "gpu" and why.endswith("not throttled") and "max SM clock 1755 vs 1980" in why
    ev = attr.gpu_evidence(c, 9, peers)
    assert ev["sm_clock_mhz"]["peer_median"] == 1755.0 and ev["gpu_class"]["other_class_peers"] == 8
    assert attr.gpu_classes(c, list(range(16))) == {r: int(r >= 8) for r in range(16)}


def test_a_throttled_gpu_is_judged_against_its_own_ceiling_and_class():
    spec = {r: (1980.0, 1980.0, 0.0) for r in range(8)}
    spec.update({r: (1755.0, 1755.0, 0.0) for r in range(8, 16)})
    spec[12] = (1755.0, 1350.0, 0.9)
    comp, why = attr.kernel_component(_gpus(spec), 12, 0.2, 1.0, [r for r in range(16) if r != 12])
    assert comp == "gpu" and "1350 of 1755" in why


# --- NVLink from the counters ---------------------------------------------------------

def _tp_node(nodes: int, bad: int | None) -> tuple[Layout, CounterSummary, CollectiveStats]:
    gpu, groups = {}, []
    for n in range(nodes):
        ranks = list(range(8 * n, 8 * n + 8))
        for r in ranks:
            nv = 0.0 if r == bad else (0.5 if bad is not None and abs(r - bad) == 1 else 1.0) * 2e11
            gpu[r] = {"nvlink_tx_Bps": nv / 2, "nvlink_rx_Bps": nv / 2, "max_sm_clock_mhz": 1980.0}
        groups.append(_group(f"tp{n}", ranks, 2e8 * (3 if bad in ranks else 1), nbytes=2e9, intra=True))
    layout = Layout({r: f"node-{r // 8}" for r in range(8 * nodes)}, {})
    c = CounterSummary(gpu=gpu, gpu_index={r: r % 8 for r in gpu})
    return layout, c, CollectiveStats(np.arange(8 * nodes), np.zeros(8 * nodes), np.zeros(8 * nodes), groups)


@pytest.mark.parametrize("nodes", [1, 2])
def test_one_gpus_nvlink_is_found_from_its_counters_on_small_jobs(nodes):
    layout, c, coll = _tp_node(nodes, bad=5)
    found = nvlink_counter_findings(layout, c, coll, 1e9, [], set())
    assert [(f.component, f.scope, f.rank, f.gpu, f.fn) for f in found] == [("nvlink", "rank", 5, 5, "tp0")]
    assert found[0].confidence >= 0.9
    if nodes == 2:
        assert found[0].slowdown == pytest.approx(3.0)


def test_healthy_nvlink_counters_find_nothing():
    layout, c, coll = _tp_node(2, bad=None)
    assert nvlink_counter_findings(layout, c, coll, 1e9, [], set()) == []


# --- cumulative counters across a reset ----------------------------------------------

def test_a_counter_reset_is_not_an_increase():
    # A driver reload mid-window: xmit_wait 1e9 -> 1e9+50 -> (reset) 5 -> 20, records out of time order.
    vals = [(3, 20), (0, 1_000_000_000), (2, 5), (1, 1_000_000_050)]
    recs = [NicRecord(job="j", node="n0", nic="mlx5_0", ts_ns=t, xmit_wait=v, rx_errors=t) for t, v in vals]
    m = summarise_nic(from_records("nic", recs))[("n0", "mlx5_0")]
    assert m["xmit_wait_inc"] == 50 + 5 + 15
    assert m["rx_errors_inc"] == 3


def test_a_second_port_of_a_device_is_a_port_of_its_own():
    # Dual-port HCA: port 1 at 1000 errors, port 2 at 50, sampled alternately.
    recs = [NicRecord(job="j", node="n0", nic="mlx5_0", ts_ns=t, port=1 + t % 2,
                      rx_errors=(1000 if t % 2 == 0 else 50) + t) for t in range(6)]
    s = summarise_nic(from_records("nic", recs))
    assert set(s) == {("n0", "mlx5_0"), ("n0", "mlx5_0:2")}
    assert s[("n0", "mlx5_0")]["rx_errors_inc"] == 4 and s[("n0", "mlx5_0:2")]["rx_errors_inc"] == 4


def test_nodes_without_congestion_counters_are_blind_not_quiet():
    from .expected import _nodes_without_congestion_counters
    c = fleet()
    for i in range(8):
        for k in ("cnp_sent_inc", "xmit_wait_inc"):
            c.nic[("node-2", f"mlx5_{i}")][k] = np.nan
    c.nic[("node-1", "eth0")]["cnp_sent_inc"] = np.nan     # a front-end port says nothing either way
    assert _nodes_without_congestion_counters(c, classify(c)) == ["node-2"]


def test_a_checkpoint_pause_is_not_nvlink_unused():
    from .expected import nvlink_unused
    layout, c, coll = _tp_node(1, bad=None)
    for m in c.gpu.values():   # links idle in most samples (a pause), busy in the rest
        m.update(nvlink_tx_Bps=0.0, nvlink_rx_Bps=0.0, nvlink_mean_Bps=8e10)
    assert nvlink_unused(coll, c) is None
    for m in c.gpu.values():
        m["nvlink_mean_Bps"] = 0.0
    assert nvlink_unused(coll, c) == 0.0


def test_collectives_faster_than_any_path_off_nvlink_ran_over_it_whatever_its_counters_read():
    from .expected import PCIE_MAX_BUS_BPS, bus_bandwidth, nvlink_unused
    layout, c, coll = _tp_node(1, bad=None)
    for m in c.gpu.values():   # counters sampled between the bursts of minutes-long steps: 0
        m.update(nvlink_tx_Bps=0.0, nvlink_rx_Bps=0.0, nvlink_mean_Bps=0.0)
    intra = [g for g in coll.groups if g.intra_node]
    assert all(bus_bandwidth(g) < PCIE_MAX_BUS_BPS for g in intra)
    assert nvlink_unused(coll, c) == 0.0          # PCIe speed and idle counters: NVLink is off
    for g in intra:                               # the same transfers 10x faster: 5x PCIe Gen5
        g.transfer_per_step /= 10
    assert all(bus_bandwidth(g) > PCIE_MAX_BUS_BPS for g in intra)
    assert nvlink_unused(coll, c) is None


def test_a_rail_that_stopped_reporting_its_speed_is_still_a_rail():
    c = fleet()
    c.nic[("node-3", "mlx5_4")].update(link_gbps=np.nan, throughput_Bps=1e4, link_up_min=0.0)
    pm = classify(c)
    assert pm.ports[("node-3", "mlx5_4")].cls == RAIL
    assert pm.ports[("node-3", "docker0")].cls == VIRTUAL and pm.ports[("node-3", "lo")].cls == VIRTUAL
    assert [(a.node, a.nic, a.kind) for a in nic_anomalies(c, pm)] == [("node-3", "mlx5_4", "flaky")]


def test_a_slow_ring_alone_must_persist_its_counters_confirm_at_once():
    # One TP group of four slower than its family: from the comparison alone it is no level
    # until it persists (jitter in who arrives last moves one window's transfer estimate);
    # with one GPU's NVLink counters below its ring-mates' it is that GPU's links, steady.
    from .link_findings import _nvlink_finding
    from .links import slow_groups
    from .test_expected import patterns
    from .patterns import K_KERNEL
    layout, c, coll = _tp_node(4, bad=5)
    p = patterns(np.full((32, 1), 1e8), [K_KERNEL])
    [s] = [s for s in slow_groups(coll, 1e9) if s.group.intra_node]
    f = _nvlink_finding(s, layout, c, p)
    assert (f.scope, f.rank, f.steady) == ("rank", 5, True)
    for m in c.gpu.values():                       # counters that cannot tell the GPU apart
        m.update(nvlink_tx_Bps=1e11, nvlink_rx_Bps=1e11)
    f = _nvlink_finding(s, layout, c, p)
    assert (f.scope, f.node, f.steady) == ("node", "node-0", False)


def test_send_recv_only_ports_are_judged_against_their_own_name_on_other_nodes():
    from .links import secondary_anomalies
    from .ports import secondary_ports
    # Rings on mlx5_0..3; mlx5_4..7 carry only pipeline send / recv (a twentieth of a rail's bytes).
    c = fleet(nodes=6, rail_tput=lambda n, i: RAIL_BPS if i < 4 else RAIL_BPS / 20)
    assert {p.nic for p in secondary_ports(classify(c))} >= {f"mlx5_{i}" for i in range(4, 8)}
    assert secondary_anomalies(c) == []
    c.nic[("node-2", "mlx5_5")]["rx_errors_inc"] = 500.0       # one port's errors climb
    for n in range(6):                                          # a port name every node counts errors on
        c.nic[(f"node-{n}", "mlx5_6")]["rx_errors_inc"] = 400.0 + n
    c.nic[("node-1", "mlx5_7")]["link_gbps"] = 200.0            # one port trained down
    got = {(a.node, a.nic, a.kind): a for a in secondary_anomalies(c)}
    assert sorted(got) == [("node-1", "mlx5_7", "degraded"), ("node-2", "mlx5_5", "flaky")]
    assert got[("node-1", "mlx5_7", "degraded")].evidence["link_gbps"]["same_port_median"] == 400.0
    assert got[("node-2", "mlx5_5", "flaky")].evidence["errors_increase"]["same_port_median"] == 0.0
    assert secondary_anomalies(c, classify(c)) == list(got.values())   # the window's port map, passed down
