"""Job-level notes: a role too small for the peer test is said, a job the peer test covers gets none."""

from __future__ import annotations

import numpy as np

from eroica.models.digest import RankRows, WindowDigest
from eroica.models.records import JobRecord

from .counters import CounterSummary
from .layout import Layout
from .notes import FEW_PEERS, JobNotes, few_peers_note, unpeered
from .peers import MIN_PEERS


def _groups(*sizes: int) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """Peer groups of the given sizes over ranks 0..n-1, in rank order (slot = rank)."""
    out: dict[int, np.ndarray] = {}
    start = 0
    for i, s in enumerate(sizes):
        out[i] = np.arange(start, start + s)
        start += s
    return out, np.arange(start)


def test_every_role_too_small_says_how_many_ranks_and_what_was_compared():
    for n in (1, 2, 3):
        note = few_peers_note("j", *_groups(n))
        assert note is not None and note.kind == FEW_PEERS and note.needed == MIN_PEERS == 4
        assert note.text == (f"job j: only {n} rank{'s' if n > 1 else ''} per role; the peer test needs 4; "
                             "compared against expected behaviour and the job's own history only")
        assert note.uncompared == tuple(range(n)) and note.smallest_group == n and note.ranks == n
    # pipeline stages of 2 and 3 ranks: a range
    note = few_peers_note("j", *_groups(2, 3))
    assert note is not None and "only 2-3 ranks per role" in note.text and note.smallest_group == 2


def test_roles_the_peer_test_can_compare_get_no_note():
    assert few_peers_note("j", *_groups(MIN_PEERS)) is None
    assert few_peers_note("j", *_groups(8)) is None
    assert few_peers_note("j", *_groups(8, 8, 8, 8)) is None
    assert few_peers_note("j", {}, np.zeros(0, dtype=np.int64)) is None


def test_some_roles_too_small_names_their_ranks():
    note = few_peers_note("j", *_groups(8, 3))
    assert note is not None
    assert note.text.startswith("job j: 1 of its 2 roles have fewer than 4 ranks (ranks 8, 9, 10)")
    assert note.uncompared == (8, 9, 10) and note.smallest_group == 3


def _two_models(ranks: int, nvl: set[int]) -> CounterSummary:
    """H100 SXM boards, and H100 NVL ones (another max clock, limit and memory) on ``nvl``."""
    sxm = {"max_sm_clock_mhz": 1980.0, "power_limit_w": 700.0, "mem_total_bytes": 85e9}
    other = {"max_sm_clock_mhz": 1785.0, "power_limit_w": 400.0, "mem_total_bytes": 95e9}
    return CounterSummary(gpu={r: dict(other if r in nvl else sxm) for r in range(ranks)})


def test_a_gpu_model_too_rare_in_its_role_is_not_kernel_compared():
    groups, ranks = _groups(8)
    counters = _two_models(8, {6, 7})
    assert unpeered(groups, ranks, counters).tolist() == [False] * 6 + [True] * 2
    note = few_peers_note("j", groups, ranks, counters)
    assert note is not None and note.uncompared == (6, 7) and note.smallest_group == 2
    assert note.text.startswith("job j: ranks 6, 7: GPUs of a model that fewer than 4 ranks of their role share")
    # four of each model: both classes compared
    assert few_peers_note("j", groups, ranks, _two_models(8, {4, 5, 6, 7})) is None


def _digest(job: str, ranks: list[int]) -> WindowDigest:
    """A digest that holds only which ranks reported (all a note reads without GPU counters)."""
    return WindowDigest(job=job, start_ns=0, end_ns=1,
                        ranks=RankRows(rank=np.array(ranks, dtype=np.int64), node=["node-0"] * len(ranks)))


def test_job_notes_keep_the_window_that_saw_most_ranks():
    meta = JobRecord(job="big", world_size=8, rank_stages=[0] * 8)
    book = JobNotes()
    book.add(_digest("big", [0, 1, 2]), meta)          # a window where 5 of 8 ranks' records are missing ...
    assert [n.text for n in book.notes()] == ["job big: only 3 ranks per role; the peer test needs 4; "
                                              "compared against expected behaviour and the job's own history only"]
    book.add(_digest("big", list(range(8))), meta)     # ... is not the job's layout: the fuller window decides
    assert book.notes() == []
    book.add(_digest("big", [0, 1]), meta)
    assert book.notes() == []
    book.add(_digest("small", [0, 1]), None)           # no job record: one role
    assert [n.to_json()["kind"] for n in book.notes()] == [FEW_PEERS]
    assert book.notes()[0].to_json()["type"] == "note" and book.notes()[0].to_json()["job"] == "small"


def test_a_layout_without_a_job_record_is_one_role():
    layout = Layout(rank_node={r: "n" for r in range(3)}, rank_stage={})
    ranks = np.arange(3)
    note = few_peers_note("j", layout.peer_groups(ranks), ranks)
    assert note is not None and note.uncompared == (0, 1, 2)
