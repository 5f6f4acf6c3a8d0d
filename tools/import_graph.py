"""Package-level import graph of Eroica, and its cycles.

    .venv/bin/python tools/import_graph.py [ROOT] [DEPTH] [--explain]

ROOT is the checkout (default ``.``); DEPTH how many levels of package name make
one node (1: ``stack``, ``streams``...; 2: ``streams.faust``, ``producers.tracer``...).
It prints one ``package -> packages`` line per package that imports others, then
the strongly connected components of more than one node (``cycles: none``)
the imports that break the layer order of :data:`LAYERS` (``layer
violations: none``) and imports of ``eroica`` modules that do not exist
(``unresolved imports: none``); it exits 1 when there is any. ``--explain`` adds, under each edge, the file and line of
every import that makes it.

Packages and their folders come from pyproject.toml's
``[tool.setuptools.package-dir]`` (every top-level folder installs as
``eroica.<top>``). Only shipped code counts: what setup.py keeps out of the
wheel (tests, the tracer's ``*_job.py`` fixtures, ``bench_*.py`` scripts: they
may use any layer as a fixture) and folders that are no package (``tests/``,
``tools/``) are not read. Every import is counted, also those inside functions:
a lazy import is still a dependency. A module file belongs to the package that
holds it, so ``stack/tansu.py`` is node ``stack`` at any depth.
tests/test_import_graph.py asserts there is neither at depth 1.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

NAMESPACE = "eroica"

# The layers, lowest first (README, "Layers"): a package imports only packages of
# lower layers; the packages of one layer never import each other.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("models",),                        # the contract
    ("runtime",),                       # process-level services: metrics, logs, state file, OS helpers
    ("kafka",),                         # the shared Kafka layer
    ("producers", "streams", "sinks"),  # the roles
    ("report", "stack"),                # views over the roles; orchestration of the roles
    ("bench",),                         # accuracy, cost and throughput benchmarks
    ("cli",),                           # the `eroica` command
)

#: (importing module's node, imported module's node) -> ["path:line", ...]
Edges = dict[tuple[str, str], list[str]]


def package_dirs(root: Path) -> dict[str, Path]:
    """``eroica.<pkg>`` -> its folder, from pyproject.toml."""
    with open(root / "pyproject.toml", "rb") as f:
        table = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: root / folder for name, folder in table.items()}


# The modules that never ship (the same rule as setup.py's).
DEV_ONLY = ("test_*.py", "*_test.py", "conftest.py", "*_job.py", "bench_*.py")


def dev_only(path: Path) -> bool:
    if path.name == "bench_cmd.py":  # `eroica bench` (cli/<name>_cmd.py) ships
        return False
    return any(fnmatch.fnmatch(path.name, pattern) for pattern in DEV_ONLY)


def modules(root: Path) -> dict[str, Path]:
    """Every shipped module ``eroica.<pkg>[.<mod>]`` -> its file (packages map to ``__init__.py``)."""
    found: dict[str, Path] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.glob("*.py")):
            if dev_only(path):
                continue
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _imported(tree: ast.AST, module: str, is_package: bool, known: dict[str, Path]) -> list[tuple[str, int]]:
    """Absolute names of the ``eroica`` modules a module imports, with their line."""
    here = module if is_package else module.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                # `from eroica.x import sub` imports module eroica.x.sub when there is one.
                sub = f"{target}.{alias.name}"
                out.append((sub if sub in known else target, node.lineno))
    return [(name, line) for name, line in out if name == NAMESPACE or name.startswith(NAMESPACE + ".")]


def node_of(module: str, known: dict[str, Path], depth: int) -> str:
    """The graph node of a module: its package (a module file belongs to its folder), ``depth`` levels deep."""
    name = module
    while name not in known or known[name].name != "__init__.py":
        if "." not in name:
            break
        name = name.rpartition(".")[0]  # a module file, or a name inside a module: up to its package
    parts = name.split(".")[1:]  # drop the namespace
    return ".".join(parts[:depth])


def _imports(root: Path):  # type: ignore[no-untyped-def]
    """(module, file, imported name, line) for every ``eroica`` import of every shipped module, and the known modules."""
    known = modules(root)
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for target, line in _imported(tree, module, path.name == "__init__.py", known):
            found.append((module, path, target, line))
    return found, known


def import_edges(root: Path, depth: int = 1) -> Edges:
    """Every package -> package import edge between different nodes, with where it comes from."""
    root = Path(root)
    found, known = _imports(root)
    edges: Edges = defaultdict(list)
    for module, path, target, line in found:
        me, other = node_of(module, known, depth), node_of(target, known, depth)
        if other and other != me:
            where = f"{path.relative_to(root)}:{line}"
            if where not in edges[(me, other)]:
                edges[(me, other)].append(where)
    return dict(edges)


def unresolved(root: Path) -> list[str]:
    """Imports of an ``eroica`` module that does not exist (a move that missed an import): ``file:line name``."""
    root = Path(root)
    found, known = _imports(root)
    return [f"{path.relative_to(root)}:{line} {target}" for _, path, target, line in found
            if target != NAMESPACE and target not in known]


def adjacency(edges: Edges) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        out[a].add(b)
    return dict(out)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative), sorted."""
    nodes = sorted(set(graph) | {b for bs in graph.values() for b in bs})
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Edges that do not go down :data:`LAYERS` (nodes of any depth: their top-level package decides)."""
    rank = {package: i for i, layer in enumerate(LAYERS) for package in layer}
    found = [f"{node}: in no layer of LAYERS" for node in sorted({n.split(".")[0] for n in graph}) if node not in rank]
    for a in sorted(graph):
        for b in sorted(graph[a]):
            top_a, top_b = a.split(".")[0], b.split(".")[0]
            if top_a != top_b and top_a in rank and rank.get(top_b, len(LAYERS)) >= rank[top_a]:
                found.append(f"{a} -> {b}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", nargs="?", default=".", type=Path, help="the checkout (holds pyproject.toml)")
    parser.add_argument("depth", nargs="?", default=1, type=int, help="package levels per node (default 1)")
    parser.add_argument("--explain", action="store_true", help="list the imports behind each edge")
    args = parser.parse_args(argv)
    edges = import_edges(args.root, args.depth)
    graph = adjacency(edges)
    for a in sorted(graph):
        print(a, "->", ", ".join(sorted(graph[a])))
        if args.explain:
            for b in sorted(graph[a]):
                print(f"    {b}: {', '.join(edges[(a, b)])}")
    found = cycles(graph)
    print("cycles:", found or "none")
    wrong = layer_violations(graph)
    print("layer violations:", wrong or "none")
    missing = unresolved(args.root)
    print("unresolved imports:", missing or "none")
    return 1 if found or wrong or missing else 0


if __name__ == "__main__":
    sys.exit(main())
