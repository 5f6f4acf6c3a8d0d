"""The tracer's runtime without torch: bounded queue, steps, in-flight dumps, identity, merge, bootstrap."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eroica.models.reader import read_batches
from eroica.producers.tracer import span
from eroica.producers.tracer import runtime as rt
from eroica.producers.tracer.launch import make_job_id
from eroica.producers.tracer.merge import job_record, merge_parts
from eroica.models.records import UNTRACED_FN
from eroica.producers.tracer.runtime import MIN_GAP_NS, Identity, Tracer, env_identity, job_id


class ListSink:
    def __init__(self) -> None:
        self.records: list = []
        self.closed = False

    def write(self, recs) -> None:
        self.records.extend(recs)

    def close(self) -> None:
        self.closed = True


def make_tracer(**kw) -> tuple[Tracer, ListSink]:
    sink = ListSink()
    ident = Identity(job="j", node="n", rank=3, world_size=4, local_rank=3, pid=os.getpid(), final=True)
    t = Tracer(sink_factory=lambda ident: sink, identity=ident, flush_s=60.0, **kw)
    t.sigterm_dump = False
    return t, sink


def test_spans_become_contract_records_in_time_order() -> None:
    t, sink = make_tracer()
    a = t.begin("DataLoader.__next__", "dataloader")
    b = t.begin("torch.distributed.all_reduce", "collective", (4096, "all_reduce", "pg0", None, None))
    t.end(b)
    t.end(a)
    t.end(a)  # closing twice is harmless
    assert t.flush() == 2
    first, second = [r for r in sink.records if r.fn != UNTRACED_FN]
    assert first.fn == "DataLoader.__next__" and first.ts_ns <= second.ts_ns  # sorted by start
    assert (second.bytes, second.op, second.group, second.rank, second.job) == (4096, "all_reduce", "pg0", 3, "j")
    assert first.dur_ns >= second.dur_ns >= 0 and not first.in_flight
    t.close()
    assert sink.closed


def test_moved_start_and_given_end_are_kept_exactly() -> None:
    """An overlapped all-reduce's exposed part: the caller's two reads are the span, not a later clock read."""
    t, sink = make_tracer()
    tok = t.begin("DDP.all_reduce", "collective")
    now = time.time_ns()
    time.sleep(0.01)  # what losing the GIL between the caller's read and end() would add
    t.end(tok, start_ns=now, end_ns=now)
    late = t.begin("DDP.all_reduce", "collective")
    t.end(late, start_ns=now - 10**9, end_ns=now + 5_000_000)  # a start before the span's own is not taken
    t.flush()
    empty, exposed = [r for r in sink.records if r.fn != UNTRACED_FN]
    assert (empty.ts_ns, empty.dur_ns) == (now, 0)
    assert exposed.ts_ns > now - 10**9 and exposed.ts_ns + exposed.dur_ns == now + 5_000_000
    t.close()


def test_time_no_span_covers_is_recorded_as_a_gap_of_the_step_that_ends_it() -> None:
    """Between spans (none open on any thread) the loop's own code runs: one ``python`` record per gap,
    from the last end to the next begin, in the step of the call that ends it; none inside spans."""
    t, sink = make_tracer()
    outer = t.begin("Net.forward", "python")
    t.end(t.begin("DDP.all_reduce", "collective"))   # nested: the forward is still open, no gap
    t.end(outer)
    time.sleep(0.02)                                  # the loop's own code: 20 ms outside any call
    t.step_done()
    t.maybe_advance()
    t.end(t.begin("DataLoader.__next__", "dataloader"))
    t.flush()
    by_fn = {r.fn: r for r in sink.records}
    gaps = [r for r in sink.records if r.fn == UNTRACED_FN]
    assert len(gaps) == 1, [r.fn for r in sink.records]
    gap, fwd, load = gaps[0], by_fn["Net.forward"], by_fn["DataLoader.__next__"]
    assert gap.kind == "python" and gap.step == load.step == fwd.step + 1
    assert gap.ts_ns == fwd.ts_ns + fwd.dur_ns and gap.ts_ns + gap.dur_ns == load.ts_ns
    assert gap.dur_ns >= 20_000_000
    t.close()


def test_back_to_back_calls_leave_no_gap_record() -> None:
    t, sink = make_tracer()
    for _ in range(3):
        t.end(t.begin("Net.forward", "python"))
    t.flush()
    assert all(r.fn != UNTRACED_FN or r.dur_ns >= MIN_GAP_NS for r in sink.records)
    t.close()


class DeclaringSink(ListSink):
    declares_watermarks = True

    def __init__(self) -> None:
        super().__init__()
        self.watermarks: list = []

    def write(self, recs, watermark_ns=None) -> None:
        super().write(recs)
        self.watermarks.append(watermark_ns)


def test_declared_watermark_is_held_by_open_spans_only() -> None:
    """Each flush tells a sink that takes it the time before which this rank has nothing left:
    the oldest open span's start, else the flush's clock read; a span open past the horizon
    (a user's span around the whole loop) does not hold it."""
    sink = DeclaringSink()
    ident = Identity(job="j", node="n", rank=0, world_size=1, local_rank=0, pid=os.getpid(), final=True)
    t = Tracer(sink_factory=lambda ident: sink, identity=ident, flush_s=60.0)
    t.sigterm_dump = False
    outer = t.begin("train_step", "python")
    inner = t.begin("Net.forward", "python")
    t.end(inner)
    t.flush()
    first = t._open[outer][2]
    assert sink.watermarks == [first] and sink.records[0].ts_ns >= first
    t.end(outer)
    before = time.time_ns()
    t.flush()
    assert sink.watermarks[-1] >= before
    t._open[99] = ("loop", "python", time.time_ns() - 10 * rt.WATERMARK_HORIZON_NS, 0, None)
    t.emit("x", "python", time.time_ns(), 1, 0)
    t.flush()
    assert sink.watermarks[-1] >= time.time_ns() - rt.WATERMARK_HORIZON_NS - 10**9
    t._open.pop(99)
    t.begin("hung", "python")
    t.close()
    assert sink.records[-1].in_flight and sink.watermarks[-1] is None  # the final flush declares nothing


def test_full_queue_drops_and_counts_never_blocks() -> None:
    t, sink = make_tracer(capacity=10)
    t0 = time.perf_counter()
    for i in range(1000):
        t.emit("f", "python", i, 1, 0)
    assert time.perf_counter() - t0 < 0.5
    assert t.dropped == 990 and t.flush() == 10
    t.close(in_flight=False)


def test_steps_advance_after_optimizer_step() -> None:
    t, sink = make_tracer()
    for _ in range(3):
        t.maybe_advance()              # loader / forward: opens the step
        t.end(t.begin("Net.forward", "python"))
        t.end(t.begin("SGD.step", "optimizer"))
        t.step_done()
        t.end(t.begin("torch.distributed.all_reduce", "collective"))  # a loss all-reduce after the step
    t.flush()
    steps = [(r.fn, r.step) for r in sink.records if r.fn != UNTRACED_FN]
    assert steps == [("Net.forward", 0), ("SGD.step", 0), ("torch.distributed.all_reduce", 0),
                     ("Net.forward", 1), ("SGD.step", 1), ("torch.distributed.all_reduce", 1),
                     ("Net.forward", 2), ("SGD.step", 2), ("torch.distributed.all_reduce", 2)]
    assert t.next_step() == 3


def test_open_spans_are_dumped_in_flight_at_close_and_on_hang() -> None:
    t, sink = make_tracer(hang_s=0.05)
    t.begin("torch.distributed.all_reduce", "collective", (8, "all_reduce", "pg0", None, None))
    time.sleep(0.06)
    t._watch_hangs()
    t._watch_hangs()  # once per span
    t.flush()
    (hung,) = sink.records
    assert hung.in_flight and hung.dur_ns >= 50_000_000 and hung.op == "all_reduce"
    t.close()
    assert [r.in_flight for r in sink.records] == [True, True]  # and again, longer, at shutdown
    assert sink.records[1].dur_ns >= hung.dur_ns


def test_custom_spans_nest_with_stacks(monkeypatch) -> None:
    t, sink = make_tracer()
    monkeypatch.setattr(rt, "_tracer", t)

    @span("tokenize")
    def tokenize():
        with span("lookup", kind="io"):
            pass

    with span("Net.forward"):
        tokenize()
    with pytest.raises(ValueError):
        span("x", kind="gpu")
    t.flush()
    by = {r.fn: r for r in sink.records}
    assert by["Net.forward"].stack is None
    assert by["tokenize"].stack == "Net.forward;tokenize"
    assert by["lookup"].stack == "Net.forward;tokenize;lookup" and by["lookup"].kind == "io"


def test_long_stacks_keep_innermost_frames() -> None:
    s = rt._truncate_stack(";".join(f"frame{i:03d}" for i in range(100)))
    assert len(s) <= 256 and s.endswith("frame099") and not s.startswith(";")


def test_identity_from_launcher_env() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "TORCHELASTIC_RUN_ID": "abc"}
    ident = env_identity(env)
    assert (ident.rank, ident.world_size, ident.local_rank, ident.job) == (5, 8, 1, "abc")
    assert job_id({"EROICA_JOB": "mine", "TORCHELASTIC_RUN_ID": "abc"}) == "mine"
    assert job_id({"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == \
        job_id({"MASTER_ADDR": "h", "MASTER_PORT": "1"})  # same on every rank without a run id
    assert env_identity({}).rank == 0 and env_identity({}).world_size == 1


def test_job_id_defaults() -> None:
    assert make_job_id(["torchrun", "train.py"], {"TORCHELASTIC_RUN_ID": "r1"}) == "r1"
    assert make_job_id(["torchrun", "--nproc-per-node", "8", "train.py"], {}).startswith("train-")
    assert make_job_id(["python", "-m", "pkg.trainer"], {}).startswith("trainer-")


def test_file_sink_and_meta(tmp_path: Path) -> None:
    t = Tracer(out_dir=tmp_path, identity=Identity("j", "node-a", 2, 4, 2, 1234, True), flush_s=60.0)
    t.sigterm_dump = False
    t.emit("SGD.step", "optimizer", 10, 5, 0)
    t.close()
    assert (tmp_path / "fn-node-a-1234.jsonl").exists()
    meta = json.loads((tmp_path / "fn-node-a-1234.meta.json").read_text())
    assert (meta["rank"], meta["world_size"], meta["written"]) == (2, 4, 1)


def _write(path: Path, recs: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_merge_orders_across_ranks_and_writes_job_record(tmp_path: Path) -> None:
    parts = tmp_path / "parts"
    parts.mkdir()
    for rank in range(2):
        recs = [{"type": "fn", "job": "j", "node": f"n{rank}", "rank": rank, "step": i, "fn": "f", "kind": "python",
                 "ts_ns": 1000 * i + rank, "dur_ns": 1} for i in range(50)]
        recs[10], recs[11] = recs[11], recs[10]  # a little disorder within a file
        _write(parts / f"fn-n{rank}-{rank}.jsonl", recs)
        (parts / f"fn-n{rank}-{rank}.meta.json").write_text(json.dumps(
            {"job": "j", "node": f"n{rank}", "rank": rank, "world_size": 2, "pid": rank, "dropped": rank}))
    _write(parts / "agent-n0.jsonl", [{"type": "host", "job": "j", "node": "n0", "ts_ns": 25_500}])
    res = merge_parts(parts, tmp_path / "run.jsonl", "j", reorder=4)
    lines = (tmp_path / "run.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {"type": "job", "job": "j", "world_size": 2, "rank_nodes": ["n0", "n1"]}
    ts = [json.loads(line)["ts_ns"] for line in lines[1:]]
    assert ts == sorted(ts) and len(ts) == 101 == res.records
    assert res.ranks == [0, 1] and res.dropped == 1
    assert not any(b.invalid for b in read_batches(str(tmp_path / "run.jsonl")))


def test_job_record_without_every_rank() -> None:
    jr = job_record([{"job": "j", "rank": 1, "node": "a", "world_size": 4}], "j")
    assert jr.world_size == 4 and jr.rank_nodes is None
    assert job_record([], "j") is None


def _trace(tmp_path: Path, *cmd: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eroica.cli.main", "trace", "--no-agent", "--out",
                           str(tmp_path / "t.jsonl"), "--", *cmd], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, **(env or {})})


def test_trace_passes_output_and_exit_code_through(tmp_path: Path) -> None:
    code = "import sys; print('out line'); print('err line', file=sys.stderr); sys.exit(7)"
    proc = _trace(tmp_path, sys.executable, "-c", code)
    assert proc.returncode == 7
    assert proc.stdout == "out line\n"
    assert proc.stderr.startswith("err line\n")  # ours comes after, on stderr only
    assert "eroica: job" in proc.stderr


def test_trace_re_raises_the_signal_that_killed_the_command(tmp_path: Path) -> None:
    proc = _trace(tmp_path, sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert proc.returncode == -signal.SIGTERM


def test_sitecustomize_chains_to_the_one_it_shadows(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    code = ("import os, sys; print(os.environ.get('THEIRS_RAN'), "
            "any(type(f).__name__ == '_PostImportHook' and f.name == 'torch' for f in sys.meta_path))")
    proc = _trace(tmp_path, sys.executable, "-c", code, env={"PYTHONPATH": str(theirs)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "1 True"


def test_trace_missing_command(tmp_path: Path) -> None:
    proc = _trace(tmp_path, "/nonexistent/program")
    assert proc.returncode == 1 and "cannot run" in proc.stderr
