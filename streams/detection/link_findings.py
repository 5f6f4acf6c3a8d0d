"""Link findings: slow communicators attributed to NVLink, a NIC, PCIe (GPUDirect) or the fabric.

Reads the communicator comparison of :mod:`.links` and the port anomalies
of the NIC counters; one :class:`Finding` per culprit link.
"""

from __future__ import annotations

import numpy as np

from . import attribution as attr
from .collectives import CollectiveStats
from .counters import CounterSummary
from .findings import Finding, confidence_of
from .layout import Layout
from .links import slow_groups
from .patterns import Patterns


def link_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                  step_ns: float, anomalies: list) -> list[Finding]:
    slow = slow_groups(coll, step_ns)
    out: list[Finding] = []
    inter = [s for s in slow if not s.group.intra_node]
    for s in slow:
        if s.group.intra_node:
            out.append(_nvlink_finding(s, layout, counters, p))
    if inter:
        nodes_in_slow = {layout.rank_node.get(int(r), "") for s in inter for r in s.group.ranks}
        hw = [a for a in anomalies if a.kind in ("degraded", "flaky") and a.node in nodes_in_slow]
        congested = {a.node for a in anomalies if a.kind == "congested"}
        best = max(inter, key=lambda s: s.ratio)
        pcie = _pcie_members(inter, counters)
        if hw:
            by_node: dict[str, object] = {}
            for a in hw:
                if a.node not in by_node or a.strength > by_node[a.node].strength:  # type: ignore[attr-defined]
                    by_node[a.node] = a
            for node, a in by_node.items():
                out.append(_nic_finding(node, a, best, layout, p))
        elif pcie:
            for rank, s in pcie.items():
                out.append(_pcie_link_finding(rank, s, layout, counters, p))
        elif len(congested) >= 2:
            out.append(_network_finding(sorted(congested), best, layout, p, anomalies))
        else:
            common = set.intersection(*[{layout.rank_node.get(int(r), "") for r in s.group.ranks} for s in inter])
            if len(common) == 1:
                out.append(_nic_finding(common.pop(), None, best, layout, p))
            else:
                out.append(_network_finding(sorted(nodes_in_slow), best, layout, p, anomalies))
    return out


def _pcie_members(slow, counters: CounterSummary) -> dict[int, object]:
    """Members of slow inter-node rings whose GPU's PCIe link trained down (GPUDirect RDMA crosses it)."""
    out: dict[int, object] = {}
    for s in slow:
        for r in s.group.ranks:
            g = counters.gpu.get(int(r), {})
            gen, mgen = g.get("pcie_gen", np.nan), g.get("max_pcie_gen", np.nan)
            w, mw = g.get("pcie_width", np.nan), g.get("max_pcie_width", np.nan)
            if (np.isfinite(gen) and np.isfinite(mgen) and gen < mgen) or (np.isfinite(w) and np.isfinite(mw) and w < mw):
                out[int(r)] = s
    return out


def _pcie_link_finding(rank: int, s, layout: Layout, counters: CounterSummary, p: Patterns) -> Finding:
    node = layout.rank_node.get(rank, "")
    evidence = {"transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    evidence.update({k: v for k, v in attr.gpu_evidence(counters, rank, []).items() if "pcie" in k})
    return Finding(kind="slow", component="pcie", scope="rank", node=node, rank=rank,
                   gpu=counters.gpu_index.get(rank, -1), fn=s.group.name, slowdown=round(s.ratio, 4),
                   score=round(s.z, 3), confidence=confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0)),
                   peers=[int(r) for r in p.ranks if int(r) != rank], culprits=[rank], evidence=evidence,
                   summary=_link_summary(s, f"GPU {counters.gpu_index.get(rank, -1)} {attr.pcie_reason(counters, rank)}"
                                            f" (its GPUDirect traffic crosses PCIe)"))


def _link_summary(s, what: str) -> str:
    return (f"{what}; collectives of group {s.group.name} move data {s.ratio:.2f}x slower than "
            f"{s.peer_groups} groups of the same shape")


def _nvlink_finding(s, layout: Layout, counters: CounterSummary, p: Patterns) -> Finding:
    ranks = [int(r) for r in s.group.ranks]
    node = layout.rank_node.get(ranks[0], "")
    tput = {r: counters.gpu.get(r, {}).get("nvlink_tx_Bps", np.nan) + counters.gpu.get(r, {}).get("nvlink_rx_Bps", np.nan)
            for r in ranks}
    finite = {r: v for r, v in tput.items() if np.isfinite(v)}
    rank, gpu, scope = -1, -1, "node"
    evidence = {"transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    if len(finite) >= 2:
        low = min(finite, key=finite.get)
        others = float(np.median([v for r, v in finite.items() if r != low]))
        if finite[low] < 0.7 * others:
            rank, gpu, scope = low, counters.gpu_index.get(low, -1), "rank"
            evidence["nvlink_Bps"] = {"culprit": round(finite[low], 1), "peer_median": round(others, 1)}
    who = f"GPU {gpu} NVLink" if scope == "rank" else "NVLink"
    return Finding(kind="slow", component="nvlink", scope=scope, node=node, rank=rank, gpu=gpu,
                   fn=s.group.name, slowdown=round(s.ratio, 4), score=round(s.z, 3),
                   confidence=confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0)),
                   peers=[int(r) for r in p.ranks if int(r) not in ranks],
                   culprits=[rank] if rank >= 0 else ranks, evidence=evidence,
                   summary=_link_summary(s, f"{who} on {node} slow"))


def _nic_finding(node: str, anomaly, s, layout: Layout, p: Patterns) -> Finding:
    ranks = layout.node_ranks(node, p.ranks)
    evidence = {"transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
    what = f"NIC on {node}"
    if anomaly is not None:
        evidence.update({"nic": {"culprit": anomaly.nic, "anomaly": anomaly.kind}, **anomaly.evidence})
        what = f"NIC {anomaly.nic} on {node} {'link degraded' if anomaly.kind == 'degraded' else 'flaky (errors)'}"
    conf = confidence_of(s.ratio, s.z, s.excess_ns / max(_step(p), 1.0))
    return Finding(kind="slow", component="nic", scope="node", node=node, fn=s.group.name,
                   slowdown=round(s.ratio, 4), score=round(s.z, 3),
                   confidence=conf if anomaly is not None else round(conf * 0.7, 3),
                   peers=[int(r) for r in p.ranks if int(r) not in ranks], culprits=ranks,
                   evidence=evidence, summary=_link_summary(s, what))


def _network_finding(nodes: list[str], s, layout: Layout, p: Patterns, anomalies) -> Finding:
    culprits = [r for n in nodes for r in layout.node_ranks(n, p.ranks)]
    evidence = {"nodes": {"culprit": nodes},
                "transfer_ns_per_step": {"culprit": round(s.group.transfer_per_step), "ratio": round(s.ratio, 3)}}
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
