"""Where verdicts land: ClickHouse (``python -m eroica.sinks.clickhouse``) and the alert consumer
(``eroica alert``).
"""
