"""Ingest: contract JSON Lines from outside collectors -> frames on the raw topic (pure).

A message on the ingest topic holds one or many JSON lines (telemetry-v1).
They are validated by the same reader as files
(:func:`~eroica.models.reader.parse_lines`), each line on its own with its size
and nesting bounded first, so a bad line never takes its neighbours with it:
each invalid line goes to the dead-letter topic with its reason and the whole
line (``source`` ``topic/partition@offset`` and ``line`` locate it), valid records are cut into frames keyed
``job/rank`` / ``job/node`` exactly as ``eroica replay`` sends them, and job
records become job messages keyed by job. The summariser then treats them like
any other frames, so there is one windowing path, whatever the collector.

No end-of-stream markers are sent (a collector is a live stream): its windows
close on event time or when it goes idle.
"""

from __future__ import annotations

from typing import Iterator

from eroica.models.frames import encode_frame, encode_job
from eroica.models.reader import parse_lines
from eroica.kafka.deadletter import encode_deadletter
from eroica.kafka.framing import DEFAULT_FRAME_RECORDS, split_frames

from .step import DEADLETTER, RAW, Send

__all__ = ["ingest_message", "RAW"]


def _numbered(data: bytes) -> Iterator[tuple[int, bytes]]:
    for i, line in enumerate(data.split(b"\n"), start=1):
        yield i, line.rstrip(b"\r")


def ingest_message(data: bytes | None, source: str, frame_records: int = DEFAULT_FRAME_RECORDS,
                   max_line_bytes: int = 1 << 20) -> tuple[list[Send], dict[str, int]]:
    """Messages for the raw and dead-letter topics from one ingest message, and counts.

    ``source`` names the message in dead letters (e.g. ``eroica.ingest/3@1234``);
    line numbers count from 1 within the message.
    """
    counts = {"lines": 0, "records": 0, "jobs": 0, "invalid": 0, "frames": 0}
    sends: list[Send] = []
    if not data:
        return sends, counts
    for batch in parse_lines(_numbered(data), source, max_line_bytes=max_line_bytes, line_limit=max_line_bytes):
        for bad in batch.invalid:
            sends.append(Send(DEADLETTER, source.encode(), encode_deadletter(bad)))
            counts["invalid"] += 1
        for job in batch.jobs:
            sends.append(Send(RAW, job.job.encode(), encode_job(job)))
            counts["jobs"] += 1
        for cols in batch.columns.values():
            for frame in split_frames(cols, frame_records):
                sends.append(Send(RAW, frame.key.encode(), encode_frame(frame.cols, {"src": source})))
                counts["frames"] += 1
                counts["records"] += len(frame.cols)
    counts["lines"] = counts["records"] + counts["jobs"] + counts["invalid"]
    return sends, counts
