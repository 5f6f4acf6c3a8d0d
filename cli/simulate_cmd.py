"""``eroica simulate``: write a simulated training job (with injected faults) as contract JSON Lines."""

from __future__ import annotations

import sys
import time

import click

from .tables import printable


def parse_start(value: str | None, now_ns: int | None = None) -> int:
    """``now`` (default), ``default`` (the library's fixed 2025-11-13 start), ns since the epoch, or ISO 8601."""
    import datetime as dt

    from eroica.producers.simulator import DEFAULT_START_NS
    from eroica.producers.simulator.config import start_now_ns

    text = (value or "now").strip()
    if text.lower() == "now":
        return start_now_ns(now_ns)
    if text.lower() == "default":
        return DEFAULT_START_NS
    if text.isdigit():
        return int(text)
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: use now, default, ns since the epoch or an ISO 8601 time "
                                 "(2026-11-23T14:00:00Z)", param_hint="--start") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    d = t - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (d.days * 86400 + d.seconds) * 10**9 + d.microseconds * 1000

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


@click.command("simulate", epilog="""\b
Exit codes: 0 written, 1 the output could not be written, 2 usage error
(an unknown fault or parameter).""")
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
@click.option("--start", default="now", show_default=True, metavar="now|default|NS|ISO-8601",
              help="When the job starts: now (the records end a job length after now; the second within "
                   "the minute is fixed so windows cut the same steps), 'default' (the library's fixed "
                   "2025-11-13 start: byte-identical output whenever it is run), ns since the epoch, or a "
                   "time like 2026-11-23T14:00:00Z.")
@click.option("--start-ns", type=click.IntRange(min=0), default=None, hidden=True,
              help="Start time, ns since the epoch (same as --start NS).")
@click.option("--sample-ms", type=click.FloatRange(min=1.0), default=None,
              help="Counter sample period (default: 500 ms; realistic: step/20 within 0.5-10 s).")
@click.option("--profile", type=click.Choice(["default", "realistic"]), default="default", show_default=True,
              help="Fleet profile: 'realistic' adds nuisances drawn from the seed (extra NICs, two GPU "
                   "models, missing fields, clock offsets, gaps, counter resets, 0.05-180 s steps, "
                   "checkpoints, evals, warm-up, MoE jitter, pipeline schedules, FSDP); see "
                   "producers/simulator/realistic.py.")
@click.option("--list-faults", is_flag=True, expose_value=False, is_eager=True, callback=_list_faults,
              help="List the faults and their parameters, then exit.")
def simulate(nodes, gpus, steps, tp, pp, microbatches, faults, seed, output, truth_file, job, start, start_ns,
             sample_ms, profile) -> None:
    """Simulate a synchronous GPU training job and write its telemetry (and ground truth).

    Records are stamped from now by default, so a replayed run shows in
    `eroica verdicts --since 1h` and `eroica status`; the same arguments, seed
    and --start (e.g. --start default) give byte-identical output.

    \b
    Examples:
      eroica simulate --nodes 8 --gpus 8 --fault gpu_throttle:rank=13 -o run.jsonl
      eroica simulate --fault nic:node=2 --start default --seed 3 -o - | eroica analyze -
    """
    from eroica.producers.simulator import FaultError, SimConfig, write_jsonl

    cfg = SimConfig(nodes=nodes, gpus=gpus, steps=steps, tp=tp, pp=pp, microbatches=microbatches,
                    faults=list(faults), seed=seed, job=job,
                    start_ns=parse_start(start) if start_ns is None else start_ns, sample_ms=sample_ms,
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
        click.echo(f"error: {printable(exc)}", err=True)
        sys.exit(1)
    took = time.perf_counter() - t0
    if output != "-" or truth_file:
        from eroica.producers.simulator import truth_path_for

        where = truth_file or (truth_path_for(output) if output != "-" else None)
        names = ", ".join(f["name"] for f in t["faults"]) or "none"
        click.echo(printable(f"wrote {t['records']} records ({t['steps_run']} steps, world {cfg.world}, faults: "
                             f"{names}) to {output} in {took:.1f} s" + (f"; truth: {where}" if where else "")),
                   err=True)
