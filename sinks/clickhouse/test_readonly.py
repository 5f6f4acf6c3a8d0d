"""The read-only SQL guard's tokenizer layer (pure; engines and attacks: test_query_guard, test_sink)."""

from __future__ import annotations

import pytest
from eroica.sinks.clickhouse.readonly import ReadOnlySQLError, check_readonly_sql


@pytest.mark.parametrize(("sql", "sent"), [
    ("SELECT 1", "SELECT 1"),
    ("select 1;", "select 1"),
    ("SELECT 1 ;  ; -- bye", "SELECT 1"),
    ("SHOW TABLES", "SHOW TABLES"),
    ("DESCRIBE TABLE t", "DESCRIBE TABLE t"),
    ("desc t", "desc t"),
    ("EXISTS TABLE t", "EXISTS TABLE t"),
    ("/* hi */ SELECT 1", "/* hi */ SELECT 1"),
    ("SELECT ';DROP TABLE t' AS s", "SELECT ';DROP TABLE t' AS s"),
    ("SELECT 'it''s; fine'", "SELECT 'it''s; fine'"),
    ("SELECT 'a\\';b'", "SELECT 'a\\';b'"),
    ("SELECT `rank` FROM eroica.`verdicts`", "SELECT `rank` FROM eroica.`verdicts`"),
    ("SELECT countIf(rank > 1), quantile(0.5)(score) FROM eroica.verdicts",
     "SELECT countIf(rank > 1), quantile(0.5)(score) FROM eroica.verdicts"),
    ("SHOW TABLES FROM eroica LIKE 'v%'", "SHOW TABLES FROM eroica LIKE 'v%'"),
    ("SHOW CREATE TABLE eroica.summaries", "SHOW CREATE TABLE eroica.summaries"),
    ("WITH w AS (SELECT job FROM eroica.verdicts) SELECT * FROM w",
     "WITH w AS (SELECT job FROM eroica.verdicts) SELECT * FROM w"),
    ("SELECT formatDateTime(now(), '%Y')", "SELECT formatDateTime(now(), '%Y')"),
    ("WITH 2 AS x SELECT x", "WITH 2 AS x SELECT x"),
])
def test_accepts_one_read_statement(sql: str, sent: str) -> None:
    assert check_readonly_sql(sql) == sent


@pytest.mark.parametrize("sql", [
    "DROP TABLE t",
    "drop table t",
    "INSERT INTO t VALUES (1)",
    "ALTER TABLE t DELETE WHERE 1",
    "TRUNCATE TABLE t",
    "OPTIMIZE TABLE t FINAL",
    "SYSTEM SHUTDOWN",
    "SET readonly = 0",
    "KILL QUERY WHERE 1",
    "SELECT 1; DROP TABLE t",
    "select 1;select 2",
    "SELECT 1 -- c\n; DROP TABLE t",
    "SELECT 1 /* ; */; DROP TABLE t",
    "SELECT \"a\\\"\"; DROP TABLE t",
    "SELECT 1 INTO OUTFILE '/tmp/x'",
    "SELECT 1 FORMAT CSV",
    "SELECT `x;y` FROM t",
    "SELECT 'unterminated",
    # table functions, other databases, settings, formats, dictionaries, functions that reach out
    "DESCRIBE TABLE file('/etc/shadow', 'TSVWithNames')",
    "DESC url('http://127.0.0.1:1/x', 'CSV')",
    "SELECT * FROM file('/etc/passwd', 'TSV', 'l String')",
    "SELECT * FROM numbers(10)",
    "SELECT * FROM s3('http://x/y')",
    "SELECT * FROM remote('127.0.0.1', system.one)",
    "SELECT * FROM system.tables",
    "SELECT * FROM `system`.`users`",
    "SELECT * FROM system . processes",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM other_db.t",
    "SELECT 1 WHERE 1 IN system.one",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT 1 FORMAT CSV",
    "SELECT dictGet('d', 'a', toUInt64(1))",
    "SELECT joinGet('j', 'a', 1)",
    "SELECT url('http://127.0.0.1:1/')",
    "SELECT hostName()",
    "SELECT sleep(3)",
    "SHOW DATABASES",
    "SHOW PROCESSLIST",
    "SHOW TABLES FROM system",
    "SHOW CREATE TABLE system.users",
    "DESCRIBE (SELECT 1)",
    "EXISTS DATABASE system",
    "SELECT {p:UInt8}",
    "SELECT $$x$$",
    "SELECT 1 # comment",
    "SELECT 'a' \u00a0FROM eroica.verdicts",
    "SELECT 1 -- c\rFROM file('/etc/passwd')",
    "SELECT 1 /* open",
    "",
    "   ",
    "-- only a comment",
])
def test_refuses_everything_else(sql: str) -> None:
    with pytest.raises(ReadOnlySQLError):
        check_readonly_sql(sql)


@pytest.mark.parametrize("sql", [
    # sharded (EROICA_CLICKHOUSE_CLUSTER): the Distributed tables keep the names; the shard-local ones are Eroica's too
    "SELECT count() FROM verdicts FINAL",
    "SELECT count() FROM eroica.verdicts_local FINAL",
    "SELECT job, sum(beta) FROM eroica.summaries_local GROUP BY job",
    "SHOW CREATE TABLE eroica.verdicts",
    "DESCRIBE TABLE verdicts_local",
])
def test_accepts_the_sharded_tables(sql: str) -> None:
    assert check_readonly_sql(sql) == sql


@pytest.mark.parametrize("sql", [
    # ... but never a table function that reads the cluster's servers around the guard
    "SELECT count() FROM remote('127.0.0.1:9001', eroica.verdicts_local)",
    "SELECT count() FROM remoteSecure('127.0.0.1:9440', eroica, verdicts_local)",
    "SELECT count() FROM cluster('eroica_shards', eroica, verdicts_local)",
    "SELECT count() FROM clusterAllReplicas('eroica_shards', eroica.verdicts_local)",
    "SELECT * FROM eroica.verdicts WHERE job IN (SELECT job FROM cluster('eroica_shards', system, one))",
    "DESCRIBE TABLE remote('127.0.0.1', eroica.verdicts_local)",
])
def test_refuses_cluster_table_functions(sql: str) -> None:
    with pytest.raises(ReadOnlySQLError):
        check_readonly_sql(sql)
