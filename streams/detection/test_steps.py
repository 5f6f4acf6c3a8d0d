"""Assembling job windows: the merged counters and the arrays handed to the detector are what the slow,
obvious ways give (the bits, not just the values)."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from eroica.models.digest import INTERIOR, CollRows, FnRows, RankRows, WindowDigest

from .patterns import first_seen_ids
from .steps import _merge_metrics, split_with_arrays


def _reference_merge(maps: Sequence[dict[str, float]]) -> dict[str, float]:
    """The merge of counters over windows, in numpy, one key at a time (as it was written first)."""
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


def test_counters_merged_in_python_floats_are_numpys_to_the_bit() -> None:
    rng = random.Random(3)
    pool = [0.0, -0.0, 1.0, 2, 3, None, float("nan"), float("inf"), -float("inf"), 1e308, 0.5]
    keys = ["throughput_Bps", "zero_share", "throughput_cv", "rx_inc", "link_up_min", "xid", "temp_max", "power"]
    with np.errstate(all="ignore"):
        for _ in range(3000):
            maps = [{k: rng.choice(pool) if rng.random() < 0.4 else rng.uniform(-10, 1e6)
                     for k in keys if rng.random() < 0.8} for _ in range(rng.randint(2, 12))]
            got, want = _merge_metrics(maps), _reference_merge(maps)  # type: ignore[arg-type]
            assert list(got) == list(want)
            for k in got:
                assert type(got[k]) is type(want[k]) and np.float64(got[k]).tobytes() == np.float64(want[k]).tobytes()


def _digest(seed: int) -> WindowDigest:
    """Four ranks, interior rows and edge steps in two parts (to merge), collective rows with repeats."""
    rng = np.random.default_rng(seed)
    f = SimpleNamespace(**{k: [] for k in FnRows.__struct_fields__})  # columns as lists while built
    for rank in range(4):
        for step in (INTERIOR, 3, 3, 4, 5):
            for name in ("gemm", "load", "step"):
                f.rank.append(rank)
                f.fn.append(name)
                f.stack.append(f"train;{name}")
                f.kind.append(int(rng.integers(0, 4)))
                f.count.append(int(rng.integers(1, 5)))
                for col in (f.total_ns, f.excl_ns, f.median_ns, f.p90_ns, f.p99_ns, f.per_step_ns, f.low_ns):
                    col.append(float(rng.integers(0, 10**6)))
                f.step.append(step)
                f.steps.append(int(rng.integers(1, 4)) if step == INTERIOR else 1)
    c = SimpleNamespace(**{k: [] for k in CollRows.__struct_fields__})
    for rank in range(4):
        for step in (3, 3, 4, 5):
            for group in ("dp0", "tp0", ""):
                c.rank.append(rank)
                c.group.append(group)
                c.step.append(step)
                c.dur_ns.append(int(rng.integers(0, 10**6)))
                c.bytes.append(float(rng.integers(0, 10**9)) if rng.random() < 0.8 else float("nan"))
                c.calls.append(int(rng.integers(1, 9)))
                c.p2p.append(bool(rng.random() < 0.2))
                c.op.append(int(rng.integers(-1, 5)))
    r = RankRows(rank=[0, 1, 2, 3], node=["a", "a", "b", "b"], steps=[1] * 4, step_time_ns=[1e6] * 4,
                 step=[3] * 4, start_ns=[0] * 4, end_ns=[10**6] * 4)
    return WindowDigest("j", 0, 10**9, ranks=r, fns=FnRows(**vars(f)), colls=CollRows(**vars(c)))


def test_the_arrays_a_split_hands_on_are_those_its_rows_convert_to() -> None:
    for seed in range(5):
        d = _digest(seed)
        for cut in (None, 4, 5):
            done, _, arrays = split_with_arrays(d, cut)
            for rows in (arrays.fns, arrays.colls, arrays.ranks):
                for (name, dtype), values in rows._arrays.items():
                    want = np.asarray(getattr(rows.rows, name), dtype=dtype)
                    assert values.dtype == want.dtype and values.tobytes() == want.tobytes(), (name, cut)
                for name, (ids, distinct) in rows._ids.items():
                    want_ids, want_distinct = first_seen_ids(getattr(rows.rows, name))
                    assert ids.tobytes() == want_ids.tobytes() and distinct == want_distinct, (name, cut)
            assert arrays.digest is done and arrays.fns._ids and arrays.colls._ids
