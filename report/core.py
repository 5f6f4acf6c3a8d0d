"""The detection core over files, one pass, keeping what the report draws.

The same steps as ``eroica analyze`` (:func:`eroica.streams.detection.analyze`:
a :class:`WindowAssembler` on event time, :func:`digest_window` per complete
window, :func:`detect_step` with the job's history) plus, per window, what the
streaming detector publishes beside its verdicts: the window summaries
(:func:`window_summaries`, the rows of the ``summaries`` table). So a report
from files and a report from ClickHouse show the same numbers, and tests can
publish exactly what the detector would.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from eroica.models.digest import WindowDigest
from eroica.models.reader import Batch
from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict
from eroica.streams.detection import analyze_windows
from eroica.streams.detection.window_summaries import window_summaries

__all__ = ["WindowResult", "run_core"]


@dataclass
class WindowResult:
    """One analysed job window: its digest, its verdicts and its per-(rank, function) summaries."""

    digest: WindowDigest
    verdicts: list[Verdict]
    summaries: list[WindowSummary]

    @property
    def job(self) -> str:
        return self.digest.job

    @property
    def start_ns(self) -> int:
        return self.digest.start_ns

    @property
    def end_ns(self) -> int:
        return self.digest.end_ns


def run_core(batches: Iterable[Batch], window_ns: int, detected_at_ns: int = 0,
             lateness_ns: int | None = None) -> Iterator[WindowResult]:
    """Every complete window of every job, in completion order (see ``analyze`` for ``lateness_ns``)."""
    for digest, verdicts in analyze_windows(batches, window_ns, detected_at_ns, lateness_ns):
        yield WindowResult(digest, verdicts, window_summaries(digest) if len(digest.ranks) else [])
