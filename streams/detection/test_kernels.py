"""The summariser's compiled kernels give what the numpy paths give, interpreted and compiled.

Each kernel source runs as plain Python (``use_kernels("python")``) and, when
numba is importable, compiled (``"numba"``); both are compared with the
numpy path (``"numpy"``, what runs without numba) on random inputs and on
the corners: no event, one, equal starts, nested spans, zero durations,
levels with gaps, rows out of step order; and whole windows through
``summarise_fn``, bit for bit.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import numpy as np
import pytest

from eroica.models.columns import KIND_CODE
from eroica.models.digest import encoder
from eroica.models.records import COLLECTIVE_OPS
from eroica.streams.detection import kernels  # the name fn_rows imports it by (numba's cache records it)

from . import fn_rows
from .intervals import exclusive_time
from .test_patterns import _bits, _reference_exclusive_time, _window

KINDS = ["python", *(["numba"] if importlib.util.find_spec("numba") else [])]


@pytest.fixture(params=KINDS)
def ks(request: pytest.FixtureRequest) -> Iterator[kernels.Kernels]:
    kernels.use_kernels(request.param)
    k = kernels.kernels()
    assert k is not None
    yield k
    kernels.use_kernels(None)


def _packed(s: np.ndarray, level: np.ndarray) -> tuple[np.ndarray, int, int]:
    """The sorted ``level | start | index`` keys :func:`fn_rows._exclusive_time_packed` gives the kernel."""
    n = s.size
    i_bits = max(n - 1, 0).bit_length()
    s_bits = int(s.max()).bit_length() if n else 0
    packed = (level.astype(np.int64) << (s_bits + i_bits)) | (s.astype(np.int64) << i_bits) | np.arange(n)
    return np.sort(packed), i_bits, s_bits


def _exclusive(ks: kernels.Kernels, slot: np.ndarray, start: np.ndarray, end: np.ndarray,
               level: np.ndarray) -> np.ndarray:
    span = int(end.max()) + 1 if end.size else 1
    s, e = slot * span + start, slot * span + end
    packed, i_bits, s_bits = _packed(s, level)
    out = np.full(s.size, -1, dtype=np.int64)
    ks.exclusive(packed, e.astype(np.int64), i_bits, s_bits, out)
    return out


def test_exclusive_time_corners(ks: kernels.Kernels) -> None:
    i64 = np.int64
    cases = [
        ([], [], [], []),                                   # nothing
        ([0], [5], [9], [2]),                               # one event
        ([0, 0, 0], [3, 3, 3], [7, 5, 9], [1, 0, 2]),       # equal starts
        ([0, 0, 0, 0], [0, 2, 3, 10], [20, 15, 4, 12], [3, 1, 0, 2]),  # nested spans
        ([0, 0, 0, 0], [4, 4, 6, 4], [4, 9, 6, 4], [0, 1, 0, 2]),      # zero durations
        ([0, 1, 0, 1], [0, 0, 5, 5], [10, 10, 6, 6], [0, 5, 9, 9]),    # two ranks, levels with gaps
        ([0, 0, 0], [0, 5, 10], [5, 10, 15], [0, 0, 1]),    # touching intervals
    ]
    for slot, start, end, level in cases:
        sl, st, en, lv = (np.array(x, dtype=i64) for x in (slot, start, end, level))
        got = _exclusive(ks, sl, st, en, lv.astype(np.int16))
        span = int(en.max()) + 1 if en.size else 1
        want = _reference_exclusive_time(sl, st, en, lv, span) if sl.size else np.zeros(0, dtype=i64)
        assert np.array_equal(got, want), (slot, start, end, level, got, want)


@pytest.mark.parametrize("case", range(4))
def test_exclusive_time_random(ks: kernels.Kernels, case: int) -> None:
    rng = np.random.default_rng(200 + case)
    for trial in range(60):
        n = int(rng.integers(1, [30, 200, 600, 60][case]))
        slot = rng.integers(0, int(rng.integers(1, 6)), n)
        start = rng.integers(0, [10, 1000, 10**6, 50][case], n)
        if case == 3:  # many equal starts, long spans nesting the rest
            start = rng.choice(np.array([0, 5, 5, 7]), n)
        end = start + rng.integers(0, [3, 50, 10**5, 100][case], n) * (rng.random(n) > 0.1)
        level = rng.integers(0, int(rng.integers(1, 8)), n).astype(np.int16)
        got = _exclusive(ks, slot, start, end, level)
        span = int(end.max()) + 1
        assert np.array_equal(got, exclusive_time(slot, start, end, level, span)), (case, trial)
        s, e = slot * span + start, slot * span + end
        if n >= 2:  # the caller: the same as without the kernels
            assert np.array_equal(fn_rows._exclusive_time_packed(s, e, level, ks),
                                  fn_rows._exclusive_time_packed(s, e, level))


def test_step_spans(ks: kernels.Kernels) -> None:
    rng = np.random.default_rng(7)
    for trial in range(100):
        n = int(rng.integers(0, 300))
        m = int(rng.integers(1, 40))
        ids = rng.integers(0, m, n)
        start = rng.integers(-10**6, 10**6, n)
        dur = rng.integers(0, [1, 10, 10**9][trial % 3], n)
        first = np.full(m, n, dtype=np.int64)
        lo = np.full(m, np.iinfo(np.int64).max)
        hi = np.full(m, np.iinfo(np.int64).min)
        ks.spans(ids, start, dur, first, lo, hi)
        w_first = np.full(m, n, dtype=np.intp)
        np.minimum.at(w_first, ids, np.arange(n))
        w_lo = np.full(m, np.iinfo(np.int64).max)
        w_hi = np.full(m, np.iinfo(np.int64).min)
        np.minimum.at(w_lo, ids, start)
        np.maximum.at(w_hi, ids, start + dur)
        assert np.array_equal(first, w_first) and np.array_equal(lo, w_lo) and np.array_equal(hi, w_hi)


def test_row_grouping(ks: kernels.Kernels) -> None:
    rng = np.random.default_rng(8)
    for trial in range(100):
        n = int(rng.integers(1, 400))
        n_cells = int(rng.integers(1, 30))
        cell = np.concatenate((np.arange(n_cells), rng.integers(0, n_cells, n)))  # every row has a record
        cell = cell[rng.permutation(cell.size)] if trial % 2 else np.sort(cell)
        steps = rng.integers(0, [1, 3, 50][trial % 3], cell.size) + 10**6
        if trial % 5 == 0:  # one long row (a merge sort of its steps)
            cell[: cell.size // 2] = 0
        perm = np.empty(cell.size, dtype=np.int64)
        bounds = np.empty(n_cells + 1, dtype=np.int64)
        step_start = np.empty(cell.size, dtype=np.int64)
        m = ks.rows(cell, n_cells, steps, perm, bounds, step_start)
        key = cell * (int(steps.max()) + 1) + steps
        want = np.argsort(key, kind="stable")
        assert np.array_equal(perm, want)
        assert np.array_equal(bounds, np.concatenate(([0], np.cumsum(np.bincount(cell, minlength=n_cells)))))
        k = key[want]
        assert np.array_equal(step_start[:m], np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1]))))
        # the same from one sort of packed (row, step, index) keys
        s_lo, n = int(steps.min()), cell.size
        s_bits, i_bits = (int(steps.max()) - s_lo).bit_length(), (n - 1).bit_length()
        keys = np.empty(n, dtype=np.int64)
        ks.row_keys(cell, steps, s_lo, s_bits, i_bits, keys)
        keys.sort()
        perm2, bounds2, start2 = np.empty(n, dtype=np.int64), np.empty(n_cells + 1, dtype=np.int64), np.empty(n, dtype=np.int64)
        assert ks.sorted_rows(keys, i_bits, s_bits, perm2, bounds2, start2) == m
        assert np.array_equal(perm2, perm) and np.array_equal(bounds2, bounds) and np.array_equal(start2[:m], step_start[:m])


@pytest.mark.parametrize("case", range(6))
def test_summarise_fn_with_and_without_kernels(ks: kernels.Kernels, case: int,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(300 + case)
    for trial in range(4 if ks.rows is kernels._rows_source else 10):  # interpreted: slow
        n = int(rng.integers(1, 1500))
        fn = _window(rng, n, ranks=int(rng.integers(1, 30)), sorted_ranks=bool(trial % 2), huge=case == 4,
                     in_flight=case == 5)
        end = [None, int(fn.arrays["ts_ns"].max()) - 10**6, int(fn.arrays["ts_ns"].max()) + 10**7][trial % 3]
        cont = None
        if case == 3:  # continuations: some records of another window reaching into this one
            cont = fn.take(np.flatnonzero(rng.random(n) < 0.2))
        monkeypatch.setattr(fn_rows, "_BLOCK_RECORDS", [1 << 16, 64, 500][trial % 3])
        got = _bits(fn_rows.summarise_fn(fn, end, cont))
        saved = kernels._lazy.value
        kernels.use_kernels("numpy")
        try:
            want = _bits(fn_rows.summarise_fn(fn, end, cont))
        finally:
            kernels._lazy.value, kernels._lazy.failed = saved, False
        assert got == want, (case, trial)


def test_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EROICA_SPAN_KERNELS", "0")
    kernels.use_kernels(None)
    try:
        assert kernels.kernels() is None and kernels.worth_it(10**9) is None and not kernels.warm()
    finally:
        kernels.use_kernels(None)


def test_loaded_only_once_worth_it(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels.use_kernels(None)
    monkeypatch.setattr(kernels, "FAST_AFTER_RECORDS", 100)
    try:
        assert kernels.worth_it(60) is None            # not yet: a small job never loads them
        assert kernels.worth_it(60) is kernels.kernels()  # past the threshold: loaded (None without numba)
    finally:
        kernels.use_kernels(None)


def _reference_row_stats(cell: np.ndarray, n_cells: int, steps: np.ndarray, dur: np.ndarray, excl: np.ndarray,
                         own_dur: np.ndarray, own: np.ndarray | None) -> tuple[list[float], ...]:
    """:func:`fn_rows._row_stats`'s figures row by row, in plain Python (nearest-rank lower quantiles)."""
    def quant(v: list[int], q: float) -> float:
        v = sorted(v)
        return float(v[int(np.floor(q * (len(v) - 1) + 0.5))])

    out: tuple[list[float], ...] = tuple([] for _ in range(11))
    for c in range(n_cells):
        idx = np.flatnonzero(cell == c)
        mine = [int(dur[i]) for i in idx if own is None or own[i]]
        costs: dict[int, int] = {}
        for i in idx:
            keep = own_dur[i] and (own is None or own[i])
            costs[int(steps[i])] = costs.get(int(steps[i]), 0) + (int(dur[i]) if keep else 0 if own_dur[i]
                                                                  else int(excl[i]))
        per = list(costs.values())
        for k, v in enumerate((len(mine), float(sum(mine)), float(sum(int(excl[i]) for i in idx)),
                               *(quant(mine, q) if mine else 0.0 for q in (0.5, 0.9, 0.99)),
                               quant(per, 0.5), quant(per, fn_rows.LOW_Q), quant(per, fn_rows.HIGH_Q), len(per),
                               int(idx.min()))):
            out[k].append(v)
    return out


def _random_rows(rng: np.random.Generator, trial: int) -> tuple[np.ndarray, int]:
    """Rows of up to 300 records, each with one at least, in record order or sorted; every fifth trial one long
    row (sorted by its own sort, not by insertion)."""
    n_cells = int(rng.integers(1, 25))
    cell = rng.integers(0, n_cells, int(rng.integers(0, 300)))
    if trial % 5 == 0:
        cell[: cell.size * 3 // 4] = 0
    cell = np.concatenate((np.arange(n_cells), cell))
    return (cell[rng.permutation(cell.size)] if trial % 2 else np.sort(cell)), n_cells


def test_row_stats(ks: kernels.Kernels) -> None:
    rng = np.random.default_rng(9)
    for trial in range(80):
        cell, n_cells = _random_rows(rng, trial)
        m = cell.size
        steps = rng.integers(0, [1, 3, 90][trial % 3], m) + 10**6
        dur = rng.integers(-5, [1, 10, 10**9][trial % 3], m)  # ties, zeros, a negative duration
        excl = rng.integers(0, 10**6, m)
        own_dur = rng.random(m) < 0.3
        own = None if trial % 4 else rng.random(m) < 0.7   # continuations: rows of them only too
        got = fn_rows._row_stats(ks, cell, n_cells, steps, dur, excl, np.where(own_dur, 3, 0).astype(np.int8), own)
        assert got is not None
        count, total, excl_sum, q, per_step, low, high, fn_steps, first = got
        want = _reference_row_stats(cell, n_cells, steps, dur, excl, fn_rows._own_duration(
            np.where(own_dur, 3, 0).astype(np.int8)), own)
        got_lists = (count, total, excl_sum, q[0], q[1], q[2], per_step, low, high, fn_steps, first)
        for k, (g, w) in enumerate(zip(got_lists, want)):
            assert g.tolist() == w, (trial, k)
    # sums that could reach 2**53: not the kernel's (float sums in record order decide)
    one = np.zeros(2, dtype=np.int64)
    assert fn_rows._row_stats(ks, one, 1, one, np.array([2**52, 2**52]), one, one.astype(np.int8), None) is None


@pytest.mark.parametrize("case", range(4))
def test_collectives_with_and_without_kernels(ks: kernels.Kernels, case: int) -> None:
    from .collectives import _grouped, summarise_collectives
    from .patterns import K_COLL

    rng = np.random.default_rng(400 + case)
    for trial in range(30):
        n = int(rng.integers(1, 800))
        fn = _window(rng, n, ranks=int(rng.integers(1, 30)), sorted_ranks=bool(trial % 2), in_flight=case == 1)
        a = fn.arrays
        a["kind"][rng.random(n) < 0.6] = K_COLL
        a["group"] = rng.integers(0, 6, n).astype(np.int32)
        fn.vocab["group"] = ["", "g1", "g2", "tp", "pp", "dp"]
        a["op"] = rng.integers(-1, len(COLLECTIVE_OPS), n).astype(np.int8)
        a["bytes"] = np.where(rng.random(n) < 0.3, -1, rng.integers(0, 2**32, n))
        if case == 2:  # wide step numbers: beyond the counting sorts (the numpy path)
            a["step"] = a["step"] * 10**9
        if case == 3:
            a["dur_ns"][0] = 2**60   # a sum past 2**53: the numpy path
        sel = np.flatnonzero((a["kind"] == K_COLL) & ~a["in_flight"])
        used = _grouped(a["rank"][sel], a["group"][sel], a["step"][sel], a["bytes"][sel], a["dur_ns"][sel],
                        a["op"][sel]) is not None
        assert used == (sel.size >= 2) or case >= 2   # the kernel's, but for the cases meant for the numpy path
        got = encoder().encode(summarise_collectives(fn))
        saved = kernels._lazy.value
        kernels.use_kernels("numpy")
        try:
            want = encoder().encode(summarise_collectives(fn))
        finally:
            kernels._lazy.value, kernels._lazy.failed = saved, False
        assert got == want, (case, trial)


def test_slot_ids(ks: kernels.Kernels) -> None:
    rng = np.random.default_rng(10)
    for trial in range(50):
        space = int(rng.integers(1, 3000))
        slot = rng.integers(0, space, int(rng.integers(0, 500)))
        if trial % 7 == 0:
            slot[:] = space - 1   # one slot, the last
        ids = np.empty(slot.size, dtype=np.int64)
        g = ks.slot_ids(slot, space, ids)
        uniq, inverse = np.unique(slot, return_inverse=True)
        assert g == uniq.size and np.array_equal(ids, inverse.ravel())


def test_block_positions(ks: kernels.Kernels) -> None:
    """The compiled counting sort by block puts records where the inverse of a stable sort by block does."""
    rng = np.random.default_rng(11)
    for trial in range(60):
        n = int(rng.integers(1, 400))
        rank = rng.integers(0, int(rng.integers(1, 40)), n).astype(np.int32) * [1, 7, 10**6][trial % 3]
        target = int(rng.integers(1, 80))
        got = fn_rows._block_positions(rank, target, ks)
        want = fn_rows._block_positions(rank, target, None)  # numpy's: argsort by block, inverted
        assert (got is None) == (want is None)
        if got is None:
            continue
        assert np.array_equal(got[0], want[0]) and got[1] == want[1]
        # blocks of whole ranks, in rank order, each block's records in record order
        order = np.argsort(got[0])
        for lo, hi in zip(got[1][:-1], got[1][1:]):
            rows = order[lo:hi]
            assert np.all(np.diff(rows) > 0)
            assert not set(rank[rows].tolist()) & set(np.delete(rank, rows).tolist())
        firsts = [int(rank[order[lo]]) for lo in got[1][:-1]]
        assert firsts == sorted(firsts)


def test_scatter(ks: kernels.Kernels) -> None:
    rng = np.random.default_rng(12)
    for dt in kernels.SCATTER_DTYPES:
        dest = rng.permutation(50)
        src = rng.integers(-100, 100, 50).astype(dt)
        out = np.empty(50, dtype=dt)
        ks.scatter(dest, src, out)
        want = np.empty(50, dtype=dt)
        want[dest] = src
        assert np.array_equal(out, want)


def test_axis_keys_and_exclusive_time(ks: kernels.Kernels) -> None:
    """The compiled levels, axis and keys give the exclusive times of the numpy ones, whatever the width of the
    starts and levels (bounds on the largest, not the largest)."""
    from .intervals import on_axis
    from .patterns import _LEVEL_OF_KIND_16, HOST_LEVEL

    rng = np.random.default_rng(13)
    for trial in range(80):
        n = int(rng.integers(2, 300))
        n_slots = int(rng.integers(1, 6))
        slot = np.sort(rng.integers(0, n_slots, n)) if trial % 2 else rng.integers(0, n_slots, n)
        start = rng.integers(0, [10, 1000, 10**6][trial % 3], n)
        end = start + rng.integers(0, [3, 500, 10**5][trial % 3], n) * (rng.random(n) > 0.1)
        kinds = rng.integers(0, len(KIND_CODE), n).astype(np.int8)
        stack = rng.integers(0, 6, n).astype(np.int32)
        host_level = None if trial % 4 == 0 else (HOST_LEVEL + rng.integers(0, 5, 6)).astype(np.int16)
        level = _LEVEL_OF_KIND_16[kinds]
        if host_level is not None:
            level = np.where(level == HOST_LEVEL, host_level[stack], level)
        span = int(end.max()) + 1
        got = fn_rows._exclusive_time_compiled(ks, slot, int(slot.max()) + 1, start, end, kinds, stack, host_level,
                                               span)
        axis = on_axis(slot, start, end, span)
        assert axis is not None and got is not None
        assert np.array_equal(got, fn_rows._exclusive_time_packed(axis[0], axis[1], level)), trial
    # other dtypes than compiled for, negative starts, a negative level: the numpy way
    one = np.zeros(3, dtype=np.int64)
    k8, s32 = one.astype(np.int8), one.astype(np.int32)
    assert fn_rows._exclusive_time_compiled(ks, one, 1, one, one + 1, one, s32, None, 2) is None
    assert fn_rows._exclusive_time_compiled(ks, one, 1, one - 1, one, k8, s32, None, 2) is None
    host = np.full(1, -1, dtype=np.int16)
    assert fn_rows._exclusive_time_compiled(ks, one, 1, one, one + 1, k8 + KIND_CODE["python"], s32, host, 2) is None


def test_row_stats_where_keys_do_not_pack(ks: kernels.Kernels, monkeypatch: pytest.MonkeyPatch) -> None:
    """Durations and step costs whose (row, value) keys do not pack take the numpy path's sorts: the same rows."""
    rng = np.random.default_rng(14)
    for trial in range(20):
        cell, n_cells = _random_rows(rng, trial)
        m = cell.size
        steps = rng.integers(0, 20, m)
        dur, excl = rng.integers(0, 10**6, m), rng.integers(0, 10**6, m)
        kinds = np.where(rng.random(m) < 0.3, 3, 0).astype(np.int8)
        own = None if trial % 2 else rng.random(m) < 0.7
        want = fn_rows._row_stats(ks, cell, n_cells, steps, dur, excl, kinds, own)
        monkeypatch.setattr(fn_rows, "_KEY_BITS", 1)
        got = fn_rows._row_stats(ks, cell, n_cells, steps, dur, excl, kinds, own)
        monkeypatch.undo()
        assert want is not None and got is not None
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want)), trial


def test_fn_hashes(ks: kernels.Kernels) -> None:
    """The compiled hash of fn records is numpy's, bit for bit (either may decide which rows are compared)."""
    from .repeats import IDENTITY, _MULTIPLIERS
    from .test_patterns import _window

    fn = _window(np.random.default_rng(15), 500, ranks=9, sorted_ranks=False, in_flight=True)
    fn.arrays["ts_ns"][:5] = [0, -1, 2**62, -(2**62), 2**63 - 1]  # wrapping arithmetic
    a = fn.arrays
    out = np.empty(len(fn), dtype=np.int64)
    with np.errstate(over="ignore"):  # interpreted, numpy's scalars warn where they wrap
        ks.fn_hashes(*(a[k] for k in IDENTITY["fn"]), np.array(_MULTIPLIERS, dtype=np.int64), out)
        h = np.zeros(len(fn), dtype=np.int64)
        for k, mult in zip(IDENTITY["fn"], _MULTIPLIERS):
            h += a[k].astype(np.int64) * np.int64(mult)
    assert np.array_equal(out, h ^ (h >> 29))


def test_step_table(ks: kernels.Kernels) -> None:
    """The compiled step table gives the numpy table's row steps, rows and own (rank, step) ids."""
    rng = np.random.default_rng(16)
    for trial in range(60):
        n = int(rng.integers(1, 300))
        n_r = int(rng.integers(1, 8))
        slot = rng.integers(0, n_r, n)
        slot[:n_r] = np.arange(min(n_r, n))
        n_r = int(slot.max()) + 1
        steps = rng.integers(0, int(rng.integers(1, 12)), n) + 10**6
        fid = rng.integers(0, int(rng.integers(1, 9)), n)
        own = None if trial % 3 == 0 else rng.random(n) < 0.8
        got = fn_rows._StepTable.of(slot, n_r, steps, own, ks)
        want = fn_rows._StepTable.of(slot, n_r, steps, own)
        assert got is not None and want is not None and got.ks is not None
        for g, w in zip(got.part_and_cells(fid), want.part_and_cells(fid)):
            assert np.array_equal(g, w), trial
        for every in (False, True):
            g_ids, g_n = got.own_steps(own, every)
            w_ids, w_n = want.own_steps(own, every)
            assert g_n == w_n and np.array_equal(g_ids, w_ids), (trial, every)


def test_counter_increases(ks: kernels.Kernels) -> None:
    """The compiled increases of several counters (gaps, resets, ties of time across entities, zeros of both
    signs) are :func:`.counters._increase`'s, bit for bit."""
    from .counters import _increase, _increases, _time_order

    rng = np.random.default_rng(17)
    for trial in range(100):
        n, m = int(rng.integers(1, 12)), int(rng.integers(1, 9))
        ids = rng.integers(0, n, n * m) if trial % 2 else np.repeat(np.arange(n), m)[rng.permutation(n * m)]
        ts = rng.permutation(n * m).astype(np.int64) * 10
        a = {k: rng.choice(np.array([0.0, -0.0, 1.0, 5.0, 7.5, 1e17, np.inf]), n * m) for k in "abc"}
        a["b"][rng.random(n * m) < 0.4] = np.nan
        a["c"][:] = np.nan
        order = _time_order(ids, ts)
        assert kernels.loaded() is ks
        with np.errstate(invalid="ignore"):  # inf - inf, both ways
            got = _increases(ids, n, a, ("a", "b", "c"), ts, order)
            want = {k: _increase(ids, n, a[k], ts, order) for k in "abc"}
        for k in "abc":
            assert got[k].tobytes() == want[k].tobytes(), (trial, k)
