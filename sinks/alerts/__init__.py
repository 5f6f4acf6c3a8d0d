"""Alerting: the verdict topic turned into incidents and webhook notifications (``eroica alert``).

- ``incidents``: the pure state machine (verdicts -> incidents -> notifications);
- ``payloads``: pure shaping of a notification for Slack, Alertmanager v2 or plain JSON;
- ``mrkdwn``: Slack's escaping of names (so none can ping a channel or hide a link);
- ``links``: the link from a notification to its job's report page (``--report-url-base``);
- ``webhook``: one POST and what its answer means;
- ``state``: the atomically written state file;
- ``consumer``: the Kafka loop that ties them together and commits offsets
  only after the webhook accepted.
"""

from .config import AlertConfig
from .incidents import IncidentTracker, Notification, TrackerSettings

__all__ = ["AlertConfig", "IncidentTracker", "Notification", "TrackerSettings"]
