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

from eroica.models.columns import Columns

from .grouping import dense_ids, group_count, group_min, group_quantiles, group_sum
from .patterns import K_COLL


@dataclass
class GroupStats:
    """One communicator over the window."""

    name: str
    ranks: np.ndarray        # member ranks
    intra_node: bool         # every member on one node (NVLink / PCIe path)
    transfer_per_step: float  # median over steps of summed transfer time (ns)
    bytes_per_step: float     # median over steps of summed bytes (NaN if unknown)
    instances: int

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


def collective_stats(fn: Columns, ranks: np.ndarray, rank_node: dict[int, str]) -> CollectiveStats:
    a = fn.arrays
    sel = (a["kind"] == K_COLL) & ~a["in_flight"]
    n_r = ranks.size
    empty = CollectiveStats(ranks, np.zeros(n_r), np.zeros(n_r), [])
    if not sel.any():
        return empty
    rank, step, grp = a["rank"][sel], a["step"][sel], a["group"][sel]
    ts, dur, nbytes = a["ts_ns"][sel], a["dur_ns"][sel], a["bytes"][sel]
    # Occurrence index of each call within (rank, group, step), in time order.
    order = np.lexsort((ts, step, grp, rank))
    r_o, g_o, s_o = rank[order], grp[order], step[order]
    new = np.ones(order.size, dtype=bool)
    new[1:] = (r_o[1:] != r_o[:-1]) | (g_o[1:] != g_o[:-1]) | (s_o[1:] != s_o[:-1])
    run_start = np.maximum.accumulate(np.where(new, np.arange(order.size), 0))
    seq = np.empty(order.size, dtype=np.int64)
    seq[order] = np.arange(order.size) - run_start

    inst, n_inst, _ = dense_ids(grp, step, seq)
    transfer = group_min(inst, dur, n_inst)
    members = group_count(inst, n_inst)
    matched = members[inst] > 1  # a call nobody else joined tells nothing about waiting
    wait = np.where(matched, dur - transfer[inst], 0)
    xfer = np.where(matched, transfer[inst], dur)

    slot = np.searchsorted(ranks, rank)
    rs, n_rs, rs_first = dense_ids(slot, step)
    rs_slot = slot[rs_first]
    wait_ps = group_quantiles(rs_slot, group_sum(rs, wait, n_rs), n_r, (0.5,))[0]
    xfer_ps = group_quantiles(rs_slot, group_sum(rs, xfer, n_rs), n_r, (0.5,))[0]

    groups: list[GroupStats] = []
    vocab = fn.vocab["group"]
    for g in np.unique(grp):
        name = vocab[int(g)]
        if not name:
            continue
        in_g = grp == g
        g_inst = np.unique(inst[in_g])
        # One row per instance: its step, transfer and bytes (bytes of the fastest member).
        first_row = np.flatnonzero(in_g)[np.unique(inst[in_g], return_index=True)[1]]
        i_step = step[first_row]
        sid, n_s, _ = dense_ids(i_step)
        t_ps = group_sum(sid, transfer[g_inst], n_s)
        b = nbytes[first_row].astype(np.float64)
        b[b < 0] = np.nan
        b_ps = group_sum(sid, np.nan_to_num(b), n_s) if np.isfinite(b).any() else np.full(n_s, np.nan)
        members_g = np.unique(rank[in_g])
        nodes = {rank_node.get(int(r), "") for r in members_g}
        groups.append(GroupStats(
            name=name, ranks=members_g, intra_node=len(nodes) == 1 and "" not in nodes,
            transfer_per_step=float(np.median(t_ps)), bytes_per_step=float(np.median(b_ps)),
            instances=int(g_inst.size),
        ))
    return CollectiveStats(ranks, np.nan_to_num(wait_ps), np.nan_to_num(xfer_ps), groups)
