"""The tracer's cost per record in CPU instructions (callgrind), and per step of the gloo test jobs.

    python -m eroica.producers.tracer.bench_instructions            # ~5 minutes: 4 runs under valgrind

Step times on a shared machine move with its load; instruction counts do not
(``perf stat -e instructions`` is not supported on this VM, so callgrind
counts them, every thread of the process included: the training thread's
hooks and the writer thread that encodes and writes the records).

A two-rank gloo job runs a training loop whose every step makes one record
of each kind the tracer writes on the jobs' hot paths: a loader fetch, the
model's forward and backward, an ``all_reduce``, an ``isend`` and an
``irecv`` (to the other rank, waited for) and the optimizer step. Rank 0 is
measured under callgrind; rank 1, its partner, runs natively and plain. It runs plain and
traced, for ``--k1`` and ``--k2`` steps each (after the same warm-up, which
covers the tracer's learning phase); the difference of the differences
cancels start-up (interpreter, torch import, process group) and leaves

    instructions per record = ((traced k2 - traced k1) - (plain k2 - plain k1)) / (records k2 - records k1)

Per step of a real job: that figure times the job's records per rank and step
(counted in a trace of it, ``--trace FILE``: one of the gloo test jobs under
``eroica trace``), turned into time with the instructions per second this
machine runs the plain loop at (callgrind's count over the loop's own CPU
time natively), and set against the job's step time in that trace.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

WARMUP = 8


def worker(steps: int, traced: bool, out: Path | None, rank: int, store: str) -> None:
    """The measured loop (run once per process: under valgrind, or natively for the timing)."""
    import torch

    if traced:
        from eroica.producers import tracer

        tracer.instrument()
    import torch.distributed as dist
    import torch.nn as nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    peer = 1 - rank
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n = WARMUP + steps
    loader = iter(DataLoader(TensorDataset(torch.randn(n * 4, 16), torch.randint(0, 4, (n * 4,))), batch_size=4))
    buf, got = torch.ones(16), torch.empty(16)
    t0 = c0 = 0.0
    for i in range(n):
        if i == WARMUP:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = next(loader)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        dist.all_reduce(model[0].weight.grad)
        works = [dist.isend(buf, dst=peer), dist.irecv(got, src=peer)]
        for w in works:
            w.wait()
        opt.step()
        opt.zero_grad()
    cpu = time.process_time() - c0
    if out is not None:
        out.write_text(json.dumps({"steps": steps, "cpu_s": cpu, "wall_s": time.perf_counter() - t0}))
    dist.destroy_process_group()


def _worker_cmd(steps: int, rank: int, store: Path) -> list[str]:
    return [sys.executable, "-m", "eroica.producers.tracer.bench_instructions", "--worker", "--steps", str(steps),
            "--rank", str(rank), "--store", str(store)]


def _start_callgrind(steps: int, traced: bool, work: Path) -> tuple:
    """Rank 0 under callgrind (traced or not), its partner rank 1 natively and plain."""
    tag = f"{'traced' if traced else 'plain'}-{steps}"
    out = work / f"callgrind.{tag}"
    trace_dir = work / f"trace-{tag}"
    store = work / f"store-{tag}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *_worker_cmd(steps, 0, store)]
    if traced:
        cmd.append("--traced")
    env = {**os.environ, "EROICA_TRACE_DIR": str(trace_dir), "EROICA_JOB": "bench", "OMP_NUM_THREADS": "1"}
    measured = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    partner = subprocess.Popen(_worker_cmd(steps, 1, store), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env={**os.environ, "OMP_NUM_THREADS": "1"})
    return tag, out, trace_dir, traced, measured, partner


def _finish_callgrind(run: tuple) -> tuple[int, int]:
    """(instructions of the whole measured process, records it wrote)."""
    tag, out, trace_dir, traced, measured, partner = run
    _, stderr = measured.communicate()
    partner.wait()
    proc = subprocess.CompletedProcess(measured.args, measured.returncode, "", stderr)
    if proc.returncode != 0:
        raise SystemExit(f"callgrind run failed ({tag}):\n{proc.stderr[-3000:]}")
    m = re.search(r"Collected\s*:\s*(\d+)", proc.stderr)
    if m is None:
        totals = [line for line in out.read_text().splitlines() if line.startswith(("summary:", "totals:"))]
        instr = int(totals[-1].split()[1])
    else:
        instr = int(m.group(1))
    records = sum(len(p.read_text().splitlines()) for p in trace_dir.glob("*.jsonl")) if traced else 0
    return instr, records


def per_step_of_trace(path: Path) -> dict:
    """Records per rank and step, and the median step time, of a traced job (merged ``eroica trace`` file)."""
    recs: Counter = Counter()
    ends: dict[int, list[int]] = defaultdict(list)
    steps: dict[int, set] = defaultdict(set)
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            if r.get("type") != "fn":
                continue
            recs[r["rank"]] += 1
            steps[r["rank"]].add(r["step"])
            if r["kind"] == "optimizer":
                ends[r["rank"]].append(r["ts_ns"] + r["dur_ns"])
    per_step = statistics.median(recs[r] / max(1, len(steps[r])) for r in recs)
    gaps = [b - a for r in ends for a, b in zip(sorted(ends[r]), sorted(ends[r])[1:])]
    return {"records_per_rank_step": per_step, "step_time_s": statistics.median(gaps) / 1e9 if gaps else float("nan")}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--stats", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--store", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--k1", type=int, default=20)
    ap.add_argument("--k2", type=int, default=220)
    ap.add_argument("--trace", action="append", default=[], help="a traced job's merged file: per-step figures")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.steps, args.traced, Path(args.stats) if args.stats else None, args.rank, args.store)
        return

    with tempfile.TemporaryDirectory(prefix="eroica-instr-") as tmp:
        work = Path(tmp)
        # all four at once: instruction counts do not depend on the load, only the wall time does
        started = {(traced, k): _start_callgrind(k, traced, work) for traced in (False, True) for k in (args.k1, args.k2)}
        runs = {key: _finish_callgrind(run) for key, run in started.items()}
        # the plain loop natively: instructions per CPU second of this machine
        stats = work / "native.json"
        store = work / "store-native"
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        partner = subprocess.Popen(_worker_cmd(args.k2, 1, store), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, env=env)
        subprocess.run([*_worker_cmd(args.k2, 0, store), "--stats", str(stats)], check=True, capture_output=True,
                       env=env)
        partner.wait()
        native = json.loads(stats.read_text())
    plain = runs[(False, args.k2)][0] - runs[(False, args.k1)][0]
    traced = runs[(True, args.k2)][0] - runs[(True, args.k1)][0]
    records = runs[(True, args.k2)][1] - runs[(True, args.k1)][1]
    per_record = (traced - plain) / records
    ips = plain / native["cpu_s"] * (args.k2 / (args.k2 - args.k1))   # plain loop, per CPU second
    result = {
        "instructions_per_record": round(per_record),
        "records_per_loop_step": records / (args.k2 - args.k1),
        "loop_instructions_per_step": {"plain": round(plain / (args.k2 - args.k1)),
                                       "traced": round(traced / (args.k2 - args.k1))},
        "instructions_per_cpu_second": round(ips),
        "us_per_record": round(per_record / ips * 1e6, 2),
        "runs": {f"{'traced' if t else 'plain'}-{k}": {"instructions": i, "records": r}
                 for (t, k), (i, r) in runs.items()},
        "jobs": {},
    }
    for path in args.trace:
        job = per_step_of_trace(Path(path))
        cost_s = job["records_per_rank_step"] * per_record / ips
        job.update(instructions_per_step=round(job["records_per_rank_step"] * per_record),
                   overhead_s_per_step=cost_s, overhead_share_of_step=cost_s / job["step_time_s"])
        result["jobs"][path] = job
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
