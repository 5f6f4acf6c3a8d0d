"""``eroica demo`` (the README's first command) runs end to end and names the injected culprit.

A smaller job than the default (8 ranks instead of 64) keeps it quick; the
pipeline, the stack and the shutdown are the same. With ``--keep`` the data
stays: the commands it prints then work on the stopped stack's data
(``eroica verdicts --since 1h`` shows the demo's verdicts: the demo stamps
its job from now), and ``eroica report --job`` draws the page. Without
``--keep`` it offers no SQL for the stack it has removed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA"))}
    env["EROICA_SINK_SESSION_TIMEOUT_MS"] = "2000"  # tansu's group join then takes ~1 s
    return env


def test_demo_names_the_throttled_gpu_and_keeps_its_data(tmp_path: Path) -> None:
    pytest.importorskip("chdb")
    env = _env()
    r = subprocess.run([sys.executable, "-m", "eroica.cli", "demo", "--nodes", "2", "--gpus", "4", "--steps", "30",
                        "--fault", "gpu_throttle:rank=5", "--timeout", "150", "--keep"],
                       capture_output=True, text=True, timeout=240, env=env)
    kept = re.search(r"its data is kept in (\S+)\. ", r.stdout)
    try:
        assert r.returncode == 0, r.stdout + r.stderr
        assert "CULPRIT [gpu] rank 5 on node-1" in r.stdout
        assert "stopping the stack" in r.stderr
        assert kept, r.stdout
        data = kept.group(1)
        job = re.search(r"verdict\(s\) for job (\S+) landed", r.stdout).group(1)
        assert f"eroica verdicts --data-dir {data} --since 1h" in r.stdout
        # the printed `eroica sql` line runs as a shell would split it (its quoting may be ' or ")
        (line,) = [ln.strip() for ln in r.stdout.splitlines() if ln.strip().startswith("eroica sql --data-dir")]
        argv = shlex.split(line)
        assert argv[:3] == ["eroica", "sql", "--data-dir"] and argv[3] == data and "FROM eroica.verdicts FINAL" in argv[4]
        q = subprocess.run([sys.executable, "-m", "eroica.cli", *argv[1:]], capture_output=True, text=True,
                           timeout=120, env=env)
        assert q.returncode == 0 and "rank 5 on node-1" in q.stdout, q.stdout + q.stderr
        # what it printed works: the stopped stack's chdb directory is opened directly
        v = subprocess.run([sys.executable, "-m", "eroica.cli", "verdicts", "--data-dir", data, "--since", "1h",
                            "--format", "json"], capture_output=True, text=True, timeout=120, env=env)
        assert v.returncode == 0, v.stderr
        found = json.loads(v.stdout)
        assert found and {x["job"] for x in found} == {job} and any(x["rank"] == 5 for x in found)
        page = tmp_path / "demo.html"
        rep = subprocess.run([sys.executable, "-m", "eroica.cli", "report", "--job", job, "--data-dir", data,
                              "-o", str(page), "-q"], capture_output=True, text=True, timeout=120, env=env)
        assert rep.returncode == 0, rep.stderr
        assert 'data-culprit="1"' in page.read_text()
    finally:
        if kept:
            shutil.rmtree(kept.group(1), ignore_errors=True)


def test_without_keep_no_sql_is_offered_for_the_removed_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack is gone when the demo prints: it shows what ClickHouse answered, not SQL to run against it."""
    import eroica.stack.demo as demo_mod
    from eroica.cli.main import cli
    from eroica.sinks.clickhouse.client import QueryResult
    from eroica.stack.demo import DemoResult, demo_sql

    def fake_run_demo(**kw: object) -> DemoResult:
        from eroica.models.verdict import Verdict

        v = Verdict(verdict_id="v1", job="demo-x", window_start_ns=0, window_end_ns=10, detected_at_ns=11,
                    kind="slow", component="gpu", scope="rank", node="node-1", rank=5, gpu=1, fn="gemm",
                    slowdown=1.4, score=9.0, confidence=0.9, peers=[0, 1], victims=[0, 1], evidence={},
                    summary="rank 5 on node-1: SM clock low")
        rows = QueryResult(["window", "component", "rank", "summary"], ["String", "String", "Int32", "String"],
                           [("00:00:00", "gpu", 5, v.summary)])
        return DemoResult("demo-x", verdicts=[v], sql=demo_sql("demo-x"), rows=rows,
                          timings={"verdict_after_replay_s": 1.0, "total_s": 20.0}, data_dir=None)

    monkeypatch.setattr(demo_mod, "run_demo", fake_run_demo)
    r = CliRunner().invoke(cli, ["demo"], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "CULPRIT [gpu] rank 5 on node-1" in r.stdout
    assert "What ClickHouse answered while the stack ran" in r.stdout and "SM clock low" in r.stdout
    assert "SELECT" not in r.stdout and "eroica sql" not in r.stdout
    assert "stack is stopped and its data removed" in r.stdout and "eroica demo --keep" in r.stdout
