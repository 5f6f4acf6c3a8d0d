"""Eroica sinks/clickhouse."""
