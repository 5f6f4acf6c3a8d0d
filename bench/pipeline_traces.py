"""Simulated pipeline-parallel jobs as per-operation tables (the OSDI'25 straggler study's format).

Why: ``eroica whatif`` must price stragglers on pipelines of any shape, and
the study's reference analyzer (``../shared/reference/straggler-whatif``)
gives the published S of any table in its format. This module makes such
tables with known culprits, executed on their real dependencies, so that the
two can be compared on many shapes (``eroica bench cost --reference``).

The job: ``pp`` stages x ``dp`` replicas, rank = ``stage * dp + dp_rank``
(Megatron's order with tp = 1). Each step, every rank runs

* ``params-all-gather`` over its stage's data-parallel group;
* its pipeline schedule (``1f1b``: Megatron's non-interleaved one-forward-
  one-backward; ``interleaved``: Megatron's interleaved 1F1B over ``vpp``
  model chunks per rank; ``gpipe``: all forwards, then all backwards), each
  compute op with its point-to-point ops: ``forward-recv`` before a forward
  of a stage > 0 and ``forward-send`` after one of a stage < pp - 1,
  ``backward-recv`` / ``backward-send`` the other way round;
* ``grads-reduce-scatter`` over its stage's data-parallel group, then
  ``optimizer``.

Execution (:func:`execute`): each rank runs its ops in its own order, one at a
time, after a launch gap (``LAUNCH_S``); a point-to-point op ends its transfer
(``P2P_S``) after both it and its partner (the matching op of the adjacent
virtual stage: same micro-batch) have started, except an asynchronous send
(interleaved, GPipe), which ends its transfer after it started; a recv and a
send issued together (1F1B's batched calls) end together; a collective ends
its transfer time after the last member started. So a forward of
micro-batch m on stage s starts after stage s - 1's forward of m ended
(through the send / recv pair), a backward of m after stage s + 1's backward
of m, and a collective waits for its slowest member: the timestamps are those
of the schedule, not drawn.

Culprits (:data:`CULPRITS`), multiplying the compute durations (or a
collective's transfer): ``worker`` (one rank), ``stage`` (every rank of one
stage: too many layers), ``mb_imbalance`` (per micro-batch and data-parallel
rank, e.g. sequence lengths: a DP collective waits for the slowest), ``dp_group``
(every rank of one replica), ``collective`` (one stage's DP collectives),
``several`` (a worker and a stage). Everything is drawn from ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SCHEDULES = ("1f1b", "interleaved", "gpipe")
CULPRITS = ("worker", "stage", "mb_imbalance", "dp_group", "collective", "several")
# a point-to-point transfer of one activation (s): small against a compute op, as on NVLink / RDMA
P2P_S = 0.0008
# launch gap between a rank's consecutive ops (s): the host's kernel launch, not a straggler
LAUNCH_S = 0.00005
# run-to-run noise of an op's duration (lognormal sigma): a healthy job's jitter, well below any culprit
JITTER = 0.02


@dataclass(frozen=True)
class TraceSpec:
    """One simulated job: its shape, schedule and culprit (``factor``: how much slower the culprit is)."""

    pp: int
    dp: int
    mb: int
    schedule: str
    culprit: str
    seed: int
    factor: float = 2.0
    vpp: int = 1
    steps: int = 3

    @property
    def name(self) -> str:
        v = f"x{self.vpp}" if self.vpp > 1 else ""
        return f"pp{self.pp}{v}-dp{self.dp}-mb{self.mb}-{self.schedule}-{self.culprit}-s{self.seed}"


@dataclass
class _Op:
    """One operation of a rank's step (``key``: what its partner matches on; ``coll``: collective id)."""

    optype: str
    mb: int = -1
    chunk: int = 0
    dur: float = 0.0
    coll: tuple[Any, ...] | None = None
    partner: tuple[Any, ...] | None = None
    start: float = float("nan")
    end: float = float("nan")
    slot: int = 0
    eager: bool = False


def schedule_order(schedule: str, pp: int, stage: int, mb: int, vpp: int = 1) -> list[tuple[str, int, int]]:
    """The compute ops of one stage in the order it runs them: ``(F|B, micro-batch, model chunk)``.

    Megatron's schedules: 1F1B warms up with ``pp - stage - 1`` forwards, then
    alternates one forward and one backward, then cools down; interleaved does
    the same over ``mb * vpp`` virtual micro-batches (groups of ``pp``, chunk
    by chunk) with a warm-up of ``2 * (pp - stage - 1) + (vpp - 1) * pp``.
    """
    if schedule == "gpipe":
        return [("F", m, 0) for m in range(mb)] + [("B", m, 0) for m in range(mb)]
    if schedule == "1f1b":
        vpp = 1
    total = mb * vpp

    def fwd(k: int) -> tuple[str, int, int]:
        group, pos = divmod(k, pp * vpp)
        return "F", group * pp + pos % pp, (pos // pp) % vpp

    def bwd(k: int) -> tuple[str, int, int]:
        group, pos = divmod(k, pp * vpp)
        return "B", group * pp + pos % pp, vpp - 1 - (pos // pp) % vpp

    if vpp == 1:
        warm = min(pp - stage - 1, total)
    else:
        warm = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)
    out = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        out += [fwd(warm + k), bwd(k)]
    out += [bwd(k) for k in range(total - warm, total)]
    return out


def _ops_of(spec: TraceSpec, stage: int, d: int) -> list[_Op]:
    """One rank's ops of a step, in order, without durations (``slot``: ops sharing one are issued together).

    1F1B: a send after a compute op and the recv of the other direction
    before the next one are one batched call, as Megatron issues them
    (``send_forward_recv_backward``...): two blocking sends facing each other
    would deadlock. Interleaved and GPipe send asynchronously (``eager``: a
    send does not wait for its receiver, a recv waits for its send), each op
    alone, so that no schedule order can deadlock.
    """
    pp, vpp = spec.pp, (spec.vpp if spec.schedule == "interleaved" else 1)
    last = pp * vpp - 1
    blocks: list[tuple[_Op | None, _Op, _Op | None]] = []
    for kind, m, c in schedule_order(spec.schedule, pp, stage, spec.mb, vpp):
        virt = c * pp + stage                       # position in the virtual pipeline
        # interleaved: every compute op has its recv and send, a no-op (no partner) at either end of the
        # virtual pipeline, as Megatron records them
        noop = vpp > 1
        if kind == "F":
            pre = (_Op("forward-recv", m, c, partner=("F", m, virt - 1, d) if virt > 0 else None)
                   if virt > 0 or noop else None)
            post = (_Op("forward-send", m, c, partner=("F", m, virt, d) if virt < last else None)
                    if virt < last or noop else None)
            blocks.append((pre, _Op("forward-compute", m, c), post))
        else:
            pre = (_Op("backward-recv", m, c, partner=("B", m, virt, d) if virt < last else None)
                   if virt < last or noop else None)
            post = (_Op("backward-send", m, c, partner=("B", m, virt - 1, d) if virt > 0 else None)
                    if virt > 0 or noop else None)
            blocks.append((pre, _Op("backward-compute", m, c), post))
    ops = [_Op("params-all-gather", chunk=c, coll=("ag", stage, c)) for c in range(vpp)]
    for i, op in enumerate(ops):
        op.slot = i
    for pre, comp, post in blocks:
        if post is not None and spec.schedule != "1f1b":
            post.eager = True
        if pre is not None:
            prev = ops[-1]
            batch = spec.schedule == "1f1b" and prev.optype.endswith("send") and prev.optype[:4] != pre.optype[:4]
            pre.slot = prev.slot if batch else prev.slot + 1
            ops.append(pre)
        comp.slot = ops[-1].slot + 1
        ops.append(comp)
        if post is not None:
            post.slot = comp.slot + 1
            ops.append(post)
    # Megatron's step tail: gc, the layernorm grads' all-reduce (tensor-parallel group: this rank alone
    # at tp 1), the embedding grads' all-reduce between the first and last stage of a replica, the
    # reduce-scatter of each chunk's grads over the stage's DP group, the grad-norm clip (an all-reduce
    # over every rank), the optimizer
    tail = [_Op("gc"), _Op("layernorm-grads-all-reduce", coll=("ln", stage, d))]
    if stage in (0, pp - 1):
        tail.append(_Op("embedding-grads-all-reduce", coll=("emb", d)))
    tail += [_Op("grads-reduce-scatter", chunk=c, coll=("rs", stage, c)) for c in range(vpp)]
    tail += [_Op("optimizer-clip-main-grad", coll=("clip",)), _Op("optimizer")]
    for op in tail:
        op.slot = ops[-1].slot + 1
        ops.append(op)
    return ops


def _durations(spec: TraceSpec, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Per (stage, dp, mb) compute factor, per-stage forward time, per-stage DP-collective factor, and the
    culprit's rank and stage (-1: none), drawn from the seed."""
    pp, dp, mb = spec.pp, spec.dp, spec.mb
    fwd = 0.02 * (1.0 + 0.1 * rng.random(pp))       # stages hold about equal layers
    comp = np.ones((pp, dp, mb))
    coll = np.ones(pp)
    rank, stage = -1, -1
    kinds = ("worker", "stage") if spec.culprit == "several" else (spec.culprit,)
    for kind in kinds:
        if kind == "worker":
            stage, d = int(rng.integers(pp)), int(rng.integers(dp))
            rank = stage * dp + d
            comp[stage, d] *= spec.factor
        elif kind == "stage":
            s = int(rng.integers(pp))
            comp[s] *= spec.factor if spec.culprit == "stage" else 1.0 + (spec.factor - 1.0) / 2
            stage = s if stage < 0 else stage
        elif kind == "mb_imbalance":
            # sequence lengths: each (dp rank, micro-batch) draws its own, up to ``factor`` times the shortest
            comp *= rng.uniform(1.0, spec.factor, size=(1, dp, mb))
        elif kind == "dp_group":
            d = int(rng.integers(dp))
            comp[:, d] *= spec.factor
        elif kind == "collective":
            stage = int(rng.integers(pp))
            coll[stage] *= 4 * spec.factor
    return comp, fwd, coll, rank, stage


def execute(spec: TraceSpec) -> dict[str, np.ndarray]:
    """Run the job's steps on their dependencies; the per-operation table as columns (the study's format)."""
    rng = np.random.default_rng(spec.seed)
    comp, fwd, coll_f, _, _ = _durations(spec, rng)
    pp, dp = spec.pp, spec.dp
    vpp = spec.vpp if spec.schedule == "interleaved" else 1
    rows: dict[str, list[Any]] = {k: [] for k in ("dp_rank", "stage", "rank", "step", "optype", "start_ts",
                                                  "duration", "seq_id", "mc", "gmc", "mb_id")}
    for step in range(spec.steps):
        ranks = [(s, d) for s in range(pp) for d in range(dp)]
        ops = {rd: _ops_of(spec, *rd) for rd in ranks}
        jit = {rd: np.exp(rng.normal(0.0, JITTER, len(ops[rd]))) for rd in ranks}
        for (s, d), lst in ops.items():
            for i, op in enumerate(lst):
                base = fwd[s] / vpp * comp[s, d, op.mb if op.mb >= 0 else 0]
                if op.optype == "forward-compute":
                    op.dur = base * jit[(s, d)][i]
                elif op.optype == "backward-compute":
                    op.dur = 2.0 * base * jit[(s, d)][i]
                elif op.optype in ("params-all-gather", "grads-reduce-scatter"):
                    op.dur = 0.01 / vpp * coll_f[s] * jit[(s, d)][i]
                elif op.optype == "optimizer":
                    op.dur = 0.015 * jit[(s, d)][i]
                elif op.optype == "gc":
                    op.dur = 0.0
                elif op.coll is not None:
                    op.dur = 0.002 * jit[(s, d)][i]
                else:
                    op.dur = P2P_S * jit[(s, d)][i]
        _run(ops, rng)
        seq: dict[tuple[int, int, str], int] = {}
        for (s, d), lst in ops.items():
            for op in lst:
                k = (s, d, op.optype)
                seq[k] = seq.get(k, -1) + 1
                compute = op.optype.endswith("compute")
                rows["dp_rank"].append(d)
                rows["stage"].append(s)
                rows["rank"].append(s * dp + d)
                rows["step"].append(step)
                rows["optype"].append(op.optype)
                rows["start_ts"].append(op.start)
                rows["duration"].append(op.end - op.start)
                rows["seq_id"].append(seq[k])
                rows["mc"].append(op.chunk if compute or op.optype in ("params-all-gather", "grads-reduce-scatter")
                                  else -1)
                rows["gmc"].append(op.chunk * pp + s if compute else -1)
                rows["mb_id"].append(op.mb if compute else -1)
    cols = {k: np.asarray(v) for k, v in rows.items()}
    # start_ts counts from the step's first start, over all ranks
    for step in range(spec.steps):
        sel = cols["step"] == step
        cols["start_ts"][sel] -= cols["start_ts"][sel].min()
    return cols


def _run(ops: dict[tuple[int, int], list[_Op]], rng: np.random.Generator) -> None:
    """Give every op its start and end. Each rank issues its slots in order (a slot: the ops issued in one
    call), the next one a launch gap after the previous ended (the first after a small random offset); a
    slot with p2p ops or a collective ends when every member of each has started, plus the longest
    transfer (an eager send: its own transfer after it started); a compute op ends its duration after it
    started."""
    members: dict[tuple[Any, ...], list[_Op]] = {}
    slots: dict[tuple[int, int], list[list[_Op]]] = {}
    for rd, lst in ops.items():
        for op in lst:
            key = op.partner if op.partner is not None else op.coll
            if key is not None:
                members.setdefault(key, []).append(op)
        grouped: dict[int, list[_Op]] = {}
        for op in lst:
            grouped.setdefault(op.slot, []).append(op)
        slots[rd] = [grouped[k] for k in sorted(grouped)]
    ptr = {rd: 0 for rd in ops}
    clock = {rd: float(rng.uniform(0.0, 0.002)) for rd in ops}
    remaining = sum(len(v) for v in slots.values())
    while remaining:
        progressed = False
        for rd, lst2 in slots.items():
            while ptr[rd] < len(lst2):
                batch = lst2[ptr[rd]]
                for op in batch:
                    if np.isnan(op.start):
                        op.start = clock[rd]
                mem = [m for op in batch if not op.eager for key in (op.partner, op.coll) if key is not None
                       for m in members[key]] + [op for op in batch if op.eager]
                if any(np.isnan(m.start) for m in mem):
                    break
                t0 = max([clock[rd]] + [m.start for m in mem])
                end = t0 + max(op.dur if op.partner is None and op.coll is None else 0.0 for op in batch)
                if mem:
                    end = t0 + max(m.dur for m in mem)
                for op in batch:
                    op.end = end
                clock[rd] = end + LAUNCH_S
                ptr[rd] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks: a p2p op waits for a partner that never starts")


def write_trace(spec: TraceSpec, folder: Path) -> tuple[Path, Path]:
    """Write ``trace-<name>.parquet`` and ``meta-<name>.yaml`` (the study's layout) into ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    cols = execute(spec)
    folder.mkdir(parents=True, exist_ok=True)
    types = {"dp_rank": pa.int16(), "stage": pa.int16(), "rank": pa.int32(), "step": pa.int64(),
             "start_ts": pa.float64(), "duration": pa.float64(), "seq_id": pa.int32(), "mc": pa.int16(),
             "gmc": pa.int16(), "mb_id": pa.int16()}
    arrays = {k: pa.array(v, type=types[k]) if k in types else
              pa.array(v.tolist()).dictionary_encode() for k, v in cols.items()}
    trace = folder / f"trace-{spec.name}.parquet"
    meta = folder / f"meta-{spec.name}.yaml"
    pq.write_table(pa.table(arrays), trace)
    vpp = spec.vpp if spec.schedule == "interleaved" else 1
    meta.write_text(yaml.safe_dump({
        "trial_name": spec.name, "run_id": 0, "dp_size": spec.dp, "dsp_size": 1, "pp_size": spec.pp,
        "tp_size": 1, "vpp_size": vpp, "world_size": spec.pp * spec.dp}, sort_keys=False))
    return trace, meta


def specs(n: int, seed: int = 1) -> list[TraceSpec]:
    """``n`` trace specs over the shapes, schedules and culprits, drawn from ``seed`` (deterministic).

    Shapes are bounded (ranks x micro-batches <= 1024) so that one trace's
    reference analysis and replay take seconds, not minutes, on a laptop.
    """
    rng = np.random.default_rng(seed)
    out: list[TraceSpec] = []
    for i in range(n):
        schedule = SCHEDULES[i % len(SCHEDULES)]
        culprit = CULPRITS[(i // len(SCHEDULES)) % len(CULPRITS)]
        while True:
            pp = int(rng.choice([2, 4, 8]))
            dp = int(rng.choice([2, 4, 8, 16, 32]))
            mb = int(rng.choice([4, 8, 16, 32, 64]))
            vpp = 2 if schedule == "interleaved" else 1
            if schedule == "interleaved" and mb % pp:
                continue
            if pp * dp * mb * vpp <= 1024 and mb >= pp:
                break
        out.append(TraceSpec(pp, dp, mb, schedule, culprit, seed=seed * 1000 + i,
                             factor=float(rng.choice([1.5, 2.0, 2.3])), vpp=vpp))
    return out
