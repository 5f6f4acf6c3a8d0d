"""End to end with the ports a real node reports beside its rails (issue 9).

The simulator writes only the RDMA rails; :mod:`frontend_ports` appends, per
node and at the rails' sampling instants, a front-end ``eth0`` (100 Gb/s on
some nodes, 200 on others; little, bursty traffic; a few hundred rx_errors on
some), a management port with its usual errors, a bond, an IPoIB device at the
rails' speed, ``lo``, ``docker0`` and a veth. None of them may be blamed, and
the degraded rail must still be named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eroica.bench.scoring import score_run
from eroica.models.verdict import decode_verdicts

from frontend_ports import add_frontend_ports

EROICA = [sys.executable, "-m", "eroica.cli"]
LAYOUT = ["--nodes", "4", "--gpus", "8", "--steps", "70"]


def _run(tmp: Path, faults: list[str], seed: int = 4) -> tuple[list, dict]:
    raw, out = tmp / "run.jsonl", tmp / "with-front-end.jsonl"
    args = [*EROICA, "simulate", *LAYOUT, "--seed", str(seed), "-o", str(raw)]
    for f in faults:
        args += ["--fault", f]
    subprocess.run(args, check=True, capture_output=True)
    assert add_frontend_ports(raw, out, seed) > 0
    res = subprocess.run([*EROICA, "analyze", str(out), "--format", "json", "--window", "20", "-q"],
                         check=True, capture_output=True)
    return decode_verdicts(res.stdout), json.loads((tmp / "run.truth.json").read_text())


def test_healthy_run_with_front_end_ports_has_no_nic_verdict(tmp_path):
    verdicts, truth = _run(tmp_path, [])
    assert truth["healthy"]
    assert [v for v in verdicts if v.component in ("nic", "network")] == []
    assert [v for v in verdicts if v.confidence >= 0.5] == []


def test_degraded_rail_is_named_beside_front_end_ports(tmp_path):
    verdicts, truth = _run(tmp_path, ["nic:node=2,nic=3"])
    score = score_run(verdicts, truth)
    assert all(f.ok for f in score.faults), [(f.expected, f.found) for f in score.faults]
    assert score.victims_blamed == [] and score.false_alarms == []
    nic = [v for v in verdicts if v.component == "nic"]
    assert nic and {v.node for v in nic} == {"node-2"}
    assert {v.evidence["nic"]["culprit"] for v in nic} == {"mlx5_3"}
