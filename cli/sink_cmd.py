"""``eroica sink``: run the Kafka -> ClickHouse sink worker in the foreground.

Configured by flags or the environment (``EROICA_KAFKA_*``,
``EROICA_CLICKHOUSE_*``, ``EROICA_SINK_*``; see
``sinks/clickhouse/worker_config.py``). SIGTERM or Ctrl-C stops it cleanly:
the last batch is inserted and committed before it exits.
"""

from __future__ import annotations

import logging
import signal
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
    from eroica.sinks.clickhouse.client import ClickHouseError
    from eroica.sinks.clickhouse.worker import SinkWorker
    from eroica.sinks.clickhouse.worker_config import SinkWorkerConfig

    logging.basicConfig(level=getattr(logging, log_level.upper()), stream=sys.stderr,
                        format="%(asctime)s eroica sink %(levelname)s: %(message)s")
    from eroica.stack.logfilter import install as limit_repeats

    limit_repeats()  # one line per kind of error every 30 s while the broker or ClickHouse is away
    overrides = {"group_id": group_id} if group_id else {}
    try:
        config = SinkWorkerConfig.from_env(bootstrap=bootstrap, clickhouse_url=clickhouse_url,
                                           http_port="env" if http_port is None else http_port, **overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    worker = SinkWorker(config)

    def on_signal(signum: int, _frame: object) -> None:
        logging.getLogger("eroica.sink").info("%s: finishing the current batch", signal.Signals(signum).name)
        worker.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stats = worker.run()
    except ClickHouseError as exc:
        click.echo(f"eroica sink: {exc}", err=True)
        sys.exit(1)
    click.echo(f"eroica sink: stopped; {stats.consumed} messages, {stats.verdicts} verdict rows, "
               f"{stats.summaries} summary rows, {stats.deadletters} dead letters, {stats.commits} commits",
               err=True)
