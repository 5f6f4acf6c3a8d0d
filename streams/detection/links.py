"""Slow links: communicators whose transfers lag behind groups of the same shape.

Groups are compared within a *family* (same member count, same intra/inter-node
span, same collective op): the rail-aligned data-parallel rings of a job, the tensor-parallel
groups of its nodes. Effective bandwidth (bytes / transfer time) when byte
counts are known, else transfer time among groups over the same pipeline
stages. The NIC counters of the rails (:mod:`.ports`: never the front-end or
management ports) then say which node's link it is (lowered speed, rising
errors) or that the fabric is congested.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .collectives import CollectiveStats, GroupStats
from .counters import NIC_CONGESTION, NIC_ERRORS, CounterSummary
from .ports import PortMap, classify, link_trouble, link_trouble_of, secondary_ports
from .robust import leave_one_out_median, robust_z

MIN_GROUPS = 3            # the smallest family whose leave-one-out median ignores one odd group
MIN_RATIO = 1.2           # 20% slower per byte: beyond the spread of equal-sized NCCL transfers on healthy links
MIN_Z = 5.0               # the peer test's significance (robust z against the family's MAD)
MIN_MATERIAL = 0.02       # the extra transfer costs >= 2% of a step: worth a verdict
LINK_SPEED_LOW = 0.9      # link speeds come in steps of 2x (lanes, generations): 0.9 only absorbs rounding


@dataclass
class SlowGroup:
    group: GroupStats
    ratio: float
    z: float
    excess_ns: float
    peer_groups: int


def _stage_set(g: GroupStats, rank_stage: dict[int, int]) -> tuple[int, ...]:
    return tuple(sorted({rank_stage.get(int(r), 0) for r in g.ranks}))


def families(groups: list[GroupStats], rank_stage: dict[int, int] | None = None) -> list[list[GroupStats]]:
    """Communicators that should move data alike: same member count, span (intra / inter-node) and op.

    Compared by bandwidth when every member of the family reports its bytes.
    Without byte counts only transfer *time* is left, and in a pipeline-parallel
    job the data-parallel groups of different stages reduce different gradient
    sizes (a stage with more layers has more): such groups are then compared
    only with groups over the same set of stages. Send / recv pairs never form
    a family: their durations hold the pipeline bubble (waiting for the other
    stage), not a link's speed.
    """
    fam: dict[tuple[int, bool, int], list[GroupStats]] = {}
    for g in groups:
        if g.ranks.size >= 2 and not g.p2p:
            fam.setdefault((int(g.ranks.size), g.intra_node, g.op), []).append(g)
    out: list[list[GroupStats]] = []
    for gs in fam.values():
        if _bytes_known(gs) or not rank_stage:
            out.append(gs)
            continue
        by_stage: dict[tuple[int, ...], list[GroupStats]] = {}
        for g in gs:
            by_stage.setdefault(_stage_set(g, rank_stage), []).append(g)
        out.extend(by_stage.values())
    return out


def pair_families(groups: list[GroupStats], rank_stage: dict[int, int] | None = None) -> list[list[GroupStats]]:
    """Pipeline send / recv pairs over the same stage boundary and span: one family each.

    A pair's time holds the bubble of waiting for the other stage, but every
    data-parallel replica runs the same schedule over the same boundary, so
    its pairs wait alike and move the same activations: one pair much slower
    than its siblings is its path (or one of its two ranks, which a straggler's
    own counters would show). Used only to corroborate a port's error or speed
    anomaly (:func:`.link_findings.link_findings`), never to blame a link alone.
    """
    fam: dict[tuple[bool, tuple[int, ...]], list[GroupStats]] = {}
    for g in groups:
        if g.p2p and g.ranks.size == 2:
            fam.setdefault((g.intra_node, _stage_set(g, rank_stage or {})), []).append(g)
    return list(fam.values())


def _bytes_known(groups: list[GroupStats]) -> bool:
    bw = np.array([g.bandwidth for g in groups])
    return bool(np.isfinite(bw).all() and (bw > 0).all())


def _cost(groups: list[GroupStats]) -> np.ndarray:
    """Slowness: transfer time per byte; transfer time alone without byte counts."""
    if _bytes_known(groups):
        return 1.0 / np.array([g.bandwidth for g in groups])
    return np.array([g.transfer_per_step for g in groups])


def family_ratios(stats: CollectiveStats, rank_stage: dict[int, int] | None = None,
                  min_groups: int = MIN_GROUPS, pairs: bool = False) -> list[tuple[GroupStats, float, float, int]]:
    """(group, cost / leave-one-out median of its family, robust z, family size - 1) for every compared group.

    ``pairs``: the send / recv pairs' families (:func:`pair_families`) instead of the collectives'.
    """
    out = []
    for groups in (pair_families if pairs else families)(stats.groups, rank_stage):
        if len(groups) < min_groups:
            continue
        cost = _cost(groups)
        loo = leave_one_out_median(cost)
        # In units of the family's median: a z-score is scale-free but for robust_z's absolute
        # floor, meant for values near zero. Seconds per byte of NVLink rings (~4e-12 s/B at
        # 230 GB/s) sit below that floor, which capped a 1.8x slower ring's z at 3.4.
        med = float(np.median(cost))
        z, _, _ = robust_z(cost / med if med > 0 else cost)
        ratio = cost / np.maximum(loo, 1e-30)
        out += [(g, float(ratio[i]), float(z[i]), len(groups) - 1) for i, g in enumerate(groups)]
    return out


def slow_groups(stats: CollectiveStats, step_ns: float, rank_stage: dict[int, int] | None = None,
                pairs: bool = False) -> list[SlowGroup]:
    """Communicators (``pairs``: send / recv pairs) slower than their family by the link test's bars."""
    out: list[SlowGroup] = []
    for g, ratio, z, peers in family_ratios(stats, rank_stage, pairs=pairs):
        t = g.transfer_per_step
        excess = t - t / max(ratio, 1e-9)
        if ratio >= MIN_RATIO and z >= MIN_Z and excess >= MIN_MATERIAL * step_ns:
            out.append(SlowGroup(g, ratio, z, excess, peers))
    return out


def group_through(stats: CollectiveStats, ranks: set[int], rank_stage: dict[int, int] | None = None) -> str:
    """The inter-node communicator that shows a node's link problem: the slowest against its family.

    Every test that blames a node's NIC names this same communicator as the
    verdict's ``fn``, so the culprit keeps one incident key whichever test found
    it in a window (the streak of consecutive windows then grows).
    Ties and families too small to compare resolve by name. ``""`` when no
    inter-node communicator has a member among ``ranks``.
    """
    cands = [g for g in stats.groups if not g.intra_node and not g.p2p and g.ranks.size >= 2
             and ranks & {int(r) for r in g.ranks}]
    if not cands:
        return ""
    ratio = {g.name: r for g, r, _, _ in family_ratios(stats, rank_stage, min_groups=2)}
    return min(cands, key=lambda g: (-ratio.get(g.name, 0.0), g.name)).name


@dataclass
class NicAnomaly:
    node: str
    nic: str
    kind: str          # degraded | flaky | congested
    evidence: dict[str, Any]
    strength: float


ERROR_FLOOR = 20.0        # error-counter increases per window a healthy link may show (retransmit noise)
ERROR_FACTOR = 10.0       # ... and how far above the job's typical rail a bad one stands
CONGESTION_FACTOR = 4.0   # CNP / xmit-wait increases 4x the quieter quarter of the rails: marked, not noise


def _fleet_quantile(values: np.ndarray, q: float) -> float:
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if values.size else float("nan")


def _fleet_median(values: np.ndarray) -> float:
    return _fleet_quantile(values, 0.5)


def _sorted_quantile(s: Sequence[float], q: float) -> float:
    """``np.quantile`` (its linear method, the very same bits) of finite values given sorted; NaN when empty.

    Done in Python floats (IEEE doubles, as numpy's): picking two order
    statistics and numpy's ``_lerp`` needs no array per call.
    """
    return _quantile_at(s.__getitem__, len(s), q)


def _quantile_at(at: Callable[[int], float], n: int, q: float) -> float:
    """:func:`_sorted_quantile` of the ``n`` sorted values ``at(0) .. at(n - 1)``."""
    if not n:
        return float("nan")
    v = (n - 1) * q
    if v >= n - 1:
        return float(at(n - 1))
    lo = math.floor(v)
    a, b, t = float(at(lo)), float(at(lo + 1)), v - lo
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


class _LeaveOneOut:
    """Medians of a group's finite values less one member's (its peers'), in O(1) per query.

    The group is sorted once; the median of it less the value at sorted index
    ``k`` reads two order statistics of the rest, shifted past ``k``. This keeps
    a fleet's per-port comparisons linear in its ports, where a list of peers
    per port made them quadratic.
    """

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.sorted = sorted(v for v in values if math.isfinite(v))
        # 0.0 and -0.0 compare equal, and which of them np.quantile's partition picks depends
        # on the values' order: with a -0.0 among them, the peers' own list decides. Without
        # one, equal values are equal bits and which of them is left out changes nothing.
        self.exact = not any(v == 0.0 and math.copysign(1.0, v) < 0 for v in self.sorted)

    def median_without(self, i: int, peers: Callable[[], list[float]]) -> float:
        """``_fleet_median`` of ``peers()``: every value but the ``i``-th (in the order that list gives)."""
        if not self.exact:
            return _fleet_median(np.array(peers()))
        v, s = self.values[i], self.sorted
        if not math.isfinite(v):
            return _sorted_quantile(s, 0.5)
        k = bisect_left(s, v)
        return _quantile_at(lambda j: s[j] if j < k else s[j + 1], len(s) - 1, 0.5)


def _errors(m: dict[str, float]) -> float:
    return float(np.nansum([m.get(f"{k}_inc", np.nan) for k in NIC_ERRORS]))


_ERROR_KEYS = tuple(f"{k}_inc" for k in NIC_ERRORS)


def _errors_of(ms: Sequence[dict[str, float]]) -> np.ndarray:
    """:func:`_errors` of every port, by one row-wise ``nansum`` (the same additions, in the same order, per row)."""
    table = np.array([[m.get(k, np.nan) for k in _ERROR_KEYS] for m in ms], dtype=np.float64)
    out: np.ndarray = np.nansum(table.reshape(len(ms), len(_ERROR_KEYS)), axis=1)
    return out


def _group_ids(names: Sequence[str]) -> np.ndarray:
    """A dense id per distinct name (in order of first appearance)."""
    index: dict[str, int] = {}
    return np.fromiter((index.setdefault(n, len(index)) for n in names), dtype=np.int64, count=len(names))


def _medians_without(group: np.ndarray, values: np.ndarray, peers: Callable[[int], list[float]]) -> list[float]:
    """Per member, :meth:`_LeaveOneOut.median_without` in its group (``group``: dense ids), all members at once.

    The groups' finite values are sorted once together; a member's median
    without itself reads the two middle order statistics of its group past its
    own sorted place (``bisect_left``: the count of smaller values), combined
    by :func:`_quantile_at`'s very formula, element-wise in float64 (the same
    IEEE operations as its Python floats). A group holding a -0.0 takes
    ``peers(i)`` (the scalar way, whose peers' order decides which zero).
    """
    n = values.size
    if n == 0:
        return []
    n_g = int(group.max()) + 1
    fin = np.isfinite(values)
    fi = np.flatnonzero(fin)
    order = fi[np.lexsort((values[fi], group[fi]))]
    sg, sv = group[order], values[order]
    n_fin = np.bincount(sg, minlength=n_g)
    g_start = np.cumsum(n_fin) - n_fin
    # bisect_left: a finite member's place is the start of its run of equal values in its group
    new_run = np.ones(sv.size, dtype=bool)
    new_run[1:] = (sg[1:] != sg[:-1]) | (sv[1:] != sv[:-1])
    run_start = np.maximum.accumulate(np.where(new_run, np.arange(sv.size), 0)) if sv.size else sv.astype(np.int64)
    skip = np.full(n, np.iinfo(np.int64).max)  # a non-finite member leaves nothing out
    skip[order] = run_start - g_start[sg]
    m = n_fin[group] - fin  # the values left
    v = (m - 1) * 0.5
    lo = np.floor(np.maximum(v, 0.0)).astype(np.int64)
    t = v - lo
    last = max(sv.size - 1, 0)
    base = g_start[group]
    pos_a = np.minimum(base + lo + (lo >= skip), last)
    pos_b = np.minimum(base + lo + 1 + (lo + 1 >= skip), last)
    s = sv if sv.size else np.full(1, np.nan)
    a, b = s[pos_a], s[pos_b]
    with np.errstate(invalid="ignore", over="ignore"):
        diff = b - a
        med = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    med = np.where(m == 1, a, med)
    med[m <= 0] = np.nan
    out: list[float] = med.tolist()
    negative_zero = np.zeros(n_g, dtype=bool)
    negative_zero[sg[(sv == 0.0) & np.signbit(sv)]] = True
    for i in np.flatnonzero(negative_zero[group]).tolist():
        out[i] = _fleet_median(np.array(peers(i)))
    return out


def _flaky(node: str, nic: str, m: dict[str, float], ev: dict[str, Any], errors: float) -> NicAnomaly:
    """A port whose errors climb: the evidence of each error counter that rose, strength from their sum."""
    ev.update({f"{k}_increase": {"culprit": m.get(f"{k}_inc")} for k in NIC_ERRORS
               if np.isfinite(m.get(f"{k}_inc", np.nan)) and m.get(f"{k}_inc", 0) > 0})
    return NicAnomaly(node, nic, "flaky", ev, 1.0 + float(np.log1p(errors)))


def secondary_anomalies(counters: CounterSummary, ports: PortMap | None = None) -> list[NicAnomaly]:
    """Errors or a lowered speed on rail-grade ports that do not carry the collectives (:func:`.ports.secondary_ports`).

    Such a port (the NIC of a GPU whose ring stays on NVLink) may still carry the
    job's pipeline send / recv. Its errors are judged like a rail's, against the
    job's rails, and against the same port on the other nodes too, so that a port
    every node counts errors on (a storage network's) stands out nowhere. Kept
    apart from :func:`nic_anomalies`: a secondary port's errors say nothing about
    the collectives, and only a slow send / recv pair through its node gives them
    a cost (:func:`.link_findings.link_findings`).
    """
    ports = ports if ports is not None else classify(counters)
    secondary = sorted(secondary_ports(ports), key=lambda p: (p.node, p.nic))
    if not secondary:
        return []
    rail_med = _fleet_median(np.array([_errors(counters.nic[(p.node, p.nic)]) for p in ports.rails]))
    # The same port name on the other nodes: one leave-one-out group per name (linear in the ports).
    # Its median is np.quantile's (as every fleet median here), which for an even count of peers may
    # differ from np.median's in the last bit: the whole speeds of real links (100, 200, 400) are exact.
    members: dict[str, list[int]] = {}
    for i, p in enumerate(secondary):
        members.setdefault(p.nic, []).append(i)
    errors = [_errors(counters.nic[(p.node, p.nic)]) for p in secondary]
    at = {i: j for idx in members.values() for j, i in enumerate(idx)}
    err_groups = {name: _LeaveOneOut([errors[i] for i in idx]) for name, idx in members.items()}
    speed_groups = {name: _LeaveOneOut([secondary[i].link_gbps for i in idx]) for name, idx in members.items()}
    out: list[NicAnomaly] = []
    for i, p in enumerate(secondary):
        m = counters.nic[(p.node, p.nic)]
        e, idx = errors[i], members[p.nic]
        same_med = err_groups[p.nic].median_without(at[i], lambda: [errors[j] for j in idx if j != i])
        ref = max(v for v in (rail_med, same_med, 0.0) if np.isfinite(v))
        speed_ref = speed_groups[p.nic].median_without(at[i], lambda: [secondary[j].link_gbps for j in idx if j != i])
        if np.isfinite(p.link_gbps) and np.isfinite(speed_ref) and p.link_gbps < LINK_SPEED_LOW * speed_ref:
            ev_speed: dict[str, Any] = {"nic": {"culprit": p.nic, "class": p.cls},
                                        "link_gbps": {"culprit": p.link_gbps, "same_port_median": speed_ref}}
            out.append(NicAnomaly(p.node, p.nic, "degraded", ev_speed, 2.0 - p.link_gbps / speed_ref))
        elif e > max(ERROR_FLOOR, ERROR_FACTOR * ref) or link_trouble(m):
            ev: dict[str, Any] = {"nic": {"culprit": p.nic, "class": p.cls},
                                  "errors_increase": {"culprit": e, "rails_median": rail_med, "same_port_median": same_med}}
            out.append(_flaky(p.node, p.nic, m, ev, e))
    return out


def nic_anomalies(counters: CounterSummary, ports: PortMap | None = None) -> list[NicAnomaly]:
    """Rail ports that differ from comparable rails: lowered speed, errors, congestion.

    Only ports that carry the job's collectives (:mod:`.ports`) are judged, each
    against its own class: a rail's speed against the same rail on the other
    nodes and the other rails of its node, its errors and congestion marks
    against the job's rails. Front-end, management and virtual ports are never
    judged (a management port's rx_errors say nothing about the job's fabric).
    Every threshold is relative to the rails of the job (a healthy link
    retransmits now and then; a congested fabric marks CNPs everywhere a bit).
    """
    ports = ports if ports is not None else classify(counters)
    rails = sorted(ports.rails, key=lambda p: (p.node, p.nic))
    if not rails:
        return []
    ms = [counters.nic[(p.node, p.nic)] for p in rails]
    errors = _errors_of(ms)
    err_med = _fleet_median(errors)
    err_limit = max(ERROR_FLOOR, ERROR_FACTOR * (err_med if np.isfinite(err_med) else 0.0))
    cong = {k: np.array([m.get(f"{k}_inc", np.nan) for m in ms]) for k in NIC_CONGESTION}
    # Congestion may hit many nodes at once: compare with the quieter quarter of the rails.
    cong_med = {k: _fleet_quantile(v, 0.25) for k, v in cong.items()}
    # A port's peers are its group less itself: the same rail (port name) on the other
    # nodes (``ports.same_rail``), the other rails of its node (``ports.node_rails``).
    by_rail = _group_ids([p.nic for p in rails])
    by_node = _group_ids([p.node for p in rails])
    speed = np.array([p.link_gbps for p in rails], dtype=np.float64)
    tput = np.array([p.throughput_Bps for p in rails], dtype=np.float64)
    rail_speed = _medians_without(by_rail, speed, lambda i: [p.link_gbps for p in ports.same_rail(rails[i])])
    node_speed = _medians_without(
        by_node, speed, lambda i: [p.link_gbps for p in ports.node_rails(rails[i].node, exclude=rails[i].nic)])
    same_tput = _medians_without(by_rail, tput, lambda i: [p.throughput_Bps for p in ports.same_rail(rails[i])])
    # The tests of every port at once; only the ports they single out are visited one by one.
    rs, ns = np.array(rail_speed), np.array(node_speed)
    with np.errstate(invalid="ignore"):
        # Slower than the same rail elsewhere (switch ports of a rail are set alike), and
        # not merely a node type whose rails are all slower: its own other rails are faster.
        degraded = (np.isfinite(speed) & np.isfinite(rs) & (speed < LINK_SPEED_LOW * rs)
                    & (~np.isfinite(ns) | (speed < LINK_SPEED_LOW * ns)))
        flaky = (errors > err_limit) | link_trouble_of(ms)
        raised_at = {k: np.isfinite(v) & (v > 0) & (v > CONGESTION_FACTOR * max(
            cong_med[k] if np.isfinite(cong_med[k]) else 0.0, 1.0)) for k, v in cong.items()}
    congested = np.zeros(len(rails), dtype=bool)
    for mask in raised_at.values():
        congested |= mask
    out: list[NicAnomaly] = []
    for i in np.flatnonzero(degraded | flaky | congested).tolist():
        port, m = rails[i], ms[i]
        ev = {
            "nic": {"culprit": port.nic, "class": port.cls},
            "link_gbps": {"culprit": m.get("link_gbps"), "same_rail_median": rail_speed[i],
                          "node_rails_median": node_speed[i]},
            "throughput_Bps": {"culprit": round(m.get("throughput_Bps", np.nan), 1),
                               "same_rail_median": round(same_tput[i], 1)},
            "throughput_cv": {"culprit": round(m.get("throughput_cv", np.nan), 3)},
        }
        if degraded[i]:
            ref = rail_speed[i] if not np.isfinite(node_speed[i]) else min(rail_speed[i], node_speed[i])
            out.append(NicAnomaly(port.node, port.nic, "degraded", ev, 1.0 + (ref - port.link_gbps) / ref))
        elif flaky[i]:
            anomaly = _flaky(port.node, port.nic, m, ev, errors[i])
            ev["errors_increase"] = {"culprit": errors[i], "rails_median": err_med}  # after the counters, as before
            out.append(anomaly)
        else:
            raised = [k for k in NIC_CONGESTION if raised_at[k][i]]
            ev.update({f"{k}_increase": {"culprit": cong[k][i], "rails_q25": cong_med[k]} for k in raised})
            out.append(NicAnomaly(port.node, port.nic, "congested", ev, 1.0))
    return out
