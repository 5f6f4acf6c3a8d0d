"""GPU-side timings from CUDA events, resolved off the training thread.

The training thread only records two events per timed region (``start`` /
``stop``: a few microseconds, no synchronisation). The tracer's writer thread
later asks each pair whether the GPU has passed it (``query()``, never a
blocking wait) and turns it into a record: the duration is
``start.elapsed_time(end)``, and the start time on the wall clock comes from
an *anchor*: an event recorded on an idle side stream and synchronised by the
writer thread, whose wall time is therefore known to a few microseconds; any
event's wall time is the anchor's plus ``anchor.elapsed_time(event)``. The
anchor is taken when the timer is created and renewed every ``ANCHOR_S``
seconds (GPU and host clocks drift apart slowly), only once every pending
event has been resolved, so an event is never timed against an anchor
recorded after it.

Events are reused: a resolved pair's two events go back to a free list
(at most ``POOL_MAX``) and the next regions record them again, since
creating and destroying a CUDA event per region cost the training thread
measurably on an H100 (``tools/gpu_overhead.py``). An event is only
returned once its times have been read, so a re-record never races a read.

Pending pairs are bounded like the record queue: past ``MAX_PENDING`` the new
pair is dropped and counted. Names get a ``[gpu]`` suffix (``Net.forward[gpu]``,
kind ``kernel``): the same name as the host span would make two kinds of one
function in the detector.

No torch import at module level; everything goes through the ``torch`` object
handed in, so tests drive it with stand-in events.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

ANCHOR_S = 30.0
MAX_PENDING = 20_000
# Free events kept for reuse: a step's regions and DDP buckets resolve within a flush or two, so a few
# hundred cover them; past this the spare ones are simply dropped (freed by CUDA).
POOL_MAX = 512
GPU_SUFFIX = "[gpu]"
# A region started this long ago and never stopped is forgotten by the watermark (the tracer's
# hang limit: a span open that long is a hang, dumped as in_flight).
STALE_START_NS = 60 * 10**9


class CudaTimer:
    """Event pairs for GPU regions; :meth:`resolve` turns finished pairs into tracer records."""

    def __init__(self, torch: Any, device: int | None = None) -> None:
        self.torch = torch
        self.device = torch.cuda.current_device() if device is None else device
        self.pending: deque = deque()
        # host start times of regions not resolved yet (the tracer's declared watermark): started
        # and not stopped (id of the start event -> ns), and stopped but pending (ns -> how many)
        self.open_starts: dict[int, int] = {}
        self.pending_starts: Counter = Counter()
        self.free: deque = deque()  # resolved events, ready to record again (append/pop are atomic)
        self.pool_max = POOL_MAX
        self.dropped = 0
        self.active = True
        self._side_stream = None
        self._anchor: tuple[Any, int] = self._new_anchor()
        self._anchor_at = time.monotonic()

    # -- training thread ---------------------------------------------------------

    def _event(self) -> Any:
        try:
            return self.free.pop()
        except IndexError:
            return self.torch.cuda.Event(enable_timing=True)

    def start(self) -> Any:
        ev = self._event()
        self.open_starts[id(ev)] = time.time_ns()
        ev.record()
        return ev

    def stop(self, start: Any, fn: str, kind: str, step: int, extra: tuple | None = None,
             suffix: bool = True) -> None:
        """Close a region opened by :meth:`start`; ``suffix`` adds ``[gpu]`` (regions that also have a host span)."""
        host_ns = self.open_starts.pop(id(start), None)
        if len(self.pending) >= MAX_PENDING:
            self.dropped += 1
            return
        end = self._event()
        end.record()
        if host_ns is not None:
            self.pending_starts[host_ns] += 1
        self.pending.append((start, end, fn + GPU_SUFFIX if suffix else fn, kind, step, extra, host_ns))

    def oldest_open_ns(self) -> int | None:
        """Host time of the oldest region started and not yet resolved: its GPU time is no earlier.

        Read by the writer thread for the tracer's declared watermark; the
        training thread adds to both maps meanwhile, so they are copied first.
        """
        stale = time.time_ns() - STALE_START_NS
        for key, t in list(self.open_starts.items()):
            if t < stale:  # started and never stopped (a region that raised): forget it
                self.open_starts.pop(key, None)
        times = [*self.open_starts.copy().values(), *self.pending_starts.copy().keys()]
        return min(times, default=None)

    # -- writer thread -------------------------------------------------------------

    def _new_anchor(self) -> tuple[Any, int]:
        cuda = self.torch.cuda
        if self._side_stream is None:
            self._side_stream = cuda.Stream(device=self.device)
        ev = cuda.Event(enable_timing=True)
        with cuda.stream(self._side_stream):
            ev.record()
        ev.synchronize()
        return ev, time.time_ns()

    def resolve(self, tracer: Any, final: bool = False) -> int:
        """Emit every finished pair at the head of the queue (in record order); returns how many."""
        if not self.pending:
            return 0
        anchor, anchor_ns = self._anchor
        n = 0
        while self.pending:
            start, end, fn, kind, step, extra, host_ns = self.pending[0]
            if not end.query():
                if final:
                    end.synchronize()
                else:
                    break
            self.pending.popleft()
            if host_ns is not None:
                left = self.pending_starts.pop(host_ns, 1) - 1
                if left > 0:
                    self.pending_starts[host_ns] = left
            try:
                dur_ms = start.elapsed_time(end)
                offset_ms = anchor.elapsed_time(start)
            except Exception:
                continue  # events of another device, or never recorded
            if len(self.free) < self.pool_max:
                self.free.append(start)
                self.free.append(end)
            ts = anchor_ns + int(offset_ms * 1e6)
            tracer.emit(fn, kind, ts, max(0, int(dur_ms * 1e6)), step, extra)
            n += 1
        now = time.monotonic()
        if not self.pending and now - self._anchor_at >= ANCHOR_S:
            self._anchor, self._anchor_at = self._new_anchor(), now
        return n
