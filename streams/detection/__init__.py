"""The detection core: pure functions over numpy arrays (no Kafka, no ClickHouse, no clock).

``analyze`` runs it over batches from the reader; the streaming detector feeds
the same :class:`WindowAssembler` and :func:`detect_window` from Kafka.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from eroica.models.reader import Batch
from eroica.models.verdict import Verdict

from .detector import detect_window
from .windows import JobWindow, WindowAssembler

DEFAULT_WINDOW_S = 30.0

__all__ = ["DEFAULT_WINDOW_S", "JobWindow", "WindowAssembler", "analyze", "detect_window"]


def analyze(batches: Iterable[Batch], window_ns: int, detected_at_ns: int = 0,
            lateness_ns: int | None = None) -> Iterator[Verdict]:
    """Verdicts for every complete window of every job, as soon as each window completes.

    ``lateness_ns`` (default: one window) is how far past a window's end the
    event-time watermark must move before it is analysed; input in time order
    then needs only about two windows in memory.
    """
    asm = WindowAssembler(window_ns, window_ns if lateness_ns is None else lateness_ns)
    for batch in batches:
        for job in batch.jobs:
            asm.add_meta(job)
        for cols in batch.columns.values():
            asm.add(cols)
        for w in asm.complete():
            yield from detect_window(w, detected_at_ns)
    for w in asm.flush():
        yield from detect_window(w, detected_at_ns)
