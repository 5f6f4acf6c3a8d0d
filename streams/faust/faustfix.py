"""Patches to faust-streaming 0.15.3 that Eroica's workers need (applied once, by :func:`apply`).

Each one was found by a probe on this project's stack (tansu 0.6.0, aiokafka 0.14); ``EROICA_FAUSTFIX_OFF``
(a comma list of ``fetch``, ``acks``, ``commit``; probes only) leaves some out:

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

On Apache Kafka (4.1.1, one node; 2026-11-23) all three stay, on this evidence:

- 2 and 3 guard faust code that does not depend on the broker: ``Stream._py_aiter``
  acks every message it skips (``do_ack or value is skipped_value``), and the
  original ``_new_offset`` commits past an unacknowledged offset (``if
  committed_offset:`` is false for 0 and None, and ``min(acked) -
  committed_offset > 1`` lets a run start one past the committed offset).
  Without them a skipped message is committed unprocessed. The probe: the
  patched ``ack`` logs ``faust skipped ...`` for every message it refuses; in
  some 25 worker restarts and rebalances on Apache Kafka
  (``tests/chaos/test_chaos_tables.py`` and a restart loop) it never fired, so
  no test yet *fails* without them there; ``EROICA_FAUSTFIX_OFF=acks,commit``
  runs the chaos cases without them. They stay: removing a guard against a
  loss path that is in faust's code because one probe did not hit it is not
  evidence enough.
- 1 (fetch wait) was not measured on Apache Kafka (whose delayed fetch
  returns as soon as data arrives, so it should cost nothing there); it is
  kept on both brokers.

Note: ``_new_offset`` ignores faust's ``_gap`` bookkeeping on purpose. Gaps are
offsets the fetcher jumped over (compaction, transaction markers); our input
topics have neither, and faust also records a "gap" when its read offset
runs ahead after a seek race, which would let a commit pass unprocessed
records. faust Tables on Apache Kafka: ``state.py`` (opt-in; why).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from dataclasses import dataclass
from typing import Any, Mapping

_log = logging.getLogger(__name__)

FETCH_MAX_WAIT_MS = 100
PATCHES = ("fetch", "acks", "commit")
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
    (see the module docstring for the probes on Apache Kafka).
    """
    import faust.streams
    from faust.transport import consumer as fconsumer
    from faust.transport.drivers import aiokafka as fa
    from faust.utils.functional import consecutive_numbers

    todo = [p for p in wanted(broker) if p not in _applied]

    if "fetch" in todo:
        create = fa.AIOKafkaConsumerThread._create_worker_consumer

        def _create_worker_consumer(self, transport):  # type: ignore[no-untyped-def]
            c = create(self, transport)
            c._fetch_max_wait_ms = FETCH_MAX_WAIT_MS
            return c

        fa.AIOKafkaConsumerThread._create_worker_consumer = _create_worker_consumer

    if "acks" in todo:
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

    if "commit" in todo:
        fconsumer.Consumer._new_offset = _make_new_offset(consecutive_numbers)

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
