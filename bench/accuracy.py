"""The accuracy benchmark: every simulator fault and healthy runs, scored against ground truth.

Culprits, nodes and NICs are drawn from the seed (not fixed), so the detector
cannot be tuned to one rank number; every run goes through the real path:
simulate to a contract file, read it back, analyse it.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from eroica.models.reader import read_batches
from eroica.models.verdict import Verdict
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection import analyze

from .scoring import RunScore, score_run

SCALES = {
    # nodes, gpus per node, steps
    "small": (4, 8, 120),
    "medium": (8, 8, 120),
}
WINDOW_S = float(os.environ.get("EROICA_BENCH_WINDOW_S", "20"))


@dataclass
class Scenario:
    name: str
    faults: list[str]
    pp: int = 1
    steps: int | None = None


def scenarios(nodes: int, gpus: int, seed: int) -> list[Scenario]:
    rng = random.Random(seed * 7919 + nodes)
    world = nodes * gpus

    def rank() -> int:
        return rng.randrange(world)

    def node(exclude: set[int] = frozenset()) -> int:  # type: ignore[assignment]
        return rng.choice([n for n in range(nodes) if n not in exclude])

    n1 = node()
    r_other = rng.choice([r for r in range(world) if r // gpus != n1])
    cong = rng.sample(range(nodes), k=max(2, nodes // 3))
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
        Scenario("kernel_regression", [f"kernel_regression:fn={rng.choice(['flash_fwd_kernel', 'layer_norm_kernel', 'vectorized_elementwise_kernel'])}"]),
        Scenario("congestion", ["congestion:nodes=" + ";".join(str(n) for n in cong)]),
        Scenario("hang", [f"hang:rank={rank()}"]),
        Scenario("two_faults", [f"gpu_throttle:rank={r_other}", f"nic:node={n1},nic={rng.randrange(gpus)}"]),
    ]


@dataclass
class ScenarioResult:
    scale: str
    seed: int
    scenario: Scenario
    score: RunScore
    seconds: float
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        s = self.score
        return all(f.ok for f in s.faults) and not s.victims_blamed and not s.false_alarms


def run_scenario(scale: str, seed: int, sc: Scenario, workdir: Path) -> ScenarioResult:
    nodes, gpus, steps = SCALES[scale]
    cfg = SimConfig(nodes=nodes, gpus=gpus, steps=sc.steps or steps, pp=sc.pp, faults=list(sc.faults), seed=seed)
    path = workdir / f"{scale}-{seed}-{sc.name}.jsonl"
    truth: dict[str, Any] = dict(write_jsonl(cfg, path, truth_path=False))
    t0 = time.perf_counter()
    batches = read_batches(path)
    verdicts = list(analyze(batches, int(WINDOW_S * 1e9)))
    dt = time.perf_counter() - t0
    path.unlink()
    return ScenarioResult(scale, seed, sc, score_run(verdicts, truth), dt, verdicts)


def run_all(seeds: int, scales: list[str], only: str | None = None,
            progress: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    results = []
    with tempfile.TemporaryDirectory(prefix="eroica-bench-") as tmp:
        for scale in scales:
            nodes, gpus, _ = SCALES[scale]
            for seed in range(1, seeds + 1):
                for sc in scenarios(nodes, gpus, seed):
                    if only and only not in sc.name:
                        continue
                    r = run_scenario(scale, seed, sc, Path(tmp))
                    results.append(r)
                    if progress:
                        progress(r)
    return results


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
