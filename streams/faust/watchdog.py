"""A worker whose faust table recovery stops making progress restarts itself (crash-only).

Found on Apache Kafka 4.1.1 with faust-streaming 0.15.3 and aiokafka 0.14
(``tests/chaos/test_chaos_tables.py``, two detectors sharing the partitions,
the one that owned the job SIGKILLed; 2026-11-26): the survivor's third
rebalance in 20 s assigned it the dead worker's changelog partitions, faust's
recovery built the highwaters (offsets remained to read on
``eroica-detector-jobstate-changelog/1``) and then received no changelog
event at all, logging "No event received for active tp ... since recovery
start" every 30 s for the next two minutes. The streams never resumed: the
job's 8 remaining verdicts were never written (nothing was lost: the input
stayed uncommitted). One test run in four stalled this way; faust's issue
tracker knows the family (recovery hangs after rebalances,
faust-streaming/faust#21, #74). A restarted detector recovers the same
changelog in well under a second (the restart case of the same test, and
patch 4 of ``faustfix.py``: 44 of 44 restarts).

What the logs show of the stall (repeat filter off, ``EROICA_LOG_REPEAT_S=0``):
in the stalled generation faust reads ``changelog/1`` from its start (offset
-1, highwater 8), logs "Resuming flow..." and never "Done reading"; unlike
every recovery that completed, no "Fetcher: Starting..." follows (the
fetcher from the earlier generation is reused). The root cause inside
faust/aiokafka is not found; this module does not depend on it.

So the detector's timer asks :func:`stalled` a few times a second; once the
recovery has had offsets left to read and received nothing for
:data:`RECOVERY_STALL_S`, and the broker answers (a broker that is away is
not a stalled recovery: restarting would not help), the worker logs the
recovery's state and exits with :data:`EXIT_RECOVERY_STALLED`. Its supervisor
(``eroica up``, systemd, Kubernetes) starts it again; its held input was
never acknowledged, so the next owner re-reads it: nothing lost, and verdict
ids are stable, so nothing doubled in the sink.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RECOVERY_STALL_S", "EXIT_RECOVERY_STALLED", "stalled"]

# faust's own warning for a changelog partition with no event fires at 30 s (Recovery.event_timeout_secs).
# A healthy recovery fetches continuously (a fetch returns within fetch_max_wait, 100 ms, when data is
# there), so 30 s of nothing while offsets remain is ~300 empty fetches: the fetch path is dead, not slow.
RECOVERY_STALL_S = 30.0
EXIT_RECOVERY_STALLED = 3


def stalled(recovery: Any, now: float, stall_s: float = RECOVERY_STALL_S) -> float | None:
    """Seconds the table recovery has gone without an event while offsets remain; None when it is not stalled.

    ``recovery``: faust's ``app.tables.recovery`` (its ``in_recovery``, ``active_stats()``, and the monotonic
    times ``_recovery_started_at`` and ``_active_events_received_at``); ``now``: ``time.monotonic()``.
    """
    if not getattr(recovery, "in_recovery", False):
        return None
    remaining = recovery.active_stats()
    started = getattr(recovery, "_recovery_started_at", None)
    if not remaining or started is None:
        return None
    received = getattr(recovery, "_active_events_received_at", {})
    last = max([started, *(t for tp in remaining if (t := received.get(tp)) is not None)])
    idle = now - last
    return idle if idle >= stall_s else None
