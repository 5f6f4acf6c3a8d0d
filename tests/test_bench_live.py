"""``eroica bench live``: the measurement arithmetic, and a tiny job replayed in real time through ``eroica up``.

The live test runs 16 ranks for ~6 windows of 4 s on tansu (about 50 s
here) and asserts what the bench claims for big jobs: every record published
was summarised, no drop, no dead letter, the lag drained, and the fault's
verdict names the throttled rank, within a few windows of its onset. Its
digest-mode twin (``--edge-digests``) asserts the same of the window digests
the replay delivered: every one read by the detector, none dropped.
"""

from __future__ import annotations

import re

import pytest

from eroica.bench.live import (Sample, count_drops, cpu_stats, digest_batch_records, drained, judge, lag_slope,
                               lag_stats, parse_stat, stage_cpu, table_rows, verdict_timing, window_floors)


def _sample(t: float, published: int, summarised: int, done: bool = False, digests_sent: int = 0,
            digests_read: int = 0, digests_lag: int | None = None) -> Sample:
    return Sample(t=t, published=published, summarised=summarised, late=0, corrupt=0, digests_sent=digests_sent,
                  digests_read=digests_read, windows=0, pending_windows=0, held=0, raw_lag=None, digests_lag=digests_lag,
                  cpu={}, rss_mb={}, load1=0.0, replay_done=done)


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


def test_a_role_of_several_processes_is_shown_each_and_summed() -> None:
    start = Sample(t=0.0, published=0, summarised=0, late=0, corrupt=0, digests_sent=0, digests_read=0, windows=0,
                   pending_windows=0, held=0, raw_lag=None, digests_lag=None, load1=0.0,
                   cpu={"summariser": 1.0, "summariser-2": 0.0, "summariser-10": 0.0, "detector": 0.0},
                   rss_mb={})
    end = Sample(t=10.0, published=0, summarised=0, late=0, corrupt=0, digests_sent=0, digests_read=0, windows=0,
                 pending_windows=0, held=0, raw_lag=None, digests_lag=None, load1=0.0,
                 cpu={"summariser": 5.0, "summariser-2": 3.0, "summariser-10": 1.0, "detector": 2.0},
                 rss_mb={"summariser": 100.0, "summariser-2": 80.0, "summariser-10": 20.0, "detector": 50.0})
    got = cpu_stats([start, end], start, None, 8000)
    assert got["summariser (all)"]["cpu_s"] == 8.0 and got["summariser (all)"]["cores"] == 0.8
    assert got["summariser (all)"]["records_per_cpu_s"] == 1000 and got["summariser (all)"]["peak_rss_mb"] == 200.0
    assert "detector (all)" not in got
    rows = table_rows({"cpu": got})
    assert [r[0] for r in rows] == ["summariser", "summariser-2", "summariser-10", "summariser (all)", "detector"]
    assert [r[4] for r in rows] == ["-", "-", "-", "1,000", "4,000"]  # a share of the records has no rate


def test_the_stack_runs_as_many_summarisers_as_asked(tmp_path) -> None:
    from eroica.stack.local import LocalStack, service_role

    specs = LocalStack(tmp_path, summarisers=3)._service_specs()
    assert [s.name for s in specs] == ["summariser", "summariser-2", "summariser-3", "detector", "sink"]
    assert [s.argv[-1] for s in specs[:4]] == ["summariser"] * 3 + ["detector"]
    assert len({s.port for s in specs}) == 5 and len({s.env["EROICA_DATA_DIR"] for s in specs}) == 5
    assert [service_role(n) for n in ("summariser-2", "sink", "detector-x", "summariser")] == \
        ["summariser", "sink", "detector-x", "summariser"]


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


def _digest_run(read_share: float, seconds: int = 120, w: float = 10.0) -> list[Sample]:
    """Digest mode: 8 nodes each deliver a window's digest 3 s into every window; the detector has read
    ``read_share`` of them by the next second (1.0: it keeps up). The summariser reads nothing."""
    out = []
    for t in range(seconds):
        sent = 8 * int((t - 3) // w + 1) if t >= 3 else 0
        before = 8 * int((t - 4) // w + 1) if t >= 4 else 0  # what was delivered a second ago
        out.append(_sample(t, 1000 * t, 0, digests_sent=sent, digests_read=int(read_share * before)))
    return out


def test_digest_mode_is_judged_on_digests_delivered_against_read() -> None:
    w, zero = 10.0, {"digests_not_delivered": 0, "dead_letters": 0}
    keeps_up, behind = _digest_run(1.0), _digest_run(0.8)
    lag = lag_stats(keeps_up, 1000.0, w, edge_digests=True)
    assert lag["max_records"] is None and lag["slope_s_per_s"] is None and lag["end_records"] is None
    assert lag["max_digests"] == 8 and lag["digests_trend_s_per_s"] == 0.0  # bursts come and go: no trend
    assert judge(lag, zero, True, 0.1, w, edge_digests=True) == (True, [])
    # raw mode's arithmetic on the same samples reads the idle summariser as a growing lag: the mode decides
    assert not judge(lag_stats(keeps_up, 1000.0, w), zero, True, 0.1, w)[0]

    lag = lag_stats(behind, 1000.0, w, edge_digests=True)
    assert lag["digests_trend_s_per_s"] > 0.1  # a fifth of every window's digests left unread, window after window
    ok, why = judge(lag, zero, True, 0.1, w, edge_digests=True)
    assert not ok and why == [f"detector lag grew {lag['digests_trend_s_per_s']:.3f} s of digests per s"]

    replay = {"records": 120_000, "delivered_records": 119_000, "digests": 100, "delivered_digests": 97}
    end = _sample(120, 119_000, 0, done=True, digests_sent=97, digests_read=95)
    drops = count_drops(replay, end, 0, edge_digests=True)
    assert drops == {"digests_not_delivered": 3, "records_not_covered": 1000, "digests_not_read": 2, "late_digests": 0,
                     "corrupt_messages": 0, "dead_letters": 0, "invalid_lines": 0}
    ok, why = judge(lag_stats(keeps_up, 1000.0, w, edge_digests=True), drops, True, 0.1, w, edge_digests=True)
    assert not ok and why == ["3 digests not delivered", "1000 records not covered", "2 digests not read"]


def test_digest_mode_drains_when_every_delivered_digest_was_read() -> None:
    done = _sample(130, 120_000, 0, done=True, digests_sent=96, digests_read=96, digests_lag=0)
    assert drained(done, True, edge_digests=True)
    assert not drained(done, True)  # raw mode would wait for the summariser, which reads nothing here
    assert not drained(_sample(130, 120_000, 0, done=True, digests_sent=96, digests_read=95), True, edge_digests=True)
    assert not drained(_sample(130, 120_000, 0, done=True, digests_sent=96, digests_read=96, digests_lag=3), True,
                       edge_digests=True)  # read, but the detector has not committed it all
    assert not drained(done, False, edge_digests=True)  # the replay failed


def test_window_floors_and_the_digest_batch() -> None:
    points = [(10.0, 5.0), (12.0, 1.0), (19.0, 8.0), (20.0, 2.0), (25.0, 0.0), (31.0, 7.0)]
    assert window_floors(points, 10.0) == [(15.0, 1.0), (25.0, 0.0)]  # the last window is still open: left out
    assert digest_batch_records(48_700.0) == 24_350 and digest_batch_records(760.0) == 380
    assert digest_batch_records(0.5) == 1


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


def _run_small_job(tmp_path, **kw) -> tuple[int, dict]:
    """16 ranks for 6 windows of 4 s through ``eroica up`` on tansu; (the culprit rank, the result)."""
    pytest.importorskip("chdb")
    from eroica.bench.live import LiveConfig, format_table, run

    cfg = LiveConfig(ranks=16, windows=6, fault_at=2.5, window_s=4.0, broker="tansu", drain_s=40, idle_s=1.0,
                     work_dir=tmp_path, env={"EROICA_SINK_FLUSH_MS": "100"}, **kw)
    r = run(cfg)
    print("\n" + format_table(r))
    return int(cfg.fault_spec().split("rank=")[1]), r


@pytest.mark.parametrize("summarisers", [1, 2])
def test_live_replay_of_a_small_job_through_eroica_up_keeps_up_and_finds_the_fault(tmp_path, summarisers) -> None:
    culprit, r = _run_small_job(tmp_path, summarisers=summarisers)

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
    if summarisers == 2:  # the raw partitions were shared: both summarised records (their counts add up, above)
        assert r["cpu"]["summariser-2"]["cpu_s"] > 0 and "summariser (all)" in r["cpu"]
        logs = [(tmp_path / "stack" / "logs" / f"{n}.log").read_text() for n in ("summariser", "summariser-2")]
        read = [int(re.search(r"'frames': \d+, 'records': (\d+)", log.rsplit("final stats", 1)[-1])[1]) for log in logs]
        assert min(read) > 0 and sum(read) == r["replay"]["delivered_records"], read


def test_live_edge_digests_of_a_small_job_through_eroica_up_keeps_up_and_finds_the_fault(tmp_path) -> None:
    """Digest mode: the replay digests each node's records and sends window digests; the summariser reads
    nothing and the detector reads every digest the broker acknowledged to the replay."""
    culprit, r = _run_small_job(tmp_path, edge_digests=True)

    rp, end = r["replay"], r["samples"][-1]
    assert r["config"]["edge_digests"] is True and rp["declared_watermarks"] is True
    assert rp["delivered_records"] == rp["records"] == r["input"]["records"] - 1  # every record in a delivered digest
    assert 0 < rp["delivered_digests"] == rp["digests"] and rp["late_records"] == 0
    assert end["digests_sent"] == end["digests_read"] == rp["delivered_digests"]  # the detector read them all
    assert end["summarised"] == 0 and end["lag_records"] is None and r["lag"]["max_records"] is None
    assert r["deadletters_counted"] and r["drops"] == {k: 0 for k in r["drops"]} and "digests_not_read" in r["drops"]
    assert r["drained_after_s"] is not None and r["lag"]["end_digests"] == 0
    assert r["lag"]["end_digests_offsets"] == 0  # the detector committed every digest the broker acknowledged
    v = r["verdict"]
    assert v["found"] and r["score"]["localised"] and f"slow/gpu@rank {culprit}" in r["score"]["found"]
    assert not r["score"]["victims_blamed"] and 0 < v["detected_after_s"] <= v["stored_after_s"]
    assert r["cpu"]["edge"]["cpu_s"] > 0 and "replay" not in r["cpu"] and r["cpu"]["detector"]["cpu_s"] > 0
    assert r["cpu"]["summariser"]["records_per_cpu_s"] is None  # idle in digest mode: no rate
    assert r["keeps_up"], r["why_not"]


def test_frame_span_is_for_raw_frames_and_positive() -> None:
    from eroica.bench.live import LiveConfig

    assert LiveConfig(ranks=16, frame_s=4.0).frame_s == 4.0
    for bad in ({"frame_s": 0.0}, {"frame_s": -1.0}, {"frame_s": 2.0, "edge_digests": True}):
        with pytest.raises(ValueError, match="frame-s"):
            LiveConfig(ranks=16, **bad)
