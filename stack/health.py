"""Health of a running stack, part by part (what ``eroica status`` prints).

Each check is cheap and bounded (about a second): the supervisor is alive,
the broker answers a metadata request, every child process is alive and
answers on its port (faust's web server, the sink's ``/health``), and a
ClickHouse query works (through the sink's endpoint on chdb, or directly
against a server). The checks run side by side, each under a deadline
(``timeout_s``, 4 s): one that does not finish in time is reported ``down``
with what did not answer, so ``eroica status`` never hangs on a frozen part.

Each part is ``up``, ``degraded`` (alive, but something it depends on is
stuck: the sink's inserts have not progressed for ``EROICA_SINK_STUCK_S``
while messages wait; the supervisor is restarting the broker; tansu's memory
is past ``EROICA_TANSU_MEMORY_WARN_MB``) or ``down``.

Each line says what the part really did, in its role's words
(:func:`role_detail`): a summariser the frames and records it read, the
digests it sent and its dead letters; the detector the digests it read, the
windows it analysed, the verdicts it sent, its dead letters and its verdict
delay (a window closed at the summariser to its verdicts out, wall clock: a
replay of old files is not counted their age); the sink the rows it stored.
The counts come from the service's stats page, the rest from the Prometheus
metrics it announces in its own directory
(``DATA_DIR/<service>/metrics-<role>-<pid>.json``, see ``runtime/metrics.py``).
Every live process announced in ``DATA_DIR`` itself (each ``eroica alert`` run
with the stack's data directory) gets a line of its own: ``alert``,
``alert-2``... oldest first, with the notifications it sent.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eroica.runtime.system import pid_alive, status_kib

from eroica.runtime.state import read_state

__all__ = ["Check", "http_ok", "check_stack", "call_with_deadline", "DeadlineExceeded", "overall_state",
           "role_detail", "announced_parts"]

DEFAULT_TIMEOUT_S = 4.0
STATES = ("up", "degraded", "down")


@dataclass(frozen=True)
class Check:
    """One line of the status table; ``state`` is ``up`` when ok, else ``down`` unless given (``degraded``)."""

    part: str
    ok: bool
    detail: str
    pid: int | None = None
    port: int | None = None
    state: str = ""

    def __post_init__(self) -> None:
        if not self.state:
            object.__setattr__(self, "state", "up" if self.ok else "down")


def overall_state(checks: list[Check]) -> str:
    """``up`` when every part is, ``down`` when one is, else ``degraded``."""
    states = {c.state for c in checks}
    return "down" if "down" in states else "degraded" if "degraded" in states else "up"


class DeadlineExceeded(TimeoutError):
    """A call did not finish within its deadline (it goes on in a daemon thread, its result ignored)."""


def call_with_deadline(fn, timeout_s: float, what: str):  # type: ignore[no-untyped-def]
    """``fn()``'s result, or DeadlineExceeded after ``timeout_s`` (a frozen server cannot hang the caller).

    The call runs in a daemon thread: a process exiting meanwhile does not wait for it.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    t = threading.Thread(target=run, name=f"deadline:{what}", daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        raise DeadlineExceeded(f"{what} did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def http_ok(url: str, timeout_s: float = 1.0) -> tuple[bool, Any]:
    """(True, decoded JSON or text) when ``url`` answers below 500, else (False, reason)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            body = resp.read(65536)
    except urllib.error.HTTPError as exc:
        if exc.code < 500:  # faust answers 404 on an unknown page: it is alive
            return True, f"HTTP {exc.code}"
        return False, f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return False, str(getattr(exc, "reason", exc))
    try:
        return True, json.loads(body)
    except ValueError:
        return True, body[:200].decode("utf-8", errors="replace")


def _rss_mb(pid: int | None) -> float | None:
    kib = status_kib(pid, "VmRSS") if pid else None
    return None if kib is None else kib / 1024.0


def _broker(kafka: dict[str, Any], timeout_s: float = 3.0) -> Check:
    from eroica.kafka.admin import BrokerError, wait_for_broker

    bootstrap = kafka.get("bootstrap", "")
    pid = kafka.get("pid")
    sup_state = kafka.get("state")
    if sup_state in ("restarting", "failed"):
        what = ("being restarted by the supervisor" if sup_state == "restarting"
                else "dead, not restarted (restart budget spent)")
        return Check("kafka", False, f"{bootstrap}: {what}; {kafka.get('restarts', 0)} restart(s) so far", pid,
                     state="degraded" if sup_state == "restarting" else "down")
    try:
        from eroica.kafka.config import KafkaConfig

        # the environment's TLS/SASL settings too (an external secure cluster): kafka/client.py
        wait_for_broker(KafkaConfig.from_env(bootstrap=bootstrap), timeout_s=timeout_s)
    except BrokerError as exc:
        return Check("kafka", False, f"{bootstrap}: {exc}", pid)
    except Exception as exc:  # noqa: BLE001 - librdkafka missing or misconfigured
        return Check("kafka", False, f"{bootstrap}: {type(exc).__name__}: {exc}", pid)
    detail = f"{bootstrap} answers"
    if kafka.get("restarts"):
        detail += f"; restarted {kafka['restarts']}x"
    if kafka.get("kind") == "tansu":
        rss = _rss_mb(pid)
        if rss is not None:
            try:
                limit = float(os.environ.get("EROICA_TANSU_MEMORY_WARN_MB") or 4096)
            except ValueError:
                limit = 4096.0
            detail += f"; tansu holds {rss:,.0f} MiB (memory storage, no retention)"
            if rss > limit:
                return Check("kafka", False, detail + f", over EROICA_TANSU_MEMORY_WARN_MB={limit:.0f}: restart "
                             f"the stack (its topics are lost) or use --broker kafka", pid, state="degraded")
    return Check("kafka", True, detail, pid)


def _metrics_detail(service_dir: Path, pid: int | None, role: str | None = None, counts: bool = True) -> str:
    """``"; metrics URL: records in 1,234, digests out 56, ..."`` when the process announced its endpoint there.

    ``role`` words the line (:func:`eroica.runtime.metrics.summarise`); ``counts=False``: its counts are
    already on the line (from the stats page), only the rest (troubles, delays) is added.
    """
    from eroica.runtime.metrics import read_announcement, scrape_summary

    ann = read_announcement(service_dir, pid=pid)
    if ann is None:
        return ""
    summary = scrape_summary(str(ann["url"]), role=role, counts=counts)
    return f"; metrics {ann['url']}" + (f": {summary}" if summary else "")


def _n(page: dict[str, Any], key: str) -> str:
    try:
        return f"{int(page.get(key) or 0):,}"
    except (TypeError, ValueError):
        return "?"


def role_detail(role: str, page: Any) -> str:
    """What a stream worker did, from its stats page (``/eroica/stats``); "" for another role or page.

    summariser: ``"frames in 12 (3,400 records), digests out 5, dead letters 0"``;
    detector: ``"digests in 5, windows analysed 5, verdicts out 2, dead letters 0"``.
    """
    if not isinstance(page, dict) or page.get("role") != role:
        return ""
    if role == "summariser":
        return (f"frames in {_n(page, 'frames')} ({_n(page, 'records')} records), digests out {_n(page, 'digests')}, "
                f"dead letters {_n(page, 'deadletters')}")
    if role == "detector":
        return (f"digests in {_n(page, 'digests')}, windows analysed {_n(page, 'windows')}, verdicts out "
                f"{_n(page, 'verdicts')}, dead letters {_n(page, 'deadletters')}")
    return ""


def _service(name: str, svc: dict[str, Any], data_dir: Path | None = None) -> Check:
    pid, port = svc.get("pid"), svc.get("port")
    state = svc.get("state", "?")
    if not pid or not pid_alive(int(pid)):
        code = svc.get("exit_code")
        return Check(name, False, f"not running (state {state}" + (f", exit status {code})" if code is not None
                                                                    else ")"), pid, port)
    ok, info = http_ok(str(svc.get("health_url")))
    if not ok:
        return Check(name, False, f"process alive but port {port} does not answer: {info}", pid, port)
    detail = f"alive, port {port} answers"
    stuck: list[str] = []
    from eroica.runtime.metrics import role_of

    role = role_of(name)
    counted = role_detail(role, info)
    if counted:
        detail += f"; {counted}"
    if isinstance(info, dict) and role == "sink":
        detail += (f"; {info.get('verdicts', 0)} verdict rows, {info.get('summaries', 0)} summary rows, "
                   f"{info.get('deadletters', 0)} dead letters; ClickHouse {info.get('clickhouse')}")
    # every service's page may say it is degraded and why: the sink (storing stalls), the stream
    # workers (their broker does not answer: streams/faust/workers.py broker_health)
    if isinstance(info, dict) and info.get("state") == "degraded":
        stuck = [str(x) for x in info.get("stuck") or []] or ["does not progress"]
    if svc.get("restarts"):
        detail += f"; restarted {svc['restarts']}x"
    if data_dir is not None:
        detail += _metrics_detail(Path(data_dir) / name, pid, role, counts=not counted)
    if stuck:
        return Check(name, False, "STUCK: " + "; ".join(stuck) + "; " + detail, pid, port, state="degraded")
    return Check(name, True, detail, pid, port)


def _ping_server(url: str, timeout_s: float) -> Check:
    """``SELECT 1`` on a ClickHouse server with every timeout short (a frozen server cannot hold us)."""
    from eroica.sinks.clickhouse.config import ClickHouseConfig

    try:
        from clickhouse_driver import Client
    except ImportError as exc:
        return Check("clickhouse", False, f"{url}: {exc}")
    config = ClickHouseConfig.from_url(url)
    client = Client(host=config.host, port=config.port, user=config.user, password=config.password,
                    secure=config.secure, connect_timeout=timeout_s, send_receive_timeout=timeout_s,
                    sync_request_timeout=timeout_s, client_name="eroica-status")
    t0 = time.monotonic()
    try:
        client.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - refused, timed out, auth...
        return Check("clickhouse", False, f"{config.target}: did not answer SELECT 1 within {timeout_s:g} s "
                     f"({type(exc).__name__}: {exc})")
    finally:
        client.disconnect()
    return Check("clickhouse", True, f"{config.target}: SELECT 1 in {(time.monotonic() - t0) * 1000:.0f} ms")


def _clickhouse(state: dict[str, Any], timeout_s: float = 3.0) -> Check:
    from eroica.sinks.clickhouse.client import ClickHouseError

    from .query import open_query_target

    url = state.get("clickhouse", {}).get("url", "")
    if state.get("clickhouse", {}).get("backend") == "native" or url.startswith("clickhouse"):
        return _ping_server(url, timeout_s)
    try:
        target = open_query_target(url, Path(state.get("data_dir", ".")), endpoint=state.get("query_endpoint"),
                                   timeout_s=timeout_s)
        try:
            target.sql("SELECT 1")
        finally:
            target.close()
    except (ClickHouseError, ValueError) as exc:
        return Check("clickhouse", False, f"{url}: {exc}")
    return Check("clickhouse", True, f"{url}: SELECT 1 works ({target.description})")


def check_stack(data_dir: Path, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Check]:
    """Every check for the stack in ``data_dir``; a single failed check when none runs there.

    The checks run in parallel; each gets ``timeout_s`` in all, after which it
    is ``down`` with "did not answer within" (it is left to finish in a daemon thread).
    """
    state = read_state(data_dir)
    if state is None:
        return [Check("stack", False, f"no stack state in {data_dir} (start one with `eroica up`)")]
    sup = int(state.get("pid", 0))
    checks = [Check("supervisor", pid_alive(sup), "alive" if pid_alive(sup) else "not running (stale state file)",
                    sup)]
    inner = max(0.5, timeout_s - 1.0)  # each check's own timeouts, inside the deadline
    jobs: list[tuple[str, Any, Any]] = [("kafka", lambda: _broker(state.get("kafka", {}), min(3.0, inner)), None)]
    for name, svc in state.get("services", {}).items():
        jobs.append((name, (lambda n=name, s=svc: _service(n, s, data_dir)), svc))
    jobs.append(("clickhouse", lambda: _clickhouse(state, min(3.0, inner)), None))
    for part, ann in announced_parts(data_dir):  # every live `eroica alert` (or other) sharing the directory
        jobs.append((part, (lambda p=part, a=ann: _announced(p, a)), {"pid": ann["pid"]}))
    results: dict[int, Any] = {}
    threads = []
    for i, (_, fn, _) in enumerate(jobs):
        def run(i: int = i, fn: Any = fn) -> None:
            try:
                results[i] = fn()
            except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check
                results[i] = exc
        t = threading.Thread(target=run, name=f"check:{jobs[i][0]}", daemon=True)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + timeout_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for i, (part, _, svc) in enumerate(jobs):
        pid = svc.get("pid") if isinstance(svc, dict) else None
        port = svc.get("port") if isinstance(svc, dict) else None
        if i not in results:
            checks.append(Check(part, False, f"did not answer within {timeout_s:g} s (frozen?)", pid, port))
            continue
        res = results[i]
        if isinstance(res, Exception):
            checks.append(Check(part, False, f"check failed: {type(res).__name__}: {res}", pid, port))
        elif isinstance(res, list):
            checks.extend(res)
        else:
            checks.append(res)
    return checks


def announced_parts(data_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """``(part, announcement)`` of every live process announced in ``data_dir`` itself, oldest first.

    Processes outside the stack that share its data directory (``eroica alert``): each has its own
    announcement (``runtime/metrics.py``), so two consumers are two parts, ``alert`` and ``alert-2``.
    """
    from eroica.runtime.metrics import read_announcements

    seen: dict[str, int] = {}
    parts = []
    for ann in read_announcements(Path(data_dir)):
        name = str(ann.get("component") or "process")
        seen[name] = seen.get(name, 0) + 1
        parts.append((name if seen[name] == 1 else f"{name}-{seen[name]}", ann))
    return parts


def _announced(part: str, ann: dict[str, Any]) -> Check:
    """The line of one announced process: what its metrics say it did (a metrics port not answering: down)."""
    from eroica.runtime.metrics import scrape_summary

    summary = scrape_summary(str(ann["url"]), role=str(ann.get("component") or ""))
    return Check(part, not summary.startswith("metrics unreachable"), f"metrics {ann['url']}: {summary}",
                 int(ann["pid"]))
