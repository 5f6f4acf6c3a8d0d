"""One sample of a node: contract ``gpu``, ``nic`` and ``host`` records.

Every record goes through the contract's own structs
(:mod:`eroica.models.records`), so what the agent publishes is valid
telemetry-v1 by construction: a value outside the contract (a NaN, a
negative rate) is dropped from its record rather than sent.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import msgspec

from eroica.models.records import GpuRecord, HostRecord, NicRecord

from .gpu import GpuSampler
from .host import HostSampler
from .nic import NicSampler


def _clean(fields: dict) -> dict:
    """Drop values the contract would reject (non-finite, negative where it must be >= 0)."""
    out = {}
    for k, v in fields.items():
        if isinstance(v, float) and not math.isfinite(v):
            continue
        out[k] = v
    return out


def _build(cls: type, base: dict, fields: dict) -> Any | None:
    """The struct, or without the offending optional fields if one breaks the contract."""
    fields = _clean(fields)
    try:
        return msgspec.convert({**base, **fields}, cls)
    except msgspec.ValidationError:
        kept = {}
        for k, v in fields.items():
            try:
                msgspec.convert({**base, **kept, k: v}, cls)
                kept[k] = v
            except msgspec.ValidationError:
                pass
        try:
            return msgspec.convert({**base, **kept}, cls)
        except msgspec.ValidationError:
            return None


class NodeSampler:
    """GPU + NIC + host sampling of one node, as contract records."""

    def __init__(self, job: str, node: str, *, root: str | Path = "/", gpu: GpuSampler | None = None,
                 nic: NicSampler | None = None, host: HostSampler | None = None, gpus: bool = True) -> None:
        self.job = job[:256]
        self.node = node[:256]
        self.gpu = gpu if gpu is not None else (GpuSampler(proc_root=Path(root) / "proc") if gpus else None)
        self.nic = nic if nic is not None else NicSampler(root)
        self.host = host if host is not None else HostSampler(root)

    def sample(self, ts_ns: int | None = None) -> list:
        ts = time.time_ns() if ts_ns is None else ts_ns
        base = {"job": self.job, "node": self.node, "ts_ns": ts}
        out: list = []
        if self.gpu is not None:
            for g in self.gpu.sample(ts):
                rec = _build(GpuRecord, {**base, "rank": g.pop("rank"), "gpu": g.pop("gpu")}, g)
                if rec is not None:
                    out.append(rec)
        for n in self.nic.sample(ts):
            rec = _build(NicRecord, {**base, "nic": n.pop("nic")}, n)
            if rec is not None:
                out.append(rec)
        rec = _build(HostRecord, base, self.host.sample())
        if rec is not None:
            out.append(rec)
        return out

    def describe(self) -> str:
        """What this node can report, for the agent's start-up line."""
        gpus = len(self.gpu.handles) if self.gpu is not None and self.gpu.available else 0
        nics = [f"{p.nic}" + (f"/{p.port}" if p.port is not None else "") for p in self.nic.read()]
        return f"{gpus} GPU(s), NICs: {', '.join(nics) or 'none'}, host: /proc"

    def close(self) -> None:
        if self.gpu is not None:
            self.gpu.close()
