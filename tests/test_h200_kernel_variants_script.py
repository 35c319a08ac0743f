"""``e2e/h200_kernel_variants.sh prepare`` on the CPU: a variant folder carries every file whose
interface moves with the GDN tree kernel, so that ``run`` times the variant's kernel through the
variant's own entry point (session 14's baseline variant ran an old benchmark against the new
``gdn_tree_verify`` and crashed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what a variant replaces: the kernels, their verify entry point and the benchmark
FILES = (
    "sglang_spec/gdn/triton_tree_recurrence.py",
    "sglang_spec/gdn/triton_tree_wy.py",
    "sglang_spec/gdn/triton_tree_conv.py",
    "sglang_spec/gdn/sglang_verify.py",
    "benchmarks/gdn_tree_recurrence.py",
)


def test_prepare_copies_the_kernel_its_verify_entry_point_and_the_benchmark():
    branch = "HEAD"
    alt = ROOT / "alt" / branch
    assert not alt.exists(), f"{alt} is in the way"
    try:
        out = subprocess.run(
            ["bash", "e2e/h200_kernel_variants.sh", "prepare", branch],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        for f in FILES:
            got = subprocess.run(
                ["git", "show", f"{branch}:{f}"], cwd=ROOT, capture_output=True, text=True
            ).stdout
            assert (alt / f).read_text() == got, f
    finally:
        shutil.rmtree(ROOT / "alt", ignore_errors=True)


def test_prepare_refuses_a_variant_named_checkout():
    """The checked-out tree is variant ``checkout``: a branch of that name would share its results."""
    out = subprocess.run(
        ["bash", "e2e/h200_kernel_variants.sh", "prepare", "checkout"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "is the checked-out tree" in out.stdout
    assert not (ROOT / "alt" / "checkout").exists()


def _pick(
    tmp_path: Path,
    times: dict[str, float | None],
    wy_us: dict[str, float] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.CompletedProcess, Path]:
    """Run ``pick 1 64`` in a copy of the script's tree: every variant's files hold its name; a
    variant's time ``None`` marks its row's checks as failed."""
    import json

    tree = tmp_path / "tree"
    (tree / "e2e").mkdir(parents=True)
    shutil.copy(ROOT / "e2e" / "h200_kernel_variants.sh", tree / "e2e")
    out = tmp_path / "out"
    out.mkdir()
    for name, us in times.items():
        base = tree if name == "checkout" else tree / "alt" / name
        for f in FILES:
            (base / f).parent.mkdir(parents=True, exist_ok=True)
            (base / f).write_text(name)
        rows = [
            dict(bs=1, N=64, fused_us=us if us is not None else 1.0, ok=us is not None),
            dict(bs=8, N=64, fused_us=0.5, ok=True),  # another cell: not the one picked on
        ]
        if name in (wy_us or {}):
            rows[0]["wy_fused_us"] = wy_us[name]
        (out / f"{name}.json").write_text(json.dumps(dict(rows=rows)))
    proc = subprocess.run(
        ["bash", str(tree / "e2e" / "h200_kernel_variants.sh"), "pick", "1", "64"],
        env={"OUT": str(out), "PATH": "/usr/bin:/bin", **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc, tree


def test_pick_checks_out_the_fastest_variant_with_passing_checks(tmp_path):
    proc, tree = _pick(tmp_path, {"checkout": 80.0, "walk": 70.0, "level": None})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fastest (fused_us) at bs 1, N 64: walk" in proc.stdout
    assert (tree / "sglang_spec/gdn/triton_tree_recurrence.py").read_text() == "walk"
    assert (tree / "benchmarks/gdn_tree_recurrence.py").read_text() == "walk"


def test_pick_leaves_the_checkout_when_it_is_fastest(tmp_path):
    """Also when a variant is main's kernel (alt/main/): session 16 timed the checked-out
    candidate against ``prepare main``, both were called main, the second run's results replaced
    the first's, and pick could not tell them apart."""
    proc, tree = _pick(tmp_path, {"checkout": 60.0, "main": 70.0})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fastest (fused_us) at bs 1, N 64: checkout" in proc.stdout
    assert (tree / "sglang_spec/gdn/sglang_verify.py").read_text() == "checkout"
    proc, tree = _pick(tmp_path / "2", {"checkout": 80.0, "main": 70.0})
    assert "fastest (fused_us) at bs 1, N 64: main" in proc.stdout
    assert (tree / "sglang_spec/gdn/sglang_verify.py").read_text() == "main"


def test_pick_compares_the_time_pick_time_names(tmp_path):
    """PICK_TIME=wy_fused_us: the WY verify's time decides (the walk's fused time would pick
    another variant); a variant whose rows lack that time does not count."""
    proc, tree = _pick(
        tmp_path,
        {"checkout": 60.0, "wy": 70.0, "old": 50.0},
        wy_us={"checkout": 40.0, "wy": 30.0},
        env={"PICK_TIME": "wy_fused_us"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fastest (wy_fused_us) at bs 1, N 64: wy" in proc.stdout
    assert (tree / "sglang_spec/gdn/triton_tree_wy.py").read_text() == "wy"


def test_pick_refuses_when_no_variant_timed_the_cell(tmp_path):
    proc, _ = _pick(tmp_path, {"checkout": None, "walk": None})
    assert proc.returncode == 2
    assert "no variant" in proc.stderr and "bs 1, N 64" in proc.stderr


FAKE_BENCH = """
import json, pathlib, sys
files = [pathlib.Path(f).read_text() for f in {files!r}]
assert len(set(files)) == 1, files  # the variant's three files travel together
name = files[0]
us = {times!r}[name]
out = sys.argv[sys.argv.index("--json") + 1]
rows = [dict(bs=1, N=64, fused_us=us, ok=True)]
pathlib.Path(out).write_text(json.dumps(dict(variant=name, rows=rows)))
print(f"| 1 | 64 | {{us}} |")
"""


def test_run_times_each_variant_on_its_own_files_and_pick_keeps_the_fastest(tmp_path):
    """``run`` on the CPU with a stand-in benchmark: the checked-out files are timed as
    ``checkout`` and each ``alt/<branch>/`` on its own files, one result file each, even when a
    branch is called main (session 16: the checkout was also called main, the second run's
    results replaced the first's); the tracked files are restored; ``pick`` then checks out the
    fastest."""
    import json

    times = {"checkout": 87.3, "main": 75.2, "level": 90.0}
    tree = tmp_path / "tree"
    (tree / "e2e").mkdir(parents=True)
    shutil.copy(ROOT / "e2e" / "h200_kernel_variants.sh", tree / "e2e")
    for name in times:
        base = tree if name == "checkout" else tree / "alt" / name
        for f in FILES:
            (base / f).parent.mkdir(parents=True, exist_ok=True)
            (base / f).write_text(name)
    bench = tmp_path / "fake_bench.py"
    bench.write_text(FAKE_BENCH.format(files=FILES, times=times))
    python = tmp_path / "python"  # the benchmark's interpreter; pick's inline script passes through
    python.write_text(
        f'#!/bin/sh\n[ "$1" = - ] && exec {sys.executable} "$@"\nshift\n'
        f'exec {sys.executable} {bench} "$@"\n'
    )
    python.chmod(0o755)
    out = tmp_path / "out"
    env = {"OUT": str(out), "PATH": "/usr/bin:/bin", "SGLANG_KIT_PYTHON": str(python)}
    script = str(tree / "e2e" / "h200_kernel_variants.sh")
    run = subprocess.run(
        ["bash", script, "run"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for name, us in times.items():
        got = json.loads((out / f"{name}.json").read_text())
        assert got["variant"] == name and got["rows"][0]["fused_us"] == us
    assert {f.stem for f in out.glob("*.json")} == set(times)
    assert all((tree / f).read_text() == "checkout" for f in FILES)  # restored
    pick = subprocess.run(
        ["bash", script, "pick", "1", "64"], cwd=tree, env=env, capture_output=True, text=True
    )
    assert pick.returncode == 0 and "fastest (fused_us) at bs 1, N 64: main" in pick.stdout, (
        pick.stderr
    )
    assert all((tree / f).read_text() == "main" for f in FILES)
