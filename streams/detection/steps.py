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

import math
from operator import itemgetter
from typing import Any, Callable, Sequence, TypeVar

import msgspec
import numpy as np

from eroica.models.digest import INTERIOR, CollRows, FnRows, InFlightRows, RankRows, WindowDigest, concat_rows

from .grouping import dense_ids, group_max, group_min, group_sum
from .patterns import JobArrays, RowArrays, first_seen_ids, renumber_first_seen

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

    Worked in Python floats with numpy's own arithmetic (:func:`_np_median`,
    :func:`_np_sum`): a job window merges thousands of entities' few values,
    where a numpy call per key and entity was most of the cost.
    """
    if len(maps) == 1:
        return dict(maps[0])
    out: dict[str, float] = {}
    for key in sorted({k for m in maps for k in m}):
        fin = [v for v in (_as_float(m.get(key)) for m in maps) if math.isfinite(v)]
        if not fin:
            out[key] = float("nan")
        elif key in ("throughput_Bps", "zero_share"):
            out[key] = _np_sum(fin) / len(fin)
        elif key == "throughput_cv":
            out[key] = _merged_cv(maps, fin)
        elif key.endswith("_inc"):
            out[key] = _np_sum(fin)
        elif key.endswith("_min"):
            out[key] = _np_extreme(fin, min)
        elif key == "xid" or key.endswith("_max"):
            out[key] = _np_extreme(fin, max)
        else:
            out[key] = _np_median(fin)
    return out


def _as_float(v: float | None) -> float:
    """A counter value as ``np.array([...], dtype=np.float64)`` reads it: absent or None is NaN."""
    return float("nan") if v is None else float(v)


# numpy adds fewer than this many values one after the other from 0.0 (its pairwise
# summation unrolls only longer runs): below it, Python's additions are numpy's bits.
_SEQUENTIAL_SUM = 8


def _np_sum(values: list[float]) -> float:
    """``float(np.array(values).sum())``: the same additions in the same order."""
    if len(values) >= _SEQUENTIAL_SUM:
        return float(np.array(values, dtype=np.float64).sum())
    total = 0.0
    for v in values:
        total += v
    return total


def _np_median(values: list[float]) -> float:
    """``float(np.median(values))`` of finite values: the middle one(s), averaged as its ``mean`` does
    (``(0.0 + a [+ b]) / count``; equal middle values differ at most in a zero's sign, which 0.0 + removes)."""
    s = sorted(values)
    h = len(s) // 2
    return (0.0 + s[h]) / 1.0 if len(s) % 2 else ((0.0 + s[h - 1]) + s[h]) / 2.0


def _np_extreme(values: list[float], pick: Callable[[list[float]], float]) -> float:
    """``float(np.min / np.max)`` of finite values; a zero (whose sign numpy's reduction decides) asks numpy."""
    v = pick(values)
    if v == 0.0:
        arr = np.array(values, dtype=np.float64)
        return float(arr.min() if pick is min else arr.max())
    return v


def _merged_cv(maps: Sequence[dict[str, float]], fin: list[float]) -> float:
    """``throughput_cv`` over the windows: the spread of all their samples, from each window's mean and cv."""
    mean_tput = np.array([m.get("throughput_Bps", np.nan) for m in maps], dtype=np.float64)
    cv_tput = np.array([m.get("throughput_cv", np.nan) for m in maps], dtype=np.float64)
    both = np.isfinite(mean_tput) & np.isfinite(cv_tput)
    m1 = float(mean_tput[both].mean()) if both.any() else float("nan")
    m2 = float((mean_tput[both] ** 2 * (1.0 + cv_tput[both] ** 2)).mean()) if both.any() else float("nan")
    return float(np.sqrt(max(m2 - m1 * m1, 0.0)) / m1) if both.any() and m1 > 0 else _np_median(fin)


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
    for r, s in zip(d.ranks.rank.tolist(), d.ranks.step.tolist()):
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
    return {r for d in pending[-LIVE_WINDOWS:] for r in d.ranks.rank.tolist()}


def _last_started(d: WindowDigest | None) -> int:
    """The latest step any rank started in ``d`` (its edge rows name it), -1 without one."""
    if d is None:
        return -1
    steps = d.ranks.step[d.ranks.step != INTERIOR]
    return int(steps.max()) if steps.size else -1


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
    for r, s, n in zip(d.ranks.rank.tolist(), d.ranks.step.tolist(), d.ranks.steps.tolist()):
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


def _joined_rows(parts: Sequence[Rows]) -> Rows:
    """:func:`concat_rows` for reading only: one part is returned as it is, not copied."""
    return parts[0] if len(parts) == 1 else concat_rows(parts)


def _picker(idx: np.ndarray) -> Callable[[Any], Any]:
    """``values[idx]`` for a numeric column (an array) and ``[values[i] for i in idx]`` for a string one (a list),
    built once for all the columns of a row set: a slice when the rows are one ascending run, else one
    ``itemgetter`` call per string column, not a Python step per row (~3x faster)."""
    n = idx.size
    if n == 0:
        return lambda values: values[:0]
    lo = int(idx[0])
    if int(idx[-1]) - lo + 1 == n and bool((np.diff(idx) == 1).all()):
        def run(values: Any) -> Any:
            if len(values) < lo + n:  # a short column fails as indexing it would, never silently shorter
                raise IndexError(f"rows {lo}..{lo + n - 1} of a column of {len(values)}")
            # a copy of an array too, as of a list: a view would keep the whole source alive in what is carried
            return values[lo:lo + n].copy()
        return run
    getters: list[Callable[[Any], Any]] = []  # built for the first string column, if any

    def pick(values: Any) -> Any:
        if isinstance(values, np.ndarray):
            return values[idx]
        if n == 1:
            return [values[lo]]
        if not getters:
            getters.append(itemgetter(*idx.tolist()))
        return list(getters[0](values))
    return pick


def _take(rows: Rows, idx: np.ndarray, fields: Sequence[str] | None = None) -> Rows:
    """The rows at ``idx``, in its order; only ``fields`` are taken when given (the others are left empty, to be set)."""
    cls = type(rows)
    pick = _picker(idx)
    return cls(**{f: pick(getattr(rows, f)) for f in (cls.__struct_fields__ if fields is None else fields)})


def _renumber_first_seen(codes: np.ndarray) -> np.ndarray:
    """Equal codes (non-negative) keep one id, numbered in order of first appearance in ``codes``."""
    return renumber_first_seen(codes)[0]


def _first_seen_ids(fn: list[str], stack: list[str], at: np.ndarray | None = None) -> np.ndarray:
    """An id per (fn, stack) pair of the rows ``at`` (default: all), numbered in order of first appearance there.

    The strings are numbered once over the whole columns (no tuple per row, no
    copy of the rows), the pairs then renumbered among the rows ``at``.
    """
    return _pair_ids(first_seen_ids(fn), first_seen_ids(stack), at)


def _pair_ids(fn: tuple[np.ndarray, list[str]], stack: tuple[np.ndarray, list[str]],
              at: np.ndarray | None = None) -> np.ndarray:
    """:func:`_first_seen_ids` from the columns' :func:`first_seen_ids`."""
    (a, _), (b, stacks) = fn, stack
    pair = a * max(len(stacks), 1) + b
    return _renumber_first_seen(pair if at is None else pair[at])


# The columns that name an edge row; the others hold its values, recomputed when parts merge.
_FN_KEYS = ("rank", "fn", "stack", "kind", "step")
_COLL_KEYS = ("rank", "group", "step")


def _merge_fn_edges(f: FnRows) -> FnRows:
    """Sum the parts of each (rank, function, edge step) into one row."""
    return _with_merged_fn_edges(f, np.zeros(0, dtype=np.intp), np.arange(len(f)))


def _with_merged_fn_edges(f: FnRows, keep: np.ndarray, at: np.ndarray) -> FnRows:
    """The rows ``keep`` as they are, then those of :func:`_merge_fn_edges` over the rows ``at`` (both ascending)."""
    return _fn_rows_merged(f, keep, at, RowArrays(f))[0]


class _Known:
    """The string columns' numberings of a row set being built, from its source's (:meth:`.patterns.RowArrays.known_ids`).

    Only the strings: renumbering the source's codes at the rows taken is
    cheaper than numbering the strings again. The numeric columns are not
    handed on: the rows' own arrays already have their dtypes, so reading
    them is a view (a count read as floats is one ``astype`` per job window).
    """

    def __init__(self) -> None:
        self.ids: dict[str, tuple[np.ndarray, list[str]]] = {}

    def taken(self, src: RowArrays, idx: np.ndarray, ids: Sequence[str]) -> _Known:
        """The source's string numberings (those it has made), at the rows ``idx``."""
        for name in ids:
            seen = src.ids_taken(name, idx)
            if seen is not None:
                self.ids[name] = seen
        return self

    def give(self, arrays: RowArrays) -> None:
        for name, (ids, distinct) in self.ids.items():
            arrays.known_ids(name, ids, distinct)


def _fn_rows_merged(f: FnRows, keep: np.ndarray, at: np.ndarray, src: RowArrays) -> tuple[FnRows, _Known]:
    """:func:`_with_merged_fn_edges`, with the string numberings of the rows built that ``src`` (``f``'s) gives.

    Each column is taken once, for both sets: a merged row takes its keys
    from its first part, and its values, all recomputed, are never copied
    row by row.
    """
    if not at.size:
        return _take(f, keep), _Known().taken(src, keep, ("fn", "stack"))
    rank = src.col("rank", np.int64)[at]
    step = src.col("step", np.int64)[at]
    ids, n, first = dense_ids(rank, _pair_ids(src.first_seen("fn"), src.first_seen("stack"), at), step)
    if n == at.size:
        order = np.concatenate([keep, at])
        return _take(f, order), _Known().taken(src, order, ("fn", "stack"))

    def col(name: str) -> np.ndarray:
        taken: np.ndarray = src.col(name, np.float64)[at]
        return taken

    count = group_sum(ids, col("count"), n)
    total = group_sum(ids, col("total_ns"), n)
    excl = group_sum(ids, col("excl_ns"), n)
    per_step = group_sum(ids, col("per_step_ns"), n)
    median = total / np.maximum(count, 1)  # a step in two parts: its typical call is the mean call ...
    p90 = group_max(ids, col("p90_ns"), n)  # ... its tail the worse part's
    p99 = group_max(ids, col("p99_ns"), n)
    merged = {
        "count": count.astype(np.int64),
        "total_ns": total,
        "excl_ns": excl,
        "per_step_ns": per_step,
        "low_ns": per_step,  # one step: its cost is its level
        "high_ns": per_step,
        "median_ns": median,
        "p90_ns": p90,
        "p99_ns": p99,
        "steps": np.ones(n, dtype=np.int64),
    }
    rows = np.concatenate([keep, at[first]])
    out = _take(f, rows, _FN_KEYS)
    for name, values in merged.items():
        mine = getattr(f, name)
        setattr(out, name, np.concatenate([mine[keep], values.astype(mine.dtype, copy=False)]))
    return out, _Known().taken(src, rows, ("fn", "stack"))


def _merge_colls(c: CollRows) -> CollRows:
    return _merge_colls_at(c, np.arange(len(c)))


def _merge_colls_at(c: CollRows, at: np.ndarray) -> CollRows:
    """The rows ``at`` (ascending) of ``c``, the parts of each (rank, communicator, step) summed into one."""
    return _coll_rows_merged(c, at, RowArrays(c))[0]


def _coll_rows_merged(c: CollRows, at: np.ndarray, src: RowArrays) -> tuple[CollRows, _Known]:
    """:func:`_merge_colls_at`, with the string numberings of the rows built that ``src`` (``c``'s) gives."""
    if not at.size:
        return CollRows(), _Known()
    gid = _renumber_first_seen(src.first_seen("group")[0][at])
    rank, step = src.col("rank", np.int64)[at], src.col("step", np.int64)[at]
    ids, n, first = dense_ids(rank, gid, step)
    if n == at.size:
        return _take(c, at), _Known().taken(src, at, ("group",))

    def col(name: str) -> np.ndarray:
        taken: np.ndarray = src.col(name, np.float64)[at]
        return taken

    out = _take(c, at[first], _COLL_KEYS)
    dur = group_sum(ids, col("dur_ns"), n).astype(np.int64)
    b = col("bytes")
    known = np.bincount(ids, weights=np.isfinite(b).astype(float), minlength=n) > 0
    nbytes = np.where(known, group_sum(ids, np.nan_to_num(b), n), np.nan)
    p2p = group_max(ids, col("p2p"), n) > 0
    op = group_max(ids, col("op"), n).astype(np.int64)
    out.dur_ns = dur
    out.bytes = nbytes.astype(np.float64, copy=False)
    out.calls = group_sum(ids, col("calls"), n).astype(np.int64)
    out.p2p = p2p
    out.op = op
    return out, _Known().taken(src, at[first], ("group",))


def _merge_rank_edges(r: RankRows) -> RankRows:
    if not len(r):
        return r
    ids, n, first = dense_ids(r.rank, r.step)
    if n == len(r):
        return r
    lo = group_min(ids, r.start_ns.astype(np.float64), n).astype(np.int64)
    hi = group_max(ids, r.end_ns.astype(np.float64), n).astype(np.int64)
    out = _take(r, first)
    out.start_ns, out.end_ns = lo, hi
    out.step_time_ns = (hi - lo).astype(np.float64)
    out.steps = np.ones(n, dtype=np.int64)
    return out


def _nonempty(d: WindowDigest) -> WindowDigest | None:
    return d if len(d.ranks) or len(d.fns) or len(d.colls) else None


def split_at_cut(d: WindowDigest, cut: int | None) -> tuple[WindowDigest, WindowDigest]:
    """(the complete steps, the rest to carry); ``cut=None`` takes everything (end of input, hang)."""
    done, carry, _ = split_with_arrays(d, cut)
    return done, carry


def split_with_arrays(d: WindowDigest, cut: int | None) -> tuple[WindowDigest, WindowDigest, JobArrays]:
    """:func:`split_at_cut`, and the complete steps' columns as arrays where the split converted them itself
    (the detector reads them again: :class:`.patterns.JobArrays`)."""
    limit = np.iinfo(np.int64).max if cut is None else cut
    done = msgspec.structs.replace(d)
    carry = WindowDigest(d.job, d.start_ns, d.end_ns)
    src = JobArrays(d)

    # Interior rows (each a time window's aggregate) stay as they are; build_patterns
    # weighs them. Only the parts of one edge step are summed into one row.
    fstep = src.fns.col("step", np.int64)
    interior = fstep == INTERIOR
    edge_done = ~interior & (fstep < limit)
    done.fns, fns_known = _fn_rows_merged(d.fns, np.flatnonzero(interior), np.flatnonzero(edge_done), src.fns)
    carry.fns = _take(d.fns, np.flatnonzero(~interior & ~edge_done))

    rstep = d.ranks.step
    interior = rstep == INTERIOR
    edge_done = ~interior & (rstep < limit)
    done.ranks = concat_rows([_take(d.ranks, np.flatnonzero(interior)),
                              _merge_rank_edges(_take(d.ranks, np.flatnonzero(edge_done)))])
    carry.ranks = _take(d.ranks, np.flatnonzero(~interior & ~edge_done))

    cstep = src.colls.col("step", np.int64)
    keep = cstep < limit
    done.colls, colls_known = _coll_rows_merged(d.colls, np.flatnonzero(keep), src.colls)
    carry.colls = _take(d.colls, np.flatnonzero(~keep))
    arrays = JobArrays(done)
    fns_known.give(arrays.fns)
    colls_known.give(arrays.colls)
    return done, carry, arrays


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
    done, rest, _ = assemble_with_arrays(pending, carry, final)
    return done, rest


def assemble_with_arrays(pending: Sequence[WindowDigest], carry: WindowDigest | None, final: bool = False
                         ) -> tuple[WindowDigest | None, WindowDigest | None, JobArrays | None]:
    """:func:`assemble`, and the job window's columns the split converted (:func:`split_with_arrays`)."""
    if not pending:
        return None, carry, None
    parts = ([carry] if carry is not None else []) + list(pending)
    start_ns, end_ns = pending[0].start_ns, pending[-1].end_ns
    # Whether a job window is ready reads the rank rows alone: the function, collective and
    # counter rows are joined only for a window that is (pending windows wait for their steps
    # most of the time, and joining them on every arrival made the wait quadratic).
    steps_only = WindowDigest(pending[0].job, start_ns, end_ns, ranks=_joined_rows([d.ranks for d in parts]))
    hung = any(len(d.in_flight) for d in parts)
    live = live_ranks(pending)
    if (final or hung or len(pending) >= MAX_PENDING_WINDOWS
            or stalled_windows(pending, carry) >= MAX_STALLED_WINDOWS):
        done, rest, arrays = split_with_arrays(_joined(parts, start_ns, end_ns),
                                               None if (final or hung) else cut_of(steps_only, live))
        return done, _nonempty(rest), arrays
    cut = cut_of(steps_only, live)
    held = complete_steps(steps_only, cut)
    if live is not None:
        held = {r: n for r, n in held.items() if r in live} or held
    if not held or min(held.values()) < MIN_WINDOW_STEPS:
        return None, carry, None
    done, rest, arrays = split_with_arrays(_joined(parts, start_ns, end_ns), cut)
    return done, _nonempty(rest), arrays
