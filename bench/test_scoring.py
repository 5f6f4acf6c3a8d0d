"""Scoring against ground truth (pure): fault to alarm in seconds and steps, step-time bands."""

from __future__ import annotations

from eroica.models.verdict import Verdict

from .accuracy import step_band
from .scoring import fault_to_alarm, score_run

S = 10**9


def verdict(start_s: int, end_s: int, confidence: float, rank: int = 3) -> Verdict:
    return Verdict(verdict_id=f"v{start_s}", job="j", window_start_ns=start_s * S, window_end_ns=end_s * S,
                   detected_at_ns=0, kind="slow", component="gpu", scope="rank", node="n0", rank=rank, gpu=3,
                   fn="gemm", slowdown=1.4, score=9.0, confidence=confidence, peers=[], victims=[], evidence={},
                   summary="")


TRUTH = {"layout": {"rank_nodes": ["n0"] * 8}, "start_ns": 0, "step_start_ns": [i * S for i in range(60)],
         "faults": [{"name": "gpu_throttle", "kind": "slow", "component": "gpu", "scope": "rank", "ranks": [3],
                     "start_ns": 12 * S}]}


def test_fault_to_alarm_is_from_the_onset_to_the_first_alarming_window_end():
    # the window 0-30 s reports below the alarm level, 30-60 s alarms: 48 s and 48 steps after the onset at 12 s
    score = score_run([verdict(0, 30, 0.45), verdict(30, 60, 0.9), verdict(60, 90, 0.99)], TRUTH)
    (f,) = score.faults
    assert f.ok and (f.alarm_s, f.alarm_steps) == (48.0, 48)
    # the onset window alarming: 18 s, the steps 12..29
    assert fault_to_alarm([verdict(0, 30, 0.8)], TRUTH["faults"][0], TRUTH) == (18.0, 18)
    # no alarm on it: no figure
    (miss,) = score_run([verdict(0, 30, 0.45)], TRUTH).faults
    assert not miss.ok and (miss.alarm_s, miss.alarm_steps) == (None, None)


def test_step_bands_cover_fifty_milliseconds_to_minutes():
    assert [step_band(s) for s in (0.05, 0.5, 4.9, 5.0, 59.0, 180.0)] == [
        "<0.5 s", "0.5-5 s", "0.5-5 s", "5-60 s", "5-60 s", ">=60 s"]
