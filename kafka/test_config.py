"""Topic names: the renames of issue 14 (digests, window summaries) and what keeps old deployments working."""

from __future__ import annotations

import logging
import uuid

import pytest
from eroica.kafka.admin import create_topics, legacy_topics_with_data
from eroica.kafka.config import KafkaConfig


def test_new_names_and_the_old_attribute_names() -> None:
    c = KafkaConfig()
    assert (c.digests_topic, c.window_summaries_topic) == ("eroica.digests", "eroica.window-summaries")
    assert (c.summaries_topic, c.patterns_topic) == (c.digests_topic, c.window_summaries_topic)
    assert "eroica.summaries" not in c.topics() and "eroica.patterns" not in c.topics()


def test_old_variables_still_read_and_new_ones_win(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "eroica.kafka"):
        old = KafkaConfig.from_env({"EROICA_KAFKA_TOPIC_SUMMARIES": "eroica.summaries",
                                    "EROICA_KAFKA_TOPIC_PATTERNS": "eroica.patterns"})
    assert (old.digests_topic, old.window_summaries_topic) == ("eroica.summaries", "eroica.patterns")
    assert "EROICA_KAFKA_TOPIC_SUMMARIES is the former name of EROICA_KAFKA_TOPIC_DIGESTS" in caplog.text
    both = KafkaConfig.from_env({"EROICA_KAFKA_TOPIC_SUMMARIES": "old", "EROICA_KAFKA_TOPIC_DIGESTS": "new"})
    assert both.digests_topic == "new"


def test_former_names_follow_a_prefix_and_a_hand_set_name_has_none() -> None:
    assert KafkaConfig().with_topic_prefix("t1").legacy_topic_names() == {
        "t1.eroica.digests": "t1.eroica.summaries", "t1.eroica.window-summaries": "t1.eroica.patterns"}
    assert KafkaConfig(digests_topic="mine", window_summaries_topic="eroica.patterns").legacy_topic_names() == {}


def test_a_start_warns_while_the_old_topic_holds_messages(kafka_bootstrap: str,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import Producer

    cfg = KafkaConfig(bootstrap=kafka_bootstrap, partitions=1).with_topic_prefix(f"legacy-{uuid.uuid4().hex[:8]}")
    old = cfg.legacy_topic_names()[cfg.digests_topic]
    assert legacy_topics_with_data(cfg, cfg.legacy_topic_names()) == {}  # no old topic: nothing to say
    create_topics(cfg, {old: 1})
    p = Producer({"bootstrap.servers": kafka_bootstrap})
    p.produce(old, b"a digest the old detector never read", b"job")
    p.flush(10)
    assert legacy_topics_with_data(cfg, cfg.legacy_topic_names()) == {cfg.digests_topic: (old, 1)}
    with caplog.at_level(logging.WARNING, "eroica.kafka"):
        create_topics(cfg, cfg.topics())
    assert f"topic {old} (the former name of {cfg.digests_topic}" in caplog.text
