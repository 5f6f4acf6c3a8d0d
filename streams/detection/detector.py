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
from typing import Any

import msgspec

import numpy as np

from eroica.models.digest import INTERIOR, WindowDigest
from eroica.models.records import UNTRACED_FN, JobRecord
from eroica.models.verdict import Verdict, finding_key, incident_id, verdict_id

from . import attribution as attr
from .collectives import CollectiveStats, collective_stats
from .cost import ROUND, finding_costs, lost_gpu_hours_per_hour, lost_share, window_cost
from .counters import CounterSummary, from_digest
from .findings import Finding, confidence_of
from .hang import hang_findings
from .bus_reference import best_bus_Bps, inter_node_groups, remember_bus
from .expected import MIN_COLL_BYTES, PAUSE_WINDOWS, bus_bandwidth, expected_findings, pause_findings, transport_findings
from .history import JobHistory
from .regression import regression_findings, shift_findings, with_window
from .stages import stage_findings
from .steps import assemble_with_arrays
from .layout import Layout, infer_layout
from .link_findings import link_findings
from .links import nic_anomalies
from .patterns import K_KERNEL, K_MEMCPY, JobArrays, Patterns, build_patterns
from .ports import classify
from .peers import (Cell, abnormal_cells, category_of, host_category_cells, node_cells, role_ratio,
                    stage_agnostic_cells)
from .robust import robust_z
from .summarise import digest_window
from .windows import JobWindow

MIN_STEPS = 3            # fewer steps in a window cannot separate a fault from a spike
RANK_MATERIAL = 0.015    # a rank's significant excesses must add up to >= 1.5% of the step
VICTIM_MARGIN = 0.005    # victims wait >= 0.5% of a step longer than the culprit
# A straggler paces the others: it waits less in collectives than the rest of its role,
# by more than the role's ordinary spread of waiting. Lateness (the role's median wait
# less the rank's, median over steps) must stand LATE_Z robust sigmas above the other
# ranks' lateness: one-sided P(z >= 3) = 0.13% under Gaussian noise, and the candidate
# already passed the peer test's z >= 5 on its own functions, so this only asks the
# waits to confirm what the functions say. Without it, a job-wide problem whose size
# varies per rank and step (a loader whose delay is drawn per batch) makes whichever
# rank drew long delays in two of three steps look like a straggler (measured: such
# ranks' lateness z 0-3, real stragglers' 5-90 on the tuning seeds).
LATE_Z = 3.0
# ... judged only against at least this many other ranks: the spread (MAD) of fewer values is
# set by one noisy peer (of three, the middle absolute deviation), and the trap it guards
# against is a multiple-comparison one that grows with the ranks (the likeliest of many
# noisy ranks to draw long delays twice); a 4-rank job keeps the plain "waits less" test.
MIN_LATENESS_PEERS = 8


def detect_window(window: JobWindow, detected_at_ns: int = 0) -> list[Verdict]:
    """Summarise a raw job window, then detect: the batch path in one call."""
    return detect(digest_window(window), window.meta, detected_at_ns)


def detect(d: WindowDigest, meta: JobRecord | None = None, detected_at_ns: int = 0,
           history: JobHistory | None = None) -> list[Verdict]:
    """Analyse one (merged) digest as a whole job window; ``detected_at_ns`` comes from the caller.

    ``history`` (the job's earlier windows) is read, never modified: use
    :func:`detect_step` to feed time windows in order and get the updated history.
    """
    job_window, _, arrays = assemble_with_arrays([d], None, final=True)
    assert job_window is not None
    return analyse_job_window(job_window, meta, history or JobHistory(job=d.job), detected_at_ns, arrays)[0]


def detect_step(d: WindowDigest, meta: JobRecord | None, history: JobHistory | None,
                detected_at_ns: int = 0) -> tuple[list[Verdict], JobHistory]:
    """One time window of a job in: verdicts (maybe none yet), and the job's history after it.

    The time window joins the job's pending ones; once they hold enough whole
    steps (:mod:`.steps`), the job window they make is analysed; at the end
    of a job's input :func:`flush_job` analyses what still waits.
    """
    history = history if history is not None else JobHistory(job=d.job)
    pending = [*history.pending, d]
    job_window, carry, arrays = assemble_with_arrays(pending, history.carry)
    if job_window is None:
        return [], msgspec.structs.replace(history, pending=pending)
    verdicts, new_history = analyse_job_window(job_window, meta, history, detected_at_ns, arrays)
    return verdicts, msgspec.structs.replace(new_history, pending=[], carry=carry)


def flush_job(meta: JobRecord | None, history: JobHistory, detected_at_ns: int = 0) -> tuple[list[Verdict], JobHistory]:
    """End of a job's input: analyse whatever is still pending."""
    if not history.pending:
        return [], history
    job_window, _, arrays = assemble_with_arrays(history.pending, history.carry, final=True)
    assert job_window is not None
    verdicts, new_history = analyse_job_window(job_window, meta, history, detected_at_ns, arrays)
    return verdicts, msgspec.structs.replace(new_history, pending=[], carry=None)


def analyse_job_window(d: WindowDigest, meta: JobRecord | None, history: JobHistory,
                       detected_at_ns: int = 0, arrays: JobArrays | None = None) -> tuple[list[Verdict], JobHistory]:
    """One job window of whole steps: verdicts, and the job's history including it.

    ``arrays``: ``d``'s columns as far as its assembly converted them (the rest are converted
    here, once, for every test that reads them).
    """
    layout = infer_layout(d, meta)
    findings: list[Finding] = []
    arrays = JobArrays.of(d, arrays)
    p = build_patterns(d, arrays) if len(d.ranks) else None
    step_ns = float(np.nanmedian(p.step_time_ns)) if p is not None and p.ranks.size else float("nan")
    findings += hang_findings(d, step_ns, layout.rank_node)
    enough = p is not None and bool(np.median(p.steps) >= MIN_STEPS) and step_ns > 0
    if p is not None and enough:
        counters = attr.with_model_power_limits(_canonical(from_digest(d)), layout.rank_node)
        coll = collective_stats(d, p.ranks, layout.rank_node, arrays)
        ports = classify(counters)
        anomalies = nic_anomalies(counters, ports)
        findings += rank_findings(p, layout, counters, coll, step_ns)
        findings += stage_findings(p, layout, counters, step_ns)
        findings += link_findings(p, layout, counters, coll, step_ns, anomalies, ports)
        fabric = inter_node_groups(coll, MIN_COLL_BYTES)
        findings += expected_findings(p, layout, counters, coll, anomalies, step_ns, ports,
                                      best_bus=best_bus_Bps(history.bus_reference, fabric))
        paused, pause_now = pause_findings(p, step_ns, history.pauses)
        findings += paused
        found = regression_findings(p, history, step_ns)
        findings += found + shift_findings(p, step_ns, {f.fn for f in found})
        _assign_victims(findings, p, coll, step_ns)
        findings = _drop_explained(findings, p, coll)
    elif p is not None and step_ns > 0 and bool(np.median(p.steps) >= 1):
        # fewer whole steps than a comparison needs (steps past the stall bound, the end of input)
        counters = attr.with_model_power_limits(_canonical(from_digest(d)), layout.rank_node)
        coll = collective_stats(d, p.ranks, layout.rank_node, arrays)
        ports = classify(counters)
        findings += transport_findings(p, layout, counters, coll, nic_anomalies(counters, ports), ports,
                                       best_bus=best_bus_Bps(history.bus_reference, inter_node_groups(coll, MIN_COLL_BYTES)))
    findings = _one_per_culprit(findings)
    lo = _first_step(d)
    first_step = history.first_step if history.first_step >= 0 else (lo if lo is not None else -1)
    warm = max(0, first_step + WARMUP_STEPS - lo) if lo is not None and first_step >= 0 else 0
    window_steps = float(np.median(p.steps)) if p is not None and p.ranks.size else 0.0
    warmup = warm > 0 and window_steps - warm < MIN_STEPS
    steps_of = {i: evidence_steps(f, _culprit_steps(f, p, layout), warm) for i, f in enumerate(findings)} \
        if p is not None and p.ranks.size else {}
    streak, streak_steps = _stabilise(findings, d.job, history, warmup, steps_of)
    regressed = {f.fn for f in findings if f.component == "software"}
    # warm-up windows do enter the regression reference: it is a minimum of low
    # quantiles, which slower warm-up steps can only raise (never a false regression)
    new_history = with_window(history, p if enough else None, d.start_ns, streak, regressed)
    new_history = msgspec.structs.replace(new_history, first_step=first_step, streak_steps=streak_steps)
    if p is not None and enough:
        new_history = msgspec.structs.replace(
            new_history, pauses=[*history.pauses, pause_now][-(PAUSE_WINDOWS - 1):],
            bus_reference=remember_bus(history.bus_reference, fabric, {g.name: bus_bandwidth(g) for g in fabric}))
    cost = window_cost(d, p.ranks, layout.work_groups(p.ranks), arrays=arrays) if p is not None and enough else None
    world = meta.world_size if meta is not None and meta.world_size else 0
    prices = finding_costs(cost, findings, world)
    prices, last_cost = _priced_before(findings, prices, d.job, history.last_cost, streak, world, d.start_ns)
    new_history = msgspec.structs.replace(new_history, last_cost=last_cost)
    verdicts = [to_verdict(f, d.job, d.start_ns, d.end_ns, detected_at_ns, c) for f, c in zip(findings, prices)]
    return verdicts, new_history


def _priced_before(findings: list[Finding], prices: list[dict[str, Any]], job: str,
                   last: dict[str, list[float]], streak: dict[str, int], world: int,
                   start_ns: int) -> tuple[list[dict[str, Any]], dict[str, list[float]]]:
    """Prices with a finding this window cannot price given its incident's last priced window's cost.

    A window of too few complete steps (the job's last, flushed at its end) has no waits to price
    from; the incident it continues was priced one window earlier, and that is the best measure of
    it there is (its evidence says so: ``cost_from_window_ns``). Kept per incident while it lasts
    (``streak``): the history stays bounded by the open incidents.
    """
    out, kept = [], {}
    for f, c in zip(findings, prices):
        inc = _streak_key(job, f)
        if c.get("cost") is not None:
            kept[inc] = [float(c["cost"]), float(start_ns)]
        elif f.kind == "slow" and inc in last:
            s_x, at = last[inc]
            c = {**c, "cost": s_x, "gpu_hours_lost_per_hour": round(lost_gpu_hours_per_hour(world, s_x), ROUND)
                 if world else None}
            f.evidence["cost_from_window_ns"] = int(at)
            kept[inc] = last[inc]
        out.append(c)
    for inc, v in last.items():
        if inc in streak and inc not in kept:
            kept[inc] = v
    return out, kept


EXPLAINS_SHARE = 0.5  # a culprit that half the job waits for sets the pace of the whole job


def _drop_explained(findings: list[Finding], p: Patterns, coll: CollectiveStats | None = None) -> list[Finding]:
    """Job-wide host symptoms that a named cause already explains are not a second finding.

    Ranks waiting for a straggler (or for collectives slowed by a misconfigured
    NCCL) sit idle in their outer Python frames: the job-wide host-Python share
    and the history of those enclosing frames rise with it. With such a cause
    named in the same window they are its symptoms (culprit, not victims).
    Kernel and copy regressions are the GPU's own work and always stay.
    """
    paced = _paced_ranks(findings, coll)
    findings = [f for f in findings if not _straggler_distorted(f, paced)]
    # One rank's odd step in a function where the job's host pauses land (GC on varying
    # ranks, expected.pause_findings) is one of those pauses, not a straggler of its own:
    # the peer test sees whichever rank paused in the window, a different one each time.
    paused = _pause_functions(findings)
    findings = [f for f in findings if not (f.scope == "rank" and f.component == "python" and not f.steady
                                            and f.fn in paused)]
    pace_set = any(f.kind == "slow" and f.scope in ("rank", "node") and len(f.victims) >= EXPLAINS_SHARE * p.ranks.size
                   for f in findings) or any(f.component == "config" for f in findings)
    if not pace_set:
        return findings
    kind_of = dict(zip(p.fn_names, p.fn_kinds.tolist()))
    own_work = (K_KERNEL, K_MEMCPY)
    return [f for f in findings if not (
        f.scope == "job" and ((f.component == "python" and "python_beta" in f.evidence)
                              or (f.component == "software" and kind_of.get(f.fn) not in own_work)))]


LINK_COMPONENTS = ("nic", "network", "nvlink", "pcie")


def _pause_functions(findings: list[Finding]) -> set[str]:
    """The host functions that a job-wide pause finding (expected.pause_findings) saw pauses in."""
    out: set[str] = set()
    for f in findings:
        ev = f.evidence.get(f.fn) if f.scope == "job" and f.component == "python" else None
        if isinstance(ev, dict) and "ranks_pausing" in ev:
            out |= set(ev.get("functions") or ())
    return out


def _paced_ranks(findings: list[Finding], coll: CollectiveStats | None) -> set[int]:
    """The culprits of the window's compute findings and the ranks they pace through intra-node communicators.

    A straggler's tensor-parallel mates wait for it in every TP collective, so
    they reach the next data-parallel collective at its pace: in each DP
    communicator they arrive late just as it would.
    """
    culprits = {r for g in findings if g.kind == "slow" and g.scope in ("rank", "node")
                and g.component not in LINK_COMPONENTS for r in g.culprits}
    paced = set(culprits)
    for g in (coll.groups if coll is not None else []):
        members = {int(r) for r in g.ranks}
        if g.intra_node and not g.p2p and members & culprits:
            paced |= members
    return paced


def _straggler_distorted(f: Finding, paced: set[int]) -> bool:
    """A fabric finding resting only on communicators that each hold a straggler's pace, with no counter symptom.

    A communicator's transfer is estimated per step as the least collective
    time of any member (collectives.py): right when one member waits least in
    every call. With a member paced by a straggler (``paced``:
    :func:`_paced_ranks`) and another late for its own reasons in other calls
    (rank 0's extra work at the start of a step), and many calls a step (FSDP
    gathers and scatters every block, MoE layers jitter), the member that
    arrives last changes from call to call, every member waits in some of
    them, and the least per-step sum overstates the transfer: such a
    communicator looks 1.3-1.9x slower than its family with no link at fault
    (seen on tuning seed 20: an MoE + FSDP job, one throttled GPU or one
    overloaded rank, a job-wide ``network`` verdict beside the right one). So
    a ``network`` finding whose every slow communicator holds a paced rank,
    and that no NIC counter supports (CNP / xmit-wait, errors, link speed:
    those carry an ``anomaly`` in the evidence), is the straggler's shadow.
    With a straggler in the window, fabric faults must show in the counters
    to be named (a real one does: congestion marks, retransmits).
    """
    if f.component != "network" or f.scope != "job":
        return False
    if any(isinstance(v, dict) and "anomaly" in v for v in f.evidence.values()):
        return False
    groups = f.evidence.get("slow_communicators") or {}
    return bool(groups) and bool(paced) and all(paced & set(members) for members in groups.values())


def _canonical(c: CounterSummary) -> CounterSummary:
    """Counters keyed in sorted order: digests merge in arrival order, ties must not follow it."""
    return CounterSummary(gpu=dict(sorted(c.gpu.items())), gpu_index=dict(sorted(c.gpu_index.items())),
                          nic=dict(sorted(c.nic.items())), host=dict(sorted(c.host.items())))


def _one_per_culprit(findings: list[Finding]) -> list[Finding]:
    """Several tests may reach the same conclusion: keep the most confident per culprit and cause.

    Ties go to a stable key (score, then function name), never to the order the tests ran in.
    """
    best: dict[tuple[str, str, str, str, int], Finding] = {}
    for f in findings:
        key = (f.kind, f.component, f.scope, f.node, f.rank)
        if key not in best or (f.confidence, f.score, f.fn) > (best[key].confidence, best[key].score, best[key].fn):
            best[key] = f
    return sorted(best.values(), key=lambda f: (f.kind, f.component, f.scope, f.node, f.rank, f.fn))


PERSIST_WINDOWS = 2      # a finding must be confirmed this many times (windows, or runs of SIGN_STEPS steps) ...
OVERWHELMING = 0.9       # ... unless a single window is this sure
UNCONFIRMED_CAP = 0.45   # below the alarm level of 0.5
STEADY_SHARE = 0.5       # share of a rank's excess its best step must still pay to be a steady level
# A fault that begins inside a window shows in that window's later steps only: its best step is
# healthy, so it is not steady. When the median step pays the level it lasted most of the window;
# a median of at least 5 steps needs 3 odd steps to move, where odd steps (a GC pause, a kernel
# spike, a checkpoint) come one or two at a time and the peer test needs them on the same rank and
# function. Such a finding is a level shift inside the window (a change point): the steps after it
# are at least half the window's, and each of them pays the level.
MOST_STEPS_MIN = 5
# Evidence in steps, not windows: a one-sided sign test. Under the null hypothesis that the culprit
# is one of its peers (exchangeable with them), it is slower than the peers' median in a step with
# probability 1/2, independently of the other steps, so slower in k of k steps with probability
# 2^-k. A steady finding (its best step, the 5% low quantile, still pays half the excess) is
# slower in about every step it holds; a level shift since an onset inside the window
# (``most_steps``) in every step since that onset, at least half the window's. SIGN_STEPS = 7
# steps give 2^-7 < 1%: one such run of steps is one confirmation, as one window was, so a short
# trace (one window of 120 fast steps) or a fault in its onset window is confirmed by its steps,
# while a window of three 10 s steps still needs the next window. One odd step is k = 1 (never
# steady, never most steps): it never confirms anything.
SIGN_STEPS = 7


# A job's first steps are its warm-up: compilation, autotuning, allocator growth and
# NCCL communicator set-up make them slower than any later step, on every rank but
# not alike. Five steps cover what the field reports (1-5 iterations). They are
# counted from the job's first step seen (the data's, not a window's): a window is
# judged on its steps after them, and one holding fewer than MIN_STEPS of those
# neither alarms nor starts a streak (hangs excepted).
WARMUP_STEPS = 5


# A node's ranks read their data through its own storage, page cache and loader processes: when
# those are slow, which of its ranks stalls longest in a window is chance (an independent
# generator's slow storage named ranks 6, 2, 7, 1 of one node in consecutive windows, each
# held unconfirmed at 0.45). The persistence of data loading therefore counts the node's windows.
NODE_OBSERVATIONS = frozenset({"data loading"})


def _streak_key(job: str, f: Finding) -> str:
    """The incident a finding's persistence counts: its culprit, function and observation (a node's, see above)."""
    obs = attr.observation(f.component)
    if f.scope == "rank" and f.node and obs in NODE_OBSERVATIONS:
        return str(incident_id(finding_key(job, f.kind, obs, "node", f.node, -1, -1, "")))
    return str(incident_id(finding_key(job, f.kind, obs, f.scope, f.node, f.rank, f.gpu, f.fn)))


def evidence_steps(f: Finding, steps: float, warm: int) -> int:
    """How many of the window's steps after the warm-up show the finding, for the sign test (SIGN_STEPS).

    ``steps``: the window's steps of the finding's culprit (its rank's, or the median
    over the ranks it covers); ``warm``: the window's warm-up steps. A steady level is
    paid in every step; a level shift (``most_steps``) in every step since its onset,
    at least half of them; warm-up steps are left out of both (they come first, so an
    onset-window's later half is counted only where it lies past them).
    """
    if not f.step_evidence:
        return 0
    if f.steady:
        return max(0, int(steps) - warm)
    if f.most_steps:
        return max(0, -(-int(steps) // 2) - warm)
    return 0


def _stabilise(findings: list[Finding], job: str, history: JobHistory, warmup: bool = False,
               steps_of: dict[int, int] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Confidence from evidence: the windows and the steps that show each finding; returns the new streaks.

    A streak belongs to the finding's culprit, function and observation
    (:func:`.attribution.observation`): a counter that crosses its threshold
    between windows changes the component named, not the evidence counted.
    ``steps_of``: each finding's evidence steps (by its index in ``findings``:
    :func:`evidence_steps`), summed over the consecutive windows that showed it.

    A finding is confirmed once per consecutive window that showed it and once
    per SIGN_STEPS consecutive steps that paid it (the sign test above),
    whichever is more. Unconfirmed findings (one confirmation) stay below the
    alarm level unless overwhelming and paid in most steps; each confirmation
    counts as independent evidence (1 - (1 - c)^n, up to three), so a moderate
    but steady problem becomes an alarm while a one-off never does. A window
    that holds too few steps after the warm-up (``warmup``) neither alarms
    nor starts a streak (hangs excepted).
    """
    streak: dict[str, int] = {}
    streak_steps: dict[str, int] = {}
    for i, f in enumerate(findings):
        iid = _streak_key(job, f)
        if f.kind == "hang":
            streak[iid] = history.streak.get(iid, 0) + 1
            f.evidence["persistence"] = {"consecutive_windows": streak[iid]}
            continue
        if warmup:
            f.confidence = min(f.confidence, UNCONFIRMED_CAP)
            f.evidence["persistence"] = {"consecutive_windows": 0, "warm_up": True}
            continue
        n = history.streak.get(iid, 0) + 1
        k = history.streak_steps.get(iid, 0) + (steps_of or {}).get(i, 0)  # written beside streak only
        streak[iid] = n
        streak_steps[iid] = k
        confirmations = max(n, k // SIGN_STEPS)
        f.evidence["persistence"] = {"consecutive_windows": n, "steps_shown": k}
        if confirmations < PERSIST_WINDOWS and (f.confidence < OVERWHELMING or not (f.steady or f.most_steps)):
            f.confidence = min(f.confidence, UNCONFIRMED_CAP)
        elif confirmations >= PERSIST_WINDOWS:
            f.confidence = round(float(min(0.99, 1.0 - (1.0 - f.confidence) ** min(confirmations, 3))), 3)
    return streak, streak_steps


def _culprit_steps(f: Finding, p: Patterns, layout: Layout) -> float:
    """The window's steps of a finding's culprit: its rank's, else the median over the ranks it covers."""
    if f.scope == "rank" and f.rank >= 0:
        slot = p.slot(f.rank)
        if slot < p.ranks.size and int(p.ranks[slot]) == f.rank:
            return float(p.steps[slot])
    members = [p.slot(r) for r in f.culprits] if f.culprits else []
    if f.scope == "node" and not members:
        members = [p.slot(r) for r, n in layout.rank_node.items() if n == f.node]
    members = [m for m in members if m < p.ranks.size]
    return float(np.median(p.steps[members])) if members else float(np.median(p.steps))


def _first_step(d: WindowDigest) -> int | None:
    """The smallest step a job window holds (every rank's first step in a time window is an edge row)."""
    edges = d.ranks.step[d.ranks.step != INTERIOR]
    return int(edges.min()) if edges.size else None


# --- compute, copy, loader and host functions: the peer test -----------------

def rank_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                  step_ns: float) -> list[Finding]:
    # Kernels are compared within GPU class (a slower model is no straggler); host,
    # loader and copy functions run on the host and compare across classes, or a
    # node whose GPUs are the only ones of their model could never be compared.
    roles = layout.peer_groups(p.ranks)
    gpu_roles = _by_gpu_class(roles, p, counters)
    role_of = np.zeros(p.ranks.size, dtype=np.int64)
    for s, members in roles.items():
        role_of[members] = s
    gpu_role_of = np.zeros(p.ranks.size, dtype=np.int64)
    for s, members in gpu_roles.items():
        gpu_role_of[members] = s
    by_slot: dict[int, list[Cell]] = defaultdict(list)
    seen: set[tuple[int, int]] = set()
    for c in (abnormal_cells(p, gpu_roles, kernels=True) + abnormal_cells(p, roles, kernels=False)
              + node_cells(p, gpu_roles, layout.rank_node, kernels=True)
              + node_cells(p, roles, layout.rank_node, kernels=False)
              + host_category_cells(p, roles) + stage_agnostic_cells(p, roles)):
        if (c.slot, c.fn) not in seen:  # the plain peer test's cell first, where both see one
            seen.add((c.slot, c.fn))
            by_slot[c.slot].append(c)
    waits = coll.wait_per_step
    # A loader stalls a step now and then (patterns: judged on its mean per step); the others
    # wait for it in those steps only, so its lateness is read from the mean waits too.
    stall_waits = coll.mean_waits
    if not layout.rank_stage and any(g.p2p for g in coll.groups):
        # A pipeline whose stages are too small to read (layout.MIN_INFERRED_STAGE) compares its
        # ranks across stages: how long a rank waits in send / recv is set by its place in the
        # pipeline (the last stage waits for the fill), not by who paces whom, so who waits least
        # is read from the collectives every member joins at once.
        waits = stall_waits = coll.sync_waits
    per_rank: list[Finding] = []
    for slot, cells in by_slot.items():
        excess: dict[str, float] = defaultdict(float)
        for c in cells:
            excess[category_of(int(p.fn_kinds[c.fn]))] += c.excess
        total = sum(excess.values())
        if total < RANK_MATERIAL * step_ns:
            continue
        cat = max(excess, key=lambda k: excess[k])
        # A straggler makes others wait and waits least itself; a rank that waits
        # as long as everyone else delayed nobody (its extra work overlapped).
        w = stall_waits if cat == "loader" else waits
        typical_wait = float(np.median(w)) if w.size else 0.0
        if typical_wait > VICTIM_MARGIN * step_ns and w[slot] >= typical_wait:
            continue
        mine = [c for c in cells if category_of(int(p.fn_kinds[c.fn])) == cat]
        rank = int(p.ranks[slot])
        node = layout.rank_node.get(rank, "")
        members = gpu_roles[int(gpu_role_of[slot])] if cat == "kernel" else roles[int(role_of[slot])]
        if all(c.job_wide for c in mine):  # stage-agnostic work of a rank without role peers (peers.py)
            members = np.arange(p.ranks.size)
        if any(c.other_nodes for c in mine):  # its peers are the role's ranks on other nodes (peers.node_cells)
            members = np.array([m for m in members if m == slot or layout.rank_node.get(int(p.ranks[m])) != node],
                               dtype=members.dtype)
        peers = [int(p.ranks[m]) for m in members if m != slot]
        top = max(mine, key=lambda c: c.excess)
        # peers that spend ~nothing in these functions: the same 0.1%-of-a-step floor as the peer test
        floor = 0.001 * step_ns * len(mine)
        cost_ratio = sum(c.value for c in mine) / max(sum(c.peer_median for c in mine), floor)
        slowdown = cost_ratio
        durations = _host_durations(p, mine, members, slot) if cat == "host" else None
        if durations is not None:
            # Host frames are tested on their exclusive (critical-path) time, which on a peer
            # whose GPU covers the frame is near nothing: a ratio of those is no "x slower".
            # The verdict's slowdown is what the contract says, the duration ratio.
            slowdown = durations[0] / max(durations[1], floor)
        score = max(c.z for c in mine)
        # Half the excess still there in the rank's best step (the low quantile over
        # its steps) means every step pays it: a level, not one odd step whose cost a
        # three-step median cannot hide when another step is odd too (an evaluation).
        # A function that runs in few steps cannot show it in every step.
        # A loader's cost is its mean (stalls: patterns._STALL_KINDS), which no best step pays:
        # it is a level when the median step pays half of it (the queue runs dry in most steps).
        level = p.low_ns if cat != "loader" else (p.per_step_ns if p.median_step_ns is None else p.median_step_ns)
        steady_excess = sum(max(0.0, float(level[c.slot, c.fn]) - c.peer_median) for c in mine
                            if not p.sporadic[c.slot, c.fn] and np.isfinite(level[c.slot, c.fn]))
        steady = steady_excess >= STEADY_SHARE * sum(c.excess for c in mine)
        # The same share in the median step (per_step_ns) of enough steps: most steps pay it (MOST_STEPS_MIN).
        # A loader's steady test is already its median step's.
        most_steps = steady if cat == "loader" else bool(p.steps[slot] >= MOST_STEPS_MIN) and sum(
            max(0.0, float(p.per_step_ns[c.slot, c.fn]) - c.peer_median) for c in mine
            if not p.sporadic[c.slot, c.fn] and np.isfinite(p.per_step_ns[c.slot, c.fn])
        ) >= STEADY_SHARE * sum(c.excess for c in mine)
        evidence = {
            p.fn_names[c.fn]: {"culprit_ns_per_step": round(c.value), "peer_median_ns_per_step": round(c.peer_median),
                               "ratio": round(c.ratio, 3), "robust_z": round(c.z, 2)}
            for c in sorted(mine, key=lambda c: -c.excess)[:5]
        }
        evidence["excess_share_of_step"] = {"culprit": round(total / step_ns, 4)}
        if durations is not None:  # the functions' per-step ns above are their critical-path (exclusive) time
            evidence["duration_ns_per_step"] = {"culprit": round(durations[0]), "peer_median": round(durations[1]),
                                                "ratio": round(float(slowdown), 3)}
        if cat == "kernel":
            kernel_fns = np.flatnonzero(p.fn_kinds == K_KERNEL)
            compute = np.array([f for f in kernel_fns if attr.is_compute_bound(p.fn_names[f])], dtype=np.int64)
            mem_excess = sum(c.excess for c in mine if not attr.is_compute_bound(p.fn_names[c.fn]))
            component, why = attr.kernel_component(
                counters, rank, mem_excess / max(excess[cat], 1.0),
                role_ratio(p, members, compute, slot) if compute.size else None, peers=peers)
            evidence.update(attr.gpu_evidence(counters, rank, peers))
            what = "kernels"
        elif cat == "memcpy":
            component, why = "pcie", attr.pcie_reason(counters, rank)
            evidence.update({k: v for k, v in attr.gpu_evidence(counters, rank, peers).items() if "pcie" in k})
            what = "memory copies"
        elif cat == "loader":
            component, why = attr.loader_component(counters, node, bursty=not steady)
            what = "data loading"
        else:
            component, why = attr.host_component(counters, node)
            untraced = sum(c.excess for c in mine if p.fn_names[c.fn] == UNTRACED_FN)
            what = "time outside any traced call" if untraced >= 0.5 * excess[cat] else "host functions"
        if node in counters.host:
            evidence["host"] = {k: round(v, 2) for k, v in counters.host[node].items() if np.isfinite(v)}
        per_rank.append(Finding(
            kind="slow", component=component, scope="rank", node=node, rank=rank,
            gpu=counters.gpu_index.get(rank, -1), fn=p.fn_names[top.fn], slowdown=round(float(slowdown), 4),
            # confidence from the statistic the peer test fired on (unchanged by how it is worded)
            score=round(float(score), 3), confidence=confidence_of(cost_ratio, score, total / step_ns),
            peers=peers, culprits=[rank], evidence=evidence,
            summary=f"{why}; {_how_slower(what, slowdown, mine, len(peers), durations, floor)}", steady=steady,
            most_steps=most_steps,
        ))
    late, late_stall = _lateness(roles, waits), _lateness(roles, stall_waits)
    return [f for f in _merge_nodes(per_rank, layout, p)
            if (_paces_others(f, p, late_stall, stall_waits, step_ns) if attr.observation(f.component) == "data loading"
                else _paces_others(f, p, late, waits, step_ns))]


def _host_durations(p: Patterns, mine: list[Cell], members: np.ndarray, slot: int) -> tuple[float, float] | None:
    """(culprit, peers' median) duration per step, summed over ``mine``'s functions; None if unknown.

    A host frame's duration per step is its calls' whole (inclusive) time over the
    rank's steps: how long the code took, which is what "slower" means. The peer
    test's exclusive time is what it cost the critical path (evidence, not slowdown).
    """
    others = members[members != slot]
    if others.size == 0:
        return None
    mine_ns = peer_ns = 0.0
    for c in mine:
        per_step = p.total_ns[members, c.fn] / np.maximum(p.steps[members], 1)
        ok = np.isfinite(per_step) & (p.count[members, c.fn] > 0)
        own = per_step[members == slot]
        rest = per_step[(members != slot) & ok]
        if own.size == 0 or not ok[members == slot].all() or rest.size == 0:
            return None
        mine_ns += float(own[0])
        peer_ns += float(np.median(rest))
    return (mine_ns, peer_ns) if peer_ns > 0 else None


def _how_slower(what: str, slowdown: float, mine: list[Cell], n_peers: int,
                durations: tuple[float, float] | None, floor: float) -> str:
    """The summary's measure, with its per-step times, so a large ratio shows its small base
    (and says so where the ratio was taken against the peer test's floor instead)."""
    value, base = sum(c.value for c in mine), sum(c.peer_median for c in mine)
    run = "runs" if what.startswith("time") else "run"   # "its time ... runs", "its kernels run"
    if durations is None:
        floored = "; the ratio against a floor of 0.1% of a step" if base < floor else ""
        return (f"its {what} {run} {slowdown:.2f}x slower than {n_peers} peers "
                f"({_ms(value)} vs {_ms(base)} per step{floored})")
    floored = ", the ratio against a floor of 0.1% of a step" if durations[1] < floor else ""
    return (f"its {what} {run} {slowdown:.2f}x longer than on {n_peers} peers ({_ms(durations[0])} vs "
            f"{_ms(durations[1])} per step{floored}; {_ms(value)} vs {_ms(base)} of it on the critical path)")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.0f} ms" if ns >= 9.5e6 else f"{ns / 1e6:.1f} ms"


def _lateness(roles: dict[int, np.ndarray], waits: np.ndarray) -> np.ndarray:
    """Each rank's role median wait less its own (roles differ in how much they wait by design)."""
    late = np.zeros(waits.size)
    for members in roles.values():
        if members.size:
            late[members] = float(np.median(waits[members])) - waits[members]
    return late


def _paces_others(f: Finding, p: Patterns, late: np.ndarray, waits: np.ndarray, step_ns: float) -> bool:
    """Whether the culprits of a rank or node finding are late enough, in the waits, to pace their role.

    ``late``: each rank's lateness (:func:`_lateness`). The culprits' median lateness
    is compared with the other ranks' (median and MAD: a node's eight culprits
    must not widen the spread they are judged against), floored at 0.1% of a step
    like the peer test, so perfectly regular peers do not make any lead significant.
    A job without collective waiting (no collectives, one rank per role), or with
    fewer than :data:`MIN_LATENESS_PEERS` other ranks, keeps the finding: the
    waits cannot speak there.
    """
    if waits.size != p.ranks.size or not np.any(waits > VICTIM_MARGIN * step_ns):
        return True
    culprit = np.isin(p.ranks, np.asarray(f.culprits, dtype=np.int64))
    if not culprit.any() or culprit.all():
        return True
    rest = late[~culprit]
    if rest.size < MIN_LATENESS_PEERS:
        return True
    _, med, scale = robust_z(rest, rel_floor=0.0, abs_floor=0.001 * step_ns)
    z = (float(np.median(late[culprit])) - med) / scale
    f.evidence["lateness"] = {"culprit_ns_per_step": round(float(np.median(late[culprit]))),
                              "others_median_ns_per_step": round(med), "robust_z": round(z, 2)}
    return z >= LATE_Z


def _by_gpu_class(roles: dict[int, np.ndarray], p: Patterns, counters: CounterSummary) -> dict[int, np.ndarray]:
    """Roles split by GPU class (model / clock ceiling): a slower GPU model is no straggler.

    Mixed node types in one job must not raise alarms by themselves: ranks
    are compared only with ranks whose GPUs share their ceilings. A class too
    small for the peer test is not compared at all rather than with the others.
    """
    classes = attr.gpu_classes(counters, [int(r) for r in p.ranks])
    if len(set(classes.values())) <= 1:
        return roles
    cls = np.array([classes.get(int(r), -1) for r in p.ranks])
    out: dict[int, np.ndarray] = {}
    for _, members in sorted(roles.items()):
        for c in np.unique(cls[members]):
            out[len(out)] = members[cls[members] == c]
    return out


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
            if component == "python":
                # Every rank of one node runs the same Python code slower than the other
                # nodes do: the code is the same everywhere, so the node's host is the
                # cause (contention, CPU frequency), even where its CPU counters are
                # missing or do not read saturated.
                component = "host_cpu"
                best.summary = best.summary.replace("host-side Python code slower than on peers",
                                                    "host-side code slower on every rank of this node", 1)
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
                # A node's loaders share one input path (storage, page cache, loader processes): which of its
                # ranks runs dry in a step is chance, so one rank that stalls in most steps is the node
                # paying it in most steps. Elsewhere every rank must show the level.
                steady=(any if attr.observation(component) in NODE_OBSERVATIONS else all)(f.steady for f in fs),
                most_steps=(any if attr.observation(component) in NODE_OBSERVATIONS else all)(
                    f.steady or f.most_steps for f in fs),
            ))
        else:
            out.extend(fs)
    return out


# --- victims -------------------------------------------------------------------

def _assign_victims(findings: list[Finding], p: Patterns, coll: CollectiveStats, step_ns: float) -> None:
    """Victims: ranks outside the culprit set that wait longer in collectives than the culprits."""
    waits = coll.wait_per_step
    known = set(p.ranks.tolist())
    for f in findings:
        if f.kind == "hang" or not f.culprits:
            continue
        slots = np.searchsorted(p.ranks, [r for r in f.culprits if r in known])
        if slots.size == 0:
            continue
        threshold = float(np.max(waits[slots])) + VICTIM_MARGIN * step_ns
        # one mask over the ranks (in their order), not a Python step per rank and finding
        victim = (waits > threshold) & ~np.isin(p.ranks, np.asarray(f.culprits, dtype=np.int64))
        f.victims = p.ranks[victim].tolist()
        if f.victims and "collective_wait_ns_per_step" not in f.evidence:
            f.evidence["collective_wait_ns_per_step"] = {
                "culprit": round(float(np.median(waits[slots]))),
                "victim_median": round(float(np.median(waits[victim]))),
            }
        if f.victims and f.scope != "job":
            f.summary += f"; {len(f.victims)} ranks wait for it in collectives"


# --- contract verdicts ----------------------------------------------------------

def _plain(evidence: dict[str, Any]) -> dict[str, Any]:
    """Evidence as plain JSON-able Python (numpy scalars become floats/ints; NaN stays NaN)."""
    plain: dict[str, Any] = msgspec.to_builtins(evidence, enc_hook=lambda o: o.tolist() if hasattr(o, "tolist") else str(o))
    return plain


def to_verdict(f: Finding, job: str, start_ns: int, end_ns: int, detected_at_ns: int,
               price: dict[str, Any] | None = None) -> Verdict:  # price: finding_costs' fields (float or None)
    key = finding_key(job, f.kind, f.component, f.scope, f.node, f.rank, f.gpu, f.fn)
    where = (f"rank {f.rank} on {f.node or '?'}" if f.scope == "rank"
             else f"node {f.node}" if f.scope == "node" else f"job {job}")
    price = price or {}
    said = f.summary + (f"; costs the job {lost_share(price['cost']):.0%} of its throughput"
                        if price.get("cost") is not None else "")
    return Verdict(
        verdict_id=verdict_id(start_ns, end_ns, key), job=job,
        window_start_ns=start_ns, window_end_ns=end_ns, detected_at_ns=int(detected_at_ns),
        # Finding's fields are str, the Verdict's Literals; `unused-ignore`: Verdict is Any while mypy cannot follow `eroica.*`
        kind=f.kind, component=f.component, scope=f.scope,  # type: ignore[arg-type, unused-ignore]
        node=f.node if f.scope != "job" else "", rank=f.rank if f.scope == "rank" else -1,
        gpu=f.gpu if f.scope == "rank" else -1, fn=f.fn,
        slowdown=float(max(1.0, f.slowdown)), score=float(f.score), confidence=float(f.confidence),
        peers=sorted(int(r) for r in f.peers), victims=sorted(int(r) for r in f.victims),
        evidence=_plain(f.evidence), summary=f"{where}: {said}", incident_id=incident_id(key), **price,
    )
