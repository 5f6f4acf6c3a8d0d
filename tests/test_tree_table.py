"""The folder table of ``docs/development.md`` is the tree's.

``tools/tree_table.py --write`` regenerates it, and this test fails when it is stale.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("tree_table", ROOT / "tools" / "tree_table.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_folder_table_matches_the_tree() -> None:
    tool = _tool()
    current = tool.page_table((ROOT / tool.PAGE).read_text(encoding="utf-8"))
    assert current is not None, f"{tool.PAGE} lost the tree-table markers"
    assert current == tool.table(ROOT), f"{tool.PAGE}'s folder table is stale: run tools/tree_table.py --write"


def test_every_listed_folder_and_module_has_a_summary() -> None:
    """An entry without a docstring shows as a bare name: every shipped folder and module states what it is."""
    tool = _tool()
    for folder in tool.folders(ROOT):
        if folder.name == "tests":
            continue  # fixture folders (chaos/) need no package docstring
        init = folder / "__init__.py"
        assert init.exists() or folder.name in tool.NOT_PACKAGES, folder
        for entry in tool.entries(folder):
            assert ": " in entry, f"{folder.name}/{entry} has no docstring"


def test_summary_is_the_first_sentence() -> None:
    tool = _tool()
    assert tool.summary("The verdict: an output. More here.\n\nLater.") == "The verdict: an output."
    assert tool.summary("Uses :class:`~eroica.kafka.config.KafkaConfig` here") == "Uses ``KafkaConfig`` here."
    assert tool.summary(None) == ""
