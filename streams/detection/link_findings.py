"""Link findings: slow communicators attributed to NVLink, a NIC, PCIe (GPUDirect) or the fabric.

Reads the communicator comparison of :mod:`.links` and the anomalies of the
rail ports (:mod:`.ports`: front-end and management ports are never blamed);
one :class:`Finding` per culprit link. A GPU whose NVLink traffic falls far
below its ring-mates' is found from the counters too, so that a job with
fewer than three nodes (too few same-shaped groups to compare) still names it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import attribution as attr
from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary
from .expected import MIN_COLL_BYTES, nvlink_Bps
from .findings import Finding, confidence_of
from .layout import Layout
from .links import (MIN_MATERIAL, NicAnomaly, SlowGroup, family_ratios, group_through, secondary_anomalies,
                    slow_groups)
from .patterns import Patterns
from .ports import PortMap
from .robust import leave_one_out_median, robust_z

# Members of one ring / all-reduce move the same bytes per step, so their NVLink
# counters agree over a window. With the group already slower than its family,
# a member below 70% of its ring-mates is where traffic left NVLink; on the
# counters alone (no family to compare with) the bar is half: a GPU moving
# less than half its share over NVLink routes the rest elsewhere (PCIe) or has
# lost links, which sampling noise over a window of samples cannot produce.
NVLINK_LOW_CONFIRMED = 0.7
NVLINK_LOW = 0.5
NVLINK_ACTIVE_BPS = 1e6   # ring-mates below 1 MB/s do not use NVLink at all (a config matter, expected.py)


def link_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                  step_ns: float, anomalies: list[NicAnomaly], ports: PortMap | None = None) -> list[Finding]:
    """Slow links: NVLink within a node, NICs and the fabric between nodes, send / recv pairs.

    ``ports``: the window's port classes (:func:`.ports.classify`), when the caller has them.
    """
    slow = slow_groups(coll, step_ns, layout.rank_stage)
    out: list[Finding] = []
    inter = [s for s in slow if not s.group.intra_node]
    nvlink_ranks: set[int] = set()
    for s in slow:
        if s.group.intra_node:
            f = _nvlink_finding(s, layout, counters, p)
            out.append(f)
            nvlink_ranks |= set(f.culprits) if f.scope == "rank" else set()
    out += nvlink_counter_findings(layout, counters, coll, step_ns, slow, nvlink_ranks)
    if inter:
        nodes_in_slow = {layout.rank_node.get(int(r), "") for s in inter for r in s.group.ranks}
        hw = [a for a in anomalies if a.kind in ("degraded", "flaky") and a.node in nodes_in_slow]
        congested = {a.node for a in anomalies if a.kind == "congested"}
        best = max(inter, key=lambda s: s.ratio)
        pcie = _pcie_members(inter, counters)
        if hw:
            by_node: dict[str, NicAnomaly] = {}
            for a in hw:
                if a.node not in by_node or a.strength > by_node[a.node].strength:
                    by_node[a.node] = a
            for node, a in by_node.items():
                out.append(_nic_finding(node, a, _slowest_through(inter, node, layout) or best, layout, p, coll))
        elif pcie:
            for rank, s in pcie.items():
                out.append(_pcie_link_finding(rank, s, layout, counters, p))
        elif len(congested) >= 2:
            out.append(_network_finding(sorted(congested), best, layout, p, anomalies, inter))
        else:
            common = set.intersection(*[{layout.rank_node.get(int(r), "") for r in s.group.ranks} for s in inter])
            if len(common) == 1:
                node = common.pop()
                out.append(_nic_finding(node, None, _slowest_through(inter, node, layout) or best, layout, p, coll))
            else:
                out.append(_network_finding(sorted(nodes_in_slow), best, layout, p, anomalies, inter))
    named = {f.node for f in out if f.component == "nic"}
    return out + _pair_findings(p, layout, counters, coll, step_ns, anomalies, named, ports)


def _pair_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats, step_ns: float,
                   anomalies: list[NicAnomaly], named: set[str], ports: PortMap | None = None) -> list[Finding]:
    """A port with errors or a lowered speed on a node whose pipeline send / recv pair is slower than its siblings.

    The collectives' test cannot see a port that carries only send / recv (the NIC
    of a GPU whose rings stay on NVLink). A pair much slower than the other pairs
    over the same stage boundary, through a node with such a port anomaly, is that
    port: both are needed, so neither a straggler's slow pair (no port anomaly)
    nor a noisy port under healthy transfers is named. ``named``: nodes already blamed.
    """
    slow = slow_groups(coll, step_ns, layout.rank_stage, pairs=True)
    if not slow:
        return []
    hw = [a for a in anomalies if a.kind in ("degraded", "flaky")] + secondary_anomalies(counters, ports)
    out: list[Finding] = []
    for node in sorted({a.node for a in hw} - named):
        through = _slowest_through(slow, node, layout)
        if through is None:
            continue
        a = max((a for a in hw if a.node == node), key=lambda a: (a.strength, a.nic))
        out.append(_nic_finding(node, a, through, layout, p, coll))
    return out


def _slowest_through(slow: list[SlowGroup], node: str, layout: Layout) -> SlowGroup | None:
    through = [s for s in slow if any(layout.rank_node.get(int(r)) == node for r in s.group.ranks)]
    return max(through, key=lambda s: (s.ratio, s.group.name)) if through else None


def _pcie_members(slow: list[SlowGroup], counters: CounterSummary) -> dict[int, SlowGroup]:
    """Members of slow inter-node rings whose GPU's PCIe link trained down (GPUDirect RDMA crosses it)."""
    out: dict[int, SlowGroup] = {}
    for s in slow:
        for r in s.group.ranks:
            g = counters.gpu.get(int(r), {})
            gen, mgen = g.get("pcie_gen", np.nan), g.get("max_pcie_gen", np.nan)
            w, mw = g.get("pcie_width", np.nan), g.get("max_pcie_width", np.nan)
            if (np.isfinite(gen) and np.isfinite(mgen) and gen < mgen) or (np.isfinite(w) and np.isfinite(mw) and w < mw):
                out[int(r)] = s
    return out


def _pcie_link_finding(rank: int, s: SlowGroup, layout: Layout, counters: CounterSummary, p: Patterns) -> Finding:
    node = layout.rank_node.get(rank, "")
    evidence = {"transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    evidence.update({k: v for k, v in attr.gpu_evidence(counters, rank, []).items() if "pcie" in k})
    return Finding(kind="slow", component="pcie", scope="rank", node=node, rank=rank,
                   gpu=counters.gpu_index.get(rank, -1), fn=s.group.name, slowdown=round(s.ratio, 4),
                   score=round(s.z, 3), confidence=confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0)),
                   peers=[int(r) for r in p.ranks if int(r) != rank], culprits=[rank], evidence=evidence,
                   summary=_link_summary(s, f"GPU {counters.gpu_index.get(rank, -1)} {attr.pcie_reason(counters, rank)}"
                                            f" (its GPUDirect traffic crosses PCIe)"))


def _link_summary(s: SlowGroup, what: str) -> str:
    if s.group.p2p:
        return (f"{what}; send / recv of pair {s.group.name} take {s.ratio:.2f}x as long as on "
                f"{s.peer_groups} pairs over the same pipeline stages")
    return (f"{what}; collectives of group {s.group.name} move data {s.ratio:.2f}x slower than "
            f"{s.peer_groups} groups of the same shape")


def _nvlink_values(g: GroupStats, counters: CounterSummary) -> dict[int, float]:
    """NVLink throughput (tx + rx) of the group's members with counters, same GPU class only.

    GPUs of another model have other NVLink generations: the members are
    compared only with the class most of the group belongs to.
    """
    ranks = [int(r) for r in g.ranks]
    classes = attr.gpu_classes(counters, ranks)
    if classes:
        main = max(set(classes.values()), key=lambda c: (list(classes.values()).count(c), c))
        ranks = [r for r in ranks if classes.get(r) == main]
    vals = {r: nvlink_Bps(counters.gpu[r]) for r in ranks if r in counters.gpu}
    return {r: float(v) for r, v in vals.items() if np.isfinite(v)}


def _nvlink_low_member(g: GroupStats, counters: CounterSummary, share: float) -> tuple[int, float, float, float] | None:
    """(rank, its NVLink Bps, its ring-mates' median, robust z of the deficit) of the member below ``share``."""
    vals = _nvlink_values(g, counters)
    if len(vals) < 2:
        return None
    ranks = sorted(vals)
    v = np.array([vals[r] for r in ranks])
    loo = leave_one_out_median(v)
    rel = v / np.maximum(loo, 1e-9)
    i = int(np.argmin(rel))
    if loo[i] < NVLINK_ACTIVE_BPS or v[i] >= share * loo[i]:
        return None
    z = float(-robust_z(v)[0][i]) if v.size >= 3 else float("nan")
    return ranks[i], float(v[i]), float(loo[i]), z


def _nvlink_finding(s: SlowGroup, layout: Layout, counters: CounterSummary, p: Patterns) -> Finding:
    ranks = [int(r) for r in s.group.ranks]
    node = layout.rank_node.get(ranks[0], "")
    rank, gpu, scope = -1, -1, "node"
    evidence = {"transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    low = _nvlink_low_member(s.group, counters, NVLINK_LOW_CONFIRMED)
    if low is not None:
        rank, value, others, _ = low
        gpu, scope = counters.gpu_index.get(rank, -1), "rank"
        evidence["nvlink_Bps"] = {"culprit": round(value, 1), "peer_median": round(others, 1)}
    who = f"GPU {gpu} NVLink" if scope == "rank" else "NVLink"
    return Finding(kind="slow", component="nvlink", scope=scope, node=node, rank=rank, gpu=gpu,
                   fn=s.group.name, slowdown=round(s.ratio, 4), score=round(s.z, 3),
                   confidence=confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0)),
                   peers=[int(r) for r in p.ranks if int(r) not in ranks],
                   culprits=[rank] if rank >= 0 else ranks, evidence=evidence,
                   summary=_link_summary(s, f"{who} on {node} slow"),
                   # On the family comparison alone (no GPU's counters below its ring-mates') one window
                   # is no level: a ring's transfer estimate includes the wait for its last arriver, and
                   # jittery compute (MoE layers) read one of four healthy TP groups 1.76x slow in a single
                   # window. Such a finding alarms once it persists (detector._stabilise).
                   steady=low is not None)


def nvlink_counter_findings(layout: Layout, counters: CounterSummary, coll: CollectiveStats, step_ns: float,
                            slow: list[SlowGroup], found: set[int]) -> list[Finding]:
    """A GPU that moves far less over NVLink than its ring-mates, in a group whose transfers matter.

    The family comparison of :func:`.links.slow_groups` needs three groups of
    the same shape, so a one- or two-node job never gets there. The members
    of an intra-node group move identical bytes, so one member far below the
    others on its NVLink counters is the link, whatever the other nodes do.
    """
    slow_names = {s.group.name for s in slow}
    ratio = {g.name: (r, z) for g, r, z, _ in family_ratios(coll, layout.rank_stage, min_groups=2)}
    out: list[Finding] = []
    for g in coll.groups:
        if not g.intra_node or g.p2p or g.ranks.size < 3 or g.name in slow_names:
            continue
        if np.isfinite(g.bytes_per_step) and g.bytes_per_step < MIN_COLL_BYTES:
            continue
        material = g.transfer_per_step / max(step_ns, 1.0)
        if material < MIN_MATERIAL:
            continue
        low = _nvlink_low_member(g, counters, NVLINK_LOW)
        if low is None or low[0] in found:
            continue
        rank, value, others, z = low
        node = layout.rank_node.get(rank, "")
        gpu = counters.gpu_index.get(rank, -1)
        deficit = others / max(value, others * 1e-3)
        # How much slower the group moves its data than the node's other groups of its shape
        # (one or two of them: a measured ratio, not a significant one); 1 when it has none.
        slowdown = max(1.0, ratio.get(g.name, (1.0, 0.0))[0])
        score = z if np.isfinite(z) else deficit
        evidence = {
            "nvlink_Bps": {"culprit": round(value, 1), "peer_median": round(others, 1), "ratio": round(deficit, 2)},
            "transfer_ns_per_step": {"culprit": round(g.transfer_per_step), "share_of_step": round(material, 4),
                                     "ratio_to_same_shape_groups": round(slowdown, 3)},
        }
        members = [int(r) for r in g.ranks]
        evidence.update({k: v for k, v in attr.gpu_evidence(counters, rank, [r for r in members if r != rank]).items()
                         if "pcie" in k or "nvlink" in k})
        out.append(Finding(
            kind="slow", component="nvlink", scope="rank", node=node, rank=rank, gpu=gpu, fn=g.name,
            slowdown=round(slowdown, 4), score=round(float(score), 3),
            confidence=confidence_of(1.0 + (1.0 - value / others), score, material),
            peers=[r for r in members if r != rank], culprits=[rank], evidence=evidence,
            summary=(f"GPU {gpu} NVLink on {node} carries {value / others:.0%} of its ring-mates' traffic "
                     f"({len(members) - 1} GPUs of group {g.name}, whose transfers take {material:.0%} of a step): "
                     f"its links are down or degraded, traffic falls back to PCIe"),
        ))
    return out


def _nic_finding(node: str, anomaly: NicAnomaly | None, s: SlowGroup, layout: Layout, p: Patterns,
                 coll: CollectiveStats) -> Finding:
    ranks = layout.node_ranks(node, p.ranks)
    evidence: dict[str, dict[str, Any]] = {
        "transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    what = f"NIC on {node}"
    if anomaly is not None:
        cls = anomaly.evidence.get("nic", {}).get("class", "rail")
        evidence.update({**anomaly.evidence, "nic": {"culprit": anomaly.nic, "anomaly": anomaly.kind, "class": cls}})
        what = f"NIC {anomaly.nic} on {node} {'link degraded' if anomaly.kind == 'degraded' else 'flaky (errors)'}"
    conf = confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0))
    # The same communicator names the culprit whichever test finds it (expected.py too): one incident.
    # A port seen only through a send / recv pair (_pair_findings) is named by that pair: the
    # collectives through its node are not slow, and the likeliest of equals would change per window.
    fn = s.group.name if s.group.p2p else (group_through(coll, set(ranks), layout.rank_stage) or s.group.name)
    return Finding(kind="slow", component="nic", scope="node", node=node, fn=fn,
                   slowdown=round(s.ratio, 4), score=round(s.z, 3),
                   confidence=conf if anomaly is not None else round(conf * 0.7, 3),
                   peers=[int(r) for r in p.ranks if int(r) not in ranks], culprits=ranks,
                   evidence=evidence, summary=_link_summary(s, what))


def _network_finding(nodes: list[str], s: SlowGroup, layout: Layout, p: Patterns, anomalies: list[NicAnomaly],
                     slow: list[SlowGroup]) -> Finding:
    culprits = [r for n in nodes for r in layout.node_ranks(n, p.ranks)]
    evidence: dict[str, dict[str, Any]] = {
        "nodes": {"culprit": nodes},
        "transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)},
        # each slow communicator's members: detector._drop_explained asks whether a straggler sits in all of them
        "slow_communicators": {g.group.name: [int(r) for r in g.group.ranks] for g in slow}}
    for a in anomalies:
        if a.node in nodes:
            evidence[f"{a.node}/{a.nic}"] = {"anomaly": a.kind}
    return Finding(kind="slow", component="network", scope="job", fn=s.group.name,
                   slowdown=round(s.ratio, 4), score=round(s.z, 3),
                   confidence=confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0)),
                   peers=[int(r) for r in p.ranks], culprits=culprits, evidence=evidence,
                   summary=_link_summary(s, f"fabric congestion across {len(nodes)} nodes ({', '.join(nodes[:4])})"))


def _step(p: Patterns) -> float:
    return float(np.nanmedian(p.step_time_ns))
