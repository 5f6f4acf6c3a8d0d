"""The documentation: the site builds strictly, the CLI reference is the commands' own help, the README stays short.

``mkdocs build --strict`` (``mkdocs.yml``: strict, with link, anchor and nav
validation) fails on a broken link between pages, a missing anchor, or a page
left out of the nav. Without mkdocs (``pip install -e '.[docs]'``) the build
test skips, and fails under ``CI``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250


def _cli_reference():
    spec = importlib.util.spec_from_file_location("cli_reference", ROOT / "tools" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_reference_matches_the_commands() -> None:
    tool = _cli_reference()
    committed = (ROOT / tool.PAGE).read_text(encoding="utf-8")
    assert committed == tool.page(), (
        f"{tool.PAGE} is stale (a command's help changed): run .venv/bin/python tools/cli_reference.py --write")


def test_cli_reference_has_every_command() -> None:
    from eroica.cli.main import COMMANDS

    text = (ROOT / _cli_reference().PAGE).read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"\n## eroica {name}\n" in text, name


def test_mkdocs_build_is_strict_and_clean(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None:
        if os.environ.get("CI"):
            pytest.fail("mkdocs is not installed in CI (the `docs` extra)", pytrace=False)
        pytest.skip("mkdocs not installed: pip install -e '.[docs]'")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
         "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").exists()
    assert (tmp_path / "site" / "cli.html").exists()


def test_mkdocs_config_is_strict() -> None:
    """The build fails on warnings, and every kind of broken link is a warning."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^strict: true$", text, re.M)
    for key in ("omitted_files", "not_found", "absolute_links", "unrecognized_links", "anchors"):
        assert re.search(rf"^\s+{key}: warn$", text, re.M), key


def _slug(heading: str) -> str:
    from markdown.extensions.toc import slugify  # what mkdocs' toc uses for anchors

    return slugify(re.sub(r"[`*]", "", heading), "-")


def test_readme_fits_the_first_screens_and_its_links_resolve() -> None:
    """mkdocs checks the links between pages; the README is not a page, so its links are checked here."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_MAX_LINES, "README.md grew past the first screens: move it into docs/"
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert links
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = ROOT / target
        assert path.is_file(), f"README.md links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(encoding="utf-8"), re.M)
            assert anchor in {_slug(h) for h in headings}, f"README.md links to {link}: no such heading"
