"""The detector's completeness, kept message by message, equals asking it from scratch.

``DetectorCore._complete`` used to rebuild the expected and covered key sets
over every source at each message (O(N^2) a window with one source per node).
Here random sequences of progress, end markers, job records and analysed
windows are applied, and after each step the incremental answer is compared
with that from-scratch one, for every window start of interest.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from eroica.models.records import JobRecord
from eroica.streams.cores.detector_core import DetectorCore, JobState, _Job


def from_scratch(core: DetectorCore, s: JobState, start_ns: int) -> bool:
    """The old ``_complete``, kept as the reference."""
    if s.job_keys and len(s.ended) >= s.job_keys:
        return True
    expected = core._expected(s)
    if expected is None:
        return False
    covered = set(s.ended)
    for sp in s.sources.values():
        if sp.closed_through_ns >= start_ns:
            covered.update(sp.keys)
    return expected <= covered


KEYS = [f"j/{r}" for r in range(6)] + ["j/node-0", "j/node-1"]
steps = st.lists(st.one_of(
    st.tuples(st.just("progress"), st.sampled_from(["raw/0", "raw/1", "edge/node-0", "edge/node-1"]),
              st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), st.integers(-1, 6)),
    st.tuples(st.just("end"), st.lists(st.sampled_from(KEYS), min_size=1, max_size=3), st.integers(0, 9)),
    st.tuples(st.just("job"), st.integers(1, 6), st.booleans()),
    st.tuples(st.just("analysed"), st.integers(0, 5)),
), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_incremental_completeness_equals_from_scratch(seq) -> None:
    core = DetectorCore(grace_s=30.0, wall_ns=lambda: 0)
    js = _Job(JobState(job="j"))
    s = js.state
    for step in seq:
        if step[0] == "progress":
            _, source, keys, closed = step
            core._progress(js, source, keys, closed)
        elif step[0] == "end":
            _, keys, job_keys = step
            s.ended = sorted(set(s.ended) | set(keys))
            js.coverage.end(keys)
            s.job_keys = job_keys or s.job_keys
        elif step[0] == "job":
            _, world, nodes = step
            s.meta = JobRecord(job="j", world_size=world,
                               rank_nodes=[f"node-{r % 2}" for r in range(world)] if nodes else None)
            js.coverage.invalidate()
        else:
            s.done_through_ns = max(s.done_through_ns, step[1])
        for start in range(-1, 8):
            assert core._complete(js, start) == from_scratch(core, s, start), (step, start)


def test_a_restored_job_rebuilds_its_coverage() -> None:
    core = DetectorCore(grace_s=30.0, wall_ns=lambda: 0)
    s = JobState(job="j", done_through_ns=3, meta=JobRecord(job="j", world_size=2))
    core._progress(_Job(s), "raw/0", ["j/0", "j/1"], 5)
    core.restore(s)
    js = core.jobs["j"]
    assert js.coverage.stale and core._complete(js, 5) and not core._complete(js, 6)
