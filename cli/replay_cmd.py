"""``eroica replay``: send contract JSONL files to Kafka as a running job would.

The summary goes to stderr so stdout stays free for pipes; the exit code says
whether everything was delivered (see cli/main.py for the shared codes).
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Callable

import click

from eroica.cli.main import EXIT_NO_VALID_RECORD

from .stack_options import data_dir_option, kafka_bootstrap, kafka_option

if TYPE_CHECKING:
    from eroica.streams.edge import EdgeDigester


def _parse_rate(value: str) -> float | None:
    if value.lower() == "max":
        return None
    try:
        rate = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a number of records/s nor 'max'") from None
    if rate <= 0:
        raise click.BadParameter("rate must be > 0 (or 'max')")
    return rate


@click.command(epilog="""\b
Exit codes: 0 everything delivered, 1 no stack found, broker unreachable or
a delivery failed, 2 usage error, 3 no valid record in the input.""")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--rate", default="max", show_default=True, metavar="N|max",
              help="Records per second to replay at, or 'max' for as fast as the broker takes them.")
@kafka_option
@data_dir_option
@click.option("--frame-records", type=click.IntRange(min=1), default=None,
              help="Most records per frame [default: $EROICA_KAFKA_FRAME_RECORDS or 1000].")
@click.option("--connect-timeout", type=click.FloatRange(min=0.1), default=10.0, show_default=True,
              metavar="SECONDS", help="Give up when the broker does not answer within this time.")
@click.option("--edge-digests", is_flag=True,
              help="Digest mode: split the input per node, digest each node's windows as its agent would "
                   "(same windows and lateness as the summariser: $EROICA_WINDOW_S, $EROICA_LATENESS_S, "
                   "$EROICA_MAX_SKEW_S) and publish the digests on the summaries topic instead of raw frames.")
@click.option("--declare-watermarks", is_flag=True,
              help="The input is in time order per rank/node and record type (as a live collector's output and "
                   "the simulator's are): each frame declares its stream's watermark, so windows close without "
                   "the lateness allowance. Records older than their stream's declaration are counted. With "
                   "--edge-digests each node declares the oldest of its streams' newest records with each batch.")
@click.option("-q", "--quiet", is_flag=True, help="Errors only: no progress, no summary on stderr.")
def replay(files: tuple[str, ...], rate: str, bootstrap: str | None, data_dir, frame_records: int | None,
           connect_timeout: float, edge_digests: bool, declare_watermarks: bool, quiet: bool) -> None:
    """Replay telemetry-v1 JSONL FILE(s) (gzip or '-' for stdin) onto Kafka as columnar frames.

    Valid records go to the raw topic, invalid lines to the dead-letter topic,
    and an end-of-stream marker per rank/node follows when all files are read.
    On a terminal a spinner counts the messages sent (not when piped, nor with --quiet).

    With no --kafka, the records go to the broker of the stack `eroica up`
    runs (found in the data directory, as `eroica verdicts` finds it).

    With --edge-digests nothing raw is published: each node's records become
    window digests on the node's side (source edge/NODE), sent with progress
    and end messages on the summaries topic, which the detector reads as it
    reads the summariser's; verdict ids are the same as in raw mode.

    \b
    Examples:
      eroica replay run.jsonl
      eroica replay run.jsonl --kafka 127.0.0.1:9092
      eroica replay run.jsonl.gz --rate 20000
      eroica simulate -o - --fault nic:node=2 | eroica replay -
      eroica replay run.jsonl --edge-digests
    """
    from eroica.kafka.config import KafkaConfig
    from eroica.producers.replay import ReplayError, ReplayResult
    from eroica.producers.replay import replay as run_replay
    from eroica.producers.replay import replay_digests

    logging.basicConfig(level=logging.WARNING, format="eroica: %(message)s", stream=sys.stderr)
    per_s = _parse_rate(rate)
    bootstrap = kafka_bootstrap(bootstrap, data_dir)
    try:
        config = KafkaConfig.from_env(bootstrap=bootstrap, frame_records=frame_records)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    def summary(r: ReplayResult) -> str:
        types = ", ".join(f"{t} {n}" for t, n in sorted(r.by_type.items())) or "none"
        p = r.publisher
        in_flight = max(0, p.produced - p.delivered - p.failed + p.refused)
        if r.delivered_records is None:
            head = f"sent {r.records} records"
        elif r.undelivered_records:
            head = (f"NOT ALL DELIVERED: {r.delivered_records} of {r.records} records delivered, "
                    f"{r.undelivered_records} not ({p.failed_records} failed, the rest never acknowledged)")
        else:
            head = f"delivered {r.delivered_records} of {r.records} records"
        if r.aborted:
            head = "replay ABORTED before the end of the input; " + head
        if r.mode == "digest":
            return (f"digest mode: {head} ({types}) as {r.digests} window digests in {r.messages} messages "
                    f"({r.message_bytes:,} bytes) to {config.digests_topic}, {r.jobs} job records, "
                    f"{r.end_of_stream} end messages, {r.late_records} late records; {r.invalid} invalid lines "
                    f"to {config.deadletter_topic}; messages: {p.delivered} delivered, {p.failed} failed" +
                    (f", {in_flight} unacknowledged" if in_flight else "") +
                    f"; {r.seconds:.2f} s, {r.records_per_s:,.0f} records/s (broker {config.bootstrap})")
        return (f"{head} ({types}) and {r.jobs} job records in {r.frames} frames "
                f"to {config.raw_topic}; {r.invalid} invalid lines to {config.deadletter_topic}; "
                f"{r.end_of_stream} end-of-stream markers; messages: {p.delivered} delivered, "
                f"{p.failed} failed" + (f", {in_flight} unacknowledged" if in_flight else "") +
                (f"; {r.watermark_violations} records older than their stream's declared watermark"
                 if r.watermark_violations else "") +
                f"; {r.seconds:.2f} s, {r.records_per_s:,.0f} records/s (broker {config.bootstrap})")

    from .progress import progress_wanted, spinner
    from .tables import printable

    publisher = None
    if progress_wanted(not quiet):
        from eroica.kafka.publisher import FramePublisher

        publisher = _Counting(FramePublisher.for_replay(config))
    try:
        with spinner(f"replaying to {config.bootstrap}", enabled=publisher is not None) as status:
            if publisher is not None:
                publisher.status = status
            if edge_digests:
                result = replay_digests(files, config, _edge_digester(declare_watermarks), rate=per_s,
                                        connect_timeout_s=connect_timeout, publisher=publisher,
                                        declare_watermarks=declare_watermarks)
            else:
                result = run_replay(files, config, per_s, connect_timeout_s=connect_timeout, publisher=publisher,
                                    declare_watermarks=declare_watermarks)
    except ReplayError as exc:  # names are data: a file's or record's name is shown escaped (cli/tables.py)
        click.echo(f"eroica replay: {printable(exc)}", err=True)
        click.echo(printable(summary(exc.result)), err=True)
        sys.exit(1)
    except OSError as exc:
        click.echo(f"eroica replay: {printable(exc)}", err=True)
        sys.exit(1)
    finally:
        if publisher is not None:
            publisher.close(timeout_s=5.0)
    if not quiet or result.undelivered_records:
        click.echo(printable(summary(result)), err=True)
    if result.undelivered_records or result.publisher.failed:
        click.echo("eroica replay: some records were not delivered", err=True)
        sys.exit(1)
    if result.records + result.jobs == 0:
        sys.exit(EXIT_NO_VALID_RECORD)


def _edge_digester(declares: bool) -> Callable[[str], EdgeDigester]:
    """One node's digester factory, with the stream workers' window settings; a malformed setting is a usage error."""
    from eroica.streams.faust.settings import edge_digester_factory

    try:
        return edge_digester_factory(declares=declares)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


class _Counting:
    """A publisher that reports the messages sent to a spinner (terminal runs only)."""

    def __init__(self, publisher: object) -> None:
        self._pub = publisher
        self.sent = 0
        self.status = None

    def publish(self, topic: str, value: bytes, key: str | bytes | None = None, **kw: int) -> bool:
        self.sent += 1
        if self.status is not None and self.sent % 200 == 0:
            self.status.update(f"{self.sent:,} messages")
        return self._pub.publish(topic, value, key, **kw)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._pub, name)
