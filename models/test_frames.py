"""Frames: the columnar wire form round-trips every record type exactly, and refuses garbage."""

from __future__ import annotations

import json

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eroica.models.columns import SCHEMAS, concat, empty, to_records
from eroica.models.frames import (
    COLUMNS, END_OF_STREAM, JOB, EndOfStream, FrameError, decode_end_of_stream, decode_frame, decode_job,
    encode_end_of_stream, encode_frame, encode_job, frame_kind,
)
from eroica.models.reader import parse_lines
from eroica.models.records import MAX_DUR_NS, MAX_TS_NS

LINES = [
    {"type": "fn", "job": "j1", "node": "n0", "rank": 0, "step": 3, "fn": "aten::mm", "kind": "kernel",
     "ts_ns": 10, "dur_ns": 5, "stream": 7},
    {"type": "fn", "job": "j1", "node": "n0", "rank": 1, "step": 3, "fn": "ncclAllReduce", "kind": "collective",
     "ts_ns": 11, "dur_ns": 50, "bytes": 1 << 30, "op": "all_reduce", "group": "g0", "in_flight": True,
     "stack": "train;step;allreduce"},
    {"type": "fn", "job": "j2", "node": "n1", "rank": 0, "step": 0, "fn": "DataLoader.__next__",
     "kind": "dataloader", "ts_ns": 12, "dur_ns": 0},
    {"type": "gpu", "job": "j1", "node": "n0", "rank": 0, "gpu": 1, "ts_ns": 20, "sm_clock_mhz": 1410.5,
     "max_sm_clock_mhz": 1980.0, "throttle_reasons": 8, "xid": 0, "temp_c": -3.5},
    {"type": "gpu", "job": "j1", "node": "n0", "rank": 1, "gpu": 0, "ts_ns": 21},
    {"type": "nic", "job": "j1", "node": "n0", "nic": "mlx5_0", "ts_ns": 30, "port": 1, "tx_Bps": 1e9,
     "link_up": False, "retransmits": 12},
    {"type": "nic", "job": "j1", "node": "n1", "nic": "eth0", "ts_ns": 31, "link_up": True},
    {"type": "host", "job": "j1", "node": "n0", "ts_ns": 40, "cpu_util_pct": 350.0, "load1": 2.5},
]


def _batch(lines: list[dict]):
    raw = [(i + 1, json.dumps(x).encode()) for i, x in enumerate(lines)]
    (batch,) = parse_lines(iter(raw))
    assert not batch.invalid
    return batch


def _canonical(recs: list[dict]) -> list[dict]:
    return sorted((json.dumps(r, sort_keys=True) for r in recs))


@pytest.mark.parametrize("type_", ["fn", "gpu", "nic", "host"])
def test_round_trip_every_type(type_: str) -> None:
    cols = _batch(LINES).columns[type_]
    meta = {"seq": np.int64(4), "producer": "abc", "flag": np.bool_(True)}
    data = encode_frame(cols, meta)
    assert frame_kind(data) == COLUMNS
    back, meta_back = decode_frame(data)
    assert meta_back == {"seq": 4, "producer": "abc", "flag": True}
    assert back.type == type_ and len(back) == len(cols)
    assert list(back.arrays) == list(SCHEMAS[type_])
    assert to_records(back) == to_records(cols)
    expected = [x for x in LINES if x["type"] == type_]
    assert _canonical(to_records(back)) == _canonical(expected)


def test_decode_is_zero_copy_and_read_only() -> None:
    cols = _batch(LINES).columns["fn"]
    back, _ = decode_frame(encode_frame(cols))
    ts = back.arrays["ts_ns"]
    assert not ts.flags.writeable and not ts.flags.owndata  # a view on the message's buffer


def test_vocabulary_is_compacted_to_what_the_frame_uses() -> None:
    cols = _batch(LINES).columns["fn"]
    one = cols.take(np.array([1]))  # shares the batch vocabulary of 3 functions
    back, _ = decode_frame(encode_frame(one))
    assert back.vocab["fn"] == ["ncclAllReduce"]
    assert back.vocab["job"] == ["j1"]
    assert to_records(back) == to_records(one)


def test_empty_frame() -> None:
    for type_ in SCHEMAS:
        back, meta = decode_frame(encode_frame(empty(type_)))
        assert back.type == type_ and len(back) == 0 and meta == {}
        assert all(len(a) == 0 for a in back.arrays.values())


def test_end_of_stream_and_job_frames() -> None:
    eos = EndOfStream("j1", 3, "", records=1234, frames=2, meta={"producer": "p"})
    data = encode_end_of_stream(eos)
    assert frame_kind(data) == END_OF_STREAM
    assert decode_end_of_stream(data) == eos
    node_eos = EndOfStream("j1", -1, "node-7", 5, 1)
    assert decode_end_of_stream(encode_end_of_stream(node_eos)) == node_eos

    job = _batch([{"type": "job", "job": "j1", "world_size": 2, "rank_nodes": ["a", "b"], "pp": 2}]).jobs[0]
    data = encode_job(job)
    assert frame_kind(data) == JOB
    assert decode_job(data) == job
    with pytest.raises(FrameError, match="expected a columns frame, got job"):
        decode_frame(data)


def _body(data: bytes) -> dict:
    return msgpack.unpackb(data[4:], raw=False)


def _repack(data: bytes, body: dict) -> bytes:
    return data[:4] + msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"", "not an Eroica frame"),
    (lambda d: b'{"type": "fn"}', "not an Eroica frame"),
    (lambda d: d[:2] + b"\x09" + d[3:], "unsupported frame format version 9"),
    (lambda d: d[:3] + b"Z" + d[4:], "unknown frame kind"),
    (lambda d: d[:40], "corrupt columns frame"),
    (lambda d: d[:4] + b"\xc1garbage", "corrupt columns frame"),
    (lambda d: _repack(d, {**_body(d), "t": "bogus"}), "unknown record type 'bogus'"),
    (lambda d: _repack(d, {k: v for k, v in _body(d).items() if k != "v"}), "missing field 'v'"),
    (lambda d: _repack(d, {**_body(d), "n": 7}), "holds .* bytes, expected 7"),
    (lambda d: _repack(d, {**_body(d), "c": _body(d)["c"][1:]}), "missing columns \\['job'\\]"),
    (lambda d: _repack(d, {**_body(d), "c": [["job", "<f8", b"\0" * 24]] + _body(d)["c"][1:]}),
     "column 'job' is <f8, expected <i4"),
    (lambda d: _repack(d, {**_body(d), "v": {**_body(d)["v"], "fn": ["only-one"]}}), "outside its vocabulary"),
    (lambda d: _repack(d, {**_body(d), "c": [["job", "bad dtype!", b""]] + _body(d)["c"][1:]}), "bad dtype"),
])
def test_corrupt_frames_raise_frame_error(mutate, message: str) -> None:
    data = encode_frame(_batch(LINES).columns["fn"])
    decode_frame(data)  # its layout is now known: the corrupt variants must still be refused
    with pytest.raises(FrameError, match=message):
        decode_frame(mutate(data))


def test_unknown_columns_from_a_newer_writer_are_ignored() -> None:
    data = encode_frame(_batch(LINES).columns["host"])
    body = _body(data)
    body["c"].append(["future_field", "<f8", b"\0" * 8])
    back, _ = decode_frame(_repack(data, body))
    assert "future_field" not in back.arrays and len(back) == 1


def test_big_endian_buffers_are_converted() -> None:
    cols = _batch(LINES).columns["fn"]
    data = encode_frame(cols)
    body = _body(data)
    swapped = []
    for name, dstr, buf in body["c"]:
        big = np.dtype(dstr).newbyteorder(">")
        swapped.append([name, big.str, np.frombuffer(buf, dstr).astype(big).tobytes()])
    body["c"] = swapped
    back, _ = decode_frame(_repack(data, body))
    assert to_records(back) == to_records(cols)


names = st.sampled_from(["a", "b", "node-é", "", "x" * 256])
fn_line = st.fixed_dictionaries(
    {"type": st.just("fn"), "job": names, "node": names, "rank": st.integers(0, 2**31 - 1),
     "step": st.integers(0, 2**63 - 1), "fn": names, "kind": st.sampled_from(["python", "kernel", "io"]),
     "ts_ns": st.integers(0, MAX_TS_NS), "dur_ns": st.integers(0, MAX_DUR_NS)},
    optional={"bytes": st.integers(0, 2**63 - 1), "group": names.filter(bool), "stream": st.integers(0, 2**31 - 1),
              "stack": names.filter(bool), "in_flight": st.just(True)})
gpu_line = st.fixed_dictionaries(
    {"type": st.just("gpu"), "job": names, "node": names, "rank": st.integers(0, 1000), "gpu": st.integers(0, 7),
     "ts_ns": st.integers(0, MAX_TS_NS)},
    optional={"sm_clock_mhz": st.floats(0, 1e4, allow_nan=False), "xid": st.integers(0, 2**53)})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(fn_line, gpu_line), min_size=1, max_size=30), st.integers(1, 7))
def test_property_frames_of_any_slice_round_trip(lines: list[dict], cut: int) -> None:
    batch = _batch(lines)
    for cols in batch.columns.values():
        parts = [cols.take(np.arange(i, min(i + cut, len(cols)))) for i in range(0, len(cols), cut)]
        decoded = [decode_frame(encode_frame(p))[0] for p in parts]
        assert to_records(concat(decoded)) == to_records(cols)


def test_a_frame_nested_deep_is_refused_where_it_is_kept_and_dropped_where_it_is_not() -> None:
    """No pre-scan on the hot path: msgpack's own stack bounds the body, ``m`` gets a depth check."""
    data = encode_frame(_batch(LINES).columns["fn"])
    deep: object = 1
    for _ in range(500):
        deep = [deep]
    with pytest.raises(FrameError, match="nested more than"):
        decode_frame(_repack(data, {**_body(data), "m": {"x": deep}}))
    cols, meta = decode_frame(_repack(data, {**_body(data), "zz_future": deep}))  # unknown: ignored
    assert len(cols) == len(decode_frame(data)[0]) and meta == {}
    too_deep = data[:4] + b"\x81\xa1m" + b"\x91" * 2000 + b"\x01"  # past msgpack's own 1,024 levels
    with pytest.raises(FrameError, match="corrupt columns frame"):
        decode_frame(too_deep)
