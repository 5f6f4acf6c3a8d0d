"""Hangs: no progress for several step times, everyone but the culprit waiting in a collective.

Collectors dump still-running functions with ``in_flight: true`` (at a hang or
shutdown). A rank stuck in a non-collective function is the culprit; when every
dumped function is a collective, the ranks *missing* from the collective are.
"""

from __future__ import annotations

import numpy as np

from eroica.models.digest import WindowDigest
from eroica.models.records import FN_KINDS

from .findings import Finding
from .patterns import K_COLL

HANG_STEPS = 3.0          # no progress for this many usual step times
HANG_FLOOR_NS = 30 * 10**9  # without a known step time, half a minute

_COMPONENT_OF_KIND = {
    "kernel": "gpu", "memcpy": "pcie", "dataloader": "dataloader", "io": "storage",
    "python": "python", "optimizer": "python", "other": "python", "collective": "network",
}


_SPECIFIC = ("kernel", "memcpy", "dataloader", "io")


def hang_findings(d: WindowDigest, step_ns: float, rank_node: dict[int, str]) -> list[Finding]:
    inf = d.in_flight
    if not len(inf):
        return []
    limit = HANG_STEPS * step_ns if np.isfinite(step_ns) and step_ns > 0 else HANG_FLOOR_NS
    durs = np.asarray(inf.dur_ns, dtype=np.int64)
    sel = np.flatnonzero(durs >= limit)
    if sel.size == 0:
        return []
    ranks = np.asarray(inf.rank, dtype=np.int64)[sel]
    kinds = np.asarray(inf.kind, dtype=np.int64)[sel]
    durs = durs[sel]
    fns = [inf.fn[i] for i in sel]
    waiting = set(ranks[kinds == K_COLL].tolist())
    all_ranks = set(d.ranks.rank.tolist()) | set(inf.rank.tolist()) | set(inf.last_rank.tolist())
    culprits: dict[int, tuple[str, str, float]] = {}
    best: dict[int, tuple[float, bool, str]] = {}
    for i in np.flatnonzero(kinds != K_COLL):
        r = int(ranks[i])
        if r in waiting:
            continue  # a rank waiting in a collective is a victim, whatever else it dumped
        # the longest stuck function; of two that started together, the more specific
        # one (a kernel, copy, loader or I/O call inside an enclosing Python frame),
        # then the name: never the order of the dump's records
        key = (float(durs[i]), FN_KINDS[int(kinds[i])] in _SPECIFIC, fns[i])
        if r not in best or key > best[r]:
            best[r] = key
            culprits[r] = (fns[i], FN_KINDS[int(kinds[i])], float(durs[i]))
    if not culprits and waiting:
        missing = sorted(all_ranks - waiting)
        if 0 < len(missing) <= max(1, len(all_ranks) // 2):
            last = {r: (f, k) for r, f, k in zip(inf.last_rank.tolist(), inf.last_fn, inf.last_kind.tolist())}
            for r in missing:
                name, kind = last.get(r, ("", FN_KINDS.index("other")))
                culprits[r] = (name, FN_KINDS[int(kind)], float("nan"))
    victims = sorted(waiting - set(culprits))
    findings: list[Finding] = []
    wait_s = float(np.median(durs[kinds == K_COLL])) / 1e9 if (kinds == K_COLL).any() else float("nan")
    for r, (name, kind, dur) in culprits.items():
        stuck_s = dur / 1e9 if np.isfinite(dur) else wait_s
        findings.append(Finding(
            kind="hang", component=_COMPONENT_OF_KIND.get(kind, "python"), scope="rank",
            node=rank_node.get(r, ""), rank=r, fn=name,
            slowdown=float(max(1.0, (stuck_s * 1e9) / step_ns)) if np.isfinite(step_ns) and step_ns > 0 else 1.0,
            score=float(len(victims)), confidence=0.95 if victims else 0.6,
            peers=sorted(all_ranks - {r}), victims=victims, culprits=[r],
            evidence={"stuck_s": {"culprit": round(stuck_s, 3)},
                      "waiting_in_collective": {"ranks": len(victims), "median_wait_s": round(wait_s, 3)},
                      "usual_step_s": {"value": round(step_ns / 1e9, 3) if np.isfinite(step_ns) else None}},
            summary=(f"rank {r} on {rank_node.get(r, '?')}: stuck in {name} ({kind}) for {stuck_s:.1f}s; "
                     f"{len(victims)} ranks wait in a collective"),
        ))
    return findings
