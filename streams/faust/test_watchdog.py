"""The recovery watchdog's decision (``watchdog.stalled``) on a stand-in for faust's Recovery service."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eroica.streams.faust.watchdog import RECOVERY_STALL_S, stalled


@dataclass
class FakeRecovery:
    """The attributes of ``faust.tables.recovery.Recovery`` that ``stalled`` reads."""

    in_recovery: bool = True
    remaining: dict[str, Any] = field(default_factory=dict)  # tp -> stats, as active_stats() returns
    _recovery_started_at: float | None = 100.0
    _active_events_received_at: dict[str, float] = field(default_factory=dict)

    def active_stats(self) -> dict[str, Any]:
        return self.remaining


def test_a_recovery_with_offsets_left_and_no_event_for_the_bound_is_stalled() -> None:
    r = FakeRecovery(remaining={"changelog/1": 3})
    assert stalled(r, 100.0 + RECOVERY_STALL_S - 0.1) is None
    assert stalled(r, 100.0 + RECOVERY_STALL_S + 5) == RECOVERY_STALL_S + 5


def test_an_event_on_a_partition_still_to_read_is_progress_and_one_elsewhere_is_not() -> None:
    r = FakeRecovery(remaining={"changelog/1": 3}, _active_events_received_at={"changelog/1": 125.0})
    assert stalled(r, 140.0) is None  # 15 s since its last event
    assert stalled(r, 160.0) == 35.0
    r = FakeRecovery(remaining={"changelog/1": 3}, _active_events_received_at={"changelog/0": 199.0})
    assert stalled(r, 200.0) == 100.0  # changelog/0 is done: its events say nothing of changelog/1


def test_no_recovery_or_nothing_left_to_read_is_never_stalled() -> None:
    assert stalled(FakeRecovery(in_recovery=False, remaining={"changelog/1": 3}), 1e6) is None
    assert stalled(FakeRecovery(remaining={}), 1e6) is None
    assert stalled(FakeRecovery(remaining={"changelog/1": 3}, _recovery_started_at=None), 1e6) is None
