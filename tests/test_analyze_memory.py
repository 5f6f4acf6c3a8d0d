"""Batch ``analyze_windows`` keeps no window's records once it is analysed.

Why: a released window holds a whole window's columns (~100 MB at 1,024
ranks, 0.76 s steps). A reference left to it while the next window fills (it
once was: the loop variable) made a third window resident beside the one
filling and the one released, 22% of the traced peak on a 1,024-rank job.
"""

from __future__ import annotations

import weakref

import eroica.streams.detection as detection
from eroica.models.reader import read_batches
from eroica.producers.simulator import SimConfig, write_jsonl

WINDOW_NS = 4 * 10**9


def test_an_analysed_window_is_freed_before_the_next_batch_is_read(tmp_path, monkeypatch):
    path = tmp_path / "job.jsonl"
    write_jsonl(SimConfig(nodes=1, gpus=4, steps=24, seed=3, faults=["gpu_throttle:rank=2"]), path,
                truth_path=False)
    analysed: list[weakref.ref] = []
    real = detection.digest_window

    def digest_window(w):
        analysed.append(weakref.ref(w))
        return real(w)

    monkeypatch.setattr(detection, "digest_window", digest_window)
    alive_while_reading = []

    def batches():
        for b in read_batches(path, batch_records=500):
            alive_while_reading.append(sum(r() is not None for r in analysed))
            yield b

    results = list(detection.analyze_windows(batches(), WINDOW_NS))
    assert len(analysed) >= 4 and len(results) == len(analysed)  # several windows released mid-stream
    assert max(alive_while_reading) == 0, alive_while_reading
