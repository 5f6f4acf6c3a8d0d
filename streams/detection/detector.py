"""The detector: one job window in, contract verdicts out. Pure: no I/O, no clock.

Order of reasoning (PerfTracker's differential observability):
1. behaviour patterns per (rank, function) and the collective wait / transfer split;
2. the peer test on compute, copy, loader and host functions (never on collective
   durations, which measure waiting);
3. culprit vs victims: a straggler waits *least* in collectives;
4. slow links: communicators slower than same-shaped ones, attributed with NIC counters;
5. hangs from ``in_flight`` dumps;
6. attribution to a component from counters and function kinds, scope node when
   every rank of a node shares the finding.
"""

from __future__ import annotations

from collections import defaultdict

import msgspec

import numpy as np

from eroica.models.digest import WindowDigest
from eroica.models.records import JobRecord
from eroica.models.verdict import Verdict, finding_key, incident_id, verdict_id

from . import attribution as attr
from .collectives import CollectiveStats, collective_stats
from .counters import CounterSummary, from_digest
from .findings import Finding, confidence_of
from .hang import hang_findings
from .expected import expected_findings
from .history import JobHistory
from .regression import regression_findings, with_window
from .stages import stage_findings
from .layout import Layout, infer_layout
from .links import nic_anomalies, slow_groups
from .patterns import K_KERNEL, Patterns, build_patterns
from .peers import Cell, abnormal_cells, category_of, role_ratio
from .summarise import digest_window
from .windows import JobWindow

MIN_STEPS = 3            # fewer steps in a window cannot separate a fault from a spike
RANK_MATERIAL = 0.015    # a rank's significant excesses must add up to >= 1.5% of the step
VICTIM_MARGIN = 0.005    # victims wait >= 0.5% of a step longer than the culprit


def detect_window(window: JobWindow, detected_at_ns: int = 0) -> list[Verdict]:
    """Summarise a raw job window, then detect: the batch path in one call."""
    return detect(digest_window(window), window.meta, detected_at_ns)


def detect(d: WindowDigest, meta: JobRecord | None = None, detected_at_ns: int = 0,
           history: JobHistory | None = None) -> list[Verdict]:
    """Analyse one job window from its (merged) digest; ``detected_at_ns`` comes from the caller.

    ``history`` (the job's earlier windows) is read, never modified: use
    :func:`detect_step` to also get the updated history.
    """
    return detect_step(d, meta, history, detected_at_ns)[0]


def detect_step(d: WindowDigest, meta: JobRecord | None, history: JobHistory | None,
                detected_at_ns: int = 0) -> tuple[list[Verdict], JobHistory]:
    """One window of a job: verdicts, and the job's history including this window."""
    history = history if history is not None else JobHistory(job=d.job)
    layout = infer_layout(d, meta)
    findings: list[Finding] = []
    p = build_patterns(d) if d.ranks.rank else None
    step_ns = float(np.nanmedian(p.step_time_ns)) if p is not None and p.ranks.size else float("nan")
    findings += hang_findings(d, step_ns, layout.rank_node)
    enough = p is not None and np.median(p.steps) >= MIN_STEPS and step_ns > 0
    if enough:
        counters = from_digest(d)
        coll = collective_stats(d, p.ranks, layout.rank_node)
        anomalies = nic_anomalies(counters)
        findings += rank_findings(p, layout, counters, coll, step_ns)
        findings += stage_findings(p, layout, counters, step_ns)
        findings += link_findings(p, layout, counters, coll, step_ns, anomalies)
        findings += expected_findings(p, layout, counters, coll, anomalies, step_ns)
        findings += regression_findings(p, history, step_ns)
        _assign_victims(findings, p, coll, step_ns)
    findings = _one_per_culprit(findings)
    streak = _stabilise(findings, d.job, history)
    regressed = {f.fn for f in findings if f.component == "software"}
    new_history = with_window(history, p if enough else None, d.start_ns, streak, regressed)
    return [to_verdict(f, d.job, d.start_ns, d.end_ns, detected_at_ns) for f in findings], new_history


def _one_per_culprit(findings: list[Finding]) -> list[Finding]:
    """Several tests may reach the same conclusion: keep the most confident per culprit and cause."""
    best: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.kind, f.component, f.scope, f.node, f.rank)
        if key not in best or f.confidence > best[key].confidence:
            best[key] = f
    return list(best.values())


PERSIST_WINDOWS = 2      # a finding must be seen in this many consecutive windows ...
OVERWHELMING = 0.9       # ... unless a single window is this sure
UNCONFIRMED_CAP = 0.45   # below the alarm level of 0.5


def _stabilise(findings: list[Finding], job: str, history: JobHistory) -> dict[str, int]:
    """Confidence from persistence; returns the new streaks.

    Unconfirmed findings (first window) stay below the alarm level unless
    overwhelming; each further consecutive window counts as independent
    evidence (1 - (1 - c)^n, up to three windows), so a moderate but steady
    problem becomes an alarm while a one-off never does.
    """
    streak: dict[str, int] = {}
    for f in findings:
        iid = incident_id(finding_key(job, f.kind, f.component, f.scope, f.node, f.rank, f.gpu, f.fn))
        n = history.streak.get(iid, 0) + 1
        streak[iid] = n
        f.evidence["persistence"] = {"consecutive_windows": n}
        if f.kind == "hang":
            continue
        if n < PERSIST_WINDOWS and f.confidence < OVERWHELMING:
            f.confidence = min(f.confidence, UNCONFIRMED_CAP)
        elif n >= PERSIST_WINDOWS:
            f.confidence = round(float(min(0.99, 1.0 - (1.0 - f.confidence) ** min(n, 3))), 3)
    return streak


# --- compute, copy, loader and host functions: the peer test -----------------

def rank_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                  step_ns: float) -> list[Finding]:
    roles = layout.roles(p.ranks)
    role_of = np.zeros(p.ranks.size, dtype=np.int64)
    for s, members in roles.items():
        role_of[members] = s
    by_slot: dict[int, list[Cell]] = defaultdict(list)
    for c in abnormal_cells(p, roles):
        by_slot[c.slot].append(c)
    waits = coll.wait_per_step
    typical_wait = float(np.median(waits)) if waits.size else 0.0
    per_rank: list[Finding] = []
    for slot, cells in by_slot.items():
        excess = defaultdict(float)
        for c in cells:
            excess[category_of(int(p.fn_kinds[c.fn]))] += c.excess
        total = sum(excess.values())
        if total < RANK_MATERIAL * step_ns:
            continue
        # A straggler makes others wait and waits least itself; a rank that waits
        # as long as everyone else delayed nobody (its extra work overlapped).
        if typical_wait > VICTIM_MARGIN * step_ns and waits[slot] >= typical_wait:
            continue
        cat = max(excess, key=excess.get)
        mine = [c for c in cells if category_of(int(p.fn_kinds[c.fn])) == cat]
        rank = int(p.ranks[slot])
        node = layout.rank_node.get(rank, "")
        members = roles[int(role_of[slot])]
        peers = [int(p.ranks[m]) for m in members if m != slot]
        top = max(mine, key=lambda c: c.excess)
        slowdown = sum(c.value for c in mine) / max(sum(c.peer_median for c in mine), 1.0)
        score = max(c.z for c in mine)
        evidence = {
            p.fn_names[c.fn]: {"culprit_ns_per_step": round(c.value), "peer_median_ns_per_step": round(c.peer_median),
                               "ratio": round(c.ratio, 3), "robust_z": round(c.z, 2)}
            for c in sorted(mine, key=lambda c: -c.excess)[:5]
        }
        evidence["excess_share_of_step"] = {"culprit": round(total / step_ns, 4)}
        if cat == "kernel":
            kernel_fns = np.flatnonzero(p.fn_kinds == K_KERNEL)
            compute = np.array([f for f in kernel_fns if attr.is_compute_bound(p.fn_names[f])], dtype=np.int64)
            mem_excess = sum(c.excess for c in mine if not attr.is_compute_bound(p.fn_names[c.fn]))
            component, why = attr.kernel_component(
                counters, rank, mem_excess / max(excess[cat], 1.0),
                role_ratio(p, members, compute, slot) if compute.size else None)
            evidence.update(attr.gpu_evidence(counters, rank, peers))
            what = "kernels"
        elif cat == "memcpy":
            component, why = "pcie", attr.pcie_reason(counters, rank)
            evidence.update({k: v for k, v in attr.gpu_evidence(counters, rank, peers).items() if "pcie" in k})
            what = "memory copies"
        elif cat == "loader":
            component, why = attr.loader_component(counters, node)
            what = "data loading"
        else:
            component, why = attr.host_component(counters, node)
            what = "host functions"
        if node in counters.host:
            evidence["host"] = {k: round(v, 2) for k, v in counters.host[node].items() if np.isfinite(v)}
        per_rank.append(Finding(
            kind="slow", component=component, scope="rank", node=node, rank=rank,
            gpu=counters.gpu_index.get(rank, -1), fn=p.fn_names[top.fn], slowdown=round(float(slowdown), 4),
            score=round(float(score), 3), confidence=confidence_of(slowdown, score, total / step_ns),
            peers=peers, culprits=[rank], evidence=evidence,
            summary=f"{why}; its {what} run {slowdown:.2f}x slower than {len(peers)} peers",
        ))
    return _merge_nodes(per_rank, layout, p)


def _merge_nodes(findings: list[Finding], layout: Layout, p: Patterns) -> list[Finding]:
    """Every rank of a node with the same component becomes one node-scope finding."""
    groups: dict[tuple[str, str], list[Finding]] = defaultdict(list)
    for f in findings:
        groups[(f.node, f.component)].append(f)
    out: list[Finding] = []
    for (node, component), fs in groups.items():
        node_ranks = layout.node_ranks(node, p.ranks)
        if node and len(node_ranks) >= 2 and len(fs) == len(node_ranks):
            best = max(fs, key=lambda f: f.score)
            culprits = sorted(f.rank for f in fs)
            peers = sorted(set().union(*[set(f.peers) for f in fs]) - set(culprits))
            out.append(Finding(
                kind="slow", component=component, scope="node", node=node, rank=-1, gpu=-1, fn=best.fn,
                slowdown=round(float(np.median([f.slowdown for f in fs])), 4),
                score=round(float(min(f.score for f in fs)), 3),
                confidence=round(float(np.median([f.confidence for f in fs])), 3),
                peers=peers, culprits=culprits,
                evidence={**best.evidence, "ranks_affected": {"culprit": culprits}},
                summary=best.summary.replace("its ", f"all {len(culprits)} ranks' ", 1),
            ))
        else:
            out.extend(fs)
    return out


# --- communicators: slow links ----------------------------------------------

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


# --- victims -------------------------------------------------------------------

def _assign_victims(findings: list[Finding], p: Patterns, coll: CollectiveStats, step_ns: float) -> None:
    """Victims: ranks outside the culprit set that wait longer in collectives than the culprits."""
    waits = coll.wait_per_step
    for f in findings:
        if f.kind == "hang" or not f.culprits:
            continue
        slots = np.searchsorted(p.ranks, [r for r in f.culprits if r in set(p.ranks.tolist())])
        if slots.size == 0:
            continue
        threshold = float(np.max(waits[slots])) + VICTIM_MARGIN * step_ns
        culprit_set = set(f.culprits)
        f.victims = [int(r) for r, w in zip(p.ranks, waits) if int(r) not in culprit_set and w > threshold]
        if f.victims and "collective_wait_ns_per_step" not in f.evidence:
            f.evidence["collective_wait_ns_per_step"] = {
                "culprit": round(float(np.median(waits[slots]))),
                "victim_median": round(float(np.median([w for r, w in zip(p.ranks, waits) if int(r) in set(f.victims)]))),
            }
        if f.victims and f.scope != "job":
            f.summary += f"; {len(f.victims)} ranks wait for it in collectives"


# --- contract verdicts ----------------------------------------------------------

def _plain(evidence: dict) -> dict:
    """Evidence as plain JSON-able Python (numpy scalars become floats/ints; NaN stays NaN)."""
    return msgspec.to_builtins(evidence, enc_hook=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))


def to_verdict(f: Finding, job: str, start_ns: int, end_ns: int, detected_at_ns: int) -> Verdict:
    key = finding_key(job, f.kind, f.component, f.scope, f.node, f.rank, f.gpu, f.fn)
    where = (f"rank {f.rank} on {f.node or '?'}" if f.scope == "rank"
             else f"node {f.node}" if f.scope == "node" else f"job {job}")
    return Verdict(
        verdict_id=verdict_id(start_ns, end_ns, key), job=job,
        window_start_ns=start_ns, window_end_ns=end_ns, detected_at_ns=int(detected_at_ns),
        kind=f.kind, component=f.component, scope=f.scope,  # type: ignore[arg-type]
        node=f.node if f.scope != "job" else "", rank=f.rank if f.scope == "rank" else -1,
        gpu=f.gpu if f.scope == "rank" else -1, fn=f.fn,
        slowdown=float(max(1.0, f.slowdown)), score=float(f.score), confidence=float(f.confidence),
        peers=sorted(int(r) for r in f.peers), victims=sorted(int(r) for r in f.victims),
        evidence=_plain(f.evidence), summary=f"{where}: {f.summary}", incident_id=incident_id(key),
    )
