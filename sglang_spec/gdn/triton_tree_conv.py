"""Triton twin of :func:`sglang_spec.gdn.tree_conv.save_conv_inputs`: one launch per layer.

The torch form is a gather, a transposed index-put and a second index-put (three or four kernels
per GDN layer inside the verify's CUDA graph, 48 layers on the Qwen3.6-27B shape); this kernel
writes a request row's ``[pre-verify state columns | node inputs]`` in one pass. Program
``(b, column, channel block)`` copies one column of request ``b``'s row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_C = 1024  # channels per program (the 27B shape's conv has 10240)


@triton.jit
def _save_conv_inputs_kernel(
    inputs_ptr,
    states_ptr,
    slots_ptr,
    rows_ptr,
    x_ptr,
    s_in_row,
    s_in_col,
    s_st_slot,
    s_st_c,
    s_st_col,
    s_x_tok,
    s_x_c,
    C,
    N,
    STATE_LEN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    col = tl.program_id(1)
    c = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = c < C
    row = tl.load(rows_ptr + b).to(tl.int64)
    out_ty = inputs_ptr.dtype.element_ty  # both branches cast: the two sources' dtypes may differ
    if col < STATE_LEN:
        # a padding request (slot < 0) reads SGLang's dummy slot 0
        slot = tl.maximum(tl.load(slots_ptr + b).to(tl.int64), 0)
        val = tl.load(states_ptr + slot * s_st_slot + c * s_st_c + col * s_st_col, mask=ok)
        val = val.to(out_ty)
    else:
        tok = (b * N + col - STATE_LEN).to(tl.int64)
        val = tl.load(x_ptr + tok * s_x_tok + c * s_x_c, mask=ok).to(out_ty)
    dst = inputs_ptr + row * s_in_row + col * s_in_col + c
    tl.store(dst, val, mask=ok)


def save_conv_inputs_triton(
    inputs: torch.Tensor,
    conv_states: torch.Tensor,
    cache_indices: torch.Tensor,
    rows: torch.Tensor,
    mixed_qkv: torch.Tensor,
) -> None:
    """``save_conv_inputs`` in one launch (same arguments; ``inputs``' last dim contiguous)."""
    bs = rows.shape[0]
    state_len = conv_states.shape[-1]
    channels = inputs.shape[-1]
    width = mixed_qkv.shape[0] // bs
    if inputs.stride(-1) != 1:
        raise ValueError(f"inputs must have a contiguous last dim; got strides {inputs.stride()}")
    grid = (bs, state_len + width, triton.cdiv(channels, BLOCK_C))
    _save_conv_inputs_kernel[grid](
        inputs,
        conv_states,
        cache_indices,
        rows,
        mixed_qkv,
        inputs.stride(0),
        inputs.stride(1),
        *conv_states.stride(),
        *mixed_qkv.stride(),
        channels,
        width,
        STATE_LEN=state_len,
        BLOCK=BLOCK_C,
        num_warps=4,
    )
