"""Behaviour patterns: per window, per (rank, function) summaries.

A pattern carries no timestamps (only durations, counts and shares), so ranks
need no clock synchronisation to be compared. The matrices are dense
``ranks x functions`` arrays (NaN where a rank never ran a function): peer
comparison is then a column-wise operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eroica.models.columns import KIND_CODE, Columns, concat
from eroica.models.digest import INTERIOR, FnRows, InFlightRows, RankRows, WindowDigest

from .grouping import (dense_ids, dense_ids_only, group_count, group_max, group_min, group_quantiles, group_sorted,
                       group_sum, group_weighted_median, sorted_quantiles)
from .intervals import exclusive_time, exclusive_time_on_axis, on_axis

K_KERNEL = KIND_CODE["kernel"]
K_MEMCPY = KIND_CODE["memcpy"]
K_COLL = KIND_CODE["collective"]
K_PYTHON = KIND_CODE["python"]
K_LOADER = KIND_CODE["dataloader"]
K_OPTIM = KIND_CODE["optimizer"]
K_IO = KIND_CODE["io"]
K_OTHER = KIND_CODE["other"]

# Critical-path priority: GPU compute > memory op > collective > host (deeper frames first).
_LEVEL_OF_KIND = np.full(16, 3, dtype=np.int64)
_LEVEL_OF_KIND[K_KERNEL] = 0
_LEVEL_OF_KIND[K_MEMCPY] = 1
_LEVEL_OF_KIND[K_COLL] = 2
HOST_LEVEL = 3
_LEVEL_OF_KIND_16 = _LEVEL_OF_KIND.astype(np.int16)

# Functions whose own duration is their cost; host spans that enclose GPU work or
# collectives (python, optimizer) are judged by their exclusive time instead,
# so that time spent waiting inside them is not read as slowness.
_OWN_DURATION_KINDS = (K_KERNEL, K_MEMCPY, K_LOADER, K_IO, K_COLL)
# Functions that wait on a producer's queue (data loading, file reads): their cost comes in stalls.
_STALL_KINDS = (K_LOADER, K_IO)
# 5% (nearest rank: the 3rd-best of 40 steps): robust to a couple of odd fast
# steps, yet below a regression that started a few steps into the window.
LOW_Q = 0.05
# Rows of at least this many steps set a cell's reference level whatever their calls
# (_level): as the job window's minimum of whole steps (steps.MIN_WINDOW_STEPS).
LEVEL_STEPS = 3


@dataclass
class Patterns:
    """Per (rank, function) behaviour of one job window."""

    ranks: np.ndarray            # (R,) global ranks, sorted
    fn_names: list[str]          # (F,)
    fn_stacks: list[str]         # (F,)
    fn_kinds: np.ndarray         # (F,) kind codes
    count: np.ndarray            # (R, F) executions in the window
    total_ns: np.ndarray         # (R, F) summed duration
    excl_ns: np.ndarray          # (R, F) summed critical-path (exclusive) time
    median_ns: np.ndarray        # (R, F) duration quantiles
    p90_ns: np.ndarray
    p99_ns: np.ndarray
    per_step_ns: np.ndarray      # (R, F) median over steps of the per-step cost
    low_ns: np.ndarray           # (R, F) low quantile over steps of the per-step cost (best steady level)
    beta: np.ndarray             # (R, F) share of the rank's step time on the critical path
    steps: np.ndarray            # (R,) distinct steps seen
    step_time_ns: np.ndarray     # (R,) median step span
    window_ns: int
    sporadic: np.ndarray         # (R, F) ran in fewer than half the rank's steps (cost = mean per step)
    # The rows behind the level the job's regression reference takes (cell, low, steps, calls,
    # n_cells: see _level); None: low_ns. Kept, not computed: once the reference holds its
    # windows (regression.REFERENCE_WINDOWS) no window needs it, and it cost ~8% of this build.
    ref_rows: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None = field(default=None, repr=False)
    _ref_low: np.ndarray | None = field(default=None, repr=False)

    @property
    def reference_low_ns(self) -> np.ndarray:
        """(R, F) low_ns less the one-step rows that ran the function fewer times than usual (records lost,
        not speed: :func:`_level`), computed on first use."""
        if self.ref_rows is None:
            return self.low_ns
        if self._ref_low is None:
            cell, low, steps, calls, n_cells = self.ref_rows
            n_f = len(self.fn_names)
            self._ref_low = _level(cell, low, steps, calls, n_cells).reshape(self.ranks.size, max(n_f, 1))[:, :n_f]
        return self._ref_low

    def slot(self, rank: int) -> int:
        return int(np.searchsorted(self.ranks, rank))

    def fn_label(self, f: int) -> str:
        return self.fn_names[f]


def stack_depths(cols: Columns) -> np.ndarray:
    """Frames in each stack of the vocabulary (0 when no stack)."""
    vocab = cols.vocab.get("stack", [])
    depth = np.fromiter((s.count(";") + 1 if s else 0 for s in vocab), dtype=np.int64, count=len(vocab))
    return depth[cols.arrays["stack"]] if len(vocab) else np.zeros(len(cols), dtype=np.int64)


def summarise_fn(fn: Columns, window_end_ns: int | None = None,
                 cont: Columns | None = None) -> tuple[FnRows, RankRows, InFlightRows]:
    """Per-rank patterns of the finished executions in a window (the summariser's work).

    ``cont``: the window's continuations (:func:`.windows.continuations`),
    spans of earlier windows that reach into this one. They enclose what
    they cover here like any span, and their exclusive time here is
    credited to their (rank, function, step) row, whose step is then an
    edge step; they add no call (count, durations and quantiles are the
    window's own records'), no step span, and no cost to kinds judged by
    their own duration (the whole duration went to the window they started in).

    Everything here is computed per rank, so the rows of a rank do not depend
    on which other ranks were summarised with it: partitions may split ranks
    any way and the merged digest is the same.

    Its cost is the summariser's (``eroica bench throughput``). Ranks are
    taken in blocks of about ``_BLOCK_RECORDS`` records, in rank order (so
    the rows come in the same order as from the whole window): every
    temporary is then the size of a block, whose memory the next block
    reuses, where temporaries the size of the window each cost a page fault
    per 4 KiB (~3 us on a VM: a third of the time), and a block's sorts fit in
    cache. In a block, records are put in (rank, time) order once (a stable
    sort, cheap on records that come nearly so, as frames do), which the
    critical path needs anyway; from it, one more stable sort groups them by
    (row, step), and the durations of each row are sorted as runs. Groupings
    that need no order use tables (:func:`.grouping.dense_ids_only`), and sums
    are taken in record order, so every float is the one a plain
    ``np.bincount`` over the records gives.
    """
    inflight = _in_flight_rows(fn)
    done = ~fn.arrays["in_flight"]
    every = bool(done.all())
    is_cont: np.ndarray | None = None
    if cont is not None and len(cont):
        own = fn if every else fn.take(done)
        fn = concat([own, cont])  # one vocabulary for both
        is_cont = np.arange(len(fn)) >= len(own)
        a = {k: fn.arrays[k] for k in _FN_COLUMNS}
    else:
        a = {k: fn.arrays[k] if every else fn.arrays[k][done] for k in _FN_COLUMNS}  # read only: no copy
        if not done.any():
            return FnRows(), RankRows(), inflight
    # Offsets from the window's first event: exclusive time only needs relative positions.
    base = int(a["ts_ns"].min())
    # Spans are clipped to the window: what an enclosing frame (a 40 s train_step)
    # covers after the window's end is covered by records of the *next* window,
    # which this one does not see; unclipped, it would all read as host time.
    clip = None if window_end_ns is None else max(int(window_end_ns) - base, 0)
    host_level = _host_levels(a["stack"], fn.vocab.get("stack", []))
    blocks = _rank_blocks(a["rank"], _BLOCK_RECORDS)
    parts = []
    for rows in blocks:
        part = _summarise_ranks({k: a[k][rows] for k in _FN_COLUMNS}, fn.vocab, base, clip, host_level,
                                single=len(blocks) == 1, cont=None if is_cont is None else is_cont[rows])
        if part is None:  # spans that reach past their rank's share of the axis: the whole window at once
            parts = [_summarise_ranks({k: a[k] for k in _FN_COLUMNS}, fn.vocab, base, clip, host_level, single=True,
                                      cont=is_cont)]
            break
        parts.append(part)
    fns = FnRows(**{k: _joined([p[0][k] for p in parts if p is not None]) for k in FnRows.__struct_fields__})
    ranks = RankRows(**{k: _joined([p[1][k] for p in parts if p is not None]) for k in RankRows.__struct_fields__})
    return fns, ranks, inflight


def _joined(columns: list[np.ndarray]) -> list[Any]:
    """The blocks' values of one column as one list (one conversion, not one per block)."""
    out: list[Any] = (columns[0] if len(columns) == 1 else np.concatenate(columns)).tolist()
    return out


# Records per block of ranks (whole ranks: a block may hold more).
_BLOCK_RECORDS = 1 << 16
_FN_COLUMNS = ("rank", "fn", "stack", "kind", "ts_ns", "dur_ns", "step", "node")


def _rank_blocks(rank: np.ndarray, target: int) -> list[slice | np.ndarray]:
    """The records of consecutive ranks, about ``target`` at a time, in rank order; each block in record order.

    A block is a slice where its records are consecutive (frames come rank by
    rank), an index array otherwise.
    """
    if rank.size <= target:
        return [slice(None)]
    if bool((rank[1:] >= rank[:-1]).all()):  # rank by rank: cut at the first rank change past each multiple
        cuts = np.unique(np.searchsorted(rank, rank[target::target], side="left")).tolist()
        edges = [0, *(c for c in cuts if c > 0), rank.size]
        return [slice(lo, hi) for lo, hi in zip(edges[:-1], edges[1:])]
    lo_rank = int(rank.min())
    shifted = rank - lo_rank if int(rank.max()) - lo_rank < 4 * rank.size else dense_ids_only(rank)[0]
    counts = np.bincount(shifted)
    blk_of_rank = np.cumsum(counts) // max(target, 1)
    blk_of_rank -= blk_of_rank[counts > 0][0]
    n_blk = int(blk_of_rank[-1]) + 1
    if n_blk == 1:
        return [slice(None)]
    blk = (blk_of_rank.astype(np.uint16) if n_blk <= 1 << 16 else blk_of_rank)[shifted]
    sizes = np.bincount(blk, minlength=n_blk)
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    order = np.argsort(blk, kind="stable")
    out: list[slice | np.ndarray] = []
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if hi > lo:
            rows = order[lo:hi]
            first, last = int(rows[0]), int(rows[-1])
            out.append(slice(first, last + 1) if last - first == hi - lo - 1 else rows)
    return out


def _summarise_ranks(a: dict[str, np.ndarray], vocab: dict[str, list[str]], base: int, clip: int | None,
                     host_level: np.ndarray | None, single: bool,
                     cont: np.ndarray | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """:func:`summarise_fn`'s rows of the finished records ``a`` of some whole ranks, as the columns of
    :class:`FnRows` and :class:`RankRows`; ``cont`` marks the continuations among them (None: none).

    None (unless ``single``, the whole window) when a span starts past the
    last clipped end: laid end to end, it would reach into the next rank's
    share of the axis, which only the whole window reproduces.
    """
    slot, n_r = dense_ids_only(a["rank"])  # np.unique(rank, return_inverse=True)'s inverse, without a sort
    fid, _ = dense_ids_only(a["fn"], a["stack"])
    kinds = a["kind"]
    dur = a["dur_ns"]
    start = a["ts_ns"] - base
    level = _LEVEL_OF_KIND_16[kinds]
    if host_level is not None:
        level = np.where(level == HOST_LEVEL, host_level[a["stack"]], level)
    end = start + dur
    if clip is not None:
        np.minimum(end, clip, out=end)
    span = int(end.max()) + 1
    if not single and int(start.max()) >= span:
        return None
    np.maximum(end, start, out=end)
    axis = on_axis(slot, start, end, span)
    order: np.ndarray | None = None
    if axis is None:
        excl = exclusive_time(slot, start, end, level, span)
    else:
        order = np.argsort(axis[0], kind="stable")  # (rank, start): shared with the grouping below
        excl = exclusive_time_on_axis(axis[0], axis[1], level, order)
    del end, level, axis

    # Whole steps: a rank's first and last step in the window may be cut by its
    # edges; they become one row each ("edge" rows, summed with their other part
    # by the detector), every step between them is complete ("interior").
    steps_ = a["step"].astype(np.int64, copy=False)
    own = None if cont is None else ~cont  # the window's own records (calls, step spans)
    lo_step = np.full(n_r, np.iinfo(np.int64).max)
    hi_step = np.full(n_r, np.iinfo(np.int64).min)
    if own is None:
        np.minimum.at(lo_step, slot, steps_)
        np.maximum.at(hi_step, slot, steps_)
        edge = steps_ == lo_step[slot]
        edge |= steps_ == hi_step[slot]
    else:
        # the rank's own records set its edge steps (as without continuations); a
        # continuation's step began in an earlier window, so it is an edge step too
        np.minimum.at(lo_step, slot[own], steps_[own])
        np.maximum.at(hi_step, slot[own], steps_[own])
        edge = (steps_ <= lo_step[slot]) | (steps_ >= hi_step[slot])
    part = np.where(edge, steps_, INTERIOR)
    del edge

    cell, n_cells = dense_ids_only(slot, fid, part)
    total = group_sum(cell, dur if own is None else np.where(own, dur, 0), n_cells)
    excl_sum = group_sum(cell, excl, n_cells)
    g = _RowSteps(cell, n_cells, steps_, order)
    if own is None:
        sv, count, starts = group_sorted(cell, dur, n_cells, g.perm)
        q = sorted_quantiles(sv, count, starts, (0.5, 0.9, 0.99))
    else:  # calls are the own records: their order in g.perm, which stays grouped by row
        at_own = np.cumsum(own) - 1
        sv, count, _ = group_sorted(cell[own], dur[own], n_cells, at_own[g.perm[own[g.perm]]])
        q = sorted_quantiles(sv, count, np.concatenate(([0], np.cumsum(count)[:-1])), (0.5, 0.9, 0.99))
        q[:, count == 0] = 0.0  # a row of continuations only: no call of its own here
        every_count = np.bincount(cell, minlength=n_cells)
        starts = np.concatenate(([0], np.cumsum(every_count)[:-1]))

    # Per-step cost, then its median over the row's steps: one-off spikes do not move it.
    # The low quantile is what the function costs in its best steps: a level a
    # regression that starts inside the window moves only once >= 95% of the
    # window's steps are past it (the job's history compares it, regression.py).
    own_dur = _own_duration(kinds)
    cost = np.where(own_dur, dur, excl)
    if cont is not None:
        cost[cont & own_dur] = 0
    del own_dur
    step_cost = g.sums(cost)
    del cost
    sv, count_s, starts_s = group_sorted(g.step_cell, step_cost, n_cells, grouped=True)
    per_step, low = sorted_quantiles(sv, count_s, starts_s, (0.5, LOW_Q))
    fn_steps = count_s.astype(np.int64, copy=False)
    rows = np.minimum.reduceat(g.perm, starts)  # each row's first record (dense_ids' representative)
    del g, sv

    fn_vocab, stack_vocab = np.asarray(vocab["fn"], dtype=object), np.asarray(vocab["stack"], dtype=object)
    fn_cols = {
        "rank": _int_objects(a["rank"], slot, n_r)[slot[rows]], "fn": fn_vocab[a["fn"][rows]],
        "stack": stack_vocab[a["stack"][rows]] if len(stack_vocab) else np.full(rows.size, "", dtype=object),
        "kind": kinds[rows], "count": count, "total_ns": total, "excl_ns": excl_sum, "median_ns": q[0],
        "p90_ns": q[1], "p99_ns": q[2], "per_step_ns": per_step, "step": part[rows], "steps": fn_steps, "low_ns": low,
    }
    if own is not None:  # step spans are the own records' (a continuation's end is its record's, seen before)
        if not own.any():
            return fn_cols, {k: np.zeros(0, dtype=np.int64) for k in ("rank", "steps", "step", "start_ns", "end_ns")} | {
                "node": np.zeros(0, dtype=object), "step_time_ns": np.zeros(0)}
        slot, steps_, start, dur, part = slot[own], steps_[own], start[own], dur[own], part[own]
        a = {"rank": a["rank"][own], "node": a["node"][own]}
    # Step span per rank and step: first start to last end of the step's records.
    rs_ids, n_rs, rs_first = dense_ids(slot, steps_)
    lo = np.full(n_rs, np.iinfo(np.int64).max)
    hi = np.full(n_rs, np.iinfo(np.int64).min)
    np.minimum.at(lo, rs_ids, start)
    start += dur
    np.maximum.at(hi, rs_ids, start)
    rp_ids, n_rp, rp_first = dense_ids(slot[rs_first], part[rs_first])
    step_time = group_quantiles(rp_ids, (hi - lo).astype(np.float64), n_rp, (0.5,))[0]
    rank_steps = group_count(rp_ids, n_rp)
    rp_lo = group_min(rp_ids, lo.astype(np.float64), n_rp)
    rp_hi = group_max(rp_ids, hi.astype(np.float64), n_rp)
    rp_rows = rs_first[rp_first]

    node_vocab = np.asarray(vocab["node"], dtype=object)
    rank_cols = {"rank": a["rank"][rp_rows], "node": node_vocab[a["node"][rp_rows]], "steps": rank_steps,
                 "step_time_ns": step_time, "step": part[rp_rows], "start_ns": rp_lo.astype(np.int64) + base,
                 "end_ns": rp_hi.astype(np.int64) + base}
    return fn_cols, rank_cols


class _RowSteps:
    """The records grouped by (row, step), from one stable sort.

    ``perm`` puts records in (row, step) order: a row's records are one run,
    as :func:`.grouping.group_sorted` wants them, and so are those of each
    (row, step). ``order`` (records in (rank, time) order, or None) makes the
    sort cheap: rows are rank-major, so it leaves short runs to merge.
    Within a (row, step) records are in ``order``'s order, not in record
    order: :meth:`sums` gives the sums of record order all the same.
    """

    def __init__(self, cell: np.ndarray, n_cells: int, steps: np.ndarray, order: np.ndarray | None) -> None:
        n = cell.size
        s_lo = int(steps.min())
        width = int(steps.max()) - s_lo + 1
        if n_cells * width < 2**62:
            key = cell.astype(np.int64)
            key *= width
            key += steps
            key -= s_lo
        else:  # step numbers too far apart to pack: (row, step) ids in key order
            key, _, _ = dense_ids(cell, steps)
        if order is not None:
            key = key[order]
            p = np.argsort(key, kind="stable")
            self.perm = order[p]
            key = key[p]
        else:
            self.perm = np.argsort(key, kind="stable")
            key = key[self.perm]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        self._new = new
        self.step_start = np.flatnonzero(new)                              # first position of each (row, step)
        self.step_cell = cell[self.perm[self.step_start]]                   # the row of each (row, step)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per (row, step), the float sum of its records' integer ``values``: ``np.bincount``'s.

        While no sum can reach 2**53 every partial sum is an exact integer, in
        any order: the sums are taken in integers over the runs (``reduceat``).
        Otherwise they are taken in record order, as ``np.bincount`` over the
        records would.
        """
        bound = max(abs(int(values.max())), abs(int(values.min())))
        if bound * values.size < 2**53:
            out: np.ndarray = np.add.reduceat(values[self.perm], self.step_start).astype(np.float64)
            return out
        ids = np.empty(self.perm.size, dtype=np.int64)
        ids[self.perm] = np.cumsum(self._new) - 1
        return np.bincount(ids, weights=values.astype(np.float64), minlength=self.step_start.size)


def _host_levels(stack: np.ndarray, stack_vocab: list[str]) -> np.ndarray | None:
    """Critical-path level of a host span per stack of the vocabulary (deeper first); None without stacks.

    Depths are those of the stack vocabulary (one per distinct stack, not one
    per record); the deepest stack any record has sets where host levels start.
    """
    if not len(stack_vocab):
        return None
    depth = np.fromiter((s.count(";") + 1 if s else 0 for s in stack_vocab), dtype=np.int64, count=len(stack_vocab))
    used = np.zeros(depth.size, dtype=bool)
    used[stack] = True
    out: np.ndarray = HOST_LEVEL + (int(depth[used].max(initial=0)) - depth)
    # Levels only order the work: narrow, they cost less memory (one window-sized array each).
    return out.astype(np.int16) if int(out.max(initial=0)) < 1 << 15 else out


# Kinds judged by their own duration, as a table over the int8 kind codes (indexed as uint8).
_OWN_OF_CODE = np.zeros(256, dtype=bool)
_OWN_OF_CODE[np.asarray(_OWN_DURATION_KINDS, dtype=np.int8).view(np.uint8)] = True


def _own_duration(kinds: np.ndarray) -> np.ndarray:
    """``np.isin(kinds, _OWN_DURATION_KINDS)``: a table lookup for int8 codes (a new array either way)."""
    if kinds.dtype == np.int8:
        out: np.ndarray = _OWN_OF_CODE[kinds.view(np.uint8)]
        return out
    return np.isin(kinds, _OWN_DURATION_KINDS)


def _int_objects(values: np.ndarray, ids: np.ndarray, n: int) -> np.ndarray:
    """Per dense id, its (shared) value as a Python int in an object array: lists of many repeated ints then cost
    a gather, not an int object per row."""
    per_id = np.zeros(n, dtype=np.int64)
    per_id[ids] = values
    return np.array(per_id.tolist(), dtype=object)


def _in_flight_rows(fn: Columns) -> InFlightRows:
    a = fn.arrays
    inf = a["in_flight"]
    if not inf.any():
        return InFlightRows()
    vocab = np.asarray(fn.vocab["fn"], dtype=object)
    rows = np.flatnonzero(inf)
    # The last finished function of every rank: what a rank absent from the dump was doing.
    done = np.flatnonzero(~inf)
    end = a["ts_ns"][done] + a["dur_ns"][done]
    # ties at the same end: the later start, then the function name (never record order)
    name_order = np.unique(np.asarray(fn.vocab["fn"], dtype=object), return_inverse=True)[1] \
        if len(fn.vocab["fn"]) else np.zeros(0, dtype=np.int64)
    order = done[np.lexsort((name_order[a["fn"][done]], a["ts_ns"][done], end, a["rank"][done]))]
    last = order[np.r_[a["rank"][order][1:] != a["rank"][order][:-1], True]] if order.size else order
    return InFlightRows(
        rank=a["rank"][rows].tolist(), fn=vocab[a["fn"][rows]].tolist(), kind=a["kind"][rows].tolist(),
        ts_ns=a["ts_ns"][rows].tolist(), dur_ns=a["dur_ns"][rows].tolist(),
        last_rank=a["rank"][last].tolist(), last_fn=vocab[a["fn"][last]].tolist(), last_kind=a["kind"][last].tolist(),
    )


def _level(cell: np.ndarray, low: np.ndarray, steps: np.ndarray, calls: np.ndarray, n_cells: int) -> np.ndarray:
    """Each cell's level for the job's reference: the lowest low quantile of its rows, less incomplete steps.

    A row of one step (an edge step, its parts from neighbouring windows
    summed) is a single sample, and the one most likely to be incomplete:
    records lost or dropped as late at a window's end leave its step with
    part of its work, a cost low for want of records, not for speed. Such a
    step ran the function fewer times than the cell's steps usually do; a step
    that was merely fast (before a regression began) ran it as often. So a
    one-step row counts only with at least the cell's usual calls per step
    (the step-weighted median over its rows, rounded down). Rows of
    ``LEVEL_STEPS`` or more steps always count: their quantile ``LOW_Q``
    already skips a lone low step once they hold >= 11.

    Only the reference takes this level (``Patterns.reference_low_ns``), never the
    level it is compared with: "usual" is wrong in a window of unusual steps
    (an evaluation step with 21 calls among training steps of one: the
    training step would read as incomplete, and the window as 21x slower).
    Excluding a row can only raise a level, so in the reference it can only
    miss a regression, never invent one.
    """
    several = steps >= LEVEL_STEPS
    if several.all():
        return group_min(cell, low, n_cells)
    typical = group_weighted_median(cell, calls / np.maximum(steps, 1.0), steps, n_cells)
    usual = np.floor(typical[cell] + 1e-9)
    whole = several | ~np.isfinite(usual) | (calls >= usual * steps)
    return group_min(cell[whole], low[whole], n_cells)


def build_patterns(d: WindowDigest) -> Patterns:
    """Dense rank x function matrices from the digest rows, for column-wise peer comparison.

    A (rank, function) may have several rows (interior steps of several time
    windows, edge steps): sums add up, per-step medians combine weighted by the
    steps each row covers.
    """
    r = d.ranks
    rr = np.asarray(r.rank, dtype=np.int64)
    ranks, r_slot = np.unique(rr, return_inverse=True)
    n_r = ranks.size
    r_w = np.asarray(r.steps, dtype=np.float64)
    steps = np.bincount(r_slot, weights=r_w, minlength=n_r).astype(np.int64)
    step_time = group_weighted_median(r_slot, np.asarray(r.step_time_ns, dtype=np.float64), r_w, n_r)
    # Time the rank's recorded steps took: the denominator of beta. Not the window's
    # length: a collector may trace one step in N (sampled tracing), and checkpoints
    # or evaluations between steps are not training time either.
    busy = np.bincount(r_slot, weights=r_w * np.nan_to_num(np.asarray(r.step_time_ns, dtype=np.float64)),
                       minlength=n_r)
    f = d.fns
    # Functions in sorted (name, stack) order, never in row order: rows arrive in
    # whatever order partitions were merged, and every later tie (max over
    # functions, first abnormal cell) must not depend on it.
    pairs = list(zip(f.fn, f.stack))
    keys = {k: i for i, k in enumerate(sorted(set(pairs)))}
    fid = np.fromiter(map(keys.__getitem__, pairs), dtype=np.int64, count=len(pairs))
    n_f = len(keys)
    kinds = np.zeros(n_f, dtype=np.int64)
    kinds[fid] = f.kind
    slot = np.searchsorted(ranks, np.asarray(f.rank, dtype=np.int64))
    cell = slot * max(n_f, 1) + fid
    n_cells = n_r * max(n_f, 1)
    w = np.asarray(f.steps, dtype=np.float64) if len(f.steps) == len(f.fn) else np.ones(len(f.fn))
    present = np.bincount(cell, minlength=n_cells) > 0

    def summed(values: list[float]) -> np.ndarray:
        m = np.bincount(cell, weights=np.asarray(values, dtype=np.float64), minlength=n_cells)
        return np.where(present, m, np.nan).reshape(n_r, max(n_f, 1))[:, :n_f]

    def wmedian(values: list[float]) -> np.ndarray:
        m = group_weighted_median(cell, np.asarray(values, dtype=np.float64), w, n_cells)
        return m.reshape(n_r, max(n_f, 1))[:, :n_f]

    count = np.bincount(cell, weights=np.asarray(f.count, dtype=np.float64), minlength=n_cells)
    count = count.reshape(n_r, max(n_f, 1))[:, :n_f].astype(np.int64)
    lows = np.asarray(f.low_ns if len(f.low_ns) == len(f.fn) else f.per_step_ns, dtype=np.float64)
    low = group_min(cell, lows, n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
    p99 = group_max(cell, np.asarray(f.p99_ns, dtype=np.float64), n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
    excl = summed(f.excl_ns)
    total = summed(f.total_ns)
    per_step = wmedian(f.per_step_ns)
    # A function that runs in fewer than half of a rank's steps (a GC pass, a
    # periodic log) has a per-step median of 0 over *all* steps; its median over
    # the steps where it ran would compare one rare pause with peers that had
    # none. Its cost per step is then its mean over all steps: its share of them.
    ran = np.bincount(cell, weights=w, minlength=n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
    sporadic = ran < 0.5 * np.maximum(steps, 1)[:, None]
    own = np.isin(kinds, _OWN_DURATION_KINDS)[None, :]
    mean_cost = np.where(own, total, excl) / np.maximum(steps, 1)[:, None]
    per_step = np.where(sporadic & np.isfinite(per_step), mean_cost, per_step)
    # A data loader stalls a step only when its prefetch queue has run dry: slow production
    # (a degraded mount, a starved worker) shows as intermittent long waits on whichever
    # rank's queue emptied first, not as a slower median step (an independent generator's
    # slow storage: 98-567 ms stalls on one rank of a node per window, each rank's median
    # untouched). What such a function costs a step is its mean, so it is never judged below it.
    stalls = np.isin(kinds, _STALL_KINDS)[None, :]
    per_step = np.where(stalls & np.isfinite(per_step) & np.isfinite(mean_cost), np.fmax(per_step, mean_cost), per_step)
    window_ns = d.end_ns - d.start_ns
    return Patterns(
        ranks=ranks, fn_names=[k[0] for k in keys], fn_stacks=[k[1] for k in keys], fn_kinds=kinds,
        count=count, total_ns=total, excl_ns=excl, median_ns=wmedian(f.median_ns),
        p90_ns=wmedian(f.p90_ns), p99_ns=p99, per_step_ns=per_step, low_ns=low,
        beta=excl / np.where(busy > 0, busy, float(window_ns))[:, None], steps=steps, step_time_ns=step_time, window_ns=window_ns,
        sporadic=sporadic, ref_rows=(cell, lows, w, np.asarray(f.count, dtype=np.float64), n_cells),
    )
