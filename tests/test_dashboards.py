"""Every SQL query of the Grafana dashboards runs on ClickHouse 18.16 and on chdb.

Each panel's ``rawSql`` and each query variable is taken from
``deploy/grafana/dashboards/*.json``, its Grafana macros and variables are
replaced by concrete values exactly as the ClickHouse data source plugin
expands them (``$__fromTime`` -> ``toDateTime(<unix s>)``, ``$__timeFilter(c)``
-> ``c >= toDateTime(a) AND c <= toDateTime(b)``, ``$__interval_s`` -> an
integer), the ``eroica`` database is renamed to the test's own, and the query
runs read-only against tables holding a few verdicts and window summaries.
Queries that must find something (the open incidents, the job's heat-map)
are checked for rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict, finding_key, incident_id, verdict_id
from eroica.sinks.clickhouse import VerdictSink

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
S = 10**9
T0 = 1_700_000_000          # the data's first window (unix seconds)
FROM, TO = T0 - 3600, T0 + 120   # the dashboard's time range: the last window ends within `open_s` of TO
VALUES = {"job": "job-1", "open_s": "300", "min_confidence": "0.7"}


def _queries() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for var in dash["templating"]["list"]:
            if var["type"] == "query":
                out.append((path.stem, f"variable {var['name']}", var["query"]))
        for panel in dash["panels"]:
            for t in panel.get("targets", []):
                out.append((path.stem, panel["title"], t["rawSql"]))
    return out


QUERIES = _queries()


def expand(sql: str, database: str) -> str:
    """Grafana's macros and variables -> concrete SQL (as the ClickHouse plugin expands them)."""
    sql = re.sub(r"\$__timeFilter\(([^()]+)\)",
                 lambda m: f"{m[1]} >= toDateTime({FROM}) AND {m[1]} <= toDateTime({TO})", sql)
    sql = sql.replace("$__fromTime", f"toDateTime({FROM})").replace("$__toTime", f"toDateTime({TO})")
    sql = sql.replace("$__interval_s", "60")
    for name, value in VALUES.items():
        sql = sql.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in sql, f"unexpanded macro or variable in: {sql}"
    return re.sub(r"\beroica\.(verdicts|summaries)\b", rf"`{database}`.\1", sql)


def _verdict(window: int, rank: int = 13, component: str = "gpu", confidence: float = 0.95) -> Verdict:
    key = finding_key("job-1", "slow", component, "rank", "node-1", rank, 5, "gemm")
    start = (T0 + window * 30) * S
    return Verdict(verdict_id=verdict_id(start, start + 30 * S, key), job="job-1", window_start_ns=start,
                   window_end_ns=start + 30 * S, detected_at_ns=start + 31 * S, kind="slow", component=component,
                   scope="rank", node="node-1", rank=rank, gpu=5, fn="gemm", slowdown=1.4, score=9.0,
                   confidence=confidence, peers=[0, 1, 2], victims=[0, 1], evidence={},
                   summary="rank 13 on node-1: GPU 5 throttled", incident_id=incident_id(key))


def _summaries() -> list[WindowSummary]:
    rows = []
    for window in range(3):
        start = (T0 + window * 30) * S
        for rank in range(4):
            for fn, kind in (("gemm", "kernel"), ("ncclAllReduce", "collective"), ("train_step", "python")):
                slow = 1.4 if (rank == 3 and kind == "kernel") else float("nan") if fn == "train_step" and rank == 0 else 1.0
                rows.append(WindowSummary(job="job-1", window_start_ns=start, window_end_ns=start + 30 * S, rank=rank,
                                          node=f"node-{rank // 2}", fn=fn, kind=kind, count=10, median_ns=1e6,
                                          p90_ns=1.2e6, p99_ns=1.5e6, total_ns=1e7, beta=0.3, slowdown_vs_peers=slow))
    return rows


@pytest.fixture
def loaded(clickhouse_config):
    sink = VerdictSink(clickhouse_config)
    sink.ensure_schema()
    sink.write_verdicts([_verdict(w) for w in range(3)] + [_verdict(2, rank=2, component="nic", confidence=0.5)])
    sink.write_summaries(_summaries(), written_at_ns=1)
    yield sink, clickhouse_config.database
    sink.close()


def test_there_are_three_dashboards_with_queries() -> None:
    assert {p.stem for p in DASHBOARDS} == {"fleet", "job", "pipeline"}
    per = {name: sum(1 for d, _t, _q in QUERIES if d == name) for name in ("fleet", "job", "pipeline")}
    assert all(n >= 5 for n in per.values()), per


def test_every_dashboard_query_runs(loaded) -> None:
    sink, database = loaded
    results = {}
    failures = []
    for dash, title, sql in QUERIES:
        try:
            results[(dash, title)] = sink.run_readonly_sql(expand(sql, database))
        except Exception as exc:  # noqa: BLE001 - collect them all, report together
            failures.append(f"{dash} / {title}: {exc}")
    assert not failures, "\n".join(failures)
    # the numbers the inserted rows imply
    assert results[("fleet", "Open incidents")].rows == [(1,)]
    by_component = dict(results[("fleet", "Open incidents by component")].rows)
    assert by_component == {"gpu": 1}                     # the nic verdict is below the confidence threshold
    assert results[("job", "variable job")].rows == [("job-1",)]
    heat = results[("job", "Per-rank heat-map: slowest function against peers")]
    assert len(heat.rows) == 3 * 4 and max(r[2] for r in heat.rows) == pytest.approx(1.4)
    assert results[("pipeline", "Windows analysed")].rows == [(3,)]
