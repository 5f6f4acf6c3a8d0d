"""``eroica analyze`` on jobs too small for the peer test (issue 32, item 3): a note, and the throttled GPU.

A role needs 4 ranks for the peer test (``peers.MIN_PEERS``). A 1x2 or 1x3 job
with a thermally throttled GPU used to read "no verdict: no rank, node or link
behaves abnormally"; now the job gets a note saying the peer test could not
run (under the table; on stderr as a JSON line with ``--format json``, stdout
staying the verdict array) and the GPU is named from its clock against its own
ceiling. A job the peer test covers (1x8) gets no note.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eroica.bench.scoring import score_run
from eroica.models.verdict import decode_verdicts

EROICA = [sys.executable, "-m", "eroica.cli"]


def _simulate(tmp: Path, gpus: int) -> Path:
    out = tmp / f"j1x{gpus}.jsonl"
    subprocess.run([*EROICA, "simulate", "--nodes", "1", "--gpus", str(gpus), "--steps", "40", "--seed", "1",
                    "--start", "default", "--fault", "gpu_throttle:rank=1", "-o", str(out)],
                   check=True, capture_output=True)
    return out


def _notes(stderr: bytes) -> list[dict]:
    return [json.loads(line) for line in stderr.decode().splitlines() if line.startswith("{")]


@pytest.mark.parametrize("gpus", [2, 3])
def test_a_small_job_gets_a_note_and_its_throttled_gpu_is_found(tmp_path, gpus):
    run = _simulate(tmp_path, gpus)
    res = subprocess.run([*EROICA, "analyze", str(run), "--format", "json", "-q"], check=True, capture_output=True)
    verdicts = decode_verdicts(res.stdout)           # stdout is the verdict array alone, as before
    assert isinstance(json.loads(res.stdout), list)
    alarms = [v for v in verdicts if v.confidence >= 0.5]
    assert alarms and {(v.component, v.scope, v.rank) for v in alarms} == {("gpu", "rank", 1)}
    assert all(v.peers == [] and 1 not in v.victims for v in alarms)
    assert "SM clock 1410 of 1980 MHz" in alarms[0].summary
    score = score_run(verdicts, json.loads(run.with_suffix(".truth.json").read_text()))
    assert all(f.ok for f in score.faults) and score.false_alarms == [] and score.victims_blamed == []
    # the note: on stderr, one JSON object per line, never among the verdicts
    notes = _notes(res.stderr)
    assert notes == [{"type": "note", "job": "sim-1", "kind": "few_peers", "ranks": gpus, "smallest_group": gpus,
                      "needed": 4, "uncompared": list(range(gpus)),
                      "text": f"job sim-1: only {gpus} ranks per role; the peer test needs 4; compared against "
                              "expected behaviour and the job's own history only"}]
    assert not any("note" in v.summary for v in verdicts)
    table = subprocess.run([*EROICA, "analyze", str(run), "-q"], check=True, capture_output=True,
                           env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    lines = table.stdout.decode().splitlines()
    assert lines[-1] == (f"note: job sim-1: only {gpus} ranks per role; the peer test needs 4; compared against "
                         "expected behaviour and the job's own history only")
    assert "no verdict" not in table.stdout.decode() and "rank 1" in table.stdout.decode()


def test_a_job_the_peer_test_covers_gets_no_note(tmp_path):
    run = _simulate(tmp_path, 8)
    res = subprocess.run([*EROICA, "analyze", str(run), "--format", "json", "-q"], check=True, capture_output=True)
    assert _notes(res.stderr) == [] and res.stderr == b""
    alarms = [v for v in decode_verdicts(res.stdout) if v.confidence >= 0.5]
    assert {(v.component, v.rank) for v in alarms} == {("gpu", 1)}
    assert all("than 7 peers" in v.summary for v in alarms)   # the peer test's verdict, not the clock test's
    table = subprocess.run([*EROICA, "analyze", str(run), "-q"], check=True, capture_output=True,
                           env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert b"note:" not in table.stdout
