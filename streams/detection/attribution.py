"""From symptoms to a component: read the counters that explain a slow function kind.

Each rule is the field's signature of a cause (detection-notes.md, "From
pattern to component"): slow kernels with low clocks or clock-event reasons
are the GPU; slow memory-bound kernels with normal GEMMs and clocks are HBM;
slow copies with a downgraded PCIe link are PCIe; a slow data loader with
iowait is storage; slow host code on a saturated CPU is host contention; more
compute with normal counters is uneven work.

GPUs are compared like with like: a GPU's clock against its *own* ceiling
(``clock_ratio``), and against peers of the same class only (same max SM
clock, power limit and memory size, whichever are reported). A node type with
a lower clock ceiling or power limit is not a throttled GPU.

The power limit NVML reports (``nvmlDeviceGetEnforcedPowerLimit``) is a
setting, not a property of the model: ``nvidia-smi -pl``, a BMC power policy
or a PSU fault lowers it on one board. The class therefore takes the power
limit of the GPU's *model on its node* (:func:`with_model_power_limits`): one
board capped below its node-mates of the same max clock and memory is the
same model, compared with them, and throttled when its clock says so.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from .counters import CounterSummary

# Compute-bound kernel names: GEMMs and convolutions. Attention kernels (flash...) are
# partly memory-bound and stay out of this class, so "GEMMs normal" stays a clean test.
_COMPUTE_BOUND = re.compile(r"gemm|xmma|wgmma|cutlass|matmul|aten::(mm|bmm|addmm|linear)|conv|sgemm|hgemm", re.I)

# One observation, several readings. Which of these components a rank finding names
# depends on a counter near its threshold (host CPU 90% busy, iowait 10%, SM clocks),
# and such a counter crosses its threshold from one window to the next on a busy host
# (measured: a 4-rank job on 2 shared cores read 77-100% CPU, its slowed rank named
# host_cpu and python in alternate windows). The slow functions persist all the same,
# so persistence counts windows of the observation, not of its reading.
OBSERVATION = {"host_cpu": "host functions", "python": "host functions",
               "storage": "data loading", "dataloader": "data loading",
               "gpu": "kernels", "gpu_memory": "kernels", "workload": "kernels"}


def observation(component: str) -> str:
    """What a finding saw, whichever counter reading named its component."""
    return OBSERVATION.get(component, component)


CLOCK_RATIO_LOW = 0.92      # SM clock below 92% of max: throttled (boost steps are 15 MHz; idle dips are brief)
THROTTLE_SHARE = 0.3        # clock-event reasons in >= 30% of samples
# Two GPUs are of one class when each reported ceiling agrees within 2%: NVML
# reports a model's max clock, power limit and memory size exactly, while a
# few MHz / watts / MiB of reporting jitter (or ECC reservations) stay inside.
CLASS_TOLERANCE = 0.02
# The power-limit ceiling is the model's (``model_power_limit_w``, :func:`with_model_power_limits`),
# read from the board's own enforced limit only where no node says otherwise.
CLASS_KEYS = ("max_sm_clock_mhz", "model_power_limit_w", "mem_total_bytes")
IOWAIT_HIGH_PCT = 10.0
CPU_SATURATED_PCT = 90.0


def is_compute_bound(name: str) -> bool:
    return bool(_COMPUTE_BOUND.search(name))


def _finite(v: float | None) -> bool:
    """``np.isfinite`` on one number: ``math.isfinite`` reads the same for floats and ints, at a tenth of the cost."""
    return v is not None and math.isfinite(v)


def _ceiling(m: dict[str, float] | None) -> tuple[float, ...]:
    if not m:
        return tuple(float("nan") for _ in CLASS_KEYS)
    return tuple(float(m.get(k, m.get("power_limit_w", np.nan) if k == "model_power_limit_w" else np.nan))
                 for k in CLASS_KEYS)


def _values(m: dict[str, float], keys: tuple[str, ...]) -> tuple[float, ...]:
    return tuple(float(m.get(k, np.nan)) for k in keys)


def _agree(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Every value both sides report agrees within CLASS_TOLERANCE; unknown ones do not separate."""
    for x, y in zip(a, b):
        if math.isfinite(x) and math.isfinite(y) and abs(x - y) > CLASS_TOLERANCE * max(abs(x), abs(y)):
            return False
    return True


def _one_value_each(values: list[tuple[float, ...]]) -> bool:
    """Every position holds at most one finite value across ``values``: then any two of them :func:`_agree`."""
    for column in zip(*values):
        seen = {x for x in column if math.isfinite(x)}
        if len(seen) > 1:
            return False
    return True


_IMMUTABLE_KEYS = ("max_sm_clock_mhz", "mem_total_bytes")  # fixed by the SKU: no setting moves them


def with_model_power_limits(counters: CounterSummary, rank_node: dict[int, str]) -> CounterSummary:
    """The counters with ``model_power_limit_w`` per GPU: the highest enforced power limit among
    the GPUs of its node that share its max SM clock and memory size.

    Why the node: a server's GPUs are one SKU (an HGX/OAM baseboard, or one
    chassis build), so a node's GPUs of one max clock and memory size are one
    model, and a limit can only be *set* below that model's (``nvidia-smi -pl``
    takes values up to the board's max limit, which the default limit is on
    data-centre boards; a power-brake or PSU fault only lowers it). The highest
    limit among them is the model's; a board below it is capped, not another
    model. Ranks with no node, or alone on theirs, keep their own limit (a
    class of their own when it differs), as before.
    """
    if not counters.gpu:
        return counters
    by_node: dict[str, list[int]] = {}
    for r in counters.gpu:
        node = rank_node.get(r)
        if node:
            by_node.setdefault(node, []).append(r)
    # A node's model limit: where its GPUs agree on their immutable keys (one SKU, the
    # usual case), every mate counts and the pairwise test (k^2 per node) is not needed.
    # The max is then the same whichever mate asks, unless zeros of both signs tie.
    shared: dict[str, float] = {}
    for node, mates in by_node.items():
        if len(mates) < 2:
            continue
        limits = [float(counters.gpu[q].get("power_limit_w", np.nan)) for q in mates]
        finite = [x for x in limits if _finite(x)]
        if finite and max(finite) != 0.0 and _one_value_each([_values(counters.gpu[q], _IMMUTABLE_KEYS) for q in mates]):
            shared[node] = max(finite)
    gpu: dict[int, dict[str, float]] = {}
    for r, m in counters.gpu.items():
        own = float(m.get("power_limit_w", np.nan))
        model = own
        node = rank_node.get(r, "")
        mates = by_node.get(node, [])
        if _finite(own) and len(mates) > 1:
            if node in shared:
                model = shared[node]
            else:
                imm = _values(m, _IMMUTABLE_KEYS)
                limits = [own]
                for q in mates:
                    mq = counters.gpu[q]
                    lq = float(mq.get("power_limit_w", np.nan))
                    if q != r and _finite(lq) and _agree(imm, _values(mq, _IMMUTABLE_KEYS)):
                        limits.append(lq)
                model = max(limits)
        gpu[r] = {**m, "model_power_limit_w": model} if _finite(model) else m
    return CounterSummary(gpu=gpu, gpu_index=counters.gpu_index, nic=counters.nic, host=counters.host)


def power_capped(m: dict[str, float] | None) -> bool:
    """The board's enforced power limit is below its model's (beyond the class tolerance)."""
    if not m:
        return False
    own, model = m.get("power_limit_w", np.nan), m.get("model_power_limit_w", np.nan)
    return _finite(own) and _finite(model) and own < (1 - CLASS_TOLERANCE) * model


def same_class(a: dict[str, float] | None, b: dict[str, float] | None) -> bool:
    """Every ceiling both GPUs report agrees (within CLASS_TOLERANCE); unknown ones do not separate."""
    return _agree(_ceiling(a), _ceiling(b))


def class_peers(counters: CounterSummary, rank: int, peers: list[int]) -> list[int]:
    """The peers whose GPU is of the rank's class (all of them when the rank reports no ceiling)."""
    mine = counters.gpu.get(rank)
    return [p for p in peers if same_class(mine, counters.gpu.get(p))]


def gpu_classes(counters: CounterSummary, ranks: list[int]) -> dict[int, int]:
    """A class id per rank with GPU counters (ranks in one class share their ceilings).

    For the peer test: comparing kernel times across classes reads a slower GPU
    model as a slow GPU. Classes are taken greedily in rank order; a GPU that
    reports no ceiling joins the first class.
    """
    reps: list[tuple[float, ...]] = []
    out: dict[int, int] = {}
    # A ceiling met before joins the class it joined then: classes only get appended,
    # so the first class it agrees with is still that one (most jobs: one ceiling).
    known: dict[tuple[float, ...], int] = {}
    for r in sorted(ranks):
        m = counters.gpu.get(r)
        if m is None:
            continue
        c = _ceiling(m)
        i = known.get(c, -1)
        if i < 0:
            i = next((j for j, rep in enumerate(reps) if _agree(rep, c)), -1)
            if i < 0:
                reps.append(c)
                i = len(reps) - 1
            known[c] = i
        out[r] = i
    return out


def gpu_evidence(counters: CounterSummary, rank: int, peers: list[int]) -> dict[str, Any]:
    """The culprit's GPU counters against the median of its peers of the same GPU class."""
    mine = counters.gpu.get(rank)
    if not mine:
        return {}
    with_counters = [p for p in peers if p in counters.gpu]
    same = class_peers(counters, rank, with_counters)
    out_class = ({"same_class_peers": len(same), "other_class_peers": len(with_counters) - len(same)}
                 if len(same) < len(with_counters) else {})
    peers = same
    out: dict[str, Any] = {}
    for key in ("sm_clock_mhz", "throttle_share", "temp_c", "power_w", "power_limit_w", "clock_ratio", "mem_util_pct",
                "pcie_gen", "pcie_width", "pcie_tx_Bps", "pcie_rx_Bps", "nvlink_tx_Bps", "nvlink_rx_Bps"):
        vals = [counters.gpu[p].get(key, np.nan) for p in peers if p in counters.gpu]
        vals = [v for v in vals if _finite(v)]
        if _finite(mine.get(key)):
            out[key] = {"culprit": round(mine[key], 4), "peer_median": round(float(np.median(vals)), 4) if vals else None}
    for key in ("max_sm_clock_mhz", "max_pcie_gen", "max_pcie_width"):
        if _finite(mine.get(key)):
            out[key] = {"culprit": mine[key]}
    if out_class:
        out["gpu_class"] = out_class
    return out


def _peer_median(counters: CounterSummary, peers: list[int], key: str) -> float:
    vals = [counters.gpu[p].get(key, np.nan) for p in peers if p in counters.gpu]
    vals = [v for v in vals if _finite(v)]
    return float(np.median(vals)) if vals else float("nan")


def kernel_component(counters: CounterSummary, rank: int, memory_share: float,
                     gemm_ratio: float | None, peers: list[int] | None = None) -> tuple[str, str]:
    """gpu / gpu_memory / workload for slow kernels on one rank, with the reason.

    ``gemm_ratio`` is None when no kernel is recognisably a GEMM: then "GEMMs
    normal" cannot be claimed and HBM is never blamed.

    Throttling is judged against the GPU's own ceiling (clock_ratio). Without
    a reported max clock, the clock is compared with ``peers`` of the same class,
    and only when a ceiling (power limit, memory size) says what the class is.
    Clock-event reasons count only when the GPU's class peers do not show them
    alike: GPUs with a lower power limit all sit at their cap (SW power cap set)
    and that is their operating point, not a fault.
    """
    g = counters.gpu.get(rank)
    same = class_peers(counters, rank, peers or [])
    throttled = False
    reason = ""
    if g:
        ratio = g.get("clock_ratio", np.nan)
        share = g.get("throttle_share", np.nan)
        if _finite(ratio) and ratio < CLOCK_RATIO_LOW:
            throttled = True
            reason = f"SM clock {g['sm_clock_mhz']:.0f} of {g['max_sm_clock_mhz']:.0f} MHz"
        elif not _finite(ratio) and same and any(_finite(v) for v in _ceiling(g)):
            base = _peer_median(counters, same, "sm_clock_mhz")
            clock = g.get("sm_clock_mhz", np.nan)
            if _finite(clock) and _finite(base) and clock < CLOCK_RATIO_LOW * base:
                throttled = True
                reason = f"SM clock {clock:.0f} MHz vs {base:.0f} on GPUs of its class"
        peer_share = _peer_median(counters, same, "throttle_share") if same else float("nan")
        if _finite(share) and share >= THROTTLE_SHARE and not (_finite(peer_share) and peer_share >= THROTTLE_SHARE):
            throttled = True
            reason = (reason + "; " if reason else "") + f"clock-event reasons in {share:.0%} of samples"
        if throttled and power_capped(g):
            # The cap is the why of the low clock: a board held below its model's limit.
            reason += (f"; power limit {g['power_limit_w']:.0f} W vs {g['model_power_limit_w']:.0f} W"
                       f" on its node's GPUs of the same model")
    if throttled:
        return "gpu", reason
    if gemm_ratio is not None and memory_share >= 0.7 and gemm_ratio < 1.05:
        return "gpu_memory", "memory-bound kernels slow while GEMMs and clocks are normal"
    if g and peers:
        others = [p for p in peers if p in counters.gpu and p not in set(same)]
        lower = _lower_ceiling(counters, rank, others)
        if lower:
            # A slower GPU model among faster peers: hardware, but no fault of this GPU.
            return "gpu", f"a GPU class with a lower ceiling than {len(others)} of its peers ({lower}); not throttled"
    if g:
        return "workload", "more compute with normal clocks and counters"
    return "gpu", "kernels slower than peers (no GPU counters to say why)"


def _lower_ceiling(counters: CounterSummary, rank: int, others: list[int]) -> str:
    """'max SM clock 1755 vs 1980' when the rank's class ceilings are below those of ``others``."""
    mine = counters.gpu.get(rank) or {}
    parts = []
    for key, label in (("max_sm_clock_mhz", "max SM clock"), ("power_limit_w", "power limit")):
        base = _peer_median(counters, others, key)
        if _finite(mine.get(key)) and _finite(base) and mine[key] < (1 - CLASS_TOLERANCE) * base:
            parts.append(f"{label} {mine[key]:.0f} vs {base:.0f}")
    return ", ".join(parts)


def pcie_reason(counters: CounterSummary, rank: int) -> str:
    g = counters.gpu.get(rank) or {}
    gen, mgen, w, mw = (g.get(k, np.nan) for k in ("pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width"))
    parts = []
    if _finite(gen) and _finite(mgen) and gen < mgen:
        parts.append(f"PCIe gen {gen:.0f} of {mgen:.0f}")
    if _finite(w) and _finite(mw) and w < mw:
        parts.append(f"width x{w:.0f} of x{mw:.0f}")
    return ", ".join(parts) or "host-device copies slower than peers"


def loader_component(counters: CounterSummary, node: str, bursty: bool = False) -> tuple[str, str]:
    """storage when the node waits on I/O more than the others, else the data loader itself.

    ``bursty``: the loader's stalls fall in a few steps, long, not in most steps
    (its median step pays under half their mean cost). Without the node's host
    counters that shape is the only hint left. A loader whose batches cost CPU
    (decode, augment) produces them at a steady rate: short of the step, it stalls
    about the same in every step. Storage reads are heavy-tailed (page-cache hits
    and prefetched buffers, then a read that queues on a degraded mount or server
    for seconds), so the prefetch queue runs dry now and then and a step stalls
    long. With the counters, iowait decides and the shape is not consulted.
    """
    h = counters.host
    mine = h.get(node, {}).get("iowait_pct", np.nan)
    others = [v.get("iowait_pct", np.nan) for n, v in h.items() if n != node]
    others = [v for v in others if _finite(v)]
    base = float(np.median(others)) if others else 0.0
    if _finite(mine) and mine >= IOWAIT_HIGH_PCT and mine >= base + 5.0:
        return "storage", f"iowait {mine:.0f}% vs {base:.0f}% on other nodes"
    if not _finite(mine) and bursty:
        return "storage", ("slow storage suspected: DataLoader.__next__ stalls long in a few steps, as reads "
                           "on slow storage do (no host counters from this node to confirm it by iowait)")
    if not _finite(mine):  # no host counters: a loader that waits on reads looks the same from the ranks
        return "dataloader", "DataLoader.__next__ slow; no host counters from this node, so slow storage is not ruled out"
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
