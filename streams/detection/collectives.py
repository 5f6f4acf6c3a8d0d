"""Collectives: separate waiting (a symptom) from transfer (the link's work).

Every member of a collective leaves when the last one has arrived and the data
has moved, so for one collective *instance* the shortest member duration is
(about) the pure transfer time, and each member's excess over it is time spent
waiting for the others. The rank that waits least is the one the others waited
for; a group whose transfer is slow compared with groups of the same shape
points at its link.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eroica.models.columns import OP_CODE, Columns
from eroica.models.records import COLLECTIVE_OPS
from eroica.models.digest import CollRows, WindowDigest

from .grouping import (dense_ids, dense_ids_by_sort, group_count, group_max, group_median, group_min, group_quantiles,
                       group_sum, stable_argsort)
# By its installed name, as fn_rows imports it (numba's cache records it).
from eroica.streams.detection.kernels import loaded
from .patterns import K_COLL, JobArrays

_P2P_OPS = np.array([OP_CODE["send"], OP_CODE["recv"]], dtype=np.int8)


@dataclass
class GroupStats:
    """One communicator over the window."""

    name: str
    ranks: np.ndarray        # member ranks
    intra_node: bool         # every member on one node (NVLink / PCIe path)
    transfer_per_step: float  # median over steps of summed transfer time (ns)
    bytes_per_step: float     # median over steps of summed bytes (NaN if unknown)
    instances: int           # steps in which the group was seen
    p2p: bool = False         # send / recv pairs: durations include waiting for the peer stage
    op: int = -1              # the op code its calls carry (groups compare only with the same op)

    @property
    def bandwidth(self) -> float:
        """Effective bytes per second of transfer (NaN without byte counts)."""
        if not np.isfinite(self.bytes_per_step) or self.transfer_per_step <= 0:
            return float("nan")
        return self.bytes_per_step / (self.transfer_per_step / 1e9)


@dataclass
class CollectiveStats:
    ranks: np.ndarray              # (R,) aligned with Patterns.ranks
    wait_per_step: np.ndarray      # (R,) median over steps of time spent waiting in collectives
    transfer_per_step: np.ndarray  # (R,) median over steps of transfer time (ns)
    groups: list[GroupStats]
    # (R,) mean over steps of time spent waiting: what an intermittent straggler (a loader
    # that runs dry in one step of four) costs the others, which the median does not show
    wait_mean_per_step: np.ndarray | None = None
    # (R,) as wait_per_step, in the collectives every member joins at once only (no send / recv): a
    # pipeline's point-to-point waits depend on the rank's place in the pipeline by design
    sync_wait_per_step: np.ndarray | None = None

    @property
    def mean_waits(self) -> np.ndarray:
        return self.wait_per_step if self.wait_mean_per_step is None else self.wait_mean_per_step

    @property
    def sync_waits(self) -> np.ndarray:
        return self.wait_per_step if self.sync_wait_per_step is None else self.sync_wait_per_step


def summarise_collectives(fn: Columns) -> CollRows:
    """Per (rank, communicator, step): summed duration, bytes and calls (the summariser's part)."""
    a = fn.arrays
    # One index of the selected rows, taken by every column (a boolean mask would be scanned once per column).
    sel = np.flatnonzero((a["kind"] == K_COLL) & ~a["in_flight"])
    if not sel.size:
        return CollRows()
    rank, step, grp = a["rank"][sel], a["step"][sel], a["group"][sel]
    op = a["op"][sel]
    grouped = _grouped(rank, grp, step, a["bytes"][sel], a["dur_ns"][sel], op)
    if grouped is not None:
        ids, n, first, b, dur, calls, p2p, op_max = grouped
    else:
        ids, n, first = dense_ids_by_sort(rank, grp, step)  # (rank, communicator, step): too many to count by table
        nbytes = a["bytes"][sel].astype(np.float64)
        known = nbytes >= 0
        b = group_sum(ids, np.where(known, nbytes, 0.0), n)
        b[group_count(ids[known], n) == 0] = np.nan
        dur = group_sum(ids, a["dur_ns"][sel], n).astype(np.int64)
        calls = group_count(ids, n)
        # Per group: any send / recv call, and the largest op code (every group has a call: no empty group to fill).
        p2p = np.bincount(ids, weights=(op == _P2P_OPS[0]) | (op == _P2P_OPS[1]), minlength=n) > 0
        op_max = np.full(n, np.iinfo(np.int64).min)
        np.maximum.at(op_max, ids, op.astype(np.int64))
    vocab = np.asarray(fn.vocab["group"], dtype=object)
    names = vocab[grp[first]]
    # A collector that reports no communicator id: calls of the same op in the same
    # step are taken as one job-wide communicator, enough to tell who waited least.
    unnamed = names == ""
    if unnamed.any():
        # Named after the op of the step's earliest call (ties: the lower op code), not
        # of whichever record came first: every rank names it alike in any record order.
        order = np.lexsort((op, a["ts_ns"][sel], ids))
        op_first = op[order[np.r_[True, ids[order][1:] != ids[order][:-1]]]]
        names[unnamed] = np.array([f"*{COLLECTIVE_OPS[o] if o >= 0 else 'collective'}" for o in op_first[unnamed]],
                                  dtype=object)
    return CollRows(
        rank=rank[first], group=names.tolist(), step=step[first],
        dur_ns=dur, bytes=b, calls=calls, p2p=p2p, op=op_max,
    )


def _grouped(rank: np.ndarray, grp: np.ndarray, step: np.ndarray, nbytes: np.ndarray, dur: np.ndarray,
             op: np.ndarray) -> tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray] | None:
    """The (rank, communicator, step) groups of the calls and their figures as :func:`summarise_collectives`'s
    numpy path has them (ids, count, first calls, byte sums, duration sums, calls, p2p, largest op), by
    the compiled :func:`.kernels._coll_groups_source`; None without the kernels, where the ranks are too
    sparse for a counting sort of them or the keys too wide to pack, or where a sum could reach 2**53 (then
    float sums in record order decide)."""
    ks = loaded()
    n = rank.size
    if ks is None or n < 2 or any(k.dtype.kind not in "iu" or (k.dtype.kind == "u" and k.dtype.itemsize >= 8)
                                  for k in (rank, grp, step, nbytes, dur, op)):
        return None
    lows = [int(k.min()) for k in (rank, grp, step)]
    w_rank, w_grp, w_step = (int(k.max()) - lo + 1 for k, lo in zip((rank, grp, step), lows))
    bound = max(abs(int(nbytes.max())), abs(int(nbytes.min())), abs(int(dur.max())), abs(int(dur.min())))
    # The counting sort's table spans the rank range: past 4 slots a call it costs more memory and
    # time than it saves (speed only: the numpy path gives the same rows). Keys must pack in 62 bits,
    # and the sums stay exact in float64 below 2**53.
    if w_rank > 4 * n or w_grp * w_step >= 1 << 62 or bound * n >= 2**53:
        return None
    minor = grp.astype(np.int64)
    minor -= lows[1]
    minor *= w_step
    minor += step
    minor -= lows[2]
    r = rank.astype(np.int64)
    r -= lows[0]
    # (rank, minor, index) order: stable by minor (a radix sort of 16 bits), then the kernel's counting sort of ranks
    by_minor = np.argsort(minor.astype(np.uint16), kind="stable") if w_grp * w_step <= 1 << 16 else stable_argsort(minor)
    perm, step_start = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    g = ks.rows(r[by_minor], w_rank, minor[by_minor], perm, np.empty(w_rank + 1, dtype=np.int64), step_start)
    ids = np.empty(n, dtype=np.int64)
    first, b_sum, known, dur_sum, calls, op_max = (np.empty(g, dtype=np.int64) for _ in range(6))
    p2p = np.empty(g, dtype=np.bool_)
    ks.coll_groups(by_minor[perm], step_start, g, nbytes.astype(np.int64, copy=False),
                   dur.astype(np.int64, copy=False), op.astype(np.int64), int(_P2P_OPS[0]), int(_P2P_OPS[1]),
                   ids, first, b_sum, known, dur_sum, calls, p2p, op_max)
    b = b_sum.astype(np.float64)
    b[known == 0] = np.nan
    return ids, g, first, b, dur_sum, calls, p2p, op_max


def collective_stats(d: WindowDigest, ranks: np.ndarray, rank_node: dict[int, str],
                     arrays: JobArrays | None = None) -> CollectiveStats:
    """Waiting per rank and transfer per communicator, from the digest rows.

    Per (communicator, step) the member with the least collective time is the
    one the others waited for: its time is (about) the transfer, and every
    member's excess over it is waiting. ``arrays``: ``d``'s columns, when the caller shares them.
    """
    c = d.colls
    n_r = ranks.size
    if not len(c):
        return CollectiveStats(ranks, np.zeros(n_r), np.zeros(n_r), [])
    cc = JobArrays.of(d, arrays).colls
    rank = cc.col("rank", np.int64)
    step = cc.col("step", np.int64)
    dur = cc.col("dur_ns", np.float64)
    nbytes = cc.col("bytes", np.float64)
    grp, names = cc.first_seen("group")  # communicators in order of first appearance
    named = np.array([bool(g) for g in names], dtype=bool)[grp]
    p2p = cc.col("p2p", bool) if len(c.p2p) == len(c.rank) else np.zeros(len(c.rank), dtype=bool)
    ops = cc.col("op", np.int64) if len(c.op) == len(c.rank) else np.full(len(c.rank), -1)

    gs, n_gs, gs_first = dense_ids(grp, step)
    members = group_count(gs, n_gs)
    transfer = group_min(gs, dur, n_gs)
    matched = named & (members[gs] > 1)  # a call nobody else joined tells nothing about waiting
    wait = np.where(matched, dur - transfer[gs], 0.0)
    xfer = np.where(matched, transfer[gs], dur)

    slot = np.searchsorted(ranks, rank)
    ok = (slot < n_r) & (ranks[np.minimum(slot, n_r - 1)] == rank)
    rs, n_rs, rs_first = dense_ids(slot[ok], step[ok])
    rs_slot = slot[ok][rs_first]
    wait_rs = group_sum(rs, wait[ok], n_rs)
    wait_ps = group_quantiles(rs_slot, wait_rs, n_r, (0.5,))[0]
    wait_mean = np.bincount(rs_slot, weights=wait_rs, minlength=n_r) / np.maximum(np.bincount(rs_slot, minlength=n_r), 1)
    xfer_ps = group_quantiles(rs_slot, group_sum(rs, xfer[ok], n_rs), n_r, (0.5,))[0]
    sync_ps = wait_ps if not p2p.any() else group_quantiles(
        rs_slot, group_sum(rs, np.where(p2p[ok], 0.0, wait[ok]), n_rs), n_r, (0.5,))[0]

    groups = _group_stats(names, _Rows(grp, step, rank, dur, nbytes, p2p, ops), matched,
                          (gs, n_gs, gs_first, transfer), rank_node)
    return CollectiveStats(ranks, np.nan_to_num(wait_ps), np.nan_to_num(xfer_ps), groups, np.nan_to_num(wait_mean),
                           np.nan_to_num(sync_ps))


@dataclass
class _Rows:
    """The digest's collective rows as arrays (communicators numbered in order of first appearance)."""

    grp: np.ndarray
    step: np.ndarray
    rank: np.ndarray
    dur: np.ndarray
    nbytes: np.ndarray
    p2p: np.ndarray
    ops: np.ndarray


def _group_stats(names: list[str], rows: _Rows, matched: np.ndarray,
                 per_step: tuple[np.ndarray, int, np.ndarray, np.ndarray],
                 rank_node: dict[int, str]) -> list[GroupStats]:
    """Each named communicator's figures over its matched calls, every communicator at once.

    Per (communicator, step) the member with the least summed time waited least: its time
    is the transfer (``transfer``, the least over the step's rows: a step's rows are all
    matched or none) and its bytes the step's bytes. A communicator's transfer and bytes per
    step are the medians over its steps (:func:`.grouping.group_median`, ``np.median``'s bits).
    ``per_step``: the (communicator, step) ids of the rows, their count, first rows and least times.
    """
    gs, n_gs, gs_first, transfer = per_step
    n_g = len(names)
    pair_g = rows.grp[gs_first]
    pair_ok = matched[gs_first]
    # bytes of the member that waited least, per (communicator, step)
    fastest = matched & (rows.dur == transfer[gs])
    b = group_max(gs[fastest], rows.nbytes[fastest], n_gs)
    pg = pair_g[pair_ok]
    t_med = group_median(pg, transfer[pair_ok], n_g)
    b_med = group_median(pg, b[pair_ok], n_g)
    b_med[np.bincount(pg, weights=~np.isfinite(b[pair_ok]), minlength=n_g) > 0] = np.nan  # a step's bytes unknown
    instances = np.bincount(pg, minlength=n_g)
    mg = rows.grp[matched]
    p2p_any = np.bincount(mg, weights=rows.p2p[matched], minlength=n_g) > 0
    op_max = np.full(n_g, np.iinfo(np.int64).min)
    np.maximum.at(op_max, mg, rows.ops[matched])
    # the members of each communicator: its distinct ranks, ascending (np.unique's)
    ids, n_m, first = dense_ids(mg, rows.rank[matched])
    m_grp, m_rank = mg[first], rows.rank[matched][first]
    m_start = np.searchsorted(m_grp, np.arange(n_g + 1))
    node_code: dict[str, int] = {}
    m_node = [node_code.setdefault(rank_node.get(r, ""), len(node_code)) for r in m_rank.tolist()]
    no_node = node_code.get("", -1)
    out: list[GroupStats] = []
    # In name order, not in order of first appearance in the digest (which depends on
    # record order and on how ranks were spread over summarisers): later ties
    # ("the first slow group", "the first inter-node group") then resolve alike.
    for name, g in sorted(zip(names, range(n_g))):
        if not name or instances[g] == 0:
            continue
        lo, hi = int(m_start[g]), int(m_start[g + 1])
        nodes = set(m_node[lo:hi])
        out.append(GroupStats(
            name=name, ranks=m_rank[lo:hi], intra_node=len(nodes) == 1 and no_node not in nodes,
            transfer_per_step=float(t_med[g]), bytes_per_step=float(b_med[g]),
            instances=int(instances[g]), p2p=bool(p2p_any[g]), op=int(op_max[g]),
        ))
    return out
