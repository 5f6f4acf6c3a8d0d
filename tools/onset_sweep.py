"""Fault onset against the window that first alarms: a fault started at every step of one window.

Why: a live verdict's delay after a fault's onset is the rest of the window the
detector first alarms on, plus the pipeline's own delay (``eroica bench live``
measures that one at one onset). Where in its window a fault begins decides
which window can alarm, so this sweeps the onset over a whole window in batch
(``analyze_windows`` over epoch-aligned windows, the streaming detector's core)
and prints, per onset, the first window with an alarm (confidence >= 0.5)
that matches the injected fault (``bench.scoring.matches``: its kind,
component and culprit), the delay to that window's end in windows, and every
alarm that does not match it.

Usage: ``python tools/onset_sweep.py [--nodes 8] [--profile default] [--fault gpu_throttle:rank=13]
[--seed 1] [--window-s 30]``; the last line is the largest delay.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path


def sweep(nodes: int, profile: str, fault: str, seed: int, window_s: float) -> list[dict]:
    """One run per onset step across the run's fourth window; each onset's first alarming window."""
    from eroica.bench.scoring import ALARM_CONFIDENCE, matches
    from eroica.models.reader import read_batches
    from eroica.producers.simulator import SimConfig, truth, write_jsonl
    from eroica.streams.detection import analyze_windows

    w = int(window_s * 1e9)
    base = dict(nodes=nodes, gpus=8, seed=seed, job="onset", start_ns=1_763_000_000 * 10**9 // w * w, profile=profile)
    ss = truth(SimConfig(steps=12, **base))["step_start_ns"]  # type: ignore[arg-type]
    step_s = (ss[-1] - ss[1]) / 1e9 / (len(ss) - 2)
    steps = int(8 * window_s / step_s)
    first = int(3 * window_s / step_s)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        for start in range(first, first + int(window_s / step_s) + 2):
            t = write_jsonl(SimConfig(steps=steps, faults=[f"{fault},start={start}"], **base),  # type: ignore[arg-type]
                            path, truth_path=False)
            onset = int(t["step_start_ns"][start])
            onset_window = onset // w * w
            faults, rank_nodes = t["faults"], t["layout"]["rank_nodes"]
            alarm, wrong = None, []
            for d, vs in analyze_windows(read_batches(path), w):
                for v in vs:
                    if v.confidence < ALARM_CONFIDENCE:
                        continue
                    if any(matches(v, f, rank_nodes) for f in faults):
                        alarm = d.start_ns if alarm is None else alarm
                    else:
                        wrong.append(f"{v.kind}/{v.component}@{v.scope} {v.node or ''} {v.rank}".strip())
            out.append({"step": start, "onset_in_window_s": round((onset - onset_window) / 1e9, 2),
                        "alarm_window": None if alarm is None else (alarm - onset_window) // w,
                        "delay_windows": None if alarm is None else round((alarm + w - onset) / w, 3),
                        "other_alarms": sorted(set(wrong))})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--profile", default="default", choices=("default", "realistic"))
    ap.add_argument("--fault", default="gpu_throttle:rank=13")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--window-s", type=float, default=30.0)
    a = ap.parse_args(argv)
    rows = sweep(a.nodes, a.profile, a.fault, a.seed, a.window_s)
    for r in rows:
        print(f"onset {r['onset_in_window_s']:6.2f} s into its window (step {r['step']}): "
              f"first alarm about window onset+{r['alarm_window']}, {r['delay_windows']} windows after the onset"
              + (f"; other alarms: {', '.join(r['other_alarms'])}" if r["other_alarms"] else ""))
    delays = [r["delay_windows"] for r in rows]
    if None in delays:
        print(f"no alarm for {delays.count(None)} onsets")
        return 1
    print(f"largest delay to the alarming window's end: {max(delays)} windows (the pipeline's own delay comes on top)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
