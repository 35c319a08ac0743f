"""Triton kernels of ``tree_recurrence`` for CUDA: the tree gated delta rule and the path replay.

Same math and layouts as ``tree_recurrence`` (its docstring has the derivation), float32 inside;
checked against the torch core under ``TRITON_INTERPRET=1`` on the CPU
(tests/test_gdn_tree_recurrence.py) and on the H200 (benchmarks/gdn_tree_recurrence.py). Neither
function reads anything back to the host, so both can be captured in a CUDA graph when ``paths`` is
built once per verify step with a fixed width (``tree_paths(parents, width=horizon + 1)``).

- ``_tree_prep_kernel``: one program per (node, request x key head). What depends only on the key
  head, formed once instead of in every value tile of every value head sharing it: node ``i``'s
  products with its ancestors' keys, ``KK[t] = khat_anc . khat_i`` and ``QK[t] = khat_anc . qhat_i``
  per path slot ``t`` (0 for an empty slot and for the slot holding ``i``), ``qhat_i . khat_i`` and
  the inverse l2 norms of ``k_i``, ``q_i`` (``SGLANG``: ``khat``, ``qhat`` are the l2-normed key
  and the l2-normed query times ``scale``; else the raw ``k``, ``q`` and norms 1), into
  ``[bs * N, Hk, 2 * W + 3]`` float32 rows (``tree_prep_scratch``).
- ``_tree_kernel``: one program per (value tile of ``BV`` columns, request x value head). Its
  prologue forms every node's log-decay sum along its path, ``gamma``, in one vectorised pass over
  the path table (``W`` gathers of all ``N`` nodes at once) into a float32 scratch. It then keeps
  its ``[K, BV]`` tile of the initial state in registers and visits the nodes in index order
  (parents come first). What a node needs that no other node's ``u`` decides (``_node_inputs``:
  ``k_i``, ``q_i`` normed with the prep's inverse norms, ``S0^T k_i``, ``S0^T q_i``, ``v_i``, its
  path row and the ancestors' decay-weighted key products) is loaded one node ahead, so a node
  waits only on its ancestors' update vectors ``[W, BV]`` (written by this same program for
  earlier nodes, hence the barrier after each store); then ``u_i`` and ``o_i``. The scratch is
  ``[bs * N, Hv, V + 2]`` float32: ``u`` in the first ``V`` columns, then the node's ``g`` and
  ``gamma``.

  With ``SGLANG`` set it is the walk form of SGLang's tree verify (``sglang_verify.gdn_tree_verify``;
  the patched verify ran it until session 20 and now runs ``triton_tree_wy``, which the tests and
  ``benchmarks/gdn_tree_recurrence.py --wy`` compare with it): it reads SGLang's raw inputs instead of prepared ones -- the
  conv output's q/k/v, the gate inputs ``a``, ``b`` with ``A_log``, ``dt_bias`` -- and forms the
  gates, the q/k l2-norm and the ``K^-0.5`` scale in-kernel with the operations, in the order,
  of SGLang's recurrent kernel (``fused_sigmoid_gating_recurrent.py``); the initial state is the
  pool row ``cache_indices[b]`` (``< 0``: a padding request, whose outputs are zeros and which
  writes nothing else); the output is in the activation dtype. With ``RING`` it also stores each
  node's raw pre-norm ``k``, raw ``v`` and its ``g``, ``beta`` into the ReplaySSM ring at column =
  node index, which is what SGLang's fold kernel (``gdn_replayssm_exact_fold_kernel``) replays.
- ``_replay_kernel``: one program per (value tile, request x value head), the state tile in registers,
  one recurrent step per path slot (a ``-1`` slot is an identity step).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .recurrence_inputs import check_inputs

#: Fewest programs a launch should have before the value tile narrows (the H200 has 132 SMs and
#: each runs many of these one-request programs at once; SGLang narrows its verify tile to 4 for
#: the same reason). ``benchmarks/gdn_tree_recurrence.py --sweep`` measures the alternatives; on
#: the H200 (session 7, 27B layer shape) one warp per program with this target was within 5 % of
#: the fastest (BV, warps) pair at every bs in {1, 8, 32} and N in {17, 65}.
TARGET_PROGRAMS = 2048

#: Warps per tree-kernel program: each program walks one (request, value head, value tile) through
#: its nodes one at a time, so wider programs only add idle lanes (in that sweep the earlier 2-4
#: warps cost up to 1.5x the same tile on 1 warp).
TREE_WARPS = 1


@triton.jit
def _program_state_tile(
    s0_ptr,
    row,
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
    """This program's value head, key/value offsets and masks, and its float32 ``[BK, BV]`` tile of
    state ``row`` of ``s0_ptr`` (grid: value tiles x requests*heads)."""
    hv = tl.program_id(1) % HV
    offs_k = tl.arange(0, BK)
    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_k = offs_k < DK
    ok_v = offs_v < DV
    tile = tl.load(
        s0_ptr + row * ss_b + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
        mask=ok_k[:, None] & ok_v[None, :],
        other=0.0,
    ).to(tl.float32)
    return hv, offs_k, offs_v, ok_k, ok_v, tile


@triton.jit
def _sglang_g(a, a_log, dt_bias):
    """SGLang's GDN log-decay as its recurrent kernel forms it with ``softplus_beta = 1``,
    ``softplus_threshold = 20`` (what gdn_backend passes; its ``1.0 * x`` is ``x`` exactly):
    ``g = -exp(A_log) * softplus(a + dt_bias)``."""
    x = a + dt_bias
    return -tl.exp(a_log) * tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)


@triton.jit
def _sglang_beta(b):
    """SGLang's ``beta = sigmoid(b)``, in its recurrent kernel's form."""
    return 1.0 / (1.0 + tl.exp(-b))


@triton.jit
def _tree_prep_kernel(
    q_ptr,
    k_ptr,
    paths_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (< 0 = a padding request, skipped)
    prep_ptr,
    sq_b,
    sq_n,
    sq_h,
    sk_b,
    sk_n,
    sk_h,
    scale,
    N,
    W: tl.constexpr,
    HK: tl.constexpr,
    DK: tl.constexpr,
    BK: tl.constexpr,
    BW: tl.constexpr,
    SGLANG: tl.constexpr,
):
    """Node ``i``'s key products, once per key head (grid: nodes x requests*key heads): row
    ``(b * N + i) * HK + hk`` of ``prep`` gets ``KK[t] = khat_anc . khat_i`` and
    ``QK[t] = khat_anc . qhat_i`` for path slot ``t < W`` (0 where the slot is empty or holds ``i``
    itself), then ``qhat_i . khat_i`` and the inverse norms ``1 / |k_i|``, ``1 / |q_i|`` (1 without
    ``SGLANG``, where ``khat, qhat`` are the raw ``k, q``; with it they are l2-normed, ``q`` also
    times ``scale``, in the order of SGLang's recurrent kernel)."""
    i = tl.program_id(0)
    b = tl.program_id(1) // HK
    hk = tl.program_id(1) % HK
    if SGLANG:
        if tl.load(s0_rows_ptr + b) < 0:  # a padding request: the tree kernel reads nothing
            return
    offs_k = tl.arange(0, BK)
    ok_k = offs_k < DK
    k_base = k_ptr + b * sk_b + hk * sk_h
    k_i = tl.load(k_base + i * sk_n + offs_k, mask=ok_k, other=0.0).to(tl.float32)
    q_i = tl.load(q_ptr + b * sq_b + i * sq_n + hk * sq_h + offs_k, mask=ok_k, other=0.0).to(
        tl.float32
    )
    t = tl.arange(0, BW)
    node = tl.load(paths_ptr + (b * N + i) * W + t, mask=t < W, other=-1)
    anc = (node >= 0) & (node != i)
    k_anc = tl.load(
        k_base + node[:, None] * sk_n + offs_k[None, :],
        mask=anc[:, None] & ok_k[None, :],
        other=0.0,
    ).to(tl.float32)
    if SGLANG:
        inv_k = 1.0 / tl.sqrt(tl.sum(k_i * k_i) + 1e-6)
        inv_q = 1.0 / tl.sqrt(tl.sum(q_i * q_i) + 1e-6)
        q_i *= inv_q
        k_i *= inv_k
        q_i = q_i * scale
    else:
        inv_k = 1.0
        inv_q = 1.0
    kk = tl.sum(k_anc * k_i[None, :], 1)
    qk = tl.sum(k_anc * q_i[None, :], 1)
    if SGLANG:  # the ancestors' keys l2-normed (an empty slot's 0 stays 0)
        inv_anc = 1.0 / tl.sqrt(tl.sum(k_anc * k_anc, 1) + 1e-6)
        kk *= inv_anc
        qk *= inv_anc
    out = prep_ptr + ((b * N + i) * HK + hk) * (2 * W + 3)
    tl.store(out + t, kk, mask=t < W)
    tl.store(out + W + t, qk, mask=t < W)
    tl.store(out + 2 * W, tl.sum(q_i * k_i))
    tl.store(out + 2 * W + 1, inv_k)
    tl.store(out + 2 * W + 2, inv_q)


@triton.jit
def _tree_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,  # SGLANG: the gate input a
    beta_ptr,  # SGLANG: the gate input b
    a_log_ptr,  # SGLANG only
    dt_bias_ptr,  # SGLANG only
    paths_ptr,
    s0_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (the pool row per request, < 0 = padding)
    scr_ptr,
    prep_ptr,  # _tree_prep_kernel's rows
    o_ptr,
    ring_k_ptr,  # RING only: [R, Hk, N, K], [R, Hv, N, V], [R, Hv, N], [R, Hv, N]
    ring_v_ptr,
    ring_g_ptr,
    ring_beta_ptr,
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
    srk_r,
    srk_h,
    srk_n,
    srv_r,
    srv_h,
    srv_n,
    srg_r,
    srg_h,
    srbeta_r,
    srbeta_h,
    scale,
    N,
    W: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BW: tl.constexpr,
    BN: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
):
    b = tl.program_id(1) // HV
    if SGLANG:
        row = tl.load(s0_rows_ptr + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    hv, offs_k, offs_v, ok_k, ok_v, s0 = _program_state_tile(
        s0_ptr, tl.maximum(row, 0), ss_b, ss_h, ss_k, ss_v, HV, DK, DV, BK, BV
    )
    hk = hv // GRP
    # o: contiguous [bs * N, HV, DV]; the scratch: contiguous [bs * N, HV, DV + 2] (u, g, gamma);
    # prep: contiguous [bs * N, HK, 2 * W + 3] (KK, QK, q.k, 1 / |k|, 1 / |q|)
    o_off = b * N * HV * DV + hv * DV
    SP: tl.constexpr = DV + 2
    HK: tl.constexpr = HV // GRP
    scr = scr_ptr + b * N * HV * SP + hv * SP
    if row < 0:  # an SGLang padding request: zeros out, nothing else written
        for i in range(N):
            tl.store(o_ptr + o_off + i * (HV * DV) + offs_v, tl.zeros([BV], tl.float32), mask=ok_v)
        return
    q_base = q_ptr + b * sq_b + hk * sq_h
    k_base = k_ptr + b * sk_b + hk * sk_h
    v_base = v_ptr + b * sv_b + hv * sv_h
    if SGLANG:
        a_log = tl.load(a_log_ptr + hv).to(tl.float32)
        dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
    if RING:
        ring_row = tl.load(ring_rows_ptr + b).to(tl.int64)
        ring_k = ring_k_ptr + ring_row * srk_r + hk * srk_h
        ring_v = ring_v_ptr + ring_row * srv_r + hv * srv_h
        stores_k = (tl.program_id(0) == 0) & (hv % GRP == 0)  # one program per key head
    else:  # unread
        ring_k = ring_k_ptr
        ring_v = ring_v_ptr
        stores_k = False

    # prologue: every node's g (SGLANG: formed from a, b) and gamma = sum of g along its path
    offs_n = tl.arange(0, BN)
    ok_n = offs_n < N
    if SGLANG:
        a_n = tl.load(g_ptr + b * sg_b + offs_n * sg_n + hv * sg_h, mask=ok_n, other=0.0)
        g_n = _sglang_g(a_n.to(tl.float32), a_log, dt_bias)
        tl.store(scr + offs_n * (HV * SP) + DV, g_n, mask=ok_n)
        if RING:
            if tl.program_id(0) == 0:
                tl.store(ring_g_ptr + ring_row * srg_r + hv * srg_h + offs_n, g_n, mask=ok_n)
                b_n = tl.load(
                    beta_ptr + b * sbeta_b + offs_n * sbeta_n + hv * sbeta_h, mask=ok_n, other=0.0
                )
                tl.store(
                    ring_beta_ptr + ring_row * srbeta_r + hv * srbeta_h + offs_n,
                    _sglang_beta(b_n.to(tl.float32)),
                    mask=ok_n,
                )
        tl.debug_barrier()  # the gathers below read g back
        g_at = scr + DV  # g of node j: g_at[j * HV * SP]
        sg_node = HV * SP
    else:
        g_at = g_ptr + b * sg_b + hv * sg_h
        sg_node = sg_n
    gamma_n = tl.zeros([BN], dtype=tl.float32)
    for pcol in range(W):
        path_node = tl.load(paths_ptr + (b * N + offs_n) * W + pcol, mask=ok_n, other=-1)
        gamma_n += tl.load(g_at + path_node * sg_node, mask=path_node >= 0, other=0.0).to(
            tl.float32
        )
    tl.store(scr + offs_n * (HV * SP) + DV + 1, gamma_n, mask=ok_n)
    tl.debug_barrier()

    # node 0's u-independent inputs; each node issues the next node's while it waits on its
    # ancestors' u (the only load that depends on earlier nodes)
    request = (b, hv, hk, N, scale, stores_k)
    ptrs = (q_base, k_base, v_base, beta_ptr, paths_ptr, prep_ptr, scr, ring_k, ring_v)
    strides = (sq_n, sk_n, sv_n, sbeta_b, sbeta_n, sbeta_h, srk_n, srv_n)
    tile = (s0, offs_k, offs_v, ok_k, ok_v)
    nxt = _node_inputs(0, request, ptrs, strides, tile, W, HV, HK, DV, BW, SGLANG, RING)
    for i in range(N):
        node, anc, w_kk, w_qk, s0k, s0q, v_i, beta_i, decay, qk_self, real = nxt
        nxt = _node_inputs(
            tl.minimum(i + 1, N - 1), request, ptrs, strides, tile, W, HV, HK, DV, BW, SGLANG, RING
        )
        u_anc = tl.load(
            scr + node[:, None] * (HV * SP) + offs_v[None, :],
            mask=anc[:, None] & ok_v[None, :],
            other=0.0,
        )
        u_i = beta_i * (v_i - decay * s0k - tl.sum(w_kk[:, None] * u_anc, 0))
        tl.store(scr + i * (HV * SP) + offs_v, u_i, mask=ok_v)
        tl.debug_barrier()  # later nodes of this program read u_i back
        o_i = decay * s0q + tl.sum(w_qk[:, None] * u_anc, 0) + qk_self * u_i
        tl.store(
            o_ptr + o_off + i * (HV * DV) + offs_v,
            tl.where(real, o_i, 0.0).to(o_ptr.dtype.element_ty),
            mask=ok_v,
        )


@triton.jit
def _node_inputs(
    i,
    request,  # (b, hv, hk, N, scale, stores_k)
    ptrs,  # (q_base, k_base, v_base, beta_ptr, paths_ptr, prep_ptr, scr, ring_k, ring_v)
    strides,  # (sq_n, sk_n, sv_n, sbeta_b, sbeta_n, sbeta_h, srk_n, srv_n)
    tile,  # (s0, offs_k, offs_v, ok_k, ok_v)
    W: tl.constexpr,
    HV: tl.constexpr,
    HK: tl.constexpr,
    DV: tl.constexpr,
    BW: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
):
    """What node ``i`` needs that no other node's ``u`` decides: its path row (``node``, the
    ancestor mask), the decay-weighted key and query products with its ancestors, ``S0^T k_i``,
    ``S0^T q_i``, ``v_i``, ``beta_i``, ``e^gamma_i``, ``q_i . k_i`` and whether it is a real node
    (RING: it also stores node ``i``'s raw ``k``, ``v``)."""
    b, hv, hk, N, scale, stores_k = request
    q_base, k_base, v_base, beta_ptr, paths_ptr, prep_ptr, scr, ring_k, ring_v = ptrs
    sq_n, sk_n, sv_n, sbeta_b, sbeta_n, sbeta_h, srk_n, srv_n = strides
    s0, offs_k, offs_v, ok_k, ok_v = tile
    SP: tl.constexpr = DV + 2
    PW: tl.constexpr = 2 * W + 3
    pre = prep_ptr + ((b * N + i) * HK + hk) * PW  # node i's key products
    k_i = tl.load(k_base + i * sk_n + offs_k, mask=ok_k, other=0.0).to(tl.float32)
    q_i = tl.load(q_base + i * sq_n + offs_k, mask=ok_k, other=0.0).to(tl.float32)
    v_i = tl.load(v_base + i * sv_n + offs_v, mask=ok_v, other=0.0).to(tl.float32)
    if SGLANG:
        if RING:  # the raw inputs, before the l2-norm, as SGLang's verify kernel stores them
            tl.store(ring_v + i * srv_n + offs_v, v_i.to(ring_v.dtype.element_ty), mask=ok_v)
            if stores_k:
                tl.store(ring_k + i * srk_n + offs_k, k_i.to(ring_k.dtype.element_ty), mask=ok_k)
        q_i *= tl.load(pre + 2 * W + 2)  # the l2-norms from the prep, then the scale
        k_i *= tl.load(pre + 2 * W + 1)
        q_i = q_i * scale
    beta_i = tl.load(beta_ptr + b * sbeta_b + i * sbeta_n + hv * sbeta_h).to(tl.float32)
    if SGLANG:
        beta_i = _sglang_beta(beta_i)
    gamma = tl.load(scr + i * (HV * SP) + DV + 1)
    t = tl.arange(0, BW)
    node = tl.load(paths_ptr + (b * N + i) * W + t, mask=t < W, other=-1)
    anc = (node >= 0) & (node != i)
    gamma_anc = tl.load(scr + node * (HV * SP) + DV + 1, mask=anc, other=0.0)
    w = tl.where(anc, tl.exp(gamma - gamma_anc), 0.0)
    w_kk = w * tl.load(pre + t, mask=anc, other=0.0)
    w_qk = w * tl.load(pre + W + t, mask=anc, other=0.0)
    real = tl.max(node, 0) >= 0  # a padding slot has no path
    decay = tl.exp(gamma)
    s0k = tl.sum(s0 * k_i[:, None], 0)
    s0q = tl.sum(s0 * q_i[:, None], 0)
    return node, anc, w_kk, w_qk, s0k, s0q, v_i, beta_i, decay, tl.load(pre + 2 * W), real


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
    b = tl.program_id(1) // HV
    hv, offs_k, offs_v, ok_k, ok_v, state = _program_state_tile(
        s0_ptr, b, ss_b, ss_h, ss_k, ss_v, HV, DK, DV, BK, BV
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


def choose_block_v(dv: int, requests_x_heads: int, override: int | None = None) -> int:
    """The value tile width: the widest power of two in 4..16 (at most ``dv`` rounded up) that still
    gives ``TARGET_PROGRAMS`` programs, so small batches spread over more programs (at 32 the tree
    kernel spills registers at the 27B shape, one warp: ``tests/test_triton_compile_sm90.py``).
    ``override`` (a power of two) is returned as is."""
    if override is not None:
        if override < 1 or override & (override - 1):
            raise ValueError(f"block_v must be a power of two; got {override}")
        return override
    bv = min(16, triton.next_power_of_2(dv))
    while bv > 4 and requests_x_heads * triton.cdiv(dv, bv) < TARGET_PROGRAMS:
        bv //= 2
    return bv


def _head_consts(hk: int, hv: int, dk: int, dv: int, bv: int) -> dict:
    """The head-layout constexprs both kernels take."""
    return dict(HV=hv, GRP=hv // hk, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=bv)


def tree_scratch(rows: int, hv: int, dv: int, device) -> torch.Tensor:
    """The ``[rows, Hv, V + 2]`` float32 scratch of ``_tree_kernel`` (``rows`` = requests x nodes):
    ``u`` per node and value head, and the node's ``g`` and ``gamma``. Written before it is read,
    so it needs no initialisation and may be shared by consecutive launches."""
    return torch.empty(rows, hv, dv + 2, dtype=torch.float32, device=device)


def prep_row_width(width: int) -> int:
    """Floats per prep row for path tables of width ``width``: ``W`` key products, ``W`` query
    products, ``q . k`` and the two inverse norms (the kernels' ``2 * W + 3``)."""
    return 2 * width + 3


def tree_prep_scratch(rows: int, hk: int, width: int, device) -> torch.Tensor:
    """The ``[rows, Hk, 2 * W + 3]`` float32 rows of ``_tree_prep_kernel`` (``rows`` = requests x
    nodes, ``W`` = the path table's width): per node and key head its ``W`` key products with its
    ancestors' keys, ``W`` with its query, ``q . k`` and the two inverse norms. Written before it
    is read, like :func:`tree_scratch`."""
    return torch.empty(rows, hk, prep_row_width(width), dtype=torch.float32, device=device)


def launch_tree_prep_kernel(q, k, paths, prep, rows=None, scale: float = 1.0) -> None:
    """Launch ``_tree_prep_kernel``: ``q, k [bs, N, Hk, K]`` (last dim contiguous), ``paths
    [bs, N, W]`` int32 contiguous, ``prep`` from :func:`tree_prep_scratch` with at least ``bs * N``
    rows. ``rows`` (SGLang's ``cache_indices``; ``< 0`` = a padding request, left unwritten)
    selects the SGLang mode: l2-normed ``q``, ``k`` and ``q`` times ``scale``."""
    bs, n, hk, dk = k.shape
    bk = triton.next_power_of_2(dk)
    bw = triton.next_power_of_2(paths.shape[2])
    _tree_prep_kernel[(n, bs * hk)](
        q,
        k,
        paths,
        paths if rows is None else rows,  # unread without SGLANG
        prep,
        *q.stride()[:3],
        *k.stride()[:3],
        scale,
        n,
        W=paths.shape[2],
        HK=hk,
        DK=dk,
        BK=bk,
        BW=bw,
        SGLANG=rows is not None,
        num_warps=4 if bw * bk >= 4096 else 2,
    )


def launch_tree_kernel(
    q,
    k,
    v,
    g,
    beta,
    paths,
    initial_state,
    scratch,
    prep,
    o,
    *,
    sglang=None,
    ring=None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> None:
    """Launch ``_tree_prep_kernel`` then ``_tree_kernel``, both modes. ``q, k [bs, N, Hk, K]``,
    ``v [bs, N, Hv, V]`` (last dim contiguous), ``g, beta [bs, N, Hv]`` (SGLANG: the gate inputs ``a``, ``b``), ``paths [bs, N, W]``
    int32 contiguous, ``initial_state`` with ``[Hv, K, V]`` index order per row (any strides),
    ``scratch`` from :func:`tree_scratch` and ``prep`` from :func:`tree_prep_scratch` with at least
    ``bs * N`` rows (``_tree_prep_kernel`` fills ``prep`` first), ``o`` contiguous
    ``[bs * N, Hv, V]``-shaped. ``sglang = (A_log, dt_bias, cache_indices, scale)`` selects the
    integration mode; ``ring = (rawk, rawv, g, beta, ring_rows)`` (rings ``[R, Hk, N, K]``,
    ``[R, Hv, N, V]``, ``[R, Hv, N]``, ``[R, Hv, N]``, last dims contiguous) adds the ring stores."""
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    bv = choose_block_v(dv, bs * hv, block_v)
    width = paths.shape[2]
    if sglang is None:
        a_log = dt_bias = rows = initial_state  # unread placeholders
        scale = 1.0
    else:
        a_log, dt_bias, rows, scale = sglang
    if ring is None:
        ring_k = ring_v = ring_g = ring_beta = ring_rows = scratch  # unread placeholders
        ring_strides = (0,) * 10
    else:
        ring_k, ring_v, ring_g, ring_beta, ring_rows = ring
        ring_strides = (
            *ring_k.stride()[:3],
            *ring_v.stride()[:3],
            *ring_g.stride()[:2],
            *ring_beta.stride()[:2],
        )
    launch_tree_prep_kernel(q, k, paths, prep, None if sglang is None else rows, scale)
    _tree_kernel[(triton.cdiv(dv, bv), bs * hv)](
        q,
        k,
        v,
        g,
        beta,
        a_log,
        dt_bias,
        paths,
        initial_state,
        rows,
        scratch,
        prep,
        o,
        ring_k,
        ring_v,
        ring_g,
        ring_beta,
        ring_rows,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *g.stride(),
        *beta.stride(),
        *initial_state.stride(),
        *ring_strides,
        scale,
        n,
        W=width,
        BW=triton.next_power_of_2(width),
        BN=triton.next_power_of_2(n),
        SGLANG=sglang is not None,
        RING=ring is not None,
        **_head_consts(hk, hv, dk, dv, bv),
        num_warps=num_warps or TREE_WARPS,
    )


def tree_gated_delta_rule_triton(
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
    """``tree_gated_delta_rule`` on a ``tree_paths`` table ``[bs, N, W]``: ``o [bs, N, Hv, V]`` fp32.

    ``q, k, v`` may be strided views (e.g. split from one projection) with a contiguous last dim.
    ``block_v`` overrides the value tile width (a power of two), ``num_warps`` the launch's warps.
    """
    check_inputs(q, k, v, g, beta, initial_state)
    bs, n = k.shape[:2]
    if paths.dim() != 3 or paths.shape[:2] != (bs, n):
        raise ValueError(f"paths must be [bs, N, W] = [{bs}, {n}, W]; got {tuple(paths.shape)}")
    q, k, v = _last_dim_contiguous(q, k, v)
    o = torch.empty(*v.shape, dtype=torch.float32, device=k.device)
    launch_tree_kernel(
        q,
        k,
        v,
        g,
        beta,
        paths.to(torch.int32).contiguous(),
        initial_state,
        tree_scratch(bs * n, v.shape[2], v.shape[3], k.device),
        tree_prep_scratch(bs * n, k.shape[2], paths.shape[2], k.device),
        o,
        block_v=block_v,
        num_warps=num_warps,
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
    bs, _, hk, dk = k.shape
    hv, dv = v.shape[2:]
    if path.dim() != 2 or path.shape[0] != bs:
        raise ValueError(f"path must be [bs={bs}, D]; got {tuple(path.shape)}")
    path = path.to(torch.int32).contiguous()
    k, v = _last_dim_contiguous(k, v)
    out = torch.empty(bs, hv, dk, dv, dtype=torch.float32, device=k.device)
    bv = choose_block_v(dv, bs * hv, block_v)
    _replay_kernel[(triton.cdiv(dv, bv), bs * hv)](
        k,
        v,
        g,
        beta,
        path,
        initial_state,
        out,
        *k.stride()[:3],
        *v.stride()[:3],
        *g.stride(),
        *beta.stride(),
        *initial_state.stride(),
        path.shape[1],
        **_head_consts(hk, hv, dk, dv, bv),
    )
    return out
