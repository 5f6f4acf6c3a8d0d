"""Names are data everywhere (issue 34, item 5): hostile job, node and function names through the CLI's printers.

A simulated run whose job, nodes and functions carry :data:`hostile_names.HOSTILE`
(an escape sequence, CR/LF, a right-to-left override, Slack and HTML markup)
goes through ``eroica analyze`` (wide table, 80-column blocks, the invalid-record
reasons on stderr) and ``eroica report``'s messages; verdicts with those names,
stored in chdb, through ``eroica sql`` (table, TSV, JSON), ``eroica verdicts``
and ``eroica fleet`` (table and drain list); ``eroica import kineto|optable``
with hostile trace-file, span, optype and output names (warnings, summary,
one-line errors), a spinner's label and an unexpected error's message. No output may hold a raw control
or bidirectional character, and each name must still be there, escaped. (The
Slack payloads are checked in sinks/alerts/test_payloads.py, the HTML page in
tests/test_report.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from hostile_names import HOSTILE, NODES, RAW_TERMINAL, hostile_run


def _raw(text: str, own: str = "\n") -> list[str]:
    """The raw control/bidi characters in ``text`` but the printer's own (line ends; TSV's TABs)."""
    return [c for c in RAW_TERMINAL.findall(text) if c not in own]


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 ranks on 2 nodes, rank 5 (on the node named ``\\x1b[31mred\\x1b[0m``) throttled; every name hostile."""
    d = tmp_path_factory.mktemp("hostile")
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "40", "--fault",
                                   "gpu_throttle:rank=5", "--seed", "1", "-o", str(d / "run.jsonl")])
    assert res.exit_code == 0, res.output
    return hostile_run(d / "run.jsonl", d / "hostile.jsonl")


@pytest.mark.parametrize("columns", ["200", "80"])
def test_analyze_prints_hostile_names_escaped(hostile: Path, tmp_path: Path, columns: str) -> None:
    # one more input, named with an escape sequence and holding a broken line: its reason names the file
    bad = tmp_path / "bad\x1b[2J\u202e.jsonl"
    bad.write_text('{"type": "fn", "job": "\x1b[5m"}\n')
    res = CliRunner().invoke(cli, ["analyze", str(hostile), str(bad)], env={"COLUMNS": columns})
    assert res.exit_code == 0, res.output
    assert _raw(res.output) == [], ascii(res.output)
    assert "rank 5 on \\x1b[31mred\\x1b[0m" in res.output          # the culprit's node, shown escaped
    assert "bad\\x1b[2J\\u202e.jsonl:1:" in res.output              # the invalid-record reason's file name


def test_report_messages_show_hostile_names_escaped(hostile: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(cli, ["report", str(hostile), "--job", "x\x1b[2Jy", "-o", str(tmp_path / "r.html")])
    assert res.exit_code == 1 and "is not in the input" in res.output, res.output
    assert _raw(res.output) == [] and "x\\x1b[2Jy" in res.output and "\\r\\n" in res.output, ascii(res.output)
    out = tmp_path / "r\u202eport\r\n.html"
    res = CliRunner().invoke(cli, ["report", str(hostile), "-o", str(out)])
    assert res.exit_code == 0 and out.is_file(), res.output
    assert _raw(res.output) == [] and "r\\u202eport\\r\\n.html" in res.output, ascii(res.output)


NAMES = HOSTILE + ("t\tab",)   # and a TAB, TSV's separator


@pytest.fixture
def stored(tmp_path: Path, make_verdict) -> str:
    """A chdb store (as a stopped stack leaves it) holding one verdict per hostile name, in job, node, fn, summary."""
    pytest.importorskip("chdb")
    from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
    from eroica.sinks.clickhouse.schema import view_statements

    url = f"chdb://{tmp_path / 'chdb'}"
    with VerdictSink(ClickHouseConfig.from_url(url)) as sink:
        sink.ensure_schema()
        for stmt in view_statements(sink.config):
            sink.client.execute(stmt)
        sink.write_verdicts([make_verdict(job=name, node=name, fn=name, rank=i, gpu=1, summary=f"rank {i} on {name}",
                                          job_slowdown=1.25, cost=1.25, gpu_hours_lost_per_hour=12.8)
                             for i, name in enumerate(NAMES)])
    return url


def _run(url: str, tmp_path: Path, *args: str) -> str:
    res = CliRunner().invoke(cli, [*args, "--clickhouse", url, "--data-dir", str(tmp_path)], env={"COLUMNS": "160"})
    assert res.exit_code == 0, res.output
    assert _raw(res.output, "\n\t" if "tsv" in args else "\n") == [], ascii(res.output)
    return res.output


def test_sql_verdicts_and_fleet_print_hostile_names_escaped(stored: str, tmp_path: Path) -> None:
    select = "SELECT job, node, fn, summary FROM eroica.verdicts FINAL ORDER BY rank"
    table = _run(stored, tmp_path, "sql", select)
    assert "\\x1b[31mred\\x1b[0m" in table and "\\u202egnp.exe" in table and "a\\r\\nb" in table
    tsv = _run(stored, tmp_path, "sql", select, "--format", "tsv").splitlines()
    assert len(tsv) == 1 + len(NAMES) and all(line.count("\t") == 3 for line in tsv)   # no forged line or field
    assert tsv[1 + NAMES.index("a\r\nb")].split("\t")[:3] == ["a\\r\\nb"] * 3
    assert tsv[-1].split("\t")[:3] == ["t\\tab"] * 3
    rows = json.loads(_run(stored, tmp_path, "sql", select, "--format", "json"))
    assert [r["job"] for r in rows] == list(NAMES)                  # JSON: the names themselves, decoded
    listed = _run(stored, tmp_path, "verdicts")
    assert "\\x1b[31mred\\x1b[0m" in listed and "\\u202egnp.exe" in listed
    fleet = _run(stored, tmp_path, "fleet", "--since", "all")
    assert "\\u202egnp.exe" in fleet and "a\\r\\nb" in fleet
    drain = _run(stored, tmp_path, "fleet", "--since", "all", "--drain-list", "--min-jobs", "1").splitlines()
    assert sorted(drain) == sorted(n.replace("\x1b", "\\x1b").replace("\r", "\\r").replace("\n", "\\n")
                                   .replace("\u202e", "\\u202e").replace("\t", "\\t")
                                   for n in NAMES)   # one line per node, none forged


def test_the_hostile_run_has_hostile_nodes(hostile: Path) -> None:
    """The fixture's premise: the culprit's node and the others really carry the hostile names."""
    nodes = {json.loads(line).get("node") for line in hostile.open()}
    assert set(NODES.values()) & nodes == {NODES["node-0"], NODES["node-1"]}


def test_whatif_prints_hostile_names_escaped(hostile: Path) -> None:
    res = CliRunner().invoke(cli, ["whatif", str(hostile)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert _raw(res.output) == [], ascii(res.output)
    assert "\\u202e" in res.output or "\\x1b" in res.output     # the job's name is there, escaped


# --------------------------------------------------------------------------- eroica import: names from the traces

EVIL = "\x1b[31mx\r\n\u202e"          # an escape sequence, a forged line, a right-to-left override
EVIL_SHOWN = "\\x1b[31mx\\r\\n\\u202e"
T0 = 1_700_000_000_000_000           # µs since the epoch


def _x(cat: str, name: str, ts: int, dur: int, **kw: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": kw.pop("pid", 100), "tid": kw.pop("tid", 100), "ts": ts,
            "dur": dur, "args": kw}


def test_import_kineto_prints_names_from_the_traces_escaped(tmp_path: Path) -> None:
    """The warnings name the trace file and the span inferred as step boundary; the summary the output file."""
    opt = f"Optimizer.step#{EVIL}.step"      # the boundary's name, quoted in the "steps inferred" warning
    events = [e for i in range(4) for e in (
        _x("user_annotation", "## forward ##", T0 + 100 * i + 10, 50),
        _x("cpu_op", "aten::mm", T0 + 100 * i + 12, 20),
        _x("user_annotation", opt, T0 + 100 * i + 70, 25))]
    trace = tmp_path / f"rank{EVIL}.json"   # no distributedInfo: "<file>: no distributedInfo.rank" warns
    trace.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    out = tmp_path / f"out{EVIL}.jsonl"
    res = CliRunner().invoke(cli, ["import", "kineto", str(trace), "-o", str(out), "--job", "j"])
    assert res.exit_code == 0 and out.is_file(), res.output
    assert _raw(res.output) == [], ascii(res.output)
    assert f"rank{EVIL_SHOWN}.json: no distributedInfo.rank" in res.output, res.output
    assert f"each 'Optimizer.step#{EVIL_SHOWN}.step' ends one" in res.output, res.output
    assert f"to {tmp_path}/out{EVIL_SHOWN}.jsonl in" in res.output, res.output
    # refused: the one-line error names the file, escaped, and is still one line
    bare = tmp_path / f"bare{EVIL}.json"
    bare.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [_x("cpu_op", "aten::mm", T0, 10)]}))
    res = CliRunner().invoke(cli, ["import", "kineto", str(bare), "-o", str(tmp_path / "bare.jsonl")])
    assert res.exit_code == 1 and _raw(res.output) == [], ascii(res.output)
    (line,) = res.output.splitlines()
    assert line.startswith(f"error: {tmp_path}/bare{EVIL_SHOWN}.json: no ProfilerStep#N markers"), line


def test_import_optable_prints_names_from_the_table_escaped(tmp_path: Path) -> None:
    """The meta found beside the table (its file name), unknown optypes, and the error naming a bad table."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("yaml")
    rows = [(0, 0, 0, 1, "forward-compute", 0.0, 1.0), (1, 0, 1, 1, f"op{EVIL}", 0.0, 1.0),
            (0, 0, 0, 2, "forward-compute", 0.0, 1.0), (1, 0, 1, 2, "forward-compute", 0.0, 1.0)]
    cols = ("rank", "stage", "dp_rank", "step", "optype", "start_ts", "duration")
    table = tmp_path / f"trace-{EVIL}.parquet"
    pq.write_table(pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)}), table)
    (tmp_path / f"meta-{EVIL}.yaml").write_text("world_size: 4\ndp_size: 2\npp_size: 1\ntp_size: 1\n")
    out = tmp_path / f"o{EVIL}.jsonl"
    res = CliRunner().invoke(cli, ["import", "optable", str(table), "-o", str(out)])
    assert res.exit_code == 0 and out.is_file(), res.output
    assert _raw(res.output) == [], ascii(res.output)
    assert f"using meta {tmp_path}/meta-{EVIL_SHOWN}.yaml" in res.output, res.output
    assert "unknown optype 'op\\x1b[31mx\\r\\n\\u202e'" in res.output, res.output
    assert f"to {tmp_path}/o{EVIL_SHOWN}.jsonl in" in res.output, res.output
    bad = tmp_path / f"bad{EVIL}.parquet"
    pq.write_table(pa.table({"rank": [0], "step": [1]}), bad)
    res = CliRunner().invoke(cli, ["import", "optable", str(bad), "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and _raw(res.output) == [], ascii(res.output)
    (line,) = res.output.splitlines()
    assert line.startswith(f"error: {tmp_path}/bad{EVIL_SHOWN}.parquet: "), line


def test_unexpected_errors_and_the_spinner_show_names_escaped(monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """An unexpected error's message (cli/main.py) and a spinner's label quote input: both escaped, no markup."""
    from rich.text import Text

    from eroica.cli import main as cli_main
    from eroica.cli import progress

    shown: list[object] = []

    class FakeStatus:
        def __init__(self, label: object) -> None:
            shown.append(label)

        def __enter__(self) -> "FakeStatus":
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def update(self, label: object) -> None:
            shown.append(label)

    monkeypatch.setattr(progress, "progress_wanted", lambda enabled=True: enabled)
    monkeypatch.setattr("rich.console.Console.status", lambda self, label: FakeStatus(label))
    with progress.spinner(f"importing [bold]{EVIL}") as status:
        status.update(f"{EVIL} 1 message")
    assert all(isinstance(s, Text) for s in shown), shown            # plain text: "[bold]" is no markup
    assert [s.plain for s in shown] == [f"importing [bold]{EVIL_SHOWN}",  # type: ignore[attr-defined]
                                        f"importing [bold]{EVIL_SHOWN}: {EVIL_SHOWN} 1 message"]

    def boom(*a: object, **k: object) -> None:
        raise RuntimeError(f"cannot read {EVIL}")

    monkeypatch.setattr(cli_main.cli, "main", boom)
    monkeypatch.setattr(cli_main.logging, "basicConfig", lambda **kw: None)   # leave the root logger alone
    with pytest.raises(SystemExit):
        cli_main.main(["sql", "x"])
    err = capsys.readouterr().err
    assert _raw(err) == [] and f"eroica sql: RuntimeError: cannot read {EVIL_SHOWN}" in err, ascii(err)
