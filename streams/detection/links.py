"""Slow links: communicators whose transfers lag behind groups of the same shape.

Groups are compared within a *family* (same member count, same intra/inter-node
span): the rail-aligned data-parallel rings of a job, the tensor-parallel
groups of its nodes. Effective bandwidth (bytes / transfer time) when byte
counts are known, else transfer time. The NIC counters then say which node's
link it is (lowered speed, rising errors) or that the fabric is congested.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .collectives import CollectiveStats, GroupStats
from .counters import NIC_CONGESTION, NIC_ERRORS, CounterSummary
from .robust import leave_one_out_median, robust_z

MIN_GROUPS = 3
MIN_RATIO = 1.2
MIN_Z = 5.0
MIN_MATERIAL = 0.02
LINK_SPEED_LOW = 0.9


@dataclass
class SlowGroup:
    group: GroupStats
    ratio: float
    z: float
    excess_ns: float
    peer_groups: int


def slow_groups(stats: CollectiveStats, step_ns: float) -> list[SlowGroup]:
    families: dict[tuple[int, bool], list[GroupStats]] = {}
    for g in stats.groups:
        if g.ranks.size >= 2:
            families.setdefault((int(g.ranks.size), g.intra_node), []).append(g)
    out: list[SlowGroup] = []
    for groups in families.values():
        if len(groups) < MIN_GROUPS:
            continue
        t = np.array([g.transfer_per_step for g in groups])
        bw = np.array([g.bandwidth for g in groups])
        # "slowness" grows with transfer time per byte; fall back to time without byte counts.
        cost = 1.0 / bw if np.isfinite(bw).all() and (bw > 0).all() else t
        loo = leave_one_out_median(cost)
        z, _, _ = robust_z(cost)
        ratio = cost / np.maximum(loo, 1e-30)
        excess = t - t * (1.0 / np.maximum(ratio, 1e-9))
        for i in np.flatnonzero((ratio >= MIN_RATIO) & (z >= MIN_Z) & (excess >= MIN_MATERIAL * step_ns)):
            out.append(SlowGroup(groups[i], float(ratio[i]), float(z[i]), float(excess[i]), len(groups) - 1))
    return out


@dataclass
class NicAnomaly:
    node: str
    nic: str
    kind: str          # degraded | flaky | congested
    evidence: dict
    strength: float


def nic_anomalies(counters: CounterSummary) -> list[NicAnomaly]:
    """NIC ports that differ from the fleet's ports: lowered speed, errors, congestion."""
    if not counters.nic:
        return []
    speeds = np.array([m.get("link_gbps", np.nan) for m in counters.nic.values()])
    speed_med = float(np.nanmedian(speeds)) if np.isfinite(speeds).any() else np.nan
    tput = np.array([m.get("throughput_Bps", np.nan) for m in counters.nic.values()])
    tput_med = float(np.nanmedian(tput)) if np.isfinite(tput).any() else np.nan
    cong = {k: np.array([m.get(f"{k}_inc", np.nan) for m in counters.nic.values()]) for k in NIC_CONGESTION}
    out: list[NicAnomaly] = []
    for (node, nic), m in counters.nic.items():
        ev = {
            "link_gbps": {"culprit": m.get("link_gbps"), "peer_median": speed_med},
            "throughput_Bps": {"culprit": round(m.get("throughput_Bps", np.nan), 1), "peer_median": round(tput_med, 1)},
            "throughput_cv": {"culprit": round(m.get("throughput_cv", np.nan), 3)},
        }
        errors = {k: m.get(f"{k}_inc", np.nan) for k in NIC_ERRORS}
        err_total = float(np.nansum(list(errors.values()))) if errors else 0.0
        speed = m.get("link_gbps", np.nan)
        if np.isfinite(speed) and np.isfinite(speed_med) and speed < LINK_SPEED_LOW * speed_med:
            out.append(NicAnomaly(node, nic, "degraded", ev, 1.0 + (speed_med - speed) / speed_med))
        elif err_total > 0 or m.get("link_up_min", 1.0) < 1.0:
            ev.update({f"{k}_increase": {"culprit": v} for k, v in errors.items() if np.isfinite(v) and v > 0})
            out.append(NicAnomaly(node, nic, "flaky", ev, 1.0 + np.log1p(err_total)))
        else:
            mine = {k: m.get(f"{k}_inc", np.nan) for k in NIC_CONGESTION}
            raised = [k for k, v in mine.items()
                      if np.isfinite(v) and v > 0 and v > 4.0 * max(float(np.nanmedian(cong[k])), 0.0)]
            if raised:
                ev.update({f"{k}_increase": {"culprit": mine[k], "peer_median": float(np.nanmedian(cong[k]))} for k in raised})
                out.append(NicAnomaly(node, nic, "congested", ev, 1.0))
    return out
