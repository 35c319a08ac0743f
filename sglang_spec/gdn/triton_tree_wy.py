"""The GDN tree verify's kernels: ``tree_gated_delta_rule`` as one triangular solve, ``U = (I +
A)^{-1} R``, in 16-row blocks, with no node-by-node walk (the walk, ``triton_tree_recurrence``, is
kept as the independent Triton form the tests and ``benchmarks/gdn_tree_recurrence.py`` compare
against).

Same contract as ``tree_recurrence.tree_gated_delta_rule`` on a ``tree_paths`` table (module
docstring there), float32 inside; with ``SGLANG`` set, the contract of the walk's SGLang mode
(``triton_tree_recurrence``, ``sglang_verify.gdn_tree_verify``): entry
``sglang_verify.gdn_tree_verify_wy``, which the patched verify calls (patch 0002).

The math (the torch core's, written as matrices over the ``N`` nodes of one request and value
head): with ``gamma_i`` the sum of ``g`` along node ``i``'s root path and ``M[i, s]`` set when
``s`` is on that path (``s = i`` included),

    A[i, s]  = beta_i exp(gamma_i - gamma_s) (k_s . k_i)   for s a strict ancestor of i, else 0
    QK[i, s] = exp(gamma_i - gamma_s) (k_s . q_i)          for s on path(i), else 0
    R_i      = beta_i (v_i - exp(gamma_i) S_0^T k_i)
    U        = (I + A)^{-1} R        (A strictly lower triangular: parents precede children)
    O        = exp(gamma) S_0^T q + QK U

Padding rows (``paths[b, i, 0] < 0``) are on no path, get ``R_i = 0`` and output zeros.

Three launches (after fla's chunked gated delta rule: ``chunk_scaled_dot_kkt``, ``solve_tril``,
``chunk_o``), with the ``N`` nodes padded to ``BN`` (a power of two, at least ``BT = 16``) and one
float32 scratch row per request and value head (:func:`tree_wy_scratch`):

- ``_wy_kkt_kernel``, one program per lower ``[16, 16]`` block ``(i, j)`` and request x value head:
  the rows' and columns' ``gamma`` (one gather of ``g`` over their path rows), the blocks of ``A``
  and ``QK`` (``tl.dot`` over ``K_SLICE``-column slices of ``K``; the ancestor mask read from
  the path table as ``M[i, s] = paths[i, depth_s] == s``). A diagonal block stores
  ``(I + A_ii)^{-1}`` (six products, ``_unit_lower_inverse``) and its nodes' ``gamma``, ``beta``
  and key / query norms.
- ``_wy_solve_kernel`` (``BN > 16``), one program per request x value head: the off-diagonal
  blocks of ``T = (I + A)^{-1}``, block row by block row (``BN / 16 - 1`` dependent steps of
  ``[16, 16]`` products, no value columns).
- ``_wy_out_kernel``, one program per value tile of ``BV`` columns and request x value head, all
  ``BN`` nodes at once: ``S_0^T k`` and ``S_0^T q`` over ``K`` slices of the pool row, ``R``,
  ``U = T R`` and ``O = e^gamma S_0^T q + QK U``: no dependent steps, ``U`` never leaves registers.
  Past ``MAX_ONE_TILE_NODES`` rows (whose ``[BN, BN]`` blocks would outgrow a block's shared
  memory) it works in blocks of ``TILE_ROWS`` rows through a float32 buffer
  (:func:`_wy_out_tiled`), up to ``MAX_WY_NODES`` nodes.

Every ``tl.dot`` runs in ``WY_DOT_PRECISION`` (``tf32x3``: tensor cores, about float32's
accuracy; on the H200 the outputs met the torch core to 1.3e-7 at the 27B shape,
``benchmarks/results/e2e_h200/session20/``).

With ``SGLANG`` the launches read SGLang's raw inputs, like the walk's SGLang mode: the conv
output's q/k/v, the gate inputs ``a``, ``b`` (``g = _sglang_g(a)``, ``beta = _sglang_beta(b)``,
the walk's functions) and the pool row ``cache_indices[b]`` (``< 0``: a padding request, which
gets zero outputs and reads and writes nothing else); the output is in the activation dtype. The
q/k l2-norm and the ``K^-0.5`` scale are applied to the products: the kkt launch scales its
blocks by the rows' and columns' inverse norms (summed over the same ``K`` slices) and stores the
rows' for the output launch, which scales ``S_0^T k`` and ``S_0^T q`` by them. With ``RING`` they
store what the walk stores into the
ReplaySSM ring at column = node index: the kkt launch each node's ``g``, ``beta`` and (one program
per key head) its raw pre-norm ``k``, the output launch its raw ``v``.

Nothing is read back to the host (CUDA-graph capturable with a fixed-width path table).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs
from .tree_replayssm import MAX_TREE_WIDTH
from .triton_tree_recurrence import _sglang_beta, _sglang_g

#: Rows per block of the solve (``tl.dot``'s smallest tile).
BT = 16

#: The output launch's value tile and warps: on the H200 (one Qwen3.6-27B GDN layer, bs 1-32,
#: N 16 and 64, session 20) 32 columns on 4 warps was the fastest of 32 x (4 | 8 warps) and
#: 64 x 8 in every cell. Trees of one ``BT``-row block (budgets up to 15) take
#: ``WY_BLOCK_V_ONE_BLOCK`` columns instead: 64 x 4, never timed in session 20, was the fastest on
#: an H100 at N 8 and 16 (session 32: 55 against 64 us at bs 16, 103 against 120 at bs 32, 14 at
#: bs 1 either way), as the programs that re-read each tile's ``k`` / ``q`` rows halve.
WY_BLOCK_V = 32
WY_BLOCK_V_ONE_BLOCK = 64

#: Key columns per ``tl.dot`` of the ``A`` / ``QK`` launch and of the output launch's ``S_0^T k`` /
#: ``S_0^T q`` (all 128 at once spilled on sm_90).
K_SLICE = 32

#: The most rows the output launch holds at once. Holding all ``BN`` rows, its ``[BN, BN]`` float32
#: blocks of ``T`` and ``QK`` go through shared memory: compiled for sm_90 it asks for 20 KB at
#: ``BN`` = 64 (Triton 3.6, the H200's), 64 KB at 128 (with 1.2 KB of spills) and 256 KB at 256,
#: over the 227 KB a block may use on an H200 (session 27). Wider trees take it in blocks of
#: ``TILE_ROWS`` rows (``_wy_out_tiled``, through a ``[bs * Hv, 3, BN, V]`` float32 buffer): 64 KB
#: at any width, no spills at the tiny pair's dims. Budgets up to 63 (the 27B shape's) keep the
#: one-tile launch, whose timings are measured.
MAX_ONE_TILE_NODES = 64
TILE_ROWS = 64

#: The most tree nodes (verify tokens per request) the launches take: the widest the tests check
#: (the tiled output launch compiles for sm_90 at 512 rows too; the solve launch's dependent steps
#: grow with the rows). One number with the start-up refusal's (``tree_replayssm``).
MAX_WY_NODES = MAX_TREE_WIDTH

WY_WARPS = 4

#: Every launch's ``tl.dot`` precision: three tf32 tensor-core products per float32 product
#: (IEEE float32 on the CUDA cores was 1.5-3x slower at the 27B shape, session 20).
WY_DOT_PRECISION = "tf32x3"

#: Warps per program of the kkt and solve launches (16 x 16 tiles). Compiled as launched at the 27B
#: shape (SGLang + ring mode, Triton 3.6, sm_90), the kkt launch holds 126 registers a thread on 4
#: warps (four programs an SM: the 768 programs of bs 16 ran in two waves) and 136 on 2 (seven an
#: SM, one wave). On an H100 (session 33, one 27B layer, the whole verify) 2 warps took 46.2
#: against 55.3 us at bs 16 / N 8, 84.4 against 101.4 at bs 32 / N 8, 224 against 293 at bs 16 /
#: N 64, 423 against 572 at bs 32 / N 64, 30.5 against 34.1 at bs 1 / N 64 and 14.4 against 13.8
#: at bs 1 / N 8. 16-column slices on 2 warps were slower (48.1 at bs 16 / N 8); the solve launch
#: gains from 2 warps as well.
KKT_WARPS = 2


@triton.jit
def _scratch_parts(scr_ptr, bh, BN: tl.constexpr):
    """Request x value head ``bh``'s row of the scratch, split into ``T`` and ``QK`` ``[BN, BN]``
    (row-major; ``T`` holds ``A`` until the solve launch replaces it by ``(I + A)^{-1}``) and the
    per-node ``gamma``, ``beta``, ``1 / |k|`` and ``scale / |q|`` ``[BN]`` (in that order)."""
    base = scr_ptr + bh.to(tl.int64) * (BN * (2 * BN + 4))
    node = base + 2 * BN * BN
    return base, base + BN * BN, node, node + BN, node + 2 * BN, node + 3 * BN


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
def _unit_lower_inverse(a, BT: tl.constexpr, PREC: tl.constexpr):
    """``(I + a)^{-1}`` of a strictly lower triangular ``[16, 16]`` ``a``: ``a^16 = 0``, so the
    inverse is ``(I - a)(I + a^2)(I + a^4)(I + a^8)``, six products instead of 15 dependent
    substitution steps."""
    r = tl.arange(0, BT)
    t = (r[:, None] == r[None, :]).to(tl.float32) - a
    p = a
    tl.static_assert(BT == 16)
    for _ in tl.static_range(3):  # a^2, a^4, a^8
        p = tl.dot(p, p, input_precision=PREC)
        t += tl.dot(t, p, input_precision=PREC)
    return t


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
    BK: tl.constexpr,
    BKC: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
    PREC: tl.constexpr,
):
    """Block ``(i, j)``, ``j <= i``, of ``A`` and ``QK`` for one request x value head (grid: the
    ``nt (nt + 1) / 2`` lower blocks x requests*value heads, block ``p = i (i + 1) / 2 + j``). A
    diagonal block stores ``(I + A_ii)^{-1}`` for ``A_ii`` and its nodes' ``gamma``, ``beta`` and
    key / query norms for the output launch; ``RING``: also their ``g``, ``beta`` and raw ``k``."""
    p = tl.program_id(0)
    bh = tl.program_id(1)
    i_t = ((tl.sqrt(8.0 * p + 1.0) - 1.0) * 0.5).to(tl.int32)
    i_t += ((i_t + 1) * (i_t + 2) // 2 <= p).to(tl.int32)  # guard the float root
    i_t -= (i_t * (i_t + 1) // 2 > p).to(tl.int32)
    j_t = p - i_t * (i_t + 1) // 2
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
    t_ptr, qk_ptr, gam_ptr, beta_s_ptr, ik_ptr, iq_ptr = _scratch_parts(scr_ptr, bh, BN)
    r = tl.arange(0, BT)
    rows = i_t * BT + r
    cols = j_t * BT + r
    ok_r = rows < N
    diag = i_t == j_t
    gam_r, _ = _path_rows(
        paths_ptr, g_ptr, b, rows, hv, N, sg_b, sg_n, sg_h, a_log, dt_bias, W, BW, SGLANG
    )
    gam_c, dep_c = _path_rows(
        paths_ptr, g_ptr, b, cols, hv, N, sg_b, sg_n, sg_h, a_log, dt_bias, W, BW, SGLANG
    )
    beta_r = tl.load(beta_ptr + b * sb_b + rows * sb_n + hv * sb_h, mask=ok_r, other=0.0).to(
        tl.float32
    )
    if SGLANG:
        beta_r = _sglang_beta(beta_r)
    k_base = k_ptr + b * sk_b + hk * sk_h
    q_base = q_ptr + b * sq_b + hk * sq_h
    if RING:
        ring_k = ring_k_ptr + tl.load(ring_rows_ptr + b).to(tl.int64) * srk_r + hk * srk_h
    kk = tl.zeros((BT, BT), dtype=tl.float32)
    qk = tl.zeros((BT, BT), dtype=tl.float32)
    ss_kr = tl.zeros((BT,), dtype=tl.float32)  # squared norms of the rows' k, q, the columns' k
    ss_qr = tl.zeros((BT,), dtype=tl.float32)
    ss_c = tl.zeros((BT,), dtype=tl.float32)
    for c in range(0, BK, BKC):  # K in slices of BKC columns (all 128 at once spill on sm_90)
        offs_k = c + tl.arange(0, BKC)
        k_i = _key_rows(k_base, rows, sk_n, ok_r, c, DK, BKC)
        q_i = _key_rows(q_base, rows, sq_n, ok_r, c, DK, BKC)
        k_jt = tl.load(  # [BKC, BT]: the column block's keys, transposed
            k_base + cols[None, :] * sk_n + offs_k[:, None],
            mask=(cols[None, :] < N) & (offs_k < DK)[:, None],
            other=0.0,
        ).to(tl.float32)
        kk += tl.dot(k_i, k_jt, input_precision=PREC)
        qk += tl.dot(q_i, k_jt, input_precision=PREC)
        if SGLANG:
            ss_kr += tl.sum(k_i * k_i, 1)
            ss_qr += tl.sum(q_i * q_i, 1)
            ss_c += tl.sum(k_jt * k_jt, 0)
            if RING:  # the raw k of the block's nodes, by one program per key head
                if diag & (hv % GRP == 0):
                    tl.store(
                        ring_k + rows[:, None] * srk_n + offs_k[None, :],
                        k_i.to(ring_k_ptr.dtype.element_ty),
                        mask=ok_r[:, None] & (offs_k < DK)[None, :],
                    )
    if SGLANG:  # q, k l2-normed (q then scaled), as the walk does, applied to the products
        inv_k = 1.0 / tl.sqrt(ss_kr + 1e-6)
        inv_q = 1.0 / tl.sqrt(ss_qr + 1e-6) * scale
        inv_c = 1.0 / tl.sqrt(ss_c + 1e-6)
        kk *= inv_k[:, None] * inv_c[None, :]
        qk *= inv_q[:, None] * inv_c[None, :]
    else:
        inv_k = tl.full((BT,), 1.0, tl.float32)
        inv_q = tl.full((BT,), 1.0, tl.float32)
    on_path = _ancestor_mask(paths_ptr, b, rows, cols, dep_c, N, W)
    decay = tl.exp(tl.where(on_path, gam_r[:, None] - gam_c[None, :], 0.0))
    strict = on_path & (rows[:, None] != cols[None, :])
    a = tl.where(strict, beta_r[:, None] * decay * kk, 0.0)
    out = rows[:, None] * BN + cols[None, :]
    tl.store(qk_ptr + out, tl.where(on_path, decay * qk, 0.0))
    if diag:
        tl.store(t_ptr + out, _unit_lower_inverse(a, BT, PREC))
        tl.store(gam_ptr + rows, gam_r)
        tl.store(beta_s_ptr + rows, beta_r)
        tl.store(ik_ptr + rows, inv_k)
        tl.store(iq_ptr + rows, inv_q)
        if RING:
            ring_row = tl.load(ring_rows_ptr + b).to(tl.int64)
            a_r = tl.load(g_ptr + b * sg_b + rows * sg_n + hv * sg_h, mask=ok_r, other=0.0)
            g_r = _sglang_g(a_r.to(tl.float32), a_log, dt_bias)
            tl.store(ring_g_ptr + ring_row * srg_r + hv * srg_h + rows, g_r, mask=ok_r)
            tl.store(ring_beta_ptr + ring_row * srbeta_r + hv * srbeta_h + rows, beta_r, mask=ok_r)
    else:
        tl.store(t_ptr + out, a)


@triton.jit
def _wy_solve_kernel(
    scr_ptr,
    s0_rows_ptr,
    HV: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    SGLANG: tl.constexpr,
    PREC: tl.constexpr,
):
    """``T = (I + A)^{-1}`` of one request x value head from the kkt launch's blocks (grid:
    requests*value heads): ``T_ij = -T_ii sum_{j <= m < i} A_im T_mj`` block row by block row,
    each ``T_ij`` stored over ``A_ij`` (row ``i``'s later blocks only read ``A_im``, ``m > j``)."""
    bh = tl.program_id(0)
    if SGLANG:
        if tl.load(s0_rows_ptr + bh // HV) < 0:
            return
    t_ptr, _, _, _, _, _ = _scratch_parts(scr_ptr, bh, BN)
    r = tl.arange(0, BT)
    for i in range(1, BN // BT):
        rows = i * BT + r
        t_ii = tl.load(t_ptr + rows[:, None] * BN + rows[None, :])
        for j in range(0, i):
            x = tl.zeros((BT, BT), dtype=tl.float32)
            for m in range(j, i):
                a_im = tl.load(t_ptr + rows[:, None] * BN + (m * BT + r)[None, :])
                t_mj = tl.load(t_ptr + (m * BT + r)[:, None] * BN + (j * BT + r)[None, :])
                x += tl.dot(a_im, t_mj, input_precision=PREC)
            tl.store(
                t_ptr + rows[:, None] * BN + (j * BT + r)[None, :],
                -tl.dot(t_ii, x, input_precision=PREC),
            )
        tl.debug_barrier()  # the next block rows read this row's T


@triton.jit
def _node_terms(
    k_base, q_base, s0_base, v_base, ring_base, paths_base, gam_ptr, beta_s_ptr, ik_ptr, iq_ptr,
    rows, ok_r, offs_v, ok_v, sk_n, sq_n, sv_n, ss_k, srv_n,
    W: tl.constexpr, DK: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr, BV: tl.constexpr,
    ROWS: tl.constexpr, RING: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The output launch's per-node terms of ``ROWS`` rows ``rows`` of one value tile: whether each
    is a real node, ``e^gamma``, ``e^gamma S_0^T q`` (scaled) and ``R = beta (v - e^gamma S_0^T k)``
    (0 off every path); ``RING``: their raw ``v`` into the ring at ``ring_base``."""
    ks = tl.zeros((ROWS, BV), dtype=tl.float32)  # S_0^T k and S_0^T q of every node
    qs = tl.zeros((ROWS, BV), dtype=tl.float32)
    for c in range(0, BK, BKC):
        offs_k = c + tl.arange(0, BKC)
        s0 = tl.load(
            s0_base + offs_k[:, None] * ss_k, mask=(offs_k < DK)[:, None] & ok_v[None, :], other=0.0
        ).to(tl.float32)
        ks += tl.dot(_key_rows(k_base, rows, sk_n, ok_r, c, DK, BKC), s0, input_precision=PREC)
        qs += tl.dot(_key_rows(q_base, rows, sq_n, ok_r, c, DK, BKC), s0, input_precision=PREC)
    mask = ok_r[:, None] & ok_v[None, :]
    v = tl.load(v_base + rows[:, None] * sv_n + offs_v[None, :], mask=mask, other=0.0)
    v = v.to(tl.float32)
    if RING:  # the raw v, as SGLang's verify kernel stores it
        tl.store(
            ring_base + rows[:, None] * srv_n + offs_v[None, :],
            v.to(ring_base.dtype.element_ty),
            mask=mask,
        )
    real = tl.load(paths_base + rows * W, mask=ok_r, other=-1) >= 0
    decay = tl.exp(tl.load(gam_ptr + rows))
    beta = tl.load(beta_s_ptr + rows)
    ks *= tl.load(ik_ptr + rows)[:, None]
    qs *= tl.load(iq_ptr + rows)[:, None]
    rhs = tl.where(real[:, None], beta[:, None] * (v - decay[:, None] * ks), 0.0)
    return real, decay[:, None] * qs, rhs


@triton.jit
def _wy_out_tiled(
    q_ptr, k_ptr, v_ptr, paths_ptr, s0_ptr, scr_ptr, o_ptr, ring_v_ptr, ring_rows_ptr, rows_ptr,
    sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h, ss_b, ss_h, ss_k, ss_v, srv_r, srv_h,
    srv_n, N, b, hv, hk, bh, row,
    W: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
    BKC: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, RING: tl.constexpr,
    PREC: tl.constexpr, RB: tl.constexpr,
):  # fmt: skip
    """:func:`_wy_out_kernel`'s work in blocks of ``RB`` rows, for trees whose ``[BN, BN]`` blocks
    of ``T`` and ``QK`` would not fit a block's shared memory at once: (1) per row block, ``R``
    (``beta (v - e^gamma S_0^T k)``, 0 off every path) and ``e^gamma S_0^T q`` into the program's
    rows of ``rows_ptr``; (2) ``U = T R`` block row by block row (``T`` is block lower triangular);
    (3) ``O = e^gamma S_0^T q + QK U`` the same way. Each step reads what the one before wrote, from
    other threads of the program: a barrier between them."""
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_v = offs_v < DV
    block = tl.arange(0, RB)
    if row < 0:  # an SGLang padding request: zeros out, nothing else read or written
        for ib in range(0, BN, RB):
            rows = ib + block
            o_tile = o_ptr + ((b * N + rows[:, None]) * HV + hv) * DV + offs_v[None, :]
            o_mask = (rows < N)[:, None] & ok_v[None, :]
            tl.store(o_tile, tl.zeros((RB, BV), dtype=o_ptr.dtype.element_ty), mask=o_mask)
    else:
        _wy_out_tiled_rows(
            q_ptr + b * sq_b + hk * sq_h, k_ptr + b * sk_b + hk * sk_h, v_ptr, paths_ptr, s0_ptr,
            scr_ptr, o_ptr, ring_v_ptr, ring_rows_ptr, rows_ptr, sq_n, sk_n, sv_b, sv_n, sv_h,
            ss_b, ss_h, ss_k, ss_v, srv_r, srv_h, srv_n, N, b, hv, bh, row, offs_v, ok_v, W, HV,
            DK, DV, BK, BKC, BV, BT, BN, RING, PREC, RB,
        )  # fmt: skip


@triton.jit
def _lower_block_row(
    m_ptr, x_buf, acc, rows_i, ib, block, offs_v, ok_v,
    BN: tl.constexpr, DV: tl.constexpr, BT: tl.constexpr, RB: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``acc`` plus block row ``rows_i`` of ``M X``, ``M`` a block lower triangular ``[BN, BN]``
    matrix of the scratch (``T`` or ``QK``, only the blocks the kkt launch wrote are read) and ``X``
    the ``[BN, DV]`` rows of ``x_buf`` (this program's value tile)."""
    for jb in range(0, ib + RB, RB):
        rows_j = jb + block
        lower = (rows_i // BT)[:, None] >= (rows_j // BT)[None, :]
        m = tl.load(m_ptr + rows_i[:, None] * BN + rows_j[None, :], mask=lower, other=0.0)
        x = tl.load(x_buf + rows_j[:, None] * DV + offs_v[None, :], mask=ok_v[None, :], other=0.0)
        acc += tl.dot(m, x, input_precision=PREC)
    return acc


@triton.jit
def _wy_out_tiled_rows(
    q_base, k_base, v_ptr, paths_ptr, s0_ptr, scr_ptr, o_ptr, ring_v_ptr, ring_rows_ptr, rows_ptr,
    sq_n, sk_n, sv_b, sv_n, sv_h, ss_b, ss_h, ss_k, ss_v, srv_r, srv_h, srv_n, N, b, hv, bh, row,
    offs_v, ok_v,
    W: tl.constexpr, HV: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BK: tl.constexpr,
    BKC: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, RING: tl.constexpr,
    PREC: tl.constexpr, RB: tl.constexpr,
):  # fmt: skip
    """:func:`_wy_out_tiled` for a real request (``row >= 0``; ``q_base``, ``k_base``: its key
    head's rows)."""
    block = tl.arange(0, RB)
    t_ptr, qk_ptr, gam_ptr, beta_s_ptr, ik_ptr, iq_ptr = _scratch_parts(scr_ptr, bh, BN)
    r_buf = rows_ptr + bh.to(tl.int64) * (3 * BN * DV)
    u_buf = r_buf + BN * DV
    d_buf = u_buf + BN * DV
    s0_base = s0_ptr + row * ss_b + hv * ss_h + offs_v[None, :] * ss_v
    v_base = v_ptr + b * sv_b + hv * sv_h
    ring_base = v_base  # unread without the ring
    if RING:
        ring_base = ring_v_ptr + tl.load(ring_rows_ptr + b).to(tl.int64) * srv_r + hv * srv_h
    for jb in range(0, BN, RB):
        rows = jb + block
        _, dq, rhs = _node_terms(
            k_base, q_base, s0_base, v_base, ring_base, paths_ptr + b * N * W, gam_ptr,
            beta_s_ptr, ik_ptr, iq_ptr, rows, rows < N, offs_v, ok_v, sk_n, sq_n, sv_n, ss_k,
            srv_n, W, DK, BK, BKC, BV, RB, RING, PREC,
        )  # fmt: skip
        at = rows[:, None] * DV + offs_v[None, :]
        tl.store(r_buf + at, rhs, mask=ok_v[None, :])
        tl.store(d_buf + at, dq, mask=ok_v[None, :])
    tl.debug_barrier()
    for ib in range(0, BN, RB):
        rows_i = ib + block
        u = _lower_block_row(t_ptr, r_buf, tl.zeros((RB, BV), dtype=tl.float32), rows_i, ib, block,
                             offs_v, ok_v, BN, DV, BT, RB, PREC)  # fmt: skip
        tl.store(u_buf + rows_i[:, None] * DV + offs_v[None, :], u, mask=ok_v[None, :])
    tl.debug_barrier()
    for ib in range(0, BN, RB):
        rows_i = ib + block
        ok_r = rows_i < N
        o = tl.load(d_buf + rows_i[:, None] * DV + offs_v[None, :], mask=ok_v[None, :], other=0.0)
        o = _lower_block_row(qk_ptr, u_buf, o, rows_i, ib, block, offs_v, ok_v, BN, DV, BT, RB,
                             PREC)  # fmt: skip
        real = tl.load(paths_ptr + (b * N + rows_i) * W, mask=ok_r, other=-1) >= 0
        o_tile = o_ptr + ((b * N + rows_i[:, None]) * HV + hv) * DV + offs_v[None, :]
        tl.store(
            o_tile,
            tl.where(real[:, None], o, 0.0).to(o_ptr.dtype.element_ty),
            mask=ok_r[:, None] & ok_v[None, :],
        )


@triton.jit
def _wy_out_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    paths_ptr,
    s0_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (the pool row per request, < 0 = padding)
    scr_ptr,
    o_ptr,
    ring_v_ptr,  # RING only: [R, Hv, N, V]
    ring_rows_ptr,  # RING: the ring row per request
    rows_ptr,  # TILED only: [bs * Hv, 3, BN, DV] float32, rhs / U / e^gamma S_0^T q by row
    sq_b,
    sq_n,
    sq_h,
    sk_b,
    sk_n,
    sk_h,
    sv_b,
    sv_n,
    sv_h,
    ss_b,
    ss_h,
    ss_k,
    ss_v,
    srv_r,
    srv_h,
    srv_n,
    N,
    W: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BKC: tl.constexpr,
    BV: tl.constexpr,
    BT: tl.constexpr,
    BN: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
    PREC: tl.constexpr,
    TILED: tl.constexpr,
    RB: tl.constexpr,
):
    """``U = T R`` and ``O = e^gamma S_0^T q + QK U`` of one value tile of one request x value head
    for all ``BN`` nodes at once, no dependent steps (grid: value tiles x requests*value heads);
    ``RING``: the tile's columns of the raw ``v`` in the ring. ``TILED`` (``BN`` past
    ``MAX_ONE_TILE_NODES``): the same in blocks of ``RB`` rows (:func:`_wy_out_tiled`)."""
    bh = tl.program_id(1)
    b = bh // HV
    hv = bh % HV
    hk = hv // GRP
    if SGLANG:
        row = tl.load(s0_rows_ptr + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    if TILED:
        _wy_out_tiled(
            q_ptr, k_ptr, v_ptr, paths_ptr, s0_ptr, scr_ptr, o_ptr, ring_v_ptr, ring_rows_ptr,
            rows_ptr, sq_b, sq_n, sq_h, sk_b, sk_n, sk_h, sv_b, sv_n, sv_h, ss_b, ss_h, ss_k,
            ss_v, srv_r, srv_h, srv_n, N, b, hv, hk, bh, row, W, HV, DK, DV, BK, BKC, BV, BT, BN,
            RING, PREC, RB,
        )  # fmt: skip
        return
    rows = tl.arange(0, BN)
    ok_r = rows < N
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_v = offs_v < DV
    o_tile = o_ptr + ((b * N + rows[:, None]) * HV + hv) * DV + offs_v[None, :]
    o_mask = ok_r[:, None] & ok_v[None, :]
    if row < 0:  # an SGLang padding request: zeros out, nothing else read or written
        tl.store(o_tile, tl.zeros((BN, BV), dtype=o_ptr.dtype.element_ty), mask=o_mask)
        return
    t_ptr, qk_ptr, gam_ptr, beta_s_ptr, ik_ptr, iq_ptr = _scratch_parts(scr_ptr, bh, BN)
    s0_base = s0_ptr + row * ss_b + hv * ss_h + offs_v[None, :] * ss_v
    v_base = v_ptr + b * sv_b + hv * sv_h
    ring_base = v_base  # unread without the ring
    if RING:
        ring_base = ring_v_ptr + tl.load(ring_rows_ptr + b).to(tl.int64) * srv_r + hv * srv_h
    real, dq, rhs = _node_terms(
        k_ptr + b * sk_b + hk * sk_h, q_ptr + b * sq_b + hk * sq_h, s0_base, v_base, ring_base,
        paths_ptr + b * N * W, gam_ptr, beta_s_ptr, ik_ptr, iq_ptr, rows, ok_r, offs_v, ok_v,
        sk_n, sq_n, sv_n, ss_k, srv_n, W, DK, BK, BKC, BV, BN, RING, PREC,
    )  # fmt: skip
    lower = (rows // BT)[:, None] >= (rows // BT)[None, :]  # the blocks the kkt launch wrote
    t = tl.load(t_ptr + rows[:, None] * BN + rows[None, :], mask=lower, other=0.0)
    u = tl.dot(t, rhs, input_precision=PREC)
    qkm = tl.load(qk_ptr + rows[:, None] * BN + rows[None, :], mask=lower, other=0.0)
    o = dq + tl.dot(qkm, u, input_precision=PREC)
    tl.store(o_tile, tl.where(real[:, None], o, 0.0).to(o_ptr.dtype.element_ty), mask=o_mask)


def choose_wy_block_v(dv: int, bn: int, override: int | None = None) -> int:
    """The output launch's value tile for ``bn`` rows (:func:`wy_block_rows`):
    ``WY_BLOCK_V_ONE_BLOCK`` columns for a tree of one ``BT``-row block, else ``WY_BLOCK_V``, or
    ``dv`` rounded up to a power of two when that is narrower (at least 16: ``tl.dot``'s smallest
    tile); ``override`` (a power of two >= 16) as is."""
    if override is not None:
        if override < 16 or override & (override - 1):
            raise ValueError(f"block_v must be a power of two >= 16; got {override}")
        return override
    widest = WY_BLOCK_V_ONE_BLOCK if bn <= BT else WY_BLOCK_V
    return max(16, min(widest, triton.next_power_of_2(dv)))


def wy_block_rows(n: int) -> int:
    """``BN``: the rows the launches give an ``n``-node tree, ``n`` rounded up to a power of two
    of at least ``BT`` (the output launch holds all of them in one tile)."""
    return max(BT, triton.next_power_of_2(n))


def wy_scratch_width(n: int) -> int:
    """Floats per request and value head of :func:`tree_wy_scratch` for ``N = n`` nodes: ``T`` and
    ``QK`` ``[BN, BN]`` and four ``[BN]`` node vectors, ``BN = wy_block_rows(n)`` (the output
    launch keeps ``U`` in registers)."""
    bn = wy_block_rows(n)
    return bn * (2 * bn + 4)


def tree_wy_scratch(requests: int, n: int, hv: int, device) -> torch.Tensor:
    """The ``[requests, Hv, wy_scratch_width(n)]`` float32 scratch of the WY launches for
    trees of ``n`` nodes. Every part is written before it is read (the kkt launch writes every
    lower block of ``A`` / ``QK`` and the node vectors of every real request, the solve launch
    reads only those and the blocks it wrote itself), so it needs no initialisation, and one
    scratch serves every layer of a step and every batch of at most ``requests`` requests of
    ``n``-node trees."""
    return torch.empty(requests, hv, wy_scratch_width(n), dtype=torch.float32, device=device)


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
    """Launch ``_wy_kkt_kernel``, ``_wy_solve_kernel`` (more than one 16-row block) and
    ``_wy_out_kernel``, both modes. Arguments as ``triton_tree_recurrence.launch_tree_kernel``'s
    (``g, beta``: with ``sglang`` the gate inputs ``a``, ``b``; ``o`` contiguous ``[bs * N, Hv,
    V]``-shaped, in any float dtype), but one ``scratch`` from :func:`tree_wy_scratch` with
    ``>= bs`` requests for this ``N``. ``sglang = (A_log, dt_bias, cache_indices, scale)`` selects
    the SGLang mode; ``ring = (rawk, rawv, g, beta, ring_rows)`` adds its ring stores (SGLang mode
    only); ``num_warps`` is the output launch's."""
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if n > MAX_WY_NODES:
        raise ValueError(
            f"the WY tree verify takes at most {MAX_WY_NODES} nodes per tree; got N = {n}"
        )
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
    bn = wy_block_rows(n)
    nt = bn // BT
    bk = max(16, triton.next_power_of_2(dk))
    width = paths.shape[2]
    consts = dict(
        W=width,
        HV=hv,
        GRP=hv // hk,
        DK=dk,
        BK=bk,
        BKC=min(bk, K_SLICE),
        BT=BT,
        BN=bn,
        SGLANG=sglang is not None,
        RING=ring is not None,
    )
    _wy_kkt_kernel[(nt * (nt + 1) // 2, bs * hv)](
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
        PREC=WY_DOT_PRECISION,
        num_warps=KKT_WARPS,
        **consts,
    )
    if nt > 1:
        _wy_solve_kernel[(bs * hv,)](
            scratch,
            rows,
            HV=hv,
            BT=BT,
            BN=bn,
            SGLANG=sglang is not None,
            PREC=WY_DOT_PRECISION,
            num_warps=KKT_WARPS,
        )
    bv = choose_wy_block_v(dv, bn, block_v)
    tiled = bn > MAX_ONE_TILE_NODES
    by_row = (
        torch.empty(bs * hv, 3, bn, dv, dtype=torch.float32, device=o.device) if tiled else o
    )  # o: an unread placeholder
    _wy_out_kernel[(triton.cdiv(dv, bv), bs * hv)](
        q,
        k,
        v,
        paths,
        initial_state,
        rows,
        scratch,
        o,
        ring_v,
        ring_rows,
        by_row,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *initial_state.stride(),
        *out_ring_strides,
        n,
        DV=dv,
        BV=bv,
        PREC=WY_DOT_PRECISION,
        TILED=tiled,
        RB=TILE_ROWS,
        num_warps=num_warps or WY_WARPS,
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
        tree_wy_scratch(bs, n, hv, k.device),
        o,
        block_v=block_v,
        num_warps=num_warps,
    )
    return o
