"""The detection core: pure functions over numpy arrays (no Kafka, no ClickHouse, no clock).

``analyze`` runs it over batches from the reader; the streaming detector feeds
the same :class:`WindowAssembler` and :func:`detect_window` from Kafka.
"""

from __future__ import annotations

from typing import Iterable, Iterator

from eroica.models.digest import WindowDigest
from eroica.models.reader import Batch
from eroica.models.records import JobRecord
from eroica.models.verdict import Verdict

from .detector import detect, detect_step, detect_window, flush_job
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
    """Each time window's digest, with the verdicts of the job window it completed (if any).

    A time window completes a *job window* once the job's pending windows hold
    enough whole steps (see :mod:`.steps`); results are yielded one window
    late per job, so the end-of-input flush can attach its verdicts to the
    job's last window.

    ``lateness_ns`` (default: one window) is how far past a window's end the
    event-time watermark must move before it is analysed; input in time order
    then needs only about two windows in memory.
    """
    asm = WindowAssembler(window_ns, window_ns if lateness_ns is None else lateness_ns)
    histories: dict[str, JobHistory] = {}
    metas: dict[str, JobRecord | None] = {}

    def run(w: JobWindow) -> tuple[WindowDigest, list[Verdict]]:
        d = digest_window(w)
        metas[w.job] = w.meta
        verdicts, histories[w.job] = detect_step(d, w.meta, histories.get(w.job), detected_at_ns)
        return d, verdicts

    held: dict[str, tuple[WindowDigest, list[Verdict]]] = {}  # each job's latest window, yielded one late

    def hold(result: tuple[WindowDigest, list[Verdict]]) -> Iterator[tuple[WindowDigest, list[Verdict]]]:
        job = result[0].job
        if job in held:
            yield held[job]
        held[job] = result

    def each(windows: list[JobWindow]) -> Iterator[tuple[WindowDigest, list[Verdict]]]:
        # Popped, not iterated: a loop variable would keep the last window's
        # records (a whole window's columns) alive until the next release,
        # a third window in memory beside the one filling and the one released.
        windows.reverse()
        while windows:
            yield from hold(run(windows.pop()))

    for batch in batches:
        for job in batch.jobs:
            asm.add_meta(job)
        for cols in batch.columns.values():
            asm.add(cols)
        yield from each(asm.complete())
    yield from each(asm.flush())
    # End of input: time windows still waiting for whole steps are analysed with
    # what they hold (the streaming detector does the same when every key has
    # ended); their verdicts go with the job's last window.
    for job_id, (digest, verdicts) in sorted(held.items()):  # job_id: `job` above is a JobRecord
        h = histories[job_id]
        if h.pending:
            more, histories[job_id] = flush_job(metas.get(job_id), h, detected_at_ns)
            verdicts = verdicts + more
        yield digest, verdicts


def analyze(batches: Iterable[Batch], window_ns: int, detected_at_ns: int = 0,
            lateness_ns: int | None = None) -> Iterator[Verdict]:
    """Verdicts for every complete window of every job (see :func:`analyze_windows`)."""
    for _digest, verdicts in analyze_windows(batches, window_ns, detected_at_ns, lateness_ns):
        yield from verdicts
