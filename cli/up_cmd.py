"""``eroica up``: run the single-machine stack in the foreground until Ctrl-C or SIGTERM.

Broker (tansu, or Apache Kafka with ``--broker kafka``; none with ``--kafka``), topics, ``eroica worker summariser``,
``eroica worker detector`` and ``eroica sink`` (chdb in the data directory,
unless ``--clickhouse``), supervised; state in ``DATA_DIR/stack.json`` (see
``runtime/state.py``). One stack per data directory (a lock file enforces it).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import threading
from pathlib import Path
from typing import IO

import click

from .stack_options import data_dir_option, resolve_data_dir
from .tables import printable


class _Interrupted(Exception):
    """A stop signal arrived while the stack was still starting."""


def _lock(data_dir: Path) -> IO[str]:
    """Hold ``stack.lock`` for this process's lifetime; UsageError when another stack holds it."""
    from eroica.runtime.state import LOCK_FILE, read_state

    data_dir.mkdir(parents=True, exist_ok=True)
    handle = open(data_dir / LOCK_FILE, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        pid = (read_state(data_dir) or {}).get("pid", "?")
        raise click.UsageError(f"a stack already runs in {data_dir} (pid {pid}); "
                               "stop it or use another --data-dir") from None
    return handle


@click.command("up", epilog="""\b
Exit codes: 0 stopped by Ctrl-C / SIGTERM, 1 the stack could not start (or a
stack already runs in the data directory), 2 usage error.""")
@data_dir_option
@click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
              help="Use this Kafka instead of starting a broker on 127.0.0.1.")
@click.option("--broker", "broker_kind", type=click.Choice(["tansu", "kafka"]), default=None,
              help="Broker to start on 127.0.0.1: tansu (default; embedded, memory only) or kafka (Apache "
                   "Kafka, KRaft, one node; needs java and the jars of .ci/install-kafka.sh; data kept in "
                   "DATA_DIR/kafka).")
@click.option("--clickhouse", "clickhouse_url", default=None, metavar="clickhouse://HOST:9000/DB",
              help="Use this ClickHouse server instead of chdb in DATA_DIR/chdb.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=3, show_default=True,
              help="Restarts of one child (or of the broker) allowed per --restart-window.")
@click.option("--restart-window", "restart_window", type=click.FloatRange(min=1.0), default=600.0,
              show_default=True, metavar="SECONDS",
              help="Sliding window of the restart budget: a child that ran this long without crashing has "
                   "its whole budget back; past the budget it waits until the window moves on.")
@click.option("--restart/--no-restart", default=True, show_default=True,
              help="Restart a crashed child, and a dead broker (on its port), with exponential backoff "
                   "(1, 2, 4 s... at most 60 s) within the budget above.")
@click.option("--summarisers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Summariser processes sharing the raw topic's partitions (one consumer group). One is one "
                   "Python process: a job whose raw rate needs more than a core needs more (see README, Live).")
@click.option("--stop-timeout", type=click.FloatRange(min=0.5), default=10.0, show_default=True,
              metavar="SECONDS", help="Grace period per shutdown stage before SIGKILL.")
@click.option("--ready-timeout", type=click.FloatRange(min=1.0), default=90.0, show_default=True,
              metavar="SECONDS", help="Give up when a part does not answer within this time at start.")
@click.option("--metrics-port-base", type=click.IntRange(min=1, max=65535 - 99), default=None,
              envvar="EROICA_METRICS_PORT_BASE", metavar="PORT",
              help="Fixed Prometheus metrics ports: sink PORT, detector PORT+1, summariser PORT+10 "
                   "(summariser-N PORT+9+N) [default: $EROICA_METRICS_PORT_BASE, else free ports]. Either way "
                   "they are listed for Prometheus' file_sd in DATA_DIR/prometheus-targets.json.")
def up(data_dir: Path | None, bootstrap: str | None, broker_kind: str | None, clickhouse_url: str | None,
       restart: bool, stop_timeout: float, ready_timeout: float, max_restarts: int,
       restart_window: float, summarisers: int, metrics_port_base: int | None) -> None:
    """Run broker, stream workers and ClickHouse sink on this machine until Ctrl-C."""
    from eroica.stack.local import LocalStack, StackError
    from eroica.kafka.admin import BrokerError

    if clickhouse_url and not clickhouse_url.startswith(("clickhouse://", "clickhouses://", "chdb://")):
        raise click.BadParameter("use clickhouse://HOST:9000/DB (or chdb:///DIR)", param_hint="--clickhouse")
    if bootstrap and broker_kind:
        raise click.UsageError("--kafka uses a running broker; --broker starts one: give only one of them")
    if broker_kind == "kafka":
        from eroica.stack.apache_kafka import kafka_available

        reason = kafka_available()
        if reason:
            raise click.UsageError(f"--broker kafka: {reason}")
    if metrics_port_base is not None and (metrics_port_base + 9 + summarisers > 65535 or summarisers > 90):
        raise click.BadParameter(f"{metrics_port_base} with {summarisers} summariser(s): summariser-N's port "
                                 f"PORT+9+N must be at most 65535, N at most 90", param_hint="--metrics-port-base")
    root = resolve_data_dir(data_dir).resolve()
    lock = _lock(root)
    stop = threading.Event()
    started = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if first and not started.is_set():  # abort start-up once; a second signal must not abort the cleanup
            raise _Interrupted(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stack = LocalStack(root, kafka=bootstrap, broker_kind=broker_kind or "tansu", clickhouse_url=clickhouse_url,
                       restart=restart, stop_timeout_s=stop_timeout, max_restarts=max_restarts,
                       restart_window_s=restart_window, summarisers=summarisers,
                       metrics_port_base=metrics_port_base)
    try:
        stack.start(ready_timeout_s=ready_timeout)
        started.set()
    except _Interrupted as exc:
        click.echo(f"eroica up: {printable(exc)} during start-up; stopped", err=True)
        sys.exit(1)
    except (StackError, BrokerError) as exc:
        click.echo(f"eroica up: {printable(exc)}", err=True)
        sys.exit(1)
    _print_summary(stack)
    try:
        while not stop.wait(0.5):
            stack.supervise_once()
    finally:
        click.echo("eroica up: stopping (workers, then sink, then broker)...", err=True)
        stack.stop()
        lock.close()
    click.echo("eroica up: stopped", err=True)


def _print_summary(stack: object) -> None:
    from eroica.stack.local import TARGETS_FILE, LocalStack

    assert isinstance(stack, LocalStack)
    d = stack.data_dir
    kind = ""
    if stack.broker is not None:
        kind = " (Apache Kafka, KRaft)" if stack.broker_kind == "kafka" else " (tansu, memory storage)"
    lines = [f"Eroica stack up (pid {os.getpid()}), data in {d}",
             f"  kafka        {stack.bootstrap}{kind}",
             f"  clickhouse   {stack.sink_clickhouse_url}"]
    for name, svc in stack.services.items():
        lines.append(f"  {name:<12} pid {svc.pid}, {svc.health_url}, log {svc.log_path}")
    lines.append(f"  prometheus   file_sd targets in {d / TARGETS_FILE} (rules: deploy/prometheus/)")
    flag = "" if str(d) == str(resolve_data_dir(None).resolve()) else f" --data-dir {d}"
    lines += ["",
              f"  eroica status{flag}",
              f"  eroica replay{flag} run.jsonl            # finds this broker; no port to copy",
              f"  eroica verdicts{flag} --since 1h",
              f"  eroica report{flag} --job JOB -o JOB.html",
              f"  eroica sql{flag} \"SELECT job, component, summary FROM eroica.verdicts FINAL\"",
              "Ctrl-C (or SIGTERM) stops everything."]
    click.echo("\n".join(lines))
