"""Cut a columnar batch into Kafka frames of one key each (pure: no Kafka here).

A frame holds records of one ``(job, rank)`` (fn, gpu) or, for counters that
belong to a node rather than a rank, one ``(job, node)`` (nic, host). The
Kafka key is ``job/rank`` or ``job/node``: one key's frames land on one
partition in order, so a consumer sees each rank's records in the order the
collector produced them, and its end-of-stream marker after them.

Grouping is a stable numpy argsort on a combined integer key: no per-record
Python, and input order is kept within each key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np

from eroica.models.columns import Columns, concat
from eroica.models.frames import compact_vocab

DEFAULT_FRAME_RECORDS = 1000

# Record types whose frames are keyed by node instead of rank.
NODE_LEVEL = frozenset({"nic", "host"})


@dataclass(frozen=True)
class FrameSlice:
    """One frame to send: its key, who it belongs to, and its records.

    ``rank`` is -1 for node-level frames, ``node`` is "" for rank-level ones
    (a rank-level frame may in principle mix nodes if a collector moved a rank).
    """

    key: str
    job: str
    rank: int
    node: str
    cols: Columns


def frame_key(job: str, rank: int = -1, node: str = "") -> str:
    """The Kafka key of a rank (``job/rank``) or, when ``rank`` < 0, of a node (``job/node``).

    Keys only choose partitions; consumers read job, rank and node from the
    frame itself, so a node named like a rank number is harmless.
    """
    return f"{job}/{rank}" if rank >= 0 else f"{job}/{node}"


def _groups(cols: Columns) -> Iterator[tuple[str, str, int, str, np.ndarray]]:
    """``(key, job, rank, node, row indices)`` per key, rows in input order."""
    n = len(cols)
    if n == 0:
        return
    job = cols.arrays["job"].astype(np.int64)
    node_level = cols.type in NODE_LEVEL
    second = (cols.arrays["node"] if node_level else cols.arrays["rank"]).astype(np.int64)
    combined = job * (int(second.max()) + 1) + second
    order = np.argsort(combined, kind="stable")
    sorted_keys = combined[order]
    starts = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    ends = np.r_[starts[1:], n]
    jobs, nodes = cols.vocab["job"], cols.vocab["node"]
    for start, end in zip(starts.tolist(), ends.tolist()):
        first = int(order[start])
        job_name = jobs[int(cols.arrays["job"][first])]
        if node_level:
            rank, node = -1, nodes[int(cols.arrays["node"][first])]
        else:
            rank, node = int(cols.arrays["rank"][first]), ""
        yield frame_key(job_name, rank, node), job_name, rank, node, order[start:end]


def split_frames(cols: Columns, max_records: int = DEFAULT_FRAME_RECORDS) -> Iterator[FrameSlice]:
    """Frames of at most ``max_records`` records of one key, keys in sorted code order.

    Each key's last frame may be short: to cut full frames from a stream of
    batches, use :class:`FrameAccumulator`.
    """
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    for key, job, rank, node, rows in _groups(cols):
        for lo in range(0, len(rows), max_records):
            yield FrameSlice(key, job, rank, node, cols.take(rows[lo:lo + max_records]))


def _time_cuts(ts: np.ndarray, size: int, span_ns: int) -> list[int]:
    """Frame boundaries over one key's records: at most ``size`` records and ``span_ns`` of event time each.

    Returns ``[0, b1, ..., bk]``: frames ``[b_i, b_i+1)``; records from ``bk`` on
    are an incomplete frame (fewer than ``size`` and within ``span_ns`` of its
    first record). Spans are measured on the running maximum of ``ts`` (input
    order is kept), one ``searchsorted`` per frame.
    """
    run = np.maximum.accumulate(ts) if len(ts) else ts
    cuts = [0]
    lo, n = 0, len(ts)
    while lo < n:
        hi = min(lo + size, int(np.searchsorted(run, run[lo] + span_ns, side="right")))
        if hi == n and hi - lo < size:
            break  # the tail: not yet full, not yet too long
        cuts.append(hi)
        lo = hi
    return cuts


class FrameAccumulator:
    """Cuts full frames across batches, holding each key's remainder for the next batch.

    A reader batch of 64k records over 64 ranks gives ~1024 records per rank:
    cut alone, that is a frame of 1000 and one of 24, and consumers pay per
    message (streaming-notes.md: 100 records per message is ~5x slower to
    process than 1000). Holding at most ``max_records - 1`` records per key
    keeps memory bounded; :meth:`drain` emits the remainders at the end.

    ``max_lag_ns`` also bounds frames in *event time*: no frame spans more than
    ``max_lag_ns``, and once a key's oldest held record is more than
    ``max_lag_ns`` older than the newest record the accumulator has seen (any
    key, any type), it goes out as a short frame, as a live agent flushes on
    count or on time (every 250-500 ms).
    Without it, a sparse stream (2 GPU samples a second) would be held until
    1000 records or the end of the file, and reach a stream processor long
    after the windows it belongs to have closed (streams/faust summariser).
    """

    def __init__(self, max_records: int = DEFAULT_FRAME_RECORDS, max_lag_ns: int | None = None) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        if max_lag_ns is not None and max_lag_ns < 0:
            raise ValueError(f"max_lag_ns must be >= 0, got {max_lag_ns}")
        self.max_records = max_records
        self.max_lag_ns = max_lag_ns
        self._pending: dict[tuple[str, str], FrameSlice] = {}
        self._oldest: dict[tuple[str, str], int] = {}  # event time of each remainder's oldest record
        self._newest = -1

    @property
    def pending_records(self) -> int:
        return sum(len(f.cols) for f in self._pending.values())

    def add(self, cols: Columns) -> Iterator[FrameSlice]:
        """Full frames completed by this batch; the rest waits for the next one."""
        size = self.max_records
        for key, job, rank, node, rows in _groups(cols):
            part = cols.take(rows)
            held = self._pending.pop((cols.type, key), None)
            if held is not None:
                # compact first: concat walks whole vocabularies in Python, and a
                # batch's vocabulary spans every rank's functions and stacks
                part = concat([held.cols, compact_vocab(part)])
            if self.max_lag_ns is None:
                full = len(part) - len(part) % size
                for lo in range(0, full, size):
                    yield FrameSlice(key, job, rank, node, part.take(slice(lo, lo + size)))
            else:
                cuts = _time_cuts(part.arrays["ts_ns"], size, self.max_lag_ns)
                for lo, hi in zip(cuts[:-1], cuts[1:]):
                    yield FrameSlice(key, job, rank, node, part.take(slice(lo, hi)))
                full = cuts[-1]
            if full < len(part):
                rest = compact_vocab(part.take(slice(full, len(part))))
                self._pending[(cols.type, key)] = FrameSlice(key, job, rank, node, rest)
                if self.max_lag_ns is not None:
                    self._oldest[(cols.type, key)] = int(rest.arrays["ts_ns"].min())
            else:
                self._oldest.pop((cols.type, key), None)
        if self.max_lag_ns is not None and len(cols):
            self._newest = max(self._newest, int(cols.arrays["ts_ns"].max()))
            horizon = self._newest - self.max_lag_ns
            for k in [k for k, oldest in self._oldest.items() if oldest < horizon]:
                del self._oldest[k]
                yield self._pending.pop(k)

    def drain(self) -> Iterator[FrameSlice]:
        """The held remainders, one short frame per key; the accumulator is empty afterwards."""
        pending, self._pending = self._pending, {}
        self._oldest = {}
        yield from pending.values()
