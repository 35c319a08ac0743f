"""One Triton launch per RMSNorm in place of the GPU kit's torch ones, for the real-scale harness.

The kit's ``sgl_kernel`` stand-in (``shared/sglang-gpu-kit/shim``) runs ``rmsnorm``,
``fused_add_rmsnorm``, ``gemma_rmsnorm`` and ``gemma_fused_add_rmsnorm`` as torch ops: 15 kernels
for a fused gemma norm where sglang-kernel runs one. In session 25's C = 16 traces of the
Qwen3.6-27B shape a decode step launched about 1900 torch elementwise, copy and reduce kernels,
about 147 norms' worth (one mean reduction each), which took 5.0 (NEXTN, 4 tokens a request) and
6.4 ms (DDTREE(7), 8) of the step: a cost that grows with the verify's tokens, so it charges a
wide verify more than a production server would. This module gives each of the four one launch,
with the stand-in's arithmetic (float32 sum and mean of squares, ``rsqrt``, the weight, or ``1 + weight`` for the gemma
forms, then the activation dtype; the fused forms write the rounded sum to ``residual`` and
normalise the float32 one) and its in-place contract.

It reaches the servers as an SGLang general plugin (entry point ``sglang.srt.plugins``, name
``kit_norms``) that :func:`e2e.kit.install_kit_norms` writes into the kit's site-packages, as this
one file and a small dist-info. :func:`register` acts only where ``SGLANG_SPEC_KIT_NORMS=triton`` is
set (``e2e.scale``'s ``fused-norms`` option) and refuses a real ``sgl_kernel``, whose norms are
fused already. It registers ``HookType.REPLACE`` hooks on the stand-in's four functions (SGLang
propagates them to ``sglang.srt.layers.layernorm``'s imported names) and prints :data:`READY` so the
harness can tell from the server log that the norms it timed were these.

Self-contained (torch, Triton, SGLang's hook registry): the kit imports it as a top-level module.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

ENV = "SGLANG_SPEC_KIT_NORMS"
READY = "[kit_norms] sgl_kernel norms: one Triton launch each"
NAMES = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm")


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    o_ptr,
    s_x,
    s_r,
    s_o,
    n,
    eps,
    ADD: tl.constexpr,
    GEMMA: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """One row: ``o = norm(x [+ r]) * w`` (``1 + w`` with GEMMA); with ADD, ``r = x + r``
    rounded to r's dtype, and the norm of the float32 sum."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    ok = cols < n
    x = tl.load(x_ptr + row * s_x + cols, mask=ok, other=0.0).to(tl.float32)
    if ADD:
        x += tl.load(r_ptr + row * s_r + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(r_ptr + row * s_r + cols, x.to(r_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n + eps)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    if GEMMA:
        w += 1.0
    tl.store(o_ptr + row * s_o + cols, (x * rstd * w).to(o_ptr.dtype.element_ty), mask=ok)


def _rows(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` as ``[rows, n]`` without a copy (a 2-D ``t`` keeps its row stride)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dim must be contiguous; got strides {t.stride()}")
    return t if t.dim() == 2 else t.view(-1, t.shape[-1])


def _launch(x, residual, weight, eps, out, gemma: bool) -> None:
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"weight has shape {tuple(weight.shape)}; the rows have {n} columns")
    xr = _rows(x, "input")
    rr = _rows(residual, "residual") if residual is not None else xr
    orow = _rows(out, "out")
    if xr.shape[0] == 0:  # an empty batch: nothing to launch (a grid of 0 programs is refused)
        return
    block = triton.next_power_of_2(n)
    _rmsnorm_kernel[(xr.shape[0],)](
        xr,
        rr,
        weight,
        orow,
        xr.stride(0),
        rr.stride(0),
        orow.stride(0),
        n,
        eps,
        ADD=residual is not None,
        GEMMA=gemma,
        BLOCK=block,
        num_warps=min(16, max(1, block // 512)),
    )


def rmsnorm(input, weight, eps: float = 1e-6, out=None, enable_pdl=None):  # noqa: ARG001, A002 - sgl_kernel's signature
    out = torch.empty_like(input) if out is None else out
    _launch(input, None, weight, eps, out, gemma=False)
    return out


def fused_add_rmsnorm(input, residual, weight, eps: float = 1e-6, enable_pdl=None):  # noqa: ARG001, A002
    _launch(input, residual, weight, eps, input, gemma=False)


def gemma_rmsnorm(input, weight, eps: float = 1e-6, out=None, enable_pdl=None):  # noqa: ARG001, A002
    out = torch.empty_like(input) if out is None else out
    _launch(input, None, weight, eps, out, gemma=True)
    return out


def gemma_fused_add_rmsnorm(input, residual, weight, eps: float = 1e-6, enable_pdl=None):  # noqa: ARG001, A002
    _launch(input, residual, weight, eps, input, gemma=True)


def register() -> None:
    """The ``kit_norms`` plugin: with ``SGLANG_SPEC_KIT_NORMS=triton``, REPLACE hooks on the
    stand-in's four norms; without it, nothing. Any other value, or a real sgl_kernel, raises."""
    mode = os.environ.get(ENV)
    if mode is None:
        return
    if mode != "triton":
        raise ValueError(f"{ENV}={mode!r}; valid: triton, or unset for the stand-in's torch norms")
    import sgl_kernel
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not getattr(sgl_kernel, "IS_PY_SHIM", False):
        raise RuntimeError(
            f"{ENV}=triton replaces the GPU kit's torch norms; this sgl_kernel "
            f"({sgl_kernel.__file__}) is the real one, whose norms are fused already"
        )
    for name in NAMES:
        HookRegistry.register(f"sgl_kernel.{name}", globals()[name], HookType.REPLACE)
    print(f"{READY} (pid {os.getpid()})", file=sys.stderr, flush=True)
