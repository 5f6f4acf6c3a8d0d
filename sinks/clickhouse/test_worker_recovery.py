"""Nothing lost, nothing duplicated: ClickHouse going away, and the sink killed mid-stream.

The invariant under test: a committed offset means the messages before it
are stored. So after any failure, re-reading from the committed offsets
(what a restarted sink does) completes the tables, and the idempotent tables
(ReplacingMergeTree keyed by verdict_id, read FINAL) show each verdict once.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

from eroica.models.verdict import Verdict, encode_verdict
from eroica.sinks.clickhouse import ClickHouseConfig, VerdictSink
from eroica.sinks.clickhouse.endpoint import EndpointClient
from eroica.stack.clickhouse_server import ClickHouseServer
from eroica.kafka.admin import create_topics
from eroica.runtime.system import free_port
from sink_helpers import (
    clickhouse_url,
    committed,
    end_offsets,
    kafka_for,
    publish,
    running_worker,
    sink_env,
    sink_subprocess,
    wait_for,
    worker_config,
)


def _stored_ids(sink: VerdictSink) -> list[str]:
    """Every verdict_id as stored, FINAL (what readers see) -- duplicates would show here."""
    return [r[0] for r in sink.run_readonly_sql(f"SELECT verdict_id FROM {sink.config.verdicts} FINAL").rows]


def _raw_rows(sink: VerdictSink) -> int:
    return int(sink.run_readonly_sql(f"SELECT count() FROM {sink.config.verdicts}").rows[0][0])


def test_clickhouse_down_then_up_loses_nothing_and_commits_only_stored(
    clickhouse_server_binary: list[str], tmp_path: Path, kafka_bootstrap: str, kafka_names,
    make_verdict: Callable[..., Verdict],
) -> None:
    port = free_port()
    server = ClickHouseServer(tmp_path / "ch", native_port=port, stop_timeout_s=5)
    server.start()
    try:
        ch = ClickHouseConfig.from_url(f"clickhouse://127.0.0.1:{port}/down_up", connect_timeout_s=1.0)
        kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
        config = worker_config(kafka, ch)
        first = [make_verdict(rank=i) for i in range(10)]
        second = [make_verdict(rank=i, job="job-2") for i in range(10)]
        with running_worker(config) as worker:
            pos = publish(kafka_bootstrap, kafka.verdicts_topic, [(v.job.encode(), encode_verdict(v)) for v in first])
            wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos),
                     20, "the first verdicts committed")

            server.stop()
            pos2 = publish(kafka_bootstrap, kafka.verdicts_topic,
                           [(v.job.encode(), encode_verdict(v)) for v in second])
            wait_for(lambda: worker.stats.insert_failures >= 3, 20, "failed insert attempts while down")
            assert worker.stats.clickhouse == "down"
            # nothing past the stored messages is committed while the batch cannot be stored
            assert committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(pos)

            server.start()  # same port, same data directory
            wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic)
                     == end_offsets(pos + pos2), 30, "everything committed after ClickHouse came back")
            assert worker.stats.clickhouse == "up"
            sink = worker.sink
            assert sink is not None
            ids = _stored_ids(sink)
            assert sorted(ids) == sorted(v.verdict_id for v in first + second)
    finally:
        server.stop()


def test_sigkill_mid_stream_then_restart_loses_and_duplicates_nothing(
    tmp_path: Path, kafka_bootstrap: str, kafka_names, clickhouse_config: ClickHouseConfig,
    make_verdict: Callable[..., Verdict],
) -> None:
    n = 400
    kafka = kafka_for(kafka_bootstrap, kafka_names.prefix)
    # Small batches so that the kill lands between many insert+commit cycles.
    config = worker_config(kafka, clickhouse_config.replace(batch_size=25), flush_interval_s=0.05)
    create_topics(kafka_bootstrap, {t: kafka.partitions for t in (*config.topics, kafka.deadletter_topic)})
    verdicts = [make_verdict(job=f"job-{i % 4}", rank=i % 64, window_start_ns=1_700_000_000_000_000_000 + i * 10**10)
                for i in range(n)]
    assert len({v.verdict_id for v in verdicts}) == n
    http_port = free_port()
    env = sink_env(config, clickhouse_url(clickhouse_config), http_port)
    endpoint = EndpointClient(f"http://127.0.0.1:{http_port}", timeout_s=5)

    positions: list[tuple[int, int]] = []
    producer = threading.Thread(target=lambda: positions.extend(publish(
        kafka_bootstrap, kafka.verdicts_topic, [(v.job.encode(), encode_verdict(v)) for v in verdicts], per_s=100)))

    def stored_by_endpoint() -> int:
        try:
            return int(endpoint.health().get("verdicts", 0))
        except Exception:  # noqa: BLE001 - not up yet
            return 0

    proc = sink_subprocess(env, tmp_path / "sink-1.log")
    try:
        wait_for(lambda: _assigned(endpoint), 30, "sink 1 assigned")
        producer.start()
        wait_for(lambda: stored_by_endpoint() >= 100, 30, "sink 1 to store some verdicts")
        os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the producer is still sending
        proc.wait(10)
        assert producer.is_alive(), "the kill should land while verdicts are still arriving"

        # The invariant right after the crash: every message below a committed offset is stored.
        after_kill = committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic)
        assert after_kill, "sink 1 committed nothing before the kill"
        producer.join(30)
        by_pos = {p: v.verdict_id for p, v in zip(positions, verdicts, strict=True)}
        must_be_stored = {vid for (p, o), vid in by_pos.items() if o < after_kill.get(p, 0)}
        with VerdictSink(clickhouse_config) as sink:  # the dir is free again on chdb: sink 1 is dead
            stored = set(_stored_ids(sink))
        assert must_be_stored <= stored, f"{len(must_be_stored - stored)} committed verdicts are not stored"
        assert len(must_be_stored) >= 50

        proc = sink_subprocess(env, tmp_path / "sink-2.log")
        wait_for(lambda: committed(kafka_bootstrap, config.group_id, kafka.verdicts_topic) == end_offsets(positions),
                 60, "sink 2 to commit everything")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if producer.is_alive():
            producer.join(30)

    with VerdictSink(clickhouse_config) as sink:
        ids = _stored_ids(sink)
        raw = _raw_rows(sink)
    assert len(ids) == n, f"{n - len(set(ids))} lost, {len(ids) - len(set(ids))} duplicated"
    assert set(ids) == {v.verdict_id for v in verdicts}
    # Re-inserted rows (stored but not yet committed at the kill) exist at most once per batch in flight.
    assert n <= raw <= n + 2 * 25 * 2


def _assigned(endpoint: EndpointClient) -> bool:
    try:
        return bool(endpoint.health().get("assigned"))
    except Exception:  # noqa: BLE001 - not up yet
        return False

