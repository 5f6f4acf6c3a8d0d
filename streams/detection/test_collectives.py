"""Collectives on hand-built digest rows: the member that waits least is the one the others waited for."""

from __future__ import annotations

import numpy as np

from eroica.models.columns import OP_CODE
from eroica.models.digest import CollRows, WindowDigest

from .collectives import GroupStats, collective_stats

MS = 1_000_000
NODE = {r: f"node-{r // 4}" for r in range(8)}


def colls(rows: list[tuple[int, str, int, float]], nbytes: float = 1e9, op: str = "all_reduce") -> WindowDigest:
    """``rows``: (rank, communicator, step, ms in the collective)."""
    c = CollRows(rank=[r for r, _, _, _ in rows], group=[g for _, g, _, _ in rows], step=[s for _, _, s, _ in rows],
                 dur_ns=[int(ms * MS) for _, _, _, ms in rows], bytes=[nbytes] * len(rows), calls=[1] * len(rows),
                 p2p=[op in ("send", "recv")] * len(rows), op=[OP_CODE[op]] * len(rows))
    return WindowDigest("j", 0, 10**10, colls=c)


def ring(late: dict[int, float], steps: int = 3, ranks: range = range(4), name: str = "dp") -> list[tuple[int, str, int, float]]:
    """Every member leaves together: a rank that arrives ``late[r]`` ms after the others spends that much less."""
    worst = max(late.values(), default=0.0)
    return [(r, name, s, 10.0 + worst - late.get(r, 0.0)) for s in range(steps) for r in ranks]


def test_the_culprit_waits_least_and_its_time_is_the_transfer():
    st = collective_stats(colls(ring({2: 100.0})), np.arange(4), NODE)
    # rank 2 arrived 100 ms late: it spent only the transfer, the others waited 100 ms for it
    assert st.wait_per_step.tolist() == [100 * MS, 100 * MS, 0.0, 100 * MS]
    assert st.transfer_per_step.tolist() == [10 * MS] * 4
    assert int(np.argmin(st.wait_per_step)) == 2
    [g] = st.groups
    assert g.name == "dp" and g.ranks.tolist() == [0, 1, 2, 3] and g.instances == 3
    assert g.transfer_per_step == 10 * MS
    # waiting never reads as low bandwidth: bytes over the transfer, not over the victims' time
    assert g.bandwidth == 1e9 / 0.010


def test_a_call_nobody_else_joined_tells_nothing_about_waiting():
    rows = ring({}, ranks=range(4)) + [(5, "lonely", 0, 500.0)]
    st = collective_stats(colls(rows), np.arange(8), NODE)
    assert st.wait_per_step[5] == 0.0 and st.transfer_per_step[5] == 500 * MS
    assert [g.name for g in st.groups] == ["dp"]


def test_groups_on_one_node_are_intra_node_others_not():
    rows = ring({}, ranks=range(4), name="tp0") + ring({}, ranks=range(2, 6), name="dp")
    st = collective_stats(colls(rows), np.arange(8), NODE)
    by = {g.name: g for g in st.groups}
    assert by["tp0"].intra_node and not by["dp"].intra_node
    # a rank of unknown node never makes a group intra-node
    st = collective_stats(colls(ring({}, ranks=range(4))), np.arange(4), {0: "node-0", 1: "node-0", 2: "node-0"})
    assert not st.groups[0].intra_node


def test_send_recv_pairs_are_marked_and_unknown_bytes_give_no_bandwidth():
    st = collective_stats(colls(ring({1: 5.0}, ranks=range(2), name="pp"), op="send"), np.arange(2), NODE)
    assert st.groups[0].p2p and st.groups[0].op == OP_CODE["send"]
    st = collective_stats(colls(ring({}, ranks=range(4)), nbytes=float("nan")), np.arange(4), NODE)
    assert np.isnan(st.groups[0].bytes_per_step) and np.isnan(st.groups[0].bandwidth)


def test_the_answer_does_not_depend_on_row_order_or_group_first_seen():
    rows = ring({2: 100.0}, name="b") + ring({1: 30.0}, ranks=range(4, 8), name="a")
    a = collective_stats(colls(rows), np.arange(8), NODE)
    b = collective_stats(colls(rows[::-1]), np.arange(8), NODE)
    assert a.wait_per_step.tolist() == b.wait_per_step.tolist()
    assert [g.name for g in a.groups] == [g.name for g in b.groups] == ["a", "b"]


def test_no_collectives():
    st = collective_stats(WindowDigest("j", 0, 1), np.arange(3), NODE)
    assert st.groups == [] and st.wait_per_step.tolist() == [0.0, 0.0, 0.0]


def test_bandwidth_is_nan_without_bytes_or_transfer():
    g = GroupStats("g", np.arange(2), True, transfer_per_step=0.0, bytes_per_step=1e6, instances=1)
    assert np.isnan(g.bandwidth)


def test_sync_waits_leave_out_a_pipelines_send_and_recv():
    """The last stage waits in recv for the pipeline's fill whoever is slow; who paces the others is read
    from the collectives every member joins at once (``sync_waits``)."""
    fill = [(r, f"p2p:{r - 1},{r}", s, ms) for s in range(3) for r, ms in ((1, 5.0), (2, 5.0), (3, 40.0))] + \
           [(r - 1, f"p2p:{r - 1},{r}", s, 5.0) for s in range(3) for r in (1, 2, 3)]
    dp = ring({1: 30.0})   # rank 1 arrives 30 ms late at the all-reduce every member joins
    p2p = colls(fill, op="recv").colls
    both = colls(dp)
    c = both.colls
    merged = CollRows(rank=[*c.rank.tolist(), *p2p.rank.tolist()], group=[*c.group, *p2p.group],
                      step=[*c.step.tolist(), *p2p.step.tolist()], dur_ns=[*c.dur_ns.tolist(), *p2p.dur_ns.tolist()],
                      bytes=[*c.bytes.tolist(), *p2p.bytes.tolist()], calls=[*c.calls.tolist(), *p2p.calls.tolist()],
                      p2p=[*c.p2p.tolist(), *p2p.p2p.tolist()], op=[*c.op.tolist(), *p2p.op.tolist()])
    st = collective_stats(WindowDigest("j", 0, 10**10, colls=merged), np.arange(4), NODE)
    assert int(np.argmax(st.wait_per_step)) == 3            # the recv of the fill dominates all waits
    assert st.sync_waits.tolist() == [30 * MS, 0.0, 30 * MS, 30 * MS]
    assert int(np.argmin(st.sync_waits)) == 1
