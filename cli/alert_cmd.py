"""``eroica alert``: the verdict topic -> incident notifications on a webhook."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import click

from .stack_options import data_dir_option, kafka_bootstrap, kafka_option, resolve_data_dir
from .tables import printable


def _components() -> list[str]:
    from eroica.models.verdict import COMPONENTS

    return list(COMPONENTS)


@click.command("alert", epilog="""\b
Exit codes: 0 stopped by Ctrl-C / SIGTERM, 1 runtime error (no stack found,
Kafka, state file in use or corrupt), 2 usage error.""")
@click.option("--webhook", default=None, metavar="URL",
              help="Where notifications are POSTed [default: $EROICA_ALERT_WEBHOOK]; required.")
@click.option("--min-confidence", type=click.FloatRange(0.0, 1.0), default=None,
              help="An incident opens at its first verdict with at least this confidence [default: 0.7].")
@click.option("--component", "components", multiple=True, type=click.Choice(_components()),
              help="Alert only on this component (repeat for several) [default: all].")
@click.option("--format", "fmt", type=click.Choice(["json", "slack", "alertmanager"]), default=None,
              help="Body of the POST [default: json].")
@kafka_option
@data_dir_option
@click.option("--group", default=None, help="Consumer group [default: eroica-alert].")
@click.option("--reminder", default=None, metavar="DURATION",
              help="Remind every DURATION while an incident stays open (90s, 30m, 2h; 'off') [default: 30m].")
@click.option("--resolve-after", type=click.IntRange(min=1), default=None, metavar="N",
              help="Resolve after N windows of the job without a verdict for the incident [default: 3].")
@click.option("--stale-after", default=None, metavar="DURATION",
              help="Resolve the incidents of a job that sent nothing for DURATION of wall time "
                   "[default: 2 x resolve-after windows, at least 5m].")
@click.option("--state", "state_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Incident state file [default: $EROICA_DATA_DIR/alerts/GROUP.json].")
@click.option("--retry-max", default=None, metavar="DURATION",
              help="Longest wait between delivery attempts while the webhook fails [default: 30s].")
@click.option("--no-window-clock", is_flag=True, default=False,
              help="Do not read the window-summary topic; healthy windows then go unseen and incidents "
                   "resolve by --stale-after only.")
@click.option("--report-url-base", default=None, metavar="URL",
              help="Link each notification to its job's report page, URL/<job file>.html, as `eroica report "
                   "--out-dir DIR` names it (URL: DIR published over http(s), or file:///DIR); a URL with "
                   "{job} gets the URL-encoded job there instead [default: $EROICA_REPORT_URL_BASE; no link].")
@click.option("-q", "--quiet", is_flag=True, help="Log warnings and errors only.")
def alert(webhook: str | None, min_confidence: float | None, components: tuple[str, ...], fmt: str | None,
          bootstrap: str | None, data_dir: Path | None, group: str | None, reminder: str | None,
          resolve_after: int | None,
          stale_after: str | None, state_path: Path | None, retry_max: str | None, no_window_clock: bool,
          report_url_base: str | None, quiet: bool) -> None:
    """Turn verdicts into incident notifications on a webhook, until Ctrl-C / SIGTERM.

    One notification when an incident opens (its first verdict at or above
    --min-confidence), a reminder every --reminder while it persists, one when
    it resolves (no verdict for it during --resolve-after windows of its job,
    or at once when the job ended: the detector's job-end marker).
    Offsets are committed only after the webhook accepted; a restart never
    sends an alert twice nor loses one (state in --state).

    \b
    Examples:
      eroica alert --webhook https://hooks.slack.com/services/T/B/X --format slack
      eroica alert --webhook http://alertmanager:9093/api/v2/alerts --format alertmanager \\
                   --component gpu --component nic --min-confidence 0.8
      eroica alert --webhook http://127.0.0.1:8000/hook --kafka 127.0.0.1:9092 --reminder off
      eroica alert --webhook http://alertmanager:9093/api/v2/alerts --format alertmanager \\
                   --report-url-base https://reports.example/eroica   # pages: eroica report --out-dir

    With no --kafka, it reads the verdict topic of the stack `eroica up` runs
    (found in the data directory, as `eroica verdicts` finds it).
    """
    from eroica.sinks.alerts.config import AlertConfig, parse_duration_ns
    from eroica.sinks.alerts.consumer import AlertConsumer
    from eroica.sinks.alerts.state import StateLockedError

    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s eroica alert: %(message)s")
    if not webhook and not os.environ.get("EROICA_ALERT_WEBHOOK"):
        raise click.UsageError("--webhook URL is required (or $EROICA_ALERT_WEBHOOK)")
    bootstrap = kafka_bootstrap(bootstrap, data_dir)
    try:
        overrides: dict[str, object] = {
            "webhook": webhook, "min_confidence": min_confidence, "components": components or None, "fmt": fmt,
            "group_id": group, "resolve_after": resolve_after, "state_path": state_path,
            "report_url_base": report_url_base,
        }
        if reminder is not None:
            overrides["reminder_ns"] = parse_duration_ns(reminder, "--reminder")
        if stale_after is not None and stale_after.strip().lower() != "auto":
            overrides["stale_ns"] = parse_duration_ns(stale_after, "--stale-after")
        if retry_max is not None:
            overrides["retry_max_s"] = parse_duration_ns(retry_max, "--retry-max") / 1e9
        if no_window_clock:
            overrides["window_clock"] = False
        config = AlertConfig.from_env(bootstrap=bootstrap, **overrides)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    # its metrics are announced in the stack's data directory, so `eroica status` lists every consumer
    os.environ.setdefault("EROICA_DATA_DIR", str(resolve_data_dir(data_dir)))
    consumer = AlertConsumer(config, serve_metrics=True)

    def on_signal(signum: int, _frame: object) -> None:
        consumer.stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        stats = consumer.run()
    except StateLockedError as exc:
        click.echo(f"eroica alert: {printable(exc)}", err=True)
        sys.exit(1)
    except (ValueError, OSError, RuntimeError) as exc:
        click.echo(f"eroica alert: {type(exc).__name__}: {printable(exc)}", err=True)
        sys.exit(1)
    sent = ", ".join(f"{n} {e}" for e, n in sorted(stats.delivered.items())) or "none"
    click.echo(f"eroica alert: stopped; read {stats.consumed} messages ({stats.verdicts} verdicts); "
               f"notifications delivered: {sent}; refused {stats.refused}; "
               f"{stats.open_incidents} incident(s) open", err=True)
