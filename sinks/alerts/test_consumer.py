"""The alert consumer against a real broker and a local webhook (in-process).

- a crash after the state file was written but before the offsets were
  committed: the next consumer reads the same messages again and sends nothing twice;
- the webhook down, then up: nothing committed meanwhile, the notification
  delivered once after the retries, then the offsets committed.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from alert_helpers import Webhook, committed, detector_windows, publish
from sink_helpers import wait_for

from eroica.kafka.config import KafkaConfig
from eroica.sinks.alerts.config import AlertConfig
from eroica.sinks.alerts.consumer import AlertConsumer

PARTITIONS = 2


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


def _config(bootstrap: str, hook: Webhook, tmp_path: Path, group: str | None = None) -> AlertConfig:
    prefix = f"a{uuid.uuid4().hex[:8]}"
    kafka = KafkaConfig(bootstrap=bootstrap, partitions=PARTITIONS).with_topic_prefix(prefix)
    return AlertConfig(webhook=hook.url, kafka=kafka, group_id=group or f"{prefix}.alert", resolve_after=2,
                       reminder_ns=0, stale_ns=600 * 10**9, state_path=tmp_path / "alert-state.json",
                       session_timeout_ms=2000, retry_initial_s=0.1, retry_max_s=0.4, shutdown_timeout_s=3.0)


@contextmanager
def running(consumer: AlertConsumer) -> Iterator[AlertConsumer]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            consumer.run()
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    th = threading.Thread(target=target, daemon=True)
    th.start()
    while not consumer.ready.wait(0.1):
        assert th.is_alive(), f"consumer died at start: {errors!r}"
    try:
        yield consumer
    finally:
        consumer.stop()
        th.join(20)
        assert not th.is_alive(), "consumer did not stop"
    consumer.errors = errors  # type: ignore[attr-defined]


def _committed_total(cfg: AlertConfig, topic: str) -> int:
    return sum(max(0, o) for o in committed(cfg.kafka.bootstrap, cfg.group_id, topic, PARTITIONS).values())


class _Crash(Exception):
    pass


class _CrashBeforeCommit(AlertConsumer):
    """Dies right after writing the state file, before its first offset commit covering a verdict."""

    def _checkpoint(self, batch) -> None:
        verdict_read = any(t == self.config.kafka.verdicts_topic for t, _p in batch.offsets)
        if verdict_read and self.state is not None and not self.state.outbox and self.stats.delivered:
            self.state.save(self._clock())
            raise _Crash("killed between the state write and the commit")
        super()._checkpoint(batch)


def test_crash_between_state_write_and_commit_sends_nothing_twice(kafka_bootstrap: str, webhook: Webhook,
                                                                   tmp_path: Path) -> None:
    windows = detector_windows(tmp_path)
    cfg = _config(kafka_bootstrap, webhook, tmp_path)
    first = _CrashBeforeCommit(cfg)
    th = threading.Thread(target=lambda: pytest.raises(_Crash, first.run), daemon=True)
    th.start()
    assert first.ready.wait(20)
    publish(kafka_bootstrap, cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic, windows[:3])
    th.join(30)
    assert not th.is_alive(), "the crashing consumer did not crash"
    assert webhook.events() == ["opened"]
    assert _committed_total(cfg, cfg.kafka.verdicts_topic) == 0        # the crash came before any commit

    second = AlertConsumer(cfg)
    with running(second):
        # it reads the three windows again, commits them, and sends nothing new
        wait_for(lambda: _committed_total(cfg, cfg.kafka.verdicts_topic) == 3, 30, "the re-read verdicts committed")
        assert webhook.events() == ["opened"]
        assert second.stats.verdicts == 3
        publish(kafka_bootstrap, cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic, windows[3:])
        wait_for(lambda: "resolved" in webhook.events(), 30, "the resolved notification")
    assert not getattr(second, "errors")
    assert webhook.events() == ["opened", "resolved"]
    assert len(set(webhook.ids())) == 2
    # every request names its notification for receivers that deduplicate
    assert all(r["headers"]["Idempotency-Key"] == r["body"]["notification_id"] for r in webhook.received)


def test_webhook_down_then_up_delivers_once_and_commits_only_after(kafka_bootstrap: str, webhook: Webhook,
                                                                   tmp_path: Path) -> None:
    windows = detector_windows(tmp_path)
    cfg = _config(kafka_bootstrap, webhook, tmp_path)
    webhook.down = True
    consumer = AlertConsumer(cfg)
    with running(consumer):
        publish(kafka_bootstrap, cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic, windows[:3])
        wait_for(lambda: webhook.attempts >= 4, 30, "several delivery attempts")
        assert webhook.received == []
        assert consumer.stats.delivery_failures >= 4 and consumer.stats.webhook == "down"
        for topic in (cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic):
            assert _committed_total(cfg, topic) == 0, f"{topic} committed while the webhook was down"
        webhook.down = False
        wait_for(lambda: webhook.events() == ["opened"], 20, "the delivery after the webhook came back")
        wait_for(lambda: _committed_total(cfg, cfg.kafka.verdicts_topic) == 3, 20, "the offsets committed after it")
        wait_for(lambda: _committed_total(cfg, cfg.kafka.window_summaries_topic) == 3, 20, "the patterns offsets committed")
        publish(kafka_bootstrap, cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic, windows[3:])
        wait_for(lambda: "resolved" in webhook.events(), 30, "the resolved notification")
    assert not getattr(consumer, "errors")
    assert webhook.events() == ["opened", "resolved"]
    assert consumer.stats.delivered == {"opened": 1, "resolved": 1}


def test_a_1000_level_nested_message_is_dead_lettered_and_committed_past(kafka_bootstrap: str, webhook: Webhook,
                                                                         kafka_consume, tmp_path: Path) -> None:
    """Issue 10: the nested verdict / patterns message that took the sink down, on the alert consumer."""
    import json

    from sink_helpers import publish as publish_raw

    windows = detector_windows(tmp_path)
    cfg = _config(kafka_bootstrap, webhook, tmp_path)
    nested = b"[" * 1000 + b"]" * 1000
    poison_verdict = b'{"verdict_id":"x","deep":' + nested + b"}"
    poison_window = b"\x91\x81\xa1x" + b"\x91" * 1000 + b"\x01"
    consumer = AlertConsumer(cfg)
    with running(consumer):
        publish_raw(kafka_bootstrap, cfg.kafka.verdicts_topic, [(b"j", poison_verdict)])
        publish_raw(kafka_bootstrap, cfg.kafka.window_summaries_topic, [(b"j", poison_window)])
        publish(kafka_bootstrap, cfg.kafka.verdicts_topic, cfg.kafka.window_summaries_topic, windows[:3])
        wait_for(lambda: webhook.events() == ["opened"], 30, "the incident opened from the valid verdicts")
        wait_for(lambda: _committed_total(cfg, cfg.kafka.verdicts_topic) == 4, 30, "verdicts committed past the poison")
        wait_for(lambda: _committed_total(cfg, cfg.kafka.window_summaries_topic) == 4, 30, "patterns committed past the poison")
        assert consumer.stats.invalid == 2 and consumer.stats.deadletters == 2
    assert not getattr(consumer, "errors")
    letters = kafka_consume(kafka_bootstrap, cfg.kafka.deadletter_topic, PARTITIONS, lambda m: len(m) >= 2, 20)
    docs = {d["source"]: d for d in (json.loads(m.value()) for m in letters)}
    assert "nested" in docs[cfg.kafka.verdicts_topic]["reason"]
    assert docs[cfg.kafka.verdicts_topic]["raw"].encode() == poison_verdict
    assert "nested" in docs[cfg.kafka.window_summaries_topic]["reason"]
    assert docs[cfg.kafka.window_summaries_topic]["raw_encoding"] == "base64"
