"""A 2-stage pipeline-parallel job on gloo (CPU), hand-scheduled, with an optional slow rank.

Four processes: two pipelines of two stages (pp=2 x dp=2). Rank ``s * dp + d``
is stage ``s`` of pipeline ``d``; stage 0 holds the first half of the layers,
stage 1 the second half and the loss. Each step is a GPipe schedule over
``--micro`` micro-batches: stage 0 runs every forward and sends each
activation (``isend``); stage 1 receives each (``irecv`` + ``wait``) and runs
its forward and the loss; then, last micro-batch first, stage 1 runs each
backward and sends the activation's gradient back (``batch_isend_irecv`` and
blocking ``send``, alternately) and stage 0 receives it (blocking ``recv``)
and runs its backward. Then each stage's
two replicas average their gradients with an ``all_reduce`` on their own
data-parallel subgroup (``{0,1}`` or ``{2,3}``: ranks use different
subgroups), and step their optimizer.

Like :mod:`.ddp_job` it knows nothing of Eroica. ``--slow-rank R
--slow-factor F`` gives rank R's forward F times more compute (extra matrix
products whose results are discarded). Run it under torchrun::

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

PP = 2


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
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % PP:
        raise SystemExit(f"world size {world} is not a multiple of {PP} stages")
    dp = world // PP
    stage, replica = divmod(rank, dp)
    # every rank creates every subgroup (torch requires it); each then uses only its own
    dp_groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(PP)]
    my_dp = dp_groups[stage]
    nxt, prev = rank + dp, rank - dp      # the same replica's other stage
    slow = rank == args.slow_rank

    torch.manual_seed(args.seed + rank)
    model = Stage(args.width, args.depth, args.slow_factor if slow else 0.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed + replica)  # both stages of a pipeline see the same batches
    n = args.batch * args.micro * 16
    data = TensorDataset(torch.randn(n, args.width, generator=g), torch.randint(0, 10, (n,), generator=g))
    loader = DataLoader(data, batch_size=args.batch * args.micro, shuffle=False, drop_last=True)
    shape = (args.batch, args.width)

    step = 0
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            xs, ys = x.chunk(args.micro), y.chunk(args.micro)
            if stage == 0:
                outs, sends = [], []
                for xm in xs:
                    out = model(xm)
                    outs.append(out)
                    sends.append(dist.isend(out.detach(), dst=nxt))
                for w in sends:
                    w.wait()
                for out in reversed(outs):   # stage 1 sends the gradients last micro-batch first
                    grad = torch.empty(shape)
                    dist.recv(grad, src=nxt)
                    out.backward(grad)
            else:
                acts, losses = [], []
                for ym in ys:
                    act = torch.empty(shape)
                    dist.irecv(act, src=prev).wait()
                    act.requires_grad_(True)
                    acts.append(act)
                    losses.append(loss_fn(model(act)[:, :10], ym) / args.micro)
                for i in reversed(range(args.micro)):
                    losses[i].backward()
                    grad = acts[i].grad
                    if i % 2 == 0:
                        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, grad, prev)]):
                            w.wait()
                    else:
                        dist.send(grad, dst=prev)
            flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
            dist.all_reduce(flat, group=my_dp)
            flat /= dp
            offset = 0
            for p in model.parameters():
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
            step += 1
            if step >= args.steps:
                break

    dist.barrier()
    del model, opt, loader, dp_groups, my_dp
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
