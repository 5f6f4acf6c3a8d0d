"""Issue 34: a job's records sent after its end-of-stream (a replay in two calls) are placed or dead-lettered.

Before, the second call's records for windows analysed at the first call's end
were dropped as late (24,000 records here) and their digests logged as late at
the detector: silently gone. Windows nothing analysed yet are placed as
before; records and digests for windows analysed at the end go to the
dead-letter topic with a reason saying how to send them.
"""

from __future__ import annotations

import json
from pathlib import Path

from eroica.models.reader import read_batches
from eroica.streams.detection import analyze

from .test_cores import W, _messages, _Pipeline, _simulate


def test_a_job_replayed_in_two_calls_loses_nothing_silently(tmp_path: Path) -> None:
    path = _simulate(tmp_path, "--nodes 4 --gpus 8 --steps 200 --fault nic:node=node-2 --seed 3 --start default")
    lines = [ln for ln in path.read_bytes().split(b"\n") if ln]
    recs = [json.loads(ln) for ln in lines]
    ts = sorted(r["ts_ns"] for r in recs if r["type"] != "job")
    cut = ts[len(ts) // 2]
    first = [ln for ln, r in zip(lines, recs) if r["type"] == "job" or r["ts_ns"] < cut]
    second = [ln for ln, r in zip(lines, recs) if r["type"] == "job" or r["ts_ns"] >= cut]
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(first) + b"\n")
    (tmp_path / "b.jsonl").write_bytes(b"\n".join(second) + b"\n")
    ref = list(analyze(read_batches(path), W))
    pa, pb = _messages(tmp_path / "a.jsonl", 4), _messages(tmp_path / "b.jsonl", 4)
    pipe = _Pipeline(4)
    pipe.run(pa, 0)  # the first call, with its end markers
    done = pipe.det.jobs[recs[0]["job"]].state.done_through_ns  # windows analysed at its end
    off = max(m[-1][2] for m in pa.values()) + 10
    pipe.run({p: [(k, v, t + off) for k, v, t in pb.get(p, [])] for p in pb}, 1)  # the second
    got = {v.verdict_id for v in pipe.verdicts}
    after = [v for v in ref if v.window_start_ns > done]
    assert after, "the second call has windows of its own"
    assert {v.verdict_id for v in after} <= got
    # nothing dropped silently: every record or digest not placed is a dead letter with its reason
    assert sum(ps.stats.late_records for ps in pipe.sums.values()) == 0
    assert pipe.det.stats.late_windows == 0
    placed_not = sum(ps.stats.after_end for ps in pipe.sums.values())
    assert placed_not > 0 and pipe.deadletters
    assert all("after its end-of-stream" in d["reason"] for d in pipe.deadletters)
