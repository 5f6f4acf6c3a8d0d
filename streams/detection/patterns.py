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
import numpy.typing as npt

from eroica.models.columns import KIND_CODE, Columns
from eroica.models.digest import INTERIOR, InFlightRows, WindowDigest

from .grouping import (group_max, group_min, group_weighted_median)

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
# ... and the high one, symmetric to it: with the median, the three tell a level that shifted inside the
# window (low at one level, median and high at another) from jitter around one level (regression.py)
HIGH_Q = 0.95
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
    # (R, F) the median step's cost where per_step_ns took a loader's mean instead (build_patterns);
    # None: per_step_ns. Whether most steps pay a stall is read from it (detector: steady).
    median_step_ns: np.ndarray | None = None
    # (R, F, 3): the median, low and high quantile of the per-step cost over a cell's interior steps
    # (its largest interior row: whole steps only, no partial step at a window's edge); NaN without one.
    # A level that shifted inside the window shows there (regression.shift_findings).
    interior_q: np.ndarray | None = None
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
        rank=a["rank"][rows], fn=vocab[a["fn"][rows]].tolist(), kind=a["kind"][rows],
        ts_ns=a["ts_ns"][rows], dur_ns=a["dur_ns"][rows],
        last_rank=a["rank"][last], last_fn=vocab[a["fn"][last]].tolist(), last_kind=a["kind"][last],
    )


def first_seen_ids(values: list[str]) -> tuple[np.ndarray, list[str]]:
    """An id per value, numbered in order of first appearance, and the distinct values in that order.

    C loops over the list (``dict.fromkeys`` keeps first appearances in order,
    ``map`` looks each row up): no Python step, and no tuple, per row.
    """
    distinct = list(dict.fromkeys(values))
    index = {v: i for i, v in enumerate(distinct)}
    return np.fromiter(map(index.__getitem__, values), np.int64, len(values)), distinct


class RowArrays:
    """One row set of a job window (its ``FnRows``, ``CollRows`` or ``RankRows``) as numpy columns of the dtypes
    its tests read, each converted once, and its string columns numbered once.

    Several tests read the same columns (patterns, collectives, costs), some
    in another dtype than the rows hold (counts as floats). A window is never
    changed while it is analysed, so the arrays are shared, read-only (numpy
    refuses a write): views, so the rows' own arrays stay as they are.
    """

    __slots__ = ("rows", "_arrays", "_ids")

    def __init__(self, rows: Any) -> None:
        self.rows = rows
        self._arrays: dict[tuple[str, np.dtype[Any]], np.ndarray] = {}
        self._ids: dict[str, tuple[np.ndarray, list[str]]] = {}

    def col(self, name: str, dtype: npt.DTypeLike) -> np.ndarray:
        """``np.asarray(rows.<name>, dtype=dtype)``, read-only."""
        key = (name, np.dtype(dtype))
        out = self._arrays.get(key)
        if out is None:
            out = np.asarray(getattr(self.rows, name), dtype=key[1]).view()
            out.flags.writeable = False
            self._arrays[key] = out
        return out

    def first_seen(self, name: str) -> tuple[np.ndarray, list[str]]:
        """:func:`first_seen_ids` of a string column (the ids read-only, the list not to be changed)."""
        out = self._ids.get(name)
        if out is None:
            ids, distinct = first_seen_ids(getattr(self.rows, name))
            ids.flags.writeable = False
            out = self._ids[name] = (ids, distinct)
        return out

    def known_ids(self, name: str, ids: np.ndarray, distinct: list[str]) -> None:
        """Give ``first_seen(name)`` beforehand: ``ids, distinct`` must be exactly what numbering the column
        gives (the builder of the rows had them, :func:`.steps.split_at_cut`)."""
        ids.flags.writeable = False
        self._ids[name] = (ids, distinct)

    def ids_taken(self, name: str, idx: np.ndarray) -> tuple[np.ndarray, list[str]] | None:
        """:func:`first_seen_ids` of the column's rows ``idx`` (in that order), from this column's, when numbered
        already: the codes renumbered in order of first appearance there (equal strings, equal codes)."""
        seen = self._ids.get(name)
        if seen is None:
            return None
        ids, distinct = seen
        renumbered, codes = renumber_first_seen(ids[idx])
        return renumbered, [distinct[c] for c in codes.tolist()]


class JobArrays:
    """The numpy columns of one job-window digest (:class:`RowArrays` of its rows), shared by its tests."""

    __slots__ = ("digest", "fns", "colls", "ranks")

    def __init__(self, d: WindowDigest) -> None:
        self.digest = d
        self.fns = RowArrays(d.fns)
        self.colls = RowArrays(d.colls)
        self.ranks = RowArrays(d.ranks)

    @staticmethod
    def of(d: WindowDigest, arrays: JobArrays | None) -> JobArrays:
        """``arrays`` when given (they must be ``d``'s), else fresh ones for ``d``."""
        if arrays is None:
            return JobArrays(d)
        if arrays.digest is not d:
            raise ValueError("the arrays of another digest")
        return arrays


def renumber_first_seen(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Equal codes (non-negative) keep one id, numbered in order of first appearance in ``codes``; and the
    code of each id."""
    if not codes.size:
        return codes, codes
    used, inverse = used_codes(codes, int(codes.max()) + 1)
    first = np.full(used.size, codes.size, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(codes.size))
    order = np.argsort(first)
    rank = np.empty(used.size, dtype=np.int64)
    rank[order] = np.arange(used.size)
    out: np.ndarray = rank[inverse]
    return out, used[order]


def used_codes(code: np.ndarray, space: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(code, return_inverse=True)`` for codes in ``[0, space)``: by a table of the space, not a sort,
    when the space is no larger than the rows (the codes of distinct strings seen in them)."""
    if space > max(4 * code.size, 1 << 12):
        used, inverse = np.unique(code, return_inverse=True)
        return used, inverse.reshape(-1)
    present = np.zeros(space, dtype=bool)
    present[code] = True
    dense = np.cumsum(present, dtype=np.int64) - 1
    return np.flatnonzero(present), dense[code]


def _sorted_fn_ids(fn: list[str], stack: list[str]) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """Each row's function id in sorted (name, stack) order, and those pairs: ``sorted(set(zip(fn, stack)))``
    without a tuple per row (the rows of a 1,024-rank window built 77k of them, and set the GC off)."""
    return _sorted_pair_ids(first_seen_ids(fn), first_seen_ids(stack))


def _sorted_pair_ids(fn: tuple[np.ndarray, list[str]],
                     stack: tuple[np.ndarray, list[str]]) -> tuple[np.ndarray, list[tuple[str, str]]]:
    """:func:`_sorted_fn_ids` from the columns' :func:`first_seen_ids`."""
    (a, names), (b, stacks) = fn, stack
    code = a * max(len(stacks), 1) + b
    if not code.size:
        return code, []
    used, inverse = used_codes(code, len(names) * max(len(stacks), 1))
    pairs = [(names[c // max(len(stacks), 1)], stacks[c % max(len(stacks), 1)]) for c in used.tolist()]
    order = sorted(range(len(pairs)), key=pairs.__getitem__)
    rank = np.empty(len(pairs), dtype=np.int64)
    rank[order] = np.arange(len(pairs))
    fid: np.ndarray = rank[inverse.reshape(-1)]
    return fid, [pairs[i] for i in order]


def _weighted_medians(cell: np.ndarray, values: np.ndarray, w: np.ndarray, n_cells: int) -> np.ndarray:
    """``group_weighted_median(cell, values, w, n_cells)``, the cells of one or two rows read directly.

    Most cells hold one or two rows (an interior row and an edge step), for
    which the general way's sort of every value is the bulk of its cost. Two
    rows ``a`` (the earlier) and ``b``: the lower one comes first, ``a`` on a
    tie (the stable sort's order), and it is the median once its weight
    reaches half the pair's. Taken only with whole weights (step counts):
    their sums are exact, so the comparison is the general way's. Cells of
    more rows take the general way, on their rows alone.
    """
    if not values.size or not bool((w == np.trunc(w)).all()) or float(np.abs(w).sum()) >= 2.0**52:
        return group_weighted_median(cell, values, w, n_cells)
    out = np.full(n_cells, np.nan)
    ok = np.isfinite(values) & (w > 0)
    ids = cell[ok]
    count = np.bincount(ids, minlength=n_cells)
    order = np.argsort(ids.astype(np.uint16) if n_cells <= 1 << 16 else ids, kind="stable")
    v, wt = values[ok][order], w[ok][order]
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    one = np.flatnonzero(count == 1)
    out[one] = v[start[one]]
    two = np.flatnonzero(count == 2)
    a, b = start[two], start[two] + 1
    b_lower = v[b] < v[a]
    lo = np.where(b_lower, v[b], v[a])
    hi = np.where(b_lower, v[a], v[b])
    w_lo = np.where(b_lower, wt[b], wt[a])
    out[two] = np.where(w_lo >= 0.5 * (wt[a] + wt[b]), lo, hi)
    more = count > 2
    if more.any():
        rows = np.flatnonzero(ok)[more[ids]]
        out[more] = group_weighted_median(cell[rows], values[rows], w[rows], n_cells)[more]
    return out


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


def build_patterns(d: WindowDigest, arrays: JobArrays | None = None) -> Patterns:
    """Dense rank x function matrices from the digest rows, for column-wise peer comparison.

    A (rank, function) may have several rows (interior steps of several time
    windows, edge steps): sums add up, per-step medians combine weighted by the
    steps each row covers. ``arrays``: ``d``'s columns, when the caller shares them.
    """
    cols = JobArrays.of(d, arrays)
    rc = cols.ranks
    rr = rc.col("rank", np.int64)
    ranks, r_slot = np.unique(rr, return_inverse=True)
    n_r = ranks.size
    r_w = rc.col("steps", np.float64)
    steps = np.bincount(r_slot, weights=r_w, minlength=n_r).astype(np.int64)
    step_time_ns = rc.col("step_time_ns", np.float64)
    step_time = group_weighted_median(r_slot, step_time_ns, r_w, n_r)
    # Time the rank's recorded steps took: the denominator of beta. Not the window's
    # length: a collector may trace one step in N (sampled tracing), and checkpoints
    # or evaluations between steps are not training time either.
    busy = np.bincount(r_slot, weights=r_w * np.nan_to_num(step_time_ns), minlength=n_r)
    f, fc = d.fns, cols.fns
    # Functions in sorted (name, stack) order, never in row order: rows arrive in
    # whatever order partitions were merged, and every later tie (max over
    # functions, first abnormal cell) must not depend on it.
    fid, keys = _sorted_pair_ids(fc.first_seen("fn"), fc.first_seen("stack"))
    n_f = len(keys)
    kinds = np.zeros(n_f, dtype=np.int64)
    kinds[fid] = fc.col("kind", np.int64)
    slot = np.searchsorted(ranks, fc.col("rank", np.int64))
    cell = slot * max(n_f, 1) + fid
    n_cells = n_r * max(n_f, 1)
    w = fc.col("steps", np.float64) if len(f.steps) == len(f.fn) else np.ones(len(f.fn))
    present = np.bincount(cell, minlength=n_cells) > 0

    def summed(name: str) -> np.ndarray:
        m = np.bincount(cell, weights=fc.col(name, np.float64), minlength=n_cells)
        return np.where(present, m, np.nan).reshape(n_r, max(n_f, 1))[:, :n_f]

    def wmedian(name: str) -> np.ndarray:
        m = _weighted_medians(cell, fc.col(name, np.float64), w, n_cells)
        return m.reshape(n_r, max(n_f, 1))[:, :n_f]

    interior_q = _interior_quantiles(fc, cell, w, n_cells, n_r, n_f) if len(f.high_ns) == len(f.fn) else None
    calls = fc.col("count", np.float64)
    count = np.bincount(cell, weights=calls, minlength=n_cells)
    count = count.reshape(n_r, max(n_f, 1))[:, :n_f].astype(np.int64)
    lows = fc.col("low_ns" if len(f.low_ns) == len(f.fn) else "per_step_ns", np.float64)
    low = group_min(cell, lows, n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
    p99 = group_max(cell, fc.col("p99_ns", np.float64), n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
    excl = summed("excl_ns")
    total = summed("total_ns")
    per_step = wmedian("per_step_ns")
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
    median_step = per_step
    per_step = np.where(stalls & np.isfinite(per_step) & np.isfinite(mean_cost), np.fmax(per_step, mean_cost), per_step)
    window_ns = d.end_ns - d.start_ns
    return Patterns(
        ranks=ranks, fn_names=[k[0] for k in keys], fn_stacks=[k[1] for k in keys], fn_kinds=kinds,
        count=count, total_ns=total, excl_ns=excl, median_ns=wmedian("median_ns"),
        p90_ns=wmedian("p90_ns"), p99_ns=p99, per_step_ns=per_step, low_ns=low,
        beta=excl / np.where(busy > 0, busy, float(window_ns))[:, None], steps=steps, step_time_ns=step_time, window_ns=window_ns,
        sporadic=sporadic, median_step_ns=median_step, ref_rows=(cell, lows, w, calls, n_cells),
        interior_q=interior_q,
    )


def _interior_quantiles(fc: Any, cell: np.ndarray, w: np.ndarray, n_cells: int, n_r: int, n_f: int) -> np.ndarray:
    """(R, F, 3) median, low and high per-step cost of each cell's largest interior row (NaN: none)."""
    out = np.full((n_cells, 3), np.nan)
    inner = np.flatnonzero(fc.col("step", np.int64) == INTERIOR)
    if inner.size:
        order = inner[np.lexsort((w[inner], cell[inner]))]  # by cell, then steps: the last of a cell is its largest
        last = np.r_[cell[order][1:] != cell[order][:-1], True]
        pick = order[last]
        for k, name in enumerate(("per_step_ns", "low_ns", "high_ns")):
            out[cell[pick], k] = fc.col(name, np.float64)[pick]
    return out.reshape(n_r, max(n_f, 1), 3)[:, :n_f]
