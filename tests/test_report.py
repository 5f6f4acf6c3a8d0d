"""`eroica report`: the page of a 64-rank and of a 1,024-rank run with one throttled GPU, checked in
headless Chromium.

- the data behind the heat-map (each SVG cell's ``data-rank``/``data-slowdown``)
  makes rank 13 the hot row, and only its row is framed as the culprit;
- readable: every row label whole ("rank 13 · node-1 · GPU 5", room made for
  it), column headers distinct (three GEMM kernels that differ in the middle of
  a 118-character name), table headers never broken inside a word, counters
  red only when worse in their bad direction (fewer retransmits is not red),
  a timeline for a 3-window job that states the numbers, a cost bar per
  culprit from the verdicts' optional cost fields (and no panel without them);
- at 1,024 ranks, a node x GPU grid (one cell per rank, 128 nodes) and the
  culprit node's rank x function detail instead of 1,024 rows; the page's
  script draws another node's detail (``#node=node-3``);
- the page is self-contained (nothing to fetch);
- Debian's ``chromium`` loads it with no console message and no uncaught
  error, its script runs, and the screenshot is a real picture; they are kept
  as ``artifacts/report-64-ranks-gpu-throttle.png`` and
  ``artifacts/report-1024-ranks-gpu-throttle.png`` (gitignored);
- ``--job`` builds the same kind of page from ClickHouse (server 18.16 and chdb).

Chromium is installed by ``.ci/install-chromium.sh``; without it the browser
test skips locally and fails under CI.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from collections import defaultdict
from html import unescape
from html.parser import HTMLParser
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


def _chromium_run(browser: str, page: Path, tmp: Path, *extra: str, fragment: str = "") -> subprocess.CompletedProcess:
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}",
            "--enable-logging=stderr", "--v=0", "--window-size=1400,2000", *extra, page.resolve().as_uri() + fragment]
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


@pytest.fixture(scope="module")
def big_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,024 ranks (128 nodes x 8 GPUs), rank 517 (node-64, GPU 5) throttled; 30 steps, 10 s windows."""
    out = tmp_path_factory.mktemp("report1024") / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "128", "--gpus", "8", "--steps", "30", "--start", "default",
                                   "--fault", "gpu_throttle:rank=517", "--seed", "1", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.with_name("report.html")
    res = CliRunner().invoke(cli, ["report", str(out), "-o", str(page), "--window", "10", "--quiet"])
    assert res.exit_code == 0, res.output
    out.unlink()  # 1.2 M records: not kept
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


def test_labels_headers_and_width(report_page: Path) -> None:
    """Whole row labels with room for them, distinct column headers, no header broken inside a word."""
    from eroica.report.render import CHAR_W, _CSS

    html = report_page.read_text()
    assert ">rank 13 · node-1 · GPU 5</text>" in html           # the culprit's label, whole
    labels = re.findall(r'<text class="rowlabel[^"]*" data-rank="\d+" x="(\d+)"[^>]*>([^<]+)</text>', html)
    assert len(labels) == 64
    assert all(int(x) >= CHAR_W * len(unescape(text)) for x, text in labels)  # none clipped at the left
    headers = re.findall(r'rotate\(-60\)" data-fn="[^"]*"><title>[^<]*</title>([^<\']+)</text>', html)
    assert len(headers) == len(set(headers)) >= 10
    assert sum("sm90_xmma" in h for h in headers) == 3 and all(len(unescape(h)) <= 40 for h in headers)
    th_rule = re.search(r"\nth \{[^}]*\}", _CSS).group(0)
    cell_rule = re.search(r"th, td \{[^}]*\}", _CSS).group(0)
    assert "white-space: nowrap" in th_rule and "anywhere" not in cell_rule
    width = int(re.search(r'<svg class="heatmap"[^>]* width="(\d+)"', html).group(1))
    assert width >= 1100                                            # the page's width, not 40% of it


def test_short_job_timeline_states_the_numbers(report_page: Path) -> None:
    """3 windows: one bar group per window with its values, step time and verdict count, and a sentence."""
    html = report_page.read_text()
    assert len(re.findall(r'class="verdict-window"', html)) == 3
    culprit = [float(v) for v in re.findall(r'data-series="culprit_x" data-value="([0-9.]+)"', html)]
    other = [float(v) for v in re.findall(r'data-series="other_x" data-value="([0-9.]+)"', html)]
    assert len(culprit) == len(other) == 3 and min(culprit) > 1.3 and max(other) < 1.15
    assert "rank 13&#x27;s hottest function ran at 1.4" in html and "median step" in html
    assert re.search(r"step \d{3} ms · 1 verdict", html)


def test_cost_bar_per_culprit_with_or_without_the_optional_fields(throttled_run: Path) -> None:
    import msgspec

    from eroica.models.reader import read_batches
    from eroica.models.verdict import Verdict
    from eroica.report.core import run_core
    from eroica.report.data import culprit_costs, from_windows
    from eroica.report.render import render_page

    results = list(run_core(read_batches(throttled_run), 30 * 10**9, detected_at_ns=1))
    rep = from_windows("sim-1", results, "test", 30 * 10**9)
    fields = {"job_slowdown", "cost", "gpu_hours_lost_per_hour"}
    if not fields <= set(Verdict.__struct_fields__):
        pytest.skip("the verdict has no cost fields yet (models/verdict.py)")
    # with the fields: a bar for rank 13, its share of the lost time
    with_cost = [msgspec.structs.replace(v, job_slowdown=1.25, cost=1.2, gpu_hours_lost_per_hour=10.7)
                 for v in rep.verdicts]
    (c,) = culprit_costs(with_cost)
    assert c.label == "rank 13 on node-1, GPU 5" and abs(c.share_of_lost - (1 - 1 / 1.2) / (1 - 1 / 1.25)) < 1e-9
    rep.verdicts, rep.costs = with_cost, culprit_costs(with_cost)
    html = render_page([rep], 0)
    assert "What it costs" in html and 'data-cost-culprit="rank 13 on node-1, GPU 5"' in html
    assert 'data-share="0.8333"' in html and "10.7 GPU-hours lost per hour" in html
    # without them (older verdicts, or objects that lack the attributes): no panel, nothing breaks
    bare = [msgspec.structs.replace(v, job_slowdown=None, cost=None, gpu_hours_lost_per_hour=None)
            for v in rep.verdicts]

    class Old:  # a verdict of before the cost fields: getattr with defaults
        def __init__(self, v: Verdict) -> None:
            self.__dict__.update({f: getattr(v, f) for f in Verdict.__struct_fields__ if f not in fields})

    assert culprit_costs(bare) == [] and culprit_costs([Old(v) for v in bare]) == []
    rep.verdicts, rep.costs = bare, culprit_costs(bare)
    assert "What it costs" not in render_page([rep], 0)


def test_counter_colour_follows_the_bad_direction() -> None:
    from eroica.report.data import CounterRow
    from eroica.report.render import _counter_row

    fewer = CounterRow("nic", "retransmits (increase)", "", 2.0, 40.0, key="retransmits_inc")
    more = CounterRow("nic", "retransmits (increase)", "", 400.0, 40.0, key="retransmits_inc")
    slow_clock = CounterRow("gpu", "SM clock", "MHz", 1410.0, 1980.0, key="sm_clock_mhz")
    power = CounterRow("gpu", "power", "W", 500.0, 690.0, key="power_w")
    same = CounterRow("gpu", "temperature", "°C", 66.0, 65.0, key="temp_c")
    assert [r.verdict for r in (fewer, more, slow_clock, power, same)] == ["better", "worse", "worse", "different", ""]
    assert 'class="worse hot"' in _counter_row(more) and 'class="worse hot"' in _counter_row(slow_clock)
    assert "hot" not in _counter_row(fewer) and "hot" not in _counter_row(power) and "hot" not in _counter_row(same)
    assert "lower: better" in _counter_row(fewer) and "higher: worse" in _counter_row(more)


def test_column_labels_are_distinct() -> None:
    from eroica.report.render import column_labels

    base = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_{}_n_tilesize{}x128x64_warpgroupsize2x1x1"
            "_execute_segment_k_off_kernel__5x_cublas")
    names = [base.format("tn", 128), base.format("nt", 256), base.format("nn", 128), "flash_fwd_kernel",
             "multi_tensor_apply_kernel<AdamFunctor<float>, 4>", "multi_tensor_apply_kernel<L2NormFunctor<float>, 1>"]
    labels = column_labels(names, 40)
    assert len(set(labels)) == len(names) and all(len(x) <= 40 for x in labels)
    assert labels[3] == "flash_fwd_kernel" and labels[4].startswith("multi_tensor_apply_kernel<Adam")


def test_1024_ranks_grid_with_drill_down(big_page: Path) -> None:
    html = big_page.read_text()
    grid = re.findall(r'<rect class="gcell( culprit)?"[^>]*data-rank="(\d+)" data-node="([^"]+)" data-gpu="(\d)" '
                      r'data-max="([0-9.]*)"', html)
    assert len(grid) == 1024 and len({(n, g) for _c, _r, n, g, _v in grid}) == 1024
    assert [(r, n, g) for c, r, n, g, _v in grid if c] == [("517", "node-64", "5")]
    hottest = max(grid, key=lambda t: float(t[4] or 0))
    assert hottest[1] == "517" and float(hottest[4]) > 1.3
    rows = _rows(html)                                   # the detail: the culprit's node, 8 rows, not 1,024
    assert sorted(rows) == list(range(512, 520)) and max(rows, key=rows.get) == 517
    assert re.findall(r'<g class="row" data-rank="(\d+)"[^>]*data-culprit="1"', html) == ["517"]
    assert len(html) < 2_000_000                         # the drill-down data is compact


def test_chromium_draws_another_node_and_keeps_the_1024_rank_screenshot(big_page: Path, tmp_path: Path) -> None:
    browser = _chromium()
    dom = _chromium_run(browser, big_page, tmp_path, "--dump-dom", fragment="#node=node-3")
    assert dom.returncode == 0 and _console_problems(dom.stderr) == [], dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout
    detail = dom.stdout.split('id="detail-0"', 1)[1].split("</svg>", 1)[0]
    assert sorted({int(r) for r in re.findall(r'<g class="row" data-rank="(\d+)"', detail)}) == list(range(24, 32))
    assert "node-3: 8 ranks" in dom.stdout
    shot = tmp_path / "big.png"
    res = _chromium_run(browser, big_page, tmp_path, f"--screenshot={shot}")
    assert res.returncode == 0 and _console_problems(res.stderr) == [], res.stderr[-2000:]
    data = shot.read_bytes()
    assert _png_size(data) == (1400, 2000) and len(data) > 40_000
    ARTIFACTS.mkdir(exist_ok=True)
    kept = ARTIFACTS / "report-1024-ranks-gpu-throttle.png"
    shutil.copyfile(shot, kept)
    shutil.copyfile(big_page, ARTIFACTS / "report-1024-ranks-gpu-throttle.html")
    print(f"\nscreenshot: {kept}", file=sys.stderr)


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
    from eroica.report.core import run_core

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


# --- names are data (issue 34, item 5): hostile job, node and function names keep the page whole ---

ISLAND = '<script type="application/json" id="eroica-data">'


@pytest.fixture(scope="module")
def hostile_pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Pages of runs whose job, nodes and functions carry hostile names: ``small`` (8 ranks, one heat-map row
    per rank, rank 5 throttled) and ``grid`` (72 ranks on 9 nodes, drawn as a node x GPU grid, rank 13 throttled)."""
    from hostile_names import hostile_run

    d = tmp_path_factory.mktemp("hostile-report")
    pages = {}
    for name, nodes, gpus, fault in (("small", 2, 4, "gpu_throttle:rank=5"), ("grid", 9, 8, "gpu_throttle:rank=13")):
        run = d / f"{name}.jsonl"
        res = CliRunner().invoke(cli, ["simulate", "--nodes", str(nodes), "--gpus", str(gpus), "--steps", "30",
                                       "--fault", fault, "--seed", "1", "-o", str(run)])
        assert res.exit_code == 0, res.output
        hostile_run(run, d / f"{name}-hostile.jsonl")
        pages[name] = d / f"{name}.html"
        res = CliRunner().invoke(cli, ["report", str(d / f"{name}-hostile.jsonl"), "-o", str(pages[name]),
                                       "--window", "10", "--quiet"])
        assert res.exit_code == 0, res.output
    return pages


class _Tags(HTMLParser):
    """The start tags of a page, each with its attributes, and the text of its <h1>s."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.h1: list[str] = []
        self._in_h1 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_h1 = tag == "h1"
        if self._in_h1:
            self.h1.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_h1 = self._in_h1 and tag != "h1"

    def handle_data(self, data: str) -> None:
        if self._in_h1:
            self.h1[-1] += data


@pytest.mark.parametrize("which", ["small", "grid"])
def test_hostile_names_keep_the_data_island_and_the_markup_intact(hostile_pages: dict[str, Path], which: str) -> None:
    from hostile_names import FNS, HOSTILE, JOB, NODES, script_text

    html = hostile_pages[which].read_text()
    start = html.index(ISLAND) + len(ISLAND)
    island = script_text(html, start)   # where a browser's tokenizer ends the element
    assert island is not None, "the data element never ends: it swallows the page's script"
    data = json.loads(island)
    assert [job["job"] for job in data] == [JOB]
    assert set(FNS.values()) <= set(data[0]["fns"])          # every hostile function name, intact
    assert not re.search(r"[<>&\u2028\u2029]", island)       # nothing for the HTML tokenizer to act on
    if which == "grid":
        assert {NODES[f"node-{i}"] for i in range(6)} <= set(data[0]["by_node"])
    # the element after the island is the page's own script, whole
    assert html[start + len(island):].startswith("</script><script>\n(function () {")
    tags = _Tags()
    tags.feed(html)
    assert [t for t, _a in tags.tags].count("script") == 2 and not {"img", "iframe", "a"} & {t for t, _a in tags.tags}
    assert tags.h1 == [f"Job {JOB}"]
    assert [a["data-job"] for t, a in tags.tags if t == "section"] == [JOB]
    assert set(FNS.values()) <= {a.get("data-fn") for t, a in tags.tags if t == "rect"}
    assert all(name in html for name in ("&lt;!channel&gt;", "&lt;!--&lt;script&gt;alert(1)&lt;/script&gt;"))
    assert not any(name in html for name in HOSTILE if "<" in name)   # no name raw in the markup


def test_json_for_script_round_trips_hostile_names() -> None:
    from eroica.report.render import json_for_script
    from hostile_names import HOSTILE, script_text

    doc = {"names": list(HOSTILE), "more": "a&b>c\u2028\u2029<!-- <script>", "n": [1, 2.5, None]}
    text = json_for_script(doc)
    assert json.loads(text) == doc and not re.search(r"[<>&\u2028\u2029]", text)
    page = f"{ISLAND}{text}</script><p>after</p>"
    assert script_text(page, len(ISLAND)) == text
    # the check itself: the escaping this page had before (only "</" escaped) lets the element run on
    old = json.dumps(doc, separators=(",", ":")).replace("</", "<\\/")
    assert script_text(f"{ISLAND}{old}</script><script>var x = 1;</script>", len(ISLAND)) is None


_CLICK_SORT = ("<script>document.querySelector('button[data-sort-target]').click();"
               "document.body.setAttribute('data-sorted', '1');</script></body>")


def test_chromium_runs_the_script_of_a_page_with_hostile_names(hostile_pages: dict[str, Path], tmp_path: Path) -> None:
    """The page's script runs to its end, sorts the heat-map by heat, and draws a hostile-named node's detail."""
    from urllib.parse import quote

    from hostile_names import NODES

    browser = _chromium()
    # 8 ranks: a test script appended after the page's own clicks "order by heat"
    small = tmp_path / "small-click.html"
    small.write_text(hostile_pages["small"].read_text().replace("</body>", _CLICK_SORT, 1))
    dom = _chromium_run(browser, small, tmp_path, "--dump-dom")
    assert dom.returncode == 0 and _console_problems(dom.stderr) == [], dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout and 'data-sorted="1"' in dom.stdout, "the page's script did not run"
    assert 'data-order="heat"' in dom.stdout and ">order by rank</button>" in dom.stdout   # the sort ran
    rows = re.findall(r'<g class="row" data-rank="(\d+)" data-max="[0-9.]+"[^>]*transform="translate\(0,([0-9.]+)\)"',
                      dom.stdout)
    assert len(rows) == 8 and min(rows, key=lambda r: float(r[1]))[0] == "5"   # the culprit's row now on top
    assert dom.stdout.count("<script") == 3 and "<img" not in dom.stdout      # no name became an element
    # 72 ranks: #node=<a hostile node name> makes the script draw that node's ranks from the data island
    node = NODES["node-4"]   # "</script><script>x</script>"
    dom = _chromium_run(browser, hostile_pages["grid"], tmp_path, "--dump-dom", fragment="#node=" + quote(node, safe=""))
    assert dom.returncode == 0 and _console_problems(dom.stderr) == [], dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout, "the page's script did not run to its end"
    detail = dom.stdout.split('id="detail-0"', 1)[1].split("</svg>", 1)[0]
    assert sorted({int(r) for r in re.findall(r'<g class="row" data-rank="(\d+)"', detail)}) == list(range(32, 40))
    assert "&lt;/script&gt;&lt;script&gt;x&lt;/script&gt;: 8 ranks" in dom.stdout
    assert dom.stdout.count("<script") == 2 and "<img" not in dom.stdout
