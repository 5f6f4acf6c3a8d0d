"""The job's own history: a function that got slower on every rank alike.

Peers cannot see a regression that hits every rank (a new kernel version, a
changed library), and it may stay inside every expected range. Compared with
the job's own earlier windows it stands out: NVIDIA's "individual score",
Greyhound's change points. The reference is the first windows of the job, so
a persisting regression keeps being reported (with one incident id) instead of
becoming the new normal after a few windows.

Levels are each function's *low quantile* of per-step cost (its best steady
steps, ``Patterns.low_ns``), compared like with like, and the reference is the
lowest of the first windows' levels: a regression that starts a few steps into
the job has already moved the first window's median, but not its best steps.
Warm-up steps are slower, so they never lower the reference.
"""

from __future__ import annotations

import msgspec
import numpy as np

from .findings import Finding, confidence_of
from .history import JobHistory
from .patterns import K_COLL, K_IO, K_LOADER, Patterns

REFERENCE_WINDOWS = 3   # windows that make up the reference
# One window is enough: the reference is a minimum of low quantiles, which a
# short or warm-up-only first window can only raise (a missed regression, never
# a false one).
MIN_REFERENCE = 1
MIN_RATIO = 1.15
# A job-wide median against the job's own reference is nearly noise-free, so a
# smaller cost is already a finding: >= 0.5% of the step, full weight at 1%.
MIN_MATERIAL = 0.005
FULL_MATERIAL = 0.01
RANK_SHARE = 0.8        # ... slower on >= 80% of ranks: shared, not one rank's problem
MIN_PRESENCE = 0.5      # functions run by at least half the ranks
MIN_STEPS = 3           # as a job window's minimum (steps.MIN_WINDOW_STEPS): a median that ignores one odd step

# A level that shifted inside the window (shift_findings): its steps' low quantile sits at the earlier
# level and its median at the new one, the high quantile close above the median: the rise from low to
# median at least SHIFT_SHAPE times the spread from median to high. Jitter around one level spreads
# about as far below the median as above it (ratio ~1); 3x keeps a skewed jitter out (healthy fleets:
# at most 19% of a function's ranks pass, against RANK_SHARE's 80%, over 22 healthy runs x windows).
SHIFT_SHAPE = 3.0
# A level needs steps on both sides: 8 interior steps put the 5% quantile on a step before the onset
# and the median on four after it.
SHIFT_STEPS = 8

# Collectives and the loader have their own tests (links, expected behaviour).
_SKIP_KINDS = (K_COLL, K_LOADER, K_IO)


def fn_key(name: str, stack: str) -> str:
    return f"{name}|{stack}" if stack else name


def regression_findings(p: Patterns, history: JobHistory, step_ns: float) -> list[Finding]:
    out: list[Finding] = []
    if np.median(p.steps) < MIN_STEPS:
        return out
    all_ranks = [int(r) for r in p.ranks]
    for f in range(len(p.fn_names)):
        if int(p.fn_kinds[f]) in _SKIP_KINDS:
            continue
        ref = history.reference.get(fn_key(p.fn_names[f], p.fn_stacks[f]))
        if not ref or len(ref) < MIN_REFERENCE:
            continue
        col = p.low_ns[:, f]
        ok = np.isfinite(col)
        if ok.mean() < MIN_PRESENCE:
            continue
        # A function most ranks run in fewer than half their steps (a metrics logger every 10 steps,
        # a checkpoint) has no per-step level to regress: its level of a window is one or two calls,
        # and its cost comes in pauses (expected.pause_findings). With many ranks the share of ranks
        # that must be slower hides that noise; in a 2-rank job it alarmed on a healthy logger.
        if np.mean(p.sporadic[ok, f]) > 0.5:
            continue
        base = float(np.min(ref))
        now = float(np.median(col[ok]))
        if base <= 0:
            continue
        ratio = now / base
        if ratio < MIN_RATIO or now - base < MIN_MATERIAL * step_ns:
            continue
        if np.mean(col[ok] / base >= 1.0 + (MIN_RATIO - 1.0) / 2) < RANK_SHARE:
            continue
        # Noise of the job-wide level: the ranks' spread around it (MAD), with a
        # floor of 2% for drift between windows that no rank spread shows.
        mad = float(np.median(np.abs(col[ok] - now))) * 1.4826 / base
        z = (ratio - 1.0) / max(mad, 0.02)
        out.append(Finding(
            kind="slow", component="software", scope="job", fn=p.fn_names[f], slowdown=round(ratio, 4),
            score=round(float(z), 3), confidence=confidence_of(ratio, z, (now - base) / step_ns, FULL_MATERIAL),
            peers=all_ranks, culprits=[],
            evidence={p.fn_names[f]: {"now_ns_per_step": round(now), "reference_ns_per_step": round(base),
                                      "ratio": round(ratio, 3), "reference_windows": len(ref),
                                      "ranks_slower": int(np.sum(col[ok] / base >= 1.1))}},
            summary=(f"{p.fn_names[f]} runs {ratio:.2f}x slower than in this job's first windows on "
                     f"{int(np.sum(col[ok] / base >= 1.1))} of {int(ok.sum())} ranks: a software regression"),
        ))
    return out


def shift_findings(p: Patterns, step_ns: float, already: set[str]) -> list[Finding]:
    """A function whose level rose on every rank alike at a point inside this window (a change point).

    Without the job's earlier windows (a short trace: the job's only window), or with earlier
    windows that hold only warm-up steps (slower: a reference too high), the history cannot show a
    regression that began inside the window; the window's own steps can. Per rank, the interior
    steps' low quantile is the level before the onset, the median the level after it (more than
    half the steps after it), and the high quantile sits close above the median (:data:`SHIFT_SHAPE`).
    The same thresholds as the history's comparison: :data:`MIN_RATIO`, on :data:`RANK_SHARE` of the
    ranks, material (:data:`MIN_MATERIAL`). ``already``: functions the history already found.
    """
    out: list[Finding] = []
    q = p.interior_q
    if q is None or np.median(p.steps) < SHIFT_STEPS:
        return out
    all_ranks = [int(r) for r in p.ranks]
    for f in range(len(p.fn_names)):
        if int(p.fn_kinds[f]) in _SKIP_KINDS or p.fn_names[f] in already:
            continue
        med, lo, hi = q[:, f, 0], q[:, f, 1], q[:, f, 2]
        ok = np.isfinite(med) & np.isfinite(lo) & np.isfinite(hi) & (lo > 0) & (p.steps >= SHIFT_STEPS)
        if ok.mean() < MIN_PRESENCE or np.mean(p.sporadic[ok, f]) > 0.5:
            continue
        shifted = (med[ok] >= MIN_RATIO * lo[ok]) & (med[ok] - lo[ok] >= SHIFT_SHAPE * (hi[ok] - med[ok]))
        if shifted.mean() < RANK_SHARE:
            continue
        base, now = float(np.median(lo[ok])), float(np.median(med[ok]))
        ratio = now / base
        if ratio < MIN_RATIO or now - base < MIN_MATERIAL * step_ns:
            continue
        mad = float(np.median(np.abs(med[ok] - now))) * 1.4826 / base
        z = (ratio - 1.0) / max(mad, 0.02)
        n_shift = int(shifted.sum())
        out.append(Finding(
            kind="slow", component="software", scope="job", fn=p.fn_names[f], slowdown=round(ratio, 4),
            score=round(float(z), 3), confidence=confidence_of(ratio, z, (now - base) / step_ns, FULL_MATERIAL),
            peers=all_ranks, culprits=[],
            evidence={p.fn_names[f]: {"now_ns_per_step": round(now), "reference_ns_per_step": round(base),
                                      "ratio": round(ratio, 3), "within_window": True, "ranks_slower": n_shift}},
            summary=(f"{p.fn_names[f]} runs {ratio:.2f}x slower since a point inside this window on {n_shift} of "
                     f"{int(ok.sum())} ranks (its best steps at the earlier level, most at the new one): a "
                     "software regression"),
        ))
    return out


def remember(p: Patterns, history: JobHistory, regressed: set[str]) -> dict[str, list[float]]:
    """The reference after this window: the first windows' typical per-step cost of each function.

    A function found regressed in this window does not enter its own reference.
    """
    ref = {k: list(v) for k, v in history.reference.items()}
    if np.median(p.steps) < MIN_STEPS:
        return ref
    for f in range(len(p.fn_names)):
        key = fn_key(p.fn_names[f], p.fn_stacks[f])
        if p.fn_names[f] in regressed:
            continue
        values = ref.setdefault(key, [])
        if len(values) >= REFERENCE_WINDOWS:
            continue
        col = p.reference_low_ns[:, f]  # less steps that lost records (patterns._level), computed here only
        if np.isfinite(col).mean() >= MIN_PRESENCE:
            values.append(float(np.nanmedian(col)))
    return {k: v for k, v in ref.items() if v}


def with_window(history: JobHistory, p: Patterns | None, start_ns: int, streak: dict[str, int],
                regressed: set[str]) -> JobHistory:
    return msgspec.structs.replace(
        history, windows=history.windows + 1, last_start_ns=start_ns, streak=streak,
        reference=remember(p, history, regressed) if p is not None else history.reference,
    )
