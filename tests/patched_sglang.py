"""A patched copy of the installed SGLang for tests: a symlink tree of the installed ``sglang``
package (directories real, files links) with the project's patch series for that release applied
by ``sglang_spec.patching.core.apply``, which replaces the patched files by real ones and leaves the
installed package untouched. Import from it in a child process with the copy first on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from sglang_spec.patching import core

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches"


def installed_sglang() -> Path:
    """The installed ``sglang`` package directory (found without importing it)."""
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def patched_copy(root: Path) -> Path:
    """Build the patched copy under ``root`` (which then contains ``sglang/``); returns ``root``."""
    src = installed_sglang()
    core.locate(str(src))  # a real sglang package
    for d, _dirs, files in os.walk(src):
        rel = Path(d).relative_to(src.parent)
        (root / rel).mkdir(exist_ok=True)
        for f in files:
            os.symlink(Path(d) / f, root / rel / f)
    res = core.apply(str(root), PATCHES)
    assert res.code == 0, res.lines
    return root


def run_cases(root: Path, script: str, *args: str, timeout: int = 900):
    """Run ``tests/<script>`` in a child process that imports SGLang from the patched copy
    ``root`` (Triton under its CPU interpreter), with ``args`` and the output path it must
    ``torch.save`` to appended; returns what it saved."""
    import torch

    out = root / "out.pt"
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=f"{root}{os.pathsep}{REPO}")
    r = subprocess.run(
        [sys.executable, str(REPO / "tests" / script), *args, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO),
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return torch.load(out, weights_only=False)
