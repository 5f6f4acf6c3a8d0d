"""Where live producers (the tracer inside each rank, the node agent) send contract records: their outputs.

(Not the top-level ``sinks/``, where verdicts land; this module was
``producers/sinks.py`` before issue 14, and its classes keep their names.)

Three outputs with one interface (``write`` a list of contract structs, ``close``):

``JsonlSink``
    Appends JSON Lines to a file (per rank, per agent); ``eroica trace --out``
    merges them at the end.

``KafkaSink``
    Cuts records into columnar frames keyed ``job/rank`` or ``job/node``
    (:class:`~eroica.kafka.framing.FrameAccumulator`, the same
    framing as ``eroica replay``) and publishes them with
    :meth:`FramePublisher.for_live_agent`: a full producer queue drops and
    counts, it never blocks the caller. Held remainders go out at the latest
    ``linger_s`` after they arrived, so a sparse stream (2 samples a second)
    reaches the stream processors before its windows close. On close, one
    end-of-stream marker per key says this producer is done with it.

``DigestKafkaSink``
    Digest mode (edge digests): the records go through a digester handed in
    by the caller (``eroica.streams.edge.EdgeDigester``: producers do not
    import the streams layer; ``eroica agent --edge-digests`` wires it) and
    only its window digests, progress and end messages are published, on the
    digests topic the detector reads, keyed by job. Same queue policy as
    ``KafkaSink``: never blocks, drops and counts.

All are written to from one background thread only (the tracer's writer,
the agent's loop), so they need no lock.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Protocol, Sequence

import msgspec

from eroica.models.records import JobRecord

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()


class Sink(Protocol):
    def write(self, records: Sequence[msgspec.Struct]) -> None: ...
    def write_job(self, job: JobRecord) -> None: ...
    def close(self) -> None: ...


class JsonlSink:
    """Appends contract records as JSON Lines to ``path`` (created with its folder on first write)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = None
        self.records = 0

    def _open(self):
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = open(self.path, "ab")
        return self._fh

    def write(self, records: Sequence[msgspec.Struct]) -> None:
        if not records:
            return
        fh = self._open()
        fh.write(_encoder.encode_lines(records))
        fh.flush()
        self.records += len(records)

    def write_job(self, job: JobRecord) -> None:
        self.write([job])

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class KafkaSink:
    """Publishes records as frames on the raw topic; never blocks (drops and counts when full)."""

    declares_watermarks = True  # write(..., watermark_ns=) is understood (collectors check this)

    def __init__(self, bootstrap: str, *, linger_s: float = 1.0, publisher=None, config=None) -> None:
        from eroica.kafka.config import KafkaConfig
        from eroica.kafka.framing import FrameAccumulator
        from eroica.kafka.publisher import FramePublisher

        self.config = config or KafkaConfig.from_env(bootstrap=bootstrap)
        self.publisher = publisher or FramePublisher.for_live_agent(self.config)
        self.linger_s = linger_s
        self._frames = FrameAccumulator(self.config.frame_records, max_lag_ns=int(linger_s * 1e9))
        self._oldest_held: float | None = None
        self._producer_id = uuid.uuid4().hex[:12]
        self._keys: dict[str, list] = {}  # key -> [job, rank, node, records, frames]
        self.records = 0

    def write(self, records: Sequence[msgspec.Struct], watermark_ns: int | None = None) -> None:
        """Frame and publish ``records``.

        ``watermark_ns``: the caller vouches that every record of its streams
        older than this has now been written (a collector that knows its open
        spans). Everything held is then sent at once and the last frame of each
        stream carries it (frame meta ``wm``), so the summariser can close
        windows without the lateness it allows guessed watermarks. Only the
        last frame: a batch cut into several frames holds older records in the
        earlier ones.
        """
        from eroica.models.columns import from_records

        by_type: dict[str, list] = defaultdict(list)
        for r in records:
            by_type[type(r).__struct_config__.tag].append(r)
        frames = []
        for type_, recs in by_type.items():
            frames.extend(self._frames.add(from_records(type_, recs)))
        if watermark_ns is not None:
            frames.extend(self._frames.drain())
            self._oldest_held = None
            last = {(f.key, f.cols.type): i for i, f in enumerate(frames)}
            declared = set(last.values())
            for i, frame in enumerate(frames):
                self._send(frame, watermark_ns if i in declared else None)
            self.publisher.poll(0)
            return
        for frame in frames:
            self._send(frame)
        now = time.monotonic()
        if self._frames.pending_records:
            if self._oldest_held is None:
                self._oldest_held = now
            elif now - self._oldest_held >= self.linger_s:
                self._drain()
        self.publisher.poll(0)

    def _drain(self) -> None:
        for frame in self._frames.drain():
            self._send(frame)
        self._oldest_held = None

    def _send(self, frame, watermark_ns: int | None = None) -> None:
        from eroica.models.frames import encode_frame

        state = self._keys.setdefault(frame.key, [frame.job, frame.rank, frame.node, 0, 0])
        meta: dict = {"seq": state[4], "producer": self._producer_id}
        if watermark_ns is not None:
            meta["wm"] = int(watermark_ns)
        value = encode_frame(frame.cols, meta)
        if self.publisher.publish(self.config.raw_topic, value, key=frame.key):
            state[3] += len(frame.cols)
            state[4] += 1
            self.records += len(frame.cols)

    def write_job(self, job: JobRecord) -> None:
        from eroica.models.frames import encode_job

        self.publisher.publish(self.config.raw_topic, encode_job(job), key=job.job)

    def close(self, timeout_s: float = 5.0) -> None:
        from eroica.models.frames import EndOfStream, encode_end_of_stream

        self._drain()
        for key, (job, rank, node, n, frames) in self._keys.items():
            eos = EndOfStream(job, rank, node, n, frames, {"producer": self._producer_id})
            self.publisher.publish(self.config.raw_topic, encode_end_of_stream(eos), key=key)
        stats = self.publisher.close(timeout_s=timeout_s)
        if stats.dropped or stats.failed:
            log.warning("Kafka sink: %d messages dropped (queue full), %d failed", stats.dropped, stats.failed)


class DigestKafkaSink:
    """Publishes the window digests of what it is given, not the records (digest mode)."""

    declares_watermarks = True  # write(..., watermark_ns=) is understood: the digester closes on it

    def __init__(self, bootstrap: str, digester, *, publisher=None, config=None) -> None:
        from eroica.kafka.config import KafkaConfig
        from eroica.kafka.publisher import FramePublisher

        self.config = config or KafkaConfig.from_env(bootstrap=bootstrap)
        self.publisher = publisher or FramePublisher.for_live_agent(self.config)
        self.digester = digester
        self.records = 0
        self.messages = 0
        self.bytes = 0

    def _send(self, messages) -> None:
        for m in messages:
            if self.publisher.publish(self.config.digests_topic, m.value, key=m.key):
                self.messages += 1
                self.bytes += len(m.value) + len(m.key)

    def write(self, records: Sequence[msgspec.Struct], watermark_ns: int | None = None) -> None:
        """``watermark_ns``: as :meth:`KafkaSink.write`'s, handed to the digester (``declared_ns``)."""
        from eroica.models.columns import from_records

        by_type: dict[str, list] = defaultdict(list)
        for r in records:
            by_type[type(r).__struct_config__.tag].append(r)
        batch = [from_records(t, recs) for t, recs in by_type.items()]
        self._send(self.digester.add(*batch, declared_ns=watermark_ns) if watermark_ns is not None
                   else self.digester.add(*batch))
        self.records += len(records)
        self.publisher.poll(0)

    def write_job(self, job: JobRecord) -> None:
        self._send(self.digester.job(job))

    def close(self, timeout_s: float = 5.0) -> None:
        self._send(self.digester.end())
        stats = self.publisher.close(timeout_s=timeout_s)
        if stats.dropped or stats.failed:
            log.warning("Kafka digest sink: %d messages dropped (queue full), %d failed", stats.dropped, stats.failed)


def make_sink(*, path: str | Path | None = None, kafka: str | None = None, digester=None) -> Sink:
    """A Kafka sink when ``kafka`` is given (digest mode with a ``digester``), else a JSON Lines file sink."""
    if kafka and digester is not None:
        return DigestKafkaSink(kafka, digester)
    if kafka:
        return KafkaSink(kafka)
    if path is None:
        raise ValueError("a sink needs a file path or a Kafka address")
    return JsonlSink(path)


def hostname() -> str:
    """The node name every Eroica producer uses (``EROICA_NODE`` overrides it)."""
    import socket

    return (os.environ.get("EROICA_NODE") or socket.gethostname() or "localhost")[:256]
