"""Which window a job's expected keys are all covered through, kept up to date message by message.

The detector analyses a window once every key the job is expected to have is
covered by a source that closed it, or has ended (``detector_core``). Asked
from scratch, that is a pass over every key of every source per message: with
one source per node (digest mode) a window of N nodes costs O(N^2), ~2 s at
1,024 nodes and minutes at a 100k-GPU job's 12,500 (``bench/edge.py``,
``detector_bookkeeping``). Here each key keeps its *reach*, the furthest
``closed_through_ns`` of any source that lists it (ended keys: forever), and a
min-heap of reaches answers "is every key covered through ``start``": a
message costs O(its own keys x log), and a window O(N log N).

Reaches only grow and windows are asked in order, so a stale heap entry (a key
whose reach has grown since) is popped when it comes up. New sources and keys
join the expected set as they come, and end markers set their keys' reach to
forever. What can make keys *leave* the expected set (the job record, the
first window analysed, which drops the first window's node keys) marks the
structure stale, and the next question rebuilds it in one pass: once or
twice in a job's life. Not persisted: a restored job rebuilds it on first use.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

NEVER = -(1 << 62)   # the reach of a key no source covers yet
FOREVER = 1 << 62    # the reach of a key that has ended


class Coverage:
    """Reach per expected key and their minimum; ``rebuild`` from the job's state, ``advance`` per message."""

    def __init__(self) -> None:
        self.stale = True
        self.expected: set[str] | None = None
        self.reach: dict[str, int] = {}
        self._heap: list[tuple[int, str]] = []

    def invalidate(self) -> None:
        self.stale = True

    def rebuild(self, expected: set[str] | None, sources: Iterable[tuple[Iterable[str], int]],
                ended: Iterable[str]) -> None:
        """From scratch: ``sources`` as (keys, closed_through_ns) pairs."""
        self.expected = expected
        reach: dict[str, int] = {}
        for keys, closed in sources:
            for k in keys:
                if closed > reach.get(k, NEVER):
                    reach[k] = closed
        for k in ended:
            reach[k] = FOREVER
        self.reach = reach
        self._heap = [(reach.get(k, NEVER), k) for k in expected] if expected is not None else []
        heapq.heapify(self._heap)
        self.stale = False

    def advance(self, keys: Iterable[str], closed_through_ns: int) -> None:
        """A source that lists ``keys`` closed its windows through ``closed_through_ns``."""
        if self.stale:
            return  # the next question rebuilds from the state, which already holds this
        reach, heap = self.reach, self._heap
        for k in keys:
            if closed_through_ns > reach.get(k, NEVER):
                reach[k] = closed_through_ns
                heapq.heappush(heap, (closed_through_ns, k))

    def add(self, keys: Iterable[str], closed_through_ns: int) -> None:
        """A new source, or new keys of a source: they become expected (a job's first windows)."""
        if self.stale or self.expected is None:
            return
        expected, heap = self.expected, self._heap
        for k in keys:
            if k not in expected:
                expected.add(k)
                heapq.heappush(heap, (self.reach.get(k, NEVER), k))
        self.advance(keys, closed_through_ns)

    def end(self, keys: Iterable[str]) -> None:
        """End-of-stream markers: these keys are covered through every window."""
        if self.stale:
            return
        for k in keys:
            if self.reach.get(k) != FOREVER:
                self.reach[k] = FOREVER
                heapq.heappush(self._heap, (FOREVER, k))

    def covered_through(self, start_ns: int) -> bool:
        """Every expected key covered through the window starting at ``start_ns`` (False without expectations)."""
        if self.expected is None:
            return False
        heap, reach = self._heap, self.reach
        while heap:
            r, k = heap[0]
            if r >= start_ns:
                return True
            if reach.get(k, NEVER) != r:
                heapq.heappop(heap)  # this key has moved on since: its newer entry is in the heap
                continue
            return False
        return True
