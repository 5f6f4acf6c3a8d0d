"""``eroica trace``: run a training command with Eroica's tracer in every rank."""

from __future__ import annotations

import click


@click.command(epilog="""\b
Exit codes: COMMAND's own exit status (a signal as 128+N), 1 when Eroica
could not start it, 2 usage error.""", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--job", default=None,
              help="Job id [default: $TORCHELASTIC_RUN_ID, else <script>-<UTC time>-<random>].")
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="Merge every rank's records (and the agent's) into this contract JSONL file, in time "
                   "order [default without --kafka: eroica-<job>.jsonl].")
@click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
              help="Publish frames to this Kafka broker instead (never blocks the job; drops and counts).")
@click.option("--no-agent", is_flag=True, help="Do not sample this node's GPU / NIC / host counters.")
@click.option("--interval", "interval_s", type=click.FloatRange(0.1, 60.0), default=0.5, show_default=True,
              help="Seconds between the node agent's samples.")
@click.option("--keep-parts", is_flag=True, hidden=True, help="Keep the per-process files (debugging).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace(job: str | None, out: str | None, bootstrap: str | None, no_agent: bool, interval_s: float,
          keep_parts: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND with Eroica's tracer active in every rank, without changing its code.

    \b
    Examples:
      eroica trace --out run.jsonl -- torchrun --nproc-per-node 8 train.py
      eroica trace --kafka broker:9092 -- python train.py --epochs 3
      eroica analyze run.jsonl

    Every rank records its DataLoader fetches, optimizer steps, the top-level
    module's forward and backward, torch.distributed collectives and DDP's
    gradient all-reduces (plus CUDA-event timings where CUDA is used); a node
    agent samples GPU / NIC / host counters beside it. COMMAND's output and
    exit status pass through unchanged; Eroica speaks only on stderr.
    """
    from eroica.producers.tracer.launch import exit_like, run_trace

    if out and bootstrap:
        raise click.UsageError("give --out FILE or --kafka HOST:PORT, not both")
    try:
        result = run_trace(list(command), job=job, out=out, kafka=bootstrap, agent=not no_agent,
                           interval_s=interval_s, keep_parts=keep_parts)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    exit_like(result.returncode)
