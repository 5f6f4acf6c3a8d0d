"""The streaming reader: files, gzip, stdin, line handling, batching, bad input."""

from __future__ import annotations

import gc
import gzip
import io
import json
import math
import subprocess
import sys
import tracemalloc
import warnings
from pathlib import Path
from unittest import mock

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eroica.models import columns as C
from eroica.models import reader
from eroica.models.reader import Batch, Invalid, iter_lines, open_source, parse_lines, read_batches, validate_line


def fn(i: int, job: str = "j1") -> dict:
    return {"type": "fn", "job": job, "node": f"n{i % 4}", "rank": i % 8, "step": i // 8, "fn": "train.forward",
            "kind": "python", "ts_ns": 1_000_000 + i, "dur_ns": 10 + i}


def gpu(i: int, job: str = "j1") -> dict:
    return {"type": "gpu", "job": job, "node": f"n{i % 4}", "rank": i % 8, "gpu": i % 8, "ts_ns": 5 + i,
            "sm_clock_mhz": 1410.0}


def nic(i: int, job: str = "j1") -> dict:
    return {"type": "nic", "job": job, "node": f"n{i % 4}", "nic": "mlx5_0", "ts_ns": 7 + i, "link_up": True}


def host(i: int, job: str = "j1") -> dict:
    return {"type": "host", "job": job, "node": f"n{i % 4}", "ts_ns": 9 + i, "load1": 1.5}


def job(i: int, job: str = "j1") -> dict:
    return {"type": "job", "job": job, "world_size": 8, "rank_nodes": [f"n{r % 4}" for r in range(8)]}


MAKERS = [fn, gpu, nic, host, job]


def enc(obj: dict) -> bytes:
    return json.dumps(obj).encode()


def jsonl(objs, sep: bytes = b"\n", trailing: bool = True) -> bytes:
    body = sep.join(enc(o) for o in objs)
    return body + sep if trailing else body


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def collect(batches) -> tuple[dict[str, list[dict]], list[dict], list[Invalid], list[Batch]]:
    """All records per type (as dicts, in order), job records, rejects, and the batches."""
    batches = list(batches)
    by_type: dict[str, list[dict]] = {}
    jobs, invalid = [], []
    for b in batches:
        for t, cols in b.columns.items():
            assert cols.type == t
            by_type.setdefault(t, []).extend(C.to_records(cols))
        jobs += [msgspec.json.decode(msgspec.json.encode(j)) | {"type": "job"} for j in b.jobs]
        invalid += b.invalid
    return by_type, jobs, invalid, batches


def valid_total(batches) -> int:
    return sum(b.valid_count for b in batches)


# --------------------------------------------------------------------------
# Sources.


def test_plain_file(tmp_path):
    objs = [fn(i) for i in range(20)]
    by_type, jobs, invalid, batches = collect(read_batches(write(tmp_path / "a.jsonl", jsonl(objs))))
    assert by_type == {"fn": objs} and jobs == [] and invalid == []
    assert len(batches) == 1


@pytest.mark.parametrize("name", ["a.jsonl.gz", "a.jsonl", "a.txt", "noext", "a.gz.bak"])
def test_gzip_detected_by_magic_any_extension(tmp_path, name):
    objs = [gpu(i) for i in range(50)]
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / name, gzip.compress(jsonl(objs)))))
    assert by_type == {"gpu": objs} and invalid == []


def test_gz_extension_but_plain_content_is_read_as_plain(tmp_path):
    objs = [host(i) for i in range(5)]
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a.jsonl.gz", jsonl(objs))))
    assert by_type == {"host": objs} and invalid == []


def test_multi_member_gzip(tmp_path):
    a, b = [fn(i) for i in range(5)], [fn(i) for i in range(5, 9)]
    data = gzip.compress(jsonl(a)) + gzip.compress(jsonl(b))
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "m.gz", data)))
    assert by_type == {"fn": a + b} and invalid == []


def test_path_object_and_str(tmp_path):
    p = write(tmp_path / "a", jsonl([fn(1)]))
    assert valid_total(read_batches(p)) == valid_total(read_batches(str(p))) == 1


def test_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        list(read_batches(tmp_path / "nope.jsonl"))


def _stdin(monkeypatch, data: bytes):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(io.BytesIO(data))))


@pytest.mark.parametrize("compress", [False, True])
def test_stdin_dash(monkeypatch, compress):
    objs = [fn(i) for i in range(10)] + [host(i) for i in range(3)]
    data = jsonl(objs) + b"{bad\n"
    _stdin(monkeypatch, gzip.compress(data) if compress else data)
    by_type, _, invalid, _ = collect(read_batches("-"))
    assert by_type == {"fn": objs[:10], "host": objs[10:]}
    assert [(i.source, i.line) for i in invalid] == [("<stdin>", 14)]
    assert not sys.stdin.buffer.closed  # stdin is never closed by the reader


@pytest.mark.parametrize("compress", [False, True])
def test_stdin_dash_subprocess(compress):
    objs = [fn(i) for i in range(30)] + [job(0)] + [nic(i) for i in range(2)]
    data = jsonl(objs) + b'{"type":"fn"}\n'
    code = (
        "import sys\n"
        "from eroica.models.reader import read_batches\n"
        "bs = list(read_batches('-', batch_records=7))\n"
        "print(sum(b.valid_count for b in bs), [i.describe() for b in bs for i in b.invalid], len(bs))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=gzip.compress(data) if compress else data,
                         capture_output=True, check=True, timeout=60)
    assert out.stdout.decode().strip() == (
        "33 ['<stdin>:34: Object missing required field `job`'] 5"
    )


def test_gzip_file_is_closed(tmp_path):
    p = write(tmp_path / "a.gz", gzip.compress(jsonl([fn(i) for i in range(3)])))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert valid_total(read_batches(p)) == 3
        gc.collect()
    assert [w for w in caught if issubclass(w.category, ResourceWarning)] == []
    stream, _ = open_source(p)
    underlying = stream.fileobj  # type: ignore[attr-defined]
    stream.close()
    assert underlying.closed


def test_file_closed_when_consumer_stops_early(tmp_path):
    p = write(tmp_path / "a.jsonl", jsonl([fn(i) for i in range(50)]))
    opened = []
    real = reader.open_source

    def spy(path):
        stream, name = real(path)
        opened.append(stream)
        return stream, name

    with mock.patch.object(reader, "open_source", spy):
        gen = read_batches(p, batch_records=10)
        next(gen)
        gen.close()
    assert opened and opened[0].closed


# --------------------------------------------------------------------------
# Lines.


def test_empty_and_blank_only_files(tmp_path):
    assert list(read_batches(write(tmp_path / "e", b""))) == []
    assert list(read_batches(write(tmp_path / "b", b"\n\n  \n\t\r\n\r\n"))) == []
    assert list(read_batches(write(tmp_path / "g", gzip.compress(b"")))) == []


def test_blank_lines_skipped_but_counted(tmp_path):
    data = b"\n" + enc(fn(1)) + b"\n\n   \n\t\n" + enc(fn(2)) + b"\n\r\n{bad}\n\n"
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data)))
    assert by_type == {"fn": [fn(1), fn(2)]}
    assert [i.line for i in invalid] == [8]


def test_crlf_line_endings(tmp_path):
    objs = [fn(0), gpu(1), host(2)]
    data = jsonl(objs, sep=b"\r\n") + b"{bad\r\n"
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data)))
    assert by_type == {"fn": [objs[0]], "gpu": [objs[1]], "host": [objs[2]]}
    assert [i.line for i in invalid] == [4]


@pytest.mark.parametrize("chunk", [1, 3, 64, 1 << 20])
def test_no_trailing_newline(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    objs = [fn(i) for i in range(5)]
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", jsonl(objs, trailing=False))))
    assert by_type == {"fn": objs} and invalid == []
    _, _, invalid, _ = collect(read_batches(write(tmp_path / "b", jsonl(objs) + b'{"type":"fn"}')))
    assert [i.line for i in invalid] == [6]


def test_mixed_types_from_several_jobs(tmp_path):
    objs = [MAKERS[i % 5](i, job=f"job{i % 3}") for i in range(60)]
    by_type, jobs, invalid, batches = collect(read_batches(write(tmp_path / "a", jsonl(objs))))
    assert invalid == []
    for t in ("fn", "gpu", "nic", "host"):
        assert by_type[t] == [o for o in objs if o["type"] == t]
    assert jobs == [o for o in objs if o["type"] == "job"]
    (b,) = batches
    assert sorted(b.columns["fn"].vocab["job"]) == ["job0", "job1", "job2"]
    assert b.valid_count == 60


def test_line_numbers_across_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 5)
    lines = [enc(fn(0)), b"x", b"", enc(gpu(1)), b"[]", enc(fn(2)), b"{"]
    _, _, invalid, _ = collect(read_batches(write(tmp_path / "a", b"\n".join(lines))))
    assert [i.line for i in invalid] == [2, 5, 7]
    assert [i.raw for i in invalid] == [b"x", b"[]", b"{"]


def test_invalid_utf8(tmp_path):
    lines = [enc(fn(0)), b'{"type":"host","job":"\xff\xfe","node":"n","ts_ns":1}', b"\xc3\x28\x80\xff", enc(fn(1)),
             b'{"type":"host","job":"j","node":"\xed\xa0\x80","ts_ns":1}']  # lone surrogate
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", b"\n".join(lines))))
    assert by_type == {"fn": [fn(0), fn(1)]}
    assert [i.line for i in invalid] == [2, 3, 5]
    assert all(i.reason for i in invalid)
    assert "utf-8" in invalid[0].reason.lower()


def test_nul_and_control_bytes_do_not_stop_the_read(tmp_path):
    data = b"\x00\x00\n" + enc(fn(0)) + b"\n\x1b[31m\n" + enc(fn(1)) + b"\n"
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data)))
    assert by_type == {"fn": [fn(0), fn(1)]} and [i.line for i in invalid] == [1, 3]


@pytest.mark.parametrize("field,value", [("ts_ns", 2**63), ("dur_ns", 10**30), ("rank", 2**31), ("step", 2**64),
                                         ("bytes", 2**63), ("stream", 2**40)])
def test_huge_integer_does_not_take_the_batch_down(tmp_path, field, value):
    # Decodable, but fits no int64/int32 column: rejected alone, neighbours kept.
    data = jsonl([fn(0), {**fn(1), field: value}, fn(2)])
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data)))
    assert by_type == {"fn": [fn(0), fn(2)]}
    assert [i.line for i in invalid] == [2] and f"$.{field}`" in invalid[0].reason


def test_huge_gpu_counter_does_not_take_the_batch_down(tmp_path):
    data = jsonl([gpu(0), {**gpu(1), "xid": 10**400}, {**gpu(2), "mem_used_bytes": 2**64}, gpu(3)])
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data)))
    assert by_type == {"gpu": [gpu(0), gpu(3)]} and [i.line for i in invalid] == [2, 3]


# --------------------------------------------------------------------------
# Batching.


@pytest.mark.parametrize("n,k", [(1, 1), (10, 1), (103, 10), (100, 10), (7, 100), (64, 63), (250, 16)])
def test_batches_bounded_by_batch_records(tmp_path, n, k):
    objs = [MAKERS[i % 5](i) for i in range(n)]
    by_type, jobs, invalid, batches = collect(read_batches(write(tmp_path / "a", jsonl(objs)), batch_records=k))
    assert all(0 < b.valid_count <= k for b in batches)
    assert len(batches) == math.ceil(n / k)
    assert sum(b.valid_count for b in batches) == n
    for t in ("fn", "gpu", "nic", "host"):
        assert by_type.get(t, []) == [o for o in objs if o["type"] == t]  # order kept within a type
    assert jobs == [o for o in objs if o["type"] == "job"]


def test_batches_bounded_even_when_everything_is_invalid(tmp_path):
    # Rejects count towards the batch bound, or a file of garbage would pile up
    # every Invalid (with up to 4 KiB of raw each) in one batch.
    data = b"".join(b"{bad %d\n" % i for i in range(95))
    batches = list(read_batches(write(tmp_path / "a", data), batch_records=10))
    assert len(batches) == 10
    assert all(len(b.invalid) <= 10 for b in batches)
    assert [i.line for b in batches for i in b.invalid] == list(range(1, 96))


def test_batches_mixed_valid_invalid_bounded(tmp_path):
    lines = [enc(fn(i)) if i % 3 else b"nope" for i in range(100)]
    batches = list(read_batches(write(tmp_path / "a", b"\n".join(lines)), batch_records=8))
    assert all(b.valid_count + len(b.invalid) <= 8 for b in batches)
    assert valid_total(batches) == 66
    assert [i.line for b in batches for i in b.invalid] == [i + 1 for i in range(100) if i % 3 == 0]


def test_parse_lines_directly():
    lines = [(10, enc(fn(0))), (11, None), (12, b"   "), (13, b"{")]
    (b,) = parse_lines(iter(lines), "kafka:topic/0", batch_records=100, max_line_bytes=99)
    assert b.valid_count == 1
    assert [(i.source, i.line) for i in b.invalid] == [("kafka:topic/0", 11), ("kafka:topic/0", 13)]
    assert b.invalid[0].reason == "line longer than 99 bytes" and b.invalid[0].raw == b""
    assert list(parse_lines(iter([]))) == []
    assert list(parse_lines(iter([(1, b""), (2, b" ")]))) == []


# --------------------------------------------------------------------------
# Overlong lines.


@pytest.mark.parametrize("chunk", [1, 2, 7, 33, 64, 65, 1 << 20])
def test_overlong_line_rejected_and_read_continues(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    small = {"type": "host", "job": "j", "node": "n", "ts_ns": 1}
    ok = enc(small)
    limit = len(ok) + 2
    lines = [
        ok,                                   # 1
        b"x" * (limit + 1),                   # 2 just over
        b"y" * 1000,                          # 3 spans many chunks
        ok,                                   # 4
        b" " * limit,                         # 5 exactly at the limit (blank)
        ok + b"  ",                           # 6 exactly at the limit
        ok + b"   ",                          # 7 one over
        b"z" * (limit * 3),                   # 8
        b"w" * (limit * 2),                   # 9 two overlong lines in a row
        ok,                                   # 10
        b"q" * 500,                           # 11 overlong last line, no newline
    ]
    by_type, _, invalid, _ = collect(
        read_batches(write(tmp_path / "a", b"\n".join(lines)), max_line_bytes=limit, batch_records=3))
    assert by_type == {"host": [small] * 4}
    assert [i.line for i in invalid] == [2, 3, 7, 8, 9, 11]
    assert {i.reason for i in invalid} == {f"line longer than {limit} bytes"}
    assert all(i.raw == b"" for i in invalid)


@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_overlong_first_line_and_crlf(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(reader, "CHUNK_BYTES", chunk)
    ok = enc(fn(0))
    data = b"a" * 300 + b"\r\n" + ok + b"\r\n" + b"b" * 300 + b"\r\n"
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", data), max_line_bytes=len(ok) + 1))
    assert by_type == {"fn": [fn(0)]} and [i.line for i in invalid] == [1, 3]


def test_overlong_line_in_gzip(tmp_path, monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 16)
    data = enc(fn(0)) + b"\n" + b"x" * 100_000 + b"\n" + enc(fn(1)) + b"\n"
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "a", gzip.compress(data)), max_line_bytes=200))
    assert by_type == {"fn": [fn(0), fn(1)]} and [i.line for i in invalid] == [2]


class _Endless(io.RawIOBase):
    """A stream of ``size`` bytes of one huge line, made up as it is read."""

    def __init__(self, size: int, tail: bytes):
        self.left, self.tail = size, tail

    def readable(self):
        return True

    def readinto(self, b):
        if self.left > 0:
            n = min(len(b), self.left)
            b[:n] = b"x" * n
            self.left -= n
            return n
        n = min(len(b), len(self.tail))
        b[:n] = self.tail[:n]
        self.tail = self.tail[n:]
        return n


def test_overlong_line_is_never_held_whole(monkeypatch):
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 16)
    size = 64 << 20
    stream = io.BufferedReader(_Endless(size, b"\n" + enc(fn(0)) + b"\n"), buffer_size=1 << 16)
    tracemalloc.start()
    try:
        out = list(iter_lines(stream, max_line_bytes=1 << 16))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert out == [(1, None), (2, enc(fn(0)))]
    assert peak < 4 << 20, peak  # a few chunks, not the 64 MiB line


# --------------------------------------------------------------------------
# Broken compressed input.


def _gz_lines(n: int) -> tuple[list[dict], bytes]:
    objs = [fn(i) for i in range(n)]
    return objs, gzip.compress(jsonl(objs))


@pytest.mark.parametrize("batch", [7, 65536])
def test_truncated_gzip_reports_unreadable_and_keeps_records_before(tmp_path, batch):
    objs, gz = _gz_lines(3000)
    p = write(tmp_path / "t.gz", gz[: len(gz) * 2 // 3])
    by_type, _, invalid, batches = collect(read_batches(p, batch_records=batch))
    got = by_type.get("fn", [])
    assert len(got) > 1000  # most of what was before the cut
    assert got == objs[: len(got)]
    assert len(invalid) == 1
    (bad,) = invalid
    assert bad.reason.startswith("unreadable input: ") and bad.source == str(p)
    assert bad.line == len(got) + 1
    assert batches[-1].invalid == [bad]


def test_gzip_cut_in_header(tmp_path):
    _, gz = _gz_lines(10)
    _, _, invalid, _ = collect(read_batches(write(tmp_path / "t.gz", gz[:5])))
    assert len(invalid) == 1 and invalid[0].reason.startswith("unreadable input: ")


def test_corrupt_gzip_body_reports_unreadable(tmp_path):
    _, gz = _gz_lines(500)
    bad = bytearray(gz)
    for k in range(40, 80):
        bad[k] ^= 0xFF
    _, _, invalid, _ = collect(read_batches(write(tmp_path / "c.gz", bytes(bad))))
    assert invalid and invalid[-1].reason.startswith("unreadable input: ")


def test_gzip_with_bad_crc_reports_unreadable(tmp_path):
    objs, gz = _gz_lines(20)
    bad = bytearray(gz)
    bad[-8] ^= 0xFF  # CRC32 in the trailer
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "c.gz", bytes(bad))))
    assert by_type.get("fn", []) == objs[: len(by_type.get("fn", []))]
    assert len(invalid) == 1 and invalid[0].reason.startswith("unreadable input: ")


def test_gzip_trailing_garbage_reports_unreadable_after_records(tmp_path):
    objs, gz = _gz_lines(20)
    by_type, _, invalid, _ = collect(read_batches(write(tmp_path / "g.gz", gz + b"garbage!")))
    assert by_type == {"fn": objs}
    assert len(invalid) == 1 and invalid[0].reason.startswith("unreadable input: ")


def test_truncated_gzip_on_stdin(monkeypatch):
    objs, gz = _gz_lines(2000)
    _stdin(monkeypatch, gz[: len(gz) // 2])
    by_type, _, invalid, _ = collect(read_batches("-"))
    assert 0 < len(by_type["fn"]) < 2000 and by_type["fn"] == objs[: len(by_type["fn"])]
    assert [i.source for i in invalid] == ["<stdin>"]


# --------------------------------------------------------------------------
# Property-based: arbitrary bytes never crash, and every line is accounted for.


def _expected(data: bytes, max_line: int) -> tuple[int, list[int]]:
    """Reference model: (valid count, invalid line numbers) of ``data``."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    valid, invalid = 0, []
    for n, part in enumerate(parts, 1):
        if len(part) > max_line:
            invalid.append(n)
        elif not part.strip():
            continue
        else:
            try:
                validate_line(part)
                valid += 1
            except (msgspec.DecodeError, UnicodeDecodeError):
                invalid.append(n)
    return valid, invalid


_valid_lines = st.sampled_from([enc(m(i)) for i, m in enumerate(MAKERS)] + [enc(fn(3)) + b"\r"])
_junk = st.binary(max_size=80) | st.sampled_from([b"", b" ", b"\r", b"{", b"\xff", b"null", b'{"type":"fn"}'])
_content = st.lists(_valid_lines | _junk, max_size=25).map(b"\n".join) | st.binary(max_size=600)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_content, st.sampled_from([1, 2, 3, 17, 256, 1 << 20]), st.sampled_from([8, 64, 200, 1 << 20]),
       st.integers(1, 9))
def test_any_bytes_are_accounted_for(data, chunk, max_line, batch):
    with mock.patch.object(reader, "CHUNK_BYTES", chunk):
        batches = list(parse_lines(iter_lines(io.BytesIO(data), max_line), "p", batch, max_line))
    valid, invalid = _expected(data, max_line)
    assert sum(b.valid_count for b in batches) == valid
    assert [i.line for b in batches for i in b.invalid] == invalid
    assert all(0 < b.valid_count + len(b.invalid) <= batch for b in batches)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_content, st.booleans(), st.sampled_from([3, 64, 1 << 20]))
def test_any_file_never_crashes_the_reader(tmp_path_factory, data, compress, chunk):
    path = tmp_path_factory.mktemp("prop") / "in"
    path.write_bytes(gzip.compress(data) if compress else data)
    with mock.patch.object(reader, "CHUNK_BYTES", chunk):
        batches = list(read_batches(path, batch_records=5, max_line_bytes=100))
    invalid = [i for b in batches for i in b.invalid]
    if not compress and data.startswith(reader.GZIP_MAGIC):
        # Not gzip but looks like it: one unreadable-input report, no crash.
        assert invalid and invalid[-1].reason.startswith("unreadable input: ")
        return
    valid, lines = _expected(data, 100)
    assert valid_total(batches) == valid
    assert [i.line for i in invalid] == lines


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_valid_lines, min_size=1, max_size=40), st.data())
def test_any_truncation_of_gzip_never_crashes(tmp_path_factory, lines, data):
    gz = gzip.compress(b"\n".join(lines) + b"\n")
    cut = data.draw(st.integers(0, len(gz)))
    path = tmp_path_factory.mktemp("cut") / "in.gz"
    path.write_bytes(gz[:cut])
    batches = list(read_batches(path, batch_records=4))
    invalid = [i for b in batches for i in b.invalid]
    n = valid_total(batches)
    assert n <= len(lines)
    if cut == len(gz):
        assert invalid == [] and n == len(lines)
    elif cut >= 2:  # one byte is not the gzip magic yet: read as a (bad) plain line
        # Everything read is a prefix of the input; the cut itself is reported.
        assert invalid[-1].reason.startswith("unreadable input: ")
        assert all(i.reason.startswith("unreadable input: ") for i in invalid)


# -- the whole-chunk fast path (reader.decode_block) gives exactly the line-by-line result ---------

def _batches_as_data(batches) -> list:
    out = []
    for b in batches:
        cols = {t: ({k: (v.dtype.str, v.tobytes()) for k, v in c.arrays.items()}, c.vocab) for t, c in b.columns.items()}
        out.append((cols, msgspec.to_builtins(b.jobs), [(i.source, i.line, i.reason, i.raw) for i in b.invalid]))
    return out


def _deep(d: int) -> bytes:
    return b'{"type":"host","job":"j","node":"n","ts_ns":1,"x":' + b"[" * d + b"]" * d + b"}"


ODD_LINES = [
    b"", b"   ", b"\t", enc(fn(5)) + b"\r", b" " + enc(fn(6)), enc(fn(7)) + b" " + enc(fn(8)),
    enc(fn(9)) + b"," + enc(fn(10)), b'{"type":"host","job":"j","node":"n","ts_ns":1,"x":[1', b'2]}',
    b'{"type":"host","job":"j\xff","node":"n","ts_ns":1}', _deep(63), _deep(64), _deep(65), _deep(300),
    b'{"type":"host","job":"' + b"a" * 500 + b'","node":"n","ts_ns":1}',
    b'{"type":"host","job":"j","node":"n","ts_ns":1,"cpu_util_pct":1e999}', b'{"type":"fn"}{"type":"fn"}',
    b'{"type":"host","job":"j","node":"n","ts_ns":1,"x":"' + b"[" * 100 + b'"}',
    b'{"type":"host","job":"j","node":"n",', b'"ts_ns":1}', b'{"type":"host","job":"j","node":"n","ts_ns":1}\x00',
    b'{"type":"gpu","job":"j","node":"n","rank":1,"gpu":0,"ts_ns":1,"mem_used_bytes":9007199254740993}',
    b'{"type":"fn","job":"j","node":"n","rank":1,"step":1,"fn":"f","kind":"collective","ts_ns":1,"dur_ns":1,'
    b'"bytes":9223372036854775807,"group":"","stack":null}',
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(st.builds(lambda m, i: enc(m(i)), st.sampled_from(MAKERS), st.integers(0, 50)),
                          st.sampled_from(ODD_LINES)), max_size=60),
       st.sampled_from([64, 300, 4096]), st.sampled_from([1, 7, 1000]), st.booleans())
def test_block_fast_path_equals_line_by_line(tmp_path: Path, lines: list[bytes], chunk: int, batch: int,
                                             trailing: bool) -> None:
    data = b"\n".join(lines) + (b"\n" if trailing else b"")
    p = tmp_path / "f.jsonl"
    p.write_bytes(data)
    with mock.patch.object(reader, "CHUNK_BYTES", chunk):
        fast = _batches_as_data(read_batches(p, batch_records=batch, max_line_bytes=400))
    parts = data.split(b"\n")
    if parts and parts[-1] == b"":
        parts.pop()   # the text after the last newline, when empty, is no line
    naive = [(i, raw if len(raw) <= 400 else None) for i, raw in enumerate(parts, 1)]
    slow = _batches_as_data(parse_lines(iter(naive), str(p), batch, 400))
    assert fast == slow


def test_block_fast_path_is_taken_for_clean_input() -> None:
    lines = [enc(m(i)) for i in range(40) for m in MAKERS]
    block = reader.Block(1, len(lines), b"\n".join(lines))
    recs = reader.decode_block(block)
    assert recs is not None and len(recs) == len(lines)
    for bad in (b"", _deep(65), enc(fn(1)) + b" " + enc(fn(2))):
        mixed = lines[:10] + [bad] + lines[10:]
        assert reader.decode_block(reader.Block(1, len(mixed), b"\n".join(mixed))) is None


# -- the reader's own buffer (reader._buffer_blocks): read in place, each block until the next ---------

class _ReadOnly:
    """A stream with ``read`` only (no ``readinto1``, no ``read1``): the buffer is filled from copies."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step = data, step

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:min(n, self.step)], self.data[min(n, self.step):]
        return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_content, st.sampled_from([1, 2, 3, 17, 256, 1 << 20]), st.sampled_from([8, 64, 200, 1 << 20]),
       st.sampled_from([None, 1, 5]))
def test_buffered_blocks_hold_the_input_lines(data, chunk, max_line, read_step):
    """Lines cut across chunks, carried, grown past a chunk or skipped: each block's are the input's, numbered."""
    stream = io.BytesIO(data) if read_step is None else _ReadOnly(data, read_step)
    got: list[bytes | None] = []
    with mock.patch.object(reader, "CHUNK_BYTES", chunk):
        for block in reader._buffer_blocks(stream, max_line):  # type: ignore[arg-type]
            assert block.first == len(got) + 1
            got += block.lines  # read before the next block is asked for
            assert block.count == len(block.lines)
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    assert got == [p if len(p) <= max_line else None for p in parts]


def test_a_buffered_block_is_gone_once_the_next_is_read():
    data = b"\n".join(enc(fn(i)) for i in range(50)) + b"\n"
    with mock.patch.object(reader, "CHUNK_BYTES", 256):
        blocks = reader._buffer_blocks(io.BytesIO(data))
        first = next(blocks)
        assert first.data is not None and first.whole
        first.count = data[:256].count(b"\n")  # as the scanner does: lines counted, never copied out
        second = next(blocks)
        next(blocks)
    with pytest.raises(RuntimeError):
        first.joined  # noqa: B018
    assert second.count == data[256:512].count(b"\n")  # not counted by a scanner: counted before it was gone
    assert second.joined is not None and second.joined.startswith(enc(fn(first.count)))


def test_owned_blocks_parse_as_the_reader_does(tmp_path, monkeypatch):
    """parse_blocks over iter_blocks' blocks (their own bytes, scanned from a copy) gives read_batches' batches."""
    from eroica.models import fastjson

    lines = [enc(m(i)) for i in range(200) for m in MAKERS[:4]]
    lines[333] = b'{"type":"fn"'
    p = write(tmp_path / "a", b"\n".join(lines))
    monkeypatch.setattr(reader, "CHUNK_BYTES", 1 << 12)
    monkeypatch.setattr(fastjson, "FAST_AFTER_BYTES", 0)
    try:
        direct = _batches_as_data(read_batches(p, batch_records=150))
        stream, name = open_source(p)
        with stream:
            owned = _batches_as_data(reader.parse_blocks(reader.iter_blocks(stream), name, batch_records=150))
    finally:
        fastjson.use_kernels(None)  # loaded on demand again, as other tests expect
    assert owned == direct
    assert sum(len(i) for _, _, i in direct) == 1


def test_columns_from_structs_match_field_by_field() -> None:
    objs = [fn(i) | ({"bytes": 2**62 + i, "op": "all_reduce", "group": "g", "stream": 3} if i % 3 else {})
            for i in range(50)] + [gpu(i) | ({"mem_used_bytes": 2**60 + 1} if i % 2 else {}) for i in range(20)]
    recs = [reader.decode_line(enc(o)) for o in objs]
    for t, cls in C.RECORD_CLASSES.items():
        rs = [r for r in recs if type(r) is cls]
        if not rs:
            continue
        cols = C.from_records(t, rs)
        for name, dtype in C.SCHEMAS[t].items():
            got = cols.strings(name).tolist() if dtype == C.CAT else cols.arrays[name].tolist()
            raw = [getattr(r, name) for r in rs]
            if dtype == C.CAT:
                want = [v or "" for v in raw]
            elif name == "kind":
                want = [C.KIND_CODE[v] for v in raw]
            elif name == "op":
                want = [-1 if v is None else C.OP_CODE[v] for v in raw]
            elif dtype == "f8":
                want = [math.nan if v is None else float(v) for v in raw]
            else:
                want = [-1 if v is None else v for v in raw]
            assert got == want or (dtype == "f8" and all(
                (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, want))), (t, name)
