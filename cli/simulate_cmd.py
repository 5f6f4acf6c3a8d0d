"""``eroica simulate``: write a simulated training job (with injected faults) as contract JSON Lines."""

from __future__ import annotations

import sys
import time

import click


def _list_faults(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from eroica.producers.simulator import describe_faults

    click.echo("Faults (NAME:key=value,...; every fault also takes start=STEP,end=STEP; lists use ';'):")
    click.echo(describe_faults())
    ctx.exit(0)


def _parse_faults(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> list:
    from eroica.producers.simulator import FaultError, parse_fault

    out = []
    for v in values:
        try:
            out.append(parse_fault(v))
        except FaultError as exc:
            raise click.BadParameter(str(exc), param_hint="--fault") from None
    return out


@click.command("simulate")
@click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True, help="Nodes.")
@click.option("--gpus", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs (and NICs) per node.")
@click.option("--steps", type=click.IntRange(min=1), default=None,
              help="Training steps (default: 40; under --profile realistic, enough for detection: "
                   "at least 20 steps and 240 s).")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Tensor parallel size (default: --gpus).")
@click.option("--pp", type=click.IntRange(min=1), default=1, show_default=True, help="Pipeline stages.")
@click.option("--microbatches", type=click.IntRange(min=1), default=None,
              help="Microbatches per step when pipelined (default 2; realistic: pp or 2*pp, from the seed).")
@click.option("--fault", "faults", multiple=True, callback=_parse_faults, metavar="NAME[:k=v,...]",
              help="Inject a fault; repeat for several at once. See --list-faults.")
@click.option("--seed", type=click.IntRange(min=0), default=1, show_default=True)
@click.option("-o", "--output", required=True, metavar="FILE", help="Output JSON Lines ('-' = stdout, .gz = gzip).")
@click.option("--truth", "truth_file", default=None, metavar="FILE",
              help="Ground-truth file (default: <output>.truth.json beside a file output; none for stdout).")
@click.option("--job", default=None, help="Job id (default sim-<seed>).")
@click.option("--start-ns", type=click.IntRange(min=0), default=None, help="Start time, ns since the epoch.")
@click.option("--sample-ms", type=click.FloatRange(min=1.0), default=None,
              help="Counter sample period (default: 500 ms; realistic: step/20 within 0.5-10 s).")
@click.option("--profile", type=click.Choice(["default", "realistic"]), default="default", show_default=True,
              help="Fleet profile: 'realistic' adds nuisances drawn from the seed (extra NICs, two GPU "
                   "models, missing fields, clock offsets, gaps, counter resets, 0.05-180 s steps, "
                   "checkpoints, evals, warm-up, MoE jitter, pipeline schedules, FSDP); see "
                   "producers/simulator/realistic.py.")
@click.option("--list-faults", is_flag=True, expose_value=False, is_eager=True, callback=_list_faults,
              help="List the faults and their parameters, then exit.")
def simulate(nodes, gpus, steps, tp, pp, microbatches, faults, seed, output, truth_file, job, start_ns,
             sample_ms, profile) -> None:
    """Simulate a synchronous GPU training job and write its telemetry (and ground truth).

    Same arguments and seed give byte-identical output.
    """
    from eroica.producers.simulator import DEFAULT_START_NS, FaultError, SimConfig, write_jsonl

    cfg = SimConfig(nodes=nodes, gpus=gpus, steps=steps, tp=tp, pp=pp, microbatches=microbatches,
                    faults=list(faults), seed=seed, job=job,
                    start_ns=DEFAULT_START_NS if start_ns is None else start_ns, sample_ms=sample_ms,
                    profile=profile)
    try:
        cfg.validate()
    except FaultError as exc:
        raise click.UsageError(str(exc)) from None
    t0 = time.perf_counter()
    truth_target = truth_file if truth_file else (output != "-")
    try:
        t = write_jsonl(cfg, output, truth_path=truth_target)
    except OSError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    took = time.perf_counter() - t0
    if output != "-" or truth_file:
        from eroica.producers.simulator import truth_path_for

        where = truth_file or (truth_path_for(output) if output != "-" else None)
        names = ", ".join(f["name"] for f in t["faults"]) or "none"
        click.echo(f"wrote {t['records']} records ({t['steps_run']} steps, world {cfg.world}, faults: {names}) "
                   f"to {output} in {took:.1f} s" + (f"; truth: {where}" if where else ""), err=True)
