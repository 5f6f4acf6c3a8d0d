"""Verdicts -> incidents -> notifications: the alert consumer's pure state machine.

No Kafka, no HTTP, no clock: the caller passes wall time in, and the whole
state round-trips through JSON (:meth:`IncidentTracker.to_doc` /
:meth:`IncidentTracker.from_doc`), so a restart resumes exactly.

An **incident** is one persisting problem: the verdicts that share an
``incident_id`` (the detector's hash of job, kind, component, scope, node,
rank, gpu and fn, without the window). Its life:

``pending``
    seen, but no verdict of it reached ``min_confidence`` yet (the detector
    keeps a first sighting below its alarm level until it persists);
``open``
    a verdict reached the threshold: one **opened** notification, then a
    **reminder** every ``reminder_ns`` of wall time while it stays open;
``resolved``
    no verdict for it during ``resolve_after`` windows of its job: one
    **resolved** notification (a pending incident just ends, silently).

"Windows of its job" is event time: each job's watermark is the latest window
end seen for it, from its verdicts and from the per-window summaries the
detector publishes for every window (``observe_window``). An incident last
seen in the window ending at ``E`` resolves once the watermark reaches
``E + resolve_after * window``. Event-time resolution is only applied when
the caller says the input is caught up (``due(..., caught_up=True)``: no
verdict can still be waiting in the topic), so reading a backlog in any order
never resolves an incident early. A job that stops sending entirely has no
watermark to move: after ``stale_ns`` of wall time without any message for the
job its incidents resolve too (reason ``stale``).

A job that *ended* says so: the detector publishes a job-end marker on the
verdict topic after the job's last verdicts (:mod:`eroica.models.job_end`).
``observe_job_end`` resolves every incident of the job at once (reason
``job_ended``; pending ones just end), so no reminder follows and nothing waits
for windows that will never come. The marker comes after every verdict of the
job on the same partition, so no verdict of the job can still be waiting: no
caught-up check is needed. A job that comes back (a second replay) opens new
occurrences with its later windows, as after any resolution.

A verdict for an incident that was already resolved and whose window starts
before the resolution point is late and ignored; a later one re-opens it as a
new **occurrence** (its notifications get new ids).

Idempotency: applying the same verdict twice changes nothing the second time
(re-reading uncommitted messages after a restart is harmless), and every
notification has a stable id (incident, occurrence, event, sequence) that the
consumer records as delivered.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec

from eroica.models.verdict import Verdict, finding_key, incident_id as make_incident_id

__all__ = ["Notification", "Incident", "JobClock", "IncidentTracker", "TrackerSettings", "notification_id",
           "EVENTS", "RESOLUTIONS"]

EVENTS = ("opened", "reminder", "resolved")
RESOLUTIONS = ("windows", "stale", "job_ended")
STATE_VERSION = 1


def notification_id(incident: str, occurrence: int, event: str, sequence: int) -> str:
    """Stable id of one notification: the same incident event always gets the same id."""
    h = hashlib.blake2b(digest_size=12)
    for part in ("n1", incident, occurrence, event, sequence):
        h.update(str(part).encode())
        h.update(b"\x1f")
    return h.hexdigest()


class Notification(msgspec.Struct, kw_only=True):
    """What the webhook is told (payloads.py shapes it for Slack, Alertmanager or plain JSON)."""

    notification_id: str
    event: str                     # opened | reminder | resolved
    incident_id: str
    occurrence: int
    sequence: int                  # 0, or the reminder's number (1, 2, ...)
    job: str
    kind: str
    component: str
    scope: str
    node: str
    rank: int
    gpu: int
    fn: str
    summary: str
    confidence: float              # highest confidence seen in this occurrence
    slowdown: float                # of the latest verdict
    first_window_start_ns: int
    last_window_end_ns: int
    windows: int                   # distinct windows with a verdict in this occurrence
    opened_at_ns: int              # wall time of the opening (0 while pending)
    created_at_ns: int             # wall time this notification was made
    resolved_at_ns: int = 0
    resolution: str = ""           # resolved: "windows" (event time), "stale" (wall clock), "job_ended" (its end)
    # what the problem costs (optional verdict fields; None when the detector could not tell)
    job_slowdown: float | None = None
    cost: float | None = None
    gpu_hours_lost_per_hour: float | None = None
    verdict_id: str = ""           # the latest verdict's id
    evidence: dict[str, Any] = {}


class Incident(msgspec.Struct, kw_only=True):
    incident_id: str
    job: str
    status: str                    # pending | open | resolved
    occurrence: int = 1
    first_window_start_ns: int
    last_window_end_ns: int
    window_ns: int
    windows: int = 1
    max_confidence: float
    verdict: dict[str, Any]        # the latest verdict (contract fields)
    opened_at_ns: int = 0
    last_notified_ns: int = 0
    reminders: int = 0
    resolved_through_ns: int = 0   # job watermark when it resolved: earlier verdicts are late
    resolved_at_ns: int = 0
    resolution: str = ""


class JobClock(msgspec.Struct, kw_only=True):
    watermark_ns: int = 0          # latest window end seen for the job (event time)
    window_ns: int = 0             # its window length
    last_activity_ns: int = 0      # wall time of the last message for the job


class TrackerSettings(msgspec.Struct, kw_only=True, frozen=True):
    min_confidence: float = 0.7
    components: tuple[str, ...] = ()   # empty: every component
    resolve_after: int = 3             # windows without a verdict
    reminder_ns: int = 30 * 60 * 10**9  # 0: no reminders
    stale_ns: int = 0                  # 0: max(2 * resolve_after windows, 5 min)
    retain_ns: int = 7 * 86400 * 10**9  # resolved incidents (and their delivered ids) kept this long

    def stale_after(self, window_ns: int) -> int:
        if self.stale_ns > 0:
            return self.stale_ns
        return max(2 * self.resolve_after * max(window_ns, 0), 300 * 10**9)


_verdict_builtins = msgspec.to_builtins


class IncidentTracker:
    """All incidents and job clocks; methods return the notifications to send, in order."""

    def __init__(self, settings: TrackerSettings | None = None) -> None:
        self.settings = settings or TrackerSettings()
        self.incidents: dict[str, Incident] = {}
        self.jobs: dict[str, JobClock] = {}
        self.late_verdicts = 0
        self.filtered_verdicts = 0

    # -- input -------------------------------------------------------------------------
    def observe_window(self, job: str, start_ns: int, end_ns: int, now_ns: int) -> None:
        """A window of ``job`` was analysed (its summaries were published): event time moves."""
        clock = self.jobs.setdefault(job, JobClock())
        if end_ns > clock.watermark_ns:
            clock.watermark_ns = int(end_ns)
        if end_ns > start_ns:
            clock.window_ns = int(end_ns - start_ns)
        clock.last_activity_ns = max(clock.last_activity_ns, int(now_ns))

    def observe_verdict(self, v: Verdict, now_ns: int) -> list[Notification]:
        """Apply one verdict; the opened notification when it opens an incident."""
        self.observe_window(v.job, v.window_start_ns, v.window_end_ns, now_ns)
        s = self.settings
        if s.components and v.component not in s.components:
            self.filtered_verdicts += 1
            return []
        iid = v.incident_id or make_incident_id(
            finding_key(v.job, v.kind, v.component, v.scope, v.node, v.rank, v.gpu, v.fn))
        inc = self.incidents.get(iid)
        if inc is not None and inc.status == "resolved":
            if v.window_start_ns < inc.resolved_through_ns:
                self.late_verdicts += 1
                return []
            inc = self._reopen(inc, v)
        if inc is None:
            inc = self.incidents[iid] = Incident(
                incident_id=iid, job=v.job, status="pending", first_window_start_ns=v.window_start_ns,
                last_window_end_ns=v.window_end_ns, window_ns=max(1, v.window_end_ns - v.window_start_ns),
                max_confidence=v.confidence, verdict=_verdict_builtins(v))
        else:
            if v.window_end_ns > inc.last_window_end_ns:
                inc.windows += 1
                inc.last_window_end_ns = v.window_end_ns
                inc.verdict = _verdict_builtins(v)
            elif v.window_end_ns == inc.last_window_end_ns and v.confidence > inc.verdict.get("confidence", 0):
                inc.verdict = _verdict_builtins(v)
            inc.first_window_start_ns = min(inc.first_window_start_ns, v.window_start_ns)
            inc.max_confidence = max(inc.max_confidence, v.confidence)
        if inc.status == "pending" and v.confidence >= s.min_confidence:
            inc.status = "open"
            inc.opened_at_ns = inc.last_notified_ns = int(now_ns)
            return [self._notification(inc, "opened", 0, now_ns)]
        return []

    def observe_job_end(self, job: str, now_ns: int) -> list[Notification]:
        """The job ended (its job-end marker): every incident of it resolves now; the resolved notifications.

        Idempotent: a marker read again finds them resolved and changes nothing.
        """
        clock = self.jobs.setdefault(job, JobClock())
        clock.last_activity_ns = max(clock.last_activity_ns, int(now_ns))
        out: list[Notification] = []
        for inc in list(self.incidents_of(job)):
            if inc.status != "resolved":
                n = self._resolve(inc, "job_ended", clock, now_ns)
                if n is not None:
                    out.append(n)
        return out

    def _resolve(self, inc: Incident, resolution: str, clock: JobClock, now_ns: int) -> Notification | None:
        """Resolve ``inc``; its resolved notification if it was open (a pending one just ends)."""
        was_open = inc.status == "open"
        inc.status = "resolved"
        inc.resolution = resolution
        inc.resolved_at_ns = int(now_ns)
        inc.resolved_through_ns = max(clock.watermark_ns, inc.last_window_end_ns)
        return self._notification(inc, "resolved", 0, now_ns) if was_open else None

    def _reopen(self, old: Incident, v: Verdict) -> Incident:
        inc = Incident(incident_id=old.incident_id, job=v.job, status="pending", occurrence=old.occurrence + 1,
                       first_window_start_ns=v.window_start_ns, last_window_end_ns=v.window_end_ns,
                       window_ns=max(1, v.window_end_ns - v.window_start_ns), max_confidence=v.confidence,
                       verdict=_verdict_builtins(v))
        self.incidents[old.incident_id] = inc
        return inc

    # -- time passing ------------------------------------------------------------------------
    def due(self, now_ns: int, *, caught_up: bool) -> list[Notification]:
        """Resolutions and reminders that are due now (call every second or so)."""
        out: list[Notification] = []
        s = self.settings
        for inc in list(self.incidents.values()):
            if inc.status == "resolved":
                continue
            clock = self.jobs.get(inc.job, JobClock())
            resolution = ""
            if caught_up and clock.watermark_ns >= inc.last_window_end_ns + s.resolve_after * inc.window_ns:
                resolution = "windows"
            elif caught_up and now_ns - clock.last_activity_ns >= s.stale_after(inc.window_ns):
                resolution = "stale"
            if resolution:
                n = self._resolve(inc, resolution, clock, now_ns)
                if n is not None:
                    out.append(n)
                continue
            if inc.status == "open" and s.reminder_ns > 0 and now_ns - inc.last_notified_ns >= s.reminder_ns:
                inc.reminders += 1
                inc.last_notified_ns = int(now_ns)
                out.append(self._notification(inc, "reminder", inc.reminders, now_ns))
        return out

    def could_resolve(self, now_ns: int) -> bool:
        """Whether :meth:`due` would resolve something if the input were caught up (cheap, no side effect).

        Lets the caller skip the broker round trips of its caught-up check when nothing could resolve.
        """
        s = self.settings
        for inc in self.incidents.values():
            if inc.status == "resolved":
                continue
            clock = self.jobs.get(inc.job, JobClock())
            if (clock.watermark_ns >= inc.last_window_end_ns + s.resolve_after * inc.window_ns
                    or now_ns - clock.last_activity_ns >= s.stale_after(inc.window_ns)):
                return True
        return False

    def prune(self, now_ns: int) -> list[str]:
        """Forget incidents resolved longer than ``retain_ns`` ago and idle jobs; returns their ids."""
        gone = [iid for iid, inc in self.incidents.items()
                if inc.status == "resolved" and now_ns - inc.resolved_at_ns > self.settings.retain_ns]
        for iid in gone:
            del self.incidents[iid]
        busy = {inc.job for inc in self.incidents.values()}
        for job in [j for j, c in self.jobs.items()
                    if j not in busy and now_ns - c.last_activity_ns > self.settings.retain_ns]:
            del self.jobs[job]
        return gone

    def open_count(self) -> int:
        return sum(1 for inc in self.incidents.values() if inc.status == "open")

    # -- notifications ---------------------------------------------------------------------
    def _notification(self, inc: Incident, event: str, sequence: int, now_ns: int) -> Notification:
        v = inc.verdict
        return Notification(
            notification_id=notification_id(inc.incident_id, inc.occurrence, event, sequence), event=event,
            incident_id=inc.incident_id, occurrence=inc.occurrence, sequence=sequence, job=inc.job,
            kind=v.get("kind", ""), component=v.get("component", ""), scope=v.get("scope", ""),
            node=v.get("node", ""), rank=int(v.get("rank", -1)), gpu=int(v.get("gpu", -1)), fn=v.get("fn", ""),
            summary=v.get("summary", ""), confidence=float(inc.max_confidence),
            slowdown=float(v.get("slowdown", 1.0)), first_window_start_ns=inc.first_window_start_ns,
            last_window_end_ns=inc.last_window_end_ns, windows=inc.windows, opened_at_ns=inc.opened_at_ns,
            created_at_ns=int(now_ns), resolved_at_ns=inc.resolved_at_ns if event == "resolved" else 0,
            resolution=inc.resolution if event == "resolved" else "", verdict_id=v.get("verdict_id", ""),
            evidence=v.get("evidence", {}) or {},
            job_slowdown=v.get("job_slowdown"), cost=v.get("cost"),
            gpu_hours_lost_per_hour=v.get("gpu_hours_lost_per_hour"),
        )

    # -- persistence ---------------------------------------------------------------------------
    def to_doc(self) -> dict[str, Any]:
        return {
            "incidents": {k: msgspec.to_builtins(v) for k, v in self.incidents.items()},
            "jobs": {k: msgspec.to_builtins(v) for k, v in self.jobs.items()},
        }

    @classmethod
    def from_doc(cls, doc: dict[str, Any], settings: TrackerSettings | None = None) -> IncidentTracker:
        t = cls(settings)
        t.incidents = {k: msgspec.convert(v, Incident) for k, v in (doc.get("incidents") or {}).items()}
        t.jobs = {k: msgspec.convert(v, JobClock) for k, v in (doc.get("jobs") or {}).items()}
        return t

    def incidents_of(self, job: str) -> Iterable[Incident]:
        return (inc for inc in self.incidents.values() if inc.job == job)
