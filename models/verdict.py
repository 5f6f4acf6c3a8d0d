"""The verdict: Eroica's output record, exactly as telemetry-v1 defines it.

``verdict_id`` is a hash of *what* was found and *when* (job, window, kind,
component, scope, node, rank, gpu, fn) and of nothing else, so the same finding
on the same window always gets the same id: replays and restarts rewrite rows
instead of duplicating them. ``incident_id`` is an optional extension field
that links the windows of one persisting problem (same hash without the window).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, TypeVar, Union, get_args

import msgspec

from .limits import MAX_VERDICT_BYTES, LimitError, check_json, failure_reason

VerdictKind = Literal["slow", "hang"]
Component = Literal[
    "gpu", "gpu_memory", "pcie", "nvlink", "nic", "network", "host_cpu", "dataloader",
    "storage", "python", "workload", "config", "software",
]
Scope = Literal["rank", "node", "job"]
COMPONENTS: tuple[str, ...] = get_args(Component)


class Verdict(msgspec.Struct, forbid_unknown_fields=False, kw_only=True):
    """One finding about one job window (field order is the contract's)."""

    verdict_id: str
    job: str
    window_start_ns: int
    window_end_ns: int
    detected_at_ns: int
    kind: VerdictKind
    component: Component
    scope: Scope
    node: str
    rank: int
    gpu: int
    fn: str
    slowdown: float
    score: float
    confidence: float
    peers: list[int]
    victims: list[int]
    evidence: dict[str, Any]
    summary: str
    # Optional extension (allowed by the contract): links the windows of one problem.
    incident_id: str = ""
    # Optional extension: what the problem costs (streams/detection/cost.py); null when unknown.
    job_slowdown: float | None = None             # the window's S: mean step time / ideal step time
    cost: float | None = None                     # the culprit's S_X: step time with only it slow / ideal
    gpu_hours_lost_per_hour: float | None = None  # world size x (1 - 1/cost)


def _digest(*parts: object) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(str(p).encode())
        h.update(b"\x1f")
    return h.hexdigest()


# (job, kind, component, scope, node, rank, gpu, fn): what a verdict id hashes besides its window.
FindingKey = tuple[str, str, str, str, str, int, int, str]


def finding_key(job: str, kind: str, component: str, scope: str, node: str, rank: int, gpu: int, fn: str) -> FindingKey:
    return (job, kind, component, scope, node, int(rank), int(gpu), fn)


def verdict_id(window_start_ns: int, window_end_ns: int, key: FindingKey) -> str:
    """Stable id of a finding on a window."""
    return _digest("v1", int(window_start_ns), int(window_end_ns), *key)


def incident_id(key: FindingKey) -> str:
    """Stable id of a finding across windows."""
    return _digest("i1", *key)


def _enc_hook(obj: Any) -> Any:
    """Evidence is built from numpy results: encode its scalars and arrays as plain JSON."""
    if hasattr(obj, "tolist"):  # numpy scalar or array
        return obj.tolist()
    raise NotImplementedError(f"cannot encode {type(obj).__name__} in a verdict")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_list_decoder = msgspec.json.Decoder(list[Verdict])
_one_decoder = msgspec.json.Decoder(Verdict)
_message_decoder = msgspec.json.Decoder(Union[Verdict, list[Verdict]])


def encode_verdicts(verdicts: list[Verdict]) -> bytes:
    return _encoder.encode(verdicts)


def encode_verdict(verdict: Verdict) -> bytes:
    return _encoder.encode(verdict)


_T = TypeVar("_T")


def _guarded(decoder: msgspec.json.Decoder[_T], data: bytes, what: str) -> _T:
    """Decode with size and depth bounded first; every failure is a ``msgspec.DecodeError`` with its reason.

    msgspec has no depth limit: a 2 KB verdict with 1,000 nested ``[`` in an
    unknown field raised ``RecursionError`` past every ``except DecodeError``.
    """
    try:
        check_json(data, MAX_VERDICT_BYTES, what=what)
        return decoder.decode(data)
    except msgspec.DecodeError:
        raise
    except LimitError as exc:
        raise msgspec.DecodeError(str(exc)) from None
    except Exception as exc:  # RecursionError, MemoryError, TypeError...: a reason, never a crash
        raise msgspec.DecodeError(failure_reason(exc, what)) from None


def decode_verdicts(data: bytes) -> list[Verdict]:
    """A JSON array of verdicts; ``msgspec.DecodeError`` (with the reason) for anything else."""
    return _guarded(_list_decoder, data, "verdict list")


def decode_verdict(data: bytes) -> Verdict:
    """One JSON verdict; ``msgspec.DecodeError`` (with the reason) for anything else."""
    return _guarded(_one_decoder, data, "verdict")


def decode_verdict_message(data: bytes | None) -> list[Verdict]:
    """The verdicts of one verdict-topic message: one JSON verdict, or a JSON array of them.

    The one decoder of verdict messages (the ClickHouse sink, the alert
    consumer, tests). The JSON value's own type picks the form, so nothing
    sniffs the first byte; ``msgspec.DecodeError`` with the reason for
    anything else (empty, another JSON type, too large or too deep: size and
    depth are bounded first). An empty array decodes to ``[]``: whether that
    is acceptable is the reader's rule.
    """
    if not data:
        raise msgspec.DecodeError("empty message (no verdict)")
    got = _guarded(_message_decoder, data, "verdict message")
    return got if isinstance(got, list) else [got]
