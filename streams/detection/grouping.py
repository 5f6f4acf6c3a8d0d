"""Grouped reductions over flat arrays (sum / quantile / first per group) without Python loops.

``np.bincount`` for sums (fastest, per the streaming notes) and one ordering by (group, value) for
order statistics of all groups at once.
"""

from __future__ import annotations

import numpy as np

# By its installed name, as fn_rows imports it (numba's cache records it).
from eroica.streams.detection.kernels import loaded


def dense_ids(*keys: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """Map tuples of integer keys to dense ids 0..G-1.

    Returns (ids, G, index of one representative row per id).
    """
    dense = _dense_ids_by_table(keys)
    if dense is not None:
        return dense
    if len(keys) == 1:
        combined = keys[0].astype(np.int64)
    else:
        ks = [k.astype(np.int64) for k in keys]
        # The keys are packed into one int64 (key 0 most significant) when that cannot
        # overflow; otherwise (a step number near 2^63 is a valid record) sorted row-wise,
        # which gives the very same ids, in the same order, and the same representatives.
        space = 1
        for k in ks:
            space *= int(k.max()) + 2 if k.size else 1
        if space >= 2**63 or any(k.size and int(k.min()) < -1 for k in ks):
            return _dense_ids_sorted(ks)
        combined = np.zeros(keys[0].shape, dtype=np.int64)
        for k in ks:
            width = int(k.max()) + 2 if k.size else 1
            combined = combined * width + (k + 1)
    uniq, first, ids = np.unique(combined, return_index=True, return_inverse=True)
    return ids.astype(np.int64), int(uniq.size), first


# A table of every possible key tuple costs this many slots per row at most: beyond it
# (wide step numbers, many functions) sorting is the cheaper way.
_TABLE_SLOTS_PER_ROW = 4
_TABLE_SLOTS_MIN = 1 << 16


def _dense_ids_by_table(keys: tuple[np.ndarray, ...]) -> tuple[np.ndarray, int, np.ndarray] | None:
    """:func:`dense_ids` without a sort, when the keys' ranges multiply to a small table (else None).

    Each key is offset by its minimum and packed (key 0 most significant) into a
    slot of a table of every possible tuple: a tuple's id is the number of
    occupied slots before its own, so ids come in key order, and its
    representative is its first row (``np.minimum.at``), as the sort gives.
    """
    table = table_slots(*keys)
    if table is None:
        return None
    slot, space = table
    n = slot.size
    ids, g = _occupied_ids(slot, space)
    first = np.full(g, n, dtype=np.intp)
    np.minimum.at(first, ids, np.arange(n, dtype=np.intp))
    return ids, g, first


def table_slots(*keys: np.ndarray) -> tuple[np.ndarray, int] | None:
    """Each row's slot in a table of every possible key tuple (key 0 most significant), and the table's size.

    None when the keys are not all integers or the table would exceed
    ``_TABLE_SLOTS_PER_ROW`` slots per row: then sorting is the cheaper way.
    Slots come in key order; one int64 array is built, in place.
    """
    n = keys[0].size
    if n == 0 or any(k.dtype.kind not in "iub" or (k.dtype.kind == "u" and k.dtype.itemsize >= 8) for k in keys):
        return None
    lows, widths = [], []
    space = 1
    for k in keys:
        lo, hi = int(k.min()), int(k.max())
        lows.append(lo)
        widths.append(hi - lo + 1)
        space *= hi - lo + 1
        if space > max(_TABLE_SLOTS_PER_ROW * n, _TABLE_SLOTS_MIN):
            return None
    slot = np.zeros(n, dtype=np.int64)
    for k, lo, width in zip(keys, lows, widths):
        slot *= width
        slot += k
        if lo:
            slot -= lo
    return slot, space


def _occupied_ids(slot: np.ndarray, space: int) -> tuple[np.ndarray, int]:
    """Dense ids of table slots: the number of occupied slots before each row's own (key order), and their count
    (by the compiled :func:`.kernels._slot_ids_source` once the summariser has loaded the kernels)."""
    ks = loaded()
    if ks is not None and slot.dtype == np.int64:
        out = np.empty(slot.size, dtype=np.int64)
        return out, ks.slot_ids(slot, space, out)
    present = np.zeros(space, dtype=bool)
    present[slot] = True
    code = np.cumsum(present, dtype=np.int64)
    ids: np.ndarray = code[slot]
    ids -= 1
    return ids, int(code[-1])


def dense_ids_only(*keys: np.ndarray) -> tuple[np.ndarray, int]:
    """:func:`dense_ids` without the representatives (the same ids, in key order), which cost a scatter per row."""
    table = table_slots(*keys)
    if table is None:
        ids, g, _ = dense_ids(*keys)
        return ids, g
    return _occupied_ids(*table)


def _dense_ids_sorted(ks: list[np.ndarray]) -> tuple[np.ndarray, int, np.ndarray]:
    """:func:`dense_ids` by a stable lexicographic sort: ids in key order, first occurrence as representative."""
    n = ks[0].size
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0, np.zeros(0, dtype=np.intp)
    order = np.lexsort(ks[::-1])  # lexsort's last key is the primary one
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in ks:
        sk = k[order]
        change[1:] |= sk[1:] != sk[:-1]
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(change) - 1
    return ids, int(change.sum()), order[change]


def _order(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """``np.lexsort((values, ids))``, the very same permutation, faster.

    Two stable sorts: by value, then by group id; the ids are narrowed to 16
    bits when there are few enough groups, which numpy sorts by radix in
    linear time.
    """
    by_value = np.argsort(values, kind="stable")
    keys = ids[by_value]
    if keys.size and int(keys.min()) >= 0 and int(keys.max()) < 1 << 16:
        keys = keys.astype(np.uint16)
    return by_value[np.argsort(keys, kind="stable")]


def _sorted_by_group(ids: np.ndarray, values: np.ndarray, n: int, grouped: bool = False) -> np.ndarray | None:
    """``values[_order(ids, values, n)]`` as float64, by one sort of packed integers; None when they do not pack.

    Non-negative whole values (durations, byte counts, sums of them) and the
    group id fit one int64 (``id * (max + 1) + value``) whenever the product
    does: sorting that is sorting by (group, value), with no permutation to
    build. Floats take this way only when each is exactly an integer below
    2**53 and none is negative or ``-0.0`` (which would come back as ``0.0``).
    ``grouped``: the rows come in group order already (``ids`` non-decreasing):
    the packed values are then runs that a stable sort (timsort) merges in
    about linear time, where quicksort would take its full ``n log n``; the
    sorted array is the same either way.
    """
    if values.size == 0 or ids.dtype.kind not in "iu" or values.dtype.kind not in "iuf":
        return None
    if values.dtype.kind == "f":
        if not bool(np.isfinite(values).all()) or bool(np.signbit(values).any()):
            return None
        vmax = float(values.max())
        if vmax >= 2.0**53 or not bool((values == np.trunc(values)).all()):
            return None
        width = int(vmax) + 1
    else:
        if int(values.min()) < 0:
            return None
        width = int(values.max()) + 1
    if int(ids.min()) < 0 or (int(ids.max()) + 1) * width >= 2**62:
        return None
    packed = ids.astype(np.int64)
    packed *= width
    packed += values if values.dtype == np.int64 else values.astype(np.int64)
    packed.sort(kind="stable" if grouped else None)
    np.remainder(packed, width, out=packed)
    return packed.astype(np.float64)


def group_sum(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(ids, weights=values.astype(np.float64), minlength=n)


def group_count(ids: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(ids, minlength=n).astype(np.int64)


def group_quantiles(ids: np.ndarray, values: np.ndarray, n: int, qs: tuple[float, ...]) -> np.ndarray:
    """Quantiles per group (nearest-rank on the lower side, like a streaming sketch).

    Returns an array of shape (len(qs), n); NaN for empty groups.
    """
    if ids.size == 0:
        return np.full((len(qs), n), np.nan)
    return sorted_quantiles(*group_sorted(ids, values, n), qs)


def group_sorted(ids: np.ndarray, values: np.ndarray, n: int,
                 grouped: np.ndarray | bool | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Values as float64 sorted by (group, value), each group's count and its first position in them.

    ``grouped``: a permutation that puts the rows in group order (any order
    within a group), or True when they come so already (``ids``
    non-decreasing), which makes the sort cheaper (:func:`_sorted_by_group`);
    the answer does not depend on it.
    """
    sv = None
    if grouped is True:
        sv = _sorted_by_group(ids, values, n, grouped=True)
    elif isinstance(grouped, np.ndarray):
        sv = _sorted_by_group(ids[grouped], values[grouped], n, grouped=True)
    if sv is None:
        sv = _sorted_by_group(ids, values, n)
    if sv is None:
        sv = values[_order(ids, values, n)].astype(np.float64)
    counts = np.bincount(ids, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    return sv, counts, starts


def sorted_quantiles(sv: np.ndarray, counts: np.ndarray, starts: np.ndarray, qs: tuple[float, ...]) -> np.ndarray:
    """:func:`group_quantiles` from :func:`group_sorted`'s answer: (len(qs), groups), NaN for empty groups."""
    out = np.full((len(qs), counts.size), np.nan)
    has = counts > 0
    every = bool(has.all())
    for i, q in enumerate(qs):
        pos = starts + np.floor(q * (counts - 1) + 0.5).astype(np.int64)
        if every:
            np.take(sv, pos, out=out[i])
        else:
            out[i, has] = sv[pos[has]]
    return out


def group_median(ids: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """``np.median`` of each group's values, all groups by one sort; NaN for an empty group or one holding a NaN.

    The very bits ``np.median`` gives: its middle order statistics are unique by
    value (equal values differ at most in the sign of a zero), and it averages
    them as its ``mean`` does, ``(0.0 + a [+ b]) / count``, which makes a zero
    of either sign 0.0, so which of two equal zeros sits in the middle cannot
    show.
    """
    out = np.full(n, np.nan)
    if not values.size:
        return out
    values = values.astype(np.float64, copy=False)
    order = np.lexsort((values, ids))
    sv = values[order]
    counts = np.bincount(ids, minlength=n)
    starts = np.cumsum(counts) - counts
    has = counts > 0
    lo = (starts + (counts - 1) // 2)[has]
    hi = (starts + counts // 2)[has]
    with np.errstate(over="ignore", invalid="ignore"):
        med = np.where(counts[has] % 2 == 1, (0.0 + sv[lo]) / 1.0, ((0.0 + sv[lo]) + sv[hi]) / 2.0)
    out[has] = med
    nan = np.bincount(ids, weights=np.isnan(values), minlength=n) > 0
    out[nan] = np.nan
    return out


def group_max(ids: np.ndarray, values: np.ndarray, n: int, fill: float = np.nan) -> np.ndarray:
    out = np.full(n, -np.inf)
    np.fmax.at(out, ids, values.astype(np.float64))  # fmax: NaN values are ignored
    out[np.isneginf(out)] = fill
    return out


def group_min(ids: np.ndarray, values: np.ndarray, n: int, fill: float = np.nan) -> np.ndarray:
    out = np.full(n, np.inf)
    np.fmin.at(out, ids, values.astype(np.float64))
    out[np.isposinf(out)] = fill
    return out


def group_weighted_median(ids: np.ndarray, values: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """Weighted median per group (the first value whose cumulative weight reaches half); NaN rows dropped, NaN for empty groups.

    Used to combine rows that each summarise several steps (their median, weighted
    by their step count): exact when every row holds one step, the median of the
    rows' medians otherwise.
    """
    out = np.full(n, np.nan)
    ok = np.isfinite(values) & (weights > 0)
    if not ok.any():
        return out
    ids, values, weights = ids[ok], values[ok].astype(np.float64), weights[ok].astype(np.float64)
    order = _order(ids, values, n)
    sid, sv, sw = ids[order], values[order], weights[order]
    cum = np.cumsum(sw)
    totals = np.bincount(sid, weights=sw, minlength=n)
    before = np.concatenate(([0.0], np.cumsum(totals)[:-1]))
    # first row of each group whose cumulative weight reaches half the group's weight
    reached = cum - before[sid] >= 0.5 * totals[sid]
    pos = np.flatnonzero(reached)
    first = np.full(n, -1)
    first[sid[pos[::-1]]] = pos[::-1]   # reversed so the earliest position wins
    has = first >= 0
    out[has] = sv[first[has]]
    return out


def dense_ids_of_slots(slot: np.ndarray, space: int) -> tuple[np.ndarray, int]:
    """Dense ids (in slot order) of rows given as slots of a table of ``space`` slots (``0 <= slot < space``), and
    their count: :func:`dense_ids_only` of keys a caller has packed itself (key 0 most significant)."""
    return _occupied_ids(slot, space)


def dense_ids_by_sort(*keys: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
    """:func:`dense_ids` (the same ids, count and representatives) by one sort of packed int64 keys.

    Where the keys' table is too large to count (:func:`table_slots`),
    ``dense_ids`` takes ``np.unique`` with its index and inverse: a stable
    argsort (numpy's timsort of int64) and scatters. Here the rows' slots in
    the table (key 0 most significant: key order) are put in stable order by
    :func:`stable_argsort`, so each run's first row is its smallest index
    (the representative ``np.unique`` returns). Keys that do not pack take
    ``dense_ids``.
    """
    n = keys[0].size
    if n < 2 or any(k.dtype.kind not in "iub" or (k.dtype.kind == "u" and k.dtype.itemsize >= 8) for k in keys):
        return dense_ids(*keys)
    space = 1
    lows = []
    for k in keys:
        lo = int(k.min())
        lows.append(lo)
        space *= int(k.max()) - lo + 1
        if space >= 1 << 62:
            return dense_ids(*keys)
    slot = np.zeros(n, dtype=np.int64)
    for k, lo in zip(keys, lows):
        slot *= int(k.max()) - lo + 1
        slot += k
        if lo:
            slot -= lo
    order = stable_argsort(slot)
    slot = slot[order]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(slot[1:], slot[:-1], out=new[1:])
    ids = np.empty(n, dtype=np.int64)
    ids[order] = np.cumsum(new) - 1
    first = order[new]
    return ids, int(first.size), first


def stable_argsort(key: np.ndarray) -> np.ndarray:
    """``np.argsort(key, kind="stable")`` of integer keys, the very same permutation.

    Each key, less the smallest, is shifted left and the record's index put in
    the low bits: the packed keys are distinct and sort as (key, index) do,
    which is the stable order, so numpy's unstable sort (a vectorised
    quicksort, several times faster than its timsort of int64) gives it. Keys
    too wide to leave room for the index take the stable sort itself.
    """
    n = key.size
    if n < 2:
        return np.argsort(key, kind="stable")
    bits = (n - 1).bit_length()
    lo = int(key.min())
    if int(key.max()) - lo >= 1 << (63 - bits):
        return np.argsort(key, kind="stable")
    packed = key.astype(np.int64)  # a copy: the key is left as it was
    if lo:
        packed -= lo
    packed <<= bits
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    packed &= (1 << bits) - 1
    return packed
