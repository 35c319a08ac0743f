"""Run an ``e2e/h200_*.sh`` device script on the CPU with a stand-in for the kit's Python.

The stand-in answers the scripts' ``-c`` probes (``torch.cuda.device_count()``: ``gpus``;
``kit.apply_patches()``: logs ``apply``, exits ``STUB_APPLY_RC``) and logs every other command as
``CUDA=<CUDA_VISIBLE_DEVICES> NVLS=<NCCL_NVLS_ENABLE> <argv>`` (``unset`` where unset), failing the
one whose module (``-m X``) is ``STUB_FAIL``. Compile caches go to ``tmp_path``, none is restored.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STUB = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then
  case "$2" in
    *device_count*) echo "$STUB_GPUS"; exit 0 ;;
    *apply_patches*) echo "apply" >> "$STUB_CALLS"; exit "${STUB_APPLY_RC:-0}" ;;
  esac
  echo "unexpected -c: $2" >&2; exit 3
fi
sleep 0.2
echo "CUDA=${CUDA_VISIBLE_DEVICES-unset} NVLS=${NCCL_NVLS_ENABLE-unset} $*" >> "$STUB_CALLS"
[ "$2" != "${STUB_FAIL:-none}" ]
"""
UNSET = ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE")


def run_script(script: str, tmp_path: Path, gpus: int, **env) -> tuple[int, list[str]]:
    """``bash e2e/<script>`` from the repo root: (exit status, the logged calls in order)."""
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    calls = tmp_path / "calls"
    full = {
        **{k: v for k, v in os.environ.items() if k not in UNSET},
        "SGLANG_KIT_PYTHON": str(stub),
        "STUB_CALLS": str(calls),
        "STUB_GPUS": str(gpus),
        "OUT": str(tmp_path / "out"),
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "SGLANG_JIT_CACHE_DIR": str(tmp_path / "jit"),
        "COMPILE_CACHE": str(tmp_path / "no-cache.tar.xz"),
        **env,
    }
    proc = subprocess.run(
        ["bash", f"e2e/{script}"], cwd=REPO, env=full, capture_output=True, text=True
    )
    return proc.returncode, calls.read_text().splitlines() if calls.exists() else []
