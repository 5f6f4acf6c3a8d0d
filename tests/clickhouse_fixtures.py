"""ClickHouse fixtures (Debian clickhouse-server 18.16 started by hand, and chdb)."""
