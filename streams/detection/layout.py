"""Who is who in a job: rank -> node, pipeline stage, data-parallel index and role.

Taken from the optional ``job`` record when present, else inferred from the
records themselves (every fn / gpu record names its rank's node; without a job
record all ranks share one role).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eroica.models.digest import WindowDigest
from eroica.models.records import JobRecord

# A peer group split by tensor-parallel position must keep this many ranks, or
# the split costs more statistical power (leave-one-out median and MAD over
# four others) than the like-for-like comparison gains; below it, the stage.
MIN_SPLIT_PEERS = 5


@dataclass
class Layout:
    rank_node: dict[int, str]
    rank_stage: dict[int, int]
    rank_role: dict[int, str] = field(default_factory=dict)   # finer role inside a stage (labels, tp position)
    explicit_roles: bool = False                              # rank_role from the job's rank_roles labels

    def node_ranks(self, node: str, present: np.ndarray) -> list[int]:
        return [int(r) for r in present if self.rank_node.get(int(r)) == node]

    def roles(self, ranks: np.ndarray) -> dict[int, np.ndarray]:
        """Pipeline stages: slot indices of the ranks of each stage (stages are compared with each other)."""
        stages = np.array([self.rank_stage.get(int(r), 0) for r in ranks])
        return {int(s): np.flatnonzero(stages == s) for s in np.unique(stages)}

    def peer_groups(self, ranks: np.ndarray) -> dict[int, np.ndarray]:
        """Ranks that do the same work: the stage, split by role where one is known.

        Explicit ``rank_roles`` labels always split; a tensor-parallel position
        splits only when every part keeps :data:`MIN_SPLIT_PEERS` ranks.
        """
        stages = self.roles(ranks)
        if not self.rank_role:
            return stages
        out: dict[int, np.ndarray] = {}
        for s, members in sorted(stages.items()):
            labels = np.array([self.rank_role.get(int(ranks[m]), "") for m in members], dtype=object)
            parts = {lab: members[labels == lab] for lab in sorted(set(labels.tolist()))}
            if len(parts) > 1 and (self.explicit_roles or min(m.size for m in parts.values()) >= MIN_SPLIT_PEERS):
                for m in parts.values():
                    out[len(out)] = m
            else:
                out[len(out)] = members
        return out


def _tp_positions(meta: JobRecord) -> dict[int, str]:
    """Each rank's position inside its tensor-parallel group: its order among the
    ranks of the same (stage, data-parallel index)."""
    if not (meta.tp and meta.tp > 1 and meta.rank_dp and meta.rank_stages
            and len(meta.rank_dp) == len(meta.rank_stages)):
        return {}
    seen: dict[tuple[int, int], int] = {}
    out: dict[int, str] = {}
    for rank, (s, d) in enumerate(zip(meta.rank_stages, meta.rank_dp)):
        pos = seen.get((s, d), 0)
        seen[(s, d)] = pos + 1
        out[rank] = f"tp{pos}"
    return out


def infer_layout(d: WindowDigest, meta: JobRecord | None) -> Layout:
    rank_node: dict[int, str] = dict(zip(d.ranks.rank, d.ranks.node))
    rank_stage: dict[int, int] = {}
    rank_role: dict[int, str] = {}
    if meta is not None:
        if meta.rank_nodes:
            rank_node.update({i: n for i, n in enumerate(meta.rank_nodes)})
        if meta.rank_stages:
            rank_stage = {i: int(s) for i, s in enumerate(meta.rank_stages)}
        rank_role = ({i: str(r) for i, r in enumerate(meta.rank_roles)} if meta.rank_roles
                     else _tp_positions(meta))
    return Layout(rank_node, rank_stage, rank_role, bool(meta is not None and meta.rank_roles))
