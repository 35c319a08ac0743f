"""Tree GDN verify without per-node states (``sglang_spec.gdn``) vs SGLang 0.5.23's per-node snapshots.

What: one Qwen3.6-27B-like Gated-DeltaNet layer (16 q/k heads, 48 v heads, head dims 128; the shape
``benchmarks/gdn_verify.py`` assumes) verifying ``bs`` DDTrees of ``N`` nodes (``build_ddtree``, L = 15,
budget N - 1, random logits):

* **SGLang tree** -- ``fused_sigmoid_gating_delta_rule_update`` in tree mode, as the TARGET_VERIFY of
  ``gdn_backend.py`` calls it (via ``tests/sglang_kernel_gdn.verify_recurrent``, the plumbing
  tests/test_sglang_gdn_kernels.py checks): gating and q/k l2-norm fused, every node starts from its
  parent's fp32 snapshot and writes its own (``intermediate_ssm``, ``N x Hv x K x V x 4`` bytes per
  request and layer);
* **SGLang chain** -- the same kernel on N tokens in a chain (DFLASH / EAGLE chain verify), for scale;
* **ours fused** -- ``sglang_spec.gdn.sglang_verify.gdn_tree_verify``, the integration kernel patch
  0002 runs inside SGLang: the same raw inputs as SGLang's kernel (the conv output's strided q/k/v,
  ``a``, ``b``, the pool rows through ``cache_indices``), gating, l2-norm and scale in-kernel, bf16
  output, and the ReplaySSM ring stores (raw k, v, g, beta per node) on a
  ``tree_paths(parents, width=L+1)`` table (a prep launch forms each node's products with its
  ancestors' keys once per key head, then the tree kernel); its value tile ``BV`` chosen from
  ``bs * Hv`` (``triton_tree_recurrence.choose_block_v``); ``--sweep`` also times every ``BV`` in
  4..32 with 1, 2 and 4 warps and prints the best;
* **WY** (``--wy``) -- the kernels the patched verify runs (``triton_tree_wy``):
  ``tree_gated_delta_rule_wy`` on the unfused kernel's inputs and path table (compare ``wy_us``
  with ``unfused kernel µs``, the walk on the same inputs: the ``WY/unfused kernel`` column), and
  the SGLang mode, ``sglang_verify.gdn_tree_verify_wy``, on the fused kernel's inputs with a ring
  of its own (compare ``WY fused µs`` with ``ours fused µs``: the ``WY fused/ours fused`` column;
  ``WY scratch MB/req`` is its scratch: ``T``, ``QK`` and four node vectors per value head);
  ``--sweep`` also times the SGLang mode at BV 32, 64 x 4, 8 warps;
* **ours unfused** (the session-3 column, kept for comparison) -- ``prep`` (gating, q/k l2-norm,
  scale and the state gather in torch) plus ``tree_gated_delta_rule_triton``; and the commit,
  ``replay_path_state_triton`` over a depth-15 accepted path.

* **tree conv** (``--conv``) -- the verify's first GDN launch, ``triton_tree_conv.tree_conv_triton``
  (patch 0002's convolution of every node along its root path, phase 2 of
  docs/gdn-tree-caching.md), on the cell's trees over a ``[bs * N, 2 Hk K + Hv V]`` conv input with
  the conv state in SGLang's layout (channels contiguous) and a 4-tap kernel; ``--sweep`` also
  times it at every nodes x channels x warps of ``CONV_SWEEP``. SGLang's own conv
  (``causal_conv1d_update``) is timed by ``benchmarks/gdn_verify.py``. The q/k/v the recurrence
  columns read are random, not this conv's output.

Checks, every cell (a failure makes the script exit 1 after the table):

* ``triton``: our Triton kernel against our torch core (``_tree_gated_delta_rule_torch``, float32, on the
  same device), max |diff| <= 1e-4;
* ``fused``: the fused kernel's bf16 outputs against the unfused float32 ones, max |diff| / (1e-4 +
  2^-7 |x|) <= 1, and its ring against the inputs (raw k, v exactly; g, beta against the torch
  gating, <= 1e-5);
* ``vs SGLang``: our outputs against SGLang's tree-mode outputs (bf16), max |diff| / (1e-4 + 2^-7 |x|)
  <= 1 (one bf16 rounding step: SGLang rounds its float32 result to the activation dtype);
* ``wy`` (``--wy``): the WY kernels' plain mode against the same torch core, max |diff| <= 1e-4; its SGLang
  mode's outputs against the fused kernel's, max |diff| / (1e-4 + 2^-7 |x|) <= 1, and its ring equal
  to the fused kernel's bit for bit;
* ``conv`` (``--conv``): the tree conv against its torch form on the CPU, max |diff| / (1e-4 +
  2^-7 |x|) <= 1;
* ``replay``: ``replay_path_state_triton`` for each request's deepest node against SGLang's fp32 snapshot
  of that node and against our torch replay, max |diff| <= 1e-4 + 1e-4 |x|.

Memory (MB per request and layer): SGLang's ``intermediate_ssm`` rows; what our verify would keep for
the commit instead (raw ``k``, ``v`` in the activation dtype, ``g``, ``beta`` fp32 per node); the
transient scratch of our kernels (``u``, ``g``, ``gamma`` per node and value head, and the prep
kernel's ``2 W + 3`` key products per node and key head); and the measured peak of extra device
memory our kernel call allocates, per request. Times: µs per call, the median of ``--reps`` replays of a
CUDA graph of 10 calls (``benchmarks.gdn_verify.time_us``).

Run on the H200 from the repository root (~3-4 min, mostly Triton compiling SGLang's kernel once per
(bs, N, mode)); ``--json`` also writes the rows::

    source .gpu-kit/setup.sh && $SGLANG_KIT_PYTHON -m benchmarks.gdn_tree_recurrence --sweep --json /tmp/gdn_tree_recurrence.json

CPU smoke run (Triton interpreter, tiny heads, fp32, bs 1, N 17; ~1 min)::

    .venv/bin/python benchmarks/gdn_tree_recurrence.py --device cpu --tiny

The WY kernels (the patched verify's) against the walk, same run (H200)::

    $SGLANG_KIT_PYTHON -m benchmarks.gdn_tree_recurrence --wy --sweep --widths 16 64 --json /tmp/gdn_wy.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (
    _REPO not in sys.path
):  # `python benchmarks/...` puts benchmarks/, not the repo root, on sys.path
    sys.path.insert(0, _REPO)

GDN_LAYERS_27B = 48  # Qwen3.6-27B-like: 64 layers, [linear x3, full] x 16
CHECK_TOL = 1e-4
BF16_STEP = 2.0**-7


def _prep(c: dict, conv_out: torch.Tensor, ssm_pool: torch.Tensor, bs: int, n: int):
    """Our kernel's inputs from what SGLang's verify hands its recurrent kernel: the q/k/v split of the
    conv output, gating and l2-norm (SGLang does both in-kernel), the requests' states as [bs, Hv, K, V]."""
    from sglang_spec.gdn.tree_gdn import _l2norm

    H, HV, dk, dv = c["num_k_heads"], c["num_v_heads"], c["head_k_dim"], c["head_v_dim"]
    q, k, v = torch.split(conv_out.view(bs, n, -1), [H * dk, H * dk, HV * dv], dim=-1)
    q = _l2norm(q.reshape(bs, n, H, dk).float()) * dk**-0.5
    k = _l2norm(k.reshape(bs, n, H, dk).float())
    v = v.view(bs, n, HV, dv)
    g = -c["A_log"].float().exp() * F.softplus(c["a"].float().view(bs, n, HV) + c["dt_bias"])
    beta = c["b"].float().view(bs, n, HV).sigmoid()
    s0 = ssm_pool[c["cache_indices"].long()].transpose(-1, -2)  # SGLang's pool is [Hv, V, K]
    return q, k, v, g, beta, s0


def _rel_err(got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> float:
    """max |got - want| / (atol + rtol |want|): <= 1 passes."""
    got, want = got.float(), want.float()
    return float(((got - want).abs() / (atol + rtol * want.abs())).max())


SWEEP = [(bv, warps) for bv in (4, 8, 16, 32) for warps in (1, 2, 4)]
# WY output launch: BV x warps. 2 warps since session 33, never timed before (the kkt launch gained
# 16-26 % on them at bs 16-32; compiled as launched, the output launch at BN 16 takes 158 registers
# on 2 warps at BV 32 and 228 at BV 64, no spill, Triton 3.6)
WY_SWEEP = [(bv, warps) for bv in (32, 64) for warps in (2, 4, 8)]
# tree conv: nodes x channels x warps per program (the launcher's: triton_tree_conv.TREE_CONV_*)
CONV_SWEEP = [(bn, bc, warps) for bn in (8, 16) for bc in (128, 256, 512) for warps in (2, 4)]


def _fused_inputs(c: dict, conv_out: torch.Tensor, bs: int, n: int, width: int, device):
    """The fused kernel's inputs as SGLang's verify holds them: q/k/v split views [1, T, H, d] of
    the conv output, and a ring (request row b = b) with the scratch and the key-product rows for
    path tables of width ``width``."""
    from sglang_spec.gdn.triton_tree_recurrence import tree_prep_scratch, tree_scratch

    H, HV, dk, dv = c["num_k_heads"], c["num_v_heads"], c["head_k_dim"], c["head_v_dim"]
    q, k, v = torch.split(conv_out, [H * dk, H * dk, HV * dv], dim=-1)
    qkv = (q.view(1, bs * n, H, dk), k.view(1, bs * n, H, dk), v.view(1, bs * n, HV, dv))
    ring = (
        torch.zeros(bs, H, n, dk, dtype=conv_out.dtype, device=device),
        torch.zeros(bs, HV, n, dv, dtype=conv_out.dtype, device=device),
        torch.zeros(bs, HV, n, device=device),
        torch.zeros(bs, HV, n, device=device),
    )
    ring_rows = torch.arange(bs, dtype=torch.int32, device=device)
    scratch = (tree_scratch(bs * n, HV, dv, device), tree_prep_scratch(bs * n, H, width, device))
    return qkv, ring, ring_rows, scratch


def run_cell(args, kern, bs: int, n: int, device) -> dict:
    from benchmarks.gdn_verify import VOCAB, L, layer_inputs, time_us
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.sglang_verify import gdn_tree_verify
    from sglang_spec.gdn.tree_recurrence import (
        _replay_path_state_torch,
        _tree_gated_delta_rule_torch,
    )
    from sglang_spec.gdn.triton_tree_recurrence import (
        choose_block_v,
        replay_path_state_triton,
        tree_gated_delta_rule_triton,
    )
    from sglang_spec.tree import build_ddtree
    from tests.sglang_kernel_gdn import verify_recurrent

    gen = torch.Generator().manual_seed(1000 * bs + n)
    c, conv_pool, ssm_pool = layer_inputs(
        bs, n, max(args.bs) + 1, args.dims, args.dtype, device, gen
    )
    H, HV, dk, dv = (
        args.dims[x] for x in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
    )
    conv_out = torch.randn(bs * n, 2 * H * dk + HV * dv, generator=gen).to(device, args.dtype)
    tree = build_ddtree(3 * torch.randn(bs, L, VOCAB, generator=gen), n - 1, torch.zeros(bs).long())
    assert tree.width == n, (tree.width, n)
    parents = tree.parents.to(device)

    # SGLang: tree mode (parent table = the tree's parents; the root's entry is not read) and chain mode
    query_start_loc = torch.arange(0, bs * n + 1, n, dtype=torch.int32, device=device)
    rows = torch.arange(bs, dtype=torch.int32, device=device)
    sg = {}
    for mode, parent_table in (("tree", parents.clamp(min=0)), ("chain", None)):
        snapshots = torch.zeros(bs + 1, n, HV, dv, dk, device=device)

        def sglang(snapshots=snapshots, parent_table=parent_table):
            return verify_recurrent(
                kern, c, conv_out, ssm_pool, query_start_loc, snapshots, rows, parent_table
            )

        sg[mode] = sglang().clone()
        sg[mode + "_us"] = time_us(sglang, device, args.reps)  # rewrites the same snapshots
        if mode == "tree":
            sg["tree_snapshots"] = snapshots

    inputs = _prep(c, conv_out, ssm_pool, bs, n)
    q, k, v, g, beta, s0 = inputs
    paths = tree_paths(parents, width=L + 1)
    deepest = tree.depths.argmax(1).to(device)
    commit_paths = paths[torch.arange(bs, device=device), deepest]  # [bs, L + 1]

    if device.type == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    ours = tree_gated_delta_rule_triton(q, k, v, g, beta, paths, s0)
    peak_mb = (
        (torch.cuda.max_memory_allocated() - base) / bs / 2**20 if device.type == "cuda" else None
    )
    state = replay_path_state_triton(k, v, g, beta, commit_paths, s0)

    (fq, fk, fv), ring, ring_rows, scratch = _fused_inputs(
        c, conv_out, bs, n, paths.shape[2], device
    )
    paths32 = paths.to(torch.int32).contiguous()

    sglang_args = (
        fq,
        fk,
        fv,
        c["a"],
        c["b"],
        c["A_log"],
        c["dt_bias"],
        ssm_pool,
        c["cache_indices"],
        paths32,
    )

    def fused(bv=None, warps=None):
        return gdn_tree_verify(
            *sglang_args,
            *scratch,
            ring=ring,
            ring_rows=ring_rows,
            block_v=bv,
            num_warps=warps,
        )

    fused_o = fused().view(bs, n, HV, dv)
    wy = {}
    if args.wy:
        from sglang_spec.gdn.sglang_verify import gdn_tree_verify_wy
        from sglang_spec.gdn.triton_tree_wy import (
            choose_wy_block_v,
            tree_gated_delta_rule_wy,
            tree_wy_scratch,
            wy_block_rows,
            wy_scratch_width,
        )

        def wy_call():
            return tree_gated_delta_rule_wy(q, k, v, g, beta, paths, s0)

        wy["wy_o"] = wy_call()
        wy_ring = tuple(torch.zeros_like(x) for x in ring)
        wy_scratch = tree_wy_scratch(bs, n, HV, device)

        def wy_fused(bv=None, warps=None):
            return gdn_tree_verify_wy(
                *sglang_args,
                wy_scratch,
                ring=wy_ring,
                ring_rows=ring_rows,
                block_v=bv,
                num_warps=warps,
            )

        wy["wy_fused_o"] = wy_fused().view(bs, n, HV, dv)

    # checks
    want = _tree_gated_delta_rule_torch(q, k, v, g, beta, tree_paths(parents), s0)
    triton_err = float((ours - want).abs().max())
    vs_sglang = _rel_err(ours, sg["tree"].view(bs, n, HV, dv), CHECK_TOL, BF16_STEP)
    snap = sg["tree_snapshots"][torch.arange(bs, device=device), deepest].transpose(-1, -2)
    replay_err = max(
        _rel_err(state, snap, CHECK_TOL, CHECK_TOL),
        _rel_err(
            state, _replay_path_state_torch(k, v, g, beta, commit_paths, s0), CHECK_TOL, CHECK_TOL
        ),
    )
    fused_err = _rel_err(fused_o, ours, CHECK_TOL, BF16_STEP)
    wy_err = wy_fused_err = wy_ring_equal = None
    if args.wy:
        wy_err = float((wy.pop("wy_o") - want).abs().max())
        wy_fused_err = _rel_err(wy.pop("wy_fused_o"), fused_o, CHECK_TOL, BF16_STEP)
        wy_ring_equal = all(torch.equal(x, y) for x, y in zip(wy_ring, ring, strict=True))
    ring_err = max(
        float((ring[0] - fk.view(bs, n, H, dk).transpose(1, 2)).abs().max()),
        float((ring[1] - fv.view(bs, n, HV, dv).transpose(1, 2)).abs().max()),
        float((ring[2] - g.transpose(1, 2)).abs().max()),
        float((ring[3] - beta.transpose(1, 2)).abs().max()),
    )
    conv = _conv_cell(args, c, conv_pool, paths32, device) if args.conv else {}
    ok = (
        triton_err <= CHECK_TOL
        and vs_sglang <= 1
        and replay_err <= 1
        and fused_err <= 1
        and ring_err <= 1e-5
        and (wy_err is None or wy_err <= CHECK_TOL)
        and (wy_fused_err is None or (wy_fused_err <= 1 and wy_ring_equal))
        and conv.get("check_conv", 0.0) <= 1
    )

    t_prep = time_us(lambda: _prep(c, conv_out, ssm_pool, bs, n), device, args.reps)
    t_ours = time_us(
        lambda: tree_gated_delta_rule_triton(q, k, v, g, beta, paths, s0), device, args.reps
    )
    t_replay = time_us(
        lambda: replay_path_state_triton(k, v, g, beta, commit_paths, s0), device, args.reps
    )
    t_fused = time_us(fused, device, args.reps)
    if args.wy:
        wy["wy_bv"] = choose_wy_block_v(dv, wy_block_rows(n))
        wy["wy_us"] = time_us(wy_call, device, args.reps)
        wy["wy_vs_walk"] = wy["wy_us"] / t_ours
        wy["wy_fused_us"] = time_us(wy_fused, device, args.reps)
        wy["wy_fused_vs_fused"] = wy["wy_fused_us"] / t_fused
        wy["wy_scratch_mb"] = HV * wy_scratch_width(n) * 4 / 2**20
        wy["wy_sweep_us"] = {}
        if args.sweep:
            for bv, warps in WY_SWEEP:
                wy["wy_sweep_us"][f"BV{bv}/w{warps}"] = time_us(
                    lambda bv=bv, warps=warps: wy_fused(bv, warps), device, args.reps
                )
    sweep = {}
    if args.sweep:
        for bv, warps in SWEEP:
            sweep[f"BV{bv}/w{warps}"] = time_us(
                lambda bv=bv, warps=warps: fused(bv, warps), device, args.reps
            )
    act = torch.finfo(args.dtype).bits // 8
    mb = 2.0**-20
    return dict(
        bs=bs,
        N=n,
        sglang_tree_us=sg["tree_us"],
        sglang_chain_us=sg["chain_us"],
        ours_prep_us=t_prep,
        ours_kernel_us=t_ours,
        ours_total_us=t_prep + t_ours,
        ours_vs_sglang_tree=(t_prep + t_ours) / sg["tree_us"],
        ours_vs_sglang_chain=(t_prep + t_ours) / sg["chain_us"],
        fused_bv=choose_block_v(dv, bs * HV),
        fused_us=t_fused,
        fused_vs_sglang_tree=t_fused / sg["tree_us"],
        fused_vs_sglang_chain=t_fused / sg["chain_us"],
        sweep_us=sweep,
        sweep_best=min(sweep, key=sweep.get) if sweep else None,
        replay_commit_us=t_replay,
        sglang_snapshots_mb=n * HV * dk * dv * 4 * mb,
        ours_records_mb=n * (H * dk * act + HV * dv * act + 2 * HV * 4) * mb,
        ours_scratch_mb=n * (HV * (dv + 2) + H * (2 * (L + 1) + 3)) * 4 * mb,
        ours_measured_peak_mb=peak_mb,
        check_triton_max_abs=triton_err,
        check_vs_sglang=vs_sglang,
        check_replay=replay_err,
        check_fused=fused_err,
        check_ring=ring_err,
        check_wy_max_abs=wy_err,
        check_wy_fused=wy_fused_err,
        check_wy_ring=wy_ring_equal,
        ok=ok,
        **wy,
        **conv,
    )


def _conv_cell(args, c: dict, conv_pool: torch.Tensor, paths: torch.Tensor, device) -> dict:
    """``--conv``: the tree conv on the cell's trees (``paths`` int32), checked against its torch
    form on the CPU and timed at the launcher's tile and, with ``--sweep``, at every
    ``CONV_SWEEP`` tile."""
    from benchmarks.gdn_verify import time_us
    from sglang_spec.gdn.tree_conv import tree_conv
    from sglang_spec.gdn.triton_tree_conv import tree_conv_triton

    # SGLang's conv state: [slots, C, K - 1] with the channels contiguous
    states = conv_pool.transpose(1, 2).contiguous().transpose(1, 2)
    x, weight, rows = c["mixed_qkv"], c["conv_weight"], c["cache_indices"]

    def call(*tile):  # (nodes, channels, warps) a program; none: the launcher's
        return tree_conv_triton(x, states, weight, None, True, rows, paths, *tile)

    cpu = [t.cpu() for t in (x, states, weight, rows, paths)]
    want = tree_conv(*cpu[:3], None, True, *cpu[3:])
    out = dict(
        check_conv=_rel_err(call().cpu(), want, CHECK_TOL, BF16_STEP),
        conv_us=time_us(call, device, args.reps),
        conv_sweep_us={},
    )
    if args.sweep:
        for bn, bc, warps in CONV_SWEEP:
            out["conv_sweep_us"][f"BN{bn}/BC{bc}/w{warps}"] = time_us(
                lambda tile=(bn, bc, warps): call(*tile), device, args.reps
            )
    return out


COLUMNS = [
    ("bs", "bs"),
    ("N", "N"),
    ("sglang_tree_us", "SGLang tree µs"),
    ("sglang_chain_us", "SGLang chain µs"),
    ("fused_bv", "fused BV"),
    ("fused_us", "ours fused µs"),
    ("fused_vs_sglang_tree", "fused/SGLang tree"),
    ("fused_vs_sglang_chain", "fused/SGLang chain"),
    ("sweep_best", "sweep: fastest"),
    ("ours_prep_us", "unfused prep µs"),
    ("ours_kernel_us", "unfused kernel µs"),
    ("ours_vs_sglang_tree", "unfused/SGLang tree"),
    ("replay_commit_us", "commit replay µs"),
    ("sglang_snapshots_mb", "SGLang snapshots MB/req"),
    ("ours_records_mb", "ours records MB/req"),
    ("ours_scratch_mb", "ours scratch MB/req"),
    ("ours_measured_peak_mb", "ours measured alloc (scratch + o) MB/req"),
    ("check_triton_max_abs", "check: Triton vs torch"),
    ("check_vs_sglang", "check: vs SGLang /tol"),
    ("check_replay", "check: replay /tol"),
    ("check_fused", "check: fused /tol"),
    ("check_ring", "check: ring"),
]
WY_COLUMNS = [  # with --wy, after the unfused kernel's column
    ("wy_bv", "WY BV"),
    ("wy_us", "WY µs"),
    ("wy_vs_walk", "WY/unfused kernel"),
    ("check_wy_max_abs", "check: WY vs torch"),
    ("wy_fused_us", "WY fused µs"),
    ("wy_fused_vs_fused", "WY fused/ours fused"),
    ("wy_scratch_mb", "WY scratch MB/req"),
    ("check_wy_fused", "check: WY fused vs fused /tol"),
    ("check_wy_ring", "check: WY ring = fused ring"),
]


CONV_COLUMNS = [("conv_us", "tree conv µs"), ("check_conv", "check: tree conv /tol")]  # --conv


def _fmt(x) -> str:
    if isinstance(x, float):
        return f"{x:.2e}" if abs(x) < 0.01 and x != 0 else f"{x:.2f}"
    return "-" if x is None else str(x)


def run(args) -> int:
    import triton  # after main() has set TRITON_INTERPRET for the CPU

    from benchmarks.gdn_verify import load_kernels
    from sglang_spec.gdn import triton_tree_wy

    device = torch.device(args.device)
    kern = load_kernels()
    H, HV, dk, dv = (
        args.dims[x] for x in ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim")
    )
    where = (
        torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, Triton interpreter"
    )
    print(
        f"# GDN tree verify, one layer ({'tiny' if args.tiny else 'Qwen3.6-27B-like'}: {H} q/k heads, "
        f"{HV} v heads, K = {dk}, V = {dv}); {where}; torch {torch.__version__}, triton "
        f"{triton.__version__}; {str(args.dtype)[6:]} activations, fp32 states; µs per call (median of "
        f"{args.reps}{' CUDA-graph replays of 10 calls' if device.type == 'cuda' else ' eager calls'}); "
        "MB per request and layer"
    )
    columns = COLUMNS
    if args.wy:
        at = [key for key, _ in COLUMNS].index("ours_kernel_us") + 1
        columns = COLUMNS[:at] + WY_COLUMNS + COLUMNS[at:]
    if args.conv:
        columns = columns + CONV_COLUMNS
    print("| " + " | ".join(title for _, title in columns) + " |")
    print("|" + "---|" * len(columns))
    results = []
    for bs in args.bs:
        for n in args.widths:
            row = run_cell(args, kern, bs, n, device)
            results.append(row)
            print("| " + " | ".join(_fmt(row[key]) for key, _ in columns) + " |", flush=True)
    if args.sweep:
        print("\n# fused kernel µs per (BV, warps); * = the default choice's tile")
        names = [f"BV{bv}/w{w}" for bv, w in SWEEP]
        print("| bs | N | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 2))
        for r in results:
            mark = f"BV{r['fused_bv']}/"
            cells = [f"{r['sweep_us'][x]:.1f}{'*' if x.startswith(mark) else ''}" for x in names]
            print(f"| {r['bs']} | {r['N']} | " + " | ".join(cells) + " |")
        if args.wy:
            print(
                "\n# WY SGLang mode µs per (BV, warps); * = the default choice; walk = ours fused"
            )
            names = [f"BV{bv}/w{w}" for bv, w in WY_SWEEP]
            print("| bs | N | walk | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 3))
            for r in results:
                mark = f"BV{r['wy_bv']}/w{triton_tree_wy.WY_WARPS}"
                cells = [f"{r['wy_sweep_us'][x]:.1f}{'*' if x == mark else ''}" for x in names]
                print(f"| {r['bs']} | {r['N']} | {r['fused_us']:.1f} | " + " | ".join(cells) + " |")
    if args.sweep and args.conv:
        from sglang_spec.gdn.triton_tree_conv import (
            TREE_CONV_CHANNELS,
            TREE_CONV_NODES,
            TREE_CONV_WARPS,
        )

        print("\n# tree conv µs per (nodes, channels, warps); * = the launcher's tile")
        names = [f"BN{bn}/BC{bc}/w{w}" for bn, bc, w in CONV_SWEEP]
        mark = f"BN{TREE_CONV_NODES}/BC{TREE_CONV_CHANNELS}/w{TREE_CONV_WARPS}"
        print("| bs | N | " + " | ".join(names) + " |\n|" + "---|" * (len(names) + 2))
        for r in results:
            cells = [f"{r['conv_sweep_us'][x]:.1f}{'*' if x == mark else ''}" for x in names]
            print(f"| {r['bs']} | {r['N']} | " + " | ".join(cells) + " |")
    print(f"\n# per request over the {GDN_LAYERS_27B} GDN layers of the 27B shape (GB)")
    print("| N | SGLang intermediate_ssm | ours per-node records |\n|---|---|---|")
    for n in args.widths:
        row = next(r for r in results if r["N"] == n)
        print(
            f"| {n} | {row['sglang_snapshots_mb'] * GDN_LAYERS_27B / 1024:.2f} | "
            f"{row['ours_records_mb'] * GDN_LAYERS_27B / 1024:.3f} |"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(device=where, dims=args.dims, dtype=str(args.dtype), rows=results), f, indent=1
            )
    failed = [(r["bs"], r["N"]) for r in results if not r["ok"]]
    if failed:
        print(f"CHECK FAILED for (bs, N) in {failed}")
        return 1
    print(
        "checks passed: Triton = torch core, outputs = SGLang's tree verify, replay = its snapshots, "
        "fused = unfused, ring = inputs"
        + (", WY = torch core, WY fused = fused" if args.wy else "")
        + (", tree conv = torch" if args.conv else "")
    )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python benchmarks/gdn_tree_recurrence.py", description=__doc__.splitlines()[0]
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny heads, bs 1, N 17, 2 reps (CPU smoke)")
    p.add_argument("--bs", type=int, nargs="+", help="batch sizes (default 1 8 32; --tiny: 1)")
    p.add_argument(
        "--widths", type=int, nargs="+", help="tree widths N (default 17 65; --tiny: 17)"
    )
    p.add_argument("--reps", type=int, help="timed repetitions per cell (default 50; --tiny: 2)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument(
        "--sweep", action="store_true", help="also time the fused kernel at every BV x warps"
    )
    p.add_argument(
        "--wy",
        action="store_true",
        help="also time and check the WY kernels (triton_tree_wy, the verify's) against the walk",
    )
    p.add_argument(
        "--conv",
        action="store_true",
        help="also time and check the tree conv (triton_tree_conv, the verify's first GDN launch)",
    )
    args = p.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    elif os.environ.get("TRITON_INTERPRET") == "1":
        p.error("--device cuda needs TRITON_INTERPRET unset")
    from benchmarks.gdn_verify import QWEN36_27B_LIKE, TINY

    args.bs = args.bs or ([1] if args.tiny else [1, 8, 32])
    args.widths = args.widths or ([17] if args.tiny else [17, 65])
    args.reps = args.reps or (2 if args.tiny else 50)
    args.dims = TINY if args.tiny else QWEN36_27B_LIKE
    # the Triton interpreter garbles bf16
    args.dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    bad = [n for n in args.widths if n < 2]
    if bad:
        p.error(f"--widths must be >= 2 (a root and at least one draft node); got {bad}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
