"""The job's own best bus bandwidth per inter-node communicator: a floor under the link capacity.

The fabric tests (:func:`.expected.inter_node_bandwidth_ratio`) compare what
the inter-node collectives carry (NCCL's bus bandwidth) with the capacity of
the links under them, which the detector can only count: the rails that carry
the collectives, shared by the ranks of a node that take part. The count is a
model, and real layouts break it. A DP ring of 16 ranks over 4 nodes crosses
each node boundary once per channel, so the node's rails are shared by its
*rings*, not by its ranks; NCCL spreads its channels over rails that some
windows' counters read idle. An independent generator's 4-node job ran its DP
rings at 45 GB/s bus bandwidth against a counted 25 GB/s, and congestion that
halved it then read as 96% "of the links": never a finding.

A communicator's bus bandwidth cannot exceed the capacity of the path it
takes, so the highest bus bandwidth the same communicator reached earlier in
this job, for the same bytes per step, is a lower bound on that capacity,
measured rather than modelled. The capacity the fabric tests use is the larger
of the count and this floor, per communicator. A job that has only ever run
slow (NCCL over TCP from its start) keeps the count, so nothing it found
before changes; a job that ran at full speed and then slows is measured
against itself.

The floor is the *second* highest window of the same transfers, not the
highest: one window's estimate can read high (a communicator's transfer time
is its fastest member's, and a window of few steps is a small sample), and a
floor set by one such window would make every ordinary window read slow. A
level two windows reached is one the path sustains. Only windows can raise it
(a slowed window never lowers it), and only for the same bytes per step: an
evaluation phase, a changed bucket size or a different batch is another
workload. Each communicator keeps the levels of its last few such phases
(:data:`PHASES`), so training and evaluation taking turns do not wipe each
other's reference.
"""

from __future__ import annotations

import numpy as np

from .collectives import CollectiveStats, GroupStats

# Bytes per step within 10% are the same transfers: the per-step mean varies with how many
# calls fall into the window's whole steps (a gradient-accumulation boundary, a last partial
# bucket), far less than any change of the workload (a different bucket or batch size).
SAME_BYTES = 0.10
# Phases remembered per communicator (training, evaluation, a changed bucket size...): each
# costs three floats of the job's history; the oldest goes when a fifth appears.
PHASES = 4
_WIDTH = 3   # one phase: [highest, second highest bus bandwidth (B/s), bytes per step]


def inter_node_groups(coll: CollectiveStats, min_bytes: float) -> list[GroupStats]:
    """The communicators whose bus bandwidth measures the fabric (send / recv hold the pipeline bubble)."""
    return [g for g in coll.groups if not g.intra_node and not g.p2p and np.isfinite(g.bytes_per_step)
            and g.bytes_per_step >= min_bytes and np.isfinite(g.bandwidth) and g.bandwidth > 0]


def best_bus_Bps(reference: dict[str, list[float]], groups: list[GroupStats]) -> dict[str, float]:
    """Each communicator's sustained best earlier bus bandwidth (the second highest window) for these bytes."""
    out: dict[str, float] = {}
    for g in groups:
        phases = reference.get(g.name, [])
        k = _phase(phases, g.bytes_per_step)
        if k is not None and phases[k + 1] > 0:
            out[g.name] = phases[k + 1]
    return out


def remember_bus(reference: dict[str, list[float]], groups: list[GroupStats],
                 bus_Bps: dict[str, float]) -> dict[str, list[float]]:
    """The reference after a window: per communicator, per phase, its two best bus bandwidths and bytes per step.

    ``bus_Bps``: this window's bus bandwidth of each group (the fabric test's own
    reading, :func:`.expected.bus_bandwidth`). A phase is found by its bytes per
    step; a new one is appended, the oldest dropped past :data:`PHASES`.
    """
    out = {k: list(v) for k, v in reference.items()}
    for g in groups:
        bw = bus_Bps.get(g.name)
        if bw is None or not np.isfinite(bw) or bw <= 0:
            continue
        phases = out.setdefault(g.name, [])
        k = _phase(phases, g.bytes_per_step)
        if k is None:
            phases += [float(bw), 0.0, float(g.bytes_per_step)]
            del phases[:max(0, len(phases) - PHASES * _WIDTH)]
        elif bw > phases[k]:
            phases[k:k + 2] = [float(bw), phases[k]]
        elif bw > phases[k + 1]:
            phases[k + 1] = float(bw)
    return out


def _phase(phases: list[float], nbytes: float) -> int | None:
    """Offset of the phase that moved the same bytes per step (the most recent when several do)."""
    for k in range(len(phases) - _WIDTH, -1, -_WIDTH):
        ref = phases[k + 2]
        if np.isfinite(ref) and ref > 0 and abs(nbytes - ref) <= SAME_BYTES * ref:
            return k
    return None
