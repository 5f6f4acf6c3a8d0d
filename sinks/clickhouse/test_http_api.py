"""The sink's HTTP endpoint answers reads and refuses every write, on both backends."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse import ReadOnlySQLError, VerdictSink
from eroica.sinks.clickhouse.endpoint import EndpointClient
from eroica.sinks.clickhouse.http_api import QueryServer

T0 = 1_700_000_000_000_000_000
W = 10_000_000_000


@pytest.fixture
def served(verdict_sink: VerdictSink, make_verdict: Callable[..., Verdict]) -> Iterator[tuple[QueryServer, list]]:
    verdict_sink.ensure_schema()
    verdicts = [make_verdict(job="a", rank=1, window_start_ns=T0), make_verdict(job="a", rank=2, window_start_ns=T0 + W),
                make_verdict(job="b", rank=3, component="nic", window_start_ns=T0 + 2 * W)]
    verdict_sink.write_verdicts(verdicts)
    server = QueryServer(verdict_sink, 0, health=lambda: {"verdicts": 3}).start()
    try:
        yield server, verdicts
    finally:
        server.stop()


def _http(url: str, method: str = "GET", body: bytes | None = None,
          ctype: str = "text/plain") -> tuple[int, dict | list]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_health_and_verdict_filters(served: tuple[QueryServer, list]) -> None:
    server, verdicts = served
    assert server.url.startswith("http://127.0.0.1:")
    status, health = _http(server.url + "/health")
    assert status == 200 and health["status"] == "ok" and health["verdicts"] == 3
    client = EndpointClient(server.url)
    assert [v.rank for v in client.verdicts()] == [3, 2, 1]  # newest window first
    assert client.verdicts(job="a", limit=1)[0] == verdicts[1]
    assert [v.rank for v in client.verdicts(component="nic")] == [3]
    # since_ns keeps windows that end at or after it
    assert [v.rank for v in client.verdicts(since_ns=T0 + 2 * W)] == [3, 2]
    assert [v.rank for v in client.verdicts(since_ns=T0 + 3 * W)] == [3]
    assert _http(server.url + "/verdicts?limit=0")[0] == 400
    assert _http(server.url + "/verdicts?since_ns=yesterday")[0] == 400


def test_sql_reads(served: tuple[QueryServer, list]) -> None:
    server, _ = served
    client = EndpointClient(server.url)
    table = server.sink.config.verdicts
    res = client.sql(f"SELECT job, count() AS n FROM {table} FINAL GROUP BY job ORDER BY job")
    assert res.columns == ["job", "n"] and [tuple(r) for r in res.rows] == [("a", 2), ("b", 1)]
    status, doc = _http(server.url + "/sql", "POST", json.dumps({"sql": "SELECT 1 AS one"}).encode(),
                        "application/json")
    assert status == 200 and doc["rows"] == [[1]]


@pytest.mark.parametrize("sql", [
    "INSERT INTO {t} SELECT * FROM {t}",
    "DROP TABLE {t}",
    "SELECT 1; DROP TABLE {t}",
    "ALTER TABLE {t} DELETE WHERE 1",
    "SELECT * FROM {t} INTO OUTFILE '/tmp/x'",
    "TRUNCATE TABLE {t}",
])
def test_sql_refuses_writes_and_nothing_changes(served: tuple[QueryServer, list], sql: str) -> None:
    server, _ = served
    t = server.sink.config.verdicts
    client = EndpointClient(server.url)
    with pytest.raises(ReadOnlySQLError):
        client.sql(sql.format(t=t))
    assert client.sql(f"SELECT count() FROM {t}").rows == [(3,)]


def test_methods_and_paths(served: tuple[QueryServer, list]) -> None:
    server, _ = served
    for method in ("PUT", "DELETE", "PATCH"):
        assert _http(server.url + "/sql", method, b"SELECT 1")[0] == 405
    assert _http(server.url + "/sql")[0] == 405  # GET /sql
    assert _http(server.url + "/verdicts", "POST", b"x")[0] == 405
    assert _http(server.url + "/nope")[0] == 404
    assert _http(server.url + "/sql", "POST", b"")[0] == 400
    status, doc = _http(server.url + "/sql", "POST", b"SELECT no_such_column FROM system.one")
    assert status == 400 and "no_such_column" in doc["error"].lower()
