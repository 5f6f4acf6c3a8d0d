"""The layering holds: no import cycle between Eroica's top-level packages, every import goes down the layers.

Runs ``tools/import_graph.py`` (README, "Layers") over this checkout's shipped
modules. Before the layering (2026-11), every top-level package was in one
cycle; this test failed on that tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _graph_tool():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "tools" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _explain(edges: dict, pairs: list[tuple[str, str]]) -> str:
    return "\n".join(f"{a} -> {b}: {', '.join(edges[(a, b)])}" for a, b in pairs if (a, b) in edges)


def test_no_cycle_between_top_level_packages() -> None:
    tool = _graph_tool()
    edges = tool.import_edges(ROOT, 1)
    graph = tool.adjacency(edges)
    found = tool.cycles(graph)
    inside = [(a, b) for scc in found for a in scc for b in scc if (a, b) in edges]
    assert found == [], f"import cycles {found}; the imports inside them:\n{_explain(edges, inside)}"


def test_imports_go_down_the_layers() -> None:
    tool = _graph_tool()
    edges = tool.import_edges(ROOT, 1)
    wrong = tool.layer_violations(tool.adjacency(edges))
    pairs = [tuple(w.split(" -> ")) for w in wrong if " -> " in w]
    assert wrong == [], f"imports against the layers (tools/import_graph.py LAYERS):\n{_explain(edges, pairs)}\n{wrong}"


def test_no_cycle_between_subpackages() -> None:
    tool = _graph_tool()
    assert tool.cycles(tool.adjacency(tool.import_edges(ROOT, 2))) == []


def test_every_eroica_import_resolves() -> None:
    """A moved module leaves no import of its old name behind (relative imports included)."""
    assert _graph_tool().unresolved(ROOT) == []


def test_the_tool_sees_a_cycle(tmp_path: Path) -> None:
    """Two packages that import each other (one lazily, inside a function, one relatively) are a cycle."""
    (tmp_path / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"eroica.a" = "a"\n"eroica.b" = "b"\n'
                                             '"eroica.b.sub" = "b/sub"\n')
    for d in ("a", "b", "b/sub"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "a" / "x.py").write_text("def f():\n    from eroica.b.sub import y\n")
    (tmp_path / "b" / "sub" / "y.py").write_text("from ...a import x\n")
    (tmp_path / "b" / "test_z.py").write_text("import eroica.a\n")  # tests do not count
    (tmp_path / "b" / "w.py").write_text("from .gone import thing\nimport eroica.b.sub.y\n")
    tool = _graph_tool()
    assert tool.adjacency(tool.import_edges(tmp_path, 1)) == {"a": {"b"}, "b": {"a"}}
    assert tool.cycles(tool.adjacency(tool.import_edges(tmp_path, 1))) == [["a", "b"]]
    assert tool.adjacency(tool.import_edges(tmp_path, 2)) == {"a": {"b.sub"}, "b": {"b.sub"}, "b.sub": {"a"}}
    assert tool.unresolved(tmp_path) == ["b/w.py:1 eroica.b.gone"]
    assert tool.layer_violations({"a": {"b"}}) == ["a: in no layer of LAYERS"]
    assert tool.layer_violations({"models": {"kafka"}, "streams": {"sinks"}, "cli": {"models"}}) == [
        "models -> kafka", "streams -> sinks"]
