"""Messages on the digests topic (``eroica.digests``): summariser -> detector (pure; no Kafka here).

Every message is keyed by job, so all of a job's messages meet, in order per
summariser, on one partition of the digests topic. One msgpack map per
message, tagged by ``type``:

``digest``   a :class:`~eroica.models.digest.WindowDigest` of the ranks/nodes one raw
             partition (``source``) holds for one job window, with ``records`` (how
             many raw records went in: after a restart a source may send a window
             again from fewer records, and the detector keeps the fullest) and the
             source's progress (below).
``progress`` a source closed windows up to ``closed_through_ns`` without data to send.
``job``      the job's contract ``job`` record, forwarded from the raw topic.
``end``      every key (``job/rank``, ``job/node``) of the job on this source sent its
             end-of-stream marker, and everything before it was sent; ``job_keys``
             is the job's total key count from the markers.

Progress, carried by every message but ``job``: ``keys`` are all the keys of the
job the source has seen, and ``closed_through_ns`` the start of the last window
the source has closed for them (data or not). A job window is complete at the
detector once every key it expects is covered by a source that closed it.
"""

from __future__ import annotations

from typing import Union

import msgspec

from eroica.models.digest import DIGEST_VERSION, WindowDigest, decoder, encoder
from eroica.models.limits import MAX_MESSAGE_BYTES, LimitError, check_msgpack, failure_reason
from eroica.models.records import JobRecord

MESSAGE_VERSION = 1


class DigestMsg(msgspec.Struct, tag="digest", kw_only=True):
    job: str
    start_ns: int
    end_ns: int
    source: str
    keys: list[str]
    closed_through_ns: int
    records: int
    digest: WindowDigest
    # wall clock (epoch ns) at which the summariser closed the window; the detector measures its verdict
    # delay from it (runtime/metrics.py VERDICT_DELAY). None: an edge digest or an older summariser.
    closed_at_ns: int | None = None
    v: int = MESSAGE_VERSION


class ProgressMsg(msgspec.Struct, tag="progress", kw_only=True):
    job: str
    source: str
    keys: list[str]
    closed_through_ns: int
    v: int = MESSAGE_VERSION


class JobMsg(msgspec.Struct, tag="job", kw_only=True):
    job: str
    record: JobRecord
    v: int = MESSAGE_VERSION


class EndMsg(msgspec.Struct, tag="end", kw_only=True):
    job: str
    source: str
    keys: list[str]
    closed_through_ns: int
    job_keys: int | None = None
    v: int = MESSAGE_VERSION


SummaryMsg = Union[DigestMsg, ProgressMsg, JobMsg, EndMsg]

_encoder = encoder()  # digests' columns are arrays (models.digest)
_decoder: msgspec.msgpack.Decoder[SummaryMsg] = decoder(SummaryMsg)


class MessageError(ValueError):
    """A summaries-topic message that cannot be read (the text says why)."""


def encode_message(msg: SummaryMsg) -> bytes:
    return _encoder.encode(msg)


def decode_message(data: bytes) -> SummaryMsg:
    """The message, or MessageError with the reason, whatever ``data`` holds (size and depth bounded first)."""
    try:
        check_msgpack(data, MAX_MESSAGE_BYTES, what="summaries message")
        msg = _decoder.decode(data)
    except LimitError as exc:
        raise MessageError(f"not a summaries message: {exc}") from None
    except msgspec.DecodeError as exc:
        raise MessageError(f"not a summaries message: {exc}") from None
    except Exception as exc:  # RecursionError, MemoryError, TypeError...: a reason, never a crash
        raise MessageError(f"not a summaries message: {failure_reason(exc)}") from None
    if msg.v != MESSAGE_VERSION:
        raise MessageError(f"unknown summaries message version {msg.v} (this reader knows {MESSAGE_VERSION})")
    if isinstance(msg, DigestMsg) and msg.digest.version != DIGEST_VERSION:
        raise MessageError(f"unknown digest version {msg.digest.version}")
    return msg
