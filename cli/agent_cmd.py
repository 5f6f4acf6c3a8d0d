"""``eroica agent``: sample this node's GPU, NIC and host counters and publish them."""

from __future__ import annotations

import logging
import signal
import sys
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:  # the digesters are imported where they are made: the cli loads streams lazily
    from eroica.streams.edge import EdgeDigester


@click.command(epilog="""\b
Exit codes: 0 stopped (Ctrl-C / SIGTERM, or --duration over), 1 runtime
error (output or Kafka), 2 usage error.""")
@click.option("--job", required=True, help="Training job id the samples belong to.")
@click.option("--kafka", "bootstrap", default=None, metavar="HOST:PORT",
              help="Publish frames to this Kafka broker (never blocks: a full queue drops and counts).")
@click.option("--out", "out", type=click.Path(dir_okay=False, allow_dash=False), default=None,
              help="Append contract JSON Lines to this file.")
@click.option("--interval", "interval_s", type=click.FloatRange(0.1, 60.0), default=0.5, show_default=True,
              help="Seconds between samples (0.1-0.5 for the contract's 2-10 Hz).")
@click.option("--duration", "duration_s", type=click.FloatRange(min=0.0), default=None,
              help="Stop after this many seconds [default: until Ctrl-C / SIGTERM].")
@click.option("--node", default=None, help="Node name [default: $EROICA_NODE or the host name].")
@click.option("--rank-base", type=click.IntRange(min=0), default=None,
              help="Global rank of this node's GPU 0 when NVML cannot tell which rank uses a GPU "
                   "[default: from GROUP_RANK/NODE_RANK, else 0].")
@click.option("--edge-digests", is_flag=True,
              help="Digest mode (with --kafka): publish this node's window digests on the summaries topic "
                   "instead of raw samples (windows as the summariser's: $EROICA_WINDOW_S, $EROICA_LATENESS_S, "
                   "$EROICA_MAX_SKEW_S). The agent vouches for its node key only; the ranks' functions may "
                   "still go raw through the summariser.")
@click.option("--from-exporter", "exporters", multiple=True, metavar="KIND=URL",
              help="Take counters from an exporter this node already runs instead of sampling them: "
                   "dcgm=URL (NVIDIA DCGM exporter, e.g. http://127.0.0.1:9400/metrics) replaces NVML for GPU "
                   "counters, node=URL (Prometheus node_exporter, e.g. http://127.0.0.1:9100/metrics) replaces "
                   "sysfs and /proc for NIC and host counters. Repeatable; what no exporter covers is sampled "
                   "as usual. Ranks of GPUs: --rank-base + the exporter's gpu index.")
@click.option("--root", default="/", show_default=True, hidden=True,
              help="Root of the /proc and /sys trees (tests).")
def agent(job: str, bootstrap: str | None, out: str | None, interval_s: float, duration_s: float | None,
          node: str | None, rank_base: int | None, edge_digests: bool, exporters: tuple[str, ...],
          root: str) -> None:
    """Sample this node's counters (GPU via NVML, NIC via sysfs, host via /proc) and publish them.

    With --from-exporter the counters come from a DCGM exporter and/or a
    node_exporter the node already runs (scraped every --interval), mapped to
    the same records.

    \b
    Examples:
      eroica agent --job llama-7b --out node.jsonl --duration 60
      eroica agent --job llama-7b --kafka broker:9092
      eroica agent --job llama-7b --kafka broker:9092 \\
          --from-exporter dcgm=http://127.0.0.1:9400/metrics \\
          --from-exporter node=http://127.0.0.1:9100/metrics

    Without an NVIDIA driver it says so once and samples NIC and host counters.
    """
    from eroica.producers.agent import NodeAgent
    from eroica.producers.counters.exporter import ExporterNodeSampler, ExporterUrls
    from eroica.producers.counters.gpu import GpuSampler, env_rank_base
    from eroica.producers.counters.sampler import NodeSampler
    from eroica.producers.outputs import hostname, make_sink

    if (bootstrap is None) == (out is None):
        raise click.UsageError("give exactly one of --kafka HOST:PORT or --out FILE")
    logging.basicConfig(level=logging.WARNING, format="eroica agent: %(message)s", stream=sys.stderr)
    try:
        urls = ExporterUrls.parse(exporters)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    sampler: NodeSampler
    gpu = None  # with a DCGM exporter, NVML is not opened at all
    if urls.dcgm is None:
        gpu = GpuSampler(proc_root=f"{root.rstrip('/')}/proc")
        if rank_base is None:
            rank_base = env_rank_base(len(gpu.handles))
        gpu.rank_base = rank_base
    if urls.dcgm is None and urls.node is None:
        sampler = NodeSampler(job, node or hostname(), root=root, gpu=gpu)
    else:
        # the exporter's GPU count is unknown before its first scrape: torchrun's layout needs
        # LOCAL_WORLD_SIZE then (else GPU 0 is rank 0), or give --rank-base
        base = rank_base if rank_base is not None else env_rank_base(0)
        sampler = ExporterNodeSampler(job, node or hostname(), urls, root=root,
                                      gpu=gpu, rank_base=base)
    if bootstrap:
        from eroica.producers.tracer.launch import prepare_kafka

        prepare_kafka(bootstrap)
    digester = None
    if edge_digests:
        if not bootstrap:
            raise click.UsageError("--edge-digests publishes to Kafka: give --kafka HOST:PORT")
        digester = node_digester(job, sampler.node)
    try:
        sink = make_sink(path=out, kafka=bootstrap, digester=digester)
    except Exception as exc:
        raise click.ClickException(f"cannot publish to {bootstrap or out}: {exc}") from None
    runner = NodeAgent(sampler, sink, interval_s)
    from .tables import printable  # the node's name (a hostname, --node) is data

    print(printable(f"eroica agent: node {sampler.node}: {sampler.describe()}; every {interval_s:g} s to "
                    f"{('kafka ' + bootstrap) if bootstrap else out}" + (" as window digests" if digester else "")),
          file=sys.stderr, flush=True)

    def stop(signum: int, frame: object) -> None:
        runner._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    runner.run(duration_s)
    print(f"eroica agent: {runner.samples} samples, {runner.records} records"
          + (f", {runner.errors} failed samples" if runner.errors else ""), file=sys.stderr, flush=True)


def node_digester(job: str, node: str) -> EdgeDigester:
    """The node's edge digester (cli joins the producers and streams layers; neither imports the other)."""
    from eroica.kafka.framing import frame_key
    from eroica.streams.faust.settings import WorkerSettings

    try:
        ws = WorkerSettings.from_env()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    return ws.edge_digester(f"edge/{node}", keys=[frame_key(job, -1, node)], declares=True)
