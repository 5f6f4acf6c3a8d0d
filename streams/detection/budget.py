"""A job's function cardinality per window is bounded: the excess is folded, counted and said.

The contract bounds a name's length, not how many names a job uses. A job that
names every call differently (a metric per step, a generated kernel per shape)
sent 100,000 functions a window: the detector's per-function work (pauses, peer
cells, regression history) took 36-108 s a window, its state outgrew the
broker's message limit, and the jobs beside it got no verdict at all. So a
digest keeps at most :data:`MAX_FN_IDENTITIES` functions (name and stack); the
functions that cost the least (summed time over the digest's ranks) are
folded, per rank, step edge and kind, into one row named ``(other <kind>
functions)``. The fold keeps each rank's time: steps, exclusive time and what
no traced call covers are unchanged.

Applied where a digest is made (:func:`.summarise.digest_window`: batch and
each summariser partition alike) and again where the detector merges the
partitions' digests, so the detector's work and state are bounded whatever a
job sends, and a job under the bound is never touched. A summariser whose
digest would still not fit the topic's message limit (many ranks on one
partition, each with many functions) folds further by rows (``max_rows``), as
the message could not be sent otherwise.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from eroica.models.digest import FnRows, WindowDigest, concat_rows
from eroica.models.records import FN_KINDS

__all__ = ["MAX_FN_IDENTITIES", "fold_fns", "folded_name"]

# 3x the largest real profiler trace here (1,265 name-and-stack pairs in a window of the shared
# Kineto control trace); the detector's per-function work is then bounded (a 100,000-function job
# of 8 ranks: 60 s of `analyze` before, 2-3 s a window with the bound).
MAX_FN_IDENTITIES = 4096


def folded_name(kind: int) -> str:
    """The name folded functions of ``kind`` (a code of :data:`FN_KINDS`) share on each rank."""
    return f"(other {FN_KINDS[kind] if 0 <= kind < len(FN_KINDS) else 'other'} functions)"


def fold_fns(d: WindowDigest, max_identities: int = MAX_FN_IDENTITIES, max_rows: int | None = None) -> WindowDigest:
    """``d`` with its least costly functions folded until the bounds hold (``d`` itself when they do).

    Kept: the functions of the largest summed ``total_ns`` (ties by name and
    stack, so the choice never depends on row order), as many as fit both
    bounds with room for the fold rows. ``WindowDigest.folded`` counts the
    functions folded.
    """
    rows = d.fns
    n = len(rows)
    max_rows = n if max_rows is None else max_rows
    if n <= max_identities and n <= max_rows:
        return d
    if n <= max_rows and len(set(rows.fn)) * len(set(rows.stack)) <= max_identities:
        return d  # the usual large job: many ranks, few functions (two set builds, not a pass per row)
    ids: dict[tuple[str, str], int] = {}
    fid = np.fromiter((ids.setdefault(k, len(ids)) for k in zip(rows.fn, rows.stack)), dtype=np.int64, count=n)
    if len(ids) <= max_identities and n <= max_rows:
        return d
    keys = list(ids)
    weight = np.bincount(fid, weights=rows.total_ns, minlength=len(keys))
    per_id = np.bincount(fid, minlength=len(keys))
    order = sorted(range(len(keys)), key=lambda i: (-weight[i], keys[i]))
    kinds = np.unique(rows.kind)
    fold_rows = int(np.unique(np.stack([rows.rank, rows.step])[:, :], axis=1).shape[1]) * kinds.size
    room_ids = max_identities - kinds.size
    room_rows = max_rows - fold_rows
    keep = np.zeros(len(keys), dtype=bool)
    used = 0
    for kept, i in enumerate(order):
        if kept >= room_ids or used + per_id[i] > room_rows:
            break
        keep[i] = True
        used += int(per_id[i])
    folded_ids = int((~keep).sum())
    if folded_ids == 0:
        return d
    mask = keep[fid]
    out = msgspec.structs.replace(d, fns=concat_rows([_take(rows, mask), _fold(rows, ~mask)]),
                                  folded=d.folded + folded_ids)
    return out


def _take(rows: FnRows, mask: np.ndarray) -> FnRows:
    idx = np.flatnonzero(mask)
    n = len(rows)
    cols: dict[str, Any] = {}  # the columns' own types, FnRows's to check
    for f in FnRows.__struct_fields__:
        v = getattr(rows, f)
        if len(v) != n:  # an optional column an older digest lacks: absent on every row
            cols[f] = v
        else:
            cols[f] = v[idx] if isinstance(v, np.ndarray) else [v[i] for i in idx.tolist()]
    return FnRows(**cols)


def _fold(rows: FnRows, mask: np.ndarray) -> FnRows:
    """The rows under ``mask`` as one row per (rank, step edge, kind): sums summed, quantiles their maximum.

    A maximum of quantiles is an upper bound of the folded calls' quantile, not
    the quantile itself: the fold row is there to keep each rank's time, and
    its comparisons across ranks read sums (per-step cost, exclusive time).
    """
    idx = np.flatnonzero(mask)
    n = len(rows)
    rank, step, kind = rows.rank[idx], rows.step[idx], rows.kind[idx]
    groups, inv = np.unique(np.stack([rank, step, kind]), axis=1, return_inverse=True)
    inv = inv.reshape(-1)
    g = groups.shape[1]

    def summed(col: np.ndarray) -> np.ndarray:
        if len(col) != n:
            return col  # absent on every row (an older digest)
        return np.bincount(inv, weights=col[idx], minlength=g)

    def most(col: np.ndarray) -> np.ndarray:
        if len(col) != n:
            return col
        out = np.full(g, -np.inf)
        np.maximum.at(out, inv, col[idx].astype(np.float64))
        return out

    return FnRows(
        rank=groups[0], fn=[folded_name(int(k)) for k in groups[2].tolist()], stack=[""] * g, kind=groups[2],
        count=summed(rows.count).astype(np.int64), total_ns=summed(rows.total_ns), excl_ns=summed(rows.excl_ns),
        median_ns=most(rows.median_ns), p90_ns=most(rows.p90_ns), p99_ns=most(rows.p99_ns),
        per_step_ns=summed(rows.per_step_ns), step=groups[1], steps=most(rows.steps).astype(np.int64),
        low_ns=summed(rows.low_ns), high_ns=summed(rows.high_ns))
