"""The node agent loop: sample the node's counters every ``interval_s``, publish them.

Runs in the foreground (``eroica agent``) or as a thread (``eroica trace``
starts one beside the training command). Sampling is paced on the monotonic
clock, so a slow sample shortens the next sleep instead of drifting; a tick
that is missed entirely is skipped, not made up in a burst.
"""

from __future__ import annotations

import logging
import threading
import time

from eroica.producers.counters.sampler import NodeSampler
from eroica.producers.outputs import Sink

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1   # 10 Hz
MAX_INTERVAL_S = 60.0


class NodeAgent:
    """Samples ``sampler`` into ``sink`` until stopped or ``duration_s`` has passed."""

    def __init__(self, sampler: NodeSampler, sink: Sink, interval_s: float = 0.5) -> None:
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
            raise ValueError(f"interval must be within [{MIN_INTERVAL_S}, {MAX_INTERVAL_S}] s, got {interval_s}")
        self.sampler = sampler
        self.sink = sink
        self.interval_s = interval_s
        self.samples = 0
        self.records = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tick(self) -> int:
        """One sample, published; returns how many records it gave."""
        try:
            records = self.sampler.sample()
            if records and getattr(self.sink, "declares_watermarks", False):
                # a sample's records are its moment: the next sample's are all later
                self.sink.write(records, watermark_ns=max(r.ts_ns for r in records))
            else:
                self.sink.write(records)
        except Exception as exc:  # a flaky counter file must not end the agent
            self.errors += 1
            if self.errors == 1 or self.errors % 100 == 0:
                log.warning("agent sample failed (%d so far): %s: %s", self.errors, type(exc).__name__, exc)
            return 0
        self.samples += 1
        self.records += len(records)
        return len(records)

    def run(self, duration_s: float | None = None) -> None:
        """Sample until :meth:`stop` (or ``duration_s``), then close the sink."""
        start = time.monotonic()
        next_tick = start
        try:
            while not self._stop.is_set():
                self.tick()
                now = time.monotonic()
                if duration_s is not None and now - start >= duration_s:
                    break
                next_tick += self.interval_s
                if next_tick < now:  # fell behind: skip the missed ticks
                    next_tick = now + self.interval_s
                wait = next_tick - now
                if duration_s is not None:
                    wait = min(wait, max(0.0, start + duration_s - now))
                if self._stop.wait(wait):
                    break
        finally:
            if self._stop.is_set() and self.samples:
                self.tick()  # a last sample covers the time since the previous one
            self.sampler.close()
            self.sink.close()

    def start(self) -> "NodeAgent":
        self._thread = threading.Thread(target=self.run, name="eroica-agent", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
