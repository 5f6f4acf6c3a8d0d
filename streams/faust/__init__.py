"""Eroica's stream processors on faust-streaming: ``eroica worker summariser`` and ``eroica worker detector``.

Data flow (topic names from :class:`~eroica.kafka.config.KafkaConfig`)::

    eroica.ingest (contract JSON lines) --ingest agent--> eroica.raw
    eroica.raw (frames, job records, end-of-stream markers; key job/rank or job/node)
        --summariser--> eroica.digests (digests + progress, job records, end notices; key job)
                        eroica.deadletter (corrupt frames, invalid JSON lines: {source, line, reason, raw})
    eroica.digests --detector--> eroica.verdicts (one contract verdict per message, JSON; key job)
                                 eroica.window-summaries (msgpack list of WindowSummary per job window; key job)
                                 <app id>-jobstate-changelog (the detector's job states, Apache Kafka;
                                 <app id>.state on tansu; see state.py)

**Summariser** (``streams/cores/summariser_core.py``, pure; glue in ``workers.py``). One
:class:`~eroica.streams.cores.summariser_core.PartitionSummariser` per raw partition decodes frames
columnar (numpy views, no per-record Python) into the core's
:class:`~eroica.streams.detection.windows.WindowAssembler` (epoch-aligned
windows, ``EROICA_WINDOW_S``). A window closes on the event-time watermark
(slowest stream of the job on the partition, plus ``EROICA_LATENESS_S``, or
``EROICA_DECLARED_LATENESS_S`` when every stream's producer declares its
watermark, then ``EROICA_CLOSE_HOLD_S`` of wall clock), when every key of the job on the
partition sent its end-of-stream marker, or when the job has been silent on
the worker for ``EROICA_IDLE_CLOSE_S``. A closed window becomes
``digest_window(JobWindow)`` of the ranks/nodes of that partition, sent to the
digests topic keyed by job, with the partition's progress (its keys and the
last window it closed). Job records are forwarded; corrupt messages are
dead-lettered with their reason and the partition goes on. Window state is
kept in memory only: see *Delivery* for why nothing else is needed.

**Detector** (``streams/cores/detector_core.py``, pure). All messages of a job share a digests
partition. Per job it collects each window's digests, one per source
partition (after a restart a source may send a window again: the copy built
from more records wins), until the window is complete (every expected key
covered by a source that closed it: ``job/rank`` for ``world_size`` ranks of
the job record, every key a source reported, and for the first window every
node of ``rank_nodes``; or every key ended; or ``EROICA_DETECT_GRACE_S`` of
wall clock since its first digest), then merges them (``merge_digests``) and
runs ``detect_step(digest, meta, history, detected_at_ns=time.time_ns())``,
windows strictly in order. A digest for a window at or before the last one
analysed is dropped and counted (``late_windows``, a warning). Verdict ids
come from the core, so a file replayed through the stream gives exactly the
ids ``eroica analyze FILE --window W`` gives (tests: ``test_cores.py``,
``test_workers.py``). The per-job :class:`~eroica.streams.cores.detector_core.JobState` (JobHistory,
last window done, job record, sources' progress, end markers) is persisted
after each change through ``state.py`` (a faust Table on Apache Kafka, a
plain state topic on tansu), never per frame or digest.

**Delivery** (at-least-once, idempotent output). A raw or summaries message is
acknowledged only once its effect is on an output topic: a frame once the
digests of every window its records reach are delivered, a digest once its
window's verdicts, patterns and job state are delivered (:class:`~.faustfix.AckGate`
acks in offset order; faust commits acked offsets every second). A worker
killed at any point therefore loses nothing: the next owner of a partition
re-reads from the committed offset. It may send again what was sent before
the crash: a summariser re-sends digests (the detector keeps the fullest copy,
or drops them if the window is done); a detector killed between sending
verdicts and persisting the job state analyses the window again and re-sends
its verdicts **with the same verdict ids**, which the sink dedupes. Verdict
ids never depend on timing (``detected_at_ns`` does). Not exactly-once: no
Kafka transactions (not used on tansu).

Job states: ``state.py``, one interface with two backends, picked by broker
(``EROICA_STATE_STORE=auto``, the default): on Apache Kafka a faust Table with
its compacted changelog, recovered by faust on start and on every rebalance;
on tansu a plain topic read back up to a marker (tansu's ListOffsets is wrong,
so faust Table recovery lost entries there). ``faustfix.py`` lists the patches
applied to faust 0.15.3 (fetch wait 100 ms, acks only from our gate, strict
commit offsets, table recovery resuming the streams with the flow stopped:
without that one a restarted detector's stream stalled in 2 of 22 to 5 of 15
restarts) and the evidence for each.

**Scale-out.** Workers started with the same application id
(``EROICA_APP_ID``, default ``eroica-summariser`` / ``eroica-detector``) form
one consumer group and share the partitions; each needs its own
``EROICA_WEB_PORT`` (0 picks a free one). Summarisers scale with raw
partitions (a job's ranks spread over them by key); detectors scale with
summaries partitions, i.e. by job (one job is always analysed by one
detector). ``EROICA_KAFKA_PARTITIONS`` bounds the parallelism. On a
rebalance a worker drops the state of revoked partitions and their unacked
messages are re-read by the new owner; a detector loads the job states of a
partition from its state store before its first message. One summariser is
capped near one core (the GIL); memory is about the raw records of the open
windows of its partitions (one window plus the lateness).

**Settings**: ``settings.py`` (``EROICA_WINDOW_S``, ``EROICA_LATENESS_S``,
``EROICA_DECLARED_LATENESS_S``, ``EROICA_MAX_SKEW_S``, ``EROICA_CLOSE_HOLD_S``, ``EROICA_IDLE_CLOSE_S``,
``EROICA_DETECT_GRACE_S``, ``EROICA_APP_ID``, ``EROICA_DATA_DIR``,
``EROICA_WEB_PORT``, ``EROICA_SHUTDOWN_TIMEOUT_S``, ``EROICA_LOG_LEVEL``,
``EROICA_INGEST``, ``EROICA_STATS_INTERVAL_S``) plus ``EROICA_KAFKA_*``.
Each worker serves its counters as JSON on ``http://127.0.0.1:PORT/eroica/stats``
(``assigned`` partitions, records, digests, windows, verdicts, late and
corrupt counts, held messages) and logs them every ``EROICA_STATS_INTERVAL_S``.
Benchmark: ``python -m eroica.streams.faust.bench_summariser``.
"""
