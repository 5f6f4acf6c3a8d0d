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
    return merge_sorted(starts[order], ends[order])


def merge_sorted(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge` of intervals already in start order (no sort): the same union.

    A new interval opens where a start lies past every end before it
    (touching intervals join); its end is the largest end of its run,
    ``np.maximum.reduceat`` over the runs, which is what ``np.maximum.at`` per
    run gives, with no scatter.
    """
    if s.size == 0:
        return s.astype(np.int64, copy=False), e.astype(np.int64, copy=False)
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], run_end[:-1], out=new[1:])
    firsts = np.flatnonzero(new)
    return s[firsts].astype(np.int64, copy=False), np.maximum.reduceat(e, firsts).astype(np.int64, copy=False)


def covered(hs: npt.NDArray[np.int64], he: npt.NDArray[np.int64],
            a: npt.NDArray[np.int64], b: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Length of ``[a, b)`` covered by the disjoint sorted intervals ``(hs, he)``."""
    if hs.size == 0:
        return np.zeros(a.shape, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(he - hs)))
    # Each interval's end, behind a first one no query reaches past (the axis keeps below 2**62).
    ends = np.concatenate(([-_AXIS_LIMIT], he))
    out = _upto(hs, ends, cum, b)
    out -= _upto(hs, ends, cum, a)
    return out


def _upto(hs: np.ndarray, ends: np.ndarray, cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Covered length before ``t``: every interval that starts at or before it, less what the last one runs past it."""
    j = np.searchsorted(hs, t, side="right")
    past = ends[j]
    past -= t
    np.maximum(past, 0, out=past)
    out: np.ndarray = cum[j]
    out -= past
    return out


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
    axis = on_axis(slot, start, end, span)
    if axis is not None:
        s, e = axis
        return exclusive_time_on_axis(s, e, level, np.argsort(s, kind="stable"))
    n_slots = int(slot.max()) + 1
    per = max(1, _AXIS_LIMIT // max(int(span), 1))
    out = np.zeros(slot.size, dtype=np.int64)
    for lo in range(0, n_slots, per):
        sel = np.flatnonzero((slot >= lo) & (slot < lo + per))
        if sel.size:
            out[sel] = exclusive_time(slot[sel] - lo, start[sel], end[sel], level[sel], span)
    return out


def on_axis(slot: np.ndarray, start: np.ndarray, end: np.ndarray,
            span: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Starts and ends laid end to end per slot on one int64 axis (``slot * span + offset``); None when they do not fit."""
    n_slots = int(slot.max()) + 1 if slot.size else 0
    if n_slots > max(1, _AXIS_LIMIT // max(int(span), 1)):
        return None
    s = slot.astype(np.int64)
    s *= np.int64(span)
    e = end.astype(np.int64)
    e -= start
    s += start
    e += s
    return s, e


def exclusive_time_on_axis(s: np.ndarray, e: np.ndarray, level: np.ndarray, order: np.ndarray) -> np.ndarray:
    """:func:`exclusive_time` of events on one axis (:func:`on_axis`); ``order`` is ``np.argsort(s, kind="stable")``,
    which a caller that needs the same order shares.

    Levels go from the highest priority down, each against the union of those
    before it. A level's events, taken from ``order``, come in start order, so
    its union is taken without a sort (:func:`merge_sorted`) and joined to
    the (small: back-to-back kernels make one interval) union of the levels
    before it; the last level's union is never needed. Arrays the size of the
    window are few (each costs its page faults): the rest is per level. Every
    step is integer arithmetic: the result is exact, whatever the order of
    the work.
    """
    out = np.empty(s.size, dtype=np.int64)
    lvl_o = level[order]
    levels = _distinct(level)
    hs = he = np.empty(0, dtype=np.int64)
    for k, lvl in enumerate(levels):
        idx = order[lvl_o == lvl]
        a, b = s[idx], e[idx]
        r = b - a
        if hs.size:
            r -= covered(hs, he, a, b)
        out[idx] = r
        del idx, r
        if k + 1 < levels.size:
            ls, le = merge_sorted(a, b)
            if hs.size:
                both = np.concatenate((hs, ls))
                o = np.argsort(both, kind="stable")
                hs, he = merge_sorted(both[o], np.concatenate((he, le))[o])
            else:
                hs, he = ls, le
    return out


def _distinct(level: np.ndarray) -> np.ndarray:
    """``np.unique(level)``: a count per value instead of a sort when the levels are small integers."""
    if level.size and level.dtype.kind in "iu" and int(level.min()) >= 0 and int(level.max()) < 1 << 16:
        return np.flatnonzero(np.bincount(level)).astype(level.dtype)
    return np.unique(level)
