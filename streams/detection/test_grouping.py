"""The sort-free fast paths give exactly what the sorting paths give (ids, representatives, bits)."""

from __future__ import annotations

import numpy as np
import pytest

from . import grouping as G
from .counters import _increase, _time_order
from .links import _fleet_median, _fleet_quantile, _LeaveOneOut, _sorted_quantile


def _keys(rng: np.random.Generator, case: int, n: int) -> np.ndarray:
    if case == 0:
        return rng.integers(-1, 5, n).astype(np.int32)
    if case == 1:
        return rng.integers(0, 300, n)
    if case == 2:
        return rng.integers(-5, 40, n).astype(np.int8)
    if case == 3:
        return rng.integers(10**6, 10**6 + 20, n)  # step numbers far from 0
    return rng.random(n) < 0.5


@pytest.mark.parametrize("case", range(5))
def test_dense_ids_by_table_is_the_sorted_answer(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(case)
    for _ in range(100):
        n = int(rng.integers(1, 2000))
        keys = [_keys(rng, case, n) for _ in range(int(rng.integers(1, 4)))]
        fast = G.dense_ids(*keys)
        with monkeypatch.context() as m:
            m.setattr(G, "_dense_ids_by_table", lambda _k: None)
            slow = G.dense_ids(*keys)
        assert fast[1] == slow[1]
        for a, b in ((fast[0], slow[0]), (fast[2], slow[2])):
            assert a.dtype == b.dtype and np.array_equal(a, b)


@pytest.mark.parametrize("case", range(6))
def test_group_quantiles_by_packed_sort_is_bit_identical(case: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(10 + case)
    for _ in range(100):
        n, g = int(rng.integers(1, 2000)), int(rng.integers(1, 200))
        ids = rng.integers(0, g, n)
        values: np.ndarray = [
            rng.integers(0, 10**10, n),                           # durations (ints)
            rng.integers(0, 10**10, n).astype(float),             # sums of durations (whole floats)
            np.where(rng.random(n) < 0.1, -0.0, rng.integers(0, 50, n).astype(float)),  # signed zeros
            rng.random(n) * 100,                                  # fractions: the sorting path
            rng.integers(-5, 50, n),                              # negatives: the sorting path
            np.where(rng.random(n) < 0.1, np.nan, rng.integers(0, 50, n).astype(float)),  # NaN
        ][case]
        qs = (0.5, 0.9, 0.99, 0.05)
        fast = G.group_quantiles(ids, values, g, qs)
        with monkeypatch.context() as m:
            m.setattr(G, "_sorted_by_group", lambda *_a: None)
            slow = G.group_quantiles(ids, values, g, qs)
        assert fast.tobytes() == slow.tobytes()


def test_leave_one_out_medians_are_np_quantile_bits() -> None:
    rng = np.random.default_rng(3)
    pool = [0.0, -0.0, 100.0, 200.0, 400.0, np.nan, np.inf]
    for trial in range(3000):
        n = int(rng.integers(0, 12))
        v = [rng.normal(size=n) * 10.0 ** int(rng.integers(-5, 12)), rng.choice(pool, size=n),
             np.round(rng.random(n) * 1e10, 1)][trial % 3]
        vals = [float(x) for x in v]
        fin = v[np.isfinite(v)]
        for q in (0.5, 0.25) if not (fin == 0).any() else ():  # zeros: _LeaveOneOut takes numpy's own way
            assert np.float64(_sorted_quantile(sorted(fin.tolist()), q)).tobytes() == \
                np.float64(_fleet_quantile(np.asarray(v, dtype=np.float64), q)).tobytes()
        loo = _LeaveOneOut(vals)
        for i in range(n):
            rest = vals[:i] + vals[i + 1:]
            got = loo.median_without(i, lambda rest=rest: rest)  # type: ignore[misc]
            assert np.float64(got).tobytes() == np.float64(_fleet_median(np.array(rest))).tobytes()


def test_shared_time_order_gives_the_same_increases() -> None:
    rng = np.random.default_rng(5)
    used = 0
    for trial in range(500):
        n, m = int(rng.integers(1, 20)), int(rng.integers(1, 300))
        ids = rng.integers(0, n, m)
        ts = rng.integers(0, 10**6 if trial % 2 else 30, m)  # every other case has ties in time
        v = np.where(rng.random(m) < 0.2, np.nan, rng.integers(0, 100, m).astype(float))
        order = _time_order(ids, ts)
        used += order is not None
        assert _increase(ids, n, v, ts, order).tobytes() == _increase(ids, n, v, ts).tobytes()
    assert 0 < used < 500


_AWKWARD = np.array([0.0, -0.0, 1.0, 2.0, np.inf, -np.inf, 1e308, -1e308, 3.5])


def _awkward(rng: np.random.Generator, shape: tuple[int, ...], nan: bool) -> np.ndarray:
    """Values with ties, zeros of both signs, infinities and sums that overflow (and NaN when asked)."""
    pool = np.append(_AWKWARD, np.nan) if nan else _AWKWARD
    plain = rng.normal(size=shape).round(int(rng.integers(0, 3))) * 10.0 ** int(rng.integers(0, 8))
    out: np.ndarray = np.where(rng.random(shape) < 0.4, rng.choice(pool, shape), plain)
    return out


def test_group_median_is_np_median_of_each_group_to_the_bit() -> None:
    rng = np.random.default_rng(7)
    with np.errstate(all="ignore"):
        for _ in range(500):
            n, g = int(rng.integers(1, 40)), int(rng.integers(1, 6))
            ids = rng.integers(0, g, n)
            values = _awkward(rng, (n,), nan=True)
            got = G.group_median(ids, values, g)
            want = np.array([np.median(values[ids == k]) if (ids == k).any() else np.nan for k in range(g)])
            assert got.tobytes() == want.tobytes(), (ids, values)


def test_column_medians_are_np_median_and_leave_one_out_median_of_each_column() -> None:
    from .robust import column_leave_one_out_medians, column_medians, leave_one_out_median
    rng = np.random.default_rng(8)
    with np.errstate(all="ignore"):
        for _ in range(500):
            block = _awkward(rng, (int(rng.integers(2, 20)), int(rng.integers(1, 6))), nan=False)
            med, loo = column_medians(block), column_leave_one_out_medians(block)
            for j in range(block.shape[1]):
                assert np.float64(np.median(block[:, j])).tobytes() == med[j].tobytes(), block[:, j]
                assert leave_one_out_median(block[:, j]).tobytes() == loo[:, j].tobytes(), block[:, j]


def test_leave_one_out_medians_of_all_ports_at_once_are_the_scalar_ones() -> None:
    from .links import _errors, _errors_of, _group_ids, _medians_without
    rng = np.random.default_rng(9)
    with np.errstate(all="ignore"):
        for _ in range(500):
            n = int(rng.integers(1, 14))
            names = [str(x) for x in rng.integers(0, 4, n)]
            values = _awkward(rng, (n,), nan=True).tolist()
            members: dict[str, list[int]] = {}
            for i, name in enumerate(names):
                members.setdefault(name, []).append(i)

            def peers(i: int) -> list[float]:
                return [values[j] for j in members[names[i]] if j != i]

            got = _medians_without(_group_ids(names), np.array(values), peers)
            for i, name in enumerate(names):
                idx = members[name]
                want = _LeaveOneOut([values[j] for j in idx]).median_without(idx.index(i), lambda: peers(i))
                assert np.float64(got[i]).tobytes() == np.float64(want).tobytes(), (names, values, i)
            ms = [{f"{k}_inc": v for k, v in zip(("rx_errors", "symbol_errors", "retransmits"), row)}
                  for row in _awkward(rng, (n, 3), nan=True).tolist()]
            assert _errors_of(ms).tobytes() == np.array([_errors(m) for m in ms]).tobytes()
