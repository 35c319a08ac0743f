"""`sglang-spec patch`: the patch tool on synthetic trees and on the real pinned wheels.

The real-wheel tests download `sglang==<pin>` once into ~/.cache/sglang-spec-wheels
(override: SGLANG_SPEC_WHEEL_CACHE; skipped, saying so, when PyPI cannot be reached), unpack it
under a pytest tmp dir, and run check -> apply -> apply -> check -> import -> revert, then compare
every file of the tree with its pre-apply hash. The import step runs on CPU against the unpacked
pin: every module the series rewrites imports, the patched module's KV reserve, and the plug-in
loaded through SGLang's own `load_plugins()` so that `SpeculativeAlgorithm.from_string("DDTREE")`
resolves, and the plug-in's adapter check (`adapter.missing_internals()`) passing against the pin.
Each pin's wheel is also surveyed again and must give its committed row of patches/support.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import urllib.request
import zipfile
from pathlib import Path

import pytest

from sglang_spec.patching import core, survey, udiff
from sglang_spec.patching import main as patch_main

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches"
PINS = ["0.5.22", "0.5.23"]


# ------------------------------------------------------------------ helpers


def snapshot(root: Path) -> dict[str, str]:
    """rel path -> sha256 of every file under root (bytecode caches excluded)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[p.relative_to(root).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def run_cli(*argv: str, capsys) -> tuple[int, str, str]:
    code = patch_main(list(argv))
    cap = capsys.readouterr()
    return code, cap.out, cap.err


# ------------------------------------------------------------------ synthetic tree

V = "9.9.1"
FILE_A = "sglang/srt/a.py"
FILE_B = "sglang/srt/sub/b.py"
ORIG_A = b"".join(f"line {i}\n".encode() for i in range(1, 21))
ORIG_B = b"alpha\nbeta\ngamma\ndelta\n"  # ends with a newline
PATCH_1 = textwrap.dedent("""\
    # header: changes a.py twice and b.py once
    --- sglang/srt/a.py
    +++ sglang/srt/a.py
    @@ -2,3 +2,3 @@
     line 2
    -line 3
    +LINE THREE
     line 4
    @@ -17,3 +17,4 @@
     line 17
     line 18
    +inserted after 18
     line 19
    --- sglang/srt/sub/b.py
    +++ sglang/srt/sub/b.py
    @@ -3,2 +3,2 @@
     gamma
    -delta
    +delta
    \\ No newline at end of file
    """)
PATCH_2 = textwrap.dedent("""\
    # a second patch on top of the first, on the same file
    --- sglang/srt/a.py
    +++ sglang/srt/a.py
    @@ -1,2 +1,2 @@
    -line 1
    +line one
     line 2
    """)


def expected_a() -> bytes:
    lines = ORIG_A.decode().splitlines(keepends=True)
    lines[0] = "line one\n"
    lines[2] = "LINE THREE\n"
    lines.insert(18, "inserted after 18\n")
    return "".join(lines).encode()


@pytest.fixture
def synth(tmp_path: Path) -> dict:
    """A tiny fake sglang tree plus a patch set for it; returns paths."""
    root = tmp_path / "site"
    (root / "sglang/srt/sub").mkdir(parents=True)
    (root / "sglang/__init__.py").write_bytes(b"")
    (root / "sglang/version.py").write_text(f'__version__ = "{V}"\n')
    (root / FILE_A).write_bytes(ORIG_A)
    (root / FILE_B).write_bytes(ORIG_B)
    (root / FILE_B).chmod(0o640)
    (root / "sglang/srt/untouched.py").write_bytes(b"x = 1\n")
    pdir = tmp_path / "patches"
    (pdir / V).mkdir(parents=True)
    (pdir / V / "0001-one.patch").write_text(PATCH_1)
    (pdir / V / "0002-two.patch").write_text(PATCH_2)
    (pdir / V / "series").write_text("0001-one.patch\n0002-two.patch\n")
    pristine = core.SglangTree(root, "test")
    (pdir / V / core.MANIFEST).write_text(json.dumps(core.build_manifest(pdir, V, pristine)))
    return {"root": root, "pdir": pdir, "before": snapshot(root)}


def test_udiff_applies_exactly_and_reverses():
    fps = udiff.parse(PATCH_1.encode())
    assert [fp.path for fp in fps] == [FILE_A, FILE_B]
    a1 = udiff.apply(ORIG_A, fps[0])
    assert b"LINE THREE\n" in a1 and b"line 3\n" not in a1
    b1 = udiff.apply(ORIG_B, fps[1])
    assert b1 == b"alpha\nbeta\ngamma\ndelta"  # the no-newline marker is honoured
    assert udiff.apply(a1, fps[0].reversed()) == ORIG_A
    assert udiff.apply(b1, fps[1].reversed()) == ORIG_B
    # exact context: one changed context line makes the hunk fail, no fuzz
    with pytest.raises(udiff.PatchError, match="does not match"):
        udiff.apply(ORIG_A.replace(b"line 4\n", b"line 4 \n"), fps[0])


def test_manifest_hashes_match_expected_contents(synth):
    m = json.loads((synth["pdir"] / V / core.MANIFEST).read_text())
    assert m["series"] == ["0001-one.patch", "0002-two.patch"]
    assert m["files"][FILE_A]["original_sha256"] == core.sha256(ORIG_A)
    assert m["files"][FILE_A]["patched_sha256"] == core.sha256(expected_a())
    assert m["files"][FILE_A]["patches"] == ["0001-one.patch", "0002-two.patch"]
    assert m["files"][FILE_B]["patched_sha256"] == core.sha256(b"alpha\nbeta\ngamma\ndelta")


def test_apply_check_idempotent_revert(synth, capsys):
    root, pdir = synth["root"], str(synth["pdir"])
    code, out, _ = run_cli("check", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1 and "state: not applied" in out

    code, out, _ = run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 0 and "rewrote 2 file(s)" in out and FILE_A in out and FILE_B in out
    assert (root / FILE_A).read_bytes() == expected_a()
    assert (root / FILE_B).stat().st_mode & 0o777 == 0o640  # mode preserved

    code, out, _ = run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 0 and "already applied; nothing to do" in out
    assert (root / FILE_A).read_bytes() == expected_a()

    code, out, _ = run_cli(
        "check", "--sglang-dir", str(root / "sglang"), "--patches-dir", pdir, capsys=capsys
    )
    assert code == 0 and "state: applied" in out and "the sglang package itself" in out

    code, out, _ = run_cli(
        "revert", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys
    )
    assert code == 0 and "restored 2 file(s)" in out
    assert snapshot(root) == synth["before"]

    code, out, _ = run_cli(
        "revert", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys
    )
    assert code == 0 and "nothing to revert" in out
    assert snapshot(root) == synth["before"]


def test_unknown_version_refused_with_pin_list(synth, capsys):
    root = synth["root"]
    (root / "sglang/version.py").write_text('__version__ = "0.0.7"\n')
    code, _, err = run_cli(
        "apply", "--sglang-dir", str(root), "--patches-dir", str(PATCHES), capsys=capsys
    )
    assert code == 2
    assert "sglang 0.0.7 is not in the support matrix" in err
    assert f"supported pins: {', '.join(PINS)}" in err
    assert (root / FILE_A).read_bytes() == ORIG_A


@pytest.mark.parametrize("version", ["0.5.9", "0.5.11", "0.5.21"])
@pytest.mark.parametrize("action", ["apply", "check", "revert"])
def test_unsupported_release_refused_with_its_reason(synth, capsys, version, action):
    root = synth["root"]
    (root / "sglang/version.py").write_text(f'__version__ = "{version}"\n')
    before = snapshot(root)
    code, out, err = run_cli(
        action, "--sglang-dir", str(root), "--patches-dir", str(PATCHES), capsys=capsys
    )
    why = core.support_matrix(PATCHES)[version]["why"]
    assert code == 2 and out == ""
    assert err == (
        f"sglang-spec patch {action}: sglang {version} is not supported: {why}; "
        f"supported pins: {', '.join(PINS)} (sglang-spec patch --list)\n"
    )
    assert snapshot(root) == before


def test_list_prints_every_release_of_the_matrix(synth, capsys):
    code, out, _ = run_cli("--list", "--sglang-dir", str(synth["root"]), capsys=capsys)
    matrix = core.support_matrix(PATCHES)
    lines = out.splitlines()
    assert code == 0 and len(lines) == 2 + len(matrix) + 1
    for line, (version, entry) in zip(lines[2:], matrix.items()):
        assert line.split()[:2] == [version, entry["status"].split()[0]]
        assert line.endswith(entry["why"])
    assert lines[-1].startswith(f"this Python's sglang: {V} at ")
    assert lines[-1].endswith("(not in the matrix)")


@pytest.mark.parametrize("argv", [[], ["--list", "apply"]])
def test_list_and_action_are_exclusive(argv, capsys):
    code, _, err = run_cli(*argv, capsys=capsys)
    assert code == 2 and "give one of --list or an action" in err


def test_not_an_sglang_dir_is_usage_error(tmp_path, capsys):
    code, _, err = run_cli("check", "--sglang-dir", str(tmp_path), capsys=capsys)
    assert code == 2 and "is an sglang package" in err


def test_hash_mismatch_refused_without_touching_anything(synth, capsys):
    root, pdir = synth["root"], str(synth["pdir"])
    # someone else edited b.py (the patch would still apply to a.py)
    (root / FILE_B).write_bytes(ORIG_B + b"# local edit\n")
    before = snapshot(root)
    code, out, _ = run_cli("check", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1 and "state: modified by someone else" in out and "modified  " + FILE_B in out
    code, _, err = run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1 and "sha256 mismatch" in err and "nothing was changed" in err
    assert snapshot(root) == before
    code, _, err = run_cli(
        "revert", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys
    )
    assert code == 1 and "refusing to revert" in err
    assert snapshot(root) == before


def test_failure_mid_apply_rolls_back_everything(synth, monkeypatch, capsys):
    root, pdir = synth["root"], str(synth["pdir"])
    real = core._replace_file
    calls = []

    def flaky(path, data):
        calls.append(path)
        if len(calls) == 2:  # the first file has been replaced, the second write fails
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(core, "_replace_file", flaky)
    code, _, err = run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1
    assert "rolled back 1 file(s); the tree is unchanged" in err
    assert len(calls) == 3  # write a, fail on b, restore a
    assert snapshot(root) == synth["before"]
    assert not list(root.rglob("*.sglang-spec.tmp"))
    monkeypatch.setattr(core, "_replace_file", real)
    code, out, _ = run_cli("check", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1 and "state: not applied" in out


def test_partially_applied_is_reported_then_completed_or_reverted(synth, capsys):
    root, pdir = synth["root"], str(synth["pdir"])
    assert run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)[0] == 0
    patched_b = (root / FILE_B).read_bytes()
    (root / FILE_B).write_bytes(ORIG_B)  # b.py restored by hand: a patched, b original
    code, out, _ = run_cli("check", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 1 and "state: partially applied" in out
    assert "patched  " + FILE_A in out and "original  " + FILE_B in out

    code, out, _ = run_cli("apply", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys)
    assert code == 0 and "completed it" in out and "rewrote 1 file(s)" in out
    assert (root / FILE_B).read_bytes() == patched_b and (
        root / FILE_A
    ).read_bytes() == expected_a()

    (root / FILE_B).write_bytes(ORIG_B)
    code, out, _ = run_cli(
        "revert", "--sglang-dir", str(root), "--patches-dir", pdir, capsys=capsys
    )
    assert code == 0 and "restored 1 file(s)" in out
    assert snapshot(root) == synth["before"]


def test_version_read_textually_from_generated_version_file(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang/__init__.py").write_text("raise RuntimeError('must not be imported')\n")
    (tmp_path / "sglang/_version.py").write_text("__version__ = version = '0.5.23'\n")
    tree = core.locate(str(tmp_path))
    assert core.detect_version(tree)[0] == "0.5.23"


def test_committed_manifests_cover_exactly_the_series():
    assert core.supported_versions(PATCHES) == PINS
    for pin in PINS:
        ps = core.load_patch_set(PATCHES, pin)
        series = [
            ln.strip() for ln in (PATCHES / pin / "series").read_text().splitlines() if ln.strip()
        ]
        assert ps.series == series
        for name in ps.series:
            head = (PATCHES / pin / name).read_text().split("\n--- ", 1)[0]
            for section in ("What it changes", "Why a hook cannot", "How it was verified"):
                assert section in head, f"{pin}/{name} header lacks {section!r}"


def test_support_matrix_covers_the_range_and_agrees_with_the_pins():
    """Supported exactly where a patch set exists; every release from 0.5.9 on is listed, and
    the matrix range starts at the first release with both register and DFlashWorkerV2."""
    matrix = core.support_matrix(PATCHES)
    assert [v for v, e in matrix.items() if e["status"] == "supported"] == PINS[::-1]
    for v in PINS:
        assert (
            matrix[v]["unmet"] == []
            and matrix[v]["patches"] == core.load_patch_set(PATCHES, v).series
        )
    hosts = [v for v, e in matrix.items() if "absent" not in (e["register"], e["dflash_worker_v2"])]
    assert hosts[-1] == "0.5.14"
    for required in ("0.5.9", "0.5.11", "0.5.14", "0.5.21"):
        assert matrix[required]["status"] == "not supported" and matrix[required]["unmet"]


# ------------------------------------------------------------------ real wheels


def wheel_cache() -> Path:
    d = Path(os.environ.get("SGLANG_SPEC_WHEEL_CACHE", Path.home() / ".cache/sglang-spec-wheels"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/sglang/", timeout=10).close()
    except OSError:
        return False
    return True


def get_wheel(version: str) -> Path:
    """The cached wheel of ``sglang==version``; downloads it when missing. Skips the test when
    PyPI cannot be reached (a download that fails with PyPI up fails the test)."""
    found = sorted(wheel_cache().glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    if not pypi_reachable():
        pytest.skip(f"sglang=={version} is not cached in {wheel_cache()} and PyPI is unreachable")
    # The pins ship only cp311 manylinux_2_34 wheels; ask for that tag explicitly so the
    # download does not depend on this host's glibc or Python.
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "--platform",
            "manylinux_2_34_x86_64",
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            f"sglang=={version}",
            "-d",
            str(wheel_cache()),
        ],
        capture_output=True,
        text=True,
    )
    found = sorted(wheel_cache().glob(f"sglang-{version}-*.whl"))
    assert r.returncode == 0 and found, f"pip download sglang=={version} failed: {r.stderr[-2000:]}"
    return found[0]


def unpack(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    return dest


def import_in_subprocess(root: Path, code: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Run ``code`` with the unpacked wheel at ``root`` first on the path (this repository's
    sglang_spec next), so neither the venv's sglang nor an installed sglang_spec is used."""
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO}", PYTHONDONTWRITEBYTECODE="1")
    prog = textwrap.dedent(f"""\
        import sglang, sglang_spec
        assert sglang.__file__.startswith({str(root)!r}), sglang.__file__
        assert sglang_spec.__file__.startswith({str(REPO)!r}), sglang_spec.__file__
        """) + textwrap.dedent(code)
    return subprocess.run(
        [sys.executable, "-c", prog],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(root),
    )


# Both pins carry patch 0001 (P3): the reserve prepare_for_decode asks for, with stubbed sizing.
# Unpatched, (width 5, block 16) reserves 2*5 = 10.
P3_CHECK = """\
import types
import sglang.srt.speculative.dflash_info_v2 as m
assert m.__file__.startswith(sglang.__path__[0]), m.__file__

class Captured(Exception):
    pass

def fake_lens(reqs, *, reserve, page_size):
    raise Captured(reserve)

m.page_aligned_decode_alloc_lens = fake_lens
batch = types.SimpleNamespace(
    device="cpu", reqs=[object()], batch_size=lambda: 1, maybe_evict_swa=lambda: None,
    token_to_kv_pool_allocator=types.SimpleNamespace(page_size=1))
out = {}
for width, block in [(16, 16), (16, None), (5, 16), (65, 16)]:
    m.get_spec = lambda w=width, b=block: types.SimpleNamespace(
        speculative_num_draft_tokens=w, speculative_dflash_block_size=b)
    try:
        m.DFlashDraftInputV2.create_idle_input("cpu").prepare_for_decode(batch)
    except Captured as c:
        out[(width, block)] = c.args[0]
assert out == {(16, 16): 32, (16, None): 32, (5, 16): 32, (65, 16): 130}, out
print("P3-OK")
"""

# The plug-in loaded the way SGLang loads it (entry point group sglang.srt.plugins), DDTREE
# resolved by name, and the worker class built on this release's DFlashWorkerV2; every SGLang
# internal the plug-in's adapter names met by this release, and the drafter's TP context entered
# through the adapter with this release's own draft_tp_context (a worker of the release's form
# with no attention-TP split).
PLUGIN_CHECK = """\
from types import SimpleNamespace

from sglang.srt.plugins import load_plugins
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

load_plugins()
algo = SpeculativeAlgorithm.from_string("DDTREE")
assert type(algo).__module__ == "sglang_spec.plugin.algorithm", type(algo)
assert algo.is_dflash_family() and not algo.is_eagle()
worker = algo.factory(None)
assert worker.__name__ == "DDTreeWorker" and issubclass(worker, DFlashWorkerV2), worker.__mro__
print("PLUGIN-OK")

from sglang_spec.plugin import adapter

problems = adapter.missing_internals()
assert not problems, "\\n".join(problems)
try:
    from sglang.srt.configs.draft_parallel import DraftParallelLayout
except ImportError:  # 0.5.22: the worker holds a bool
    drafter = SimpleNamespace(draft_owns_attention=False)
else:
    single = DraftParallelLayout(tp_group=None, attn_tp_size=1)
    drafter = SimpleNamespace(draft_parallel_layout=single)
with adapter.draft_tp_context(drafter) as ctx:
    assert ctx is None, ctx
print("ADAPTER-OK", len(adapter.EXPECTED[adapter.installed_sglang_version()]))
"""


def patched_modules_check(files) -> str:
    """Import every module the series rewrites (from the unpacked pin, patched)."""
    mods = sorted(rel.removesuffix(".py").replace("/", ".") for rel in files)
    return textwrap.dedent(f"""\
        import importlib
        for name in {mods!r}:
            m = importlib.import_module(name)
            assert m.__file__.startswith(sglang.__path__[0]), m.__file__
        print("MODULES-OK", {len(mods)})
        """)


@pytest.mark.parametrize("version", PINS)
def test_real_wheel_apply_check_import_revert(version, tmp_path, capsys):
    wheel = get_wheel(version)
    # The committed matrix row is what the survey reads in this wheel.
    entry = survey.support_document([survey.survey_release(wheel, PATCHES)])["releases"][version]
    assert entry == core.support_matrix(PATCHES)[version]

    root = unpack(wheel, tmp_path / "wheel")
    before = snapshot(root)
    args = ["--sglang-dir", str(root), "--patches-dir", str(PATCHES)]

    code, out, _ = run_cli("check", *args, capsys=capsys)
    assert code == 1 and f"sglang {version}" in out and "state: not applied" in out
    code, out, _ = run_cli("apply", *args, capsys=capsys)
    assert code == 0, out
    ps = core.load_patch_set(PATCHES, version)
    for rel, h in ps.files.items():
        assert core.sha256((root / rel).read_bytes()) == h["patched_sha256"]
        assert rel in out
    code, out, _ = run_cli("apply", *args, capsys=capsys)
    assert code == 0 and "already applied" in out
    code, out, _ = run_cli("check", *args, capsys=capsys)
    assert code == 0 and "state: applied" in out

    r = import_in_subprocess(root, patched_modules_check(ps.files) + P3_CHECK + PLUGIN_CHECK)
    ok = all(f"{w}-OK" in r.stdout for w in ("MODULES", "P3", "PLUGIN", "ADAPTER"))
    assert r.returncode == 0 and ok, r.stdout[-2000:] + r.stderr[-3000:]

    code, out, _ = run_cli("revert", *args, capsys=capsys)
    assert code == 0 and "restored" in out
    assert snapshot(root) == before
    code, out, _ = run_cli("check", *args, capsys=capsys)
    assert code == 1 and "state: not applied" in out
