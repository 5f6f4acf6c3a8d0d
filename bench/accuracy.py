"""The accuracy benchmark: every simulator fault and healthy runs, scored against ground truth.

Culprits, nodes and NICs are drawn from the seed (not fixed), so the detector
cannot be tuned to one rank number; every run goes through the real path:
simulate to a contract file, read it back, analyse it.

Two profiles. ``default``: the simulator's clean fleet, analysed with 20 s
windows (``EROICA_BENCH_WINDOW_S``), the numbers the README quotes. ``realistic``:
the simulator's realistic fleet (:mod:`eroica.producers.simulator.realistic`:
extra NICs, two GPU models, missing fields, clock offsets, gaps, resets, steps
of 0.05-180 s, checkpoints, evals, warm-up, MoE jitter, pipeline schedules,
FSDP), analysed at the detector's *default* window as ``eroica analyze`` runs
it, with more healthy runs and the field misses (a kernel regression from the
first steps at 5-15 % of the step, a modestly flaky NIC). Tuning seeds are
1..N; held-out seeds (6001..6000+N) are reported apart and must not be looked
at while tuning.
"""

from __future__ import annotations

import os
import random
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from eroica.models.reader import read_batches
from eroica.models.verdict import Verdict
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.producers.simulator.program import Program
from eroica.producers.simulator.realistic import nominal_step_ns, plan_for, trace_every, variant_for
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze

from .scoring import RunScore, score_run

SCALES = {
    # nodes, gpus per node, steps
    "small": (4, 8, 120),
    "medium": (8, 8, 120),
}
WINDOW_S = float(os.environ.get("EROICA_BENCH_WINDOW_S", "20"))
PROFILES = ("default", "realistic")
# HOLD-OUT SEEDS: tuning uses seeds 1..N; 6001..6000+N are held out. No one may look at the held-out
# results (nor run them to see which scenarios fail) while tuning the detector: they are the estimate
# of how it does on data it was not tuned to. Report them, never tune to them.
# History: seeds 1001..1005, 2001..2005, 3001..3005, then 4001..4005, were hold-out ranges whose scores
# were seen (each time before fixes of failures reproduced on tuning seeds 1..15; 4002's GC miss was seen
# before the pause fix, so 4001..4005 may no longer be unseen) and are spent: a fresh range replaced them
# each time; their scores are reported in that day's closing notes. 5001..5005 were reported on
# 2026-11-23 (5005's few_workers victim was then reproduced and fixed: it is spent too).
# Tuning seeds 1..15 have been looked at; 2026-11-26 opened 16..20 (``--first-seed 16``) as fresh tuning
# seeds, to look for failures the used ones no longer show.
HOLDOUT_BASE = 6000


def window_s(profile: str) -> float:
    """The window a profile is analysed with: the realistic profile uses the detector's default,
    as ``eroica analyze`` and the stream workers do, not the bench's tuned 20 s."""
    return WINDOW_S if profile == "default" else float(DEFAULT_WINDOW_S)


def seed_list(seeds: int, holdout: bool, first: int = 1) -> list[int]:
    """Tuning seeds ``first..first+seeds-1``, or the held-out ``6001..6000+seeds`` (``first`` moves only the
    tuning range: fresh tuning seeds find failures the used ones no longer can, without touching the hold-out)."""
    return [HOLDOUT_BASE + s for s in range(1, seeds + 1)] if holdout else list(range(first, first + seeds))


@dataclass
class Scenario:
    name: str
    faults: list[str]
    pp: int = 1
    steps: int | None = None
    tp: int | None = None


class _Draws:
    """Culprits drawn from the seed, in one fixed order for both profiles' scenario lists."""

    def __init__(self, nodes: int, gpus: int, seed: int) -> None:
        self.rng = random.Random(seed * 7919 + nodes)
        self.nodes, self.world = nodes, nodes * gpus
        self.n1 = self.node()
        self.r_other = self.rng.choice([r for r in range(self.world) if r // gpus != self.n1])
        self.cong = self.rng.sample(range(nodes), k=max(2, nodes // 3))

    def rank(self) -> int:
        return self.rng.randrange(self.world)

    def node(self, exclude: frozenset[int] = frozenset()) -> int:
        return self.rng.choice([n for n in range(self.nodes) if n not in exclude])


def scenarios(nodes: int, gpus: int, seed: int) -> list[Scenario]:

    d = _Draws(nodes, gpus, seed)
    rng, rank, node, n1, r_other, cong = d.rng, d.rank, d.node, d.n1, d.r_other, d.cong
    return [
        Scenario("healthy", []),
        Scenario("healthy-pp", [], pp=2),
        Scenario("gpu_throttle", [f"gpu_throttle:rank={rank()}"]),
        Scenario("gpu_throttle-power", [f"gpu_throttle:rank={rank()},reason=power"]),
        Scenario("gpu_memory", [f"gpu_memory:rank={rank()}"]),
        Scenario("pcie", [f"pcie:rank={rank()}"]),
        Scenario("nvlink", [f"nvlink:rank={rank()}"]),
        Scenario("nic", [f"nic:node={node()},nic={rng.randrange(gpus)}"]),
        Scenario("nic_flaky", [f"nic_flaky:node={node()},nic={rng.randrange(gpus)}"]),
        Scenario("dataloader", [f"dataloader:node={node()}"]),
        Scenario("storage", [f"storage:node={node()}"]),
        Scenario("host_cpu", [f"host_cpu:node={node()}"]),
        Scenario("gc", ["gc"]),
        Scenario("uneven_workload", [f"uneven_workload:rank={rank()}"]),
        Scenario("pp_imbalance", [f"pp_imbalance:stage={rng.randrange(2)}"], pp=2),
        Scenario("nccl_tcp", ["nccl_tcp"]),
        Scenario("few_workers", ["few_workers"]),
        Scenario("kernel_regression", ["kernel_regression:fn=" + rng.choice(
            ["flash_fwd_kernel", "layer_norm_kernel", "vectorized_elementwise_kernel"])]),
        Scenario("congestion", ["congestion:nodes=" + ";".join(str(n) for n in cong)]),
        Scenario("hang", [f"hang:rank={rank()}"]),
        Scenario("two_faults", [f"gpu_throttle:rank={r_other}", f"nic:node={n1},nic={rng.randrange(gpus)}"]),
    ]


# The realistic profile keeps each fault's size relative to the step: the default profile's
# millisecond parameters are shares of its ~0.70 s step (a 250 ms data-loader stall is 36 % of it).
DEFAULT_STEP_MS = 700.0
FAULT_STEP_SHARE = {"dataloader": 250.0 / DEFAULT_STEP_MS, "storage": 300.0 / DEFAULT_STEP_MS,
                    "few_workers": 200.0 / DEFAULT_STEP_MS, "gc": 500.0 / DEFAULT_STEP_MS}
REGRESSION_SHARE = (0.05, 0.15)  # the field miss: a regression adding 5-15 % to the step, not a huge one
REGRESSION_KERNELS = ("flash_fwd_kernel", "layer_norm_kernel", "vectorized_elementwise_kernel")
MAX_REGRESSION_FACTOR = 50.0  # the fault's own bound
# "A few steps in", counted in steps the tracer recorded after the warm-up: the job's history is
# what was recorded. Two at least: one step is no evidence of a level (a partial batch or a short
# sequence makes one step cheap on every rank), and the detector's level skips a lone low step by
# design (patterns.LOW_Q). The first version counted 1-3 raw steps: with one step traced in ten
# (held-out seed 6004) the regression began before any steady step was recorded, and with one
# (tuning seed 2) a lone step was all the history there was; both were counted as misses.
EARLY_TRACED_STEPS = (2, 4)


def kernel_step_share(cfg: SimConfig, fn: str) -> float:
    """The share of a healthy step that kernel ``fn`` takes on a rank (pp = 1)."""
    prog = Program(cfg)
    k = sum(o.gpu_ns for o in prog.fwd[0] + prog.bwd[0] if o.fn == fn)
    return k / nominal_step_ns(cfg.nodes, cfg.gpus, cfg.tp_size, cfg.pp, cfg.mb, variant_for(cfg))


def early_regression_step(cfg: SimConfig, steady_traced: int) -> int:
    """The step a regression starts at so that ``steady_traced`` recorded steps after the warm-up precede it."""
    plan = cfg.plan
    te = trace_every(Program(cfg), plan.step_for(cfg.pp))
    first = -(-len(plan.warmup) // te) * te  # the first traced step past the warm-up
    return first + (steady_traced - 1) * te + 1


def realistic_scenarios(nodes: int, gpus: int, seed: int) -> list[Scenario]:
    """Every fault (sized to the seed's step), 4 healthy runs (two pipelined), two faults at once and
    the field misses. Culprits come from the same stream as :func:`scenarios`: independent of the
    nuisances, which the simulator draws from its own."""
    world = nodes * gpus
    plan = plan_for(seed)
    step_ms = plan.step_s * 1e3
    ms = {k: round(v * step_ms, 3) for k, v in FAULT_STEP_SHARE.items()}

    d = _Draws(nodes, gpus, seed)
    rng, rank, node, n1, r_other, cong = d.rng, d.rank, d.node, d.n1, d.r_other, d.cong
    kr_fn = rng.choice(list(REGRESSION_KERNELS))
    early_fn = rng.choice(list(REGRESSION_KERNELS))
    share = rng.uniform(*REGRESSION_SHARE)
    base = SimConfig(nodes=nodes, gpus=gpus, seed=seed, profile="realistic")
    factor = min(MAX_REGRESSION_FACTOR, 1.0 + share / kernel_step_share(base, early_fn))
    early = early_regression_step(base, rng.randint(*EARLY_TRACED_STEPS))
    out = [
        Scenario("healthy", []),
        Scenario("healthy-tp4", [], tp=gpus // 2 if gpus % 2 == 0 else None),
        Scenario("healthy-pp2", [], pp=2),
        Scenario("healthy-pp4", [], pp=4) if world % (gpus * 4) == 0 else Scenario("healthy-pp2-tp4", [], pp=2,
                                                                                     tp=gpus // 2),
        Scenario("gpu_throttle", [f"gpu_throttle:rank={rank()}"]),
        Scenario("gpu_throttle-power", [f"gpu_throttle:rank={rank()},reason=power"]),
        Scenario("gpu_memory", [f"gpu_memory:rank={rank()}"]),
        Scenario("pcie", [f"pcie:rank={rank()}"]),
        Scenario("nvlink", [f"nvlink:rank={rank()}"]),  # one GPU's NVLinks (a field miss)
        Scenario("nic", [f"nic:node={node()},nic={rng.randrange(gpus)}"]),
        Scenario("nic_flaky", [f"nic_flaky:node={node()},nic={rng.randrange(gpus)}"]),
        Scenario("dataloader", [f"dataloader:node={node()},ms={ms['dataloader']}"]),
        Scenario("storage", [f"storage:node={node()},ms={ms['storage']}"]),
        Scenario("host_cpu", [f"host_cpu:node={node()}"]),
        Scenario("gc", [f"gc:ms={ms['gc']}"]),
        Scenario("uneven_workload", [f"uneven_workload:rank={rank()}"]),
        Scenario("pp_imbalance", [f"pp_imbalance:stage={rng.randrange(2)}"], pp=2),
        Scenario("nccl_tcp", ["nccl_tcp"]),
        Scenario("few_workers", [f"few_workers:ms={ms['few_workers']}"]),
        Scenario("kernel_regression", [f"kernel_regression:fn={kr_fn}"]),
        Scenario("congestion", ["congestion:nodes=" + ";".join(str(n) for n in cong)]),
        Scenario("hang", [f"hang:rank={rank()}"]),
        Scenario("two_faults", [f"gpu_throttle:rank={r_other}", f"nic:node={n1},nic={rng.randrange(gpus)}"]),
        # the field misses
        Scenario("kernel_regression-early", [f"kernel_regression:fn={early_fn},factor={factor:.3f},start={early}"]),
        Scenario("nic_flaky-modest", [f"nic_flaky:node={node()},nic={rng.randrange(gpus)},factor=1.3,"
                                      f"flap_prob=0.02"]),
    ]
    return out


@dataclass
class ScenarioResult:
    scale: str
    seed: int
    scenario: Scenario
    score: RunScore
    seconds: float
    verdicts: list[Verdict] = field(default_factory=list)
    profile: str = "default"
    holdout: bool = False
    records: int = 0
    sim_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    step_s: float = 0.0           # the run's median step time (its truth's step starts)

    @property
    def passed(self) -> bool:
        s = self.score
        return all(f.ok for f in s.faults) and not s.victims_blamed and not s.false_alarms


def run_scenario(scale: str, seed: int, sc: Scenario, workdir: Path, profile: str = "default",
                 holdout: bool = False, run: int | None = None) -> ScenarioResult:
    """One scenario simulated and analysed; ``run`` cuts it to that many steps (:func:`run_length`)."""
    nodes, gpus, scale_steps = SCALES[scale]
    if profile == "default":
        cfg = SimConfig(nodes=nodes, gpus=gpus, steps=run or sc.steps or scale_steps, pp=sc.pp, tp=sc.tp,
                        faults=list(sc.faults), seed=seed)
    else:  # the seed's plan chooses the run length (and the sample period) unless cut
        cfg = SimConfig(nodes=nodes, gpus=gpus, steps=run or sc.steps, pp=sc.pp, tp=sc.tp, faults=list(sc.faults),
                        seed=seed, profile=profile)
    path = workdir / f"{profile}-{scale}-{seed}-{sc.name}.jsonl"
    t_sim = time.perf_counter()
    truth: dict[str, Any] = dict(write_jsonl(cfg, path, truth_path=False))
    t0 = time.perf_counter()
    batches = read_batches(path)
    verdicts = list(analyze(batches, int(window_s(profile) * 1e9)))
    dt = time.perf_counter() - t0
    path.unlink()
    return ScenarioResult(scale, seed, sc, score_run(verdicts, truth), dt, verdicts, profile, holdout,
                          int(truth["records"]), t0 - t_sim, observability_notes(truth), median_step_s(truth))


def median_step_s(truth: dict[str, Any]) -> float:
    """The run's median step time in seconds, from its truth's step start times (0 with fewer than two)."""
    starts = np.asarray(truth.get("step_start_ns") or [], dtype=np.float64)
    return float(np.median(np.diff(starts))) / 1e9 if starts.size > 1 else 0.0


# Step-time bands of the fault-to-alarm table: a fine-tune's sub-second steps .. a huge model's minutes.
STEP_BANDS_S = (0.5, 5.0, 60.0)


def step_band(step_s: float) -> str:
    """The band of a step time: '<0.5 s', '0.5-5 s', '5-60 s' or '>=60 s'."""
    lo = 0.0
    for hi in STEP_BANDS_S:
        if step_s < hi:
            return f"<{hi:g} s" if lo == 0.0 else f"{lo:g}-{hi:g} s"
        lo = hi
    return f">={lo:g} s"


def observability_notes(truth: dict[str, Any]) -> list[str]:
    """Nuisances that hide part of a fault's signature on its culprit (realistic profile): a reader
    of a failure needs them; the run is scored all the same (a real fleet has them too)."""
    nz = truth.get("nuisances")
    if not nz:
        return []
    notes = []
    culprit_nodes = {n for f in truth["faults"] for n in (f.get("nodes") or []) + (f.get("affected_nodes") or [])}
    names = {f["name"] for f in truth["faults"]}
    if nz.get("host_records_missing") in culprit_nodes and names & {"dataloader", "storage", "host_cpu"}:
        notes.append(f"no host records from {nz['host_records_missing']}")
    for n in sorted(culprit_nodes):
        miss = nz.get("missing_fields", {}).get(n, [])
        if "nvlink" in miss and "nvlink" in names:
            notes.append(f"{n} reports no NVLink counters")
        if "nic_hw_counters" in miss and names & {"nic_flaky", "congestion"}:
            notes.append(f"{n} reports no NIC hw_counters")
        if (nz.get("counter_reset") or {}).get("node") == n and names & {"nic_flaky", "congestion"}:
            notes.append(f"{n}'s counters reset mid-run")
    return notes


def run_length(profile: str, nodes: int, gpus: int, seed: int, sc: Scenario, steps: int | None) -> int | None:
    """The steps to simulate for a run cut to ``steps`` *recorded* steps (None: not cut).

    A short trace is what a user recorded: where the realistic tracer records one step in ``te``
    (nuisance 6, :func:`trace_every`), 30 recorded steps are 30 x ``te`` steps of the job.
    """
    if steps is None:
        return None
    if profile == "default":
        return steps
    cfg = SimConfig(nodes=nodes, gpus=gpus, pp=sc.pp, tp=sc.tp, seed=seed, profile=profile)
    return steps * trace_every(Program(cfg), cfg.plan.step_for(cfg.pp))


def fits(sc: Scenario, run: int | None) -> bool:
    """Whether a scenario can run in a run cut to ``run`` steps: each fault given a start step starts before
    the cut; a scenario that cannot is left out of a cut run, not scored as a miss."""
    if run is None:
        return True
    starts = [int(m.group(1)) for f in sc.faults for m in [re.search(r"(?:^|[,:])start=(\d+)", f)] if m]
    return all(start < run for start in starts)


def run_all(seeds: int, scales: list[str], only: str | None = None,
            progress: Callable[[ScenarioResult], None] | None = None,
            profiles: tuple[str, ...] = ("default",), holdout: bool = False,
            first_seed: int = 1, steps: int | None = None) -> list[ScenarioResult]:
    """Every scenario of every profile, scale and tuning seed (and the held-out seeds with ``holdout``);
    ``steps`` cuts every run to that many steps."""
    results = []
    splits = [False, True] if holdout else [False]
    with tempfile.TemporaryDirectory(prefix="eroica-bench-") as tmp:
        for profile in profiles:
            make = scenarios if profile == "default" else realistic_scenarios
            for held in splits:
                for scale in scales:
                    nodes, gpus, _ = SCALES[scale]
                    for seed in seed_list(seeds, held, first_seed):
                        for sc in make(nodes, gpus, seed):
                            if only and only not in sc.name:
                                continue
                            run = run_length(profile, nodes, gpus, seed, sc, steps)
                            if not fits(sc, run):
                                continue
                            r = run_scenario(scale, seed, sc, Path(tmp), profile, held, run)
                            results.append(r)
                            if progress:
                                progress(r)
    return results


def groups(results: list[ScenarioResult]) -> list[tuple[str, bool, list[ScenarioResult]]]:
    """Results per (profile, held out), in run order: each gets its own summary line."""
    keys: list[tuple[str, bool]] = []
    for r in results:
        if (r.profile, r.holdout) not in keys:
            keys.append((r.profile, r.holdout))
    return [(p, h, [r for r in results if (r.profile, r.holdout) == (p, h)]) for p, h in keys]


def totals(results: list[ScenarioResult]) -> dict[str, Any]:
    faults = [f for r in results for f in r.score.faults]
    healthy = [r for r in results if not r.scenario.faults]
    return {
        "faults": len(faults),
        "localised": sum(f.ok for f in faults),
        "share_localised": (sum(f.ok for f in faults) / len(faults)) if faults else 1.0,
        "victims_blamed": sum(len(r.score.victims_blamed) for r in results),
        "false_alarms_healthy": sum(len(r.score.false_alarms) for r in healthy),
        "false_alarms_faulty": sum(len(r.score.false_alarms) for r in results if r.scenario.faults),
        "healthy_runs": len(healthy),
        "scenarios": len(results),
        "passed": sum(r.passed for r in results),
        "records": sum(r.records for r in results),
        "seconds": round(sum(r.seconds + r.sim_seconds for r in results), 1),
        "fault_to_alarm": fault_to_alarm_table(results),
        "fault_to_alarm_by_step_time": fault_to_alarm_table(results, by_band=True),
    }


def fault_to_alarm_table(results: list[ScenarioResult], by_band: bool = False) -> dict[str, dict[str, Any]]:
    """Per fault kind (or per step-time band, :func:`step_band`): how many were alarmed on, and the median
    and worst fault-to-alarm in steps and seconds."""
    by: dict[str, list[Any]] = {}
    for r in results:
        for f in r.score.faults:
            by.setdefault(step_band(r.step_s) if by_band else f.name, []).append(f)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(by):
        got = [f for f in by[name] if f.alarm_s is not None]
        steps = sorted(f.alarm_steps for f in got)
        secs = sorted(f.alarm_s for f in got)
        out[name] = {"faults": len(by[name]), "alarmed": len(got),
                     "median_steps": float(np.median(steps)) if steps else None,
                     "max_steps": max(steps) if steps else None,
                     "median_s": round(float(np.median(secs)), 1) if secs else None,
                     "max_s": round(max(secs), 1) if secs else None}
    return out


def result_json(r: ScenarioResult) -> dict[str, Any]:
    s = r.score
    return {
        "profile": r.profile, "holdout": r.holdout, "scale": r.scale, "seed": r.seed, "scenario": r.scenario.name,
        "faults": r.scenario.faults, "pp": r.scenario.pp, "tp": r.scenario.tp, "passed": r.passed,
        "expected": [f.expected for f in s.faults], "found": [f.found for f in s.faults],
        "localised": [f.ok for f in s.faults], "victims_blamed": s.victims_blamed, "false_alarms": s.false_alarms,
        "alarms": s.alarms, "notes": r.notes, "records": r.records,
        "fault_to_alarm_s": [f.alarm_s for f in s.faults], "fault_to_alarm_steps": [f.alarm_steps for f in s.faults],
        "step_s": round(r.step_s, 3),
        "simulate_s": round(r.sim_seconds, 2), "analyze_s": round(r.seconds, 2),
    }


def shared_dir() -> Path:
    """``../shared`` beside the checkout, or $EROICA_SHARED, or the workplace's /work/shared."""
    env = os.environ.get("EROICA_SHARED")
    if env:
        return Path(env)
    beside = Path(__file__).resolve().parents[1].parent / "shared"
    return beside if beside.is_dir() else Path("/work/shared")


@dataclass
class RealTraceResult:
    path: Path
    verdicts: list[Verdict]
    passed: bool
    found: str


def run_real_straggler_trace(base: Path | None = None) -> RealTraceResult | None:
    """The OSDI'25 op-table trace: its published cause is a long last pipeline stage (ranks 6, 7)."""
    from eroica.producers.importers.optable import import_optable

    path = (base or shared_dir()) / "data" / "stragglers" / "trace-ST.parquet"
    if not path.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="eroica-bench-") as tmp:
        out = Path(tmp) / "st.jsonl"
        import_optable(path, out)
        verdicts = list(analyze(read_batches(out), int(WINDOW_S * 1e9)))
    alarms = [v for v in verdicts if v.confidence >= 0.5]
    named = {v.rank for v in alarms if v.scope == "rank"}
    hardware = {v.component for v in verdicts} - {"workload"}
    ok = bool(alarms) and named == {6, 7} and all(v.component == "workload" for v in alarms) and not hardware
    found = ", ".join(sorted({f"{v.component}@rank {v.rank}" for v in alarms})) or "nothing"
    return RealTraceResult(path, verdicts, ok, found)
