"""The read-only SQL guard (pure; the engines' own readonly is tested in test_sink)."""

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
    ("SELECT `x;y` FROM t", "SELECT `x;y` FROM t"),
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
    "SELECT 'unterminated",
    "SELECT 1 /* open",
    "",
    "   ",
    "-- only a comment",
])
def test_refuses_everything_else(sql: str) -> None:
    with pytest.raises(ReadOnlySQLError):
        check_readonly_sql(sql)
