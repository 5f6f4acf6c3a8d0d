"""Whether the broker has answered without a break: probe results -> outages, silence included.

Both workers hold back what an outage may have held up (the summariser its
idle closes, the detector its forced windows) while the broker is away and
for the publishers' delivery timeout after. That needs every outage seen,
and a probe that fails is only one way to see it: on a loaded machine the
probe itself can be late (the event loop busy, its thread pool taken by a
slow end-offset call), and an outage that fits between two probes then
passes unseen. CI's broker-kill chaos test met exactly that: the tick that
starts probes waited 7.5 s on an end-offset call across the outage, no probe
ran, the worker reported ``broker_outages`` 0 and closed jobs as idle while
the publishers still held their records.

So an answer only vouches for the time since the previous answer if that
previous answer is recent: a stretch longer than ``max_silence_s`` without an
answer, whatever its cause, is reported as an outage that ended with the
answer that closed it. A false outage (a stalled event loop) costs a delay
of idle closes and forced windows; a missed one costs records dropped as
late and partial windows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class BrokerWatch:
    """Probe results in, observations (answered, at) out; counts outages."""

    max_silence_s: float
    answering: bool = True
    outages: int = 0
    last_answer_at: float | None = None
    silent_outages: int = 0          # of ``outages``: seen only as a silence between two answers

    def result(self, answered: bool, at: float) -> list[tuple[bool, float]]:
        """One probe's result at monotonic ``at``: what to report, in order (an outage may be inferred)."""
        out: list[tuple[bool, float]] = []
        if not answered and self.last_answer_at is None:
            # never answered yet: a client still connecting (its first request can outlast the
            # timeout), and a worker that has read nothing has nothing an outage could hold up
            return out
        if not answered:
            if self.answering:
                self.outages += 1
            self.answering = False
            return [(False, at)]
        previous = self.last_answer_at
        self.last_answer_at = at
        if self.answering and previous is not None and at - previous > self.max_silence_s:
            # answered before and now, never in between: an outage nobody saw
            self.outages += 1
            self.silent_outages += 1
            out.append((False, previous))
        self.answering = True
        out.append((True, at))
        return out
