"""Behaviour patterns: per window, per (rank, function) summaries.

A pattern carries no timestamps (only durations, counts and shares), so ranks
need no clock synchronisation to be compared. The matrices are dense
``ranks x functions`` arrays (NaN where a rank never ran a function): peer
comparison is then a column-wise operation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eroica.models.columns import KIND_CODE, Columns
from eroica.models.digest import INTERIOR, FnRows, InFlightRows, RankRows, WindowDigest

from .grouping import (dense_ids, group_count, group_max, group_min, group_quantiles, group_sum,
                       group_weighted_median)
from .intervals import exclusive_time

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

# Functions whose own duration is their cost; host spans that enclose GPU work or
# collectives (python, optimizer) are judged by their exclusive time instead,
# so that time spent waiting inside them is not read as slowness.
_OWN_DURATION_KINDS = (K_KERNEL, K_MEMCPY, K_LOADER, K_IO, K_COLL)
# 5% (nearest rank: the 3rd-best of 40 steps): robust to a couple of odd fast
# steps, yet below a regression that started a few steps into the window.
LOW_Q = 0.05


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

    def slot(self, rank: int) -> int:
        return int(np.searchsorted(self.ranks, rank))

    def fn_label(self, f: int) -> str:
        return self.fn_names[f]


def stack_depths(cols: Columns) -> np.ndarray:
    """Frames in each stack of the vocabulary (0 when no stack)."""
    vocab = cols.vocab.get("stack", [])
    depth = np.fromiter((s.count(";") + 1 if s else 0 for s in vocab), dtype=np.int64, count=len(vocab))
    return depth[cols.arrays["stack"]] if len(vocab) else np.zeros(len(cols), dtype=np.int64)


def summarise_fn(fn: Columns, window_end_ns: int | None = None) -> tuple[FnRows, RankRows, InFlightRows]:
    """Per-rank patterns of the finished executions in a window (the summariser's work).

    Everything here is computed per rank, so the rows of a rank do not depend
    on which other ranks were summarised with it: partitions may split ranks
    any way and the merged digest is the same.
    """
    inflight = _in_flight_rows(fn)
    done = ~fn.arrays["in_flight"]
    a = dict(fn.arrays) if done.all() else {k: v[done] for k, v in fn.arrays.items()}  # read only: no copy
    if not done.any():
        return FnRows(), RankRows(), inflight
    slot, n_r, _ = dense_ids(a["rank"])  # np.unique(rank, return_inverse=True)'s inverse, without a sort
    fid, n_f, first = dense_ids(a["fn"], a["stack"])
    kinds = a["kind"].astype(np.int64)

    dur = a["dur_ns"]
    # Offsets from the window's first event: exclusive time only needs relative positions.
    start = a["ts_ns"] - a["ts_ns"].min()
    depth = stack_depths(Columns(fn.type, a, fn.vocab))
    level = _LEVEL_OF_KIND[kinds]
    host = level == HOST_LEVEL
    level = np.where(host, HOST_LEVEL + (depth.max(initial=0) - depth), level)
    # Spans are clipped to the window: what an enclosing frame (a 40 s train_step)
    # covers after the window's end is covered by records of the *next* window,
    # which this one does not see; unclipped, it would all read as host time.
    end = start + dur
    if window_end_ns is not None:
        end = np.minimum(end, max(int(window_end_ns) - int(a["ts_ns"].min()), 0))
    excl = exclusive_time(slot, start, np.maximum(end, start), level, int(end.max()) + 1)

    # Whole steps: a rank's first and last step in the window may be cut by its
    # edges; they become one row each ("edge" rows, summed with their other part
    # by the detector), every step between them is complete ("interior").
    steps_ = a["step"].astype(np.int64)
    lo_step = np.full(n_r, np.iinfo(np.int64).max)
    hi_step = np.full(n_r, np.iinfo(np.int64).min)
    np.minimum.at(lo_step, slot, steps_)
    np.maximum.at(hi_step, slot, steps_)
    edge = (steps_ == lo_step[slot]) | (steps_ == hi_step[slot])
    part = np.where(edge, steps_, INTERIOR)

    cell, n_cells, cell_first = dense_ids(slot, fid, part)
    count = group_count(cell, n_cells)
    total = group_sum(cell, dur, n_cells)
    excl_sum = group_sum(cell, excl, n_cells)
    q = group_quantiles(cell, dur, n_cells, (0.5, 0.9, 0.99))

    # Per-step cost, then its median over the row's steps: one-off spikes do not move it.
    own = np.isin(kinds, _OWN_DURATION_KINDS)
    cost = np.where(own, dur, excl)
    step_ids, n_cs, step_first = dense_ids(cell, steps_)
    # The low quantile is what the function costs in its best steps: a level a
    # regression that starts inside the window moves only once >= 95% of the
    # window's steps are past it (the job's history compares it, regression.py).
    per_step, low = group_quantiles(cell[step_first], group_sum(step_ids, cost, n_cs), n_cells, (0.5, LOW_Q))
    fn_steps = group_count(cell[step_first], n_cells)

    # Step span per rank and step: first start to last end of the step's records.
    rs_ids, n_rs, rs_first = dense_ids(slot, steps_)
    lo = np.full(n_rs, np.iinfo(np.int64).max)
    hi = np.full(n_rs, np.iinfo(np.int64).min)
    np.minimum.at(lo, rs_ids, start)
    np.maximum.at(hi, rs_ids, start + dur)
    rp_ids, n_rp, rp_first = dense_ids(slot[rs_first], part[rs_first])
    step_time = group_quantiles(rp_ids, (hi - lo).astype(np.float64), n_rp, (0.5,))[0]
    rank_steps = group_count(rp_ids, n_rp)
    base = int(a["ts_ns"].min())
    rp_lo = group_min(rp_ids, lo.astype(np.float64), n_rp)
    rp_hi = group_max(rp_ids, hi.astype(np.float64), n_rp)
    rp_rows = rs_first[rp_first]

    rows = cell_first
    fn_vocab, stack_vocab = np.asarray(fn.vocab["fn"], dtype=object), np.asarray(fn.vocab["stack"], dtype=object)
    fns = FnRows(
        rank=a["rank"][rows].tolist(), fn=fn_vocab[a["fn"][rows]].tolist(),
        stack=stack_vocab[a["stack"][rows]].tolist() if len(stack_vocab) else [""] * rows.size,
        kind=kinds[rows].tolist(), count=count.tolist(), total_ns=total.tolist(), excl_ns=excl_sum.tolist(),
        median_ns=q[0].tolist(), p90_ns=q[1].tolist(), p99_ns=q[2].tolist(), per_step_ns=per_step.tolist(),
        step=part[rows].tolist(), steps=fn_steps.tolist(), low_ns=low.tolist(),
    )
    node_vocab = np.asarray(fn.vocab["node"], dtype=object)
    rank_rows = RankRows(rank=a["rank"][rp_rows].tolist(), node=node_vocab[a["node"][rp_rows]].tolist(),
                         steps=rank_steps.tolist(), step_time_ns=step_time.tolist(), step=part[rp_rows].tolist(),
                         start_ns=(rp_lo.astype(np.int64) + base).tolist(),
                         end_ns=(rp_hi.astype(np.int64) + base).tolist())
    return fns, rank_rows, inflight


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
    low = group_min(cell, np.asarray(f.low_ns if len(f.low_ns) == len(f.fn) else f.per_step_ns, dtype=np.float64),
                    n_cells).reshape(n_r, max(n_f, 1))[:, :n_f]
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
    window_ns = d.end_ns - d.start_ns
    return Patterns(
        ranks=ranks, fn_names=[k[0] for k in keys], fn_stacks=[k[1] for k in keys], fn_kinds=kinds,
        count=count, total_ns=total, excl_ns=excl, median_ns=wmedian(f.median_ns),
        p90_ns=wmedian(f.p90_ns), p99_ns=p99, per_step_ns=per_step, low_ns=low,
        beta=excl / np.where(busy > 0, busy, float(window_ns))[:, None], steps=steps, step_time_ns=step_time, window_ns=window_ns,
        sporadic=sporadic,
    )
