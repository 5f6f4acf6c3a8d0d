"""The faust workers: ``summariser`` (raw frames + ingest -> digests) and ``detector`` (digests -> verdicts).

The logic lives in pure modules (``summariser.py``, ``detector.py``,
``ingest.py``); this module wires them to faust: topics, agents, timers, held
acknowledgements (:class:`~eroica.streams.faust.faustfix.AckGate`), the
detector's job-state store (``state.py``: a faust Table, or a plain topic on
tansu), the ``/eroica/stats`` page and the worker process
with a shutdown deadline. See the package docstring for the design.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable

import faust

from eroica.models.reader import Invalid
from eroica.models.limits import MAX_VERDICT_BYTES, failure_reason
from eroica.kafka.admin import LARGE_MESSAGES, EndOffsets
from eroica.kafka.client import faust_broker_kwargs
from eroica.kafka.config import KafkaConfig
from eroica.kafka.deadletter import encode_deadletter
from eroica.runtime import metrics
from eroica.streams.cores.detector_core import JOB_END, PATTERNS, VERDICTS, DetectorCore
from eroica.streams.cores.ingest import RAW, ingest_message
from eroica.streams.cores.step import Step as Output  # one type since issue 14; the old name kept here only
from eroica.streams.cores.broker_watch import BrokerWatch
from eroica.streams.cores.summariser_core import (DEADLETTER, SUMMARIES, InputDrain, JobClock, PartitionSummariser,
                                                  Send, Step, SummariserStats)

from . import faustfix
from .settings import ROLES, WorkerSettings
from .state import StateStore, broker_kind, make_store, resolve_store, store_topics
from .watchdog import EXIT_RECOVERY_STALLED, stalled

log = logging.getLogger("eroica.streams.faust")

TICK_S = 0.25
# How often the workers ask the broker whether it answers (one end-offset request): well under
# the idle timeout (5 s), so an outage that ends before a job looks idle is still seen. A probe
# may take twice that (a loaded machine) before it counts as "no answer": a false outage only
# delays idle closes and forced windows by the delivery timeout, but should stay rare.
PROBE_S = 1.0
PROBE_TIMEOUT_S = 2.0
# Answers of a healthy broker are at most PROBE_S (the timer) + PROBE_S (the wait for the next
# start) + PROBE_TIMEOUT_S (a slow answer) apart, 4 s here; a longer silence, whatever its cause,
# counts as an outage (BrokerWatch). 6 s leaves 2 s of slack for a loaded event loop.
MAX_SILENCE_S = 2 * PROBE_S + 2 * PROBE_TIMEOUT_S
EXIT_FORCED = 1


def topics_for(role: str, config: KafkaConfig, app_id: str) -> dict[str, int]:
    """Topics a role reads or writes, with partition counts (created at start if missing).

    The detector's job-state topic is not here: :func:`~.state.store_topics` (it depends on the backend).
    """
    p = config.partitions
    if role == "summariser":
        names = [config.raw_topic, config.ingest_topic, config.summaries_topic, config.deadletter_topic]
    elif role == "detector":
        names = [config.summaries_topic, config.verdicts_topic, config.patterns_topic, config.deadletter_topic]
    else:
        raise ValueError(f"unknown role {role!r} (one of {', '.join(ROLES)})")
    return {n: p for n in names}


def build_app(role: str, settings: WorkerSettings, config: KafkaConfig, web_port: int | None,
              broker: str = "tansu") -> faust.App:
    """A faust app tuned for this stack (streaming-notes: session timeout, fetch wait, web bind...).

    ``broker`` (``tansu`` or ``kafka``) selects the faust patches that broker needs (``faustfix.py``).
    """
    faustfix.apply(broker)
    app_id = settings.app_id_for(role)
    datadir = settings.data_dir / app_id
    datadir.parent.mkdir(parents=True, exist_ok=True)  # faust fails when the parent is missing
    return faust.App(
        app_id,
        **faust_broker_kwargs(config),  # bootstrap, client id, TLS/SASL (kafka/client.py)
        store="memory://",
        datadir=str(datadir),
        autodiscover=False,
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=config.partitions,
        topic_allow_declare=True,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=6.0,  # tansu's JoinGroup waits half of it
        broker_heartbeat_interval=1.5,
        broker_commit_interval=1.0,
        broker_commit_livelock_soft_timeout=3600.0,  # acks are held for a window on purpose
        stream_wait_empty=False,  # held acks must not block a rebalance
        table_standby_replicas=0,  # no use with the in-memory store: see state.py
        web_enabled=web_port is not None,
        web_bind="127.0.0.1",
        web_host="127.0.0.1",
        web_port=web_port or 6066,
        worker_redirect_stdouts=False,
        producer_linger=0.005,
        # A job window's window summaries (~6.3 KB a rank) and a partition's digest (~11 KB a rank
        # on it) pass faust's 1,000,000-byte default at ~160 ranks (`eroica bench live`: 256 ranks
        # failed, 1,024 crash-looped); the sink's own bound on such a message is the ceiling.
        producer_max_request_size=int(os.environ.get("PRODUCER_MAX_REQUEST_SIZE") or MAX_VERDICT_BYTES),
    )


class _Outputs:
    """Sends role-named messages and waits for the broker's acknowledgements."""

    WARN_EVERY_S = 10.0

    def __init__(self, topics: dict[str, Any]) -> None:
        self.topics = topics
        self.sent = 0
        self.deadletters = 0
        self._warned = float("-inf")

    async def send(self, sends: Iterable[Send]) -> None:
        futs = []
        for s in sends:
            if s.topic == DEADLETTER:
                self.deadletters += 1
                now = time.monotonic()
                if now - self._warned >= self.WARN_EVERY_S:
                    self._warned = now
                    log.warning("dead letter (%d so far): %s", self.deadletters,
                                s.value[:300].decode("utf-8", "replace"))
            futs.append(await self.topics[s.topic].send(key=s.key, value=s.value, force=True))
        if futs:
            await asyncio.gather(*futs)
            self.sent += len(futs)


def _failed(source: str, offset: int, value: bytes | None, exc: BaseException, token: Any) -> Step:
    """A message whose processing raised: logged, dead-lettered, acknowledged; the worker goes on."""
    log.exception("processing %s@%d failed; dead-lettered", source, offset)
    bad = Invalid(source, offset, f"processing failed: {failure_reason(exc)}", bytes(value or b""))
    return Step([Send(DEADLETTER, source.encode(), encode_deadletter(bad))], [token])


def _assigned(app: faust.App, topic: str) -> list[int]:
    """Partitions of ``topic`` this worker holds now (empty before the first assignment)."""
    try:
        return sorted(tp.partition for tp in app.consumer.assignment() if tp.topic == topic)
    except Exception:
        return []


def _revoked_arg(args: tuple, kwargs: dict) -> set:
    revoked = kwargs.get("revoked")
    if revoked is None:
        revoked = next((a for a in args if isinstance(a, (set, frozenset))), set())
    return set(revoked)


async def _ensure_base(app: faust.App, tp: Any) -> None:
    """Before the first commit of a partition never committed, learn where it starts."""
    if app.consumer._committed_offset.get(tp) is None and tp not in faustfix._base_offsets:
        offsets = await app.consumer.earliest_offsets(tp)
        faustfix.set_base_offset(tp, offsets.get(tp, 0) or 0)


class BrokerProbe:
    """Asks the broker every ``PROBE_S`` whether it answers: one end-offset request, in the background.

    Both workers must know of an outage even when nothing they do asks the
    broker (one shorter than their timeouts ends unseen, and the publishers'
    backlog then arrives after a window was closed or forced). ``on_result``
    gets (answered, monotonic time) after each probe, and (False, t) (True,
    now) for a silence longer than ``MAX_SILENCE_S`` between two answers
    (:class:`~eroica.streams.cores.broker_watch.BrokerWatch`); transitions are
    logged. The workers start it from a timer of its own, for their whole
    life: a probe held up behind their other work, or skipped while they had
    nothing to do, would read as a silence.
    """

    def __init__(self, config: KafkaConfig, topic: str, role: str,
                 on_result: Callable[[bool, float], None]) -> None:
        self.client = EndOffsets(config, topic, timeout_s=PROBE_TIMEOUT_S)
        self.role, self.on_result = role, on_result
        self.watch = BrokerWatch(MAX_SILENCE_S)
        self._task: asyncio.Future | None = None
        self._at = float("-inf")

    @property
    def outages(self) -> int:
        return self.watch.outages

    def start(self, now: float, partition: int = 0) -> None:
        """Probe now unless one started in the last half ``PROBE_S`` (the timer paces it) or is still running."""
        if now - self._at < PROBE_S / 2 or (self._task is not None and not self._task.done()):
            return
        self._at = now
        self._task = asyncio.ensure_future(self._probe(partition))

    async def _probe(self, partition: int) -> None:
        ends = await asyncio.get_running_loop().run_in_executor(None, self.client, [partition])
        was = self.watch.answering
        seen = self.watch.result(ends is not None, time.monotonic())
        if len(seen) > 1:
            log.warning("%s: no answer from the broker for %.1f s (more than %.0f s): counted as an outage",
                        self.role, seen[-1][1] - seen[0][1], MAX_SILENCE_S)
        elif self.watch.answering and not was:
            # two templates: the log filter (runtime/logfilter.py) folds repeats of one template,
            # and folded "answers again" lines hid every recovery in the chaos logs
            log.warning("%s: the broker answers again", self.role)
        elif was and not self.watch.answering:
            log.warning("%s: the broker does not answer", self.role)
        for answered, at in seen:
            self.on_result(answered, at)


# --- what the workers tell ``eroica status`` of their broker (the ``/eroica/stats`` page) --------------
# (issue 34 item 6) A worker whose broker is frozen is alive and its page answers, so status said
# "up"; the page now says ``state`` "degraded" and why in ``stuck``, the keys of the sink's /health.
NEVER_ANSWERED_S = 2 * MAX_SILENCE_S  # start-up's first answer may take a while (client connecting)


def broker_health(watch: BrokerWatch, started: float, now: float) -> dict[str, Any]:
    """``state`` (``up``/``degraded``), ``stuck`` (the reasons) and ``broker`` (the probe's findings) at ``now``.

    Degraded while the probe says the broker does not answer, while no answer has come for longer
    than ``MAX_SILENCE_S`` (the probes themselves held up), or when the broker never answered in
    ``NEVER_ANSWERED_S`` since the worker started; up again with the next answer.
    """
    last = watch.last_answer_at
    silent_s = None if last is None else max(0.0, now - last)
    stuck: list[str] = []
    if last is None:
        if now - started > NEVER_ANSWERED_S:
            stuck.append(f"broker not answering: no answer since the worker started {now - started:.0f} s ago")
    elif not watch.answering or silent_s > MAX_SILENCE_S:  # type: ignore[operator]
        stuck.append(f"broker not answering for {silent_s:.0f} s")
    return {"state": "degraded" if stuck else "up", "stuck": stuck,
            "broker": {"answering": not stuck and last is not None,
                       "last_answer_s": None if silent_s is None else round(silent_s, 1),
                       "outages": watch.outages}}
# --- end of what the workers tell ``eroica status`` ----------------------------------------------------


class SummariserWorker:
    """Agents ``eroica-summariser`` (raw topic) and ``eroica-ingest`` (ingest topic), plus a timer."""

    def __init__(self, app: faust.App, settings: WorkerSettings, config: KafkaConfig) -> None:
        self.app, self.settings, self.config = app, settings, config
        P = config.partitions
        self.raw = app.topic(config.raw_topic, key_type=bytes, value_type=bytes, partitions=P)
        self.ingest = app.topic(config.ingest_topic, key_type=bytes, value_type=bytes, partitions=P)
        self.out = _Outputs({
            SUMMARIES: app.topic(config.summaries_topic, key_type=bytes, value_type=bytes, partitions=P),
            DEADLETTER: app.topic(config.deadletter_topic, key_type=bytes, value_type=bytes, partitions=P),
            RAW: self.raw,
        })
        self.parts: dict[int, PartitionSummariser] = {}
        self.clock = JobClock()
        self.retired = SummariserStats()
        self.counted_to: dict[int, int] = {}  # per raw partition: the highest offset its figures counted
        self.gate = faustfix.AckGate()
        self.lock = asyncio.Lock()
        self.ingest_counts = {"messages": 0, "lines": 0, "records": 0, "jobs": 0, "invalid": 0, "frames": 0}
        self.started = time.monotonic()
        self.first_frame_at: float | None = None
        self.last_frame_at: float | None = None
        # Idle closing must tell "no more input" from "input held up" (a broker
        # restarting takes longer than the idle timeout; its records would then
        # arrive late and be dropped): a partition's jobs close as idle only when
        # the broker answers and every record up to its end offset has been read.
        self.read_to: dict[int, int] = {}
        self.end_offsets = EndOffsets(config, config.raw_topic)
        # ... and an outage must be noticed even when no idle close is at stake (one shorter
        # than the idle timeout would otherwise go unseen, and the publishers' backlog arrive
        # after the next idle close): the broker is probed every PROBE_S (BrokerProbe).
        self.input = InputDrain(self.clock, config.delivery_timeout_ms / 1000)
        self.probe = BrokerProbe(config, config.raw_topic, "summariser", self.input.observe)

        async def summarise(stream: Any) -> None:
            async for event in stream.noack().events():
                await self.on_raw(event)

        async def ingest(stream: Any) -> None:
            async for event in stream.noack().events():
                await self.on_ingest(event)

        async def tick() -> None:
            await self.tick()

        async def probe() -> None:
            self.probe.start(time.monotonic(), min(self.parts, default=0))

        async def on_revoked(*args: Any, **kwargs: Any) -> None:
            revoked = _revoked_arg(args, kwargs)
            async with self.lock:
                for tp in revoked:
                    if tp.topic == config.raw_topic and tp.partition in self.parts:
                        gone = self.parts.pop(tp.partition)
                        self.retired.add(gone.stats)
                        self.counted_to[tp.partition] = gone.counted_to  # its re-read is not counted again
                self.gate.drop(revoked)

        app.agent(self.raw, name="eroica-summariser")(summarise)
        if settings.ingest:
            app.agent(self.ingest, name="eroica-ingest")(ingest)
        app.timer(TICK_S)(tick)
        app.timer(PROBE_S)(probe)
        app.on_partitions_revoked.connect(on_revoked)

    def _partition(self, p: int) -> PartitionSummariser:
        ps = self.parts.get(p)
        if ps is None:
            s = self.settings
            ps = self.parts[p] = PartitionSummariser(f"{self.config.raw_topic}/{p}", s.window_ns, s.lateness_ns,
                                                     s.max_skew_ns, hold_s=s.close_hold_s, clock=self.clock,
                                                     declared_lateness_ns=s.declared_lateness_ns,
                                                     counted_to=self.counted_to.get(p, -1))
        return ps

    async def deliver(self, step: Step) -> None:
        if step.sends:
            await self.out.send(step.sends)
        if step.acks:
            self.gate.release_all(step.acks)

    async def on_raw(self, event: Any) -> None:
        held = self.gate.hold(event)
        msg = event.message
        if msg.partition not in self.parts:
            await _ensure_base(self.app, msg.tp)
        now = time.monotonic()
        if self.first_frame_at is None:
            self.first_frame_at = now
        self.last_frame_at = now
        self.read_to[msg.partition] = max(self.read_to.get(msg.partition, 0), msg.offset + 1)
        async with self.lock:
            try:
                step = self._partition(msg.partition).on_message(event.key, event.value, held, now, msg.offset,
                                                                 arrival_ns=time.time_ns())
            except Exception as exc:  # a bug must not stop the partition: the message goes to the dead letters
                step = _failed(f"{self.config.raw_topic}/{msg.partition}", msg.offset, event.value, exc, held)
            await self.deliver(step)

    async def on_ingest(self, event: Any) -> None:
        held = self.gate.hold(event)
        msg = event.message
        await _ensure_base(self.app, msg.tp)
        source = f"{self.config.ingest_topic}/{msg.partition}@{msg.offset}"
        try:
            sends, counts = ingest_message(event.value, source, self.config.frame_records)
        except Exception as exc:
            sends, counts = _failed(source, msg.offset, event.value, exc, held).sends, {}
        self.ingest_counts["messages"] += 1
        for k, v in counts.items():
            self.ingest_counts[k] += v
        await self.out.send(sends)
        self.gate.release(held)

    async def tick(self) -> None:
        now = time.monotonic()
        idle_s = self.settings.idle_close_s
        async with self.lock:
            waiting = [p for p, ps in self.parts.items() if ps.idle_due(now, idle_s)]
        drained = await self._drained(waiting, now) if waiting else set()
        async with self.lock:
            for p, ps in list(self.parts.items()):
                try:
                    step = ps.tick(now, idle_s if p in drained else None)
                except Exception:  # logged; the next tick tries again
                    log.exception("closing windows of %s failed", ps.source)
                    continue
                await self.deliver(step)

    async def _drained(self, partitions: list[int], now: float) -> set[int]:
        ends = await asyncio.get_running_loop().run_in_executor(None, self.end_offsets, partitions)
        done = time.monotonic()
        if done - now > PROBE_TIMEOUT_S:
            # answers that took this long may span an outage (CI saw 7.5 s across a broker restart,
            # each partition's answer within its own timeout): they say nothing about what the
            # publishers still hold, so nothing is drained on them
            ends = None
        return self.input.drained(ends, self.read_to, done)

    def stats(self) -> dict:
        total = SummariserStats()
        total.add(self.retired)
        for ps in self.parts.values():
            total.add(ps.stats)
        busy = (self.last_frame_at - self.first_frame_at) if self.first_frame_at and self.last_frame_at else 0.0
        return {"role": "summariser", "app_id": self.app.conf.id,
                "assigned": _assigned(self.app, self.config.raw_topic), "partitions": sorted(self.parts),
                **asdict(total), "held_messages": self.gate.pending(), "sent": self.out.sent,
                "deadletters": self.out.deadletters,
                "ingest": dict(self.ingest_counts), "first_to_last_frame_s": round(busy, 3),
                "broker_outages": self.input.outages,
                **broker_health(self.probe.watch, self.started, time.monotonic()),
                "uptime_s": round(time.monotonic() - self.started, 1)}


class DetectorWorker:
    """Agent ``eroica-detector`` (summaries topic), a grace timer, and the job-state store (``state.py``)."""

    def __init__(self, app: faust.App, settings: WorkerSettings, config: KafkaConfig,
                 state_store: str = "topic") -> None:
        self.app, self.settings, self.config = app, settings, config
        P = config.partitions
        self.summaries = app.topic(config.summaries_topic, key_type=bytes, value_type=bytes, partitions=P)
        self.store: StateStore = make_store(state_store, app, config, app.conf.id)
        verdicts = app.topic(config.verdicts_topic, key_type=bytes, value_type=bytes, partitions=P)
        self.out = _Outputs({
            VERDICTS: verdicts,
            JOB_END: verdicts,  # the job-end marker goes after the job's verdicts, on their topic (models/job_end.py)
            PATTERNS: app.topic(config.patterns_topic, key_type=bytes, value_type=bytes, partitions=P),
            DEADLETTER: app.topic(config.deadletter_topic, key_type=bytes, value_type=bytes, partitions=P),
        })
        self.core = DetectorCore(settings.detect_grace_s)
        self.broker_answers = EndOffsets(config, config.summaries_topic)  # the recovery watchdog asks it
        # A window's grace must not run out while the digests it waits for are held up by an outage:
        # after the broker answers again, the summarisers' producers may take their delivery timeout.
        self.delivery_s = config.delivery_timeout_ms / 1000
        self.probe = BrokerProbe(config, config.summaries_topic, "detector", self._on_probe)
        self.loaded: set[int] = set()
        self.gate = faustfix.AckGate()
        self.lock = asyncio.Lock()
        self.started = time.monotonic()
        self.last_verdict_at: float | None = None

        async def detect(stream: Any) -> None:
            async for event in stream.noack().events():
                await self.on_summary(event)

        async def tick() -> None:
            await self.tick()

        async def probe() -> None:
            self.probe.start(time.monotonic())

        async def on_revoked(*args: Any, **kwargs: Any) -> None:
            revoked = _revoked_arg(args, kwargs)
            parts = {tp.partition for tp in revoked if tp.topic == config.summaries_topic}
            async with self.lock:
                self.core.drop_partitions(parts)
                self.loaded -= parts
                self.gate.drop(revoked)

        app.agent(self.summaries, name="eroica-detector")(detect)
        app.timer(TICK_S)(tick)
        app.timer(PROBE_S)(probe)
        app.on_partitions_revoked.connect(on_revoked)

    async def deliver(self, out: Output) -> None:
        if out.sends:
            await self.out.send(out.sends)
            if any(s.topic == VERDICTS for s in out.sends):
                self.last_verdict_at = time.monotonic()
        if out.persist:
            await self.store.save(out.persist)
        if out.acks:
            self.gate.release_all(out.acks)

    async def on_summary(self, event: Any) -> None:
        held = self.gate.hold(event)
        msg = event.message
        async with self.lock:
            if msg.partition not in self.loaded:
                await _ensure_base(self.app, msg.tp)
                for st in await self.store.load(msg.partition):
                    st.partition = msg.partition
                    self.core.restore(st)
                self.loaded.add(msg.partition)
            try:
                out = self.core.on_message(event.value, held, msg.partition, time.monotonic(), msg.offset,
                                           source=self.config.summaries_topic)
            except Exception as exc:  # a bug must not stop the partition: the message goes to the dead letters
                step = _failed(f"{self.config.summaries_topic}/{msg.partition}", msg.offset, event.value, exc, held)
                out = Output(sends=step.sends, acks=step.acks)
            await self.deliver(out)

    def _on_probe(self, answered: bool, now: float) -> None:
        if not answered:
            self.core.hold_grace(float("inf"))
        elif self.core.grace_held_until == float("inf"):
            self.core.hold_grace(now + self.delivery_s, replace=True)

    async def tick(self) -> None:
        await self._watch_recovery()
        async with self.lock:
            try:
                out = self.core.due(time.monotonic())
            except Exception:  # logged; the next tick tries again
                log.exception("detecting due windows failed")
                return
            await self.deliver(out)

    async def _watch_recovery(self) -> None:
        """Exit (the supervisor restarts us) when faust's table recovery has stalled: see ``watchdog.py``."""
        recovery = getattr(getattr(self.app, "tables", None), "recovery", None)
        idle = None if recovery is None else stalled(recovery, time.monotonic())
        if recovery is None or idle is None:
            return
        ends = await asyncio.get_running_loop().run_in_executor(None, self.broker_answers, [0])
        if ends is None:  # the broker is away: a restart would not help, and the recovery waits for it too
            return
        log.error("table recovery stalled: no changelog event for %.0f s with offsets left (%s); exiting "
                  "with status %d for the supervisor to restart this worker", idle,
                  {f"{tp.topic}/{tp.partition}": st.remaining for tp, st in recovery.active_stats().items()},
                  EXIT_RECOVERY_STALLED)
        logging.shutdown()
        os._exit(EXIT_RECOVERY_STALLED)

    def stats(self) -> dict:
        return {"role": "detector", "app_id": self.app.conf.id,
                "assigned": _assigned(self.app, self.config.summaries_topic), "partitions": sorted(self.loaded),
                **asdict(self.core.stats), "jobs": len(self.core.jobs), "pending_windows": self.core.pending_windows(),
                "broker_outages": self.probe.outages,
                "held_messages": self.gate.pending(), "sent": self.out.sent, "deadletters": self.out.deadletters,
                **self.store.stats(), **broker_health(self.probe.watch, self.started, time.monotonic()),
                "uptime_s": round(time.monotonic() - self.started, 1)}


def install(role: str, app: faust.App, settings: WorkerSettings, config: KafkaConfig,
            state_store: str = "topic") -> Any:
    """Register a role's agents, timers and ``/eroica/stats`` page on ``app``; returns the role object.

    ``state_store``: the detector's job-state backend, ``table`` or ``topic`` (``state.py``).
    """
    worker: SummariserWorker | DetectorWorker
    if role == "summariser":
        # The summariser's compiled kernels load now (~0.5 CPU-s, once), not inside its first windows.
        from eroica.streams.detection import kernels
        kernels.warm()
        worker = SummariserWorker(app, settings, config)
    elif role == "detector":
        worker = DetectorWorker(app, settings, config, state_store)
    else:
        raise ValueError(f"unknown role {role!r} (one of {', '.join(ROLES)})")

    @app.page("/eroica/stats")
    async def stats_page(web: Any, request: Any) -> Any:
        return web.json(worker.stats())

    if settings.stats_interval_s > 0:
        @app.timer(settings.stats_interval_s)
        async def log_stats() -> None:
            log.info("stats %s", worker.stats())

    @app.on_rebalance_complete.connect
    async def on_rebalanced(*args: Any, **kwargs: Any) -> None:
        log.info("%s %s: assignment %s", role, app.conf.id,
                 sorted((tp.topic, tp.partition) for tp in app.consumer.assignment()))

    return worker


class _DeadlineWorker(faust.Worker):
    """A faust worker that exits by a deadline once told to stop (a worker whose broker is gone can hang)."""

    def __init__(self, *args: Any, shutdown_timeout_s: float, on_stop: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline_s = shutdown_timeout_s
        self._armed = False
        self._on_stop_cb = on_stop

    def _arm(self) -> None:
        if self._armed:
            return
        self._armed = True

        def force() -> None:
            log.error("worker did not stop within %.1f s of the signal: exiting now", self._deadline_s)
            logging.shutdown()
            os._exit(EXIT_FORCED)

        t = threading.Timer(self._deadline_s, force)
        t.daemon = True
        t.start()

    def _on_sigterm(self) -> None:
        self._arm()
        super()._on_sigterm()

    def _on_sigint(self) -> None:
        self._arm()
        super()._on_sigint()

    def on_worker_shutdown(self) -> None:
        if self._on_stop_cb is not None:
            try:
                self._on_stop_cb()
            except Exception:  # pragma: no cover - logging only
                log.exception("final stats failed")
        self._arm()  # a crash or stop without a signal must not hang either
        super().on_worker_shutdown()


def run(role: str, settings: WorkerSettings | None = None, config: KafkaConfig | None = None,
        connect_timeout_s: float = 30.0) -> int:
    """Run one worker in this process until SIGTERM/SIGINT; returns the exit status (0 after a clean stop)."""
    from eroica.kafka.admin import BrokerError, create_topics, wait_for_broker
    from eroica.runtime.system import columnar_gc, free_port

    settings = settings or WorkerSettings.from_env()
    config = config or KafkaConfig.from_env()
    app_id = settings.app_id_for(role)
    try:
        wait_for_broker(config, timeout_s=connect_timeout_s)
        broker = broker_kind(config)
        create_topics(config, topics_for(role, config, app_id), config=LARGE_MESSAGES)
        store = resolve_store(settings.state_store, broker)
        if role == "detector":
            names, topic_config = store_topics(store, app_id, config.partitions)
            create_topics(config, names, config=topic_config)
    except BrokerError as exc:
        print(f"eroica worker {role}: {exc}", file=sys.stderr)
        return 1
    port = settings.web_port
    if port == 0:
        port = free_port()
    columnar_gc()  # a summariser holds a window's frames: see runtime/system.py
    app = build_app(role, settings, config, port, broker)
    worker_obj = install(role, app, settings, config, store)
    metrics.serve(role)
    worker = _DeadlineWorker(app, loglevel=settings.log_level, shutdown_timeout_s=settings.shutdown_timeout_s,
                             quiet=True, on_stop=lambda: log.info("final stats %s", worker_obj.stats()))
    web = f"http://127.0.0.1:{port}/eroica/stats" if port else "off"

    @app.task
    async def announce() -> None:  # once faust has set up logging
        from eroica.runtime.logfilter import install as limit_repeats

        limit_repeats()  # a broker that is away makes aiokafka log every reconnect attempt
        log.info("eroica %s worker %s on %s (%s); window %.0f s, lateness %.0f s;%s stats %s", role, app_id,
                 config.bootstrap, broker, settings.window_s, settings.lateness_ns / 1e9,
                 f" job states in a {store};" if role == "detector" else "", web)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
