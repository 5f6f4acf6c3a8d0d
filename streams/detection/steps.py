"""Step-aligned job windows: the unit of comparison is whole training steps.

The summariser cuts records on event time (``[k*W, (k+1)*W)``, the same grid
in batch and streaming), but a training step does not respect that grid: a
large model's step lasts from seconds to minutes, so a 30 s window may hold
no complete step at all, and every window cuts the steps at its edges. So the
detector does not analyse time windows one by one. It *assembles* a job
window from consecutive time-window digests until every reporting rank holds
at least :data:`MIN_WINDOW_STEPS` complete steps, then analyses exactly those
steps:

- a digest's *interior* rows (steps strictly between a rank's first and last
  step in the time window) are complete by construction;
- its *edge* rows (a rank's first and last step there) are summed with the
  other parts of the same step from neighbouring time windows; an edge step
  is complete once every rank of the job has moved past it (the job-wide
  *cut*: the smallest of the ranks' latest steps), and carried to the next job
  window otherwise. Collective rows (per rank, communicator and step) follow
  the same cut, so a collective's members are always analysed together.

Nothing here reads a clock or the arrival order: the job window's bounds are
those of its first and last time windows, and which steps it holds is a
function of the digests' contents alone, so batch and streaming, any number of
partitions and any record order give the same job windows. Node clock
offsets only move records between time windows; steps are matched by their
step number, never by time, so they stay whole.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Any, Callable, Sequence, TypeVar

import msgspec
import numpy as np

from eroica.models.digest import INTERIOR, CollRows, FnRows, InFlightRows, RankRows, WindowDigest, concat_rows

from .grouping import dense_ids, group_max, group_min, group_sum
from .patterns import first_seen_ids, used_codes

# A job window holds at least this many complete steps on every rank. Three is
# the smallest sample whose median ignores one odd step (a checkpoint, a GC
# pause, a warm-up step): the per-step median's breakdown point.
MIN_WINDOW_STEPS = 3
# ... unless the job stops making progress (a hang without an in-flight dump,
# every collector gone): after this many time windows in which no rank started
# a new step, the job window is analysed with what it has, so the hang test and
# the job's counters are not held back for ever. 16 windows of the default 30 s
# = 8 min without a new step anywhere: longer than any step of the 5-minute
# steps a large model takes, so a job that is merely slow is never cut short
# (it was, when this bound counted windows rather than windows without progress:
# a 40 s step slowed 6x by a fault gave job windows of two steps, too few to judge).
MAX_STALLED_WINDOWS = 16
# Memory bound whatever the progress: 64 windows (32 min at 30 s) hold three
# steps of 10 minutes, twice the longest step a user of this field reports.
MAX_PENDING_WINDOWS = 64
# A rank silent for this many time windows (2 min at the default 30 s: longer than
# any single operation of a healthy step) no longer holds the cut back.
LIVE_WINDOWS = 4


def _merge_metrics(maps: Sequence[dict[str, float]]) -> dict[str, float]:
    """One entity's counters over several time windows.

    Levels (medians of the samples) combine as the median of the windows'
    levels; increases of cumulative counters (``*_inc``) add up; worst-case
    marks keep their worst (``xid``, ``*_min``). Means over the samples
    (a port's ``throughput_Bps``, its ``zero_share``) combine as means, and
    ``throughput_cv`` as the spread of all the samples: a rail moves its bytes
    in bursts at the end of each step, so with steps of minutes most time
    windows see it idle, and the median of the windows' means would read a
    rail as quieter than the front-end port beside it.
    """
    if len(maps) == 1:
        return dict(maps[0])
    out: dict[str, float] = {}
    mean_tput = np.array([m.get("throughput_Bps", np.nan) for m in maps], dtype=np.float64)
    cv_tput = np.array([m.get("throughput_cv", np.nan) for m in maps], dtype=np.float64)
    for key in sorted({k for m in maps for k in m}):
        vals = np.array([m.get(key, np.nan) for m in maps], dtype=np.float64)
        fin = vals[np.isfinite(vals)]
        if not fin.size:
            out[key] = float("nan")
        elif key in ("throughput_Bps", "zero_share"):
            out[key] = float(fin.mean())
        elif key == "throughput_cv":
            both = np.isfinite(mean_tput) & np.isfinite(cv_tput)
            m1 = float(mean_tput[both].mean()) if both.any() else float("nan")
            m2 = float((mean_tput[both] ** 2 * (1.0 + cv_tput[both] ** 2)).mean()) if both.any() else float("nan")
            out[key] = float(np.sqrt(max(m2 - m1 * m1, 0.0)) / m1) if both.any() and m1 > 0 else float(np.median(fin))
        elif key.endswith("_inc"):
            out[key] = float(fin.sum())
        elif key.endswith("_min"):
            out[key] = float(fin.min())
        elif key == "xid" or key.endswith("_max"):
            out[key] = float(fin.max())
        else:
            out[key] = float(np.median(fin))
    return out


def _merge_counters(digests: Sequence[WindowDigest], name: str) -> dict[Any, dict[str, float]]:
    """Keys are GPU ranks (int) or node / NIC names (str), by ``name``: Any."""
    per: dict[Any, list[dict[str, float]]] = {}
    for d in digests:
        for k, m in getattr(d, name).items():
            per.setdefault(k, []).append(m)
    return {k: _merge_metrics(v) for k, v in per.items()}


def concat(parts: Sequence[WindowDigest], start_ns: int, end_ns: int) -> WindowDigest:
    """The rows of consecutive time windows side by side (no merging of duplicates yet)."""
    out = WindowDigest(parts[0].job, start_ns, end_ns)
    out.ranks = concat_rows([d.ranks for d in parts])
    out.fns = concat_rows([d.fns for d in parts])
    out.colls = concat_rows([d.colls for d in parts])
    out.in_flight = concat_rows([d.in_flight for d in parts])
    out.gpu = _merge_counters(parts, "gpu")
    out.nic = _merge_counters(parts, "nic")
    out.host = _merge_counters(parts, "host")
    for d in parts:
        out.gpu_index.update(d.gpu_index)
    return out


def _joined(parts: Sequence[WindowDigest], start_ns: int, end_ns: int) -> WindowDigest:
    """:func:`concat`, for :func:`assemble`'s own reading: one part's rows are shared, not copied.

    Safe because nothing leaves :func:`assemble` with them: :func:`split_at_cut`
    builds new rows for both of its halves (in-flight rows, which it passes on,
    are still copied).
    """
    if len(parts) > 1:
        return concat(parts, start_ns, end_ns)
    (d,) = parts
    out = concat([WindowDigest(d.job, d.start_ns, d.end_ns, in_flight=d.in_flight, gpu=d.gpu, nic=d.nic, host=d.host,
                               gpu_index=d.gpu_index)], start_ns, end_ns)
    out.ranks, out.fns, out.colls = d.ranks, d.fns, d.colls
    return out


def latest_steps(d: WindowDigest) -> dict[int, int]:
    """Each rank's latest step seen."""
    out: dict[int, int] = {}
    for r, s in zip(d.ranks.rank, d.ranks.step):
        if s > out.get(r, -1):
            out[r] = s
    return out


def cut_of(d: WindowDigest, live: set[int] | None = None) -> int:
    """Steps below the cut are complete on every (live) rank: each has started a later one."""
    latest = latest_steps(d)
    if live is not None:
        latest = {r: s for r, s in latest.items() if r in live} or latest
    return min(latest.values()) if latest else -1


def live_ranks(pending: Sequence[WindowDigest]) -> set[int] | None:
    """Ranks that reported in the last :data:`LIVE_WINDOWS` time windows (None: too few windows to tell).

    A rank whose collector died must not hold every other rank's steps back
    (nor make the carried rows grow without bound); a rank inside one long
    operation still reports within a few windows.
    """
    if len(pending) < LIVE_WINDOWS:
        return None
    return {r for d in pending[-LIVE_WINDOWS:] for r in d.ranks.rank}


def _last_started(d: WindowDigest | None) -> int:
    """The latest step any rank started in ``d`` (its edge rows name it), -1 without one."""
    if d is None:
        return -1
    steps = [s for s in d.ranks.step if s != INTERIOR]
    return max(steps) if steps else -1


def stalled_windows(pending: Sequence[WindowDigest], carry: WindowDigest | None) -> int:
    """Trailing time windows of ``pending`` in which no rank started a step later than any before them."""
    best, since = _last_started(carry), 0
    for d in pending:
        last = _last_started(d)
        if last > best:
            best, since = last, 0
        else:
            since += 1
    return since


def complete_steps(d: WindowDigest, cut: int) -> dict[int, int]:
    """Per rank: complete steps held (interior steps + distinct edge steps below the cut)."""
    out: dict[int, int] = {}
    edge: set[tuple[int, int]] = set()
    for r, s, n in zip(d.ranks.rank, d.ranks.step, d.ranks.steps):
        if s == INTERIOR:
            out[r] = out.get(r, 0) + n
        elif s < cut:
            edge.add((r, s))
        else:
            out.setdefault(r, 0)
    for r, _s in edge:
        out[r] = out.get(r, 0) + 1
    return out


Rows = TypeVar("Rows", FnRows, RankRows, CollRows, InFlightRows)


def _picker(idx: np.ndarray) -> Callable[[list[Any]], list[Any]]:
    """``lambda values: [values[i] for i in idx]``, built once for all the columns of a row set: a slice when the
    rows are one ascending run, else one ``itemgetter`` call per column, not a Python step per row (~3x faster;
    the values are Python objects spread over the heap, so each row of each column still costs a memory access)."""
    n = idx.size
    if n == 0:
        return lambda values: []
    lo = int(idx[0])
    if int(idx[-1]) - lo + 1 == n and bool((np.diff(idx) == 1).all()):
        def run(values: list[Any]) -> list[Any]:
            if len(values) < lo + n:  # a short column fails as indexing it would, never silently shorter
                raise IndexError(f"rows {lo}..{lo + n - 1} of a column of {len(values)}")
            return values[lo:lo + n]
        return run
    if n == 1:
        return lambda values: [values[lo]]
    get = itemgetter(*idx.tolist())
    return lambda values: list(get(values))


def _take(rows: Rows, idx: np.ndarray, fields: Sequence[str] | None = None) -> Rows:
    """The rows at ``idx``, in its order; only ``fields`` are taken when given (the others are left empty, to be set)."""
    cls = type(rows)
    pick = _picker(idx)
    return cls(**{f: pick(getattr(rows, f)) for f in (cls.__struct_fields__ if fields is None else fields)})


def _renumber_first_seen(codes: np.ndarray) -> np.ndarray:
    """Equal codes (non-negative) keep one id, numbered in order of first appearance in ``codes``."""
    if not codes.size:
        return codes
    used, inverse = used_codes(codes, int(codes.max()) + 1)
    first = np.full(used.size, codes.size, dtype=np.int64)
    np.minimum.at(first, inverse, np.arange(codes.size))
    rank = np.empty(used.size, dtype=np.int64)
    rank[np.argsort(first)] = np.arange(used.size)
    out: np.ndarray = rank[inverse]
    return out


def _first_seen_ids(fn: list[str], stack: list[str], at: np.ndarray | None = None) -> np.ndarray:
    """An id per (fn, stack) pair of the rows ``at`` (default: all), numbered in order of first appearance there.

    The strings are numbered once over the whole columns (no tuple per row, no
    copy of the rows), the pairs then renumbered among the rows ``at``.
    """
    a, _ = first_seen_ids(fn)
    b, stacks = first_seen_ids(stack)
    pair = a * max(len(stacks), 1) + b
    return _renumber_first_seen(pair if at is None else pair[at])


# The columns that name an edge row; the others hold its values, recomputed when parts merge.
_FN_KEYS = ("rank", "fn", "stack", "kind", "step")
_COLL_KEYS = ("rank", "group", "step")


def _merge_fn_edges(f: FnRows) -> FnRows:
    """Sum the parts of each (rank, function, edge step) into one row."""
    return _with_merged_fn_edges(f, np.zeros(0, dtype=np.intp), np.arange(len(f.rank)))


def _with_merged_fn_edges(f: FnRows, keep: np.ndarray, at: np.ndarray) -> FnRows:
    """The rows ``keep`` as they are, then those of :func:`_merge_fn_edges` over the rows ``at`` (both ascending).

    Each column is taken once, for both sets: a merged row takes its keys
    from its first part, and its values, all recomputed, are never copied
    row by row.
    """
    if not at.size:
        return _take(f, keep)
    rank = np.asarray(f.rank, dtype=np.int64)[at]
    step = np.asarray(f.step, dtype=np.int64)[at]
    ids, n, first = dense_ids(rank, _first_seen_ids(f.fn, f.stack, at), step)
    if n == at.size:
        return _take(f, np.concatenate([keep, at]))

    def col(name: str) -> np.ndarray:
        taken: np.ndarray = np.asarray(getattr(f, name), dtype=np.float64)[at]
        return taken

    count = group_sum(ids, col("count"), n)
    total = group_sum(ids, col("total_ns"), n)
    per_step = group_sum(ids, col("per_step_ns"), n).tolist()
    merged = {
        "count": count.astype(np.int64).tolist(),
        "total_ns": total.tolist(),
        "excl_ns": group_sum(ids, col("excl_ns"), n).tolist(),
        "per_step_ns": per_step,
        "low_ns": list(per_step),  # one step: its cost is its level
        # a step in two parts: its typical call is the mean call, its tail the worse part's
        "median_ns": (total / np.maximum(count, 1)).tolist(),
        "p90_ns": group_max(ids, col("p90_ns"), n).tolist(),
        "p99_ns": group_max(ids, col("p99_ns"), n).tolist(),
        "steps": [1] * n,
    }
    out = _take(f, np.concatenate([keep, at[first]]), _FN_KEYS)
    pick = _picker(keep)
    for name, values in merged.items():
        mine = pick(getattr(f, name))
        mine += values
        setattr(out, name, mine)
    return out


def _merge_rank_edges(r: RankRows) -> RankRows:
    if not r.rank:
        return r
    ids, n, first = dense_ids(np.asarray(r.rank), np.asarray(r.step))
    if n == len(r.rank):
        return r
    lo = group_min(ids, np.asarray(r.start_ns, dtype=np.float64), n).astype(np.int64)
    hi = group_max(ids, np.asarray(r.end_ns, dtype=np.float64), n).astype(np.int64)
    out = _take(r, first)
    out.start_ns, out.end_ns = lo.tolist(), hi.tolist()
    out.step_time_ns = (hi - lo).astype(np.float64).tolist()
    out.steps = [1] * n
    return out


def _merge_colls(c: CollRows) -> CollRows:
    return _merge_colls_at(c, np.arange(len(c.rank)))


def _merge_colls_at(c: CollRows, at: np.ndarray) -> CollRows:
    """The rows ``at`` (ascending) of ``c``, the parts of each (rank, communicator, step) summed into one."""
    if not at.size:
        return CollRows()
    gid = _renumber_first_seen(first_seen_ids(c.group)[0][at])
    ids, n, first = dense_ids(np.asarray(c.rank, dtype=np.int64)[at], gid, np.asarray(c.step, dtype=np.int64)[at])
    if n == at.size:
        return _take(c, at)

    def col(name: str) -> np.ndarray:
        taken: np.ndarray = np.asarray(getattr(c, name), dtype=np.float64)[at]
        return taken

    out = _take(c, at[first], _COLL_KEYS)
    out.dur_ns = group_sum(ids, col("dur_ns"), n).astype(np.int64).tolist()
    b = col("bytes")
    known = np.bincount(ids, weights=np.isfinite(b).astype(float), minlength=n) > 0
    out.bytes = np.where(known, group_sum(ids, np.nan_to_num(b), n), np.nan).tolist()
    out.calls = group_sum(ids, col("calls"), n).astype(np.int64).tolist()
    out.p2p = (group_max(ids, col("p2p"), n) > 0).tolist()
    out.op = group_max(ids, col("op"), n).astype(np.int64).tolist()
    return out


def _nonempty(d: WindowDigest) -> WindowDigest | None:
    return d if d.ranks.rank or d.fns.rank or d.colls.rank else None


def split_at_cut(d: WindowDigest, cut: int | None) -> tuple[WindowDigest, WindowDigest]:
    """(the complete steps, the rest to carry); ``cut=None`` takes everything (end of input, hang)."""
    limit = np.iinfo(np.int64).max if cut is None else cut
    done = msgspec.structs.replace(d)
    carry = WindowDigest(d.job, d.start_ns, d.end_ns)

    # Interior rows (each a time window's aggregate) stay as they are; build_patterns
    # weighs them. Only the parts of one edge step are summed into one row.
    fstep = np.asarray(d.fns.step, dtype=np.int64)
    interior = fstep == INTERIOR
    edge_done = ~interior & (fstep < limit)
    done.fns = _with_merged_fn_edges(d.fns, np.flatnonzero(interior), np.flatnonzero(edge_done))
    carry.fns = _take(d.fns, np.flatnonzero(~interior & ~edge_done))

    rstep = np.asarray(d.ranks.step, dtype=np.int64)
    interior = rstep == INTERIOR
    edge_done = ~interior & (rstep < limit)
    done.ranks = concat_rows([_take(d.ranks, np.flatnonzero(interior)),
                              _merge_rank_edges(_take(d.ranks, np.flatnonzero(edge_done)))])
    carry.ranks = _take(d.ranks, np.flatnonzero(~interior & ~edge_done))

    cstep = np.asarray(d.colls.step, dtype=np.int64)
    keep = cstep < limit
    done.colls = _merge_colls_at(d.colls, np.flatnonzero(keep))
    carry.colls = _take(d.colls, np.flatnonzero(~keep))
    return done, carry


def assemble(pending: Sequence[WindowDigest], carry: WindowDigest | None,
             final: bool = False) -> tuple[WindowDigest | None, WindowDigest | None]:
    """(the job window to analyse now, or None; what to carry into the next one).

    ``pending`` are the time-window digests not analysed yet, oldest first;
    ``carry`` the incomplete steps left by the previous job window. The job
    window is ready when every rank holds :data:`MIN_WINDOW_STEPS` complete
    steps, when ``final`` (end of input), when a rank dumped functions still
    in flight (a hang: analyse now), after :data:`MAX_STALLED_WINDOWS` without a
    new step, or after :data:`MAX_PENDING_WINDOWS` whatever the progress.
    """
    if not pending:
        return None, carry
    parts = ([carry] if carry is not None else []) + list(pending)
    whole = _joined(parts, pending[0].start_ns, pending[-1].end_ns)
    hung = bool(whole.in_flight.rank)
    live = live_ranks(pending)
    if (final or hung or len(pending) >= MAX_PENDING_WINDOWS
            or stalled_windows(pending, carry) >= MAX_STALLED_WINDOWS):
        done, rest = split_at_cut(whole, None if (final or hung) else cut_of(whole, live))
        return done, _nonempty(rest)
    cut = cut_of(whole, live)
    held = complete_steps(whole, cut)
    if live is not None:
        held = {r: n for r, n in held.items() if r in live} or held
    if not held or min(held.values()) < MIN_WINDOW_STEPS:
        return None, carry
    done, rest = split_at_cut(whole, cut)
    return done, _nonempty(rest)
