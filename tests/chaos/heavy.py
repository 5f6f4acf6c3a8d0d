"""The heavy-neighbour case (issue 34): a 100,000-function job replayed beside a normal job on one stack.

A job that names every call differently must not take the stack down nor hold up
the jobs beside it: its functions beyond the budget are folded (counted on the
detector's stats page, said in its log) and the normal job's verdicts are those
of ``analyze``, complete within two windows (plus the idle close) of its replay's end.
"""

from __future__ import annotations

import time
from pathlib import Path

from chaos.harness import ChaosStack, Job, check_job, service_stats, stack_settings
from sink_helpers import wait_for

HEAVY_NAMES = 100_000
HEAVY_JOB = "heavy-100k"
SERVICES = ("summariser", "detector", "sink")


def heavy_job_file(tmp: Path, names: int = HEAVY_NAMES, job: str = HEAVY_JOB) -> Job:
    """The heavy job (a healthy 2x2 job with ``names`` distinctly named metric calls) as a :class:`Job`.

    Its verdicts are not compared (none expected of a healthy job; ``analyze`` of it is the batch test's).
    """
    from eroica.streams.detection.test_budget import heavy_job

    tmp.mkdir(parents=True, exist_ok=True)
    return Job(job, heavy_job(tmp, names=names, job=job), frozenset())


def heavy_job_case(stack: ChaosStack, job: Job, broker: str) -> None:
    """The heavy job and ``job`` replayed at once: no restart, ``job``'s ids in time, the excess counted."""
    settings = stack_settings(stack)
    bound_s = 2 * settings.window_s + settings.idle_close_s
    heavy = heavy_job_file(stack.data_dir.parent / "heavy")
    restarts = {s: stack.restarts(s) for s in SERVICES}
    det0 = service_stats(stack, "detector")
    before, failed = det0.get("folded_functions", 0), det0.get("failed_windows", 0)

    t0 = time.monotonic()
    reps = {HEAVY_JOB: stack.replay(heavy, rate=None), job.name: stack.replay(job)}
    ended: dict[str, float] = {}
    while len(ended) < len(reps):
        for name, rep in reps.items():
            if name not in ended and rep.poll() is not None:
                ended[name] = time.monotonic()
        if time.monotonic() - t0 > 180:
            for rep in reps.values():
                rep.kill()
            raise AssertionError(f"replays not done after 180 s (ended: {sorted(ended)})\n{stack.log_tail()}")
        time.sleep(0.1)
    for name, rep in reps.items():
        out = rep.stdout.read() if rep.stdout else ""
        assert rep.returncode == 0, f"replay of {name} failed ({rep.returncode}): {out[-2000:]}"

    # the normal job's ids complete: measured from its replay's end (the heavy one may still be replaying)
    case = f"{HEAVY_NAMES:,}-function job beside"
    try:
        wait_for(lambda: stack.stored(job.name) >= job.expected, max(120.0, bound_s + 30), f"{case}: all ids",
                 interval_s=0.25)
    except AssertionError:
        pass  # check_job says what is missing, with the log
    done = time.monotonic()
    result = check_job(stack, job, case, broker, t0)
    to_complete = done - ended[job.name]
    print(f"  replays: {job.name} {ended[job.name] - t0:.1f} s, {HEAVY_JOB} {ended[HEAVY_JOB] - t0:.1f} s "
          f"({heavy.path.stat().st_size / 2**20:.1f} MiB); {job.name}'s ids complete {to_complete:.1f} s after its "
          f"replay's end (bound {bound_s:.0f} s: 2 windows of {settings.window_s:g} s + idle close "
          f"{settings.idle_close_s:g} s)", flush=True)
    assert to_complete <= bound_s, (f"{job.name}'s ids complete {to_complete:.1f} s after its replay's end, "
                                    f"over {bound_s:.0f} s; {result.line()}\n{stack.log_tail()}")

    # the heavy job's excess counted (the detector's stats page) and said (its log)
    def folded() -> dict:
        st = service_stats(stack, "detector")
        return st if st.get("folded_functions", 0) > before else {}

    try:
        det = wait_for(folded, 60, "the detector's folded_functions to grow", interval_s=0.5)
    except AssertionError:
        raise AssertionError(f"no folded functions on the detector's stats page: {service_stats(stack, 'detector')}"
                             f"\n{stack.log_tail()}") from None
    summ = service_stats(stack, "summariser")
    log = Path(stack.state()["services"]["detector"]["log"]).read_text(errors="replace")
    said = [ln for ln in log.splitlines() if f"job {HEAVY_JOB!r}" in ln and "beyond the budget" in ln]
    now = {s: stack.restarts(s) for s in SERVICES}
    print(f"  detector: folded_functions {det['folded_functions'] - before} (windows {det.get('windows')}, "
          f"forced {det.get('forced_windows')}, failed {det.get('failed_windows')}); summariser: folded_functions "
          f"{summ.get('folded_functions')}; fold lines in the detector's log: {len(said)}; restarts {restarts} -> {now}",
          flush=True)
    assert said, f"the detector's log does not say why {HEAVY_JOB}'s functions were folded"
    assert det.get("failed_windows", 0) == failed, f"the detector failed on windows: {det}"
    assert now == restarts, f"services restarted during the case: {restarts} -> {now}\n{stack.log_tail()}"
