"""Fault-injecting simulator of a synchronous GPU training job (telemetry-v1 output).

It models what a collector would record on a Megatron-style job (TP inside a
node, rail-aligned DP rings across nodes, optional GPipe pipeline) and injects
the faults of :mod:`.faults`, with ground truth for scoring a detector.

API::

    cfg = SimConfig(nodes=4, gpus=8, steps=40, faults=["gpu_throttle:rank=13"], seed=1)
    for records in generate(cfg): ...          # one list of contract dicts per step
    t = write_jsonl(cfg, "run.jsonl")          # + run.truth.json beside it; returns the truth
    t = truth(cfg)                             # the truth alone (runs the model, builds no records)

Records per rank per step, pp = 1 (tp > 1, dp > 1): 37 ``fn`` records --
13 fixed ones (the enclosing regions ``train_step``, ``model.forward``, ``model.backward``,
``clip_grad_norm_``, ``optimizer.step``; ``DataLoader.__next__``, ``Memcpy HtoD``,
the DP reduce-scatter, the grad-norm kernel, the world all-reduce, the Adam
kernel, the DP all-gather, ``Memcpy DtoH``), 12 in the forward pass (10
kernels, 2 TP all-reduces) and 12 in the backward pass (10 + 2); plus rare
noise records (rank 0's ``log_metrics`` every 10 steps, short ``gc.collect``).
Counters add, every ``sample_ms`` (500 ms), one ``gpu`` sample per rank, one
``nic`` sample per NIC (one NIC per GPU) and one ``host`` sample per node: with
a healthy step of ~0.70 s that is ~3.0 records per rank-step, ~40 in all.
So records ~= 40 * nodes * gpus * steps for a healthy run:
``--nodes 16 --gpus 8 --steps 200`` writes 1,029,137 records (about 1 s,
238 MB). Faults that slow steps add counter samples. With pp > 1 (GPipe,
2 microbatches by default) a rank has 42-46 fn records per step (about
12 + 16 * microbatches).

Profiles: all of the above is the ``default`` profile, the clean fleet.
``SimConfig(profile="realistic")`` (``eroica simulate --profile realistic``)
draws from the seed a fleet with the nuisances of real ones -- front-end,
management and virtual NICs, two GPU models, missing counter fields, clock
offsets, sampling gaps, counter resets, steps of 0.05-180 s, checkpoints,
evaluations, warm-up, jittery MoE layers, 1F1B / interleaved pipelines, FSDP
-- without changing the ground truth; see :mod:`.realistic`. Its truth adds
``profile`` and ``nuisances`` (what was drawn). The default profile's output is
byte-identical to what it was before profiles existed.
"""

from __future__ import annotations

import gzip
import os
import sys
from pathlib import Path
from typing import IO, Any, Iterator, TypedDict

import msgspec

from .config import DEFAULT_START_NS, Layout, SimConfig
from .engine import Simulation
from .faults import FAULTS, FaultError, FaultSpec, describe_faults, parse_fault

__all__ = [
    "SimConfig", "FaultSpec", "FaultError", "FAULTS", "Layout", "Simulation", "Truth", "DEFAULT_START_NS",
    "parse_fault", "describe_faults", "generate", "write_jsonl", "truth", "truth_path_for", "dump_truth",
]


class Truth(TypedDict, total=False):
    """Ground truth of a run (see README / module docstring)."""

    job: str
    seed: int
    layout: dict[str, Any]
    healthy: bool
    faults: list[dict[str, Any]]
    steps_run: int
    start_ns: int
    end_ns: int
    step_start_ns: list[int]
    sample_ns: int
    hang_cut_ns: int | None
    noise: dict[str, Any]
    records: int


def generate(cfg: SimConfig) -> Iterator[list[dict]]:
    """Yield the run's contract records, one list per step (the ``job`` record first)."""
    yield from Simulation(cfg).steps()


def truth(cfg: SimConfig) -> dict:
    """The ground truth of ``cfg`` without building records (same numbers as :func:`write_jsonl`)."""
    return Simulation(cfg).truth()


def truth_path_for(path: str | os.PathLike) -> Path:
    """``run.jsonl`` / ``run.jsonl.gz`` / ``run.json`` -> ``run.truth.json``."""
    p = Path(path)
    name = p.name
    for suffix in (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".gz"):
        if name.endswith(suffix):
            return p.with_name(name[: -len(suffix)] + ".truth.json")
    return p.with_name(name + ".truth.json")


def write_jsonl(cfg: SimConfig, path: str | os.PathLike | IO[bytes],
                truth_path: str | os.PathLike | bool | None = True) -> Truth:
    """Write the run as JSON Lines (``-`` = stdout, ``.gz`` = gzip) and return its truth.

    ``truth_path``: True writes ``<run>.truth.json`` beside a file path (nothing
    for stdout or a stream), a path writes it there, False/None writes none.
    """
    sim = Simulation(cfg)
    enc = msgspec.json.Encoder()
    close = None
    if hasattr(path, "write"):
        out = path  # type: ignore[assignment]
    elif str(path) == "-":
        out = sys.stdout.buffer
    elif str(path).endswith(".gz"):
        out = close = gzip.open(path, "wb", compresslevel=3)
    else:
        out = close = open(path, "wb", buffering=1 << 20)
    try:
        for recs in sim.steps():
            out.write(enc.encode_lines(recs))
        out.flush()
    finally:
        if close is not None:
            close.close()
    t: Truth = sim.truth()  # type: ignore[assignment]
    if truth_path is True:
        target = None if hasattr(path, "write") or str(path) == "-" else truth_path_for(path)  # type: ignore[arg-type]
    elif truth_path:
        target = Path(truth_path)  # type: ignore[arg-type]
    else:
        target = None
    if target is not None:
        target.write_bytes(dump_truth(t))
    return t


def dump_truth(t: dict) -> bytes:
    """Truth as JSON: one top-level key (and one fault) per line, lists kept on one line."""
    enc = msgspec.json.encode
    parts = []
    for k, v in t.items():
        if k == "faults" and v:
            body = "[\n  " + ",\n  ".join(enc(f).decode() for f in v) + "\n ]"
        else:
            body = enc(v).decode()
        parts.append(f" {enc(k).decode()}: {body}")
    return ("{\n" + ",\n".join(parts) + "\n}\n").encode()
