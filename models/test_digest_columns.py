"""Digest rows hold numpy columns in memory and msgpack arrays of numbers on the wire (``models.digest``)."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from eroica.models.digest import CollRows, FnRows, WindowDigest, concat_rows, decode_digest, encode_digest


def _lists() -> dict:
    """A digest as plain lists, the wire form every earlier version wrote."""
    return {"job": "j", "start_ns": 0, "end_ns": 10,
            "fns": {"rank": [3, 1], "fn": ["gemm", "load"], "stack": ["", ""], "kind": [1, 4], "count": [2, 1],
                    "total_ns": [5.0, 2.5], "excl_ns": [5.0, 2.5], "median_ns": [2.5, 2.5], "p90_ns": [3.0, 2.5],
                    "p99_ns": [3.0, 2.5], "per_step_ns": [5.0, 2.5], "step": [-1, 7], "steps": [1, 1],
                    "low_ns": [5.0, float("nan")]},
            "colls": {"rank": [1], "group": ["dp"], "step": [7], "dur_ns": [9], "bytes": [float("nan")],
                      "calls": [2], "p2p": [True], "op": [4]}}


def test_the_wire_bytes_are_those_of_lists_and_decode_to_typed_arrays() -> None:
    wire = _lists()
    d = decode_digest(msgspec.msgpack.encode(wire))
    assert d.fns.rank.dtype == np.int64 and d.fns.total_ns.dtype == np.float64 and d.colls.p2p.dtype == np.bool_
    assert d.fns.fn == ["gemm", "load"] and len(d.fns) == 2 and len(d.in_flight) == 0
    assert d.in_flight.rank.dtype == np.int64  # absent columns: empty, typed
    assert math.isnan(d.fns.low_ns[1])
    # Encoded back, every column given is the same msgpack bytes as its list (ints stay ints, floats floats, NaN).
    again = msgspec.msgpack.decode(encode_digest(d))
    for rows in ("fns", "colls"):
        for column, values in wire[rows].items():
            assert msgspec.msgpack.encode(again[rows][column]) == msgspec.msgpack.encode(values), (rows, column)
    assert encode_digest(decode_digest(encode_digest(d))) == encode_digest(d)


@pytest.mark.parametrize("column, value", [("rank", ["x"]), ("rank", [1.5]), ("rank", [True]), ("rank", 5),
                                           ("rank", [[1]]), ("total_ns", [1.0, None]), ("rank", [2**64 - 1])])
def test_a_column_of_anything_but_its_numbers_is_refused_with_its_name(column: str, value: object) -> None:
    wire = _lists()
    wire["fns"][column] = value
    with pytest.raises(msgspec.DecodeError, match=column):
        decode_digest(msgspec.msgpack.encode(wire))


def test_rows_built_from_lists_are_arrays_and_compare_by_value() -> None:
    a = FnRows(rank=[1, 2], fn=["x", "y"], total_ns=[1, float("nan")])
    assert a.rank.dtype == np.int64 and a.total_ns.dtype == np.float64
    assert a == FnRows(rank=np.array([1, 2], dtype=np.int32), fn=["x", "y"], total_ns=[1.0, float("nan")])
    assert a != FnRows(rank=[1, 3], fn=["x", "y"], total_ns=[1, float("nan")])
    both = concat_rows([a, FnRows(rank=[5], fn=["z"], total_ns=[3.0])])
    assert both.rank.tolist() == [1, 2, 5] and both.fn == ["x", "y", "z"] and both.rank is not a.rank
    assert WindowDigest("j", 0, 1, colls=CollRows(rank=[1], p2p=[True])) == WindowDigest(
        "j", 0, 1, colls=CollRows(rank=[1], p2p=[True]))
    with pytest.raises(TypeError, match="rank"):
        FnRows(rank=["a"])
