"""The peer test: the same function on ranks of the same role, compared robustly.

For every non-collective function and every role (pipeline stage) we compare
each rank's per-step cost with the median of the *other* ranks. A cell is
abnormal when it is clearly slower (ratio), significantly so (robust z) and
the difference matters for the step (material share). Collectives are never
compared this way: their duration measures waiting, which points at victims.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

import numpy as np

from eroica.models.records import UNTRACED_FN

from .patterns import K_COLL, K_IO, K_KERNEL, K_LOADER, K_MEMCPY, Patterns
from .robust import MAD_TO_SIGMA, column_leave_one_out_medians, column_medians, leave_one_out_median, robust_z

MIN_PEERS = 4        # fewer ranks in a role cannot tell an outlier from a pair
MIN_RATIO = 1.10     # 10% slower than the peers' median
MIN_Z = 5.0          # k = 5 MADs, as in the paper
# A single function's excess may be small (one of ten memory-bound kernels); what
# must matter is the rank's total (RANK_MATERIAL in the detector). Per cell we only
# drop crumbs below 0.2% of the step.
MIN_MATERIAL = 0.002

CATEGORIES = ("kernel", "memcpy", "loader", "host")


def category_of(kind: int) -> str:
    if kind == K_KERNEL:
        return "kernel"
    if kind == K_MEMCPY:
        return "memcpy"
    if kind in (K_LOADER, K_IO):
        return "loader"
    return "host"


@dataclass
class Cell:
    """One abnormal (rank, function)."""

    slot: int
    fn: int
    value: float
    peer_median: float
    ratio: float
    z: float
    excess: float   # ns per step
    n_peers: int
    other_nodes: bool = False  # judged against its role's ranks on other nodes only (:func:`node_cells`)
    job_wide: bool = False     # judged against every rank of the job (:func:`stage_agnostic_cells`)


def _tested(p: Patterns, f: int, kernels: bool | None) -> bool:
    """Whether function ``f`` takes the peer test (never collectives; kernels or the rest when asked)."""
    return not (p.fn_kinds[f] == K_COLL or (kernels is not None and (p.fn_kinds[f] == K_KERNEL) != kernels))


def _hit(ratio: np.ndarray, z: np.ndarray, excess: np.ndarray, step: float) -> np.ndarray:
    """The peer test's three bars, all needed: slower by a factor, far outside the peers' spread, and material."""
    return (ratio >= MIN_RATIO) & (z >= MIN_Z) & (excess >= MIN_MATERIAL * step)


def abnormal_cells(p: Patterns, roles: dict[int, np.ndarray], kernels: bool | None = None) -> list[Cell]:
    """Abnormal (rank, function) cells; ``kernels`` True/False restricts the test to GPU kernels / to the rest."""
    step = float(np.nanmedian(p.step_time_ns)) if p.step_time_ns.size else 0.0
    cells: list[Cell] = []
    if step <= 0:
        return cells
    metric = p.per_step_ns
    tested = [f for f in range(metric.shape[1]) if _tested(p, f, kernels)]
    # Floors at 0.1% of a step: a function that costs peers ~nothing gives finite ratios and z.
    floor = 0.001 * step
    for members in roles.values():
        if members.size < MIN_PEERS or not tested:
            continue
        block = metric[np.ix_(members, np.asarray(tested, dtype=np.intp))]
        whole = np.isfinite(block).all(axis=0)
        # the functions every member runs, all at once (the same statistics, column by column)
        hits = _column_hits(block[:, whole], step, floor)
        for j, f in enumerate(tested):
            if whole[j]:
                x, loo, ratio, z, excess, hit = hits[int(np.count_nonzero(whole[:j]))]
                chosen, ok_n = members, members.size
            else:
                col = block[:, j]
                ok = np.isfinite(col)
                if ok.sum() < MIN_PEERS:
                    continue
                x = col[ok]
                loo = leave_one_out_median(x)
                z, _, _ = robust_z(x, abs_floor=floor)
                ratio = x / np.maximum(loo, floor)
                excess = x - loo
                hit = _hit(ratio, z, excess, step)
                chosen, ok_n = members[ok], int(ok.sum())
            for i in np.flatnonzero(hit):
                cells.append(Cell(int(chosen[i]), f, float(x[i]), float(loo[i]), float(ratio[i]),
                                  float(z[i]), float(excess[i]), ok_n - 1))
    return cells


_Stats = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _column_hits(block: np.ndarray, step: float, floor: float) -> list[_Stats]:
    """The peer test of each column of ``block`` (finite values), as one column at a time would run it:
    (x, leave-one-out median, ratio, z, excess, hit) per column.

    The order statistics come from one sort of the block (:func:`.robust.column_medians`,
    :func:`.robust.column_leave_one_out_medians`: ``np.median``'s and
    :func:`.robust.leave_one_out_median`'s very bits), the rest is element-wise.
    """
    if block.shape[1] == 0:
        return []
    loo = column_leave_one_out_medians(block)
    med = column_medians(block)
    mad = column_medians(np.abs(block - med)) * MAD_TO_SIGMA
    # robust_z's scale: max(mad, |median| * rel_floor, abs_floor), in the same float operations
    scale = np.maximum(np.maximum(mad, np.abs(med) * 0.02), floor)
    scale = np.where(np.isnan(mad), mad, scale)
    z = (block - med) / scale
    ratio = block / np.maximum(loo, floor)
    excess = block - loo
    hit = _hit(ratio, z, excess, step)
    return [(block[:, j], loo[:, j], ratio[:, j], z[:, j], excess[:, j], hit[:, j]) for j in range(block.shape[1])]


def host_category_cells(p: Patterns, roles: dict[int, np.ndarray]) -> list[Cell]:
    """Cells of a rank whose host functions, *summed*, stand out from its role's, though none does alone.

    A CPU-starved process (another job's threads on its cores, a runaway agent)
    slows every host function by the same factor. Where they are many and each is
    short (forward and backward launch loops of 1-3 ms in a 0.5 s step) no single
    one clears the peer test's floor of 0.1% of a step in spread, while their sum
    costs the step 2%: the independent generator's CPU contention on a node, 3-4x
    slower in every host frame, went unseen. The sum over the category is the
    statistic of that cause, tested as one function with the peer test's bars
    (:func:`_hit`; the floor is still 0.1% of a step, now of the sum). For a rank
    it flags, each host function at least :data:`MIN_RATIO` slower than its peers
    and above the per-cell crumb is a cell, with the sum's z (the rank's finding
    then adds them up and must still reach the detector's RANK_MATERIAL).
    Loader, I/O, kernels, copies and collectives keep their own tests.
    """
    step = float(np.nanmedian(p.step_time_ns)) if p.step_time_ns.size else 0.0
    cells: list[Cell] = []
    host = [f for f in range(len(p.fn_names)) if _tested(p, f, False) and category_of(int(p.fn_kinds[f])) == "host"]
    if step <= 0 or len(host) < 2:
        return cells
    floor = 0.001 * step
    metric = p.per_step_ns[:, host]
    for members in roles.values():
        if members.size < MIN_PEERS:
            continue
        block = metric[members]
        # functions most of the role runs (a function some ranks lack would make their sums unlike)
        common = np.isfinite(block).mean(axis=0) >= 0.5
        if common.sum() < 2:
            continue
        total = np.nansum(block[:, common], axis=1)
        loo = leave_one_out_median(total)
        z, _, _ = robust_z(total, abs_floor=floor)
        ratio = total / np.maximum(loo, floor)
        hit = _hit(ratio, z, total - loo, step)
        if not hit.any():
            continue
        # each common function's leave-one-out medians, once per role (NaN where a rank lacks it
        # or too few ranks run it), read below for every flagged rank
        peer_med = np.full(block.shape, np.nan)
        n_ok = np.isfinite(block).sum(axis=0)
        for j in np.flatnonzero(common & (n_ok >= MIN_PEERS)):
            ok = np.isfinite(block[:, j])
            peer_med[ok, j] = leave_one_out_median(block[ok, j])
        for i in np.flatnonzero(hit):
            for j in np.flatnonzero(common):
                if not np.isfinite(peer_med[i, j]):
                    continue
                med = float(peer_med[i, j])
                v = float(block[i, j])
                r = v / max(med, floor)
                if r >= MIN_RATIO and v - med >= MIN_MATERIAL * step:
                    cells.append(Cell(int(members[i]), host[int(j)], v, med, r, float(z[i]), v - med, int(n_ok[j]) - 1))
    return cells


def node_cells(p: Patterns, roles: dict[int, np.ndarray], rank_node: dict[int, str],
               kernels: bool | None = None) -> list[Cell]:
    """Abnormal cells of a node that holds half or more of its role, judged against the role's other nodes.

    The median and the MAD break down at half the sample: when one node carries
    half a role (a pipeline stage of two nodes, 8 of 16 ranks), its slow ranks
    *are* the role's median, and :func:`abnormal_cells` cannot tell which half is
    slow (an independent generator's CPU contention on such a layout: forward
    frames 1.56 s per step beside 9 ms, no finding). Such a node's ranks are
    compared with the role's ranks on other nodes only (their median, and their
    MAD for the spread), one-sided like the peer test and with its thresholds. Which
    half is slower is then plain; whether it also *paces* the job is left to the
    waits, as for any rank finding (a straggler waits least).
    """
    step = float(np.nanmedian(p.step_time_ns)) if p.step_time_ns.size else 0.0
    cells: list[Cell] = []
    if step <= 0:
        return cells
    floor = 0.001 * step  # the peer test's floor
    metric = p.per_step_ns
    for members in roles.values():
        names = [rank_node.get(r, "") for r in p.ranks[members].tolist()]
        held = Counter(names)
        # below half the role the plain peer test sees it (and < MIN_PEERS others tell nothing)
        big = [n for n in sorted(held) if n and 2 * held[n] >= members.size and members.size - held[n] >= MIN_PEERS]
        if not big:
            continue
        nodes = np.array(names)
        for node in big:
            mine = nodes == node
            for f in range(metric.shape[1]):
                if not _tested(p, f, kernels):
                    continue
                col = metric[members, f]
                ok = np.isfinite(col)
                rest = col[~mine & ok]
                if rest.size < MIN_PEERS:
                    continue
                _, med, scale = robust_z(rest, abs_floor=floor)
                x = col[mine & ok]
                ratio = x / max(med, floor)
                hit = _hit(ratio, (x - med) / scale, x - med, step)
                for i in np.flatnonzero(hit):
                    cells.append(Cell(int(members[mine & ok][i]), f, float(x[i]), med, float(ratio[i]),
                                      float((x[i] - med) / scale), float(x[i] - med), int(rest.size), True))
    return cells


def role_ratio(p: Patterns, members: np.ndarray, fns: np.ndarray, slot: int) -> float:
    """Slowdown of ``slot`` over its role on a set of functions (sum of per-step costs)."""
    if fns.size == 0:
        return 1.0
    m = np.nan_to_num(p.per_step_ns[np.ix_(members, fns)])
    mine = m[members == slot].sum()
    others = np.median(m[members != slot].sum(axis=1)) if members.size > 1 else np.nan
    return float(mine / others) if others and np.isfinite(others) and others > 0 else 1.0


def stage_agnostic(p: Patterns, f: int) -> bool:
    """Work whose cost does not depend on the rank's stage or role: feeding a batch (loader, file
    reads) and the training loop's own code outside any traced call. Every rank of a job runs the
    same loop over batches of the same size, whatever layers it holds."""
    return int(p.fn_kinds[f]) in (K_LOADER, K_IO) or p.fn_names[f] == UNTRACED_FN


def stage_agnostic_cells(p: Patterns, roles: dict[int, np.ndarray]) -> list[Cell]:
    """Abnormal stage-agnostic cells of ranks whose role is too small for the peer test, judged job-wide.

    A pipeline of few ranks per stage (4 stages of one rank) leaves each role
    without peers, yet its ranks load batches and run their loop alike: those
    functions are compared across every rank of the job instead.
    """
    small = np.zeros(p.ranks.size, dtype=bool)
    for members in roles.values():
        if members.size < MIN_PEERS:
            small[members] = True
    if not small.any() or p.ranks.size < MIN_PEERS:
        return []
    everyone = {0: np.arange(p.ranks.size)}
    return [dataclasses.replace(c, job_wide=True) for c in abnormal_cells(p, everyone, kernels=False)
            if small[c.slot] and stage_agnostic(p, c.fn)]
