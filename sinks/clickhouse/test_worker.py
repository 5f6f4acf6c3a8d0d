"""The sink worker against a real broker (tansu) and both ClickHouse backends.

Verdicts and window summaries published -> rows; invalid messages -> dead
letters with a reason, and never block their partition; offsets committed
only for stored messages (and exactly up to them); a SIGTERM stores and
commits the last batch.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable

import msgspec
from eroica.models.verdict import Verdict, encode_verdict
from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
from sink_helpers import (
    committed,
    end_offsets,
    kafka_for,
    publish,
    running_worker,
    wait_for,
    worker_config,
)


def _summary(job: str, rank: int, **kw: object) -> dict:
    base = dict(job=job, window_start_ns=1_700_000_000_000_000_000, window_end_ns=1_700_000_010_000_000_000,
                rank=rank, node=f"node-{rank // 8}", fn="aten::mm", kind="kernel", count=12, median_ns=1e6,
                p90_ns=1.2e6, p99_ns=1.5e6, total_ns=1.3e7, beta=0.4, slowdown_vs_peers=math.nan)
    base.update(kw)
    return base


def _count(sink: VerdictSink, table: str, extra: str = " FINAL") -> int:
    return int(sink.run_readonly_sql(f"SELECT count() FROM {table}{extra}").rows[0][0])


def test_verdicts_and_summaries_land_and_offsets_are_committed(
    kafka_bootstrap: str, kafka_names, clickhouse_config: ClickHouseConfig, make_verdict: Callable[..., Verdict],
) -> None:
    kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
    config = worker_config(kafka, clickhouse_config)
    verdicts = [make_verdict(job=f"job-{i % 3}", rank=i) for i in range(30)]
    with running_worker(config) as worker:
        sink = worker.sink
        assert sink is not None
        pos = publish(kafka_bootstrap, kafka.verdicts_topic,
                      [(v.job.encode(), encode_verdict(v)) for v in verdicts])
        # the same verdicts again (a detector restart replays them): no visible duplicate
        pos += publish(kafka_bootstrap, kafka.verdicts_topic,
                       [(v.job.encode(), encode_verdict(v)) for v in verdicts[:10]])
        spos = publish(kafka_bootstrap, config.window_summaries_topic,
                       [(b"job-0", msgspec.msgpack.encode([_summary("job-0", r) for r in range(8)])),
                        (b"job-1", msgspec.msgpack.encode([_summary("job-1", r) for r in range(4)]))])
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos),
                 20, "verdict offsets committed")
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, config.window_summaries_topic) == end_offsets(spos),
                 20, "summary offsets committed")
        cfg = sink.config
        assert _count(sink, cfg.verdicts) == 30
        assert _count(sink, cfg.summaries) == 12
        got = {v.verdict_id: v for v in sink.query_verdicts(limit=None)}
        assert got == {v.verdict_id: v for v in verdicts}  # every field survives the trip
        summaries = sink.query_summaries(job="job-0")
        assert len(summaries) == 8 and math.isnan(summaries[0].slowdown_vs_peers)
        assert worker.stats.verdicts >= 40 and worker.stats.summaries == 12 and worker.stats.deadletters == 0
        assert worker.stats.last_insert_ms is not None and worker.stats.clickhouse == "up"


def test_invalid_messages_go_to_the_dead_letter_topic_and_do_not_block(
    kafka_bootstrap: str, kafka_names, kafka_consume, clickhouse_config: ClickHouseConfig,
    make_verdict: Callable[..., Verdict],
) -> None:
    kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
    config = worker_config(kafka, clickhouse_config)
    good = [make_verdict(rank=i) for i in range(4)]
    doc = msgspec.to_builtins(good[0])
    bad = [
        b"{this is not json",
        json.dumps({**doc, "component": "toaster"}).encode(),
        json.dumps({**doc, "window_start_ns": -1}).encode(),
        b"",
    ]
    with running_worker(config) as worker:
        sink = worker.sink
        assert sink is not None
        # all on one key, so one partition holds good and bad interleaved
        values = [encode_verdict(good[0]), bad[0], encode_verdict(good[1]), bad[1], bad[2],
                  encode_verdict(good[2]), bad[3], encode_verdict(good[3])]
        pos = publish(kafka_bootstrap, kafka.verdicts_topic, [(b"job-1", v) for v in values])
        spos = publish(kafka_bootstrap, config.window_summaries_topic, [(b"job-1", b"\xc1 not msgpack")])
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos),
                 20, "offsets committed past the bad messages")
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, config.window_summaries_topic) == end_offsets(spos),
                 20, "summary offsets committed past the bad message")
        assert {v.verdict_id for v in sink.query_verdicts(limit=None)} == {v.verdict_id for v in good}
        assert worker.stats.deadletters == 5
    letters = kafka_consume(kafka_bootstrap, kafka.deadletter_topic, kafka.partitions, lambda m: len(m) >= 5, 20)
    docs = sorted((json.loads(m.value()) for m in letters),
                  key=lambda d: (d["source"] != config.window_summaries_topic, d["offset"]))
    assert len(docs) == 5 and docs[0]["source"] == config.window_summaries_topic
    reasons = [d["reason"] for d in docs]
    assert "invalid window summaries" in reasons[0] and docs[0]["raw_encoding"] == "base64"
    assert "JSON is malformed" in reasons[1] and "component" in reasons[2] and "UInt64" in reasons[3]
    assert "empty message" in reasons[4]
    p = pos[1][0]
    assert [d["offset"] for d in docs[1:]] == [pos[1][1], pos[3][1], pos[4][1], pos[6][1]]
    assert all(d["partition"] == p and d["key"] == "job-1" for d in docs[1:])
    assert docs[1]["raw"] == "{this is not json"


def test_a_1000_level_nested_message_is_dead_lettered_whole_and_committed_past(
    kafka_bootstrap: str, kafka_names, kafka_consume, clickhouse_config: ClickHouseConfig,
    make_verdict: Callable[..., Verdict],
) -> None:
    """Issue 10: a 2 KB verdict or patterns message with a 1,000-level nested unknown field raised
    RecursionError outside the decoders' handling; the sink re-read it after every restart and stayed failed."""
    kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
    config = worker_config(kafka, clickhouse_config)
    good = [make_verdict(rank=i) for i in range(2)]
    doc = encode_verdict(good[0])
    poison_verdict = doc[:-1] + b',"x":' + b"[" * 1000 + b"]" * 1000 + b"}"
    summary = msgspec.msgpack.encode(_summary("job-1", 0))
    # the same unknown field in a window summary map (msgpack): one more key whose value nests 1,000 arrays
    poison_patterns = b"\x91" + bytes([summary[0] + 1]) + summary[1:] + b"\xa1x" + b"\x91" * 1000 + b"\x01"
    assert len(poison_verdict) < 3000
    with running_worker(config) as worker:
        sink = worker.sink
        assert sink is not None
        pos = publish(kafka_bootstrap, kafka.verdicts_topic,
                      [(b"job-1", encode_verdict(good[0])), (b"job-1", poison_verdict),
                       (b"job-1", encode_verdict(good[1]))])
        spos = publish(kafka_bootstrap, config.window_summaries_topic, [(b"job-1", poison_patterns)])
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos),
                 20, "offsets committed past the nested verdict")
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, config.window_summaries_topic) == end_offsets(spos),
                 20, "offsets committed past the nested patterns message")
        assert {v.verdict_id for v in sink.query_verdicts(limit=None)} == {v.verdict_id for v in good}
        assert worker.stats.deadletters == 2 and worker.stats.clickhouse == "up"
    letters = kafka_consume(kafka_bootstrap, kafka.deadletter_topic, kafka.partitions, lambda m: len(m) >= 2, 20)
    docs = {d["source"]: d for d in (json.loads(m.value()) for m in letters)}
    v, p = docs[kafka.verdicts_topic], docs[config.window_summaries_topic]
    assert "nested" in v["reason"] and "over the bound" in v["reason"]
    assert v["raw"].encode() == poison_verdict and not v["raw_truncated"] and v["offset"] == pos[1][1]
    assert "nested" in p["reason"] and p["raw_encoding"] == "base64"
    assert base64.b64decode(p["raw"]) == poison_patterns


def test_sigterm_stores_and_commits_the_last_batch(
    kafka_bootstrap: str, kafka_names, clickhouse_config: ClickHouseConfig, make_verdict: Callable[..., Verdict],
) -> None:
    """A long flush interval keeps the batch pending until stop(): the stop must flush it."""
    kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
    config = worker_config(kafka, clickhouse_config, flush_interval_s=60.0)
    verdicts = [make_verdict(rank=i) for i in range(5)]
    with running_worker(config) as worker:
        pos = publish(kafka_bootstrap, kafka.verdicts_topic, [(b"j", encode_verdict(v)) for v in verdicts])
        wait_for(lambda: worker.stats.consumed >= 5, 20, "the worker to read the messages")
        assert worker.stats.commits == 0  # still batching
    assert committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos)
    with VerdictSink(clickhouse_config) as sink:
        assert _count(sink, clickhouse_config.verdicts) == 5
