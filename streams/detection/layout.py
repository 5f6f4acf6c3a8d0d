"""Who is who in a job: rank -> node, pipeline stage, data-parallel index and role.

Taken from the optional ``job`` record when present, else inferred from the
records themselves: every fn / gpu record names its rank's node, and the
communicators the ranks use give the pipeline stages (:func:`stages_from_communicators`).
Without a job record and without a pipeline, all ranks share one role.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from eroica.models.digest import CollRows, WindowDigest
from eroica.models.records import JobRecord

# Stages read from the communicators are used only when each holds at least this many
# ranks: the peer test's smallest role (peers.MIN_PEERS). A stage of two or three ranks
# cannot be judged inside itself, so its ranks are then compared with every rank, as
# before the inference: a pp=2 x dp=2 job with one slowed rank is found that way, while
# a job whose stages differ by design needs its job record (rank_stages) to say so.
MIN_INFERRED_STAGE = 4

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

    def work_groups(self, ranks: np.ndarray) -> dict[int, np.ndarray]:
        """Ranks whose own work per step is the same by construction, for pricing (:mod:`.cost`).

        The stage, split by explicit ``rank_roles`` only. An inferred tensor-parallel
        position is not split off here: its ranks on the other nodes share one rail
        (their NIC index), so a slow rail would be its whole group's level, an
        excess over no one, and cost nothing (a 64-rank job's half-speed NIC read
        as 1.01 against 1.16 measured). Positions that differ a little in a
        healthy job stay within the spread the cost keeps (``cost.LEVEL_Z``).
        """
        return self.peer_groups(ranks) if self.explicit_roles else self.roles(ranks)

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


class _Sets:
    """Union-find over ranks (path halving); roots are the smallest member, so results do not
    depend on the order groups are met."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def find(self, r: int) -> int:
        self.parent.setdefault(r, r)
        while self.parent[r] != r:
            self.parent[r] = self.parent[self.parent[r]]
            r = self.parent[r]
        return r

    def join(self, members: list[int]) -> None:
        roots = sorted({self.find(m) for m in members})
        for other in roots[1:]:
            self.parent[other] = roots[0]


def stages_from_communicators(colls: CollRows, ranks: list[int]) -> dict[int, int]:
    """Pipeline stages read from who talks to whom, for jobs without a ``job`` record.

    A pipeline's point-to-point communicators join the stages of one replica, so
    two ranks that share one (directly or along the chain) are in *different*
    stages. Every other communicator (data- and tensor-parallel, expert) stays
    inside a stage, except those that tie stages of one replica together, such
    as Megatron's embedding all-reduce between the first and last stage: a
    collective group with two members in the same point-to-point chain is
    therefore not a stage's and is left out. The stages are the components of
    the remaining groups. They count only when they partition every rank that
    reports into at least two equal parts (a pipeline's stages hold the same
    number of ranks); otherwise there is no pipeline to read and the answer is
    empty. Stages are numbered by their smallest rank, the stage-major rank
    order of Megatron-LM and torch's pipelining (the number is a label; only
    the partition is used to compare). Stages smaller than :data:`MIN_INFERRED_STAGE`
    are not inferred.
    """
    if not len(colls):
        return {}
    members: dict[tuple[bool, str], set[int]] = {}
    p2ps = colls.p2p.tolist() if len(colls.p2p) == len(colls) else [False] * len(colls)
    for r, g, p2p in zip(colls.rank.tolist(), colls.group, p2ps):
        if g:
            members.setdefault((bool(p2p), g), set()).add(int(r))
    chains = _Sets()
    for (p2p, _), m in sorted(members.items()):
        if p2p:
            chains.join(sorted(m))
    if not chains.parent:
        return {}
    stages = _Sets()
    for (p2p, _), m in sorted(members.items()):
        if p2p:
            continue
        chain_of = [chains.find(r) for r in m]
        if len(set(chain_of)) < len(chain_of):
            continue   # ties stages of one pipeline replica together: not a stage's group
        stages.join(sorted(m))
    everyone = sorted({int(r) for r in ranks})
    parts: dict[int, list[int]] = {}
    for r in everyone:
        parts.setdefault(stages.find(r), []).append(r)
    sizes = {len(m) for m in parts.values()}
    if len(parts) < 2 or len(sizes) != 1 or min(sizes) < MIN_INFERRED_STAGE:
        return {}
    order = sorted(parts, key=lambda root: min(parts[root]))
    return {r: i for i, root in enumerate(order) for r in parts[root]}


def infer_layout(d: WindowDigest, meta: JobRecord | None) -> Layout:
    rank_node: dict[int, str] = dict(zip(d.ranks.rank.tolist(), d.ranks.node))
    rank_stage: dict[int, int] = {}
    rank_role: dict[int, str] = {}
    if meta is not None:
        if meta.rank_nodes:
            rank_node.update({i: n for i, n in enumerate(meta.rank_nodes)})
        if meta.rank_stages:
            rank_stage = {i: int(s) for i, s in enumerate(meta.rank_stages)}
        rank_role = ({i: str(r) for i, r in enumerate(meta.rank_roles)} if meta.rank_roles
                     else _tp_positions(meta))
    if not rank_stage:
        rank_stage = stages_from_communicators(d.colls, sorted(set(d.ranks.rank.tolist()) | set(d.fns.rank.tolist())))
    return Layout(rank_node, rank_stage, rank_role, bool(meta is not None and meta.rank_roles))
