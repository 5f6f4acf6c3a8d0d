"""The detector's fast paths give what the code they replaced gave, bit for bit.

Step assembly (``steps``: rows taken by index, edge parts merged without an
intermediate copy, ids without a tuple per row), the patterns' function ids and
weighted medians (``patterns``) and the GPU classes and model power limits
(``attribution``) are each compared with the replaced code, kept here as the
reference, on random inputs built to reach the corners: permuted and
repeated indices, ties of both zero signs, weights that are not whole, cells
of one, two and many rows, nodes whose GPUs disagree on a ceiling.
"""

from __future__ import annotations

from itertools import chain
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from eroica.models.digest import INTERIOR, CollRows, FnRows, RankRows, WindowDigest, concat_rows, encode_digest, encoder

from . import steps
from .attribution import _IMMUTABLE_KEYS, _agree, _finite, _values, gpu_classes, same_class, with_model_power_limits
from .counters import CounterSummary
from .expected import PAUSE_COST, PAUSE_EXCLUSIVE, _outlier_pauses
from .grouping import dense_ids, group_max, group_sum, group_weighted_median
from .history import PauseRecord
from .patterns import _sorted_fn_ids, _weighted_medians, used_codes

# -- the replaced code (as it was), the reference ---------------------------------------------------------------


def _ref_concat_rows(parts):
    cls = type(parts[0])
    return cls(**{f: list(chain.from_iterable([getattr(p, f) for p in parts])) for f in cls.__struct_fields__})


def _ref_take(rows, idx):
    cls = type(rows)
    at = idx.tolist()
    return cls(**{f: list(map(getattr(rows, f).__getitem__, at)) for f in cls.__struct_fields__})


def _ref_merge_fn_edges(f):
    if not len(f.rank):
        return f
    names: dict[tuple[str, str], int] = {}
    fid = np.fromiter((names.setdefault((n, s), len(names)) for n, s in zip(f.fn, f.stack)), np.int64, len(f.fn))
    ids, n, first = dense_ids(np.asarray(f.rank), fid, np.asarray(f.step))
    if n == len(f.rank):
        return f
    count = group_sum(ids, np.asarray(f.count, dtype=np.float64), n)
    total = group_sum(ids, np.asarray(f.total_ns, dtype=np.float64), n)
    out = _ref_take(f, first)
    out.count = count.astype(np.int64).tolist()
    out.total_ns = total.tolist()
    out.excl_ns = group_sum(ids, np.asarray(f.excl_ns, dtype=np.float64), n).tolist()
    out.per_step_ns = group_sum(ids, np.asarray(f.per_step_ns, dtype=np.float64), n).tolist()
    out.low_ns = list(out.per_step_ns)
    out.high_ns = list(out.per_step_ns)
    out.median_ns = (total / np.maximum(count, 1)).tolist()
    out.p90_ns = group_max(ids, np.asarray(f.p90_ns, dtype=np.float64), n).tolist()
    out.p99_ns = group_max(ids, np.asarray(f.p99_ns, dtype=np.float64), n).tolist()
    out.steps = [1] * n
    return out


def _ref_merge_colls(c):
    if not len(c.rank):
        return c
    groups: dict[str, int] = {}
    gid = np.fromiter((groups.setdefault(g, len(groups)) for g in c.group), np.int64, len(c.group))
    ids, n, first = dense_ids(np.asarray(c.rank), gid, np.asarray(c.step))
    if n == len(c.rank):
        return c
    out = _ref_take(c, first)
    out.dur_ns = group_sum(ids, np.asarray(c.dur_ns, dtype=np.float64), n).astype(np.int64).tolist()
    b = np.asarray(c.bytes, dtype=np.float64)
    known = np.bincount(ids, weights=np.isfinite(b).astype(float), minlength=n) > 0
    out.bytes = np.where(known, group_sum(ids, np.nan_to_num(b), n), np.nan).tolist()
    out.calls = group_sum(ids, np.asarray(c.calls, dtype=np.float64), n).astype(np.int64).tolist()
    out.p2p = (group_max(ids, np.asarray(c.p2p, dtype=np.float64), n) > 0).tolist()
    out.op = group_max(ids, np.asarray(c.op, dtype=np.float64), n).astype(np.int64).tolist()
    return out


def _ref_split_at_cut(d, cut):
    limit = np.iinfo(np.int64).max if cut is None else cut
    done = msgspec.structs.replace(d)
    carry = WindowDigest(d.job, d.start_ns, d.end_ns)
    fstep = np.asarray(d.fns.step, dtype=np.int64)
    interior = fstep == INTERIOR
    edge_done = ~interior & (fstep < limit)
    done.fns = _ref_concat_rows([_ref_take(d.fns, np.flatnonzero(interior)),
                                 _ref_merge_fn_edges(_ref_take(d.fns, np.flatnonzero(edge_done)))])
    carry.fns = _ref_take(d.fns, np.flatnonzero(~interior & ~edge_done))
    rstep = np.asarray(d.ranks.step, dtype=np.int64)
    interior = rstep == INTERIOR
    edge_done = ~interior & (rstep < limit)
    done.ranks = _ref_concat_rows([_ref_take(d.ranks, np.flatnonzero(interior)),
                                   steps._merge_rank_edges(_ref_take(d.ranks, np.flatnonzero(edge_done)))])
    carry.ranks = _ref_take(d.ranks, np.flatnonzero(~interior & ~edge_done))
    cstep = np.asarray(d.colls.step, dtype=np.int64)
    keep = cstep < limit
    done.colls = _ref_merge_colls(_ref_take(d.colls, np.flatnonzero(keep)))
    carry.colls = _ref_take(d.colls, np.flatnonzero(~keep))
    return done, carry


def _ref_sorted_fn_ids(fn, stack):
    pairs = list(zip(fn, stack))
    keys = {k: i for i, k in enumerate(sorted(set(pairs)))}
    return np.fromiter(map(keys.__getitem__, pairs), dtype=np.int64, count=len(pairs)), list(keys)


def _ref_with_model_power_limits(counters, rank_node):
    if not counters.gpu:
        return counters
    by_node: dict[str, list[int]] = {}
    for r in counters.gpu:
        node = rank_node.get(r)
        if node:
            by_node.setdefault(node, []).append(r)
    gpu = {}
    for r, m in counters.gpu.items():
        own = float(m.get("power_limit_w", np.nan))
        model = own
        mates = by_node.get(rank_node.get(r, ""), [])
        if _finite(own) and len(mates) > 1:
            imm = _values(m, _IMMUTABLE_KEYS)
            limits = [own]
            for q in mates:
                mq = counters.gpu[q]
                lq = float(mq.get("power_limit_w", np.nan))
                if q != r and _finite(lq) and _agree(imm, _values(mq, _IMMUTABLE_KEYS)):
                    limits.append(lq)
            model = max(limits)
        gpu[r] = {**m, "model_power_limit_w": model} if _finite(model) else m
    return CounterSummary(gpu=gpu, gpu_index=counters.gpu_index, nic=counters.nic, host=counters.host)


def _ref_gpu_classes(counters, ranks):
    reps: list[dict[str, float]] = []
    out: dict[int, int] = {}
    for r in sorted(ranks):
        m = counters.gpu.get(r)
        if m is None:
            continue
        for i, rep in enumerate(reps):
            if same_class(rep, m):
                out[r] = i
                break
        else:
            reps.append(m)
            out[r] = len(reps) - 1
    return out


# -- random inputs ------------------------------------------------------------------------------------------------


def _digest(rng: np.random.Generator, parts: int) -> WindowDigest:
    """Time-window digests side by side, as assemble joins them: edge steps repeated across parts, some not."""
    fns, ranks, colls = [], [], []
    names = [f"k{i}" for i in range(int(rng.integers(1, 6)))]
    stacks = ["", "a;b", "a;c"]
    for _ in range(parts):
        n = int(rng.integers(0, 40))
        step = rng.choice([INTERIOR, 3, 4, 5, 6], n).tolist()
        fns.append(FnRows(
            rank=rng.integers(0, 5, n).tolist(), fn=rng.choice(names, n).tolist(), stack=rng.choice(stacks, n).tolist(),
            kind=rng.integers(0, 4, n).tolist(), count=rng.integers(1, 9, n).tolist(),
            total_ns=rng.choice([0.0, -0.0, 1.5, 2e9, 3.25], n).tolist(), excl_ns=rng.random(n).tolist(),
            median_ns=rng.random(n).tolist(), p90_ns=rng.choice([np.nan, 1.0, 2.0], n).tolist(),
            p99_ns=rng.random(n).tolist(), per_step_ns=(rng.random(n) * 1e9).tolist(), step=step,
            steps=rng.integers(1, 9, n).tolist(), low_ns=rng.random(n).tolist()))
        m = int(rng.integers(0, 12))
        ranks.append(RankRows(rank=rng.integers(0, 5, m).tolist(), node=rng.choice(["n0", "n1"], m).tolist(),
                              steps=rng.integers(1, 9, m).tolist(), step_time_ns=rng.random(m).tolist(),
                              step=rng.choice([INTERIOR, 3, 4, 5], m).tolist(),
                              start_ns=rng.integers(0, 100, m).tolist(), end_ns=rng.integers(100, 200, m).tolist()))
        k = int(rng.integers(0, 30))
        colls.append(CollRows(rank=rng.integers(0, 5, k).tolist(), group=rng.choice(["tp0", "dp1", "pp"], k).tolist(),
                              step=rng.integers(2, 7, k).tolist(), dur_ns=rng.integers(0, 1000, k).tolist(),
                              bytes=rng.choice([np.nan, 0.0, 4096.0], k).tolist(), calls=rng.integers(1, 4, k).tolist(),
                              p2p=rng.choice([True, False], k).tolist(), op=rng.integers(-1, 3, k).tolist()))
    d = WindowDigest("j", 0, 1)
    d.fns, d.ranks, d.colls = _ref_concat_rows(fns), _ref_concat_rows(ranks), _ref_concat_rows(colls)
    return d


# -- the tests ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(60))
def test_split_at_cut_is_the_replaced_code(seed):
    rng = np.random.default_rng(seed)
    d = _digest(rng, int(rng.integers(1, 4)))
    for cut in (None, 3, 4, 5, 7):
        new, ref = steps.split_at_cut(d, cut), _ref_split_at_cut(d, cut)
        assert [encode_digest(x) for x in new] == [encode_digest(x) for x in ref]


@pytest.mark.parametrize("seed", range(20))
def test_merged_edges_and_collectives_are_the_replaced_code(seed):
    d = _digest(np.random.default_rng(seed), 3)
    enc = encoder()
    assert enc.encode(steps._merge_fn_edges(d.fns)) == enc.encode(_ref_merge_fn_edges(d.fns))
    assert enc.encode(steps._merge_colls(d.colls)) == enc.encode(_ref_merge_colls(d.colls))


def test_picker_takes_any_order_and_runs():
    values = list(range(10))
    for idx in ([], [4], [2, 3, 4], [0, 2, 1, 3], [3, 2, 1, 0], [9, 0], [1, 1, 2], list(range(10))):
        assert steps._picker(np.asarray(idx, dtype=np.intp))(values) == [values[i] for i in idx]


def test_concat_rows_is_the_replaced_code():
    a = FnRows(rank=[1, 2], fn=["x", "y"])
    b = FnRows(rank=[3], fn=["z"])
    assert concat_rows([a, b]) == _ref_concat_rows([a, b])
    assert concat_rows([a]) == a and concat_rows([a]).rank is not a.rank


@pytest.mark.parametrize("seed", range(40))
def test_function_ids_are_the_replaced_code(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    fn = rng.choice(["b", "a", "ab", "é", ""], n).tolist()
    stack = rng.choice(["", "x;y", "x"], n).tolist()
    fid, keys = _sorted_fn_ids(fn, stack)
    ref_fid, ref_keys = _ref_sorted_fn_ids(fn, stack)
    assert fid.tolist() == ref_fid.tolist() and keys == ref_keys


@pytest.mark.parametrize("seed", range(60))
def test_weighted_medians_are_the_general_way(seed):
    rng = np.random.default_rng(seed)
    n, cells = int(rng.integers(0, 80)), int(rng.integers(1, 30))
    cell = rng.integers(0, cells, n)
    values = rng.choice([0.0, -0.0, 1.0, 2.0, np.nan, np.inf, 3.5], n) if seed % 2 else rng.random(n)
    w = rng.integers(0, 4, n).astype(np.float64) if seed % 3 else rng.random(n) * 3
    got, ref = _weighted_medians(cell, values, w, cells), group_weighted_median(cell, values, w, cells)
    assert got.tobytes() == ref.tobytes()


@pytest.mark.parametrize("seed", range(30))
def test_model_power_limits_and_classes_are_the_replaced_code(seed):
    rng = np.random.default_rng(seed)
    gpu = {}
    for r in rng.permutation(24).tolist():
        m: dict[str, float] = {}
        for key, choices in (("power_limit_w", [700.0, 650.0, np.nan, 0.0, -0.0]),
                             ("max_sm_clock_mhz", [1980.0, 1970.0, 1755.0, np.nan]),
                             ("mem_total_bytes", [80e9, 94e9, np.inf])):
            if rng.random() < 0.85 or seed % 4 == 0:
                m[key] = float(rng.choice(choices[:1] if seed % 4 == 0 else choices))
        gpu[r] = m
    rank_node = {r: f"n{r // 8}" for r in range(24) if r % 7 or seed % 2}
    c = CounterSummary(gpu=gpu)
    new, ref = with_model_power_limits(c, rank_node), _ref_with_model_power_limits(c, rank_node)
    assert msgspec.json.encode(new.gpu) == msgspec.json.encode(ref.gpu)
    assert list(new.gpu) == list(ref.gpu)
    ranks = list(range(26))
    assert gpu_classes(new, ranks) == _ref_gpu_classes(new, ranks)


def _ref_outlier_pauses(p, f, step_ns):
    out = []
    for slot in np.flatnonzero(p.count[:, f] > 0):
        calls, steps_ = float(p.count[slot, f]), float(max(p.steps[slot], 1))
        low, excl = float(p.low_ns[slot, f]), float(p.excl_ns[slot, f])
        total, p99 = float(p.total_ns[slot, f]), float(p.p99_ns[slot, f])
        if not all(np.isfinite(v) for v in (low, excl, total, p99)):
            continue
        usual = min(steps_, calls) * low
        excess = excl - usual
        size = p99 - max(total - excess, 0.0) / calls
        if (size < PAUSE_COST * step_ns or excess < PAUSE_EXCLUSIVE * size
                or usual < PAUSE_EXCLUSIVE * max(total - excess, 0.0)):
            continue
        out.append(PauseRecord(p.fn_names[f], int(p.ranks[slot]), excess, max(1, int(round(excess / size))), size))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_outlier_pauses_are_the_replaced_code(seed):
    rng = np.random.default_rng(seed)
    r, nf = int(rng.integers(1, 40)), 3
    def m(scale):
        a = rng.choice([0.0, -0.0, 1e6, 5e7, 2e8, np.nan, np.inf], (r, nf)) if seed % 2 else rng.random((r, nf)) * scale
        return a
    p = SimpleNamespace(count=rng.integers(0, 4, (r, nf)), steps=rng.integers(0, 5, r), low_ns=m(1e7),
                        excl_ns=m(3e8), total_ns=m(4e8), p99_ns=m(3e8), fn_names=["a", "b", "c"],
                        ranks=np.arange(r) * 2)
    for f in range(nf):
        for step_ns in (1e8, 1e9, 1e-3):  # the detector asks only with a positive step
            assert _outlier_pauses(p, f, step_ns) == _ref_outlier_pauses(p, f, step_ns)


@pytest.mark.parametrize("seed", range(20))
def test_used_codes_and_first_seen_renumbering_are_the_sorts(seed):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, int(rng.integers(1, 50)) * (1 if seed % 2 else 1000), int(rng.integers(1, 300)))
    used, inverse = used_codes(codes, int(codes.max()) + 1)
    ref_used, ref_inverse = np.unique(codes, return_inverse=True)
    assert used.tolist() == ref_used.tolist() and inverse.tolist() == ref_inverse.reshape(-1).tolist()
    seen: dict[int, int] = {}
    assert steps._renumber_first_seen(codes).tolist() == [seen.setdefault(c, len(seen)) for c in codes.tolist()]


def test_picker_fails_on_a_short_column_as_indexing_does():
    short = [10, 11]
    for idx in ([0, 1, 2], [1, 2], [0, 2]):     # a run past the end, and not a run
        with pytest.raises(IndexError):
            steps._picker(np.asarray(idx, dtype=np.intp))(short)
