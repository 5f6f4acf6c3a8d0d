"""``eroica bench live``: the measurement arithmetic, and a tiny job replayed in real time through ``eroica up``.

The live test runs 16 ranks for ~6 windows of 4 s on tansu (about 50 s
here) and asserts what the bench claims for big jobs: every record published
was summarised, no drop, no dead letter, the lag drained, and the fault's
verdict names the throttled rank, within a few windows of its onset.
"""

from __future__ import annotations

import pytest

from eroica.bench.live import (Sample, judge, lag_slope, lag_stats, parse_stat, stage_cpu, verdict_timing)


def _sample(t: float, published: int, summarised: int, done: bool = False) -> Sample:
    return Sample(t=t, published=published, summarised=summarised, late=0, corrupt=0, digests_sent=0, digests_read=0,
                  windows=0, pending_windows=0, held=0, raw_lag=None, digests_lag=None, cpu={}, rss_mb={}, load1=0.0,
                  replay_done=done)


def test_parse_stat_reads_a_name_with_spaces_and_parentheses() -> None:
    import os

    clk, page = os.sysconf("SC_CLK_TCK"), os.sysconf("SC_PAGE_SIZE")
    fields = ["S", "77"] + ["0"] * 9 + [str(3 * clk), str(clk)] + ["0"] * 7 + ["4096", "250"]  # ... vsize, rss
    raw = b"123 (tansu (x) y) " + " ".join(fields).encode()
    assert parse_stat(raw) == (77, 4.0, 250 * page)


def test_stage_cpu_counts_each_process_once() -> None:
    # supervisor 1 -> broker 2, summariser 3 (-> its helper 5), sink 4; 9 is not ours
    table = {1: (0, 1.0, 10), 2: (1, 2.0, 20), 3: (1, 3.0, 30), 5: (3, 0.5, 5), 4: (1, 4.0, 40), 9: (0, 9.0, 90)}
    got = stage_cpu(table, {"supervisor": 1, "broker": 2, "summariser": 3, "sink": 4, "gone": 42})
    assert got == {"supervisor": (1.0, 10), "broker": (2.0, 20), "summariser": (3.5, 35), "sink": (4.0, 40),
                   "gone": (0.0, 0)}


def test_a_growing_lag_falls_behind_and_a_bounded_one_does_not() -> None:
    assert lag_slope([(0, 0), (1, 2), (2, 4), (3, 6)]) == pytest.approx(2.0)
    rate, w = 1000.0, 10.0
    steady = [_sample(t, 1000 * t, 1000 * t - (500 if t % 10 == 0 else 0)) for t in range(0, 120)]
    behind = [_sample(t, 1000 * t, 800 * t) for t in range(0, 120)]
    zero = {"dead_letters": 0}
    ok, why = judge(lag_stats(steady, rate, w), zero, True, 0.1, w)
    assert ok and not why
    ok, why = judge(lag_stats(behind, rate, w), zero, True, 0.1, w)
    assert not ok and "summariser lag grew 0.200 s per s" in why[0]
    ok, why = judge(lag_stats(steady, rate, w), {"dead_letters": 2}, False, 9.0, w)
    assert why == ["2 dead letters", "not drained at the end", "the replay ran up to 9.0 s behind real time"]


def test_verdict_timing_in_seconds_and_windows() -> None:
    w = 30 * 10**9
    onset = 100 * w + 15 * 10**9  # half-way through window 100
    offset = 7 * 10**9  # wall = event + 7 s
    first = {"window_start_ns": 101 * w, "detected_at_ns": onset + offset + 48 * 10**9,
             "seen_ns": onset + offset + 50 * 10**9}
    t = verdict_timing(onset, w, offset, first)
    assert t["verdict_window"] == 1 and t["onset_in_window_s"] == 15.0
    assert (t["detected_after_s"], t["detected_after_windows"]) == (48.0, 1.6)
    assert (t["stored_after_s"], t["stored_after_windows"]) == (50.0, pytest.approx(1.67))
    assert verdict_timing(onset, w, offset, None)["found"] is False


def test_live_replay_of_a_small_job_through_eroica_up_keeps_up_and_finds_the_fault(tmp_path) -> None:
    pytest.importorskip("chdb")
    from eroica.bench.live import LiveConfig, format_table, run

    cfg = LiveConfig(ranks=16, windows=6, fault_at=2.5, window_s=4.0, broker="tansu", drain_s=40, idle_s=1.0,
                     work_dir=tmp_path, env={"EROICA_SINK_FLUSH_MS": "100"})
    r = run(cfg)
    print("\n" + format_table(r))
    culprit = int(cfg.fault_spec().split("rank=")[1])

    assert r["replay"]["delivered_records"] == r["replay"]["records"] == r["input"]["records"] - 1  # - the job record
    assert r["deadletters_counted"] and r["drops"] == {k: 0 for k in r["drops"]}
    assert r["drained_after_s"] is not None and r["lag"]["end_records"] == 0 and r["lag"]["end_digests"] == 0
    assert r["lag"]["end_raw_offsets"] == 0  # the summariser committed everything the broker acknowledged
    assert r["samples"][-1]["summarised"] == r["replay"]["delivered_records"]
    v = r["verdict"]
    assert v["found"] and r["score"]["localised"] and f"slow/gpu@rank {culprit}" in r["score"]["found"]
    assert not r["score"]["victims_blamed"]
    assert 0 < v["detected_after_s"] <= v["stored_after_s"] and v["verdict_window"] in (0, 1)
    assert r["cpu"]["summariser"]["cpu_s"] > 0 and r["cpu"]["broker"]["cpu_s"] > 0 and r["cpu"]["replay"]["cpu_s"] > 0
    assert r["keeps_up"], r["why_not"]
