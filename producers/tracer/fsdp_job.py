"""A small FSDP job on gloo (CPU), with either FSDP API, and an optional slow rank.

``--api fsdp1`` wraps each block, then the whole model, in
``FullyShardedDataParallel``; ``--api fsdp2`` applies ``fully_shard`` to each
block, then to the model. Either way every block is an FSDP unit: its
parameters are all-gathered before its forward (and again before its
backward) and its gradients reduce-scattered after its backward. Like
:mod:`.ddp_job` it knows nothing of Eroica; ``--slow-rank R --slow-factor F``
gives rank R's forward F times more compute (extra matrix products beside the
model's own, whose results are discarded); the options of :mod:`.job_faults`
plant its other slowdowns on that rank. Run it under torchrun::

    torchrun --standalone --nproc-per-node 4 -m eroica.producers.tracer.fsdp_job --api fsdp2 --steps 100 \\
        --slow-rank 2 --slow-factor 3
"""

from __future__ import annotations

import argparse
import gc
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

from eroica.producers.tracer import job_faults


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self, width: int, depth: int, extra: float = 0.0) -> None:
        super().__init__()
        self.inp = nn.Linear(64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.out = nn.Linear(width, 10)
        self.extra = extra
        self.burn = torch.randn(width, width)  # a plain tensor: not a parameter, not sharded

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for b in self.blocks:
            h = b(h)
        if self.extra > 0:
            with torch.no_grad():
                z = torch.randn(x.shape[0], self.burn.shape[0])
                for _ in range(int(round(self.extra * (len(self.blocks) + 2)))):
                    z = torch.relu(z @ self.burn)
        return self.out(h)


def shard(model: Net, api: str) -> nn.Module:
    if api == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        cpu = torch.device("cpu")  # FSDP looks for an accelerator unless told

        for i, b in enumerate(model.blocks):
            model.blocks[i] = FSDP(b, use_orig_params=True, device_id=cpu)
        return FSDP(model, use_orig_params=True, device_id=cpu)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for b in model.blocks:
        fully_shard(b, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--api", choices=("fsdp1", "fsdp2"), default="fsdp2")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-factor", type=float, default=0.0, help="extra forward compute on the slow rank")
    ap.add_argument("--seed", type=int, default=0)
    job_faults.add_arguments(ap)
    args = ap.parse_args(argv)

    warnings.filterwarnings("ignore")  # FSDP warns about CPU use at every wrap
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)      # the same initial weights on every rank
    model = shard(Net(args.width, args.depth, args.slow_factor if rank == args.slow_rank else 0.0), args.api)
    torch.manual_seed(args.seed + rank)
    n = args.batch * 32
    data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
    slow = rank == args.slow_rank
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True,
                        collate_fn=job_faults.slow_collate(args.slow_data_ms if slow else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    step = 0
    while step < args.steps:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            job_faults.pause(args.gap_ms if slow else 0.0)
            loss.backward()
            opt.step()
            job_faults.spin(args.slow_loop_ms if slow else 0.0)
            step += 1
            if step >= args.steps:
                break
    dist.barrier()
    del model, opt, loader
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
