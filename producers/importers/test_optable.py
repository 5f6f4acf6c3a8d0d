"""The operation-table importer: the real straggler trace of ../shared/data/stragglers, and small tables."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import read_batches, validate_line
from eroica.models.records import FnRecord, JobRecord
from eroica.producers.importers import ImportFailed
from eroica.producers.importers.optable import DEFAULT_START_NS, group_of, import_optable, map_optype

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def read_all(path: Path) -> tuple[list[JobRecord], list[FnRecord]]:
    invalid = []
    for batch in read_batches(path):
        invalid += batch.invalid
    assert not invalid, [i.describe() for i in invalid[:5]]
    recs = [validate_line(line) for line in path.read_bytes().splitlines() if line.strip()]
    return [r for r in recs if isinstance(r, JobRecord)], [r for r in recs if isinstance(r, FnRecord)]


def _straggler(shared_dir: Path) -> Path:
    d = shared_dir / "data" / "stragglers"
    if not (d / "trace-ST.parquet").is_file():
        pytest.skip(f"{d / 'trace-ST.parquet'} not found")
    return d


def test_straggler_trace_import(shared_dir, tmp_path):
    d = _straggler(shared_dir)
    out = tmp_path / "st.jsonl"
    res = CliRunner().invoke(cli, ["import", "optable", str(d / "trace-ST.parquet"), "--meta",
                                   str(d / "meta-ST.yaml"), "-o", str(out), "--job", "st"])
    assert res.exit_code == 0, res.output
    jobs, fns = read_all(out)
    assert out.read_bytes().startswith(b'{"type":"job"')
    (job,) = jobs
    assert (job.job, job.world_size, job.dp, job.pp, job.tp) == ("st", 8, 2, 4, 1)
    assert job.rank_stages == [0, 0, 1, 1, 2, 2, 3, 3] and job.rank_dp == [0, 1] * 4
    assert job.rank_nodes == ["node-0"] * 8
    assert len(fns) == 6784
    assert {r.rank for r in fns} == set(range(8))
    assert len({r.step for r in fns}) == 32
    # the grad-norm clip is a collective (its all-reduce over every rank), the optimizer is not
    assert Counter(r.kind for r in fns) == {"collective": 4224, "kernel": 2048, "optimizer": 256, "python": 256}
    ops = Counter(r.op for r in fns if r.kind == "collective")
    assert ops == {"send": 1536, "recv": 1536, "reduce_scatter": 256, "all_gather": 256, "all_reduce": 640}
    assert {r.fn for r in fns if r.kind == "python"} == {"gc.collect"}
    # Each communicator is named alike by all its members.
    members = defaultdict(set)
    for r in fns:
        if r.kind == "collective":
            members[r.group].add(r.rank)
    for g, ranks in members.items():
        if g.startswith("pp-"):
            assert len(ranks) == 2, (g, ranks)
    assert members["pp-0-1-dp0"] == {0, 2} and members["pp-2-3-dp1"] == {5, 7}
    assert members["dp-stage3"] == {6, 7} and members["embedding-dp0"] == {0, 6}
    assert members["tp-stage1-dp1"] == {3} and members["world"] == set(range(8))
    # Steps laid end to end: a step's first operation starts at or after the previous step's last end.
    span = {}
    for r in fns:
        lo, hi = span.get(r.step, (2**63, 0))
        span[r.step] = (min(lo, r.ts_ns), max(hi, r.ts_ns + r.dur_ns))
    order = sorted(span)
    assert span[order[0]][0] >= DEFAULT_START_NS
    for a, b in zip(order, order[1:]):
        assert span[b][0] >= span[a][1]
    ts = [r.ts_ns for r in fns]
    assert ts == sorted(ts)
    proc = subprocess.run([sys.executable, "-m", "eroica.cli", "analyze", str(out), "--format", "json"],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    assert isinstance(json.loads(proc.stdout), list)


def test_meta_found_beside_the_trace(shared_dir, tmp_path):
    d = _straggler(shared_dir)
    out = tmp_path / "st.jsonl"
    res = CliRunner().invoke(cli, ["import", "optable", str(d / "trace-ST.parquet"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "meta-ST.yaml" in res.output
    (job,) = read_all(out)[0]
    assert job.job == "trace-ST" and job.world_size == 8 and job.dp == 2 and job.pp == 4


def test_optype_mapping():
    assert map_optype("forward-compute") == ("kernel", "forward-compute", None)
    assert map_optype("backward-compute") == ("kernel", "backward-compute", None)
    assert map_optype("forward-send") == ("collective", "forward-send", "send")
    assert map_optype("backward-recv") == ("collective", "backward-recv", "recv")
    assert map_optype("grads-reduce-scatter") == ("collective", "grads-reduce-scatter", "reduce_scatter")
    assert map_optype("params-all-gather") == ("collective", "params-all-gather", "all_gather")
    assert map_optype("layernorm-grads-all-reduce")[2] == "all_reduce"
    assert map_optype("embedding-grads-all-reduce")[2] == "all_reduce"
    assert map_optype("optimizer") == ("optimizer", "optimizer", None)
    assert map_optype("optimizer-clip-main-grad") == ("collective", "optimizer-clip-main-grad", "all_reduce")
    assert map_optype("gc") == ("python", "gc.collect", None)
    assert map_optype("something-new") == ("other", "something-new", None)


def test_pipeline_groups_pair_both_ends():
    pp = 4
    for s in range(pp - 1):
        # forward: s sends to s+1, which receives from s; backward: s+1 sends to s, which receives.
        assert group_of("forward-send", "send", s, 1, pp) == group_of("forward-recv", "recv", s + 1, 1, pp)
        assert group_of("backward-send", "send", s + 1, 1, pp) == group_of("backward-recv", "recv", s, 1, pp)
        assert group_of("forward-send", "send", s, 1, pp) == f"pp-{s}-{s + 1}-dp1"
    assert group_of("grads-reduce-scatter", "reduce_scatter", 2, 0, pp) == "dp-stage2"
    assert group_of("params-all-gather", "all_gather", 2, 1, pp) == "dp-stage2"
    assert group_of("optimizer", None, 0, 0, pp) is None


def write_table(path: Path, rows: list[tuple]) -> Path:
    cols = ("rank", "stage", "dp_rank", "step", "optype", "start_ts", "duration")
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    n = len(rows)
    data.update(seq_id=[0] * n, mc=[-1] * n, mb_id=[-1] * n, gmc=[-1] * n)
    pq.write_table(pa.table(data), path)
    return path


def test_small_table_times_and_job(tmp_path):
    # 2 stages x 1 replica; steps 7 and 9 (sampled). Step 7 lasts 3.5 s (rank 1's recv ends last).
    rows = [
        (0, 0, 0, 7, "forward-compute", 0.0, 1.0),
        (0, 0, 0, 7, "forward-send", 1.0, 0.25),
        (1, 1, 0, 7, "forward-recv", 0.5, 3.0),
        (0, 0, 0, 9, "forward-compute", 0.125, 1.0),
        (1, 1, 0, 9, "gc", 0.0, 0.0),
    ]
    p = write_table(tmp_path / "small.parquet", rows)
    out = tmp_path / "small.jsonl"
    stats = import_optable(p, out, start_ns=10**18, gpus_per_node=1)
    jobs, fns = read_all(out)
    (job,) = jobs
    assert (job.world_size, job.dp, job.pp, job.tp) == (2, 1, 2, None)
    assert job.rank_nodes == ["node-0", "node-1"] and job.rank_stages == [0, 1] and job.rank_dp == [0, 0]
    got = sorted((r.step, r.rank, r.fn, r.ts_ns, r.dur_ns, r.op, r.group) for r in fns)
    assert got == [
        (7, 0, "forward-compute", 10**18, 10**9, None, None),
        (7, 0, "forward-send", 10**18 + 10**9, 25 * 10**7, "send", "pp-0-1-dp0"),
        (7, 1, "forward-recv", 10**18 + 5 * 10**8, 3 * 10**9, "recv", "pp-0-1-dp0"),
        (9, 0, "forward-compute", 10**18 + 35 * 10**8 + 125 * 10**6, 10**9, None, None),
        (9, 1, "gc.collect", 10**18 + 35 * 10**8, 0, None, None),
    ]
    assert {r.node for r in fns if r.rank == 1} == {"node-1"}
    assert stats.records == 5 and len(stats.steps) == 2


def test_bad_table(tmp_path):
    bad = tmp_path / "x.parquet"
    pq.write_table(pa.table({"rank": [0], "step": [1]}), bad)
    with pytest.raises(ImportFailed, match="x.parquet"):
        import_optable(bad, tmp_path / "x.jsonl")
    res = CliRunner().invoke(cli, ["import", "optable", str(bad), "-o", str(tmp_path / "x.jsonl")])
    assert res.exit_code == 1 and "error:" in res.output


def test_table_without_steps_is_refused(tmp_path):
    """No step column: start_ts is relative to each row's step, so no step can be inferred; one line, exit 1."""
    rows = [(0, 0, 0, s, o, t, 0.5) for s in (1, 2) for o, t in (("forward-compute", 0.0), ("optimizer", 0.5))]
    p = write_table(tmp_path / "nostep.parquet", rows)
    pq.write_table(pq.read_table(p).drop_columns(["step"]), p)
    out = tmp_path / "nostep.jsonl"
    with pytest.raises(ImportFailed, match="nostep.parquet: no 'step' column"):
        import_optable(p, out)
    res = CliRunner().invoke(cli, ["import", "optable", str(p), "-o", str(out)])
    assert res.exit_code == 1 and not out.exists()
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {p}: no 'step' column") and "one step" in line
    # Another missing column is named as such.
    pq.write_table(pq.read_table(write_table(p, rows)).drop_columns(["duration"]), p)
    with pytest.raises(ImportFailed, match="not an operation table: no column 'duration'"):
        import_optable(p, out)
