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


def test_librdkafka_lines_are_limited_per_level_and_facility() -> None:
    from eroica.runtime.logfilter import RateLimitedLogger

    now = [0.0]
    seen: list[str] = []

    class Target(logging.Logger):
        def log(self, level: int, msg: object, *args: object, **kwargs: object) -> None:  # type: ignore[override]
            seen.append(str(msg) % args)

    limited = RateLimitedLogger(Target("librdkafka"), interval_s=30.0, clock=lambda: now[0])
    for _ in range(5):
        limited.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
    limited.log(logging.WARNING, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "other level")
    limited.log(logging.ERROR, "%s [%s] %s", "CONFWARN", "rdkafka#consumer-1", "other facility")
    assert seen == ["FAIL [rdkafka#consumer-1] Connection refused", "FAIL [rdkafka#consumer-1] other level",
                    "CONFWARN [rdkafka#consumer-1] other facility"]
    now[0] = 30.0
    limited.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#consumer-1", "Connection refused")
    assert seen[-1] == "FAIL [rdkafka#consumer-1] Connection refused [4 similar messages suppressed in 30 s]"


def test_the_interval_comes_from_the_environment(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from eroica.runtime.logfilter import DEFAULT_INTERVAL_S, interval_from_env

    monkeypatch.setenv("EROICA_LOG_REPEAT_S", "5")
    assert interval_from_env() == 5.0
    monkeypatch.setenv("EROICA_LOG_REPEAT_S", "soon")
    assert interval_from_env() == DEFAULT_INTERVAL_S
