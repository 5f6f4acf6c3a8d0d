"""The torch instrumentation in real (single-process) torch programs.

Each scenario runs in its own interpreter: patching torch is process-wide and
must not leak into other tests.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from eroica.models.records import UNTRACED_FN

pytest.importorskip("torch")

COMMON = """
import os, sys, torch, torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from eroica.producers import tracer as T
torch.manual_seed(0)
torch.set_num_threads(1)

class Net(nn.Module):
    def __init__(self, bn=False):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.b = nn.Linear(16, 4)
    def forward(self, x):
        with T.span("inner"):
            h = torch.relu(self.bn(self.a(x)))
        return self.b(h)

def loader():
    return DataLoader(TensorDataset(torch.randn(40, 8), torch.randint(0, 4, (40,))), batch_size=8)
"""


def run(tmp_path: Path, body: str, *, env: dict | None = None, timeout: float = 120) -> list[dict]:
    script = tmp_path / "prog.py"
    script.write_text(COMMON + textwrap.dedent(body))
    out = tmp_path / "trace"
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "EROICA_TRACE_DIR": str(out), "EROICA_JOB": "t", **(env or {})})
    assert proc.returncode == 0, proc.stderr
    assert "could not instrument" not in proc.stderr and "tracing off" not in proc.stderr, proc.stderr
    return [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]


def test_training_loop_is_traced_with_steps(tmp_path: Path) -> None:
    recs = run(tmp_path, """
        T.instrument()
        model, loss_fn = Net(), nn.CrossEntropyLoss()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader():            # 5 batches: 3 learning steps, then per-instance hooks
            opt.zero_grad()
            loss_fn(model(x), y).backward()
            opt.step()
        with torch.no_grad():
            model(torch.randn(2, 8))     # evaluation: a forward, no backward
    """)
    counts = Counter((r["fn"], r["kind"]) for r in recs)
    assert counts[("DataLoader.__next__", "dataloader")] == 5  # the StopIteration call is no fetch
    assert counts[("SGD.step", "optimizer")] == 5
    assert counts[("Net.forward", "python")] == 6
    assert counts[("Net.backward", "python")] == 5
    assert counts[("inner", "python")] == 6
    assert not any("CrossEntropyLoss" in r["fn"] for r in recs)  # no parameters: not a top-level model
    for step in range(5):
        fns = [r["fn"] for r in sorted(recs, key=lambda r: r["ts_ns"])
               if r["step"] == step and r["fn"] not in ("inner", UNTRACED_FN)]
        assert fns[:4] == ["DataLoader.__next__", "Net.forward", "Net.backward", "SGD.step"], (step, fns)
    # the loss between forward and backward, zero_grad and the loop itself run in no traced call
    gaps = [r for r in recs if r["fn"] == UNTRACED_FN]
    assert {r["step"] for r in gaps} >= set(range(1, 5)) and all(r["kind"] == "python" for r in gaps)
    inner = [r for r in recs if r["fn"] == "inner"]
    assert all(r["stack"] == "Net.forward;inner" for r in inner)
    fwd = {r["step"]: r for r in recs if r["fn"] == "Net.forward"}
    bwd = {r["step"]: r for r in recs if r["fn"] == "Net.backward"}
    assert all(bwd[s]["ts_ns"] >= fwd[s]["ts_ns"] + fwd[s]["dur_ns"] for s in bwd)
    assert all(r["job"] == "t" and r["rank"] == 0 for r in recs)


def test_collectives_and_ddp_gradient_all_reduces(tmp_path: Path) -> None:
    recs = run(tmp_path, f"""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        T.instrument()
        dist.init_process_group("gloo", init_method="file://{tmp_path}/store", rank=0, world_size=1)
        t = torch.ones(1000)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.broadcast(t, src=0)
        dist.all_gather([torch.empty(1000)], t)
        dist.barrier()
        sub = dist.new_group([0])
        dist.all_reduce(t, group=sub)
        model = DDP(Net(bn=True))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader():
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        calls = []
        def my_hook(state, bucket):
            calls.append(bucket.buffer().numel())
            fut = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        mine = DDP(Net())
        mine.register_comm_hook(None, my_hook)
        nn.functional.cross_entropy(mine(torch.randn(8, 8)), torch.randint(0, 4, (8,))).backward()
        assert calls, "the user's hook must still run"
        dist.destroy_process_group()
    """)
    coll = [r for r in recs if r["kind"] == "collective"]
    by_fn = Counter(r["fn"] for r in coll)
    assert by_fn["torch.distributed.all_reduce"] == 3
    assert by_fn["torch.distributed.broadcast"] == 1 and by_fn["torch.distributed.all_gather"] == 1
    assert by_fn["torch.distributed.barrier"] == 1
    ar = [r for r in coll if r["fn"] == "torch.distributed.all_reduce"]
    assert all(r["op"] == "all_reduce" and r["bytes"] == 4000 for r in ar)
    # named after the sorted global ranks: the one-rank world and its one-rank subgroup alike
    assert ar[0]["group"] == "ranks:0" and ar[2]["group"] == "ranks:0"
    ddp = [r for r in coll if r["fn"] == "DDP.all_reduce"]
    n_params = 8 * 16 + 16 + 16 * 4 + 4 + 16 + 16  # with BatchNorm's weight and bias
    assert len(ddp) >= 6 and all(r["op"] == "all_reduce" and r["group"] == "ranks:0" for r in ddp)
    assert sum(r["bytes"] for r in ddp if r["step"] == 1) == n_params * 4
    bufs = [r for r in coll if r["fn"] == "DDP.broadcast_buffers"]
    assert len(bufs) == 5 and all(r["op"] == "broadcast" and r["bytes"] > 0 for r in bufs)
    assert Counter(r["step"] for r in ddp)[4] >= 1  # gradient all-reduces belong to their step
    assert [r for r in recs if r["fn"] == "Net.forward"]  # the DDP wrapper is named after its module


def test_explicit_instrumentation_only_what_is_given(tmp_path: Path) -> None:
    recs = run(tmp_path, """
        model, other = Net(), Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        other_opt = torch.optim.SGD(other.parameters(), lr=0.1)
        dl = loader()
        T.instrument(model=model, optimizer=opt, dataloader=dl)
        for x, y in dl:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            other(x).sum().backward()
            other_opt.step()
        for x, y in loader():   # another loader: not instrumented
            pass
    """)
    counts = Counter(r["fn"] for r in recs)
    assert counts["DataLoader.__next__"] == 5 and counts["SGD.step"] == 5
    assert counts["Net.forward"] == 5 and counts["Net.backward"] == 5
    assert sorted({r["step"] for r in recs}) == [0, 1, 2, 3, 4]


def test_tracing_off_without_torch_import(tmp_path: Path) -> None:
    """The import hook touches nothing until torch is imported; a torch-free program writes nothing."""
    out = tmp_path / "trace"
    from eroica.producers.tracer.bootstrap import write_site_dir

    site = write_site_dir(tmp_path / "site")
    proc = subprocess.run([sys.executable, "-c", "import json; print('ok')"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(site), "EROICA_TRACE_DIR": str(out)}, timeout=60)
    assert proc.stdout == "ok\n" and proc.stderr == "" and not out.exists()


def test_sigterm_dumps_open_spans_in_flight(tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text(COMMON + textwrap.dedent("""
        import time
        T.instrument()
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        with T.span("stuck_here", kind="io"):
            print("ready", flush=True)
            time.sleep(120)
    """))
    out = tmp_path / "trace"
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "EROICA_TRACE_DIR": str(out), "EROICA_JOB": "t"})
    assert proc.stdout.readline() == "ready\n"
    time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGTERM  # still dies of SIGTERM, as without Eroica
    recs = [json.loads(line) for f in out.glob("*.jsonl") for line in f.read_text().splitlines()]
    stuck = [r for r in recs if r["fn"] == "stuck_here"]
    assert len(stuck) == 1 and stuck[0]["in_flight"] is True and stuck[0]["kind"] == "io"
    assert stuck[0]["dur_ns"] >= 150_000_000
    assert any(r["fn"] == "SGD.step" for r in recs)


def test_cuda_timer_resolves_events_against_an_anchor() -> None:
    """The CUDA path with stand-in events (no GPU here): ordering, anchoring, pending bound."""
    from types import SimpleNamespace

    from eroica.producers.tracer import cuda_timing

    clock = {"gpu_ms": 0.0}

    class Event:
        def __init__(self, enable_timing=False):
            self.t = None

        def record(self, stream=None):
            self.t = clock["gpu_ms"]

        def query(self):
            return self.t is not None and self.t <= clock["gpu_ms"] - 1.0  # finished 1 ms after recording

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return other.t - self.t

    class Ctx:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    cuda = SimpleNamespace(Event=Event, Stream=lambda device=None: object(), stream=lambda s: Ctx(),
                           current_device=lambda: 0)
    timer = cuda_timing.CudaTimer(SimpleNamespace(cuda=cuda))
    anchor_ns = timer._anchor[1]
    emitted = []
    sink = SimpleNamespace(emit=lambda *a: emitted.append(a))
    clock["gpu_ms"] = 10.0
    assert timer.oldest_open_ns() is None
    before = time.time_ns()
    ev = timer.start()
    started = timer.oldest_open_ns()
    assert started is not None and started >= before  # a started region holds the watermark ...
    clock["gpu_ms"] = 14.5
    timer.stop(ev, "Net.forward", "kernel", 3)
    assert timer.resolve(sink) == 0  # not finished on the GPU yet: never waited for
    assert timer.oldest_open_ns() == started  # ... and so does a stopped one until it is resolved
    clock["gpu_ms"] = 20.0
    assert timer.resolve(sink) == 1
    assert timer.oldest_open_ns() is None
    fn, kind, ts, dur, step, extra = emitted[0]
    assert (fn, kind, step, dur) == ("Net.forward[gpu]", "kernel", 3, 4_500_000)
    assert ts == anchor_ns + 10_000_000
    # a resolved pair's events are recorded again by the next region, not created anew
    made = len(timer.free)
    assert made == 2
    ev2 = timer.start()
    clock["gpu_ms"] = 22.0
    timer.stop(ev2, "Net.forward", "kernel", 4)
    assert not timer.free and timer.pending[0][0] is ev2
    clock["gpu_ms"] = 30.0
    assert timer.resolve(sink) == 1 and emitted[1][3] == 2_000_000 and emitted[1][2] == anchor_ns + 20_000_000
    timer.pool_max = 0  # a full pool keeps no more
    ev3 = timer.start()
    timer.stop(ev3, "Net.forward", "kernel", 5)
    clock["gpu_ms"] = 40.0
    assert timer.resolve(sink) == 1 and len(timer.free) == 0


DDP_LOOP = """
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="file://{store}", rank=0, world_size=1)
{setup}
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader():
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("setup", [
    # the API called after the job built its DDP model: its all-reduces are still timed
    "model = DDP(Net())\nT.instrument()",
    # a model instrumented explicitly, then wrapped by DDP: one forward per step, not two
    "net = Net()\nT.instrument(model=net)\nmodel = DDP(net)",
])
def test_ddp_built_before_or_around_instrumentation(tmp_path: Path, setup: str) -> None:
    recs = run(tmp_path, DDP_LOOP.format(store=tmp_path / "store", setup=setup))
    counts = Counter(r["fn"] for r in recs)
    assert counts["Net.forward"] == 5 and counts["Net.backward"] == 5
    assert counts["DDP.all_reduce"] >= 5
    assert all(r["group"] == "ranks:0" for r in recs if r["fn"] == "DDP.all_reduce")


P2P_PAIR = """
import sys, torch, torch.distributed as dist
from eroica.producers import tracer as T
T.instrument()
rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://{store}", rank=rank, world_size=2)
t = torch.full((256,), float(rank))
if rank == 0:
    dist.send(t, dst=1)                       # blocking
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1)])
    assert len(works) == 1 and works[0].wait()
    dist.isend(t, dst=1).wait()
    keep = t.clone()
    w = dist.isend(keep, dst=1)               # never waited for: its end is never seen, no record
else:
    assert dist.recv(t) == 0                  # from any source: the peer is learnt at the end
    dist.irecv(t, src=0).wait()
    dist.irecv(t).wait()                      # any source, async
    dist.recv(t, src=0)
dist.barrier()                                # rank 1 has the last message: the send is over
if rank == 0:
    del w                                     # dropped without a wait
dist.destroy_process_group()
"""


def test_point_to_point_records_peer_bytes_and_only_waited_transfers(tmp_path: Path) -> None:
    script = tmp_path / "pair.py"
    script.write_text(P2P_PAIR.format(store=tmp_path / "store"))
    out = tmp_path / "trace"
    env = {**os.environ, "EROICA_TRACE_DIR": str(out), "EROICA_JOB": "t"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r)], stderr=subprocess.PIPE, text=True,
                              env={**env, "RANK": str(r), "WORLD_SIZE": "2"}) for r in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    recs = [json.loads(line) for f in sorted(out.glob("*.jsonl")) for line in f.read_text().splitlines()]
    p2p = sorted((r for r in recs if r.get("op") in ("send", "recv")), key=lambda r: (r["rank"], r["ts_ns"]))
    assert all(r["group"] == "p2p:0,1" and r["bytes"] == 1024 and r["kind"] == "collective" for r in p2p), p2p
    assert [(r["rank"], r["fn"].rsplit(".", 1)[1]) for r in p2p] == [
        (0, "send"), (0, "isend"), (0, "isend"),          # the dropped isend made no record
        (1, "recv"), (1, "irecv"), (1, "irecv"), (1, "recv"),
    ]
    assert all(r["op"] == ("send" if r["rank"] == 0 else "recv") for r in p2p)
