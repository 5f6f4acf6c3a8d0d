"""Pure shaping of the sink worker: message bytes -> rows or a dead-letter reason; the pending batch."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable

import msgspec
import pytest
from eroica.kafka.deadletter import deadletter_message
from eroica.models.deadletter import decode_deadletter
from eroica.models.summary import WindowSummary
from eroica.models.verdict import Verdict, encode_verdict, encode_verdicts
from eroica.sinks.clickhouse.messages import (
    DecodedMessage,
    PendingBatch,
    RejectedMessage,
    decode_summaries,
    decode_verdicts,
)
from eroica.sinks.clickhouse.schema import SUMMARY_NAMES, VERDICT_NAMES


def _summary(**kw: object) -> dict:
    base = dict(job="j", window_start_ns=10, window_end_ns=20, rank=3, node="n0", fn="aten::mm", kind="kernel",
                count=5, median_ns=1.0, p90_ns=2.0, p99_ns=3.0, total_ns=9.0, beta=0.5, slowdown_vs_peers=math.nan)
    base.update(kw)
    return base


def test_one_verdict_per_message_and_a_list(make_verdict: Callable[..., Verdict]) -> None:
    v = make_verdict()
    [(got, row)] = decode_verdicts(encode_verdict(v))
    assert got == v and len(row) == len(VERDICT_NAMES) and row[0] == v.verdict_id
    many = decode_verdicts(encode_verdicts([v, make_verdict(rank=2)]))
    assert [g.rank for g, _ in many] == [17, 2]


@pytest.mark.parametrize("value, reason", [
    (b"", "empty message"),
    (None, "empty message"),
    (b"{not json", "invalid verdict"),
    (b"[]", "empty verdict list"),
    (b'{"verdict_id": "x"}', "invalid verdict"),
])
def test_rejects_with_a_reason(value: bytes | None, reason: str) -> None:
    with pytest.raises(RejectedMessage, match=reason):
        decode_verdicts(value)


def test_rejects_values_outside_the_contract_or_the_columns(make_verdict: Callable[..., Verdict]) -> None:
    doc = msgspec.to_builtins(make_verdict())
    for field, bad, match in (("component", "toaster", "component"), ("rank", 2**40, "Int32"),
                              ("window_start_ns", -5, "UInt64"), ("verdict_id", "", "empty verdict_id")):
        with pytest.raises(RejectedMessage, match=match):
            decode_verdicts(json.dumps({**doc, field: bad}).encode())
    with pytest.raises(RejectedMessage, match="window ends before"):
        decode_verdicts(json.dumps({**doc, "window_end_ns": doc["window_start_ns"] - 1}).encode())


def test_unknown_fields_are_ignored(make_verdict: Callable[..., Verdict]) -> None:
    doc = {**msgspec.to_builtins(make_verdict()), "from_the_future": 1}
    assert decode_verdicts(json.dumps(doc).encode())[0][0] == make_verdict()


def test_summaries_keep_nan_and_carry_the_version() -> None:
    rows = decode_summaries(msgspec.msgpack.encode([_summary(), _summary(rank=4)]), written_at_ns=77)
    assert len(rows) == 2 and rows[1][SUMMARY_NAMES.index("rank")] == 4
    assert math.isnan(rows[0][SUMMARY_NAMES.index("slowdown_vs_peers")])
    assert rows[0][SUMMARY_NAMES.index("written_at_ns")] == 77
    assert decode_summaries(msgspec.msgpack.encode([]), 1) == []
    for bad in (b"\xc1", msgspec.msgpack.encode([{"job": "j"}]), msgspec.msgpack.encode([_summary(count=-1)])):
        with pytest.raises(RejectedMessage, match="window summar"):
            decode_summaries(bad, 1)
    assert WindowSummary  # the decoder's type


def test_deadletter_keeps_position_reason_and_the_whole_payload() -> None:
    doc = json.loads(deadletter_message("eroica.verdicts", 3, 41, b"job-1", b"{bad" * 1000, "invalid verdict: x"))
    assert doc["source"] == "eroica.verdicts" and doc["partition"] == 3 and doc["offset"] == doc["line"] == 41
    assert doc["key"] == "job-1" and doc["reason"] == "invalid verdict: x"
    assert doc["raw"] == "{bad" * 1000 and doc["raw_encoding"] == "text" and not doc["raw_truncated"]
    assert doc["raw_bytes"] == 4000 and doc["raw_sha256"] == hashlib.sha256(b"{bad" * 1000).hexdigest()
    # past the bound: a durable reference (topic/partition/offset, size, sha256) and the first bytes
    big = b"x" * (2 << 20)
    ref = json.loads(deadletter_message("eroica.verdicts", 3, 42, None, big, "too big"))
    assert ref["raw_truncated"] and ref["raw"] == "x" * 4096 and ref["raw_bytes"] == len(big)
    assert ref["raw_sha256"] == hashlib.sha256(big).hexdigest() and (ref["partition"], ref["offset"]) == (3, 42)
    binary = json.loads(deadletter_message("eroica.window-summaries", 0, 1, None, b"\xc1\xff", "r"))
    assert binary["raw_encoding"] == "base64" and binary["raw"] == "wf8="


def test_one_dead_letter_reader_for_both_forms() -> None:
    """The reader gives topic, partition and offset for today's form and for the stream workers' former one."""
    now = decode_deadletter(deadletter_message("eroica.raw", 3, 41, b"j/0", b"\xc1\xff", "corrupt"))
    assert (now.topic, now.partition, now.offset, now.key, now.payload()) == ("eroica.raw", 3, 41, "j/0", b"\xc1\xff")
    old = decode_deadletter(json.dumps({"source": "eroica.summaries/3", "line": 41, "reason": "x", "raw": "abc",
                                        "raw_encoding": "text"}).encode())
    assert (old.source, old.topic, old.partition, old.offset, old.payload()) == ("eroica.summaries", "eroica.summaries",
                                                                                  3, 41, b"abc")
    line = decode_deadletter(json.dumps({"source": "eroica.ingest/0@7", "line": 2, "reason": "x"}).encode())
    assert line.partition is None and line.topic is None and line.line == 2


def test_pending_batch_offsets_and_due() -> None:
    b = PendingBatch()
    assert not b.due(100.0, 10, 0.5)
    b.add(DecodedMessage("v", 0, 7, None, verdict_rows=[(1,)]), now=1.0)
    b.add(DecodedMessage("v", 0, 5, None, verdict_rows=[(2,)]), now=1.1)
    b.add(DecodedMessage("p", 1, 2, None, summary_rows=[(3,), (4,)]), now=1.2)
    b.add(DecodedMessage("v", 1, 0, None, deadletter=b"{}"), now=1.3)
    assert b.offsets == {("v", 0): 8, ("p", 1): 3, ("v", 1): 1}
    assert b.rows == 4 and len(b.deadletters()) == 1
    assert b.due(1.2, 4, 10.0) and not b.due(1.2, 5, 10.0) and b.due(1.5, 5, 0.5)
    assert b.drop_partitions([("v", 0)]) == 2
    assert b.offsets == {("p", 1): 3, ("v", 1): 1} and b.rows == 2
    b.drop_partitions([("p", 1), ("v", 1)])
    assert b.started_at is None and not b.due(99.0, 1, 0.0)
