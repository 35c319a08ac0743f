"""Triton kernels of ``tree_recurrence`` for CUDA: the tree gated delta rule and the path replay.

Same math and layouts as ``tree_recurrence`` (its docstring has the derivation), float32 inside;
checked against the torch core under ``TRITON_INTERPRET=1`` on the CPU
(tests/test_gdn_tree_recurrence.py) and on the H200 (benchmarks/gdn_tree_recurrence.py). Neither
function reads anything back to the host, so both can be captured in a CUDA graph when ``paths`` is
built once per verify step with a fixed width (``tree_paths(parents, width=horizon + 1)``).

- ``_tree_kernel``: one program per (value tile of ``BV`` columns, request x value head). It keeps its
  ``[K, BV]`` tile of the initial state in registers and visits the nodes in index order (parents
  come first). Per node it loads the ``BT``-slot chunks of the node's path row, its ancestors' keys
  ``[BT, K]`` and update vectors ``[BT, BV]`` (written by this same program for earlier nodes, hence
  the barrier after each store), the log-decays whose prefix sums give ``gamma`` per ancestor; then
  ``u_i`` and ``o_i``. The ``u`` vectors go to a float32 scratch the size of ``o``.
- ``_replay_kernel``: one program per (value tile, request x value head), the state tile in registers,
  one recurrent step per path slot (a ``-1`` slot is an identity step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs


@triton.jit
def _program_state_tile(
    s0_ptr,
    ss_b,
    ss_h,
    ss_k,
    ss_v,
    HV: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """This program's (request, value head, key/value offsets and masks) and its float32
    ``[BK, BV]`` tile of the initial state (grid: value tiles x requests*heads)."""
    i_bh = tl.program_id(1)
    b = i_bh // HV
    hv = i_bh % HV
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_k = offs_k < DK
    ok_v = offs_v < DV
    tile = tl.load(
        s0_ptr + b * ss_b + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
        mask=ok_k[:, None] & ok_v[None, :],
        other=0.0,
    ).to(tl.float32)
    return b, hv, offs_k, offs_v, ok_k, ok_v, tile


@triton.jit
def _tree_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    paths_ptr,
    s0_ptr,
    u_ptr,
    o_ptr,
    sk_b,
    sk_n,
    sk_h,
    sv_b,
    sv_n,
    sv_h,
    sg_b,
    sg_n,
    sg_h,
    sbeta_b,
    sbeta_n,
    sbeta_h,
    ss_b,
    ss_h,
    ss_k,
    ss_v,
    sq_b,
    sq_n,
    sq_h,
    N,
    W,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
):
    b, hv, offs_k, offs_v, ok_k, ok_v, s0 = _program_state_tile(
        s0_ptr, ss_b, ss_h, ss_k, ss_v, HV, DK, DV, BK, BV
    )
    hk = hv // GRP
    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    g_base = g_ptr + b * sg_b + hv * sg_h
    # u and o: contiguous [bs, N, HV, DV]
    uo_off = b * N * HV * DV + hv * DV
    for i in range(N):
        row = paths_ptr + (b * N + i) * W
        gamma = 0.0  # sum of g along node i's path
        for t0 in range(0, W, BT):
            t = t0 + tl.arange(0, BT)
            node = tl.load(row + t, mask=t < W, other=-1)
            gamma += tl.sum(tl.load(g_base + node * sg_n, mask=node >= 0, other=0.0).to(tl.float32))
        k_i = tl.load(k_base + i * sk_n + offs_k, mask=ok_k, other=0.0).to(tl.float32)
        q_i = tl.load(q_base + i * sq_n + offs_k, mask=ok_k, other=0.0).to(tl.float32)
        corr_u = tl.zeros([BV], dtype=tl.float32)
        corr_o = tl.zeros([BV], dtype=tl.float32)
        gamma_before = 0.0  # sum of g over the path slots of earlier chunks
        for t0 in range(0, W, BT):
            t = t0 + tl.arange(0, BT)
            node = tl.load(row + t, mask=t < W, other=-1)
            g_t = tl.load(g_base + node * sg_n, mask=node >= 0, other=0.0).to(tl.float32)
            gamma_anc = gamma_before + tl.cumsum(g_t, 0)
            gamma_before += tl.sum(g_t)
            anc = (node >= 0) & (node != i)
            w = tl.where(anc, tl.exp(gamma - gamma_anc), 0.0)
            k_anc = tl.load(
                k_base + node[:, None] * sk_n + offs_k[None, :],
                mask=anc[:, None] & ok_k[None, :],
                other=0.0,
            ).to(tl.float32)
            u_anc = tl.load(
                u_ptr + uo_off + node[:, None] * (HV * DV) + offs_v[None, :],
                mask=anc[:, None] & ok_v[None, :],
                other=0.0,
            )
            kk = tl.sum(k_anc * k_i[None, :], 1)
            qk = tl.sum(k_anc * q_i[None, :], 1)
            corr_u += tl.sum((w * kk)[:, None] * u_anc, 0)
            corr_o += tl.sum((w * qk)[:, None] * u_anc, 0)
        v_i = tl.load(v_ptr + b * sv_b + i * sv_n + hv * sv_h + offs_v, mask=ok_v, other=0.0).to(
            tl.float32
        )
        beta_i = tl.load(beta_ptr + b * sbeta_b + i * sbeta_n + hv * sbeta_h).to(tl.float32)
        decay = tl.exp(gamma)
        u_i = beta_i * (v_i - decay * tl.sum(s0 * k_i[:, None], 0) - corr_u)
        tl.store(u_ptr + uo_off + i * (HV * DV) + offs_v, u_i, mask=ok_v)
        tl.debug_barrier()  # later nodes of this program read u_i back
        o_i = decay * tl.sum(s0 * q_i[:, None], 0) + corr_o + tl.sum(q_i * k_i) * u_i
        real = tl.load(row) >= 0  # a padding row has no path
        tl.store(o_ptr + uo_off + i * (HV * DV) + offs_v, tl.where(real, o_i, 0.0), mask=ok_v)


@triton.jit
def _replay_kernel(
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    path_ptr,
    s0_ptr,
    out_ptr,
    sk_b,
    sk_n,
    sk_h,
    sv_b,
    sv_n,
    sv_h,
    sg_b,
    sg_n,
    sg_h,
    sbeta_b,
    sbeta_n,
    sbeta_h,
    ss_b,
    ss_h,
    ss_k,
    ss_v,
    D,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    b, hv, offs_k, offs_v, ok_k, ok_v, state = _program_state_tile(
        s0_ptr, ss_b, ss_h, ss_k, ss_v, HV, DK, DV, BK, BV
    )
    hk = hv // GRP
    for t in range(D):
        node = tl.load(path_ptr + b * D + t)
        real = node >= 0
        node = tl.maximum(node, 0)
        k_t = tl.load(
            k_ptr + b * sk_b + node * sk_n + hk * sk_h + offs_k, mask=ok_k & real, other=0.0
        ).to(tl.float32)
        v_t = tl.load(
            v_ptr + b * sv_b + node * sv_n + hv * sv_h + offs_v, mask=ok_v & real, other=0.0
        ).to(tl.float32)
        g_t = tl.load(g_ptr + b * sg_b + node * sg_n + hv * sg_h, mask=real, other=0.0)
        beta_t = tl.load(
            beta_ptr + b * sbeta_b + node * sbeta_n + hv * sbeta_h, mask=real, other=0.0
        )
        state = state * tl.exp(g_t.to(tl.float32))
        u = beta_t.to(tl.float32) * (v_t - tl.sum(state * k_t[:, None], 0))
        state = state + k_t[:, None] * u[None, :]
    tl.store(
        out_ptr + b * HV * DK * DV + hv * DK * DV + offs_k[:, None] * DV + offs_v[None, :],
        state,
        mask=ok_k[:, None] & ok_v[None, :],
    )


def _last_dim_contiguous(*xs: torch.Tensor) -> list[torch.Tensor]:
    return [x if x.stride(-1) == 1 else x.contiguous() for x in xs]


def _block_v(dv: int, programs_per_tile: int, block_v: int | None) -> int:
    """Value tile width: 32 columns, 16 when that leaves fewer than ~2 waves of programs."""
    if block_v is not None:
        if block_v < 1 or block_v & (block_v - 1):
            raise ValueError(f"block_v must be a power of two; got {block_v}")
        return block_v
    bv = min(32, triton.next_power_of_2(dv))
    return 16 if bv == 32 and programs_per_tile * triton.cdiv(dv, bv) < 512 else bv


def _shared_launch_args(k, v, g, beta, initial_state, block_v: int | None):
    """The grid (value tiles, requests x value heads), the k / v / g / beta / state strides and the
    constexprs both kernels take."""
    bs, _, hk, dk = k.shape
    hv, dv = v.shape[2:]
    bv = _block_v(dv, bs * hv, block_v)
    strides = (
        *k.stride()[:3],
        *v.stride()[:3],
        *g.stride(),
        *beta.stride(),
        *initial_state.stride(),
    )
    consts = dict(HV=hv, GRP=hv // hk, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=bv)
    return (triton.cdiv(dv, bv), bs * hv), strides, consts


def tree_gated_delta_rule_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    paths: torch.Tensor,
    initial_state: torch.Tensor,
    block_v: int | None = None,
) -> torch.Tensor:
    """``tree_gated_delta_rule`` on a ``tree_paths`` table ``[bs, N, W]``: ``o [bs, N, Hv, V]`` fp32.

    ``q, k, v`` may be strided views (e.g. split from one projection) with a contiguous last dim.
    ``block_v`` overrides the value tile width (a power of two).
    """
    check_inputs(q, k, v, g, beta, initial_state)
    bs, n = k.shape[:2]
    if paths.dim() != 3 or paths.shape[:2] != (bs, n):
        raise ValueError(f"paths must be [bs, N, W] = [{bs}, {n}, W]; got {tuple(paths.shape)}")
    paths = paths.to(torch.int32).contiguous()
    q, k, v = _last_dim_contiguous(q, k, v)
    u = torch.empty(*v.shape, dtype=torch.float32, device=k.device)
    o = torch.empty_like(u)
    width = paths.shape[2]
    grid, strides, consts = _shared_launch_args(k, v, g, beta, initial_state, block_v)
    _tree_kernel[grid](
        q,
        k,
        v,
        g,
        beta,
        paths,
        initial_state,
        u,
        o,
        *strides,
        *q.stride()[:3],
        n,
        width,
        BT=min(16, triton.next_power_of_2(width)),
        **consts,
    )
    return o


def replay_path_state_triton(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    initial_state: torch.Tensor,
    block_v: int | None = None,
) -> torch.Tensor:
    """``replay_path_state`` without validating ``path`` ``[bs, D]`` (``-1`` = identity step)."""
    check_inputs(None, k, v, g, beta, initial_state)
    bs, _, _, dk = k.shape
    if path.dim() != 2 or path.shape[0] != bs:
        raise ValueError(f"path must be [bs={bs}, D]; got {tuple(path.shape)}")
    path = path.to(torch.int32).contiguous()
    k, v = _last_dim_contiguous(k, v)
    out = torch.empty(bs, v.shape[2], dk, v.shape[3], dtype=torch.float32, device=k.device)
    grid, strides, consts = _shared_launch_args(k, v, g, beta, initial_state, block_v)
    _replay_kernel[grid](k, v, g, beta, path, initial_state, out, *strides, path.shape[1], **consts)
    return out
