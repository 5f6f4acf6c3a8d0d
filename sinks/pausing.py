"""Pausing a consumer's partitions while the downstream (ClickHouse, a webhook) is away.

Shared by the sink workers: a paused consumer keeps polling, so it stays a live
member of its group (rebalances are served) without fetching more messages,
and nothing is committed meanwhile.
"""

from __future__ import annotations

import logging
from typing import Iterable

from confluent_kafka import Consumer, KafkaException, TopicPartition

log = logging.getLogger(__name__)


class PartitionPause:
    """The set of partitions paused on one consumer."""

    def __init__(self) -> None:
        self.partitions: list[TopicPartition] = []

    def __bool__(self) -> bool:
        return bool(self.partitions)

    def pause(self, consumer: Consumer | None) -> None:
        """Pause every assigned partition (once; a second call is a no-op)."""
        if consumer is None or self.partitions:
            return
        try:
            self.partitions = list(consumer.assignment())
            if self.partitions:
                consumer.pause(self.partitions)
        except KafkaException as exc:
            log.warning("pausing partitions: %s", exc)
            self.partitions = []

    def resume(self, consumer: Consumer | None) -> None:
        if consumer is None or not self.partitions:
            return
        try:
            consumer.resume(self.partitions)
        except KafkaException as exc:
            log.warning("resuming partitions: %s", exc)
        self.partitions = []

    def forget(self, gone: Iterable[tuple[str, int]]) -> None:
        """Partitions revoked or lost in a rebalance are no longer ours to resume."""
        gone = set(gone)
        self.partitions = [p for p in self.partitions if (p.topic, p.partition) not in gone]
