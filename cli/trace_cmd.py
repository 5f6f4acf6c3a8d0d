"""``eroica trace``: run a training command with Eroica's tracer in every rank."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the digesters are imported where they are made: the cli loads streams lazily
    from eroica.streams.edge import EdgeDigester


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
@click.option("--edge-digests", is_flag=True,
              help="Digest mode (with --kafka): every rank and the node agent publish their windows' digests "
                   "on the digests topic instead of raw records, so no central summariser is needed.")
@click.option("--keep-parts", is_flag=True, hidden=True, help="Keep the per-process files (debugging).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def trace(job: str | None, out: str | None, bootstrap: str | None, no_agent: bool, interval_s: float,
          edge_digests: bool, keep_parts: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND with Eroica's tracer active in every rank, without changing its code.

    \b
    Examples:
      eroica trace --out run.jsonl -- torchrun --nproc-per-node 8 train.py
      eroica trace --kafka broker:9092 -- python train.py --epochs 3
      eroica trace --kafka broker:9092 --edge-digests -- torchrun --nproc-per-node 8 train.py
      eroica analyze run.jsonl

    Every rank records its DataLoader fetches, optimizer steps, the top-level
    module's forward and backward, torch.distributed collectives and DDP's
    gradient all-reduces (plus CUDA-event timings where CUDA is used); a node
    agent samples GPU / NIC / host counters beside it. COMMAND's output and
    exit status pass through unchanged; Eroica speaks only on stderr.
    """
    from eroica.producers.tracer.launch import exit_like, make_job_id, run_trace

    if out and bootstrap:
        raise click.UsageError("give --out FILE or --kafka HOST:PORT, not both")
    digests: dict = {}
    if edge_digests:
        if not bootstrap:
            raise click.UsageError("--edge-digests publishes to Kafka: give --kafka HOST:PORT")
        from eroica.producers.outputs import hostname

        from .agent_cmd import node_digester

        job = job or make_job_id(list(command))
        digests = {"rank_digester": f"{__name__}:rank_digester",
                   "agent_digester": None if no_agent else node_digester(job, hostname())}
    try:
        result = run_trace(list(command), job=job, out=out, kafka=bootstrap, agent=not no_agent,
                           interval_s=interval_s, keep_parts=keep_parts, **digests)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    exit_like(result.returncode)


def rank_digester(job: str, node: str, rank: int) -> EdgeDigester:
    """One traced rank's edge digester (``--edge-digests``; the tracer loads it by name in each rank).

    Its source is the rank and its one key the rank's (``job/rank``), as the
    node agent's is its node's: the detector expects every rank's key and
    the job's first window every node's, and waits until each is covered.
    The window settings are the stream workers' (``EROICA_WINDOW_S`` ...); the
    tracer declares its watermark (its open spans) at each flush, so a window
    closes ``EROICA_DECLARED_LATENESS_S`` after the rank is past it, as the
    summariser closes a declaring stream's.
    """
    from eroica.kafka.framing import frame_key
    from eroica.streams.faust.settings import WorkerSettings

    return WorkerSettings.from_env().edge_digester(f"edge/{node}/rank-{rank}", keys=[frame_key(job, rank)],
                                                   declares=True)
