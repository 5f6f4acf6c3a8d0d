"""Fault catalogue and the ``name:key=value,...`` fault-spec parser.

Every fault takes its own parameters plus the generic ``start=STEP`` and
``end=STEP`` (active in ``[start, end)``; default: the whole run). Lists (of
ranks or nodes) are separated by ``;`` (or ``+``, which needs no shell
quoting): ``congestion:nodes=1;5;9``. Nodes may be given as ``3`` or
``node-3``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REQUIRED = object()


class FaultError(ValueError):
    """A fault spec that cannot be parsed or does not fit the job layout."""


@dataclass(frozen=True)
class Param:
    type: str  # int | float | str | node | ints | nodes
    default: Any = REQUIRED
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    help: str = ""


@dataclass(frozen=True)
class FaultDef:
    name: str
    component: str  # verdict component vocabulary; "by_fn" for hang
    scope: str  # rank | node | job
    params: dict[str, Param]
    help: str
    kind: str = "slow"


def _p(*a, **k) -> Param:
    return Param(*a, **k)


FAULTS: dict[str, FaultDef] = {f.name: f for f in [
    FaultDef("gpu_throttle", "gpu", "rank", {
        "rank": _p("int", lo=0),
        "factor": _p("float", 1.4, lo=1.0, hi=10.0, help="compute-kernel slowdown = max clock / clock"),
        "reason": _p("str", "thermal", choices=("thermal", "power"), help="thermal (0x20/0x40, hot) or power cap (0x4)"),
    }, "one GPU clocks down: kernels slower, low SM clock, clock-event reasons set, hot or at the power cap"),
    FaultDef("gpu_memory", "gpu_memory", "rank", {
        "rank": _p("int", lo=0),
        "factor": _p("float", 1.6, lo=1.0, hi=10.0, help="memory-bound kernel slowdown"),
    }, "one GPU under memory pressure / degraded HBM: memory-bound kernels slower, GEMMs and clocks normal"),
    FaultDef("pcie", "pcie", "rank", {
        "rank": _p("int", lo=0),
        "gen": _p("int", 4, lo=1, hi=5, help="degraded PCIe generation (max 5)"),
        "width": _p("int", 8, choices=(1, 2, 4, 8, 16), help="degraded lane count (max 16)"),
    }, "one GPU's PCIe link trained down: memcpy and GPUDirect traffic capped by the link"),
    FaultDef("nvlink", "nvlink", "rank", {
        "rank": _p("int", lo=0),
        "factor": _p("float", 8.0, lo=1.0, hi=100.0, help="NVLink bus bandwidth / fallback PCIe P2P bandwidth"),
    }, "one GPU's NVLinks down: NCCL routes its intra-node traffic over PCIe, the node's TP ring is paced by it"),
    FaultDef("nic", "nic", "node", {
        "node": _p("node"),
        "nic": _p("int", 0, lo=0, help="rail / NIC index mlx5_<nic>"),
        "gbps": _p("float", 200.0, lo=1.0, hi=400.0, help="degraded link speed (of 400)"),
    }, "one NIC links at a lower speed: its rail's rings slow down for all members"),
    FaultDef("nic_flaky", "nic", "node", {
        "node": _p("node"),
        "nic": _p("int", 0, lo=0),
        "factor": _p("float", 2.0, lo=1.0, hi=20.0, help="median transfer slowdown from retransmissions"),
        "flap_prob": _p("float", 0.08, lo=0.0, hi=1.0, help="chance per collective that the link flaps (stall 0.3-1.5 s)"),
    }, "one NIC with a bad cable/transceiver: symbol errors, retransmits, link flaps, bursty stalls"),
    FaultDef("dataloader", "dataloader", "node", {
        "node": _p("node"),
        "ms": _p("float", 250.0, lo=0.0, help="extra DataLoader.__next__ time"),
    }, "one node's data loader workers cannot keep up (CPU-bound decode): GPU idle at step start, no iowait"),
    FaultDef("storage", "storage", "node", {
        "node": _p("node"),
        "ms": _p("float", 300.0, lo=0.0, help="extra (bursty) DataLoader.__next__ time"),
    }, "one node's storage is slow: DataLoader waits on reads, high iowait"),
    FaultDef("host_cpu", "host_cpu", "node", {
        "node": _p("node"),
        "factor": _p("float", 4.0, lo=1.0, hi=50.0, help="host-side slowdown of Python and kernel launches"),
    }, "one node's CPUs are oversubscribed: Python and launch gaps longer, kernels normal, CPU ~100%"),
    FaultDef("gc", "python", "job", {
        "ranks": _p("ints", None, help="ranks that may pause (default: any)"),
        "rate": _p("float", 0.5, lo=0.0, hi=100.0, help="pauses per step (Poisson)"),
        "ms": _p("float", 500.0, lo=0.0, help="median pause length"),
    }, "long Python GC pauses on varying ranks"),
    FaultDef("uneven_workload", "workload", "rank", {
        "rank": _p("int", lo=0),
        "factor": _p("float", 1.3, lo=1.0, hi=10.0, help="extra work on that rank"),
    }, "one rank gets more work (e.g. an overloaded expert): GEMMs longer, clocks normal"),
    FaultDef("pp_imbalance", "workload", "rank", {
        "stage": _p("int", lo=0),
        "factor": _p("float", 1.5, lo=1.0, hi=10.0, help="compute of that stage"),
    }, "one pipeline stage has more layers than the others (needs --pp > 1)"),
    FaultDef("nccl_tcp", "config", "job", {
        "gbps": _p("float", 16.0, lo=0.1, hi=400.0, help="socket throughput per rail"),
    }, "NCCL over TCP sockets and P2P disabled: inter-node at socket speed, no NVLink"),
    FaultDef("few_workers", "config", "job", {
        "ms": _p("float", 200.0, lo=0.0, help="extra DataLoader.__next__ time on every rank"),
    }, "too few DataLoader workers everywhere"),
    FaultDef("kernel_regression", "software", "job", {
        "fn": _p("str", help="kernel name (see --list-faults)"),
        "factor": _p("float", 1.5, lo=1.0, hi=50.0),
    }, "one kernel slower on every rank from `start` on (default: half-way)"),
    FaultDef("congestion", "network", "job", {
        "nodes": _p("nodes"),
        "factor": _p("float", 2.5, lo=1.0, hi=50.0, help="mean bandwidth loss on those nodes' links"),
    }, "fabric congestion at several nodes: low bursty throughput, CNPs and xmit_wait rising, no errors"),
    FaultDef("hang", "by_fn", "rank", {
        "rank": _p("int", lo=0),
        "step": _p("int", None, lo=0, help="step of the hang (default: half-way)"),
        "fn": _p("str", None, help="stuck function (default: a backward GEMM); a kernel, DataLoader.__next__ or Memcpy HtoD"),
        "after": _p("float", 6.0, lo=1.0, hi=1000.0, help="step-times recorded with no progress"),
    }, "one rank gets stuck; everyone else waits in a collective; the run ends with in_flight records", kind="hang"),
]}

GENERIC = {"start": Param("int", None, lo=0), "end": Param("int", None, lo=1)}
LIST_SEPARATORS = (";", "+")


@dataclass
class FaultSpec:
    """A parsed fault: its name, typed parameters (defaults filled) and active steps."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    start: int | None = None
    end: int | None = None

    @property
    def definition(self) -> FaultDef:
        return FAULTS[self.name]

    def __str__(self) -> str:
        items = [f"{k}={_fmt(v)}" for k, v in self.params.items() if v is not None]
        if self.start is not None:
            items.append(f"start={self.start}")
        if self.end is not None:
            items.append(f"end={self.end}")
        return self.name + (":" + ",".join(items) if items else "")


def _fmt(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ";".join(str(x) for x in v)
    return str(v)


def _convert(fault: str, key: str, p: Param, raw: str) -> Any:
    raw = raw.strip()
    where = f"fault {fault!r}, parameter {key!r}"
    if raw == "":
        raise FaultError(f"{where}: empty value")
    try:
        if p.type == "int":
            v: Any = int(raw)
        elif p.type == "float":
            v = float(raw)
            if v != v or v in (float("inf"), float("-inf")):
                raise ValueError
        elif p.type == "node":
            v = _node(raw)
        elif p.type in ("ints", "nodes"):
            parts = raw
            for sep in LIST_SEPARATORS[1:]:
                parts = parts.replace(sep, LIST_SEPARATORS[0])
            items = [x.strip() for x in parts.split(LIST_SEPARATORS[0]) if x.strip()]
            if not items:
                raise ValueError
            v = [(_node(x) if p.type == "nodes" else int(x)) for x in items]
            if len(set(v)) != len(v):
                raise FaultError(f"{where}: duplicate entries in {raw!r}")
        else:
            v = raw
    except FaultError:
        raise
    except ValueError:
        expect = {"int": "an integer", "float": "a number", "node": "a node index or node-<i>",
                  "ints": "integers separated by ';'", "nodes": "node indices separated by ';'"}.get(p.type, "a value")
        raise FaultError(f"{where}: expected {expect}, got {raw!r}") from None
    values = v if isinstance(v, list) else [v]
    for x in values:
        if p.choices and x not in p.choices:
            raise FaultError(f"{where}: {x!r} is not one of {', '.join(map(str, p.choices))}")
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            if p.lo is not None and x < p.lo:
                raise FaultError(f"{where}: {x} is below the minimum {p.lo:g}")
            if p.hi is not None and x > p.hi:
                raise FaultError(f"{where}: {x} is above the maximum {p.hi:g}")
    return v


def _node(raw: str) -> int:
    s = raw.strip()
    if s.startswith("node-"):
        s = s[5:]
    v = int(s)
    if v < 0:
        raise ValueError
    return v


def parse_fault(spec: str) -> FaultSpec:
    """Parse ``name[:key=value,...]``; raises :class:`FaultError` with a precise reason."""
    if not isinstance(spec, str) or not spec.strip():
        raise FaultError("empty fault spec; expected name[:key=value,...]")
    spec = spec.strip()
    name, _, rest = spec.partition(":")
    name = name.strip()
    fdef = FAULTS.get(name)
    if fdef is None:
        raise FaultError(f"unknown fault {name!r}; known faults: {', '.join(sorted(FAULTS))}")
    params: dict[str, Any] = {}
    generic: dict[str, Any] = {}
    if rest.strip():
        for item in rest.split(","):
            if not item.strip():
                raise FaultError(f"fault {name!r}: empty item in {spec!r}")
            key, eq, raw = item.partition("=")
            key = key.strip()
            if not eq:
                raise FaultError(f"fault {name!r}: expected key=value, got {item.strip()!r}")
            if key in GENERIC:
                target, p = generic, GENERIC[key]
            elif key in fdef.params:
                target, p = params, fdef.params[key]
            else:
                known = ", ".join(list(fdef.params) + list(GENERIC))
                raise FaultError(f"fault {name!r} has no parameter {key!r}; its parameters: {known}")
            if key in target:
                raise FaultError(f"fault {name!r}: parameter {key!r} given twice")
            target[key] = _convert(name, key, p, raw)
    for key, p in fdef.params.items():
        if key not in params:
            if p.default is REQUIRED:
                raise FaultError(f"fault {name!r} needs parameter {key!r} ({_describe(fdef)})")
            params[key] = p.default
    start, end = generic.get("start"), generic.get("end")
    if start is not None and end is not None and end <= start:
        raise FaultError(f"fault {name!r}: end={end} must be greater than start={start}")
    return FaultSpec(name, params, start, end)


def _describe(fdef: FaultDef) -> str:
    parts = []
    for k, p in fdef.params.items():
        parts.append(k if p.default is REQUIRED else f"[{k}]" if p.default is None else f"[{k}={p.default}]")
    return f"{fdef.name}:" + ",".join(parts)


def describe_faults() -> str:
    """One line per fault: its parameters with defaults and what it models (for --help)."""
    lines = []
    for f in FAULTS.values():
        comp = "component by the stuck function" if f.component == "by_fn" else f"{f.component}/{f.scope}"
        lines.append(f"{_describe(f)}  -- {f.help} [{f.kind}, {comp}]")
    return "\n".join(lines)
