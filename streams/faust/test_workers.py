"""The faust workers as real processes on a real broker (``kafka_bootstrap``): ``eroica worker ...``.

- replay of a simulated job with malformed lines -> the verdict ids of ``eroica
  analyze`` for the same file, the malformed lines in the dead letters; a job
  sent as JSON lines on the ingest topic gives its own ``analyze`` verdicts;
- SIGKILL of the summariser and of the detector in the middle of a replay,
  each restarted -> the complete verdict set, no duplicate id (raw duplicate
  messages counted and reported);
- SIGTERM stops a worker whose broker is gone by its deadline.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from eroica.models.job_end import decode_job_end
from eroica.models.verdict import decode_verdict
from eroica.kafka.config import KafkaConfig
from eroica.streams.faust.process import WorkerProcess, worker_env


def _simulate(path: Path, args: str, *extra: str) -> Path:
    from click.testing import CliRunner

    from eroica.cli.main import cli

    res = CliRunner().invoke(cli, ["simulate", *args.split(), *extra, "-o", str(path)])
    assert res.exit_code == 0, res.output
    return path


def _analyze_ids(path: Path, window_s: float = 30.0) -> list[str]:
    from eroica.models.reader import read_batches
    from eroica.streams.detection import analyze

    return sorted(v.verdict_id for v in analyze(read_batches(path), int(window_s * 1e9)))


class _Stack:
    """A summariser and a detector on fresh topics and application ids."""

    def __init__(self, tmp_path: Path, config: KafkaConfig, prefix: str, **settings: object) -> None:
        self.config = config
        common = dict(data_dir=tmp_path / "data", log_level="info", stats_interval_s=0, idle_close_s=2,
                      detect_grace_s=60, shutdown_timeout_s=8, **settings)
        self.sum = WorkerProcess("summariser", worker_env(config, app_id=f"{prefix}-sum", **common),
                                 tmp_path / "summariser.log")
        self.det = WorkerProcess("detector", worker_env(config, app_id=f"{prefix}-det", **common),
                                 tmp_path / "detector.log")

    def start(self) -> "_Stack":
        self.sum.start()
        self.det.start()
        self.sum.wait_ready()
        self.det.wait_ready()
        return self

    def stop(self) -> dict[str, tuple]:
        return {"summariser": self.sum.stop(), "detector": self.det.stop()}


def _verdicts(consume, config: KafkaConfig, want: int, timeout_s: float) -> list:
    """The verdict messages of the verdict topic, without the job-end markers it also carries (models/job_end.py)."""
    def verdicts(out: list) -> list:
        return [m for m in out if decode_job_end(m.value()) is None]

    msgs = consume(config.bootstrap, config.verdicts_topic, config.partitions,
                   lambda out: len({m.value() for m in verdicts(out)}) >= want, timeout_s=timeout_s)
    return verdicts(msgs)


@pytest.fixture
def stack(tmp_path, kafka_bootstrap, kafka_names):
    made: list[_Stack] = []

    def make(**settings: object) -> _Stack:
        s = _Stack(tmp_path, kafka_names.config(kafka_bootstrap), kafka_names.prefix, **settings)
        made.append(s)
        return s.start()

    yield make
    for s in made:
        s.stop()


def test_replay_and_ingest_give_the_verdicts_of_analyze(tmp_path, stack, kafka_consume) -> None:
    from eroica.kafka.publisher import FramePublisher
    from eroica.producers.replay import replay

    run = _simulate(tmp_path / "run.jsonl", "--nodes 2 --gpus 4 --steps 20 --fault gpu_throttle:rank=5 --seed 1")
    lines = run.read_bytes().splitlines()
    bad = [b'{"type":"fn","job":"sim-1","node":"node-0","rank":0,"step":0,"fn":"f","kind":"kernel",'
           b'"ts_ns":1763000000000000000,"dur_ns":-5}', b"this is not json"]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_bytes(b"\n".join(lines[:100] + bad + lines[100:]) + b"\n")
    ingest_file = _simulate(tmp_path / "ingest.jsonl", "--nodes 2 --gpus 4 --steps 20 --fault uneven_workload:rank=2 "
                            "--seed 2", "--job", "ingested")
    ref = _analyze_ids(run)
    ref_ingest = _analyze_ids(ingest_file)
    assert ref and ref_ingest

    s = stack()
    config = s.config
    t0 = time.monotonic()
    result = replay([mixed], config)
    replayed_at = time.time()
    assert result.invalid == 2
    msgs = _verdicts(kafka_consume, config, len(ref), 60)
    got = [decode_verdict(m.value()) for m in msgs]
    assert sorted(v.verdict_id for v in got) == ref
    last_ts_ms = max(m.timestamp()[1] for m in msgs)
    latency = last_ts_ms / 1000 - replayed_at
    print(f"\nreplay {result.records} records in {result.seconds:.2f} s; last verdict on the topic "
          f"{latency:.2f} s after the replay's last message ({time.monotonic() - t0:.1f} s end to end)")

    # the same worker takes contract JSON lines from the ingest topic (500 lines a message, one bad line)
    ingest_lines = ingest_file.read_bytes().splitlines()
    ingest_lines.insert(10, b'{"type":"gpu","job":"ingested"}')
    with FramePublisher(config) as pub:
        for lo in range(0, len(ingest_lines), 500):
            pub.publish(config.ingest_topic, b"\n".join(ingest_lines[lo:lo + 500]), key=b"collector-1")
        pub.flush(10)
    msgs = _verdicts(kafka_consume, config, len(ref) + len(ref_ingest), 60)
    got_ingest = sorted(decode_verdict(m.value()).verdict_id for m in msgs
                        if decode_verdict(m.value()).job == "ingested")
    assert got_ingest == ref_ingest

    dead = [json.loads(m.value()) for m in kafka_consume(
        config.bootstrap, config.deadletter_topic, config.partitions, lambda out: len(out) >= 3, timeout_s=20)]
    assert len(dead) == 3, dead
    assert any("dur_ns" in d["reason"] for d in dead) and any("invalid JSON" in d["reason"] for d in dead)
    assert any(d["source"].startswith(config.ingest_topic) and "missing required field" in d["reason"]
               for d in dead), dead

    patterns = kafka_consume(config.bootstrap, config.window_summaries_topic, config.partitions,
                             lambda out: len(out) >= 2, timeout_s=10)
    assert patterns, "window summaries reach the patterns topic"
    stats = s.sum.stats()
    assert stats["ingest"]["invalid"] == 1 and stats["ingest"]["jobs"] == 1
    assert stats["records"] == result.records + stats["ingest"]["records"]
    assert stats["late_records"] == 0 and s.det.stats()["late_windows"] == 0
    for role, (code, took) in s.stop().items():
        assert code == 0 and took < 10, (role, code, took)


def test_sigkill_mid_replay_then_restart_loses_and_duplicates_nothing(tmp_path, stack, kafka_consume) -> None:
    from eroica.producers.replay import replay

    run = _simulate(tmp_path / "run.jsonl", "--nodes 4 --gpus 8 --steps 60 --fault nic:node=node-2 --seed 3")
    ref = _analyze_ids(run, window_s=5)
    assert len(ref) >= 3
    s = stack(window_s=5)
    config = s.config
    done = threading.Event()
    result: list = []

    def send() -> None:
        try:
            result.append(replay([run], config, rate=5000))
        finally:
            done.set()

    t = threading.Thread(target=send, daemon=True)
    t.start()
    # the detector dies once it has sent a verdict, the summariser once it has sent more digests since
    first = kafka_consume(config.bootstrap, config.verdicts_topic, config.partitions, lambda out: len(out) >= 1,
                          timeout_s=30)
    assert first and not done.is_set(), "a verdict should come out while the replay runs"
    s.det.kill()
    s.det.start()
    before = s.sum.stats()["digests"]
    deadline = time.monotonic() + 20
    while s.sum.stats()["digests"] < before + 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    summarised = s.sum.stats()
    s.sum.kill()
    s.sum.start()
    assert not done.is_set(), "the replay should still be running when the summariser is killed"
    t.join(60)
    assert result and result[0].records > 0
    msgs = _verdicts(kafka_consume, config, len(ref), 90)
    got = [decode_verdict(m.value()) for m in msgs]
    ids = [v.verdict_id for v in got]
    assert sorted(set(ids)) == ref, ([(v.window_start_ns, v.component, v.scope, v.node, v.rank, v.fn, v.verdict_id)
                                      for v in got], ref, s.sum.stats(), s.det.stats())
    after = s.sum.stats()
    print(f"\n{len(ids)} verdict messages for {len(set(ids))} verdicts: {len(ids) - len(set(ids))} raw duplicates; "
          f"summariser killed after {summarised['records']} records and {summarised['digests']} digests, "
          f"read {after['records']} of {result[0].records} records again after its restart; "
          f"detector after restart: {s.det.stats()}")


def test_sigterm_stops_a_worker_whose_broker_is_gone(tmp_path, kafka_names) -> None:
    from eroica.stack.tansu import TansuBroker

    with TansuBroker(data_dir=tmp_path / "tansu") as broker:
        config = kafka_names.config(broker.bootstrap)
        w = WorkerProcess("detector", worker_env(config, app_id=f"{kafka_names.prefix}-det", data_dir=tmp_path,
                                                 shutdown_timeout_s=3, stats_interval_s=0),
                          tmp_path / "detector.log").start()
        w.wait_ready()
    code, took = w.stop(timeout_s=20)
    assert took < 3 + 3, (code, took, w.log_tail())


def test_messages_that_grow_with_the_job_fit_the_producer_and_the_topics(tmp_path, monkeypatch) -> None:
    """A 1,024-rank job window's window summaries are ~6.5 MB: faust's 1,000,000-byte default refused
    them (eroica bench live), so the workers raise the producer's bound to the sink's, and the topics of
    a broker the stack runs take as much."""
    from eroica.kafka.admin import LARGE_MESSAGES
    from eroica.models.limits import MAX_VERDICT_BYTES
    from eroica.stack.local import LocalStack
    from eroica.streams.faust.settings import WorkerSettings
    from eroica.streams.faust.workers import build_app

    monkeypatch.delenv("PRODUCER_MAX_REQUEST_SIZE", raising=False)
    monkeypatch.setenv("EROICA_DATA_DIR", str(tmp_path))
    app = build_app("summariser", WorkerSettings.from_env(), KafkaConfig.from_env(), None)
    assert app.conf.producer_max_request_size == MAX_VERDICT_BYTES > 6_500_000
    assert LARGE_MESSAGES == {"max.message.bytes": str(MAX_VERDICT_BYTES)}
    config = LocalStack(tmp_path / "stack", env={}).topic_config()
    assert config is not None and config["max.message.bytes"] == str(MAX_VERDICT_BYTES)
