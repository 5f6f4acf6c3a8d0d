"""``eroica analyze``: run the detection core over contract JSON Lines files.

Besides its verdicts a job may get a *note* (:mod:`eroica.streams.detection.notes`):
what the analysis could not do for it, e.g. compare ranks with peers in a job
too small for the peer test. A note is not a verdict (no culprit, no
confidence), so it never enters the verdict list: the table prints it under
the verdicts, prefixed ``note:``; ``--format json`` keeps stdout the contract's
array of verdicts, byte for byte what it was, and writes each note to stderr
as one JSON object on a line of its own (``{"type": "note", ...}``). A
consumer that reads the array from stdout is unaffected; one that wants the
notes reads stderr's lines that start with ``{`` (the other stderr lines, the
invalid-record summary, are plain text). Notes are results, not chatter:
``--quiet`` does not silence them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Iterator

import click

from eroica.models.reader import Batch, Invalid, read_batches, read_merged
from eroica.models.records import JobRecord
from eroica.models.verdict import Verdict, encode_verdicts

from .main import EXIT_NO_VALID_RECORD
from .tables import printable

if TYPE_CHECKING:
    from eroica.streams.detection.notes import Note

SHOWN_REASONS = 5


class _Tally:
    """Counts what the reader saw, keeping only the first few reasons (bounded memory)."""

    def __init__(self) -> None:
        self.valid = 0
        self.invalid = 0
        self.first: list[Invalid] = []
        self.jobs: dict[str, JobRecord] = {}  # each job's latest job record, as the window assembler keeps it

    def watch(self, paths: tuple[str, ...]) -> Iterator[Batch]:
        # several files (one per rank or node) cover the same time: merge them by time
        source = read_batches(paths[0]) if len(paths) == 1 else read_merged(list(paths))
        for batch in source:
            self.valid += batch.valid_count
            self.invalid += len(batch.invalid)
            room = SHOWN_REASONS - len(self.first)
            if room > 0:
                self.first.extend(batch.invalid[:room])
            for job in batch.jobs:
                self.jobs[job.job] = job
            yield batch


def render_table(verdicts: list[Verdict], notes: list[Note] | None = None) -> None:
    """Verdicts for a terminal: a table when wide, blocks at 80 columns (no word cut; cli/tables.py); then
    each job's note on a line of its own, ``note: job ...``."""
    import textwrap

    from .tables import console, render_verdicts

    render_verdicts(verdicts)
    out = console()
    for n in notes or []:  # wrapped between words as the verdict blocks are, continued under the text
        out.print(textwrap.fill(f"note: {printable(n.text)}", width=max(20, out.width - 1), subsequent_indent="      ",
                                break_long_words=False, break_on_hyphens=False),
                  highlight=False, markup=False, soft_wrap=True)


@click.command(epilog="""\b
Exit codes: 0 analysed (whether or not it found something), 1 runtime error,
2 usage error, 3 no valid record in the input.""")
@click.argument("files", nargs=-1, required=True, type=click.Path(allow_dash=True))
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
@click.option("--window", "window_s", type=click.FloatRange(min=1.0), default=30.0, show_default=True,
              help="Window length in seconds (windows are aligned to the epoch).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar and no invalid-record summary on stderr.")
def analyze(files: tuple[str, ...], fmt: str, window_s: float, quiet: bool) -> None:
    """Analyse contract JSON Lines FILES (plain, gzip, or - for stdin) and print verdicts.

    \b
    Examples:
      eroica analyze run.jsonl
      eroica analyze run.jsonl.gz --format json > verdicts.json
      cat run.jsonl | eroica analyze - --window 20

    Invalid records are counted and the first reasons shown on stderr; they
    never stop the analysis. A job too small for the peer test (fewer than 4
    ranks per role) gets a note, not a verdict: a "note:" line under the
    table; with --format json, a JSON object per line on stderr (stdout stays
    the verdict array). On a terminal a progress bar shows on stderr
    (never when stderr is piped, nor with --quiet).
    """
    from eroica.runtime.system import columnar_gc_during
    from eroica.streams.detection import analyze_windows
    from eroica.streams.detection.notes import JobNotes

    for f in files:
        if f != "-" and not click.Path(exists=True, dir_okay=False).convert(f, None, None):
            raise click.UsageError(f"no such file: {f}")
    from .progress import track_batches

    tally = _Tally()
    notes = JobNotes()
    verdicts: list[Verdict] = []
    with columnar_gc_during():
        for digest, found in analyze_windows(track_batches(tally.watch(files), files, enabled=not quiet),
                                             int(window_s * 1e9), detected_at_ns=time.time_ns()):
            verdicts += found
            notes.add(digest, tally.jobs.get(digest.job))
    if tally.invalid and not quiet:
        click.echo(f"eroica: {tally.invalid} invalid record(s) skipped; first reasons:", err=True)
        for inv in tally.first:
            click.echo(f"  {printable(inv.describe())}", err=True)
    if tally.valid == 0:
        click.echo("eroica: no valid record in the input; nothing to analyse", err=True)
        sys.exit(EXIT_NO_VALID_RECORD)
    if fmt == "json":
        sys.stdout.buffer.write(encode_verdicts(verdicts) + b"\n")
        for n in notes.notes():  # on stderr: stdout stays the contract's verdict array (module docstring)
            click.echo(json.dumps(n.to_json(), sort_keys=True), err=True)
    else:
        render_table(verdicts, notes.notes())
