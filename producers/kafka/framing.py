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


class FrameAccumulator:
    """Cuts full frames across batches, holding each key's remainder for the next batch.

    A reader batch of 64k records over 64 ranks gives ~1024 records per rank:
    cut alone, that is a frame of 1000 and one of 24, and consumers pay per
    message (streaming-notes.md: 100 records per message is ~5x slower to
    process than 1000). Holding at most ``max_records - 1`` records per key
    keeps memory bounded; :meth:`drain` emits the remainders at the end.
    """

    def __init__(self, max_records: int = DEFAULT_FRAME_RECORDS) -> None:
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        self.max_records = max_records
        self._pending: dict[tuple[str, str], FrameSlice] = {}

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
            full = len(part) - len(part) % size
            for lo in range(0, full, size):
                yield FrameSlice(key, job, rank, node, part.take(slice(lo, lo + size)))
            if full < len(part):
                rest = compact_vocab(part.take(slice(full, len(part))))
                self._pending[(cols.type, key)] = FrameSlice(key, job, rank, node, rest)

    def drain(self) -> Iterator[FrameSlice]:
        """The held remainders, one short frame per key; the accumulator is empty afterwards."""
        pending, self._pending = self._pending, {}
        yield from pending.values()
