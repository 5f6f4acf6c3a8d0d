"""Batch ``analyze``'s parts in one warm process: the JSON floor, the reader, windows + digests, the detector.

Why: ``eroica bench throughput`` measures each stage cold (freed memory handed
back to the OS before it, so a stage pays the first touch of its peak), which
is what a one-shot ``eroica analyze`` pays; this measures the same functions
warm (kernels loaded, memory mapped, the collector as the workers set it), as
a long-running process pays them, and splits ``analyze`` into its parts so a
change to one shows where it lands. Each figure is the least CPU time of
``--runs`` runs (``time.process_time``); the ratio is to the floor's.

Usage: ``python tools/analyze_stages.py FILE.jsonl [--runs 3] [--window-s 30]``
(a bench job: ``eroica simulate --nodes 128 --gpus 8 --steps 40
--fault gpu_throttle:rank=13 --start default -o job.jsonl``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, Callable


def least_cpu(fn: Callable[[], Any], runs: int) -> float:
    """The least CPU seconds ``fn`` took over ``runs`` calls (the others are the machine's noise)."""
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def parts(path: Path, window_s: float, runs: int) -> dict[str, float]:
    from eroica.bench.throughput import json_floor, warm_kernels
    from eroica.models.reader import read_batches
    from eroica.runtime.system import columnar_gc_during
    from eroica.streams.detection import WindowAssembler, analyze_windows, detect_step, digest_window, flush_job

    w = int(window_s * 1e9)
    warm_kernels()
    with columnar_gc_during():
        batches = list(read_batches(path))

        def windows() -> list:
            asm = WindowAssembler(w, w)
            out = []
            for b in batches:
                for job in b.jobs:
                    asm.add_meta(job)
                for cols in b.columns.values():
                    asm.add(cols)
                out += asm.complete()
            return out + asm.flush()

        cut = windows()
        digests = [(digest_window(x), x.meta) for x in cut]

        def detect() -> int:
            histories: dict[str, Any] = {}
            metas: dict[str, Any] = {}
            n = 0
            for d, meta in digests:
                vs, histories[d.job] = detect_step(d, meta, histories.get(d.job), 0)
                metas[d.job] = meta
                n += len(vs)
            for job, h in histories.items():
                if h.pending:  # as analyze_windows ends a job
                    n += len(flush_job(metas[job], h, 0)[0])
            return n

        out = {
            "floor (msgspec structs)": least_cpu(lambda: json_floor(path), runs),
            "reader": least_cpu(lambda: list(read_batches(path)), runs),
            "windowing": least_cpu(windows, runs),
            "digest_window": least_cpu(lambda: [digest_window(x) for x in cut], runs),
            "detect_step": least_cpu(detect, runs),
            "analyze_windows": least_cpu(
                lambda: sum(len(v) for _d, v in analyze_windows(read_batches(path), w)), runs),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=30.0)
    a = ap.parse_args()
    res = parts(a.file, a.window_s, a.runs)
    floor = res["floor (msgspec structs)"]
    for name, cpu in res.items():
        print(f"{name:24s} {cpu:7.3f} CPU-s  {cpu / floor:5.2f}x floor")


if __name__ == "__main__":
    main()
