"""``eroica sink``: run the Kafka -> ClickHouse sink worker in the foreground.

Configured by flags or the environment (``EROICA_KAFKA_*``,
``EROICA_CLICKHOUSE_*``, ``EROICA_SINK_*``; see
``sinks/clickhouse/worker_config.py``). SIGTERM or Ctrl-C stops it cleanly:
the last batch is inserted and committed before it exits.
"""

from __future__ import annotations

import sys

import click


@click.command("sink", epilog="""\b
Exit codes: 0 stopped by SIGTERM / Ctrl-C, 1 runtime error (Kafka,
ClickHouse), 2 usage error.""")
@click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
              help="Kafka bootstrap servers [default: $EROICA_KAFKA_BOOTSTRAP or 127.0.0.1:9092].")
@click.option("--clickhouse", "clickhouse_url", default=None, metavar="URL",
              help="clickhouse://HOST:9000/DB or chdb:///DIR [default: $EROICA_CLICKHOUSE_URL or "
                   "clickhouse://127.0.0.1:9000/eroica].")
@click.option("--http-port", default=None, metavar="PORT|0|auto|off",
              help="Read-only query endpoint on 127.0.0.1 [default: $EROICA_SINK_HTTP_PORT or auto: "
                   "a free port on chdb, none on a server].")
@click.option("--group", "group_id", default=None, help="Consumer group [default: $EROICA_SINK_GROUP or eroica-sink].")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def sink(bootstrap: str | None, clickhouse_url: str | None, http_port: str | None, group_id: str | None,
         log_level: str) -> None:
    """Store verdicts and window summaries from Kafka in ClickHouse (commits only what is stored)."""
    from eroica.sinks.clickhouse.worker import serve
    from eroica.sinks.clickhouse.worker_config import SinkWorkerConfig

    overrides = {"group_id": group_id} if group_id else {}
    try:
        config = SinkWorkerConfig.from_env(bootstrap=bootstrap, clickhouse_url=clickhouse_url,
                                           http_port="env" if http_port is None else http_port, **overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sys.exit(serve(config, log_level))
