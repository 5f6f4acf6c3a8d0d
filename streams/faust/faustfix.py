"""Patches to faust-streaming 0.15.3 that Eroica's workers need (applied once, by :func:`apply`).

Each one was found by a probe on this project's stack (tansu 0.6.0, aiokafka 0.14):

1. **fetch wait**: faust hard-codes aiokafka's ``fetch_max_wait_ms=1500``; on tansu
   that gave 0.4-0.8 s of extra lag and 1.4 s stalls (streaming-notes). We set
   :data:`FETCH_MAX_WAIT_MS` on the consumer it creates.
2. **acks only from us**: our agents acknowledge a message only once its effect
   is on an output topic (held acks, see the package docstring). faust also
   acks on its own the messages it *skips* while a rebalance is in progress
   (stale generation, flow stopped); the next commit then moves past records
   nobody processed, and they are lost (seen: one message of a partition lost
   on a restart). :class:`AckGate` releases acks in offset order, and the
   patched ``Consumer.ack`` accepts only what a gate released: a skipped
   message stays unacknowledged and is read again after the rebalance seeks
   to the committed offset. The Cython stream iterator inlines its acks, so
   the pure-Python one is used (it calls ``Consumer.ack``).
3. **strict commit offsets**: faust's ``Consumer._new_offset`` commits the first
   run of consecutive acked offsets even when it starts one past the committed
   offset, or anywhere when nothing was committed yet (it tests
   ``if committed_offset:``, and 0 is false). The patched version commits only a
   run that starts exactly at the committed offset (or, before the first
   commit, at the partition's earliest offset, registered by
   :func:`set_base_offset`).

No faust Table is used: on tansu, table recovery reads changelogs up to the
high watermark that ListOffsets reports, which tansu gets wrong for batches of
several records (recovered tables lost entries in our probes), and recovery
interleaves with stream processing (messages processed during it, then
re-delivered). The detector keeps its state in a plain topic instead
(``state.py``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

FETCH_MAX_WAIT_MS = 100

_applied = False
# (topic, partition, offset) of messages an AckGate released; Consumer.ack accepts only these
_released: set[tuple[str, int, int]] = set()
# partition -> earliest offset, for partitions with no committed offset yet
_base_offsets: dict[Any, int] = {}


def apply() -> None:
    """Install the patches (idempotent; before the app starts)."""
    global _applied
    if _applied:
        return
    import faust.streams
    from faust.transport import consumer as fconsumer
    from faust.transport.drivers import aiokafka as fa
    from faust.utils.functional import consecutive_numbers

    create = fa.AIOKafkaConsumerThread._create_worker_consumer

    def _create_worker_consumer(self, transport):  # type: ignore[no-untyped-def]
        c = create(self, transport)
        c._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
        return c

    fa.AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer

    faust.streams._CStreamIterator = None  # acks must go through Consumer.ack

    original_ack = fconsumer.Consumer.ack

    def ack(self, message):  # type: ignore[no-untyped-def]
        k = (message.topic, message.partition, message.offset)
        if k not in _released:
            return False  # skipped by faust during a rebalance: leave it to be read again
        _released.discard(k)
        return original_ack(self, message)

    fconsumer.Consumer.ack = ack

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

    fconsumer.Consumer._new_offset = _new_offset
    _applied = True


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
