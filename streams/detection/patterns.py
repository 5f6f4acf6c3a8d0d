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
from eroica.models.digest import FnRows, InFlightRows, RankRows, WindowDigest
from eroica.models.records import FN_KINDS
from eroica.models.summary import WindowSummary

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


def summarise_fn(fn: Columns) -> tuple[FnRows, RankRows, InFlightRows]:
    """Per-rank patterns of the finished executions in a window (the summariser's work).

    Everything here is computed per rank, so the rows of a rank do not depend
    on which other ranks were summarised with it: partitions may split ranks
    any way and the merged digest is the same.
    """
    inflight = _in_flight_rows(fn)
    done = ~fn.arrays["in_flight"]
    a = {k: v[done] for k, v in fn.arrays.items()}
    if not done.any():
        return FnRows(), RankRows(), inflight
    ranks, slot = np.unique(a["rank"], return_inverse=True)
    n_r = ranks.size
    fid, n_f, first = dense_ids(a["fn"], a["stack"])
    kinds = a["kind"].astype(np.int64)

    dur = a["dur_ns"]
    # Offsets from the window's first event: exclusive time only needs relative positions.
    start = a["ts_ns"] - a["ts_ns"].min()
    depth = stack_depths(Columns(fn.type, a, fn.vocab))
    level = _LEVEL_OF_KIND[kinds]
    host = level == HOST_LEVEL
    level = np.where(host, HOST_LEVEL + (depth.max(initial=0) - depth), level)
    excl = exclusive_time(slot, start, start + dur, level, int((start + dur).max()) + 1)

    cell, n_cells, cell_first = dense_ids(slot, fid)
    count = group_count(cell, n_cells)
    total = group_sum(cell, dur, n_cells)
    excl_sum = group_sum(cell, excl, n_cells)
    q = group_quantiles(cell, dur, n_cells, (0.5, 0.9, 0.99))

    # Per-step cost, then its median over steps: one-off spikes do not move it.
    own = np.isin(kinds, _OWN_DURATION_KINDS)
    cost = np.where(own, dur, excl)
    step_ids, n_cs, step_first = dense_ids(cell, a["step"])
    per_step = group_quantiles(cell[step_first], group_sum(step_ids, cost, n_cs), n_cells, (0.5,))[0]

    # Step span per rank: first start to last end of the step's records.
    rs_ids, n_rs, rs_first = dense_ids(slot, a["step"])
    lo = np.full(n_rs, np.iinfo(np.int64).max)
    hi = np.full(n_rs, np.iinfo(np.int64).min)
    np.minimum.at(lo, rs_ids, start)
    np.maximum.at(hi, rs_ids, start + dur)
    rs_slot = slot[rs_first]
    step_time = group_quantiles(rs_slot, (hi - lo).astype(np.float64), n_r, (0.5,))[0]
    steps = group_count(rs_slot, n_r)
    _, node_first = np.unique(slot, return_index=True)

    rows = cell_first
    fn_vocab, stack_vocab = np.asarray(fn.vocab["fn"], dtype=object), np.asarray(fn.vocab["stack"], dtype=object)
    fns = FnRows(
        rank=a["rank"][rows].tolist(), fn=fn_vocab[a["fn"][rows]].tolist(),
        stack=stack_vocab[a["stack"][rows]].tolist() if len(stack_vocab) else [""] * rows.size,
        kind=kinds[rows].tolist(), count=count.tolist(), total_ns=total.tolist(), excl_ns=excl_sum.tolist(),
        median_ns=q[0].tolist(), p90_ns=q[1].tolist(), p99_ns=q[2].tolist(), per_step_ns=per_step.tolist(),
    )
    node_vocab = np.asarray(fn.vocab["node"], dtype=object)
    rank_rows = RankRows(rank=ranks.tolist(), node=node_vocab[a["node"][node_first]].tolist(),
                         steps=steps.tolist(), step_time_ns=step_time.tolist())
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
    order = done[np.lexsort((end, a["rank"][done]))]
    last = order[np.r_[a["rank"][order][1:] != a["rank"][order][:-1], True]] if order.size else order
    return InFlightRows(
        rank=a["rank"][rows].tolist(), fn=vocab[a["fn"][rows]].tolist(), kind=a["kind"][rows].tolist(),
        ts_ns=a["ts_ns"][rows].tolist(), dur_ns=a["dur_ns"][rows].tolist(),
        last_rank=a["rank"][last].tolist(), last_fn=vocab[a["fn"][last]].tolist(), last_kind=a["kind"][last].tolist(),
    )


def build_patterns(d: WindowDigest) -> Patterns:
    """Dense rank x function matrices from the digest rows, for column-wise peer comparison."""
    r = d.ranks
    ranks, first = np.unique(np.asarray(r.rank, dtype=np.int64), return_index=True)
    steps = np.asarray(r.steps, dtype=np.int64)[first]
    step_time = np.asarray(r.step_time_ns, dtype=np.float64)[first]
    f = d.fns
    keys: dict[tuple[str, str], int] = {}
    fid = np.fromiter((keys.setdefault((n, s), len(keys)) for n, s in zip(f.fn, f.stack)), dtype=np.int64,
                      count=len(f.fn))
    n_r, n_f = ranks.size, len(keys)
    slot = np.searchsorted(ranks, np.asarray(f.rank, dtype=np.int64))
    kinds = np.zeros(n_f, dtype=np.int64)
    kinds[fid] = f.kind

    def mat(values: list) -> np.ndarray:
        m = np.full((n_r, n_f), np.nan)
        m[slot, fid] = values
        return m

    count = np.zeros((n_r, n_f), dtype=np.int64)
    count[slot, fid] = f.count
    excl = mat(f.excl_ns)
    window_ns = d.end_ns - d.start_ns
    return Patterns(
        ranks=ranks, fn_names=[k[0] for k in keys], fn_stacks=[k[1] for k in keys], fn_kinds=kinds,
        count=count, total_ns=mat(f.total_ns), excl_ns=excl, median_ns=mat(f.median_ns), p90_ns=mat(f.p90_ns),
        p99_ns=mat(f.p99_ns), per_step_ns=mat(f.per_step_ns), beta=excl / float(window_ns), steps=steps,
        step_time_ns=step_time, window_ns=window_ns,
    )


def pattern_summaries(d: WindowDigest, p: Patterns | None = None) -> list[WindowSummary]:
    """Rows for the ``summaries`` table: each (rank, function) with its slowdown against the other ranks."""
    p = p if p is not None else build_patterns(d)
    if not p.ranks.size:
        return []
    node = dict(zip(d.ranks.rank, d.ranks.node))
    cost = p.per_step_ns
    with np.errstate(all="ignore"):
        med = np.nanmedian(np.where(np.isfinite(cost), cost, np.nan), axis=0) if cost.size else np.empty(0)
        slow = cost / med
    rows: list[WindowSummary] = []
    r_idx, f_idx = np.nonzero(p.count > 0)
    for r, f in zip(r_idx.tolist(), f_idx.tolist()):
        rows.append(WindowSummary(
            job=d.job, window_start_ns=d.start_ns, window_end_ns=d.end_ns, rank=int(p.ranks[r]),
            node=node.get(int(p.ranks[r]), ""), fn=p.fn_names[f], kind=FN_KINDS[int(p.fn_kinds[f])],
            count=int(p.count[r, f]), median_ns=float(p.median_ns[r, f]), p90_ns=float(p.p90_ns[r, f]),
            p99_ns=float(p.p99_ns[r, f]), total_ns=float(p.total_ns[r, f]), beta=float(p.beta[r, f]),
            slowdown_vs_peers=float(slow[r, f]) if np.isfinite(slow[r, f]) else float("nan"),
        ))
    return rows
