"""The test tiers stay complete (issue 35 item 6).

The root conftest.py gives every collected test exactly one of ``unit``, ``integration``,
``chaos`` (and ``slow`` on top where it takes long); ``make check`` runs ``-m "unit and not
slow"``. Here: the rule on made-up tests, and one real collection of the whole suite in a
subprocess (every test has exactly one tier; every test the conftest names by hand still exists,
so a renamed test does not silently fall back to ``unit``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIERS = {"unit", "integration", "chaos"}


@pytest.fixture(scope="module")
def tiers(pytestconfig: pytest.Config) -> ModuleType:
    """The root conftest.py as pytest loaded it (the module that marks the tests)."""
    for plugin in pytestconfig.pluginmanager.get_plugins():
        if isinstance(plugin, ModuleType) and Path(getattr(plugin, "__file__", "") or "") == ROOT / "conftest.py":
            return plugin
    raise AssertionError("the root conftest.py is not loaded")


def test_the_markers_are_registered_and_strict(pytestconfig: pytest.Config) -> None:
    names = {line.split(":", 1)[0] for line in pytestconfig.getini("markers")}
    assert {"unit", "integration", "chaos", "slow"} <= names
    assert "--strict-markers" in pytestconfig.getini("addopts")


@pytest.mark.parametrize("nodeid, fixtures, params, tier", [
    ("tests/chaos/test_chaos_tansu.py::test_x", ["stack", "kafka_bootstrap"], {}, "chaos"),
    ("kafka/test_publisher.py::test_x", ["kafka_bootstrap", "tmp_path"], {}, "integration"),
    ("tests/test_apache_kafka.py::test_x", ["kafka_cluster", "_kafka_cluster_module"], {}, "integration"),
    ("sinks/clickhouse/test_sink.py::test_x[server]", ["verdict_sink", "clickhouse_config"],
     {"clickhouse_config": "server"}, "integration"),
    ("sinks/clickhouse/test_sink.py::test_x[chdb]", ["verdict_sink", "clickhouse_config"],
     {"clickhouse_config": "chdb"}, "unit"),
    ("tests/test_demo.py::test_demo_names_the_throttled_gpu_and_keeps_its_data", ["tmp_path"], {}, "integration"),
    ("stack/test_tansu.py::test_anything_new", [], {}, "integration"),  # a listed module: all its tests
    ("tests/test_demo.py::test_without_keep_no_sql_is_offered_for_the_removed_stack", ["monkeypatch"], {}, "unit"),
    ("models/test_records.py::test_x[1-2]", ["tmp_path"], {"a": 1}, "unit"),
])
def test_each_test_gets_one_tier(tiers: ModuleType, nodeid: str, fixtures: list[str], params: dict,
                                 tier: str) -> None:
    assert tiers.tier_of(nodeid, fixtures, params) == tier


_DUMP = textwrap.dedent('''
    import os

    def pytest_collection_finish(session):
        with open(os.environ["EROICA_TIERS_OUT"], "w") as f:
            for item in session.items:
                names = sorted({m.name for m in item.iter_markers()})
                f.write(item.nodeid + "\\t" + ",".join(names) + "\\n")
''')


def test_every_collected_test_has_exactly_one_tier(tiers: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "tierdump.py").write_text(_DUMP)
    env = {**os.environ, "EROICA_TIERS_OUT": str(tmp_path / "tiers.txt"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tierdump", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [line.split("\t") for line in (tmp_path / "tiers.txt").read_text().splitlines()]
    assert len(rows) > 1000  # the whole suite, not a corner of it
    marks = {nodeid: set(names.split(",")) - {""} for nodeid, names in rows}
    wrong = {nodeid: sorted(m & TIERS) for nodeid, m in marks.items() if len(m & TIERS) != 1}
    assert not wrong, f"tests without exactly one tier: {dict(list(wrong.items())[:20])}"
    assert any("chaos" in m for m in marks.values()) and any("integration" in m for m in marks.values())
    assert any(m == {"unit"} for m in marks.values())
    # Every test or module named by hand is still collected (a rename would otherwise fall back to unit / not slow).
    bases = {nodeid.split("[", 1)[0] for nodeid in marks}
    paths = {base.split("::", 1)[0] for base in bases}
    stale = sorted(name for name in tiers.INTEGRATION_TESTS | tiers.SLOW_TESTS if name not in bases | paths)
    assert not stale, f"named in conftest.py but not collected: {stale}"
    slow = {nodeid for nodeid, m in marks.items() if "slow" in m}
    assert all(tiers._listed(nodeid, tiers.SLOW_TESTS) for nodeid in slow)
