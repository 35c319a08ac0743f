"""Shared by the tests: the import graph of packages, read from the source (nothing is imported).

Every import statement counts, function-level ones too: a lazy import still closes a cycle once
both modules are loaded. ``from pkg import name`` is an edge to ``pkg`` itself (importing it runs
``pkg/__init__.py``) and to ``pkg.name`` if that is a module; ``import a.b`` is an edge to ``a.b``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, list[str]]:
    """Module name -> the modules (of ``packages``, all under ``root``) it imports."""
    modules = {}
    for package in packages:
        for f in (root / package).rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    graph = {}
    for name, f in modules.items():
        here = name if f.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom):
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                target = ".".join(
                    (up if node.level else []) + ([node.module] if node.module else [])
                )
                deps |= {target} | {f"{target}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = sorted(d for d in deps if d in modules and d != name)
    return graph


def import_cycles(root: Path, packages: Iterable[str]) -> list[list[str]]:
    """Cycles among the modules of ``packages`` (one per back edge of a depth-first walk, so the
    list is empty exactly when the graph has no cycle), each as ``[a, b, ..., a]``."""
    graph = import_graph(root, packages)
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for d in graph[m]:
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d) :] + [m, d])
            elif d not in state:
                visit(d, stack + [m])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles
