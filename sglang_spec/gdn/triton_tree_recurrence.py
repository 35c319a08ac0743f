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
- ``_tree_rhs_kernel``: one program per (16 nodes, request x value head, value tile of up to 32
  columns). What no node's ``u`` decides, for many nodes at once: ``gamma_i`` (the sum of ``g``
  along node ``i``'s path, from the path table), ``beta_i (v_i - e^gamma_i S0^T k_i)`` and
  ``e^gamma_i S0^T q_i`` (two fp32 dots of the nodes' keys and queries with the state tile,
  ``input_precision="ieee"``) into the scratch; zeros out for padding slots.
- ``_tree_solve_kernel``: one program per (value tile of ``BV`` columns, request x value head). The
  tree's only sequential part, ``u_i = beta_i (v_i - e^gamma_i S0^T k_i) - beta_i sum_s w_is u_s``
  over node ``i``'s strict ancestors ``s``, depends on ancestors only, so all nodes of one depth are
  independent: the prologue orders the nodes by depth and cuts each level into rounds of at most
  ``solve_nodes(BV)`` (each node's round and lane, in registers), and the program runs the rounds in
  order -- gather the round's ancestors' ``u`` ``[NB, W, BV]``, form ``u`` and ``o`` of all its nodes,
  store ``u`` behind a barrier. At 16 nodes per round a DDTREE(63) tree of depth 15 takes about 18
  rounds where a node-by-node walk takes 64 dependent steps. A round's nodes come from registers,
  their path rows are loaded two rounds ahead and the rest of what they need besides the ancestors'
  ``u`` (decay-weighted key and query products, ``beta``, the rhs kernel's terms) one round ahead. The scratch is ``[bs * N, Hv, 2 V + 1]`` float32
  (``scratch_row_width``).

  With ``SGLANG`` set the kernels are the integration kernels of SGLang's tree verify
  (``sglang_verify.gdn_tree_verify``): they read SGLang's raw inputs instead of prepared ones -- the
  conv output's q/k/v, the gate inputs ``a``, ``b`` with ``A_log``, ``dt_bias`` -- and form the
  gates, the q/k l2-norm and the ``K^-0.5`` scale in-kernel with the operations of SGLang's
  recurrent kernel (``fused_sigmoid_gating_recurrent.py``); the initial state is the pool row
  ``cache_indices[b]`` (``< 0``: a padding request, whose outputs are zeros and which writes
  nothing else); the output is in the activation dtype. With ``RING`` the rhs kernel also stores
  each node's raw pre-norm ``k``, raw ``v`` and its ``g``, ``beta`` into the ReplaySSM ring at
  column = node index, which is what SGLang's fold kernel (``gdn_replayssm_exact_fold_kernel``)
  replays.
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

#: Values per round of the solve kernel (nodes x value columns): a round takes ``64 // BV`` nodes, so
#: a narrow value tile (few requests: latency-bound, few rounds wanted) takes 16 nodes and a wide one
#: (many requests: throughput-bound, few idle lanes wanted) 4. A level wider than that takes several
#: rounds.
SOLVE_VALUES = 64


def solve_nodes(bv: int) -> int:
    """Nodes per round of the solve kernel for value tile ``bv`` (``SOLVE_VALUES``; 1 to 16)."""
    return max(1, min(16, SOLVE_VALUES // bv))


#: Nodes per program of the rhs kernel, its value tile (at most) and warps: two ``[NA, K] x [K, BV]``
#: fp32 dots per program.
RHS_NODES = 16
RHS_BLOCK_V = 32
RHS_KEY_SLICE = 32
RHS_WARPS = 4


def solve_warps(bv: int, bw: int, bn: int) -> int:
    """Warps per solve-kernel program: enough that a round's ``[NB, BW, BV]`` ancestor tile and the
    schedule's ``[BN, BW]`` path table are at most 32 values per thread (on the H200 one warp with
    ``BN = 128`` spilled 1 KB per thread: ``tests/test_triton_compile_sm90.py``)."""
    return max(1, max(solve_nodes(bv) * bv, bn) * bw // (32 * 32))


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
def _tree_rhs_kernel(
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
    NA: tl.constexpr,
    KC: tl.constexpr,
    SGLANG: tl.constexpr,
    RING: tl.constexpr,
):
    """What no node's ``u`` decides, for ``NA`` nodes at once (grid: node blocks x requests*value
    heads x value tiles): ``gamma_i`` (the path's log-decay sum), ``beta_i (v_i - e^gamma_i S0^T
    k_i)`` and ``e^gamma_i S0^T q_i`` (two fp32 dots on the state tile) into the scratch, zeros
    out for padding slots (and for every node of an SGLANG padding request); RING: the raw inputs."""
    b = tl.program_id(1) // HV
    hv = tl.program_id(1) % HV
    hk = hv // GRP
    HK: tl.constexpr = HV // GRP
    SP: tl.constexpr = 2 * DV + 1
    PW: tl.constexpr = 2 * W + 3
    offs_n = tl.program_id(0) * NA + tl.arange(0, NA)
    ok_n = offs_n < N
    offs_v = tl.program_id(2) * BV + tl.arange(0, BV)
    ok_v = offs_v < DV
    ok_nv = ok_n[:, None] & ok_v[None, :]
    o_at = o_ptr + (b * N + offs_n)[:, None] * (HV * DV) + hv * DV + offs_v[None, :]
    if SGLANG:
        row = tl.load(s0_rows_ptr + b).to(tl.int64)
    else:
        row = b.to(tl.int64)
    if row < 0:  # an SGLang padding request: zeros out, nothing else written
        tl.store(o_at, tl.zeros([NA, BV], tl.float32).to(o_ptr.dtype.element_ty), mask=ok_nv)
        return
    v_at = offs_n[:, None] * sv_n + offs_v[None, :]
    v_n = tl.load(v_ptr + b * sv_b + hv * sv_h + v_at, mask=ok_nv, other=0.0).to(tl.float32)
    t = tl.arange(0, BW)
    path = tl.load(
        paths_ptr + (b * N + offs_n)[:, None] * W + t[None, :],
        mask=ok_n[:, None] & (t < W)[None, :],
        other=-1,
    )
    on_path = path >= 0
    g_path = tl.load(g_ptr + b * sg_b + path * sg_n + hv * sg_h, mask=on_path, other=0.0)
    beta_n = tl.load(beta_ptr + b * sbeta_b + offs_n * sbeta_n + hv * sbeta_h, mask=ok_n, other=0.0)
    beta_n = beta_n.to(tl.float32)
    pre = prep_ptr + ((b * N + offs_n) * HK + hk) * PW  # SGLANG: the prep's inverse norms
    inv_k = tl.load(pre + 2 * W + 1, mask=ok_n, other=0.0)[:, None]
    inv_q = tl.load(pre + 2 * W + 2, mask=ok_n, other=0.0)[:, None]
    stores_k = False
    if SGLANG:
        a_log = tl.load(a_log_ptr + hv).to(tl.float32)
        dt_bias = tl.load(dt_bias_ptr + hv).to(tl.float32)
        g_path = tl.where(on_path, _sglang_g(g_path.to(tl.float32), a_log, dt_bias), 0.0)
        beta_n = _sglang_beta(beta_n)
        if RING:  # the raw inputs, before the l2-norm, as SGLang's verify kernel stores them
            ring_row = tl.load(ring_rows_ptr + b).to(tl.int64)
            ring_v = ring_v_ptr + ring_row * srv_r + hv * srv_h
            v_ring = ring_v + offs_n[:, None] * srv_n + offs_v[None, :]
            tl.store(v_ring, v_n.to(ring_v_ptr.dtype.element_ty), mask=ok_nv)
            stores_k = (tl.program_id(2) == 0) & (hv % GRP == 0)  # one program per key head
            if tl.program_id(2) == 0:
                a_n = tl.load(g_ptr + b * sg_b + offs_n * sg_n + hv * sg_h, mask=ok_n, other=0.0)
                g_n = _sglang_g(a_n.to(tl.float32), a_log, dt_bias)
                tl.store(ring_g_ptr + ring_row * srg_r + hv * srg_h + offs_n, g_n, mask=ok_n)
                beta_ring = ring_beta_ptr + ring_row * srbeta_r + hv * srbeta_h + offs_n
                tl.store(beta_ring, beta_n, mask=ok_n)
    # S0^T k_i and S0^T q_i for the NA nodes: fp32 dots over KC-wide slices of the key dimension
    s0k = tl.zeros([NA, BV], tl.float32)
    s0q = tl.zeros([NA, BV], tl.float32)
    for kc in range(0, BK, KC):
        offs_k = kc + tl.arange(0, KC)
        ok_k = offs_k < DK
        ok_nk = ok_n[:, None] & ok_k[None, :]
        k_at = b * sk_b + offs_n[:, None] * sk_n + hk * sk_h + offs_k[None, :]
        k_n = tl.load(k_ptr + k_at, mask=ok_nk, other=0.0).to(tl.float32)
        q_at = b * sq_b + offs_n[:, None] * sq_n + hk * sq_h + offs_k[None, :]
        q_n = tl.load(q_ptr + q_at, mask=ok_nk, other=0.0).to(tl.float32)
        if RING:
            if stores_k:
                k_ring = ring_row * srk_r + hk * srk_h + offs_n[:, None] * srk_n + offs_k[None, :]
                tl.store(ring_k_ptr + k_ring, k_n.to(ring_k_ptr.dtype.element_ty), mask=ok_nk)
        if SGLANG:  # l2-normed with the prep's norms, q then times the scale
            q_n *= inv_q
            k_n *= inv_k
            q_n = q_n * scale
        s0 = tl.load(
            s0_ptr + row * ss_b + hv * ss_h + offs_k[:, None] * ss_k + offs_v[None, :] * ss_v,
            mask=ok_k[:, None] & ok_v[None, :],
            other=0.0,
        ).to(tl.float32)
        s0k += tl.dot(k_n, s0, input_precision="ieee")
        s0q += tl.dot(q_n, s0, input_precision="ieee")
    gamma = tl.sum(g_path.to(tl.float32), 1)
    decay = tl.exp(gamma)[:, None]
    scr = scr_ptr + (b * N + offs_n)[:, None] * (HV * SP) + hv * SP
    tl.store(scr + offs_v[None, :], beta_n[:, None] * (v_n - decay * s0k), mask=ok_nv)
    tl.store(scr + DV + offs_v[None, :], decay * s0q, mask=ok_nv)
    tl.store(scr_ptr + (b * N + offs_n) * (HV * SP) + hv * SP + 2 * DV, gamma, mask=ok_n)
    padding = tl.max(path, 1) < 0  # a padding slot has no path
    zeros = tl.zeros([NA, BV], tl.float32).to(o_ptr.dtype.element_ty)
    tl.store(o_at, zeros, mask=ok_nv & padding[:, None])


@triton.jit
def _tree_solve_kernel(
    beta_ptr,  # SGLANG: the gate input b
    paths_ptr,
    s0_rows_ptr,  # SGLANG: cache_indices (< 0 = a padding request, left to the rhs kernel)
    scr_ptr,
    prep_ptr,
    o_ptr,
    sbeta_b,
    sbeta_n,
    sbeta_h,
    N,
    W: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DV: tl.constexpr,
    BV: tl.constexpr,
    BW: tl.constexpr,
    BN: tl.constexpr,
    NB: tl.constexpr,
    SGLANG: tl.constexpr,
):
    """The update vectors level by level (grid: value tiles x requests*value heads). The prologue
    orders the nodes by depth and cuts each level into rounds of at most ``NB`` nodes (each node's
    round and lane, in registers); round by round the program gathers its nodes' ancestors' ``u``
    (all in earlier levels, written by earlier rounds), forms ``u`` and ``o`` of up to ``NB`` nodes
    at once and stores ``u`` behind a barrier. A round's nodes come from registers, their path rows
    are loaded two rounds ahead and the rest of their inputs one round ahead (``_round_inputs``), so
    a round waits on one load: its ancestors' ``u``."""
    b = tl.program_id(1) // HV
    hv = tl.program_id(1) % HV
    if SGLANG:
        if tl.load(s0_rows_ptr + b) < 0:  # a padding request: the rhs kernel wrote its zeros
            return
    SP: tl.constexpr = 2 * DV + 1
    RS: tl.constexpr = HV * SP  # scratch row stride
    scr = scr_ptr + b * N * RS + hv * SP  # row r of this (request, value head): scr + r * RS
    # the schedule: depth -> (round, lane) per node
    offs_n = tl.arange(0, BN)
    t = tl.arange(0, BW)
    path = tl.load(
        paths_ptr + (b * N + offs_n)[:, None] * W + t[None, :],
        mask=(offs_n < N)[:, None] & (t < W)[None, :],
        other=-1,
    )
    depth = tl.sum((path >= 0).to(tl.int32), 1) - 1  # -1: a padding slot
    level = (depth[:, None] == t[None, :]).to(tl.int32)  # [BN, BW] one-hot (depth < W <= BW)
    count = tl.sum(level, 0)
    rounds = (count + NB - 1) // NB
    first_round = tl.cumsum(rounds, 0) - rounds
    rank = tl.sum(level * tl.cumsum(level, 0), 1) - 1  # among the nodes of its depth
    rnd = tl.where(depth >= 0, tl.sum(level * first_round[None, :], 1) + rank // NB, -1)
    lane = rank % NB
    n_rounds = tl.sum(rounds, 0)

    offs_v = tl.program_id(0) * BV + tl.arange(0, BV)
    ok_v = offs_v < DV
    sched = (rnd, lane, offs_n)
    request = (b, hv, N, sbeta_b, sbeta_n, sbeta_h)
    ptrs = (beta_ptr, paths_ptr, prep_ptr, scr)
    nodes, path_r = _round_nodes(0, sched, b, N, paths_ptr, W, BW, NB)
    nxt = _round_inputs(nodes, path_r, request, ptrs, offs_v, ok_v, W, HV, GRP, DV, BW, SGLANG)
    nodes, path_r = _round_nodes(1, sched, b, N, paths_ptr, W, BW, NB)
    for r in range(n_rounds):
        cur_nodes, ok_l, anc_path, anc, w_kk, w_qk, qk_self, beta, br, hq = nxt
        u_anc = tl.load(
            scr + anc_path[:, :, None] * RS + offs_v[None, None, :],
            mask=anc[:, :, None] & ok_v[None, None, :],
            other=0.0,
        )
        nxt = _round_inputs(nodes, path_r, request, ptrs, offs_v, ok_v, W, HV, GRP, DV, BW, SGLANG)
        nodes, path_r = _round_nodes(r + 2, sched, b, N, paths_ptr, W, BW, NB)
        ok_lv = ok_l[:, None] & ok_v[None, :]
        u = br - beta[:, None] * tl.sum(w_kk[:, :, None] * u_anc, 1)
        tl.store(scr + cur_nodes[:, None] * RS + offs_v[None, :], u, mask=ok_lv)
        tl.debug_barrier()  # later rounds of this program read u back
        o = hq + tl.sum(w_qk[:, :, None] * u_anc, 1) + qk_self[:, None] * u
        o_at = o_ptr + (b * N + cur_nodes)[:, None] * (HV * DV) + hv * DV + offs_v[None, :]
        tl.store(o_at, o.to(o_ptr.dtype.element_ty), mask=ok_lv)


@triton.jit
def _round_nodes(r, sched, b, N, paths_ptr, W: tl.constexpr, BW: tl.constexpr, NB: tl.constexpr):
    """Round ``r``'s nodes ``[NB]`` (-1 for an empty lane; every lane is empty past the last round),
    picked from the schedule's registers, and their path rows ``[NB, BW]``."""
    rnd, lane, offs_n = sched
    pick = (rnd[None, :] == r) & (lane[None, :] == tl.arange(0, NB)[:, None])  # [NB, BN]
    nodes = tl.max(tl.where(pick, offs_n[None, :], -1), 1)
    t = tl.arange(0, BW)
    path_r = tl.load(
        paths_ptr + (b * N + nodes)[:, None] * W + t[None, :],
        mask=(nodes >= 0)[:, None] & (t < W)[None, :],
        other=-1,
    )
    return nodes, path_r


@triton.jit
def _round_inputs(
    nodes,
    path_r,
    request,  # (b, hv, N, sbeta_b, sbeta_n, sbeta_h)
    ptrs,  # (beta_ptr, paths_ptr, prep_ptr, scr)
    offs_v,
    ok_v,
    W: tl.constexpr,
    HV: tl.constexpr,
    GRP: tl.constexpr,
    DV: tl.constexpr,
    BW: tl.constexpr,
    SGLANG: tl.constexpr,
):
    """What a round's nodes need that no ``u`` of this launch decides: the ancestor mask, the
    decay-weighted key and query products with their ancestors, ``q_i . k_i``, ``beta_i``, and the
    rhs kernel's ``beta (v - e^gamma S0^T k)`` and ``e^gamma S0^T q``."""
    b, hv, N, sbeta_b, sbeta_n, sbeta_h = request
    beta_ptr, paths_ptr, prep_ptr, scr = ptrs
    SP: tl.constexpr = 2 * DV + 1
    RS: tl.constexpr = HV * SP
    PW: tl.constexpr = 2 * W + 3
    HK: tl.constexpr = HV // GRP
    ok_l = nodes >= 0
    t = tl.arange(0, BW)
    anc = (path_r >= 0) & (path_r != nodes[:, None])
    gamma = tl.load(scr + nodes * RS + 2 * DV, mask=ok_l, other=0.0)
    gamma_anc = tl.load(scr + path_r * RS + 2 * DV, mask=anc, other=0.0)
    w = tl.where(anc, tl.exp(gamma[:, None] - gamma_anc), 0.0)
    pre = prep_ptr + ((b * N + nodes) * HK + hv // GRP) * PW  # the nodes' key products
    w_kk = w * tl.load(pre[:, None] + t[None, :], mask=anc, other=0.0)
    w_qk = w * tl.load(pre[:, None] + W + t[None, :], mask=anc, other=0.0)
    qk_self = tl.load(pre + 2 * W, mask=ok_l, other=0.0)
    beta = tl.load(beta_ptr + b * sbeta_b + nodes * sbeta_n + hv * sbeta_h, mask=ok_l, other=0.0)
    beta = beta.to(tl.float32)
    if SGLANG:
        beta = _sglang_beta(beta)
    ok_lv = ok_l[:, None] & ok_v[None, :]
    br = tl.load(scr + nodes[:, None] * RS + offs_v[None, :], mask=ok_lv, other=0.0)
    hq = tl.load(scr + nodes[:, None] * RS + DV + offs_v[None, :], mask=ok_lv, other=0.0)
    return nodes, ok_l, path_r, anc, w_kk, w_qk, qk_self, beta, br, hq


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


def scratch_row_width(dv: int) -> int:
    """Floats per node and value head in the tree kernels' scratch: ``beta (v - e^gamma S0^T k)``
    (then ``u``) and ``e^gamma S0^T q`` (``V`` each), and ``gamma``."""
    return 2 * dv + 1


def tree_scratch(rows: int, hv: int, dv: int, device) -> torch.Tensor:
    """The ``[rows, Hv, 2 V + 1]`` float32 scratch of the tree kernels (``rows`` = requests x
    nodes; :func:`scratch_row_width`). Written before it is read, so it needs no initialisation and
    may be shared by consecutive launches."""
    return torch.empty(rows, hv, scratch_row_width(dv), dtype=torch.float32, device=device)


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
    bw = triton.next_power_of_2(width)
    heads = _head_consts(hk, hv, dk, dv, bv)
    rhs_bv = max(16, min(RHS_BLOCK_V, triton.next_power_of_2(dv)))  # tl.dot wants >= 16
    _tree_rhs_kernel[(triton.cdiv(n, RHS_NODES), bs * hv, triton.cdiv(dv, rhs_bv))](
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
        BW=bw,
        NA=RHS_NODES,
        KC=min(RHS_KEY_SLICE, triton.next_power_of_2(dk)),
        SGLANG=sglang is not None,
        RING=ring is not None,
        **(heads | dict(BV=rhs_bv)),
        num_warps=RHS_WARPS,
    )
    _tree_solve_kernel[(triton.cdiv(dv, bv), bs * hv)](
        beta,
        paths,
        rows,
        scratch,
        prep,
        o,
        *beta.stride(),
        n,
        W=width,
        HV=hv,
        GRP=hv // hk,
        DV=dv,
        BV=bv,
        BW=bw,
        BN=triton.next_power_of_2(n),
        NB=solve_nodes(bv),
        SGLANG=sglang is not None,
        num_warps=num_warps or solve_warps(bv, bw, triton.next_power_of_2(n)),
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
