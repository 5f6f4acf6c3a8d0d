"""The rows of the ``summaries`` table: each (rank, function) of a time window, with its slowdown.

``slowdown_vs_peers`` is the peer test's own measure, per function: the
rank's per-step cost over the *leave-one-out* median of the other ranks of
its role (:meth:`.layout.Layout.peer_groups`: the pipeline stage, split by
tensor-parallel position or the job's role labels), as a verdict's
``slowdown`` is for the functions it names. A rank is never in its own
median, and a stage that computes more by design never reads as slow
against the other stages. What still differs from a verdict: the span (a
time window here, a job window of whole steps there) and the sum (a verdict
adds up the culprit's abnormal functions, floored at 0.1% of a step each).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from eroica.models.digest import WindowDigest
from eroica.models.records import FN_KINDS, JobRecord
from eroica.models.summary import WindowSummary

from .layout import infer_layout
from .patterns import Patterns, build_patterns
from .robust import leave_one_out_median


def slowdown_vs_peers(p: Patterns, groups: Mapping[int, npt.NDArray[np.int64]]) -> npt.NDArray[np.float64]:
    """(ranks x functions): per-step cost over the leave-one-out median of the rank's role, NaN where undefined."""
    cost = np.where(np.isfinite(p.per_step_ns), p.per_step_ns, np.nan)
    out = np.full(cost.shape, np.nan)
    for members in groups.values():
        block = cost[members]
        for f in range(block.shape[1]):
            ok = np.flatnonzero(np.isfinite(block[:, f]))
            if ok.size < 2:
                continue
            med = leave_one_out_median(block[ok, f])
            with np.errstate(all="ignore"):
                out[members[ok], f] = np.where(med > 0, block[ok, f] / med, np.nan)
    return out


def window_summaries(d: WindowDigest, meta: JobRecord | None = None, p: Patterns | None = None) -> list[WindowSummary]:
    """Rows for the ``summaries`` table: every (rank, function) that ran in the window."""
    if p is None and not len(d.ranks):  # continuations alone: no step of any rank ran here, no call
        return []
    p = p if p is not None else build_patterns(d)
    if not p.ranks.size:
        return []
    node = dict(zip(d.ranks.rank.tolist(), d.ranks.node))
    slow = slowdown_vs_peers(p, infer_layout(d, meta).peer_groups(p.ranks))
    rows: list[WindowSummary] = []
    r_idx, f_idx = np.nonzero(p.count > 0)
    for r, f in zip(r_idx.tolist(), f_idx.tolist()):
        rows.append(WindowSummary(
            job=d.job, window_start_ns=d.start_ns, window_end_ns=d.end_ns, rank=int(p.ranks[r]),
            node=node.get(int(p.ranks[r]), ""), fn=p.fn_names[f], kind=FN_KINDS[int(p.fn_kinds[f])],
            count=int(p.count[r, f]), median_ns=float(p.median_ns[r, f]), p90_ns=float(p.p90_ns[r, f]),
            p99_ns=float(p.p99_ns[r, f]), total_ns=float(p.total_ns[r, f]), beta=float(p.beta[r, f]),
            slowdown_vs_peers=float(slow[r, f]) if np.isfinite(slow[r, f]) else float("nan"),
        ))
    return rows
