"""Job-level notes: what the analysis could not do for a job, said beside the verdicts, never as one.

A note is not a verdict: it names no culprit and has no confidence, so it stays
out of the verdict stream (the contract's array, the verdict topic, ClickHouse).
The one note so far: a role with fewer ranks than the peer test needs
(:data:`.peers.MIN_PEERS`). A 2- or 3-rank job otherwise reads "no rank, node
or link behaves abnormally" when no rank was compared with its peers at all;
its ranks are still judged against the expected behaviour (clocks and
throttling: :mod:`.clocks`; loader, host and link shares: :mod:`.expected`)
and against the job's own history (:mod:`.regression`), which need no peers.

Pure: computed from a digest's ranks, the job record's layout and the GPU
counters' classes; no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from eroica.models.digest import WindowDigest
from eroica.models.records import JobRecord

from . import attribution as attr
from .budget import MAX_FN_IDENTITIES
from .counters import CounterSummary, from_digest
from .layout import Layout, infer_layout
from .peers import MIN_PEERS

FEW_PEERS = "few_peers"
FOLDED = "folded"  # functions beyond the job's budget folded (budget.py)


@dataclass(frozen=True)
class Note:
    """One job-level note: ``kind`` says which (:data:`FEW_PEERS`), ``text`` says it in a sentence."""

    job: str
    kind: str
    text: str
    ranks: int                 # ranks the job window held
    smallest_group: int = 0    # ranks in the smallest group the peer test would compare
    needed: int = 0            # ranks a group needs for the peer test
    uncompared: tuple[int, ...] = ()  # the ranks no peer test compares (their kernels, at least)
    folded: int = 0            # functions folded beyond the budget, over the job's windows (FOLDED)

    def to_json(self) -> dict[str, Any]:
        """The note as one JSON object; ``"type": "note"`` tells it from a verdict wherever both travel."""
        out: dict[str, Any] = {"type": "note", "job": self.job, "kind": self.kind, "text": self.text,
                               "ranks": self.ranks}
        if self.kind == FOLDED:
            out["folded"] = self.folded
        else:
            out.update(smallest_group=self.smallest_group, needed=self.needed, uncompared=list(self.uncompared))
        return out


def kernel_groups(groups: dict[int, np.ndarray], ranks: np.ndarray, counters: CounterSummary) -> list[np.ndarray]:
    """The sets of slots the peer test compares GPU kernels within: each peer group, split by GPU class.

    ``groups``: the peer groups (:meth:`.layout.Layout.peer_groups`, slots of
    ``ranks``). Kernels are compared within a GPU class only (the detector's
    split by model: a slower model is no straggler), and only where the job
    holds several classes. ``counters`` should carry the model power limits
    (:func:`.attribution.with_model_power_limits`), as the detector's do.
    """
    classes = attr.gpu_classes(counters, [int(r) for r in ranks])
    if len(set(classes.values())) <= 1:
        return [m for _, m in sorted(groups.items())]
    out: list[np.ndarray] = []
    for _, members in sorted(groups.items()):
        cls = np.array([classes.get(int(ranks[m]), -1) for m in members])
        out += [members[cls == c] for c in np.unique(cls)]
    return out


def unpeered(groups: dict[int, np.ndarray], ranks: np.ndarray, counters: CounterSummary) -> np.ndarray:
    """Which slots of ``ranks`` the peer test cannot compare on their GPU kernels (a bool per slot).

    Those in a set of :func:`kernel_groups` with fewer than
    :data:`.peers.MIN_PEERS` ranks: the leave-one-out median and MAD of fewer
    than three others cannot tell an outlier from a pair (:mod:`.peers`), so
    the peer test skips such a set. A group too small takes no peer test on
    any function; a GPU class too small inside a larger group misses only the
    kernels' (host, loader and copy functions compare across classes).
    """
    out = np.zeros(ranks.size, dtype=bool)
    for members in kernel_groups(groups, ranks, counters):
        if members.size < MIN_PEERS:
            out[members] = True
    return out


def few_peers_note(job: str, groups: dict[int, np.ndarray], ranks: np.ndarray,
                   counters: CounterSummary | None = None) -> Note | None:
    """The note for a job whose peer test cannot compare some of its ranks; None when it compares them all.

    Three wordings, from the widest: every role too small ("only 3 ranks per
    role"), some roles too small ("2 of 4 roles have fewer than 4 ranks"), or
    a GPU model too rare inside its role (:func:`unpeered`).
    """
    if ranks.size == 0 or not groups:
        return None
    counters = counters or CounterSummary()
    mask = unpeered(groups, ranks, counters)
    if not mask.any():
        return None
    sizes = sorted(int(m.size) for m in groups.values())
    small = [s for s in sizes if s < MIN_PEERS]
    uncompared = tuple(sorted(int(r) for r in ranks[mask]))
    needs = f"the peer test needs {MIN_PEERS}"
    if len(small) == len(sizes):
        lo, hi = small[0], small[-1]
        count = f"{lo}" if lo == hi else f"{lo}-{hi}"
        what = (f"only {count} rank{'s' if hi > 1 else ''} per role; {needs}; "
                "compared against expected behaviour and the job's own history only")
    elif small:
        few = tuple(sorted(int(ranks[i]) for m in groups.values() if m.size < MIN_PEERS for i in m))
        what = (f"{len(small)} of its {len(sizes)} roles have fewer than {MIN_PEERS} ranks ({_ranks(few)}); "
                f"{needs}; those ranks compared against expected behaviour and the job's own history only")
    else:
        what = (f"{_ranks(uncompared)}: GPUs of a model that fewer than {MIN_PEERS} ranks of their role share; "
                f"{needs} within a GPU model; their kernels compared against expected behaviour and the job's "
                "own history only")
    smallest = min(int(m.size) for m in kernel_groups(groups, ranks, counters))
    return Note(job=job, kind=FEW_PEERS, text=f"job {job}: {what}", ranks=int(ranks.size),
                smallest_group=smallest, needed=MIN_PEERS, uncompared=uncompared)


def _ranks(ranks: tuple[int, ...], shown: int = 8) -> str:
    """'rank 3' / 'ranks 0, 1, 2' / 'ranks 0, 1, ... (12)': a list that stays one short clause."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    head = ", ".join(str(r) for r in ranks[:shown])
    return f"ranks {head}" + (f", ... ({len(ranks)})" if len(ranks) > shown else "")


def window_note(d: WindowDigest, meta: JobRecord | None) -> Note | None:
    """:func:`few_peers_note` for one digest: its ranks, the layout the detector infers, its GPU classes."""
    ranks = np.unique(np.asarray(d.ranks.rank, dtype=np.int64))
    layout: Layout = infer_layout(d, meta)
    counters = attr.with_model_power_limits(from_digest(d), layout.rank_node)
    return few_peers_note(d.job, layout.peer_groups(ranks), ranks, counters)


class JobNotes:
    """Each job's note, from the window that saw the most of its ranks (the fullest view of its layout).

    A window that misses some ranks' records (a late node, the end of input)
    must not make a 32-rank job read as a small one, and a job's note is said
    once, not per window. Ties keep the earlier window. In memory only.
    """

    def __init__(self) -> None:
        self._best: dict[str, tuple[int, Note | None]] = {}
        self._folded: dict[str, tuple[int, int, int]] = {}  # job -> (functions folded, windows, most ranks)

    def add(self, d: WindowDigest, meta: JobRecord | None) -> None:
        seen = int(np.unique(np.asarray(d.ranks.rank)).size)
        if d.folded:
            f, w, r = self._folded.get(d.job, (0, 0, 0))
            self._folded[d.job] = (f + d.folded, w + 1, max(r, seen))
        if seen == 0 or seen <= self._best.get(d.job, (0, None))[0]:
            return
        self._best[d.job] = (seen, window_note(d, meta))

    def notes(self) -> list[Note]:
        """The notes, by job."""
        out = [n for _, (_, n) in sorted(self._best.items()) if n is not None]
        for job, (folded, windows, ranks) in sorted(self._folded.items()):
            out.append(Note(job=job, kind=FOLDED, ranks=ranks, folded=folded, text=(
                f"job {job}: {folded} functions beyond the budget of {MAX_FN_IDENTITIES} a window (name and "
                f"stack) folded into one '(other <kind> functions)' row per rank and kind in {windows} window(s): "
                "their time is kept and compared as that one function")))
        return sorted(out, key=lambda n: (n.job, n.kind))
