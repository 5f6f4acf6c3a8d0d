"""Score verdicts against a simulator's ground truth (pure: no I/O).

A fault counts as *localised* when some alarm (a verdict at or above the
alarm confidence) has its kind and component and names its culprit: the rank
(rank scope), the node (node scope, or a rank on that node), or just the job
for job-wide causes. An alarm that names a rank or node no fault touched is a
*victim blamed*; on a healthy run every alarm is a *false alarm*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eroica.models.verdict import Verdict

ALARM_CONFIDENCE = 0.5


@dataclass
class FaultResult:
    name: str
    expected: str
    found: str
    ok: bool
    # fault to alarm: from the fault's onset to the end of the first window that alarms on it (the
    # earliest instant a live detector can emit that verdict), in seconds and in the job's steps begun
    # in that time; None when nothing alarmed on it
    alarm_s: float | None = None
    alarm_steps: int | None = None


@dataclass
class RunScore:
    faults: list[FaultResult] = field(default_factory=list)
    victims_blamed: list[str] = field(default_factory=list)
    false_alarms: list[str] = field(default_factory=list)
    alarms: int = 0


def describe(v: Verdict) -> str:
    who = f"rank {v.rank}" if v.scope == "rank" else f"{v.node}" if v.scope == "node" else "job"
    return f"{v.kind}/{v.component}@{who}"


def _expected(f: dict[str, Any]) -> str:
    who = (f"ranks {f['ranks']}" if f["scope"] == "rank" else f"nodes {f['nodes']}" if f["scope"] == "node" else "job")
    return f"{f['kind']}/{f['component']}@{who}"


def matches(v: Verdict, f: dict[str, Any], rank_nodes: list[str]) -> bool:
    if v.kind != f["kind"] or v.component != f["component"]:
        return False
    ranks, nodes = set(f.get("ranks") or []), set(f.get("nodes") or [])
    if f["scope"] == "job":
        return True
    if f["scope"] == "rank":
        if v.scope == "rank":
            return v.rank in ranks
        # a node-scope verdict is right for a rank fault only when the fault spans that node's ranks
        culprit_nodes = {rank_nodes[r] for r in ranks if r < len(rank_nodes)}
        return v.scope == "node" and v.node in culprit_nodes and (
            len(ranks) > 1 or f["component"] in ("nvlink",))
    # node scope
    return v.node in nodes


def fault_to_alarm(hits: list[Verdict], fault: dict[str, Any], truth: dict[str, Any]
                   ) -> tuple[float | None, int | None]:
    """Seconds and steps from a fault's onset to the end of the first window that alarmed on it.

    The onset is the fault's ``start_ns`` (the job's start when it has none); steps are
    those the job began after the onset and before that window's end (``step_start_ns``
    of the truth). None, None without an alarm.
    """
    if not hits:
        return None, None
    onset = int(fault.get("start_ns") or truth.get("start_ns") or 0)
    end = min(v.window_end_ns for v in hits)
    starts = [int(t) for t in truth.get("step_start_ns") or []]
    steps = sum(1 for t in starts if onset <= t < end)
    return round(max(0.0, (end - onset) / 1e9), 3), steps


def culprit_entities(truth: dict[str, Any]) -> tuple[set[int], set[str]]:
    ranks: set[int] = set()
    nodes: set[str] = set()
    rank_nodes = truth["layout"]["rank_nodes"]
    for f in truth["faults"]:
        ranks |= set(f.get("ranks") or []) | set(f.get("affected_ranks") or [])
        nodes |= set(f.get("nodes") or []) | set(f.get("affected_nodes") or [])
    nodes |= {rank_nodes[r] for r in ranks if r < len(rank_nodes)}
    ranks |= {r for r, n in enumerate(rank_nodes) if n in nodes}
    return ranks, nodes


def score_run(verdicts: list[Verdict], truth: dict[str, Any]) -> RunScore:
    alarms = [v for v in verdicts if v.confidence >= ALARM_CONFIDENCE]
    s = RunScore(alarms=len(alarms))
    rank_nodes = truth["layout"]["rank_nodes"]
    for f in truth["faults"]:
        hit = [v for v in alarms if matches(v, f, rank_nodes)]
        found = ", ".join(sorted({describe(v) for v in (hit or alarms)})) or "nothing"
        s.faults.append(FaultResult(f["name"], _expected(f), found, bool(hit), *fault_to_alarm(hit, f, truth)))
    if truth.get("healthy") or not truth["faults"]:
        s.false_alarms = sorted({describe(v) for v in alarms})
        return s
    ranks, nodes = culprit_entities(truth)
    job_components = {f["component"] for f in truth["faults"] if f["scope"] == "job"}
    for v in alarms:
        if any(matches(v, f, rank_nodes) for f in truth["faults"]):
            continue
        if v.scope == "rank" and v.rank not in ranks:
            s.victims_blamed.append(describe(v))
        elif v.scope == "node" and v.node not in nodes:
            s.victims_blamed.append(describe(v))
        elif v.scope == "job" and v.component not in job_components:
            s.false_alarms.append(describe(v))
    return s
