"""``eroica bench``: measured accuracy (and throughput) of the detector."""

from __future__ import annotations

import json
import sys

import click

# Fewer steps than the warm-up and one sign-test run (detector.WARMUP_STEPS + SIGN_STEPS) cannot alarm by
# construction; a shorter cut would measure the rule, not the detector.
MIN_BENCH_STEPS = 12


@click.group()
def bench() -> None:
    """Benchmarks that report measured numbers (no pass/fail thresholds in tests)."""


@bench.command()
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Tuning seeds 1..N (and, with --holdout, held-out seeds 6001..6000+N).")
@click.option("--scale", "scales", type=click.Choice(["small", "medium"]), multiple=True,
              help="Scale(s) to run (default: both).")
@click.option("--profile", "profiles", type=click.Choice(["default", "realistic"]), multiple=True,
              help="Simulator fleet profile(s) (default: both). 'realistic' adds the nuisances of a real "
                   "fleet drawn per seed and is analysed at the detector's default window.")
@click.option("--first-seed", type=click.IntRange(min=1, max=5999), default=1, show_default=True,
              help="Start the tuning seeds here (FIRST..FIRST+N-1): fresh seeds for a new look at failures. "
                   "The held-out seeds stay 6001..6000+N.")
@click.option("--holdout", is_flag=True,
              help="Also run the held-out seeds, reported apart. Do not look at them while tuning.")
@click.option("--only", default=None, help="Run only scenarios whose name contains this text.")
@click.option("--steps", type=click.IntRange(min=MIN_BENCH_STEPS), default=None,
              help="Cut every run to this many steps (a short trace of a user's own job); default: each "
                   "scale's or realistic plan's length.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--verbose", "-v", is_flag=True, help="Show every verdict of failing scenarios.")
def accuracy(seeds: int, scales: tuple[str, ...], profiles: tuple[str, ...], first_seed: int, holdout: bool,
             only: str | None, steps: int | None, fmt: str, verbose: bool) -> None:
    """Run every simulator fault and healthy runs, print a scorecard.

    \b
    Examples:
      eroica bench accuracy --seeds 3
      eroica bench accuracy --profile realistic --seeds 5 --scale medium
      eroica bench accuracy --scale small --only nic -v
      eroica bench accuracy --profile realistic --seeds 5 --holdout --format json > scores.json
      eroica bench accuracy --profile realistic --scale small --steps 30 --holdout
    """
    from eroica.bench.accuracy import (groups, result_json, run_all, run_real_straggler_trace, totals,
                                       window_s)

    chosen = tuple(dict.fromkeys(profiles)) or ("default", "realistic")

    def progress(r) -> None:
        if sys.stderr.isatty():
            print(f"  {r.profile} {r.scale} seed {r.seed} {r.scenario.name}: {'pass' if r.passed else 'FAIL'}",
                  file=sys.stderr)

    results = run_all(seeds, list(scales) or ["small", "medium"], only, progress, chosen, holdout, first_seed, steps)
    real = run_real_straggler_trace() if "default" in chosen and not only else None
    summaries = []
    for profile, held, rs in groups(results):
        summaries.append({"profile": profile, "holdout": held, "window_s": window_s(profile), **totals(rs)})

    if fmt == "json":
        out = {"summaries": summaries, "scenarios": [result_json(r) for r in results]}
        if real is not None:
            out["real_trace"] = {"path": str(real.path), "passed": real.passed, "found": real.found}
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
        return

    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=False, width=None if sys.stdout.isatty() else 200)
    table = Table(title="Eroica detection scorecard")
    for col in ("profile", "scale", "seed", "scenario", "result", "expected", "found", "s"):
        table.add_column(col, overflow="fold")
    for r in results:
        s = r.score
        expected = "; ".join(f.expected for f in s.faults) or "no alarm"
        found = "; ".join(f.found for f in s.faults) if s.faults else ", ".join(s.false_alarms) or "no alarm"
        extra = []
        if s.victims_blamed:
            extra.append("victims blamed: " + ", ".join(s.victims_blamed))
        if s.false_alarms and s.faults:
            extra.append("false alarms: " + ", ".join(s.false_alarms))
        if r.notes:
            extra.append("(" + "; ".join(r.notes) + ")")
        table.add_row(r.profile + (" held-out" if r.holdout else ""), r.scale, str(r.seed), r.scenario.name,
                      "pass" if r.passed else "FAIL", expected, found + ("; " + "; ".join(extra) if extra else ""),
                      f"{r.sim_seconds + r.seconds:.1f}")
        if verbose and not r.passed:
            for v in r.verdicts:
                console.print(f"    [{r.profile} {r.scenario.name}] {v.confidence:.2f} {v.kind}/{v.component} "
                              f"{v.scope} node={v.node} rank={v.rank}: {v.summary}", markup=False, highlight=False)
    console.print(table)
    for t in summaries:
        label = f"{t['profile']}{' (held-out seeds)' if t['holdout'] else ''}, window {t['window_s']:g} s"
        console.print(
            f"[bold]{label}[/bold]: faults localised with the right component and culprit: "
            f"{t['localised']}/{t['faults']} ({100 * t['share_localised']:.1f}%); victims blamed: "
            f"{t['victims_blamed']}; false alarms on healthy runs: {t['false_alarms_healthy']} "
            f"(over {t['healthy_runs']} runs); extra alarms on faulty runs: {t['false_alarms_faulty']}; "
            f"scenarios passed: {t['passed']}/{t['scenarios']} ({t['records']:,} records, {t['seconds']:.0f} s)"
        )
    for t in summaries:
        label = f"{t['profile']}{' (held-out seeds)' if t['holdout'] else ''}"
        for key, first in (("fault_to_alarm", "fault"), ("fault_to_alarm_by_step_time", "step time")):
            lat = Table(title=f"fault to alarm, {label}: onset to the end of the first window alarming on it "
                              "(steps: the job's steps begun meanwhile)")
            for col in (first, "alarmed", "median steps", "max steps", "median s", "max s"):
                lat.add_column(col)
            for name, row in t[key].items():
                lat.add_row(name, f"{row['alarmed']}/{row['faults']}", *(
                    "-" if row[k] is None else f"{row[k]:g}" for k in ("median_steps", "max_steps", "median_s", "max_s")))
            console.print(lat)
    if "default" in chosen and not only:
        if real is None:
            console.print("real trace (stragglers/trace-ST.parquet): not found (set EROICA_SHARED)")
        else:
            console.print(f"real trace {real.path.name} (published cause: last pipeline stage, ranks 6-7, "
                          f"workload): {'pass' if real.passed else 'FAIL'}; found {real.found}")


@bench.command()
@click.option("--ranks", type=click.IntRange(min=1), default=64, show_default=True,
              help="Ranks of the simulated job (8 GPUs per node; a multiple of 8 above 8).")
@click.option("--steps", type=click.IntRange(min=1), default=60, show_default=True, help="Training steps simulated.")
@click.option("--window-s", type=click.FloatRange(min=0.001), default=None,
              help="Time window of the summariser (default: the detector's, 30 s).")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--fault", default="auto", show_default=True,
              help="Simulator fault spec ('auto': a throttled GPU, so there are verdicts to sink; 'none': healthy).")
@click.option("--broker", type=click.Choice(["tansu", "kafka", "none"]), default="tansu", show_default=True,
              help="Broker for the publish + consume stage (kafka: Apache Kafka from the installed jars).")
@click.option("--server/--no-server", default=None,
              help="Also insert into a ClickHouse server (default: when clickhouse-server is installed).")
@click.option("--chdb/--no-chdb", default=True, show_default=True, help="Insert into chdb (embedded).")
@click.option("--tracemalloc", "traced", is_flag=True,
              help="Also report tracemalloc's peak per stage (its overhead inflates the CPU times).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results as JSON to this file ('-' for stdout, the table then goes to stderr).")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the input and databases here (default: a temporary directory, removed).")
@click.option("--passes", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run every stage and floor this many times on the same input; each row is the median pass "
                   "by ratio to floor, with the range (for a machine whose speed drifts).")
def throughput(ranks: int, steps: int, window_s: float | None, seed: int, fault: str, broker: str,
               server: bool | None, chdb: bool, traced: bool, json_path: str | None, work_dir: str | None,
               passes: int) -> None:
    """Each stage's records per CPU-second beside its floor (decoding the same bytes) on this machine.

    \b
    Stages: JSON Lines reader, batch analyze, framing, windowing, summariser,
    detector, sink inserts (chdb, ClickHouse server), publish + consume through
    the broker. See eroica/bench/throughput.py for what each floor is.

    \b
    Examples:
      eroica bench throughput
      eroica bench throughput --ranks 1024 --steps 20 --json bench.json
      eroica bench throughput --broker kafka --server
      eroica bench throughput --ranks 1024 --steps 40 --passes 3 --broker none
    """
    from pathlib import Path

    from eroica.bench.throughput import BenchConfig, format_table, run, to_json
    from eroica.streams.detection import DEFAULT_WINDOW_S

    def progress(msg: str) -> None:
        if sys.stderr.isatty():
            print(f"  {msg}", file=sys.stderr, flush=True)

    cfg = BenchConfig(ranks=ranks, steps=steps, window_s=window_s or DEFAULT_WINDOW_S, seed=seed,
                      fault=None if fault == "none" else fault, broker=broker, server=server, chdb=chdb,
                      tracemalloc=traced, work_dir=Path(work_dir) if work_dir else None, progress=progress,
                      passes=passes)
    try:
        result = run(cfg)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    table = format_table(result)
    if json_path == "-":
        print(table, file=sys.stderr)
        sys.stdout.buffer.write(to_json(result))
        return
    print(table)
    if json_path:
        Path(json_path).write_bytes(to_json(result))


@bench.command("independent")
@click.option("--scale", type=click.Choice(["tiny", "small", "medium"]), default="small", show_default=True)
@click.option("--seeds", default="1-3", show_default=True, help="Seeds: a range (1-3) or a list (1,4,7).")
@click.option("--only", multiple=True, help="Run only this scenario (repeatable).")
@click.option("--json", "json_path", default="", help="Write one JSON line per run here.")
def independent(scale: str, seeds: str, only: tuple[str, ...], json_path: str) -> None:
    """Score the detector on telemetry from the independent generator (bench/independent).

    The generator was written from the contract and the field notes only, by
    someone who did not read the simulator or the detector: its assumptions are
    not the detector's. Every fault alone and healthy runs, per seed, at the
    default 30 s window.

    \b
    Examples:
      eroica bench independent --scale small --seeds 1-3
      eroica bench independent --scale medium --seeds 101-103 --only nccl_tcp
    """
    from eroica.bench.independent.run import main

    argv = ["--scale", scale, "--seeds", seeds, *(a for o in only for a in ("--only", o))]
    sys.exit(main(argv + (["--json", json_path] if json_path else [])))


@bench.command("edge")
@click.option("--nodes", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--gpus", type=click.IntRange(min=1), default=8, show_default=True, help="GPUs (ranks) per node.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Training steps [default: the profile's].")
@click.option("--profile", type=click.Choice(["default", "realistic"]), default="realistic", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--fault", "faults", multiple=True,
              help="Simulator fault spec, repeatable [default: gpu_throttle:rank=6 and nic:node=2,nic=1].")
@click.option("--window-s", type=click.FloatRange(min=1.0), default=30.0, show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results as JSON to this file ('-' for stdout, the table then goes to stderr).")
def edge(nodes: int, gpus: int, steps: int | None, profile: str, seed: int, faults: tuple[str, ...],
         window_s: float, json_path: str | None) -> None:
    """Raw mode against digest mode (edge digests): bytes on Kafka per rank per step, per-core rates.

    \b
    One simulated job through the real producer and stream code (no broker:
    a counting publisher): frames through the summariser and detector, and
    per-node edge digests through the detector. Also checks both modes give
    the same verdict ids (exit 1 when not). See eroica/bench/edge.py.

    \b
    Examples:
      eroica bench edge
      eroica bench edge --nodes 32 --json edge.json
    """
    from pathlib import Path

    from eroica.bench.edge import EdgeBenchConfig, format_report, run, to_json

    cfg = EdgeBenchConfig(nodes=nodes, gpus=gpus, steps=steps, profile=profile, seed=seed, window_s=window_s)
    if faults:
        cfg.faults = list(faults)
    result = run(cfg)
    report = format_report(result)
    if json_path == "-":
        print(report, file=sys.stderr)
        sys.stdout.buffer.write(to_json(result))
    else:
        print(report)
        if json_path:
            Path(json_path).write_bytes(to_json(result))
    if not result["same_verdict_ids"]:
        sys.exit(1)


@bench.command("live")
@click.option("--ranks", "ranks", type=click.IntRange(min=1), multiple=True,
              help="Ranks of the job (8 GPUs per node) [default: 1024]. Repeat for a ladder: runs in order, "
                   "stops at the first size that falls behind.")
@click.option("--steps", type=click.IntRange(min=4), default=None,
              help="Training steps [default: enough for --windows windows].")
@click.option("--windows", type=click.FloatRange(min=3.0), default=8.0, show_default=True,
              help="Length of the run in windows, when --steps is not given.")
@click.option("--window-s", type=click.FloatRange(min=1.0), default=None,
              help="EROICA_WINDOW_S for the stack [default: the environment's, else 30 s].")
@click.option("--fault", default=None, help="Simulator fault, without start= [default: gpu_throttle:rank=2N/3+1].")
@click.option("--fault-at", type=click.FloatRange(min=1.0), default=3.5, show_default=True,
              help="Fault onset, in windows from the run's first window start.")
@click.option("--profile", type=click.Choice(["default", "realistic"]), default="default", show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--broker", type=click.Choice(["tansu", "kafka"]), default="tansu", show_default=True,
              help="Broker `eroica up` starts (kafka: Apache Kafka from the installed jars).")
@click.option("--summarisers", type=click.IntRange(min=1), default=1, show_default=True,
              help="Summariser processes of the stack (`eroica up --summarisers`), sharing the raw partitions.")
@click.option("--drain-s", type=click.FloatRange(min=1.0), default=120.0, show_default=True,
              help="How long the pipeline may take to drain once the replay ended.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Also write the results as JSON to this file.")
@click.option("--work-dir", type=click.Path(file_okay=False), default=None,
              help="Keep the stack's logs here (default: a temporary directory, removed; the input is always removed).")
@click.option("--declared-watermarks/--guessed-watermarks", default=True, show_default=True,
              help="Frames declare their stream's watermark as live collectors do (windows close 5 s after it), "
                   "or carry none (windows close one lateness after the guessed marks). With --edge-digests each "
                   "node declares its mark with each batch, as a live agent or tracer does.")
@click.option("--edge-digests/--raw", "edge_digests", default=False, show_default=True,
              help="Digest mode: the replay digests each node's records at the edge as `eroica replay "
                   "--edge-digests` does (its digesters guess their marks) and sends window digests, which the "
                   "detector reads directly; the summariser reads nothing. Judged on digests delivered against "
                   "digests read; the replay process's CPU is reported as the edge (the nodes') cost. "
                   "Default: raw frames through the summariser.")
@click.option("--frame-s", type=click.FloatRange(min=0.001), default=None,
              help="Raw mode: the most event time one frame spans (default: the replay's, as a tracer's 0.5 s "
                   "flush with a 1 s linger). The summariser's cost is per frame: longer frames, fewer of them, "
                   "windows closing that much later.")
def live(ranks: tuple[int, ...], steps: int | None, windows: float, window_s: float | None, fault: str | None,
         fault_at: float, profile: str, seed: int, broker: str, drain_s: float, fmt: str, json_path: str | None,
         work_dir: str | None, declared_watermarks: bool, summarisers: int, edge_digests: bool,
         frame_s: float | None) -> None:
    """A simulated job replayed at its real event rate through `eroica up`: does the stack keep up?

    \b
    Every record the simulator emits is released when its event time comes
    (shifted to now); meanwhile, every second: records published against
    records summarised (lag), digests sent against digests analysed, committed
    offsets, CPU seconds and memory per process (broker, summariser, detector,
    sink, supervisor, the replay itself), and the verdicts in ClickHouse.
    Reports drops and dead letters (must be 0), the fault-to-verdict delay in
    seconds and windows, and whether the stack keeps up (exit 1 when not).
    With --edge-digests the nodes' digests are sent instead of raw frames (digest
    mode): the lag is window digests delivered against digests the detector read.
    See eroica/bench/live.py.

    \b
    Examples:
      eroica bench live --ranks 1024
      eroica bench live --ranks 1024 --ranks 2048 --ranks 4096 --windows 6 --json live.json
      eroica bench live --ranks 2048 --summarisers 2
      eroica bench live --ranks 1024 --edge-digests
      eroica bench live --ranks 1024 --frame-s 4
      EROICA_WINDOW_S=4 eroica bench live --ranks 16 --windows 6 --format json
    """
    from pathlib import Path

    from eroica.bench.live import LiveConfig, format_table, run_ladder, to_json

    def progress(msg: str) -> None:
        if sys.stderr.isatty() or fmt == "table":
            print(f"  {msg}", file=sys.stderr, flush=True)

    results: list[dict] = []

    def report(r: dict) -> None:
        results.append(r)
        if fmt == "table":
            print(format_table(r), flush=True)
            print(flush=True)

    try:
        base = LiveConfig(ranks=(ranks or (1024,))[0], steps=steps, windows=windows, window_s=window_s, fault=fault,
                          fault_at=fault_at, profile=profile, seed=seed, broker=broker, drain_s=drain_s,
                          work_dir=Path(work_dir) if work_dir else None, progress=progress,
                          declared_watermarks=declared_watermarks, summarisers=summarisers,
                          edge_digests=edge_digests, frame_s=frame_s)
        run_ladder(base, ranks or (1024,), lambda _n: steps, report)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    doc = results[0] if len(results) == 1 else {"runs": results}
    if fmt == "json":
        sys.stdout.buffer.write(to_json(doc))
    if json_path:
        Path(json_path).write_bytes(to_json(doc))
    if not results or not results[-1]["keeps_up"]:
        sys.exit(1)


@bench.command("cost")
@click.option("--seeds", type=click.IntRange(min=1), default=3, show_default=True, help="Seeds 1..N.")
@click.option("--scale", type=click.Choice(["small", "medium"]), default="small", show_default=True)
@click.option("--only", default=None, help="Run only scenarios whose name contains this text.")
@click.option("--profile", type=click.Choice(["default", "realistic"]), default="default", show_default=True,
              help="Simulator fleet profile (realistic: nuisances drawn per seed, the detector's default window).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--reference", is_flag=True,
              help="Instead: eroica whatif's S against the OSDI'25 study's reference analyzer (../shared) on "
                   "generated pipeline traces and on the real ST trace.")
@click.option("--traces", type=click.IntRange(min=1), default=60, show_default=True,
              help="With --reference: how many pipeline traces to generate (shapes, schedules, culprits).")
@click.option("--trace-seed", type=click.IntRange(min=1), default=1, show_default=True,
              help="With --reference: the seed the traces are drawn from.")
def cost(seeds: int, scale: str, only: str | None, profile: str, fmt: str, reference: bool, traces: int,
         trace_seed: int) -> None:
    """The online cost estimate (S, S_X per job window) against the simulator's ground truth.

    \b
    With --reference, instead: ``eroica whatif`` (import optable, then whatif,
    as a user runs them) against the OSDI'25 study's reference analyzer
    (../shared/reference/straggler-whatif) on --traces generated pipeline
    tables (pp 2-8, dp 2-32, 4-64 micro-batches, 1F1B / interleaved / GPipe,
    one culprit or several) and on the real ST trace against its published
    result: S of each, its error, the top stage / DP index of each, summary.

    Every fault scenario of ``bench accuracy`` (of the chosen profile) is
    simulated with its fault and again without it (same seed: the same jitter), which
    gives the true slowdown S of each job window's steps; the estimate is the
    detector's, from the digests. Prints the relative error of S, and whether
    the injected culprit (rank, node, or the ring its NIC / NVLink paces) has
    the largest S_X.

    \b
    Examples:
      eroica bench cost --seeds 3
      eroica bench cost --seeds 1 --only gpu --format json
      eroica bench cost --seeds 1 --profile realistic
      eroica bench cost --reference --traces 60
    """
    if reference:
        _cost_reference(traces, trace_seed, fmt)
        return
    from eroica.bench.cost import result_json, run_all, summary

    def progress(r) -> None:
        if sys.stderr.isatty():
            print(f"  seed {r.seed} {r.scenario}: S true {r.s_true:.3f} est {r.s_est:.3f}", file=sys.stderr)

    results = run_all(seeds, scale, only, progress, profile)
    totals = summary(results)
    if fmt == "json":
        _write_json({"summary": totals, "scenarios": [result_json(r) for r in results]})
        return
    console, table = _cost_table(f"Eroica cost estimate vs ground truth ({profile}, {scale}, seeds 1..{seeds})",
                                 ("seed", "scenario", "scope", "S true", "S est", "rel err", "culprit",
                                  "largest S_X", "culprit S_X"))
    for r in results:
        parts = "; ".join(f"{k}: true {a:.3f} est {b:.3f}" for k, (a, b) in r.parts.items())
        table.add_row(str(r.seed), r.scenario, r.scope, f"{r.s_true:.3f}", f"{r.s_est:.3f}", f"{r.rel_error:.1%}",
                      r.culprit or parts or "-",
                      "-" if r.culprit_top is None else ("yes" if r.culprit_top else f"no ({r.top})"),
                      "-" if r.culprit_cost is None else f"{r.culprit_cost:.3f}")
    console.print(table)
    for label, key in (("all scenarios", "all"),
                       ("all but the causes priced from an assumed healthy bandwidth (nccl_tcp, congestion)",
                        "priced"), ("stragglers (rank, node, link, two faults, healthy)", "stragglers"),
                       ("job-wide and stage faults (priced from their findings' evidence where it measured "
                        "an ideal)", "job_scope")):
        t = totals[key]
        if t["scenarios"]:
            console.print(f"[bold]{label}[/bold]: {t['scenarios']} scenarios, relative error of S: median "
                          f"{t['median_rel_error']:.1%}, worst {t['worst_rel_error']:.1%} ({t['worst']})")
    console.print(f"[bold]culprit has the largest S_X[/bold]: {totals['culprit_top']}/{totals['single_culprit']} "
                  f"single-culprit scenarios")
    where = ", ".join(totals["unpriced_scenarios"]) or "none"
    console.print(f"[bold]confident verdicts (>= 0.5) stating no cost[/bold]: {totals['unpriced_verdicts']} ({where})")


def _write_json(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, indent=1) + "\n")


def _cost_table(title: str, columns: tuple[str, ...]):
    """The console (200 wide off a terminal) and an empty table with these columns."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, overflow="fold")
    return Console(width=None if sys.stdout.isatty() else 200), table


def _cost_reference(traces: int, seed: int, fmt: str) -> None:
    """``bench cost --reference``: one row per generated trace and the ST trace, then the summary."""
    from eroica.bench.cost_reference import TARGET, result_json, run_all, summary

    def progress(r) -> None:
        if sys.stderr.isatty():
            got = "n/m" if r.s_eroica is None else f"{r.s_eroica:.3f}"
            print(f"  {r.name}: S reference {r.s_ref:.3f} eroica {got}", file=sys.stderr)

    results, real = run_all(traces, seed, progress)
    totals = summary(results, real)
    if fmt == "json":
        _write_json({"summary": totals, "traces": [result_json(r) for r in results]})
        return
    console, table = _cost_table(f"eroica whatif vs the OSDI'25 reference analyzer ({traces} traces, seed {seed})",
                                 ("trace", "config", "culprit", "S reference", "S eroica", "error",
                                  "top reference", "top eroica"))
    for r in results + ([real] if real else []):
        err = "not measurable" if r.s_eroica is None else f"{r.rel_error:.1%}"
        table.add_row(r.name, r.config, r.culprit, f"{r.s_ref:.3f}", "-" if r.s_eroica is None else
                      f"{r.s_eroica:.3f}", err, r.top_ref or "-",
                      r.top_eroica + (" (differs)" if r.agree is False else ""))
    console.print(table)
    def pct(x: float | None) -> str:
        return "not measurable" if x is None else f"{x:.1%}"

    console.print(f"[bold]S error[/bold] over {totals['traces']} generated traces: median "
                  f"{pct(totals['median_rel_error'])}, worst {pct(totals['worst_rel_error'])} ({totals['worst']}); "
                  f"{totals['within_target']}/{totals['traces']} within {TARGET:.0%}, "
                  f"{totals['not_measurable']} not measurable")
    for sched, t in totals["by_schedule"].items():
        console.print(f"  {sched}: {t['within_target']}/{t['traces']} within {TARGET:.0%}, median error "
                      f"{pct(t['median_rel_error'])}")
    console.print(f"[bold]top contributor (stage or dp index) agrees[/bold]: {totals['top_agree']}/"
                  f"{totals['top_compared']} traces where the reference decomposes S")
    if real:
        err = "not measurable" if real.s_eroica is None else f"{real.rel_error:.1%}"
        console.print(f"[bold]ST trace[/bold]: published S {real.s_ref:.3f}, eroica "
                      f"{'-' if real.s_eroica is None else f'{real.s_eroica:.3f}'} ({err}), top "
                      f"{real.top_ref} / {real.top_eroica}")
