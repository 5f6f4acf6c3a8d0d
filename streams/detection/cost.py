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
history) and :func:`finding_costs` removes it from the ideal too. Limits
(stated, not hidden): NCCL far below link speed and fabric congestion have no
measured ideal bandwidth, so their verdicts carry no ``cost`` and ``S`` does
not include them; several stragglers at *different* synchronisation points
of a step (a throttled GPU and a slow rail ring) add up in the job but the
per-step maximum counts only the larger (``eroica bench cost``: two faults
read ~6% low).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eroica.models.digest import WindowDigest

from .grouping import dense_ids, group_max, group_min

# A cell whose own work exceeds its rank's persistent level by more than this many
# robust sigmas (1.4826 x MAD of all cells of its role) is a fault, not noise: the
# peer test's own threshold (z >= 5); under normal noise P(z > 5) = 3e-7, so in a
# window of 64 ranks x 30 steps (~2,000 cells) the chance of one noise cell
# counted as a fault is ~6e-4.
OUTLIER_Z = 5.0
# Fewer complete steps cannot tell a persistent excess from a one-off (the median's
# breakdown point, as MIN_WINDOW_STEPS in steps.py).
MIN_STEPS = 3
# MAD of 0 (perfectly regular ranks, e.g. a replayed trace): the noise floor is one
# microsecond, below any collective's launch cost, so no exact tie is read as an outlier.
MIN_SIGMA_NS = 1_000.0


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

    def extra_of(self, ranks) -> float:
        """Mean per-step time the job loses when only ``ranks`` keep their measured own work."""
        mask = np.isin(self.ranks, np.asarray(list(ranks), dtype=np.int64))
        if not mask.any():
            return 0.0
        scen = np.where(mask[:, None], self.measured, self.ideal)
        return float(np.mean(scen.max(axis=0) - self.ideal.max(axis=0)))

    def cost_of(self, ranks) -> float:
        """S_X for X = ``ranks`` (those keep their measured own work, all other ranks ideal)."""
        if self.ideal_ns <= 0:
            return 1.0
        return float(max(1.0, (self.ideal_ns + self.extra_of(ranks)) / self.ideal_ns))

    def costs_by(self, groups: dict[str, list[int]]) -> dict[str, float]:
        return {k: self.cost_of(v) for k, v in groups.items()}


def lost_gpu_hours_per_hour(world: int, s_x: float) -> float:
    """GPU-hours lost per hour of the job to a cost S_X: world x (1 - 1/S_X)."""
    return float(world) * (1.0 - 1.0 / s_x) if s_x > 0 else 0.0


def wait_matrix(d: WindowDigest, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(steps, W[R, S]): collective waiting per rank and step, int64 ns; -1 where a rank has no row.

    Per (communicator, step) the member with the least summed time waited
    least; the others' excess is waiting. Communicators without a name, and
    calls no other rank joined, tell nothing about waiting (as in
    :func:`.collectives.collective_stats`).
    """
    c = d.colls
    n_r = ranks.size
    if not c.rank or n_r == 0:
        return np.zeros(0, np.int64), np.zeros((n_r, 0), np.int64)
    rank = np.asarray(c.rank, dtype=np.int64)
    step = np.asarray(c.step, dtype=np.int64)
    dur = np.asarray(c.dur_ns, dtype=np.int64)
    names = sorted(set(c.group))
    code = {g: i for i, g in enumerate(names)}
    grp = np.fromiter((code[g] for g in c.group), dtype=np.int64, count=len(c.group))
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


def mean_step_ns(d: WindowDigest, ranks: np.ndarray) -> float:
    """Mean step time: per rank, first start to last end of its rows over its steps; median over ranks."""
    r = d.ranks
    if not r.rank:
        return float("nan")
    rr = np.asarray(r.rank, dtype=np.int64)
    ids, n, first = dense_ids(rr)
    lo = group_min(ids, np.asarray(r.start_ns, dtype=np.float64), n)
    hi = group_max(ids, np.asarray(r.end_ns, dtype=np.float64), n)
    steps = np.bincount(ids, weights=np.asarray(r.steps, dtype=np.float64), minlength=n)
    per = (hi - lo) / np.maximum(steps, 1)
    keep = np.isin(rr[first], ranks) & (steps > 0) & np.isfinite(per) & (per > 0)
    return float(np.median(per[keep])) if keep.any() else float("nan")


def window_cost(d: WindowDigest, ranks: np.ndarray, roles: dict[int, np.ndarray],
                step_ns: float | None = None) -> WindowCost | None:
    """The window's S and what S_X needs; None without collectives or :data:`MIN_STEPS` common steps.

    ``ranks``: the window's ranks, sorted (``Patterns.ranks``); ``roles``: slot
    indices into ``ranks`` of the ranks that do the same work
    (``Layout.peer_groups``); ``step_ns``: the mean measured step time
    (default: :func:`mean_step_ns`).
    """
    steps, W = wait_matrix(d, ranks)
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
        ideal[rows] = typical + np.minimum(persistent, 0.0) + noise
    T = float(step_ns) if step_ns is not None else mean_step_ns(d, kept)
    if not np.isfinite(T) or T <= 0:
        return None
    gain = float(np.mean(a.max(axis=0) - ideal.max(axis=0)))
    ideal_ns = max(T - gain, 1.0)
    return WindowCost(ranks=kept, steps=steps, step_ns=T, measured=a, ideal=ideal, ideal_ns=ideal_ns,
                      slowdown=float(max(1.0, T / ideal_ns)))


def lost_share(s_x: float) -> float:
    """Share of the job's throughput lost to a cost S_X."""
    return 1.0 - 1.0 / s_x if s_x > 0 else 0.0


# verdict fields are rounded: 4 decimals of a ratio (0.01%) are below any step-time noise
ROUND = 4


def declared_excess_ns(evidence: dict, step_ns: float) -> float | None:
    """Per-step time that a finding the peer comparison cannot price says the job loses, from its evidence.

    Only causes invisible to the waits (every rank alike, or a whole pipeline stage, which is its own
    role), and only where the evidence holds a measured ideal:

    * a stage's compute over the other stages' median (``stages.py``): the pipeline runs at its
      slowest stage's pace, so that excess is on the critical path once per step;
    * the data loader on every rank's critical path (``loader_beta``): with enough workers the next
      batch is ready when asked for (prefetched), so the ideal is none of it;
    * a regression against the job's own history (``now_ns_per_step`` / ``reference_ns_per_step``):
      the excess of each function over its reference.

    Anything else (NCCL far below link speed, fabric congestion: their ideal bandwidth is not measured
    here; sporadic pauses: already outliers in the waits) declares nothing: None.
    """
    declared = declared_cause(evidence, step_ns)
    return None if declared is None else declared[1]


def declared_cause(evidence: dict, step_ns: float) -> tuple[str, float] | None:
    """(what the cause is, its per-step excess) for :func:`declared_excess_ns`: several findings may
    declare one cause (a stage spread over two nodes gives one finding per node), counted once."""
    try:
        if isinstance(evidence.get("stage"), dict) and "compute_ns_per_step" in evidence:
            c = evidence["compute_ns_per_step"]
            return (f"stage {evidence['stage'].get('culprit')}",
                    max(0.0, float(c["culprit"]) - float(c["other_stages_median"])))
        if "loader_beta" in evidence:
            return "loader", max(0.0, float(evidence["loader_beta"]["median"])) * float(step_ns)
        fns = sorted((k, v) for k, v in evidence.items()
                     if isinstance(v, dict) and "now_ns_per_step" in v and "reference_ns_per_step" in v)
        if fns:
            return ("regression " + ",".join(k for k, _ in fns),
                    sum(max(0.0, float(v["now_ns_per_step"]) - float(v["reference_ns_per_step"])) for _, v in fns))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None


_NONE: dict[str, float | None] = {"job_slowdown": None, "cost": None, "gpu_hours_lost_per_hour": None}


def finding_costs(wc: WindowCost | None, findings: list, world: int) -> list[dict[str, float | None]]:
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
    for i, f in enumerate(findings):
        if f.kind == "slow" and (f.scope == "job" or isinstance(f.evidence.get("stage"), dict)):
            c = declared_cause(f.evidence, wc.step_ns)
            if c is not None and c[1] > 0:
                declared[i] = c[1]
                causes[c[0]] = max(causes.get(c[0], 0.0), c[1])
    # the ideal keeps at least half the measured step: a step cannot be more than twice what it would be
    # without a declared cause unless that cause's evidence is wrong (then its cost is capped at 2x)
    ideal = max(wc.ideal_ns - sum(causes.values()), 0.5 * wc.ideal_ns, 1.0)
    base = {"job_slowdown": round(max(1.0, wc.step_ns / ideal), ROUND)}
    world = world or int(wc.ranks.size)
    out = []
    for i, f in enumerate(findings):
        s_x = None
        if f.kind == "hang":
            pass
        elif i in declared:
            s_x = (ideal + declared[i]) / ideal
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
