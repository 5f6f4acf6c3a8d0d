"""A fabric finding that only a straggler's own communicators support is its shadow (detector._straggler_distorted)."""

from __future__ import annotations

import numpy as np

from eroica.streams.detection.collectives import CollectiveStats, GroupStats
from eroica.streams.detection.detector import _paced_ranks, _straggler_distorted
from eroica.streams.detection.findings import Finding


def network(groups: dict[str, list[int]], **extra: dict) -> Finding:
    return Finding(kind="slow", component="network", scope="job", fn=next(iter(groups), ""),
                   evidence={"nodes": {"culprit": ["node-0", "node-1"]}, "slow_communicators": groups, **extra})


def straggler(rank: int, component: str = "gpu") -> Finding:
    return Finding(kind="slow", component=component, scope="rank", rank=rank, culprits=[rank])


def coll(groups: dict[str, tuple[list[int], bool]]) -> CollectiveStats:
    gs = [GroupStats(name=n, ranks=np.array(r), intra_node=intra, transfer_per_step=1.0, bytes_per_step=1.0,
                     instances=10, p2p=False, op=0) for n, (r, intra) in groups.items()]
    return CollectiveStats(np.arange(32), np.zeros(32), np.zeros(32), gs)


def test_fabric_slowness_only_in_the_stragglers_communicators_is_its_shadow() -> None:
    f = network({"dp-pp0-tp0": [0, 8, 16, 24]})
    for culprit in (straggler(16), straggler(16, "workload")):
        assert _straggler_distorted(f, _paced_ranks([f, culprit], None))


def test_a_stragglers_tensor_parallel_mates_carry_its_pace() -> None:
    f = network({"dp-pp0-tp0": [0, 8, 16, 24]})
    c = coll({"tp-node-1": ([8, 9, 10, 11, 12, 13, 14, 15], True), "dp-pp0-tp1": ([1, 9, 17, 25], False)})
    assert not _straggler_distorted(f, _paced_ranks([f, straggler(9)], None))
    assert _straggler_distorted(f, _paced_ranks([f, straggler(9)], c))  # rank 8 waits for 9 in every TP call


def test_a_slow_communicator_without_the_straggler_keeps_the_fabric_finding() -> None:
    f = network({"dp-pp0-tp0": [0, 8, 16, 24], "dp-pp0-tp1": [1, 9, 17, 25]})
    assert not _straggler_distorted(f, _paced_ranks([f, straggler(16)], None))
    assert _straggler_distorted(f, _paced_ranks([f, straggler(16), straggler(17)], None))  # one in each


def test_counter_evidence_or_a_link_culprit_keeps_the_fabric_finding() -> None:
    backed = network({"dp-pp0-tp0": [0, 8, 16, 24]}, **{"node-2/mlx5_0": {"anomaly": "congested"}})
    assert not _straggler_distorted(backed, _paced_ranks([backed, straggler(16)], None))
    f = network({"dp-pp0-tp0": [0, 8, 16, 24]})
    nic = Finding(kind="slow", component="nic", scope="node", node="node-2", culprits=[16, 17])
    assert not _straggler_distorted(f, _paced_ranks([f, nic], None))  # a NIC is a link, not a straggler
    assert not _straggler_distorted(f, _paced_ranks([f], None))
    assert not _straggler_distorted(straggler(16), {16})  # only network findings are judged


def test_one_ranks_odd_step_in_a_function_the_jobs_pauses_land_in_is_one_of_those_pauses() -> None:
    from eroica.streams.detection.detector import _drop_explained
    from eroica.streams.detection.expected import PAUSES_FN
    from eroica.streams.detection.patterns import K_PYTHON
    from eroica.streams.detection.test_expected import patterns

    p = patterns(np.full((8, 2), 1e6), [K_PYTHON, K_PYTHON])
    pauses = Finding(kind="slow", component="python", scope="job", fn=PAUSES_FN, evidence={PAUSES_FN: {
        "ranks_pausing": 6, "functions": {"Trainer.prepare_batch": 0.6, "LRScheduler.step": 0.4}}})

    def rank(fn: str, steady: bool) -> Finding:
        return Finding(kind="slow", component="python", scope="rank", rank=3, fn=fn, culprits=[3], steady=steady)

    kept = _drop_explained([pauses, rank("Trainer.prepare_batch", False)], p)
    assert kept == [pauses]
    # a rank slower in every step (steady), or in another function, is a finding of its own
    for other in (rank("Trainer.prepare_batch", True), rank("Model.compile", False)):
        assert _drop_explained([pauses, other], p) == [pauses, other]
    assert _drop_explained([rank("Trainer.prepare_batch", False)], p) == [rank("Trainer.prepare_batch", False)]
