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

from .grouping import dense_ids, group_count, group_quantiles, group_sum
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
    beta: np.ndarray             # (R, F) share of the window on the critical path
    steps: np.ndarray            # (R,) distinct steps seen
    step_time_ns: np.ndarray     # (R,) median step span
    window_ns: int

    def slot(self, rank: int) -> int:
        return int(np.searchsorted(self.ranks, rank))

    def fn_label(self, f: int) -> str:
        return self.fn_names[f]


def stack_depths(cols: Columns) -> np.ndarray:
    """Frames in each stack of the vocabulary (0 when no stack)."""
    vocab = cols.vocab.get("stack", [])
    depth = np.fromiter((s.count(";") + 1 if s else 0 for s in vocab), dtype=np.int64, count=len(vocab))
    return depth[cols.arrays["stack"]] if len(vocab) else np.zeros(len(cols), dtype=np.int64)


def build_patterns(fn: Columns, window_start_ns: int, window_ns: int) -> Patterns:
    """Summarise finished executions (``in_flight`` ones are left to hang detection)."""
    done = ~fn.arrays["in_flight"]
    a = {k: v[done] for k, v in fn.arrays.items()}
    ranks, slot = np.unique(a["rank"], return_inverse=True)
    n_r = ranks.size
    fid, n_f, first = dense_ids(a["fn"], a["stack"])
    fn_names = [fn.vocab["fn"][c] for c in a["fn"][first]]
    fn_stacks = [fn.vocab["stack"][c] for c in a["stack"][first]]
    kinds = a["kind"].astype(np.int64)
    fn_kinds = kinds[first]

    dur = a["dur_ns"]
    start = a["ts_ns"] - window_start_ns
    depth = stack_depths(Columns(fn.type, a, fn.vocab))
    level = _LEVEL_OF_KIND[kinds]
    host = level == HOST_LEVEL
    level = np.where(host, HOST_LEVEL + (depth.max(initial=0) - depth), level)
    span = int(window_ns + max(int(dur.max(initial=0)), 0) + 1)
    excl = exclusive_time(slot, start, start + dur, level, span)

    cell = slot * n_f + fid
    n_cells = n_r * n_f
    count = group_count(cell, n_cells)
    total = group_sum(cell, dur, n_cells)
    excl_sum = group_sum(cell, excl, n_cells)
    q = group_quantiles(cell, dur, n_cells, (0.5, 0.9, 0.99))

    # Per-step cost, then its median over steps: one-off spikes do not move it.
    own = np.isin(kinds, _OWN_DURATION_KINDS)
    cost = np.where(own, dur, excl)
    step_ids, n_cs, step_first = dense_ids(cell, a["step"])
    step_cost = group_sum(step_ids, cost, n_cs)
    step_cell = cell[step_first]
    per_step = group_quantiles(step_cell, step_cost, n_cells, (0.5,))[0]

    # Step span per rank: first start to last end of the step's records.
    rs_ids, n_rs, rs_first = dense_ids(slot, a["step"])
    lo = np.full(n_rs, np.iinfo(np.int64).max)
    hi = np.full(n_rs, np.iinfo(np.int64).min)
    np.minimum.at(lo, rs_ids, start)
    np.maximum.at(hi, rs_ids, start + dur)
    rs_slot = slot[rs_first]
    step_time = group_quantiles(rs_slot, (hi - lo).astype(np.float64), n_r, (0.5,))[0]
    steps = group_count(rs_slot, n_r)

    shape = (n_r, n_f)
    absent = count.reshape(shape) == 0

    def mat(v: np.ndarray) -> np.ndarray:
        m = v.reshape(shape).astype(np.float64)
        m[absent] = np.nan
        return m

    return Patterns(
        ranks=ranks, fn_names=fn_names, fn_stacks=fn_stacks, fn_kinds=fn_kinds,
        count=count.reshape(shape), total_ns=mat(total), excl_ns=mat(excl_sum),
        median_ns=mat(q[0]), p90_ns=mat(q[1]), p99_ns=mat(q[2]), per_step_ns=mat(per_step),
        beta=mat(excl_sum) / float(window_ns), steps=steps, step_time_ns=step_time,
        window_ns=window_ns,
    )
