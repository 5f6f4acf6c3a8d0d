"""Prove the tracer's CUDA-event timings and the agent's NVML fields on a real GPU (issue 12, item 6).

Run on a machine with one NVIDIA GPU, torch with CUDA, and Eroica installed:

    python tools/gpu_proof.py --out DIR [--seconds 60]

It writes a small single-GPU training job (NCCL backend, world size 1, so the
all-reduce runs as an NCCL kernel), runs it under ``eroica trace --out`` (the
tracer in the rank, the node agent beside it), then checks the records:

* CUDA-event regions (``<name>[gpu]``, kind ``kernel``): present, positive,
  and no longer than two typical host steps;
* every NVML field the contract names, on the GPU's ``gpu`` records, within a
  physical range (clocks 100-3000 MHz and not above their maximum, power
  10-1500 W, temperature 10-110 degC, PCIe generation 1-6 and width 1-32,
  ECC and XID counts >= 0, memory used <= total); NVLink only where the
  board has links (``nvidia-smi nvlink -s`` says none on PCIe cards).

The checks are :func:`check`, a pure function over the records, so the test
suite can run them on hand-built records (``tests/test_gpu_proof.py``) without a
GPU. The summary (``gpu_proof.json``) is what a closing note quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

JOB = textwrap.dedent('''
    import os, time, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("nccl")
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(dev)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(2048, 4096)), batch_size=256)
    end = time.time() + float(os.environ.get("PROOF_SECONDS", "60"))
    while time.time() < end:
        for (x,) in data:
            loss = model(x.to(dev, non_blocking=True)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dist.destroy_process_group()
''')

# (field, low, high): the physical range a healthy data-centre GPU reports
RANGES: tuple[tuple[str, float, float], ...] = (
    ("sm_clock_mhz", 100, 3000), ("max_sm_clock_mhz", 500, 3000), ("power_w", 10, 1500),
    ("power_limit_w", 50, 1500), ("temp_c", 10, 110), ("pcie_gen", 1, 6), ("max_pcie_gen", 1, 6),
    ("pcie_width", 1, 32), ("max_pcie_width", 1, 32), ("pcie_tx_Bps", 0, 1.3e11), ("pcie_rx_Bps", 0, 1.3e11),
    ("throttle_reasons", 0, 2**63), ("ecc_uncorrected", 0, 1e9), ("xid", 0, 1e4), ("sm_util_pct", 0, 100),
    ("mem_util_pct", 0, 100), ("mem_used_bytes", 0, 1e12), ("mem_total_bytes", 1e9, 1e12),
)
NVLINK = (("nvlink_tx_Bps", 0, 2e12), ("nvlink_rx_Bps", 0, 2e12))


def check(records: list[dict[str, Any]], nvlink_expected: bool) -> dict[str, Any]:
    """What the records prove: per field seen / in range, CUDA-event regions; ``ok`` only if all hold."""
    gpu = [r for r in records if r.get("type") == "gpu"]
    fns = [r for r in records if r.get("type") == "fn"]
    cuda = [r for r in fns if str(r.get("fn", "")).endswith("[gpu]")]
    fields: dict[str, Any] = {}
    problems: list[str] = []
    for name, lo, hi in RANGES + (NVLINK if nvlink_expected else ()):
        values = [float(r[name]) for r in gpu if r.get(name) is not None]
        bad = [v for v in values if not lo <= v <= hi]
        fields[name] = {"samples": len(values), "min": min(values, default=None), "max": max(values, default=None),
                        "out_of_range": len(bad)}
        if not values:
            problems.append(f"{name}: never reported")
        elif bad:
            problems.append(f"{name}: {len(bad)} of {len(values)} samples outside [{lo}, {hi}]")
    over_max = sum(1 for r in gpu if r.get("sm_clock_mhz") and r.get("max_sm_clock_mhz")
                   and r["sm_clock_mhz"] > r["max_sm_clock_mhz"])
    if over_max:
        problems.append(f"sm_clock_mhz above max_sm_clock_mhz in {over_max} samples")
    # A GPU region runs behind the host that queued it, so it may end after its host step; it may not
    # last longer than two typical host steps (a step's GPU work cannot take twice the step).
    spans: dict[tuple[int, int], list[int]] = {}
    for r in fns:
        if str(r.get("fn", "")).endswith("[gpu]"):
            continue
        span = spans.setdefault((r["rank"], r["step"]), [r["ts_ns"], r["ts_ns"] + r["dur_ns"]])
        span[0], span[1] = min(span[0], r["ts_ns"]), max(span[1], r["ts_ns"] + r["dur_ns"])
    lengths = sorted(b - a for a, b in spans.values())
    typical = lengths[len(lengths) // 2] if lengths else 0
    implausible = [r for r in cuda if r["dur_ns"] <= 0 or r["dur_ns"] > 2 * typical]
    if not cuda:
        problems.append("no CUDA-event region ([gpu] records)")
    elif implausible:
        problems.append(f"{len(implausible)} CUDA-event regions non-positive or longer than two host steps")
    regions = sorted({r["fn"] for r in cuda})
    return {"ok": not problems, "problems": problems, "gpu_samples": len(gpu), "fn_records": len(fns),
            "cuda_event_records": len(cuda), "cuda_event_regions": regions, "fields": fields,
            "nvlink_expected": nvlink_expected}


def _has_nvlink() -> bool:
    try:
        out = subprocess.run(["nvidia-smi", "nvlink", "-s"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "GB/s" in out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=60.0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    job = args.out / "proof_job.py"
    job.write_text(JOB)
    run = args.out / "run.jsonl"
    env = {**os.environ, "PROOF_SECONDS": str(args.seconds)}
    proc = subprocess.run([sys.executable, "-m", "eroica.cli", "trace", "--job", "gpu-proof", "--out", str(run),
                           "--interval", "0.5", "--", "torchrun", "--nproc-per-node", "1", str(job)],
                          env=env, capture_output=True, text=True)
    (args.out / "trace.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        print(proc.stderr[-4000:], file=sys.stderr)
        return 1
    records = [json.loads(line) for line in run.read_text().splitlines() if line.strip()]
    summary = check(records, _has_nvlink())
    (args.out / "gpu_proof.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
