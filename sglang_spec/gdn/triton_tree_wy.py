"""A blocked-WY candidate for ``tree_gated_delta_rule``: the tree's update vectors from one
triangular solve in 16-row blocks instead of a walk of the nodes one by one.

Same contract as ``tree_recurrence.tree_gated_delta_rule`` on a ``tree_paths`` table (module
docstring there), float32 inside; with ``SGLANG`` set, the contract of the walk's SGLang mode
(``triton_tree_recurrence``, ``sglang_verify.gdn_tree_verify``; entry
``sglang_verify.gdn_tree_verify_wy``). Not wired into the verify path: a candidate to time against
the walk with ``benchmarks/gdn_tree_recurrence.py --wy``.

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
``BT = 16``, and one float32 scratch row per request and value head (:func:`tree_wy_scratch`):

- ``_wy_kkt_kernel``, one program per (16-row block ``i``, request x value head): each node's
  ``gamma`` (one gather of ``g`` over its path row), then for every column block ``j <= i`` the
  ``[16, 16]`` blocks of ``A`` and ``QK`` (``tl.dot`` over ``K`` in IEEE float32, the ancestor mask
  read from the path table as ``M[i, s] = paths[i, depth_s] == s``). The diagonal block of ``A``
  is replaced by ``(I + A_ii)^{-1}``, formed by forward substitution in registers. Writes ``A``,
  ``QK`` ``[BN, BN]`` (lower blocks only) and ``gamma`` ``[BN]`` into the scratch row.
- ``_wy_out_kernel``, one program per (value tile of ``BV`` columns, request x value head), its
  ``[K, BV]`` tile of ``S_0`` in registers: block by block, ``R_i`` minus ``A_ij U_j`` over the
  earlier blocks, ``U_i = (I + A_ii)^{-1} (...)`` (a block forward substitution: ``ceil(N / 16)``
  dependent steps instead of ``N``), stored to the scratch row's ``U`` ``[BN, V]`` for the later
  blocks (barrier), and ``O_i`` from the same loads.

With ``SGLANG`` both launches read SGLang's raw inputs, like the walk's SGLang mode: the conv
output's q/k/v, the gate inputs ``a``, ``b`` (``g = _sglang_g(a)``, ``beta = _sglang_beta(b)``,
the walk's functions) and the pool row ``cache_indices[b]`` (``< 0``: a padding request, which
gets zero outputs and reads and writes nothing else); the output is in the activation dtype. The
q/k l2-norm and the ``K^-0.5`` scale are applied in the walk's order: the kkt launch multiplies its
row block's ``q``, ``k`` by their inverse norms (``q`` then by the scale) before the products and
the column block's products by the columns' inverse norms after them (as the walk's
``_tree_prep_kernel`` does with a node's ancestors); the output launch normalises and scales its
rows as the walk's node loop does. With ``RING`` they store what the walk stores into the
ReplaySSM ring at column = node index: the kkt launch each node's ``g``, ``beta`` and (one program
per key head) its raw pre-norm ``k``, the output launch its raw ``v``.

Nothing is read back to the host (CUDA-graph capturable with a fixed-width path table).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs
from .triton_tree_recurrence import _program_state_tile, _sglang_beta, _sglang_g

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
def _scratch_parts(scr_ptr, bh, BN: tl.constexpr, DV: tl.constexpr):
    """Request x value head ``bh``'s row of the scratch, split into ``A`` and ``QK`` ``[BN, BN]``,
    ``gamma`` ``[BN]`` and ``U`` ``[BN, DV]`` (row-major, in that order)."""
    base = scr_ptr + bh.to(tl.int64) * (BN * (2 * BN + 1 + DV))
    return base, base + BN * BN, base + 2 * BN * BN, base + 2 * BN * BN + BN


@triton.jit
def _key_rows(base, rows, stride, ok_r, c, DK: tl.constexpr, BK: tl.constexpr):
    """The float32 ``[rows, BK]`` tile of key columns ``c .. c + BK - 1`` of q or k rows ``rows``
    (0 where ``ok_r`` is not set and past ``DK``)."""
    offs_k = c + tl.arange(0, BK)
    return tl.load(
        base + rows[:, None] * stride + offs_k[None, :],
        mask=ok_r[:, None] & (offs_k < DK)[None, :],
        other=0.0,
    ).to(tl.float32)


@triton.jit
def _inv_l2(x):
    """Per row of ``x``, SGLang's l2-norm factor ``1 / sqrt(|x|^2 + 1e-6)`` (the walk's)."""
    return 1.0 / tl.sqrt(tl.sum(x * x, 1) + 1e-6)


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
    a_log,
    dt_bias,
    W: tl.constexpr,
    BW: tl.constexpr,
    SGLANG: tl.constexpr,
):
    """``gamma`` (sum of ``g`` of value head ``hv`` over the root path; ``SGLANG``: ``g`` formed
    from the gate input ``a`` at ``g_ptr``) and the depth (``-1`` for a padding row or a row past
    ``N``) of nodes ``rows`` of request ``b``."""
    t = tl.arange(0, BW)
    node = tl.load(
        paths_ptr + (b * N + rows[:, None]) * W + t[None, :],
        mask=(rows[:, None] < N) & (t[None, :] < W),
        other=-1,
    )
    on = node >= 0
    gv = tl.load(g_ptr + b * sg_b + node * sg_n + hv * sg_h, mask=on, other=0.0).to(tl.float32)
    if SGLANG:
        gv = tl.where(on, _sglang_g(gv, a_log, dt_bias), 0.0)
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
    g_ptr,  # SGLANG: the gate input a
    beta_ptr,  # SGLANG: the gate input b
    a_log_ptr,  # SGLANG only
    dt_bias_ptr,  # SGLANG only
    paths_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (< 0 = a padding request, skipped)
    scr_ptr,
    ring_k_ptr,  # RING only: [R, Hk, N, K], [R, Hv, N], [R, Hv, N]
    ring_g_ptr,
    ring_beta_ptr,
    ring_rows_ptr,  # RING: the ring row per request
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
    srk_r,
    srk_h,
    srk_n,
    srg_r,
    srg_h,
    srbeta_r,
    srbeta_h,
    scale,
    N,
    W: tl.constexpr,
    BW: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BKC: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
):
    """Row block ``i`` of ``A`` (diagonal block: ``(I + A_ii)^{-1}``), of ``QK`` and of ``gamma``
    for one request x value head (grid: row blocks x requests*value heads); ``RING``: the block's
    nodes' ``g``, ``beta`` and raw ``k`` in the ring (their raw ``v`` is the output launch's)."""
    i_t = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // HV
    hv = bh % HV
    hk = hv // GRP
    if SGLANG:
        if tl.load(s0_rows_ptr + b) < 0:  # a padding request: the output launch reads nothing
            return
        a_log = tl.load(a_log_ptr + hv).to(tl.float32)
        dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    else:  # unread
        a_log = 0.0
        dt_bias = 0.0
    a_ptr, qk_ptr, gam_ptr, _ = _scratch_parts(scr_ptr, bh, BN, DV)
    r = tl.arange(0, BT)
    rows = i_t * BT + r
    ok_r = rows < N
    gam_r, _ = _path_rows(
        paths_ptr, g_ptr, b, rows, hv, N, sg_b, sg_n, sg_h, a_log, dt_bias, W, BW, SGLANG
    )
    beta_r = tl.load(beta_ptr + b * sb_b + rows * sb_n + hv * sb_h, mask=ok_r, other=0.0).to(
        tl.float32
    )
    tl.store(gam_ptr + rows, gam_r)

    k_base = k_ptr + b * sk_b + hk * sk_h
    q_base = q_ptr + b * sq_b + hk * sq_h
    if SGLANG:
        beta_r = _sglang_beta(beta_r)
        if RING:
            ring_row = tl.load(ring_rows_ptr + b).to(tl.int64)
            a_r = tl.load(g_ptr + b * sg_b + rows * sg_n + hv * sg_h, mask=ok_r, other=0.0)
            g_r = _sglang_g(a_r.to(tl.float32), a_log, dt_bias)
            tl.store(ring_g_ptr + ring_row * srg_r + hv * srg_h + rows, g_r, mask=ok_r)
            tl.store(ring_beta_ptr + ring_row * srbeta_r + hv * srbeta_h + rows, beta_r, mask=ok_r)
            ring_k = ring_k_ptr + ring_row * srk_r + hk * srk_h
        # the row block's squared q, k norms in BKC-column slices (raw k into the ring: one
        # program per key head stores it)
        ss_k = tl.zeros((BT,), dtype=tl.float32)
        ss_q = tl.zeros((BT,), dtype=tl.float32)
        for c in range(0, BK, BKC):
            k_s = _key_rows(k_base, rows, sk_n, ok_r, c, DK, BKC)
            q_s = _key_rows(q_base, rows, sq_n, ok_r, c, DK, BKC)
            ss_k += tl.sum(k_s * k_s, 1)
            ss_q += tl.sum(q_s * q_s, 1)
            if RING:
                if hv % GRP == 0:
                    offs_k = c + tl.arange(0, BKC)
                    tl.store(
                        ring_k + rows[:, None] * srk_n + offs_k[None, :],
                        k_s.to(ring_k_ptr.dtype.element_ty),
                        mask=ok_r[:, None] & (offs_k < DK)[None, :],
                    )
        inv_k_r = 1.0 / tl.sqrt(ss_k + 1e-6)
        inv_q_r = 1.0 / tl.sqrt(ss_q + 1e-6)
    out = rows[:, None] * BN
    for j in range(0, i_t + 1):
        cols = j * BT + r
        gam_c, dep_c = _path_rows(
            paths_ptr, g_ptr, b, cols, hv, N, sg_b, sg_n, sg_h, a_log, dt_bias, W, BW, SGLANG
        )
        on_path = _ancestor_mask(paths_ptr, b, rows, cols, dep_c, N, W)
        kk = tl.zeros((BT, BT), dtype=tl.float32)
        qk = tl.zeros((BT, BT), dtype=tl.float32)
        ss_c = tl.zeros((BT,), dtype=tl.float32)  # SGLANG: the column keys' squared norms
        for c in range(0, BK, BKC):  # K in slices of BKC columns
            offs_k = c + tl.arange(0, BKC)
            ok_k = offs_k < DK
            k_i = _key_rows(k_base, rows, sk_n, ok_r, c, DK, BKC)
            q_i = _key_rows(q_base, rows, sq_n, ok_r, c, DK, BKC)
            k_jt = tl.load(  # [BKC, BT]: the column block's keys, transposed
                k_base + cols[None, :] * sk_n + offs_k[:, None],
                mask=(cols[None, :] < N) & ok_k[:, None],
                other=0.0,
            ).to(tl.float32)
            if SGLANG:  # the row block's q, k l2-normed, then q scaled (the walk's order)
                q_i *= inv_q_r[:, None]
                k_i *= inv_k_r[:, None]
                q_i = q_i * scale
                ss_c += tl.sum(k_jt * k_jt, 0)
            kk += tl.dot(k_i, k_jt, input_precision="ieee")
            qk += tl.dot(q_i, k_jt, input_precision="ieee")
        if SGLANG:  # the column keys l2-normed after the products (the walk's ancestors')
            inv_c = 1.0 / tl.sqrt(ss_c + 1e-6)
            kk *= inv_c[None, :]
            qk *= inv_c[None, :]
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
def _zero_output(
    o_ptr, b, hv, N, HV: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr
):
    """Zeros into this program's value tile of request ``b``'s ``N`` output rows."""
    r = tl.arange(0, BT)
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    for i in range(0, tl.cdiv(N, BT)):
        rows = i * BT + r
        tl.store(
            o_ptr + ((b * N + rows[:, None]) * HV + hv) * DV + offs_v[None, :],
            tl.zeros((BT, BV), dtype=o_ptr.dtype.element_ty),
            mask=(rows < N)[:, None] & (offs_v < DV)[None, :],
        )


@triton.jit
def _wy_out_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    beta_ptr,  # SGLANG: the gate input b
    paths_ptr,
    s0_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (the pool row per request, < 0 = padding)
    scr_ptr,
    o_ptr,
    ring_v_ptr,  # RING only: [R, Hv, N, V]
    ring_rows_ptr,  # RING: the ring row per request
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
    srv_r,
    srv_h,
    srv_n,
    scale,
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
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
):
    """``U`` and ``O`` of one value tile of one request x value head, block by block (grid: value
    tiles x requests*value heads); ``RING``: the tile's columns of the raw ``v`` in the ring."""
    bh = tl.program_id(1)
    b = bh // HV
    if SGLANG:
        row = tl.load(s0_rows_ptr + b).to(tl.int64)
        if row < 0:  # a padding request: zeros out, nothing else read or written
            _zero_output(o_ptr, b, bh % HV, N, HV, DV, BV, BT)
            return
    else:
        row = b.to(tl.int64)
    hv, offs_k, offs_v, ok_k, ok_v, s0 = _program_state_tile(
        s0_ptr, row, ss_b, ss_h, ss_k, ss_v, HV, DK, DV, BK, BV
    )
    hk = hv // GRP
    a_ptr, qk_ptr, gam_ptr, u_ptr = _scratch_parts(scr_ptr, bh, BN, DV)
    if RING:
        ring_v = ring_v_ptr + tl.load(ring_rows_ptr + b).to(tl.int64) * srv_r + hv * srv_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    q_base = q_ptr + b * sq_b + hk * sq_h
    r = tl.arange(0, BT)
    for i in range(0, tl.cdiv(N, BT)):
        rows = i * BT + r
        ok_r = rows < N
        real = tl.load(paths_ptr + (b * N + rows) * W, mask=ok_r, other=-1) >= 0
        k_i = _key_rows(k_base, rows, sk_n, ok_r, 0, DK, BK)
        q_i = _key_rows(q_base, rows, sq_n, ok_r, 0, DK, BK)
        v_i = tl.load(
            v_ptr + b * sv_b + hv * sv_h + rows[:, None] * sv_n + offs_v[None, :],
            mask=ok_r[:, None] & ok_v[None, :],
            other=0.0,
        ).to(tl.float32)
        beta_i = tl.load(beta_ptr + b * sb_b + rows * sb_n + hv * sb_h, mask=ok_r, other=0.0).to(
            tl.float32
        )
        if SGLANG:
            if RING:  # the raw v, as SGLang's verify kernel stores it
                tl.store(
                    ring_v + rows[:, None] * srv_n + offs_v[None, :],
                    v_i.to(ring_v_ptr.dtype.element_ty),
                    mask=ok_r[:, None] & ok_v[None, :],
                )
            q_i *= _inv_l2(q_i)[:, None]  # l2-normed, then q scaled (the walk's order)
            k_i *= _inv_l2(k_i)[:, None]
            q_i = q_i * scale
            beta_i = _sglang_beta(beta_i)
        decay = tl.exp(tl.load(gam_ptr + rows))
        s0k = tl.dot(k_i, s0, input_precision="ieee")
        s0q = tl.dot(q_i, s0, input_precision="ieee")
        rhs = tl.where(real[:, None], beta_i[:, None] * (v_i - decay[:, None] * s0k), 0.0)
        acc = decay[:, None] * s0q
        for j in range(0, i):
            cols = j * BT + r
            u_j = tl.load(u_ptr + cols[:, None] * DV + offs_v[None, :], mask=ok_v[None, :])
            a_ij = tl.load(a_ptr + rows[:, None] * BN + cols[None, :])
            qk_ij = tl.load(qk_ptr + rows[:, None] * BN + cols[None, :])
            rhs -= tl.dot(a_ij, u_j, input_precision="ieee")
            acc += tl.dot(qk_ij, u_j, input_precision="ieee")
        t_ii = tl.load(a_ptr + rows[:, None] * BN + rows[None, :])
        u_i = tl.dot(t_ii, rhs, input_precision="ieee")
        tl.store(u_ptr + rows[:, None] * DV + offs_v[None, :], u_i, mask=ok_v[None, :])
        tl.debug_barrier()  # the next blocks read this block's u from the scratch
        qk_ii = tl.load(qk_ptr + rows[:, None] * BN + rows[None, :])
        acc += tl.dot(qk_ii, u_i, input_precision="ieee")
        tl.store(
            o_ptr + ((b * N + rows[:, None]) * HV + hv) * DV + offs_v[None, :],
            tl.where(real[:, None], acc, 0.0).to(o_ptr.dtype.element_ty),
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


def wy_scratch_width(n: int, dv: int) -> int:
    """Floats per request and value head of :func:`tree_wy_scratch` for ``N = n`` nodes and
    ``V = dv``: ``A`` and ``QK`` ``[BN, BN]``, ``gamma`` ``[BN]`` and ``U`` ``[BN, V]``, ``BN`` =
    ``n`` rounded up to whole 16-row blocks."""
    bn = triton.cdiv(n, BT) * BT
    return bn * (2 * bn + 1 + dv)


def tree_wy_scratch(requests: int, n: int, hv: int, dv: int, device) -> torch.Tensor:
    """The ``[requests, Hv, wy_scratch_width(n, dv)]`` float32 scratch of both WY launches for
    trees of ``n`` nodes. Every part is written before it is read (the kkt launch writes ``A``,
    ``QK``, ``gamma`` of every real request before the output launch reads them; block ``i`` of
    ``U`` is written before the blocks after it read it), so it needs no initialisation, and one
    scratch serves every layer of a step and every batch of at most ``requests`` requests of
    ``n``-node trees."""
    return torch.empty(requests, hv, wy_scratch_width(n, dv), dtype=torch.float32, device=device)


def launch_wy_kernels(
    q,
    k,
    v,
    g,
    beta,
    paths,
    initial_state,
    scratch,
    o,
    *,
    sglang=None,
    ring=None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Launch ``_wy_kkt_kernel`` then ``_wy_out_kernel``, both modes. Arguments as
    ``triton_tree_recurrence.launch_tree_kernel``'s (``g, beta``: with ``sglang`` the gate inputs
    ``a``, ``b``; ``o`` contiguous ``[bs * N, Hv, V]``-shaped, in any float dtype), but one
    ``scratch`` from :func:`tree_wy_scratch` with ``>= bs`` requests for this ``N``.
    ``sglang = (A_log, dt_bias, cache_indices, scale)`` selects the SGLang mode;
    ``ring = (rawk, rawv, g, beta, ring_rows)`` adds its ring stores (SGLang mode only)."""
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if sglang is None:
        if ring is not None:
            raise ValueError("the ring stores are the SGLang mode's: give sglang with ring")
        a_log = dt_bias = rows = paths  # unread placeholders
        scale = 1.0
    else:
        a_log, dt_bias, rows, scale = sglang
    if ring is None:
        ring_k = ring_v = ring_g = ring_beta = ring_rows = scratch  # unread placeholders
        kkt_ring_strides, out_ring_strides = (0,) * 7, (0,) * 3
    else:
        ring_k, ring_v, ring_g, ring_beta, ring_rows = ring
        kkt_ring_strides = (*ring_k.stride()[:3], *ring_g.stride()[:2], *ring_beta.stride()[:2])
        out_ring_strides = ring_v.stride()[:3]
    nt = triton.cdiv(n, BT)
    bk = max(16, triton.next_power_of_2(dk))
    width = paths.shape[2]
    consts = dict(
        W=width,
        HV=hv,
        GRP=hv // hk,
        DK=dk,
        DV=dv,
        BK=bk,
        BT=BT,
        BN=nt * BT,
        SGLANG=sglang is not None,
        RING=ring is not None,
        num_warps=num_warps or WY_WARPS,
    )
    _wy_kkt_kernel[(nt, bs * hv)](
        q,
        k,
        g,
        beta,
        a_log,
        dt_bias,
        paths,
        rows,
        scratch,
        ring_k,
        ring_g,
        ring_beta,
        ring_rows,
        *q.stride()[:3],
        *k.stride()[:3],
        *g.stride(),
        *beta.stride(),
        *kkt_ring_strides,
        scale,
        n,
        BW=triton.next_power_of_2(width),
        BKC=min(bk, KKT_K_SLICE),
        **consts,
    )
    bv = choose_wy_block_v(dv, block_v)
    _wy_out_kernel[(triton.cdiv(dv, bv), bs * hv)](
        q,
        k,
        v,
        beta,
        paths,
        initial_state,
        rows,
        scratch,
        o,
        ring_v,
        ring_rows,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *beta.stride(),
        *initial_state.stride(),
        *out_ring_strides,
        scale,
        n,
        BV=bv,
        **consts,
    )


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
    o = torch.empty(bs, n, hv, dv, dtype=torch.float32, device=k.device)
    launch_wy_kernels(
        q,
        k,
        v,
        g,
        beta,
        paths.to(torch.int32).contiguous(),
        initial_state,
        tree_wy_scratch(bs, n, hv, dv, k.device),
        o,
        block_v=block_v,
        num_warps=num_warps,
    )
    return o
