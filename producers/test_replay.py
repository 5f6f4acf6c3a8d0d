"""Replay against a real broker: what goes in as JSONL comes out of Kafka as the same records."""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from eroica.cli.main import cli
from eroica.models.columns import concat, to_records
from eroica.models.frames import (
    COLUMNS, END_OF_STREAM, JOB, decode_end_of_stream, decode_frame, decode_job, frame_kind,
)
from eroica.producers.replay import replay
from eroica.runtime.system import free_port

MALFORMED_LINE = 7


def _lines() -> list[dict]:
    out: list[dict] = [{"type": "job", "job": "jA", "world_size": 4, "rank_nodes": ["n0", "n0", "n1", "n1"]}]
    for step in range(150):
        for rank in range(4):
            out.append({"type": "fn", "job": "jA", "node": f"n{rank // 2}", "rank": rank, "step": step,
                        "fn": "aten::mm" if step % 2 else "ncclAllReduce",
                        "kind": "kernel" if step % 2 else "collective", "ts_ns": 1000 * step + rank,
                        "dur_ns": 100 + rank, **({} if step % 2 else {"op": "all_reduce", "bytes": 4096})})
    for t in range(20):
        out.append({"type": "fn", "job": "jB", "node": "m0", "rank": 0, "step": t, "fn": "train.step",
                    "kind": "python", "ts_ns": t, "dur_ns": 5, "stack": "main;train.step"})
        out.append({"type": "gpu", "job": "jA", "node": "n0", "rank": t % 2, "gpu": t % 2, "ts_ns": t,
                    "sm_clock_mhz": 1400.0 + t})
        out.append({"type": "nic", "job": "jA", "node": f"n{t % 2}", "nic": "mlx5_0", "ts_ns": t, "tx_Bps": 1e9})
        out.append({"type": "host", "job": "jA", "node": f"n{t % 2}", "ts_ns": t, "cpu_util_pct": 50.0})
    return out


def _write(path: Path, lines: list[dict], malformed_at: int | None = MALFORMED_LINE) -> Path:
    text = [json.dumps(x) for x in lines]
    if malformed_at is not None:
        text.insert(malformed_at - 1, '{"type": "fn", "job": "jA", "node": "n0", "rank": 0, "step": 1, '
                                      '"fn": "f", "kind": "python", "ts_ns": 1, "dur_ns": -5}')
    path.write_text("\n".join(text) + "\n")
    return path


def _canonical(recs: list[dict]) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True) for r in recs)


def test_replay_round_trip_with_dead_letter_and_end_of_stream(kafka_bootstrap: str, kafka_names, kafka_consume,
                                                              tmp_path: Path) -> None:
    lines = _lines()
    src = _write(tmp_path / "in.jsonl", lines)
    config = kafka_names.config(kafka_bootstrap, partitions=3, frame_records=64)
    result = replay([src], config, batch_records=1000)

    valid = [x for x in lines if x["type"] != "job"]
    assert result.records == len(valid) and result.jobs == 1 and result.invalid == 1
    assert result.by_type == Counter(x["type"] for x in valid)
    # keys: 4 ranks of jA + rank 0 of jB (fn/gpu) and 2 nodes of jA (nic/host)
    assert result.end_of_stream == 7
    assert result.publisher.failed == 0 and result.publisher.dropped == 0

    msgs = kafka_consume(kafka_bootstrap, config.raw_topic, 3,
                   lambda got: sum(frame_kind(m.value()) == END_OF_STREAM for m in got) >= 7)
    by_kind = defaultdict(list)
    for m in msgs:
        by_kind[frame_kind(m.value())].append(m)
    assert len(by_kind[COLUMNS]) == result.frames
    assert [decode_job(m.value()).job for m in by_kind[JOB]] == ["jA"]

    decoded = defaultdict(list)
    per_key = defaultdict(lambda: {"records": 0, "frames": 0, "seq": []})
    for m in by_kind[COLUMNS]:
        cols, meta = decode_frame(m.value())
        assert len(cols) <= 64
        decoded[cols.type].append(cols)
        k = per_key[m.key().decode()]
        k["records"] += len(cols)
        k["frames"] += 1
        k["seq"].append(meta["seq"])
    got = [r for batches in decoded.values() for r in to_records(concat(batches))]
    assert _canonical(got) == _canonical(valid)

    # each key's frames arrive in order, then exactly one marker that counts them
    markers = {m.key().decode(): decode_end_of_stream(m.value()) for m in by_kind[END_OF_STREAM]}
    assert set(markers) == set(per_key) == {"jA/0", "jA/1", "jA/2", "jA/3", "jB/0", "jA/n0", "jA/n1"}
    for key, eos in markers.items():
        assert (eos.records, eos.frames) == (per_key[key]["records"], per_key[key]["frames"])
        assert per_key[key]["seq"] == list(range(eos.frames))
        assert eos.meta["job_keys"] == (6 if eos.job == "jA" else 1)
        assert (eos.rank == -1) == key.startswith("jA/n")
    for m in by_kind[END_OF_STREAM]:
        later = [x for x in msgs if x.partition() == m.partition() and x.offset() > m.offset()
                 and x.key() == m.key()]
        assert not later

    dead = kafka_consume(kafka_bootstrap, config.deadletter_topic, 3, lambda got: len(got) >= 1, timeout_s=10)
    assert len(dead) == 1
    letter = json.loads(dead[0].value())
    assert set(letter) == {"source", "line", "reason", "raw", "raw_encoding", "raw_bytes", "raw_sha256",
                           "raw_truncated"}
    assert letter["raw_encoding"] == "text" and not letter["raw_truncated"]
    assert letter["source"] == str(src) and letter["line"] == MALFORMED_LINE
    assert "dur_ns" in letter["reason"] and '"dur_ns": -5' in letter["raw"]
    assert dead[0].key().decode() == str(src)


def test_replay_cli_paces_to_rate(kafka_bootstrap: str, kafka_names, kafka_consume, tmp_path: Path) -> None:
    lines = [x for x in _lines() if x["type"] == "fn"][:600]
    src = _write(tmp_path / "paced.jsonl", lines, malformed_at=None)
    config = kafka_names.config(kafka_bootstrap)
    env = {"EROICA_KAFKA_TOPIC_RAW": config.raw_topic, "EROICA_KAFKA_TOPIC_DEADLETTER": config.deadletter_topic,
           "EROICA_KAFKA_PARTITIONS": "2"}
    start = time.monotonic()
    res = CliRunner().invoke(cli, ["replay", str(src), "--rate", "1000", "--kafka", kafka_bootstrap,
                                   "--frame-records", "50"], env=env)
    elapsed = time.monotonic() - start
    assert res.exit_code == 0, res.output
    assert "delivered 600 of 600 records (fn 600)" in res.stderr and "0 failed" in res.stderr
    assert elapsed >= 0.5  # 600 records at 1000/s, paced per frame of <= 50
    msgs = kafka_consume(kafka_bootstrap, config.raw_topic, 2,
                   lambda got: sum(frame_kind(m.value()) == END_OF_STREAM for m in got) >= 4)
    assert sum(len(decode_frame(m.value())[0]) for m in msgs if frame_kind(m.value()) == COLUMNS) == 600


def test_replay_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    bad = runner.invoke(cli, ["replay", str(tmp_path / "x.jsonl"), "--rate", "fast"])
    assert bad.exit_code == 2
    src = _write(tmp_path / "one.jsonl", _lines()[:3], malformed_at=None)
    dead = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    res = runner.invoke(cli, ["replay", str(src), "--kafka", dead, "--connect-timeout", "0.5"])
    assert res.exit_code == 1 and "no Kafka broker answered" in res.stderr
    assert time.monotonic() - start < 5


def test_replay_cli_no_valid_record_exits_3(kafka_bootstrap: str, kafka_names, kafka_consume, tmp_path: Path) -> None:
    src = tmp_path / "bad.jsonl"
    src.write_text('not json\n{"type": "gpu", "job": "j"}\n')
    config = kafka_names.config(kafka_bootstrap)
    env = {"EROICA_KAFKA_TOPIC_RAW": config.raw_topic, "EROICA_KAFKA_TOPIC_DEADLETTER": config.deadletter_topic}
    res = CliRunner().invoke(cli, ["replay", str(src), "--kafka", kafka_bootstrap], env=env)
    assert res.exit_code == 3, res.output
    assert "2 invalid lines" in res.stderr
    dead = kafka_consume(kafka_bootstrap, config.deadletter_topic, config.partitions, lambda got: len(got) >= 2)
    assert sorted(json.loads(m.value())["line"] for m in dead) == [1, 2]


def test_replay_against_a_broker_killed_midway_reports_what_was_delivered(tmp_path: Path) -> None:
    """Issue 10 item 6: the summary counts acknowledged records, and the exit status is non-zero."""
    import os
    import subprocess
    import sys

    from eroica.stack.tansu import TansuBroker

    lines = [x for x in _lines() if x["type"] == "fn"][:600]
    src = _write(tmp_path / "paced.jsonl", lines, malformed_at=None)
    broker = TansuBroker(data_dir=tmp_path / "tansu").start()
    try:
        env = {**os.environ, "EROICA_KAFKA_DELIVERY_TIMEOUT_MS": "2000", "EROICA_KAFKA_LINGER_MS": "0"}
        # 600 records at 200/s in frames of 10: about 3 s, the broker dies after 1 s
        proc = subprocess.Popen([sys.executable, "-m", "eroica.cli", "replay", str(src), "--rate", "200",
                                 "--frame-records", "10", "--kafka", broker.bootstrap], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        from confluent_kafka import Consumer, TopicPartition

        from eroica.stack.tansu import _quiet_admin

        admin, deadline = _quiet_admin(broker.bootstrap), time.monotonic() + 20
        while "eroica.raw" not in admin.list_topics(timeout=5).topics:  # replay has started sending
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        parts = admin.list_topics(timeout=5).topics["eroica.raw"].partitions
        del admin
        # Kill it once the broker holds some of the records (some delivered, most still to come).
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe", "log_level": 0})
        consumer.assign([TopicPartition("eroica.raw", p, 0) for p in parts])
        while (msg := consumer.poll(0.2)) is None or msg.error() is not None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        consumer.close()
        time.sleep(0.3)
        assert proc.poll() is None, proc.communicate()
        broker._proc.kill()  # type: ignore[union-attr]
        _out, err = proc.communicate(timeout=30)
    finally:
        broker.stop()
    assert proc.returncode == 1, err
    assert "NOT ALL DELIVERED" in err and "replay ABORTED" in err, err
    import re

    m = re.search(r"(\d+) of (\d+) records delivered, (\d+) not", err)
    assert m, err
    delivered, sent, missing = map(int, m.groups())
    assert 0 < delivered < 600 and sent == delivered + missing and missing > 0


class _Stamping:
    """A publisher without a broker that stamps each message with the wall clock it was handed over at."""

    counts_records = False

    def __init__(self) -> None:
        from eroica.kafka.publisher import PublisherStats

        self.stats = PublisherStats()
        self.sent: list[tuple[int, bytes]] = []

    def publish(self, topic: str, value: bytes, key: object = None, **_kw: object) -> bool:
        self.sent.append((time.time_ns(), value))
        self.stats.produced += 1
        self.stats.delivered += 1
        return True

    def poll(self, timeout_s: float = 0.0) -> int:
        time.sleep(timeout_s)
        return 0

    def flush(self, timeout_s: float = 0.0) -> int:
        return 0


def test_replay_paced_by_event_time_sends_no_frame_before_its_newest_record(tmp_path: Path) -> None:
    """Event time + offset is when a frame may go: none early, the last one ~1.2 s after the first record."""
    from eroica.kafka.config import KafkaConfig

    span_ns = 1_200_000_000
    lines: list[dict] = [{"type": "job", "job": "jT", "world_size": 2, "rank_nodes": ["n0", "n0"]}]
    for i in range(240):  # 2 ranks, a record every 10 ms of event time each
        lines.append({"type": "fn", "job": "jT", "node": "n0", "rank": i % 2, "step": i // 20, "fn": "aten::mm",
                      "kind": "kernel", "ts_ns": 10**12 + i * span_ns // 240, "dur_ns": 1000})
    src = _write(tmp_path / "clock.jsonl", lines, malformed_at=None)
    pub = _Stamping()
    start = time.time_ns()
    offset = start + 200_000_000 - 10**12  # the first record "happens" 0.2 s from now
    result = replay([src], KafkaConfig(bootstrap="unused:1", frame_records=10), publisher=pub,  # type: ignore[arg-type]
                    create=False, clock_offset_ns=offset)

    frames = [(at, decode_frame(v)[0]) for at, v in pub.sent if frame_kind(v) == COLUMNS]
    assert sum(len(c) for _, c in frames) == result.records == 240
    for at, cols in frames:
        assert at >= int(cols.arrays["ts_ns"].max()) + offset  # never before its newest record happened
    last_release = 10**12 + 239 * span_ns // 240 + offset
    assert frames[-1][0] - last_release < 300_000_000 and result.behind_s < 0.3
    assert time.time_ns() - start >= 200_000_000 + 239 * span_ns // 240


def test_digest_replay_paced_by_event_time_digests_no_batch_before_its_newest_record(tmp_path: Path) -> None:
    """Digest mode paced by event time: a window's digest goes out no sooner than the record that closed it
    (the window's end plus the lateness, shifted by the offset); the replay lasts the input's span."""
    from eroica.kafka.config import KafkaConfig
    from eroica.producers.replay import replay_digests
    from eroica.streams.cores.digest_messages import DigestMsg, decode_message
    from eroica.streams.edge import EdgeDigester

    w, t0, span_ns = 100_000_000, 10**12, 1_200_000_000
    lines: list[dict] = [{"type": "job", "job": "jD", "world_size": 2, "rank_nodes": ["n0", "n1"]}]
    for i in range(240):  # 2 ranks on 2 nodes, a record every 5 ms of event time
        lines.append({"type": "fn", "job": "jD", "node": f"n{i % 2}", "rank": i % 2, "step": i // 20, "fn": "aten::mm",
                      "kind": "kernel", "ts_ns": t0 + i * span_ns // 240, "dur_ns": 1000})
    src = _write(tmp_path / "digests.jsonl", lines, malformed_at=None)
    pub = _Stamping()
    start = time.time_ns()
    offset = start + 200_000_000 - t0  # the first record "happens" 0.2 s from now
    result = replay_digests([src], KafkaConfig(bootstrap="unused:1"), lambda source: EdgeDigester(source, w, w, 2 * w),
                            publisher=pub, create=False, clock_offset_ns=offset, batch_records=20)  # type: ignore[arg-type]

    digests = [(at, m) for at, v in pub.sent if isinstance(m := decode_message(v), DigestMsg)]
    last = t0 + 239 * span_ns // 240
    closed_in_flight = [(at, m) for at, m in digests if m.end_ns + w <= last]
    assert result.digests == len(digests) and len(closed_in_flight) >= 10 and result.records == 240
    for at, m in closed_in_flight:
        assert at >= m.end_ns + w + offset  # the batch that closed it went out when its newest record happened
    assert pub.sent[-1][0] >= last + offset and result.behind_s < 0.3
    with pytest.raises(ValueError, match="not both"):
        replay_digests([src], None, lambda source: None, rate=10.0, clock_offset_ns=0,  # type: ignore[arg-type]
                       create=False, publisher=pub)  # type: ignore[arg-type]


def test_clock_pacer_records_how_late_a_frame_went_out() -> None:
    from eroica.producers.replay import _ClockPacer

    now = [5_000_000_000]
    pub = _Stamping()
    pacer = _ClockPacer(1_000_000_000, pub, clock=lambda: now[0])  # type: ignore[arg-type]
    pacer.before(3_500_000_000)  # release at 4.5 s, now 5 s: 0.5 s late, no wait
    assert pacer.behind_s == 0.5
    pacer.before(3_900_000_000)  # 0.1 s late: the worst stays
    assert pacer.behind_s == 0.5

    def advance(timeout_s: float) -> int:
        now[0] += int(timeout_s * 1e9) + 1
        return 0

    pub.poll = advance  # type: ignore[method-assign]
    pacer.before(4_200_000_000)  # release at 5.2 s: waits for the clock
    assert now[0] >= 5_200_000_000 and pacer.behind_s == 0.5
    try:
        replay([], None, rate=10.0, clock_offset_ns=0, create=False, publisher=pub)  # type: ignore[arg-type]
    except ValueError as exc:
        assert "not both" in str(exc)
    else:
        raise AssertionError("rate and clock pacing together must be refused")


def test_replay_declares_each_streams_watermark_and_counts_broken_order(tmp_path: Path) -> None:
    """Time-ordered input: every frame says its stream's newest time so far (``wm``), never less than
    before; a record older than its stream's declaration (input out of order) is counted."""
    from eroica.kafka.config import KafkaConfig

    lines: list[dict] = []
    for i in range(60):  # 2 ranks, in time order
        lines.append({"type": "fn", "job": "jW", "node": "n0", "rank": i % 2, "step": 0, "fn": "aten::mm",
                      "kind": "kernel", "ts_ns": 10**12 + i * 1000, "dur_ns": 10})
    lines.append({"type": "fn", "job": "jW", "node": "n0", "rank": 0, "step": 0, "fn": "aten::mm",
                  "kind": "kernel", "ts_ns": 10**12, "dur_ns": 10})  # older than rank 0 declared
    src = _write(tmp_path / "wm.jsonl", lines, malformed_at=None)
    pub = _Stamping()
    result = replay([src], KafkaConfig(bootstrap="unused:1", frame_records=10), publisher=pub,  # type: ignore[arg-type]
                    create=False, declare_watermarks=True)
    frames = [decode_frame(v) for _, v in pub.sent if frame_kind(v) == COLUMNS]
    assert sum(len(c) for c, _ in frames) == 61 and all("wm" in m for _, m in frames)
    per_rank: dict[int, list[int]] = {}
    for cols, meta in frames:
        per_rank.setdefault(int(cols.arrays["rank"][0]), []).append(meta["wm"])
        assert meta["wm"] >= int(cols.arrays["ts_ns"].max())
    assert all(w == sorted(w) for w in per_rank.values())
    assert result.watermark_violations == 1
    plain = _Stamping()
    replay([src], KafkaConfig(bootstrap="unused:1", frame_records=10), publisher=plain,  # type: ignore[arg-type]
           create=False)
    assert not any("wm" in decode_frame(v)[1] for _, v in plain.sent if frame_kind(v) == COLUMNS)


def test_in_order_mark_is_the_oldest_of_the_streams_newest_records(tmp_path: Path) -> None:
    """A stream is (job, rank) for rank records and (job, node) for node samples: the mark may not pass any."""
    from eroica.models.reader import read_batches
    from eroica.producers.replay import in_order_mark

    def fn(job: str, rank: int, ts: int) -> dict:
        return {"type": "fn", "job": job, "node": f"n{rank // 2}", "rank": rank, "step": 0, "fn": "f",
                "kind": "kernel", "ts_ns": ts, "dur_ns": 1}

    def cols(lines: list[dict], name: str) -> dict:
        return next(iter(read_batches(_write(tmp_path / name, lines, malformed_at=None)))).columns

    fns = cols([fn("a", 0, 50), fn("a", 1, 90), fn("a", 0, 70), fn("b", 0, 95)], "fn.jsonl")["fn"]
    assert in_order_mark([fns]) == 70  # rank 0 of job a is newest at 70, though the batch reaches 95
    gpu = cols([{"type": "gpu", "job": "a", "node": "n0", "rank": r, "gpu": r, "ts_ns": ts, "sm_util_pct": 1.0}
                for r, ts in ((0, 80), (1, 60))], "gpu.jsonl")["gpu"]
    assert in_order_mark([fns, gpu]) == 70 and in_order_mark([gpu]) == 80  # one node's samples: one stream
    assert in_order_mark([fns.take(np.arange(0))]) is None


def test_digest_replay_that_declares_closes_windows_sooner_and_loses_nothing(tmp_path: Path) -> None:
    """Declared marks (each node: the oldest of its streams' newest records) close a window the declared lateness
    after it is past instead of the guessed lateness: the same digests, sent earlier in the input, none late."""
    from eroica.kafka.config import KafkaConfig
    from eroica.models.digest import encode_digest
    from eroica.producers.replay import replay_digests
    from eroica.producers.simulator import SimConfig, write_jsonl
    from eroica.streams.cores.digest_messages import DigestMsg, EndMsg, decode_message
    from eroica.streams.faust.settings import WorkerSettings

    src = tmp_path / "job.jsonl"
    write_jsonl(SimConfig(nodes=2, gpus=4, steps=60, seed=2), src, truth_path=False)
    settings = WorkerSettings.from_env({"EROICA_WINDOW_S": "10", "EROICA_LATENESS_S": "20"})  # declared: 5 s

    def run(declare: bool) -> tuple[dict, int, int]:
        pub = _Stamping()
        r = replay_digests([src], KafkaConfig(bootstrap="unused:1"),
                           lambda s: settings.edge_digester(s, declares=declare), publisher=pub,  # type: ignore
                           create=False, batch_records=200, declare_watermarks=declare)
        sent = [v for _, v in pub.sent]
        msgs = [decode_message(v) for v in sent]
        digests = {(m.source, m.digest.start_ns): encode_digest(m.digest) for m in msgs if isinstance(m, DigestMsg)}
        ends = [i for i, m in enumerate(msgs) if isinstance(m, EndMsg)]
        before_end = sum(isinstance(m, DigestMsg) for m in msgs[:ends[0]])  # closed while records flowed
        return digests, before_end, r.late_records

    guessed, guessed_at, guessed_late = run(False)
    declared, declared_at, declared_late = run(True)
    assert declared == guessed and len(declared) >= 8  # the same windows, the same contents
    assert guessed_late == declared_late == 0
    assert declared_at > guessed_at  # more windows closed while the input flowed, fewer waited for its end


def test_frame_lag_sets_how_much_event_time_a_frame_spans(tmp_path: Path) -> None:
    """Longer frames, fewer of them: the same records either way, no frame spanning more than its lag,
    and declared marks still never passed (the summariser's cost is per frame, README "Throughput")."""
    from eroica.kafka.config import KafkaConfig

    lines = [{"type": "fn", "job": "jL", "node": "n0", "rank": i % 4, "step": 0, "fn": "aten::mm",
              "kind": "kernel", "ts_ns": 10**12 + i * 25_000_000, "dur_ns": 10} for i in range(1600)]  # 40 s
    src = _write(tmp_path / "lag.jsonl", lines, malformed_at=None)
    sent: dict[float | None, list] = {}
    for lag in (None, 1.0, 4.0):
        pub = _Stamping()
        result = replay([src], KafkaConfig(bootstrap="unused:1"), publisher=pub,  # type: ignore[arg-type]
                        create=False, declare_watermarks=True, frame_lag_s=lag)
        assert result.watermark_violations == 0
        sent[lag] = [decode_frame(v)[0] for _, v in pub.sent if frame_kind(v) == COLUMNS]
    for lag, frames in sent.items():
        spans = [int(c.arrays["ts_ns"].max()) - int(c.arrays["ts_ns"].min()) for c in frames]
        assert max(spans) <= (lag or 1.0) * 1e9, lag
        got = sorted((int(r), int(t)) for c in frames for r, t in zip(c.arrays["rank"], c.arrays["ts_ns"]))
        assert got == sorted((d["rank"], d["ts_ns"]) for d in lines)
    assert len(sent[None]) == len(sent[1.0])          # the default is a tracer's one second
    assert len(sent[4.0]) * 3 <= len(sent[1.0])       # four times the span: about a quarter of the frames
    with pytest.raises(ValueError, match="frame_lag_s"):
        replay([src], KafkaConfig(bootstrap="unused:1"), publisher=_Stamping(), create=False,  # type: ignore[arg-type]
               frame_lag_s=0.0)
