"""The input records of telemetry-v1 (``../shared/spec/telemetry-v1.md``).

The structs *are* the validation: msgspec checks types, bounds and string
lengths while decoding (in C), so a record that decodes is contract-valid and
the error message of one that does not names the field, the value and the rule.
Unknown fields are ignored, as the contract requires of newer collectors.
JSON has no NaN/Infinity literal and msgspec rejects out-of-range numbers such
as ``1e999``, so every float that decodes is finite.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec

Str = Annotated[str, msgspec.Meta(max_length=256)]
# JSON integers are unbounded, but the columns are int64 / int32 arrays: an
# integer that decoded but does not fit its column would crash the batch it is
# in (OverflowError in numpy), taking every valid record of it down. So the
# upper bounds are part of validation: times, sizes and counters are int64,
# indices (rank, GPU, stream, port) and parallelism degrees are int32.
INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
# Times and durations have tighter bounds (telemetry-v1, "Bounds"), so that no
# valid record can overflow the int64 arithmetic done on them: ``ts_ns + dur_ns``
# (end times), offsets within a window times a rank slot (critical path), sums of
# durations. A duration is at most one week (no function of a training step runs
# longer; an in-flight dump of a longer hang is rejected, with its reason), a time
# at most 2^62 ns after the epoch (the year 2116), so ``ts_ns + dur_ns`` < 2^62 + 2^50
# and any sum of 8,000 durations stays below 2^63, every per-record value below
# 2^53 exact in float64. Before this bound a single ``dur_ns`` of 7e18 overflowed the
# streaming summariser's critical-path offsets and blamed innocent ranks.
MAX_DUR_NS = 7 * 24 * 3600 * 10**9
MAX_TS_NS = 2**62
TimeNs = Annotated[int, msgspec.Meta(ge=0, le=MAX_TS_NS)]
DurNs = Annotated[int, msgspec.Meta(ge=0, le=MAX_DUR_NS)]
Index = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Rank = Index
Degree = Annotated[int, msgspec.Meta(ge=1, le=INT32_MAX)]
# Counters are only required to be finite numbers: the contract rejects wrong
# types and non-finite values, not readings we find odd, so a collector that
# reports e.g. a summed multi-core CPU percentage is not turned away.
Pct = float
NonNegFloat = float

# The ``fn`` of a ``python`` record that covers a gap no traced call covers (no span open on any
# thread of the rank): the training loop's own code between the calls a tracer sees. Telemetry-v1
# reserves the name (a convention, no new field); the detector words findings on it as such.
UNTRACED_FN = "outside any traced call"
FN_KINDS = ("python", "kernel", "collective", "memcpy", "dataloader", "optimizer", "io", "other")
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "barrier")

FnKind = Literal["python", "kernel", "collective", "memcpy", "dataloader", "optimizer", "io", "other"]
CollectiveOp = Literal["all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv", "barrier"]


class _Record(msgspec.Struct, tag_field="type", forbid_unknown_fields=False, gc=False, omit_defaults=True):
    """Base of all input records; ``type`` is the tag that selects the kind."""


class FnRecord(_Record, tag="fn"):
    """One execution of one function on one rank."""

    job: Str
    node: Str
    rank: Rank
    step: NonNegInt
    fn: Str
    kind: FnKind
    ts_ns: TimeNs
    dur_ns: DurNs
    bytes: NonNegInt | None = None
    op: CollectiveOp | None = None
    group: Str | None = None
    stream: Index | None = None
    in_flight: bool = False
    # The contract bounds every string to 256 characters, stacks included:
    # collectors keep the innermost frames when a stack is deeper.
    stack: Str | None = None


class GpuRecord(_Record, tag="gpu"):
    """One sample of one GPU's counters; absent fields were not reported."""

    job: Str
    node: Str
    rank: Rank
    gpu: Index
    ts_ns: TimeNs
    sm_util_pct: Pct | None = None
    mem_util_pct: Pct | None = None
    sm_clock_mhz: NonNegFloat | None = None
    max_sm_clock_mhz: NonNegFloat | None = None
    power_w: NonNegFloat | None = None
    power_limit_w: NonNegFloat | None = None
    temp_c: float | None = None
    throttle_reasons: NonNegInt | None = None
    pcie_gen: NonNegInt | None = None
    max_pcie_gen: NonNegInt | None = None
    pcie_width: NonNegInt | None = None
    max_pcie_width: NonNegInt | None = None
    pcie_tx_Bps: NonNegFloat | None = None
    pcie_rx_Bps: NonNegFloat | None = None
    nvlink_tx_Bps: NonNegFloat | None = None
    nvlink_rx_Bps: NonNegFloat | None = None
    ecc_uncorrected: NonNegInt | None = None
    xid: NonNegInt | None = None
    mem_used_bytes: NonNegInt | None = None
    mem_total_bytes: NonNegInt | None = None


class NicRecord(_Record, tag="nic"):
    """One sample of one NIC port; error counters are cumulative."""

    job: Str
    node: Str
    nic: Str
    ts_ns: TimeNs
    port: Index | None = None
    tx_Bps: NonNegFloat | None = None
    rx_Bps: NonNegFloat | None = None
    link_gbps: NonNegFloat | None = None
    link_up: bool | None = None
    tx_discards: NonNegInt | None = None
    rx_errors: NonNegInt | None = None
    symbol_errors: NonNegInt | None = None
    link_downed: NonNegInt | None = None
    retransmits: NonNegInt | None = None
    cnp_sent: NonNegInt | None = None
    xmit_wait: NonNegInt | None = None


class HostRecord(_Record, tag="host"):
    """One sample of a node's host resources."""

    job: Str
    node: Str
    ts_ns: TimeNs
    cpu_util_pct: Pct | None = None
    load1: NonNegFloat | None = None
    iowait_pct: Pct | None = None
    mem_used_pct: Pct | None = None
    steal_pct: Pct | None = None


class JobRecord(_Record, tag="job"):
    """Job metadata: optional, improves attribution (roles, nodes, stages)."""

    job: Str
    world_size: Degree
    ts_ns: TimeNs | None = None
    rank_nodes: list[Str] | None = None
    rank_stages: list[NonNegInt] | None = None
    rank_dp: list[NonNegInt] | None = None
    rank_roles: list[Str] | None = None
    dp: Degree | None = None
    tp: Degree | None = None
    pp: Degree | None = None


Record = Union[FnRecord, GpuRecord, NicRecord, HostRecord, JobRecord]
RECORD_TYPES: dict[str, type[_Record]] = {
    "fn": FnRecord,
    "gpu": GpuRecord,
    "nic": NicRecord,
    "host": HostRecord,
    "job": JobRecord,
}

_encoder = msgspec.json.Encoder()


def encode_record(record: Record) -> bytes:
    """One JSON line (without newline) in the contract's form."""
    return _encoder.encode(record)
