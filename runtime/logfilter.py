"""Rate-limited logging of repeated messages (a broker that is away must not flood the logs).

While the broker is down, aiokafka (the faust workers) and librdkafka (the
sink) report every failed reconnect, several times a second per connection:
22 KB/s of log was measured. :class:`RepeatFilter`, installed on the log
handlers of ``eroica worker`` and ``eroica sink``, lets the first record of a
kind through (kind = logger name, level and message template), then at most
one every ``interval_s``, with the count of the ones dropped in between
appended (``[37 similar messages suppressed in 30 s]``). Records of level
``CRITICAL`` always pass.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

__all__ = ["RepeatFilter", "install", "DEFAULT_INTERVAL_S"]

DEFAULT_INTERVAL_S = 30.0
_MAX_KINDS = 4096  # bound the table itself (templates with inline values would grow it)


class RepeatFilter(logging.Filter):
    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._seen: dict[tuple[str, int, str], list[float | int]] = {}  # kind -> [last passed at, suppressed]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.CRITICAL or self.interval_s <= 0:
            return True
        kind = (record.name, record.levelno, str(record.msg)[:200])
        now = self.clock()
        entry = self._seen.get(kind)
        if entry is None:
            if len(self._seen) >= _MAX_KINDS:
                self._seen.clear()
            self._seen[kind] = [now, 0]
            return True
        if now - float(entry[0]) < self.interval_s:
            entry[1] = int(entry[1]) + 1
            return False
        suppressed = int(entry[1])
        entry[0], entry[1] = now, 0
        if suppressed:
            record.msg = f"{record.msg} [{suppressed} similar messages suppressed in {self.interval_s:.0f} s]"
        return True


def install(interval_s: float | None = None, logger: logging.Logger | None = None) -> RepeatFilter | None:
    """Add one shared filter to every handler of ``logger`` (the root logger); idempotent.

    ``EROICA_LOG_REPEAT_S`` sets the interval (0 turns the filter off).
    """
    if interval_s is None:
        try:
            interval_s = float(os.environ.get("EROICA_LOG_REPEAT_S") or DEFAULT_INTERVAL_S)
        except ValueError:
            interval_s = DEFAULT_INTERVAL_S
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
