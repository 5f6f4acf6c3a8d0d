"""The compiled msgpack depth walk gives the interpreted walk's answers and errors, byte for byte.

The interpreted walk (with its fast paths) is the reference; the kernel source
runs compiled (numba, as production loads it) and interpreted (the same source
as plain Python), on packed values, on those values cut short, edited and
spliced with the never-used 0xC1 byte, on nesting at the bound, and on the
array shapes the fast paths skip.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any, Iterator

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models import limits
from eroica.models.limits import MAX_DEPTH, LimitError, msgpack_depth

KINDS = ["python", pytest.param("numba", marks=pytest.mark.skipif(importlib.util.find_spec("numba") is None,
                                                                   reason="numba not installed (the fast extra)"))]


@pytest.fixture(params=KINDS)
def kernel(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param
    limits.use_kernel(None)


def outcome(kind: str, data: bytes, max_depth: int) -> tuple[str, Any]:
    limits.use_kernel(kind)
    try:
        return "depth", msgpack_depth(data, max_depth, what="message")
    except LimitError as exc:
        return "refused", str(exc)


def same(kind: str, data: bytes, max_depth: int = MAX_DEPTH) -> tuple[str, Any]:
    want = outcome("none", data, max_depth)
    got = outcome(kind, data, max_depth)
    assert got == want, (kind, data[:64], max_depth)
    return want


scalars = st.one_of(st.integers(-2**63, 2**64 - 1), st.floats(), st.text(max_size=40), st.binary(max_size=300),
                    st.none(), st.booleans(),
                    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=20)))
values = st.recursive(scalars, lambda c: st.one_of(st.lists(c, max_size=6),
                                                     st.dictionaries(st.text(max_size=4), c, max_size=4)),
                      max_leaves=60)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=values, max_depth=st.sampled_from([0, 1, 2, 3, 64]), data=st.data())
def test_kernel_walks_as_the_interpreted_walk(kernel: str, value: Any, max_depth: int, data: st.DataObject) -> None:
    packed = msgpack.packb(value, use_bin_type=True)
    same(kernel, packed, max_depth)
    # the same bytes cut short, with trailing bytes, edited, and spliced with 0xC1
    cut = data.draw(st.integers(0, len(packed)))
    same(kernel, packed[:cut], max_depth)
    same(kernel, packed + data.draw(st.binary(max_size=8)), max_depth)
    edited = bytearray(packed)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(edited) - 1))
        edited[i] = data.draw(st.integers(0, 255))
    same(kernel, bytes(edited), max_depth)
    at = data.draw(st.integers(0, len(packed)))
    same(kernel, packed[:at] + b"\xc1" + packed[at:], max_depth)


def test_kernel_at_the_bound_and_on_the_fast_paths(kernel: str) -> None:
    for levels in (MAX_DEPTH - 1, MAX_DEPTH, MAX_DEPTH + 1, 1000):
        chain = b"\x91" * levels + b"\x01"
        assert same(kernel, chain)[0] == ("depth" if levels <= MAX_DEPTH else "refused")
        as_map = b"\x81\xa1k" * levels + b"\xc0"
        same(kernel, as_map)
    assert same(kernel, b"\x92\x01\xc1") == ("refused", "message is not msgpack: byte 0xc1 at offset 2")
    rng = np.random.default_rng(7)
    # arrays the interpreted walk skips in one comparison: float64 (with nan and inf), one-byte ints
    floats = rng.normal(size=5000).tolist() + [math.nan, math.inf, -math.inf]
    ints = rng.integers(-32, 128, size=70_000).tolist()   # longer than its fast path's run of 65,536
    for v in (floats, ints, [floats, {"x": ints}], {"a": [floats[:3], [ints[:2]]]}, [[]], {}, []):
        for max_depth in (0, 1, 2, MAX_DEPTH):
            packed = msgpack.packb(v)
            same(kernel, packed, max_depth)
            same(kernel, packed[:-3], max_depth)
    # every length-field width: str 8/16/32, bin 8/16/32, array 16/32, map 16/32, ext 8/16/32
    for v in ("s" * 40, "s" * 300, "s" * 70_000, b"b" * 40, b"b" * 300, b"b" * 70_000, list(range(20)),
              {str(i): i for i in range(20)}, msgpack.ExtType(5, b"e" * 40), msgpack.ExtType(5, b"e" * 300),
              msgpack.ExtType(5, b"e" * 70_000), [[1.5] * 3] * 70_000):
        packed = msgpack.packb(v, use_bin_type=True)
        same(kernel, packed)
        same(kernel, packed[:2])


def test_a_process_loads_the_kernel_once_it_has_checked_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("numba") is None:
        pytest.skip("numba not installed (the fast extra): the interpreted walk is the only one")
    limits.use_kernel(None)
    monkeypatch.setattr(limits, "KERNEL_AFTER_BYTES", 1000)
    try:
        packed = msgpack.packb([[1.0] * 50] * 2)   # ~900 bytes
        assert msgpack_depth(packed) == 2
        assert limits._walk.value is None               # 900 of 1000 bytes: not yet
        assert msgpack_depth(packed) == 2
        assert limits._walk.value is not None           # past the bound: loaded, and used from now on
        with pytest.raises(LimitError, match="nested more than 64"):
            msgpack_depth(b"\x91" * 65 + b"\x01")
    finally:
        limits.use_kernel(None)
