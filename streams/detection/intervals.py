"""Interval arithmetic for the critical path, vectorised over all ranks at once.

Each instant of a rank's timeline is credited to one activity, by priority
(GPU compute > memory op > collective > host): an event's *exclusive* time is
the part of it not covered by any higher-priority event on the same rank.
Ranks are laid end to end on one axis (``rank_slot * span``) so a single
sort / ``searchsorted`` serves every rank.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals as disjoint, sorted intervals."""
    if starts.size == 0:
        return starts.astype(np.int64), ends.astype(np.int64)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    group = np.cumsum(new) - 1
    ms = s[new]
    me = np.zeros(ms.size, dtype=np.int64)
    np.maximum.at(me, group, e)
    return ms, me


def covered(hs: npt.NDArray[np.int64], he: npt.NDArray[np.int64],
            a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Length of ``[a, b)`` covered by the disjoint sorted intervals ``(hs, he)``."""
    if hs.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    lengths = he - hs
    cum = np.concatenate(([0], np.cumsum(lengths)))

    def upto(t: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        j = np.searchsorted(hs, t, side="right") - 1
        jj = np.clip(j, 0, None)
        part = np.clip(t - hs[jj], 0, lengths[jj])
        return np.where(j >= 0, cum[jj] + part, 0)

    return upto(b) - upto(a)


# Slots laid end to end must stay below this on the shared int64 axis.
_AXIS_LIMIT = 2**62


def exclusive_time(
    slot: np.ndarray, start: np.ndarray, end: np.ndarray, level: np.ndarray, span: int
) -> np.ndarray:
    """Per event, its time not covered by higher-priority (lower ``level``) events on its slot.

    ``start``/``end`` are relative to a common origin and lie in ``[0, span)``.
    Slots are laid end to end on one int64 axis; when ``slots * span`` would not
    fit (many ranks, long durations: 15,000 ranks and week-long spans), they are
    taken in groups that fit, with the same result (slots never interact).
    """
    n_slots = int(slot.max()) + 1 if slot.size else 0
    per = max(1, _AXIS_LIMIT // max(int(span), 1))
    if n_slots <= per:
        return _exclusive_time(slot, start, end, level, span)
    out = np.zeros(slot.size, dtype=np.int64)
    for lo in range(0, n_slots, per):
        sel = np.flatnonzero((slot >= lo) & (slot < lo + per))
        if sel.size:
            out[sel] = _exclusive_time(slot[sel] - lo, start[sel], end[sel], level[sel], span)
    return out


def _exclusive_time(
    slot: np.ndarray, start: np.ndarray, end: np.ndarray, level: np.ndarray, span: int
) -> np.ndarray:
    off = slot.astype(np.int64) * np.int64(span)
    s = start.astype(np.int64) + off
    e = end.astype(np.int64) + off
    out = np.zeros(s.size, dtype=np.int64)
    hs = np.empty(0, dtype=np.int64)
    he = np.empty(0, dtype=np.int64)
    # Each level's events in start order (one sort for all levels): every merge below then
    # joins two sorted runs, which its stable sort does in linear time. The union is the same.
    order = np.argsort(s, kind="stable")
    level_in_order = level[order]
    for lvl in _distinct(level):
        idx = order[level_in_order == lvl]
        out[idx] = (e[idx] - s[idx]) - covered(hs, he, s[idx], e[idx])
        hs, he = merge(np.concatenate((hs, s[idx])), np.concatenate((he, e[idx])))
    return out


def _distinct(level: np.ndarray) -> np.ndarray:
    """``np.unique(level)``: a count per value instead of a sort when the levels are small integers."""
    if level.size and level.dtype.kind in "iu" and int(level.min()) >= 0 and int(level.max()) < 1 << 16:
        return np.flatnonzero(np.bincount(level)).astype(level.dtype)
    return np.unique(level)
