"""Where the tracer's cost goes on a real GPU step: the gpu_proof job plain and traced, part by part.

    python tools/gpu_overhead.py --out DIR [--seconds 15]

Runs :data:`gpu_proof.JOB` (one GPU, NCCL, DDP) plain, then under ``eroica trace --out`` with parts
of the tracer switched off inside the job (CUDA-event timing; DDP's timed communication hook; the
node agent), each for the same wall time, and reports steps per second and the job's own host time
per phase (forward, backward, optimizer: ``time.perf_counter`` around each, so they include any
wait the tracer adds on the training thread). The job reads ``PROOF_OFF`` (comma list: ``cuda``,
``ddp``) and turns those parts off through the tracer's module state before CUDA starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

_spec = importlib.util.spec_from_file_location("gpu_proof", Path(__file__).with_name("gpu_proof.py"))
assert _spec is not None and _spec.loader is not None
gpu_proof = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_proof)

PRELUDE = '''
import os, sys, time
_off = set(filter(None, os.environ.get("PROOF_OFF", "").split(",")))


def _switch_off():
    th = sys.modules.get("eroica.producers.tracer.torch_hooks")
    print("eroica tracer hooks loaded:", th is not None, "off:", sorted(_off), file=sys.stderr)
    if th is not None and "cuda" in _off:
        th._state["no_cuda"] = True
    if "pool" in _off:
        import eroica.producers.tracer.cuda_timing as ct
        ct.POOL_MAX = 0


_phase = {"forward": 0.0, "backward": 0.0, "opt": 0.0}
_samples = {}


def _sampler(main_ident, period_s=0.001):
    """Sample the training thread's stack: its innermost tracer frame, else its innermost frame."""
    while True:
        time.sleep(period_s)
        frame = sys._current_frames().get(main_ident)
        where = None
        inner = frame
        while frame is not None:
            path = frame.f_code.co_filename
            if "/eroica/" in path or "eroica/producers" in path:
                where = "eroica " + os.path.basename(path) + ":" + frame.f_code.co_name
                break
            frame = frame.f_back
        if where is None and inner is not None:
            where = os.path.basename(inner.f_code.co_filename) + ":" + inner.f_code.co_name
        _samples[where] = _samples.get(where, 0) + 1


if os.environ.get("PROOF_SAMPLE"):
    import threading
    threading.Thread(target=_sampler, args=(threading.get_ident(),), daemon=True).start()
'''

VARIANTS = (("plain", False, ""), ("traced", True, ""), ("traced, no agent", True, "agent"),
            ("traced, no event pool", True, "pool"), ("traced, no CUDA events", True, "cuda"),
            ("traced, no DDP hook", True, "ddp"), ("plain", False, ""), ("traced", True, ""),
            ("traced, sampled", True, "sample"), ("plain, sampled", False, "sample"))


def micro() -> dict:
    """In-process costs on this GPU: a CUDA event pair created vs reused; each NVML call the agent makes."""
    import torch

    out: dict = {}
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(3):
        a @ a  # keep the GPU busy: events queue behind real work, as in training
    n = 4000
    t0 = time.perf_counter()
    pairs = []
    for _ in range(n):
        e1 = torch.cuda.Event(enable_timing=True)
        e1.record()
        e2 = torch.cuda.Event(enable_timing=True)
        e2.record()
        pairs.append((e1, e2))
    out["event_pair_new_us"] = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    for _ in range(3):
        a @ a
    t0 = time.perf_counter()
    for e1, e2 in pairs:
        e1.record()
        e2.record()
    out["event_pair_reused_us"] = (time.perf_counter() - t0) / n * 1e6
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for e1, e2 in pairs:
        e2.query()
        e1.elapsed_time(e2)
    out["event_pair_resolve_us"] = (time.perf_counter() - t0) / n * 1e6
    t0 = time.perf_counter()
    del pairs
    out["event_pair_destroy_us"] = (time.perf_counter() - t0) / n * 1e6

    import pynvml
    from eroica.producers.counters.gpu import GpuSampler

    calls: dict = {}

    class Timed:
        def __getattr__(self, name):
            fn = getattr(pynvml, name)
            if not callable(fn) or not name.startswith("nvml"):
                return fn

            def timed(*args, **kwargs):
                t = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    c = calls.setdefault(name, [0, 0.0])
                    c[0] += 1
                    c[1] += time.perf_counter() - t
            return timed

    sampler = GpuSampler(Timed())
    sampler.sample(1)
    calls.clear()
    t0 = time.perf_counter()
    for i in range(10):
        sampler.sample(2 + i)
    out["nvml_sample_ms"] = (time.perf_counter() - t0) / 10 * 1e3
    out["nvml_calls_ms_each"] = {k: round(v[1] / v[0] * 1e3, 3) for k, v in sorted(calls.items(), key=lambda kv: -kv[1][1])}
    return out


def job_source() -> str:
    """The proof job with phase timers and the part switches."""
    src = gpu_proof.JOB
    src = src.replace("opt = torch.optim.SGD(", (
        "_switch_off()\nif 'ddp' in _off:\n    model.__dict__['_eroica_comm'] = 'off'\n"
        "opt = torch.optim.SGD("), 1)
    src = src.replace(
        "        loss = model(x.to(dev, non_blocking=True)).square().mean()\n"
        "        loss.backward()\n"
        "        opt.step()\n",
        "        t0 = time.perf_counter()\n"
        "        loss = model(x.to(dev, non_blocking=True)).square().mean()\n"
        "        t1 = time.perf_counter()\n"
        "        loss.backward()\n"
        "        t2 = time.perf_counter()\n"
        "        opt.step()\n"
        "        t3 = time.perf_counter()\n"
        "        _phase['forward'] += t1 - t0; _phase['backward'] += t2 - t1; _phase['opt'] += t3 - t2\n", 1)
    src = src.replace("'{\"steps\": %d, \"seconds\": %.3f}' % (steps, time.time() - start)",
                      "__import__('json').dumps({'steps': steps, 'seconds': time.time() - start, "
                      "'cpu_s': time.process_time(), "
                      "'samples': dict(sorted(_samples.items(), key=lambda kv: -kv[1])[:25]), "
                      "**{k: v / max(steps, 1) * 1e3 for k, v in _phase.items()}})")
    if "_phase['forward'] +=" not in src or "cpu_s" not in src or "'ddp' in _off" not in src:
        raise RuntimeError("gpu_proof.JOB changed: update gpu_overhead.job_source")
    return PRELUDE + src


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--micro", action="store_true", help="also time CUDA events and NVML calls in-process")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.micro:
        try:
            got = micro()
        except Exception as exc:  # the variants still run
            got = {"failed": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(got), flush=True)
        (args.out / "gpu_micro.json").write_text(json.dumps(got, indent=2))
    job = args.out / "overhead_job.py"
    job.write_text(job_source())
    results = []
    for name, traced, off in VARIANTS:
        stats = args.out / f"stats-{len(results)}.json"
        env = {**os.environ, "PROOF_SECONDS": str(args.seconds), "PROOF_STATS": str(stats), "PROOF_OFF": off}
        if "sample" in off:
            env["PROOF_SAMPLE"] = "1"
        torchrun = ["torchrun", "--nproc-per-node", "1", str(job)]
        cmd = torchrun if not traced else [
            sys.executable, "-m", "eroica.cli", "trace", "--job", "gpu-overhead",
            "--out", str(args.out / f"run-{len(results)}.jsonl"), "--interval", "0.5",
            *(["--no-agent"] if "agent" in off else []), "--", *torchrun]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            print(name, proc.stderr[-3000:], file=sys.stderr)
            results.append({"variant": name, "failed": proc.returncode})
            continue
        got = json.loads(stats.read_text())
        got["variant"] = name
        got["steps_per_s"] = got["steps"] / got["seconds"]
        results.append(got)
        print(json.dumps(got), flush=True)
    (args.out / "gpu_overhead.json").write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
