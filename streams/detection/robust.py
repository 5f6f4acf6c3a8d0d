"""Robust statistics: the median / MAD vocabulary of every peer comparison.

Means and standard deviations are dragged by the very outlier we look for;
the median and the median absolute deviation are not (breakdown point 50%).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its sigma


def robust_z(values: np.ndarray, rel_floor: float = 0.02, abs_floor: float = 1e-12) -> tuple[np.ndarray, float, float]:
    """z-scores against the median, scaled by MAD.

    ``rel_floor`` bounds the scale below by a share of the median: when peers
    agree almost perfectly (MAD ~ 0, common in lock-step training) a 1% wobble
    must not become a z of 100; ``abs_floor`` does the same for values near zero.
    Returns (z, median, scale).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values, float("nan"), float("nan")
    med = float(np.median(values))
    mad = float(np.median(np.abs(values - med))) * MAD_TO_SIGMA
    scale = max(mad, abs(med) * rel_floor, abs_floor)
    return (values - med) / scale, med, scale


def leave_one_out_median(values: np.ndarray) -> np.ndarray:
    """For each element, the median of the others (vectorised via sorted order).

    Comparing a rank with a median that includes itself understates its
    deviation when peers are few (8 ranks of a node, 2 of a stage). One
    column of :func:`column_leave_one_out_medians`.
    """
    values = np.asarray(values, dtype=np.float64)
    out: np.ndarray = column_leave_one_out_medians(values.reshape(-1, 1))[:, 0]
    return out


def column_medians(block: np.ndarray) -> np.ndarray:
    """``np.median`` of each column of a 2-D array of finite values, by one sort (the very bits).

    ``np.median`` averages the middle value(s) as its ``mean`` does,
    ``(0.0 + a [+ b]) / count``; equal middle values differ at most in a
    zero's sign, which ``0.0 +`` removes, so the sort's order of ties cannot show.
    """
    s = np.sort(block, axis=0)
    h = s.shape[0] // 2
    if s.shape[0] % 2:
        out: np.ndarray = (0.0 + s[h]) / 1.0
        return out
    with np.errstate(over="ignore"):
        even: np.ndarray = ((0.0 + s[h - 1]) + s[h]) / 2.0
    return even


def column_leave_one_out_medians(block: np.ndarray) -> np.ndarray:
    """For each element of a 2-D array, the median of the other elements of its column: all columns by one sort.

    Sorted, each element's median of the others is one of the two middle
    values (or their mean), chosen by whether it sat at or below them.
    """
    n = block.shape[0]
    if n <= 1:
        return np.full(block.shape, np.nan)
    order = np.argsort(block, axis=0, kind="stable")
    s = np.take_along_axis(block, order, axis=0)
    m = n - 1  # size of the remaining set
    # Median of s without position p: positions of the middle elements shift by one when p <= mid.
    lo_idx, hi_idx = (m - 1) // 2, m // 2
    pos = np.arange(n)[:, None]

    def pick(k: int) -> npt.NDArray[np.float64]:
        picked: npt.NDArray[np.float64] = np.where(pos <= k, s[min(k + 1, n - 1)], s[k])
        return picked

    with np.errstate(over="ignore"):
        med_sorted = 0.5 * (pick(lo_idx) + pick(hi_idx))
    out = np.empty(block.shape)
    np.put_along_axis(out, order, med_sorted, axis=0)
    return out
