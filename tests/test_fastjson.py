"""The compiled scanner (``models/fastjson.py``) against the msgspec reader: same batches, same rejects, always.

The scanner answers for a whole chunk or not at all, so two properties make
it safe: *soundness*, per line (a line the scanner accepts is one msgspec
accepts, with the very same column values and dtypes), and *equality*, per
file (the reader with the scanner gives exactly the batches, columns,
vocabularies, job records and rejects of the reader without it). Both are
checked on valid input (simulator profiles, real traces imported from
``shared/data``) and on corrupted input (hypothesis: wrong types, floats
for ints, huge numbers, missing, unknown and duplicate fields, escapes,
UTF-8, deep nesting, overlong strings, byte edits).

Every test runs the scanner's source as plain Python (no numba needed) and,
where numba is installed, compiled as well.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Iterator
from unittest import mock

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models import columns as C
from eroica.models import fastjson, reader
from eroica.models.records import (COLLECTIVE_OPS, FN_KINDS, INT32_MAX, INT64_MAX, MAX_DUR_NS, MAX_TS_NS, JobRecord)

KERNELS = ["python"] + (["numba"] if importlib.util.find_spec("numba") else [])


@pytest.fixture(params=KERNELS)
def kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    fastjson.use_kernels(request.param)
    yield request.param
    fastjson.use_kernels(None)


# ------------------------------------------------------------------------------------------------
# Comparing batches exactly.


def assert_same_columns(a: C.Columns, b: C.Columns, where: str = "") -> None:
    assert a.type == b.type, where
    assert list(a.arrays) == list(b.arrays), where
    for name in a.arrays:
        x, y = a.arrays[name], b.arrays[name]
        assert x.dtype == y.dtype, (where, name, x.dtype, y.dtype)
        assert x.shape == y.shape, (where, name)
        if x.dtype.kind == "f":  # bit for bit: NaN where absent, the sign of zero too
            assert np.array_equal(x.view(np.int64), y.view(np.int64)), (where, name, x, y)
        else:
            assert np.array_equal(x, y), (where, name, x, y)
    assert a.vocab == b.vocab, where


def assert_same_batches(fast: list[reader.Batch], base: list[reader.Batch]) -> None:
    assert len(fast) == len(base)
    for i, (a, b) in enumerate(zip(fast, base)):
        assert list(a.columns) == list(b.columns), i
        for tag in a.columns:
            assert_same_columns(a.columns[tag], b.columns[tag], f"batch {i} {tag}")
        assert a.jobs == b.jobs, i
        assert a.invalid == b.invalid, i


def read_both(path: Path, **kw: Any) -> tuple[list[reader.Batch], list[reader.Batch], int]:
    """The batches without the scanner (today's path), with it, and how many chunks it answered for."""
    with mock.patch.object(fastjson, "worth_it", lambda _n: False):
        base = list(reader.read_batches(path, **kw))
    scanned = 0
    real = fastjson.Scanner.scan

    def spy(self: fastjson.Scanner, data: np.ndarray, size: int) -> fastjson.ChunkColumns | None:
        nonlocal scanned
        out = real(self, data, size)
        scanned += out is not None
        return out

    with mock.patch.object(fastjson.Scanner, "scan", spy), mock.patch.object(fastjson, "FAST_AFTER_BYTES", 0):
        fast = list(reader.read_batches(path, **kw))
    return fast, base, scanned


def judge_line(line: bytes) -> bool:
    """Soundness on one line: if the scanner takes it, msgspec takes it too, with the same columns."""
    chunk = fastjson.scan_chunk(line)
    try:
        rec = reader.decode_line(line)
    except msgspec.DecodeError:
        rec = None
    if chunk is None:
        return False
    assert rec is not None and type(rec) is not JobRecord, line
    tag = str(rec.__struct_config__.tag)
    assert list(chunk.rows) == [fastjson.KINDS.index(tag)], line
    got = fastjson.merge(tag, [(chunk, 0, 1)])
    assert got is not None, line
    assert_same_columns(got, C.from_records(tag, [rec]), repr(line))
    return True


# ------------------------------------------------------------------------------------------------
# Valid input: the scanner answers, and the batches are today's.


def _simulate(path: Path, **kw: Any) -> Path:
    from eroica.producers.simulator import SimConfig, write_jsonl

    write_jsonl(SimConfig(**kw), path, truth_path=False)
    return path


@pytest.mark.parametrize("profile", ["default", "realistic"])
@pytest.mark.parametrize("batch_records", [65536, 1000, 7])
def test_simulated_runs_are_scanned_and_equal(kernels, tmp_path, monkeypatch, profile, batch_records):
    if kernels == "python" and batch_records != 1000:
        pytest.skip("interpreted scanner: one batch size is enough")
    path = _simulate(tmp_path / "run.jsonl", nodes=2, gpus=4, steps=3, profile=profile,
                     faults=["gpu_throttle:rank=3"], seed=5)
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 14)  # many chunks, batches cut inside them
    fast, base, scanned = read_both(path, batch_records=batch_records)
    assert_same_batches(fast, base)
    assert scanned >= path.stat().st_size // (1 << 14) - 2  # every chunk but the job record's
    assert sum(b.valid_count for b in base) > 100


def test_bench_sized_run_is_scanned_and_equal(tmp_path):
    if "numba" not in KERNELS:
        pytest.skip("numba not installed: the compiled scanner is not used")
    fastjson.use_kernels("numba")
    try:
        path = _simulate(tmp_path / "run.jsonl", nodes=16, gpus=8, steps=10, faults=["nic:node=2,nic=5"])
        fast, base, scanned = read_both(path)
        assert_same_batches(fast, base)
        stream, _ = reader.open_source(path)
        with stream:
            blocks = sum(1 for _ in reader.iter_blocks(stream))
        assert scanned == blocks - 1  # all but the first (its job record goes to msgspec)
    finally:
        fastjson.use_kernels(None)


def _kineto_run(shared_dir: Path, out: Path) -> Path:
    from eroica.producers.importers import import_kineto

    d = shared_dir / "data" / "kineto"
    if not d.is_dir():
        pytest.skip(f"{d} not found")
    import_kineto([d / "sampled_rank-0.json.gz", d / "sampled_rank-1.json.gz"], out)  # read in place
    return out


def _optable_run(shared_dir: Path, out: Path) -> Path:
    from eroica.producers.importers import import_optable

    d = shared_dir / "data" / "stragglers"
    if not (d / "trace-ST.parquet").is_file():
        pytest.skip(f"{d / 'trace-ST.parquet'} not found")
    import_optable(d / "trace-ST.parquet", out, meta_path=d / "meta-ST.yaml")
    return out


@pytest.mark.parametrize("trace", ["kineto", "optable"])
def test_real_traces_equal(shared_dir, tmp_path, monkeypatch, trace):
    fastjson.use_kernels("numba" if "numba" in KERNELS else "python")
    try:
        out = tmp_path / "real.jsonl"
        path = _kineto_run(shared_dir, out) if trace == "kineto" else _optable_run(shared_dir, out)
        if "numba" not in KERNELS:  # interpreted: a slice of the trace
            with open(path, "rb") as f:
                head = b"".join(line for _, line in zip(range(3000), f))
            path.write_bytes(head)
        monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 16)
        fast, base, scanned = read_both(path, batch_records=5000)
        assert_same_batches(fast, base)
        assert sum(b.valid_count for b in base) > 1000
    finally:
        fastjson.use_kernels(None)


# ------------------------------------------------------------------------------------------------
# Corrupted input: hypothesis.

_ASCII = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=12)
_ANY_TEXT = st.one_of(_ASCII, st.text(max_size=8), st.sampled_from(["", "x" * 256, "x" * 257, "é" * 200]))
_INT_EDGES = [0, 1, INT32_MAX, INT32_MAX + 1, MAX_DUR_NS, MAX_DUR_NS + 1, MAX_TS_NS, MAX_TS_NS + 1,
              INT64_MAX, INT64_MAX + 1, 2**64, 10**19, 10**20, -1]
_INTS = st.one_of(st.integers(0, 2**20), st.integers(0, INT64_MAX), st.sampled_from(_INT_EDGES))
_FLOATS = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-2**60, 2**60),
                    st.sampled_from([0.0, -0.0, 1e22, 1e23, 5e-324, 2.2250738585072014e-308, 9007199254740993]))
# Number literals as collectors might write them, valid or not.
_NUMBER_TEXT = st.from_regex(r"\A-?(0|[1-9][0-9]{0,20})(\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?\Z")
_POISON = ["1.0", "-1", "-0", "-0.0", "0.0", "1e3", "1E3", "1e-400", "1e309", "0e999", "01", "1.", ".5", "+1",
           "NaN", "Infinity", "-Infinity", "true", "false", "null", "[]", "{}", "[1,2]", '{"a":1}',
           '"1"', '""', '"\\u0041"', '"\\ud800"', '"\\n"', '"a\\"b"', '"\u00e9"', '"\x01"', '"' + "y" * 257 + '"',
           "18446744073709551616", "9223372036854775808", "9223372036854775807", str(MAX_TS_NS + 1),
           str(MAX_DUR_NS + 1), str(INT32_MAX + 1), "1" * 25, "[" * 70 + "]" * 70, '"fn"', '"job"', '"gpu"',
           '"kernel"', '"all_reduce"', '"bogus"']
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | _ASCII,
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_ASCII, inner, max_size=3),
                     max_leaves=6)

_STR_FIELDS = {"job", "node", "fn", "group", "stack", "nic"}
_BOOL_FIELDS = {"in_flight", "link_up"}
_ENUMS = {"kind": FN_KINDS, "op": COLLECTIVE_OPS}


def _value(draw: st.DrawFn, name: str, kind: str, poison: bool) -> str:
    """A JSON text for one field: usually valid for the field, sometimes (``poison``) anything."""
    if poison and draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.sampled_from(_POISON), _NUMBER_TEXT, _JSON.map(json.dumps)))
    if name == "type":
        return json.dumps(kind)
    if name in _ENUMS:
        return json.dumps(draw(st.sampled_from(_ENUMS[name])))
    if name in _STR_FIELDS:
        text = draw(_ANY_TEXT) if poison else draw(st.one_of(_ASCII, st.text(max_size=6), st.just("x" * 256),
                                                             st.just("\u00e9" * 256), st.just("\U0001f600" * 3)))
        return json.dumps(text, ensure_ascii=draw(st.booleans()))
    if name in _BOOL_FIELDS:
        return json.dumps(draw(st.booleans()))
    t = fastjson._FIELDS[fastjson.FIELD_INDEX[name]][1]
    if t == fastjson.T_FLT:
        return draw(st.one_of(_FLOATS.map(json.dumps), _NUMBER_TEXT))
    if poison:
        return str(draw(_INTS))
    hi = fastjson._FIELDS[fastjson.FIELD_INDEX[name]][2]
    return str(draw(st.one_of(st.integers(0, min(hi, 2**20)), st.integers(0, hi), st.just(hi))))


@st.composite
def contract_lines(draw: st.DrawFn) -> bytes:
    """One line: a record of some kind, its fields in any order, optional ones or not, then mutated."""
    kind = draw(st.sampled_from(fastjson.KINDS))
    k = fastjson.KINDS.index(kind)
    names = [n for i, n in enumerate(fastjson.FIELD_INDEX) if fastjson.ALLOWED[k, i]]
    chosen = [n for n in names if fastjson.REQUIRED[k, fastjson.FIELD_INDEX[n]] or draw(st.booleans())]
    chosen = draw(st.permutations(chosen))
    mutate = draw(st.integers(0, 2)) == 0  # a third of the lines: poison values and structural edits
    pairs = [(json.dumps(n), _value(draw, n, kind, mutate)) for n in chosen]
    for _ in range(draw(st.integers(0, 2)) if mutate else 0):  # structural mutations
        what = draw(st.integers(0, 5))
        if what == 0 and pairs:
            pairs.pop(draw(st.integers(0, len(pairs) - 1)))  # a missing field
        elif what == 1 and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs.insert(draw(st.integers(0, len(pairs))), (pairs[i][0], draw(st.sampled_from([pairs[i][1], "1"]))))
        elif what == 2:
            other = draw(st.sampled_from([*fastjson.FIELD_INDEX, "unknown", "rank_nodes", "world_size", "Type"]))
            pairs.insert(draw(st.integers(0, len(pairs))), (json.dumps(other), draw(_JSON.map(json.dumps))))
        elif what == 3 and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (pairs[i][0], draw(st.sampled_from(_POISON)))
        elif what == 4 and pairs:
            i = draw(st.integers(0, len(pairs) - 1))
            pairs[i] = (json.dumps(json.loads(pairs[i][0]).upper()) if draw(st.booleans())
                        else '"\\u00' + f"{ord(json.loads(pairs[i][0])[0]):02x}" + json.loads(pairs[i][0])[1:] + '"',
                        pairs[i][1])
    odd = [(",\t", ":"), (",", ":\r")] if mutate else []
    sep = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " :"), *odd]))
    text = "{" + sep[0].join(key + sep[1] + value for key, value in pairs) + "}"
    if mutate:
        text = draw(st.sampled_from(["", " ", "\t"])) + text + draw(st.sampled_from(["", " ", "\r", " x", "}", ",{}"]))
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(0, 1)) if mutate and draw(st.booleans()) else 0):  # a byte edit
        at = draw(st.integers(0, len(data)))
        op = draw(st.integers(0, 2))
        if op == 0 and at < len(data):
            del data[at]
        elif op == 1:
            data[at:at] = bytes([draw(st.integers(0, 255))])
        elif at < len(data):
            data[at] = draw(st.integers(0, 255))
    return bytes(data).replace(b"\n", b" ")


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))


def test_line_soundness_on_fuzzed_lines(kernels):
    accepted = rejected = 0

    @FUZZ
    @given(contract_lines())
    def check(line: bytes) -> None:
        nonlocal accepted, rejected
        if judge_line(line):
            accepted += 1
        else:
            rejected += 1

    check()
    assert accepted > 20 and rejected > 20, (accepted, rejected)  # both sides were exercised


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(_NUMBER_TEXT, st.floats(allow_nan=False, allow_infinity=False).map(repr)),
       st.sampled_from(["temp_c", "load1", "tx_Bps"]))
def test_float_literals_decode_bit_for_bit(number, name):
    fastjson.use_kernels(KERNELS[-1])
    try:
        kind = {"temp_c": "gpu", "load1": "host", "tx_Bps": "nic"}[name]
        base = {"gpu": '"rank":0,"gpu":0,', "host": "", "nic": '"nic":"mlx5_0",'}[kind]
        line = f'{{"type":"{kind}","job":"j","node":"n",{base}"ts_ns":1,"{name}":{number}}}'.encode()
        judge_line(line)
    finally:
        fastjson.use_kernels(None)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(contract_lines(), st.sampled_from([b"", b"   ", b"{bad", b"[]", b'{"type":"job","job":"j",'
                                                             b'"world_size":2,"rank_nodes":["a","b"]}'])),
                min_size=1, max_size=40),
       st.integers(1, 50), st.integers(6, 11))
def test_files_of_fuzzed_lines_give_todays_batches(tmp_path_factory, lines, batch_records, chunk_log2):
    fastjson.use_kernels(KERNELS[-1])
    try:
        path = tmp_path_factory.mktemp("fz") / "f.jsonl"
        path.write_bytes(b"\n".join(lines) + b"\n")
        with mock.patch.object(reader, "CHUNK_BYTES", 1 << chunk_log2):
            fast, base, _ = read_both(path, batch_records=batch_records)
        assert_same_batches(fast, base)
    finally:
        fastjson.use_kernels(None)


def test_files_mixing_valid_and_bad_chunks(kernels, tmp_path, monkeypatch):
    """Valid chunks (scanned) between chunks with a bad line (today's path), batches cut across both."""
    path = _simulate(tmp_path / "run.jsonl", nodes=1, gpus=4, steps=2, seed=3)
    lines = path.read_bytes().splitlines()
    bad = [b'{"type":"fn","job":"j","node":"n","rank":1.0,"step":0,"fn":"f","kind":"io","ts_ns":1,"dur_ns":1}',
           b'{"type":"fn","job":"j"', b'{"type":"gpu","job":"j","node":"n","rank":0,"gpu":0,"ts_ns":1,"extra":[1]}',
           b'{"type":"fn","job":"j","node":"n","rank":0,"step":0,"fn":"\\u0041","kind":"io","ts_ns":1,"dur_ns":1}']
    for i, b in zip(range(50, len(lines), 97), bad * 10):
        lines[i] = b
    path.write_bytes(b"\n".join(lines) + b"\n")
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 12)
    fast, base, scanned = read_both(path, batch_records=333)
    assert_same_batches(fast, base)
    assert scanned > 10 and sum(len(b.invalid) for b in base) >= 2


# ------------------------------------------------------------------------------------------------
# The scanner's own rules, one by one.

_FN = (b'{"type":"fn","job":"j","node":"n","rank":3,"step":1,"fn":"f","kind":"kernel","ts_ns":10,'
       b'"dur_ns":5')


@pytest.mark.parametrize("tail,accepted", [
    (b"}", True),
    (b',"bytes":7,"op":"all_reduce","group":"g","stream":2,"in_flight":true,"stack":"a;b"}', True),
    (b',"op":null,"group":null,"bytes":null}', True),
    (b',"in_flight":null}', False),            # a bool without None: msgspec refuses null
    (b',"dur_ns":6}', False),                  # a field twice
    (b',"gpu":1}', False),                     # a field of another kind: unknown here
    (b',"x":1}', False),                       # unknown field: valid, but left to msgspec
    (b',"bytes":1.0}', False),                 # float for int
    (b',"bytes":-0}', False),
    (b',"stream":2147483648}', False),         # over int32
    (b',"group":"\\u0041"}', False),           # an escape
    (b',"group":"' + b"z" * 256 + b'"}', True),
    (b',"group":"' + b"z" * 257 + b'"}', False),
    (b',"group":"\xc3\xa9\xf0\x9f\x98\x80"}', True),   # UTF-8 in a value
    (b',"group":"' + "\u00e9".encode() * 256 + b'"}', True),   # 256 characters, 512 bytes
    (b',"group":"' + "\u00e9".encode() * 257 + b'"}', False),
    (b',"group":"\xff"}', False),             # invalid UTF-8
    (b',"group":"\xed\xa0\x80"}', False),   # an encoded surrogate
    (b',"group":"\xc0\xaf"}', False),        # an overlong encoding
    (b',"gr\xc3\xa9":1}', False),            # UTF-8 in a key: unknown field
    (b'} ', True),
    (b'}\r', False),
    (b' }', True),
])
def test_scanner_rules(kernels, tail, accepted):
    assert judge_line(_FN + tail) is accepted


def test_bounds_of_times(kernels):
    line = b'{"type":"fn","job":"j","node":"n","rank":0,"step":0,"fn":"f","kind":"io","ts_ns":%d,"dur_ns":%d}'
    assert judge_line(line % (MAX_TS_NS, MAX_DUR_NS))
    assert not judge_line(line % (MAX_TS_NS + 1, 0))
    assert not judge_line(line % (0, MAX_DUR_NS + 1))


def test_merge_orders_vocabularies_by_first_appearance_across_parts(kernels):
    """Strings first seen late in one chunk but early in a batch slice keep the batch's own order."""
    rows = [b'{"type":"host","job":"j","node":"%s","ts_ns":1}' % n for n in (b"a", b"b", b"c", b"b", b"a", b"d")]
    joined = b"\n".join(rows)
    chunk = fastjson.scan_chunk(joined)
    assert chunk is not None
    recs = [reader.decode_line(r) for r in rows]
    for lo, hi in [(0, 6), (3, 6), (1, 5), (4, 5)]:
        got = fastjson.merge("host", [(chunk, lo, hi)])
        assert got is not None
        assert_same_columns(got, C.from_records("host", recs[lo:hi]))
    both = fastjson.merge("host", [C.from_records("host", recs[4:]), (chunk, 1, 4)])
    assert both is not None
    assert_same_columns(both, C.from_records("host", recs[4:] + recs[1:4]))


def test_without_numba_the_reader_is_todays(tmp_path, monkeypatch):
    fastjson.use_kernels(None)
    monkeypatch.setattr(fastjson, "_failed", True)  # as when numba is not installed
    path = _simulate(tmp_path / "run.jsonl", nodes=1, gpus=2, steps=2)
    fast, base, scanned = read_both(path)
    assert scanned == 0
    assert_same_batches(fast, base)
    fastjson.use_kernels(None)


def test_worth_it_waits_for_a_large_input(monkeypatch):
    fastjson.use_kernels(None)
    monkeypatch.setattr(fastjson, "FAST_AFTER_BYTES", 1 << 30)
    assert not fastjson.worth_it(1 << 20) and not fastjson.loaded()
    fastjson.use_kernels(None)


def test_field_table_agrees_with_the_structs(monkeypatch):
    assert fastjson.drift() == []
    fields = list(fastjson._FIELDS)
    i = fastjson.FIELD_INDEX["dur_ns"]
    fields[i] = ("dur_ns", fastjson.T_INT, MAX_DUR_NS + 1, False)  # a bound the structs do not have
    monkeypatch.setattr(fastjson, "_FIELDS", fields)
    assert [d.split(":")[0] for d in fastjson.drift()] == ["fn.dur_ns"]


# ------------------------------------------------------------------------------------------------
# One Scanner for a whole read: arrays reused, nothing filled in before a chunk.

_SAMPLE = {fastjson.T_STR: "s", fastjson.T_INT: 7, fastjson.T_FLT: 1.5, fastjson.T_BOOL: True,
           fastjson.T_KIND: "io", fastjson.T_OP: "send"}


def _record_line(kind: str, fill: str) -> bytes:
    """A line of ``kind`` with every optional field given (``fill="all"``), null where it may be, or absent."""
    k = fastjson.KINDS.index(kind)
    obj: dict[str, Any] = {}
    for i, (name, t, _hi, nullable) in enumerate(fastjson._FIELDS):
        if not fastjson.ALLOWED[k, i]:
            continue
        required = fastjson.REQUIRED[k, i]
        if t == fastjson.T_TAG:
            obj[name] = kind
        elif required or fill == "all":
            obj[name] = _SAMPLE[t]
        elif fill == "null" and nullable:
            obj[name] = None
    return json.dumps(obj, separators=(",", ":")).encode()


def test_scanner_arrays_are_reused_across_chunks_of_other_kinds(kernels):
    """A line writes every value of its kind, absent ones too, so no value of an earlier chunk shows through."""
    full = {kind: _record_line(kind, "all") for kind in fastjson.KINDS}
    nulls = {kind: _record_line(kind, "null") for kind in fastjson.KINDS}
    bare = {kind: _record_line(kind, "none") for kind in fastjson.KINDS}
    chunks = [[full["gpu"]] * 4 + [full["fn"], full["nic"], full["host"]],  # the largest first: no regrowth
              [bare["gpu"], nulls["gpu"], bare["gpu"]],
              [nulls["fn"], full["fn"], bare["fn"]],
              [bare["host"], nulls["nic"], bare["nic"], nulls["host"]],
              [bare["fn"], bare["gpu"], bare["nic"], bare["host"]]]
    scanner = fastjson.Scanner()
    arrays = None
    for lines in chunks:
        joined = b"\n".join(lines)
        chunk = scanner.scan(fastjson.padded(joined), len(joined))
        assert chunk is not None and len(chunk) == len(lines)
        arrays = arrays or (scanner.ivals, scanner.fvals, scanner.svals)
        assert (scanner.ivals, scanner.fvals, scanner.svals) == arrays  # the very same arrays, reused
        recs = [reader.decode_line(line) for line in lines]
        for k in chunk.rows:
            tag = fastjson.KINDS[k]
            got = fastjson.merge(tag, [(chunk, 0, len(chunk))])
            assert got is not None
            want = C.from_records(tag, [r for r in recs if r.__struct_config__.tag == tag])
            assert_same_columns(got, want, f"{tag} {lines}")


def test_min_line_is_the_shortest_line_accepted(kernels):
    """The line count of a chunk is bounded by MIN_LINE, not counted: no accepted line may be shorter."""
    line = min((_record_line(kind, "none").replace(b'"s"', b'""').replace(b"7", b"0") for kind in fastjson.KINDS),
               key=len)
    assert len(line) == fastjson.MIN_LINE
    assert judge_line(line)
    for i in range(len(line)):  # one byte fewer, anywhere: refused
        assert not judge_line(line[:i] + line[i + 1:])
    joined = b"\n".join([line] * 500)
    chunk = fastjson.scan_chunk(joined)
    assert chunk is not None and len(chunk) == 500 <= fastjson.max_lines(len(joined)) <= 501


def test_bytes_after_the_chunk_are_never_part_of_it(kernels):
    """The scanner stops at its sentinel (written at the chunk's end) whatever the buffer holds after it."""
    good = b'{"type":"host","job":"j","node":"n","ts_ns":1,"load1":2.5}'
    for cut in range(len(good) + 1):
        joined = good[:cut]
        for after in (b"", good[cut:], good[cut:] + b"\n" + good, b"x" * 20):
            data = fastjson.padded(joined + after)
            got = fastjson.Scanner().scan(data, len(joined))
            assert (got is not None) == (cut == len(good)), (joined, after)
    with pytest.raises(ValueError):  # no room for the sentinel and the rest of its word
        fastjson.Scanner().scan(np.frombuffer(good + b"\0", dtype=np.uint8).copy(), len(good))


@pytest.mark.parametrize("byte,accepted", [(b"\\", False), (b"\x00", False), (b"\x1f", False), (b'"', False),
                                           (b"\x7f", True), (b"\xc3\xa9", True), (b"\xff", False)])
def test_string_bytes_at_every_offset_of_a_word(kernels, byte, accepted):
    """Strings are scanned eight bytes at a time: a byte that matters is found wherever in a word it falls."""
    for length in range(1, 18):
        for at in range(length):
            value = b"a" * at + byte + b"a" * (length - at - 1)
            assert judge_line(_FN + b',"group":"' + value + b'"}') is accepted, value


def test_strings_that_differ_in_one_byte_of_a_word(kernels):
    """Strings are compared with the field's last value a word at a time: one byte apart, anywhere, is another."""
    for length in range(1, 18):
        for at in range(length):
            a = b"a" * length
            b = a[:at] + b"b" + a[at + 1:]
            lines = [_FN + b',"group":"%s"}' % v for v in (a, b, a, b, b)]
            chunk = fastjson.scan_chunk(b"\n".join(lines))
            assert chunk is not None
            got = fastjson.merge("fn", [(chunk, 0, len(lines))])
            assert got is not None
            assert_same_columns(got, C.from_records("fn", [reader.decode_line(x) for x in lines]), repr(b))
