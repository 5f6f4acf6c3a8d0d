"""Slowdowns the tracer's example jobs can inject on one rank, as a user's own loop would have them.

The jobs (:mod:`.ddp_job`, :mod:`.fsdp_job`, :mod:`.pipeline_job`) know
nothing of Eroica; these are the faults their tests and benchmarks plant:
a slow input pipeline (``--slow-data-ms``: a sleep in the loader's collate,
as a slow disk or a busy decoder), and work in the training loop's own Python
that no traced call covers (``--slow-loop-ms``: a per-step metric or logging
routine that computes in pure Python after the optimizer step;
``--gap-ms``: a sleep between the forward and the backward).
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The slowdown options every example job takes (besides its own ``--slow-rank``)."""
    ap.add_argument("--slow-data-ms", type=float, default=0.0, help="extra time per batch in the slow rank's loader")
    ap.add_argument("--slow-loop-ms", type=float, default=0.0,
                    help="pure-Python work per step in the slow rank's loop, after the optimizer step")
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="a sleep per step between the slow rank's forward and its backward")


def spin(ms: float) -> None:
    """Busy Python for ``ms`` milliseconds (the interpreter's own work: no call into torch)."""
    if ms <= 0:
        return
    end = time.perf_counter() + ms / 1e3
    acc = 0
    while time.perf_counter() < end:
        acc += sum(i * i for i in range(200))


def pause(ms: float) -> None:
    """Sleep ``ms`` milliseconds (a host stall outside any traced call)."""
    if ms > 0:
        time.sleep(ms / 1e3)


def slow_collate(ms: float) -> Callable[[list[Any]], Any]:
    """A collate function that takes ``ms`` more per batch than torch's default."""
    import torch.utils.data

    def collate(items: list[Any]) -> Any:
        pause(ms)
        return torch.utils.data.default_collate(items)

    return collate
