"""A small DistributedDataParallel job on gloo (CPU) with an optional slow rank.

Used by the tracer's end-to-end test and by the overhead benchmark; it knows
nothing of Eroica (that is the point: ``eroica trace`` must find the slow
rank without any change here). Run it under torchrun::

    torchrun --standalone --nproc-per-node 4 -m eroica.producers.tracer.ddp_job --seconds 10 \\
        --slow-rank 2 --slow-factor 1.5

``--slow-rank R --slow-factor F`` makes rank R's forward do F times more
compute (extra matrix products beside the model's own, whose results are
discarded), the way one rank with a slower chip or a busier CPU would;
``--slow-data-ms``, ``--slow-loop-ms``, ``--gap-ms`` plant the slowdowns of
:mod:`.job_faults` (its loader, its loop's own Python, a pause) on that rank;
``--slow-backward F`` gives its *backward* F times the model's products
more, between the first layer and the rest: with ``--bucket-mb`` small,
the all-reduces of the later layers' buckets run while it computes (DDP's
overlap), the case where a slow rank's compute hides behind communication.
``--stats FILE`` (rank 0) writes the per-step wall times as JSON.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from eroica.producers.tracer import job_faults


class _BurnInBackward(torch.autograd.Function):
    """Identity forward; a backward that also does ``n`` width x width products (results discarded)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, burn: torch.Tensor, n: int) -> torch.Tensor:
        ctx.burn, ctx.n = burn, n
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        h = torch.randn(grad.shape[0], ctx.burn.shape[0])
        for _ in range(ctx.n):
            h = torch.relu(h @ ctx.burn)
        return grad, None, None


class Net(nn.Module):
    def __init__(self, width: int, depth: int, extra: float = 0.0, extra_backward: float = 0.0) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        layers.append(nn.Linear(width, 10))
        self.body = nn.Sequential(*layers)
        self.extra = extra
        self.extra_backward = int(round(extra_backward * (len(self.body) // 2)))
        self.burn = torch.randn(width, width)  # a plain tensor: not a parameter, not a buffer DDP syncs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_backward:
            h = self.body[0](x)
            h = _BurnInBackward.apply(h, self.burn, self.extra_backward)
            out = self.body[1:](h)
        else:
            out = self.body(x)
        if self.extra > 0:
            # The slow rank's extra work: `extra` times as many width x width products as the model has.
            with torch.no_grad():
                h = torch.randn(x.shape[0], self.burn.shape[0])
                whole, frac = divmod(self.extra * (len(self.body) // 2), 1.0)
                for _ in range(int(whole) + (1 if torch.rand(()) < frac else 0)):
                    h = torch.relu(h @ self.burn)
        return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=None, help="train this long (rank 0 decides when to stop)")
    ap.add_argument("--steps", type=int, default=200, help="train this many steps (without --seconds)")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=float, default=0.0, help="extra forward compute on the slow rank")
    job_faults.add_arguments(ap)
    ap.add_argument("--slow-backward", type=float, default=0.0, help="extra backward compute on the slow rank")
    ap.add_argument("--bucket-mb", type=float, default=25.0, help="DDP's gradient bucket size (MB)")
    ap.add_argument("--stats", default=None, help="rank 0 writes step times here (JSON)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--python-comm-hook", action="store_true",
                    help="register torch's Python all-reduce hook (what the tracer's timed hook wraps), to "
                         "separate its cost from the tracer's")
    ap.add_argument("--cpu-from-step", type=int, default=0,
                    help="measure each rank's CPU time (all its threads) from this step on; reported in --stats")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed + rank)
    n = args.batch * 64
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    slow = rank == args.slow_rank
    # the slow rank's input pipeline takes longer per batch (a slow disk, a busy decoder)
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                        collate_fn=job_faults.slow_collate(args.slow_data_ms if slow else 0.0))
    model = DDP(Net(args.width, args.depth, args.slow_factor if slow else 0.0, args.slow_backward if slow else 0.0),
                bucket_cap_mb=args.bucket_mb)
    if args.python_comm_hook:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        model.register_comm_hook(None, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    step_times: list[float] = []
    start = last = time.perf_counter()
    step = 0
    cpu_start = time.process_time()
    stop = torch.zeros(1)
    while True:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            job_faults.pause(args.gap_ms if slow else 0.0)
            loss.backward()
            opt.step()
            job_faults.spin(args.slow_loop_ms if slow else 0.0)
            now = time.perf_counter()
            step_times.append(now - last)
            last = now
            step += 1
            if step == args.cpu_from_step:
                cpu_start = time.process_time()
            if args.seconds is not None:
                # every rank must agree when to stop: rank 0 decides, one small all-reduce tells all
                stop.fill_(1.0 if rank == 0 and now - start >= args.seconds else 0.0)
                dist.all_reduce(stop)
                done = bool(stop.item())
            else:
                done = step >= args.steps
            if done:
                break
        else:
            continue
        break

    # CPU seconds per step of each rank's process over the measured steps, averaged over ranks
    cpu = torch.tensor([(time.process_time() - cpu_start) / max(1, step - args.cpu_from_step)], dtype=torch.float64)
    dist.all_reduce(cpu)
    if rank == 0 and args.stats:
        with open(args.stats, "w") as fh:
            json.dump({"world_size": world, "steps": step, "step_times": step_times,
                       "cpu_per_step_s": float(cpu) / world,
                       "seconds": time.perf_counter() - start, "pid": os.getpid()}, fh)
    dist.barrier()
    # Drop every holder of the process group (the DDP reducer, its buckets) while the interpreter is
    # whole: gloo's worker threads torn down at interpreter exit can abort the process (SIGABRT).
    del model, opt, loader
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
