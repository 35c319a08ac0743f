"""A blocked-WY candidate for ``tree_gated_delta_rule``: the tree's update vectors from one
triangular solve in 16-row blocks instead of a walk of the nodes one by one.

Same contract as ``tree_recurrence.tree_gated_delta_rule`` on a ``tree_paths`` table (module
docstring there), float32 inside. Not wired into the verify path: a candidate to time against the
walk (``triton_tree_recurrence``) with ``benchmarks/gdn_tree_recurrence.py --wy``.

The math (the torch core's, written as matrices over the ``N`` nodes of one request and value
head): with ``gamma_i`` the sum of ``g`` along node ``i``'s root path and ``M[i, s]`` set when
``s`` is on that path (``s = i`` included),

    A[i, s]  = beta_i exp(gamma_i - gamma_s) (k_s . k_i)   for s a strict ancestor of i, else 0
    QK[i, s] = exp(gamma_i - gamma_s) (k_s . q_i)          for s on path(i), else 0
    R_i      = beta_i (v_i - exp(gamma_i) S_0^T k_i)
    U        = (I + A)^{-1} R        (A strictly lower triangular: parents precede children)
    O        = exp(gamma) S_0^T q + QK U

Padding rows (``paths[b, i, 0] < 0``) are on no path, get ``R_i = 0`` and output zeros.

Two launches, modest tiles (after fla's chunked gated delta rule: ``chunk_scaled_dot_kkt``,
``solve_tril``, ``wy_fast``, ``chunk_o``), with the ``N`` nodes padded to ``BN``, a multiple of
``BT = 16``:

- ``_wy_kkt_kernel``, one program per (16-row block ``i``, request x value head): each node's
  ``gamma`` (one gather of ``g`` over its path row), then for every column block ``j <= i`` the
  ``[16, 16]`` blocks of ``A`` and ``QK`` (``tl.dot`` over ``K`` in IEEE float32, the ancestor mask
  read from the path table as ``M[i, s] = paths[i, depth_s] == s``). The diagonal block of ``A``
  is replaced by ``(I + A_ii)^{-1}``, formed by forward substitution in registers. Writes ``A``,
  ``QK`` ``[bs * Hv, BN, BN]`` (lower blocks only) and ``gamma`` ``[bs * Hv, BN]``.
- ``_wy_out_kernel``, one program per (value tile of ``BV`` columns, request x value head), its
  ``[K, BV]`` tile of ``S_0`` in registers: block by block, ``R_i`` minus ``A_ij U_j`` over the
  earlier blocks, ``U_i = (I + A_ii)^{-1} (...)`` (a block forward substitution: ``ceil(N / 16)``
  dependent steps instead of ``N``), stored to a ``[bs * Hv, BN, V]`` scratch for the later
  blocks (barrier), and ``O_i`` from the same loads.

Nothing is read back to the host (CUDA-graph capturable with a fixed-width path table).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs

#: Rows per block of the solve (``tl.dot``'s smallest tile).
BT = 16

#: The output launch's value tile: on the H200 (one Qwen3.6-27B GDN layer, bs 1-32, N 16 and 64)
#: 64 columns was the fastest of 16, 32 and 64 in every cell, bs 1 included, where more, narrower
#: programs had been expected to win.
WY_BLOCK_V = 64

#: Key columns per ``tl.dot`` of the ``A`` / ``QK`` launch (all 128 at once spilled on sm_90).
KKT_K_SLICE = 32

#: Warps per program of both launches.
WY_WARPS = 4


@triton.jit
def _path_rows(
    paths_ptr,
    g_ptr,
    b,
    rows,
    hv,
    N,
    sg_b,
    sg_n,
    sg_h,
    W: tl.constexpr,
    BW: tl.constexpr,
):
    """``gamma`` (sum of ``g`` of value head ``hv`` over the root path) and the depth (``-1`` for a
    padding row or a row past ``N``) of nodes ``rows`` of request ``b``."""
    t = tl.arange(0, BW)
    node = tl.load(
        paths_ptr + (b * N + rows[:, None]) * W + t[None, :],
        mask=(rows[:, None] < N) & (t[None, :] < W),
        other=-1,
    )
    on = node >= 0
    gv = tl.load(g_ptr + b * sg_b + node * sg_n + hv * sg_h, mask=on, other=0.0).to(tl.float32)
    return tl.sum(gv, 1), tl.sum(on.to(tl.int32), 1) - 1


@triton.jit
def _ancestor_mask(paths_ptr, b, rows, cols, depth_c, N, W: tl.constexpr):
    """``[rows, cols]``: node ``cols[c]`` is on node ``rows[r]``'s root path (itself included),
    i.e. ``paths[b, r, depth_c] == c``."""
    ok = (rows[:, None] < N) & (depth_c[None, :] >= 0)
    node = tl.load(paths_ptr + (b * N + rows[:, None]) * W + depth_c[None, :], mask=ok, other=-1)
    return node == cols[None, :]


@triton.jit
def _wy_kkt_kernel(
    q_ptr,
    k_ptr,
    g_ptr,
    beta_ptr,
    paths_ptr,
    a_ptr,
    qk_ptr,
    gam_ptr,
    sq_b,
    sq_n,
    sq_h,
    sk_b,
    sk_n,
    sk_h,
    sg_b,
    sg_n,
    sg_h,
    sb_b,
    sb_n,
    sb_h,
    N,
    W: tl.constexpr,
    BW: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    BK: tl.constexpr,
    BKC: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
):
    """Row block ``i`` of ``A`` (diagonal block: ``(I + A_ii)^{-1}``), of ``QK`` and of ``gamma``
    for one request x value head (grid: row blocks x requests*value heads)."""
    i_t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    hv = bh % HV
    hk = hv // GRP
    r = tl.arange(0, BT)
    rows = i_t * BT + r
    ok_r = rows < N
    gam_r, dep_r = _path_rows(paths_ptr, g_ptr, b, rows, hv, N, sg_b, sg_n, sg_h, W, BW)
    beta_r = tl.load(beta_ptr + b * sb_b + rows * sb_n + hv * sb_h, mask=ok_r, other=0.0).to(
        tl.float32
    )
    tl.store(gam_ptr + bh * BN + rows, gam_r)

    k_base = k_ptr + b * sk_b + hk * sk_h
    q_base = q_ptr + b * sq_b + hk * sq_h
    out = bh * BN * BN + rows[:, None] * BN
    for j in range(0, i_t + 1):
        cols = j * BT + r
        gam_c, dep_c = _path_rows(paths_ptr, g_ptr, b, cols, hv, N, sg_b, sg_n, sg_h, W, BW)
        on_path = _ancestor_mask(paths_ptr, b, rows, cols, dep_c, N, W)
        kk = tl.zeros((BT, BT), dtype=tl.float32)
        qk = tl.zeros((BT, BT), dtype=tl.float32)
        for c in range(0, BK, BKC):  # K in slices of BKC columns
            offs_k = c + tl.arange(0, BKC)
            ok_k = offs_k < DK
            k_i = tl.load(
                k_base + rows[:, None] * sk_n + offs_k[None, :],
                mask=ok_r[:, None] & ok_k[None, :],
                other=0.0,
            ).to(tl.float32)
            q_i = tl.load(
                q_base + rows[:, None] * sq_n + offs_k[None, :],
                mask=ok_r[:, None] & ok_k[None, :],
                other=0.0,
            ).to(tl.float32)
            k_jt = tl.load(  # [BKC, BT]: the column block's keys, transposed
                k_base + cols[None, :] * sk_n + offs_k[:, None],
                mask=(cols[None, :] < N) & ok_k[:, None],
                other=0.0,
            ).to(tl.float32)
            kk += tl.dot(k_i, k_jt, input_precision="ieee")
            qk += tl.dot(q_i, k_jt, input_precision="ieee")
        decay = tl.exp(tl.where(on_path, gam_r[:, None] - gam_c[None, :], 0.0))
        strict = on_path & (rows[:, None] != cols[None, :])
        a = tl.where(strict, beta_r[:, None] * decay * kk, 0.0)
        tl.store(qk_ptr + out + cols[None, :], tl.where(on_path, decay * qk, 0.0))
        if j == i_t:
            # (I + a)^{-1} by forward substitution: row s of t is final once s < i
            t = (r[:, None] == r[None, :]).to(tl.float32)
            for i in range(1, BT):
                a_row = tl.sum(tl.where(r[:, None] == i, a, 0.0), 0)
                below = tl.sum(a_row[:, None] * t, 0)
                t = tl.where(
                    r[:, None] == i, tl.where(r == i, 1.0, 0.0)[None, :] - below[None, :], t
                )
            a = t
        tl.store(a_ptr + out + cols[None, :], a)


@triton.jit
def _wy_out_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    beta_ptr,
    paths_ptr,
    s0_ptr,
    a_ptr,
    qk_ptr,
    gam_ptr,
    u_ptr,
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
    BT: tl.constexpr,
    BN: tl.constexpr,
):
    """``U`` and ``O`` of one value tile of one request x value head, block by block (grid: value
    tiles x requests*value heads)."""
    bh = tl.program_id(1)
    b = bh // HV
    hv = bh % HV
    hk = hv // GRP
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_k = offs_k < DK
    ok_v = offs_v < DV
    s0 = tl.load(
        s0_ptr + b * ss_b + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
        mask=ok_k[:, None] & ok_v[None, :],
        other=0.0,
    ).to(tl.float32)
    r = tl.arange(0, BT)
    blk = bh * BN * BN
    for i in range(0, tl.cdiv(N, BT)):
        rows = i * BT + r
        ok_r = rows < N
        real = tl.load(paths_ptr + (b * N + rows) * W, mask=ok_r, other=-1) >= 0
        k_i = tl.load(
            k_ptr + b * sk_b + hk * sk_h + rows[:, None] * sk_n + offs_k[None, :],
            mask=ok_r[:, None] & ok_k[None, :],
            other=0.0,
        ).to(tl.float32)
        q_i = tl.load(
            q_ptr + b * sq_b + hk * sq_h + rows[:, None] * sq_n + offs_k[None, :],
            mask=ok_r[:, None] & ok_k[None, :],
            other=0.0,
        ).to(tl.float32)
        v_i = tl.load(
            v_ptr + b * sv_b + hv * sv_h + rows[:, None] * sv_n + offs_v[None, :],
            mask=ok_r[:, None] & ok_v[None, :],
            other=0.0,
        ).to(tl.float32)
        beta_i = tl.load(beta_ptr + b * sb_b + rows * sb_n + hv * sb_h, mask=ok_r, other=0.0).to(
            tl.float32
        )
        decay = tl.exp(tl.load(gam_ptr + bh * BN + rows))
        s0k = tl.dot(k_i, s0, input_precision="ieee")
        s0q = tl.dot(q_i, s0, input_precision="ieee")
        rhs = tl.where(real[:, None], beta_i[:, None] * (v_i - decay[:, None] * s0k), 0.0)
        acc = decay[:, None] * s0q
        for j in range(0, i):
            cols = j * BT + r
            u_j = tl.load(
                u_ptr + (bh * BN + cols[:, None]) * DV + offs_v[None, :], mask=ok_v[None, :]
            )
            a_ij = tl.load(a_ptr + blk + rows[:, None] * BN + cols[None, :])
            qk_ij = tl.load(qk_ptr + blk + rows[:, None] * BN + cols[None, :])
            rhs -= tl.dot(a_ij, u_j, input_precision="ieee")
            acc += tl.dot(qk_ij, u_j, input_precision="ieee")
        t_ii = tl.load(a_ptr + blk + rows[:, None] * BN + rows[None, :])
        u_i = tl.dot(t_ii, rhs, input_precision="ieee")
        tl.store(u_ptr + (bh * BN + rows[:, None]) * DV + offs_v[None, :], u_i, mask=ok_v[None, :])
        tl.debug_barrier()  # the next blocks read this block's u from the scratch
        qk_ii = tl.load(qk_ptr + blk + rows[:, None] * BN + rows[None, :])
        acc += tl.dot(qk_ii, u_i, input_precision="ieee")
        tl.store(
            o_ptr + ((b * N + rows[:, None]) * HV + hv) * DV + offs_v[None, :],
            tl.where(real[:, None], acc, 0.0),
            mask=ok_r[:, None] & ok_v[None, :],
        )


def choose_wy_block_v(dv: int, override: int | None = None) -> int:
    """The output launch's value tile: ``WY_BLOCK_V`` columns, or ``dv`` rounded up to a power of
    two when that is narrower (at least 16: ``tl.dot``'s smallest tile); ``override`` (a power of
    two >= 16) as is."""
    if override is not None:
        if override < 16 or override & (override - 1):
            raise ValueError(f"block_v must be a power of two >= 16; got {override}")
        return override
    return max(16, min(WY_BLOCK_V, triton.next_power_of_2(dv)))


def tree_gated_delta_rule_wy(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    paths: torch.Tensor,
    initial_state: torch.Tensor,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``tree_gated_delta_rule`` on a ``tree_paths`` table ``[bs, N, W]`` by the blocked WY solve:
    ``o [bs, N, Hv, V]`` float32 (layouts and arguments as ``tree_gated_delta_rule_triton``)."""
    check_inputs(q, k, v, g, beta, initial_state)
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if paths.dim() != 3 or paths.shape[:2] != (bs, n):
        raise ValueError(f"paths must be [bs, N, W] = [{bs}, {n}, W]; got {tuple(paths.shape)}")
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    paths = paths.to(torch.int32).contiguous()
    width = paths.shape[2]
    nt = triton.cdiv(n, BT)
    bn = nt * BT
    dev = k.device
    a = torch.empty(bs * hv, bn, bn, dtype=torch.float32, device=dev)
    qk = torch.empty_like(a)
    gam = torch.empty(bs * hv, bn, dtype=torch.float32, device=dev)
    u = torch.empty(bs * hv, bn, dv, dtype=torch.float32, device=dev)
    o = torch.empty(bs, n, hv, dv, dtype=torch.float32, device=dev)
    bk = max(16, triton.next_power_of_2(dk))
    warps = num_warps or WY_WARPS
    _wy_kkt_kernel[(nt, bs * hv)](
        q,
        k,
        g,
        beta,
        paths,
        a,
        qk,
        gam,
        *q.stride()[:3],
        *k.stride()[:3],
        *g.stride(),
        *beta.stride(),
        n,
        W=width,
        BW=triton.next_power_of_2(width),
        HV=hv,
        GRP=hv // hk,
        DK=dk,
        BK=bk,
        BKC=min(bk, KKT_K_SLICE),
        BT=BT,
        BN=bn,
        num_warps=warps,
    )
    bv = choose_wy_block_v(dv, block_v)
    _wy_out_kernel[(triton.cdiv(dv, bv), bs * hv)](
        q,
        k,
        v,
        beta,
        paths,
        initial_state,
        a,
        qk,
        gam,
        u,
        o,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *beta.stride(),
        *initial_state.stride(),
        n,
        W=width,
        HV=hv,
        GRP=hv // hk,
        DK=dk,
        DV=dv,
        BK=bk,
        BV=bv,
        BT=BT,
        BN=bn,
        num_warps=warps,
    )
    return o
