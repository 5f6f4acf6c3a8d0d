"""Persistence: a streak counts windows of one culprit's observation, whichever counter
reading named its component (``detector._stabilise``)."""

from __future__ import annotations

import msgspec

from .detector import PERSIST_WINDOWS, SIGN_STEPS, UNCONFIRMED_CAP, _stabilise, evidence_steps
from .findings import Finding
from .history import JobHistory


def slow(component: str, rank: int = 2, confidence: float = 0.8, fn: str = "Stage.forward") -> Finding:
    return Finding(kind="slow", component=component, scope="rank", node="n0", rank=rank, fn=fn,
                   confidence=confidence, culprits=[rank])


def confidences(windows: list[list[Finding]]) -> list[list[float]]:
    """Run the findings of consecutive windows through persistence; each window's confidences."""
    history, out = JobHistory(job="j"), []
    for findings in windows:
        streak, steps = _stabilise(findings, "j", history)
        history = msgspec.structs.replace(history, streak=streak, streak_steps=steps)
        out.append([f.confidence for f in findings])
    return out


def test_a_reading_that_flips_between_windows_still_confirms_the_culprit():
    # host CPU near its saturation threshold: python, host_cpu, python ...
    got = confidences([[slow("python")], [slow("host_cpu")], [slow("python")]])
    assert got[0] == [UNCONFIRMED_CAP]
    assert all(c[0] >= 0.5 for c in got[1:]), got
    got = confidences([[slow("dataloader")], [slow("storage")]])   # iowait near 10%
    assert got[1][0] >= 0.5, got


def test_what_persists_must_be_the_same_culprit_function_and_observation():
    assert PERSIST_WINDOWS == 2
    for second in (slow("host_cpu", rank=3),            # another rank
                   slow("host_cpu", fn="Stage.backward"),  # another function
                   slow("dataloader")):                  # another observation (loader, not host code)
        got = confidences([[slow("python")], [second]])
        assert got[1] == [UNCONFIRMED_CAP], (second, got)


def test_slow_data_loading_on_a_node_persists_whichever_of_its_ranks_stalls_longest():
    # a node's storage is slow: the rank that stalls longest changes from window to window
    got = confidences([[slow("storage", rank=6, fn="DataLoader.__next__")],
                       [slow("storage", rank=2, fn="torch.serialization.save")],
                       [slow("dataloader", rank=7, fn="DataLoader.__next__")]])
    assert got[0] == [UNCONFIRMED_CAP] and all(c[0] >= 0.5 for c in got[1:]), got
    # ... but not across nodes, and host code keeps its own rank (a GC pause is one process's)
    other_node = Finding(kind="slow", component="storage", scope="rank", node="n1", rank=9, fn="DataLoader.__next__",
                         confidence=0.8, culprits=[9])
    assert confidences([[slow("storage", rank=6)], [other_node]])[1] == [UNCONFIRMED_CAP]
    assert confidences([[slow("python", rank=6)], [slow("python", rank=2)]])[1] == [UNCONFIRMED_CAP]


def evidenced(windows: list[list[tuple[Finding, int]]]) -> list[list[float]]:
    """As :func:`confidences`, each finding with the steps that showed it (the sign test's k)."""
    history, out = JobHistory(job="j"), []
    for window in windows:
        findings = [f for f, _ in window]
        streak, steps = _stabilise(findings, "j", history, steps_of={i: k for i, (_, k) in enumerate(window)})
        history = msgspec.structs.replace(history, streak=streak, streak_steps=steps)
        out.append([f.confidence for f in findings])
    return out


def test_steps_that_show_a_finding_confirm_it_within_one_window():
    # a short trace: one window of many steps after the warm-up, a steady level in every one
    assert evidenced([[(slow("python", confidence=0.5), 2 * SIGN_STEPS)]])[0][0] >= 0.5
    # too few steps for two sign-test runs: one confirmation, held below the alarm level
    assert evidenced([[(slow("python", confidence=0.5), 2 * SIGN_STEPS - 1)]]) == [[UNCONFIRMED_CAP]]
    # a weak finding stays weak however many steps show it (three confirmations at most)
    assert evidenced([[(slow("python", confidence=0.2), 100)]])[0][0] < 0.5


def test_steps_count_only_while_the_finding_persists():
    f = slow("python", confidence=0.5)
    # a run of steps interrupted by a window without the finding starts again
    got = evidenced([[(f, SIGN_STEPS)], [], [(slow("python", confidence=0.5), SIGN_STEPS)]])
    assert got[2] == [UNCONFIRMED_CAP], got
    # consecutive windows add their steps (and count as windows themselves)
    got = evidenced([[(slow("python", confidence=0.5), SIGN_STEPS)], [(slow("python", confidence=0.5), SIGN_STEPS)]])
    assert got[1][0] >= 0.5, got


def test_evidence_steps_leave_out_the_warm_up_and_odd_steps():
    steady = slow("python")
    onset = Finding(kind="slow", component="python", scope="rank", rank=2, steady=False, most_steps=True)
    odd = Finding(kind="slow", component="python", scope="rank", rank=2, steady=False, most_steps=False)
    assert evidence_steps(steady, 40, 0) == 40 and evidence_steps(steady, 40, 5) == 35
    assert evidence_steps(onset, 30, 0) == 15 and evidence_steps(onset, 31, 5) == 11
    assert evidence_steps(odd, 120, 0) == 0          # one odd step never confirms anything
    assert evidence_steps(steady, 4, 5) == 0         # a window of warm-up only


def test_sporadic_pauses_are_confirmed_by_windows_not_steps():
    pauses = Finding(kind="slow", component="python", scope="job", fn="host Python pauses", step_evidence=False)
    assert evidence_steps(pauses, 120, 0) == 0
