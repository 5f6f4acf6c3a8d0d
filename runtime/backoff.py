"""Exponential backoff: how long to wait after the n-th failure in a row (one formula for every retry).

The consume loop's retries (:mod:`eroica.kafka.loop`, for the sink and the alert
consumer), ClickHouse's retry policy (:mod:`eroica.sinks.clickhouse.config`) and
the stack's restarts of a crashed child (:mod:`eroica.stack.local`) all wait
``initial_s``, then twice as long after each further failure, never more than
``max_s``. No jitter: each of those waits is taken by one process on its own
(one consumer's write, one supervisor's child), not by a fleet of clients
that would all come back at the same instant.
"""

from __future__ import annotations

__all__ = ["INITIAL_S", "MAX_S", "delay"]

# The defaults are the consume loop's: a write that failed because ClickHouse or the webhook
# blinked is tried again within half a second, and a store that stays away is asked at most every
# 30 s, so that once it is back the backlog (its partitions paused meanwhile) drains within 30 s.
INITIAL_S = 0.5
MAX_S = 30.0


def delay(failures: int, initial_s: float = INITIAL_S, max_s: float = MAX_S, factor: float = 2.0) -> float:
    """The wait after ``failures`` failed tries in a row: ``min(max_s, initial_s * factor ** (failures - 1))``.

    ``failures`` counts from 1 (the first wait is ``initial_s``); 0 or less is taken as 1. A retry
    that goes on for ever (the sink while ClickHouse is away) stays at ``max_s``: past about a
    thousand failures ``factor ** n`` no longer fits a float, and the wait is ``max_s`` then too.
    """
    try:
        return min(max_s, initial_s * factor ** max(0, failures - 1))
    except OverflowError:
        return max_s
