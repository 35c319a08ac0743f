"""No import cycles in the project's packages (issue 11, item 5), read from the source with the
walker of tests/import_graph.py, which is itself checked here on small packages."""

from __future__ import annotations

from pathlib import Path

from import_graph import import_cycles

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ["sglang_spec", "e2e", "benchmarks", "loadtests", "training"]


def test_project_packages_have_no_import_cycle():
    # One graph over all of them, so a cycle across two packages counts too.
    assert import_cycles(ROOT, PACKAGES) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_import_cycles_finds_a_lazy_cycle(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .b import f\n",
            "pkg/b.py": "def f():\n    from .a import g\n",
            "pkg/c.py": "import pkg.a\n",
        },
    )
    assert import_cycles(tmp_path, ["pkg"]) == [["pkg.a", "pkg.b", "pkg.a"]]


def test_import_cycles_counts_a_submodule_imported_through_its_package(tmp_path):
    # `from pkg import sub` runs pkg/__init__.py, which imports the module doing it: a cycle;
    # `import pkg.sub as sub` is the same module without the edge to the package.
    files = {"pkg/__init__.py": "from pkg.a import f\n", "pkg/sub.py": ""}
    _write(tmp_path, {**files, "pkg/a.py": "from pkg import sub\n"})
    assert import_cycles(tmp_path, ["pkg"]) == [["pkg", "pkg.a", "pkg"]]
    _write(tmp_path, {"pkg/a.py": "import pkg.sub as sub\n"})
    assert import_cycles(tmp_path, ["pkg"]) == []


def test_import_cycles_sees_a_cycle_across_packages(tmp_path):
    _write(tmp_path, {"p/__init__.py": "", "p/x.py": "import q.y\n", "q/__init__.py": ""})
    _write(tmp_path, {"q/y.py": "def f():\n    from p.x import g\n"})
    assert import_cycles(tmp_path, ["p", "q"]) == [["p.x", "q.y", "p.x"]]
