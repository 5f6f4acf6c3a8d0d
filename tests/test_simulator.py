"""The fault-injecting simulator: contract validity, determinism, collective semantics,
each fault's signature in the raw records, fault-spec errors, truth and the CLI."""

from __future__ import annotations

import io
import json
from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import parse_lines, validate_line
from eroica.producers.simulator import (FAULTS, FaultError, SimConfig, generate, parse_fault, truth,
                                        truth_path_for, write_jsonl)
from eroica.producers.simulator.program import GEMM_NN

MEM_KERNELS = {"layer_norm_kernel", "vectorized_elementwise_kernel", "softmax_warp_forward",
               "softmax_warp_backward", "layer_norm_grad_input_kernel"}


class Run:
    def __init__(self, faults=(), nodes=2, gpus=4, steps=10, seed=3, **kw):
        self.cfg = SimConfig(nodes=nodes, gpus=gpus, steps=steps, seed=seed, faults=list(faults), **kw)
        buf = io.BytesIO()
        self.truth = write_jsonl(self.cfg, buf)
        self.raw = buf.getvalue()
        self.records = [json.loads(line) for line in self.raw.splitlines()]
        self.fn = [r for r in self.records if r["type"] == "fn"]
        self.gpu = [r for r in self.records if r["type"] == "gpu"]
        self.nic = [r for r in self.records if r["type"] == "nic"]
        self.host = [r for r in self.records if r["type"] == "host"]
        self.W = self.cfg.world

    def fn_mean(self, pred, ranks=None) -> np.ndarray:
        """Mean duration (ms) of matching fn records per rank."""
        acc = defaultdict(list)
        for r in self.fn:
            if pred(r):
                acc[r["rank"]].append(r["dur_ns"])
        return np.array([np.mean(acc[i]) / 1e6 if acc[i] else np.nan for i in range(self.W)])

    def gpu_mean(self, field: str) -> np.ndarray:
        acc = defaultdict(list)
        for r in self.gpu:
            acc[r["rank"]].append(r[field])
        return np.array([np.mean(acc[i]) for i in range(self.W)])

    def node_mean(self, field: str) -> dict:
        acc = defaultdict(list)
        for r in self.host:
            acc[r["node"]].append(r[field])
        return {k: float(np.mean(v)) for k, v in acc.items()}

    def nic_series(self, node: str, nic: str, field: str) -> list:
        return [r[field] for r in self.nic if r["node"] == node and r["nic"] == nic]


@lru_cache(maxsize=None)
def run(*faults: str, **kw) -> Run:
    return Run(faults, **kw)


def others(arr: np.ndarray, culprits) -> np.ndarray:
    mask = np.ones(len(arr), bool)
    mask[list(culprits)] = False
    return arr[mask]


is_gemm = lambda r: r["kind"] == "kernel" and "gemm" in r["fn"]  # noqa: E731
is_mem = lambda r: r["fn"] in MEM_KERNELS  # noqa: E731
is_tp = lambda r: r.get("group", "").startswith("tp-")  # noqa: E731
is_dp = lambda r: r.get("group", "").startswith("dp-")  # noqa: E731
is_dl = lambda r: r["fn"] == "DataLoader.__next__"  # noqa: E731


# ---------------------------------------------------------------- contract


@pytest.mark.parametrize("faults,kw", [
    ((), {}),
    (("gpu_throttle:rank=5", "congestion:nodes=0;1", "nic_flaky:node=1,nic=2,flap_prob=0.5"), {}),
    (("hang:rank=6,step=4",), {}),
    (("pp_imbalance:stage=1", "gc:rate=2"), {"pp": 2, "nodes": 4}),
    (("nccl_tcp", "storage:node=0"), {"tp": 2}),
])
def test_every_record_validates(faults, kw):
    r = run(*faults, **kw)
    lines = r.raw.splitlines()
    valid = invalid = 0
    for batch in parse_lines(enumerate(lines, 1)):
        valid += batch.valid_count
        invalid += len(batch.invalid)
    assert invalid == 0
    assert valid == len(lines) == r.truth["records"]
    for line in lines[:50]:
        validate_line(line)
    assert r.records[0]["type"] == "job"
    job = r.records[0]
    assert job["world_size"] == r.W and len(job["rank_nodes"]) == r.W
    assert job["tp"] * job["pp"] * job["dp"] == r.W
    assert all(x["dur_ns"] >= 0 for x in r.fn)
    assert {x["kind"] for x in r.fn} >= {"python", "kernel", "collective", "memcpy", "dataloader", "optimizer"}


def test_deterministic_and_seeded():
    a = Run(["gpu_throttle:rank=3", "nic_flaky:node=1"], steps=6, seed=9)
    b = Run(["gpu_throttle:rank=3", "nic_flaky:node=1"], steps=6, seed=9)
    c = Run(["gpu_throttle:rank=3", "nic_flaky:node=1"], steps=6, seed=10)
    assert a.raw == b.raw and a.truth == b.truth
    assert a.raw != c.raw
    assert a.records[0]["ts_ns"] == 1_763_000_000_000_000_000  # fixed start, not the clock


def test_faults_leave_the_noise_of_other_ranks_alone():
    # noise and faults draw from separate streams: a fault changes only what it touches
    a, b = run(), run("gpu_throttle:rank=5")
    ka = [x["dur_ns"] for x in a.fn if x["rank"] == 0 and x["kind"] == "kernel"]
    kb = [x["dur_ns"] for x in b.fn if x["rank"] == 0 and x["kind"] == "kernel"]
    assert len(ka) == len(kb) and max(abs(x - y) for x, y in zip(ka, kb)) <= 2  # ns rounding


def test_records_roughly_in_time_order_and_counts():
    r = run()
    steps = [x["step"] for x in r.fn]
    assert steps == sorted(steps) or np.mean(np.diff(steps) >= 0) > 0.99
    per = defaultdict(int)
    for x in r.fn:
        per[(x["rank"], x["step"])] += 1
    counts = np.array(list(per.values()))
    assert 20 <= np.median(counts) <= 40
    # counters: one gpu sample per rank, one nic per NIC, one host per node each period
    ts = sorted({x["ts_ns"] for x in r.gpu})
    assert np.all(np.diff(ts) == 500_000_000)
    assert len(r.gpu) == len(ts) * r.W and len(r.nic) == len(ts) * r.W and len(r.host) == len(ts) * 2
    step = r.fn_mean(lambda x: x["fn"] == "train_step")
    assert 500 < np.median(step) < 2000


# ------------------------------------------------------ collective semantics


def instances(r: Run, pred):
    """Collective instances: (step, group, fn, k-th occurrence) -> member records."""
    seen = defaultdict(int)
    out = defaultdict(list)
    for x in sorted((x for x in r.fn if x["kind"] == "collective" and pred(x)), key=lambda x: x["ts_ns"]):
        key = (x["step"], x["group"], x["fn"], x["rank"])
        k = seen[key]
        seen[key] += 1
        out[(x["step"], x["group"], x["fn"], k)].append(x)
    return out


def test_collective_members_leave_together():
    r = run("gpu_throttle:rank=5")
    inst = instances(r, lambda x: True)
    assert inst
    for key, members in inst.items():
        ends = {m["ts_ns"] + m["dur_ns"] for m in members}
        assert len(ends) == 1, key
        size = {"tp": r.cfg.tp_size, "dp": r.cfg.dp, "wo": r.W}[key[1][:2]]
        assert len(members) == size


def test_throttled_rank_waits_least_and_steps_stay_equal():
    r = run("gpu_throttle:rank=5")
    spiked = {sp["step"] for sp in r.truth["noise"]["spikes"]}  # one-off 2-4x kernels are noise
    tp = [m for k, m in instances(r, is_tp).items() if any(x["rank"] == 5 for x in m) and k[0] not in spiked]
    assert len(tp) >= 10
    for members in tp:
        waits = {m["rank"]: m["dur_ns"] for m in members}
        assert min(waits, key=waits.get) == 5
        assert max(waits.values()) > 3 * waits[5]
    # step times equal across ranks (everyone leaves the collectives together)
    by_step = defaultdict(list)
    for x in r.fn:
        if x["fn"] == "train_step":
            by_step[x["step"]].append(x["dur_ns"])
    for durs in by_step.values():
        assert max(durs) / min(durs) < 1.01
    # victims: raw collective time points at everyone on the node but the culprit
    tpw = r.fn_mean(is_tp)
    assert tpw[5] < 0.5 * np.min(tpw[[4, 6, 7]])


def test_pipeline_receiver_waits_for_sender():
    r = run(pp=2, nodes=4)
    sends = {(x["step"], x["rank"], x["ts_ns"] + x["dur_ns"]) for x in r.fn if x.get("op") == "send"}
    recvs = [x for x in r.fn if x.get("op") == "recv"]
    assert sends and recvs
    ends = {e for _, _, e in sends}
    for x in recvs:
        assert x["ts_ns"] + x["dur_ns"] in ends  # pairs end together
    assert set(r.truth["layout"]["rank_stages"]) == {0, 1}


# ------------------------------------------------------------ fault signatures


def test_gpu_throttle_signature():
    r = run("gpu_throttle:rank=5")
    h = run()
    gemm = r.fn_mean(is_gemm)
    assert gemm[5] > 1.3 * np.median(others(gemm, [5]))
    clock, reasons, temp = r.gpu_mean("sm_clock_mhz"), r.gpu_mean("throttle_reasons"), r.gpu_mean("temp_c")
    assert clock[5] < 1500 < np.min(others(clock, [5]))
    assert reasons[5] > 0 and np.all(others(reasons, [5]) == 0)
    assert temp[5] > 85 > np.max(others(temp, [5]))
    assert 50 < np.median(temp) < 75
    assert np.median(r.fn_mean(lambda x: x["fn"] == "train_step")) > np.median(
        h.fn_mean(lambda x: x["fn"] == "train_step"))
    p = run("gpu_throttle:rank=5,reason=power")
    power = p.gpu_mean("power_w")
    assert p.gpu_mean("throttle_reasons")[5] == 4
    assert power[5] > np.max(others(power, [5])) and power[5] > 600


def test_gpu_memory_signature():
    r = run("gpu_memory:rank=2")
    mem, gemm = r.fn_mean(is_mem), r.fn_mean(is_gemm)
    assert mem[2] > 1.4 * np.median(others(mem, [2]))
    assert gemm[2] < 1.03 * np.median(others(gemm, [2]))
    clock = r.gpu_mean("sm_clock_mhz")
    assert clock[2] > 1970
    assert r.gpu_mean("mem_util_pct")[2] > np.max(others(r.gpu_mean("mem_util_pct"), [2]))
    used = r.gpu_mean("mem_used_bytes") / r.gpu[0]["mem_total_bytes"]
    assert used[2] > 0.99 > np.max(others(used, [2]))


def test_pcie_signature():
    r = run("pcie:rank=6")
    assert r.gpu_mean("pcie_gen")[6] == 4 and r.gpu_mean("pcie_width")[6] == 8
    assert np.all(others(r.gpu_mean("pcie_gen"), [6]) == 5)
    h2d = r.fn_mean(lambda x: x["fn"] == "Memcpy HtoD")
    assert h2d[6] > 3 * np.median(others(h2d, [6]))
    assert {x["max_pcie_gen"] for x in r.gpu} == {5}


def test_nvlink_signature():
    r = run("nvlink:rank=1")
    nvl = r.gpu_mean("nvlink_tx_Bps") + r.gpu_mean("nvlink_rx_Bps")
    assert nvl[1] < 0.01 * np.median(nvl)
    tp = r.fn_mean(is_tp)
    node0, node1 = tp[:4], tp[4:]
    assert np.min(node0) > 3 * np.median(node1)  # the node's TP ring is paced by the bad GPU
    assert r.gpu_mean("pcie_tx_Bps")[1] > 2 * np.median(r.gpu_mean("pcie_tx_Bps"))


def test_nic_signature():
    r = run("nic:node=1,nic=2", nodes=3)
    assert set(r.nic_series("node-1", "mlx5_2", "link_gbps")) == {200.0}
    assert {x["link_gbps"] for x in r.nic if not (x["node"] == "node-1" and x["nic"] == "mlx5_2")} == {400.0}
    dp = r.fn_mean(is_dp)
    h = run(nodes=3).fn_mean(is_dp)
    # the rail-2 ring (local GPU 2 on every node) is slower for all its members
    rail2 = [2, 6, 10]
    assert np.min(dp[rail2]) > 1.3 * np.min(h[rail2])
    assert all(x["symbol_errors"] == 0 for x in r.nic)


def test_nic_flaky_signature():
    r = run("nic_flaky:node=1,nic=3,flap_prob=0.5")
    sym = r.nic_series("node-1", "mlx5_3", "symbol_errors")
    assert sym[-1] > sym[0] > 0 and np.all(np.diff(sym) >= 0)
    assert r.nic_series("node-1", "mlx5_3", "retransmits")[-1] > 100
    assert r.nic_series("node-1", "mlx5_3", "link_downed")[-1] >= 1
    assert all(x["symbol_errors"] == 0 for x in r.nic if not (x["node"] == "node-1" and x["nic"] == "mlx5_3"))
    tx = np.array(r.nic_series("node-1", "mlx5_3", "tx_Bps"))
    assert (tx < 1e6).any()  # stalls: samples with (almost) no traffic


def test_congestion_signature():
    r = run("congestion:nodes=0;2", nodes=3)
    cnp = {(x["node"]): x["cnp_sent"] for x in r.nic if x["nic"] == "mlx5_0"}  # last sample wins
    assert cnp["node-0"] > 20 * cnp["node-1"] and cnp["node-2"] > 20 * cnp["node-1"]
    assert all(x["symbol_errors"] == 0 and x["link_downed"] == 0 and x["link_gbps"] == 400.0 for x in r.nic)
    dp, h = r.fn_mean(is_dp), run(nodes=3).fn_mean(is_dp)
    assert np.median(dp) > 1.5 * np.median(h)
    assert r.truth["faults"][0]["scope"] == "job" and r.truth["faults"][0]["affected_nodes"] == ["node-0", "node-2"]


def test_dataloader_and_storage_signatures():
    for name, iow_hi in (("dataloader", False), ("storage", True)):
        r = run(f"{name}:node=1")
        dl = r.fn_mean(is_dl)
        assert np.min(dl[4:]) > 10 * np.max(dl[:4])
        util = r.gpu_mean("sm_util_pct")
        assert np.max(util[4:]) < np.min(util[:4])  # GPU idle at step start
        iow = r.node_mean("iowait_pct")
        assert (iow["node-1"] > 10) == iow_hi and iow["node-0"] < 2
        gemm = r.fn_mean(is_gemm)
        assert np.max(gemm) < 1.05 * np.min(gemm)


def test_host_cpu_signature():
    r = run("host_cpu:node=0")
    fwd = r.fn_mean(lambda x: x["fn"] == "model.forward")
    assert np.min(fwd[:4]) > 3 * np.max(fwd[4:])
    gemm = r.fn_mean(is_gemm)
    assert np.max(gemm) < 1.05 * np.min(gemm)  # kernels themselves normal
    cpu = r.node_mean("cpu_util_pct")
    assert cpu["node-0"] > 95 > cpu["node-1"]
    util = r.gpu_mean("sm_util_pct")
    assert np.max(util[:4]) < np.min(util[4:])  # launch gaps


def test_gc_signature():
    r = run("gc:rate=2,ms=400")
    pauses = [x for x in r.fn if x["fn"] == "gc.collect" and x["dur_ns"] > 100e6]
    assert len({x["rank"] for x in pauses}) >= 3  # varying ranks
    f = r.truth["faults"][0]
    assert f["scope"] == "job" and f["component"] == "python" and f["ranks"] == []
    assert set(f["affected_ranks"]) == {x["rank"] for x in pauses}
    assert all(x["kind"] == "python" and x["stack"].endswith("gc.collect") for x in pauses)


def test_workload_signatures():
    r = run("uneven_workload:rank=3")
    gemm = r.fn_mean(is_gemm)
    assert gemm[3] > 1.2 * np.median(others(gemm, [3]))
    assert r.gpu_mean("sm_clock_mhz")[3] > 1970 and r.gpu_mean("throttle_reasons")[3] == 0
    p = run("pp_imbalance:stage=0", pp=2, nodes=4)
    g = p.fn_mean(is_gemm)
    assert np.min(g[:8]) > 1.4 * np.max(g[8:])
    f = p.truth["faults"][0]
    assert f["ranks"] == list(range(8)) and f["nodes"] == ["node-0", "node-1"]


def test_nccl_tcp_and_few_workers_hit_every_rank_alike():
    r = run("nccl_tcp")
    assert np.max(r.gpu_mean("nvlink_tx_Bps")) == 0
    dp, h = r.fn_mean(is_dp), run().fn_mean(is_dp)
    assert np.min(dp) > 5 * np.max(h)
    tx = [x["tx_Bps"] for x in r.nic]
    assert max(tx) < 16e9 / 8 * 1.01  # never above socket speed
    w = run("few_workers")
    dl = w.fn_mean(is_dl)
    assert np.min(dl) > 100 and np.max(dl) < 2 * np.min(dl)


def test_kernel_regression_needs_history():
    r = run("kernel_regression:fn=flash_fwd_kernel", steps=12)
    f = r.truth["faults"][0]
    assert f["start_step"] == 6 and f["component"] == "software"
    before = [x["dur_ns"] for x in r.fn if x["fn"] == "flash_fwd_kernel" and x["step"] < 6]
    after = [x["dur_ns"] for x in r.fn if x["fn"] == "flash_fwd_kernel" and x["step"] >= 6]
    assert np.median(after) > 1.4 * np.median(before)
    other = r.fn_mean(lambda x: x["fn"] == "flash_bwd_kernel")
    assert np.max(other) < 1.05 * np.min(other)


def test_hang_signature():
    r = run("hang:rank=6,step=4")
    f = r.truth["faults"][0]
    assert f["kind"] == "hang" and f["component"] == "gpu" and f["ranks"] == [6] and f["fn"] == GEMM_NN
    infl = [x for x in r.fn if x.get("in_flight")]
    by_rank = {x["rank"]: x for x in infl}
    assert len(infl) == len(by_rank) == r.W  # one stuck function per rank
    assert by_rank[6]["fn"] == GEMM_NN and by_rank[6]["kind"] == "kernel"
    assert all(x["kind"] == "collective" for rk, x in by_rank.items() if rk != 6)
    assert max(x["step"] for x in r.fn) == 4
    cut = r.truth["hang_cut_ns"]
    assert all(x["ts_ns"] + x["dur_ns"] == cut for x in infl)
    assert all(x["ts_ns"] + x["dur_ns"] <= cut for x in r.fn)
    # counters keep coming for several step times with no progress
    last_done = max(x["ts_ns"] + x["dur_ns"] for x in r.fn if not x.get("in_flight"))
    later = sorted({x["ts_ns"] for x in r.gpu if x["ts_ns"] > f["start_ns"]})
    assert len(later) >= 6 and later[-1] > last_done + 2e9
    assert by_rank[6]["dur_ns"] > 3e9
    d = run("hang:rank=1,step=2,fn=DataLoader.__next__")
    fd = d.truth["faults"][0]
    assert fd["component"] == "dataloader"
    stuck = [x for x in d.fn if x.get("in_flight") and x["rank"] == 1]
    assert [x["fn"] for x in stuck] == ["DataLoader.__next__"]


def test_faults_can_be_combined_and_windowed():
    r = run("gpu_throttle:rank=1,start=3,end=6", "dataloader:node=1")
    clock = defaultdict(list)
    for x in r.gpu:
        if x["rank"] == 1:
            clock[x["ts_ns"]].append(x["sm_clock_mhz"])
    starts = r.truth["step_start_ns"]
    low = [t for t, c in clock.items() if c[0] < 1500]
    assert low and min(low) > starts[3] and max(low) <= starts[6] + 500_000_000
    gemm = defaultdict(list)
    for x in r.fn:
        if x["rank"] == 1 and is_gemm(x):
            gemm[x["step"] in (3, 4, 5)].append(x["dur_ns"])
    assert np.median(gemm[True]) > 1.3 * np.median(gemm[False])
    dl = r.fn_mean(is_dl)
    assert np.min(dl[4:]) > 10 * np.max(dl[:4])


# ------------------------------------------------------------------ noise


def test_noise_is_not_a_fault():
    r = run(steps=12, seed=5)
    assert r.truth["healthy"] and r.truth["faults"] == []
    logs = [x for x in r.fn if x["fn"] == "log_metrics"]
    assert [x["rank"] for x in logs] == [0] and logs[0]["step"] == 10 and 100e6 <= logs[0]["dur_ns"] <= 300e6
    step = r.fn_mean(lambda x: x["fn"] == "train_step")
    gemm = r.fn_mean(is_gemm)
    assert np.max(gemm) / np.min(gemm) < 1.04  # +-1% per GPU plus jitter
    durs = defaultdict(list)
    for x in r.fn:
        if x["fn"] == "train_step":
            durs[x["step"]].append(x["dur_ns"])
    med = {k: np.median(v) for k, v in durs.items()}
    assert med[10] > med[9] + 80e6  # everyone waits for rank 0's logging
    assert np.median(step) < 800


# ----------------------------------------------------------- parsing, truth


def test_parse_fault_good():
    f = parse_fault("gpu_throttle:rank=13,factor=1.6,start=5,end=9")
    assert (f.name, f.params["rank"], f.params["factor"], f.start, f.end) == ("gpu_throttle", 13, 1.6, 5, 9)
    assert f.params["reason"] == "thermal"
    assert parse_fault("gc").params == {"ranks": None, "rate": 0.5, "ms": 500.0}
    assert parse_fault("congestion:nodes=node-1;3+5").params["nodes"] == [1, 3, 5]
    assert parse_fault("nic:node=node-2").params == {"node": 2, "nic": 0, "gbps": 200.0}
    assert str(parse_fault("nic:node=2,start=1")) == "nic:node=2,nic=0,gbps=200.0,start=1"
    assert set(FAULTS) >= {"gpu_throttle", "gpu_memory", "pcie", "nvlink", "nic", "nic_flaky", "dataloader",
                           "storage", "host_cpu", "gc", "uneven_workload", "pp_imbalance", "nccl_tcp",
                           "few_workers", "kernel_regression", "congestion", "hang"}


@pytest.mark.parametrize("spec,needle", [
    ("gpu_melt:rank=1", "unknown fault 'gpu_melt'"),
    ("gpu_throttle:rnk=1", "no parameter 'rnk'"),
    ("gpu_throttle", "needs parameter 'rank'"),
    ("gpu_throttle:rank=x", "expected an integer"),
    ("gpu_throttle:rank=1,factor=fast", "expected a number"),
    ("gpu_throttle:rank=1,factor=0.5", "below the minimum"),
    ("gpu_throttle:rank=1,reason=cosmic", "not one of"),
    ("gpu_throttle:rank=1,rank=2", "given twice"),
    ("gpu_throttle:rank", "expected key=value"),
    ("nic:node=1,start=5,end=3", "must be greater"),
    ("", "empty fault spec"),
])
def test_parse_fault_errors_are_clear(spec, needle):
    with pytest.raises(FaultError, match=needle.replace("(", r"\(")):
        parse_fault(spec)


@pytest.mark.parametrize("faults,kw,needle", [
    (["gpu_throttle:rank=8"], {}, "rank 8 not in 0..7"),
    (["nic:node=2"], {}, "node 2 not in 0..1"),
    (["nic:node=0,nic=4"], {}, "nic 4 not in 0..3"),
    (["pp_imbalance:stage=0"], {}, "needs pp > 1"),
    (["kernel_regression:fn=nope"], {}, "no kernel 'nope'"),
    (["hang:rank=1,fn=nope"], {}, "never runs 'nope'"),
    (["nic:node=0,start=10"], {}, "not before the last step"),
    ([], {"tp": 3}, "must divide gpus"),
])
def test_layout_errors_are_clear(faults, kw, needle):
    with pytest.raises(FaultError, match=needle):
        SimConfig(nodes=2, gpus=4, steps=10, faults=faults, **kw).validate()


def test_truth_content():
    r = run("gpu_throttle:rank=5", "nic:node=1,nic=2", "few_workers")
    t = r.truth
    assert t["job"] == "sim-3" and t["seed"] == 3 and t["healthy"] is False
    lay = t["layout"]
    assert (lay["nodes"], lay["gpus"], lay["tp"], lay["pp"], lay["dp"], lay["world_size"]) == (2, 4, 4, 1, 2, 8)
    assert lay["rank_nodes"] == ["node-0"] * 4 + ["node-1"] * 4 and lay["rank_stages"] == [0] * 8
    g, n, w = t["faults"]
    assert (g["kind"], g["component"], g["scope"], g["ranks"], g["nodes"]) == ("slow", "gpu", "rank", [5], ["node-1"])
    assert (n["component"], n["scope"], n["ranks"], n["nodes"], n["nic"]) == (
        "nic", "node", [4, 5, 6, 7], ["node-1"], "mlx5_2")
    assert (w["component"], w["scope"], w["ranks"], w["nodes"], w["fn"]) == (
        "config", "job", [], [], "DataLoader.__next__")
    for f in t["faults"]:
        assert f["start_step"] == 0 and f["end_step"] == 10 and f["start_ns"] == t["start_ns"]
        assert set(f) >= {"name", "params", "kind", "component", "scope", "ranks", "nodes", "fn",
                          "start_step", "end_step", "start_ns"}
    assert truth(r.cfg) == t  # the truth alone matches the written run's
    assert len(t["step_start_ns"]) == 10 and t["records"] == len(r.records)


def test_generate_api():
    cfg = SimConfig(nodes=1, gpus=2, steps=3, seed=1)
    lists = list(generate(cfg))
    assert len(lists) == 3 and lists[0][0]["type"] == "job"
    assert all(isinstance(x, dict) for lst in lists for x in lst)
    assert {x["step"] for x in lists[1] if x["type"] == "fn"} == {1}
    assert truth_path_for("a/run.jsonl").as_posix() == "a/run.truth.json"
    assert truth_path_for("run.jsonl.gz").name == "run.truth.json"


def test_cli(tmp_path):
    out = tmp_path / "run.jsonl"
    # --start default: the same bytes twice (the CLI's default stamps from now)
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "4", "--seed", "2",
                                   "--fault", "gpu_throttle:rank=3", "--fault", "dataloader:node=1",
                                   "-o", str(out), "--start", "default"])
    assert res.exit_code == 0, res.output
    t = json.loads((tmp_path / "run.truth.json").read_text())
    assert [f["name"] for f in t["faults"]] == ["gpu_throttle", "dataloader"] and t["job"] == "sim-2"
    again = tmp_path / "again.jsonl"
    CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "4", "--seed", "2",
                             "--fault", "gpu_throttle:rank=3", "--fault", "dataloader:node=1", "-o", str(again),
                             "--job", "sim-2", "--start", "default"])
    assert again.read_bytes() == out.read_bytes()
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "1", "--gpus", "2", "--steps", "2", "-o", "-",
                                   "--start-ns", "5", "--truth", str(tmp_path / "t.json")])
    assert res.exit_code == 0
    first = json.loads(res.stdout.splitlines()[0])
    assert first["type"] == "job" and first["ts_ns"] == 5
    assert (tmp_path / "t.json").exists()
    bad = CliRunner().invoke(cli, ["simulate", "--fault", "gpu_throttle:rnk=1", "-o", str(out)])
    assert bad.exit_code == 2 and "no parameter 'rnk'" in bad.output
    bad = CliRunner().invoke(cli, ["simulate", "--nodes", "1", "--fault", "gpu_throttle:rank=99", "-o", str(out)])
    assert bad.exit_code == 2 and "rank 99" in bad.output
    lst = CliRunner().invoke(cli, ["simulate", "--list-faults"])
    assert lst.exit_code == 0 and "kernel_regression" in lst.output
