"""Triton twins of :func:`sglang_spec.gdn.tree_conv.save_conv_inputs` and
:func:`~sglang_spec.gdn.tree_conv.tree_conv` (one launch per layer each) and of
:func:`~sglang_spec.gdn.tree_conv.commit_conv_states` (one launch for all layers).

- ``_save_conv_inputs_kernel``: the torch form is a gather, a transposed index-put and a second
  index-put (three or four kernels per GDN layer inside the verify's CUDA graph, 48 layers on the
  Qwen3.6-27B shape); this kernel writes a request row's ``[pre-verify state columns | node
  inputs]`` in one pass. Program ``(b, column, channel block)`` copies one column of request
  ``b``'s row.
- ``_tree_conv_kernel``: program ``(b, node block, channel block)`` forms the conv output of
  ``BN`` nodes at once: per tap, each node's input from its path row (or a pre-verify state
  column), times the tap's weight, into a float32 accumulator, in the order and the dtypes of
  SGLang's tree-mode ``_causal_conv1d_update_kernel`` (which visits the nodes one at a time).
- ``_commit_conv_states_kernel``: program ``(request and target, layer, channel block)`` writes
  the ``W - 1`` state columns of one request's slot (or its extra_buffer track slot) from its row,
  along its accepted path.
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


#: Nodes, channels and warps per ``_tree_conv_kernel`` program. 8 nodes: on the H200 at the 27B
#: shape (session 34, ``benchmarks/gdn_tree_recurrence.py --conv --sweep``) the fastest or within
#: 0.2 µs of it at every cell timed, against 16 nodes: 5.9 / 8.6 µs at bs 16 / N 8, 8.9 / 9.7 at
#: N 14, 9.3 / 14.7 at bs 32 / N 8, 14.9 / 15.2 at N 14, 3.7 / 4.3 at bs 1 / N 32, 4.1 / 5.0 at
#: N 64. A 16-node tile left half its rows idle for trees of 8 nodes and held 168 registers a
#: thread, against 96 (compiled as launched, sm_90).
TREE_CONV_NODES = 8
TREE_CONV_CHANNELS = 256
TREE_CONV_WARPS = 4


@triton.jit
def _tree_conv_kernel(
    x_ptr,
    states_ptr,
    w_ptr,
    bias_ptr,
    slots_ptr,
    paths_ptr,
    o_ptr,
    s_x_tok,
    s_st_slot,
    s_st_c,
    s_st_col,
    s_w_c,
    s_w_k,
    C,
    N,
    P: tl.constexpr,
    KERNEL: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SILU: tl.constexpr,
    BN: tl.constexpr,
    BC: tl.constexpr,
):
    b = tl.program_id(0)
    i = tl.program_id(1) * BN + tl.arange(0, BN)
    c = tl.program_id(2) * BC + tl.arange(0, BC)
    ok_i = i < N
    ok_c = c < C
    ok = ok_i[:, None] & ok_c[None, :]
    slot = tl.maximum(tl.load(slots_ptr + b).to(tl.int64), 0)  # a padding request reads slot 0
    row = paths_ptr + (b * N + i) * P
    depth = tl.zeros([BN], dtype=tl.int32) - 1
    for t in range(P):
        depth += (tl.load(row + t, mask=ok_i, other=-1) >= 0).to(tl.int32)
    if HAS_BIAS:
        acc = tl.load(bias_ptr + c, mask=ok_c, other=0.0).to(tl.float32)[None, :]
        acc = tl.broadcast_to(acc, [BN, BC])
    else:
        acc = tl.zeros([BN, BC], dtype=tl.float32)
    for back in tl.static_range(KERNEL):  # 0: the node itself, 1: its parent, ...
        w = tl.load(w_ptr + c * s_w_c + (KERNEL - 1 - back) * s_w_k, mask=ok_c, other=0.0)
        at = depth - back  # the path position, < 0: a pre-verify state column
        on_path = at >= 0
        node = tl.load(row + tl.maximum(at, 0), mask=ok_i & on_path, other=0)
        from_x = tl.load(
            x_ptr + (b * N + node).to(tl.int64)[:, None] * s_x_tok + c[None, :],
            mask=ok & on_path[:, None],
            other=0.0,
        )
        column = tl.minimum(tl.maximum(KERNEL - 1 + at, 0), KERNEL - 2)
        from_state = tl.load(
            states_ptr + slot * s_st_slot + c[None, :] * s_st_c + column[:, None] * s_st_col,
            mask=ok & ~on_path[:, None],
            other=0.0,
        )
        acc += tl.where(on_path[:, None], from_x * w[None, :], from_state * w[None, :])
    if SILU:
        acc = acc / (1 + tl.exp(-acc))
    tl.store(o_ptr + (b * N + i).to(tl.int64)[:, None] * C + c[None, :], acc, mask=ok)


def tree_conv_triton(
    x,
    conv_states,
    weight,
    bias,
    silu,
    cache_indices,
    paths,
    block_n: int = TREE_CONV_NODES,
    block_c: int = TREE_CONV_CHANNELS,
    num_warps: int = TREE_CONV_WARPS,
) -> torch.Tensor:
    """``tree_conv`` in one launch (same arguments and types; ``x``'s last dim contiguous,
    ``paths`` contiguous int32). ``block_n`` / ``block_c`` (powers of two) and ``num_warps`` set
    the program's nodes, channels and warps, for ``benchmarks/gdn_tree_recurrence.py --conv
    --sweep``."""
    bs, n, width = paths.shape
    channels, kernel = weight.shape
    if x.stride(-1) != 1 or paths.dtype != torch.int32 or not paths.is_contiguous():
        raise ValueError(
            f"x needs a contiguous last dim and paths must be contiguous int32; got x strides "
            f"{x.stride()}, paths {paths.dtype} contiguous={paths.is_contiguous()}"
        )
    for name, value in (("block_n", block_n), ("block_c", block_c)):
        if value & (value - 1):
            raise ValueError(f"{name} must be a power of two; got {value}")
    o = torch.empty(bs * n, channels, dtype=x.dtype, device=x.device)
    grid = (bs, triton.cdiv(n, block_n), triton.cdiv(channels, block_c))
    _tree_conv_kernel[grid](
        x,
        conv_states,
        weight,
        weight if bias is None else bias,  # unread without HAS_BIAS
        cache_indices,
        paths,
        o,
        x.stride(0),
        *conv_states.stride(),
        *weight.stride(),
        channels,
        n,
        P=width,
        KERNEL=kernel,
        HAS_BIAS=bias is not None,
        SILU=silu,
        BN=block_n,
        BC=block_c,
        num_warps=num_warps,
    )
    return o


# The batch size, accept_index's width (and row stride) and the verify width change with the
# running batch and the budget: left unspecialised, one compile serves them all (specialised, a
# new (batch, budget) pair compiled 0.2 s inside a timed level of the 27B adaptive server, session 25).
@triton.jit(do_not_specialize=["s_ix_b", "bs", "A", "N"])
def _commit_conv_states_kernel(
    conv_ptr,
    inputs_ptr,
    slots_ptr,
    rows_ptr,
    index_ptr,
    lens_ptr,
    track_slots_ptr,
    track_nodes_ptr,
    s_cv_layer,
    s_cv_slot,
    s_cv_c,
    s_cv_col,
    s_in_layer,
    s_in_row,
    s_in_col,
    s_ix_b,
    bs,
    C,
    A,
    N,
    STATE_LEN: tl.constexpr,
    AB: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0)  # request b's own slot for p < bs, its track slot after
    b = p % bs
    layer = tl.program_id(1).to(tl.int64)
    c = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    ok = c < C
    nodes_at = index_ptr + b.to(tl.int64) * s_ix_b
    if p < bs:
        dst = tl.load(slots_ptr + b).to(tl.int64)
        end = tl.load(lens_ptr + b).to(tl.int32)
    else:  # the track snapshot: the state as of the first accepted position holding the node
        dst = tl.load(track_slots_ptr + b).to(tl.int64)
        node = tl.load(track_nodes_ptr + b).to(tl.int32)
        t = tl.arange(0, AB)
        on_path = (tl.load(nodes_at + t, mask=t < A, other=-1) - b * N == node) & (t < A)
        first = tl.min(tl.where(on_path, t, AB), axis=0)
        end = tl.where((first < AB) & (node >= 0), first + 1, 0)
    if (end > 0) & (dst >= 0):
        row = tl.load(rows_ptr + b).to(tl.int64)
        src = inputs_ptr + layer * s_in_layer + row * s_in_row + c
        out = conv_ptr + layer * s_cv_layer + dst * s_cv_slot + c * s_cv_c
        for j in tl.static_range(STATE_LEN):
            t = end - STATE_LEN + j  # the path position of state column j; < 0: pre-verify
            node = tl.load(nodes_at + tl.maximum(t, 0)).to(tl.int32) - b * N
            column = STATE_LEN + tl.where(t >= 0, node, t)
            val = tl.load(src + column.to(tl.int64) * s_in_col, mask=ok)
            tl.store(out + j * s_cv_col, val.to(conv_ptr.dtype.element_ty), mask=ok)


def commit_conv_states_triton(
    conv_states: torch.Tensor,
    inputs: torch.Tensor,
    slots: torch.Tensor,
    rows: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    num_draft: int,
    track_slots: torch.Tensor | None = None,
    track_nodes: torch.Tensor | None = None,
) -> None:
    """``commit_conv_states`` in one launch (same arguments; ``inputs``' last dim contiguous,
    ``accept_index``'s too). A request with nothing to commit writes nothing (the torch path
    writes it into SGLang's dummy slot 0)."""
    layers, _, channels, state_len = conv_states.shape
    bs, width = accept_index.shape
    if inputs.stride(-1) != 1 or accept_index.stride(-1) != 1:
        raise ValueError(
            f"inputs and accept_index need a contiguous last dim; got strides {inputs.stride()}, "
            f"{accept_index.stride()}"
        )
    track = track_slots is not None and track_nodes is not None
    if bs == 0:
        return
    grid = (bs * (2 if track else 1), layers, triton.cdiv(channels, BLOCK_C))
    _commit_conv_states_kernel[grid](
        conv_states,
        inputs,
        slots,
        rows,
        accept_index,
        accept_lens,
        track_slots if track else slots,  # unread without the track half of the grid
        track_nodes if track else slots,
        *conv_states.stride(),
        inputs.stride(0),
        inputs.stride(1),
        inputs.stride(2),
        accept_index.stride(0),
        bs,
        channels,
        width,
        num_draft,
        STATE_LEN=state_len,
        AB=max(16, triton.next_power_of_2(width)),  # one variant up to 16 accepted positions
        BLOCK=BLOCK_C,
        num_warps=4,
    )
