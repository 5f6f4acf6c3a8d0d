"""Overhead of ``eroica trace`` on a real gloo DDP job: plain vs traced, alternating, side by side.

    python -m eroica.producers.tracer.bench_overhead --runs 6 --steps 400

Each round runs :mod:`eroica.producers.tracer.ddp_job` (torchrun, ``--nproc``
ranks, no fault) once plain and once under ``eroica trace --out`` (node agent
included, as deployed), alternating which goes first so that drift on the
machine hits both alike. Rank 0 reports its per-step wall times; the first
``--warmup`` steps are dropped and each run is summarised by its median step
time. Reported: every round's traced / plain ratio, their median and mean,
and the median over all steps of each mode.

Step times on a shared machine move with whatever else runs on it, so two
steadier measures come with them: the CPU time each rank's process (all its
threads: training, gloo, the tracer's writer) spends per step after the
warm-up, traced / plain; and the tracer's own cost per record measured
in-process (``begin`` + ``end`` + queueing, no I/O) times records per step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _job_cmd(nproc: int, steps: int, stats: Path, warmup: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
            "-m", "eroica.producers.tracer.ddp_job", "--steps", str(steps), "--stats", str(stats),
            "--cpu-from-step", str(warmup), *extra]


def run_once(traced: bool, nproc: int, steps: int, warmup: int, work: Path, extra: list[str], agent: bool) -> dict:
    stats = work / f"stats-{'traced' if traced else 'plain'}.json"
    cmd = _job_cmd(nproc, steps, stats, warmup, extra)
    if traced:
        out = work / "run.jsonl"
        cmd = [sys.executable, "-m", "eroica.cli.main", "trace", "--out", str(out)] + \
            ([] if agent else ["--no-agent"]) + ["--"] + cmd
    t0 = time.monotonic()
    before = os.times()
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"{'traced' if traced else 'plain'} run failed:\n{proc.stderr[-3000:]}")
    data = json.loads(stats.read_text())
    data["wall_s"] = time.monotonic() - t0
    # every process of the run (launcher, ranks, eroica trace with its agent and merge), start-up included
    data["total_cpu_s"] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if traced:
        data["records"] = sum(1 for _ in open(work / "run.jsonl"))
    return data


def span_cost_ns(n: int = 200_000) -> float:
    """Nanoseconds per traced span (begin + end + queue append), in this process, no I/O."""
    from eroica.producers.tracer.runtime import Identity, Tracer

    class Null:
        def write(self, recs): pass
        def close(self): pass

    t = Tracer(sink_factory=lambda ident: Null(), identity=Identity("b", "n", 0, 1, 0, os.getpid(), True),
               capacity=n + 10, flush_s=3600.0)
    t.sigterm_dump = False
    extra = (4096, "all_reduce", "pg0", None, None)
    t.end(t.begin("warm", "python"))
    start = time.perf_counter_ns()
    for _ in range(n):
        t.end(t.begin("DDP.all_reduce", "collective", extra))
    per = (time.perf_counter_ns() - start) / n
    t.close(in_flight=False)
    return per


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6, help="rounds of (plain, traced)")
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--warmup", type=int, default=30, help="first steps of each run left out")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--no-agent", action="store_true", help="trace without the node agent")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("job_args", nargs="*", help="extra ddp_job arguments (after --)")
    args = ap.parse_args(argv)

    per_span = span_cost_ns()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="eroica-bench-") as tmp:
        work = Path(tmp)
        for i in range(args.runs):
            order = (False, True) if i % 2 == 0 else (True, False)
            res = {}
            for traced in order:
                res[traced] = run_once(traced, args.nproc, args.steps, args.warmup, work, args.job_args,
                                       not args.no_agent)
            plain = statistics.median(res[False]["step_times"][args.warmup:])
            traced = statistics.median(res[True]["step_times"][args.warmup:])
            cpu = res[True]["cpu_per_step_s"] / res[False]["cpu_per_step_s"]
            rounds.append({"plain_ms": plain * 1e3, "traced_ms": traced * 1e3, "ratio": traced / plain,
                           "cpu_per_step_ms": {"plain": res[False]["cpu_per_step_s"] * 1e3,
                                               "traced": res[True]["cpu_per_step_s"] * 1e3},
                           "cpu_ratio": cpu,
                           "total_cpu_s": {"plain": res[False]["total_cpu_s"], "traced": res[True]["total_cpu_s"]},
                           "records": res[True]["records"], "steps": res[True]["steps"],
                           "plain_steps": res[False]["step_times"][args.warmup:],
                           "traced_steps": res[True]["step_times"][args.warmup:]})
            print(f"round {i + 1}/{args.runs} ({'plain first' if i % 2 == 0 else 'traced first'}): "
                  f"plain {plain * 1e3:.2f} ms, traced {traced * 1e3:.2f} ms, ratio {traced / plain:.4f}; "
                  f"CPU per rank-step ratio {cpu:.4f}",
                  flush=True)
    ratios = [r["ratio"] for r in rounds]
    all_plain = [t for r in rounds for t in r.pop("plain_steps")]
    all_traced = [t for r in rounds for t in r.pop("traced_steps")]
    records_per_step = statistics.median(r["records"] / r["steps"] for r in rounds)
    step_ms = statistics.median(all_plain) * 1e3
    summary = {
        "nproc": args.nproc, "steps": args.steps, "runs": args.runs, "agent": not args.no_agent,
        "ratio_median": statistics.median(ratios), "ratio_mean": statistics.fmean(ratios),
        "ratio_min": min(ratios), "ratio_max": max(ratios),
        "pooled_step_ms": {"plain": step_ms, "traced": statistics.median(all_traced) * 1e3},
        "pooled_ratio": statistics.median(all_traced) / statistics.median(all_plain),
        "cpu_ratio_median": statistics.median(r["cpu_ratio"] for r in rounds),
        "cpu_ratio_mean": statistics.fmean(r["cpu_ratio"] for r in rounds),
        "total_cpu_s_median": {m: statistics.median(r["total_cpu_s"][m] for r in rounds) for m in ("plain", "traced")},
        "span_cost_ns": per_span, "records_per_step_all_ranks": records_per_step,
        "bound_per_step_pct": 100.0 * per_span * records_per_step / args.nproc / (step_ms * 1e6),
        "rounds": rounds,
    }
    print(f"\n{args.runs} rounds, {args.nproc} ranks, {args.steps} steps each "
          f"({'with' if summary['agent'] else 'without'} node agent):")
    print(f"  step-time ratio traced/plain: median {summary['ratio_median']:.4f}, mean {summary['ratio_mean']:.4f}, "
          f"range {summary['ratio_min']:.4f}..{summary['ratio_max']:.4f}")
    print(f"  pooled medians: plain {step_ms:.2f} ms, traced {summary['pooled_step_ms']['traced']:.2f} ms "
          f"(ratio {summary['pooled_ratio']:.4f})")
    print(f"  CPU time per rank-step (each rank's process, all threads) traced/plain: median "
          f"{summary['cpu_ratio_median']:.4f}, mean {summary['cpu_ratio_mean']:.4f}")
    print(f"  whole-run CPU incl. start-up, agent and merge: plain {summary['total_cpu_s_median']['plain']:.1f} s, "
          f"traced {summary['total_cpu_s_median']['traced']:.1f} s (medians)")
    print(f"  tracer cost per record {per_span:.0f} ns x {records_per_step / args.nproc:.1f} records per rank-step "
          f"= {summary['bound_per_step_pct']:.3f}% of a {step_ms:.1f} ms step")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
