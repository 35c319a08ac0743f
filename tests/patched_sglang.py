"""A patched copy of a pinned SGLang for tests, with the project's patch series for that release
applied by ``sglang_spec.patching.core.apply``. For the installed release it is a symlink tree of
the installed ``sglang`` package (directories real, files links; ``apply`` replaces the patched files
by real ones and leaves the installed package untouched); for another pin it is the ``sglang/`` of
that release's wheel (``test_patching.get_wheel``: cached, downloaded once, skipped without PyPI).
The released files the series rewrites are kept under ``pristine/``. Import from the copy in a
child process with it first on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from sglang_spec.patching import core

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "patches"
GDN_TREE_PINS = ["0.5.22", "0.5.23"]  # the pins whose series carries the GDN tree patches


def installed_sglang() -> Path:
    """The installed ``sglang`` package directory (found without importing it)."""
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0])


def gdn_fold(version: str) -> str:
    """The ReplaySSM fold kernel file the series patches (``kernels/ops/attention/linear/`` in
    0.5.23, ``.../fla/`` in 0.5.22), relative to the copy's root."""
    (rel,) = [
        f
        for f in core.load_patch_set(PATCHES, version).files
        if f.endswith("/gdn_replayssm_spec_fold.py")
    ]
    return rel


def patched_copy(root: Path, version: str | None = None, patches: Path = PATCHES) -> Path:
    """Build the patched copy of ``version`` (default: the installed release) under ``root``
    (which then contains ``sglang/`` and ``pristine/sglang/...``), with the series of the
    per-version patch sets in ``patches`` (default: this checkout's); returns ``root``."""
    src = installed_sglang()
    installed = core.detect_version(core.locate(str(src)))[0]  # a real sglang package
    if version is None or version == installed:
        for d, _dirs, files in os.walk(src):
            rel = Path(d).relative_to(src.parent)
            (root / rel).mkdir(exist_ok=True)
            for f in files:
                os.symlink(Path(d) / f, root / rel / f)
    else:
        from test_patching import get_wheel

        with zipfile.ZipFile(get_wheel(version)) as zf:
            zf.extractall(root, members=[m for m in zf.namelist() if m.startswith("sglang/")])
    version = core.detect_version(core.locate(str(root)))[0]
    for rel in core.load_patch_set(patches, version).files:
        (root / "pristine" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / rel, root / "pristine" / rel)
    res = core.apply(str(root), patches)
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


def publish_tiny_ddtree(*args: str):
    """For a child process: register the DDTREE plug-in and publish a tiny-hybrid DDTREE server's
    configuration as ``launch_server`` does (``prepare_server_args``, ``resolve_once``,
    ``set_server_args``; publishing is process-wide), with SGLang's GPU platform check for
    ``extra_buffer`` answered as on CUDA, and no ``--page-size`` (as ``e2e.tiny_pair`` serves: the raw
    record's is None, the resolved one 1). ``args``: the server's further flags. Returns its
    ServerArgs."""
    import sglang.srt.arg_groups.mamba_hook as mamba_hook
    from sglang.srt.runtime_context import get_context
    from sglang.srt.server_args import prepare_server_args

    from sglang_spec.plugin.algorithm import register

    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True
    register()
    fixtures = REPO / "sglang_spec/fixtures/tiny-pair"
    sa = prepare_server_args(
        ["--model-path", str(fixtures / "hybrid"), "--device", "cuda"]
        + ["--speculative-algorithm", "DDTREE"]
        + ["--speculative-draft-model-path", str(fixtures / "hybrid-dflash")]
        + ["--attention-backend", "triton", *args]
    )
    sa.resolve_once()
    get_context().set_server_args(sa)
    return sa
