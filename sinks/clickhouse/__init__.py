"""ClickHouse verdict sink (after Vector's ClickHouse sink).

``config`` (where), ``schema`` (DDL), ``shaping`` (pure record <-> row),
``client`` (the I/O, server or chdb), ``readonly`` (user-SQL guard) and
``sink`` (VerdictSink). clickhouse-driver and chdb are optional dependencies
(the ``sink`` extra) and are imported only when a client of that kind opens.
"""

from .client import ClickHouseError, ClickHouseUnavailableError, QueryResult, open_client
from .config import ClickHouseConfig, RetryPolicy
from .readonly import ReadOnlySQLError, check_readonly_sql
from .shaping import WindowSummary
from .sink import SchemaMismatchError, VerdictSink

__all__ = [
    "ClickHouseConfig", "RetryPolicy", "VerdictSink", "WindowSummary", "QueryResult",
    "ClickHouseError", "ClickHouseUnavailableError", "SchemaMismatchError", "ReadOnlySQLError",
    "check_readonly_sql", "open_client",
]
