"""Hardware counters summarised per window: what attribution reads.

Rates and levels are medians over the window's samples (robust to one odd
sample); cumulative error counters become their increase over the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eroica.models.columns import Columns
from eroica.models.digest import WindowDigest

from .grouping import dense_ids, group_max, group_min, group_quantiles, stable_argsort
# By its installed name, as fn_rows imports it (numba's cache records it).
from eroica.streams.detection.kernels import loaded

# NVML clock-event reasons that mean "slowed down", not "idle" or "app clocks":
# SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, power brake 0x80.
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

NIC_ERRORS = ("symbol_errors", "rx_errors", "link_downed", "tx_discards", "retransmits")
NIC_CONGESTION = ("cnp_sent", "xmit_wait")


@dataclass
class CounterSummary:
    """Per-rank GPU, per-NIC and per-node host summaries: name -> {key: value}."""

    gpu: dict[int, dict[str, float]] = field(default_factory=dict)        # rank -> metrics
    gpu_index: dict[int, int] = field(default_factory=dict)               # rank -> GPU index
    nic: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)  # (node, nic) -> metrics
    host: dict[str, dict[str, float]] = field(default_factory=dict)       # node -> metrics


def _medians(ids: np.ndarray, n: int, cols: Columns, names: tuple[str, ...],
             rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Per entity, the median of each column's samples (NaN samples left out); ``rows``: :func:`_equal_groups`.

    With as many samples per entity (``rows``) a column without NaN is
    sorted row by row. The other float columns are taken together, from one
    (entities, samples) grid of them (:func:`_sample_grid`: entities with
    fewer samples, and NaN samples, padded with NaN), where a grouped sort
    per column cost a sort and several passes each (a window's GPU samples
    rarely come one per rank and period exactly, and a GPU without NVLink or
    PCIe counters reports NaN for them).
    """
    arrays = cols.arrays
    out: dict[str, np.ndarray] = {}
    grid = None
    gaps = []  # float columns with missing samples, or entities with fewer samples: taken together
    for name in names:
        v = arrays[name]
        if v.dtype != np.float64:
            continue
        if rows is not None and not bool(np.isnan(v).any()):
            out[name] = _row_medians(v[rows])
        else:
            gaps.append(name)
    if gaps:
        grid = _sample_grid(ids, n, rows)
    if grid is not None:
        values = np.empty((len(gaps), ids.size))
        for r, k in enumerate(gaps):
            values[r] = arrays[k]
        out.update(zip(gaps, _grid_medians(values, grid)))
    for name in names:
        if name not in out:
            v = arrays[name]
            ok = ~np.isnan(v)
            out[name] = group_quantiles(ids[ok], v[ok], n, (0.5,))[0] if ok.any() else np.full(n, np.nan)
    return {name: out[name] for name in names}


def _row_medians(values: np.ndarray) -> np.ndarray:
    """Each row's median (last axis) as :func:`.grouping.group_quantiles` takes it (nearest rank, lower side)
    over rows of as many values, none NaN.

    The grouped sort is stable: of equal values it picks the one first in
    record order. Equal values have the same bits except ``0.0`` and ``-0.0``,
    so without a ``-0.0`` numpy's unstable (vectorised, ~10x faster) sort
    picks the very same value; with one, a stable sort per row does.
    """
    m = values.shape[-1]
    neg_zero = bool(((values == 0) & np.signbit(values)).any())
    values.sort(axis=-1, kind="stable" if neg_zero else None)
    out: np.ndarray = values[..., int(np.floor(0.5 * (m - 1) + 0.5))]
    return out


def _equal_groups(ids: np.ndarray, n: int) -> np.ndarray | None:
    """The rows as an (entities, samples) index matrix, each entity's samples in record order, when every entity
    has as many samples (one GPU sample per rank every period, one NIC sample per port); else None."""
    if ids.size == 0 or n == 0 or ids.size % n:
        return None
    counts = np.bincount(ids, minlength=n)
    if not bool((counts == ids.size // n).all()):
        return None
    order = np.argsort(ids.astype(np.uint16) if n <= 1 << 16 else ids, kind="stable")
    return order.reshape(n, ids.size // n)


# A grid of samples costs at most this many slots per sample (the rest padding): past it, one entity
# with many more samples than the others, the grouped sorts are the cheaper way.
_GRID_SLOTS_PER_SAMPLE = 4


def _sample_grid(ids: np.ndarray, n: int, rows: np.ndarray | None = None) -> np.ndarray | None:
    """The samples as an (entities, most samples of one + 1) index matrix, each entity's in record order, padded
    with ``ids.size`` (an index past the samples: :func:`_grid_medians` reads a NaN there), at least once per
    entity; from :func:`_equal_groups`' ``rows`` where every entity has as many. None when the padding would
    outweigh the samples."""
    size = ids.size
    if rows is not None:
        return np.concatenate((rows, np.full((rows.shape[0], 1), size, dtype=rows.dtype)), axis=1)
    if size == 0 or n == 0:
        return None
    counts = np.bincount(ids, minlength=n)
    width = int(counts.max()) + 1
    if n * width > _GRID_SLOTS_PER_SAMPLE * size + 1024:  # (a small grid is cheap whatever its padding)
        return None
    order = np.argsort(ids.astype(np.uint16) if n <= 1 << 16 else ids, kind="stable")  # 16 bits: a radix sort
    grid = np.full((n, width), size, dtype=np.intp)
    at = np.arange(size, dtype=np.intp)
    at -= np.repeat(np.cumsum(counts) - counts, counts)  # each sample's place among its entity's
    grid[ids[order], at] = order
    return grid


def _grid_medians(values: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Per column of ``values`` (columns, samples), each entity's median as :func:`.grouping.group_quantiles`
    takes it over its samples that are not NaN (nearest rank, lower side; NaN for an entity without one).

    Padding and NaN samples sort last (numpy sorts NaN after every number),
    so each entity's first NaN after the sort is its count of samples (every
    entity has a padding slot). Of equal values the grouped sort picks the
    one first in record order; equal values have the same bits except ``0.0``
    and ``-0.0``, so without a ``-0.0`` numpy's unstable (vectorised, ~10x
    faster) sort picks the very same value; with one, a stable sort of each
    entity's samples (in record order) does.
    """
    neg_zero = bool(((values == 0) & np.signbit(values)).any())
    padded = np.take(np.concatenate((values, np.full((values.shape[0], 1), np.nan)), axis=1), grid, axis=1)
    padded.sort(axis=2, kind="stable" if neg_zero else None)  # (columns, entities, width)
    count = np.isnan(padded).argmax(axis=2).ravel()
    at = np.floor(0.5 * (count - 1) + 0.5).astype(np.int64)
    at += np.arange(0, padded.size, grid.shape[1])  # into the flattened grid, row by row
    out: np.ndarray = padded.ravel()[at]
    out[count == 0] = np.nan
    return out.reshape(values.shape[0], grid.shape[0])


def _by_entity_then_value(ids: np.ndarray, values: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    """``np.lexsort((values, ids))`` (``values`` without NaN); with equal groups (``rows``), a stable sort per row."""
    if rows is None:
        return np.lexsort((values, ids))
    out: np.ndarray = np.take_along_axis(rows, np.argsort(values[rows], axis=1, kind="stable"), axis=1).ravel()
    return out


def _sums_by_value(ids: np.ndarray, n: int, values: np.ndarray, rows: np.ndarray | None,
                   *powers: int) -> list[np.ndarray]:
    """Per entity, the sums of ``values ** p`` for each of ``powers`` (1: the values), added in the entity's
    value order (:func:`_by_entity_then_value`) as ``np.bincount`` adds them: the same bits in any record order.

    With equal groups (``rows``) the values are sorted per row by numpy's
    unstable sort: it may order equal values differently than the stable
    sort, which changes no sum. Equal values have the same bits except
    ``0.0`` and ``-0.0``, and ``bincount`` starts every sum at ``0.0``, to
    which a zero of either sign adds nothing (``0.0 + -0.0 == 0.0``), nor to
    any partial sum after it; NaNs make the sum NaN in any order. Without
    equal groups, values without NaN are sorted so too, in the padded grid of
    :func:`_sample_grid` (padding NaN: last), each entity's first ``count``.
    """
    grid = None if rows is not None or bool(np.isnan(values).any()) else _sample_grid(ids, n)
    if rows is not None:
        ordered = np.sort(values[rows], axis=1).ravel()
        ent = np.repeat(np.arange(n), rows.shape[1])
    elif grid is not None:
        counts = np.bincount(ids, minlength=n)
        padded = np.sort(np.take(np.append(values, np.nan), grid), axis=1)
        ordered = padded[np.arange(grid.shape[1]) < counts[:, None]]  # row by row: each entity's values
        ent = np.repeat(np.arange(n), counts)
    else:
        o = _by_entity_then_value(ids, values, rows)
        ent, ordered = ids[o], values[o]
    return [np.bincount(ent, weights=ordered if p == 1 else ordered ** p, minlength=n) for p in powers]


def _increases(ids: np.ndarray, n: int, a: dict[str, np.ndarray], names: tuple[str, ...], ts: np.ndarray,
               time_order: np.ndarray | None) -> dict[str, np.ndarray]:
    """:func:`_increase` of several counters; those without a missing sample share their time order and
    differences (one pass over a matrix), with the very arithmetic of :func:`_increase`. Once the summariser's
    kernels are loaded, every counter in one compiled pass over their samples in time order
    (:func:`.kernels._increases_source`), missing samples (NaN) and all: a counter with gaps took a dozen
    numpy calls of its own (a port that reports some counters now and then)."""
    ks = loaded()
    if ks is not None and time_order is not None and names:
        values = np.empty((len(names), ids.size))
        for r, k in enumerate(names):
            values[r] = a[k]
        inc = np.empty((len(names), n))
        ks.increases(time_order.astype(np.int64, copy=False), ids.astype(np.int64, copy=False), values,
                     np.empty(n, dtype=np.bool_), np.empty(n), inc)
        return dict(zip(names, inc))
    out: dict[str, np.ndarray] = {}
    full = [k for k in names if time_order is not None and not bool(np.isnan(a[k]).any())]
    if full and time_order is not None:
        i = ids[time_order]
        same = i[1:] == i[:-1]
        later = i[1:][same]
        empty = np.bincount(i, minlength=n) == 0
        x = np.take(np.stack([a[k] for k in full]), time_order, axis=1)  # (a 2-D fancy index: several times slower)
        d = np.diff(x, axis=1)
        step = np.where(d >= 0, d, x[:, 1:])
        for r, k in enumerate(full):
            inc = np.bincount(later, weights=step[r][same], minlength=n).astype(np.float64)
            inc[empty] = np.nan
            out[k] = inc
    return {k: out[k] if k in out else _increase(ids, n, a[k], ts, time_order) for k in names}


def _time_order(ids: np.ndarray, ts: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray | None:
    """``np.lexsort((ts, ids))``, shared by an entity's counters; None if an entity has two samples at one time.

    Without such ties it is the order :func:`_increase` sorts every counter's
    samples in (its tie-break by value never applies), restricted to the
    samples the counter has. ``rows`` (:func:`_equal_groups`: each entity's
    rows in record order, entities in id order): where every entity's samples
    come in strictly increasing time, that is the order itself, with no sort.
    """
    if rows is not None and rows.shape[1] > 0:
        t = ts[rows]
        if bool((t[:, 1:] > t[:, :-1]).all()):
            out: np.ndarray = rows.ravel()
            return out
    order = _lexsort_pair(ts, ids)
    si, st = ids[order], ts[order]
    if si.size > 1 and bool(((si[1:] == si[:-1]) & (st[1:] == st[:-1])).any()):
        return None
    return order


def _lexsort_pair(minor: np.ndarray, major: np.ndarray) -> np.ndarray:
    """``np.lexsort((minor, major))`` of integer keys, the very same permutation: a stable sort of the pair
    packed into one int64 key (:func:`.grouping.stable_argsort`); keys too wide to pack take ``np.lexsort``."""
    if major.size < 2 or any(k.dtype.kind not in "iu" or (k.dtype.kind == "u" and k.dtype.itemsize >= 8)
                             for k in (minor, major)):
        return np.lexsort((minor, major))
    lo_major, lo_minor = int(major.min()), int(minor.min())
    width = int(minor.max()) - lo_minor + 1
    if (int(major.max()) - lo_major + 1) * width >= 1 << 62:
        return np.lexsort((minor, major))
    key = major.astype(np.int64)
    if lo_major:
        key -= lo_major
    key *= width
    key += minor
    if lo_minor:
        key -= lo_minor
    return stable_argsort(key)


def _increase(ids: np.ndarray, n: int, v: np.ndarray, ts: np.ndarray,
              time_order: np.ndarray | None = None) -> np.ndarray:
    """Increase of a cumulative counter per entity over the window, across resets.

    Samples are taken in time order; a sample below its predecessor means the
    counter restarted from 0 (a driver reload, a wrap), so its value is what
    accrued since the restart (the semantics of Prometheus' ``increase``).
    ``max - min`` would read a reset as an increase of the whole old count:
    every error counter of a node whose NIC driver reloaded would look flaky.
    """
    ok = ~np.isnan(v)
    if not ok.any():
        return np.full(n, np.nan)
    if time_order is not None:  # (entity, time) is unique: the same order as the lexsort below
        sel = time_order[ok[time_order]]
        i, x = ids[sel], v[sel]
    else:
        i, x = ids[ok], v[ok]
        order = np.lexsort((x, ts[ok], i))  # equal timestamps: by value, so record order never matters
        i, x = i[order], x[order]
    same = i[1:] == i[:-1]
    d = np.diff(x)
    step = np.where(d >= 0, d, x[1:])
    inc = np.bincount(i[1:][same], weights=step[same], minlength=n).astype(np.float64)
    inc[np.bincount(i, minlength=n) == 0] = np.nan
    return inc


def summarise_gpu(gpu: Columns) -> tuple[dict[int, dict[str, float]], dict[int, int]]:
    a = gpu.arrays
    ids, n, first = dense_ids(a["rank"])
    rows = _equal_groups(ids, n)
    med = _medians(ids, n, gpu, (
        "sm_clock_mhz", "max_sm_clock_mhz", "power_w", "power_limit_w", "temp_c", "sm_util_pct",
        "mem_util_pct", "pcie_gen", "max_pcie_gen", "pcie_width", "max_pcie_width", "pcie_tx_Bps",
        "pcie_rx_Bps", "nvlink_tx_Bps", "nvlink_rx_Bps",
    ), rows)
    tr = a["throttle_reasons"]
    has_tr = ~np.isnan(tr)
    throttled = np.where(has_tr, (np.nan_to_num(tr).astype(np.int64) & THROTTLE_MASK) != 0, False)
    thr_share = np.bincount(ids, weights=throttled.astype(float), minlength=n) / np.maximum(
        np.bincount(ids, weights=has_tr.astype(float), minlength=n), 1)
    thr_share[np.bincount(ids, weights=has_tr.astype(float), minlength=n) == 0] = np.nan
    # NVLink bytes moved per second over the window (mean, not median): a checkpoint or
    # evaluation pause that idles the links for half the window must not read as "unused".
    nv_has = ~(np.isnan(a["nvlink_tx_Bps"]) & np.isnan(a["nvlink_rx_Bps"]))
    nv = np.nan_to_num(a["nvlink_tx_Bps"]) + np.nan_to_num(a["nvlink_rx_Bps"])
    nv_cnt = np.bincount(ids, weights=nv_has.astype(float), minlength=n)
    # Summed in a fixed order: the same bits in any record order (``nv`` is 0 where both are NaN).
    nv_mean = _sums_by_value(ids, n, nv, rows, 1)[0] / np.maximum(nv_cnt, 1)
    nv_mean[nv_cnt == 0] = np.nan
    ecc = _increases(ids, n, a, ("ecc_uncorrected",), a["ts_ns"], _time_order(ids, a["ts_ns"], rows))["ecc_uncorrected"]
    xid = group_max(ids, np.nan_to_num(a["xid"]), n)
    out: dict[int, dict[str, float]] = {}
    index: dict[int, int] = {}
    # Per entity one dict, from Python floats converted a column at a time (tolist: the same values).
    names = [*med, "throttle_share", "ecc_increase", "nvlink_mean_Bps", "xid"]
    columns = [v.astype(np.float64).tolist() for v in (*med.values(), thr_share, ecc, nv_mean, xid)]
    ranks, gpus = a["rank"][first].tolist(), a["gpu"][first].tolist()
    for rank, gpu_i, values in zip(ranks, gpus, zip(*columns)):
        m = dict(zip(names, values))
        if m["max_sm_clock_mhz"] > 0:
            m["clock_ratio"] = m["sm_clock_mhz"] / m["max_sm_clock_mhz"]
        out[rank] = m
        index[rank] = gpu_i
    return out, index


def summarise_nic(nic: Columns) -> dict[tuple[str, str], dict[str, float]]:
    """Per (node, port) levels; a device's port 2 and up is keyed ``"<nic>:<port>"``."""
    a = nic.arrays
    # A device's second (third...) port is a link of its own (dual-port HCAs: one rail per
    # port): its cumulative counters must not interleave with the first port's.
    port = a["port"] if "port" in a else np.full(len(nic), -1, dtype=np.int32)
    port_key = np.where(port > 1, port, -1)
    ids, n, first = dense_ids(a["node"], a["nic"], port_key)
    rows = _equal_groups(ids, n)
    med = _medians(ids, n, nic, ("tx_Bps", "rx_Bps", "link_gbps"), rows)
    tput = np.nan_to_num(a["tx_Bps"]) + np.nan_to_num(a["rx_Bps"])
    has_t = ~(np.isnan(a["tx_Bps"]) & np.isnan(a["rx_Bps"]))
    # Float sums in a fixed order (by port, then value), never in record order: the
    # same samples in another order must give the same bits (stable verdicts).
    # (``tput`` is 0 where both are NaN: its sums are those of the samples that have one.)
    cnt = np.bincount(ids, weights=has_t.astype(float), minlength=n)  # sums of ones: exact in any order
    total, total_sq = _sums_by_value(ids, n, tput, rows, 1, 2)
    mean = total / np.maximum(cnt, 1)
    sq = total_sq / np.maximum(cnt, 1)
    cv = np.sqrt(np.maximum(sq - mean ** 2, 0)) / np.maximum(mean, 1e-9)
    zero_share = np.bincount(ids, weights=(has_t & (tput <= 0)).astype(float), minlength=n) / np.maximum(cnt, 1)
    down = group_min(ids, np.where(np.isnan(a["link_up"]), 1.0, a["link_up"]), n)
    out: dict[tuple[str, str], dict[str, float]] = {}
    time_order = _time_order(ids, a["ts_ns"], rows)
    incs = _increases(ids, n, a, NIC_ERRORS + NIC_CONGESTION, a["ts_ns"], time_order)
    names = [*med, "throughput_Bps", "throughput_cv", "zero_share", "link_up_min", *(f"{k}_inc" for k in incs)]
    columns = [v.astype(np.float64).tolist() for v in (*med.values(), mean, cv, zero_share, down, *incs.values())]
    nic_names, node_names = nic.vocab["nic"], nic.vocab["node"]
    for nic_code, node_code, pk, values in zip(a["nic"][first].tolist(), a["node"][first].tolist(),
                                               port_key[first].tolist(), zip(*columns)):
        name = nic_names[nic_code]
        if pk > 1:
            name = f"{name}:{pk}"
        out[(node_names[node_code], name)] = dict(zip(names, values))
    return out


def summarise_host(host: Columns) -> dict[str, dict[str, float]]:
    a = host.arrays
    ids, n, first = dense_ids(a["node"])
    med = _medians(ids, n, host, ("cpu_util_pct", "load1", "iowait_pct", "mem_used_pct", "steal_pct"))
    return {
        host.vocab["node"][int(a["node"][first[i]])]: {k: float(v[i]) for k, v in med.items()}
        for i in range(n)
    }


def summarise(gpu: Columns | None, nic: Columns | None, host: Columns | None) -> CounterSummary:
    """Per-entity counter levels of a window (the summariser's part)."""
    s = CounterSummary()
    if gpu is not None and len(gpu):
        s.gpu, s.gpu_index = summarise_gpu(gpu)
    if nic is not None and len(nic):
        s.nic = summarise_nic(nic)
    if host is not None and len(host):
        s.host = summarise_host(host)
    return s


def nic_key(node: str, nic: str) -> str:
    return f"{node}/{nic}"


def from_digest(d: WindowDigest) -> CounterSummary:
    """The counters of a (merged) digest, keyed for attribution."""
    return CounterSummary(
        gpu=d.gpu, gpu_index=d.gpu_index,
        # `d` is Any while mypy cannot follow `eroica.*` (pyproject), so the ignore is unused there
        nic={tuple(k.rsplit("/", 1)): v for k, v in d.nic.items()},  # type: ignore[misc, unused-ignore]
        host=d.host,
    )
