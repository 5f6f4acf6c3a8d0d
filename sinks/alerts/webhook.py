"""One webhook POST and what its answer means (stdlib urllib; the consumer owns the retrying).

- 2xx: **accepted**.
- 408, 425, 429, 5xx, a refused connection, a timeout, a reset: **transient**;
  the consumer retries with backoff and commits nothing meanwhile.
- any other 4xx (400 bad payload, 401/403 wrong credentials, 404 wrong URL):
  **refused**: retrying the same request cannot succeed, so the notification
  is recorded as refused (logged, counted) and the consumer moves on instead
  of stalling every later alert behind it.

Every request carries ``Idempotency-Key`` and ``X-Eroica-Notification-Id``
(the notification id), so a receiver that sees a request twice (the consumer
died between the webhook's answer and the write of its state) can drop it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass

__all__ = ["Delivery", "post", "TRANSIENT_STATUS"]

TRANSIENT_STATUS = frozenset({408, 425, 429})
USER_AGENT = "eroica-alert/1"


@dataclass(frozen=True)
class Delivery:
    outcome: str            # accepted | transient | refused
    status: int | None      # HTTP status, None when no answer
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.outcome == "accepted"


def post(url: str, body: bytes, notification_id: str, *, timeout_s: float = 10.0,
         headers: dict[str, str] | None = None) -> Delivery:
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": USER_AGENT,
        "Idempotency-Key": notification_id, "X-Eroica-Notification-Id": notification_id, **(headers or {}),
    })
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read(65536)
            return Delivery("accepted", resp.status)
    except urllib.error.HTTPError as exc:
        code = exc.code
        try:
            text = exc.read(300).decode("utf-8", errors="replace")
        except OSError:
            text = ""
        detail = f"HTTP {code}" + (f": {text.strip()[:200]}" if text.strip() else "")
        if 200 <= code < 300:
            return Delivery("accepted", code)
        if code >= 500 or code in TRANSIENT_STATUS:
            return Delivery("transient", code, detail)
        return Delivery("refused", code, detail)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        # ValueError: a malformed URL; checked when the consumer starts, so here it is transient noise.
        return Delivery("transient", None, str(getattr(exc, "reason", exc)))
