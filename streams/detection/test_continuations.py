"""Spans that cross a window's end: their own time after it is counted, in the step they belong to
(:func:`.windows.continuations`, ``summarise_fn(..., cont=)``)."""

from __future__ import annotations

import random

import numpy as np

from eroica.models.columns import from_records
from eroica.models.records import FnRecord

from .steps import MAX_PENDING_WINDOWS, _merge_fn_edges, concat
from .summarise import digest_window
from .windows import CONT, WindowAssembler, continuations

S = 1_000_000_000
W = 30 * S


def fn(rank: int, name: str, kind: str, start_s: float, dur_s: float, step: int = 0, stack: str = "",
       in_flight: bool = False) -> FnRecord:
    return FnRecord(job="j", node=f"n{rank // 8}", rank=rank, step=step, fn=name, kind=kind,
                    ts_ns=int(start_s * S), dur_ns=int(dur_s * S), stack=stack, in_flight=in_flight)


def test_a_span_continues_into_every_later_window_it_covers_and_no_further():
    cols = from_records("fn", [fn(0, "train_step", "python", 10, 65),     # 10-75 s: windows 1 and 2
                               fn(0, "gc.collect", "python", 20, 10),     # ends exactly at 30 s: none
                               fn(0, "hang", "python", 25, 40, in_flight=True)])  # no end to carry
    c = continuations(cols, W)
    assert c is not None and c.strings("fn").tolist() == ["train_step", "train_step"]
    assert c.arrays["ts_ns"].tolist() == [30 * S, 60 * S]
    assert c.arrays["dur_ns"].tolist() == [45 * S, 15 * S]       # each ends where the record ends
    assert continuations(from_records("fn", [fn(0, "k", "kernel", 1, 2)]), W) is None
    week = continuations(from_records("fn", [fn(0, "stuck", "python", 1, 7 * 86400)]), W)
    assert week is not None and len(week) == MAX_PENDING_WINDOWS   # bounded: 20,160 windows otherwise
    assert week.arrays["ts_ns"][-1] == MAX_PENDING_WINDOWS * W


def _job(order_seed: int | None) -> list[FnRecord]:
    """Rank 0's 40 s step holds a 30 s GC pause across the 30 s window end; ranks 1-3 run 40 s of
    a kernel each; every rank then starts step 1 (so step 0 is complete everywhere)."""
    recs = [fn(0, "train_step", "python", 0, 40, stack="train_step"),
            fn(0, "gc.collect", "python", 5, 30, stack="train_step;gc.collect"),
            fn(0, "train_step", "python", 40, 1, step=1, stack="train_step")]
    for r in (1, 2, 3):
        recs += [fn(r, "train_step", "python", 0, 40, stack="train_step"),
                 fn(r, "gemm", "kernel", 1, 38, stack="train_step"),
                 fn(r, "train_step", "python", 40, 1, step=1, stack="train_step")]
    if order_seed is not None:
        random.Random(order_seed).shuffle(recs)
    return recs


def _step0(records: list[FnRecord], batch: int) -> dict[tuple[int, str], tuple[int, float, float, float]]:
    """(rank, fn) -> (count, total s, exclusive s, per-step cost s) of step 0 once its parts are merged."""
    asm = WindowAssembler(W, W)
    for i in range(0, len(records), batch):
        asm.add(from_records("fn", records[i:i + batch]))
    windows = asm.flush()
    assert any(CONT in w.columns for w in windows)
    assert sum(w.records for w in windows) == len(records)   # continuations are not records received
    digests = [digest_window(w) for w in windows]
    f = _merge_fn_edges(concat(digests, 0, 2 * W).fns)
    return {(r, n): (c, t / S, e / S, p / S) for r, n, s, c, t, e, p in
            zip(f.rank, f.fn, f.step, f.count, f.total_ns, f.excl_ns, f.per_step_ns) if s == 0}


def test_a_pause_across_the_window_end_is_counted_whole_in_its_step_in_any_record_order():
    for seed, batch in ((None, 100), (1, 1), (2, 3)):
        got = _step0(_job(seed), batch)
        assert got[(0, "gc.collect")] == (1, 30.0, 30.0, 30.0), got   # 25 s of it after the window end
        assert got[(0, "train_step")] == (1, 40.0, 10.0, 10.0), got   # the frame: 40 s less the pause
        for r in (1, 2, 3):
            assert got[(r, "train_step")] == (1, 40.0, 2.0, 2.0), got  # host time around the kernel
            assert got[(r, "gemm")] == (1, 38.0, 38.0, 38.0), got      # own duration, counted once
        assert np.isclose(sum(v[2] for (r, _), v in got.items() if r == 0), 40.0)
