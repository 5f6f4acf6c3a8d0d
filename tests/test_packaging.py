"""What the wheel holds: every package, under the one ``eroica`` namespace, and no test code.

Co-located tests (``test_*.py``), the tracer's training-job fixtures
(``*_job.py``) and benchmark scripts (``bench_*.py``) sit beside their code
but never ship (setup.py filters them); pyproject.toml's package lists must
name every package folder, or it would silently be left out of the wheel.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEV_ONLY = ("test_*.py", "*_test.py", "conftest.py", "*_job.py", "bench_*.py")


def _setuptools() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def test_every_package_folder_is_listed() -> None:
    conf = _setuptools()
    dirs = conf["package-dir"]
    assert sorted(conf["packages"]) == sorted(dirs), "packages and package-dir name different packages"
    assert all(name.startswith("eroica.") for name in dirs)
    listed = {(ROOT / folder).resolve() for folder in dirs.values()}
    on_disk = {p.parent.resolve() for p in ROOT.glob("*/__init__.py")}
    for top in {p for p in listed if p.parent == ROOT.resolve()}:
        on_disk |= {p.parent.resolve() for p in top.rglob("__init__.py") if "__pycache__" not in p.parts}
    assert on_disk == listed, (f"not in pyproject.toml: {sorted(map(str, on_disk - listed))}; "
                               f"listed without __init__.py: {sorted(map(str, listed - on_disk))}")


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Build the wheel from a copy of the sources (the checkout is left as it is: no build/ or egg-info)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    for folder in _setuptools()["package-dir"].values():
        (src / folder).mkdir(parents=True, exist_ok=True)
        for path in (ROOT / folder).glob("*.py"):
            shutil.copy2(path, src / folder / path.name)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                           "--no-index", "-q", "-w", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("eroica-*.whl")
    with zipfile.ZipFile(whl) as z:
        return z.namelist()


def test_wheel_ships_no_tests_fixtures_or_bench_scripts(wheel_names: list[str]) -> None:
    modules = [n for n in wheel_names if n.endswith(".py")]
    dev = [n for n in modules if any(fnmatch.fnmatch(n.rsplit("/", 1)[-1], p) for p in DEV_ONLY)
           and n != "eroica/cli/bench_cmd.py"]
    assert dev == [], f"test code in the wheel: {dev}"


def test_wheel_ships_every_layer_under_eroica(wheel_names: list[str]) -> None:
    modules = {n for n in wheel_names if n.endswith(".py")}
    assert all(n.startswith("eroica/") for n in modules), sorted(n for n in modules if not n.startswith("eroica/"))
    for name in ("eroica/models/records.py", "eroica/runtime/metrics.py", "eroica/kafka/admin.py",
                 "eroica/producers/replay.py", "eroica/streams/detection/detector.py", "eroica/streams/faust/__main__.py",
                 "eroica/sinks/clickhouse/__main__.py", "eroica/report/render.py", "eroica/stack/local.py",
                 "eroica/bench/throughput.py", "eroica/cli/main.py", "eroica/cli/bench_cmd.py"):
        assert name in modules, name
