"""A candidate for the wide-tree GDN verify: the whole tree as one chunk (the WY form, solved).

Status: a measured candidate, not yet on the serving path. ``triton_tree_recurrence._tree_kernel``
walks the nodes one after another (about 1.3 µs per node at bs 1 on the H200, so 80-110 µs per
layer at N = 65 on the Qwen3.6-27B shape). This kernel has no node-by-node dependency: every step
is a tile product. ``benchmarks/gdn_tree_recurrence.py --chunk`` times the two on the same inputs
(checks included). The candidate replaces the walk in the SGLang verify only if it wins there;
otherwise it goes.

Same contract and layouts as ``tree_gated_delta_rule_triton`` (plain mode: ``q``, ``k`` already
normalised and scaled, ``g``, ``beta`` given). With ``M`` the ancestor-or-self mask from the path
table and ``gamma = M g`` (the log-decay along each path), the update vectors solve
``(I + A) U = B``:

    A[i, s] = beta_i exp(gamma_i - gamma_s) (k_i . k_s)   for s a strict ancestor of i
    B_i     = beta_i (v_i - exp(gamma_i) S_0^T k_i)
    o_i     = exp(gamma_i) S_0^T q_i + sum_{s in M(i)} exp(gamma_i - gamma_s) (q_i . k_s) u_s

``A`` links a node only to its strict ancestors, so a product of ``m`` factors of ``A`` follows
chains of ``m`` ancestors: ``A^W = 0`` when no path has more than ``W`` nodes. Hence
``(I + A)^-1 = sum_{m < 2^D} (-A)^m = (I - A)(I + A^2)(I + A^4)...(I + A^(2^(D-1)))`` with
``2^D >= W``: ``2D - 1`` products of ``[N, N]`` tiles (``D = 4`` for the 16-wide paths of a
horizon-15 drafter).

Precision: every product is ``tf32x3`` (three TF32 tensor-core products per fp32 product, close to
fp32; plain TF32 would lose the exactness the tests hold the walk kernel to). The key products are
accumulated over 32-column slices of ``K``.
- Compiled for sm_90 at DDTREE(63)'s shape (64 nodes, BV 32), ``ptxas -v`` reports a stack per
  thread of 1176 bytes with 4 warps and 792 with 8.
- Before the slicing (whole ``[64, 128]`` q and k tiles) it was 1784 and 2096; with IEEE fp32
  products, 22096.
- That is still a spill: 0.2-0.3 GB of local memory at launch on an H200, which the serving path
  would have to account for.

One program per (value tile of ``BV`` columns, request x value head); the key products are formed
again in each value tile and head of a group (a first version: the benchmark decides whether that
matters).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs, check_paths
from .triton_tree_recurrence import last_dim_contiguous


@triton.jit
def _tree_chunk_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    paths_ptr,
    s0_ptr,
    o_ptr,
    sq_b,
    sq_n,
    sq_h,
    sk_b,
    sk_n,
    sk_h,
    sv_b,
    sv_n,
    sv_h,
    sg_b,
    sg_n,
    sg_h,
    sb_b,
    sb_n,
    sb_h,
    ss_b,
    ss_h,
    ss_k,
    ss_v,
    N,
    W: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    NB: tl.constexpr,
    KC: tl.constexpr,
    DOUBLINGS: tl.constexpr,
):
    iv = tl.program_id(0)
    b = tl.program_id(1) // HV
    h = tl.program_id(1) % HV
    hk = h // GRP
    nodes = tl.arange(0, NB)
    real_row = nodes < N
    offs_k = tl.arange(0, BK)
    ok_k = offs_k < DK
    offs_v = iv * BV + tl.arange(0, BV)
    ok_v = offs_v < DV

    # ancestor-or-self mask: anc[i, s] when node s is on node i's path (padding rows: none)
    anc = (nodes[:, None] < 0) & (nodes[None, :] < 0)  # [NB, NB], all False
    for t in range(W):
        on = tl.load(paths_ptr + (b * N + nodes) * W + t, mask=real_row, other=-1)
        anc = anc | (on[:, None] == nodes[None, :])
    real = tl.sum(anc.to(tl.int32), 1) > 0
    g = tl.load(g_ptr + b * sg_b + nodes * sg_n + h * sg_h, mask=real_row, other=0.0)
    beta = tl.load(beta_ptr + b * sb_b + nodes * sb_n + h * sb_h, mask=real_row, other=0.0)
    gamma = tl.sum(tl.where(anc, g.to(tl.float32)[None, :], 0.0), 1)
    decay = tl.where(anc, tl.exp(gamma[:, None] - gamma[None, :]), 0.0)

    # the key products, K in slices of KC columns (whole [NB, K] tiles of q and k spilled)
    kk = tl.zeros([NB, NB], dtype=tl.float32)
    qk = tl.zeros([NB, NB], dtype=tl.float32)
    s0k = tl.zeros([NB, BV], dtype=tl.float32)
    s0q = tl.zeros([NB, BV], dtype=tl.float32)
    for k0 in tl.static_range(0, BK, KC):
        offs_k = k0 + tl.arange(0, KC)
        ok_k = offs_k < DK
        row_k = real_row[:, None] & ok_k[None, :]
        k = tl.load(
            k_ptr + b * sk_b + nodes[:, None] * sk_n + hk * sk_h + offs_k[None, :],
            mask=row_k,
            other=0.0,
        ).to(tl.float32)
        q = tl.load(
            q_ptr + b * sq_b + nodes[:, None] * sq_n + hk * sq_h + offs_k[None, :],
            mask=row_k,
            other=0.0,
        ).to(tl.float32)
        s0 = tl.load(
            s0_ptr + b * ss_b + h * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
            mask=ok_k[:, None] & ok_v[None, :],
            other=0.0,
        ).to(tl.float32)
        kt = tl.trans(k)
        kk += tl.dot(k, kt, input_precision="tf32x3")
        qk += tl.dot(q, kt, input_precision="tf32x3")
        s0k += tl.dot(k, s0, input_precision="tf32x3")
        s0q += tl.dot(q, s0, input_precision="tf32x3")
    v = tl.load(
        v_ptr + b * sv_b + nodes[:, None] * sv_n + h * sv_h + offs_v[None, :],
        mask=real_row[:, None] & ok_v[None, :],
        other=0.0,
    ).to(tl.float32)

    strict = anc & (nodes[:, None] != nodes[None, :])
    a = tl.where(strict, beta.to(tl.float32)[:, None] * decay * kk, 0.0)
    eg = tl.exp(gamma)
    s0k = tl.dot(k, s0, input_precision="tf32x3")
    rhs = beta.to(tl.float32)[:, None] * (v - eg[:, None] * s0k)
    attn = decay * qk  # the output's weights; decay and qk are not needed again
    # (I + A)^-1 = (I - A)(I + A^2)(I + A^4)...: A is nilpotent of index <= W <= 2^DOUBLINGS
    eye = tl.where(nodes[:, None] == nodes[None, :], 1.0, 0.0)
    inv = eye - a
    power = a
    for _ in tl.static_range(DOUBLINGS - 1):
        power = tl.dot(power, power, input_precision="tf32x3")
        inv = tl.dot(inv, eye + power, input_precision="tf32x3")
    u = tl.dot(inv, rhs, input_precision="tf32x3")
    o = eg[:, None] * s0q + tl.dot(attn, u, input_precision="tf32x3")
    o = tl.where(real[:, None], o, 0.0)
    out = o_ptr + ((b * N + nodes[:, None]) * HV + h) * DV + offs_v[None, :]
    tl.store(out, o, mask=real_row[:, None] & ok_v[None, :])


def doublings(width: int) -> int:
    """Factors ``D`` of the inverse: the smallest ``D >= 1`` with ``2^D >= width``."""
    return max(1, (width - 1).bit_length())


def tree_gated_delta_rule_chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    paths: torch.Tensor,
    initial_state: torch.Tensor,
    block_v: int = 32,
    num_warps: int = 4,
) -> torch.Tensor:
    """``tree_gated_delta_rule_triton``'s contract (``paths`` a ``tree_paths`` table ``[bs, N, W]``,
    ``o [bs, N, Hv, V]`` fp32), solved as one chunk. ``N`` up to 128 nodes."""
    check_inputs(q, k, v, g, beta, initial_state)
    check_paths(paths, k)
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if n > 128:
        raise ValueError(f"the one-chunk solve holds up to 128 nodes per tree; got N = {n}")
    q, k, v = last_dim_contiguous(q, k, v)
    width = paths.shape[2]
    paths = paths.to(torch.int32).contiguous()
    o = torch.empty(bs, n, hv, dv, dtype=torch.float32, device=k.device)
    _tree_chunk_kernel[(triton.cdiv(dv, block_v), bs * hv)](
        q,
        k,
        v,
        g,
        beta,
        paths,
        initial_state,
        o,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *g.stride(),
        *beta.stride(),
        *initial_state.stride(),
        n,
        W=width,
        HV=hv,
        GRP=hv // hk,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=block_v,
        NB=max(16, triton.next_power_of_2(n)),
        KC=min(32, triton.next_power_of_2(dk)),
        DOUBLINGS=doublings(width),
        num_warps=num_warps,
    )
    return o
