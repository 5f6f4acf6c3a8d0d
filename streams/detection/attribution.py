"""From symptoms to a component: read the counters that explain a slow function kind.

Each rule is the field's signature of a cause (detection-notes.md, "From
pattern to component"): slow kernels with low clocks or clock-event reasons
are the GPU; slow memory-bound kernels with normal GEMMs and clocks are HBM;
slow copies with a downgraded PCIe link are PCIe; a slow data loader with
iowait is storage; slow host code on a saturated CPU is host contention; more
compute with normal counters is uneven work.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from .counters import CounterSummary

# Compute-bound kernel names: GEMMs and convolutions. Attention kernels (flash...) are
# partly memory-bound and stay out of this class, so "GEMMs normal" stays a clean test.
_COMPUTE_BOUND = re.compile(r"gemm|xmma|wgmma|cutlass|matmul|aten::(mm|bmm|addmm|linear)|conv|sgemm|hgemm", re.I)

CLOCK_RATIO_LOW = 0.92      # SM clock below 92% of max: throttled
THROTTLE_SHARE = 0.3        # clock-event reasons in >= 30% of samples
IOWAIT_HIGH_PCT = 10.0
CPU_SATURATED_PCT = 90.0


def is_compute_bound(name: str) -> bool:
    return bool(_COMPUTE_BOUND.search(name))


def _finite(v: float | None) -> bool:
    return v is not None and np.isfinite(v)


def gpu_evidence(counters: CounterSummary, rank: int, peers: list[int]) -> dict[str, Any]:
    """The culprit's GPU counters against its peers' median."""
    mine = counters.gpu.get(rank)
    if not mine:
        return {}
    out: dict[str, Any] = {}
    for key in ("sm_clock_mhz", "throttle_share", "temp_c", "power_w", "clock_ratio", "mem_util_pct",
                "pcie_gen", "pcie_width", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps", "nvlink_rx_Bps"):
        vals = [counters.gpu[p].get(key, np.nan) for p in peers if p in counters.gpu]
        vals = [v for v in vals if _finite(v)]
        if _finite(mine.get(key)):
            out[key] = {"culprit": round(mine[key], 4), "peer_median": round(float(np.median(vals)), 4) if vals else None}
    for key in ("max_sm_clock_mhz", "max_pcie_gen", "max_pcie_width", "power_limit_w"):
        if _finite(mine.get(key)):
            out[key] = {"culprit": mine[key]}
    return out


def kernel_component(counters: CounterSummary, rank: int, memory_share: float,
                     gemm_ratio: float | None) -> tuple[str, str]:
    """gpu / gpu_memory / workload for slow kernels on one rank, with the reason.

    ``gemm_ratio`` is None when no kernel is recognisably a GEMM: then "GEMMs
    normal" cannot be claimed and HBM is never blamed.
    """
    g = counters.gpu.get(rank)
    throttled = False
    reason = ""
    if g:
        ratio = g.get("clock_ratio", np.nan)
        share = g.get("throttle_share", np.nan)
        if _finite(ratio) and ratio < CLOCK_RATIO_LOW:
            throttled = True
            reason = f"SM clock {g['sm_clock_mhz']:.0f} of {g['max_sm_clock_mhz']:.0f} MHz"
        if _finite(share) and share >= THROTTLE_SHARE:
            throttled = True
            reason = (reason + "; " if reason else "") + f"clock-event reasons in {share:.0%} of samples"
    if throttled:
        return "gpu", reason
    if gemm_ratio is not None and memory_share >= 0.7 and gemm_ratio < 1.05:
        return "gpu_memory", "memory-bound kernels slow while GEMMs and clocks are normal"
    if g:
        return "workload", "more compute with normal clocks and counters"
    return "gpu", "kernels slower than peers (no GPU counters to say why)"


def pcie_reason(counters: CounterSummary, rank: int) -> str:
    g = counters.gpu.get(rank) or {}
    gen, mgen, w, mw = (g.get(k, np.nan) for k in ("pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width"))
    parts = []
    if _finite(gen) and _finite(mgen) and gen < mgen:
        parts.append(f"PCIe gen {gen:.0f} of {mgen:.0f}")
    if _finite(w) and _finite(mw) and w < mw:
        parts.append(f"width x{w:.0f} of x{mw:.0f}")
    return ", ".join(parts) or "host-device copies slower than peers"


def loader_component(counters: CounterSummary, node: str) -> tuple[str, str]:
    """storage when the node waits on I/O more than the others, else the data loader itself."""
    h = counters.host
    mine = h.get(node, {}).get("iowait_pct", np.nan)
    others = [v.get("iowait_pct", np.nan) for n, v in h.items() if n != node]
    others = [v for v in others if _finite(v)]
    base = float(np.median(others)) if others else 0.0
    if _finite(mine) and mine >= IOWAIT_HIGH_PCT and mine >= base + 5.0:
        return "storage", f"iowait {mine:.0f}% vs {base:.0f}% on other nodes"
    return "dataloader", "DataLoader.__next__ slow with no I/O wait"


def host_component(counters: CounterSummary, node: str) -> tuple[str, str]:
    h = counters.host
    mine = h.get(node, {}).get("cpu_util_pct", np.nan)
    others = [v.get("cpu_util_pct", np.nan) for n, v in h.items() if n != node]
    others = [v for v in others if _finite(v)]
    base = float(np.median(others)) if others else np.nan
    if _finite(mine) and mine >= CPU_SATURATED_PCT and (not _finite(base) or mine >= base + 10.0):
        others_txt = f" vs {base:.0f}% on other nodes" if _finite(base) else ""
        return "host_cpu", f"host CPU {mine:.0f}% busy{others_txt}"
    return "python", "host-side Python code slower than on peers"
