"""Health of a running stack, part by part (what ``eroica status`` prints).

Each check is cheap and bounded (about a second): the supervisor is alive,
the broker answers a metadata request, every child process is alive and
answers on its port (faust's web server, the sink's ``/health``), and a
ClickHouse query works (through the sink's endpoint on chdb, or directly
against a server). A process that announces Prometheus metrics in its own
directory (``DATA_DIR/<service>/metrics.json``, see ``stack/metrics.py``) gets
them summarised on its line; one announced in ``DATA_DIR/metrics.json``
(``eroica alert`` run with the stack's data directory) gets a line of its own.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eroica.sinks.clickhouse.endpoint import pid_alive

from .state import read_state

__all__ = ["Check", "http_ok", "check_stack"]


@dataclass(frozen=True)
class Check:
    """One line of the status table."""

    part: str
    ok: bool
    detail: str
    pid: int | None = None
    port: int | None = None


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


def _broker(bootstrap: str) -> Check:
    from .tansu import BrokerError, wait_for_broker

    try:
        wait_for_broker(bootstrap, timeout_s=3.0)
    except BrokerError as exc:
        return Check("kafka", False, f"{bootstrap}: {exc}")
    except Exception as exc:  # noqa: BLE001 - librdkafka missing or misconfigured
        return Check("kafka", False, f"{bootstrap}: {type(exc).__name__}: {exc}")
    return Check("kafka", True, f"{bootstrap} answers")


def _metrics_detail(service_dir: Path, pid: int | None) -> str:
    """``"; metrics: in 1,234, out 56, ..."`` when the process announced its Prometheus endpoint there."""
    from .metrics import read_announcement, scrape_summary

    ann = read_announcement(service_dir)
    if ann is None or (pid is not None and int(ann.get("pid", 0)) != int(pid)):
        return ""
    return f"; metrics {ann['url']}: {scrape_summary(str(ann['url']))}"


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
    if isinstance(info, dict) and name == "sink":
        detail += (f"; {info.get('verdicts', 0)} verdict rows, {info.get('summaries', 0)} summary rows, "
                   f"{info.get('deadletters', 0)} dead letters; ClickHouse {info.get('clickhouse')}")
    if svc.get("restarts"):
        detail += f"; restarted {svc['restarts']}x"
    if data_dir is not None:
        detail += _metrics_detail(Path(data_dir) / name, pid)
    return Check(name, True, detail, pid, port)


def _clickhouse(state: dict[str, Any]) -> Check:
    from eroica.sinks.clickhouse.client import ClickHouseError

    from .query import open_query_target

    url = state.get("clickhouse", {}).get("url", "")
    try:
        target = open_query_target(url, Path(state.get("data_dir", ".")), endpoint=state.get("query_endpoint"),
                                   timeout_s=3.0)
        try:
            target.sql("SELECT 1")
        finally:
            target.close()
    except (ClickHouseError, ValueError) as exc:
        return Check("clickhouse", False, f"{url}: {exc}")
    return Check("clickhouse", True, f"{url}: SELECT 1 works ({target.description})")


def check_stack(data_dir: Path) -> list[Check]:
    """Every check for the stack in ``data_dir``; a single failed check when none runs there."""
    state = read_state(data_dir)
    if state is None:
        return [Check("stack", False, f"no stack state in {data_dir} (start one with `eroica up`)")]
    sup = int(state.get("pid", 0))
    checks = [Check("supervisor", pid_alive(sup), "alive" if pid_alive(sup) else "not running (stale state file)",
                    sup)]
    checks.append(_broker(state.get("kafka", {}).get("bootstrap", "")))
    for name, svc in state.get("services", {}).items():
        checks.append(_service(name, svc, data_dir))
    checks.append(_clickhouse(state))
    checks.extend(_announced(data_dir))
    return checks


def _announced(data_dir: Path) -> list[Check]:
    """Processes outside the stack that share its data directory (e.g. ``eroica alert``) and serve metrics."""
    from .metrics import read_announcement

    ann = read_announcement(Path(data_dir))
    if ann is None or not pid_alive(int(ann.get("pid", 0))):
        return []
    name = str(ann.get("component", "process"))
    detail = _metrics_detail(Path(data_dir), int(ann["pid"])).removeprefix("; ")
    return [Check(name, "unreachable" not in detail, detail, int(ann["pid"]))]
