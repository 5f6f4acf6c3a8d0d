"""A gloo job whose ranks use different subgroups, counting every call into torch's process groups.

For the test that the tracer never issues a collective of its own: a tracer
that asked a process group anything (to agree on a group name, to sync a
clock) would show up here as an extra call, or hang the job, since each
rank only calls into the groups it belongs to, in its own order. Four ranks:
``{0,1}`` and ``{2,3}`` (pairs), ``{0,2}`` and ``{1,3}`` (strided), ``{0,1,2}``
(created with ``use_local_synchronization``: rank 3 never calls into it) and
the world. Each rank runs ``--steps`` rounds of all_reduce / all_gather /
broadcast on its own groups (a different mix per rank), pipeline-style
``isend``/``irecv`` between the strided pairs, and a small model's
forward / backward / optimizer step.

``--count DIR`` wraps every public method of ``ProcessGroup`` (the C++
object behind all torch.distributed calls, whoever makes them) with a
counter and writes ``DIR/rank<R>.json``: calls per method and per group
(sorted global ranks).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

COUNTED = ("allreduce", "allreduce_coalesced", "allgather", "allgather_coalesced", "_allgather_base",
           "allgather_into_tensor_coalesced", "reduce_scatter", "_reduce_scatter_base",
           "reduce_scatter_tensor_coalesced", "broadcast", "barrier", "send", "recv", "recv_anysource",
           "reduce", "gather", "scatter", "alltoall", "alltoall_base", "monitored_barrier")


def count_process_group_calls() -> Counter:
    """Wrap ProcessGroup's communication methods with a counter (before any call is made)."""
    from torch._C._distributed_c10d import ProcessGroup

    counts: Counter = Counter()
    for name in COUNTED:
        orig = getattr(ProcessGroup, name, None)
        if orig is None:
            continue

        def make(name: str, orig):
            @functools.wraps(orig)
            def counted(self, *args, **kwargs):
                try:
                    members = ",".join(map(str, sorted(dist.get_process_group_ranks(self))))
                except Exception:
                    members = "?"
                counts[f"{name}@{members}"] += 1
                return orig(self, *args, **kwargs)
            return counted

        setattr(ProcessGroup, name, make(name, orig))
    return counts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--count", default=None, help="write per-rank call counts to this folder")
    args = ap.parse_args(argv)

    counts = count_process_group_calls() if args.count else Counter()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == 4, "this job is written for 4 ranks"
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    strided = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    trio = dist.new_group([0, 1, 2], use_local_synchronization=True) if rank < 3 else None
    my_pair, my_stride = pairs[rank // 2], strided[rank % 2]
    peer = rank ^ 2                       # the other member of my strided group

    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(8, 16)
        loss = model(x).square().mean()
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat, group=my_pair)
        if rank % 2 == 0:                 # even ranks gather on their strided group, odd ones broadcast
            out = [torch.empty(4) for _ in range(2)]
            dist.all_gather(out, torch.full((4,), float(rank)), group=my_stride)
        else:
            dist.broadcast(torch.full((4,), float(rank)), src=min(rank, peer), group=my_stride)
        if trio is not None and step % 3 == 0:
            dist.all_reduce(torch.ones(2), group=trio)
        send, recv = torch.full((64,), float(rank)), torch.empty(64)
        works = [dist.isend(send, dst=peer), dist.irecv(recv, src=peer)]
        for w in works:
            w.wait()
        assert recv[0].item() == peer
        opt.step()
        opt.zero_grad()
    dist.barrier()
    if args.count:
        out = Path(args.count)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}.json").write_text(json.dumps(dict(counts), sort_keys=True))
    del pairs, strided, trio, my_pair, my_stride
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
