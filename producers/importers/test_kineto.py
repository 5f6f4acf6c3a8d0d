"""The Kineto importer: the real traces of ../shared/data/kineto, and hand-built ones for each rule."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

import msgspec
import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import read_batches, validate_line
from eroica.models.records import FnRecord, JobRecord
from eroica.producers.importers import ImportFailed, import_kineto
from eroica.producers.importers.common import MAX_STR, clip, join_stack
from eroica.producers.importers.kineto import collective_bytes, collective_op, us_to_ns, _Args


def _kineto(shared_dir: Path) -> Path:
    d = shared_dir / "data" / "kineto"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    return d


def read_all(path: Path) -> tuple[list[JobRecord], list[FnRecord]]:
    """Every line through the contract's validator: 0 invalid lines, or the test fails."""
    invalid = []
    for batch in read_batches(path):
        invalid += batch.invalid
    assert not invalid, [i.describe() for i in invalid[:5]]
    data = path.read_bytes()
    data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    recs = [validate_line(line) for line in data.splitlines() if line.strip()]
    return [r for r in recs if isinstance(r, JobRecord)], [r for r in recs if isinstance(r, FnRecord)]


def analyze_json(path: Path) -> list:
    """``eroica analyze FILE --format json`` runs (exit 0) and prints one JSON array."""
    proc = subprocess.run([sys.executable, "-m", "eroica.cli", "analyze", str(path), "--format", "json"],
                          capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    out = json.loads(proc.stdout)
    assert isinstance(out, list)
    return out


# --------------------------------------------------------------------------- real traces


def test_sampled_ranks_import(shared_dir, tmp_path):
    d = _kineto(shared_dir)
    out = tmp_path / "sampled.jsonl"
    res = CliRunner().invoke(cli, ["import", "kineto", str(d / "sampled_rank-0.json.gz"),
                                   str(d / "sampled_rank-1.json.gz"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    jobs, fns = read_all(out)
    assert out.read_bytes().startswith(b'{"type":"job"')  # meta before the windows that need it
    assert len(jobs) == 1 and jobs[0].world_size == 128 and jobs[0].job == "sampled_rank"
    assert {r.rank for r in fns} == {0, 1}
    assert {r.job for r in fns} == {"sampled_rank"}
    assert {r.node for r in fns} == {"node-0"}  # ranks 0 and 1: node-<rank // 8>
    kinds = Counter(r.kind for r in fns)
    # 1154 + 1104 kernels, of which 10 + 10 are NCCL; 40 + 10 copies / sets per rank.
    assert kinds["kernel"] == 2238
    assert kinds["collective"] == 20
    assert kinds["memcpy"] == 100
    assert kinds["optimizer"] == 8 and kinds["other"] > 5000 and kinds["python"] > 100
    # Steps: ProfilerStep#551 and #552 on both ranks; nothing lies outside them.
    assert {(r.rank, r.step) for r in fns} == {(0, 551), (0, 552), (1, 551), (1, 552)}
    for r in fns:
        if r.kind == "collective":
            assert r.op == "send" and r.bytes and r.bytes > 0 and r.stream in (84, 203)
        if r.kind in ("kernel", "memcpy", "collective"):
            assert r.stream is not None and r.stack is None
        else:
            assert r.stack and r.stack.split(";")[-1].startswith(r.fn[:20].replace(";", ","))
    assert max(len(r.fn) for r in fns) == MAX_STR  # long templated kernel names clipped to the bound
    ts = [r.ts_ns for r in fns]
    assert ts == sorted(ts)  # both ranks merged in time order
    assert 1682725898000000000 < ts[0] < ts[-1] < 1682725900000000000  # µs since the epoch -> ns
    assert analyze_json(out) is not None


def test_control_import(shared_dir, tmp_path):
    d = _kineto(shared_dir)
    out = tmp_path / "control.jsonl.gz"
    stats = import_kineto([d / "control.json.gz"], out)
    jobs, fns = read_all(out)
    assert jobs[0].world_size == 8 and jobs[0].job == "control"
    assert {r.rank for r in fns} == {3}
    assert sorted({r.step for r in fns}) == list(range(1009, 1015))
    kinds = Counter(r.kind for r in fns)
    assert kinds["kernel"] == 8508 and kinds["collective"] == 60 and kinds["memcpy"] == 882
    assert kinds["dataloader"] == 6 and kinds["optimizer"] == 12
    ops = Counter(r.op for r in fns if r.kind == "collective")
    assert ops == {"send": 42, "all_reduce": 18}
    assert all(r.bytes for r in fns if r.kind == "collective")
    assert stats.skipped["events outside every ProfilerStep"] == 25
    assert stats.records == len(fns)
    analyze_json(out)


def test_test_trace_imports(shared_dir, tmp_path):
    d = _kineto(shared_dir)
    out = tmp_path / "test.jsonl"
    import_kineto([d / "test.json.gz"], out, job="test-run")
    jobs, fns = read_all(out)
    assert jobs[0].world_size == 2 and {r.rank for r in fns} == {1}
    assert len({r.step for r in fns}) == 6


def strip_trace(src: Path, dst: Path, drop: Callable[[dict], bool]) -> Path:
    """A copy of a real trace in ``dst`` (tmp) without the events ``drop`` says yes to."""
    doc = json.loads(gzip.decompress(src.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not drop(e)]
    dst.write_text(json.dumps(doc))
    return dst


def named(*prefixes: str) -> Callable[[dict], bool]:
    return lambda e: str(e.get("name", "")).startswith(prefixes)


def ranges_but_optimizer(e: dict) -> bool:
    """ProfilerStep and every record_function range but the optimizer's."""
    return named("ProfilerStep#")(e) or (e.get("cat") == "user_annotation" and not named("Optimizer.step#")(e))


def _key(r: FnRecord) -> tuple:
    return r.ts_ns, r.fn, r.dur_ns, r.stream


def _imported(src: Path, out: Path) -> Path:
    import_kineto([src], out)
    return out


def _steps_against_markers(src: Path, tmp_path: Path, drop: Callable[[dict], bool]) -> tuple[list, list, list]:
    """(warnings, inferred records, (marked step, inferred step) of each record both imports wrote)."""
    _, marked = read_all(_imported(src, tmp_path / "marked.jsonl"))
    stats = import_kineto([strip_trace(src, tmp_path / "stripped.json", drop)], tmp_path / "inferred.jsonl")
    _, inferred = read_all(tmp_path / "inferred.jsonl")
    step_of = {_key(r): r.step for r in marked}
    pairs = [(step_of[_key(r)], r.step) for r in inferred if _key(r) in step_of]
    # Every inferred record was imported with the markers too, but for the few in the gaps between two
    # ProfilerSteps (20 of 62,825 on control); and most of the marked ones are in a complete inferred step.
    assert len(pairs) >= 0.999 * len(inferred) and len(pairs) >= 0.45 * len(marked)
    return stats.warnings, inferred, pairs


def test_real_trace_without_markers_gets_the_marked_steps(shared_dir, tmp_path):
    """control.json.gz without its ProfilerStep#1009..1014: its ranges repeat with one optimizer step in
    each, and the steps come out as the markers had them, record for record."""
    d = _kineto(shared_dir)
    warnings, inferred, pairs = _steps_against_markers(d / "control.json.gz", tmp_path, named("ProfilerStep#"))
    assert any("5 steps inferred from the repeating pattern of record_function ranges, one "
               "'Optimizer.step#FusedAdam.step' in each: each '## metrics:add ##' ends one" in w for w in warnings)
    # 6 iterations, 5 complete steps: the first is left out (it may be partial); step k is marked 1009 + k.
    assert sorted({r.step for r in inferred}) == [1, 2, 3, 4, 5]
    assert len(pairs) > 60_000 and all(m == k + 1009 for m, k in pairs)


def test_real_trace_optimizer_step_alone(shared_dir, tmp_path):
    """control.json.gz without ProfilerStep and any range but Optimizer.step: each update ends a step."""
    d = _kineto(shared_dir)
    warnings, inferred, pairs = _steps_against_markers(d / "control.json.gz", tmp_path, ranges_but_optimizer)
    assert any("5 steps inferred from the optimizer step: each 'Optimizer.step#FusedAdam.step' ends one" in w
               for w in warnings)
    assert sorted({r.step for r in inferred}) == [1, 2, 3, 4, 5]
    # Step k is marked step 1009 + k but for the work after the update, which opens the next inferred step
    # instead of closing its marked one (97% of the records in the same step, measured).
    assert sum(m == k + 1009 for m, k in pairs) / len(pairs) >= 0.95
    assert all(m - k in (1008, 1009) for m, k in pairs)


def test_real_trace_pattern_alone_and_refusal(shared_dir, tmp_path):
    """sampled_rank-0 without ProfilerStep and Optimizer ranges: its record_function ranges repeat (8 per
    iteration), so its one complete iteration (marked 552) is found; without any range it is refused."""
    d = _kineto(shared_dir)
    src = d / "sampled_rank-0.json.gz"
    warnings, inferred, pairs = _steps_against_markers(src, tmp_path, named("ProfilerStep#", "Optimizer."))
    assert any("1 step inferred from the repeating pattern of record_function ranges: each "
               "'## sdd_wait_tensors ##' ends one" in w for w in warnings)
    assert {r.step for r in inferred} == {1} and all(m == 552 for m, _ in pairs)
    bare = strip_trace(src, tmp_path / "bare.json", lambda e: named("ProfilerStep#")(e) or e.get("cat") == "user_annotation")
    res = CliRunner().invoke(cli, ["import", "kineto", str(bare), "-o", str(tmp_path / "bare.jsonl")])
    assert res.exit_code == 1 and not (tmp_path / "bare.jsonl").exists()
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {bare}: no ProfilerStep#N markers") and "prof.step()" in line


def test_whatif_on_a_trace_without_markers_reports_no_cost(shared_dir, tmp_path):
    """The observed bug: sampled ranks without markers imported as one step, then whatif printed a cost.
    Now the steps are inferred (one complete iteration), and whatif says S is not measurable there: the
    replay of the measured durations misses the measured step by far more than any cost it could show."""
    d = _kineto(shared_dir)
    srcs = [strip_trace(d / f"sampled_rank-{r}.json.gz", tmp_path / f"s{r}.json", named("ProfilerStep#"))
            for r in (0, 1)]
    out = tmp_path / "s.jsonl"
    assert CliRunner().invoke(cli, ["import", "kineto", *map(str, srcs), "-o", str(out)]).exit_code == 0
    res = CliRunner().invoke(cli, ["whatif", str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    (job,) = json.loads(res.stdout)["jobs"]
    assert job["steps"] == 1 and job["measurable"] is False and job["slowdown"] is None
    assert "does not fit" in job["reason"] and job["by_rank"] == {}
    table = CliRunner().invoke(cli, ["whatif", str(out)]).stdout
    assert "S not measurable" in table and "cost" not in table  # the bug: "stragglers cost the job -43%"


# --------------------------------------------------------------------------- hand-built traces


def X(cat, name, ts, dur, pid=100, tid=100, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def write_trace(path: Path, events: list, rank: int | None = 0, world: int = 2, gz: bool = False, **top) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


T0 = 1_700_000_000_000_000  # µs since the epoch


def two_steps() -> list:
    """ProfilerStep#5 [T0, T0+100) and #6 [T0+100, T0+200) on the main thread."""
    return [
        X("user_annotation", "ProfilerStep#5", T0, 100),
        X("user_annotation", "ProfilerStep#6", T0 + 100, 100),
    ]


def run(tmp_path, events, **kw) -> tuple[list[FnRecord], object]:
    p = write_trace(tmp_path / "t.json", events, **{k: v for k, v in kw.items() if k in ("rank", "world", "gz")},
                    **kw.get("top", {}))
    out = tmp_path / "t.jsonl"
    stats = import_kineto([p], out, **{k: v for k, v in kw.items() if k in ("job", "node", "default_group")})
    return read_all(out)[1], stats


def test_us_to_ns_and_base_time(tmp_path):
    assert us_to_ns(1682725898236567.0) == 1682725898236567000  # integer µs convert exactly
    assert us_to_ns(1700000000000000.5) == 1700000000000000500
    assert us_to_ns(12.345) == 12345
    fns, _ = run(tmp_path, two_steps() + [X("kernel", "k", T0 + 0.5, 2.25, pid=0, tid=7, stream=7)])
    k = next(r for r in fns if r.fn == "k")
    assert (k.ts_ns, k.dur_ns) == (T0 * 1000 + 500, 2250)
    # baseTimeNanoseconds: ts is relative to it.
    base = 1_750_000_000_123_456_789
    fns, _ = run(tmp_path, [X("user_annotation", "ProfilerStep#3", 10, 100),
                            X("kernel", "k", 12.345, 1.5, pid=0, tid=7, stream=7)],
                 top={"baseTimeNanoseconds": base})
    k = next(r for r in fns if r.fn == "k")
    assert (k.ts_ns, k.dur_ns, k.step) == (base + 12345, 1500, 3)


def test_step_assignment_via_correlation(tmp_path):
    ev = two_steps() + [
        # Launched in step 5, runs on the GPU during step 6: step 5, by the correlation link.
        X("cuda_runtime", "cudaLaunchKernel", T0 + 90, 5, correlation=7),
        X("kernel", "late_kernel", T0 + 150, 10, pid=0, tid=7, stream=7, correlation=7),
        # No launch in the trace: the step it starts in.
        X("kernel", "orphan_kernel", T0 + 150, 10, pid=0, tid=7, stream=7, correlation=99),
        # Launched after the last step: left out, as are host spans outside every step.
        X("cuda_runtime", "cudaLaunchKernel", T0 + 250, 5, correlation=8),
        X("kernel", "after_kernel", T0 + 255, 10, pid=0, tid=7, stream=7, correlation=8),
        X("cpu_op", "aten::warmup", T0 - 50, 10),
        # Another host thread (autograd) is stepped by time too.
        X("cpu_op", "autograd::engine::evaluate_function: MmBackward0", T0 + 120, 20, tid=200),
    ]
    fns, stats = run(tmp_path, ev)
    by = {r.fn: r for r in fns}
    assert by["late_kernel"].step == 5
    assert by["orphan_kernel"].step == 6
    assert by["cudaLaunchKernel"].step == 5
    assert by["autograd::engine::evaluate_function: MmBackward0"].step == 6
    assert "after_kernel" not in by and "aten::warmup" not in by
    assert stats.skipped["events outside every ProfilerStep"] == 3
    assert {r.step for r in fns if r.fn == "ProfilerStep"} == {5, 6}


def test_no_markers_and_no_boundary_is_refused(tmp_path):
    """Never one fake step: no ProfilerStep and nothing recurring per iteration -> one line, exit 1, no output."""
    p = write_trace(tmp_path / "bare.json", [X("cpu_op", "aten::mm", T0, 10), X("kernel", "gemm", T0 + 5, 3, pid=0, tid=7),
                                             X("user_annotation", "## forward ##", T0, 20),
                                             X("user_annotation", "## backward ##", T0 + 20, 20),
                                             X("user_annotation", "Optimizer.step#SGD.step", T0 + 40, 5)])
    out = tmp_path / "bare.jsonl"
    with pytest.raises(ImportFailed, match="bare.json: no ProfilerStep#N markers") as err:
        import_kineto([p], out)
    assert "\n" not in str(err.value) and "prof.step()" in str(err.value)
    assert not out.exists()
    res = CliRunner().invoke(cli, ["import", "kineto", str(p), "-o", str(out)])
    assert res.exit_code == 1 and not out.exists()
    (line,) = res.stderr.splitlines()
    assert line.startswith(f"error: {p}: no ProfilerStep#N markers") and "torch.profiler.schedule" in line


def iteration(t: int, corr: int, opt: str = "Optimizer.step#SGD.step") -> list:
    """One training iteration of 100 µs from ``t``: load, forward (launching a kernel that runs after the
    optimizer step has ended), optimizer step."""
    return [
        X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", t, 10),
        X("user_annotation", "## forward ##", t + 10, 50),
        X("cpu_op", "aten::mm", t + 12, 20),
        X("cuda_runtime", "cudaLaunchKernel", t + 13, 2, correlation=corr),
        X("kernel", "gemm", t + 96, 3, pid=0, tid=7, stream=7, correlation=corr),
        X("user_annotation", opt, t + 70, 25),
        X("cpu_op", "aten::add_", t + 75, 5),
    ]


def test_steps_inferred_from_the_optimizer_step(tmp_path):
    # Four iterations; an EMA optimizer stepped every other one recurs less and is not the boundary. The
    # ranges then repeat every two iterations, and the EMA would end each such step: two SGD updates in
    # one step, so the optimizer step alone gives the steps.
    ev = [e for i in range(4) for e in iteration(T0 + 100 * i, i + 1)]
    ev += [X("user_annotation", "Optimizer.step#EMA.step", T0 + 100 * i + 96, 2) for i in (0, 2)]
    fns, stats = run(tmp_path, ev)
    # Boundaries at the ends of the 4 SGD steps: 3 complete steps; the first iteration (it may be partial)
    # and the EMA step after the last boundary are left out.
    assert sorted({r.step for r in fns}) == [1, 2, 3]
    assert any("3 steps inferred from the optimizer step: each 'Optimizer.step#SGD.step' ends one" in w
               for w in stats.warnings)
    assert stats.skipped["events outside every inferred step"] > 0 and stats.inferred_steps
    by_step: dict[int, Counter] = {}
    for r in fns:
        by_step.setdefault(r.step, Counter())[r.fn] += 1
    # Step k: the tail of iteration k-1 (its EMA step, if any), then iteration k's load, forward, kernel, update.
    for k in (1, 2, 3):
        assert by_step[k]["Optimizer.step#SGD.step"] == 1 and by_step[k]["gemm"] == 1
        assert by_step[k]["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"] == 1
    assert by_step[1]["Optimizer.step#EMA.step"] == 1 and by_step[3]["Optimizer.step#EMA.step"] == 1
    # A kernel running after its step's boundary keeps the step of its launch (correlation), as with markers.
    gemm = {r.ts_ns: r.step for r in fns if r.fn == "gemm"}
    assert gemm == {(T0 + 100 * k + 96) * 1000: k for k in (1, 2, 3)}


def test_steps_inferred_from_a_repeating_pattern(tmp_path):
    # No optimizer range: the outermost record_function ranges repeat exactly (data, fwd, bwd) x 3.
    ev = []
    for i in range(3):
        t = T0 + 100 * i
        ev += [X("user_annotation", "## data ##", t, 10), X("user_annotation", "## fwd ##", t + 10, 40),
               X("user_annotation", "## layer ##", t + 12, 5), X("user_annotation", "## layer ##", t + 20, 5),
               X("user_annotation", "## bwd ##", t + 50, 45), X("cpu_op", "aten::mm", t + 55, 5)]
    fns, stats = run(tmp_path, ev)
    assert sorted({r.step for r in fns}) == [1, 2]
    assert any("2 steps inferred from the repeating pattern of record_function ranges: each '## bwd ##' ends one" in w
               for w in stats.warnings)
    assert Counter(r.fn for r in fns if r.step == 2) == {"## data ##": 1, "## fwd ##": 1, "## layer ##": 2,
                                                         "## bwd ##": 1, "aten::mm": 1}
    # One extra range in one iteration: no exact repeat, and a name that merely recurs proves nothing.
    ev.append(X("user_annotation", "## checkpoint ##", T0 + 96, 2))
    with pytest.raises(ImportFailed, match="no ProfilerStep#N markers"):
        run(tmp_path, ev)


def test_inferred_steps_that_may_not_line_up_are_warned(tmp_path):
    p0 = write_trace(tmp_path / "r0.json", [e for i in range(4) for e in iteration(T0 + 100 * i, i + 1)], rank=0)
    p1 = write_trace(tmp_path / "r1.json", [e for i in range(3) for e in iteration(T0 + 100 * i, i + 1)], rank=1)
    p2 = write_trace(tmp_path / "r2.json", two_steps(), rank=1)
    stats = import_kineto([p0, p1], tmp_path / "a.jsonl")
    assert any("different numbers of steps" in w for w in stats.warnings)
    stats = import_kineto([p0, p2], tmp_path / "b.jsonl")
    assert any("1 of 2 traces have no ProfilerStep#N markers" in w for w in stats.warnings)


def test_host_kinds_names_and_stacks(tmp_path):
    ev = two_steps() + [
        X("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", T0 + 1, 9),
        X("user_annotation", "DistributedDataParallel.forward", T0 + 10, 40),
        X("cpu_op", "aten::linear", T0 + 11, 20),
        X("cpu_op", "aten::addmm", T0 + 12, 10),
        X("cuda_runtime", "cudaLaunchKernel", T0 + 13, 2, correlation=1),
        X("user_annotation", "Optimizer.step#Adam.step", T0 + 60, 30),
        X("python_function", "torch/optim/adam.py(120): step", T0 + 61, 5),
        X("cpu_op", "aten::add_", T0 + 150, 5),
    ]
    fns, _ = run(tmp_path, ev)
    by = {r.fn: r for r in fns}
    assert by["ProfilerStep"].kind == "python" and by["ProfilerStep"].stack == "ProfilerStep"
    assert by["enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"].kind == "dataloader"
    assert by["DistributedDataParallel.forward"].kind == "python"
    assert by["aten::addmm"].kind == "other"
    assert by["aten::addmm"].stack == "ProfilerStep;DistributedDataParallel.forward;aten::linear;aten::addmm"
    assert by["cudaLaunchKernel"].kind == "other"
    assert by["cudaLaunchKernel"].stack.endswith("aten::addmm;cudaLaunchKernel")
    assert by["Optimizer.step#Adam.step"].kind == "optimizer"
    assert by["torch/optim/adam.py(120): step"].kind == "python"
    assert by["aten::add_"].stack == "ProfilerStep;aten::add_" and by["aten::add_"].step == 6


def test_collective_op_inference():
    cases = {
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "all_reduce",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
        "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)": "all_gather",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "reduce_scatter",
        "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)": "broadcast",
        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "send",
        "ncclDevKernel_Send(ncclDevComm*)": "send",
        "ncclDevKernel_Recv(ncclDevComm*)": "recv",
        "ncclDevKernel_Generic(ncclDevComm*, unsigned long, ncclWork*)": None,
    }
    for name, op in cases.items():
        assert collective_op(name) == op, name
    # Hints after the name: Collective name, then the enclosing range.
    assert collective_op("ncclDevKernel_Generic", "_allgather_base") == "all_gather"
    assert collective_op("ncclDevKernel_Generic", None, "nccl:_reduce_scatter_base") == "reduce_scatter"
    assert collective_op("ncclDevKernel_Generic", "all_to_allv", "nccl:all_to_all") is None  # not in the vocabulary
    assert collective_op("ncclDevKernel_Generic", "barrier") == "barrier"


def test_collective_fields_from_args(tmp_path):
    ev = two_steps() + [
        # Newer PyTorch: the kernel carries the collective's parameters.
        X("cuda_runtime", "cudaLaunchKernel", T0 + 10, 2, correlation=1),
        X("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", T0 + 20, 30, pid=0, tid=40, stream=40,
          correlation=1, **{"Process Group Name": "3", "In msg nelems": 1024, "Out msg nelems": 4096,
                            "dtype": "BFloat16", "Collective name": "_allgather_base"}),
        # Older: the enclosing host range nccl:all_reduce gives the op (Generic kernel) and the size.
        X("user_annotation", "nccl:all_reduce", T0 + 30, 10, **{"Input Dims": [[10, 4]], "Input type": ["float"]}),
        X("cuda_runtime", "cudaLaunchKernel", T0 + 31, 2, correlation=2),
        X("kernel", "ncclDevKernel_Generic(ncclDevComm*)", T0 + 60, 30, pid=0, tid=40, stream=40, correlation=2),
        # A copy: bytes from args.
        X("cuda_runtime", "cudaMemcpyAsync", T0 + 110, 2, correlation=3),
        X("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", T0 + 120, 5, pid=0, tid=22, stream=22, correlation=3,
          bytes=65536),
        X("gpu_memset", "Memset (Device)", T0 + 130, 1, pid=0, tid=7, stream=7, bytes=8),
    ]
    fns, _ = run(tmp_path, ev, default_group="world")
    coll = [r for r in fns if r.kind == "collective"]
    assert [(r.op, r.group, r.bytes, r.step, r.stream) for r in coll] == [
        ("all_gather", "3", 4096 * 2, 5, 40),
        ("all_reduce", "world", 10 * 4 * 4, 5, 40),  # no group in the trace: --default-group
    ]
    mem = [(r.fn, r.bytes, r.stream, r.step) for r in fns if r.kind == "memcpy"]
    assert mem == [("Memcpy HtoD (Pinned -> Device)", 65536, 22, 6), ("Memset (Device)", 8, 7, 6)]
    # The host-side range is host work, not a second collective.
    assert next(r for r in fns if r.fn == "nccl:all_reduce").kind == "python"
    # Without --default-group the group stays unknown (absent) rather than guessed.
    fns, _ = run(tmp_path, ev)
    assert [r.group for r in fns if r.kind == "collective"] == ["3", None]


def test_collective_bytes_helpers():
    assert collective_bytes(_Args(in_nelems=10, out_nelems=80, dtype="Float")) == 320
    assert collective_bytes(_Args(input_dims=[[384]], input_type=["long"])) == 3072
    assert collective_bytes(_Args(input_dims=[[2, 3], [], [7]], input_type=["c10::Half", "Scalar", "int"])) == 28
    assert collective_bytes(_Args(input_dims=[[5]], input_type=["mystery"])) is None
    assert collective_bytes(_Args()) is None


def test_truncation_keeps_head_and_bound(tmp_path):
    head = "void at::native::elementwise_kernel<128, 4, " + "Functor<float, " * 40
    a, b = head + "A>(int)", head + "B>(int)"
    assert len(a) > 600
    ev = two_steps() + [X("kernel", a, T0 + 1, 1, pid=0, tid=7, stream=7),
                        X("kernel", b, T0 + 2, 1, pid=0, tid=7, stream=7),
                        X("cpu_op", "x" * 300, T0 + 3, 1)]
    fns, _ = run(tmp_path, ev)
    ka, kb = (next(r for r in fns if r.ts_ns == (T0 + i) * 1000) for i in (1, 2))
    assert len(ka.fn) == len(kb.fn) == MAX_STR
    assert ka.fn.startswith(head[:200]) and kb.fn.startswith(head[:200])
    assert ka.fn != kb.fn  # same head, different kernels: the hash suffix tells them apart
    assert clip(a) == ka.fn and clip("short") == "short"
    host = next(r for r in fns if r.fn.startswith("xxx"))
    assert len(host.fn) == MAX_STR and len(host.stack) <= MAX_STR


def test_join_stack_keeps_innermost_frames_and_depth():
    frames = [f"frame{i:02d}_" + "y" * 40 for i in range(12)]
    s = join_stack(frames)
    assert len(s) <= MAX_STR
    assert s.count(";") + 1 == len(frames)  # depth kept
    assert s.endswith(frames[-1]) and frames[0] not in s  # innermost kept, outermost dropped
    assert join_stack(["a", "b"]) == "a;b"


def test_multi_file_merge_ranks_and_nodes(tmp_path):
    p0 = write_trace(tmp_path / "r-0.json", two_steps() + [X("kernel", "k", T0 + 50, 1, pid=0, tid=7)], rank=0)
    p1 = write_trace(tmp_path / "r-1.json.gz", [
        X("user_annotation", "ProfilerStep#5", T0 - 10, 100),
        X("kernel", "k", T0 + 5, 1, pid=1, tid=7)], rank=1, gz=True, hostname="gpu-host-7")
    out = tmp_path / "m.jsonl"
    res = CliRunner().invoke(cli, ["import", "kineto", str(p0), str(p1), "-o", str(out), "--job", "j1"])
    assert res.exit_code == 0, res.output
    jobs, fns = read_all(out)
    assert jobs[0].job == "j1" and jobs[0].world_size == 2
    assert jobs[0].rank_nodes == ["node-0", "gpu-host-7"]  # every rank present: the node list
    ts = [r.ts_ns for r in fns]
    assert ts == sorted(ts) and {r.rank for r in fns} == {0, 1}
    assert {r.node for r in fns if r.rank == 1} == {"gpu-host-7"}
    # --node overrides; the same rank twice is refused (two runs of one rank are two jobs).
    res = CliRunner().invoke(cli, ["import", "kineto", str(p0), "-o", str(out), "--node", "h1"])
    assert res.exit_code == 0 and {r.node for r in read_all(out)[1]} == {"h1"}
    with pytest.raises(ImportFailed, match="rank 0 already"):
        import_kineto([p0, p0], tmp_path / "dup.jsonl")


def test_rank_fallback_and_bad_input(tmp_path):
    p = write_trace(tmp_path / "a.json", two_steps() + [X("kernel", "k", T0, 1, pid=0, tid=7)], rank=None)
    stats = import_kineto([p], tmp_path / "a.jsonl")
    assert any("no distributedInfo" in w for w in stats.warnings)
    jobs, fns = read_all(tmp_path / "a.jsonl")
    assert jobs[0].world_size == 1 and {r.rank for r in fns} == {0}
    # A bare event array (plain Chrome trace) is accepted.
    (tmp_path / "b.json").write_text(json.dumps(two_steps() + [X("cpu_op", "aten::mm", T0 + 1, 1)]))
    import_kineto([tmp_path / "b.json"], tmp_path / "b.jsonl")
    assert [r.fn for r in read_all(tmp_path / "b.jsonl")[1]] == ["ProfilerStep", "aten::mm", "ProfilerStep"]
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ImportFailed, match="bad.json"):
        import_kineto([bad], tmp_path / "c.jsonl")
    assert not (tmp_path / "c.jsonl").exists()  # nothing written on failure
    res = CliRunner().invoke(cli, ["import", "kineto", str(bad), "-o", str(tmp_path / "c.jsonl")])
    assert res.exit_code == 1 and "error:" in res.output


def test_records_are_contract_records(tmp_path):
    """Encoded lines decode back with the contract's validator, unknown kinds never slip through."""
    fns, _ = run(tmp_path, two_steps() + [X("cpu_op", "aten::mm", T0 + 1, 1)])
    for r in fns:
        assert validate_line(msgspec.json.encode(r)) == r
