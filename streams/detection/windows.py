"""Cut the record stream into (job, window) pieces on event time.

Shared by ``eroica analyze`` and the streaming detector so both see the same
windows: a window is ``[k * W, (k + 1) * W)`` in epoch nanoseconds, whatever
the input order. A window is complete once the job's event-time watermark
(largest timestamp seen) has passed its end by ``lateness_ns``; for input in
time order this keeps only the open windows in memory, whatever the file size.
No wall clock here: idle timeouts belong to the streaming shell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eroica.models.columns import Columns, concat
from eroica.models.records import JobRecord

from .repeats import without_copies
from .steps import MAX_PENDING_WINDOWS

COUNTER_TYPES = ("gpu", "nic", "host")
TYPES = ("fn",) + COUNTER_TYPES
# A window's continuations: the parts of finished spans that started in an earlier
# window and reach into this one (fn records, :func:`continuations`), kept apart
# from the window's own records.
CONT = "cont"


@dataclass
class JobWindow:
    """Everything known about one job in one window."""

    job: str
    start_ns: int
    end_ns: int
    columns: dict[str, Columns]
    meta: JobRecord | None = None
    repeated: int = 0  # copies of records delivered twice, dropped on release (see .repeats)

    def get(self, type_: str) -> Columns | None:
        return self.columns.get(type_)

    @property
    def records(self) -> int:
        """Records received for this window (continuations are derived from earlier windows' records)."""
        return sum(len(c) for t, c in self.columns.items() if t != CONT)


# A batch's (job, window) pieces are found by a counting sort of their slots in a table of every
# (job, window) of its range while it has at most this many (16 bits: numpy's radix sort); past it, by np.unique.
_TABLE_SLOTS = 1 << 16


def split(cols: Columns, window_ns: int) -> dict[tuple[str, int], Columns]:
    """Split a batch by (job, window index), pieces in (job code, window) order, each in record order.

    A batch of one job in one window (most: frames are short next to a
    window) is itself, found by four reductions: no division per record,
    no sort. Records in time order (a file, a frame) fall in runs of one
    window: then each piece is a slice of the batch (a view, no copy).
    Otherwise the pieces are found by one radix sort of their (job, window)
    slots, where ``np.unique`` took a sort and a stable argsort.
    """
    if not len(cols):
        return {}
    ts = cols.arrays["ts_ns"]
    job = cols.arrays["job"]
    lo, hi = int(ts.min()) // window_ns, int(ts.max()) // window_ns
    j_lo, j_hi = int(job.min()), int(job.max())
    jobs = cols.vocab["job"]
    if lo == hi and j_lo == j_hi:
        return {(jobs[j_lo], lo): cols}
    win = ts // window_ns
    width = hi - lo + 1
    if (j_hi - j_lo + 1) * width > _TABLE_SLOTS:
        return _split_by_unique(cols, job, win, jobs)
    slot = win - lo  # int64, a fresh array
    if j_hi > j_lo:
        slot += (job.astype(np.int64) - j_lo) * width
    out: dict[tuple[str, int], Columns] = {}
    if bool((slot[1:] >= slot[:-1]).all()):  # runs in slot order: each piece a slice
        cuts = np.flatnonzero(slot[1:] != slot[:-1]) + 1
        edges = [0, *cuts.tolist(), slot.size]
        for a, b in zip(edges[:-1], edges[1:]):
            k = int(slot[a])
            out[(jobs[j_lo + k // width], lo + k % width)] = cols.take(slice(a, b))
        return out
    order = np.argsort(slot.astype(np.uint16), kind="stable")  # a radix sort: each piece in record order
    counts = np.bincount(slot, minlength=(j_hi - j_lo + 1) * width)
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    for k in np.flatnonzero(counts).tolist():
        out[(jobs[j_lo + k // width], lo + k % width)] = cols.take(order[bounds[k]:bounds[k + 1]])
    return out


def _split_by_unique(cols: Columns, job: np.ndarray, win: np.ndarray, jobs: list[str]) -> dict[tuple[str, int], Columns]:
    """:func:`split` where the batch's (job, window) range is too wide for a table: by ``np.unique``."""
    base = int(win.min())
    key = job.astype(np.int64) * (1 << 40) + (win - base)
    uniq, inverse = np.unique(key, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(uniq.size + 1))
    out: dict[tuple[str, int], Columns] = {}
    for g, k in enumerate(uniq):
        idx = order[bounds[g]:bounds[g + 1]]
        out[(jobs[int(k >> 40)], base + int(k & ((1 << 40) - 1)))] = cols.take(idx)
    return out


def continuations(fn: Columns, window_ns: int) -> Columns | None:
    """One record per later window each finished span reaches into, starting at that window's start.

    Why: records go to the window of their start, and the summariser clips
    each span at its window's end, because what an enclosing frame covers
    after that end is covered by records of the next window, which it does
    not see. Clipped and nothing more, the span's own (exclusive) time past
    the end was lost: a 30 s GC pause crossing a window's end read as
    0-10 s, and a step frame's gaps after its first window as nothing. A
    continuation carries the span into each later window it covers, where
    it encloses the records it covers there and is credited with the rest
    (:func:`.patterns.summarise_fn`), without counting as a call. In-flight
    records have no end to carry.
    """
    if not len(fn):
        return None
    a = fn.arrays
    start = a["ts_ns"]
    # most frames: every record ends inside the window the earliest starts in (three reductions)
    if int(start.max()) + int(a["dur_ns"].max()) <= (int(start.min()) // window_ns + 1) * window_ns:
        return None
    end = start + np.maximum(a["dur_ns"], 0)
    first = start // window_ns + 1
    # At most MAX_PENDING_WINDOWS windows on: no job window holds more, so a span's time
    # past them could never be compared, and a contract-valid one-week span would
    # otherwise open 20,160 windows (604,800 at 1 s windows) of continuations.
    n = np.minimum((end - 1) // window_ns - first + 1, MAX_PENDING_WINDOWS)
    n[a["in_flight"] | (n < 0)] = 0
    if not n.any():
        return None
    idx = np.repeat(np.arange(n.size), n)
    win = first[idx] + (np.arange(idx.size) - np.repeat(np.cumsum(n) - n, n))
    out = fn.take(idx)
    out.arrays["ts_ns"] = win * window_ns
    out.arrays["dur_ns"] = end[idx] - out.arrays["ts_ns"]
    return out


@dataclass
class WindowAssembler:
    """Buffers records per (job, window) and releases windows once complete."""

    window_ns: int
    lateness_ns: int = 0
    _parts: dict[tuple[str, int], dict[str, list[Columns]]] = field(default_factory=dict)
    _watermark: dict[str, int] = field(default_factory=dict)
    _meta: dict[str, JobRecord] = field(default_factory=dict)
    _closed: dict[str, int] = field(default_factory=dict)  # job -> highest window index emitted
    late_records: int = 0
    repeated_records: int = 0  # copies of records already in their window (delivered twice), dropped

    def add_meta(self, job: JobRecord) -> None:
        self._meta[job.job] = job

    def add(self, cols: Columns) -> int:
        """Buffer records in their windows; returns the last window their spans reach (-1: none past their own)."""
        reach = self.add_continuations(cols)
        for (job, win), part in split(cols, self.window_ns).items():
            if win <= self._closed.get(job, -1):
                self.late_records += len(part)  # its window was already analysed
                continue
            self._parts.setdefault((job, win), {}).setdefault(cols.type, []).append(part)
            hi = int(part.arrays["ts_ns"].max())
            if hi > self._watermark.get(job, -1):
                self._watermark[job] = hi
        return reach

    def add_continuations(self, cols: Columns) -> int:
        """Buffer the continuations of ``cols`` (fn records) in the windows they reach; :meth:`add` does this.

        Derived from records of earlier windows, they are never late records
        and never move the watermark. Returns the last window index they
        reach (-1: none): a record is not fully summarised before that
        window is.
        """
        cont = continuations(cols, self.window_ns) if cols.type == "fn" else None
        if cont is None:
            return -1
        for (job, win), part in split(cont, self.window_ns).items():
            if win > self._closed.get(job, -1):
                self._parts.setdefault((job, win), {}).setdefault(CONT, []).append(part)
        return int(cont.arrays["ts_ns"].max()) // self.window_ns

    def complete(self) -> list[JobWindow]:
        """Windows whose end the watermark has passed by ``lateness_ns``, oldest first."""
        ready = [
            k for k in self._parts
            if (k[1] + 1) * self.window_ns + self.lateness_ns <= self._watermark.get(k[0], -1)
        ]
        return [self._release(k) for k in sorted(ready, key=lambda k: (k[0], k[1]))]

    def flush(self, job: str | None = None) -> list[JobWindow]:
        """Every buffered window (of one job, or all): end of input."""
        keys = sorted(k for k in self._parts if job is None or k[0] == job)
        return [self._release(k) for k in keys]

    def pending_jobs(self) -> list[str]:
        return sorted({k[0] for k in self._parts})

    def _release(self, key: tuple[str, int]) -> JobWindow:
        job, win = key
        parts = self._parts.pop(key)
        self._closed[job] = max(self._closed.get(job, -1), win)
        columns = {}
        repeated = 0
        for t, p in parts.items():
            # one copy of each record delivered twice (at-least-once producers): see .repeats
            columns[t], dropped = without_copies(concat(p))
            if t != CONT:  # continuations are derived from records already counted
                repeated += dropped
        self.repeated_records += repeated
        return JobWindow(job, win * self.window_ns, (win + 1) * self.window_ns, columns, self._meta.get(job), repeated)
