"""Static tools see the package: mypy follows ``eroica.*`` imports to the files (issue 35 item 1).

The folders install as ``eroica.<folder>`` through pyproject's package-dir map,
which mypy cannot read (nor the editable install's import hook), so
``.typing/eroica/`` holds one symlink per top-level package and
``[tool.mypy] mypy_path`` points there. Before, every ``eroica.*`` import was
``Any`` to mypy and a made-up attribute on a ``WindowDigest`` passed ``make lint``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINKS = ROOT / ".typing" / "eroica"

api = pytest.importorskip("mypy.api")


def test_the_link_tree_is_the_package_dir_map() -> None:
    """One link per top-level package of the map, each to its folder: a new top-level package needs its link."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        dirs = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    top = {name.split(".")[1]: folder for name, folder in dirs.items() if name.count(".") == 1}
    assert {p.name for p in LINKS.iterdir()} == set(top)
    for name, folder in top.items():
        link = LINKS / name
        assert link.is_symlink(), f"{link} is not a symlink"
        assert os.readlink(link) == f"../../{folder}"
        assert link.resolve() == (ROOT / folder).resolve()
    assert not (LINKS / "__init__.py").exists()  # `eroica` stays a namespace package, as installed


def _mypy(tmp_path: Path, cache: Path, body: str) -> tuple[str, int]:
    probe = tmp_path / "probe.py"
    probe.write_text("from eroica.models.digest import WindowDigest\n\n\ndef f(d: WindowDigest) -> int:\n"
                     f"    return {body}\n")
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
                                "--no-error-summary", str(probe)])
    return out + err, status


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy_cache")


def test_a_made_up_attribute_on_a_project_type_fails_the_type_check(tmp_path: Path, mypy_cache: Path) -> None:
    out, status = _mypy(tmp_path, mypy_cache, "d.no_such_field")
    assert status == 1, out
    assert '"WindowDigest" has no attribute "no_such_field"' in out, out


def test_a_real_attribute_passes(tmp_path: Path, mypy_cache: Path) -> None:
    out, status = _mypy(tmp_path, mypy_cache, "d.start_ns")
    assert status == 0, out
