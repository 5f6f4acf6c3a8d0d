"""The alert consumer's state file: incidents, job clocks, delivered ids, undelivered notifications.

One JSON document, replaced atomically (temporary file, fsync, rename, fsync
of the directory), so a crash at any instant leaves either the previous or the
new state, never half of one. It is written after each accepted delivery and
before each offset commit; with Kafka's commit after it, a restart resumes
from a state that already contains everything the committed offsets cover::

    {"version": 1, "group": "eroica-alert", "saved_at_ns": ...,
     "incidents": {incident_id: {...}}, "jobs": {job: {...}},
     "delivered": {notification_id: {"event", "incident_id", "at_ns", "outcome"}},
     "outbox": [notification, ...]}

A lock file beside it (``flock``) keeps a second consumer from sharing the
state: two processes writing one file would each undo the other's deliveries.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path
from typing import Any

import msgspec

from .incidents import STATE_VERSION, IncidentTracker, Notification, TrackerSettings

__all__ = ["AlertState", "StateLockedError"]


class StateLockedError(RuntimeError):
    """Another process holds the state file."""


class AlertState:
    def __init__(self, path: Path, tracker: IncidentTracker, group: str = "") -> None:
        self.path = Path(path)
        self.tracker = tracker
        self.group = group
        self.delivered: dict[str, dict[str, Any]] = {}
        self.outbox: list[Notification] = []
        self._lock_fd: int | None = None

    # -- loading and saving --------------------------------------------------------------
    @classmethod
    def load(cls, path: Path, settings: TrackerSettings, group: str = "") -> AlertState:
        """The saved state, or a fresh one when there is no file. A corrupt file is an error, never ignored."""
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, IncidentTracker(settings), group)
        except ValueError as exc:
            raise ValueError(f"alert state {path} is not valid JSON ({exc}); move it away to start afresh "
                             "(already delivered alerts may then be sent again)") from None
        if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
            raise ValueError(f"alert state {path}: unknown format (version {doc.get('version')!r})")
        state = cls(path, IncidentTracker.from_doc(doc, settings), group or doc.get("group", ""))
        state.delivered = dict(doc.get("delivered") or {})
        state.outbox = [msgspec.convert(n, Notification) for n in doc.get("outbox") or []]
        return state

    def to_doc(self, now_ns: int) -> dict[str, Any]:
        return {"version": STATE_VERSION, "group": self.group, "saved_at_ns": int(now_ns),
                **self.tracker.to_doc(), "delivered": self.delivered,
                "outbox": [msgspec.to_builtins(n) for n in self.outbox]}

    def save(self, now_ns: int) -> None:
        data = msgspec.json.encode(self.to_doc(now_ns))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    # -- one process per state file ----------------------------------------------------------
    def lock(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateLockedError(f"another eroica alert uses the state file {self.path}") from None
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- notifications ---------------------------------------------------------------------------
    def enqueue(self, notifications: list[Notification]) -> int:
        """Queue those not delivered yet (a re-read verdict regenerates an id already sent); how many."""
        queued = {n.notification_id for n in self.outbox}
        added = 0
        for n in notifications:
            if n.notification_id in self.delivered or n.notification_id in queued:
                continue
            self.outbox.append(n)
            queued.add(n.notification_id)
            added += 1
        return added

    def mark(self, n: Notification, outcome: str, now_ns: int) -> None:
        self.delivered[n.notification_id] = {"event": n.event, "incident_id": n.incident_id,
                                             "at_ns": int(now_ns), "outcome": outcome}
        self.outbox = [m for m in self.outbox if m.notification_id != n.notification_id]

    def prune(self, now_ns: int) -> None:
        """Drop resolved incidents past retention and the delivered ids of incidents no longer known."""
        self.tracker.prune(now_ns)
        known = set(self.tracker.incidents)
        self.delivered = {k: v for k, v in self.delivered.items() if v.get("incident_id") in known}
