"""``eroica whatif`` against the OSDI'25 study's reference analyzer on generated pipelines (issue 33).

Runs the reference (``../shared/reference/straggler-whatif/run.sh``: it builds
its own pinned venv on first use, CI has PyPI access) and Eroica's whatif (as
a user runs it: ``eroica import optable`` then ``eroica whatif``) on a few
generated tables, and holds S to the reference within 5% with the same top
stage / DP index. It fails when the replay mis-models a pipeline: before
issue 33 item 2 Eroica's S was 4-40% off on such tables (``median`` of each
micro-batch position instead of the study's mean, the grad-norm clip's wait
read as optimizer work, sends paired with the wrong recvs), and on interleaved
ones 2-31% off or not measurable (an asynchronous send held its rank, no-op
p2p records typical of their function's waits).
"""

from __future__ import annotations

import shutil

import pytest

from eroica.bench.cost_reference import TARGET, run_spec
from eroica.bench.pipeline_traces import TraceSpec

CASES = [
    TraceSpec(pp=4, dp=2, mb=8, schedule="1f1b", culprit="worker", seed=1),
    TraceSpec(pp=2, dp=4, mb=16, schedule="gpipe", culprit="mb_imbalance", seed=2),
    TraceSpec(pp=4, dp=2, mb=16, schedule="1f1b", culprit="stage", seed=3, factor=1.5),
    TraceSpec(pp=2, dp=4, mb=8, schedule="1f1b", culprit="dp_group", seed=4),
    # interleaved 1F1B (2 model chunks per rank, asynchronous sends, no-op p2p records at the virtual
    # pipeline's ends): before the fix S was 13% low on the first and not measurable on the second (the
    # replay of the measured durations 6% short: a send's pair node, arriving with its late receiver, cut
    # the sender's next op off its rank's sequence)
    TraceSpec(pp=2, dp=2, mb=4, schedule="interleaved", culprit="worker", seed=7, vpp=2),
    TraceSpec(pp=4, dp=2, mb=8, schedule="interleaved", culprit="stage", seed=3, vpp=2),
]


@pytest.mark.parametrize("spec", CASES, ids=lambda s: s.name)
def test_s_agrees_with_the_reference(spec, shared_dir, tmp_path):
    if not (shared_dir / "reference" / "straggler-whatif" / "run.sh").is_file():
        pytest.skip(f"no reference analyzer under {shared_dir}/reference")
    if shutil.which("python3") is None:
        pytest.skip("the reference's run.sh needs python3 to build its venv")
    r = run_spec(spec, tmp_path)
    assert r.s_eroica is not None, r.reason
    assert r.rel_error <= TARGET, (r.s_ref, r.s_eroica)
    assert r.agree is not False, (r.top_ref, r.top_eroica)
