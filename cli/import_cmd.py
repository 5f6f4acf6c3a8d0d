"""``eroica import``: turn real traces into contract JSON Lines (``eroica import kineto|optable``).

Names are data: the warnings and errors name trace files, spans, optypes and
jobs as the traces have them, so every message goes through
:func:`~eroica.cli.tables.printable` (control and bidirectional characters
shown escaped), the spinner's label included (``cli/progress.py``).
"""

from __future__ import annotations

import sys
import time

import click

from .progress import spinner
from .tables import printable


def _report(stats, output: str, took: float) -> None:
    for w in stats.warnings:
        click.echo(f"warning: {printable(w)}", err=True)
    where = "stdout" if output == "-" else output
    click.echo(f"imported {stats.sources} source(s): {printable(stats.describe())}; to {printable(where)} "
               f"in {took:.2f} s", err=True)


def _fail(exc: Exception) -> None:
    click.echo(f"error: {printable(exc)}", err=True)
    sys.exit(1)


@click.group("import", epilog="""\b
Exit codes: 0 imported, 1 unreadable or unusable input (or a missing extra),
2 usage error. On a terminal a spinner runs while importing.""")
def import_() -> None:
    """Import real traces (PyTorch profiler, per-operation tables) as contract JSON Lines.

    The output starts with a job record, then fn records in time order; it
    can go straight to eroica analyze.
    """


@import_.command("kineto")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, metavar="FILE", help="Output JSON Lines ('-' = stdout, .gz = gzip).")
@click.option("--job", default=None, help="Job id (default: the files' common name, e.g. sampled_rank).")
@click.option("--node", default=None, help="Node of every rank (default: the trace's hostname, else "
                                           "node-<rank // gpus-per-node>).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
              help="For the default node names.")
@click.option("--default-group", default=None, metavar="NAME",
              help="Communicator of NCCL kernels whose trace names none (e.g. 'world' for a job with one "
                   "process group); default: none.")
def kineto(files: tuple[str, ...], output: str, job: str | None, node: str | None, gpus_per_node: int,
           default_group: str | None) -> None:
    """Import PyTorch profiler (Kineto) traces FILES (.json or .json.gz), one rank each.

    \b
    Examples:
      eroica import kineto rank-*.json.gz -o run.jsonl
      eroica import kineto trace.json --job exp1 --node host-3 -o - | eroica analyze -

    Rank and world size come from each trace's distributedInfo. Kernels,
    NCCL collectives, copies and host spans (operators, runtime calls,
    annotations with their stacks) each become an fn record with the step of
    the enclosing ProfilerStep#N; events outside every step are left out.
    A trace without ProfilerStep markers gets steps from what recurs once per
    iteration (its Optimizer.step ranges, an exactly repeating pattern of
    record_function ranges), with a warning; with neither it is refused (exit
    1): record with torch.profiler.schedule and call prof.step() per iteration.
    """
    from eroica.producers.importers import ImportFailed, import_kineto

    t0 = time.perf_counter()
    try:
        with spinner(f"importing {len(files)} trace(s)"):
            stats = import_kineto(list(files), output, job=job, node=node, gpus_per_node=gpus_per_node,
                                  default_group=default_group)
    except (ImportFailed, OSError) as exc:
        _fail(exc)
    _report(stats, output, time.perf_counter() - t0)


@import_.command("optable")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, metavar="FILE", help="Output JSON Lines ('-' = stdout, .gz = gzip).")
@click.option("--meta", "meta", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Job parallelism (YAML: world_size, dp_size, pp_size, tp_size); default: meta-<X>.yaml "
                   "beside trace-<X>.parquet when there is one.")
@click.option("--job", default=None, help="Job id (default: the file's name without .parquet).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
              help="Node of rank r: node-<r // G>.")
@click.option("--start-ns", type=click.IntRange(min=0), default=None,
              help="Start of the first step, ns since the epoch (default 1763000000000000000).")
def optable(file: str, output: str, meta: str | None, job: str | None, gpus_per_node: int,
            start_ns: int | None) -> None:
    """Import a per-operation table FILE (Parquet: rank, stage, dp_rank, step, optype, start_ts, duration).

    \b
    Example:
      eroica import optable trace-ST.parquet --meta meta-ST.yaml -o st.jsonl

    Steps (relative in the table) are laid end to end; pipeline sends and
    receives become collectives of the stage pair, gradient reduce-scatters
    and parameter all-gathers collectives of the stage's data-parallel group.
    Needs pyarrow (and pyyaml for --meta): pip install 'eroica[import]'.
    """
    from pathlib import Path

    try:
        from eroica.producers.importers import ImportFailed, import_optable
        from eroica.producers.importers.optable import DEFAULT_START_NS, default_meta_path
        import pyarrow  # noqa: F401
    except ImportError as exc:
        _fail(RuntimeError(f"{exc.name or exc} is missing: pip install 'eroica[import]'"))
    if meta is None:
        found = default_meta_path(Path(file))
        if found is not None:
            meta = str(found)
            click.echo(f"using meta {printable(meta)}", err=True)
    t0 = time.perf_counter()
    try:
        with spinner(f"importing {Path(file).name}"):
            stats = import_optable(file, output, meta_path=meta, job=job, gpus_per_node=gpus_per_node,
                                   start_ns=DEFAULT_START_NS if start_ns is None else start_ns)
    except ImportError as exc:
        _fail(RuntimeError(f"{exc.name or exc} is missing: pip install 'eroica[import]'"))
    except (ImportFailed, OSError) as exc:
        _fail(exc)
    _report(stats, output, time.perf_counter() - t0)
