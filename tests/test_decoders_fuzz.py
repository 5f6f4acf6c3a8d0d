"""Every decoder against hostile bytes: deep nesting, huge numbers, invalid UTF-8, random and truncated input.

Each decoder either returns a value or raises its own, declared error with a
reason; never ``RecursionError``, ``MemoryError``, ``OverflowError`` or any
other exception a consumer would not catch (issue 10: one 2 KB message of
1,000 nested brackets took the sink down for good). Kept fast for the normal
test run: a few hundred hypothesis examples in all.
"""

from __future__ import annotations

import json

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models.digest import WindowDigest, decode_digest, encode_digest
from eroica.models.frames import (
    EndOfStream, FrameError, decode_end_of_stream, decode_frame, decode_job, encode_end_of_stream, encode_frame,
    encode_job,
)
from eroica.models.limits import MAX_DEPTH, LimitError, check_json, check_msgpack, json_depth, msgpack_depth
from eroica.models.reader import decode_line, parse_lines
from eroica.models.records import JobRecord
from eroica.models.verdict import Verdict, decode_verdict, decode_verdicts, encode_verdict
from eroica.sinks.alerts.consumer import _Rejected, decode_verdict_message, decode_window_message
from eroica.sinks.clickhouse.messages import RejectedMessage
from eroica.sinks.clickhouse.messages import decode_summaries as sink_summaries
from eroica.sinks.clickhouse.messages import decode_verdicts as sink_verdicts
from eroica.streams.cores.detector_core import DetectorCore
from eroica.streams.cores.ingest import ingest_message
from eroica.streams.cores.digest_messages import DigestMsg, MessageError, decode_message, encode_message
from eroica.streams.cores.summariser_core import DEADLETTER, PartitionSummariser

FN = {"type": "fn", "job": "j", "node": "n", "rank": 0, "step": 0, "fn": "f", "kind": "kernel",
      "ts_ns": 1, "dur_ns": 2}
VERDICT = Verdict(verdict_id="v1", job="j", window_start_ns=0, window_end_ns=10, detected_at_ns=11, kind="slow",
                  component="gpu", scope="rank", node="n", rank=1, gpu=0, fn="f", slowdown=2.0, score=1.0,
                  confidence=0.9, peers=[0], victims=[], evidence={"a": {"b": [1, 2]}}, summary="s")


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]") -> bytes:
    return open_ * depth + close * depth


def poisoned_json(depth: int) -> bytes:
    """A verdict / record with a deeply nested unknown field: the reported 2 KB message."""
    return b'{"verdict_id":"x","deep":' + nested(depth) + b"}"


def _frames_of_valid_messages() -> list[bytes]:
    from eroica.models.columns import from_records
    from eroica.models.records import FnRecord

    cols = from_records("fn", [msgspec.convert(FN, FnRecord)])
    digest = WindowDigest("j", 0, 10)
    msg = DigestMsg(job="j", start_ns=0, end_ns=10, source="raw/0", keys=["j/0"], closed_through_ns=0, records=1,
                    digest=digest)
    return [encode_frame(cols), encode_end_of_stream(EndOfStream("j", 0)), encode_job(JobRecord(job="j", world_size=2)),
            encode_digest(digest), encode_message(msg), msgspec.msgpack.encode([{"job": "j"}])]


VALID_MSGPACK = _frames_of_valid_messages()
VALID_JSON = [json.dumps(FN).encode(), encode_verdict(VERDICT), b"[" + encode_verdict(VERDICT) + b"]"]

json_poison = st.one_of(
    st.integers(MAX_DEPTH + 1, 5000).map(poisoned_json),
    st.integers(MAX_DEPTH + 1, 5000).map(lambda d: nested(d, b'{"a":', b"}")),
    st.sampled_from([b'{"type":"fn","dur_ns":1e999}', b'{"type":"fn","dur_ns":' + b"9" * 5000 + b"}",
                     b'{"type":"fn","ts_ns":-' + b"9" * 400 + b"}", b'{"type":"fn","job":"\xff\xfe"}',
                     b'{"type":"fn","job":"\xed\xa0\x80"}', b"\x00" * 64, b'"\\ud800"', b"[" * 100_000]),
    st.sampled_from(VALID_JSON).flatmap(lambda v: st.integers(0, len(v)).map(lambda i: v[:i])),
    st.sampled_from(VALID_JSON).flatmap(
        lambda v: st.tuples(st.integers(0, len(v)), st.binary(min_size=1, max_size=8)).map(
            lambda t: v[:t[0]] + t[1] + v[t[0]:])),
    st.binary(max_size=300),
)
msgpack_poison = st.one_of(
    st.integers(MAX_DEPTH + 1, 5000).map(lambda d: b"\x91" * d + b"\x01"),
    st.integers(MAX_DEPTH + 1, 5000).map(lambda d: b"\x81\xa1a" * d + b"\x01"),
    st.sampled_from(VALID_MSGPACK).flatmap(lambda v: st.integers(0, len(v)).map(lambda i: v[:i])),
    st.sampled_from(VALID_MSGPACK).flatmap(
        lambda v: st.tuples(st.integers(0, len(v)), st.binary(min_size=1, max_size=8)).map(
            lambda t: v[:t[0]] + t[1] + v[t[0] + len(t[1]):])),
    st.sampled_from([b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xc6\xff\xff\xff\xff", b"\xc1",
                     b"\xcf" + b"\xff" * 8, b"\xd3\x80" + b"\x00" * 7, b"\xdb\xff\xff\xff\xff\xff"]),
    st.binary(max_size=300),
)
FRAME_HEADERS = [b"EF\x01C", b"EF\x01E", b"EF\x01J"]
frame_poison = st.tuples(st.sampled_from(FRAME_HEADERS), msgpack_poison).map(lambda t: t[0] + t[1])


def _only(call, errors: tuple[type[BaseException], ...]) -> None:
    try:
        call()
    except errors as exc:
        assert str(exc), "a rejection must carry its reason"


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(json_poison)
def test_json_decoders_reject_with_a_reason(data: bytes) -> None:
    _only(lambda: decode_line(data), (msgspec.DecodeError,))
    _only(lambda: decode_verdict(data), (msgspec.DecodeError,))
    _only(lambda: decode_verdicts(data), (msgspec.DecodeError,))
    _only(lambda: sink_verdicts(data), (RejectedMessage,))
    _only(lambda: decode_verdict_message(data), (_Rejected,))
    (batch,) = list(parse_lines(iter([(1, data), (2, json.dumps(FN).encode())]))) or [None]
    assert batch is not None and batch.valid_count >= 1  # the neighbour survives


@FAST
@given(msgpack_poison)
def test_msgpack_decoders_reject_with_a_reason(data: bytes) -> None:
    _only(lambda: decode_digest(data), (msgspec.DecodeError,))
    _only(lambda: decode_message(data), (MessageError,))
    _only(lambda: sink_summaries(data, 1), (RejectedMessage,))
    _only(lambda: decode_window_message(data), (_Rejected,))
    out = DetectorCore(1.0).on_message(data, "tok", 0, 0.0, offset=3)  # never raises: decoded, or dead-lettered
    assert out.acks == ["tok"] or not any(s.topic == DEADLETTER for s in out.sends)


@FAST
@given(frame_poison)
def test_frame_decoders_reject_with_a_reason(data: bytes) -> None:
    for decode in (decode_frame, decode_end_of_stream, decode_job):
        _only(lambda: decode(data), (FrameError,))
    step = PartitionSummariser("raw/0", 10**9, 10**9, 2 * 10**9).on_message(b"j/0", data, "tok", 0.0, 5)
    assert step.acks == ["tok"] or all(s.topic != DEADLETTER for s in step.sends)


@settings(max_examples=25, deadline=None)
@given(st.lists(json_poison, min_size=1, max_size=4), st.integers(1, 30))
def test_ingest_dead_letters_only_the_bad_lines(bad: list[bytes], good: int) -> None:
    lines = [json.dumps({**FN, "rank": i % 4, "ts_ns": i}).encode() for i in range(good)]
    for i, b in enumerate(bad):
        lines.insert(i * 2, b.replace(b"\n", b" "))
    sends, counts = ingest_message(b"\n".join(lines), "ingest/0@1")
    assert counts["records"] >= good and counts["invalid"] <= len(bad)
    for s in sends:
        if s.topic == DEADLETTER:
            doc = msgspec.json.decode(s.value)
            assert doc["reason"] and doc["source"] == "ingest/0@1" and not doc["raw_truncated"]


# ---------------------------------------------------------------------------------------------
# the pre-scans themselves


@settings(max_examples=60, deadline=None)
@given(st.recursive(st.one_of(st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=False), st.text(max_size=5),
                              st.none()),
                    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=3), c, max_size=3)),
                    max_leaves=30))
def test_prescans_measure_depth_exactly(value) -> None:
    def depth(x) -> int:
        if isinstance(x, list):
            return 1 + max(map(depth, x), default=0)
        if isinstance(x, dict):
            return 1 + max(map(depth, x.values()), default=0)
        return 0

    assert json_depth(json.dumps(value).encode()) == depth(value)
    assert json_depth(json.dumps(value, ensure_ascii=False).encode()) == depth(value)
    import msgpack

    def filled(x) -> int:  # msgpack_depth counts the levels of non-empty containers
        if isinstance(x, (list, dict)) and x:
            return 1 + max(map(filled, x.values() if isinstance(x, dict) else x))
        return 0

    assert msgpack_depth(msgpack.packb(value), 10_000) == filled(value)


def test_brackets_in_strings_and_escapes_do_not_count() -> None:
    assert json_depth(b'{"a":"[[[[\\"[[[{{{","b":[1]}') == 2
    assert json_depth(b'["\\\\",[[]]]') == 3
    check_json(b'{"s":"' + b"[" * 10_000 + b'"}', 1 << 20)   # brackets inside a string: fine
    with pytest.raises(LimitError, match="nested 65 levels deep"):
        check_json(nested(65), 1 << 20)
    with pytest.raises(LimitError, match="over the 10-byte bound"):
        check_json(b"[1,2,3,4,5,6]", 10)
    with pytest.raises(LimitError, match="nested more than 64"):
        check_msgpack(b"\x91" * 65 + b"\x01")
    check_msgpack(b"\x91" * 64 + b"\x01")
