"""Import PyTorch profiler (Kineto) Chrome traces as telemetry-v1 ``fn`` records.

A Kineto trace (``.json`` or ``.json.gz``) is one rank's ``traceEvents``; the
importer reads the complete events (``ph: "X"``) and maps them as follows.

Time
  ``ts``/``dur`` are microseconds (floats). ``ts_ns = baseTimeNanoseconds +
  ts * 1000`` when the trace has ``baseTimeNanoseconds`` (newer Kineto writes
  ``ts`` relative to it); without it, ``ts`` is taken as microseconds since the
  Unix epoch (Kineto's clock, as in every trace we have seen). The integer
  microseconds convert exactly; a fraction is rounded to the nanosecond.

Who
  ``rank`` and the job's ``world_size`` come from ``distributedInfo``; a trace
  without it gets its position among the files as rank (with a warning).
  ``node`` is ``--node`` if given, else a ``hostname`` the trace carries (top
  level or in ``distributedInfo``), else ``node-<rank // gpus_per_node>``
  (default 8 GPUs per node, ranks numbered node by node).

Kinds (``cat``, lower-cased)
  ``kernel`` -> ``kernel`` (``stream`` from ``args.stream``); a kernel whose
  name contains ``nccl`` -> ``collective``. ``gpu_memcpy`` / ``gpu_memset``
  -> ``memcpy`` (``bytes`` from ``args.bytes``). Host spans: ``cpu_op`` (ATen
  operators) and ``cuda_runtime`` / ``cuda_driver`` calls -> ``other``;
  ``user_annotation`` (``record_function`` ranges) and ``python_function`` ->
  ``python``; whatever the category, ``Optimizer.*`` (``Optimizer.step#Adam.step``,
  ``Optimizer.zero_grad#...``) -> ``optimizer`` and ``enumerate(DataLoader)#...``
  / ``DataLoader...__next__`` -> ``dataloader``. The host-side collective ranges
  (``nccl:all_reduce``, ``record_param_comms``) are host work (``other`` /
  ``python``): the collective itself is the NCCL kernel, counted once.
  Other categories (``Trace``, ``gpu_user_annotation``, flows, instants,
  metadata) are not imported.

Names
  A trailing ``#<digits>`` is dropped (``ProfilerStep#551`` -> ``ProfilerStep``)
  so a function keeps one name across steps. Names over 256 characters keep
  their head and end with ``~`` and 8 hex digits of a hash of the full name.
  Host spans carry ``stack``: the enclosing host spans of the same thread,
  outermost first, the span itself last (each frame cut to 64 characters; a
  deeper stack keeps its innermost frames, see :func:`common.join_stack`).

Collectives
  ``op`` is inferred from the kernel name (AllReduce -> ``all_reduce``,
  AllGather -> ``all_gather``, ReduceScatter -> ``reduce_scatter``, Broadcast
  -> ``broadcast``, SendRecv / Send -> ``send``, Recv -> ``recv``), else from
  ``Collective name`` in the kernel's args, else from the enclosing host range
  of the launch (``nccl:all_reduce``, ``record_param_comms``); an op outside
  the contract's vocabulary (all_to_all, gather, reduce) leaves ``op`` out.
  ``group`` is ``Process Group Name`` (else ``pg_id``, else ``Process Group
  Description``) from the kernel's args or the launching range's, else
  ``--default-group``, else absent: a guessed communicator would pair ranks
  that never talked. ``bytes`` is the larger of ``In msg nelems`` / ``Out msg
  nelems`` times the ``dtype`` size, else the largest input of the launching
  range (``Input Dims`` x ``Input type`` size), else absent.

Steps
  ``ProfilerStep#N`` spans (any host thread) give step ``N`` to the host spans
  that start inside them; a GPU event gets the step of the runtime call that
  launched it (``args.correlation``), else of the span it starts in. A trace
  without ``ProfilerStep`` gets steps from a span that recurs once per
  iteration (the ``Optimizer.step#...`` range says how often, an exactly
  repeating pattern of ``record_function`` ranges where: :mod:`.steps` states
  the rules and why), numbered 1, 2... within the trace, with a warning that
  says so; with neither the trace is refused (one line naming the file): one
  step of everything would look like a measurement and is never written. Events
  outside every step (warm-up before the first, work after the last) are not
  imported, and counted: a step of leftovers would look like a step.

Memory: one trace is decoded at a time (msgspec, into typed structs that keep
only the fields used); its records are sorted and spooled (see
:class:`common.Spool`) before the next trace is read.
"""

from __future__ import annotations

import bisect
import gzip
import math
import re
import zlib
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Sequence

import msgspec

from eroica.models.records import FnRecord, JobRecord, encode_record

from .common import ImportFailed, ImportStats, Spool, clip, frame, join_stack, write_spool
from .steps import NO_STEPS, OPTIMIZER_STEP, Span, find_boundary, fn_name

DEFAULT_GPUS_PER_NODE = 8

HOST_KIND = {
    "cpu_op": "other", "operator": "other",
    "cuda_runtime": "other", "runtime": "other", "cuda_driver": "other",
    "user_annotation": "python", "python_function": "python",
}
GPU_KIND = {"kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memcpy", "memset": "memcpy"}
_LAUNCH_CATS = {"cuda_runtime", "runtime", "cuda_driver"}

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")

_DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "int": 4, "int32": 4, "long": 8, "long int": 8, "long long": 8, "int64": 8, "short": 2, "int16": 2,
    "unsigned char": 1, "uint8": 1, "byte": 1, "signed char": 1, "char": 1, "int8": 1, "bool": 1,
    "uint16": 2, "uint32": 4, "uint64": 8,
    "complex<float>": 8, "complexfloat": 8, "complex64": 8, "complex<double>": 16, "complexdouble": 16,
    "complex128": 16, "complex<half>": 4, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


class _Args(msgspec.Struct, gc=False):
    """The few ``args`` the mapping reads (others are skipped while decoding)."""

    correlation: Any = None
    stream: Any = None
    bytes: Any = None
    dtype: Any = None
    pg_id: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: float | None = None
    dur: float = 0.0
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] = []
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    hostname: Any = None


_decoder = msgspec.json.Decoder(_Trace | list[_Event], strict=False)


def load_trace(path: str | Path) -> _Trace:
    """Decode one trace file (plain or gzip); a bare event array is accepted too."""
    try:
        data = Path(path).read_bytes()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        trace = _decoder.decode(data)
    except (OSError, EOFError, zlib.error) as exc:
        raise ImportFailed(f"{path}: unreadable: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ImportFailed(f"{path}: not a Chrome/Kineto trace: {exc}") from None
    return _Trace(traceEvents=trace) if isinstance(trace, list) else trace


def us_to_ns(ts: float) -> int:
    """Microseconds (float) to integer nanoseconds, exact for integer microseconds."""
    whole = math.floor(ts)
    return int(whole) * 1000 + round((ts - whole) * 1000)


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if v >= 0 else None
    if isinstance(v, float) and math.isfinite(v) and v >= 0:
        return int(v)
    if isinstance(v, str):
        try:
            n = int(v.strip())
        except ValueError:
            return None
        return n if n >= 0 else None
    return None


def host_kind(cat: str, name: str) -> str:
    """Contract kind of a host span of category ``cat`` (lower-cased)."""
    if name.startswith("Optimizer."):
        return "optimizer"
    if "DataLoader" in name and (name.startswith("enumerate(") or "__next__" in name):
        return "dataloader"
    return HOST_KIND[cat]


def collective_op(*hints: Any) -> str | None:
    """The contract's ``op`` from the first hint that names one (kernel name first)."""
    for h in hints:
        if not isinstance(h, str) or not h:
            continue
        n = h.lower().replace("_", "").replace("-", "")
        if "allreduce" in n:
            return "all_reduce"
        if "allgather" in n:
            return "all_gather"
        if "reducescatter" in n:
            return "reduce_scatter"
        if "broadcast" in n:
            return "broadcast"
        if "barrier" in n:
            return "barrier"
        if "sendrecv" in n or "send" in n:
            return "send"
        if "recv" in n:
            return "recv"
    return None


def dtype_size(t: Any) -> int | None:
    if not isinstance(t, str):
        return None
    k = t.strip().lower()
    for prefix in ("c10::", "torch."):
        if k.startswith(prefix):
            k = k[len(prefix):]
    return _DTYPE_BYTES.get(k)


def collective_bytes(a: _Args | None) -> int | None:
    """Payload of a collective from its args: message elements x dtype, else the largest input."""
    if a is None:
        return None
    size = dtype_size(a.dtype)
    if size:
        counts = [n for n in (_int(a.in_nelems), _int(a.out_nelems)) if n is not None]
        if counts:
            return max(counts) * size
    dims, types = a.input_dims, a.input_type
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    best: int | None = None
    for d, t in zip(dims, types):
        s = dtype_size(t)
        if s is None or not isinstance(d, list) or not all(isinstance(x, int) and x >= 0 for x in d):
            continue
        b = math.prod(d) * s
        best = b if best is None else max(best, b)
    return best


def collective_group(*argsets: _Args | None) -> str | None:
    for a in argsets:
        if a is None:
            continue
        for v in (a.pg_name, a.pg_id):
            if v is not None and v != "" and not isinstance(v, (list, dict)):
                return clip(str(v))
        if isinstance(a.pg_desc, str) and a.pg_desc and a.pg_desc != "undefined":
            return clip(a.pg_desc)
    return None


def _is_host_collective(name: str) -> bool:
    return name.startswith(("nccl:", "record_param_comms", "c10d::", "gloo:"))


class _Steps:
    """Step spans (``ProfilerStep#N``, or inferred), for 'which step contains this instant'."""

    def __init__(self, spans: list[tuple[int, int, int]]) -> None:
        spans.sort()
        self.starts = [s for s, _, _ in spans]
        self.ends = [e for _, e, _ in spans]
        self.numbers = [n for _, _, n in spans]

    def at(self, ts: int) -> int | None:
        i = bisect.bisect_right(self.starts, ts) - 1
        # Spans may nest or touch at the edges: look back a little for one that contains ts.
        for j in range(i, max(i - 2, -1), -1):
            if self.starts[j] <= ts < self.ends[j] or (self.starts[j] == ts == self.ends[j]):
                return self.numbers[j]
        return None


def _steps_of(markers: list[tuple[int, int, int]], annotations: dict[tuple[Any, Any], list[Span]],
              source: str, stats: ImportStats) -> tuple[_Steps, str]:
    """The trace's steps and what to call the events outside them.

    The ``ProfilerStep#N`` markers when there are any; else the steps inferred
    from a span that recurs once per iteration (:mod:`.steps`), with a warning
    saying so; else the trace is refused: one step of everything is no
    measurement, and nothing downstream could tell it from one.
    """
    if markers:
        return _Steps(markers), "events outside every ProfilerStep"
    boundary = find_boundary((sp for spans in annotations.values() for sp in spans), annotations.values())
    if boundary is None:
        raise ImportFailed(f"{source}: {NO_STEPS}")
    stats.warnings.append(f"{source}: no ProfilerStep#N markers; {boundary.describe()}")
    stats.inferred_steps[source] = boundary.steps
    return _Steps(boundary.spans()), "events outside every inferred step"


def convert_trace(trace: _Trace, *, job: str, rank: int, node: str, stats: ImportStats,
                  default_group: str | None = None, source: str = "trace") -> list[tuple[int, bytes]]:
    """One trace's ``fn`` records as ``(ts_ns, JSON line)``, in no particular order.

    Raises :class:`ImportFailed` (naming ``source``) when the trace has no steps and none can be inferred.
    """
    base = _int(trace.baseTimeNanoseconds) or 0
    threads: dict[tuple[Any, Any], list[tuple[int, int, _Event, str]]] = defaultdict(list)
    gpu: list[tuple[int, int, _Event, str]] = []
    spans: list[tuple[int, int, int]] = []
    # record_function ranges per thread (and optimizer steps): step boundaries when there is no ProfilerStep
    annotations: dict[tuple[Any, Any], list[Span]] = defaultdict(list)
    skipped = stats.skipped
    isfinite = math.isfinite
    for e in trace.traceEvents:
        t = e.ts
        if e.ph != "X" or t is None:
            continue
        cat = e.cat.lower()
        host = cat in HOST_KIND
        if not host and cat not in GPU_KIND:
            skipped[f"'{e.cat or '(none)'}' events"] += 1
            continue
        if not isinstance(e.name, str) or not isfinite(t) or not isfinite(e.dur):
            skipped["malformed events"] += 1
            continue
        whole = int(t)
        ts = base + (whole * 1000 if t == whole else us_to_ns(t))
        dur = round(e.dur * 1000)
        if ts < 0 or dur < 0:
            skipped["events with a negative time"] += 1
            continue
        if host:
            threads[(e.pid, e.tid)].append((ts, dur, e, cat))
            if e.name.startswith("ProfilerStep#"):
                m = _STEP_RE.match(e.name)
                if m:
                    spans.append((ts, ts + dur, int(m.group(1))))
            elif cat == "user_annotation" or e.name.startswith(OPTIMIZER_STEP):
                annotations[(e.pid, e.tid)].append((ts, ts + dur, e.name))
        else:
            gpu.append((ts, dur, e, GPU_KIND[cat]))
    steps, outside_label = _steps_of(spans, annotations, source, stats)
    del annotations
    step_at = steps.at

    out: list[tuple[int, bytes]] = []
    append = out.append
    encode = encode_record
    tally: Counter[tuple[str, int]] = Counter()
    outside = 0
    # correlation id -> (step of the launch, enclosing host collective range: (name, args))
    launches: dict[int, tuple[int | None, tuple[str, _Args] | None]] = {}
    # (category, raw name) -> (fn, stack frame, kind, is a host-side collective range, is a launch)
    names: dict[tuple[str, str], tuple[str, str, str, bool, bool]] = {}

    for events in threads.values():
        events.sort(key=lambda x: (x[0], -x[1]))
        # Open spans of this thread: (end, frame, stack string, enclosing host collective range)
        open_: list[tuple[int, str, str, tuple[str, _Args] | None]] = []
        for ts, dur, e, cat in events:
            while open_ and open_[-1][0] <= ts:
                open_.pop()
            info = names.get((cat, e.name))
            if info is None:
                name = fn_name(e.name)
                info = names[(cat, e.name)] = (clip(name), frame(name), host_kind(cat, e.name),
                                              _is_host_collective(e.name), cat in _LAUNCH_CATS)
            fn, fr, kind, is_coll, is_launch = info
            if open_:
                parent = open_[-1]
                stack = parent[2] + ";" + fr
                if len(stack) > 256:
                    stack = join_stack([o[1] for o in open_] + [fr])
                coll = parent[3]
            else:
                stack, coll = fr, None
            a = e.args
            if is_coll and a is not None:
                coll = (e.name, a)
            step = step_at(ts)
            if is_launch and a is not None:
                corr = _int(a.correlation)
                if corr is not None:
                    launches[corr] = (step, coll)
            open_.append((ts + dur, fr, stack, coll))
            if step is None:
                outside += 1
                continue
            append((ts, encode(FnRecord(job=job, node=node, rank=rank, step=step, fn=fn, kind=kind,
                                        ts_ns=ts, dur_ns=dur, stack=stack))))
            tally[(kind, step)] += 1
    del threads

    kernel_names: dict[str, tuple[str, bool]] = {}
    for ts, dur, e, kind in gpu:
        a = e.args or _NO_ARGS
        corr = _int(a.correlation)
        link = launches.get(corr) if corr is not None else None
        step = link[0] if link is not None else step_at(ts)
        if step is None:
            outside += 1
            continue
        stream = _int(a.stream)
        if stream is None:
            stream = _int(e.tid)
        name: str = e.name
        known = kernel_names.get(name)
        if known is None:
            known = kernel_names[name] = (clip(name), "nccl" in name.lower())
        fn, nccl = known
        nbytes = op = group = None
        if kind == "kernel" and nccl:
            kind = "collective"
            rng = link[1] if link is not None else None
            range_name, host = rng if rng is not None else (None, None)
            op = collective_op(name, a.coll_name, host.coll_name if host else None, range_name)
            group = collective_group(a, host) or default_group
            nbytes = collective_bytes(a)
            if nbytes is None:
                nbytes = collective_bytes(host)
        elif kind == "memcpy":
            nbytes = _int(a.bytes)
        append((ts, encode(FnRecord(job=job, node=node, rank=rank, step=step, fn=fn, kind=kind, ts_ns=ts,
                                    dur_ns=dur, bytes=nbytes, op=op, group=group, stream=stream))))
        tally[(kind, step)] += 1

    if outside:
        skipped[outside_label] += outside
    for (kind, step), n in tally.items():
        stats.records += n
        stats.kinds[kind] += n
        stats.steps.add(step)
    if tally:
        stats.ranks.add(rank)
    return out


def _hostname(trace: _Trace, info: dict) -> str | None:
    for v in (trace.hostname, info.get("hostname"), info.get("host")):
        if isinstance(v, str) and v:
            return clip(v)
    return None


def default_job(paths: Sequence[str | Path]) -> str:
    """A job id from the file names: their common stem (``sampled_rank-0``, ``-1`` -> ``sampled_rank``)."""
    stems = []
    for p in paths:
        name = Path(p).name
        for suffix in (".json.gz", ".json", ".gz"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        stems.append(name)
    common = stems[0] if len(stems) == 1 else _common_prefix(stems).rstrip("-_. ")
    return clip(common or "kineto")


def _common_prefix(names: list[str]) -> str:
    lo, hi = min(names), max(names)
    i = 0
    while i < min(len(lo), len(hi)) and lo[i] == hi[i]:
        i += 1
    return lo[:i]


def _check_inferred_steps(stats: ImportStats, traces: int) -> None:
    """Warn when inferred steps may not line up across the traces.

    Inferred steps are numbered 1, 2... within each trace, so step k names the
    same iteration on every rank only when their profilers covered the same
    iterations: different counts say they did not (or that a rule misread
    one), and a mix with ``ProfilerStep#N`` numbers never lines up.
    """
    counts = stats.inferred_steps
    if counts and len(counts) < traces:
        stats.warnings.append(f"{len(counts)} of {traces} traces have no ProfilerStep#N markers: their inferred "
                              "steps (1, 2...) do not line up with the marked ones")
    elif len(set(counts.values())) > 1:
        each = ", ".join(f"{src}: {n}" for src, n in counts.items())
        stats.warnings.append(f"the traces inferred different numbers of steps ({each}): inferred steps are "
                              "numbered within each trace and may not name the same iteration on every rank")


def import_kineto(paths: Sequence[str | Path], output: str | Path, *, job: str | None = None,
                  node: str | None = None, gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
                  default_group: str | None = None) -> ImportStats:
    """Import Kineto traces (one rank each) of one job into ``output`` (``-``, ``.gz`` or plain).

    The output starts with a ``job`` record, then the ``fn`` records of all
    traces in time order. Nothing is written when a trace cannot be read.
    """
    if not paths:
        raise ImportFailed("no trace given")
    job = clip(job) if job else default_job(paths)
    stats = ImportStats()
    world: int | None = None
    rank_node: dict[int, str] = {}
    source_of: dict[int, str] = {}
    with Spool() as spool:
        for i, path in enumerate(paths):
            trace = load_trace(path)
            info = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
            rank = _int(info.get("rank"))
            if rank is None:
                rank = i
                stats.warnings.append(f"{path}: no distributedInfo.rank; using its position, rank {rank}")
            if rank in source_of:
                raise ImportFailed(f"{path}: rank {rank} already comes from {source_of[rank]} "
                                   "(traces of another job or run? import them separately, with --job)")
            source_of[rank] = str(path)
            ws = _int(info.get("world_size"))
            if ws:
                if world is not None and ws != world:
                    stats.warnings.append(f"{path}: world_size {ws} differs from {world} in an earlier trace")
                world = max(world or 0, ws)
            where = clip(node) if node else (_hostname(trace, info) or f"node-{rank // gpus_per_node}")
            rank_node[rank] = where
            run = convert_trace(trace, job=job, rank=rank, node=where, stats=stats, default_group=default_group,
                                source=str(path))
            del trace
            spool.add(run)
            del run
            stats.sources += 1
        _check_inferred_steps(stats, len(paths))
        top = max(rank_node) + 1
        if world is None or world < top:
            if world is not None:
                stats.warnings.append(f"rank {top - 1} is not below world_size {world}; using {top}")
            world = top
        nodes = [rank_node[r] for r in range(world)] if len(rank_node) == world else None
        head = [encode_record(JobRecord(job=job, world_size=world, rank_nodes=nodes))]
        write_spool(spool, output, head)
    return stats
