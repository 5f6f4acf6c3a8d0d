"""Job windows of whole steps: long steps, steps cut by window edges, node clock offsets.

The real OSDI'25 pipeline trace (read in place from ../shared/data) is
re-timed so that its steps last ~55 s, longer than the default 30 s window,
as a large model's do: the default settings must still name the last stage
as `workload`, and nothing else.
"""

from __future__ import annotations

import subprocess
import sys

import msgspec
import numpy as np

from eroica.models.digest import INTERIOR, RankRows, WindowDigest
from eroica.models.reader import read_batches
from eroica.producers.simulator import SimConfig, write_jsonl
from eroica.streams.detection import DEFAULT_WINDOW_S, analyze
from eroica.streams.detection.steps import (MAX_STALLED_WINDOWS, MIN_WINDOW_STEPS, assemble, complete_steps, cut_of,
                                             stalled_windows)
from eroica.streams.detection.summarise import digest_window
from eroica.streams.detection.windows import WindowAssembler

W = int(DEFAULT_WINDOW_S * 1e9)


def _retimed(src, dst, factor: float) -> None:
    """Every time and duration of a contract file stretched ``factor`` times around its first record."""
    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    recs = [dec.decode(line) for line in src.read_bytes().splitlines() if line.strip()]
    t0 = min(r["ts_ns"] for r in recs if "ts_ns" in r)
    with dst.open("wb") as out:
        for r in recs:
            if "ts_ns" in r:
                r["ts_ns"] = t0 + int((r["ts_ns"] - t0) * factor)
            if "dur_ns" in r:
                r["dur_ns"] = int(r["dur_ns"] * factor)
            out.write(enc.encode(r) + b"\n")


def test_steps_longer_than_the_window_give_the_published_cause(tmp_path, shared_dir):
    out = tmp_path / "st.jsonl"
    subprocess.run([sys.executable, "-m", "eroica.cli", "import", "optable",
                    str(shared_dir / "data/stragglers/trace-ST.parquet"), "-o", str(out)], check=True,
                   capture_output=True)
    long = tmp_path / "st-long.jsonl"
    _retimed(out, long, 25.0)  # 2.2 s steps -> ~55 s, the trace's 32 steps -> ~30 min
    verdicts = list(analyze(read_batches(long), W))
    assert verdicts, "no verdict at the default window on steps longer than it"
    assert {v.component for v in verdicts} == {"workload"}
    assert {v.rank for v in verdicts if v.confidence >= 0.5} == {6, 7}
    # every job window holds whole steps: several 30 s windows each
    assert min(v.window_end_ns - v.window_start_ns for v in verdicts) >= 3 * W


def test_five_minute_steps_give_the_published_cause_at_default_settings(tmp_path, shared_dir):
    """Steps of ~4.8 min (the trace re-timed 130x): a job window waits for three whole steps
    (~15 min of 30 s windows) because the job keeps making progress; it is never cut short."""
    out = tmp_path / "st.jsonl"
    subprocess.run([sys.executable, "-m", "eroica.cli", "import", "optable",
                    str(shared_dir / "data/stragglers/trace-ST.parquet"), "-o", str(out)], check=True,
                   capture_output=True)
    long = tmp_path / "st-5min.jsonl"
    _retimed(out, long, 130.0)
    verdicts = list(analyze(read_batches(long), W))
    assert {v.component for v in verdicts} == {"workload"}
    assert {v.rank for v in verdicts if v.confidence >= 0.5} == {6, 7}
    assert min(v.window_end_ns - v.window_start_ns for v in verdicts) >= 16 * W  # longer than 16 windows: 3 steps


def test_a_job_window_stays_open_while_steps_progress_and_closes_when_they_stop():
    def window(k: int, step: int) -> WindowDigest:
        d = WindowDigest("j", k * W, (k + 1) * W)
        d.ranks = RankRows(rank=[0], node=["n"], steps=[1], step_time_ns=[0.0], step=[step], start_ns=[k * W],
                           end_ns=[(k + 1) * W])
        return d

    slow = [window(k, k // 10) for k in range(40)]   # a new step every 10 windows (5 min)
    assert max(stalled_windows(slow[: n + 1], None) for n in range(40)) == 9
    stuck = [window(k, 3) for k in range(20)]         # no new step after the first window
    assert stalled_windows(stuck, None) == 19
    assert stalled_windows(stuck[:17], None) >= MAX_STALLED_WINDOWS


def _windows(path, window_ns: int = W):
    asm = WindowAssembler(window_ns, window_ns)
    for b in read_batches(path):
        for c in b.columns.values():
            asm.add(c)
    return asm.flush()


def test_a_window_s_edge_steps_are_kept_apart_and_summed_across_windows(tmp_path):
    path = tmp_path / "run.jsonl"
    write_jsonl(SimConfig(nodes=2, gpus=4, steps=30, seed=5), path, truth_path=False)
    digests = [digest_window(w) for w in _windows(path, 5 * 10**9)]  # ~7 steps of 0.7 s per window
    d = digests[1]
    steps = np.asarray(d.fns.step)
    assert (steps == INTERIOR).any() and (steps != INTERIOR).any()
    # per rank: one interior row and its first and last step as edge rows
    for r in set(d.ranks.rank):
        rows = [s for rr, s in zip(d.ranks.rank, d.ranks.step) if rr == r]
        assert rows.count(INTERIOR) == 1 and len(rows) == 3
    # assembling two windows: the step cut by their common edge becomes one row per (rank, fn)
    job_window, carry = assemble(digests[:2], None)
    assert job_window is not None and carry is not None
    cut = cut_of(msgspec.structs.replace(digests[1]))
    edge = [(r, f, s) for r, f, s in zip(job_window.fns.rank, job_window.fns.fn, job_window.fns.step) if s != INTERIOR]
    assert len(edge) == len(set(edge)), "an edge step's parts were not summed"
    assert all(s < cut for _, _, s in edge)
    assert all(s >= cut for s in carry.fns.step)
    assert min(complete_steps(job_window, cut).values()) >= MIN_WINDOW_STEPS


def test_node_clock_offsets_change_no_finding(tmp_path):
    path = tmp_path / "run.jsonl"
    write_jsonl(SimConfig(nodes=4, gpus=4, steps=90, seed=8, faults=["gpu_throttle:rank=6"]), path,
                truth_path=False)
    shifted = tmp_path / "shifted.jsonl"
    rng = np.random.default_rng(3)
    offset = {f"node-{n}": int(o) for n, o in enumerate(rng.uniform(-50e6, 50e6, 4))}
    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    with shifted.open("wb") as out:
        for line in path.read_bytes().splitlines():
            r = dec.decode(line)
            if "ts_ns" in r and "node" in r:
                r["ts_ns"] += offset[r["node"]]
            out.write(enc.encode(r) + b"\n")

    def findings(p):
        return {(v.component, v.scope, v.node, v.rank) for v in analyze(read_batches(p), W) if v.confidence >= 0.5}

    assert findings(path) == findings(shifted) == {("gpu", "rank", "node-1", 6)}


def test_a_rank_that_stops_reporting_holds_nothing_back(tmp_path):
    """Rank 3's collector dies after 10 s: the others' job windows still close, and what is
    carried from one job window to the next stays bounded."""
    path = tmp_path / "run.jsonl"
    write_jsonl(SimConfig(nodes=2, gpus=4, steps=400, seed=9, faults=["gpu_throttle:rank=5"]), path,
                truth_path=False)
    dec, enc = msgspec.json.Decoder(), msgspec.json.Encoder()
    cut_path = tmp_path / "dead.jsonl"
    lines = path.read_bytes().splitlines()
    t0 = min(dec.decode(ln).get("ts_ns", 1 << 62) for ln in lines)
    with cut_path.open("wb") as out:
        for ln in lines:
            r = dec.decode(ln)
            if r.get("rank") == 3 and r.get("ts_ns", 0) > t0 + 10 * 10**9:
                continue
            out.write(enc.encode(r) + b"\n")
    verdicts = list(analyze(read_batches(cut_path), W))
    late = [v for v in verdicts if v.window_start_ns > t0 + 150 * 10**9]
    assert any(v.component == "gpu" and v.rank == 5 for v in late), "no job window closed after rank 3 died"
    assert max(v.window_end_ns - v.window_start_ns for v in verdicts) <= 8 * W


def test_a_rails_bursts_merge_as_a_mean_rate_over_windows():
    """Steps of minutes: a rail moves its bytes in one time window of ten, the front-end port a
    little in every one. Over the job window the rail must still be the busier port."""
    from eroica.streams.detection.steps import _merge_metrics
    rail = [{"throughput_Bps": 0.0, "throughput_cv": 0.0, "zero_share": 1.0}] * 9 + [
        {"throughput_Bps": 5e10, "throughput_cv": 1.0, "zero_share": 0.5}]
    eth0 = [{"throughput_Bps": 1e8, "throughput_cv": 0.3, "zero_share": 0.0}] * 10
    r, e = _merge_metrics(rail), _merge_metrics(eth0)
    assert r["throughput_Bps"] == 5e9 and e["throughput_Bps"] == 1e8
    assert abs(r["zero_share"] - 0.95) < 1e-12
    assert abs(e["throughput_cv"] - 0.3) < 1e-9  # equal windows: the spread of all samples is each window's
    assert r["throughput_cv"] > 3.0                # mostly idle, one burst: very uneven
