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


def _pass(ratios: dict[str, float], floor_rate: float) -> dict:
    """A pass's result as :func:`run` gives it, with the given ratios (a stage's rate is its floor's / ratio)."""
    stages = [{"stage": name, "records": 100, "cpu_s": 100 * r / floor_rate, "records_per_cpu_s": floor_rate / r,
               "floor": "frames", "floor_records_per_cpu_s": floor_rate, "ratio_to_floor": r, "peak_mb": 1.0}
              for name, r in ratios.items()]
    return {"config": {"ranks": 8}, "machine": {"load1": floor_rate}, "stages": stages,
            "floors": {"frames": {"records": 100, "cpu_s": 100 / floor_rate, "records_per_cpu_s": floor_rate}}}


def test_combine_passes_takes_each_stage_from_its_median_pass() -> None:
    from eroica.bench.throughput import combine_passes

    # the machine ran at three speeds; the summariser's ratio moved less than its rate
    passes = [_pass({"summariser": 2.0, "detector": 1.0}, 9e6),
              _pass({"summariser": 2.4, "detector": 3.0}, 4e6),
              _pass({"summariser": 1.8, "detector": 1.5}, 6e6)]
    out = combine_passes(passes)
    assert out["passes"] == 3 and out["config"] == {"ranks": 8}
    by = {s["stage"]: s for s in out["stages"]}
    assert [s["stage"] for s in out["stages"]] == ["summariser", "detector"]
    # the median pass by ratio, every figure of the row from that one pass
    assert by["summariser"]["ratio_to_floor"] == 2.0 and by["summariser"]["floor_records_per_cpu_s"] == 9e6
    assert by["summariser"]["records_per_cpu_s"] == 9e6 / 2.0
    assert by["detector"]["ratio_to_floor"] == 1.5 and by["detector"]["floor_records_per_cpu_s"] == 6e6
    assert by["summariser"]["ratio_range"] == [1.8, 2.4]
    assert by["summariser"]["rate_range"] == [4e6 / 2.4, 9e6 / 2.0]
    assert by["detector"]["passes"] == 3
    assert out["floors"]["frames"]["records_per_cpu_s"] == 6e6
    assert out["floors"]["frames"]["rate_range"] == [4e6, 9e6]
    assert out["furthest_from_floor"] == "summariser"
    assert [p["machine"]["load1"] for p in out["pass_results"]] == [9e6, 4e6, 6e6]
    # an even count takes the lower middle pass; one pass is returned as it is
    two = combine_passes(passes[:2])
    assert {s["stage"]: s["ratio_to_floor"] for s in two["stages"]} == {"summariser": 2.0, "detector": 1.0}
    assert combine_passes(passes[:1]) == {**passes[0], "passes": 1}


def test_bench_throughput_passes_share_one_input(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    argv = [sys.executable, "-m", "eroica.cli", "bench", "throughput", "--ranks", "8", "--steps", "4",
            "--broker", "none", "--no-server", "--no-chdb", "--passes", "2", "--json", str(out),
            "--work-dir", str(tmp_path / "work")]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 passes: each row is its median pass" in proc.stdout
    result = json.loads(out.read_text())
    assert result["passes"] == 2 and len(result["pass_results"]) == 2
    expected = STAGES[:-1]
    for p in result["pass_results"]:
        assert [s["stage"] for s in p["stages"]] == expected
    for k, s in enumerate(result["stages"]):
        pair = [p["stages"][k] for p in result["pass_results"]]
        assert all(x["records"] == s["records"] for x in pair)  # the same input each pass
        lo, hi = s["ratio_range"]
        assert lo == min(x["ratio_to_floor"] for x in pair) and hi == max(x["ratio_to_floor"] for x in pair)
        assert s["ratio_to_floor"] == lo  # two passes: the lower middle one
    # simulated once, every pass in its own directory
    assert sorted(x.name for x in (tmp_path / "work").iterdir()) == ["pass-1", "pass-2", "run.jsonl"]
