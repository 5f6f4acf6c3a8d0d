"""The simulator's ``realistic`` fleet profile: each nuisance shows in the records, the default
profile's output is unchanged, the ground truth is the same with and without nuisances, and every
record still validates against the contract.

Seeds are searched for (cheaply: constructing a Simulation draws its fleet without running it)
rather than hard-coded, so the tests say which property they need; runs are shortened with
``steps=`` to keep the module fast.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections import defaultdict
from functools import lru_cache

import numpy as np
import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import parse_lines
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.producers.simulator.engine import Simulation, schedule_order
from eroica.producers.simulator.program import DP_REDUCE_SCATTER, FSDP_REDUCE_SCATTER, MOE_EXPERT_KERNELS
from eroica.producers.simulator.realistic import (CLOCK_OFFSET_MS, H100_NVL, H100_SXM, MIN_RUN_S, MIN_STEPS,
                                                  STEP_RANGE_S, TRACE_RECORDS_PER_S, plan_for)

# sha256 of (records + truth) of small default-profile runs, computed before the realistic profile
# existed: the default profile must stay byte-identical
DEFAULT_HASHES = [
    (dict(nodes=2, gpus=4, steps=6, seed=3), "99a58edb20d4b4342c333d0da2c9c511f799e1200651b0dfe195046b04c4dbb2"),
    (dict(nodes=2, gpus=4, steps=6, seed=7, faults=["gpu_throttle:rank=5", "nic_flaky:node=1,nic=2,flap_prob=0.5"]),
     "21fc550df093be1b52886572afe8fb1284c27f5739844e7592628f18035b1efc"),
    (dict(nodes=4, gpus=4, steps=5, seed=2, pp=2, faults=["pp_imbalance:stage=1", "gc:rate=2"]),
     "87874f9152483ccaab6b01f07f0ea2da0286d377f009f29d0f8494a4ea4af537"),
    (dict(nodes=2, gpus=4, steps=8, seed=4, faults=["hang:rank=6,step=4"]),
     "9313534122aac6f04f5143e688bdf3782fe6f1472eee17f5d5d99b0a4d2a83d6"),
]

LAYOUT = dict(nodes=4, gpus=4)
STEPS = 16  # long enough for warm-up, a checkpoint and an eval on long-step seeds


class Run:
    def __init__(self, seed: int, faults=(), steps: int | None = STEPS, **kw):
        kw = {**LAYOUT, **kw}
        self.cfg = SimConfig(seed=seed, steps=steps, faults=list(faults), profile="realistic", **kw)
        buf = io.BytesIO()
        self.truth = write_jsonl(self.cfg, buf)
        self.raw = buf.getvalue()
        self.records = [json.loads(line) for line in self.raw.splitlines()]
        self.by_type: dict[str, list] = defaultdict(list)
        for r in self.records:
            self.by_type[r["type"]].append(r)
        self.nz = self.truth["nuisances"]


@lru_cache(maxsize=None)
def run(seed: int, *faults: str, **kw) -> Run:
    return Run(seed, faults, **kw)


def fleet(seed: int, steps: int | None = STEPS, **kw):
    return Simulation(SimConfig(seed=seed, steps=steps, profile="realistic", **{**LAYOUT, **kw})).fleet


def find_seed(pred, start: int = 1, **kw) -> int:
    """First seed whose fleet (or plan) satisfies ``pred``; fails loudly rather than skipping."""
    for seed in range(start, start + 300):
        if pred(fleet(seed, **kw)):
            return seed
    raise AssertionError("no seed in range has the property")


def long_step(f, lo: float = 5.0, hi: float = 60.0) -> bool:
    """A step long enough that checkpoints and evals fall inside a short test run, short enough to be quick."""
    return lo <= f.plan.step_s <= hi


def run_hash(cfg: SimConfig) -> str:
    buf = io.BytesIO()
    t = write_jsonl(cfg, buf, truth_path=False)
    return hashlib.sha256(buf.getvalue() + json.dumps(t, sort_keys=True).encode()).hexdigest()


# ------------------------------------------------------------------ the default profile


@pytest.mark.parametrize("kw,digest", DEFAULT_HASHES)
def test_default_profile_is_byte_identical(kw, digest):
    assert run_hash(SimConfig(**kw)) == digest
    assert run_hash(SimConfig(profile="default", **kw)) == digest


def test_profile_is_validated():
    from eroica.producers.simulator import FaultError

    with pytest.raises(FaultError, match="profile must be one of"):
        SimConfig(profile="chaos").validate()


# ------------------------------------------------------------------ contract and truth


def test_realistic_records_validate_and_count():
    seed = find_seed(lambda f: long_step(f))
    for r in (run(seed), run(seed, "gpu_throttle:rank=5", pp=2)):
        lines = r.raw.splitlines()
        valid = invalid = 0
        for batch in parse_lines(enumerate(lines, 1)):
            valid += batch.valid_count
            invalid += len(batch.invalid)
        assert invalid == 0
        assert valid == len(lines) == r.truth["records"]
        assert r.records[0]["type"] == "job" and r.truth["profile"] == "realistic"
        assert all(x["dur_ns"] >= 0 for x in r.by_type["fn"])


def test_deterministic():
    seed = find_seed(lambda f: long_step(f))
    a = Run(seed, ["nic:node=1,nic=2"], steps=8)
    b = Run(seed, ["nic:node=1,nic=2"], steps=8)
    assert a.raw == b.raw and a.truth == b.truth


TRUTH_KEYS = ("name", "spec", "params", "kind", "component", "scope", "ranks", "nodes", "fn", "start_step",
              "end_step")


@pytest.mark.parametrize("faults", [
    ("gpu_throttle:rank=5", "nic:node=1,nic=2"),
    ("dataloader:node=2", "congestion:nodes=0;3"),
    ("hang:rank=6,step=5",),
])
def test_truth_is_the_same_with_nuisances(faults):
    seed = find_seed(lambda f: long_step(f))
    d = SimConfig(seed=seed, steps=10, faults=list(faults), **LAYOUT)
    r = run(seed, *faults, steps=10)
    td = Simulation(d).truth()
    tr = r.truth
    assert tr["healthy"] == td["healthy"] is False
    assert [{k: f[k] for k in TRUTH_KEYS} for f in tr["faults"]] == [{k: f[k] for k in TRUTH_KEYS}
                                                                     for f in td["faults"]]
    assert tr["layout"]["rank_nodes"] == td["layout"]["rank_nodes"]
    # nuisances do not depend on the faults: a healthy run of the seed draws the same fleet
    h = run(seed, steps=10)
    assert h.truth["healthy"] and h.truth["faults"] == []
    for key in ("gpu_models", "clock_offset_ns", "extra_ports", "missing_fields", "sampling_gaps_ns"):
        assert h.nz[key] == tr["nuisances"][key]


def test_healthy_run_has_no_straggler():
    seed = find_seed(lambda f: long_step(f) and len({m.name for m in f.node_model}) == 2 and f.plan.moe)
    r = run(seed)
    warm = len(r.nz["warmup_factors"])
    per = defaultdict(list)
    for x in r.by_type["fn"]:
        if x["kind"] == "kernel" and x["step"] >= warm and "gemm" in x["fn"]:
            per[(x["fn"], x["rank"])].append(x["dur_ns"])
    for fn in {f for f, _ in per} - set(MOE_EXPERT_KERNELS):  # MoE jitter: see the MoE test
        med = np.array([np.median(v) for (f, _), v in per.items() if f == fn])
        assert med.max() / med.min() < 1.04, fn  # the two models differ by <= 2 %


# ------------------------------------------------------------------ 1: ports beyond the rails


def test_extra_ports():
    seed = find_seed(lambda f: long_step(f) and f.noisy_mgmt is not None and any(
        name == "bond0" for ps in f.ports for name, _ in ps))
    r = run(seed)
    nic = r.by_type["nic"]
    names = defaultdict(set)
    for x in nic:
        names[x["node"]].add(x["nic"])
    for node, ports in names.items():
        assert {"eth0", "lo", "mlx5_0", "mlx5_3"} <= ports
    eth = [x for x in nic if x["nic"] in ("eth0", "eth1")]
    assert {x["link_gbps"] for x in eth if "link_gbps" in x} <= {100.0, 200.0}
    assert all(1e6 <= x["tx_Bps"] <= 200e6 for x in eth)
    assert all("link_gbps" not in x and x["tx_Bps"] == x["rx_Bps"] for x in nic if x["nic"] == "lo")
    bonds = [x for x in nic if x["nic"] == "bond0"]
    assert bonds and all(x["link_gbps"] in (200.0, 400.0) for x in bonds)
    noisy = [x["rx_errors"] for x in nic if x["nic"] == "eno1" and x["node"] == r.nz["noisy_mgmt_port"]]
    assert noisy and 100 <= min(noisy) and max(noisy) < 1000
    # the rails keep their link speed everywhere
    assert all(x["link_gbps"] == 400.0 for x in nic if x["nic"].startswith("mlx5_"))


# ------------------------------------------------------------------ 2: two GPU models


def test_two_gpu_models():
    seed = find_seed(lambda f: long_step(f) and len({m.name for m in f.node_model}) == 2)
    r = run(seed)
    by_node = defaultdict(set)
    for x in r.by_type["gpu"]:
        by_node[x["node"]].add((x["max_sm_clock_mhz"], x["mem_total_bytes"]))
    assert set().union(*by_node.values()) == {(H100_SXM.max_clock_mhz, H100_SXM.mem_total_bytes),
                                              (H100_NVL.max_clock_mhz, H100_NVL.mem_total_bytes)}
    assert all(len(v) == 1 for v in by_node.values())  # one model per node
    nvl = set(r.nz["gpu_models"][H100_NVL.name])
    for x in r.by_type["gpu"]:
        m = H100_NVL if x["node"] in nvl else H100_SXM
        assert x["sm_clock_mhz"] <= m.max_clock_mhz
        if "power_w" in x:
            assert x["power_w"] <= m.power_limit_w + 2 and x["power_limit_w"] == m.power_limit_w
    assert 0.005 <= r.nz["model_speed_gap"] <= 0.02


# ------------------------------------------------------------------ 3: missing fields


def test_missing_fields():
    seed = find_seed(lambda f: long_step(f) and f.host_missing is not None and any(f.gpu_drop))
    r = run(seed)
    missing = r.nz["missing_fields"]
    node = next(n for n, groups in missing.items() if any(g in ("nvlink", "power", "pcie_traffic",
                                                                 "throttle_reasons") for g in groups))
    fields = {"nvlink": "nvlink_tx_Bps", "power": "power_w", "pcie_traffic": "pcie_tx_Bps",
              "throttle_reasons": "throttle_reasons"}
    g = next(g for g in missing[node] if g in fields)
    assert all(fields[g] not in x for x in r.by_type["gpu"] if x["node"] == node)
    assert any(fields[g] in x for x in r.by_type["gpu"] if x["node"] != node)
    hosts = {x["node"] for x in r.by_type["host"]}
    assert r.nz["host_records_missing"] not in hosts and len(hosts) == LAYOUT["nodes"] - 1
    assert all("sm_clock_mhz" in x for x in r.by_type["gpu"])


# ------------------------------------------------------------------ 4: clock offsets


def test_clock_offsets():
    seed = find_seed(lambda f: long_step(f))
    r = run(seed)
    off = r.nz["clock_offset_ns"]
    assert all(abs(v) <= CLOCK_OFFSET_MS * 1e6 for v in off.values()) and len(set(off.values())) == len(off)
    # members of one DP collective leave together in true time: their written ends differ by the offsets
    ends = defaultdict(dict)
    for x in r.by_type["fn"]:
        if x.get("group", "").startswith("dp-"):
            ends[(x["step"], x["group"], x["fn"])][x["node"]] = x["ts_ns"] + x["dur_ns"]
    checked = 0
    for members in ends.values():
        if len(members) < 2:
            continue
        a, b = sorted(members)[:2]
        assert abs((members[b] - members[a]) - (off[b] - off[a])) <= 2  # ns rounding
        checked += 1
    assert checked > 5
    # counters shifted alike: each node's sample times sit at its offset from the common period grid
    P = r.truth["sample_ns"]
    for x in r.by_type["host"][:20]:
        rel = (x["ts_ns"] - r.truth["start_ns"] - off[x["node"]]) % P
        assert min(rel, P - rel) <= 1


# ------------------------------------------------------------------ 5: gaps and resets


def test_sampling_gaps_and_counter_reset():
    seed = find_seed(lambda f: long_step(f) and f.reset is not None)
    r = run(seed)
    reset = r.nz["counter_reset"]
    node = reset["node"]
    P = r.truth["sample_ns"]
    ts = sorted({x["ts_ns"] for x in r.by_type["gpu"] if x["node"] == node})
    assert np.max(np.diff(ts)) >= 2 * P  # a gap (the driver reload takes the agent off the air)
    series = [x["xmit_wait"] for x in r.by_type["nic"] if x["node"] == node and x["nic"] == "mlx5_1"
              and "xmit_wait" in x]
    drops = int(np.sum(np.diff(series) < 0)) if series else 0
    if series:  # the vendor counters may be among the node's missing fields
        assert drops == 1
    tx = [x["tx_discards"] for x in r.by_type["nic"] if x["node"] == node and x["nic"] == "mlx5_1"]
    assert np.all(np.diff(tx) <= 0) or np.sum(np.diff(tx) < 0) <= 1
    # every other node's cumulative counters never go down
    for x_node in {x["node"] for x in r.by_type["nic"]} - {node}:
        s = [x["xmit_wait"] for x in r.by_type["nic"] if x["node"] == x_node and x["nic"] == "mlx5_1"
             and "xmit_wait" in x]
        assert np.all(np.diff(s) >= 0)


# ------------------------------------------------------------------ 6: step times


def test_step_time_range_across_seeds():
    plans = [plan_for(s) for s in range(1, 201)]
    steps_s = np.array([p.step_s for p in plans])
    assert STEP_RANGE_S[0] <= steps_s.min() < 0.1 and 100 < steps_s.max() <= STEP_RANGE_S[1]
    # log-uniform: about as many below 3 s (the geometric middle) as above
    assert 0.35 < np.mean(steps_s < math.sqrt(STEP_RANGE_S[0] * STEP_RANGE_S[1])) < 0.65
    for p in plans:
        assert p.steps >= MIN_STEPS and p.steps * p.step_s >= MIN_RUN_S
        assert 0.5 <= p.sample_s <= 10.0
        assert p.step_for(4) >= 1.0 and p.steps_for(4) * p.step_for(4) >= MIN_RUN_S  # pipelined: big models
    # the tracer budget bounds the records of a medium-scale run of any seed
    for seed in (int(np.argmin(steps_s)) + 1, int(np.argmax(steps_s)) + 1):
        f = fleet(seed, steps=None, nodes=8, gpus=8)
        rate = Simulation(SimConfig(seed=seed, nodes=8, gpus=8, profile="realistic")).prog.records_per_rank_step()
        assert rate / f.trace_every / f.plan.step_s <= TRACE_RECORDS_PER_S * 1.01


def test_realised_step_time_follows_the_plan():
    for seed in (find_seed(lambda f: f.plan.step_s < 0.3, steps=40),
                 find_seed(lambda f: long_step(f, 20.0, 200.0), steps=8)):
        r = run(seed, steps=40 if plan_for(seed).step_s < 0.3 else 8)
        warm = len(r.nz["warmup_factors"])
        durs = [x["dur_ns"] / 1e9 for x in r.by_type["fn"] if x["fn"] == "train_step" and x["step"] >= warm]
        assert 0.8 < np.median(durs) / plan_for(seed).step_s < 1.25
        assert r.truth["sample_ns"] == round(plan_for(seed).sample_s * 1e9)


# ------------------------------------------------------------------ 7-9: checkpoints, evals, warm-up


def test_checkpoints_evals_and_warmup():
    seed = find_seed(lambda f: long_step(f) and f.ckpt_every < STEPS - 1 and f.eval_every < STEPS - 1)
    r = run(seed)
    W = r.cfg.world
    ck = [x for x in r.by_type["fn"] if x["fn"] == "checkpoint.save"]
    assert ck and all(x["kind"] == "io" for x in ck)
    by_step = defaultdict(list)
    for x in ck:
        by_step[x["step"]].append(x)
    for step, xs in by_step.items():
        assert len(xs) == W
        assert 2e9 * 0.9 <= max(x["dur_ns"] for x in xs) <= 20e9 + 1e8
    ev = [x for x in r.by_type["fn"] if x["fn"] == "eval.forward"]
    assert ev and {x["rank"] for x in ev} == set(range(W)) and all(x["kind"] == "python" for x in ev)
    steps = defaultdict(list)
    for x in r.by_type["fn"]:
        if x["fn"] == "train_step":
            steps[x["step"]].append(x["dur_ns"])
    med = {k: np.median(v) for k, v in steps.items()}
    warm = r.nz["warmup_factors"]
    later = np.median([med[k] for k in med if k >= len(warm)])
    assert 2 <= len(warm) <= 4 and med[0] > 1.8 * later and med[0] < 6.5 * later


def test_checkpoint_leaves_gpus_idle():
    seed = find_seed(lambda f: long_step(f, 20.0, 60.0) and f.ckpt_every < STEPS - 1)
    r = run(seed)
    off = r.nz["clock_offset_ns"]
    longest = max((x for x in r.by_type["fn"] if x["fn"] == "checkpoint.save" and x["rank"] == 0),
                  key=lambda x: x["dur_ns"])
    t0 = longest["ts_ns"] - off[longest["node"]]
    t1 = t0 + longest["dur_ns"]
    P = r.truth["sample_ns"]
    inside = [x["sm_util_pct"] for x in r.by_type["gpu"]
              if t0 + P <= x["ts_ns"] - off[x["node"]] <= t1]
    if inside:  # a checkpoint shorter than a sample period has no sample of its own
        assert max(inside) < 5.0


# ------------------------------------------------------------------ 10-12: MoE, schedules, FSDP


def test_moe_jitter_is_per_step_not_per_rank():
    seed = find_seed(lambda f: long_step(f, 1.0, 60.0) and f.plan.moe)
    r = run(seed)
    warm = len(r.nz["warmup_factors"])
    d = defaultdict(list)
    for x in r.by_type["fn"]:
        if x["fn"] == MOE_EXPERT_KERNELS[0] and x["step"] >= warm:
            d[(x["rank"], x["step"])].append(x["dur_ns"])
    per = defaultdict(dict)
    for (rank, step), v in d.items():
        per[rank][step] = np.mean(v)
    ranks = sorted(per)
    steps = sorted(per[ranks[0]])
    m = np.array([[per[rk][s] for s in steps] for rk in ranks])
    ratio = m / np.median(m)
    assert ratio.max() / ratio.min() > 1.4  # +-30 % per rank and step
    slowest = np.argmax(ratio, axis=0)  # per step
    assert len(set(slowest.tolist())) >= len(steps) // 2  # a different rank each time: no persistent culprit


def test_schedule_orders():
    # 1F1B, pp=4, M=8: stage 0 warms up with 3 forwards, the last stage alternates from the start
    o = schedule_order(4, 8, 1, 0)
    assert [d for d, _, _ in o[:5]] == ["F", "F", "F", "F", "B"]
    assert [d for d, _, _ in schedule_order(4, 8, 1, 3)[:4]] == ["F", "B", "F", "B"]
    for pp, M, v in ((2, 2, 1), (4, 8, 1), (2, 4, 2), (4, 4, 2)):
        for s in range(pp):
            o = schedule_order(pp, M, v, s)
            assert sorted(o) == sorted([(d, c, m) for d in "FB" for c in range(v) for m in range(M)])


@pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
def test_pipeline_schedules_run(schedule):
    seed = find_seed(lambda f: long_step(f, 1.0, 60.0) and f.plan.schedule == schedule, pp=2)
    r = run(seed, pp=2)
    assert r.nz["pipeline_schedule"] == schedule
    fn = r.by_type["fn"]
    sends = [x for x in fn if x.get("op") == "send"]
    recvs = [x for x in fn if x.get("op") == "recv"]
    off = r.nz["clock_offset_ns"]
    true_end = lambda x: x["ts_ns"] + x["dur_ns"] - off[x["node"]]  # noqa: E731
    ends = {true_end(x) for x in sends}
    assert recvs and all(true_end(x) in ends for x in recvs)
    per_step = defaultdict(int)
    for x in fn:
        if x["rank"] == 0 and x["fn"] == "flash_fwd_kernel":
            per_step[x["step"]] += 1
    chunks = 2 if schedule == "interleaved" else 1
    # each microbatch (and chunk) runs the forward once; evals add forwards on some steps
    assert min(per_step.values()) == r.cfg.mb * chunks
    frames = {x["stack"] for x in fn if x["fn"] == "forward_backward_pipelining"}
    assert any(("with_interleaving" in s) == (schedule == "interleaved") for s in frames)


def test_fsdp_moves_dp_traffic_into_the_blocks():
    seed = find_seed(lambda f: long_step(f, 1.0, 60.0) and f.plan.fsdp)
    r = run(seed)
    assert r.nz["fsdp"]
    dp = [x for x in r.by_type["fn"] if x.get("group", "").startswith("dp-") and x["rank"] == 0 and x["step"] == 5]
    ops = [x["op"] for x in sorted(dp, key=lambda x: x["ts_ns"])]
    assert ops.count("all_gather") >= 4 and ops.count("reduce_scatter") == 2
    assert all(x["fn"] != DP_REDUCE_SCATTER for x in dp)
    assert any(x["fn"] == FSDP_REDUCE_SCATTER for x in dp)


# ------------------------------------------------------------------ CLI


def test_cli_profile(tmp_path):
    seed = find_seed(lambda f: long_step(f))
    out = tmp_path / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "6", "--seed", str(seed),
                                   "--profile", "realistic", "-o", str(out)])
    assert res.exit_code == 0, res.output
    t = json.loads((tmp_path / "run.truth.json").read_text())
    assert t["profile"] == "realistic" and t["nuisances"]["trace_every_steps"] >= 1
    assert any(json.loads(line).get("nic") == "eth0" for line in out.read_bytes().splitlines())
    bad = CliRunner().invoke(cli, ["simulate", "--profile", "chaos", "-o", str(out)])
    assert bad.exit_code == 2


# ------------------------------------------------------------------ the bench


def test_bench_realistic_scenarios_fit_their_runs():
    from eroica.bench.accuracy import EARLY_TRACED_STEPS, HOLDOUT_BASE, realistic_scenarios, seed_list, window_s
    from eroica.producers.simulator.program import Program
    from eroica.producers.simulator.realistic import trace_every

    assert seed_list(2, False) == [1, 2] and seed_list(2, True) == [HOLDOUT_BASE + 1, HOLDOUT_BASE + 2]
    assert window_s("realistic") == 30.0  # the detector's default, not the default profile's tuned 20 s
    for seed in (1, 4, 11):
        scs = realistic_scenarios(4, 8, seed)
        assert sum(not sc.faults for sc in scs) >= 3 and any(not sc.faults and sc.pp > 1 for sc in scs)
        for sc in scs:
            cfg = SimConfig(nodes=4, gpus=8, seed=seed, pp=sc.pp, tp=sc.tp, faults=list(sc.faults),
                            profile="realistic")
            cfg.validate()
        early = next(sc for sc in scs if sc.name == "kernel_regression-early")
        spec = early.faults[0]
        start = int(spec.split("start=")[1])
        # a few *recorded* steady steps precede it (the tracer records one step in trace_every)
        plan = plan_for(seed)
        te = trace_every(Program(SimConfig(nodes=4, gpus=8, seed=seed, profile="realistic")), plan.step_for(1))
        steady_traced = [k for k in range(len(plan.warmup), start) if k % te == 0]
        assert EARLY_TRACED_STEPS[0] <= len(steady_traced) <= EARLY_TRACED_STEPS[1]
        assert start - 1 == steady_traced[-1]  # it starts right after the last of them
        assert 1.0 < float(spec.split("factor=")[1].split(",")[0]) <= 50.0


def test_bench_cli_json(monkeypatch):
    from eroica.bench import accuracy

    monkeypatch.setitem(accuracy.SCALES, "small", (2, 4, 20))  # a tiny layout keeps this quick
    res = CliRunner().invoke(cli, ["bench", "accuracy", "--profile", "realistic", "--seeds", "1", "--scale",
                                   "small", "--only", "gpu_throttle-power", "--format", "json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [s["profile"] for s in out["summaries"]] == ["realistic"] and out["summaries"][0]["window_s"] == 30.0
    (row,) = out["scenarios"]
    assert row["scenario"] == "gpu_throttle-power" and row["records"] > 0 and "passed" in row


def test_collector_styles_drop_the_job_record_stacks_and_write_collectives_as_nccl_kernels():
    """Nuisance 13: what other collectors leave out or write differently, drawn per seed."""
    def short(f) -> bool:
        return f.plan.step_s <= 5.0

    bare = run(find_seed(lambda f: f.no_job and f.no_stack and short(f)))
    assert not bare.by_type["job"] and all("stack" not in r for r in bare.by_type["fn"])
    assert bare.nz["collector"] == {"job_record": False, "collectives_as_nccl_kernels": bare.nz["collector"][
        "collectives_as_nccl_kernels"], "stacks": False}
    cupti = run(find_seed(lambda f: f.nccl_kernels and not f.no_job and short(f)))
    fns = cupti.by_type["fn"]
    assert not [r for r in fns if r["kind"] == "collective"]
    nccl = [r for r in fns if r["fn"].startswith("ncclDevKernel_")]
    assert nccl and all(r["kind"] == "kernel" and "op" not in r and r.get("group") for r in nccl)
    plain = run(find_seed(lambda f: not (f.no_job or f.nccl_kernels or f.no_stack) and short(f)))
    assert plain.by_type["job"] and any(r["kind"] == "collective" for r in plain.by_type["fn"])
