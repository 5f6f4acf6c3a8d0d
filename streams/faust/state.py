"""The detector's durable job states: one interface, two backends (a faust Table, a plain topic).

What must survive a restart or a rebalance is each job's
:class:`~eroica.streams.cores.detector_core.JobState` (history, last window done,
job record, sources' progress, end markers). The detector hands this module
the states a step changed (:attr:`~eroica.streams.cores.step.Step.persist`:
when a window is analysed, a job record, progress or end notice arrives, never
per frame or per digest) and acknowledges the step's input only once
:meth:`StateStore.save` returns, i.e. once the broker has the new states. When
a summaries partition is assigned, the states of its jobs are loaded before
its first message is processed (:meth:`StateStore.load`). Keys are job names;
a state lives on the partition of its job's summaries partition, so whoever
owns that partition owns its states.

Backends (``EROICA_STATE_STORE``: ``auto``, the default, ``table`` or ``topic``):

- :class:`TableStore` (Apache Kafka, and any broker that is not tansu): a faust
  ``app.Table`` (:data:`TABLE_NAME`, in-memory store) with its compacted
  changelog topic ``<app id>-jobstate-changelog``. faust recovers it from the
  changelog before the stream resumes, on start-up and after every rebalance,
  for the partitions the worker now owns. A write updates the table's store
  and sends the changelog record with the table's own ``send_changelog`` to
  the job's partition; it is awaited before the input is acknowledged. (faust's
  ``table[key] = value`` is not used because it needs a *current event* for
  the partition, and the detector also closes windows from its grace timer,
  outside any event.) **No standby replicas**
  (``table_standby_replicas=0``): with the in-memory store (the one faust
  store this project installs; rocksdb is an optional native extra) a
  standby's data does not speed a failover: faust's memory store reports no
  persisted offset, so a promoted partition is read from the changelog's
  start anyway, and its ``on_recovery_completed`` drops every recovered key
  of a non-active partition, standbys' included. A standby would only double
  the changelog reads. The compacted changelog holds about one record per
  job, so a full recovery reads little (measured in
  ``tests/chaos/test_chaos_tables.py``).
- :class:`TopicStore` (tansu only): a plain topic ``<app id>.state`` read back up to
  a marker. It remains for tansu, where a faust Table cannot work. On tansu
  0.6.0 faust's table recovery lost entries: it reads a changelog up to the
  high watermark that ListOffsets reports, which tansu gets wrong for batches
  of several records, and recovery interleaved with stream processing (see
  ``../shared/spec/streaming-notes.md``). The loader
  therefore appends a marker message of its own and reads from the beginning
  until it reaches the marker's offset (known from the produce
  acknowledgement), never trusting end offsets. tansu's memory storage keeps
  everything (one small message per job window).

``auto`` asks the broker for its cluster id (DescribeCluster): tansu answers
``tansu_cluster`` and gets the topic; any other broker gets the table. On
Apache Kafka the state topic is no longer used or created (``EROICA_STATE_STORE=topic``
still forces it there, for comparisons only).

**The table on Apache Kafka**: its recovery loads the jobs' states from the
changelog before the stream resumes. faust's ``Recovery.on_recovery_completed``
raced the fetcher there (a restarted detector's stream stalled, or a message
was delivered twice); ``faustfix.py`` patch 4 (``recovery``) closes that race,
and the chaos cases on Kafka pass with the table
(``tests/chaos/test_chaos_tables.py``, ``test_chaos_kafka.py``,
``test_chaos_cluster.py``). One stall remains in faust's recovery after a run
of rebalances (a changelog partition that never delivers): ``watchdog.py``
restarts such a worker. The probes and their counts: CHANGELOG.md, "Moved from
docstrings (2026-12-07)".
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Any, Iterable

from eroica.streams.cores.detector_core import JobState, decode_state, encode_state

log = logging.getLogger(__name__)

STORES = ("auto", "table", "topic")
TABLE_NAME = "jobstate"
MARKER_KEY = b"\x00eroica-state-marker"
LOAD_TIMEOUT_S = 30.0
TANSU_CLUSTER_PREFIX = "tansu"


class StateLoadError(RuntimeError):
    pass


def state_topic_name(app_id: str) -> str:
    """The tansu backend's state topic (one per application id, like a faust changelog)."""
    return f"{app_id}.state"


def changelog_topic_name(app_id: str) -> str:
    """faust's name for the job-state table's changelog topic."""
    return f"{app_id}-{TABLE_NAME}-changelog"


def broker_kind(config: Any, timeout_s: float = 10.0) -> str:
    """``tansu`` or ``kafka``: what the broker at ``config`` is, from its cluster id (BrokerError if it does not say)."""
    from eroica.kafka.admin import BrokerError, admin_client

    admin = admin_client(config)  # held until the answer is in (a dropped client cancels its requests)
    try:
        cluster = admin.describe_cluster(request_timeout=timeout_s).result(timeout=timeout_s)
    except Exception as exc:
        raise BrokerError(f"DescribeCluster failed: {exc}") from exc
    return "tansu" if str(cluster.cluster_id or "").startswith(TANSU_CLUSTER_PREFIX) else "kafka"


def resolve_store(setting: str, broker: str) -> str:
    """The backend for ``setting`` (``auto``: by the broker's kind, :func:`broker_kind`): ``table`` or ``topic``."""
    if setting not in STORES:
        raise ValueError(f"state store must be one of {', '.join(STORES)}, got {setting!r}")
    if setting != "auto":
        return setting
    return "topic" if broker == "tansu" else "table"


def store_topics(kind: str, app_id: str, partitions: int) -> tuple[dict[str, int], dict[str, str]]:
    """Topics a backend needs created (name -> partitions) and their topic configs."""
    if kind == "table":
        return {changelog_topic_name(app_id): partitions}, {"cleanup.policy": "compact"}
    return {state_topic_name(app_id): partitions}, {}


class StateStore:
    """Where job states live: :meth:`save` them (awaits the broker), :meth:`load` a partition's."""

    kind = ""

    def __init__(self) -> None:
        self.writes = 0
        self.loaded = 0
        self.load_s = 0.0

    async def save(self, states: Iterable[JobState]) -> None:
        raise NotImplementedError

    async def load(self, partition: int) -> list[JobState]:
        raise NotImplementedError

    def stats(self) -> dict:
        return {"state_store": self.kind, "state_writes": self.writes, "states_loaded": self.loaded,
                "state_load_s": round(self.load_s, 3)}


class TableStore(StateStore):
    """Job states in a faust Table (changelog topic, recovery by faust); see the module docstring."""

    kind = "table"

    def __init__(self, app: Any, partitions: int) -> None:
        super().__init__()
        # Raw bytes both ways. faust 0.15's app.Table takes no serializer arguments and defaults to
        # json, whose decoder fails on our msgpack during recovery (faust then logs "Error in recovery"
        # for each record and never finishes): the changelog topic is built here with raw serializers,
        # as faust would build it otherwise (compacted, internal, no acks of its own).
        changelog = app.topic(changelog_topic_name(app.conf.id), key_type=bytes, value_type=bytes,
                              key_serializer="raw", value_serializer="raw", partitions=partitions,
                              compacting=True, acks=False, internal=True)
        self.table = app.Table(TABLE_NAME, default=None, partitions=partitions, changelog_topic=changelog,
                               help="Eroica detector: per-job state (msgpack JobState), written when a window closes")
        self.table.key_serializer = self.table.value_serializer = "raw"  # send_changelog passes these

    async def save(self, states: Iterable[JobState]) -> None:
        futs = []
        for st in states:
            key, value = st.job.encode(), encode_state(st)
            self.table.data[key] = value  # the local store; the changelog record goes out just below
            futs.append(self.table.send_changelog(st.partition, key, value))
        if futs:
            await asyncio.gather(*futs)
            self.writes += len(futs)

    async def load(self, partition: int) -> list[JobState]:
        # faust recovered the table for the partitions this worker owns before the stream resumed
        t0 = time.monotonic()
        out = []
        for key, value in list(self.table.data.items()):
            if value is None:
                continue
            try:
                st = decode_state(value)
            except Exception as exc:  # unreadable: the job restarts fresh
                log.warning("table state of %r unreadable, ignored: %s", key, exc)
                continue
            if st.partition == partition:
                out.append(st)
        self.loaded += len(out)
        self.load_s += time.monotonic() - t0
        log.info("loaded %d job state(s) of partition %d from table %s", len(out), partition, TABLE_NAME)
        return out


class TopicStore(StateStore):
    """Job states in a plain topic read back to a marker (tansu); see the module docstring."""

    kind = "topic"

    def __init__(self, app: Any, config: Any, app_id: str) -> None:
        super().__init__()
        self.config = config
        self.name = state_topic_name(app_id)
        self.topic = app.topic(self.name, key_type=bytes, value_type=bytes, partitions=config.partitions)

    async def save(self, states: Iterable[JobState]) -> None:
        futs = [await self.topic.send(key=st.job.encode(), value=encode_state(st), partition=st.partition,
                                      force=True) for st in states]
        if futs:
            await asyncio.gather(*futs)
            self.writes += len(futs)

    async def load(self, partition: int) -> list[JobState]:
        t0 = time.monotonic()
        out = await load_partition(self.config, self.topic, self.name, partition)
        self.loaded += len(out)
        self.load_s += time.monotonic() - t0
        return out


def make_store(kind: str, app: Any, config: Any, app_id: str) -> StateStore:
    if kind == "table":
        return TableStore(app, config.partitions)
    if kind == "topic":
        return TopicStore(app, config, app_id)
    raise ValueError(f"unknown state store {kind!r} (table or topic)")


async def load_partition(bootstrap: Any, topic: Any, topic_name: str, partition: int,
                         timeout_s: float = LOAD_TIMEOUT_S) -> list[JobState]:
    """Every job's last state on ``partition`` of the state topic (``topic``: the faust topic)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from eroica.kafka.client import aiokafka_kwargs
    from eroica.kafka.config import KafkaConfig

    t0 = time.monotonic()
    fut = await topic.send(key=MARKER_KEY, value=uuid.uuid4().bytes, partition=partition, force=True)
    meta = await fut
    marker_offset = meta.offset
    tp = TopicPartition(topic_name, partition)
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
