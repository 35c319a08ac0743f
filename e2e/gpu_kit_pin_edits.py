"""GPU-kit edits for a pinned SGLang other than 0.5.23 (the kit, ``shared/sglang-gpu-kit``, is
verified for 0.5.23; ``SGLANG_VERSION=0.5.22 bash prepare.sh`` builds one for 0.5.22, whose own
``edits.py`` then reports ``renorm.py`` as not found).

The H200 has neither flashinfer nor sgl_kernel; the kit brings a headers-only flashinfer that
refuses to import and a pure-torch ``sgl_kernel`` shim. SGLang 0.5.23 imports flashinfer lazily;
0.5.22 imports it at module level on CUDA in four places on the server's path, and needs one
``sgl_kernel`` name the shim lacks. These edits take those imports out of the kit's throwaway
copy (never a real install); the paths they serve are unused with the kit's flags
(``--sampling-backend pytorch``, Triton attention, no FP8 / GGUF / vision):

    python e2e/gpu_kit_pin_edits.py /tmp/gpukit/site       # after `source .gpu-kit/setup.sh`

``--cpu-import-check SHIM`` (on a CPU machine, before spending device time) instead imports the
server's modules from SITE as the kit would on the H200: ``torch.cuda`` reports an H200, SHIM (the
kit's ``shim/`` directory) provides ``sgl_kernel``, flashinfer refuses to import. It prints OK or
the first failing import; exit 1 if one fails.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

KIT = "  # sglang-spec gpu-kit pin edit"
EDITS = {
    "0.5.22": [
        (
            "sglang/srt/layers/quantization/fp8_utils.py",
            "    from flashinfer import bmm_fp8 as _raw_bmm_fp8_batched\n",
            f"    _raw_bmm_fp8_batched = None{KIT}: no flashinfer\n",
        ),
        (
            "sglang/srt/layers/sampler.py",
            "if is_cuda():\n    from flashinfer.sampling import (\n"
            "        min_p_sampling_from_probs,\n        top_k_top_p_sampling_from_probs,\n    )\n",
            f"if is_cuda():{KIT}: flashinfer sampling unused with --sampling-backend pytorch\n",
        ),
        (
            "sglang/srt/layers/attention/vision.py",
            "    from flashinfer.prefill import cudnn_batch_prefill_with_kv_cache\n",
            f"    cudnn_batch_prefill_with_kv_cache = None{KIT}: no flashinfer\n",
        ),
        (
            "sglang/srt/speculative/dflash_utils.py",
            "    from flashinfer.sampling import top_k_renorm_probs as top_k_renorm_prob\n"
            "    from flashinfer.sampling import top_p_renorm_probs as top_p_renorm_prob\n",
            "    from sglang.kernels.ops.sampling.renorm_triton import (\n"
            f"        top_k_renorm_probs_triton as top_k_renorm_prob,{KIT}: Triton renorm\n"
            "        top_p_renorm_probs_triton as top_p_renorm_prob,\n    )\n",
        ),
        (
            "sglang/srt/layers/quantization/gguf.py",
            "    from sgl_kernel import moe_align_block_size, moe_sum\n",
            f"    from sgl_kernel import moe_sum{KIT}: the shim has no moe_align_block_size\n",
        ),
        (  # eagle_sample's T > 0 renorm (DDTREE's walk), imported inside the function
            "sglang/srt/speculative/eagle_utils.py",
            "        elif _is_cuda:\n"
            "            from flashinfer.sampling import top_k_renorm_probs as top_k_renorm_prob\n"
            "            from flashinfer.sampling import top_p_renorm_probs as top_p_renorm_prob\n",
            f"        elif _is_cuda:{KIT}: Triton renorm\n"
            "            from sglang.kernels.ops.sampling.renorm_triton import (\n"
            "                top_k_renorm_probs_triton as top_k_renorm_prob,\n"
            "                top_p_renorm_probs_triton as top_p_renorm_prob,\n"
            "            )\n",
        ),
    ],
}

# What a DFLASH-family server on the tiny pair imports (plus the model classes it resolves).
SERVER_MODULES = (
    "sglang.launch_server",
    "sglang.srt.managers.scheduler",
    "sglang.srt.model_executor.model_runner",
    "sglang.srt.layers.sampler",
    "sglang.srt.speculative.dflash_worker_v2",
    "sglang.srt.speculative.eagle_utils",
    "sglang.srt.models.qwen3_5_text",
    "sglang.srt.models.qwen3",
    "sglang.srt.models.dflash",
)

PRETEND_H200 = """\
import importlib, sys, torch
torch.cuda.is_available = lambda: True
torch.version.cuda = "13.0"
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
torch.cuda.get_device_name = lambda *a, **k: "NVIDIA H200"
for m in sys.argv[1:]:  # a failed import leaves sglang half-imported: stop at the first
    try:
        importlib.import_module(m)
    except Exception as e:
        sys.exit(f"FAIL {m} -> {type(e).__name__}: {str(e)[:200]}")
    print("OK  ", m)
"""


def site_version(site: Path) -> str:
    for rel in ("sglang/_version.py", "sglang/version.py"):
        f = site / rel
        text = f.read_text() if f.is_file() else ""
        m = re.search(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)""", text, re.M)
        if m:
            return m.group(1)
    raise SystemExit(f"{site}: no sglang/_version.py or sglang/version.py with a __version__")


def apply_edits(site: Path) -> int:
    version = site_version(site)
    edits = EDITS.get(version, [])
    missing = []
    for rel, old, new in edits:
        f = site / rel
        text = f.read_text() if f.is_file() else ""
        if new in text:
            continue
        if old not in text:
            missing.append(rel)
            continue
        f.write_text(text.replace(old, new, 1))
    if missing:
        print(f"gpu-kit pin edits for sglang {version}: not found in {missing}", file=sys.stderr)
        return 1
    print(f"gpu-kit pin edits for sglang {version}: {len(edits)} in place")
    return 0


def cpu_import_check(site: Path, shim: Path) -> int:
    """Only the site's sglang package is put on the path (its other packages are built for the
    H200's Python); this Python's own dependencies serve the rest."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "sglang").symlink_to((site / "sglang").resolve())
        (Path(tmp) / "flashinfer").mkdir()
        (Path(tmp) / "flashinfer/__init__.py").write_text('raise ImportError("no flashinfer")\n')
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join([tmp, str(shim)]),
            PYTHONDONTWRITEBYTECODE="1",
            SGL_KERNEL_SHIM_QUIET="1",
            SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK="1",
            SGLANG_IS_FLASHINFER_AVAILABLE="false",
        )
        return subprocess.run(
            [sys.executable, "-c", PRETEND_H200, *SERVER_MODULES], env=env, check=False
        ).returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("site", type=Path, help="directory containing the kit's sglang/")
    ap.add_argument("--cpu-import-check", type=Path, metavar="SHIM", default=None)
    a = ap.parse_args()
    if not (a.site / "sglang").is_dir():
        ap.error(f"{a.site}: no sglang/ package there (expected the kit's site directory)")
    if a.cpu_import_check is not None:
        if not (a.cpu_import_check / "sgl_kernel").is_dir():
            ap.error(
                f"--cpu-import-check {a.cpu_import_check}: no sgl_kernel/ there (the kit's shim/)"
            )
        return cpu_import_check(a.site, a.cpu_import_check)
    return apply_edits(a.site)


if __name__ == "__main__":
    sys.exit(main())
