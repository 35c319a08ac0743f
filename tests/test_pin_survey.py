"""`python -m sglang_spec.patching.survey`: how each SGLang internal is looked up in a release's
source, and how a release's support status follows. Synthetic trees here; the real wheels are
surveyed in tests/test_patching.py (the committed patches/support.json must match them)."""

from __future__ import annotations

import json
import textwrap
import zipfile
from pathlib import Path

import pytest

from sglang_spec.patching import core, survey
from sglang_spec.patching.survey import Need, Resolver, Source

V = "9.9.1"

MODULES = {
    "sglang/__init__.py": "",
    "sglang/version.py": f'__version__ = "{V}"\n',
    "sglang/a.py": """\
        from dataclasses import dataclass
        from typing import TYPE_CHECKING

        from sglang.b import Impl as Exported
        from .c import *

        if TYPE_CHECKING:
            from sglang.b import Hidden


        class Base:
            def __init__(self):
                self.from_base = 1

            def inherited(self, x):
                return x


        class Child(Base):
            field: int = 0

            def __init__(self, a, b, *, key=None):
                self.attr = a

            def method(self, p, q, *, kw1):
                return p

            def flexible(self, *args, **kwargs):
                return args


        @dataclass
        class Rec:
            x: int
            y: int
        """,
    "sglang/b.py": """\
        class Impl:
            pass

        Hidden = 1
        """,
    "sglang/c.py": """\
        def starred(u, v):
            return u
        """,
    "sglang/pkg/__init__.py": "from .inner import deep\n",
    "sglang/pkg/inner.py": "def deep():\n    return 1\n",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "site"
    for rel, text in MODULES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    return root


def where(res: Resolver, target: str) -> str:
    found, why = res.resolve(target)
    return f"{found.file}:{found.line}" if found else f"MISSING: {why}"


def test_lookup_follows_reexports_and_star_imports_not_type_checking(tree):
    res = Resolver(Source(tree))
    assert where(res, "sglang.a:Exported") == "sglang/b.py:1"  # `from b import Impl as Exported`
    assert where(res, "sglang.a:starred") == "sglang/c.py:1"  # `from .c import *`
    assert where(res, "sglang.pkg:deep") == "sglang/pkg/inner.py:1"  # relative, in a package
    hidden = where(res, "sglang.a:Hidden")  # imported for annotations only: absent at run time
    assert hidden == "MISSING: Hidden not in sglang/a.py"
    assert where(res, "sglang.nope:x") == "MISSING: no module sglang.nope"
    # alternatives: the first that exists
    assert where(res, "sglang.a:Nope | sglang.c:starred") == "sglang/c.py:1"


def test_lookup_of_class_members_and_bases(tree):
    res = Resolver(Source(tree))
    assert where(res, "sglang.a:Child.field") == "sglang/a.py:20"  # class-body field
    assert where(res, "sglang.a:Child.attr") == "sglang/a.py:23"  # self.attr = ... in a method
    assert where(res, "sglang.a:Child.method") == "sglang/a.py:25"
    assert where(res, "sglang.a:Child.from_base") == "sglang/a.py:13"  # set in Base.__init__
    assert where(res, "sglang.a:Child.inherited") == "sglang/a.py:15"  # Base's method
    found, why = res.resolve("sglang.a:Child.inherited", own=True)  # an override is required
    assert found is None and why == "Child.inherited not in sglang/a.py (class at line 19)"
    assert res.resolve("sglang.a:Child.method", own=True)[0].line == 25
    assert where(res, "sglang.a:Child.nope") == (
        "MISSING: Child.nope not in sglang/a.py (class at line 19)"
    )
    assert where(res, "sglang.c:starred.x") == "MISSING: sglang/c.py:1 is not a class"


@pytest.mark.parametrize(
    "target, kw, npos, problem",
    [
        ("sglang.a:Child.method", ("kw1", "q"), 2, ""),
        ("sglang.a:Child.method", ("kw2",), 0, "no keyword(s) kw2; signature (p, q, *, kw1)"),
        ("sglang.a:Child.method", (), 3, "takes 2 positional, the plug-in passes 3"),
        ("sglang.a:Child.flexible", ("anything",), 9, ""),  # *args, **kwargs
        ("sglang.a:Child", ("key",), 2, ""),  # a class: its __init__
        ("sglang.a:Child", ("nokey",), 0, "no keyword(s) nokey"),
        ("sglang.a:Rec", ("x", "y"), 0, ""),  # a dataclass: its fields
        ("sglang.a:Rec", ("x", "z"), 0, "no field(s) z"),
    ],
)
def test_signature_check(tree, target, kw, npos, problem):
    f = survey.check_need(Resolver(Source(tree)), Need("batch", target, "test", kw, npos))
    assert f.ok == (problem == "")
    assert f.detail.startswith(problem) if problem else f.detail == ""


def test_wheel_and_directory_read_the_same(tree, tmp_path):
    whl = tmp_path / f"sglang-{V}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for rel in MODULES:
            zf.write(tree / rel, rel)
        zf.writestr(f"sglang-{V}.dist-info/METADATA", f"Name: sglang\nVersion: {V}\n")
    assert Source(whl).version() == Source(tree).version() == V
    for target in ("sglang.a:Child.from_base", "sglang.a:starred", "sglang.a:Hidden"):
        assert where(Resolver(Source(whl)), target) == where(Resolver(Source(tree)), target)


# ------------------------------------------------------------------ status of a release

PATCH = """\
# adds a function the plug-in needs
--- sglang/c.py
+++ sglang/c.py
@@ -1,2 +1,6 @@
 def starred(u, v):
     return u
+
+
+def patched_in(w):
+    return w
"""


@pytest.fixture
def synthetic_needs(monkeypatch):
    """The survey's needs and its two bounding needs replaced by ones on the synthetic tree;
    sglang.c:patched_in exists only once the pin's patch is applied."""
    monkeypatch.setattr(survey, "REGISTER", "sglang.a:Child")
    monkeypatch.setattr(survey, "WORKER_V2", "sglang.a:Base")
    monkeypatch.setattr(
        survey,
        "NEEDS",
        (
            Need("registry", "sglang.a:Child", "bound"),
            Need("dflash_v2", "sglang.a:Base", "bound"),
            Need("batch", "sglang.c:patched_in", "only there once patched", npos=1),
        ),
    )
    monkeypatch.setattr(survey, "ADAPTED", {})


@pytest.fixture
def pin(tree, tmp_path, synthetic_needs) -> Path:  # noqa: ARG001  (needs the synthetic needs)
    """A patches dir in which V is a pin whose patch adds sglang.c:patched_in."""
    pdir = tmp_path / "patches"
    (pdir / V).mkdir(parents=True)
    (pdir / V / "0001-add.patch").write_text(PATCH)
    (pdir / V / "series").write_text("0001-add.patch\n")
    manifest = core.build_manifest(pdir, V, core.SglangTree(tree, "test"))
    (pdir / V / core.MANIFEST).write_text(json.dumps(manifest))
    return pdir


def test_pin_is_surveyed_with_its_patches_applied(tree, pin):
    before = (tree / "sglang/c.py").read_bytes()
    r = survey.survey_release(tree, pin)
    assert (r["status"], r["needs_met"], r["unmet"]) == ("supported", 3, [])
    assert r["why"] == f"pin: patches/{V} (0001-add.patch)"
    assert r["register"] == "sglang/a.py:19" and r["dflash_worker_v2"] == "sglang/a.py:11"
    assert (tree / "sglang/c.py").read_bytes() == before  # applied in memory only


@pytest.mark.usefixtures("synthetic_needs")
def test_release_without_a_patch_set_is_not_supported(tree, tmp_path):
    r = survey.survey_release(tree, tmp_path / "no-patches")
    assert r["status"] == "not supported"
    assert r["unmet"] == [
        {
            "group": "batch",
            "need": "sglang.c:patched_in",
            "where": "",
            "detail": "patched_in not in sglang/c.py",
        }
    ]
    assert r["why"] == (
        "1 internal(s) the plug-in uses are missing or changed: patched_in "
        "(1 of 3 needs unmet, in batch)"
    )


def test_adapted_need_counts_only_in_the_form_recorded_for_that_release(tree, pin, monkeypatch):
    renamed = Need("dflash_v2", "sglang.a:Child.new_name", "0.5.23 form")
    monkeypatch.setattr(survey, "NEEDS", (*survey.NEEDS, renamed))
    r = survey.survey_release(tree, pin)
    assert r["status"] == "not supported" and r["why"].startswith("BROKEN PIN: ")
    alt = Need("dflash_v2", "sglang.a:Child.attr", "this release's form")
    monkeypatch.setattr(survey, "ADAPTED", {V: {renamed.target: alt}})
    r = survey.survey_release(tree, pin)
    assert r["status"] == "supported" and r["unmet"] == []
    assert r["adapted"] == [
        {
            "need": "sglang.a:Child.new_name",
            "has": "sglang.a:Child.attr",
            "where": "sglang/a.py:23",
            "note": "this release's form",
        }
    ]
    assert "adapter takes this release's form of Child.new_name" in r["why"]
    # the recorded form must itself exist in the release
    monkeypatch.setattr(
        survey, "ADAPTED", {V: {renamed.target: Need("dflash_v2", "sglang.a:Child.gone", "x")}}
    )
    assert survey.survey_release(tree, pin)["status"] == "not supported"


@pytest.mark.usefixtures("synthetic_needs")
def test_release_without_register_or_worker_says_so(tree, monkeypatch, tmp_path):
    monkeypatch.setattr(survey, "REGISTER", "sglang.a:Missing")
    monkeypatch.setattr(survey, "NEEDS", (*survey.NEEDS, Need("registry", "sglang.a:Missing", "")))
    r = survey.survey_release(tree, tmp_path / "no-patches")
    assert r["register"] == "absent" and r["dflash_worker_v2"] == "sglang/a.py:11"
    assert r["why"].startswith("no SpeculativeAlgorithm.register (2 of 4 needs unmet")


def test_support_document_groups_an_absent_module_on_one_line():
    unmet = [
        {"group": "g", "need": "m.x:A", "where": "", "detail": "no module m.x"},
        {"group": "g", "need": "m.y:f", "where": "m/y.py:3", "detail": "no keyword(s) k"},
        {"group": "g", "need": "m.x:B.c", "where": "", "detail": "no module m.x"},
        {"group": "g", "need": "m.z:C.d", "where": "", "detail": "C.d not in m/z.py"},
    ]
    assert survey.compact_unmet(unmet) == [
        "no module m.x (A, B.c)",
        "f [m/y.py:3]: no keyword(s) k",
        "C.d not in m/z.py",
    ]


def test_cli_rejects_a_source_that_is_not_a_wheel_or_tree(tmp_path, capsys):
    bogus = tmp_path / "sglang.tar.gz"
    bogus.write_bytes(b"")
    with pytest.raises(SystemExit) as e:
        survey.main([str(bogus)])
    assert e.value.code == 2
    assert f"{bogus}: not a .whl file or a directory" in capsys.readouterr().err
