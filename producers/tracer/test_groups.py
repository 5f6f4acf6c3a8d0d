"""Group ids from sorted global ranks: the same on every member, distinct for distinct rank sets."""

from __future__ import annotations

import random

from eroica.producers.tracer.groups import MAX_STR, pair_id, ranks_id


def test_ids_depend_on_the_set_of_ranks_only() -> None:
    assert ranks_id([3, 0, 1, 2]) == ranks_id(range(4)) == "ranks:0-3"
    assert ranks_id([7, 1, 3, 5]) == "ranks:1-7:2"
    assert ranks_id([5, 0, 3]) == "ranks:0,3,5"
    assert ranks_id([4]) == "ranks:4"
    assert pair_id(4, 2) == pair_id(2, 4) == "p2p:2,4"
    assert pair_id(0, 1) != ranks_id([0, 1])  # a channel is not the collective group of the same two ranks


def test_distinct_sets_get_distinct_ids_within_the_contract_length() -> None:
    rng = random.Random(7)
    seen: dict[str, tuple] = {}
    for _ in range(3000):
        n = rng.choice([2, 3, 8, 17, 300, 5000])
        members = tuple(sorted(rng.sample(range(20000), n)))
        shuffled = list(members)
        rng.shuffle(shuffled)
        gid = ranks_id(shuffled)
        assert len(gid) <= MAX_STR
        assert seen.setdefault(gid, members) == members, (gid, members)
    big = ranks_id(range(0, 16384, 8))
    assert big == "ranks:0-16376:8"  # regular layouts stay readable at any size
