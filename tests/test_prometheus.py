"""Prometheus against Eroica: the shipped rules under promtool, and a real Prometheus scraping ``eroica up``.

- ``promtool check config``/``check rules``/``test rules`` on ``deploy/prometheus/`` (the rules'
  own unit tests are ``eroica-rules.test.yml``);
- ``eroica up`` writes ``DATA_DIR/prometheus-targets.json``; Debian's Prometheus, given the
  shipped ``prometheus.yml`` with that path (and a 1 s scrape interval), finds every role's
  target up, sees each role's own series and none of another role's, and loads the rules.

The binaries come from ``.ci/install-prometheus.sh`` (Debian's ``prometheus`` package). Without
them the tests skip, except under ``CI`` where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from eroica.runtime.system import free_port
from sink_helpers import stop_stack, wait_for

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "prometheus"
# Fast group joins and flushes, as the other `eroica up` tests; no ClickHouse server of the environment.
STACK_ENV = {"EROICA_SINK_SESSION_TIMEOUT_MS": "2000", "EROICA_SINK_FLUSH_MS": "100"}


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path:
        return path
    reason = f"{name} not installed (run .ci/install-prometheus.sh)"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set: the Prometheus checks must run here)", pytrace=False)
    pytest.skip(reason)


def _promtool(*args: str, cwd: Path = DEPLOY) -> str:
    r = subprocess.run([_binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"promtool {' '.join(args)}:\n{r.stdout}\n{r.stderr}"
    return r.stdout + r.stderr


def test_promtool_checks_and_tests_the_shipped_rules() -> None:
    assert "SUCCESS" in _promtool("check", "rules", "eroica-rules.yml")
    assert "SUCCESS" in _promtool("test", "rules", "eroica-rules.test.yml")
    _promtool("check", "config", "prometheus.yml")  # also loads the rules it names


def _api(base: str, path: str, **params: str) -> Any:
    url = f"{base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=5) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]


def _query(base: str, promql: str) -> list[dict[str, Any]]:
    return list(_api(base, "/api/v1/query", query=promql)["result"])


def _start_stack(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    data = tmp_path / "stack"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EROICA_CLICKHOUSE", "EROICA_METRICS"))}
    log = open(tmp_path / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "eroica.cli", "up", "--data-dir", str(data), "--stop-timeout", "5"],
                          stdout=log, stderr=subprocess.STDOUT, env={**env, **STACK_ENV}, start_new_session=True)
    log.close()

    def running() -> bool:
        if up.poll() is not None:
            raise AssertionError(f"eroica up exited with {up.returncode}: {(tmp_path / 'up.log').read_text()[-3000:]}")
        return "stack up" in (tmp_path / "up.log").read_text()

    try:
        wait_for(running, 90, "eroica up to report the stack up", interval_s=0.25)
    except BaseException:
        stop_stack(up)
        raise
    return up, data


def _prometheus_config(tmp_path: Path, targets: Path) -> Path:
    """The shipped prometheus.yml, pointed at ``targets``, scraping and evaluating every second."""
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update({"scrape_interval": "1s", "evaluation_interval": "1s"})
    config["rule_files"] = [str(DEPLOY / f) for f in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["file_sd_configs"] = [{"files": [str(targets)]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_real_prometheus_scrapes_every_role_of_a_running_stack(tmp_path: Path) -> None:
    prometheus = _binary("prometheus")
    pytest.importorskip("chdb")
    t0 = time.monotonic()
    up, data = _start_stack(tmp_path)
    prom: subprocess.Popen[bytes] | None = None
    try:
        targets_file = data / "prometheus-targets.json"
        groups = json.loads(targets_file.read_text())
        state = json.loads((data / "stack.json").read_text())
        services = set(state["services"])
        assert {g["labels"]["service"] for g in groups} == services
        for g in groups:  # the port the supervisor gave each child, recorded in the state too
            assert g["targets"] == [f"127.0.0.1:{state['services'][g['labels']['service']]['metrics_port']}"]
        roles = {g["labels"]["role"] for g in groups}

        port = free_port()
        base = f"http://127.0.0.1:{port}"
        plog = open(tmp_path / "prometheus.log", "wb")
        prom = subprocess.Popen([prometheus, f"--config.file={_prometheus_config(tmp_path, targets_file)}",
                                 f"--web.listen-address=127.0.0.1:{port}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
                                stdout=plog, stderr=subprocess.STDOUT, start_new_session=True)
        plog.close()

        def all_up() -> dict[str, str]:
            if prom is not None and prom.poll() is not None:
                raise AssertionError(f"prometheus exited: {(tmp_path / 'prometheus.log').read_text()[-3000:]}")
            try:
                active = _api(base, "/api/v1/targets")["activeTargets"]
            except OSError:
                return {}
            health = {t["labels"]["service"]: t["health"] for t in active}
            return health if set(health) == services and set(health.values()) == {"up"} else {}

        wait_for(all_up, 45, "Prometheus to scrape every service of the stack", interval_s=0.5)

        # Every role's target is up (the `role` and `service` labels come from the file_sd file) ...
        assert {r["metric"]["role"] for r in _query(base, 'up{job="eroica"} == 1')} == roles
        # ... and its own series are there, at zero before any traffic (made when its exposition starts).
        own = {"summariser": 'eroica_windows_closed_total{component="summariser"}',
               "detector": 'eroica_detection_delay_seconds_count{component="detector"}',
               "sink": 'eroica_sink_insert_failures_total{component="sink"}'}
        for role in roles:
            got = _query(base, own[role])
            assert got and {r["metric"]["role"] for r in got} == {role}, (role, got)
        # No process exports another role's families (before this change every one showed eroica_alert_*).
        assert _query(base, '{job="eroica", __name__=~"eroica_alert_.*"}') == []
        assert _query(base, 'eroica_sink_insert_seconds_count{role!="sink"}') == []
        assert _query(base, 'eroica_windows_closed_total{role="sink"}') == []
        # The shipped rules loaded, and on a healthy idle stack none of them fires.
        rule_groups = {g["name"] for g in _api(base, "/api/v1/rules")["groups"]}
        assert rule_groups == {"eroica.records", "eroica.health"}
        assert _api(base, "/api/v1/alerts")["alerts"] == []
    finally:
        if prom is not None:
            prom.terminate()
            try:
                prom.wait(15)
            except subprocess.TimeoutExpired:
                prom.kill()
        stop_stack(up)
    assert up.returncode == 0, (tmp_path / "up.log").read_text()[-3000:]
    assert not (data / "prometheus-targets.json").exists()  # a stopped stack lists no targets
    print(f"stack up + Prometheus scrape of {sorted(services)} in {time.monotonic() - t0:.1f} s")
