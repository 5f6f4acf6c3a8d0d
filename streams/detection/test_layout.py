"""Pipeline stages read from communicators when a job has no ``job`` record (hand-built rows)."""

from __future__ import annotations

from types import SimpleNamespace

from eroica.models.digest import CollRows
from eroica.streams.detection.layout import stages_from_communicators


def _rows(groups: dict[str, tuple[bool, list[int]]]) -> CollRows:
    c = SimpleNamespace(**{k: [] for k in CollRows.__struct_fields__})  # columns as lists while built
    for name, (p2p, members) in groups.items():
        for r in members:
            c.rank.append(r)
            c.group.append(name)
            c.step.append(0)
            c.dur_ns.append(1)
            c.bytes.append(0.0)
            c.calls.append(1)
            c.p2p.append(p2p)
            c.op.append(4 if p2p else 0)
    return CollRows(**vars(c))


def _megatron(pp: int, dp: int, embedding: bool) -> dict[str, tuple[bool, list[int]]]:
    """rank = stage * dp + replica (stage-major), p2p between adjacent stages of a replica."""
    g: dict[str, tuple[bool, list[int]]] = {}
    for s in range(pp):
        g[f"dp-stage{s}"] = (False, [s * dp + d for d in range(dp)])
    for d in range(dp):
        for s in range(pp - 1):
            g[f"pp-{s}-{s + 1}-dp{d}"] = (True, [s * dp + d, (s + 1) * dp + d])
        if embedding:
            g[f"embedding-dp{d}"] = (False, [d, (pp - 1) * dp + d])
    return g


def test_stages_are_the_components_of_data_parallel_groups_between_pipeline_chains():
    got = stages_from_communicators(_rows(_megatron(4, 4, embedding=False)), list(range(16)))
    assert got == {r: r // 4 for r in range(16)}


def test_a_group_that_ties_stages_of_one_replica_is_not_a_stage_s():
    # the embedding all-reduce joins stage 0 and stage 3 of each replica; it must not merge them
    got = stages_from_communicators(_rows(_megatron(4, 4, embedding=True)), list(range(16)))
    assert got == {r: r // 4 for r in range(16)}


def test_stages_too_small_for_the_peer_test_are_not_inferred():
    # pp=4 x dp=2: two ranks per stage, which the peer test cannot judge inside the stage
    assert stages_from_communicators(_rows(_megatron(4, 2, embedding=False)), list(range(8))) == {}


def test_no_pipeline_or_an_uneven_split_gives_no_stages():
    no_pp = {"world": (False, list(range(8)))}
    assert stages_from_communicators(_rows(no_pp), list(range(8))) == {}
    # rank 16 reports but is in no communicator: the parts are not equal, so nothing is inferred
    assert stages_from_communicators(_rows(_megatron(4, 4, embedding=False)), list(range(17))) == {}
    assert stages_from_communicators(CollRows(), list(range(4))) == {}


def test_the_answer_does_not_depend_on_the_order_rows_arrive():
    rows = _rows(_megatron(4, 4, embedding=True))
    order = list(reversed(range(len(rows.rank))))
    shuffled = CollRows(**{f: [getattr(rows, f)[i] for i in order] for f in rows.__struct_fields__})
    assert stages_from_communicators(shuffled, list(range(16))) == stages_from_communicators(rows, list(range(16)))
