"""Records lost, then ``eroica analyze``: do alarms appear that the whole input does not raise?

Two sweeps, each printing the cases that raised alarms (confidence >= 0.5) and a total:

``tails FILE``
    For every 30 s window of FILE, its last 5, 10, ... 25 s of function records
    (a late burst of one frame type) or of every record type (an outage's late
    records, a dead collector) removed; an alarm counts when the whole FILE does
    not raise it.
``gaps SEED[,SEED...]``
    Healthy ``--profile realistic`` jobs (4 nodes x 4 GPUs) with four random
    losses each: one node's records for 3-20 s, or every node's last 3-25 s of a
    window. Seeds 7001-7008 are the range kept for this check (never used to tune).

Usage: ``python tools/lost_records.py tails run.jsonl`` or ``python tools/lost_records.py gaps 7001,7002``
(``--eroica PATH`` picks another installation, to compare two versions).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

W = 30 * 10**9
S = 10**9
ALL = ("fn", "gpu", "nic", "host")


def _alarms(eroica: str, path: Path) -> set[tuple]:
    out = subprocess.run([eroica, "analyze", str(path), "--format", "json"], capture_output=True, text=True, check=True)
    return {(v["component"], v["scope"], v["node"], v["rank"]) for v in json.loads(out.stdout) if v["confidence"] >= 0.5}


def _write_without(lines: list[bytes], recs: list[dict], types: tuple[str, ...], lo_ns: float, hi_ns: float,
                   out: Path, node: str | None = None) -> Path:
    """The input less the records of ``types`` timed in [lo_ns, hi_ns) (of one ``node``, or of all)."""
    def lost(r: dict) -> bool:
        return (r.get("type") in types and lo_ns <= r.get("ts_ns", 0) < hi_ns
                and (node is None or r.get("node") == node))
    out.write_bytes(b"".join(line for line, r in zip(lines, recs) if not lost(r)))
    return out


def _load(path: Path) -> tuple[list[bytes], list[dict], int, int]:
    lines = path.read_bytes().splitlines(keepends=True)
    recs = [json.loads(line) for line in lines]
    ts = [r.get("ts_ns", 0) for r in recs]
    return lines, recs, min(t for t in ts if t), max(ts)


def tails(eroica: str, path: Path, tmp: Path) -> tuple[int, int]:
    lines, recs, lo, hi = _load(path)
    whole = _alarms(eroica, path)
    bad = n = 0
    w0 = lo - lo % W
    while w0 < hi:
        for cut in (5, 10, 15, 20, 25):
            for types in (("fn",), ALL):
                got = _alarms(eroica, _write_without(lines, recs, types, w0 + cut * S, w0 + W, tmp / "cut.jsonl"))
                n += 1
                if got - whole:
                    bad += 1
                    print(f"window +{(w0 - lo) // S} s, last {30 - cut} s of {','.join(types)}: {sorted(got - whole)[:3]}",
                          flush=True)
        w0 += W
    return bad, n


def gaps(eroica: str, seeds: list[int], tmp: Path) -> tuple[int, int]:
    bad = n = 0
    for seed in seeds:
        base = tmp / f"healthy-{seed}.jsonl"
        subprocess.run([eroica, "simulate", "--profile", "realistic", "--nodes", "4", "--gpus", "4", "--seed", str(seed),
                        "--start", "default", "-o", str(base)], check=True, capture_output=True)
        lines, recs, lo, hi = _load(base)
        nodes = sorted({str(r["node"]) for r in recs if r.get("node")})
        rng = random.Random(seed)
        for case in range(4):
            if case % 2 == 0:
                node, d = rng.choice(nodes), rng.uniform(3, 20) * S
                t0 = rng.uniform(lo, hi - d)
                cut = _write_without(lines, recs, ALL, t0, t0 + d, tmp / "cut.jsonl", node)
                what = f"{node} silent {d / S:.0f} s"
            else:
                w0 = (lo - lo % W) + W * rng.randrange(0, max(1, int((hi - lo) // W)))
                lost_s = rng.uniform(3, 25)
                types = rng.choice([("fn",), ALL])
                cut = _write_without(lines, recs, types, w0 + W - lost_s * S, w0 + W, tmp / "cut.jsonl")
                what = f"last {lost_s:.0f} s of a window's {','.join(types)}"
            got = _alarms(eroica, cut)
            n += 1
            if got:
                bad += 1
                print(f"seed {seed}, {what}: {sorted(got)[:3]}", flush=True)
    return bad, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("mode", choices=["tails", "gaps"])
    ap.add_argument("what", help="tails: a JSON Lines file; gaps: seeds, comma-separated")
    ap.add_argument("--eroica", default=str(Path(sys.executable).with_name("eroica")))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.mode == "tails":
            bad, n = tails(args.eroica, Path(args.what), Path(tmp))
            print(f"new alarms in {bad} of {n} cuts")
        else:
            bad, n = gaps(args.eroica, [int(s) for s in args.what.split(",")], Path(tmp))
            print(f"alarms in {bad} of {n} healthy runs with lost records")


if __name__ == "__main__":
    main()
