"""Persistence: a streak counts windows of one culprit's observation, whichever counter
reading named its component (``detector._stabilise``)."""

from __future__ import annotations

import msgspec

from .detector import PERSIST_WINDOWS, UNCONFIRMED_CAP, _stabilise
from .findings import Finding
from .history import JobHistory


def slow(component: str, rank: int = 2, confidence: float = 0.8, fn: str = "Stage.forward") -> Finding:
    return Finding(kind="slow", component=component, scope="rank", node="n0", rank=rank, fn=fn,
                   confidence=confidence, culprits=[rank])


def confidences(windows: list[list[Finding]]) -> list[list[float]]:
    """Run the findings of consecutive windows through persistence; each window's confidences."""
    history, out = JobHistory(job="j"), []
    for findings in windows:
        history = msgspec.structs.replace(history, streak=_stabilise(findings, "j", history))
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
