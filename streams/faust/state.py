"""The detector's durable job states: a plain Kafka topic read back with an end marker.

Each write is one message (key: job, value: :func:`~eroica.streams.faust.detector.encode_state`)
on the partition of the job's summaries partition, so whoever owns that
summaries partition owns the states on the same partition of the state topic.
The last message of a job wins. On real Kafka set ``cleanup.policy=compact``
on it; tansu's memory storage keeps everything (one small message per job
window).

Loading a partition must read *everything* written to it, and tansu's
ListOffsets (the high watermark) is wrong for batches of several records, so
we do not trust end offsets: the loader first appends a marker message of its
own to the partition and reads from the beginning until it reaches the
marker's offset (known from the produce acknowledgement).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any

from .detector import JobState, decode_state

log = logging.getLogger(__name__)

MARKER_KEY = b"\x00eroica-state-marker"
LOAD_TIMEOUT_S = 30.0


class StateLoadError(RuntimeError):
    pass


async def load_partition(bootstrap: Any, topic: Any, topic_name: str, partition: int,
                         timeout_s: float = LOAD_TIMEOUT_S) -> list[JobState]:
    """Every job's last state on ``partition`` of the state topic (``topic``: the faust topic)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    t0 = time.monotonic()
    fut = await topic.send(key=MARKER_KEY, value=uuid.uuid4().bytes, partition=partition, force=True)
    meta = await fut
    marker_offset = meta.offset
    tp = TopicPartition(topic_name, partition)
    from eroica.kafka.client import aiokafka_kwargs
    from eroica.kafka.config import KafkaConfig

    config = bootstrap if isinstance(bootstrap, KafkaConfig) else KafkaConfig(bootstrap=bootstrap)
    consumer = AIOKafkaConsumer(**aiokafka_kwargs(config, "state-loader"), enable_auto_commit=False,
                                group_id=None, fetch_max_wait_ms=100, auto_offset_reset="earliest")
    states: dict[bytes, bytes] = {}
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        done = False
        while not done:
            if time.monotonic() - t0 > timeout_s:
                raise StateLoadError(f"state partition {topic_name}/{partition}: marker at offset "
                                     f"{marker_offset} not reached within {timeout_s:.0f} s")
            batch = await consumer.getmany(tp, timeout_ms=500)
            for msg in batch.get(tp, []):
                if msg.offset >= marker_offset:
                    done = True
                    break
                if msg.key and msg.key != MARKER_KEY and msg.value is not None:
                    states[msg.key] = msg.value
    finally:
        await asyncio.shield(consumer.stop())
    out = []
    for key, value in states.items():
        try:
            out.append(decode_state(value))
        except Exception as exc:  # a state we cannot read is dropped, not fatal: the job restarts fresh
            log.warning("state of %r on %s/%d unreadable, ignored: %s", key, topic_name, partition, exc)
    log.info("loaded %d job state(s) from %s/%d in %.2f s", len(out), topic_name, partition,
             time.monotonic() - t0)
    return out
