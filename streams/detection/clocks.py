"""The expected-behaviour test of a GPU's clock, for ranks no peer test compares.

A throttled GPU runs every kernel slower, and the peer test finds it by its
kernels against its role's other ranks. A job whose roles hold fewer ranks
than that test needs (:data:`.peers.MIN_PEERS`: a 2- or 3-GPU job, a small
pipeline stage, a GPU model too rare inside its role) has no such peers, and
its throttled GPU went unnamed. Its counters still say it against the
hardware's own specification, which needs no peer: the SM clock against the
GPU's own maximum (``clock_ratio``) and NVML's clock-event reasons
(``throttle_share``), the thresholds :mod:`.attribution` names a throttled GPU
by when the peer test has found it (without reasons reported, the clock of a
busy GPU alone, with less confidence).

One clock below its ceiling is not yet a fault: a GPU drawing its model's full
power limit runs below its maximum clock by design (SW power cap, the
operating point of heavy kernels on every board of the model). A throttled
clock is a fault here when something says the power cap is not why
(:func:`_not_the_cap`): the board draws well below its limit (then thermal or
hardware slowdown holds the clock), its limit is set below its model's
(:func:`.attribution.power_capped`), or GPUs of its model in its role run at
their ceiling without clock-event reasons.
"""

from __future__ import annotations

import math

import numpy as np

from . import attribution as attr
from .attribution import CLOCK_RATIO_LOW, THROTTLE_SHARE
from .counters import CounterSummary
from .findings import Finding
from .layout import Layout
from .notes import kernel_groups, unpeered
from .patterns import K_KERNEL, Patterns
from .peers import MIN_PEERS

# A board held at its power cap reads within a few percent of its limit (NVML's controller keeps the
# average power at the limit; the simulator's capped board reads 97-98% of it). Well below the limit, the
# cap is not what holds the clock down: thermal or hardware slowdown is (the simulator's thermally
# throttled board: 59%; healthy boards at full clock: 77%, but they are not throttled).
POWER_BELOW_CAP = 0.9
# The clock's expected cost (the rank's kernel time per step x (1 - clock ratio): what its kernels would
# save at full clock) must reach 1.5% of the step, the bar a rank finding of the peer test must reach
# (detector.RANK_MATERIAL): a throttled GPU that hardly computes costs the job nothing.
MATERIAL = 0.015
FULL_MATERIAL = 0.05      # ... full weight in the confidence at 5% of the step (findings.confidence_of's)
FULL_EFFECT = 0.3         # ... and at 30% slower (1 / clock ratio), as confidence_of's ratio
# Counters are direct readings, but the kernels' slowdown is inferred from the clock, not measured
# (memory-bound kernels slow less than the clock): never fully sure, as expected.py's counter findings.
MAX_CONFIDENCE = 0.95
# A level (``Finding.steady``: paid in the window's steps alike, not in a few of them): throttled in at
# least 90% of the window's samples, so at most a tenth of the window ran at full clock. A throttle that
# began inside the window is not steady, and waits for the next window to confirm it.
STEADY_SHARE = 0.9
# A slow clock slows every kernel of the GPU alike, so the finding names them together, as one function:
# naming the costliest kernel made a different incident whenever two kernels traded places (a MoE job's
# grouped GEMMs on realistic seed 2 did every window or two, and each swap restarted the streak that
# confirms the finding). The costliest kernels are in the evidence.
KERNELS_FN = "GPU kernels"
# Where a GPU reports no clock-event reasons (an older driver or agent), the clock alone must say it, and a
# GPU's clock drops by design when it idles (NVML's "GPU idle" reason, outside the throttle mask). Busy in
# most samples (SM utilisation >= 50%), the window's median clock is a clock under load. How much of the
# window it held is then unknown beyond the median's "at least half": neither steady nor fully sure.
BUSY_UTIL_PCT = 50.0
UNREPORTED_HELD = 0.5


def clock_findings(p: Patterns, layout: Layout, counters: CounterSummary, step_ns: float) -> list[Finding]:
    """Ranks the peer test cannot compare whose GPU is throttled below its ceiling (a ``gpu`` finding each).

    ``counters`` with the model power limits (:func:`.attribution.with_model_power_limits`),
    as the detector's. Ranks the peer test compares are left to it: it measures
    the kernels' slowdown against peers instead of inferring it from the clock.
    """
    kernels = np.flatnonzero(p.fn_kinds == K_KERNEL)
    if kernels.size == 0 or not (step_ns > 0) or not counters.gpu:
        return []
    groups = layout.peer_groups(p.ranks)
    lonely = unpeered(groups, p.ranks, counters)
    if not lonely.any():
        return []
    group_of: dict[int, np.ndarray] = {int(s): m for m in kernel_groups(groups, p.ranks, counters) for s in m}
    out: list[Finding] = []
    for slot in np.flatnonzero(lonely):
        rank = int(p.ranks[slot])
        g = counters.gpu.get(rank)
        if not g:
            continue
        ratio, share = float(g.get("clock_ratio", np.nan)), float(g.get("throttle_share", np.nan))
        if not (math.isfinite(ratio) and 0 < ratio < CLOCK_RATIO_LOW):
            continue
        if math.isfinite(share):
            if share < THROTTLE_SHARE:
                continue  # a low clock NVML gives no slowdown reason for: idle, or application clocks
            held = share
        elif float(g.get("sm_util_pct", np.nan)) >= BUSY_UTIL_PCT:
            held = UNREPORTED_HELD
        else:
            continue
        mates = [int(p.ranks[m]) for m in group_of.get(int(slot), np.zeros(0, dtype=np.intp)) if m != slot]
        why = _not_the_cap(g, counters, mates)
        if why is None:
            continue
        per_step = p.per_step_ns[slot, kernels]
        kernel_ns = float(np.nansum(per_step))
        excess = kernel_ns * (1.0 - ratio)
        if excess < MATERIAL * step_ns:
            continue
        costliest = kernels[np.argsort(-np.nan_to_num(per_step, nan=-1.0), kind="stable")[:3]]
        _, reason = attr.kernel_component(counters, rank, 0.0, None, peers=mates)
        effect = min(1.0, (1.0 / ratio - 1.0) / FULL_EFFECT)
        cost = min(1.0, excess / step_ns / FULL_MATERIAL)
        node = layout.rank_node.get(rank, "")
        n = len(mates)
        evidence = {
            **attr.gpu_evidence(counters, rank, mates),
            "expected_clock": {"clock_ratio": round(ratio, 4), "expected_min": CLOCK_RATIO_LOW,
                               "throttle_share": round(share, 4) if math.isfinite(share) else None,
                               "expected_max": THROTTLE_SHARE},
            "kernel_ns_per_step": {"culprit": round(kernel_ns), "at_full_clock": round(kernel_ns - excess)},
            "costliest_kernels_ns_per_step": {p.fn_names[f]: round(float(p.per_step_ns[slot, f]))
                                              for f in costliest if np.isfinite(p.per_step_ns[slot, f])},
            "excess_share_of_step": {"culprit": round(excess / step_ns, 4)},
            "peer_test": {"ranks_like_it": n + 1, "needed": MIN_PEERS},
        }
        out.append(Finding(
            kind="slow", component="gpu", scope="rank", node=node, rank=rank,
            gpu=counters.gpu_index.get(rank, -1), fn=KERNELS_FN, slowdown=round(1.0 / ratio, 4),
            score=round((1.0 - ratio) / (1.0 - CLOCK_RATIO_LOW), 3),
            confidence=round(min(MAX_CONFIDENCE, 0.2 + 0.79 * min(effect, held, cost)), 3),
            peers=[], culprits=[rank], evidence=evidence,
            summary=(f"{reason}; {why}; its kernels ({kernel_ns / 1e6:.{0 if kernel_ns >= 9.5e6 else 1}f} ms per "
                     f"step) run up to {1.0 / ratio:.2f}x slower than at full clock; {_alone(n)}"),
            steady=held >= STEADY_SHARE,
        ))
    return out


def _not_the_cap(g: dict[str, float], counters: CounterSummary, mates: list[int]) -> str | None:
    """Why a throttled clock is not the power cap's operating point, in words; None when it may be."""
    if attr.power_capped(g):  # kernel_component's reason gives both limits
        return "a limit below its model's is the board's fault, not its operating point"
    power, limit = float(g.get("power_w", np.nan)), float(g.get("power_limit_w", np.nan))
    if math.isfinite(power) and math.isfinite(limit) and limit > 0 and power < POWER_BELOW_CAP * limit:
        temp = float(g.get("temp_c", np.nan))
        hot = f", at {temp:.0f} C" if math.isfinite(temp) else ""
        return f"drawing {power:.0f} of its {limit:.0f} W{hot}: not the power cap (thermal or hardware slowdown)"
    at_ceiling = [m for m in mates if m in counters.gpu
                  and float(counters.gpu[m].get("clock_ratio", np.nan)) >= CLOCK_RATIO_LOW
                  and not float(counters.gpu[m].get("throttle_share", np.nan)) >= THROTTLE_SHARE]
    if mates and 2 * len(at_ceiling) > len(mates):
        return (f"{len(at_ceiling)} GPU{'s' if len(at_ceiling) > 1 else ''} of its model in its role "
                "run at full clock doing the same work")
    return None


def _alone(n: int) -> str:
    return ("no other rank in its role to compare with" if n == 0
            else f"only {n} other rank{'s' if n > 1 else ''} in its role, too few for the peer test")
