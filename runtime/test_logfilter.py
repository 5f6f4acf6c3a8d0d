"""RepeatFilter: one line per kind of message per interval, with the count of those left out."""

from __future__ import annotations

import logging

from eroica.runtime.logfilter import RepeatFilter


def test_repeated_messages_are_rate_limited_with_a_count() -> None:
    now = [0.0]
    f = RepeatFilter(30.0, clock=lambda: now[0])

    def rec(msg: str, *args: object, name: str = "aiokafka.conn", level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, args, None)

    passed = [f.filter(rec("Unable connect to node %s: %s", 1, "refused")) for _ in range(100)]
    assert passed == [True] + [False] * 99
    assert f.filter(rec("other message"))  # another kind passes
    assert f.filter(rec("Unable connect to node %s: %s", 1, "x", name="other.logger"))
    assert f.filter(rec("boom", level=logging.CRITICAL)) and f.filter(rec("boom", level=logging.CRITICAL))
    now[0] = 30.0
    r = rec("Unable connect to node %s: %s", 1, "refused")
    assert f.filter(r) and "[99 similar messages suppressed in 30 s]" in r.getMessage()
