"""Pipeline-stage imbalance: one stage computes longer than the others.

Peers of a rank are the ranks of its own stage, so a stage that is slow as a
whole never stands out inside itself; here stages are compared with each
other on their compute per step. A longer stage with normal clocks is uneven
work (``workload``): more layers or more tokens, not hardware.
"""

from __future__ import annotations

import numpy as np

from eroica.models.records import UNTRACED_FN

from .attribution import CLOCK_RATIO_LOW
from .counters import CounterSummary
from .findings import Finding, confidence_of
from .layout import Layout
from .patterns import K_KERNEL, K_OPTIM, K_OTHER, K_PYTHON, Patterns

MIN_RATIO = 1.2
MIN_MATERIAL = 0.05


def compute_functions(p: Patterns) -> np.ndarray:
    """(F,) the functions that are a stage's compute: its GPU kernels, or on a job without any (a
    CPU-only job, where the host *is* the compute) its host work (model, optimizer and other host
    functions, their critical-path time), less the loop's code outside any traced call, which
    every stage runs alike (peers.stage_agnostic)."""
    kernels: np.ndarray = p.fn_kinds == K_KERNEL
    if kernels.any():
        return kernels
    names = np.array([n != UNTRACED_FN for n in p.fn_names], dtype=bool)
    host: np.ndarray = np.isin(p.fn_kinds, (K_PYTHON, K_OPTIM, K_OTHER)) & names
    return host


def stage_findings(p: Patterns, layout: Layout, counters: CounterSummary, step_ns: float) -> list[Finding]:
    roles = layout.roles(p.ranks)
    if len(roles) < 2:
        return []
    compute = np.nansum(np.where(compute_functions(p), np.nan_to_num(p.per_step_ns), 0.0), axis=1)
    per_stage = {s: float(np.median(compute[m])) for s, m in roles.items() if m.size}
    stages = sorted(per_stage)
    out: list[Finding] = []
    for s in stages:
        others = [per_stage[o] for o in stages if o != s]
        base = float(np.median(others))
        if base <= 0:
            continue
        ratio = per_stage[s] / base
        excess = per_stage[s] - base
        if ratio < MIN_RATIO or excess < MIN_MATERIAL * step_ns:
            continue
        ranks = [int(p.ranks[i]) for i in roles[s]]
        clocks = [counters.gpu.get(r, {}).get("clock_ratio", np.nan) for r in ranks]
        if np.isfinite(clocks).any() and np.nanmedian(clocks) < CLOCK_RATIO_LOW:
            continue  # a whole stage throttled is hardware, left to the other tests
        spread = np.std(others) / base if len(others) > 1 else 0.0
        z = (ratio - 1.0) / max(spread, 0.02)
        evidence = {
            "stage": {"culprit": s, "stages": len(stages)},
            "compute_ns_per_step": {"culprit": round(per_stage[s]), "other_stages_median": round(base),
                                    "ratio": round(ratio, 3)},
        }
        # One verdict per node the stage fills, else per rank: the contract names one culprit each.
        nodes = {layout.rank_node.get(r, "") for r in ranks}
        whole = [n for n in nodes if n and set(layout.node_ranks(n, p.ranks)) <= set(ranks)]
        covered = {r for n in whole for r in layout.node_ranks(n, p.ranks)}
        targets = [("node", n, -1) for n in sorted(whole)] + [("rank", layout.rank_node.get(r, ""), r)
                                                              for r in ranks if r not in covered]
        peers = [int(r) for r in p.ranks if int(r) not in set(ranks)]
        for scope, node, rank in targets:
            out.append(Finding(
                kind="slow", component="workload", scope=scope, node=node, rank=rank, fn=f"stage {s} compute",
                slowdown=round(ratio, 4), score=round(float(z), 3),
                confidence=confidence_of(ratio, float(z), excess / step_ns), peers=peers, culprits=ranks,
                evidence=evidence,
                summary=(f"pipeline stage {s} computes {ratio:.2f}x longer per step than the other "
                         f"{len(stages) - 1} stages with normal clocks: uneven stage partitioning"),
            ))
    return out
