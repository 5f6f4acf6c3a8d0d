"""A pipeline-parallel job on gloo (CPU), hand-scheduled, with an optional slow rank.

``--pp`` stages (default 2) times dp replicas: with four processes, two
pipelines of two stages (pp=2 x dp=2) or one of four (``--pp 4``). Rank
``s * dp + d`` is stage ``s`` of pipeline ``d``; each stage holds ``--depth``
layers, the last one also the loss. Each step is a GPipe schedule over
``--micro`` micro-batches: every stage but the first receives each
activation (``irecv`` + ``wait``), runs its forward and, but the last, sends
its output on (``isend``); then, last micro-batch first, the last stage runs
each backward and the others receive the gradient (blocking ``recv``), run
their backward and send their input's gradient back (``batch_isend_irecv``
and blocking ``send``, alternately). Then each stage's replicas average
their gradients with an ``all_reduce`` on their own data-parallel subgroup
(``{0,1}`` or ``{2,3}`` at pp=2: ranks use different subgroups), and step
their optimizer.

Like :mod:`.ddp_job` it knows nothing of Eroica. ``--slow-rank R
--slow-factor F`` gives rank R's forward F times more compute (extra matrix
products whose results are discarded); the options of :mod:`.job_faults`
plant its other slowdowns on that rank. Run it under torchrun::

    torchrun --standalone --nproc-per-node 4 -m eroica.producers.tracer.pipeline_job --steps 100 \\
        --slow-rank 1 --slow-factor 3
"""

from __future__ import annotations

import argparse
import gc

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from eroica.producers.tracer import job_faults


class Stage(nn.Module):
    """Half of the model: ``depth`` width x width layers (both stages alike, so their ranks compare)."""

    def __init__(self, width: int, depth: int, extra: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.body = nn.Sequential(*layers)
        self.extra = extra
        self.burn = torch.randn(width, width)  # not a parameter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.body(x)
        if self.extra > 0:
            with torch.no_grad():
                h = torch.randn(x.shape[0], self.burn.shape[0])
                for _ in range(int(round(self.extra * len(self.body) // 2))):
                    h = torch.relu(h @ self.burn)
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--micro", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--batch", type=int, default=32, help="micro-batch size")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3, help="layers per stage")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=float, default=0.0, help="extra forward compute on the slow rank")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages (the world size is pp x dp)")
    job_faults.add_arguments(ap)
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pp = args.pp
    if world % pp:
        raise SystemExit(f"world size {world} is not a multiple of {pp} stages")
    dp = world // pp
    stage, replica = divmod(rank, dp)
    first, last = stage == 0, stage == pp - 1
    # every rank creates every subgroup (torch requires it); each then uses only its own
    dp_groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(pp)]
    my_dp = dp_groups[stage]
    nxt, prev = rank + dp, rank - dp      # the same replica's next and previous stage
    slow = rank == args.slow_rank

    torch.manual_seed(args.seed + rank)
    model = Stage(args.width, args.depth, args.slow_factor if slow else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed + replica)  # every stage of a pipeline sees the same batches
    n = args.batch * args.micro * 16
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=args.batch * args.micro, shuffle=False, drop_last=True,
                        collate_fn=job_faults.slow_collate(args.slow_data_ms if slow else 0.0))
    shape = (args.batch, args.width)

    step = 0
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            xs, ys = x.chunk(args.micro), y.chunk(args.micro)
            ins, outs, sends = [], [], []
            for xm, ym in zip(xs, ys):     # forwards: receive, compute, send on
                if first:
                    act = xm
                else:
                    act = torch.empty(shape)
                    dist.irecv(act, src=prev).wait()
                    act.requires_grad_(True)
                ins.append(act)
                out = model(act)
                if last:
                    out = loss_fn(out[:, :10], ym) / args.micro
                else:
                    sends.append(dist.isend(out.detach(), dst=nxt))
                outs.append(out)
            for w in sends:
                w.wait()
            job_faults.pause(args.gap_ms if slow else 0.0)
            for i in reversed(range(args.micro)):   # backwards, last micro-batch first
                if last:
                    outs[i].backward()
                else:
                    grad = torch.empty(shape)
                    dist.recv(grad, src=nxt)
                    outs[i].backward(grad)
                if not first:
                    if i % 2 == 0:
                        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, ins[i].grad, prev)]):
                            w.wait()
                    else:
                        dist.send(ins[i].grad, dst=prev)
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=my_dp)
            flat /= dp
            offset = 0
            for p in model.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
            job_faults.spin(args.slow_loop_ms if slow else 0.0)
            step += 1
            if step >= args.steps:
                break

    dist.barrier()
    del model, opt, loader, dp_groups, my_dp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
