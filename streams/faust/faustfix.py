"""Patches to faust-streaming 0.15.3 that Eroica's workers need (applied once, by :func:`apply`).

Each one was found by a probe on this project's stack (tansu 0.6.0, aiokafka 0.14); ``EROICA_FAUSTFIX_OFF``
(a comma list of ``fetch``, ``acks``, ``commit``, ``recovery``; probes only) leaves some out:

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
4. **table recovery resumes the streams with the flow stopped** (found on Apache
   Kafka 4.1.1 with the detector's faust Table, 2026-11-23). Once the
   changelogs are read, faust's ``Recovery.on_recovery_completed`` resumes the
   stream partitions, awaits ``perform_seek()`` (seek to the committed
   offsets), and only then calls ``app.flow_control.resume()``, which *clears*
   every stream queue (``clear_on_resume``) before ``consumer.resume_flow()``.
   But the consumer's flow is still running at that point (recovery resumed it
   to read the changelog), and aiokafka has fetched the stream partitions all
   along (faust's pause is only a filter of its own): the fetcher drains
   stream records into the queues *during* the seek, and the clear drops them.
   Two outcomes, both seen with the probe (faust/aiokafka calls, fetched
   ranges, agent arrivals and gate releases logged per detector process):
   the seek lands first (a no-op: aiokafka's position already is the
   committed offset), then ``summaries/2`` 73..96 are drained, the agent takes
   73, the clear drops 74..96, aiokafka's position is 97 and nothing fetches
   them again until the next rebalance: the stream stalls, our gate holds
   73's acknowledgement, the committed offset stays at 73 (nothing lost, all
   late; ``state.py``'s 5 in 15 restarts). Or the drain lands first, the seek
   moves the position back, and the message the agent had already taken is
   delivered twice (e.g. ``summaries/3@9``). The patch stops
   the consumer's flow on entry: nothing is drained during the seek (records
   the fetcher returns meanwhile are dropped by ``getmany``, which seeks back
   to the committed offsets itself), and faust's own ``resume_flow()`` at the
   end starts the streams at the committed offsets, after the clear. Restart
   loop (one Kafka node, the detector SIGKILLed mid-replay and restarted by
   ``eroica up``, 10 verdicts per job; a stall: not all verdicts within 30 s):
   without the patch 2 of 22 restarts stalled (an earlier probe: 5 of 15), the
   clear dropped queued records (13-30) in 5 of 20 detector processes and 5
   messages were delivered twice; with it 24 of 24 restarts stored exactly the
   expected ids, each in 10.5-17.5 s, with no drop and no double delivery, and
   20 of 20 more without the probe's instrumentation (10.5-15.9 s). The
   no-table path (``Recovery._resume_streams``) needs nothing: there the flow
   has been stopped since the rebalance began, and on a first start the
   fetcher only starts after the seek; that is why the state topic never
   stalled.

On Apache Kafka (4.1.1, one node; 2026-11-23) all four stay, on this evidence:

- 2 and 3 guard faust code that does not depend on the broker: ``Stream._py_aiter``
  acks every message it skips (``do_ack or value is skipped_value``), and the
  original ``_new_offset`` commits past an unacknowledged offset (``if
  committed_offset:`` is false for 0 and None, and ``min(acked) -
  committed_offset > 1`` lets a run start one past the committed offset).
  Without them a skipped message is committed unprocessed. The probe: the
  patched ``ack`` logs ``faust skipped ...`` for every message it refuses; in
  some 25 worker restarts and rebalances on Apache Kafka
  (``tests/chaos/test_chaos_tables.py`` and a restart loop), and in 24 more
  restarts of the detector with its faust Table (patch 4's loop), it never fired, so
  no test yet *fails* without them there; ``EROICA_FAUSTFIX_OFF=acks,commit``
  runs the chaos cases without them. They stay: removing a guard against a
  loss path that is in faust's code because one probe did not hit it is not
  evidence enough.
- 4 is Kafka's (faust Tables are not used on tansu, where the patched method never runs).
- 1 (fetch wait) was not measured on Apache Kafka (whose delayed fetch
  returns as soon as data arrives, so it should cost nothing there); it is
  kept on both brokers.

Note: ``_new_offset`` ignores faust's ``_gap`` bookkeeping on purpose. Gaps are
offsets the fetcher jumped over (compaction, transaction markers); our input
topics have neither, and faust also records a "gap" when its read offset
runs ahead after a seek race, which would let a commit pass unprocessed
records. faust Tables on Apache Kafka: ``state.py`` (the default there since patch 4).
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

    if "recovery" in todo:
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
