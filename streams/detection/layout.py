"""Who is who in a job: rank -> node, pipeline stage and data-parallel index.

Taken from the optional ``job`` record when present, else inferred from the
records themselves (every fn / gpu record names its rank's node; without a job
record all ranks share one role).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from eroica.models.digest import WindowDigest
from eroica.models.records import JobRecord


@dataclass
class Layout:
    rank_node: dict[int, str]
    rank_stage: dict[int, int]

    def node_ranks(self, node: str, present: np.ndarray) -> list[int]:
        return [int(r) for r in present if self.rank_node.get(int(r)) == node]

    def roles(self, ranks: np.ndarray) -> dict[int, np.ndarray]:
        """Peer groups for comparison: ranks of the same pipeline stage."""
        stages = np.array([self.rank_stage.get(int(r), 0) for r in ranks])
        return {int(s): np.flatnonzero(stages == s) for s in np.unique(stages)}


def infer_layout(d: WindowDigest, meta: JobRecord | None) -> Layout:
    rank_node: dict[int, str] = dict(zip(d.ranks.rank, d.ranks.node))
    rank_stage: dict[int, int] = {}
    if meta is not None:
        if meta.rank_nodes:
            rank_node.update({i: n for i, n in enumerate(meta.rank_nodes)})
        if meta.rank_stages:
            rank_stage = {i: int(s) for i, s in enumerate(meta.rank_stages)}
    return Layout(rank_node, rank_stage)
