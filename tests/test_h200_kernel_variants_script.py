"""``e2e/h200_kernel_variants.sh prepare`` on the CPU: a variant folder carries every file whose
interface moves with the GDN tree kernel, so that ``run`` times the variant's kernel through the
variant's own entry point (session 14's baseline variant ran an old benchmark against the new
``gdn_tree_verify`` and crashed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
        for f in (
            "sglang_spec/gdn/triton_tree_recurrence.py",
            "sglang_spec/gdn/sglang_verify.py",
            "benchmarks/gdn_tree_recurrence.py",
        ):
            got = subprocess.run(
                ["git", "show", f"{branch}:{f}"], cwd=ROOT, capture_output=True, text=True
            ).stdout
            assert (alt / f).read_text() == got, f
    finally:
        shutil.rmtree(ROOT / "alt", ignore_errors=True)
