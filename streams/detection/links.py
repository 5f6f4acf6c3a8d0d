"""Slow links: communicators whose transfers lag behind groups of the same shape.

Groups are compared within a *family* (same member count, same intra/inter-node
span, same collective op): the rail-aligned data-parallel rings of a job, the tensor-parallel
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
    families: dict[tuple[int, bool, int], list[GroupStats]] = {}
    for g in stats.groups:
        if g.ranks.size >= 2 and not g.p2p:
            families.setdefault((int(g.ranks.size), g.intra_node, g.op), []).append(g)
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


ERROR_FLOOR = 20.0        # error-counter increases per window a healthy link may show (retransmit noise)
ERROR_FACTOR = 10.0       # ... and how far above the fleet's typical port a bad one stands
CONGESTION_FACTOR = 4.0


def _fleet_quantile(values: np.ndarray, q: float) -> float:
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if values.size else float("nan")


def _fleet_median(values: np.ndarray) -> float:
    return _fleet_quantile(values, 0.5)


def nic_anomalies(counters: CounterSummary) -> list[NicAnomaly]:
    """NIC ports that differ from the fleet's ports: lowered speed, errors, congestion.

    Every threshold is relative to the other ports of the job (a healthy link
    retransmits now and then; a congested fabric marks CNPs everywhere a bit).
    """
    if not counters.nic:
        return []
    ports = list(counters.nic.items())
    speeds = np.array([m.get("link_gbps", np.nan) for _, m in ports])
    tput = np.array([m.get("throughput_Bps", np.nan) for _, m in ports])
    errors = np.array([float(np.nansum([m.get(f"{k}_inc", np.nan) for k in NIC_ERRORS])) for _, m in ports])
    speed_med, tput_med, err_med = _fleet_median(speeds), _fleet_median(tput), _fleet_median(errors)
    err_limit = max(ERROR_FLOOR, ERROR_FACTOR * (err_med if np.isfinite(err_med) else 0.0))
    cong = {k: np.array([m.get(f"{k}_inc", np.nan) for _, m in ports]) for k in NIC_CONGESTION}
    # Congestion may hit many nodes at once: compare with the quieter quarter of the ports.
    cong_med = {k: _fleet_quantile(v, 0.25) for k, v in cong.items()}
    out: list[NicAnomaly] = []
    for i, ((node, nic), m) in enumerate(ports):
        ev = {
            "link_gbps": {"culprit": m.get("link_gbps"), "peer_median": speed_med},
            "throughput_Bps": {"culprit": round(m.get("throughput_Bps", np.nan), 1), "peer_median": round(tput_med, 1)},
            "throughput_cv": {"culprit": round(m.get("throughput_cv", np.nan), 3)},
        }
        speed = speeds[i]
        flapped = m.get("link_up_min", 1.0) < 1.0 or m.get("link_downed_inc", 0.0) > 0
        if np.isfinite(speed) and np.isfinite(speed_med) and speed < LINK_SPEED_LOW * speed_med:
            out.append(NicAnomaly(node, nic, "degraded", ev, 1.0 + (speed_med - speed) / speed_med))
        elif errors[i] > err_limit or flapped:
            ev.update({f"{k}_increase": {"culprit": m.get(f"{k}_inc")} for k in NIC_ERRORS
                       if np.isfinite(m.get(f"{k}_inc", np.nan)) and m.get(f"{k}_inc", 0) > 0})
            ev["errors_increase"] = {"culprit": errors[i], "peer_median": err_med}
            out.append(NicAnomaly(node, nic, "flaky", ev, 1.0 + float(np.log1p(errors[i]))))
        else:
            raised = [k for k in NIC_CONGESTION
                      if np.isfinite(cong[k][i]) and cong[k][i] > 0
                      and cong[k][i] > CONGESTION_FACTOR * max(cong_med[k] if np.isfinite(cong_med[k]) else 0.0, 1.0)]
            if raised:
                ev.update({f"{k}_increase": {"culprit": cong[k][i], "peer_median": cong_med[k]} for k in raised})
                out.append(NicAnomaly(node, nic, "congested", ev, 1.0))
    return out
