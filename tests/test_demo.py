"""``eroica demo`` (the README's first command) runs end to end and names the injected culprit.

A smaller job than the default (8 ranks instead of 64) keeps it quick; the
pipeline, the stack and the shutdown are the same.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def test_demo_names_the_throttled_gpu() -> None:
    pytest.importorskip("chdb")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA"))}
    env["EROICA_SINK_SESSION_TIMEOUT_MS"] = "2000"  # tansu's group join then takes ~1 s
    r = subprocess.run([sys.executable, "-m", "eroica.cli", "demo", "--nodes", "2", "--gpus", "4", "--steps", "30",
                        "--fault", "gpu_throttle:rank=5", "--timeout", "150"],
                       capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "CULPRIT [gpu] rank 5 on node-1" in r.stdout
    assert "FROM eroica.verdicts FINAL" in r.stdout
    assert "stopping the stack" in r.stderr
