"""The expected-behaviour test: problems every rank shares, which peers cannot show.

Each kind of function has a range it should stay in (the paper's first test):
the data loader and host Python should hardly ever hold the critical path;
inter-node collectives should move data at a good share of the NIC's link
speed; tensor-parallel collectives inside a node should use NVLink. A job
outside the range is abnormal even when all its ranks agree. A GPU's clock
has its range too, its own ceiling: judged here for the ranks that no peer
test compares (:mod:`.clocks`).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from eroica.models.columns import OP_CODE

from .clocks import clock_findings
from .collectives import CollectiveStats, GroupStats
from .counters import CounterSummary
from .findings import Finding
from .history import PauseRecord, PauseWindow
from .layout import Layout
from .links import NicAnomaly, group_through
from .ports import PortMap, bypassed_ports, classify
from .patterns import K_COLL, K_KERNEL, K_LOADER, K_OPTIM, K_OTHER, K_PYTHON, Patterns

LOADER_BETA = 0.10        # the data loader holds >= 10% of the window on the typical rank
# Host Python holds >= 25%. The outermost step frame's exclusive time also holds every
# unexplained gap (stalls between collectives, launch gaps), which reaches 15-20% under
# bursty network faults; a loop bound by host syncs or slow Python is well above.
PYTHON_BETA = 0.25
RANK_SHARE = 0.8          # ... on at least 80% of the ranks: shared, not one rank's problem
# Shares of a rank's link capacity reached by the *bus* bandwidth of inter-node collectives
# (what each link carries: NCCL's busbw, the algorithm factor taken out), so 1.0 is the wire.
BW_CONFIG = 0.2           # below 20%: not NCCL's RDMA path (RDMA reaches 80-95%, TCP sockets 5-20%)
BW_DEGRADED = 0.8         # below 80%: slow enough to blame the fabric when it reports congestion
NIC_CONFIDENCE = 0.7      # a rail's counter anomaly under slowed transfers: a clear cause, no significance test
MIN_COLL_BYTES = 1 << 20  # ignore tiny collectives (latency-bound, e.g. a scalar all-reduce)
NVLINK_IDLE_BPS = 1e6     # NVLink counters below 1 MB/s while TP collectives run: unused ...
# ... unless the intra-node collectives themselves moved faster than any path off NVLink
# can: PCIe Gen5 x16 carries at most 64 GB/s a direction (the fastest host path NCCL
# falls back to), so a higher bus bandwidth ran over NVLink whatever its counters read.
# Seen: 101 s steps stretched ~8x by slow storage, TP collectives at 258-326 GB/s bus
# bandwidth, NVLink counters sampled between their bursts reading 0.
PCIE_MAX_BUS_BPS = 64e9
IOWAIT_HIGH_PCT = 10.0
# Congestion marks have an expected range of their own, whatever the other ports read: a
# fabric congested under every node of a job marks all its rails alike, and the peer test
# (links.nic_anomalies: "far above the quieter ports") then sees no port stand out. A RoCE
# NIC sends a CNP only for a received packet that a switch ECN-marked, and a switch marks
# only while its egress queue sits above the marking threshold (Kmin; the probability ramps
# to Pmax at Kmax); the NIC sends at most one CNP per queue pair per few microseconds, so
# CNPs count marked packets from below. Ring and tree collectives over rail-aligned links
# run each flow at most at line rate into a port of the same speed: without congestion the
# queues stay under Kmin but for microbursts (ECMP collisions), and marks are rare: both
# models of a healthy port this project has (the simulator: one CNP per 2 GB; the
# independent generator: at most 30 a second at line rate) mark ~1e-6 of the packets. One
# received packet in a thousand answered with a CNP is three orders of magnitude above
# that: queues held above the marking threshold, i.e. congestion.
CNP_PER_PACKET_MAX = 1e-3
# Packets counted at a 1024-byte RoCE MTU, the largest that fits a standard 1500-byte
# Ethernet frame (jumbo-frame fabrics run 4096 B: 4x fewer packets for the same bytes).
# Counting more packets than there were only lowers the share read: an MTU the detector
# cannot see never makes an alarm.
ROCE_MTU_MIN_B = 1024.0
# ... and marks frequent enough, during the transfers, to hold the senders' rate down: each
# CNP makes DCQCN cut a queue pair's rate once, and without another one it climbs back to
# line rate within about a millisecond (a few rate-increase periods: rpg_time_reset, 300 us
# by default on ConnectX; the DCQCN paper's 55 us timer and 5 fast-recovery steps). Fewer
# than one CNP per millisecond of inter-node transfer leaves the flows at line rate most of
# the time: it cannot be why collectives run below BW_DEGRADED of the link (and a near-idle
# rail's few stray marks, a large share of almost no packets, are not congestion).
CNP_PER_TRANSFER_S_MIN = 1e3


def _share_beta(p: Patterns, kinds: tuple[int, ...]) -> np.ndarray:
    cols = np.isin(p.fn_kinds, kinds)
    return np.nansum(p.beta[:, cols], axis=1) if cols.any() else np.zeros(p.ranks.size)


def expected_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                      anomalies: list[NicAnomaly], step_ns: float, ports: PortMap | None = None,
                      best_bus: dict[str, float] | None = None) -> list[Finding]:
    """Findings against what a healthy job looks like (loader and host shares, the fabric's bandwidth), and
    the GPUs throttled below their ceiling among the ranks no peer test compares (:func:`.clocks.clock_findings`).

    ``ports``: the window's :func:`.ports.classify` of ``counters``, when the
    caller has it (classified here otherwise: ~5 ms at 1,024 ranks).
    ``best_bus``: each inter-node communicator's best earlier bus bandwidth in this
    job (:mod:`.bus_reference`), a measured floor under the links' capacity.
    """
    out: list[Finding] = []
    all_ranks = [int(r) for r in p.ranks]

    loader = _share_beta(p, (K_LOADER,))
    if np.median(loader) >= LOADER_BETA and np.mean(loader >= LOADER_BETA / 2) >= RANK_SHARE:
        iowaits = [m.get("iowait_pct", np.nan) for m in counters.host.values()]
        iowait = float(np.nanmedian(iowaits)) if np.isfinite(iowaits).any() else float("nan")
        storage = np.isfinite(iowait) and iowait >= IOWAIT_HIGH_PCT
        out.append(Finding(
            kind="slow", component="storage" if storage else "config", scope="job", fn="DataLoader.__next__",
            slowdown=float(1.0 / max(1.0 - np.median(loader), 0.05)), score=float(np.median(loader) / LOADER_BETA),
            confidence=_conf(np.median(loader) / LOADER_BETA), peers=all_ranks, culprits=all_ranks,
            evidence={"loader_beta": {"median": round(float(np.median(loader)), 4), "expected_max": LOADER_BETA},
                      "host_iowait_pct": {"median": iowait}},
            summary=(f"the data loader holds {np.median(loader):.0%} of the time on every rank (expected < "
                     f"{LOADER_BETA:.0%}); " + (f"storage is slow (iowait {iowait:.0f}%)" if storage
                                                else "too few DataLoader workers or a slow input pipeline")),
        ))

    collective = _collective_findings(p, layout, counters, coll, anomalies, ports, best_bus)
    python = _share_beta(p, (K_PYTHON, K_OPTIM, K_OTHER))
    config = [f for f in collective if f.component == "config"]
    if np.median(python) >= PYTHON_BETA and np.mean(python >= PYTHON_BETA / 2) >= RANK_SHARE and config:
        # Socket transports burn host CPU: with NCCL off its RDMA path the host-side time is a
        # symptom of that misconfiguration, not a second cause.
        config[0].evidence["python_beta"] = {"median": round(float(np.median(python)), 4)}
    elif (np.median(python) >= PYTHON_BETA and np.mean(python >= PYTHON_BETA / 2) >= RANK_SHARE
          and (p.fn_kinds == K_KERNEL).any()):
        # Only meaningful where a GPU could run meanwhile: on a CPU-only job the host *is* the compute.
        out.append(Finding(
            kind="slow", component="python", scope="job", fn=_top_fn(p, (K_PYTHON, K_OPTIM, K_OTHER)),
            slowdown=float(1.0 / max(1.0 - np.median(python), 0.05)), score=float(np.median(python) / PYTHON_BETA),
            confidence=_conf(np.median(python) / PYTHON_BETA), peers=all_ranks, culprits=all_ranks,
            evidence={"python_beta": {"median": round(float(np.median(python)), 4), "expected_max": PYTHON_BETA}},
            summary=f"host Python holds {np.median(python):.0%} of the time on every rank while the GPU idles "
                    f"(expected < {PYTHON_BETA:.0%}): host syncs or slow Python in the training loop",
        ))

    return out + collective + clock_findings(p, layout, counters, step_ns)


PAUSE_COST = 0.05     # pauses cost the job >= 5% of a step on average
PAUSE_RANKS = 3       # ... spread over at least 3 ranks
PAUSE_TOP_SHARE = 0.5  # ... none of which holds half of it (that would be one rank's problem)
PAUSE_EXCLUSIVE = 0.5  # ... and spent mostly in the function itself, not in GPU work it encloses
# "Varying ranks" is a statement over time: a collector pauses whichever rank it runs on, so a
# job window of a few long steps holds one or two pauses, on one or two ranks, and alone cannot
# tell GC from one rank's problem. The pattern is judged over the last three job windows (the
# current one and the two before it), each of at least MIN_WINDOW_STEPS steps.
PAUSE_WINDOWS = 3
# A collector that the tracer does not record as a frame of its own (``gc.collect``) stops the
# interpreter inside whatever Python function happens to run: the pause is then one call of an
# every-step function that lasts far longer than its other calls, on whichever rank collects,
# in whichever function allocates. Such calls are pauses too (:func:`_outlier_pauses`), and
# the pauses of all host functions are judged together: it is the job's code that pauses, and
# the function a pause lands in is chance (a per-function test sees a third of them and names
# a different function from one window to the next, which no streak survives).
# The finding names them all, as one function: the incident (and its streak over windows)
# is the job's pausing, whichever functions this window's pauses happened to land in.
PAUSES_FN = "host Python pauses"


def _outlier_pauses(p: Patterns, f: int, step_ns: float) -> list[PauseRecord]:
    """Pauses inside an every-step host function: per rank, the time its calls spent above the rank's best steps.

    A rank's typical cost of the function is its best steady level (``low_ns``: the low
    quantile over its steps, which one or two paused steps of a window cannot move, where a
    median of three steps can be one); the exclusive time above it is the pause time. The
    pause's size is the longest call less the rank's usual call (its calls' duration with
    the pause time taken out: a frame that encloses GPU work lasts long in every call).
    Only calls at least :data:`PAUSE_COST` of a step longer than usual count (ordinary
    jitter of host code is micro- to milliseconds: a shorter stall cannot be told from it
    nor cost the job a material share), only where that extra time is mostly the
    function's own (:data:`PAUSE_EXCLUSIVE`): a frame whose long call waited for the GPU
    work it encloses (a slow kernel, an evaluation) did not pause, and only in functions
    whose usual calls are mostly their own code too: the exclusive time of a frame that
    encloses other traced work (the step's outer frame, a module's forward) is the gaps
    between its children, where every wait the tracer does not record lands (a loader's
    prefetch, a CUDA sync, launch gaps, a neighbour's contention): a long gap there says
    the step stalled, not that the interpreter paused.
    """
    out: list[PauseRecord] = []
    for slot in _pause_candidates(p, f, step_ns):
        calls, steps = float(p.count[slot, f]), float(max(p.steps[slot], 1))
        low, excl = float(p.low_ns[slot, f]), float(p.excl_ns[slot, f])
        total, p99 = float(p.total_ns[slot, f]), float(p.p99_ns[slot, f])
        if not all(np.isfinite(v) for v in (low, excl, total, p99)):
            continue
        usual = min(steps, calls) * low              # a step's worth of calls at the best level, each step it ran
        excess = excl - usual
        size = p99 - max(total - excess, 0.0) / calls
        if (size < PAUSE_COST * step_ns or excess < PAUSE_EXCLUSIVE * size
                or usual < PAUSE_EXCLUSIVE * max(total - excess, 0.0)):
            continue
        # how many such calls the excess holds (at least the one that showed)
        out.append(PauseRecord(p.fn_names[f], int(p.ranks[slot]), excess, max(1, int(round(excess / size))), size))
    return out


def _pause_candidates(p: Patterns, f: int, step_ns: float) -> np.ndarray:
    """The ranks (slots) of :func:`_outlier_pauses` whose calls may hold a pause: its tests, on all ranks at once.

    The same float64 operations in the same order as the per-rank test (which
    then runs on these alone and has the last word), so no rank it keeps is
    left out here: a 1,024-rank window ran that test in Python 4,096 times.
    """
    slots = np.flatnonzero(p.count[:, f] > 0)
    calls = p.count[slots, f].astype(np.float64)
    steps = np.maximum(p.steps[slots], 1).astype(np.float64)
    low, excl, total, p99 = (a[slots, f].astype(np.float64) for a in (p.low_ns, p.excl_ns, p.total_ns, p.p99_ns))
    with np.errstate(all="ignore"):
        usual = np.minimum(steps, calls) * low
        excess = excl - usual
        own = np.maximum(total - excess, 0.0)
        size = p99 - own / calls
        keep = (np.isfinite(low) & np.isfinite(excl) & np.isfinite(total) & np.isfinite(p99)
                & ~(size < PAUSE_COST * step_ns) & ~(excess < PAUSE_EXCLUSIVE * size) & ~(usual < PAUSE_EXCLUSIVE * own))
    out: np.ndarray = slots[keep]
    return out


def pause_window(p: Patterns, step_ns: float) -> PauseWindow:
    """This window's host pauses: functions that run in at most half a rank's steps (their every call), and
    the far-too-long calls of every-step functions (:func:`_outlier_pauses`)."""
    steps = float(np.median(p.steps)) if p.steps.size else 0.0
    records: list[PauseRecord] = []
    for f in np.flatnonzero(p.fn_kinds == K_PYTHON):
        ran = p.count[:, f] > 0
        if not ran.any():
            continue
        if np.median(p.count[ran, f] / np.maximum(p.steps[ran], 1)) > 0.5:
            records += _outlier_pauses(p, int(f), step_ns)
            continue
        for slot in np.flatnonzero(ran):
            records.append(PauseRecord(p.fn_names[f], int(p.ranks[slot]), float(np.nan_to_num(p.excl_ns[slot, f])),
                                       int(p.count[slot, f]), float(p.median_ns[slot, f])))
    return PauseWindow(steps, float(step_ns), records)


def _holds(recs: Sequence[PauseRecord]) -> bool:
    """A function's pauses hold the critical path themselves (the host does nothing the GPU
    could overlap): most of their time is the function's own exclusive time. A frame that
    encloses GPU work (an evaluation pass, a step wrapper) only waits for it."""
    spent = sum(float(np.nan_to_num(r.median_ns)) * r.calls for r in recs)
    return sum(r.excl_ns for r in recs) >= PAUSE_EXCLUSIVE * spent


def pause_findings(p: Patterns, step_ns: float, recent: Sequence[PauseWindow] = ()) -> tuple[list[Finding], PauseWindow]:
    """Long, sporadic host pauses on varying ranks (GC): each stalls the whole lock-step job.

    Per-step medians hide them (a rank pauses only now and then) and the peer
    test sees no rank stand out, so this test looks for host pauses (a function
    that runs in few steps of each rank, or calls far longer than the function's
    usual ones) that last long, appear on several ranks, and add up to a real
    share of the job's time, over this window and the ``recent`` ones before it
    (:data:`PAUSE_WINDOWS`). The pauses of every host function that paused on more
    than one rank are pooled into one finding (:data:`PAUSES_FN`, the functions in
    its evidence); a function whose pauses all sit on one rank is that rank's
    periodic work (the peer test's). Returns the findings and this window's
    pauses, to remember.
    """
    out: list[Finding] = []
    now = pause_window(p, step_ns)
    windows = [*recent[-(PAUSE_WINDOWS - 1):], now] if PAUSE_WINDOWS > 1 else [now]
    job_ns = sum(w.steps * w.step_ns for w in windows if w.steps > 0 and w.step_ns > 0)
    if now.steps <= 0 or job_ns <= 0 or not now.records:
        return out, now
    recs_of: dict[str, list[PauseRecord]] = {}
    for w in windows:
        for r in w.records:
            recs_of.setdefault(r.fn, []).append(r)
    pooled = sorted(fn for fn, rs in recs_of.items() if len({r.rank for r in rs}) >= 2 and _holds(rs))
    recs = [r for fn in pooled for r in recs_of[fn]]
    if not recs or not {r.fn for r in now.records} & set(pooled):
        return out, now
    totals: dict[int, float] = {}
    for r in recs:
        totals[r.rank] = totals.get(r.rank, 0.0) + r.excl_ns
    n_ranks = len(totals)
    if n_ranks < PAUSE_RANKS:
        return out, now
    # Time-weighted: the typical pause is the one that holds most of the time (a collector's
    # many millisecond young-generation passes beside its seconds-long full ones must not
    # make "the median pause" a few ms), and ...
    typical = np.array([r.median_ns for r in recs], dtype=np.float64)
    spent = np.nan_to_num(typical) * np.array([r.calls for r in recs], dtype=np.float64)
    order = np.argsort(typical, kind="stable")
    half = np.searchsorted(np.cumsum(spent[order]), 0.5 * spent.sum()) if spent.sum() > 0 else 0
    pause = float(typical[order][min(int(half), len(recs) - 1)])
    long = pause >= PAUSE_COST * step_ns
    total = float(sum(totals.values()))
    share = total / job_ns
    top = max(totals.values())
    if not long or share < PAUSE_COST or top > PAUSE_TOP_SHARE * total:
        return out, now
    by_fn = {fn: sum(r.excl_ns for r in recs_of[fn]) for fn in pooled}
    ranked = sorted(pooled, key=lambda k: (-by_fn[k], k))
    what = f"host pauses ({pause / 1e6:.0f} ms) in " + ", ".join(ranked[:3]) + (
        f" and {len(ranked) - 3} more" if len(ranked) > 3 else "")
    evidence: dict[str, Any] = {PAUSES_FN: {
        "cost_share_of_step": round(share, 4), "ranks_pausing": n_ranks,
        "median_pause_ns": round(pause), "largest_rank_share": round(top / total, 3),
        "windows": len(windows), "functions": {k: round(by_fn[k] / total, 3) for k in ranked}}}
    out.append(Finding(
        kind="slow", component="python", scope="job", fn=PAUSES_FN,
        slowdown=float(1.0 + share), score=float(n_ranks),
        confidence=round(float(min(0.95, 0.3 + share * 4)), 3), peers=[int(r) for r in p.ranks],
        culprits=[], evidence=evidence,
        # sporadic by definition: no level that steps could show, so it is confirmed by windows only
        step_evidence=False,
        # ``share`` is pause time over the *pause-free* steps' time (median step x steps), so
        # it may pass 100%; of the time the job took (those steps plus the pauses that
        # stalled them) the pauses hold total / (job_ns + total), never over 100%.
        summary=(f"{what} on {n_ranks} different ranks stall the whole job "
                 f"for {total / (job_ns + total):.0%} of its time ({total / 1e9:.1f} s of pauses beside "
                 f"{job_ns / 1e9:.0f} s of steps; e.g. garbage collection)"),
    ))
    return out, now


def _conf(strength: float) -> float:
    return round(float(min(0.95, 0.4 + 0.3 * (strength - 1.0) + 0.3)), 3) if strength >= 1 else 0.3


def _top_fn(p: Patterns, kinds: tuple[int, ...]) -> str:
    cols = np.flatnonzero(np.isin(p.fn_kinds, kinds))
    if cols.size == 0:
        return ""
    return p.fn_names[int(cols[np.argmax(np.nanmedian(p.beta[:, cols], axis=0))])]


def link_capacity_Bps(counters: CounterSummary, ports: PortMap | None = None,
                      ranks_per_node: dict[str, int] | None = None) -> float:
    """A rank's share of its node's rail capacity (bytes/s), the median over nodes.

    Only the ports that carry the job's collectives count (:mod:`.ports`): a
    front-end or management port's speed says nothing about what the
    collectives can reach. With ``ranks_per_node`` (the ranks of each node that
    take part in inter-node collectives, which run concurrently) each rank gets
    its share of the node's rails, which is one rail when rails and GPUs pair
    up; without it, one rail per rank.
    """
    ports = ports if ports is not None else classify(counters)
    if ranks_per_node:
        share = _rank_share_Bps({n: ports.node_capacity_gbps(n) for n in ranks_per_node}, ranks_per_node)
        if np.isfinite(share):
            return share
    speeds = [p.link_gbps for p in ports.rails if np.isfinite(p.link_gbps) and p.link_gbps > 0]
    return float(np.median(speeds)) * 1e9 / 8 if speeds else float("nan")


def _rank_share_Bps(node_gbps: dict[str, float], ranks_per_node: dict[str, int]) -> float:
    """A rank's share of its node's link capacity (bytes/s), the median over nodes; NaN when none is known.

    The ranks of a node that take part in inter-node collectives run them
    concurrently, so they split the node's links.
    """
    caps = [node_gbps[n] / k for n, k in ranks_per_node.items() if k > 0 and n in node_gbps]
    caps = [c for c in caps if np.isfinite(c) and c > 0]
    return float(np.median(caps)) * 1e9 / 8 if caps else float("nan")


_BUS_FACTOR_OPS = {OP_CODE["all_reduce"]: 2.0, OP_CODE["all_gather"]: 1.0, OP_CODE["reduce_scatter"]: 1.0}


def bus_bandwidth(g: GroupStats) -> float:
    """What each link of the group carries per second (NCCL's busbw), from bytes / transfer time.

    A ring all-reduce sends 2(n-1)/n of the buffer over every link, all-gather
    and reduce-scatter (n-1)/n of the full buffer (the tracer's ``bytes``);
    broadcast and unknown ops are taken as sending the buffer once.
    """
    n = int(g.ranks.size)
    factor = _BUS_FACTOR_OPS.get(int(g.op), 0.0) * (n - 1) / n if n > 1 else 0.0
    return g.bandwidth * (factor if factor > 0 else 1.0)


def _inter_node_ranks(coll: CollectiveStats, layout: Layout) -> dict[str, int]:
    ranks = {int(r) for g in coll.groups if not g.intra_node and not g.p2p for r in g.ranks}
    out: dict[str, int] = {}
    for r in ranks:
        node = layout.rank_node.get(r, "")
        if node:
            out[node] = out.get(node, 0) + 1
    return out


def inter_node_bandwidth_ratio(coll: CollectiveStats, counters: CounterSummary,
                               layout: Layout | None = None, ports: PortMap | None = None,
                               cap: float | None = None,
                               best: dict[str, float] | None = None) -> tuple[float, list[str]]:
    """Median over inter-node communicators of bus bandwidth / a rank's rail capacity.

    Send / recv pairs are left out: their time holds the pipeline bubble.
    ``cap``: that capacity, when the caller has it (:func:`link_capacity_Bps` with ``layout``'s ranks).
    ``best``: each communicator's best earlier bus bandwidth in this job
    (:mod:`.bus_reference`), a measured floor under its path's capacity.
    """
    if cap is None:
        cap = link_capacity_Bps(counters, ports, _inter_node_ranks(coll, layout) if layout is not None else None)
    groups = [g for g in coll.groups if not g.intra_node and not g.p2p and np.isfinite(g.bytes_per_step)
              and g.bytes_per_step >= MIN_COLL_BYTES and np.isfinite(g.bandwidth)]
    if not groups or not np.isfinite(cap):
        return float("nan"), []
    best = best or {}
    return (float(np.median([bus_bandwidth(g) / max(cap, best.get(g.name, 0.0)) for g in groups])),
            [g.name for g in groups])


def transport_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                       anomalies: list[NicAnomaly], ports: PortMap | None = None,
                       best_bus: dict[str, float] | None = None) -> list[Finding]:
    """NCCL off its RDMA path only: what a job window of one or two steps may still say.

    Such a window comes from steps longer than the stall bound (steps.py): NCCL
    over TCP sockets turns a 90 s step into ~10 minutes. No comparison between
    ranks or with history is sound on one step (a spike is a step), but the bus
    bandwidth of inter-node collectives against their links' speed is measured
    on every transfer, and one step of them measures it as well as three.
    """
    # Only the bandwidth against the links: NVLink's counters, sampled every few seconds,
    # can miss every burst of one or two steps' collectives.
    return [f for f in _collective_findings(p, layout, counters, coll, anomalies, ports, best_bus) if f.component == "config"
            and min(f.evidence.get("inter_node_bandwidth_share_of_link", {}).get("median", 1.0),
                    f.evidence.get("bypassed_ports", {}).get("share_of_link", 1.0)) < BW_CONFIG]


def _collective_findings(p: Patterns, layout: Layout, counters: CounterSummary, coll: CollectiveStats,
                         anomalies: list[NicAnomaly], ports: PortMap | None = None,
                         best_bus: dict[str, float] | None = None) -> list[Finding]:
    out: list[Finding] = []
    all_ranks = [int(r) for r in p.ranks]
    ports = ports if ports is not None else classify(counters)
    cap = link_capacity_Bps(counters, ports, _inter_node_ranks(coll, layout))
    ratio, names = inter_node_bandwidth_ratio(coll, counters, layout, ports, cap)
    # Whether the fabric is *slowed* is judged against the larger of the counted capacity and the
    # job's own sustained best (bus_reference: a communicator that ran above the count proves the
    # count low). Whether NCCL is off its RDMA path stays a share of the links themselves: the
    # job's best says nothing about which transport it used.
    slowed = inter_node_bandwidth_ratio(coll, counters, layout, ports, cap, best_bus)[0] if best_bus else ratio
    duty = (_transfer_ns(coll, set(names)) / max(float(np.nanmedian(p.step_time_ns)), 1.0)
            if names and p.step_time_ns.size else float("nan"))
    relative = {a.node for a in anomalies if a.kind == "congested" and _material_marks(a, counters, p.window_ns / 1e9, duty)}
    # Marks above their expected range (CNP_PER_PACKET_MAX) on the rails, whether or not
    # other ports read lower: the only way a fabric congested under every node shows.
    marked = _marked_rails(counters, ports, p.window_ns / 1e9, duty)
    congested = sorted(relative | set(marked))
    hw = [a for a in anomalies if a.kind in ("degraded", "flaky")]
    reasons: list[str] = []
    evidence: dict[str, Any] = {}
    if np.isfinite(ratio):
        evidence["inter_node_bandwidth_share_of_link"] = {"median": round(ratio, 4), "link_Bps": cap,
                                                           "groups": names[:8], "ports": ports.summary(),
                                                           # what the cost of a slow fabric is priced from
                                                           "transfer_ns_per_step": _transfer_ns(coll, set(names))}
        if slowed != ratio and best_bus:
            evidence["inter_node_bandwidth_share_of_link"].update(
                {"of_job_best": round(slowed, 4),
                 "job_best_bus_Bps": {k: round(v) for k, v in sorted(best_bus.items())[:8]}})
        evidence["collective_ns_per_step"] = _collective_exposure(p, coll)
    # Several nodes marked: the fabric. A node whose rails report no congestion counters at
    # all (the vendor hw_counters are optional) cannot say it is quiet: one marked node
    # beside such a node, with every ring slowed, is the fabric too.
    blind = _nodes_without_congestion_counters(counters, ports)
    if (np.isfinite(slowed) and slowed < BW_DEGRADED and not hw
            and (len(congested) >= 2 or (len(congested) == 1 and set(blind) - set(congested)))):
        ev = {**evidence, "congested_nodes": {"culprit": congested}}
        if blind:
            ev["nodes_without_congestion_counters"] = {"nodes": blind}
        if marked:
            ev["cnp_above_expected"] = {"nodes": marked, "expected_max_per_packet": CNP_PER_PACKET_MAX}
        why = ("CNP / xmit-wait counters far above the other ports" if not marked else
               "CNPs answer " + f"{max(m['cnp_per_received_packet'] for m in marked.values()):.2%}"
               f" of received packets (expected < {CNP_PER_PACKET_MAX:.1%})"
               + ("" if set(marked) >= set(congested) else ", and CNP / xmit-wait far above the other ports"))
        out.append(Finding(
            kind="slow", component="network", scope="job", fn=names[0] if names else "",
            slowdown=float(1.0 / max(slowed, 0.01)), score=float(len(congested)),
            confidence=_conf(1.0 + (BW_DEGRADED - slowed) / BW_DEGRADED * 2), peers=all_ranks,
            culprits=[], evidence=ev,
            summary=(f"fabric congestion at {len(congested)} nodes ({', '.join(congested[:4])}): {why}; "
                     f"inter-node collectives at {slowed:.0%} of "
                     + ("link speed" if slowed == ratio else "their own best in this job")),
        ))
        return out
    if np.isfinite(ratio) and ratio < BW_CONFIG and not hw and not congested:
        reasons.append(f"inter-node collectives at {ratio:.1%} of the {cap * 8 / 1e9:.0f} Gb/s links "
                       f"(NCCL over TCP sockets instead of RDMA?)")
    elif np.isfinite(ratio) and not hw:
        bypass = _bypassed_path(ports, counters, coll, layout, ratio * cap)
        if bypass is not None and bypass["share_of_link"] < BW_CONFIG:
            evidence["bypassed_ports"] = bypass
            ratio = bypass["share_of_link"]
            reasons.append(f"inter-node collectives ride {', '.join(bypass['carrying'])} while "
                           f"{', '.join(bypass['idle'][:4])}{'...' if len(bypass['idle']) > 4 else ''} "
                           f"({bypass['idle_gbps']:.0f} Gb/s) sit idle: at {ratio:.1%} of what those links carry "
                           f"(NCCL over TCP sockets instead of RDMA?)")
    # Too few same-shaped communicators for the link test (one or two DP rings): the
    # port that differs from the fleet's, under slowed transfers through it, is it.
    for a in {a.node: a for a in sorted(hw, key=lambda a: a.strength)}.values():
        ranks = layout.node_ranks(a.node, p.ranks)
        below = (np.isfinite(slowed) and slowed < BW_DEGRADED) or _slower_than_family(coll, set(ranks))
        # Transfers cost >= 5% of a step: a link problem there is worth a verdict (the cost bar of confidence_of).
        if below and _transfer_share(p, coll) >= 0.05:
            out.append(Finding(
                kind="slow", component="nic", scope="node", node=a.node,
                # the communicator link_findings names too: one incident whichever test finds it
                fn=group_through(coll, set(ranks), layout.rank_stage) or (names[0] if names else ""),
                slowdown=float(1.0 / max(ratio, 0.01)) if np.isfinite(ratio) else 1.0, score=float(a.strength),
                confidence=NIC_CONFIDENCE, peers=[r for r in all_ranks if r not in ranks], culprits=ranks,
                evidence={**evidence, **a.evidence, "nic": {"culprit": a.nic, "anomaly": a.kind, "class": "rail"}},
                summary=(f"NIC {a.nic} on {a.node} {'link degraded' if a.kind == 'degraded' else 'flaky (errors)'} "
                         f"while collectives move data below the links' speed"),
            ))
    nv = nvlink_unused(coll, counters)
    if nv is not None:
        intra = [g for g in coll.groups if g.intra_node and not g.p2p and len(g.ranks) >= 2
                 and np.isfinite(g.bytes_per_step) and g.bytes_per_step >= MIN_COLL_BYTES and np.isfinite(g.bandwidth)]
        evidence["nvlink_Bps"] = {"median": nv,
                                  # the intra-node collectives' transfer per step and bus bandwidth off NVLink
                                  "intra_node_transfer_ns_per_step": _transfer_ns(coll, {g.name for g in intra}),
                                  "intra_node_bus_Bps": round(float(np.median([bus_bandwidth(g) for g in intra])))
                                  if intra else float("nan")}
        evidence.setdefault("collective_ns_per_step", _collective_exposure(p, coll))
        reasons.append("NVLink unused while tensor-parallel collectives run (P2P / NVLink disabled?)")
    if reasons:
        out.append(Finding(
            kind="slow", component="config", scope="job", fn="nccl",
            slowdown=float(1.0 / max(ratio, 0.01)) if np.isfinite(ratio) and ratio < 1 else 1.0,
            score=float(len(reasons)), confidence=0.9, peers=all_ranks, culprits=[],
            evidence=evidence, summary="; ".join(reasons),
        ))
    return out


def _bypassed_path(ports: PortMap, counters: CounterSummary, coll: CollectiveStats, layout: Layout | None,
                   bus_Bps: float) -> dict[str, Any] | None:
    """The collectives' bus bandwidth against the node's faster idle ports (:func:`.ports.bypassed_ports`).

    A job-wide misconfiguration shows on every node alike, so a strict majority
    of the nodes that carry inter-node collectives must have such ports; the
    capacity is a rank's share of them, as :func:`link_capacity_Bps` takes it
    of the rails. None when the job's collectives already take the fastest path.
    """
    per_node = _inter_node_ranks(coll, layout) if layout is not None else {}
    fast = bypassed_ports(ports, counters)
    if not per_node or 2 * sum(1 for n in per_node if n in fast) <= len(per_node):
        return None
    cap_Bps = _rank_share_Bps({n: sum(p.link_gbps for p in ps) for n, ps in fast.items()}, per_node)
    idle = sorted({p.nic for ps in fast.values() for p in ps})
    return {"share_of_link": round(bus_Bps / cap_Bps, 4), "capacity_Bps_per_rank": cap_Bps,
            "carrying": sorted({p.nic for p in ports.rails}), "idle": idle,
            "idle_gbps": float(np.median([p.link_gbps for ps in fast.values() for p in ps])),
            "nodes": sorted(fast)[:8]}


def _transfer_ns(coll: CollectiveStats, names: set[str]) -> int:
    """The typical rank's transfer time per step in the communicators ``names`` (summed over those it is in;
    the median over their members): what the transfers of a slow path take in each step."""
    per_rank: dict[int, float] = {}
    for g in coll.groups:
        if g.name in names:
            for r in g.ranks:
                per_rank[int(r)] = per_rank.get(int(r), 0.0) + g.transfer_per_step
    return int(round(float(np.median(list(per_rank.values()))))) if per_rank else 0


def _collective_exposure(p: Patterns, coll: CollectiveStats) -> dict[str, int]:
    """The typical rank's collective time on the step's critical path, and its waiting in collectives, per step.

    ``exposed``: the step less what GPU compute, copies and host work hold of its critical path (their
    exclusive time: a collective overlapped with compute is not exposed); the rest is the collectives'
    (and any unrecorded gap: an upper bound of what faster collectives can save). Computed from the other
    kinds' shares rather than the collectives' own, which a window edge cuts short when one collective
    outlasts the step's remainder in the window. ``waiting``: the median rank's waiting in collectives.
    """
    if not p.ranks.size:
        return {"exposed": 0, "waiting": 0}
    others = np.nansum(p.beta[:, p.fn_kinds != K_COLL], axis=1)
    exposed = np.clip(1.0 - others, 0.0, 1.0) * p.step_time_ns
    ok = np.isfinite(exposed)
    wait = coll.wait_per_step[np.isfinite(coll.wait_per_step)] if coll.wait_per_step.size else np.zeros(0)
    return {"exposed": int(round(float(np.median(exposed[ok])))) if ok.any() else 0,
            "waiting": int(round(float(np.median(wait)))) if wait.size else 0}


def _marked_rails(counters: CounterSummary, ports: PortMap, window_s: float,
                  transfer_duty: float) -> dict[str, dict[str, Any]]:
    """Nodes with a rail whose CNPs are above their expected range (evidence: that node's worst rail).

    Judged per rail port, on its own traffic: the CNPs of the window against the packets
    it received (half its bytes: a ring or tree collective receives on a rail what it sends
    on it), counted at :data:`ROCE_MTU_MIN_B`, above :data:`CNP_PER_PACKET_MAX`; and at
    least :data:`CNP_PER_TRANSFER_S_MIN` CNPs per second of the window's inter-node transfers
    (``transfer_duty``: their share of a step). Rails without a CNP counter say nothing.
    """
    out: dict[str, dict[str, Any]] = {}
    for port in sorted(ports.rails, key=lambda q: (q.node, q.nic)):
        m = counters.nic.get((port.node, port.nic), {})
        cnp = m.get("cnp_sent_inc", np.nan)
        tput = m.get("throughput_Bps", np.nan)
        per_transfer_s = _cnp_per_transfer_s(cnp, window_s, transfer_duty)
        if tput is None or not math.isfinite(tput) or not math.isfinite(per_transfer_s) or cnp <= 0:
            continue
        packets = max(0.5 * tput * window_s / ROCE_MTU_MIN_B, 1.0)
        share = float(cnp) / packets
        if share <= CNP_PER_PACKET_MAX or per_transfer_s < CNP_PER_TRANSFER_S_MIN:
            continue
        if port.node not in out or share > out[port.node]["cnp_per_received_packet"]:
            xw = m.get("xmit_wait_inc", np.nan)
            out[port.node] = {"nic": port.nic, "cnp_per_s": round(float(cnp) / window_s, 2),
                              "cnp_per_received_packet": round(share, 6),
                              "cnp_per_transfer_s": round(per_transfer_s, 1),
                              "xmit_wait_per_s": round(float(xw) / window_s, 2)
                              if xw is not None and np.isfinite(xw) else float("nan")}
    return out


def _material_marks(a: NicAnomaly, counters: CounterSummary, window_s: float, transfer_duty: float) -> bool:
    """A rail marked far above the quieter ports (links.nic_anomalies) whose CNPs could slow a collective.

    Far above the others is not enough: 0.03 CNP/s beside 0 on the other ports is 4x them and
    nothing to the flows. Fewer than :data:`CNP_PER_TRANSFER_S_MIN` CNPs per second of
    inter-node transfer leave DCQCN's senders at line rate most of the time, so they cannot be
    why the collectives run slow (seen: NVLink unused, its rings slowed in the nodes, read as
    fabric congestion on two nodes with a few stray marks). A rail without a CNP counter, or a
    window whose transfer time is unknown, keeps the relative reading (xmit-wait has no
    absolute scale: its unit is a vendor's tick).
    """
    rate = _cnp_per_transfer_s(counters.nic.get((a.node, a.nic), {}).get("cnp_sent_inc"), window_s, transfer_duty)
    return not np.isfinite(rate) or rate >= CNP_PER_TRANSFER_S_MIN


def _cnp_per_transfer_s(cnp: float | None, window_s: float, transfer_duty: float) -> float:
    """A rail's CNPs per second of the window's inter-node transfers (``transfer_duty``: their share of
    a step, at most all of it); NaN without a CNP count or a transfer time."""
    if (cnp is None or not math.isfinite(cnp) or not (math.isfinite(window_s) and window_s > 0)
            or not (math.isfinite(transfer_duty) and transfer_duty > 0)):
        return float("nan")
    return float(cnp) / (window_s * min(transfer_duty, 1.0))


def _nodes_without_congestion_counters(counters: CounterSummary, ports: PortMap) -> list[str]:
    """Nodes none of whose rails report a CNP or xmit-wait counter."""
    seen: dict[str, bool] = {}
    for p in ports.rails:
        m = counters.nic.get((p.node, p.nic), {})
        has = any(math.isfinite(m.get(f"{k}_inc", np.nan)) for k in ("cnp_sent", "xmit_wait"))
        seen[p.node] = seen.get(p.node, False) or has
    return sorted(n for n, has in seen.items() if not has)


def _slower_than_family(coll: CollectiveStats, ranks: set[int], margin: float = 0.9) -> bool:
    """Some inter-node communicator through these ranks moves data slower than its fastest sibling."""
    families: dict[tuple[int, int], list[GroupStats]] = {}
    for g in coll.groups:
        if not g.intra_node and not g.p2p and np.isfinite(g.bandwidth) and g.bytes_per_step >= MIN_COLL_BYTES:
            families.setdefault((len(g.ranks), g.op), []).append(g)
    for groups in families.values():
        if len(groups) < 2:
            continue
        best = max(g.bandwidth for g in groups)
        if any(g.bandwidth <= margin * best and ranks & set(int(r) for r in g.ranks) for g in groups):
            return True
    return False


def _transfer_share(p: Patterns, coll: CollectiveStats) -> float:
    """The typical rank's collective transfer time per step, as a share of the step.

    Send / recv are left out: their "transfer" holds the pipeline bubble (the
    wait for the other stage), which says nothing about a link.
    """
    step = float(np.nanmedian(p.step_time_ns)) if p.step_time_ns.size else 0.0
    per_rank: dict[int, float] = {}
    for g in coll.groups:
        if g.p2p:
            continue
        for r in g.ranks:
            per_rank[int(r)] = per_rank.get(int(r), 0.0) + g.transfer_per_step
    return float(np.median(list(per_rank.values()))) / step if step > 0 and per_rank else 0.0


def nvlink_Bps(m: dict[str, float]) -> float:
    """A GPU's NVLink bytes per second over the window: the mean of tx + rx when summarised, else the medians'.

    The mean counts what moved; the median of the samples reads 0 whenever a
    checkpoint or evaluation idles the job for more than half the window.
    """
    mean = m.get("nvlink_mean_Bps", np.nan)
    if mean is not None and math.isfinite(mean):
        return float(mean)
    return float(m.get("nvlink_tx_Bps", np.nan) + m.get("nvlink_rx_Bps", np.nan))


def nvlink_unused(coll: CollectiveStats, counters: CounterSummary) -> float | None:
    """Median NVLink throughput when intra-node collectives run but NVLink carries nothing."""
    intra = [g for g in coll.groups if g.intra_node and not g.p2p and len(g.ranks) >= 2 and np.isfinite(g.bytes_per_step)
             and g.bytes_per_step >= MIN_COLL_BYTES]
    if not intra:
        return None
    tput = np.array([t for t in (nvlink_Bps(m) for m in counters.gpu.values()) if math.isfinite(t)])
    if tput.size < 2:
        return None
    bus = [bus_bandwidth(g) for g in intra if np.isfinite(g.bandwidth)]
    if bus and float(np.median(bus)) > PCIE_MAX_BUS_BPS:
        return None
    if np.mean(tput < NVLINK_IDLE_BPS) >= 0.9:
        return float(np.median(tput))
    return None
