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
    _TOKENS[server.url] = server.token
    try:
        yield server, verdicts
    finally:
        _TOKENS.pop(server.url, None)
        server.stop()


_TOKENS: dict[str, str] = {}  # server url -> its token (set by the fixture)


def _http(url: str, method: str = "GET", body: bytes | None = None,
          ctype: str = "text/plain", token: str | None = "auto") -> tuple[int, dict | list]:
    headers = {"Content-Type": ctype}
    if token == "auto":
        token = next((t for u, t in _TOKENS.items() if url.startswith(u)), None)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=body, method=method, headers=headers)
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
    client = EndpointClient(server.url, token=server.token)
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
    client = EndpointClient(server.url, token=server.token)
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
    client = EndpointClient(server.url, token=server.token)
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
    status, doc = _http(server.url + "/sql", "POST", f"SELECT no_such_column FROM {server.sink.config.verdicts}".encode())
    assert status == 400 and "no_such_column" in doc["error"].lower()


# -- the locked surface (issue 10, item 5): who may ask, and how much -------------------------
def _raw(server: QueryServer, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> tuple[int, dict]:
    """A request with exactly these headers (http.client lets Host and Origin be anything)."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders(body or None)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"{}")
    finally:
        conn.close()


def _good(server: QueryServer, **extra: str) -> dict[str, str]:
    return {"Host": f"127.0.0.1:{server.port}", "Authorization": f"Bearer {server.token}", **extra}


def test_token_required_on_every_data_path(served: tuple[QueryServer, list]) -> None:
    server, _ = served
    sql = b"SELECT 1"
    for headers in ({"Host": f"127.0.0.1:{server.port}"},
                    {"Host": f"127.0.0.1:{server.port}", "Authorization": "Bearer wrong-token"},
                    {"Host": f"127.0.0.1:{server.port}", "Authorization": server.token},  # no Bearer
                    {"Host": f"127.0.0.1:{server.port}", "Authorization": f"Basic {server.token}"}):
        assert _raw(server, "POST", "/sql", {**headers, "Content-Length": str(len(sql))}, sql)[0] == 401
        assert _raw(server, "GET", "/verdicts", headers)[0] == 401
    assert _raw(server, "POST", "/sql", _good(server, **{"Content-Length": str(len(sql))}), sql) == (
        200, {"columns": ["1"], "types": ["UInt8"], "rows": [[1]]})
    with pytest.raises(Exception, match="401"):
        EndpointClient(server.url).sql("SELECT 1")
    # /health stays open for the supervisor's probe, without the target; with the token, the target too
    status, doc = _raw(server, "GET", "/health", {"Host": f"127.0.0.1:{server.port}"})
    assert status == 200 and doc["status"] == "ok" and "target" not in doc
    assert "target" in _raw(server, "GET", "/health", _good(server))[1]


@pytest.mark.parametrize("host", ["evil.example:{port}", "127.0.0.1", "127.0.0.1:1", "localhost.evil:{port}",
                                  "", "127.0.0.1:{port}.evil"])
def test_wrong_host_refused(served: tuple[QueryServer, list], host: str) -> None:
    """DNS rebinding: a page on evil.example rebinds its name to 127.0.0.1 and sends its own Host."""
    server, _ = served
    headers = _good(server)
    headers["Host"] = host.format(port=server.port)
    assert _raw(server, "GET", "/verdicts", headers)[0] == 403
    assert _raw(server, "GET", "/health", headers)[0] == 403
    assert _raw(server, "GET", "/verdicts", _good(server, Host=f"localhost:{server.port}"))[0] == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1:{port}"])
def test_foreign_origin_refused(served: tuple[QueryServer, list], origin: str) -> None:
    """A web page's cross-site POST carries its Origin: refused even with a valid token and Host."""
    server, _ = served
    sql = b"SELECT 1"
    headers = _good(server, Origin=origin.format(port=server.port), **{"Content-Length": str(len(sql)),
                                                                       "Content-Type": "text/plain"})
    assert _raw(server, "POST", "/sql", headers, sql)[0] == 403
    own = _good(server, Origin=f"http://127.0.0.1:{server.port}", **{"Content-Length": str(len(sql))})
    assert _raw(server, "POST", "/sql", own, sql)[0] == 200


def test_request_sizes_bounded(served: tuple[QueryServer, list]) -> None:
    from eroica.sinks.clickhouse.http_api import MAX_BODY_BYTES

    server, _ = served
    big = b"SELECT 1 -- " + b"x" * MAX_BODY_BYTES
    assert _raw(server, "POST", "/sql", _good(server, **{"Content-Length": str(len(big))}), big)[0] == 413
    # a length announced but never sent is not read either
    assert _raw(server, "POST", "/sql", _good(server, **{"Content-Length": str(1 << 40)}))[0] == 413
    assert _raw(server, "POST", "/sql", _good(server, **{"Transfer-Encoding": "chunked"}))[0] == 411
    status, doc = _http(server.url + "/sql", "POST", b"SELECT 1 -- " + b"x" * (MAX_BODY_BYTES - 100))
    assert status == 200


@pytest.mark.parametrize("value", [str(2**64), str(2**63), "-1", "1" * 100, "1e30"])
def test_since_ns_out_of_range_is_an_error_not_a_wrap(served: tuple[QueryServer, list], value: str) -> None:
    server, _ = served
    status, doc = _http(server.url + f"/verdicts?since_ns={value}")
    assert status == 400 and "since_ns" in doc["error"]
    assert _http(server.url + f"/verdicts?since_ns={2**63 - 1}") == (200, [])


def test_endpoint_refuses_the_reported_attacks(served: tuple[QueryServer, list]) -> None:
    from listener import Listener

    from .test_query_guard import _exfiltration

    server, _ = served
    client = EndpointClient(server.url, token=server.token)
    lis = Listener()
    try:
        for sql in ("DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
                    "SELECT * FROM file('/etc/passwd', 'TSV', 'l String')",
                    _exfiltration(lis.port, server.sink.config.database, "describe"),
                    _exfiltration(lis.port, server.sink.config.database, "select"),
                    "SELECT * FROM system.users", "SELECT 1 SETTINGS readonly = 0", "SELECT 1; SELECT 2"):
            with pytest.raises(ReadOnlySQLError):
                client.sql(sql)
        import time

        time.sleep(0.3)
        assert lis.connections == 0 and bytes(lis.received) == b""
    finally:
        lis.stop()


def test_token_file_is_private_and_stable(tmp_path) -> None:
    import os
    import stat

    from eroica.sinks.clickhouse.endpoint import ensure_token_file, read_token_file

    path = tmp_path / "sink" / "eroica-sink.token"
    token = ensure_token_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_token_file(path) == token and ensure_token_file(path) == token  # the same across restarts
    os.chmod(path, 0o644)  # someone widened it: a new token, private again
    assert ensure_token_file(path) != token and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_worker_config_token_file() -> None:
    from eroica.sinks.clickhouse.worker_config import SinkWorkerConfig

    env = {"EROICA_CLICKHOUSE_URL": "chdb:///tmp/x", "EROICA_DATA_DIR": "/data/sink"}
    assert SinkWorkerConfig.from_env(env).token_file == "/data/sink/eroica-sink.token"
    env["EROICA_SINK_TOKEN_FILE"] = "/run/t"
    assert SinkWorkerConfig.from_env(env).token_file == "/run/t"
