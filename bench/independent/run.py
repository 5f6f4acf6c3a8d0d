"""Score the detector on the independent generator's scenarios.

    python -m eroica.bench.independent.run --scale small --seeds 1-3 [--only NAME] [--json out.jsonl]

Each scenario (every fault alone, plus healthy runs) is generated per seed into a temporary
file, analysed with the detector's default 30 s window exactly as a user would (``read_batches``
then ``analyze``), scored with ``eroica.bench.scoring.score_run``, and deleted.

Seeds 1-6 (and 7-16 for five faults) were looked at while the detector was changed after this
generator's first run (2026-11-27); seeds 101-110 were held out through two rounds of changes.
The third round (2026-11-27, later) looked at the misses of held-out small 103, 104, 107 and
110 and medium 101 and 104, so 101-110 are no longer fully unseen: they are still reported, as
the earlier held-out set. Seeds 111-130 (small) and 106-115 (medium) are the held-out range now
(HOLDOUT_SEEDS): run them only to report, never to decide a change, and report them apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

from eroica.bench.scoring import ALARM_CONFIDENCE, score_run
from eroica.models.reader import read_batches
from eroica.streams.detection import analyze

from .faults import CATALOGUE
from .generator import SCALES, make_config, write_jsonl

WINDOW_NS = int(30e9)
HOLDOUT_SEEDS = range(111, 131)   # small; medium: 106-115 (see above)
HEALTHY = ("healthy", "healthy_pp")
SCENARIOS: tuple[str, ...] = HEALTHY + tuple(CATALOGUE)


def parse_seeds(text: str) -> list[int]:
    """'1-3' -> [1, 2, 3]; '1,4,7' -> [1, 4, 7]."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-", 1)
            out.extend(range(int(a), int(b) + 1))
        elif part:
            out.append(int(part))
    return out


def run_one(scale: str, seed: int, scenario: str, tmpdir: str) -> dict[str, Any]:
    """Generate, analyse, score and delete one scenario; return one result row."""
    cfg = make_config(scale, seed, scenario)
    path = os.path.join(tmpdir, f"{scenario}-{seed}.jsonl")
    t0 = time.perf_counter()
    try:
        truth = write_jsonl(cfg, path)
        size = os.path.getsize(path)
        t1 = time.perf_counter()
        invalid = 0
        batches = []
        for b in read_batches(path):
            invalid += len(b.invalid)
            batches.append(b)
        verdicts = list(analyze(iter(batches), WINDOW_NS))
        t2 = time.perf_counter()
    finally:
        if os.path.exists(path):
            os.remove(path)
    s = score_run(verdicts, truth)
    alarms = [v for v in verdicts if v.confidence >= ALARM_CONFIDENCE]
    return {
        "scenario": scenario, "seed": seed, "scale": scale,
        "expected": "; ".join(f.expected for f in s.faults) or "nothing",
        "found": "; ".join(f.found for f in s.faults) if s.faults else (", ".join(s.false_alarms) or "nothing"),
        "ok": all(f.ok for f in s.faults) and not s.false_alarms,
        "faults_found": sum(f.ok for f in s.faults), "faults": len(s.faults),
        "victims_blamed": s.victims_blamed, "false_alarms": s.false_alarms, "alarms": s.alarms,
        "invalid": invalid, "records": truth["records"], "mb": round(size / 1e6, 1),
        "gen_s": round(t1 - t0, 2), "detect_s": round(t2 - t1, 2), "seconds": round(t2 - t0, 2),
        "truth": truth["faults"], "config": truth["config"],
        "summaries": sorted({f"{v.kind}/{v.component} {v.scope} conf={v.confidence:.2f}: {v.summary}" for v in alarms}),
    }


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "~"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eroica.bench.independent.run", description=__doc__.split("\n")[0])
    ap.add_argument("--scale", default="small", choices=sorted(SCALES))
    ap.add_argument("--seeds", default="1-3")
    ap.add_argument("--only", action="append", default=[], help="scenario name (repeatable)")
    ap.add_argument("--json", default="", help="write one JSON line per run here")
    args = ap.parse_args(argv)
    unknown = [n for n in args.only if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenario {unknown}; choose from {', '.join(SCENARIOS)}")
    names = [n for n in SCENARIOS if not args.only or n in args.only]
    rows: list[dict[str, Any]] = []
    out = open(args.json, "w", encoding="utf-8") if args.json else None
    head = f"{'scenario':18} {'seed':>4} {'expected':36} {'found':44} {'ok':3} {'victims':>7} {'false':>5} {'sec':>6}"
    print(head)
    print("-" * len(head))
    try:
        with tempfile.TemporaryDirectory(prefix="eroica-indep-") as tmp:
            for seed in parse_seeds(args.seeds):
                for name in names:
                    row = run_one(args.scale, seed, name, tmp)
                    rows.append(row)
                    print(f"{name:18} {seed:>4} {_short(row['expected'], 36):36} {_short(row['found'], 44):44} "
                          f"{'yes' if row['ok'] else 'NO':3} {len(row['victims_blamed']):>7} {len(row['false_alarms']):>5} "
                          f"{row['seconds']:>6.1f}", flush=True)
                    if out:
                        out.write(json.dumps(row) + "\n")
                        out.flush()
    finally:
        if out:
            out.close()
    faulty = [r for r in rows if r["faults"]]
    healthy = [r for r in rows if not r["faults"]]
    found = sum(r["faults_found"] for r in faulty)
    total = sum(r["faults"] for r in faulty)
    print("-" * len(head))
    print(f"faults localised {found}/{total}; runs with victims blamed {sum(bool(r['victims_blamed']) for r in faulty)}"
          f"/{len(faulty)} ({sum(len(r['victims_blamed']) for r in faulty)} alarms); healthy runs with false alarms "
          f"{sum(bool(r['false_alarms']) for r in healthy)}/{len(healthy)}; job-scope false alarms on faulty runs "
          f"{sum(len(r['false_alarms']) for r in faulty)}; invalid records {sum(r['invalid'] for r in rows)}; "
          f"{sum(r['seconds'] for r in rows):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
