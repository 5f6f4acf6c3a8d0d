"""One backoff for every retry: the schedules its four users had before it, and no overflow."""

from __future__ import annotations

import pytest

from eroica.runtime.backoff import delay


def test_defaults_are_the_consume_loops_half_second_doubling_to_thirty() -> None:
    assert [delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert delay(0) == delay(-3) == 0.5  # the first wait, whatever was counted before it


def test_each_callers_schedule() -> None:
    assert [delay(n, 0.2, 5.0) for n in range(1, 7)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0])  # ClickHouse
    assert [delay(n + 1, 1.0, 60.0) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]  # stack restarts
    assert [delay(n, 0.1, 10.0, factor=3.0) for n in range(1, 4)] == pytest.approx([0.1, 0.3, 0.9])


def test_a_retry_that_goes_on_for_ever_stays_at_the_cap() -> None:
    # The sink retries ClickHouse for ever at 30 s: 2 ** 1100 no longer fits a float.
    assert delay(1_100) == 30.0 and delay(10**6, 0.2, 5.0) == 5.0
