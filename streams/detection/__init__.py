"""The detection core: pure functions over numpy arrays (no Kafka, no ClickHouse, no clock).

``analyze`` runs it over batches from the reader; the streaming detector feeds
the same :class:`WindowAssembler` and :func:`detect_window` from Kafka.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from eroica.models.digest import WindowDigest
from eroica.models.reader import Batch
from eroica.models.verdict import Verdict

from .detector import detect, detect_step, detect_window
from .history import JobHistory
from .summarise import digest_window
from .windows import JobWindow, WindowAssembler

DEFAULT_WINDOW_S = 30.0

__all__ = [
    "DEFAULT_WINDOW_S", "JobHistory", "JobWindow", "WindowAssembler", "analyze", "analyze_windows", "detect",
    "detect_step",
    "detect_window", "digest_window",
]


def analyze_windows(batches: Iterable[Batch], window_ns: int, detected_at_ns: int = 0,
                    lateness_ns: int | None = None) -> Iterator[tuple[WindowDigest, list[Verdict]]]:
    """Each complete job window's digest and verdicts, as soon as the window completes.

    ``lateness_ns`` (default: one window) is how far past a window's end the
    event-time watermark must move before it is analysed; input in time order
    then needs only about two windows in memory.
    """
    asm = WindowAssembler(window_ns, window_ns if lateness_ns is None else lateness_ns)
    histories: dict[str, JobHistory] = {}

    def run(w: JobWindow) -> tuple[WindowDigest, list[Verdict]]:
        d = digest_window(w)
        verdicts, histories[w.job] = detect_step(d, w.meta, histories.get(w.job), detected_at_ns)
        return d, verdicts

    for batch in batches:
        for job in batch.jobs:
            asm.add_meta(job)
        for cols in batch.columns.values():
            asm.add(cols)
        for w in asm.complete():
            yield run(w)
    for w in asm.flush():
        yield run(w)


def analyze(batches: Iterable[Batch], window_ns: int, detected_at_ns: int = 0,
            lateness_ns: int | None = None) -> Iterator[Verdict]:
    """Verdicts for every complete window of every job (see :func:`analyze_windows`)."""
    for _digest, verdicts in analyze_windows(batches, window_ns, detected_at_ns, lateness_ns):
        yield from verdicts
