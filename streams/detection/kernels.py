"""Compiled loops of the summariser: exclusive time by priority level, step spans, grouping, row figures,
counter increases, the block order of a window's records, the hash of its fn records, collectives.

Why: :func:`.fn_rows.summarise_fn` spends most of its time in places that
numpy can only do in several passes. The exclusive time of every span (its
time not covered by a higher-priority span of its rank) is computed level by
level, each level a handful of full passes (``searchsorted``, ``cumsum``,
``maximum.reduceat``, a merge by ``argsort``) over arrays of its size, after
four passes for the levels, four for the axis and five for the keys
(:func:`_axis_keys_source` makes all three in one); the step span of each
(rank, step) is three scatters (``np.minimum.at`` and friends); a record's
(rank, step) table entry, row step and row id take a dozen passes
(:func:`_step_keys_source`, :func:`_cells_source`). Each is one pass over
the records here, compiled by numba (the ``fast`` extra) when it is
installed. So are, once the records are in (row, step) order (one vectorised
sort of packed keys, :func:`_row_keys_source` and :func:`_sorted_rows_source`;
or the counting sort of :func:`_rows_source`), every per-row sum (durations,
exclusive times, per-step costs: :func:`_row_sums_source`, where numpy took a
scatter per sum) and the keys whose one sort gives each row's quantiles
(:func:`_row_ranks_source`); the scatter that puts a window's records in
block order (:func:`_block_dest_source`, :func:`_scatter_source`); the hash
of the fn records' identities (:func:`_fn_hashes_source`); the increases of
a window's cumulative counters (:func:`_increases_source`); and the
per-(rank, communicator, step) sums of the collective calls
(:func:`_coll_groups_source`).

The sources are plain Python over numpy arrays, so that the tests run them
interpreted as well as compiled; they are compiled on first use
(``numba.njit(cache=True, nogil=True)``: several seconds the very first time,
then its cache is loaded, ~0.16 CPU-s for them all with numba already
imported). Every result is an exact integer, or the same float arithmetic in
the same order, computed from the same values, so the compiled path, the
interpreted one and the numpy one (kept for when numba is absent, or
``EROICA_SPAN_KERNELS=0``) give the same digests, bit for bit.
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import numpy as np

from eroica.models.jit import LazyKernels


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


def _axis_keys_source(slot: np.ndarray, start: np.ndarray, end: np.ndarray, kind: np.ndarray, stack: np.ndarray,
                      level_of_kind: np.ndarray, host_level: np.ndarray, host: int, span: int, s_bits: int,
                      i_bits: int, packed: np.ndarray, e: np.ndarray) -> bool:
    """Events laid end to end per slot on one axis (:func:`.intervals.on_axis`: ``slot * span + start``, the
    ends likewise into ``e``) and packed as :func:`_exclusive_source` takes them, ``level | start | index``
    (unsorted): one pass, where numpy takes four for the axis, four for the levels and five for the keys.

    A record's level is its kind's (``level_of_kind``), or where that is
    ``host``, its stack's (``host_level``, when it has entries). False (the
    keys unfinished) where a level is negative or wider than the
    ``63 - s_bits - i_bits`` bits left to it.
    """
    top = np.int64(1) << (63 - s_bits - i_bits)
    stacks = host_level.shape[0] > 0
    for i in range(slot.shape[0]):
        lvl = np.int64(level_of_kind[kind[i]])
        if stacks and lvl == host:
            lvl = np.int64(host_level[stack[i]])
        if lvl < 0 or lvl >= top:
            return False
        at = slot[i] * span
        e[i] = at + end[i]
        packed[i] = (lvl << (s_bits + i_bits)) | ((at + start[i]) << i_bits) | i
    return True


def _spans_source(ids: np.ndarray, start: np.ndarray, dur: np.ndarray, first: np.ndarray, lo: np.ndarray,
                  hi: np.ndarray) -> None:
    """Per group of ``ids``: its first record, least start and greatest ``start + dur`` (one pass); records of
    id -1 are in none (the caller's continuations, left out without a copy of the others).

    ``first`` comes filled with ``ids.size``, ``lo`` with the int64 maximum and
    ``hi`` with its minimum: what ``np.minimum.at`` / ``np.maximum.at`` would
    leave, in three scatters.
    """
    for i in range(ids.shape[0]):
        g = ids[i]
        if g < 0:
            continue
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


def _row_keys_source(cell: np.ndarray, steps: np.ndarray, s_lo: int, s_bits: int, i_bits: int,
                     keys: np.ndarray) -> None:
    """Each record's ``row | step - s_lo | index`` key (``s_bits`` and ``i_bits`` wide): sorted, the records in
    (row, step, index) order, :func:`_rows_source`'s; one pass, where numpy takes six."""
    for i in range(cell.shape[0]):
        keys[i] = (cell[i] << (s_bits + i_bits)) | ((steps[i] - s_lo) << i_bits) | i


def _sorted_rows_source(keys: np.ndarray, i_bits: int, s_bits: int, perm: np.ndarray, bounds: np.ndarray,
                        step_start: np.ndarray) -> int:
    """:func:`_rows_source`'s ``perm``, ``bounds`` and ``step_start`` (and the number of (row, step)) from the
    sorted keys of :func:`_row_keys_source`, in one pass: a vectorised sort of the keys and this cost less
    than the counting sort, whose scatters and gathers go all over the block."""
    n = keys.shape[0]
    n_cells = bounds.shape[0] - 1
    i_mask = (np.int64(1) << i_bits) - 1
    m = 0
    last = np.int64(-1)
    c = -1
    for p in range(n):
        k = keys[p]
        perm[p] = k & i_mask
        g = k >> i_bits
        if g != last:
            step_start[m] = p
            m += 1
            last = g
            row = g >> s_bits
            while c < row:
                c += 1
                bounds[c] = p
    while c < n_cells:
        c += 1
        bounds[c] = n
    return m


def _row_sums_source(perm: np.ndarray, bounds: np.ndarray, step_start: np.ndarray, n_groups: int,
                     dur: np.ndarray, excl: np.ndarray, own_dur: np.ndarray, own: np.ndarray, all_own: bool,
                     d_bits: int, d_lo: int, count: np.ndarray, total: np.ndarray, excl_sum: np.ndarray,
                     step_sum: np.ndarray, fn_steps: np.ndarray, first: np.ndarray, d_keys: np.ndarray) -> None:
    """Every per-row sum of the function rows in one pass over the records in (row, step) order
    (:func:`_rows_source`'s ``perm``, ``bounds`` and ``step_start``, ``n_groups`` of them).

    Per row: its first record (``first``), its own records' count and
    duration sum (``count``, ``total``), the exclusive time of all its records
    (``excl_sum``) and how many steps it has (``fn_steps``); per (row, step),
    in that order, the step's cost (``step_sum``). A record's cost is its
    duration where its kind is judged by its own duration (``own_dur``), else
    its exclusive time, and nothing for a continuation (not ``own``) of such a
    kind. ``all_own``: every record is the window's own (``own`` is not read).
    With ``d_bits >= 0``, each own record's ``row << d_bits | (duration - d_lo)``
    goes to ``d_keys``, row by row: sorted, they are each row's durations in
    order (the caller makes sure they fit).

    Sums are taken in integers: the caller makes sure no sum can reach 2**53,
    so each is what ``np.bincount`` gives as a float, in any order. The
    quantiles are not taken here: sorting each row's values here (insertion
    sorts: most rows are short) cost twice this pass, where one vectorised
    sort of the block's packed keys costs a fraction of it.
    """
    n = perm.shape[0]
    n_cells = bounds.shape[0] - 1
    g = 0
    j = 0
    for c in range(n_cells):
        a = bounds[c]
        b = bounds[c + 1]
        g0 = g
        k = 0
        tot = 0
        ex = 0
        lo_i = n
        s = 0
        for p in range(a, b):
            if g < n_groups and step_start[g] == p:  # a row's first position starts a (row, step) too
                if p > a:
                    step_sum[g - 1] = s
                    s = 0
                g += 1
            i = perm[p]
            if i < lo_i:
                lo_i = i
            x = excl[i]
            ex += x
            if all_own or own[i]:
                d = dur[i]
                k += 1
                tot += d
                s += d if own_dur[i] else x
                if d_bits >= 0:
                    d_keys[j] = (np.int64(c) << d_bits) | (d - d_lo)
                    j += 1
            elif not own_dur[i]:
                s += x
        if b > a:
            step_sum[g - 1] = s
        first[c] = lo_i
        count[c] = k
        total[c] = float(tot)
        excl_sum[c] = float(ex)
        fn_steps[c] = g - g0


def _pack_rows_source(values: np.ndarray, counts: np.ndarray, lo: int, bits: int, keys: np.ndarray) -> None:
    """``row << bits | (value - lo)`` of values that come row by row (``counts`` per row): one pass, where numpy
    repeats the rows per value and takes three more."""
    j = 0
    for c in range(counts.shape[0]):
        for _ in range(counts[c]):
            keys[j] = (np.int64(c) << bits) | (values[j] - lo)
            j += 1


def _row_ranks_source(keys: np.ndarray, counts: np.ndarray, qs: np.ndarray, bits: int, lo: int, empty: float,
                      out: np.ndarray) -> None:
    """Nearest-rank quantiles (lower side, ``floor(q * (count - 1) + 0.5)``: :func:`.grouping.sorted_quantiles`)
    of each row's values from sorted ``row << bits | (value - lo)`` keys (``counts`` per row), as floats into
    ``out`` (one row per quantile); ``empty`` for a row without a value."""
    mask = (np.int64(1) << bits) - 1
    at = 0
    for c in range(counts.shape[0]):
        n = counts[c]
        for t in range(qs.shape[0]):
            if n > 0:
                out[t, c] = float((keys[at + int(np.floor(qs[t] * (n - 1) + 0.5))] & mask) + lo)
            else:
                out[t, c] = empty
        at += n


def _increases_source(order: np.ndarray, ids: np.ndarray, values: np.ndarray, seen: np.ndarray, prev: np.ndarray,
                      out: np.ndarray) -> None:
    """Per counter (a row of ``values``) and entity (``ids``), the increase of a cumulative counter over its
    samples in time order (``order``), across resets (:func:`.counters._increase`, the same float arithmetic):
    each sample that is not NaN adds its difference from the entity's previous one, or itself where that is
    negative (a restart), starting from 0.0 in time order (``np.bincount``'s sums); NaN for an entity without
    a sample. ``seen`` and ``prev`` are scratch, one per entity; ``out`` is (counters, entities)."""
    n = out.shape[1]
    for r in range(values.shape[0]):
        for e in range(n):
            seen[e] = False
            out[r, e] = 0.0
        for p in range(order.shape[0]):
            j = order[p]
            x = values[r, j]
            if x != x:  # NaN: a sample the counter does not have
                continue
            e = ids[j]
            if seen[e]:
                d = x - prev[e]
                out[r, e] += d if d >= 0 else x
            seen[e] = True
            prev[e] = x
        for e in range(n):
            if not seen[e]:
                out[r, e] = np.nan


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

def _step_keys_source(slot: np.ndarray, steps: np.ndarray, s_lo: int, width: int, own: np.ndarray, all_own: bool,
                      key: np.ndarray, present: np.ndarray, present_own: np.ndarray) -> None:
    """Each record's entry in a table of every (slot, step) of the range (``slot * width + step - s_lo``, into
    ``key``), and which entries some record has (``present``) and some own record (``present_own``, the same
    array when ``all_own``): one pass, where numpy takes four for the keys and a scatter, a gather and a
    scatter for the marks."""
    for i in range(slot.shape[0]):
        k = slot[i] * width + steps[i] - s_lo
        key[i] = k
        present[k] = True
        if not all_own and own[i]:
            present_own[k] = True


def _cells_source(slot: np.ndarray, fid: np.ndarray, key: np.ndarray, part_of: np.ndarray, code_of: np.ndarray,
                  own_code: np.ndarray, own: np.ndarray, all_own: bool, n_f: int, n_v: int, part: np.ndarray,
                  cell: np.ndarray, own_ids: np.ndarray) -> int:
    """Per record, from its (slot, step) entry ``key``: its row step (``part_of``), its row's key in the table
    of every (slot, function, row step) (the row step by its code, ``code_of``), and its own (slot, step) id
    (``own_code``; -1 for a continuation); returns the table's size. What a gather and five passes to pack
    the row keys give, in one; :func:`_slot_ids_source` then makes the keys dense ids, in that order."""
    n = slot.shape[0]
    top = 0  # the rows' table: up to the last row key present
    for i in range(n):
        k = key[i]
        part[i] = part_of[k]
        c = (slot[i] * n_f + fid[i]) * n_v + code_of[k]
        cell[i] = c
        if c + 1 > top:
            top = c + 1
        own_ids[i] = own_code[k] if all_own or own[i] else -1
    return top


def _slot_ids_source(slot: np.ndarray, space: int, ids: np.ndarray) -> int:
    """Dense ids of table slots (``0 <= slot < space``): each row's the number of occupied slots before its own
    (slot order), into ``ids``; returns how many slots are occupied. What :func:`.grouping._occupied_ids` gets
    from a scatter of flags, their cumulative sum and a gather, in two passes over the rows. ``ids`` may be
    ``slot`` itself (each row's slot is read before its id is written)."""
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


def _block_dest_source(key: np.ndarray, blk_of: np.ndarray, pos: np.ndarray, dest: np.ndarray) -> None:
    """Each record's position when records are put in block order, stably: the scatter of a counting sort.

    ``key``: each record's rank slot; ``blk_of``: each slot's block; ``pos``:
    each block's first position (advanced here). ``dest`` receives what
    ``np.argsort(blk_of[key], kind="stable")`` is the inverse of, in one pass.
    """
    for i in range(key.shape[0]):
        b = blk_of[key[i]]
        dest[i] = pos[b]
        pos[b] += 1


def _scatter_source(dest: np.ndarray, src: np.ndarray, out: np.ndarray) -> None:
    """``out[dest] = src``: one column put in block order (:func:`_block_dest_source`), a third faster than
    numpy's indexed assignment."""
    for i in range(src.shape[0]):
        out[dest[i]] = src[i]


def _fn_hashes_source(ts: np.ndarray, dur: np.ndarray, rank: np.ndarray, fn: np.ndarray, stream: np.ndarray,
                      stack: np.ndarray, in_flight: np.ndarray, mults: np.ndarray, out: np.ndarray) -> None:
    """The 64-bit hash of each fn record's identity (:func:`.repeats._hashes`, the same wrapping arithmetic):
    one pass, where numpy takes two per field."""
    for i in range(ts.shape[0]):
        h = (ts[i] * mults[0] + dur[i] * mults[1] + np.int64(rank[i]) * mults[2] + np.int64(fn[i]) * mults[3]
             + np.int64(stream[i]) * mults[4] + np.int64(stack[i]) * mults[5] + np.int64(in_flight[i]) * mults[6])
        out[i] = h ^ (h >> 29)


# The column dtypes :func:`_scatter_source` is compiled for (the fn schema's: models.columns.SCHEMAS);
# columns of other dtypes take numpy's scatter, not a compilation of their own at run time.
SCATTER_DTYPES = (np.dtype(np.int8), np.dtype(np.int32), np.dtype(np.int64))


class Kernels(NamedTuple):
    """The kernels, compiled (or, for tests, interpreted)."""

    exclusive: Callable[[np.ndarray, np.ndarray, int, int, np.ndarray], None]
    axis_keys: Callable[..., bool]
    spans: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    rows: Callable[[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray], int]
    row_keys: Callable[..., None]
    sorted_rows: Callable[..., int]
    row_sums: Callable[..., None]
    pack_rows: Callable[[np.ndarray, np.ndarray, int, int, np.ndarray], None]
    row_ranks: Callable[..., None]
    coll_groups: Callable[..., None]
    increases: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    slot_ids: Callable[[np.ndarray, int, np.ndarray], int]
    step_keys: Callable[..., None]
    cells: Callable[..., int]
    block_dest: Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]
    scatter: Callable[[np.ndarray, np.ndarray, np.ndarray], None]
    fn_hashes: Callable[..., None]


# Loading the kernels costs ~0.16 CPU-s (numba already imported, as the reader's scanner imports it; all
# seventeen, 2026-11-28) to ~0.3 s (not yet) and saves ~90 ns per record (1,024 ranks): they are loaded once
# the process has summarised this many records (never for a small analysis), or by :func:`warm`.
FAST_AFTER_RECORDS = int(os.environ.get("EROICA_SPAN_KERNELS_AFTER", 4 << 20))


_SOURCES = Kernels(
    exclusive=_exclusive_source, axis_keys=_axis_keys_source, spans=_spans_source, rows=_rows_source,
    row_keys=_row_keys_source, sorted_rows=_sorted_rows_source, row_sums=_row_sums_source,
    pack_rows=_pack_rows_source, row_ranks=_row_ranks_source, coll_groups=_coll_groups_source,
    increases=_increases_source, slot_ids=_slot_ids_source, step_keys=_step_keys_source, cells=_cells_source,
    block_dest=_block_dest_source, scatter=_scatter_source, fn_hashes=_fn_hashes_source,
)


def kernels() -> Kernels | None:
    """The compiled kernels (compiled or loaded from numba's cache on the first call), or None when numba is
    not installed (or ``EROICA_SPAN_KERNELS=0``)."""
    ks: Kernels | None = _lazy.get()
    return ks


def use_kernels(kind: str | None) -> None:
    """For tests: ``"numba"`` (compiled), ``"python"`` (the same sources, interpreted: slow, small inputs
    only, runs without numba), ``"numpy"`` (none: the numpy path), or None (back to loading them on demand)."""
    _lazy.use(kind, off="numpy")


def worth_it(records: int) -> Kernels | None:
    """The kernels to summarise ``records`` more records with (loading them once enough have been), or None."""
    ks: Kernels | None = _lazy.worth_it(records, FAST_AFTER_RECORDS)
    return ks


def loaded() -> Kernels | None:
    """The kernels if :func:`worth_it` (or :func:`warm`) has loaded them, else None (loads nothing)."""
    ks: Kernels | None = _lazy.value
    return ks


def warm() -> bool:
    """Load the kernels now (the very first time: compile them into numba's cache, ~1.5 CPU-s).

    For a bench (to leave this one-time cost out of its stages), an image
    build or a long-running worker's start. False when numba is not
    installed or the kernels are switched off.
    """
    return kernels() is not None


def _compile(jit: Callable[[Callable[..., object]], Callable[..., object]]) -> Kernels:
    return Kernels(*(jit(f) for f in _SOURCES))  # type: ignore[arg-type]


def _smoke(ks: Kernels) -> bool:
    """Run each kernel once on a tiny input (compiling it, or loading it from numba's cache); whether all
    gave the right answer."""
    out = np.empty(2, dtype=np.int64)
    ks.exclusive(np.array([0, 1 << 2 | 1 << 1 | 1], dtype=np.int64), np.array([2, 3], dtype=np.int64), 1, 1, out)
    keys, ends = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64)  # slots 0, 1 of span 2: starts 0, 3
    i16 = np.int16  # kinds 1, 0 of levels 3 (a host kind: its stack's, 1) and 0
    axis_ok = ks.axis_keys(np.array([0, 1], dtype=np.int64), np.array([0, 1], dtype=np.int64),
                           np.array([2, 1], dtype=np.int64), np.array([1, 0], dtype=np.int8),
                           np.array([0, 0], dtype=np.int32), np.array([0, 3], dtype=i16), np.array([1], dtype=i16), 3,
                           2, 2, 1, keys, ends)
    axis_ok = axis_ok and keys.tolist() == [1 << 3 | 0 << 1 | 0, 0 << 3 | 3 << 1 | 1] and ends.tolist() == [2, 3]
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
    keys3 = np.empty(3, dtype=np.int64)
    ks.row_keys(cell, np.array([5, 4, 3], dtype=np.int64), 3, 2, 2, keys3)
    keys3.sort()
    perm2, bounds2, start2 = np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64), np.empty(3, dtype=np.int64)
    sorted_ok = (ks.sorted_rows(keys3, 2, 2, perm2, bounds2, start2) == m and perm2.tolist() == perm.tolist()
                 and bounds2.tolist() == bounds.tolist() and start2.tolist() == step_start[:m].tolist())
    i64, f64 = np.int64, np.float64
    count, fn_steps, rep, step_sum = (np.empty(k, dtype=i64) for k in (2, 2, 2, 3))
    total, excl_sum = np.empty(2, dtype=f64), np.empty(2, dtype=f64)
    d_keys = np.empty(3, dtype=i64)
    ks.row_sums(perm, bounds, step_start, m, np.array([2, 3, 4], dtype=i64), np.ones(3, dtype=i64),
                np.zeros(3, dtype=bool), np.zeros(0, dtype=bool), True, 2, 2, count, total, excl_sum, step_sum,
                fn_steps, rep, d_keys)
    # Calls in groups (0: call 2), (1: calls 0, 1), by group then index; call 1 a receive (op 1) of 10 bytes.
    ci = np.empty(3, dtype=i64)
    cf, cb, ck, cd, cc, co = (np.empty(2, dtype=i64) for _ in range(6))
    cp = np.empty(2, dtype=np.bool_)
    ks.coll_groups(np.array([2, 0, 1], dtype=i64), np.array([0, 1], dtype=i64), 2, np.array([-1, 10, 5], dtype=i64),
                   np.array([7, 8, 9], dtype=i64), np.array([0, 1, 2], dtype=i64), 1, 3, ci, cf, cb, ck, cd, cc, cp, co)
    ok = (ci.tolist() == [1, 1, 0] and cf.tolist() == [2, 0] and cb.tolist() == [5, 10] and ck.tolist() == [1, 1]
          and cd.tolist() == [9, 15] and cc.tolist() == [1, 2] and cp.tolist() == [False, True]
          and co.tolist() == [2, 1])
    # Rows of 1 and 2 values (3; 4, 6), packed with 2 bits from 3, then their medians and nothing for a third row.
    packed3, ranks = np.empty(3, dtype=i64), np.empty((1, 3), dtype=f64)
    ks.pack_rows(np.array([3, 4, 6], dtype=i64), np.array([1, 2, 0], dtype=i64), 3, 2, packed3)
    ks.row_ranks(packed3, np.array([1, 2, 0], dtype=i64), np.array([0.5]), 2, 3, -1.0, ranks)
    ok = ok and packed3.tolist() == [0, 4 | 1, 4 | 3] and ranks.tolist() == [[3.0, 6.0, -1.0]]
    # Entity 0: 5, NaN, 7, 2 (a reset: + 2 + 2); entity 1: NaN only.
    inc = np.empty((1, 2), dtype=f64)
    ks.increases(np.array([0, 1, 2, 3, 4], dtype=i64), np.array([0, 0, 0, 0, 1], dtype=i64),
                 np.array([[5.0, np.nan, 7.0, 2.0, np.nan]]), np.empty(2, dtype=np.bool_), np.empty(2, dtype=f64), inc)
    ok = ok and inc[0, 0] == 4.0 and bool(np.isnan(inc[0, 1]))
    sid = np.empty(3, dtype=i64)
    ok = ok and ks.slot_ids(np.array([4, 1, 4], dtype=i64), 6, sid) == 2 and sid.tolist() == [1, 0, 1]
    # Slots 0, 1, 0 at steps 5, 5, 6 in a table of width 2 from step 5; functions 0, 0, 1; two row steps.
    slot3, key = np.array([0, 1, 0], dtype=i64), np.empty(3, dtype=i64)
    present = np.zeros(4, dtype=bool)
    ks.step_keys(slot3, np.array([5, 5, 6], dtype=i64), 5, 2, np.zeros(0, dtype=bool), True, key, present, present)
    ok = ok and key.tolist() == [0, 2, 1] and present.tolist() == [True, True, True, False]
    part, cell, own_ids = np.empty(3, dtype=i64), np.empty(3, dtype=i64), np.empty(3, dtype=i64)
    top = ks.cells(slot3, np.array([0, 0, 1], dtype=i64), key, np.array([5, 6, 5, 6], dtype=i64),
                   np.array([0, 1, 0, 1], dtype=i64), np.array([0, 1, 2, 2], dtype=i64), np.zeros(0, dtype=bool), True,
                   2, 2, part, cell, own_ids)
    ok = ok and top == 5 and part.tolist() == [5, 5, 6] and cell.tolist() == [0, 4, 3] and own_ids.tolist() == [0, 2, 1]
    ok = ok and ks.slot_ids(cell, top, cell) == 3 and cell.tolist() == [0, 2, 1]
    dest = np.empty(3, dtype=i64)  # slots 0, 1, 0 in blocks 1, 0 (starting at 1 and 0): slot 1's record first
    ks.block_dest(np.array([0, 1, 0], dtype=i64), np.array([1, 0], dtype=i64), np.array([0, 1], dtype=i64), dest)
    ok = ok and dest.tolist() == [1, 0, 2]
    for dt in SCATTER_DTYPES:  # one compiled version per dtype
        col = np.empty(3, dtype=dt)
        ks.scatter(dest, np.arange(3, dtype=dt), col)
        ok = ok and col.tolist() == [1, 0, 2]
    i32 = np.int32
    h = np.empty(1, dtype=i64)  # the dtypes of the fn schema (models.columns.SCHEMAS)
    ks.fn_hashes(np.array([1], dtype=i64), np.array([2], dtype=i64), np.array([1], dtype=i32), np.array([1], dtype=i32),
                 np.array([1], dtype=i32), np.array([1], dtype=i32), np.array([True]), np.arange(1, 8, dtype=i64), h)
    ok = ok and h.tolist() == [1 * 1 + 2 * 2 + 3 + 4 + 5 + 6 + 7]  # below 2**29: the shift adds nothing
    return bool(ok and axis_ok and sorted_ok and out[0] == 2 and out[1] == 1 and first[0] == 0 and lo[0] == 0
                and hi[0] == 4 and m == 3 and perm.tolist() == [1, 2, 0] and total.tolist() == [3.0, 6.0]
                and fn_steps.tolist() == [1, 2]
                and count.tolist() == [1, 2] and d_keys.tolist() == [1, 4 | 2, 4 | 0]
                and rep.tolist() == [1, 0] and step_sum.tolist() == [1, 1, 1] and excl_sum.tolist() == [1.0, 2.0])


_lazy: LazyKernels[Kernels] = LazyKernels("EROICA_SPAN_KERNELS", _compile, _smoke, _SOURCES)
