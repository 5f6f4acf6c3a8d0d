"""Rate-limited logging of repeated messages (a broker that is away must not flood the logs).

While the broker is down, aiokafka (the faust workers) and librdkafka (the
sink) report every failed reconnect, several times a second per connection:
22 KB/s of log was measured. :class:`RepeatFilter`, installed on the log
handlers of ``eroica worker`` and ``eroica sink``, lets the first record of a
kind through (kind = logger name, level and message template), then at most
one every ``interval_s``, with the count of the ones dropped in between
appended (``[37 similar messages suppressed in 30 s]``). Records of level
``CRITICAL`` always pass.

:class:`RateLimitedLogger` applies the same rule where no handler of ours is
installed: librdkafka's own log lines (``logger=`` of every confluent-kafka
client, :mod:`eroica.kafka.client`), which a live agent writes into the
training job's log. Its kind is the level and librdkafka's facility
(``FAIL``, ``CONFWARN``...): the message template is the same for all of them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable

__all__ = ["DEFAULT_INTERVAL_S", "RateLimitedLogger", "RepeatFilter", "install", "interval_from_env"]

DEFAULT_INTERVAL_S = 30.0
_MAX_KINDS = 4096  # bound the table itself (templates with inline values would grow it)


class _Repeats:
    """Per kind: the first occurrence passes, then at most one every ``interval_s``; counts the rest."""

    def __init__(self, interval_s: float, clock: Callable[[], float]) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._seen: dict[Hashable, list[float | int]] = {}  # kind -> [last passed at, suppressed]

    def admit(self, kind: Hashable) -> int | None:
        """None: drop this one; else it passes, and the int is how many were dropped since the last."""
        if self.interval_s <= 0:
            return 0
        now = self.clock()
        entry = self._seen.get(kind)
        if entry is None:
            if len(self._seen) >= _MAX_KINDS:
                self._seen.clear()
            self._seen[kind] = [now, 0]
            return 0
        if now - float(entry[0]) < self.interval_s:
            entry[1] = int(entry[1]) + 1
            return None
        suppressed = int(entry[1])
        entry[0], entry[1] = now, 0
        return suppressed

    def note(self, suppressed: int) -> str:
        return f" [{suppressed} similar messages suppressed in {self.interval_s:.0f} s]" if suppressed else ""


class RepeatFilter(logging.Filter):
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self._repeats = _Repeats(interval_s, clock)

    @property
    def interval_s(self) -> float:
        return self._repeats.interval_s

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL:
            return True
        suppressed = self._repeats.admit((record.name, record.levelno, str(record.msg)[:200]))
        if suppressed is None:
            return False
        if suppressed:
            record.msg = f"{record.msg}{self._repeats.note(suppressed)}"
        return True


class RateLimitedLogger:
    """A ``logger`` for confluent-kafka clients: one line per (level, facility) every ``interval_s``.

    librdkafka calls ``log(level, "%s [%s] %s", facility, client name, message)``
    for every failed reconnect, several a second while a broker is away. The
    first line of a kind passes, then at most one every ``interval_s``
    (default: ``EROICA_LOG_REPEAT_S``, 30 s; 0 lets every line through), with
    the count of those dropped in between.
    """

    def __init__(self, target: logging.Logger, interval_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.target = target
        self._repeats = _Repeats(interval_from_env() if interval_s is None else interval_s, clock)

    def log(self, level: int, msg: str, *args: object) -> None:
        suppressed = self._repeats.admit((level, str(args[0]) if args else msg))
        if suppressed is not None:
            self.target.log(level, msg + self._repeats.note(suppressed), *args)


def interval_from_env() -> float:
    """``EROICA_LOG_REPEAT_S`` (seconds; 0: no limit), :data:`DEFAULT_INTERVAL_S` when unset or not a number."""
    try:
        return float(os.environ.get("EROICA_LOG_REPEAT_S") or DEFAULT_INTERVAL_S)
    except ValueError:
        return DEFAULT_INTERVAL_S


def install(interval_s: float | None = None, logger: logging.Logger | None = None) -> RepeatFilter | None:
    """Add one shared filter to every handler of ``logger`` (the root logger); idempotent.

    ``EROICA_LOG_REPEAT_S`` sets the interval (0 turns the filter off).
    """
    if interval_s is None:
        interval_s = interval_from_env()
    if interval_s <= 0:
        return None
    target = logger or logging.getLogger()
    shared: RepeatFilter | None = None
    for h in target.handlers:
        for f in h.filters:
            if isinstance(f, RepeatFilter):
                shared = f
    shared = shared or RepeatFilter(interval_s)
    for h in target.handlers:
        if shared not in h.filters:
            h.addFilter(shared)
    return shared
