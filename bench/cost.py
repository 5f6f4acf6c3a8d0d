"""The cost benchmark: the online S and S_X of every job window against the simulator's ground truth.

The simulator is deterministic per seed, and a fault draws from its own random
stream (``engine.ActiveFault``: seeded by the run's seed and the fault's
index), so re-running a scenario *without* its fault (same seed, same layout)
replays the same jitter, spikes and logging: the true cost of the fault.

* true S of a job window = time of the window's steps with the fault / time
  of the same steps without it (step start to next step start,
  ``truth["step_start_ns"]``);
* true S_X of one fault of a two-fault run = the same with only that fault.

The estimate is :func:`eroica.streams.detection.cost.window_cost` on the very
job windows the detector analyses (the same summariser, assembler and
layout); per scenario, the windows' S weighted by their steps against the
truth over the same steps. The culprit check: for a rank fault the culprit
rank has the largest S_X of all ranks; for a node fault the node (X = its
ranks) of all nodes; for a NIC fault (a rail ring is paced by the NIC, every
ring member alike) the ring that goes through the NIC, of all communicators.
Job-scope faults have no culprit rank and are reported apart: the peer
comparison cannot see what every rank shares; their verdicts state the cost
their evidence prices (see the cost module).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from eroica.models.reader import read_batches
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection.cost import window_cost
from eroica.streams.detection.detector import analyse_job_window
from eroica.streams.detection.history import JobHistory
from eroica.streams.detection.layout import infer_layout
from eroica.streams.detection.patterns import build_patterns
from eroica.streams.detection.steps import assemble
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import WindowAssembler

from .accuracy import SCALES, realistic_scenarios, scenarios, window_s

# no step time to compare once a rank stops (the hang fault), nothing to cost without a fault
SKIPPED = ("hang",)
LINK_FAULTS = ("nic", "nic_flaky", "nvlink")
# a stage holding more layers than the others: the stages are separate roles (the module's limits)
STAGE_FAULTS = ("pp_imbalance",)
# causes every rank shares whose ideal is not measured but physical (the bandwidth NCCL reaches over a
# healthy RDMA fabric: cost.network_excess_ns); reported, and summarised apart as well (the "priced" summary
# leaves them out, so that the waits' and the measured ideals' own error shows on its own)
UNPRICED = ("nccl_tcp", "congestion")


@dataclass
class WindowEstimate:
    steps: np.ndarray
    slowdown: float
    by_rank: dict[int, float]
    by_node: dict[str, float]
    by_group: dict[str, float]
    verdict_costs: list[tuple[str, str, int, float | None]]   # (component, scope, rank, cost) of its verdicts


@dataclass
class CostResult:
    seed: int
    scenario: str
    faults: list[str]
    scope: str                         # rank | node | link | job | several
    s_true: float
    s_est: float
    culprit: str = ""
    culprit_top: bool | None = None    # None: no single culprit to rank
    culprit_cost: float | None = None
    top: str = ""
    parts: dict[str, tuple[float, float]] = field(default_factory=dict)   # fault -> (true S_X, estimated S_X)
    unpriced: int = 0                  # confident slow verdicts stating no cost, over the scenario's windows
    windows: int = 0
    seconds: float = 0.0

    @property
    def rel_error(self) -> float:
        return abs(self.s_est - self.s_true) / self.s_true


def job_windows(path: Path, window_ns: int) -> list[tuple[Any, Any, list]]:
    """The detector's job windows of a contract file, with its verdicts on each (as ``analyze`` runs it)."""
    asm = WindowAssembler(window_ns, window_ns)
    out: list = []
    state: dict[str, Any] = {"pending": [], "carry": None, "history": None, "meta": None}

    def analyse(jw) -> None:
        h = state["history"] or JobHistory(job=jw.job)
        verdicts, h = analyse_job_window(jw, state["meta"], h)
        state["history"] = h
        out.append((jw, state["meta"], verdicts))

    def feed(w) -> None:
        state["meta"] = w.meta or state["meta"]
        state["pending"].append(digest_window(w))
        jw, carry = assemble(state["pending"], state["carry"])
        if jw is not None:
            analyse(jw)
            state["pending"], state["carry"] = [], carry

    for batch in read_batches(path):
        for j in batch.jobs:
            asm.add_meta(j)
        for cols in batch.columns.values():
            asm.add(cols)
        for w in asm.complete():
            feed(w)
    for w in asm.flush():
        feed(w)
    if state["pending"]:
        jw, _ = assemble(state["pending"], state["carry"], final=True)
        if jw is not None:
            analyse(jw)
    return out


def estimate(jw, meta, verdicts: list | None = None) -> WindowEstimate | None:
    """S of a job window as its verdicts state it (the waits' S, plus what job-wide and stage findings
    declare), the waits' S where it has no verdict; S_X of every rank, node and communicator."""
    p = build_patterns(jw)
    if not p.ranks.size:
        return None
    layout = infer_layout(jw, meta)
    wc = window_cost(jw, p.ranks, layout.work_groups(p.ranks))
    if wc is None:
        return None
    stated = [v.job_slowdown for v in verdicts or [] if v.job_slowdown is not None]
    nodes: dict[str, list[int]] = {}
    for r in wc.ranks.tolist():
        nodes.setdefault(layout.rank_node.get(int(r), ""), []).append(int(r))
    groups: dict[str, set[int]] = {}
    for r, g, p2p in zip(jw.colls.rank.tolist(), jw.colls.group, jw.colls.p2p.tolist()):
        if g and not p2p:
            groups.setdefault(g, set()).add(int(r))
    return WindowEstimate(
        steps=wc.steps, slowdown=stated[0] if stated else wc.slowdown,
        by_rank={int(r): wc.cost_of([r]) for r in wc.ranks.tolist()},
        by_node={n: wc.cost_of(rs) for n, rs in nodes.items()},
        by_group={g: wc.cost_of(sorted(rs)) for g, rs in groups.items()},
        verdict_costs=[(v.component, v.scope, v.rank, v.cost) for v in verdicts or [] if v.kind == "slow"],
    )


def _step_time(truth: dict, steps: np.ndarray) -> float:
    starts = np.asarray(truth["step_start_ns"], dtype=np.float64)
    steps = steps[steps + 1 < starts.size]
    return float((starts[steps + 1] - starts[steps]).sum())


def _simulate(cfg: SimConfig, path: Path) -> dict:
    return dict(write_jsonl(cfg, path, truth_path=False))


def _weighted(values: list[tuple[float, int]]) -> float:
    w = sum(n for _, n in values)
    return sum(v * n for v, n in values) / w if w else float("nan")


def _scope(faults: list[dict]) -> str:
    if not faults:
        return "healthy"
    if len(faults) != 1:
        return "several"
    f = faults[0]
    if f["name"] in LINK_FAULTS:
        return "link"
    if f["name"] in STAGE_FAULTS:
        return "stage"
    return f["scope"] if f["scope"] in ("rank", "node") else "job"


def _ring_of(truth: dict, fault: dict, groups: dict[str, set[int]]) -> tuple[str, list[str]]:
    """The communicator the faulty link paces, and the communicators of its shape (same size, not the
    whole job) it is ranked among. A NIC: the inter-node rail ring of its node's rank on that rail
    (local rank = NIC index, the simulator's rail alignment); a GPU's NVLinks: its node's TP group."""
    lay = truth["layout"]
    rank_nodes = lay["rank_nodes"]
    if fault["name"] == "nvlink":
        rank, inter = fault["ranks"][0], False
    else:
        on_node = [r for r, n in enumerate(rank_nodes) if n == fault["nodes"][0]]
        rank, inter = on_node[int(fault["nic"].split("_")[-1]) % len(on_node)], True
    world = len(rank_nodes)
    for g in sorted(groups):
        members = groups[g]
        if rank in members and (len({rank_nodes[m] for m in members}) > 1) == inter and len(members) < world:
            return g, [h for h in sorted(groups) if len(groups[h]) == len(members)]
    return "", []


def run_scenario(scale: str, seed: int, name: str, faults: list[str], pp: int, workdir: Path,
                 window_ns: int, profile: str = "default", tp: int | None = None) -> CostResult:
    t0 = time.perf_counter()
    nodes, gpus, steps = SCALES[scale]

    def cfg(fs: list[str]) -> SimConfig:
        if profile == "default":
            return SimConfig(nodes=nodes, gpus=gpus, steps=steps, pp=pp, tp=tp, faults=list(fs), seed=seed)
        # the seed's plan chooses the run length, its nuisances come from the seed, not from the faults
        return SimConfig(nodes=nodes, gpus=gpus, pp=pp, tp=tp, faults=list(fs), seed=seed, profile=profile)

    path = workdir / f"cost-{seed}-{name}.jsonl"
    truth = _simulate(cfg(faults), path)
    windows = job_windows(path, window_ns)
    path.unlink()
    healthy = dict(write_jsonl(cfg([]), workdir / "h.jsonl", truth_path=False))
    (workdir / "h.jsonl").unlink()
    alone = [dict(write_jsonl(cfg([f]), workdir / "a.jsonl", truth_path=False)) for f in faults] \
        if len(faults) > 1 else []
    if alone:
        (workdir / "a.jsonl").unlink()

    est: list[tuple[WindowEstimate, int]] = []
    for jw, meta, verdicts in windows:
        e = estimate(jw, meta, verdicts)
        if e is not None and e.steps.size:
            est.append((e, int(e.steps.size)))
    all_steps = np.concatenate([e.steps for e, _ in est]) if est else np.zeros(0, np.int64)
    # every window's verdicts, whether or not its cost could be estimated: what a user sees
    unpriced = sum(1 for _jw, _m, vs in windows for v in vs
                   if v.kind == "slow" and v.confidence >= 0.5 and v.cost is None)
    s_true = _step_time(truth, all_steps) / max(_step_time(healthy, all_steps), 1.0)
    s_est = _weighted([(e.slowdown, n) for e, n in est])
    tf = truth["faults"]
    res = CostResult(seed, name, faults, _scope(tf), s_true, s_est, windows=len(est), unpriced=unpriced)

    def top_of(key: str, among: list[str] | None = None) -> tuple[str, dict[str, float]]:
        agg: dict[str, list[tuple[float, int]]] = {}
        for e, n in est:
            for k, v in getattr(e, key).items():
                if among is not None and str(k) not in among:
                    continue
                agg.setdefault(str(k), []).append((v, n))
        means = {k: _weighted(v) for k, v in agg.items()}
        return (max(means, key=lambda k: (means[k], k)) if means else ""), means

    if res.scope == "rank":
        res.culprit = str(tf[0]["ranks"][0])
        res.top, means = top_of("by_rank")
    elif res.scope == "node":
        res.culprit = tf[0]["nodes"][0]
        res.top, means = top_of("by_node")
    elif res.scope == "link":
        groups: dict[str, set[int]] = {}
        for jw, _, _ in windows:
            for r, g, p2p in zip(jw.colls.rank.tolist(), jw.colls.group, jw.colls.p2p.tolist()):
                if g and not p2p:
                    groups.setdefault(g, set()).add(int(r))
        res.culprit, among = _ring_of(truth, tf[0], groups)
        res.top, means = top_of("by_group", among)
    else:
        # job-wide and stage faults: the cost their job-scope (or stage) verdict states, weighted by steps
        means = {}
        comp = tf[0]["component"] if tf else ""
        stated = [(c, n) for e, n in est for (k, scope, _r, c) in e.verdict_costs
                  if c is not None and k == comp and scope in ("job", "node")]
        if stated:
            res.culprit_cost = _weighted(stated)
    if res.culprit:
        res.culprit_top = res.top == res.culprit
        res.culprit_cost = means.get(res.culprit)
    if alone:
        _, by_rank = top_of("by_rank")
        _, by_node = top_of("by_node")
        for spec, t_alone, f in zip(faults, alone, tf):
            true_x = _step_time(t_alone, all_steps) / max(_step_time(healthy, all_steps), 1.0)
            if f["scope"] == "rank":
                e_x = by_rank.get(str(f["ranks"][0]), float("nan"))
            else:
                e_x = by_node.get(f["nodes"][0], float("nan"))
            res.parts[spec] = (true_x, e_x)
    res.seconds = time.perf_counter() - t0
    return res


def run_all(seeds: int, scale: str = "small", only: str | None = None,
            progress: Callable[[CostResult], None] | None = None, profile: str = "default") -> list[CostResult]:
    """Every scenario of ``bench accuracy``'s profile (``default``: 20 s windows; ``realistic``: the
    fleet's nuisances drawn per seed, at the detector's default window, as that bench runs them)."""
    out = []
    window_ns = int(window_s(profile) * 1e9)
    nodes, gpus, _ = SCALES[scale]
    make = scenarios if profile == "default" else realistic_scenarios
    with tempfile.TemporaryDirectory(prefix="eroica-cost-") as tmp:
        for seed in range(1, seeds + 1):
            for sc in make(nodes, gpus, seed):
                if sc.name in SKIPPED or (only and only not in sc.name):
                    continue
                r = run_scenario(scale, seed, sc.name, sc.faults, sc.pp, Path(tmp), window_ns, profile, sc.tp)
                out.append(r)
                if progress:
                    progress(r)
    return out


def summary(results: list[CostResult]) -> dict[str, Any]:
    """Errors of S over all scenarios and over the straggler (rank / node / link) ones, and the culprit check."""
    def errs(rs: list[CostResult]) -> dict[str, Any]:
        e = np.array([r.rel_error for r in rs])
        worst = max(rs, key=lambda r: r.rel_error) if rs else None
        return {"scenarios": len(rs), "median_rel_error": float(np.median(e)) if e.size else float("nan"),
                "worst_rel_error": float(e.max()) if e.size else float("nan"),
                "worst": f"seed {worst.seed} {worst.scenario}" if worst else ""}

    stragglers = [r for r in results if r.scope in ("rank", "node", "link", "several", "healthy")]
    single = [r for r in results if r.culprit_top is not None]
    return {
        "all": errs(results),
        "priced": errs([r for r in results if not any(f.split(":")[0] in UNPRICED for f in r.faults)]),
        "stragglers": errs(stragglers),
        "job_scope": errs([r for r in results if r.scope in ("job", "stage")]),
        "culprit_top": sum(bool(r.culprit_top) for r in single),
        "unpriced_verdicts": sum(r.unpriced for r in results),
        "unpriced_scenarios": sorted({f"seed {r.seed} {r.scenario}" for r in results if r.unpriced}),
        "single_culprit": len(single),
    }


def result_json(r: CostResult) -> dict[str, Any]:
    return {"seed": r.seed, "scenario": r.scenario, "faults": r.faults, "scope": r.scope,
            "s_true": round(r.s_true, 4), "s_est": round(r.s_est, 4), "rel_error": round(r.rel_error, 4),
            "culprit": r.culprit, "culprit_top": r.culprit_top,
            "culprit_cost": None if r.culprit_cost is None else round(r.culprit_cost, 4), "top": r.top,
            "parts": {k: {"true": round(a, 4), "est": round(b, 4)} for k, (a, b) in r.parts.items()},
            "windows": r.windows, "unpriced_verdicts": r.unpriced, "seconds": round(r.seconds, 1)}
