"""The summariser's function and rank rows of a window (most of the summariser's cost).

Per (rank, function, step-edge) the durations, quantiles, critical-path time and
per-step costs of the finished executions; per (rank, step-edge) the step spans.
The groupings are found with as few passes as the rows allow
(``eroica bench throughput`` times them against decoding the same frames):

- every sort that must be stable is a plain (unstable, vectorised: numpy's
  SIMD quicksort) sort of int64 keys made unique by packing each record's
  index into their low bits (:func:`.grouping.stable_argsort`); numpy's stable sort of
  int64 is a timsort, several times slower on keys that are not nearly sorted;
- groupings whose order inside a group no result depends on (the durations
  of a row, the records of a (row, step)) are sorted by their key directly,
  not by a permutation from an earlier sort;
- the continuations are not joined to the window's records by
  :func:`eroica.models.columns.concat` (every column, every vocabulary) but
  block by block, for the eight columns the rows read, with the codes that
  ``concat`` would give them (:class:`_Records`);
- a record's edge step, row step and (rank, step) id are functions of its
  (rank, step): computed once per entry of a small table of them
  (:class:`_StepTable`), then looked up, not scattered per record;
- records that interleave the ranks are put in block order once, by one
  scatter per column (:meth:`_Records.blocks`), not gathered from the whole
  window block by block;
- with the compiled kernels (:mod:`.kernels`), what numpy does in several
  passes over a block (levels, axis and keys of the exclusive time; the
  table's keys and rows; every per-row sum) is one pass each, and the
  quantiles of a row are read from one vectorised sort of packed
  (row, value) keys, not from a sort per row.

Every sum is an exact integer sum or an ``np.bincount``, and every order
statistic is taken from the same sorted values, so nothing depends on the
order of the work or of the records. It replaced a simpler implementation
(``patterns.summarise_fn`` until 2026-11-27) bit for bit: 8,400 windows of
simulated, realistic and independent jobs, shuffled and split; the tests keep
a reference implementation to compare with (``test_patterns.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from eroica.models.columns import Columns
from eroica.models.digest import INTERIOR, FnRows, InFlightRows, RankRows

from .grouping import (dense_ids, dense_ids_of_slots, dense_ids_only, group_count, group_max, group_min,
                       group_quantiles, group_sorted, group_sum, sorted_quantiles, stable_argsort)
from .intervals import _AXIS_LIMIT, covered, exclusive_time, exclusive_time_on_axis, merge_sorted, on_axis
# By its installed name, whatever name this module was imported by: numba's cache records the module
# name of a kernel's globals and imports it by that name when it loads the kernel (in any process).
from eroica.streams.detection.kernels import SCATTER_DTYPES, Kernels, worth_it
from .patterns import HIGH_Q, HOST_LEVEL, LOW_Q, _LEVEL_OF_KIND_16, _host_levels, _in_flight_rows, _own_duration

# Records per block of ranks (whole ranks: a block may hold more).
_BLOCK_RECORDS = 1 << 16
_FN_COLUMNS = ("rank", "fn", "stack", "kind", "ts_ns", "dur_ns", "step", "node")
# The columns whose codes index a vocabulary (merged as ``concat`` merges them).
_CAT_COLUMNS = ("fn", "stack", "node")


def summarise_fn(fn: Columns, window_end_ns: int | None = None,
                 cont: Columns | None = None) -> tuple[FnRows, RankRows, InFlightRows]:
    """Per-rank patterns of the finished executions in a window (the summariser's work).

    ``cont``: the window's continuations (:func:`.windows.continuations`),
    spans of earlier windows that reach into this one. They enclose what
    they cover here like any span, and their exclusive time here is
    credited to their (rank, function, step) row, whose step is then an
    edge step; they add no call (count, durations and quantiles are the
    window's own records'), no step span, and no cost to kinds judged by
    their own duration (the whole duration went to the window they started in).

    Everything here is computed per rank, so the rows of a rank do not depend
    on which other ranks were summarised with it: partitions may split ranks
    any way and the merged digest is the same.

    Ranks are taken in blocks of about ``_BLOCK_RECORDS`` records, in rank
    order (the rows then come in the same order as from the whole window):
    every temporary is the size of a block, whose memory the next block
    reuses, where temporaries the size of the window each cost a page fault
    per 4 KiB (~3 us on a VM), and a block's sorts fit in cache. (Records
    that interleave the ranks are first put in block order: the eight
    columns read here, once each, :meth:`_Records.blocks`.)
    """
    inflight = _in_flight_rows(fn)
    done = ~fn.arrays["in_flight"]
    every = bool(done.all())
    if cont is None or not len(cont):
        if not done.any():
            return FnRows(), RankRows(), inflight
        cont = None
    recs = _Records(fn, None if every else done, cont)
    # Offsets from the window's first event: exclusive time only needs relative positions.
    base = recs.min_ts()
    # Spans are clipped to the window: what runs past its end belongs to the next one.
    clip = None if window_end_ns is None else max(int(window_end_ns) - base, 0)
    host_level = _host_levels(recs.column("stack"), recs.vocab.get("stack", []))
    ks = worth_it(recs.size())
    blocks = recs.blocks(_BLOCK_RECORDS, ks)
    parts = []
    for a, is_cont in blocks:
        part = _summarise_ranks(a, recs.vocab, base, clip, host_level, single=len(blocks) == 1, cont=is_cont, ks=ks)
        if part is None:  # spans that reach past their rank's share of the axis: the whole window at once
            a, is_cont = recs.block(slice(None))
            parts = [_summarise_ranks(a, recs.vocab, base, clip, host_level, single=True, cont=is_cont, ks=ks)]
            break
        parts.append(part)
    fns = FnRows(**{k: _joined([p[0][k] for p in parts if p is not None]) for k in FnRows.__struct_fields__})
    ranks = RankRows(**{k: _joined([p[1][k] for p in parts if p is not None]) for k in RankRows.__struct_fields__})
    return fns, ranks, inflight


class _Records:
    """The finished records of a window followed by its continuations, as ``concat([own, cont])`` has them,
    without building that concatenation: only the columns the rows read, a block at a time.

    ``concat`` copies every column of both (a window's worth of memory, most of
    it never read here) and re-codes every categorical column through the
    merged vocabulary. Here the merged vocabulary and each part's code table
    are built as ``concat`` builds them; codes are translated only where the
    table is not the identity (the window's own records, whose vocabulary the
    merged one starts with, never are unless it repeats a string).
    """

    def __init__(self, fn: Columns, done: np.ndarray | None, cont: Columns | None) -> None:
        own = {k: fn.arrays[k] if done is None else fn.arrays[k][done] for k in _FN_COLUMNS}  # no copy when all done
        self.n_own = own["rank"].size
        if cont is None:
            self.parts = [own]
            self.vocab = fn.vocab
            return
        later = {k: cont.arrays[k] for k in _FN_COLUMNS}
        if self.n_own == 0:  # concat drops an empty part: the continuations as they are
            self.parts = [later]
            self.vocab = cont.vocab
            return
        self.vocab = dict(fn.vocab)
        for name in _CAT_COLUMNS:
            own[name], later[name], self.vocab[name] = _merged_codes(own[name], fn.vocab[name], later[name],
                                                                     cont.vocab[name])
        # One dtype per column, as np.concatenate would promote both parts to.
        for k in _FN_COLUMNS:
            dt = np.result_type(own[k], later[k])
            own[k], later[k] = own[k].astype(dt, copy=False), later[k].astype(dt, copy=False)
        self.parts = [own, later]

    def column(self, name: str) -> np.ndarray:
        """One column of all the records (a copy only with continuations)."""
        out: np.ndarray = self.parts[0][name] if len(self.parts) == 1 else np.concatenate([p[name] for p in self.parts])
        return out

    def size(self) -> int:
        """How many records."""
        return sum(p["rank"].size for p in self.parts)

    def min_ts(self) -> int:
        return min(int(p["ts_ns"].min()) for p in self.parts if p["ts_ns"].size)

    def block(self, rows: slice) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        """The columns of the records ``rows`` of ``concat([own, cont])`` (views), and which of them are
        continuations (None: no continuations at all)."""
        if len(self.parts) == 1:
            p = self.parts[0]
            cols = {k: p[k][rows] for k in _FN_COLUMNS}
            return cols, (None if self.n_own else np.ones(cols["rank"].size, dtype=bool))
        own, later = self.parts
        n = self.n_own
        lo, hi, _ = rows.indices(n + later["rank"].size)
        mine, theirs = slice(min(lo, n), min(hi, n)), slice(max(lo - n, 0), max(hi - n, 0))
        cols = {}
        for k in _FN_COLUMNS:
            x, y = own[k][mine], later[k][theirs]
            cols[k] = x if not y.size else y if not x.size else np.concatenate((x, y))
        is_cont = np.zeros(cols["rank"].size, dtype=bool)
        is_cont[mine.stop - mine.start:] = True
        return cols, is_cont

    def blocks(self, target: int, ks: Kernels | None) -> list[tuple[dict[str, np.ndarray], np.ndarray | None]]:
        """The records of consecutive ranks, about ``target`` at a time (whole ranks: a block may hold more), in
        rank order, each block's records in their order here; with which of them are continuations (:meth:`block`).

        Records in rank order (frames rank by rank) are cut into slices, with
        no copy. Otherwise (a producer's records interleave the ranks, often
        one record per run) the eight columns are put in block order by one
        scatter each, the inverse of a stable counting sort by block
        (:func:`_block_positions`), and the blocks are slices of that: a block
        gathered from the whole window reads nearly every cache line of every
        column once per block, and listing a block's runs costs several passes
        over the runs, as many as the records when ranks interleave.
        """
        n = self.size()
        if n <= target:
            return [self.block(slice(None))]
        rank = self.column("rank")
        if len(self.parts) == 1 and bool((rank[1:] >= rank[:-1]).all()):  # rank by rank: cut where ranks change
            cuts = np.unique(np.searchsorted(rank, rank[target::target], side="left")).tolist()
            edges = [0, *(c for c in cuts if c > 0), n]
            return [self.block(slice(lo, hi)) for lo, hi in zip(edges[:-1], edges[1:])]
        placed = _block_positions(rank, target, ks)
        if placed is None:
            return [self.block(slice(None))]
        dest, bounds = placed
        cols: dict[str, np.ndarray] = {}
        for k in _FN_COLUMNS:
            out = cols[k] = np.empty(n, dtype=self.parts[0][k].dtype)  # both parts have one dtype (__init__)
            at = 0
            for p in self.parts:
                m = p[k].size
                if ks is not None and out.dtype in SCATTER_DTYPES and p[k].flags.c_contiguous:  # as compiled
                    ks.scatter(dest[at:at + m], p[k], out)
                else:
                    out[dest[at:at + m]] = p[k]
                at += m
        is_cont: np.ndarray | None = None
        if len(self.parts) == 2 or not self.n_own:
            is_cont = np.zeros(n, dtype=bool)
            is_cont[dest[self.n_own:]] = True
        return [({k: v[lo:hi] for k, v in cols.items()}, None if is_cont is None else is_cont[lo:hi])
                for lo, hi in zip(bounds[:-1], bounds[1:]) if hi > lo]


def _block_positions(rank: np.ndarray, target: int, ks: Kernels | None) -> tuple[np.ndarray, list[int]] | None:
    """Each record's position in block order, and the blocks' bounds there; None when all are one block.

    A rank's block is the number of whole ``target``s of records up to and
    including its own (ranks in order); blocks are in rank order, and each
    block's records in record order (the inverse permutation of a stable
    sort by block, ``np.argsort(block, kind="stable")``).
    """
    lo_rank = int(rank.min())
    if int(rank.max()) - lo_rank < 4 * rank.size:  # ranks dense enough for a table of them
        key = rank.astype(np.int64)
        key -= lo_rank
    else:
        key = dense_ids_only(rank)[0]
    counts = np.bincount(key)
    blk_of = np.cumsum(counts) // max(target, 1)
    blk_of -= blk_of[0]  # the lowest rank has records
    n_blk = int(blk_of[-1]) + 1
    if n_blk == 1:
        return None
    sizes = np.bincount(blk_of, weights=counts, minlength=n_blk).astype(np.int64)  # exact: below 2**53
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    if ks is not None:
        dest = np.empty(rank.size, dtype=np.int64)
        ks.block_dest(key, blk_of, bounds[:-1].copy(), dest)
    else:
        blk = (blk_of.astype(np.uint16) if n_blk <= 1 << 16 else blk_of)[key]
        order = np.argsort(blk, kind="stable")  # 16 bits: a radix sort
        dest = np.empty(rank.size, dtype=np.int64)
        dest[order] = np.arange(rank.size, dtype=np.int64)
    return dest, bounds.tolist()


def _merged_codes(own: np.ndarray, own_vocab: list[str], later: np.ndarray,
                  later_vocab: list[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Both parts' codes in ``concat``'s merged vocabulary, and that vocabulary.

    ``concat`` numbers the strings in order of first appearance, the first
    part's vocabulary first, and passes codes through unchanged for a part
    without a vocabulary (when any part has none).
    """
    table: dict[str, int] = {}
    out = []
    for codes, voc in ((own, own_vocab), (later, later_vocab)):
        remap = np.fromiter((table.setdefault(s, len(table)) for s in voc), dtype=np.int32, count=len(voc))
        if not len(remap) or bool((remap == np.arange(remap.size)).all()):
            out.append(codes)  # the identity (or no vocabulary): the codes as they are
        else:
            out.append(remap[codes])
    return out[0], out[1], list(table)


def _joined(columns: list[np.ndarray]) -> Any:
    """The blocks' values of one column as one column: an array of numbers, or a list of strings."""
    out = columns[0] if len(columns) == 1 else np.concatenate(columns)
    return out.tolist() if out.dtype == object else out


def _row_sorted(ids: np.ndarray, values: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`.grouping.group_sorted` (no grouping hint): values as float64 sorted by (group, value), each
    group's count and first position.

    Integer values are sorted as ``id << bits | (value - min)``: one sort of
    distinct-enough int64 keys (numpy's vectorised quicksort), then a mask,
    with no division to unpack them. The sorted integers, then converted, are
    the converted values sorted (the conversion is monotonic). Other values
    (floats, or keys too wide to pack) take ``group_sorted`` itself.
    """
    if values.size and values.dtype.kind == "i" and ids.dtype.kind in "iu" and int(ids.min()) >= 0:
        v_lo = int(values.min())
        bits = (int(values.max()) - v_lo).bit_length()
        if bits <= 62 and int(ids.max()) < 1 << (63 - bits):
            packed = ids.astype(np.int64)
            packed <<= bits
            shifted = values.astype(np.int64)
            if v_lo:
                shifted -= v_lo
            packed |= shifted
            del shifted
            packed.sort()
            packed &= (1 << bits) - 1
            if v_lo:
                packed += v_lo
            counts = np.bincount(ids, minlength=n)
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
            return packed.astype(np.float64), counts, starts
    return group_sorted(ids, values, n)


def _exclusive_time(s: np.ndarray, e: np.ndarray, level: np.ndarray, order: np.ndarray) -> np.ndarray:
    """:func:`.intervals.exclusive_time_on_axis`, the same integers, with each level's events found by one
    counting sort of the levels instead of one scan of every event per level.

    A stable sort of the levels (in ``order``: start order) leaves each
    level's events in start order, one slice each. The union of the levels
    before one is merged with an unstable sort: tied starts join one run
    whatever their order (every interval ends at or after its start), so the
    union is the same.
    """
    lvl_o = level[order]
    if lvl_o.dtype.itemsize > 2 or lvl_o.dtype.kind not in "iu" or (lvl_o.size and int(lvl_o.min()) < 0):
        return exclusive_time_on_axis(s, e, level, order)  # numpy sorts only 8 and 16-bit integers by counting
    counts = np.bincount(lvl_o)
    by_level = order[np.argsort(lvl_o, kind="stable")]
    return _exclusive_by_level(s[by_level], e, by_level, counts)


def _exclusive_time_packed(s: np.ndarray, e: np.ndarray, level: np.ndarray,
                           ks: Kernels | None = None) -> np.ndarray | None:
    """:func:`_exclusive_time` with ``order`` ``np.argsort(s, kind="stable")``, by one sort instead of three
    (None where the keys do not pack: then that is the way).

    The events in (level, start, index) order are what a stable sort by start
    and then a stable sort by level give; here they come from one sort of
    ``level | start | index`` packed into distinct int64 keys (numpy's
    vectorised unstable sort), and each level's starts from the sorted keys
    themselves, with no gather. With ``ks``, the levels are then taken in one pass over the sorted keys
    (:func:`.kernels._exclusive_source`).
    """
    n = s.size
    if n < 2 or level.dtype.kind not in "iu" or int(level.min()) < 0 or int(s.min()) < 0:
        return None
    i_bits = (n - 1).bit_length()
    s_bits = int(s.max()).bit_length()
    if int(level.max()).bit_length() + s_bits + i_bits > 63:
        return None
    packed = level.astype(np.int64)
    packed <<= s_bits
    packed |= s
    packed <<= i_bits
    packed |= np.arange(n, dtype=np.int64)
    packed.sort()
    if ks is not None:
        out = np.empty(n, dtype=np.int64)
        ks.exclusive(packed, e.astype(np.int64, copy=False), i_bits, s_bits, out)
        return out
    by_level = packed & ((1 << i_bits) - 1)
    packed >>= i_bits
    packed &= (1 << s_bits) - 1  # the starts, level by level in start order
    return _exclusive_by_level(packed, e, by_level, np.bincount(level))


def _exclusive_time_compiled(ks: Kernels, slot: np.ndarray, n_slots: int, start: np.ndarray, end: np.ndarray,
                             kinds: np.ndarray, stack: np.ndarray, host_level: np.ndarray | None,
                             span: int) -> np.ndarray | None:
    """:func:`_exclusive_time_packed` of the events on their axis (:func:`.intervals.on_axis`) at their levels
    (their kind's, or a host kind's stack's), with the levels, the axis and the packed keys made by one
    compiled pass (:func:`.kernels._axis_keys_source`); None where that does not apply (the axis or the keys
    do not fit, or columns and levels of other dtypes than it is compiled for): then the numpy way.

    The starts take as many bits as the largest start the axis can hold
    (its last slot's offset plus the latest start), and the levels as many
    as the largest in their tables: the keys sort in the same order as with
    the bits the values take, and the kernel reads them back with the same
    widths.
    """
    n = slot.size
    hosts = _NO_LEVELS if host_level is None else host_level
    if (n < 2 or kinds.dtype != np.int8 or stack.dtype != np.int32 or hosts.dtype != np.int16
            or int(start.min()) < 0):
        return None
    if n_slots > max(1, _AXIS_LIMIT // max(int(span), 1)):  # on_axis's limit
        return None
    i_bits = (n - 1).bit_length()
    s_bits = ((n_slots - 1) * int(span) + int(start.max())).bit_length()
    top = max(int(_LEVEL_OF_KIND_16.max()), int(hosts.max(initial=0)))
    if top.bit_length() + s_bits + i_bits > 63:
        return None
    packed = np.empty(n, dtype=np.int64)
    e = np.empty(n, dtype=np.int64)
    if not ks.axis_keys(slot.astype(np.int64, copy=False), start.astype(np.int64, copy=False),
                        end.astype(np.int64, copy=False), kinds, stack, _LEVEL_OF_KIND_16, hosts, HOST_LEVEL,
                        int(span), s_bits, i_bits, packed, e):
        return None
    packed.sort()
    out = np.empty(n, dtype=np.int64)
    ks.exclusive(packed, e, i_bits, s_bits, out)
    return out


_NO_LEVELS = np.zeros(0, dtype=np.int16)


def _exclusive_by_level(starts: np.ndarray, e: np.ndarray, by_level: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The loop of :func:`.intervals.exclusive_time_on_axis` over levels, given the events ``by_level`` (by
    level, then start, then index), their ``starts`` in that order, and the events per level value."""
    out = np.empty(e.size, dtype=np.int64)
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    levels = np.flatnonzero(counts).tolist()
    hs = he = np.empty(0, dtype=np.int64)
    for k, lvl in enumerate(levels):
        idx = by_level[bounds[lvl]:bounds[lvl + 1]]
        a, b = starts[bounds[lvl]:bounds[lvl + 1]], e[idx]
        r = b - a
        if hs.size:
            r -= covered(hs, he, a, b)
        out[idx] = r
        if k + 1 < len(levels):
            ls, le = merge_sorted(a, b)
            if hs.size:
                both = np.concatenate((hs, ls))
                o = np.argsort(both)
                hs, he = merge_sorted(both[o], np.concatenate((he, le))[o])
            else:
                hs, he = ls, le
    return out


def _summarise_ranks(a: dict[str, np.ndarray], vocab: dict[str, list[str]], base: int, clip: int | None,
                     host_level: np.ndarray | None, single: bool,
                     cont: np.ndarray | None = None,
                     ks: Kernels | None = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None:
    """The rows of the finished records ``a`` of some whole ranks, as the columns
    of :class:`FnRows` and :class:`RankRows`; ``cont`` marks the continuations among them (None: none);
    ``ks``: the compiled kernels, if any.

    None (unless ``single``, the whole window) when a span starts past the
    last clipped end (see there).
    """
    slot, n_r = dense_ids_only(a["rank"])  # np.unique(rank, return_inverse=True)'s inverse, without a sort
    fid, _ = dense_ids_only(a["fn"], a["stack"])
    kinds = a["kind"]
    dur = a["dur_ns"]
    start = a["ts_ns"] - base
    end = start + dur
    if clip is not None:
        np.minimum(end, clip, out=end)
    span = int(end.max()) + 1
    if not single and int(start.max()) >= span:
        return None
    np.maximum(end, start, out=end)
    excl = None if ks is None else _exclusive_time_compiled(ks, slot, n_r, start, end, kinds, a["stack"],
                                                            host_level, span)
    if excl is None:
        level = _LEVEL_OF_KIND_16[kinds]
        if host_level is not None:
            level = np.where(level == HOST_LEVEL, host_level[a["stack"]], level)
        axis = on_axis(slot, start, end, span)
        packed = None if axis is None else _exclusive_time_packed(axis[0], axis[1], level, ks)
        if packed is not None:
            excl = packed
        elif axis is None:
            excl = exclusive_time(slot, start, end, level, span)
        else:
            excl = _exclusive_time(axis[0], axis[1], level, stable_argsort(axis[0]))  # (rank, start) order
        del axis, packed, level
    del end

    # Whole steps: a rank's first and last step in the window are edge rows, the steps between interior.
    steps_ = a["step"].astype(np.int64, copy=False)
    own = None if cont is None else ~cont  # the window's own records (calls, step spans)
    table = _StepTable.of(slot, n_r, steps_, own, ks)
    if table is not None:
        part, cell, n_cells = table.part_and_cells(fid)
    else:
        part = _parts(slot, n_r, steps_, own)
        cell, n_cells = dense_ids_only(slot, fid, part)
    stats = None if ks is None else _row_stats(ks, cell, n_cells, steps_, dur, excl, kinds, own)
    if stats is not None:
        count, total, excl_sum, q, per_step, low, high, fn_steps, rows = stats
    else:
        total = group_sum(cell, dur if own is None else np.where(own, dur, 0), n_cells)
        excl_sum = group_sum(cell, excl, n_cells)
        g = _RowSteps(cell, n_cells, steps_, ks)
        count, q = _duration_quantiles(cell, n_cells, dur, own)
        every_count = count if own is None else np.bincount(cell, minlength=n_cells)
        starts = np.concatenate(([0], np.cumsum(every_count)[:-1]))  # each row's first position in g.perm

        # Per-step cost, then its median and low quantile over the row's steps.
        own_dur = _own_duration(kinds)
        cost = np.where(own_dur, dur, excl)
        if cont is not None:
            cost[cont & own_dur] = 0
        del own_dur
        step_cost = g.sums(cost)
        del cost
        sv, count_s, starts_s = _row_sorted(g.step_cell, step_cost, n_cells)
        per_step, low, high = sorted_quantiles(sv, count_s, starts_s, (0.5, LOW_Q, HIGH_Q))
        fn_steps = count_s.astype(np.int64, copy=False)
        rows = np.minimum.reduceat(g.perm, starts)  # each row's first record (dense_ids' representative)
        del g, sv

    fn_vocab, stack_vocab = np.asarray(vocab["fn"], dtype=object), np.asarray(vocab["stack"], dtype=object)
    fn_cols = {
        "rank": a["rank"][rows], "fn": fn_vocab[a["fn"][rows]],
        "stack": stack_vocab[a["stack"][rows]] if len(stack_vocab) else np.full(rows.size, "", dtype=object),
        "kind": kinds[rows], "count": count, "total_ns": total, "excl_ns": excl_sum, "median_ns": q[0],
        "p90_ns": q[1], "p99_ns": q[2], "per_step_ns": per_step, "step": part[rows], "steps": fn_steps, "low_ns": low,
        "high_ns": high,
    }
    if own is not None:  # step spans are the own records' (a continuation's end is its record's, seen before)
        if not own.any():
            return fn_cols, {k: np.zeros(0, dtype=np.int64) for k in ("rank", "steps", "step", "start_ns", "end_ns")} | {
                "node": np.zeros(0, dtype=object), "step_time_ns": np.zeros(0)}
    # Step span per rank and step: first start to last end of the step's records.
    if table is not None and ks is not None:  # the compiled pass skips continuations itself: no copies of the own
        ids, n_ids = table.own_steps(own, every=True)
        rs_first, lo, hi = _step_spans(slot, steps_, start, dur, (ids, n_ids), ks)
    else:
        if own is not None:
            slot, steps_, start, dur, part = slot[own], steps_[own], start[own], dur[own], part[own]
            a = {"rank": a["rank"][own], "node": a["node"][own]}
        rs_first, lo, hi = _step_spans(slot, steps_, start, dur, None if table is None else table.own_steps(own), ks)
    rp_ids, n_rp, rp_first = dense_ids(slot[rs_first], part[rs_first])
    step_time = group_quantiles(rp_ids, (hi - lo).astype(np.float64), n_rp, (0.5,))[0]
    rank_steps = group_count(rp_ids, n_rp)
    rp_lo = group_min(rp_ids, lo.astype(np.float64), n_rp)
    rp_hi = group_max(rp_ids, hi.astype(np.float64), n_rp)
    rp_rows = rs_first[rp_first]

    node_vocab = np.asarray(vocab["node"], dtype=object)
    rank_cols = {"rank": a["rank"][rp_rows], "node": node_vocab[a["node"][rp_rows]], "steps": rank_steps,
                 "step_time_ns": step_time, "step": part[rp_rows], "start_ns": rp_lo.astype(np.int64) + base,
                 "end_ns": rp_hi.astype(np.int64) + base}
    return fn_cols, rank_cols


def _row_stats(ks: Kernels, cell: np.ndarray, n_cells: int, steps: np.ndarray, dur: np.ndarray, excl: np.ndarray,
               kinds: np.ndarray, own: np.ndarray | None) -> tuple[np.ndarray, ...] | None:
    """The rows' count, duration sum, exclusive sum, duration quantiles, per-step cost quantiles, steps and first
    record, as the numpy path of :func:`_summarise_ranks` takes them: the sums by one pass of the compiled
    :func:`.kernels._row_sums_source` over the records in (row, step) order (one vectorised sort of packed
    (row, step, index) keys, or where they do not pack the counting sort of :func:`.kernels._rows_source`),
    which also packs each own record's (row, duration) key; the quantiles from one sort of packed (row, value)
    keys each, as the numpy path takes them (:func:`_row_sorted`). None where a sum could reach 2**53 (that
    path then sums floats in record order) or durations are not integers."""
    n = cell.size
    if dur.dtype.kind != "i" or excl.dtype.kind != "i" or not n:
        return None
    d_lo, d_hi = int(dur.min()), int(dur.max())
    bound = max(abs(d_hi), abs(d_lo), abs(int(excl.max())), abs(int(excl.min())))
    if bound * n >= 2**53:
        return None
    perm = np.empty(n, dtype=np.int64)
    bounds = np.empty(n_cells + 1, dtype=np.int64)
    step_start = np.empty(n, dtype=np.int64)
    dur = dur.astype(np.int64, copy=False)
    cell, steps = cell.astype(np.int64, copy=False), steps.astype(np.int64, copy=False)
    s_lo = int(steps.min())
    s_bits, i_bits = (int(steps.max()) - s_lo).bit_length(), (n - 1).bit_length()
    if (n_cells - 1).bit_length() + s_bits + i_bits <= _KEY_BITS:  # (row, step, index) keys: one vectorised sort
        keys = np.empty(n, dtype=np.int64)
        ks.row_keys(cell, steps, s_lo, s_bits, i_bits, keys)
        keys.sort()
        m = ks.sorted_rows(keys, i_bits, s_bits, perm, bounds, step_start)
        del keys
    else:
        m = ks.rows(cell, n_cells, steps, perm, bounds, step_start)
    d_bits = (d_hi - d_lo).bit_length()
    if (n_cells - 1).bit_length() + d_bits > _KEY_BITS:
        d_bits = -1  # (row, duration) keys that do not pack: the numpy path's sort
    count, fn_steps, first = (np.empty(n_cells, dtype=np.int64) for _ in range(3))
    total, excl_sum = np.empty(n_cells), np.empty(n_cells)
    step_sum = np.empty(m, dtype=np.int64)
    d_keys = np.empty((n if own is None else int(np.count_nonzero(own))) if d_bits >= 0 else 0, dtype=np.int64)
    ks.row_sums(perm, bounds, step_start, m, dur, excl.astype(np.int64, copy=False), _own_duration(kinds),
                _NO_RECORDS if own is None else own, own is None, d_bits, d_lo, count, total, excl_sum, step_sum,
                fn_steps, first, d_keys)
    if d_bits >= 0:
        d_keys.sort()
        q = np.empty((3, n_cells))
        ks.row_ranks(d_keys, count, _FN_QS, d_bits, d_lo, 0.0, q)  # 0.0: a row of continuations only
    else:
        count, q = _duration_quantiles(cell, n_cells, dur, own)
    per_step, low, high = _step_quantiles(ks, step_sum, fn_steps, n_cells)
    return count, total, excl_sum, q, per_step, low, high, fn_steps, first


# Bits a packed (row, value) key may use: below int64's sign bit, with one to spare.
_KEY_BITS = 62


def _step_quantiles(ks: Kernels, step_sum: np.ndarray, fn_steps: np.ndarray,
                    n_cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each row's median, low and high quantile of its steps' costs (``step_sum``: per (row, step), row by row) from
    one sort of packed (row, cost) keys; by :func:`_row_sorted` where they do not pack."""
    lo = int(step_sum.min())
    bits = (int(step_sum.max()) - lo).bit_length()
    if (n_cells - 1).bit_length() + bits > _KEY_BITS:
        sv, count_s, starts_s = _row_sorted(np.repeat(np.arange(n_cells, dtype=np.int64), fn_steps), step_sum, n_cells)
        per_step, low, high = sorted_quantiles(sv, count_s, starts_s, (0.5, LOW_Q, HIGH_Q))
        return per_step, low, high
    keys = np.empty(step_sum.size, dtype=np.int64)
    ks.pack_rows(step_sum, fn_steps, lo, bits, keys)
    keys.sort()
    out = np.empty((3, n_cells))
    ks.row_ranks(keys, fn_steps, _STEP_QS, bits, lo, np.nan, out)
    return out[0], out[1], out[2]


# The quantiles of a row's durations and of its steps' costs (what the digest's rows hold).
_FN_QS = np.array([0.5, 0.9, 0.99])
_STEP_QS = np.array([0.5, LOW_Q, HIGH_Q])


def _duration_quantiles(cell: np.ndarray, n_cells: int, dur: np.ndarray,
                        own: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each row's call count and duration quantiles (0.5, 0.9, 0.99) over its own records (0.0 for a row of
    continuations only), by one sort of (row, duration): no result depends on the order within a row."""
    if own is None:
        sv, count, starts = _row_sorted(cell, dur, n_cells)
        return count, sorted_quantiles(sv, count, starts, (0.5, 0.9, 0.99))
    sv, count, _ = _row_sorted(cell[own], dur[own], n_cells)
    q = sorted_quantiles(sv, count, np.concatenate(([0], np.cumsum(count)[:-1])), (0.5, 0.9, 0.99))
    q[:, count == 0] = 0.0  # a row of continuations only: no call of its own here
    return count, q


_NO_RECORDS = np.zeros(0, dtype=bool)


def _parts(slot: np.ndarray, n_r: int, steps: np.ndarray, own: np.ndarray | None) -> np.ndarray:
    """Each record's row step: its step where that is an edge step of its rank, else ``INTERIOR``.

    A rank's edge steps are its first and last step among its own records;
    a continuation's step began in an earlier window, so it is an edge step
    too (as are those of ranks with no own record).
    """
    lo_step = np.full(n_r, np.iinfo(np.int64).max)
    hi_step = np.full(n_r, np.iinfo(np.int64).min)
    if own is None:
        np.minimum.at(lo_step, slot, steps)
        np.maximum.at(hi_step, slot, steps)
        edge = steps == lo_step[slot]
        edge |= steps == hi_step[slot]
    else:
        np.minimum.at(lo_step, slot[own], steps[own])
        np.maximum.at(hi_step, slot[own], steps[own])
        edge = (steps <= lo_step[slot]) | (steps >= hi_step[slot])
    out: np.ndarray = np.where(edge, steps, INTERIOR)
    return out


class _StepTable:
    """A block's records placed in a table of every (rank, step) of its ranks' step range.

    Edges, row steps and row ids are functions of a record's (rank, step):
    computed once per table entry (a few thousand: tens of ranks by tens of
    steps), and each record then takes its entry's by one lookup, instead
    of per-record scatters (``np.minimum.at``) and comparisons. Only where
    the table is small (:meth:`of`); :func:`_parts` otherwise. With the
    compiled kernels (``ks``), the per-record passes are two
    (:func:`.kernels._step_keys_source`, :func:`.kernels._cells_source`).
    """

    def __init__(self, slot: np.ndarray, n_r: int, steps: np.ndarray, s_lo: int, width: int,
                 own: np.ndarray | None, ks: Kernels | None = None) -> None:
        self.n_r, self.width, self.slot, self.own, self.ks = n_r, width, slot, own, ks
        self.present = np.zeros(n_r * width, dtype=bool)  # some record, own or continuation
        self.present_own = self.present if own is None else np.zeros(n_r * width, dtype=bool)
        self._own_ids: tuple[np.ndarray, int] | None = None
        if ks is not None:
            self.key = np.empty(slot.size, dtype=np.int64)
            ks.step_keys(slot, steps, s_lo, width, _NO_RECORDS if own is None else own, own is None, self.key,
                         self.present, self.present_own)
        else:
            key = slot.astype(np.int64)
            key *= width
            key += steps
            key -= s_lo
            self.key = key
            self.present[key] = True
            if own is not None:
                self.present_own[key[own]] = True
        seen = self.present_own.reshape(n_r, width)
        has = seen.any(axis=1)
        step_of = np.arange(width, dtype=np.int64) + s_lo
        lo_step = np.where(has, seen.argmax(axis=1) + s_lo, np.iinfo(np.int64).max)[:, None]
        hi_step = np.where(has, s_lo + width - 1 - seen[:, ::-1].argmax(axis=1), np.iinfo(np.int64).min)[:, None]
        if own is None:
            edge = (step_of == lo_step) | (step_of == hi_step)
        else:
            edge = (step_of <= lo_step) | (step_of >= hi_step)
        self.part_of = np.where(edge, step_of, INTERIOR).ravel()

    @classmethod
    def of(cls, slot: np.ndarray, n_r: int, steps: np.ndarray, own: np.ndarray | None,
           ks: Kernels | None = None) -> _StepTable | None:
        """The table of a block, or None when its step range is too wide for one (about a slot per record)."""
        s_lo = int(steps.min())
        width = int(steps.max()) - s_lo + 1
        if n_r * width > max(slot.size, 1 << 12):
            return None
        compiled = ks is not None and slot.dtype == np.int64 and steps.dtype == np.int64  # as compiled
        return cls(slot, n_r, steps, s_lo, width, own, ks if compiled else None)

    def part_and_cells(self, fid: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """:func:`_parts` (the row step of each record) and ``dense_ids_only(slot, fid, part)``: the same ids,
        in the same (rank, function, row step) order, and how many.

        The row steps of the table are numbered in their order (a handful of
        distinct values: ``INTERIOR`` and the edge steps), so that the three
        keys pack into a table of every combination small enough to count.
        """
        values = np.unique(self.part_of[self.present])
        code_of = np.searchsorted(values, self.part_of)
        n_f = int(fid.max()) + 1
        if self.ks is not None and fid.dtype == np.int64:
            n = self.key.size
            part, cell, own_ids = (np.empty(n, dtype=np.int64) for _ in range(3))
            own_code = np.cumsum(self.present_own)
            own_code -= 1
            top = self.ks.cells(self.slot, fid, self.key, self.part_of, code_of, own_code,
                                _NO_RECORDS if self.own is None else self.own, self.own is None, n_f,
                                values.size, part, cell, own_ids)
            n_cells = self.ks.slot_ids(cell, top, cell)  # the row keys as dense ids, in place
            self._own_ids = own_ids, int(own_code[-1]) + 1
            return part, cell, n_cells
        part = self.part_of[self.key]
        packed = self.slot.astype(np.int64)
        packed *= n_f
        packed += fid
        packed *= values.size
        packed += code_of[self.key]
        cell, n_cells = dense_ids_of_slots(packed, self.n_r * n_f * values.size)
        return part, cell, n_cells

    def own_steps(self, own: np.ndarray | None, every: bool = False) -> tuple[np.ndarray, int]:
        """The own records' ``dense_ids(slot, step)`` ids (in key order) and their count; ``every``: an id for
        every record, -1 for a continuation (made by :meth:`part_and_cells` with the kernels)."""
        if every and self._own_ids is not None:
            return self._own_ids
        code = np.cumsum(self.present_own)
        n = int(code[-1])
        code -= 1
        ids: np.ndarray = code[self.key if own is None or every else self.key[own]]
        if own is not None and every:
            ids[~own] = -1
        return ids, n


def _step_spans(slot: np.ndarray, steps: np.ndarray, start: np.ndarray, dur: np.ndarray,
                dense: tuple[np.ndarray, int] | None,
                ks: Kernels | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per (rank, step), in key order: its first record (``dense_ids(slot, steps)``'s representative), and
    the first start and last end (``start + dur``) of its records. ``dense``: those ids and their count
    when known (:meth:`_StepTable.own_steps`); with ``ks``, all three in one pass, which leaves out the records
    of id -1."""
    if dense is None:
        ids, n, first = dense_ids(slot, steps)
    else:
        ids, n = dense
        if ks is not None:
            first = np.full(n, ids.size, dtype=np.int64)
            lo = np.full(n, np.iinfo(np.int64).max)
            hi = np.full(n, np.iinfo(np.int64).min)
            ks.spans(ids.astype(np.int64, copy=False), start.astype(np.int64, copy=False),
                     dur.astype(np.int64, copy=False), first, lo, hi)
            return first, lo, hi
        first = np.full(n, ids.size, dtype=np.intp)
        np.minimum.at(first, ids, np.arange(ids.size, dtype=np.intp))
    lo = np.full(n, np.iinfo(np.int64).max)
    hi = np.full(n, np.iinfo(np.int64).min)
    np.minimum.at(lo, ids, start)
    np.maximum.at(hi, ids, start + dur)
    return first, lo, hi


class _RowSteps:
    """The records grouped by (row, step), by one sort of the (row, step) key alone.

    ``perm`` puts records in (row, step) order: a row's records are one run,
    and so are those of each (row, step); within a (row, step) they are in
    record order. :meth:`sums` gives the sums of record order all the same.
    """

    def __init__(self, cell: np.ndarray, n_cells: int, steps: np.ndarray, ks: Kernels | None = None) -> None:
        n = cell.size
        if ks is not None:  # by a counting sort of the rows (:func:`.kernels._rows_source`)
            self.perm = np.empty(n, dtype=np.int64)
            bounds = np.empty(n_cells + 1, dtype=np.int64)  # each row's first position in ``perm``
            step_start = np.empty(n, dtype=np.int64)
            m = ks.rows(cell.astype(np.int64, copy=False), n_cells, steps.astype(np.int64, copy=False), self.perm,
                        bounds, step_start)
            self.step_start = step_start[:m]
            self.step_cell = cell[self.perm[self.step_start]]
            self._new: np.ndarray | None = None  # made when needed (:meth:`sums`)
            return
        s_lo = int(steps.min())
        width = int(steps.max()) - s_lo + 1
        if n_cells * width < 2**62:
            key = cell.astype(np.int64)
            key *= width
            key += steps
            key -= s_lo
        else:  # step numbers too far apart to pack: (row, step) ids in key order
            key, _, _ = dense_ids(cell, steps)
        self.perm = stable_argsort(key)
        key = key[self.perm]
        new = np.empty(n, dtype=bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        self._new = new
        self.step_start = np.flatnonzero(new)                              # first position of each (row, step)
        self.step_cell = cell[self.perm[self.step_start]]                   # the row of each (row, step)

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per (row, step), the float sum of its records' integer ``values`` (``np.bincount``'s), or the
        same sums as integers where those are exactly the floats.

        While no sum can reach 2**53 every partial sum is an exact integer, in
        any order: the sums are taken in integers over the runs (``reduceat``),
        and left integers (sorting them sorts their floats: the conversion is
        monotonic). Otherwise they are taken in record order, as
        ``np.bincount`` over the records would.
        """
        bound = max(abs(int(values.max())), abs(int(values.min())))
        if bound * values.size < 2**53:
            out: np.ndarray = np.add.reduceat(values[self.perm], self.step_start)
            return out
        new = self._new
        if new is None:
            new = np.zeros(self.perm.size, dtype=bool)
            new[self.step_start] = True
        ids = np.empty(self.perm.size, dtype=np.int64)
        ids[self.perm] = np.cumsum(new) - 1
        return np.bincount(ids, weights=values.astype(np.float64), minlength=self.step_start.size)
