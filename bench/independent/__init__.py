"""An independent, clean-room telemetry generator for measuring how Eroica's detector generalises.

Why it exists: the detector has been graded on the project's own simulator, written by the same
people with the same assumptions, so a good score there may only show that both agree. This
package was written from the telemetry contract (``telemetry-v1.md``), the field notes on what
physical faults look like (``detection-notes.md``) and the scorer's truth format only, without
reading the project's simulator (``producers/``) or detector (``streams/``); the detector is used
as a black box through ``eroica.streams.detection.analyze``.

It models a synchronous job from first principles (``generator``): a discrete-event lock-step
engine where a collective ends when its last member arrives plus the ring transfer time over the
slowest link, counters that integrate the bytes and busy time the engine books on each link and
GPU, and realistic nuisances (clock offsets, sampler jitter and gaps, missing counters, warm-up,
checkpoints, compute noise, front-end and loopback NICs). Faults (``faults``) change only physical
quantities; ``run`` scores the detector on them.
"""
