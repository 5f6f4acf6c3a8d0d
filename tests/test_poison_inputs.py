"""Issue 10's poison inputs through the batch tools and the ingest path.

One line with a 1,000-level nested unknown field (2 KB) made ``eroica analyze``
and ``eroica replay`` exit 1 with no result, and dead-lettered a whole
2,000-line ingest message (keeping 4 KB of it). Now the line is rejected with
its reason and kept whole; every other record is analysed, replayed, ingested.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.reader import decode_line, parse_lines
from eroica.models.records import MAX_DUR_NS
from eroica.kafka.config import KafkaConfig
from eroica.producers.replay import replay
from eroica.streams.cores.ingest import RAW, ingest_message
from eroica.streams.cores.summariser_core import DEADLETTER

FN = {"type": "fn", "job": "j", "node": "n0", "rank": 0, "step": 0, "fn": "aten::mm", "kind": "kernel",
      "ts_ns": 1_700_000_000_000_000_000, "dur_ns": 1000}
POISON = (b'{"type":"fn","job":"j","node":"n0","rank":0,"step":0,"fn":"f","kind":"kernel","ts_ns":1,"dur_ns":1,'
          b'"x":' + b"[" * 1000 + b"]" * 1000 + b"}")


def _simulate(tmp_path: Path) -> Path:
    out = tmp_path / "run.jsonl"
    res = CliRunner().invoke(cli, ["simulate", "--nodes", "2", "--gpus", "4", "--steps", "20", "--seed", "1",
                                   "--fault", "gpu_throttle:rank=5", "-o", str(out)])
    assert res.exit_code == 0, res.output
    return out


def _poisoned(clean: Path, at: int) -> Path:
    lines = clean.read_bytes().split(b"\n")
    lines.insert(at - 1, POISON)
    out = clean.with_name("poisoned.jsonl")
    out.write_bytes(b"\n".join(lines))
    return out


def test_the_nested_line_is_rejected_with_a_reason() -> None:
    assert len(POISON) < 2200
    try:
        decode_line(POISON)
    except msgspec.DecodeError as exc:
        assert "nested 1001 levels deep" in str(exc) and "over the bound of 64" in str(exc)
    else:
        raise AssertionError("the nested line decoded")


def test_analyze_reports_the_nested_line_and_analyses_the_rest(tmp_path: Path) -> None:
    clean = _simulate(tmp_path)
    bad = _poisoned(clean, 100)
    runner = CliRunner()
    want = runner.invoke(cli, ["analyze", str(clean), "--format", "json", "-q"])
    got = runner.invoke(cli, ["analyze", str(bad), "--format", "json"])
    assert want.exit_code == 0 and got.exit_code == 0, got.output
    ids = {v["verdict_id"] for v in json.loads(got.stdout)}
    assert ids and ids == {v["verdict_id"] for v in json.loads(want.stdout)}
    assert "1 invalid record(s) skipped" in got.stderr and f"{bad}:100: line nested 1001 levels deep" in got.stderr


class _Publisher:
    """Records what replay publishes (no broker)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, str | bytes | None]] = []

        class _Stats:
            failed = 0
            delivered = 0
            last_error = None
        self.stats = _Stats()

    def publish(self, topic: str, value: bytes, key: str | bytes | None = None) -> bool:
        self.sent.append((topic, value, key))
        return True

    def poll(self, timeout_s: float = 0.0) -> int:
        return 0

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0

    def close(self, timeout_s: float = 0.0) -> None:
        pass


def test_replay_dead_letters_the_nested_line_whole_and_sends_the_rest(tmp_path: Path) -> None:
    clean = _simulate(tmp_path)
    bad = _poisoned(clean, 100)
    config = KafkaConfig(bootstrap="unused:1")
    want = replay([clean], config, publisher=_Publisher(), create=False)
    pub = _Publisher()
    got = replay([bad], config, publisher=pub, create=False)
    assert (got.records, got.jobs, got.invalid) == (want.records, want.jobs, 1)
    (letter,) = [json.loads(v) for t, v, _ in pub.sent if t == config.deadletter_topic]
    assert letter["line"] == 100 and letter["source"] == str(bad) and "nested" in letter["reason"]
    assert letter["raw"].encode() == POISON and not letter["raw_truncated"]


def test_replay_cli_exits_0_with_the_nested_line(kafka_bootstrap: str, kafka_names, tmp_path: Path) -> None:
    bad = _poisoned(_simulate(tmp_path), 100)
    env = {f"EROICA_KAFKA_TOPIC_{k}": v for k, v in (("RAW", f"{kafka_names.prefix}.raw"),
                                                    ("DEADLETTER", f"{kafka_names.prefix}.deadletter"))}
    res = CliRunner().invoke(cli, ["replay", "--kafka", kafka_bootstrap, str(bad)], env=env)
    assert res.exit_code == 0, res.output
    assert "1 invalid lines" in res.stderr and "0 failed" in res.stderr


def test_ingest_message_with_one_bad_line_of_2000_dead_letters_only_that_line() -> None:
    lines = [json.dumps({**FN, "rank": i % 8, "step": i // 8, "ts_ns": FN["ts_ns"] + i * 1000}).encode()
             for i in range(1999)]
    lines.insert(999, POISON)
    sends, counts = ingest_message(b"\n".join(lines), "eroica.ingest/3@1234")
    assert counts == {"lines": 2000, "records": 1999, "jobs": 0, "invalid": 1, "frames": 8}
    (dead,) = [msgspec.json.decode(s.value) for s in sends if s.topic == DEADLETTER]
    assert dead["source"] == "eroica.ingest/3@1234" and dead["line"] == 1000
    assert "nested 1001 levels deep" in dead["reason"]
    assert dead["raw"].encode() == POISON and dead["raw_bytes"] == len(POISON) and not dead["raw_truncated"]
    assert sum(1 for s in sends if s.topic == RAW) == 8


def test_ingest_keeps_a_reference_to_a_line_too_big_for_a_dead_letter() -> None:
    import hashlib

    big = b'{"type":"fn","pad":"' + b"x" * (1 << 20) + b'"}'
    sends, counts = ingest_message(json.dumps(FN).encode() + b"\n" + big, "eroica.ingest/0@7", max_line_bytes=2 << 20)
    assert counts["records"] == 1 and counts["invalid"] == 1
    (dead,) = [msgspec.json.decode(s.value) for s in sends if s.topic == DEADLETTER]
    assert dead["raw_truncated"] and dead["raw"] == big[:4096].decode() and dead["raw_bytes"] == len(big)
    assert dead["raw_sha256"] == hashlib.sha256(big).hexdigest()
    assert (dead["source"], dead["line"]) == ("eroica.ingest/0@7", 2)  # topic/partition@offset and line
    assert max(len(s.value) for s in sends if s.topic == DEADLETTER) <= 900 * 1024


def test_dur_ns_beyond_one_week_is_rejected_with_its_reason() -> None:
    ok = json.dumps({**FN, "dur_ns": MAX_DUR_NS}).encode()
    bad = json.dumps({**FN, "dur_ns": 7 * 10**18}).encode()
    late = json.dumps({**FN, "ts_ns": 2**62 + 1}).encode()
    (batch,) = parse_lines(iter([(1, ok), (2, bad), (3, late)]), "f")
    assert batch.valid_count == 1
    assert [i.line for i in batch.invalid] == [2, 3]
    assert "$.dur_ns" in batch.invalid[0].reason and str(MAX_DUR_NS) in batch.invalid[0].reason
    assert "$.ts_ns" in batch.invalid[1].reason
