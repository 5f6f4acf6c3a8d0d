"""Hangs from hand-built in-flight dumps: the rank not waiting in a collective is the culprit."""

from __future__ import annotations

from eroica.models.digest import INTERIOR, InFlightRows, RankRows, WindowDigest
from eroica.models.records import FN_KINDS

from .hang import HANG_FLOOR_NS, HANG_STEPS, hang_findings

S = 10**9
STEP_NS = 2.0 * S
NODE = {r: f"node-{r // 4}" for r in range(8)}


def digest(dumps: list[tuple[int, str, str, int]], last: list[tuple[int, str, str]] = (), ranks: int = 8) -> WindowDigest:
    """``dumps``: (rank, fn, kind, running ns) still in flight; ``last``: (rank, fn, kind) last finished."""
    inf = InFlightRows(rank=[d[0] for d in dumps], fn=[d[1] for d in dumps], kind=[FN_KINDS.index(d[2]) for d in dumps],
                       ts_ns=[0] * len(dumps), dur_ns=[d[3] for d in dumps],
                       last_rank=[x[0] for x in last], last_fn=[x[1] for x in last],
                       last_kind=[FN_KINDS.index(x[2]) for x in last])
    rk = RankRows(rank=list(range(ranks)), node=[NODE[r] for r in range(ranks)], steps=[5] * ranks,
                  step_time_ns=[STEP_NS] * ranks, step=[INTERIOR] * ranks, start_ns=[0] * ranks, end_ns=[0] * ranks)
    return WindowDigest("j", 0, 60 * S, ranks=rk, in_flight=inf)


def waiting(ranks: list[int], dur: int = 60 * S) -> list[tuple[int, str, str, int]]:
    return [(r, "all_reduce", "collective", dur) for r in ranks]


def test_the_rank_stuck_outside_the_collective_is_the_culprit_the_others_its_victims():
    d = digest(waiting([0, 1, 3, 4, 5, 6, 7]) + [(2, "flash_attn_fwd", "kernel", 61 * S)])
    [f] = hang_findings(d, STEP_NS, NODE)
    assert (f.kind, f.component, f.scope, f.rank, f.node, f.fn) == ("hang", "gpu", "rank", 2, "node-0", "flash_attn_fwd")
    assert f.victims == [0, 1, 3, 4, 5, 6, 7] and f.culprits == [2]
    assert f.confidence == 0.95
    assert f.evidence["stuck_s"]["culprit"] == 61.0


def test_running_for_less_than_three_steps_is_no_hang():
    below = int(HANG_STEPS * STEP_NS) - 1
    d = digest(waiting([0, 1, 3], dur=below) + [(2, "gemm", "kernel", below)])
    assert hang_findings(d, STEP_NS, NODE) == []
    # without a known step time, half a minute
    d = digest(waiting([0, 1, 3], dur=HANG_FLOOR_NS - 1) + [(2, "gemm", "kernel", HANG_FLOOR_NS - 1)])
    assert hang_findings(d, float("nan"), NODE) == []
    d = digest(waiting([0, 1, 3], dur=HANG_FLOOR_NS) + [(2, "gemm", "kernel", HANG_FLOOR_NS)])
    assert [f.rank for f in hang_findings(d, float("nan"), NODE)] == [2]


def test_a_rank_waiting_in_a_collective_is_a_victim_whatever_else_it_dumped():
    # rank 0's enclosing Python frame is in flight too: it still only waits
    d = digest(waiting([0, 1, 3]) + [(0, "train_step", "python", 62 * S), (2, "next", "dataloader", 61 * S)], ranks=4)
    [f] = hang_findings(d, STEP_NS, NODE)
    assert (f.rank, f.component) == (2, "dataloader") and f.victims == [0, 1, 3]


def test_the_more_specific_of_two_functions_started_together_names_the_component():
    d = digest(waiting([0, 1, 3]) + [(2, "train_step", "python", 61 * S), (2, "cudaMemcpy", "memcpy", 61 * S)], ranks=4)
    [f] = hang_findings(d, STEP_NS, NODE)
    assert (f.fn, f.component) == ("cudaMemcpy", "pcie")


def test_when_everyone_dumped_waits_the_missing_rank_is_named_by_its_last_kind():
    for kind, component in (("dataloader", "dataloader"), ("io", "storage"), ("memcpy", "pcie"),
                            ("kernel", "gpu"), ("optimizer", "python")):
        d = digest(waiting([0, 1, 3, 4, 5, 6, 7]), last=[(2, "last_fn", kind)])
        [f] = hang_findings(d, STEP_NS, NODE)
        assert (f.rank, f.fn, f.component) == (2, "last_fn", component), kind
        assert f.victims == [0, 1, 3, 4, 5, 6, 7]
        assert f.evidence["stuck_s"]["culprit"] == 60.0   # the victims' wait: its own time is unknown


def test_too_many_missing_ranks_name_nobody():
    # half the job or fewer may be missing; with 5 of 8 absent the dump says nothing about who
    d = digest(waiting([0, 1, 2]), last=[(r, "f", "kernel") for r in range(3, 8)])
    assert hang_findings(d, STEP_NS, NODE) == []
    d = digest(waiting([0, 1, 2, 3]), last=[(r, "f", "kernel") for r in range(4, 8)])
    assert sorted(f.rank for f in hang_findings(d, STEP_NS, NODE)) == [4, 5, 6, 7]


def test_no_dump_no_hang():
    assert hang_findings(digest([]), STEP_NS, NODE) == []
