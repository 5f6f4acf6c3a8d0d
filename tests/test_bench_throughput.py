"""``eroica bench throughput`` on a tiny job: the table and JSON carry every stage, every stage saw every record.

No timing assertions: the numbers are measurements of a noisy shared machine.
Runs the command in a subprocess (chdb serves one data directory per process,
and the bench opens its own).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

STAGES = ["reader", "analyze (batch)", "framing encode", "framing decode", "windowing", "summariser", "detector",
          "sink chdb"]
FIELDS = {"stage", "records", "cpu_s", "records_per_cpu_s", "floor", "floor_records_per_cpu_s", "ratio_to_floor",
          "peak_mb", "wall_s", "own_cpu_s", "child_cpu_s", "repeats", "detail"}


def _server_installed() -> bool:
    from eroica.stack.clickhouse_server import find_server_binary

    try:
        import clickhouse_driver  # noqa: F401
    except ImportError:
        return False
    return find_server_binary() is not None


def _tansu_installed() -> bool:
    try:
        from eroica.stack.tansu import tansu_binary

        return tansu_binary().exists()
    except Exception:
        return False


def test_bench_throughput_tiny(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    broker = "tansu" if _tansu_installed() else "none"
    server = _server_installed()
    argv = [sys.executable, "-m", "eroica.cli", "bench", "throughput", "--ranks", "8", "--steps", "6",
            "--broker", broker, "--server" if server else "--no-server", "--json", str(out),
            "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr

    expected = STAGES + (["sink server"] if server else []) + ([f"broker {broker}"] if broker != "none" else [])
    # the printed table: header row, one row per stage, the floors line
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("stage"))
    for col in ("records", "CPU s", "records/CPU-s", "floor rec/CPU-s", "x floor", "peak MB"):
        assert col in lines[header]
    rows = lines[header + 2: header + 2 + len(expected)]
    assert [r.split("  ")[0].strip() for r in rows] == expected
    assert any(line.startswith("floors: ") for line in lines)

    result = json.loads(out.read_text())
    assert [s["stage"] for s in result["stages"]] == expected
    assert set(result["floors"]) == {"json", "frames", "digests", "sink"}
    assert result["furthest_from_floor"] in expected
    # The kernels' one-time load is measured apart from every stage (numba is installed in CI).
    assert ("fastjson" in result["startup"]["kernels"]) == (importlib.util.find_spec("numba") is not None)
    assert any(line.startswith("once per process") for line in lines)

    total = result["input"]["records"]
    jsonl = tmp_path / "work" / "run.jsonl"
    with open(jsonl, "rb") as f:
        assert total == sum(1 for line in f if line.strip())
    by = {s["stage"]: s for s in result["stages"]}
    for s in result["stages"]:
        assert FIELDS <= set(s), s["stage"]
        assert s["records"] > 0 and s["cpu_s"] >= 0 and s["peak_mb"] >= 0
    # every stage handled every record: all lines read; all but the job record framed and summarised
    assert by["reader"]["records"] == total
    assert by["reader"]["detail"]["invalid"] == 0
    assert by["analyze (batch)"]["records"] == total
    for stage in ("framing encode", "framing decode", "windowing", "summariser", "detector"):
        assert by[stage]["records"] == total - 1, stage
    if broker != "none":
        assert by[f"broker {broker}"]["records"] == total - 1
        assert by[f"broker {broker}"]["detail"]["frames"] == result["input"]["frames"]
    assert result["floors"]["json"]["records"] == total
    assert result["floors"]["frames"]["records"] == total - 1
    # the sink inserted every row it was given, checked with SELECT count()
    sinks = [s for s in expected if s.startswith("sink ")]
    for stage in sinks:
        d = by[stage]["detail"]
        assert d["summary_rows"] > 0
        assert by[stage]["records"] == d["summary_rows"] + d["verdict_rows"] == result["floors"]["sink"]["records"]
    assert len({by[s]["records"] for s in sinks}) == 1


def test_bench_throughput_rejects_odd_ranks() -> None:
    from eroica.bench.throughput import BenchConfig, sim_config

    with pytest.raises(ValueError):
        sim_config(BenchConfig(ranks=12))
    assert sim_config(BenchConfig(ranks=4)).nodes == 1
    assert sim_config(BenchConfig(ranks=1024)).nodes == 128
