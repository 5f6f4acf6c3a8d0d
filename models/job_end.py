"""The job-end marker: the detector's word, on the verdict topic, that a job's telemetry stream ended.

The detector knows when a job ends (every key of the job sent its
end-of-stream marker and the job's last windows were analysed); consumers of
the verdict topic did not, so an alert stayed open, reminding, until its wall
clock ran out ("stale"). The detector now publishes one marker per ending,
keyed by the job, right after the job's last verdicts::

    {"type": "job_end", "v": 1, "job": "J", "last_window_start_ns": 1700000030000000000,
     "detected_at_ns": 1700000031234567890}

Why the verdict topic and not a topic of its own: the marker must come
*after* every verdict of the job, and only one partition of one topic orders
messages. The job's verdicts and its marker share the key (the job), so they
share a partition and a consumer that reads the marker has already read every
verdict before it. A separate topic gives no such order (a consumer could
resolve an incident, then read the verdict that opens it) and one more topic
to create, secure and retain.

Telling it apart: a message of the verdict topic is a job-end marker if and
only if it is a JSON object whose ``type`` is ``"job_end"`` (no contract
verdict has a ``type`` field, and the marker lacks every required verdict
field, so a reader that knows only verdicts rejects it with a reason instead of
misreading it). Readers that know the marker skip it (the ClickHouse sink) or
act on it (the alert consumer resolves the job's incidents). Unknown fields
are ignored (later versions may add some); ``v`` is the marker's version.

An optional, additive extension of telemetry-v1's verdict topic (README,
"Alerting"); nothing in a verdict changes.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from .limits import MAX_VERDICT_BYTES, check_json

__all__ = ["JobEnd", "JOB_END_TYPE", "encode_job_end", "decode_job_end"]

JOB_END_TYPE = "job_end"


class JobEnd(msgspec.Struct, kw_only=True, forbid_unknown_fields=False, tag_field="type", tag=JOB_END_TYPE):
    """One job's end: every key ended and its windows through ``last_window_start_ns`` were analysed."""

    v: int = 1
    job: str
    last_window_start_ns: int = -1   # start of the job's last analysed window (-1: none)
    detected_at_ns: int = 0          # wall time the detector saw the end


class _Type(msgspec.Struct, forbid_unknown_fields=False):
    """The discriminator alone, required (msgspec accepts a lone tagged struct without its tag)."""

    type: Literal["job_end"]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(JobEnd)
_type = msgspec.json.Decoder(_Type)
_NEEDLE = b'"' + JOB_END_TYPE.encode() + b'"'


def encode_job_end(marker: JobEnd) -> bytes:
    return _encoder.encode(marker)


def decode_job_end(data: bytes | None) -> JobEnd | None:
    """The marker, or None when ``data`` is not one (a verdict, or anything else: the caller's rule applies).

    Never raises: a message that is not a marker is left to the verdict decoder,
    which gives the reason. The substring test only skips the decode for the
    messages that cannot be markers; the decode decides.
    """
    if not data or _NEEDLE not in data:
        return None
    try:
        check_json(data, MAX_VERDICT_BYTES, what="job-end marker")
        _type.decode(data)  # "type": "job_end" present (a verdict of a job named job_end is no marker)
        return _decoder.decode(data)
    except Exception:  # DecodeError, LimitError, RecursionError...: not a marker
        return None
