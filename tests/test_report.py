"""`eroica report`: the page of a 64-rank run with one throttled GPU, checked in headless Chromium.

- the data behind the heat-map (each SVG cell's ``data-rank``/``data-slowdown``)
  makes rank 13 the hot row, and only its row is framed as the culprit;
- the page is self-contained (nothing to fetch);
- Debian's ``chromium`` loads it with no console message and no uncaught
  error, its script runs, and the screenshot is a real picture; it is kept
  as ``artifacts/report-64-ranks-gpu-throttle.png`` (gitignored);
- ``--job`` builds the same kind of page from ClickHouse (server 18.16 and chdb).

Chromium is installed by ``.ci/install-chromium.sh``; without it the browser
test skips locally and fails under CI.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CELL = re.compile(r'<rect class="cell"[^>]*?data-rank="(\d+)"[^>]*?data-slowdown="([0-9.]*)"')


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed (CI is set): run .ci/install-chromium.sh", pytrace=False)
    pytest.skip("chromium is not installed (.ci/install-chromium.sh installs it)")
    raise AssertionError


def _chromium_run(browser: str, page: Path, tmp: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr", "--v=0", "--window-size=1400,2000", *extra, page.resolve().as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90)


def _console_problems(stderr: str) -> list[str]:
    """Console messages (any level) and uncaught errors that Chromium logged for the page."""
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture(scope="module")
def throttled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "8", "--gpus", "8", "--steps", "60",
                                   "--fault", "gpu_throttle:rank=13", "--seed", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


@pytest.fixture(scope="module")
def report_page(throttled_run: Path) -> Path:
    page = throttled_run.with_name("report.html")
    res = CliRunner().invoke(cli, ["report", str(throttled_run), "-o", str(page), "--quiet"])
    assert res.exit_code == 0, res.output
    return page


def _rows(html: str) -> dict[int, float]:
    rows: dict[int, float] = defaultdict(float)
    for rank, value in CELL.findall(html):
        if value:
            rows[int(rank)] = max(rows[int(rank)], float(value))
    return rows


def test_the_throttled_rank_is_the_hot_row(report_page: Path) -> None:
    html = report_page.read_text()
    rows = _rows(html)
    assert len(rows) == 64
    hottest = max(rows, key=rows.get)
    assert hottest == 13, sorted(rows.items(), key=lambda kv: -kv[1])[:3]
    others = sorted(v for r, v in rows.items() if r != 13)
    assert rows[13] > 1.25 and rows[13] > others[-1] + 0.2          # it stands out, not by a hair
    assert re.findall(r'<g class="row" data-rank="(\d+)"[^>]*data-culprit="1"', html) == ["13"]
    assert "rank 13 on node-1" in html and 'class="verdict-window"' in html
    assert "SM clock" in html and "1,410 MHz" in html                  # the culprit's counters vs peers


def test_the_page_is_self_contained(report_page: Path) -> None:
    html = report_page.read_text()
    assert not re.search(r"<(link|img|iframe)\b|\bsrc\s*=|@import|url\(", html, re.I)
    assert not re.search(r'href="(?!#)', html)
    assert re.findall(r"https?://[^\"' ]+", html) == ["http://www.w3.org/2000/svg"] * html.count("<svg ")


def test_chromium_renders_it_without_console_errors(report_page: Path, tmp_path: Path) -> None:
    browser = _chromium()
    # the check itself: a page with a script error is caught
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>")
    assert _console_problems(_chromium_run(browser, bad, tmp_path, "--dump-dom").stderr)

    shot = tmp_path / "report.png"
    res = _chromium_run(browser, report_page, tmp_path, f"--screenshot={shot}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert _console_problems(res.stderr) == [], "\n".join(_console_problems(res.stderr))
    data = shot.read_bytes()
    assert _png_size(data) == (1400, 2000)
    assert len(data) > 40_000, f"screenshot of {len(data)} bytes: blank page?"
    dom = _chromium_run(browser, report_page, tmp_path, "--dump-dom")
    assert 'data-ready="1"' in dom.stdout, "the page's script did not run to its end"
    assert _console_problems(dom.stderr) == []
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / "report-64-ranks-gpu-throttle.png"
    shutil.copyfile(shot, kept)
    shutil.copyfile(report_page, ARTIFACTS / "report-64-ranks-gpu-throttle.html")
    print(f"\nscreenshot: {kept}", file=sys.stderr)


def test_report_from_clickhouse(clickhouse_config, tmp_path: Path) -> None:
    """--job: verdicts and summaries from the tables give the same hot row."""
    from eroica.models.reader import read_batches
    from eroica.producers.simulator import SimConfig, write_jsonl
    from eroica.sinks.clickhouse import VerdictSink
    from eroica.sinks.report.core import run_core

    run = tmp_path / "small.jsonl"
    write_jsonl(SimConfig(nodes=2, gpus=4, steps=45, faults=["gpu_throttle:rank=5"], seed=3), run, truth_path=False)
    results = list(run_core(read_batches(run), 20 * 10**9, detected_at_ns=1))
    with VerdictSink(clickhouse_config) as sink:
        sink.ensure_schema()
        sink.write_verdicts([v for r in results for v in r.verdicts])
        sink.write_summaries([s for r in results for s in r.summaries], written_at_ns=1)
    if clickhouse_config.backend == "chdb":
        url = f"chdb://{clickhouse_config.chdb_path}?database={clickhouse_config.database}"
    else:
        url = f"clickhouse://{clickhouse_config.host}:{clickhouse_config.port}/{clickhouse_config.database}"
    page = tmp_path / "db.html"
    res = CliRunner().invoke(cli, ["report", "--job", "sim-3", "--clickhouse", url, "-o", str(page), "-q"],
                             env={"EROICA_DATA_DIR": str(tmp_path / "none")})
    assert res.exit_code == 0, res.output
    html = page.read_text()
    rows = _rows(html)
    assert max(rows, key=rows.get) == 5 and len(rows) == 8
    assert "ClickHouse" in html and "the verdict&#x27;s evidence" in html
    missing = CliRunner().invoke(cli, ["report", "--job", "nope", "--clickhouse", url, "-o", str(page)],
                                 env={"EROICA_DATA_DIR": str(tmp_path / "none")})
    assert missing.exit_code == 1 and "nothing stored" in missing.output


def test_healthy_run_and_usage_errors(tmp_path: Path) -> None:
    run = tmp_path / "healthy.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "30", "-o", str(run)])
    assert res.exit_code == 0, res.output
    page = tmp_path / "healthy.html"
    res = CliRunner().invoke(cli, ["report", str(run), "-o", str(page), "--window", "10", "-q"])
    assert res.exit_code == 0, res.output
    html = page.read_text()
    assert "No verdict" in html and 'data-culprit="1"' not in html and len(_rows(html)) == 8
    assert CliRunner().invoke(cli, ["report", "-o", str(page)]).exit_code == 2          # neither FILE nor --job
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "fn"}\n')
    assert CliRunner().invoke(cli, ["report", str(bad), "-o", str(page)]).exit_code == 3  # no valid record
    assert CliRunner().invoke(cli, ["alert"]).exit_code == 2                             # no webhook
