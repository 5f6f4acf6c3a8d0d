"""Compiled loops of the summariser: exclusive time by priority level, step spans, grouping, row figures, collectives.

Why: :func:`.fn_rows.summarise_fn` spends most of its time in two places
that numpy can only do in several passes. The exclusive time of every span
(its time not covered by a higher-priority span of its rank) is computed
level by level, each level a handful of full passes (``searchsorted``,
``cumsum``, ``maximum.reduceat``, a merge by ``argsort``) over arrays of its
size; the step span of each (rank, step) is three scatters
(``np.minimum.at`` and friends); the records of each (rank, function, row
step) and of each of its steps are found by a sort of the whole block
(packed keys, numpy's quicksort), where a counting sort by row suffices.
Each is one pass over the records here,
compiled by numba (the ``fast`` extra) when it is installed. So are, once the
records are in (row, step) order, every per-row figure (counts, sums,
duration quantiles, per-step cost quantiles: :func:`_row_stats_source`,
where numpy took a sort of packed keys per figure and a scatter per sum),
and the per-(rank, communicator, step) sums of the collective calls
(:func:`_coll_groups_source`).

The sources are plain Python over numpy arrays, so that the tests run them
interpreted as well as compiled; they are compiled on first use
(``numba.njit(cache=True, nogil=True)``: a few seconds the very first time,
then its cache is loaded, ~0.06 CPU-s with numba already imported, ~0.5 s
without). Every result is an exact integer computed from the same values, so
the compiled path, the interpreted one and the numpy one (kept for when numba
is absent, or ``EROICA_SPAN_KERNELS=0``) give the same digests, bit for bit.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np


def _exclusive_source(packed: np.ndarray, e: np.ndarray, i_bits: int, s_bits: int, out: np.ndarray) -> None:
    """Exclusive time of events by priority level, from their sorted ``level | start | index`` keys.

    ``packed`` holds each event's ``level << (s_bits + i_bits) | start << i_bits | index``,
    sorted (so by level, then start, then index); ``e`` the events' ends by index
    (``e >= start``), and ``out`` receives, by index, each event's length less the
    part of it covered by the events of lower levels (one timeline: the caller lays
    ranks end to end on one axis, :func:`.intervals.on_axis`).

    Levels are taken in order. The union of the levels before the current one is
    kept as disjoint intervals in start order, with the running sum of their
    lengths; an event's covered time is that union's length up to its end less
    its length up to its start. Starts come in order within a level, so the
    union interval at or before a start is found by a pointer that only moves
    forward; the one at or before an end by a galloping search from there.
    Then the level's intervals (in start order too) are merged into the union
    in one pass; the last level's never are. Every step is integer arithmetic.
    """
    n = packed.shape[0]
    i_mask = (np.int64(1) << i_bits) - 1
    s_mask = (np.int64(1) << s_bits) - 1
    shift = s_bits + i_bits
    hs = np.empty(n, dtype=np.int64)   # the union: starts, ends, lengths before each interval
    he = np.empty(n, dtype=np.int64)
    cum = np.empty(n + 1, dtype=np.int64)
    ms = np.empty(n, dtype=np.int64)   # the next union, merged into
    me = np.empty(n, dtype=np.int64)
    cum[0] = 0
    m = 0
    lo = 0
    while lo < n:
        level = packed[lo] >> shift
        hi = lo + 1
        while hi < n and (packed[hi] >> shift) == level:
            hi += 1
        j = 0  # union intervals starting at or before the current start
        for p in range(lo, hi):
            key = packed[p]
            i = key & i_mask
            a = (key >> i_bits) & s_mask
            b = e[i]
            r = b - a
            if m > 0:
                while j < m and hs[j] <= a:
                    j += 1
                # those starting at or before b: gallop from j, then bisect
                k = j
                step = 1
                while k + step <= m and hs[k + step - 1] <= b:
                    k += step
                    step *= 2
                top = min(k + step, m)
                while k < top:
                    mid = (k + top) // 2
                    if hs[mid] <= b:
                        k = mid + 1
                    else:
                        top = mid
                up_b = cum[k]
                if k > 0 and he[k - 1] > b:
                    up_b -= he[k - 1] - b
                up_a = cum[j]
                if j > 0 and he[j - 1] > a:
                    up_a -= he[j - 1] - a
                r -= up_b - up_a
            out[i] = r
        if hi < n:  # the next level is covered by this one too: merge it into the union
            q = 0
            u = 0
            c = 0
            run_s = np.int64(0)
            run_e = np.int64(0)
            p = lo
            while p < hi or u < m:
                if u >= m or (p < hi and ((packed[p] >> i_bits) & s_mask) < hs[u]):
                    key = packed[p]
                    x = (key >> i_bits) & s_mask
                    y = e[key & i_mask]
                    p += 1
                else:
                    x = hs[u]
                    y = he[u]
                    u += 1
                if c > 0 and x <= run_e:
                    if y > run_e:
                        run_e = y
                else:
                    if c > 0:
                        ms[q] = run_s
                        me[q] = run_e
                        q += 1
                    run_s = x
                    run_e = y
                    c = 1
            ms[q] = run_s
            me[q] = run_e
            q += 1
            hs, ms = ms, hs
            he, me = me, he
            m = q
            for t in range(m):
                cum[t + 1] = cum[t] + (he[t] - hs[t])
        lo = hi


def _spans_source(ids: np.ndarray, start: np.ndarray, dur: np.ndarray, first: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray) -> None:
    """Per group of ``ids``: its first record, least start and greatest ``start + dur`` (one pass).

    ``first`` comes filled with ``ids.size``, ``lo`` with the int64 maximum and
    ``hi`` with its minimum: what ``np.minimum.at`` / ``np.maximum.at`` would
    leave, in three scatters.
    """
    for i in range(ids.shape[0]):
        g = ids[i]
        if first[g] > i:
            first[g] = i
        s = start[i]
        if s < lo[g]:
            lo[g] = s
        x = s + dur[i]
        if x > hi[g]:
            hi[g] = x


def _rows_source(cell: np.ndarray, n_cells: int, steps: np.ndarray, perm: np.ndarray, bounds: np.ndarray,
                 step_start: np.ndarray) -> int:
    """The records in (row, step, index) order, found by a counting sort of the rows: ``perm`` (what
    ``np.argsort(cell * width + step, kind="stable")`` gives), each row's first position in it
    (``bounds``, ``n_cells + 1`` of them) and each (row, step)'s (``step_start``); returns how many
    (row, step) there are.

    A row's records keep their record order through the counting sort, and
    are usually in step order already (they come in time order); where not,
    they are put in step order by a stable sort of the row alone (an insertion
    sort, or a merge sort for long rows).
    """
    n = cell.shape[0]
    for c in range(n_cells + 1):
        bounds[c] = 0
    for i in range(n):
        bounds[cell[i] + 1] += 1
    for c in range(n_cells):
        bounds[c + 1] += bounds[c]
    pos = bounds[:n_cells].copy()
    for i in range(n):
        c = cell[i]
        perm[pos[c]] = i
        pos[c] += 1
    m = 0
    for c in range(n_cells):
        a = bounds[c]
        b = bounds[c + 1]
        ordered = True
        for p in range(a + 1, b):
            if steps[perm[p]] < steps[perm[p - 1]]:
                ordered = False
                break
        if not ordered:
            if b - a <= 32:  # insertion sort below ~32 items beats a call into a general sort (speed only)
                for p in range(a + 1, b):
                    x = perm[p]
                    sx = steps[x]
                    q = p - 1
                    while q >= a and steps[perm[q]] > sx:
                        perm[q + 1] = perm[q]
                        q -= 1
                    perm[q + 1] = x
            else:
                seg = perm[a:b].copy()
                o = np.argsort(steps[seg], kind="mergesort")
                for t in range(b - a):
                    perm[a + t] = seg[o[t]]
        for p in range(a, b):
            if p == a or steps[perm[p]] != steps[perm[p - 1]]:
                step_start[m] = p
                m += 1
    return m


def _row_stats_source(perm: np.ndarray, bounds: np.ndarray, step_start: np.ndarray, n_groups: int,
                      dur: np.ndarray, excl: np.ndarray, own_dur: np.ndarray, own: np.ndarray, all_own: bool,
                      fn_qs: np.ndarray, step_qs: np.ndarray, count: np.ndarray, total: np.ndarray,
                      excl_sum: np.ndarray, q: np.ndarray, step_q: np.ndarray, fn_steps: np.ndarray,
                      first: np.ndarray) -> None:
    """Every per-row figure of the function rows in one pass over the records in (row, step) order
    (:func:`_rows_source`'s ``perm``, ``bounds`` and ``step_start``, ``n_groups`` of them).

    Per row: its first record (``first``), its own records' count, duration sum
    (``total``) and duration quantiles ``fn_qs`` (``q``, one row per quantile; 0.0
    for a row without an own record), the exclusive time of all its records
    (``excl_sum``), and over its steps (``fn_steps`` of them) the quantiles
    ``step_qs`` of each step's cost (``step_q``). A record's cost is its
    duration where its kind is judged by its own duration (``own_dur``), else
    its exclusive time, and nothing for a continuation (not ``own``) of such a
    kind. ``all_own``: every record is the window's own (``own`` is not read).

    Sums are taken in integers: the caller makes sure no sum can reach 2**53,
    so each is what ``np.bincount`` gives as a float, in any order. Quantiles
    are nearest-rank (lower side), ``floor(q * (count - 1) + 0.5)``, of the
    values sorted in integers, whose conversion to float is monotonic: what
    :func:`.grouping.sorted_quantiles` takes from the sorted floats.
    """
    n = perm.shape[0]
    n_cells = bounds.shape[0] - 1
    buf = np.empty(n, dtype=np.int64)
    sbuf = np.empty(n, dtype=np.int64)
    g = 0
    for c in range(n_cells):
        a = bounds[c]
        b = bounds[c + 1]
        k = 0
        tot = 0
        ex = 0
        lo_i = n
        m = 0
        s = 0
        for p in range(a, b):
            if g < n_groups and step_start[g] == p:  # a row's first position starts a (row, step) too
                if p > a:
                    sbuf[m] = s
                    m += 1
                    s = 0
                g += 1
            i = perm[p]
            if i < lo_i:
                lo_i = i
            x = excl[i]
            ex += x
            if all_own or own[i]:
                d = dur[i]
                buf[k] = d
                k += 1
                tot += d
                s += d if own_dur[i] else x
            elif not own_dur[i]:
                s += x
        if b > a:
            sbuf[m] = s
            m += 1
        first[c] = lo_i
        count[c] = k
        total[c] = float(tot)
        excl_sum[c] = float(ex)
        fn_steps[c] = m
        for which in range(2):  # the row's durations, then its step costs, sorted: insertion sorts of short rows
            v = buf if which == 0 else sbuf
            size = k if which == 0 else m
            if size <= 64:  # short rows: insertion sort; longer ones np.sort (speed only: both sort the same)
                for p in range(1, size):
                    x = v[p]
                    t = p - 1
                    while t >= 0 and v[t] > x:
                        v[t + 1] = v[t]
                        t -= 1
                    v[t + 1] = x
            else:
                v[:size].sort()
        for t in range(fn_qs.shape[0]):
            if k > 0:
                q[t, c] = float(buf[int(np.floor(fn_qs[t] * (k - 1) + 0.5))])
            else:
                q[t, c] = 0.0
        for t in range(step_qs.shape[0]):
            step_q[t, c] = float(sbuf[int(np.floor(step_qs[t] * (m - 1) + 0.5))])


def _coll_groups_source(order: np.ndarray, starts: np.ndarray, n_groups: int, nbytes: np.ndarray, dur: np.ndarray,
                        op: np.ndarray, p2p_a: int, p2p_b: int, ids: np.ndarray, first: np.ndarray,
                        bytes_sum: np.ndarray, known: np.ndarray, dur_sum: np.ndarray, calls: np.ndarray,
                        p2p: np.ndarray, op_max: np.ndarray) -> None:
    """Per group of collective calls (``order``: the calls by group, then index; ``starts``: each group's first
    position in it): each call's group (``ids``), the group's first call, the integer sums of its known
    (``>= 0``) byte counts and of its durations, how many byte counts it has and how many calls, whether a call
    is a send or receive (op ``p2p_a`` or ``p2p_b``) and its largest op code. The caller makes sure no sum
    can reach 2**53 (each is then what ``np.bincount`` gives as a float, in any order).
    """
    n = order.shape[0]
    for g in range(n_groups):
        lo = starts[g]
        hi = starts[g + 1] if g + 1 < n_groups else n
        first[g] = order[lo]
        b_sum = 0
        kn = 0
        d_sum = 0
        any_p = False
        o_max = op[order[lo]]
        for p in range(lo, hi):
            i = order[p]
            ids[i] = g
            b = nbytes[i]
            if b >= 0:
                b_sum += b
                kn += 1
            d_sum += dur[i]
            o = op[i]
            if o == p2p_a or o == p2p_b:
                any_p = True
            if o > o_max:
                o_max = o
        bytes_sum[g] = b_sum
        known[g] = kn
        dur_sum[g] = d_sum
        calls[g] = hi - lo
        p2p[g] = any_p
        op_max[g] = o_max

def _slot_ids_source(slot: np.ndarray, space: int, ids: np.ndarray) -> int:
    """Dense ids of table slots (``0 <= slot < space``): each row's the number of occupied slots before its own
    (slot order), into ``ids``; returns how many slots are occupied. What :func:`.grouping._occupied_ids` gets
    from a scatter of flags, their cumulative sum and a gather, in two passes over the rows."""
    code = np.zeros(space, dtype=np.int64)
    for i in range(slot.shape[0]):
        code[slot[i]] = 1
    g = 0
    for t in range(space):
        if code[t]:
            code[t] = g
            g += 1
    for i in range(slot.shape[0]):
        ids[i] = code[slot[i]]
    return g


class Kernels(NamedTuple):
    """The kernels, compiled (or, for tests, interpreted)."""

    exclusive: Callable[[np.ndarray, np.ndarray, int, int, np.ndarray], None]
    spans: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    rows: Callable[[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
    row_stats: Callable[..., None]
    coll_groups: Callable[..., None]
    slot_ids: Callable[[np.ndarray, int, np.ndarray], int]


_kernels: Kernels | None = None
_failed = False
_records_seen = 0

# Loading the kernels costs ~0.06 CPU-s (numba already imported, as the reader's scanner imports it) to
# ~0.5 s (not yet) and saves ~50 ns per record: they are loaded once the process has summarised this
# many records (never for a small analysis), or by :func:`warm`.
FAST_AFTER_RECORDS = int(os.environ.get("EROICA_SPAN_KERNELS_AFTER", 4 << 20))


_SOURCES = Kernels(_exclusive_source, _spans_source, _rows_source, _row_stats_source, _coll_groups_source,
                   _slot_ids_source)


def _compiler() -> Callable[[Callable[..., object]], Callable[..., object]] | None:
    """numba's ``njit`` as the kernels are compiled with, or None: switched off, or numba not installed."""
    if os.environ.get("EROICA_SPAN_KERNELS", "1") == "0":
        return None
    try:
        import numba  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return None
    jit: Callable[[Callable[..., object]], Callable[..., object]] = numba.njit(cache=True, nogil=True,
                                                                              boundscheck=False)
    return jit


def kernels() -> Kernels | None:
    """The compiled kernels (compiled or loaded from numba's cache on the first call), or None when numba is
    not installed (or ``EROICA_SPAN_KERNELS=0``)."""
    global _kernels, _failed
    if _kernels is None and not _failed:
        jit = _compiler()
        if jit is None:
            _failed = True
            return None
        _kernels = Kernels(*(jit(f) for f in _SOURCES))  # type: ignore[arg-type]
        try:  # compiled or loaded here, once: a cache that cannot be loaded must not fail a summary later
            ok = _smoke(_kernels)
        except Exception:  # noqa: BLE001  (numba's errors have no common base: the numpy path then)
            ok = False
        if not ok:
            _kernels, _failed = None, True
    return _kernels


def use_kernels(kind: str | None) -> None:
    """For tests: ``"numba"`` (compiled), ``"python"`` (the same sources, interpreted: slow, small inputs
    only, runs without numba), ``"numpy"`` (none: the numpy path), or None (back to loading them on demand)."""
    global _kernels, _failed, _records_seen
    _kernels, _failed, _records_seen = None, False, 0
    if kind == "python":
        _kernels = _SOURCES
    elif kind == "numpy":
        _failed = True
    elif kind == "numba" and kernels() is None:
        raise RuntimeError("numba is not installed")


def worth_it(records: int) -> Kernels | None:
    """The kernels to summarise ``records`` more records with (loading them once enough have been), or None."""
    global _records_seen
    if _kernels is not None or _failed:
        return _kernels
    _records_seen += records
    if _records_seen < FAST_AFTER_RECORDS:
        return None
    return kernels()


def loaded() -> Kernels | None:
    """The kernels if :func:`worth_it` (or :func:`warm`) has loaded them, else None (loads nothing)."""
    return _kernels


def warm() -> bool:
    """Load the kernels now (the very first time: compile them into numba's cache, ~1.5 CPU-s).

    For a bench (to leave this one-time cost out of its stages), an image
    build or a long-running worker's start. False when numba is not
    installed or the kernels are switched off.
    """
    return kernels() is not None


def _smoke(ks: Kernels) -> bool:
    """Run each kernel once on a tiny input (compiling it, or loading it from numba's cache); whether all
    gave the right answer."""
    out = np.empty(2, dtype=np.int64)
    ks.exclusive(np.array([0, 1 << 2 | 1 << 1 | 1], dtype=np.int64), np.array([2, 3], dtype=np.int64), 1, 1, out)
    first = np.full(1, 2, dtype=np.int64)  # the dtypes of every call (one compiled version each)
    lo = np.full(1, np.iinfo(np.int64).max)
    hi = np.full(1, np.iinfo(np.int64).min)
    ks.spans(np.zeros(2, dtype=np.int64), np.array([0, 1], dtype=np.int64), np.array([2, 3], dtype=np.int64),
             first, lo, hi)
    cell = np.array([1, 0, 1], dtype=np.int64)
    perm = np.empty(3, dtype=np.int64)
    bounds = np.empty(3, dtype=np.int64)
    step_start = np.empty(3, dtype=np.int64)
    m = ks.rows(cell, 2, np.array([5, 4, 3], dtype=np.int64), perm, bounds, step_start)
    i64, f64 = np.int64, np.float64
    count, fn_steps, rep = np.empty(2, dtype=i64), np.empty(2, dtype=i64), np.empty(2, dtype=i64)
    total, excl_sum = np.empty(2, dtype=f64), np.empty(2, dtype=f64)
    q, step_q = np.empty((3, 2), dtype=f64), np.empty((2, 2), dtype=f64)
    ks.row_stats(perm, bounds, step_start, m, np.array([2, 3, 4], dtype=i64), np.ones(3, dtype=i64),
                 np.zeros(3, dtype=bool), np.zeros(0, dtype=bool), True, np.array([0.5, 0.9, 0.99]),
                 np.array([0.5, 0.05]), count, total, excl_sum, q, step_q, fn_steps, rep)
    # Calls in groups (0: call 2), (1: calls 0, 1), by group then index; call 1 a receive (op 1) of 10 bytes.
    ci = np.empty(3, dtype=i64)
    cf, cb, ck, cd, cc, co = (np.empty(2, dtype=i64) for _ in range(6))
    cp = np.empty(2, dtype=np.bool_)
    ks.coll_groups(np.array([2, 0, 1], dtype=i64), np.array([0, 1], dtype=i64), 2, np.array([-1, 10, 5], dtype=i64),
                   np.array([7, 8, 9], dtype=i64), np.array([0, 1, 2], dtype=i64), 1, 3, ci, cf, cb, ck, cd, cc, cp, co)
    ok = (ci.tolist() == [1, 1, 0] and cf.tolist() == [2, 0] and cb.tolist() == [5, 10] and ck.tolist() == [1, 1]
          and cd.tolist() == [9, 15] and cc.tolist() == [1, 2] and cp.tolist() == [False, True]
          and co.tolist() == [2, 1])
    sid = np.empty(3, dtype=i64)
    ok = ok and ks.slot_ids(np.array([4, 1, 4], dtype=i64), 6, sid) == 2 and sid.tolist() == [1, 0, 1]
    return bool(ok and out[0] == 2 and out[1] == 1 and first[0] == 0 and lo[0] == 0 and hi[0] == 4 and m == 3
                and perm.tolist() == [1, 2, 0] and count.tolist() == [1, 2] and total.tolist() == [3.0, 6.0]
                and q[0].tolist() == [3.0, 4.0] and fn_steps.tolist() == [1, 2] and rep.tolist() == [1, 0]
                and step_q[0].tolist() == [1.0, 1.0] and excl_sum.tolist() == [1.0, 2.0])
