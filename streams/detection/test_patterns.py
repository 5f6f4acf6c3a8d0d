"""The summariser's fast paths give what the paths they replaced gave, bit for bit.

``summarise_fn`` (blocks of ranks, one shared (rank, time) order, grouped
sorts), ``exclusive_time`` (levels taken from one order, unions without
sorts) and the counters' row medians are each compared with the code they
replaced, kept here as the reference, on random windows built to reach the
corners: ranks out of order, functions run several times a step, host spans
with stacks of several depths, zero and huge durations, spans clipped at the
window's end or starting past it, in-flight records.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from eroica.models.columns import KIND_CODE, Columns
from eroica.models.digest import INTERIOR, FnRows, InFlightRows, RankRows, encoder

from . import fn_rows
from .counters import (_by_entity_then_value, _equal_groups, _increase, _increases, _lexsort_pair, _medians,
                       _sums_by_value, _time_order)
from .grouping import (dense_ids, dense_ids_by_sort, group_count, group_max, group_min, group_quantiles, group_sorted, group_sum,
                       sorted_quantiles)
from .intervals import _AXIS_LIMIT, covered, exclusive_time, merge, merge_sorted
from .patterns import HIGH_Q, HOST_LEVEL, LOW_Q, _in_flight_rows, _LEVEL_OF_KIND, _OWN_DURATION_KINDS, stack_depths

# -- the replaced code (as it was), the reference ---------------------------------------------------------------


def _reference_merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as disjoint, sorted intervals."""
    if starts.size == 0:
        return starts.astype(np.int64), ends.astype(np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new) - 1
    ms = s[new]
    me = np.zeros(ms.size, dtype=np.int64)
    np.maximum.at(me, group, e)
    return ms, me


def _reference_covered(hs: npt.NDArray[np.int64], he: npt.NDArray[np.int64],
            a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Length of ``[a, b)`` covered by the disjoint sorted intervals ``(hs, he)``."""
    if hs.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    lengths = he - hs
    cum = np.concatenate(([0], np.cumsum(lengths)))

    def upto(t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        j = np.searchsorted(hs, t, side="right") - 1
        jj = np.clip(j, 0, None)
        part = np.clip(t - hs[jj], 0, lengths[jj])
        return np.where(j >= 0, cum[jj] + part, 0)

    return upto(b) - upto(a)




def _reference_exclusive_time(
    slot: np.ndarray, start: np.ndarray, end: np.ndarray, level: np.ndarray, span: int
) -> np.ndarray:
    """Per event, its time not covered by higher-priority (lower ``level``) events on its slot.

    ``start``/``end`` are relative to a common origin and lie in ``[0, span)``.
    Slots are laid end to end on one int64 axis; when ``slots * span`` would not
    fit (many ranks, long durations: 15,000 ranks and week-long spans), they are
    taken in groups that fit, with the same result (slots never interact).
    """
    n_slots = int(slot.max()) + 1 if slot.size else 0
    per = max(1, _AXIS_LIMIT // max(int(span), 1))
    if n_slots <= per:
        return _reference_exclusive_time_1(slot, start, end, level, span)
    out = np.zeros(slot.size, dtype=np.int64)
    for lo in range(0, n_slots, per):
        sel = np.flatnonzero((slot >= lo) & (slot < lo + per))
        if sel.size:
            out[sel] = _reference_exclusive_time_1(slot[sel] - lo, start[sel], end[sel], level[sel], span)
    return out


def _reference_exclusive_time_1(
    slot: np.ndarray, start: np.ndarray, end: np.ndarray, level: np.ndarray, span: int
) -> np.ndarray:
    off = slot.astype(np.int64) * np.int64(span)
    s = start.astype(np.int64) + off
    e = end.astype(np.int64) + off
    out = np.zeros(s.size, dtype=np.int64)
    hs = np.empty(0, dtype=np.int64)
    he = np.empty(0, dtype=np.int64)
    # Each level's events in start order (one sort for all levels): every merge below then
    # joins two sorted runs, which its stable sort does in linear time. The union is the same.
    order = np.argsort(s, kind="stable")
    level_in_order = level[order]
    for lvl in np.unique(level):
        idx = order[level_in_order == lvl]
        out[idx] = (e[idx] - s[idx]) - _reference_covered(hs, he, s[idx], e[idx])
        hs, he = _reference_merge(np.concatenate((hs, s[idx])), np.concatenate((he, e[idx])))
    return out


def _reference_summarise_fn(fn: Columns, window_end_ns: int | None = None) -> tuple[FnRows, RankRows, InFlightRows]:
    """``summarise_fn`` as it was before its fast paths (one window at once, sorts for every grouping)."""
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
    excl = _reference_exclusive_time(slot, start, np.maximum(end, start), level, int(end.max()) + 1)

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
    per_step, low, high = group_quantiles(cell[step_first], group_sum(step_ids, cost, n_cs), n_cells,
                                          (0.5, LOW_Q, HIGH_Q))
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
        step=part[rows].tolist(), steps=fn_steps.tolist(), low_ns=low.tolist(), high_ns=high.tolist(),
    )
    node_vocab = np.asarray(fn.vocab["node"], dtype=object)
    rank_rows = RankRows(rank=a["rank"][rp_rows].tolist(), node=node_vocab[a["node"][rp_rows]].tolist(),
                         steps=rank_steps.tolist(), step_time_ns=step_time.tolist(), step=part[rp_rows].tolist(),
                         start_ns=(rp_lo.astype(np.int64) + base).tolist(),
                         end_ns=(rp_hi.astype(np.int64) + base).tolist())
    return fns, rank_rows, inflight


# -- random windows -------------------------------------------------------------------------------------------------

_STACKS = ["", "train_step", "train_step;model.forward", "train_step;model.forward;layer", "a;b;c;d;e"]
_FNS = ["train_step", "model.forward", "flash_fwd", "nccl_allreduce", "DataLoader.__next__", "gc.collect", "Memcpy"]


def _window(rng: np.random.Generator, n: int, ranks: int, sorted_ranks: bool, huge: bool = False,
            in_flight: bool = False) -> Columns:
    rank = rng.integers(0, ranks, n).astype(np.int32) * 3 + 7      # sparse rank ids
    step = rng.integers(100, 100 + int(rng.integers(1, 9)), n).astype(np.int64)
    ts = 10**12 + step * 10**6 + rng.integers(0, 2 * 10**6, n)    # steps overlap a little
    if sorted_ranks:
        o = np.lexsort((ts, rank))
        rank, step, ts = rank[o], step[o], ts[o]
    dur = rng.integers(0, 3 * 10**5, n)
    dur[rng.random(n) < 0.05] = 0
    if huge:
        dur[rng.random(n) < 0.01] = 2**60   # sums past 2**53: float sums in record order
    kinds = rng.choice(np.array(list(KIND_CODE.values()), dtype=np.int8), n)
    arrays = {
        "job": np.zeros(n, dtype=np.int32), "node": (rank // 8).astype(np.int32), "rank": rank, "step": step,
        "fn": rng.integers(0, len(_FNS), n).astype(np.int32), "kind": kinds, "ts_ns": ts.astype(np.int64),
        "dur_ns": dur.astype(np.int64), "bytes": np.full(n, -1, dtype=np.int64), "op": np.full(n, -1, dtype=np.int8),
        "group": np.zeros(n, dtype=np.int32), "stream": np.zeros(n, dtype=np.int32),
        "in_flight": (rng.random(n) < 0.02) if in_flight else np.zeros(n, dtype=bool),
        "stack": rng.integers(0, len(_STACKS), n).astype(np.int32),
    }
    vocab = {"job": ["j"], "node": [f"node-{i}" for i in range(int(arrays["node"].max()) + 1)], "fn": list(_FNS),
             "group": [""], "stack": list(_STACKS)}
    return Columns("fn", arrays, vocab)


def _bits(rows: tuple[FnRows, RankRows, InFlightRows]) -> bytes:
    return encoder().encode(rows)


@pytest.mark.parametrize("case", range(8))
def test_summarise_fn_is_the_replaced_code_bit_for_bit(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(100 + case)
    for trial in range(12):
        n = int(rng.integers(1, 3000))
        fn = _window(rng, n, ranks=int(rng.integers(1, 40)), sorted_ranks=bool(trial % 2), huge=case == 5,
                     in_flight=case == 6)
        end = [None, int(fn.arrays["ts_ns"].max()) - 10**6, int(fn.arrays["ts_ns"].max()) + 10**7][trial % 3]
        if case == 7:  # the window ends before some records start: spans reach past their rank's share of the axis
            end = int(fn.arrays["ts_ns"].min()) + 5 * 10**5
        monkeypatch.setattr(fn_rows, "_BLOCK_RECORDS", [1 << 16, 64, 500][trial % 3])   # one block, many, a few
        assert _bits(fn_rows.summarise_fn(fn, end)) == _bits(_reference_summarise_fn(fn, end)), (case, trial)


@pytest.mark.parametrize("case", range(4))
def test_exclusive_time_is_the_replaced_code(case: int) -> None:
    rng = np.random.default_rng(200 + case)
    for _ in range(200):
        n = int(rng.integers(0, 400))
        slot = rng.integers(0, int(rng.integers(1, 6)), n)
        start = rng.integers(0, 1000, n)
        end = start + rng.integers(0, [5, 50, 400, 1000][case], n)   # from sparse to heavily nested
        level = rng.integers(0, int(rng.integers(1, 8)), n)
        span = int(end.max()) + 1 if n else 1
        got, want = exclusive_time(slot, start, end, level, span), _reference_exclusive_time(slot, start, end, level, span)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert np.array_equal(exclusive_time(slot, start, end, level, _AXIS_LIMIT // 2),
                              _reference_exclusive_time(slot, start, end, level, _AXIS_LIMIT // 2))  # slots in groups


def test_unions_and_coverage_are_the_replaced_code() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(0, 60))
        s = rng.integers(0, 300, n)
        e = s + rng.integers(0, 40, n)
        hs, he = merge(s, e)
        rs, re_ = _reference_merge(s, e)
        assert hs.tolist() == rs.tolist() and he.tolist() == re_.tolist()
        o = np.argsort(s, kind="stable")
        assert [x.tolist() for x in merge_sorted(s[o], e[o])] == [hs.tolist(), he.tolist()]
        a = rng.integers(0, 350, 30)
        b = a + rng.integers(0, 80, 30)
        assert np.array_equal(covered(hs, he, a, b), _reference_covered(hs, he, a, b))


def test_grouped_sort_is_the_sort() -> None:
    rng = np.random.default_rng(8)
    for _ in range(200):
        n, g = int(rng.integers(1, 500)), int(rng.integers(1, 40))
        ids = rng.integers(0, g, n)
        values = rng.integers(0, 10**6, n) if rng.random() < 0.5 else rng.integers(0, 50, n).astype(float)
        order = np.argsort(ids, kind="stable")
        for grouped in (order, None):
            sv, counts, starts = group_sorted(ids, values, g, grouped)
            got = sorted_quantiles(sv, counts, starts, (0.5, 0.9, 0.05))
            assert got.tobytes() == group_quantiles(ids, values, g, (0.5, 0.9, 0.05)).tobytes()
        sv, counts, starts = group_sorted(ids[order], values[order], g, grouped=True)
        assert sorted_quantiles(sv, counts, starts, (0.5,)).tobytes() == group_quantiles(ids, values, g, (0.5,)).tobytes()


def test_counter_medians_of_equal_groups_are_the_grouped_quantiles() -> None:
    rng = np.random.default_rng(9)
    for trial in range(300):
        n, m = int(rng.integers(1, 30)), int(rng.integers(1, 12))
        ids = np.repeat(np.arange(n), m)[rng.permutation(n * m)] if trial % 3 else rng.integers(0, n, n * m)
        pool = np.array([0.0, -0.0, 1.5, 2.0, 100.0, np.nan if trial % 4 == 0 else 3.0])
        v = rng.choice(pool, n * m) if trial % 2 else rng.random(n * m) * 100
        cols = Columns("gpu", {"v": v}, {})
        got = _medians(ids, n, cols, ("v",))["v"]
        ok = ~np.isnan(v)
        want = group_quantiles(ids[ok], v[ok], n, (0.5,))[0] if ok.any() else np.full(n, np.nan)
        assert got.tobytes() == want.tobytes()


def test_counter_orders_and_increases_are_the_replaced_code() -> None:
    rng = np.random.default_rng(10)
    for trial in range(300):
        n, m = int(rng.integers(1, 20)), int(rng.integers(1, 10))
        ids = np.repeat(np.arange(n), m)[rng.permutation(n * m)]
        rows = _equal_groups(ids, n) if trial % 2 else None
        v = rng.choice(np.array([0.0, -0.0, 1.0, 5.0, 7.5]), n * m)
        assert np.array_equal(_by_entity_then_value(ids, v, rows), np.lexsort((v, ids)))
        ts = rng.permutation(n * m).astype(np.int64)
        a = {k: rng.integers(0, 50, n * m).astype(float) for k in "abc"}
        a["c"][rng.random(n * m) < 0.3] = np.nan                      # a counter with gaps takes its own way
        order = _time_order(ids, ts)
        got = _increases(ids, n, a, ("a", "b", "c"), ts, order)
        for k in "abc":
            assert got[k].tobytes() == _increase(ids, n, a[k], ts, order).tobytes()


def test_packed_exclusive_time_is_the_replaced_code() -> None:
    rng = np.random.default_rng(11)
    for trial in range(300):
        n = int(rng.integers(2, 400))
        slot = rng.integers(0, int(rng.integers(1, 6)), n)
        start = rng.integers(0, 1000, n)
        end = start + rng.integers(0, [5, 50, 400, 1000][trial % 4], n)
        level = rng.integers(0, int(rng.integers(1, 8)), n).astype(np.int16)
        span = int(end.max()) + 1
        s = slot * span + start
        e = slot * span + end
        got = fn_rows._exclusive_time_packed(s, e, level)
        assert got is not None
        assert np.array_equal(got, _reference_exclusive_time(slot, start, end, level, span))


def test_sorted_dense_ids_and_orders_are_the_replaced_code() -> None:
    rng = np.random.default_rng(12)
    for trial in range(300):
        n = int(rng.integers(1, 500))
        keys = [rng.integers(-1 if trial % 2 else 0, int(rng.integers(1, 10**4)), n) for _ in range(int(rng.integers(1, 4)))]
        got, want = dense_ids_by_sort(*keys), dense_ids(*keys)
        assert got[1] == want[1] and np.array_equal(got[0], want[0]) and np.array_equal(got[2], want[2])
        ts = rng.integers(0, 10**9 if trial % 3 else 20, n)
        assert np.array_equal(_lexsort_pair(ts, keys[0]), np.lexsort((ts, keys[0])))


def test_sums_by_value_are_the_replaced_code() -> None:
    rng = np.random.default_rng(13)
    for trial in range(300):
        n, m = int(rng.integers(1, 20)), int(rng.integers(1, 10))
        ids = np.repeat(np.arange(n), m)[rng.permutation(n * m)]
        rows = _equal_groups(ids, n) if trial % 2 else None
        v = rng.choice(np.array([0.0, -0.0, 1e-3, 1.0, 5.0, 7.5, 1e17]), n * m)
        o = np.lexsort((v, ids))
        want = [np.bincount(ids[o], weights=v[o], minlength=n), np.bincount(ids[o], weights=v[o] ** 2, minlength=n)]
        got = _sums_by_value(ids, n, v, rows, 1, 2)
        assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want))
        ts = rng.permutation(n * m).astype(np.int64) if trial % 3 else np.arange(n * m, dtype=np.int64)  # in time order
        assert np.array_equal(_time_order(ids, ts, rows) if rows is not None else _time_order(ids, ts),
                              np.lexsort((ts, ids)))
