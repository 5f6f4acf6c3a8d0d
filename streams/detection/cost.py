"""What a straggler costs the job, per job window, from the digests alone (online what-if).

``eroica whatif`` (:mod:`.whatif`) replays every operation of a trace; the
streaming detector has no operations, only digests. What a digest does keep
is each rank's collective time per communicator and *step*
(:class:`~eroica.models.digest.CollRows`), and that is enough for the step
time's critical path of a synchronous job:

* In one instance of a collective the member that waited least is the one
  the others waited for; every member's excess over it is waiting
  (:mod:`.collectives`). Summed over the step's communicators, ``w[r, s]`` is
  the time rank ``r`` spent waiting for others in step ``s``.
* Every rank of a synchronous job spends the same step time ``T_s``: its own
  work plus its waiting. So ``own[r, s] = T_s - w[r, s]``: the ranks' own
  work is known *relative to each other* in every step (``a = -w``), without
  any clock, and the step is paced by the rank with the most own work
  (``T_s = C_s + max_r a[r, s]``, ``C_s`` common to all ranks).
* **Ideal**: each rank's own work at its role's typical level (the median of
  the ranks of its role, :meth:`Layout.peer_groups`, in the same step), but
  with the *noise a healthy job has too* kept: a healthy job of N ranks is
  paced by the slowest of N jittering ranks, and the ground truth of "the job
  without its fault" (the simulator re-run without it, ``eroica bench cost``)
  still has that jitter. A rank's excess over its role's median is split into
  its *persistent* part (median over the window's steps: a throttled GPU, a
  slow loader) and the per-step rest; the rest is noise unless it is an
  outlier (over :data:`OUTLIER_Z` robust sigmas: a GC pause, a NIC flap).
  The ideal removes a positive persistent part and replaces outliers by the
  typical level; it keeps each rank's ordinary noise.
* ``S = mean measured step / (mean measured step - mean over steps of
  (max_r a - max_r a_ideal))``; ``S_X`` is the same with only the ranks of X
  keeping their measured own work (everyone else ideal), over the ideal.

The mean measured step time is each rank's span over the window's steps
(first start to last end, on its own clock) over its step count, the median
over ranks. All sums are over int64 nanoseconds and medians / maxima, so the
result does not depend on the order of the digest's rows (batch and streaming
give the same numbers).

A slowdown every rank shares alike makes nobody wait for anybody, and an
imbalance between pipeline stages (separate roles) is no excess over a role's
median: both are invisible to the waits. Where the finding that names such a
cause measured its ideal, its evidence declares the per-step excess
(:func:`declared_excess_ns`: a stage's compute over the other stages', the
data loader on every rank's critical path, a regression against the job's own
history) and :func:`finding_costs` removes it from the ideal too. NCCL far
below link speed and fabric congestion (expected.py's ``config`` and
``network`` findings) are priced physically (:func:`network_excess_ns`): the
inter-node transfers at the measured bus bandwidth less the same bytes at the
share of the wire NCCL reaches over healthy RDMA (and NVLink's bandwidth for
intra-node collectives run off it), bounded by the collectives' time on the
critical path.

A collective moves at its slowest hop's pace, so the waits read a slow ring's
transfer as the own work of all its members alike. Where one member's own
data path is slow (its host<->device copies, over the PCIe link that also
carries its GPUDirect traffic, :func:`slow_copy_ranks`), that member paces the
ring, and S_X charges the ring's excess over its siblings to X only when X
holds it (:func:`paced_transfers`); otherwise every member carries it, as
before. Limits (stated, not hidden): several stragglers at *different*
synchronisation points of a step (a throttled GPU and a slow rail ring) add
up in the job but the per-step maximum counts only the larger (``eroica
bench cost``: two faults read ~6% low).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from eroica.models.columns import KIND_CODE
from eroica.models.digest import WindowDigest

from .expected import BW_CONFIG  # the config finding's own threshold for naming the inter-node path
from .expected import PAUSES_FN
from .findings import Finding
from .grouping import dense_ids, group_max, group_min
from .patterns import JobArrays

# A cell whose own work exceeds its rank's persistent level by more than this many
# robust sigmas (1.4826 x MAD of all cells of its role) is a fault, not noise: the
# peer test's own threshold (z >= 5); under normal noise P(z > 5) = 3e-7, so in a
# window of 64 ranks x 30 steps (~2,000 cells) the chance of one noise cell
# counted as a fault is ~6e-4.
OUTLIER_Z = 5.0
# A rank's persistent level (median over the window's steps) this many robust sigmas above its role's
# levels is a fault's, not the ordinary spread of healthy ranks: Iglewicz and Hoaglin's cutoff for the
# modified z-score (3.5), the usual robust outlier rule for a small sample such as one role's ranks.
LEVEL_Z = 3.5
# Fewer complete steps cannot tell a persistent excess from a one-off (the median's
# breakdown point, as MIN_WINDOW_STEPS in steps.py).
MIN_STEPS = 3
# MAD of 0 (perfectly regular ranks, e.g. a replayed trace): the noise floor is one
# microsecond, below any collective's launch cost, so no exact tie is read as an outlier.
MIN_SIGMA_NS = 1_000.0
# A rank's host<->device copies this many times its role's typical time mark a slow PCIe path. A PCIe link
# trains down in halves (each generation or width step halves it), so a degraded link copies at least ~2x
# slower; sqrt(2) is the geometric midpoint between that and a healthy link (copy jitter is a few %).
SLOW_COPY_FACTOR = 2.0 ** 0.5
_K_MEMCPY = KIND_CODE["memcpy"]


@dataclass(frozen=True)
class WindowCost:
    """Cost of one job window: S, and the matrices to compute any S_X."""

    ranks: np.ndarray        # (R,) global ranks
    steps: np.ndarray        # (S,) the steps compared (every rank waited in collectives in them)
    step_ns: float           # mean measured step time
    measured: np.ndarray     # (R, S) own work relative to the step (-waiting), ns
    ideal: np.ndarray        # (R, S) the same at the role's typical level (ordinary noise kept)
    ideal_ns: float          # mean step time with every rank ideal
    slowdown: float          # S
    # communicators paced by a member's slow data path (:func:`paced_transfers`): (members (R,) bool,
    # pacers (R,) bool, the communicator's transfer excess per step (S,) ns)
    paced: tuple[tuple[np.ndarray, np.ndarray, np.ndarray], ...] = ()

    def extra_of(self, ranks: Iterable[int]) -> float:
        """Mean per-step time the job loses when only ``ranks`` keep their measured own work.

        A communicator whose transfer a member's slow data path paces (:func:`paced_transfers`) is as
        slow as measured only when that member is among ``ranks``: its other members only waited on
        it inside the transfer, and without the pacer it runs at its siblings' pace.
        """
        mask = np.isin(self.ranks, np.asarray(list(ranks), dtype=np.int64))
        if not mask.any():
            return 0.0
        scen = np.where(mask[:, None], self.measured, self.ideal)
        for members, pacers, excess in self.paced:
            if not (mask & pacers).any():
                rows = members & mask
                scen[rows] = scen[rows] - excess[None, :]
        return float(np.mean(scen.max(axis=0) - self.ideal.max(axis=0)))

    def cost_of(self, ranks: Iterable[int]) -> float:
        """S_X for X = ``ranks`` (those keep their measured own work, all other ranks ideal)."""
        if self.ideal_ns <= 0:
            return 1.0
        return float(max(1.0, (self.ideal_ns + self.extra_of(ranks)) / self.ideal_ns))

    def costs_by(self, groups: dict[str, list[int]]) -> dict[str, float]:
        return {k: self.cost_of(v) for k, v in groups.items()}

    def kept_wait_ns(self) -> float:
        """The typical rank's waiting per step that the ideal keeps (ordinary noise: the slowest of N
        jittering ranks, or rings that finish apart): in each step, the ideal's pacing rank's own work
        over the median rank's; the mean over steps."""
        if not self.steps.size:
            return 0.0
        return float(np.mean(self.ideal.max(axis=0) - np.median(self.ideal, axis=0)))


def lost_gpu_hours_per_hour(world: int, s_x: float) -> float:
    """GPU-hours lost per hour of the job to a cost S_X: world x (1 - 1/S_X)."""
    return float(world) * (1.0 - 1.0 / s_x) if s_x > 0 else 0.0


def wait_matrix(d: WindowDigest, ranks: np.ndarray, arrays: JobArrays | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(steps, W[R, S]): collective waiting per rank and step, int64 ns; -1 where a rank has no row.

    Per (communicator, step) the member with the least summed time waited
    least; the others' excess is waiting. Communicators without a name, and
    calls no other rank joined, tell nothing about waiting (as in
    :func:`.collectives.collective_stats`).
    """
    c = d.colls
    n_r = ranks.size
    if not len(c) or n_r == 0:
        return np.zeros(0, np.int64), np.zeros((n_r, 0), np.int64)
    cc = JobArrays.of(d, arrays).colls
    rank = cc.col("rank", np.int64)
    step = cc.col("step", np.int64)
    dur = cc.col("dur_ns", np.int64)
    # communicators numbered in name order, without a Python step per row
    first_id, distinct = cc.first_seen("group")
    names = sorted(distinct)
    code = {g: i for i, g in enumerate(names)}
    grp = np.asarray([code[g] for g in distinct], dtype=np.int64)[first_id]
    named = np.array([bool(g) for g in names], dtype=bool)[grp]
    # one row per (rank, communicator, step): the parts of a step cut by a window edge add up
    rgs, n_rgs, first = dense_ids(rank, grp, step)
    total = np.zeros(n_rgs, np.int64)
    np.add.at(total, rgs, dur)
    rank, grp, step, named = rank[first], grp[first], step[first], named[first]
    gs, n_gs, _ = dense_ids(grp, step)
    members = np.bincount(gs, minlength=n_gs)
    least = group_min(gs, total.astype(np.float64), n_gs).astype(np.int64)
    wait = np.where(named & (members[gs] > 1), total - least[gs], 0)
    steps = np.unique(step)
    slot = np.searchsorted(ranks, rank)
    ok = (slot < n_r) & (ranks[np.minimum(slot, n_r - 1)] == rank)
    si = np.searchsorted(steps, step)
    W = np.zeros((n_r, steps.size), np.int64)
    np.add.at(W, (slot[ok], si[ok]), wait[ok])
    seen = np.zeros((n_r, steps.size), bool)
    seen[slot[ok], si[ok]] = True
    return steps, np.where(seen, W, -1)


def copy_ns_per_step(d: WindowDigest, ranks: np.ndarray, arrays: JobArrays | None = None) -> np.ndarray:
    """(R,) each rank's host<->device copy time (memcpy records) per step, NaN without copies or steps."""
    f, r = d.fns, d.ranks
    n_r = ranks.size
    out = np.full(n_r, np.nan)
    if not len(f) or not len(r) or n_r == 0:
        return out
    cols = JobArrays.of(d, arrays)
    kind = cols.fns.col("kind", np.int64)
    sel = kind == _K_MEMCPY
    if not sel.any():
        return out
    frank = cols.fns.col("rank", np.int64)[sel]
    # int64 sums: the same total in any row order (batch and streaming)
    tot = cols.fns.col("total_ns", np.float64)[sel].round().astype(np.int64)
    slot = np.searchsorted(ranks, frank)
    ok = (slot < n_r) & (ranks[np.minimum(slot, n_r - 1)] == frank)
    copies = np.zeros(n_r, np.int64)
    np.add.at(copies, slot[ok], tot[ok])
    rr = cols.ranks.col("rank", np.int64)
    rslot = np.searchsorted(ranks, rr)
    rok = (rslot < n_r) & (ranks[np.minimum(rslot, n_r - 1)] == rr)
    steps = np.zeros(n_r, np.int64)
    np.add.at(steps, rslot[rok], cols.ranks.col("steps", np.int64)[rok])
    seen = np.zeros(n_r, bool)
    seen[slot[ok]] = True
    good = seen & (steps > 0)
    out[good] = copies[good] / steps[good]
    return out


def slow_copy_ranks(copies: np.ndarray, roles: dict[int, np.ndarray]) -> np.ndarray:
    """(R,) bool: ranks whose copies take :data:`SLOW_COPY_FACTOR` times their role's median and are an
    outlier among its ranks (:data:`OUTLIER_Z` robust sigmas): a slow PCIe path, which is also the
    GPU's path to its NIC (GPUDirect RDMA) and to its peers without NVLink."""
    out = np.zeros(copies.size, bool)
    for _, members in sorted(roles.items()):
        members = np.asarray(members, dtype=np.int64)
        c = copies[members]
        ok = np.isfinite(c)
        if ok.sum() < 3:
            continue
        typical = float(np.median(c[ok]))
        sigma = max(1.4826 * float(np.median(np.abs(c[ok] - typical))), MIN_SIGMA_NS)
        slow = ok & (c > SLOW_COPY_FACTOR * typical) & (c - typical > OUTLIER_Z * sigma) & (typical > 0)
        out[members[slow]] = True
    return out


def paced_transfers(d: WindowDigest, ranks: np.ndarray, steps: np.ndarray, pacer: np.ndarray,
                    arrays: JobArrays | None = None) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The communicators a member with a slow data path (``pacer``, (R,) bool) belongs to, with their
    transfer excess per step: (members, pacers, excess[S]).

    A collective moves data at its slowest hop's pace, and every member spends the same transfer time in
    it: the waits read it as the own work of all members alike, though only the member on the slow path
    holds it up (the others wait on it *inside* the transfer). The transfer of a communicator in a step
    is its least member's time (:func:`wait_matrix`); its excess, over the median of the communicators of
    the same shape (members, op) in that step: without the slow path it would move at their pace.
    Communicators without siblings tell no excess.
    """
    c = d.colls
    n_r = ranks.size
    if not len(c) or not pacer.any():
        return []
    cc = JobArrays.of(d, arrays).colls
    rank = cc.col("rank", np.int64)
    step = cc.col("step", np.int64)
    dur = cc.col("dur_ns", np.int64)
    p2p = cc.col("p2p", bool) if len(c.p2p) == len(c.rank) else np.zeros(rank.size, bool)
    ops = cc.col("op", np.int64) if len(c.op) == len(c.rank) else np.full(rank.size, -1)
    # communicators numbered in name order, without a Python step per row
    first_id, distinct = cc.first_seen("group")
    names = sorted(distinct)
    code = {g: i for i, g in enumerate(names)}
    grp = np.asarray([code[g] for g in distinct], dtype=np.int64)[first_id]
    slot = np.searchsorted(ranks, rank)
    ok = (slot < n_r) & (ranks[np.minimum(slot, n_r - 1)] == rank)
    members: dict[int, np.ndarray] = {}
    shape: dict[int, tuple[int, int]] = {}
    for g in range(len(names)):
        rows = np.flatnonzero((grp == g) & ok)
        # named collectives only: send / recv hold the pipeline bubble, not a transfer
        if not names[g] or rows.size == 0 or p2p[rows].any():
            continue
        m = np.zeros(n_r, bool)
        m[slot[rows]] = True
        if m.sum() < 2:
            continue
        members[g] = m
        shape[g] = (int(m.sum()), int(ops[rows].max()))
    if not any((m & pacer).any() for m in members.values()):
        return []
    # the transfer of each (communicator, step): its least member's summed time
    rgs, n_rgs, first = dense_ids(rank, grp, step)
    total = np.zeros(n_rgs, np.int64)
    np.add.at(total, rgs, dur)
    g1, s1 = grp[first], step[first]
    gs, n_gs, gfirst = dense_ids(g1, s1)
    least = group_min(gs, total.astype(np.float64), n_gs)
    gg, ss = g1[gfirst], s1[gfirst]
    si = np.searchsorted(steps, ss)
    inside = (si < steps.size) & (steps[np.minimum(si, steps.size - 1)] == ss)
    t = np.full((len(names), steps.size), np.nan)
    t[gg[inside], si[inside]] = least[inside]
    out = []
    for g, m in sorted(members.items()):
        if not (m & pacer).any():
            continue
        sib = [h for h in members if shape[h] == shape[g]]
        if len(sib) < 2:
            continue
        typical = np.nanmedian(t[sib], axis=0) if np.isfinite(t[sib]).any(axis=0).all() else None
        if typical is None:
            continue
        excess = np.nan_to_num(np.maximum(t[g] - typical, 0.0))
        out.append((m, m & pacer, excess))
    return out


def mean_step_ns(d: WindowDigest, ranks: np.ndarray, arrays: JobArrays | None = None) -> float:
    """Mean step time: per rank, first start to last end of its rows over its steps; median over ranks."""
    r = d.ranks
    if not len(r):
        return float("nan")
    rc = JobArrays.of(d, arrays).ranks
    rr = rc.col("rank", np.int64)
    ids, n, first = dense_ids(rr)
    lo = group_min(ids, rc.col("start_ns", np.float64), n)
    hi = group_max(ids, rc.col("end_ns", np.float64), n)
    steps = np.bincount(ids, weights=rc.col("steps", np.float64), minlength=n)
    per = (hi - lo) / np.maximum(steps, 1)
    keep = np.isin(rr[first], ranks) & (steps > 0) & np.isfinite(per) & (per > 0)
    return float(np.median(per[keep])) if keep.any() else float("nan")


def window_cost(d: WindowDigest, ranks: np.ndarray, roles: dict[int, np.ndarray],
                step_ns: float | None = None, arrays: JobArrays | None = None) -> WindowCost | None:
    """The window's S and what S_X needs; None without collectives or :data:`MIN_STEPS` common steps.

    ``ranks``: the window's ranks, sorted (``Patterns.ranks``); ``roles``: slot
    indices into ``ranks`` of the ranks that do the same work
    (``Layout.peer_groups``); ``step_ns``: the mean measured step time
    (default: :func:`mean_step_ns`); ``arrays``: ``d``'s columns, when the caller shares them.
    """
    arrays = JobArrays.of(d, arrays)
    steps, W = wait_matrix(d, ranks, arrays)
    # ranks that never wait in a collective here (none on this communicator set) pace nothing we can see
    active = (W >= 0).any(axis=1)
    if active.sum() < 2:
        return None
    common = (W[active] >= 0).all(axis=0)
    if common.sum() < MIN_STEPS:
        return None
    steps, W = steps[common], W[:, common]
    a = -W[active].astype(np.float64)
    kept = ranks[active]
    slots = np.flatnonzero(active)
    role_of = np.zeros(ranks.size, dtype=np.int64)
    for k, members in sorted(roles.items()):
        role_of[members] = k
    role_of = role_of[slots]
    ideal = np.empty_like(a)
    for k in np.unique(role_of):
        rows = np.flatnonzero(role_of == k)
        sub = a[rows]
        typical = np.median(sub, axis=0)[None, :]
        excess = sub - typical
        persistent = np.median(excess, axis=1)[:, None]
        rest = excess - persistent
        sigma = max(1.4826 * float(np.median(np.abs(rest))), MIN_SIGMA_NS)
        noise = np.where(rest > OUTLIER_Z * sigma, 0.0, rest)
        # a rank's own level differs from its peers' a little in a healthy job too (its GPU, its place in
        # the rings): that spread paces the job with or without a fault and is kept; only a level that is
        # an outlier among its role's levels is the fault's, and goes
        spread = max(1.4826 * float(np.median(np.abs(persistent - np.median(persistent)))), MIN_SIGMA_NS)
        natural = persistent <= np.median(persistent) + LEVEL_Z * spread
        ideal[rows] = typical + np.where(natural, persistent, np.minimum(persistent, 0.0)) + noise
    T = float(step_ns) if step_ns is not None else mean_step_ns(d, kept, arrays)
    if not np.isfinite(T) or T <= 0:
        return None
    gain = float(np.mean(a.max(axis=0) - ideal.max(axis=0)))
    ideal_ns = max(T - gain, 1.0)
    # communicators a member's slow data path paces (S_X only: S and the ideal do not change)
    full_roles = {k: np.flatnonzero(np.isin(slots, members)) for k, members in roles.items()}
    pacer = slow_copy_ranks(copy_ns_per_step(d, kept, arrays), full_roles)
    paced = tuple(paced_transfers(d, kept, steps, pacer, arrays))
    return WindowCost(ranks=kept, steps=steps, step_ns=T, measured=a, ideal=ideal, ideal_ns=ideal_ns,
                      slowdown=float(max(1.0, T / ideal_ns)), paced=paced)


def _pause_share(evidence: dict[str, Any]) -> float | None:
    """Sporadic host pauses' time over the pause-free steps' time (expected.pause_findings), or None."""
    e = evidence.get(PAUSES_FN)
    share = e.get("cost_share_of_step") if isinstance(e, dict) else None
    return float(share) if isinstance(share, (int, float)) and share > 0 else None


def lost_share(s_x: float) -> float:
    """Share of the job's throughput lost to a cost S_X."""
    return 1.0 - 1.0 / s_x if s_x > 0 else 0.0


# verdict fields are rounded: 4 decimals of a ratio (0.01%) are below any step-time noise
ROUND = 4


def declared_excess_ns(evidence: dict[str, Any], step_ns: float) -> float | None:
    """Per-step time that a finding the peer comparison cannot price says the job loses, from its evidence.

    Only causes invisible to the waits (every rank alike, or a whole pipeline stage, which is its own
    role), and only where the evidence holds a measured ideal:

    * a stage's compute over the other stages' median (``stages.py``): the pipeline runs at its
      slowest stage's pace, so that excess is on the critical path once per step;
    * the data loader on every rank's critical path (``loader_beta``): with enough workers the next
      batch is ready when asked for (prefetched), so the ideal is none of it;
    * a regression against the job's own history (``now_ns_per_step`` / ``reference_ns_per_step``):
      the excess of each function over its reference.

    * NCCL far below link speed and fabric congestion (:func:`network_excess_ns`): the transfers at the
      measured bandwidth less at the bandwidth a healthy RDMA fabric (and NVLink) reaches, bounded by
      the collectives' exposed time.

    Anything else (sporadic pauses: already outliers in the waits) declares nothing: None.
    """
    declared = declared_cause(evidence, step_ns)
    return None if declared is None else declared[1]


def declared_cause(evidence: dict[str, Any], step_ns: float, kept_wait_ns: float = 0.0) -> tuple[str, float] | None:
    """(what the cause is, its per-step excess) for :func:`declared_excess_ns`: several findings may
    declare one cause (a stage spread over two nodes gives one finding per node), counted once.
    ``kept_wait_ns``: the typical rank's waiting per step that the waits' ideal keeps
    (:meth:`WindowCost.kept_wait_ns`), for :func:`network_excess_ns`."""
    c = _declared(evidence, step_ns, kept_wait_ns)
    return None if c is None else (c[0], c[1])


def _declared(evidence: dict[str, Any], step_ns: float, kept_wait_ns: float = 0.0) -> tuple[str, float, bool] | None:
    """:func:`declared_cause` and whether its excess is already bounded by the critical path
    (the network's: by the collectives' exposed time)."""
    try:
        if isinstance(evidence.get("stage"), dict) and "compute_ns_per_step" in evidence:
            c = evidence["compute_ns_per_step"]
            return (f"stage {evidence['stage'].get('culprit')}",
                    max(0.0, float(c["culprit"]) - float(c["other_stages_median"])), False)
        if "loader_beta" in evidence:
            return "loader", max(0.0, float(evidence["loader_beta"]["median"])) * float(step_ns), False
        fns = sorted((k, v) for k, v in evidence.items()
                     if isinstance(v, dict) and "now_ns_per_step" in v and "reference_ns_per_step" in v)
        if fns:
            return ("regression " + ",".join(k for k, _ in fns),
                    sum(max(0.0, float(v["now_ns_per_step"]) - float(v["reference_ns_per_step"])) for _, v in fns),
                    False)
        net = network_excess_ns(evidence, kept_wait_ns)
        if net is not None:
            return net[0], net[1], True
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None


# --- the network's job-wide causes (expected.py's `config` and `network` findings) --------------------
# A slow fabric or NCCL off its RDMA path slows every rank alike: nobody waits for anybody, so the waits
# cannot price it. Its ideal is physical instead: the same bytes at the bandwidth NCCL reaches on a
# healthy path. The transfers are measured (per step, per communicator), so the excess is the transfer
# time at the measured bandwidth less the same bytes at the healthy one.
#
# NCCL's bus bandwidth over a healthy RDMA fabric as a share of the wire: RDMA reaches 80-95% of the
# link (expected.py's BW_CONFIG; nccl-tests busbw on 200/400 Gb/s InfiniBand and RoCE): the middle of
# that range. Either end moves the ideal transfer by about 8%, a few % of the ideal step at most.
RDMA_BUS_SHARE = 0.875
# NCCL's all-reduce bus bandwidth inside a node over NVLink, for a job whose intra-node collectives run
# off NVLink (P2P disabled: shared memory / PCIe): nccl-tests on 8 A100 SXM (NVLink 3, 300 GB/s per
# direction) reach ~230 GB/s. The oldest NVLink generation in common service: newer ones (H100 ~360-480
# GB/s) only make the excess larger, so this understates it rather than overstating it.
NVLINK_BUS_Bps = 230e9
# A declared cause cannot take the whole step: the ideal keeps at least 1% of the measured one (S <= 100).
MIN_IDEAL_SHARE = 0.01


def network_excess_ns(evidence: dict[str, Any], kept_wait_ns: float = 0.0) -> tuple[str, float] | None:
    """(cause, per-step excess) of a slow inter-node path or NVLink left unused, from a finding's evidence
    (:func:`.expected._collective_findings`); None where the evidence does not carry the transfer times.

    * inter-node (fabric congestion, ``congested_nodes``; NCCL below :data:`.expected.BW_CONFIG` of the
      link: its socket transport): the typical rank's inter-node transfer per step ``X`` at the measured
      bus-bandwidth share ``b`` of the link would take ``X b / RDMA_BUS_SHARE`` on a healthy fabric:
      the excess is ``X (1 - b / RDMA_BUS_SHARE)``. The rings of a congested fabric also stop finishing
      together (each link loses a different share in each call), and every rank waits for the slowest
      in the next collective: that waiting (the typical rank's waiting the waits' ideal keeps,
      ``kept_wait_ns``, the straggler part priced there already left out) is spread among transfers and
      shrinks with them, by the same factor;
    * NVLink unused (``nvlink_Bps``): the intra-node transfer per step at its measured bus bandwidth
      over what :data:`NVLINK_BUS_Bps` moves;
    * bounded by the collectives' time on the critical path (``collective_ns_per_step.exposed``: a
      collective overlapped with compute saves only its exposed part) less the waiting that is not
      the network's (the typical rank's waiting beyond the kept part: stragglers, priced by the waits).
    """
    exposure = evidence.get("collective_ns_per_step")
    if not isinstance(exposure, dict):
        return None
    parts: list[str] = []
    excess = 0.0
    kept = max(0.0, float(kept_wait_ns))
    share = evidence.get("inter_node_bandwidth_share_of_link")
    if isinstance(share, dict) and "transfer_ns_per_step" in share:
        b = float(share["median"])
        if np.isfinite(b) and ("congested_nodes" in evidence or b < BW_CONFIG):
            slower = max(0.0, 1.0 - b / RDMA_BUS_SHARE)
            excess += (float(share["transfer_ns_per_step"]) + kept) * slower
            parts.append("inter-node bandwidth")
    nv = evidence.get("nvlink_Bps")
    if isinstance(nv, dict) and "intra_node_transfer_ns_per_step" in nv:
        bus = float(nv["intra_node_bus_Bps"])
        if np.isfinite(bus) and bus > 0:
            excess += float(nv["intra_node_transfer_ns_per_step"]) * max(0.0, 1.0 - bus / NVLINK_BUS_Bps)
            parts.append("nvlink")
    if not parts:
        return None
    not_network = max(0.0, float(exposure["waiting"]) - kept)
    bound = max(0.0, float(exposure["exposed"]) - not_network)
    return " + ".join(parts), float(min(excess, bound))


_NONE: dict[str, float | None] = {"job_slowdown": None, "cost": None, "gpu_hours_lost_per_hour": None}


def finding_costs(wc: WindowCost | None, findings: list[Finding], world: int) -> list[dict[str, float | None]]:
    """The optional verdict fields of each finding of one job window, in order.

    ``job_slowdown`` (S) is the window's: the waits' ideal (:func:`window_cost`) less the per-step
    excess that job-wide and stage findings declare (:func:`declared_excess_ns`; these are invisible
    to the waits, so nothing is counted twice). ``cost`` (S_X): for a finding that declares its
    excess, (ideal + excess) / ideal; for one that blames some ranks, those ranks keeping their
    measured own work (:meth:`WindowCost.cost_of`, over the same ideal); None for a hang, and for a
    finding that blames no rank or every rank and declares nothing. ``gpu_hours_lost_per_hour`` =
    ``world`` x (1 - 1/cost).
    """
    if wc is None:
        return [dict(_NONE) for _ in findings]
    declared: dict[int, float] = {}
    causes: dict[str, float] = {}
    bounded: set[str] = set()
    kept = wc.kept_wait_ns()
    for i, f in enumerate(findings):
        if f.kind == "slow" and (f.scope == "job" or isinstance(f.evidence.get("stage"), dict)):
            c = _declared(f.evidence, wc.step_ns, kept)
            if c is not None and c[1] > 0:
                declared[i] = c[1]
                causes[c[0]] = max(causes.get(c[0], 0.0), c[1])
                if c[2]:
                    bounded.add(c[0])
    # the ideal keeps at least half the measured step: a step cannot be more than twice what it would be
    # without a declared cause unless that cause's evidence is wrong (then its cost is capped at 2x).
    # The network's causes are bounded by the collectives' exposed time instead (a job held up by
    # sockets for 80% of its step is 5x slower than it should be): they come off after that cap.
    unbounded = sum(v for k, v in causes.items() if k not in bounded)
    ideal = max(wc.ideal_ns - unbounded, 0.5 * wc.ideal_ns, 1.0)
    ideal = max(ideal - sum(v for k, v in causes.items() if k in bounded), MIN_IDEAL_SHARE * wc.step_ns, 1.0)
    base = {"job_slowdown": round(max(1.0, wc.step_ns / ideal), ROUND)}
    world = world or int(wc.ranks.size)
    out = []
    for i, f in enumerate(findings):
        s_x = None
        paused = _pause_share(f.evidence)
        if f.kind == "hang":
            pass
        elif i in declared:
            s_x = (ideal + declared[i]) / ideal
        elif paused is not None:
            # host pauses on varying ranks: outliers of the waits, which the ideal already replaced by the
            # typical level (window_cost), so they are no declared cause (nothing counted twice). Their
            # finding measured them against the pause-free steps' time over its windows: S_X = 1 + share
            s_x = 1.0 + paused
        else:
            mine = set(int(r) for r in f.culprits) & set(wc.ranks.tolist())
            if mine and len(mine) < wc.ranks.size:
                s_x = (ideal + wc.extra_of(sorted(mine))) / ideal
        if s_x is None:
            out.append({**_NONE, **base})
            continue
        s_x = round(max(1.0, s_x), ROUND)
        out.append({**base, "cost": s_x, "gpu_hours_lost_per_hour": round(lost_gpu_hours_per_hour(world, s_x), ROUND)})
    return out
