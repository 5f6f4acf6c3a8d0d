"""The first hour of a new user (issue 14 item 4), command by command.

- with no stack, every command that talks to one (`verdicts`, `sql`,
  `report --job`, `replay`, `alert`) fails with exit 1 and ONE line that says
  what to do ("no stack: run `eroica up` or pass `--clickhouse`"), no traceback;
  `--debug` brings the traceback back;
- they all find a running stack through one helper (`cli/stack_options.py`
  over `runtime/state.py`): `eroica replay FILE` with no `--kafka` delivers to
  the broker named in the data directory's `stack.json`;
- `eroica simulate` stamps its records from now (so `verdicts --since 1h`
  shows a replayed run), in the library default's phase of the minute (windows
  cut the same steps), and `--start default` stays byte-identical;
- every command's `--help` states its exit codes;
- verdict tables at 80 columns cut no word in the middle.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import COMMANDS, cli

EROICA = [sys.executable, "-m", "eroica.cli"]


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_KAFKA", "EROICA_DEBUG"))}
    return {**env, "EROICA_DATA_DIR": str(data_dir), "COLUMNS": "80", **extra}


def _simulate(out: Path) -> object:
    return CliRunner().invoke(cli, ["simulate", "--nodes", "1", "--gpus", "2", "--steps", "3", "-o", str(out)])


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EROICA, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args, flag", [
    (["verdicts", "--since", "1h"], "--clickhouse"),
    (["sql", "SELECT 1"], "--clickhouse"),
    (["report", "--job", "j", "-o", "x.html"], "--clickhouse"),
    (["replay", "README.md"], "--kafka"),
    (["alert", "--webhook", "http://127.0.0.1:9/hook"], "--kafka"),
])
def test_no_stack_is_one_actionable_line(tmp_path: Path, args: list[str], flag: str) -> None:
    if args[0] == "replay":
        args = ["replay", str(Path(__file__))]
    t0 = time.monotonic()
    r = _run(args, _env(tmp_path / "nothing-here"))
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"eroica {args[0]}: no stack: run `eroica up` or pass `{flag}"), lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert time.monotonic() - t0 < 30  # at once: nothing is tried against a guessed port


def test_errors_are_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    from eroica.runtime.system import free_port

    args = ["verdicts", "--clickhouse", f"clickhouse://127.0.0.1:{free_port()}/x"]
    r = _run(args, _env(tmp_path))
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "unavailable" in r.stderr and "Traceback" not in r.stderr
    d = _run([*args, "--debug"], _env(tmp_path))
    assert d.returncode == 1 and "Traceback" in d.stderr and "ConnectionRefusedError" in d.stderr
    e = _run(args, _env(tmp_path, EROICA_DEBUG="1"))
    assert "Traceback" in e.stderr


def test_an_unexpected_error_is_one_line_without_debug(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    import eroica.report.render as render
    from eroica.cli.main import main

    def boom(*_a: object, **_k: object) -> str:
        raise RuntimeError("boom")

    monkeypatch.setattr(render, "render_page", boom)
    run = tmp_path / "run.jsonl"
    assert _simulate(run).exit_code == 0
    args = ["report", str(run), "-o", str(tmp_path / "r.html"), "-q"]
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["eroica report: RuntimeError: boom (`--debug` shows the traceback)"]
    with pytest.raises(RuntimeError, match="boom"):
        main([*args, "--debug"])


def test_commands_find_the_running_stack_through_its_state_file(tmp_path: Path, kafka_bootstrap: str) -> None:
    """replay (and alert) resolve the broker from stack.json, as verdicts/sql/report resolve ClickHouse."""
    from eroica.cli.stack_options import NoStack, kafka_bootstrap as resolve_kafka, query_target
    from eroica.runtime.state import find_stack, write_state

    data = tmp_path / "stack"
    data.mkdir()
    with pytest.raises(NoStack):
        resolve_kafka(None, data)
    with pytest.raises(NoStack):
        query_target(None, data)
    write_state(data, {"pid": os.getpid(), "data_dir": str(data),
                       "kafka": {"bootstrap": kafka_bootstrap, "managed": True, "kind": "tansu", "state": "running"},
                       "clickhouse": {"url": f"chdb://{data / 'chdb'}", "backend": "chdb"},
                       "query_endpoint": None, "services": {}})
    found = find_stack(data)
    assert found is not None and found.bootstrap == kafka_bootstrap and found.pid == os.getpid()
    assert resolve_kafka(None, data) == kafka_bootstrap
    assert resolve_kafka("elsewhere:9092", data) == "elsewhere:9092"  # the flag wins
    run = tmp_path / "run.jsonl"
    assert _simulate(run).exit_code == 0
    env = {k: None for k in os.environ if k.startswith(("EROICA_KAFKA", "EROICA_CLICKHOUSE"))}
    r = CliRunner().invoke(cli, ["replay", str(run), "--data-dir", str(data), "-q"], env=env)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(cli, ["replay", str(run), "--data-dir", str(data)], env=env)
    assert r.exit_code == 0 and f"(broker {kafka_bootstrap})" in r.stderr, r.output


def test_simulate_stamps_records_from_now(tmp_path: Path) -> None:
    from eroica.producers.simulator import DEFAULT_START_NS
    from eroica.producers.simulator.config import START_PHASE_NS, start_now_ns

    def first_ts(*extra: str) -> tuple[int, bytes]:
        out = tmp_path / "run.jsonl"
        res = CliRunner().invoke(cli, ["simulate", "--nodes", "1", "--gpus", "2", "--steps", "3", "-o", str(out),
                                       *extra])
        assert res.exit_code == 0, res.output
        data = out.read_bytes()
        return json.loads(data.splitlines()[0])["ts_ns"], data

    before = time.time_ns()
    ts, _ = first_ts()
    assert before - START_PHASE_NS <= ts <= time.time_ns()           # from now, at most a minute back
    assert (ts - DEFAULT_START_NS) % START_PHASE_NS == 0              # same cut of the epoch-aligned windows
    assert start_now_ns(DEFAULT_START_NS + 5 * START_PHASE_NS + 7) == DEFAULT_START_NS + 5 * START_PHASE_NS
    ts_default, a = first_ts("--start", "default")
    _, b = first_ts("--start", "default")
    assert ts_default == DEFAULT_START_NS and a == b                  # deterministic on request
    assert first_ts("--start", "2026-01-01T00:00:00Z")[0] == 1_767_225_600 * 10**9
    assert first_ts("--start", "5")[0] == 5
    bad = CliRunner().invoke(cli, ["simulate", "--start", "soon", "-o", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "--start" in bad.output


def _helps() -> list[tuple[list[str], str]]:
    import click

    out = []
    for name in sorted(COMMANDS):
        cmd = cli.get_command(click.Context(cli), name)
        assert cmd is not None
        out.append(([name], CliRunner().invoke(cli, [name, "--help"], terminal_width=80).output))
        if isinstance(cmd, click.Group):
            for sub in sorted(cmd.commands):
                out.append(([name, sub], CliRunner().invoke(cli, [name, sub, "--help"], terminal_width=80).output))
    return out


def test_every_command_help_states_its_exit_codes() -> None:
    helps = _helps()
    assert len(helps) >= len(COMMANDS)
    missing = [" ".join(args) for args, text in helps if "Exit codes" not in text]
    assert missing == []
    top = CliRunner().invoke(cli, ["--help"]).output
    assert "Exit codes" in top and "--debug" in top


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z][A-Za-z_-]{2,}", text))


def test_verdict_tables_cut_no_word_at_80_columns(tmp_path: Path) -> None:
    run = tmp_path / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "4", "--gpus", "8", "--steps", "40", "--seed", "1",
                                   "--fault", "gpu_throttle:rank=13", "--fault", "nic:node=2", "-o", str(run)])
    assert res.exit_code == 0, res.output
    env = _env(tmp_path)
    verdicts = json.loads(_run(["analyze", str(run), "--format", "json", "-q"], env).stdout)
    assert {v["component"] for v in verdicts} >= {"gpu", "nic"}
    known = _words(" ".join(f'{v["summary"]} {v["component"]} {v["kind"]} {v["node"]}' for v in verdicts)) | _words(
        "window kind component scope culprit slowdown conf confidence summary rank job node slow slower loses")
    for width in ("80", "120", "200"):
        text = _run(["analyze", str(run), "-q"], {**env, "COLUMNS": width}).stdout
        assert text and max(len(line) for line in text.splitlines()) <= int(width)
        cut = _words(text) - known
        assert cut == set(), f"words cut at {width} columns: {sorted(cut)[:10]}"


def test_print_rows_turns_narrow_tables_into_blocks() -> None:
    from rich.console import Console

    from eroica.cli.tables import print_rows

    summary = ("node node-2: NIC mlx5_0 on node-2 link degraded; collectives of group dp-pp0-tp0 move data 2.00x "
               "slower than 7 groups of the same shape")
    rows = [["14:20:00", "nic", "node-2", summary], ["14:20:30", "gpu", "rank 13", summary]]
    for width in (80, 100, 200):
        buf = io.StringIO()
        print_rows(["window", "component", "culprit", "summary"], rows, wide={"summary"},
                   out=Console(file=buf, width=width, color_system=None))
        text = buf.getvalue()
        assert max(len(line) for line in text.splitlines()) <= width
        assert _words(text) <= _words(summary) | {"window", "component", "culprit", "summary", "nic", "gpu", "rank"}


def test_whatif_table_fits_80_columns_with_long_kernel_names(tmp_path: Path) -> None:
    run = tmp_path / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "30",
                                   "--fault", "gpu_throttle:rank=5", "-o", str(run)])
    assert res.exit_code == 0, res.output
    text = _run(["whatif", str(run)], _env(tmp_path)).stdout
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.startswith("│ function")]
    assert rows and all(line.count("│") == 5 for line in rows)       # one line per row: no name folded over two
    assert len({line.split("│")[2] for line in rows}) == len(rows)   # the shortened names stay distinct
