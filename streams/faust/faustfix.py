"""Patches to faust-streaming 0.15.3 that Eroica's workers need (applied once, by :func:`apply`).

Each replaces or wraps faust code of exactly this release (pyproject pins it), and each is applied
on both brokers, tansu and Apache Kafka. ``EROICA_FAUSTFIX_OFF`` (a comma list of ``fetch``,
``acks``, ``commit``, ``recovery``; for probes only) leaves some out. How each was found and
measured: CHANGELOG.md, "Moved from docstrings (2026-12-07)".

1. **fetch wait** (``fetch``): faust's aiokafka driver creates its consumer with
   ``fetch_max_wait_ms=1500`` and no setting to change it; on tansu an empty fetch then holds the
   streams back up to 1.5 s (extra lag, stalls). We set :data:`FETCH_MAX_WAIT_MS` on the consumer
   it creates. On Apache Kafka, whose delayed fetch returns as soon as data arrives, the lower
   value costs nothing. Upstream: no issue found; faust-streaming has no setting for it (the value
   is passed in ``faust/transport/drivers/aiokafka.py``).
2. **acks only from us** (``acks``): our agents acknowledge a message only once its effect is on
   an output topic (held acks, see the package docstring). faust also acks on its own the
   messages it *skips* while a rebalance is in progress (``Stream._py_aiter``: ``do_ack or value
   is skipped_value``; stale generation, flow stopped); the next commit then moves past records
   nobody processed, and they are lost. :class:`AckGate` releases acks in offset order, and the
   patched ``Consumer.ack`` accepts only what a gate released: a skipped message stays
   unacknowledged and is read again after the rebalance seeks to the committed offset. The Cython
   stream iterator inlines its acks, so the pure-Python one is used (it calls ``Consumer.ack``).
   Upstream: the skip came with https://github.com/faust-streaming/faust/pull/223 (for
   https://github.com/faust-streaming/faust/issues/221); offsets of unprocessed messages
   committed across a rebalance, with ``noack`` streams too, are
   https://github.com/faust-streaming/faust/issues/527 (open). No issue names the skip's ack.
3. **strict commit offsets** (``commit``): faust's ``Consumer._new_offset`` commits the first run
   of consecutive acked offsets even when it starts one past the committed offset (``min(acked)
   - committed_offset > 1`` lets it through), or anywhere when nothing was committed yet (``if
   committed_offset:`` is false for 0 and None). The patched version commits only a run that
   starts exactly at the committed offset (or, before the first commit, at the partition's
   earliest offset, registered by :func:`set_base_offset`). Upstream:
   https://github.com/faust-streaming/faust/issues/606 (open; the fix proposed in
   https://github.com/faust-streaming/faust/pull/707 is not in a release).
   It ignores faust's ``_gap`` bookkeeping on purpose. Gaps are offsets the fetcher jumped over
   (compaction, transaction markers); our input topics have neither, and faust also records a
   "gap" when its read offset runs ahead after a seek race, which would let a commit pass
   unprocessed records.
4. **table recovery resumes the streams with the flow stopped** (``recovery``; faust Tables, so
   Apache Kafka only: ``state.py``). Once the changelogs are read, ``Recovery.on_recovery_completed``
   resumes the stream partitions, awaits ``perform_seek()`` (seek to the committed offsets), and
   only then calls ``app.flow_control.resume()``, which *clears* every stream queue
   (``clear_on_resume``) before ``consumer.resume_flow()``. But the consumer's flow is still
   running then (recovery resumed it to read the changelogs), and aiokafka fetches the stream
   partitions all along (faust's pause is a filter of its own): stream records drained during the
   seek are dropped by the clear (aiokafka's position is past them, so the stream stalls until
   the next rebalance; our gate holds the acknowledgement, so nothing is lost, only late), or,
   when the drain lands before the seek, a message the agent already took is delivered twice.
   The patch stops the consumer's flow on entry: nothing is drained during the seek (records the
   fetcher returns meanwhile are dropped by ``getmany``, which seeks back to the committed offsets
   itself), and faust's own ``resume_flow()`` at the end starts the streams at the committed
   offsets, after the clear. Upstream: the same race on the path without tables
   (``Recovery._resume_streams``) was https://github.com/faust-streaming/faust/issues/216, fixed
   by https://github.com/faust-streaming/faust/pull/217, which is why that path (and the state
   topic) needs nothing; no issue found for ``on_recovery_completed``.

Why 2 and 3 stay on Apache Kafka although no probe there has yet hit the paths they guard: the
paths are in faust's code, not the broker's (a skipped message is acked, and the original
``_new_offset`` commits past an unacknowledged offset, on any broker); that one probe did not hit
a loss path is not evidence enough to remove its guard. ``EROICA_FAUSTFIX_OFF=acks,commit`` runs
the chaos cases without them.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

_log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 100
PATCHES = ("fetch", "acks", "commit", "recovery")
# Probes only (tests/chaos/test_chaos_tables.py): EROICA_FAUSTFIX_OFF=acks,commit leaves those out.
OFF_ENV = "EROICA_FAUSTFIX_OFF"

_applied: set[str] = set()
# (topic, partition, offset) of messages an AckGate released; Consumer.ack accepts only these
_released: set[tuple[str, int, int]] = set()
# partition -> earliest offset, for partitions with no committed offset yet
_base_offsets: dict[Any, int] = {}


def wanted(broker: str, env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The patches a worker on ``broker`` (``tansu`` or ``kafka``) applies (see the module docstring)."""
    env = os.environ if env is None else env
    off = {p.strip() for p in env.get(OFF_ENV, "").split(",") if p.strip()}
    unknown = off - set(PATCHES)
    if unknown:
        raise ValueError(f"{OFF_ENV}: unknown patch(es) {sorted(unknown)} (of {', '.join(PATCHES)})")
    return tuple(p for p in PATCHES if p not in off)


def apply(broker: str = "tansu") -> tuple[str, ...]:
    """Install the patches (idempotent; before the app starts); returns those applied.

    ``broker`` (``tansu`` or ``kafka``) is where the worker runs: every patch is applied on both today
    (see the module docstring).
    """
    import faust.streams
    from faust.transport import consumer as fconsumer
    from faust.transport.drivers import aiokafka as fa
    from faust.utils.functional import consecutive_numbers

    todo = [p for p in wanted(broker) if p not in _applied]

    if "fetch" in todo:  # 1. no upstream issue: faust has no setting for aiokafka's fetch_max_wait_ms
        create = fa.AIOKafkaConsumerThread._create_worker_consumer

        def _create_worker_consumer(self, transport):  # type: ignore[no-untyped-def]
            c = create(self, transport)
            c._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
            return c

        fa.AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer

    if "acks" in todo:  # 2. skipped messages acked: faust-streaming/faust#527 (skip from PR #223)
        faust.streams._CStreamIterator = None  # acks must go through Consumer.ack

        original_ack = fconsumer.Consumer.ack

        def ack(self, message):  # type: ignore[no-untyped-def]
            k = (message.topic, message.partition, message.offset)
            if k not in _released:
                _log.warning("faust skipped %s/%d@%d (generation %s, app generation %s, flow %s): not acknowledged",
                             *k, getattr(message, "generation_id", None), self.app.consumer_generation_id,
                             self.app.flow_control.is_active())
                return False  # skipped by faust during a rebalance: leave it to be read again
            _released.discard(k)
            return original_ack(self, message)

        fconsumer.Consumer.ack = ack

    if "commit" in todo:  # 3. commits past an unacked offset: faust-streaming/faust#606 (PR #707)
        fconsumer.Consumer._new_offset = _make_new_offset(consecutive_numbers)

    if "recovery" in todo:  # 4. as faust-streaming/faust#216 (fixed there), on the table path
        from faust.tables import recovery as frecovery

        completed = frecovery.Recovery.on_recovery_completed

        async def on_recovery_completed(self, generation_id=0):  # type: ignore[no-untyped-def]
            # Nothing is fetched for the stream partitions until faust has sought them to the committed
            # offsets and cleared the stream queues (app.flow_control.resume); it resumes the flow itself.
            self.app.consumer.stop_flow()
            return await completed(self, generation_id)

        frecovery.Recovery.on_recovery_completed = on_recovery_completed

    _applied.update(todo)
    return tuple(sorted(_applied))


def _make_new_offset(consecutive_numbers: Any) -> Any:
    def _new_offset(self, tp):  # type: ignore[no-untyped-def]
        acked = self._acked[tp]
        if not acked:
            return None
        acked.sort()
        base = self._committed_offset[tp]
        if base is None:
            base = _base_offsets.get(tp)
            if base is None:
                return None
        while acked and acked[0] < base:  # stale acks from before a seek
            self._acked_index[tp].discard(acked.pop(0))
        if not acked or acked[0] != base:
            return None
        batch = next(consecutive_numbers(acked))
        acked[: len(batch)] = []
        self._acked_index[tp].difference_update(batch)
        return batch[-1] + 1

    return _new_offset


def set_base_offset(tp: Any, offset: int) -> None:
    """The earliest offset of a partition with no committed offset (commits start there)."""
    _base_offsets[tp] = int(offset)


@dataclass
class _Held:
    event: Any
    done: bool = False


class AckGate:
    """Acknowledges events per partition strictly in offset order, once each is released.

    ``hold`` every event as it arrives (arrival order is offset order within a
    partition); ``release`` it once its effect is on an output topic. An event
    is acknowledged to faust only when it and every earlier event of its
    partition are released, so faust's committed offset never passes an
    unfinished record.
    """

    def __init__(self) -> None:
        self._queues: dict[Any, deque[_Held]] = {}

    def hold(self, event: Any) -> _Held:
        h = _Held(event)
        self._queues.setdefault(event.message.tp, deque()).append(h)
        return h

    def release(self, held: _Held) -> None:
        held.done = True
        q = self._queues.get(held.event.message.tp)
        while q and q[0].done:
            _ack(q.popleft().event)

    def release_all(self, items: list[_Held]) -> None:
        for h in items:
            h.done = True
        for tp in {h.event.message.tp for h in items}:
            q = self._queues.get(tp)
            while q and q[0].done:
                _ack(q.popleft().event)

    def drop(self, tps: set[Any]) -> None:
        """Forget revoked partitions: their events are never acknowledged here (the next owner re-reads them)."""
        for tp in tps:
            q = self._queues.pop(tp, None)
            if q:
                for h in q:
                    m = h.event.message
                    _released.discard((m.topic, m.partition, m.offset))

    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())


def _ack(event: Any) -> None:
    msg = event.message
    _released.add((msg.topic, msg.partition, msg.offset))
    event.ack()
