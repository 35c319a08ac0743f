"""SGLang 0.5.23's GDN verify step for one Qwen3.6-27B-like layer: tree mode vs chain mode (H200, GPU kit).

What: the GPU time of one Gated-DeltaNet layer's TARGET_VERIFY in SGLang 0.5.23 -- the two Triton kernels
``gdn_backend.forward_extend`` launches, ``causal_conv1d_update`` and then
``fused_sigmoid_gating_delta_rule_update`` (``disable_state_update``, a state snapshot per verified token)
-- for ``bs`` requests of ``N`` verify tokens each, in

* tree mode (EAGLE topk > 1, our DDTree): ``N`` nodes of a tree from ``sglang_spec.tree.build_ddtree``
  (random logits, L = 15, budget N - 1) laid out with ``sglang_tree_abi``;
* chain mode (topk == 1: EAGLE chain / DFLASH): the same kernels on ``N`` tokens in a chain.

Layer (Qwen3.6-27B-like, assumed -- not looked up): 16 q/k heads, 48 v heads, head_k_dim = head_v_dim = 128,
conv kernel 4 (conv_dim 10240); bf16 activations, conv weight and conv state (SGLang's default conv dtype),
fp32 ``A_log`` and SSM state (default ``mamba_ssm_dtype``). ``N``: 17 (a DFlash 16-block + bonus / DDTree
budget 16), 65 (budget 64), 129 (budget 128); ``bs``: 1, 8, 32. The pools have ``max(bs) + 1`` rows in
every cell (a server's pool does not shrink with the batch; it also keeps the conv kernel's compile-time
``num_cache_lines`` fixed), the verify scratch ``bs + 1`` rows (rows no request owns are never touched).

What differs between the modes (paths under site-packages/sglang/ of 0.5.23):

1. ``retrieve_next_token`` / ``retrieve_next_sibling`` / ``retrieve_parent_token`` are only set for
   topk > 1 (``srt/layers/attention/hybrid_linear_attn_backend.py:298-305``), else None. Passed to
   ``causal_conv1d_update`` (``srt/layers/attention/linear/gdn_backend.py:1047-1059``) they switch on
   ``HAS_EAGLE_TREE_CUSTOM_ATTN_MASK`` (``kernels/ops/mamba/causal_conv1d_triton.py:1226``): every token
   derives its parent and walks its ancestors for the K-tap window (:800, :839-:937) instead of
   sliding one window (:938-:995); ``retrieve_parent_token`` then goes to the recurrent kernel
   (``gdn_backend.py:1161`` -> ``linear/kernels/gdn_triton.py:217-254``), whose tree mode
   (``kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py:283-320``, flag at :746) reloads
   each token's state from its parent's snapshot in the intermediate buffer instead of carrying it in
   registers.
2. The intermediate conv windows: chain mode on CUDA gets the deduplicated sliding-window layout (one
   ``[C, N+K-2]`` buffer per request behind an overlapping ``as_strided`` view), tree mode the dense
   ``[N, C, K-1]`` one (``srt/mem_cache/memory_pool.py:135`` ``conv_window_dedup_enabled``, :598
   ``_allocate_deduplicated_conv_window``, :916-965).
3. Nothing else. Tree verify always runs the Triton recurrent kernel (``gdn_backend.py:506-512``); chain
   verify runs the configured verify backend, Triton unless FlashInfer's is selected
   (``gdn_backend.py:347-360``; the GPU kit has no FlashInfer) -- Triton in both columns here. Both get the
   strided q/k/v split (``gdn_triton.py:44``; also qkv_dim 10240 > ``MAX_FUSED_QKV_SPLIT_DIM`` 8192,
   ``gdn_backend.py:46``, :1082), ``cache_steps = N`` and the same launch configuration (on SM90 the value
   tile BV=4 for k = v = 128 and bs <= 64, ``fused_sigmoid_gating_recurrent.py:46-58``).

How: the kernels are imported from the installed ``sglang`` package
(``sglang.kernels.ops.mamba.causal_conv1d_triton``,
``sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent``; 0.5.23 has no
``srt/layers/attention/mamba/causal_conv1d_triton.py``) and called through the TARGET_VERIFY plumbing of
``tests/sglang_kernel_gdn.py`` (``verify_conv``, ``verify_recurrent``), the code that
tests/test_sglang_gdn_kernels.py checks against our reference ``sglang_spec.gdn``. On CUDA each kernel is
captured 10 times (``CALLS``) into a CUDA graph (SGLang replays verify from CUDA graphs too; Python's launch
overhead is not counted) and timed with CUDA events (``benchmarks.timing.median_timer``): median over
``--reps`` (default 50) replays, divided by ``CALLS``. "verify" = conv + recurrent.

Correctness check, once per (bs, N), on the cell's inputs and kernel variants: tree mode on a tree that is
one path (``build_chain`` of width N) against chain mode. The conv windows, the conv pool (the kernel
shifts it in place), the SSM snapshots and the core outputs must agree to rtol = atol = 1e-5
(``torch.allclose``; the table shows the max absolute difference; 0 in the CPU smoke run). The conv
outputs are compared to one rounding step of the activation dtype (|diff| <= 1e-5 + eps |x|, bf16 eps =
2^-7; the table shows the max of |diff| / that, a pass is <= 1), because the two conv code paths add the
K taps in opposite orders (tree mode newest first, chain mode oldest first); the recurrent kernels of both
modes are then fed chain mode's conv output, so that their comparison is exact. (An fp32 check would need
a second compile of every tree conv variant.) A failed check makes the script exit 1 after the table.

Compile time: the tree conv kernel unrolls its loop over N, so Triton needs minutes per variant at N = 129
(~4 min on one 2-core CPU here, against ~10 s for N = 17), and SGLang's wrapper passes bs as a Python int,
so bs 1, 8 and 32 are three variants. The checks therefore run first, one process per cell, all in
parallel (``--check-cell``); they compile every kernel variant the timing needs into Triton's on-disk cache
(``TRITON_CACHE_DIR``, /tmp/triton_cache with the GPU kit), from which the timing then loads them.

Run on the H200, from the repository root (the full grid: ~5-6 min, nearly all of it compiling; a second
run on the same machine finds the kernels in the cache)::

    source .gpu-kit/setup.sh && $SGLANG_KIT_PYTHON -m benchmarks.gdn_verify

CPU smoke run of the same code (Triton interpreter, tiny heads, fp32 activations -- the interpreter
garbles bf16 -- bs 1, N 17, 2 reps; ~20 s, mostly importing ``sglang``)::

    TRITON_INTERPRET=1 .venv/bin/python -m benchmarks.gdn_verify --device cpu --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import torch

from benchmarks.timing import median_timer
from sglang_spec.cli_args import Parser, int_range, positive_int
from sglang_spec.plugin import MAX_VERIFY_WIDTH
from sglang_spec.tree import TreeMaskMode, build_chain, build_ddtree, sglang_tree_abi

# The verify plumbing that tests/test_sglang_gdn_kernels.py checks (run from the repository root).
from tests.sglang_kernel_gdn import verify_conv, verify_recurrent

REPO = Path(__file__).resolve().parents[1]

L = 15  # drafter depth (DFlash block size 16)
VOCAB = 256  # of the random drafter logits the trees are built from
CONV_KERNEL = 4
QWEN36_27B_LIKE = dict(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128)  # assumed
TINY = dict(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)
CHECK_TOL = 1e-5
CALLS = 10  # kernel calls per CUDA graph


def load_kernels() -> types.SimpleNamespace:
    """SGLang 0.5.23's launch wrappers of the two verify kernels, from the installed ``sglang``."""
    from sglang.kernels.ops.attention.linear.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )
    from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update

    return types.SimpleNamespace(
        causal_conv1d_update=causal_conv1d_update,
        fused_sigmoid_gating_delta_rule_update=fused_sigmoid_gating_delta_rule_update,
    )


def layer_inputs(bs: int, n: int, pool: int, dims: dict, dtype, device, gen):
    """Random inputs of one layer's verify (the keys ``sglang_kernel_gdn.verify_*`` read) and the pools of
    ``pool`` rows (conv ``[pool, C, K-1]`` in ``dtype``, SSM ``[pool, HV, dv, dk]`` fp32)."""
    H, HV, dk, dv = dims["num_k_heads"], dims["num_v_heads"], dims["head_k_dim"], dims["head_v_dim"]
    C = 2 * H * dk + HV * dv

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device, dtype)

    c = dict(
        mixed_qkv=rand(bs * n, C),
        a=rand(bs * n, HV),
        b=rand(bs * n, HV),
        conv_weight=rand(C, CONV_KERNEL, scale=0.5),
        A_log=(0.05 + 0.55 * torch.rand(HV, generator=gen))
        .log()
        .to(device),  # decay exp(g) ~ 0.5..0.97
        dt_bias=rand(HV, scale=0.3),
        cache_indices=torch.randperm(pool, generator=gen)[:bs].to(device, torch.int32),
        **dims,
    )
    conv_pool = rand(pool, C, CONV_KERNEL - 1)
    ssm_pool = (0.5 * torch.randn(pool, HV, dv, dk, generator=gen)).to(device)
    return c, conv_pool, ssm_pool


def with_tree(c: dict, tree, device) -> dict:
    """``c`` plus the tree's ``retrieve_next_token`` / ``retrieve_next_sibling`` (built on the CPU)."""
    abi = sglang_tree_abi(
        tree, torch.zeros(tree.batch_size, dtype=torch.long), mode=TreeMaskMode.QLEN_ONLY
    )
    return dict(
        c,
        retrieve_next_token=abi.retrieve_next_token.to(device),
        retrieve_next_sibling=abi.retrieve_next_sibling.to(device),
    )


def verify_step(kern, c: dict, conv_pool, ssm_pool, tree: bool):
    """One mode's verify of one layer as two closures, the conv kernel and the recurrent kernel, over
    this mode's own copies of the pools and its own scratch; and the dict they write their outputs to."""
    dev, (T, C) = c["mixed_qkv"].device, c["mixed_qkv"].shape
    bs = c["cache_indices"].shape[0]
    n = T // bs
    rows = bs + 1  # scratch rows (spec_state_size + 1, here for bs requests); request i owns row i
    if tree:  # dense: one [C, K-1] window per token (memory_pool.py:951)
        window = torch.zeros(rows, n, C, CONV_KERNEL - 1, dtype=conv_pool.dtype, device=dev)
    else:  # deduplicated: token t's window is columns t..t+K-2 of one shared [C, n+K-2] buffer (:598)
        shared = torch.zeros(rows, C, n + CONV_KERNEL - 2, dtype=conv_pool.dtype, device=dev)
        window = shared.as_strided(
            (rows, n, C, CONV_KERNEL - 1), (shared.stride(0), 1, shared.stride(1), 1)
        )
    HV, dk, dv = c["num_v_heads"], c["head_k_dim"], c["head_v_dim"]
    s = dict(
        conv_states=conv_pool.clone(),
        ssm_states=ssm_pool.clone(),
        intermediate_conv_window=window,
        intermediate_ssm=torch.zeros(rows, n, HV, dv, dk, device=dev),
    )
    state_rows = torch.arange(bs, dtype=torch.int32, device=dev)
    query_start_loc = torch.arange(0, T + 1, n, dtype=torch.int32, device=dev)
    parents = torch.empty_like(c["retrieve_next_token"]) if tree else None

    def conv():
        s["conv_out"] = verify_conv(kern, c, s["conv_states"], window, state_rows, parents)

    def recurrent():
        s["core"] = verify_recurrent(
            kern,
            c,
            s["conv_out"],
            s["ssm_states"],
            query_start_loc,
            s["intermediate_ssm"],
            state_rows,
            parents,
        )

    return conv, recurrent, s


def check_chain(kern, c: dict, conv_pool, ssm_pool, gen) -> tuple[float, float, bool]:
    """Tree mode on a one-path tree of ``c``'s width vs chain mode, on ``c``'s inputs (the timed kernel
    variants): (max |difference| of the conv windows, conv pool, SSM snapshots and core outputs; max
    |difference| / (1e-5 + eps |x|) of the conv outputs; all within tolerance)."""
    bs = c["cache_indices"].shape[0]
    n = c["mixed_qkv"].shape[0] // bs
    chain = build_chain(
        torch.randn(bs, n - 1, VOCAB, generator=gen), torch.zeros(bs, dtype=torch.long)
    )
    c = with_tree(c, chain, c["mixed_qkv"].device)
    (tree_conv, tree_rec, t), (chain_conv, chain_rec, ch) = (
        verify_step(kern, c, conv_pool, ssm_pool, tree) for tree in (True, False)
    )
    tree_conv()
    chain_conv()
    # The two conv paths add the K taps in opposite orders, so their outputs agree to one rounding step of
    # the activation dtype; for an exact comparison of the recurrent kernels both then get chain mode's.
    got, want = t["conv_out"].float(), ch["conv_out"].float()
    conv_err = float(
        (
            (got - want).abs() / (CHECK_TOL + torch.finfo(c["mixed_qkv"].dtype).eps * want.abs())
        ).max()
    )
    close = conv_err <= 1
    t["conv_out"] = ch["conv_out"]
    tree_rec()
    chain_rec()
    diff = 0.0
    for key in ("intermediate_conv_window", "conv_states", "intermediate_ssm", "core"):
        x, y = t[key], ch[key]
        if key == "core":
            x, y = x.reshape(bs, -1), y.reshape(bs, -1)
        for xi, yi in zip(x, y):  # row by row: a request's SSM snapshots are ~0.4 GB at N = 129
            diff = max(diff, float((xi.float() - yi.float()).abs().max()))
            close &= torch.allclose(xi, yi, rtol=CHECK_TOL, atol=CHECK_TOL)
    return diff, conv_err, close


def time_us(fn, device, reps: int) -> float:
    """Median µs per call of ``fn``: on CUDA over replays of a CUDA graph of ``CALLS`` calls (compiled and
    warmed up on a side stream first), on the CPU over eager calls."""
    timer = median_timer(device)
    if device.type != "cuda":
        return timer(fn, reps)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return timer(graph.replay, reps) / CALLS


def cell_inputs(args, bs: int, n: int, device):
    """Inputs and pools of the (bs, N) cell (the pool has max(bs) + 1 rows in every cell), and the cell's
    random generator."""
    gen = torch.Generator().manual_seed(1000 * bs + n)
    return layer_inputs(bs, n, max(args.bs) + 1, args.dims, args.dtype, device, gen), gen


def checks_in_parallel(args) -> dict:
    """The check of every cell, each in its own process (``--check-cell``), all at once. Besides checking,
    each process compiles every Triton kernel variant its cell's timing needs into Triton's on-disk cache:
    the tree conv kernel is unrolled over N, and one variant takes minutes to compile at N = 129 (SGLang's
    wrapper passes the batch size as an int, so bs 1, 8 and 32 are three variants) -- one after the other
    the grid would compile for ~17 min."""
    procs = {}
    for bs in args.bs:
        for n in args.widths:
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.gdn_verify",
                "--device",
                args.device,
                "--bs",
                *map(str, args.bs),
                "--check-cell",
                str(bs),
                str(n),
            ] + (["--tiny"] if args.tiny else [])
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=REPO)
            procs[bs, n] = (proc, out, err)
    checks = {}
    for cell, (proc, out, err) in procs.items():
        proc.wait()
        out.seek(0)
        err.seek(0)
        lines = [line for line in out.read().splitlines() if line.startswith("CHECK ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(
                f"check of (bs, N) = {cell} failed (rc={proc.returncode}):\n{err.read()[-6000:]}"
            )
        checks[cell] = json.loads(lines[-1][len("CHECK ") :])
    return checks


def run(args) -> int:
    import triton  # after main() has set TRITON_INTERPRET for the CPU

    device = torch.device(args.device)
    checks = checks_in_parallel(args)
    kern = load_kernels()
    dims, dtype = args.dims, args.dtype
    C = 2 * dims["num_k_heads"] * dims["head_k_dim"] + dims["num_v_heads"] * dims["head_v_dim"]
    where = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else "CPU, Triton interpreter (smoke run, times meaningless)"
    )
    how = (
        f"median of {args.reps} replays of a CUDA graph of {CALLS} calls"
        if device.type == "cuda"
        else f"median of {args.reps} eager calls"
    )
    print(
        f"# SGLang 0.5.23 GDN TARGET_VERIFY, one layer, {'tiny' if args.tiny else 'Qwen3.6-27B-like, assumed'}: "
        f"{dims['num_k_heads']} q/k heads, {dims['num_v_heads']} v heads, head_k_dim {dims['head_k_dim']}, "
        f"head_v_dim {dims['head_v_dim']}, conv kernel {CONV_KERNEL} (conv_dim {C})"
    )
    print(
        f"# {where}; torch {torch.__version__}, triton {triton.__version__}; {str(dtype)[6:]} activations and "
        f"conv state, fp32 SSM state; pool {max(args.bs) + 1} rows; trees: build_ddtree (L={L}, budget N-1) on "
        "random logits"
    )
    print(
        f"# µs per call, {how}; check: tree mode on a one-path tree vs chain mode -- conv windows, conv pool, "
        f"SSM snapshots and core outputs to rtol = atol = {CHECK_TOL:g}, conv outputs to one {str(dtype)[6:]} step "
        f"(tol = {CHECK_TOL:g} + eps * |x|)"
    )
    cols = [
        "bs",
        "N",
        "conv tree",
        "conv chain",
        "recurrent tree",
        "recurrent chain",
        "verify tree",
        "verify chain",
        "tree/chain",
        "check: max abs diff",
        "check: conv out max diff/tol",
    ]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for bs in args.bs:
        for n in args.widths:
            (c, conv_pool, ssm_pool), gen = cell_inputs(args, bs, n, device)
            tree = build_ddtree(
                3 * torch.randn(bs, L, VOCAB, generator=gen),
                n - 1,
                torch.zeros(bs, dtype=torch.long),
            )
            assert tree.width == n, (tree.width, n)
            c = with_tree(c, tree, device)
            times = {}
            for mode in ("tree", "chain"):
                conv, recurrent, _ = verify_step(kern, c, conv_pool, ssm_pool, mode == "tree")
                times[mode] = (
                    time_us(conv, device, args.reps),
                    time_us(recurrent, device, args.reps),
                )
            (ct, rt), (cc, rc) = times["tree"], times["chain"]
            check = checks[bs, n]
            row = [
                bs,
                n,
                ct,
                cc,
                rt,
                rc,
                ct + rt,
                cc + rc,
                f"{(ct + rt) / (cc + rc):.2f}",
                f"{check['diff']:.1e}",
                f"{check['conv_err']:.2f}" + ("" if check["close"] else " FAIL"),
            ]
            print(
                "| "
                + " | ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in row)
                + " |",
                flush=True,
            )
    failed = [cell for cell, check in checks.items() if not check["close"]]
    if failed:
        print(f"CHECK FAILED (tree mode on a chain != chain mode) for (bs, N) in {failed}")
        return 1
    print("check passed: tree mode on a one-path tree equals chain mode in every cell")
    return 0


def check_cell(args, bs: int, n: int) -> int:
    """``--check-cell``: the check of one cell, printed as a ``CHECK {json}`` line."""
    device = torch.device(args.device)
    (c, conv_pool, ssm_pool), gen = cell_inputs(args, bs, n, device)
    diff, conv_err, close = check_chain(load_kernels(), c, conv_pool, ssm_pool, gen)
    print("CHECK " + json.dumps(dict(diff=diff, conv_err=conv_err, close=close)), flush=True)
    return 0


def main(argv=None) -> int:
    p = Parser(prog="python -m benchmarks.gdn_verify", description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where to run")
    p.add_argument(
        "--tiny", action="store_true", help="tiny heads, bs 1, N 17, 2 reps (the CPU smoke run)"
    )
    p.add_argument(
        "--bs",
        type=int_range(1, 256),
        nargs="+",
        help="batch sizes (default 1 8 32; --tiny: 1)",
    )
    p.add_argument(
        "--widths",
        type=int_range(2, MAX_VERIFY_WIDTH),
        nargs="+",
        help="verify widths N (default 17 65 129; --tiny: 17)",
    )
    p.add_argument(
        "--reps", type=positive_int, help="timed repetitions per cell (default 50; --tiny: 2)"
    )
    p.add_argument("--check-cell", type=int, nargs=2, metavar=("BS", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.bs = args.bs or ([1] if args.tiny else [1, 8, 32])
    args.widths = args.widths or ([17] if args.tiny else [17, 65, 129])
    args.reps = args.reps or (2 if args.tiny else 50)
    args.dims = TINY if args.tiny else QWEN36_27B_LIKE
    args.dtype = (
        torch.bfloat16 if args.device == "cuda" else torch.float32
    )  # the Triton interpreter garbles bf16
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
    elif os.environ.get("TRITON_INTERPRET") == "1":
        p.error("--device cuda needs TRITON_INTERPRET unset")
    return check_cell(args, *args.check_cell) if args.check_cell else run(args)


if __name__ == "__main__":
    sys.exit(main())
