"""The incident state machine (pure): open once, remind, resolve on event time or wall clock, never twice."""

from __future__ import annotations

import msgspec
import pytest

from eroica.models.verdict import Verdict, finding_key, incident_id, verdict_id
from eroica.sinks.alerts.incidents import IncidentTracker, TrackerSettings, notification_id
from eroica.sinks.alerts.state import AlertState

S = 10**9
W = 10 * S
T0 = 1_700_000_000 * S


def verdict(window: int, confidence: float = 0.9, *, job: str = "j1", rank: int = 5, component: str = "gpu",
            fn: str = "gemm") -> Verdict:
    key = finding_key(job, "slow", component, "rank", "node-1", rank, 1, fn)
    start = T0 + window * W
    return Verdict(verdict_id=verdict_id(start, start + W, key), job=job, window_start_ns=start,
                   window_end_ns=start + W, detected_at_ns=start + W + S, kind="slow", component=component,
                   scope="rank", node="node-1", rank=rank, gpu=1, fn=fn, slowdown=1.4, score=9.0,
                   confidence=confidence, peers=[0, 1], victims=[0, 1], evidence={"sm_clock_mhz": {"culprit": 1410}},
                   summary=f"rank {rank} on node-1: throttled", incident_id=incident_id(key))


def tracker(**kw) -> IncidentTracker:
    base = dict(min_confidence=0.7, resolve_after=2, reminder_ns=0, stale_ns=600 * S)
    base.update(kw)
    return IncidentTracker(TrackerSettings(**base))


def window(t: IncidentTracker, job: str, k: int, now: int) -> None:
    t.observe_window(job, T0 + k * W, T0 + (k + 1) * W, now)


def test_opens_once_at_the_first_verdict_above_the_threshold() -> None:
    t = tracker()
    assert t.observe_verdict(verdict(0, 0.45), now_ns=1) == []          # pending: below the alarm level
    opened = t.observe_verdict(verdict(1, 0.95), now_ns=2)
    assert [n.event for n in opened] == ["opened"]
    n = opened[0]
    assert (n.job, n.rank, n.component, n.first_window_start_ns, n.windows) == ("j1", 5, "gpu", T0, 2)
    assert n.notification_id == notification_id(n.incident_id, 1, "opened", 0)
    assert t.observe_verdict(verdict(2, 0.99), now_ns=3) == []          # persists: no new notification
    assert t.open_count() == 1


def test_applying_the_same_verdicts_again_changes_nothing() -> None:
    t = tracker()
    t.observe_verdict(verdict(0), 1)
    t.observe_verdict(verdict(1), 2)
    before = msgspec.json.encode(t.to_doc())
    for k in (0, 1):  # re-read after a restart
        assert t.observe_verdict(verdict(k), 5) == []
    after = t.to_doc()
    assert after["incidents"] == msgspec.json.decode(before)["incidents"]


def test_resolves_after_n_windows_of_the_job_on_event_time_only_when_caught_up() -> None:
    t = tracker()
    t.observe_verdict(verdict(0), 1)
    t.observe_verdict(verdict(1), 2)
    window(t, "j1", 2, 3)                      # one window without it
    assert t.due(4, caught_up=True) == []
    assert not t.could_resolve(4)
    window(t, "j1", 3, 5)                      # the second one: resolve_after = 2 reached
    assert t.could_resolve(6)
    assert t.due(6, caught_up=False) == []     # a verdict may still wait in the topic
    resolved = t.due(7, caught_up=True)
    assert [n.event for n in resolved] == ["resolved"] and resolved[0].resolution == "windows"
    assert t.due(8, caught_up=True) == [] and t.open_count() == 0
    # another job's windows never resolve it
    t2 = tracker()
    t2.observe_verdict(verdict(0), 1)
    for k in range(1, 6):
        window(t2, "other", k, 2)
    assert t2.due(3, caught_up=True) == []


def test_a_late_verdict_is_ignored_and_a_new_one_reopens_with_new_ids() -> None:
    t = tracker()
    first = t.observe_verdict(verdict(0), 1)[0]
    for k in (1, 2):
        window(t, "j1", k, 2)
    resolved = t.due(3, caught_up=True)[0]
    assert t.observe_verdict(verdict(1), 4) == []          # window before the resolution point: late
    assert t.late_verdicts == 1
    again = t.observe_verdict(verdict(5), 5)
    assert [n.event for n in again] == ["opened"] and again[0].occurrence == 2
    assert len({first.notification_id, resolved.notification_id, again[0].notification_id}) == 3


def test_reminders_at_the_interval_while_open() -> None:
    t = tracker(reminder_ns=30 * 60 * S, stale_ns=86400 * S)
    t.observe_verdict(verdict(0), now_ns=T0)
    assert t.due(T0 + 29 * 60 * S, caught_up=True) == []
    r1 = t.due(T0 + 30 * 60 * S, caught_up=True)
    r2 = t.due(T0 + 61 * 60 * S, caught_up=True)
    assert [(n.event, n.sequence) for n in r1 + r2] == [("reminder", 1), ("reminder", 2)]
    assert r1[0].notification_id != r2[0].notification_id


def test_a_job_that_stops_sending_resolves_by_wall_clock() -> None:
    t = tracker(stale_ns=120 * S)
    t.observe_verdict(verdict(0), now_ns=T0)
    assert t.due(T0 + 119 * S, caught_up=True) == []
    assert t.due(T0 + 200 * S, caught_up=False) == []       # not while a backlog is being read
    n = t.due(T0 + 121 * S, caught_up=True)
    assert [(x.event, x.resolution) for x in n] == [("resolved", "stale")]
    assert TrackerSettings(resolve_after=3).stale_after(W) == 300 * S  # auto: at least 5 min
    assert TrackerSettings(resolve_after=3).stale_after(600 * S) == 3600 * S


def test_pending_incidents_end_silently_and_filters_apply() -> None:
    t = tracker(components=("nic",))
    assert t.observe_verdict(verdict(0, 0.99), 1) == [] and t.filtered_verdicts == 1
    t = tracker()
    t.observe_verdict(verdict(0, 0.3), 1)
    for k in (1, 2):
        window(t, "j1", k, 2)
    assert t.due(3, caught_up=True) == []
    assert next(iter(t.incidents.values())).status == "resolved"


def test_state_round_trips_and_skips_delivered(tmp_path) -> None:
    settings = TrackerSettings(resolve_after=2, reminder_ns=0)
    state = AlertState.load(tmp_path / "s.json", settings, "g")
    opened = state.tracker.observe_verdict(verdict(0), 1)
    assert state.enqueue(opened) == 1 and state.enqueue(opened) == 0
    state.mark(opened[0], "accepted", 2)
    state.save(3)
    again = AlertState.load(tmp_path / "s.json", settings)
    assert again.group == "g" and not again.outbox and opened[0].notification_id in again.delivered
    # a notification regenerated after a restart is not queued again
    assert again.enqueue(opened) == 0
    for k in (1, 2):
        window(again.tracker, "j1", k, 4)
    resolved = again.tracker.due(5, caught_up=True)
    assert again.enqueue(resolved) == 1
    again.save(6)
    third = AlertState.load(tmp_path / "s.json", settings)
    assert [n.event for n in third.outbox] == ["resolved"]   # undelivered work survives a restart
    assert not list(tmp_path.glob(".*.tmp"))


def test_the_state_file_is_locked_and_a_corrupt_one_is_an_error(tmp_path) -> None:
    from eroica.sinks.alerts.state import StateLockedError

    a = AlertState.load(tmp_path / "s.json", TrackerSettings())
    a.lock()
    b = AlertState.load(tmp_path / "s.json", TrackerSettings())
    with pytest.raises(StateLockedError):
        b.lock()
    a.unlock()
    b.lock()
    b.unlock()
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        AlertState.load(tmp_path / "bad.json", TrackerSettings())
