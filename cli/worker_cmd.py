"""``eroica worker ROLE``: run one faust stream processor (summariser or detector) in the foreground.

Configured by environment variables (``EROICA_KAFKA_*`` for Kafka, the rest
in ``eroica.streams.faust.settings``); the few options below override them.
Stops on SIGTERM or SIGINT, by ``EROICA_SHUTDOWN_TIMEOUT_S`` at the latest.
"""

from __future__ import annotations

import sys

import click

ROLES = ("summariser", "detector")


@click.command("worker", epilog="""\b
Exit codes: 0 stopped by SIGTERM / Ctrl-C, 1 runtime error, 2 usage error.""")
@click.argument("role", type=click.Choice(ROLES))
@click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
              help="Kafka bootstrap servers [default: $EROICA_KAFKA_BOOTSTRAP or 127.0.0.1:9092].")
@click.option("--app-id", default=None, help="faust application id = consumer group [default: eroica-ROLE].")
@click.option("--window", "window_s", type=click.FloatRange(min=1.0), default=None,
              help="Window length in seconds [default: $EROICA_WINDOW_S or 30].")
@click.option("--log-level", type=click.Choice(["debug", "info", "warn", "error"]), default=None,
              help="Log level [default: $EROICA_LOG_LEVEL or info].")
def worker(role: str, bootstrap: str | None, app_id: str | None, window_s: float | None,
           log_level: str | None) -> None:
    """Run the ROLE stream worker (summariser: raw frames -> window digests; detector: digests -> verdicts).

    \b
    Workers started with the same --app-id share the partitions (scale-out).
    Environment: EROICA_KAFKA_BOOTSTRAP and the other EROICA_KAFKA_* topic names,
    EROICA_WINDOW_S, EROICA_LATENESS_S, EROICA_IDLE_CLOSE_S, EROICA_DETECT_GRACE_S,
    EROICA_DATA_DIR, EROICA_WEB_PORT (0 = a free port, off = none),
    EROICA_SHUTDOWN_TIMEOUT_S, EROICA_LOG_LEVEL, EROICA_INGEST.
    """
    from eroica.kafka.config import KafkaConfig
    from eroica.streams.faust.settings import WorkerSettings

    try:
        settings = WorkerSettings.from_env(app_id=app_id, window_s=window_s, log_level=log_level)
        config = KafkaConfig.from_env(bootstrap=bootstrap)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    from eroica.streams.faust.workers import run

    sys.exit(run(role, settings, config))
