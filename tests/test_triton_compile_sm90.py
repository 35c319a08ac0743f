"""The GDN tree kernels and the T > 0 node sampler's row kernel compile for an H200 (sm_90) on a
CPU box.

Triton's CPU interpreter (``TRITON_INTERPRET=1``, the numerical tests) runs a kernel as Python, so
it accepts code the real compiler refuses -- e.g. a loop variable reused with another type or
shape, which failed the first H200 server run of patch 0002 ("Loop-carried variable t has initial
type int32 but is re-assigned to <['16'], int32>"). This test runs the whole compiler (TTIR ->
TTGIR -> LLVM -> PTX -> cubin with the bundled ptxas) for ``GPUTarget("cuda", 90, 32)`` on the
argument types and constexprs the launchers use at the Qwen3.6-27B shape, every mode.
"""

from __future__ import annotations

import inspect

import pytest
import torch

triton = pytest.importorskip("triton")
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from sglang_spec.gdn import triton_tree_recurrence as ttr  # noqa: E402

SM90 = GPUTarget("cuda", 90, 32)
# The shared memory one block may use on an H100 / H200 (227 KB, cudaFuncSetAttribute's opt-in).
SM90_MAX_SHARED = 232448
BF16_PTRS = {"q_ptr", "k_ptr", "v_ptr"}
INT_PTRS = {"paths_ptr", "path_ptr", "s0_rows_ptr", "ring_rows_ptr"}


def compile_sm90(
    jit_fn,
    constexprs: dict,
    ints_32: tuple[str, ...] = (),
    types: dict | None = None,
    options: dict | None = None,
) -> dict:
    """Compile ``jit_fn`` for sm_90 with pointer/scalar types as the launchers pass them
    (``types``: parameter -> Triton type, for parameters the naming rules get wrong; ``options``:
    e.g. ``num_warps``)."""
    params = list(inspect.signature(jit_fn.fn).parameters)
    sig = {}
    for p in params:
        if types and p in types:
            sig[p] = types[p]
        elif p in constexprs:
            sig[p] = "constexpr"
        elif p in BF16_PTRS:
            sig[p] = "*bf16"
        elif p in INT_PTRS:
            sig[p] = "*i32"
        elif p.endswith("_ptr"):
            sig[p] = "*fp32"
        elif p == "scale":
            sig[p] = "fp32"
        else:
            sig[p] = "i32" if p in ints_32 else "i64"
    src = ASTSource(
        fn=jit_fn, signature=sig, constexprs={(params.index(k),): v for k, v in constexprs.items()}
    )
    kernel = triton.compile(src, target=SM90, options=options)
    return {**kernel.asm, "shared": kernel.metadata.shared}


# Qwen3.6-27B's GDN: 16 key heads, 48 value heads, K = V = 128; DDTREE(63): N = 64, W = 16.
@pytest.mark.parametrize("sglang_mode,ring", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("requests", [1, 32])
def test_tree_kernel_compiles_for_sm90_without_spilling(sglang_mode, ring, requests):
    """At the tile the launcher picks (one warp), the tree kernel keeps its state tile and the next
    node's inputs in registers: no stack frame (a 32-wide tile spilled about 1.5 KB per thread)."""
    bv = ttr.choose_block_v(128, requests * 48)
    consts = dict(W=16, BW=16, BN=64, SGLANG=sglang_mode, RING=ring)
    consts |= ttr._head_consts(16, 48, 128, 128, bv)
    asm = compile_sm90(
        ttr._tree_kernel, consts, ints_32=("N",), options=dict(num_warps=ttr.TREE_WARPS)
    )
    assert asm["cubin"]
    assert _ptxas_stack_bytes(asm) == 0, bv


@pytest.mark.parametrize("act", ["*bf16", "*fp32"])
def test_tree_conv_kernel_compiles_for_sm90(act):
    from sglang_spec.gdn import triton_tree_conv as ttc

    types = dict(x_ptr=act, states_ptr=act, w_ptr=act, bias_ptr=act, o_ptr=act)
    types |= dict(slots_ptr="*i64", paths_ptr="*i32", C="i32", N="i32")
    consts = dict(P=16, KERNEL=4, HAS_BIAS=False, SILU=True)
    consts |= dict(BN=ttc.TREE_CONV_NODES, BC=ttc.TREE_CONV_CHANNELS)
    assert compile_sm90(ttc._tree_conv_kernel, consts, types=types)["cubin"]


def test_replay_kernel_compiles_for_sm90():
    asm = compile_sm90(ttr._replay_kernel, ttr._head_consts(16, 48, 128, 128, 32), ints_32=("D",))
    assert asm["cubin"]


@pytest.mark.parametrize("sglang_mode", [True, False])
def test_tree_prep_kernel_compiles_for_sm90(sglang_mode):
    consts = dict(W=16, HK=16, DK=128, BK=128, BW=16, SGLANG=sglang_mode)
    asm = compile_sm90(ttr._tree_prep_kernel, consts, ints_32=("N",))
    assert asm["cubin"]


@pytest.mark.parametrize("dtype", ["*fp32", "*bf16"])
@pytest.mark.parametrize("candidates", [0, 20, 256])
def test_row_sampler_kernel_compiles_for_sm90(dtype, candidates):
    from sglang_spec.tree import triton_sampler as ts

    consts = dict(K=candidates, KB=triton.next_power_of_2(max(candidates, 1)), BV=2048)
    consts |= dict(HAS_MIN_P=True, TOP_K_FIRST=True, SEARCH=True, ABOVE_ONE=0x3F800001, STEPS=30)
    types = dict(logits_ptr=dtype, cand_ptr=dtype, k_ptr="*i64", token_ptr="*i64")
    types |= dict(kept_ptr="*i32", stride_v="i32", V="i32")
    asm = compile_sm90(ts._row_sample_kernel, consts, types=types)
    assert asm["cubin"]


@pytest.mark.parametrize("conv_dtype", ["*bf16", "*fp32"])
def test_save_conv_inputs_kernel_compiles_for_sm90(conv_dtype):
    from sglang_spec.gdn import triton_tree_conv as ttc

    types = dict(inputs_ptr=conv_dtype, states_ptr=conv_dtype, x_ptr="*bf16")
    types |= dict(slots_ptr="*i32", rows_ptr="*i64", C="i32", N="i32")
    consts = dict(STATE_LEN=3, BLOCK=ttc.BLOCK_C)
    assert compile_sm90(ttc._save_conv_inputs_kernel, consts, types=types)["cubin"]


@pytest.mark.parametrize("width,mode", [(16, 0), (64, 0), (16, 2), (64, 1), (256, 0)])
def test_layout_kernel_with_paths_compiles_for_sm90(width, mode):
    """The tree layout (with the GDN path table) up to budget 255's width, its rows per program as
    the launcher picks them, within an H200 block's shared memory."""
    from sglang_spec.tree import triton_kernels as tk

    i64 = ("parents_ptr", "depths_ptr", "seq_lens_ptr", "positions_ptr", "next_token_ptr")
    types = {p: "*i64" for p in (*i64, "next_sibling_ptr", "retrieve_index_ptr")}
    types |= dict(mask_ptr="*i8" if mode < 2 else "*u16", paths_ptr="*i32")
    nb = triton.next_power_of_2(width)
    bi = 16 if width > 64 else 32
    consts = dict(N=width, HOPS=15, MODE=mode, BI=bi, NB=nb, RB=16, PW=16, PWB=16)
    asm = compile_sm90(tk._layout_kernel, consts, types=types)
    assert asm["cubin"] and asm["shared"] <= SM90_MAX_SHARED


@pytest.mark.parametrize("budget,k", [(63, 49), (255, 241)])
def test_select_kernel_compiles_for_sm90_up_to_budget_255(budget, k):
    """The best-first selection (one warp, the frontier in registers) at budgets 63 and 255 with
    their exact K at the horizon 15, the chain forced, within an H200 block's shared memory."""
    from sglang_spec.tree import triton_kernels as tk

    n = budget + 1
    types = {p: "*i64" for p in ("ids_ptr", "root_ptr", "tokens_ptr", "depth_ptr", "rank_ptr")}
    types |= {"parent_ptr": "*i64", "num_nodes_ptr": "*i64"}
    consts = dict(L=15, K=k, N=n, FB=triton.next_power_of_2(n), CHAIN=15)
    asm = compile_sm90(tk._select_kernel, consts, types=types, options=dict(num_warps=1))
    assert asm["cubin"] and asm["shared"] <= SM90_MAX_SHARED


def _ptxas_stack_bytes(asm: dict) -> int:
    """The stack frame ``ptxas -v`` reports for the kernel's PTX on sm_90a (Triton's bundled ptxas)."""
    import os
    import re
    import subprocess
    import tempfile

    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(asm["ptx"])
    try:
        out = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.unlink(f.name)
    match = re.search(r"(\d+) bytes stack frame", out.stdout + out.stderr)
    assert match, out.stdout + out.stderr
    return int(match.group(1))


def test_kv_move_kernel_does_not_spill_at_the_capped_rows():
    """SGLang's tiled KV-move kernel at the 27B shape's settings (2 KB rows: 128-byte tiles, 4
    warps): at adapter.KV_MOVE_ROWS rows per launch its stack frame is small; at 256 (SGLang's own
    cap there, the premise of the cap) it spills to kilobytes per thread, about 2 GB of local
    memory at launch on an H200. If SGLang's kernel stops spilling at 256, the cap can go."""
    from sglang.kernels.ops.kvcache.cache_move import copy_all_layer_kv_cache_tiled as kernel

    from sglang_spec.plugin.adapter import KV_MOVE_ROWS

    types = dict(data_ptrs="*u64", strides="*i64", tgt_loc_ptr="*i64", src_loc_ptr="*i64")
    types |= dict(num_locs="i32")

    def stack(rows: int) -> int:
        consts = dict(num_locs_upper=rows, BYTES_PER_TILE=128)
        options = dict(num_warps=4, num_stages=2)
        return _ptxas_stack_bytes(compile_sm90(kernel, consts, types=types, options=options))

    assert stack(KV_MOVE_ROWS) <= 256
    assert stack(256) > 4096


def _cubin_resources(asm: dict) -> tuple[dict, str]:
    """``cuobjdump -res-usage`` of the compiled cubin (``REG``, ``STACK``, ``SHARED``, ``LOCAL``
    ... as ints) and its SASS (Triton's bundled cuobjdump)."""
    import os
    import re
    import subprocess
    import tempfile

    cuobjdump = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump"
    )
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(asm["cubin"])
    try:
        usage, sass = (
            subprocess.run(
                [cuobjdump, flag, f.name], capture_output=True, text=True, timeout=120
            ).stdout
            for flag in ("-res-usage", "-sass")
        )
    finally:
        os.unlink(f.name)
    res = {k: int(v) for k, v in re.findall(r"(\w+):(\d+)", usage.split("Function", 1)[-1])}
    assert "REG" in res, usage
    return res, sass


def record_launches(module, kernels: tuple[str, ...], call) -> list[tuple]:
    """The launches ``call()`` makes of ``module``'s Triton kernels named ``kernels``, recorded
    instead of run (on CPU tensors): ``(jit function, arguments by parameter name, num_warps)``
    each, in launch order."""
    launches = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid):
            def launch(*args, num_warps, **kwargs):
                names = [p.name for p in self.fn.params]
                launches.append((self.fn, dict(zip(names, args)) | kwargs, num_warps))

            return launch

    with pytest.MonkeyPatch.context() as mp:
        for name in kernels:
            mp.setattr(module, name, Recorder(getattr(module, name)))
        call()
    return launches


def compile_sm90_as_launched(jit_fn, values: dict, num_warps: int) -> dict:
    """Compile ``jit_fn`` for sm_90 as Triton's launcher would for the argument ``values`` (as
    :func:`record_launches` gives them): every run-time argument specialised by Triton's own rule
    (``native_specialize_impl``: 16-byte aligned pointers and integers divisible by 16 marked so,
    integers equal to 1 made constants), so that loads and stores vectorise as on the device.
    :func:`compile_sm90` marks nothing and can spill where the launched kernel does not (session
    33: the kkt launch on 2 warps, 16 bytes a thread there, none as launched)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    sig, consts, attrs = {}, {}, {}
    for i, param in enumerate(jit_fn.params):
        value = values[param.name]
        if param.is_constexpr:
            sig[param.name], consts[(i,)] = "constexpr", value
            continue
        ty, spec = native_specialize_impl(
            BaseBackend,
            value,
            False,
            not param.do_not_specialize,
            not param.do_not_specialize_on_alignment,
        )
        if ty == "constexpr":
            sig[param.name], consts[(i,)] = ty, spec
            continue
        sig[param.name] = ty
        if spec:
            attrs[(i,)] = BaseBackend.parse_attr(spec)
    src = ASTSource(fn=jit_fn, signature=sig, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=SM90, options=dict(num_warps=num_warps))
    return {**kernel.asm, "shared": kernel.metadata.shared}


def wy_launches_27b(sglang_mode: bool, ring: bool, n: int) -> list[tuple]:
    """The WY verify's launches (:func:`record_launches`) for two requests of ``n``-node trees at
    the 27B shape (Hk 16, Hv 48, K = V = 128, W = 16): the SGLang mode as patch 0002 calls it
    (``gdn_tree_verify_wy`` on strided bf16 q/k/v views of the conv output, bf16 gate inputs, the
    fp32 pool, the ring of bf16 raw k/v and fp32 g/beta), or the plain mode
    (``tree_gated_delta_rule_wy`` on contiguous fp32 inputs)."""
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn import triton_tree_wy as wy
    from sglang_spec.gdn.sglang_verify import gdn_tree_verify_wy

    hk, hv, d, bs, t = 16, 48, 128, 2, 2 * n
    parents = torch.tensor([[-1] + [(i - 1) // 4 for i in range(1, n)]] * bs)
    paths = tree_paths(parents, width=16).to(torch.int32)
    if not sglang_mode:
        f32 = dict(dtype=torch.float32)
        qk = [torch.zeros(bs, n, hk, d, **f32) for _ in range(2)]
        gb = [torch.zeros(bs, n, hv, **f32) for _ in range(2)]
        s0 = torch.zeros(bs, hv, d, d, **f32)

        def call():
            wy.tree_gated_delta_rule_wy(*qk, torch.zeros(bs, n, hv, d, **f32), *gb, paths, s0)

    else:
        bf16 = dict(dtype=torch.bfloat16)
        mixed = torch.zeros(t, 2 * hk * d + hv * d, **bf16)
        q, k, v = torch.split(mixed, [hk * d, hk * d, hv * d], dim=-1)
        a, b = torch.split(torch.zeros(t, 2 * hv, **bf16), [hv, hv], dim=-1)
        rows = torch.arange(bs, dtype=torch.int32)
        rings = (
            torch.zeros(bs, hk, n, d, **bf16),
            torch.zeros(bs, hv, n, d, **bf16),
            torch.zeros(bs, hv, n),
            torch.zeros(bs, hv, n),
        )

        def call():
            gdn_tree_verify_wy(
                *(x.view(1, t, -1, d) for x in (q, k, v)),
                a,
                b,
                torch.zeros(hv),
                torch.zeros(hv, **bf16),
                torch.zeros(bs + 1, hv, d, d),
                rows,
                paths,
                wy.tree_wy_scratch(bs, n, hv, "cpu"),
                ring=rings if ring else None,
                ring_rows=rows if ring else None,
            )

    return record_launches(wy, ("_wy_kkt_kernel", "_wy_solve_kernel", "_wy_out_kernel"), call)


@pytest.mark.parametrize("bn", [16, 64])
@pytest.mark.parametrize("sglang_mode,ring", [(False, False), (True, False), (True, True)])
def test_wy_kernels_compile_for_sm90_without_spilling(sglang_mode, ring, bn):
    """The verify's WY kernels (``triton_tree_wy``) at the 27B shape (:func:`wy_launches_27b`:
    N = 16 and 64, one row block with its wider value tile and four, no solve launch for one
    block), compiled as launched (:func:`compile_sm90_as_launched`: the value tile, warps,
    strides and alignment the launcher passes), in every mode: no stack frame, no local memory and
    no local stores (``STL``) in the SASS of any launch. Passes with Triton 3.8 (here, CI) and 3.6
    (the device's; ``pip install --target /tmp/t36 triton==3.6.0``, then ``PYTHONPATH=/tmp/t36``).
    Both fail it with all 128 key columns in one slice (the kkt launch spills 232-1024 bytes a
    thread), with the output launch on 2 warps (200-216 bytes) or with 128-column value tiles.
    Until session 33 this test compiled without the launch's argument specialisation
    (:func:`compile_sm90`), spilled where the launched kernels do not, and ran on Triton 3.6 only."""
    from sglang_spec.gdn import triton_tree_wy as wy

    launches = wy_launches_27b(sglang_mode, ring, bn)
    names = [fn.__name__ for fn, _, _ in launches]
    assert names == ["_wy_kkt_kernel"] + ["_wy_solve_kernel"] * (bn > wy.BT) + ["_wy_out_kernel"]
    for fn, values, warps in launches:
        asm = compile_sm90_as_launched(fn, values, warps)
        res, sass = _cubin_resources(asm)
        assert res["STACK"] == res["LOCAL"] == 0 and "STL" not in sass, (fn.__name__, res)
        assert _ptxas_stack_bytes(asm) == 0, fn.__name__


@pytest.mark.parametrize("dtype", ["*bf16", "*fp32"])
@pytest.mark.parametrize("k", [7, 17, 49, 241])
def test_topk_kernels_compile_for_sm90(dtype, k):
    """The draft head's top-K at the 27B vocabulary: tiles of 4096, K up to budget 63's 49 (and
    budget 255's 241 at the tiny pair's horizon), the candidate search without spilling."""
    from sglang_spec.tree import triton_topk as tt

    kb, tiles = triton.next_power_of_2(k), triton.cdiv(248320, 4096)
    types = dict(logits_ptr=dtype, cand_id_ptr="*i32", V="i32", stride="i32", temp="fp32")
    assert compile_sm90(tt._tile_stats_kernel, dict(BV=4096, SCALE=True), types=types)["cubin"]
    consts = dict(K=k, KB=kb, TB=64, BV=4096, SCALE=True)
    asm = compile_sm90(tt._tile_candidates_kernel, consts, types=types)
    assert asm["cubin"] and _ptxas_stack_bytes(asm) == 0  # a 4096-wide tile in registers
    types = dict(cand_id_ptr="*i32", id_ptr="*i64", tiles="i32", V="i32")
    consts = dict(K=k, KB=kb, CB=triton.next_power_of_2(tiles * kb), TB=64)
    assert compile_sm90(tt._merge_kernel, consts, types=types)["cubin"]


@pytest.mark.parametrize("conv_dtype", ["*bf16", "*fp32"])
def test_commit_conv_states_kernel_compiles_for_sm90_unspecialised(conv_dtype):
    """One variant for every batch size and budget: the arguments that change with them are not
    specialised (a compile per new (batch, budget) pair fell inside a timed level, session 25)."""
    from sglang_spec.gdn import triton_tree_conv as ttc

    fn = ttc._commit_conv_states_kernel
    params = list(inspect.signature(fn.fn).parameters)
    unspecialised = {params[i] if isinstance(i, int) else i for i in fn.do_not_specialize}
    assert unspecialised >= {"bs", "A", "N", "s_ix_b"}
    types = dict(conv_ptr=conv_dtype, inputs_ptr=conv_dtype, slots_ptr="*i64", rows_ptr="*i64")
    types |= dict(index_ptr="*i32", lens_ptr="*i32", track_slots_ptr="*i64")
    types |= dict(track_nodes_ptr="*i64")
    consts = dict(STATE_LEN=3, AB=16, BLOCK=ttc.BLOCK_C)
    assert compile_sm90(ttc._commit_conv_states_kernel, consts, types=types)["cubin"]


# (Hk, Hv, K = V): the 27B shape's GDN, the tiny hybrid pair's
@pytest.mark.parametrize("dims", [(16, 48, 128), (1, 2, 64)])
def test_wy_output_launch_fits_an_h200_block_up_to_the_widest_tree(dims):
    """The output launch as the launcher sets it up fits an sm_90 block's shared memory at the
    widest tree (MAX_WY_NODES: in blocks of TILE_ROWS rows) and at the widest one-tile launch
    (MAX_ONE_TILE_NODES); holding a 256-row tree at once it would not (its [BN, BN] blocks grow as
    BN^2: 256 KB with the H200's Triton 3.6), which is why wider trees go in blocks."""
    from sglang_spec.gdn import triton_tree_wy as wy

    hk, hv, d = dims
    bf16 = ("g_ptr", "beta_ptr", "o_ptr", "ring_k_ptr", "ring_v_ptr")

    def shared(bn: int, tiled: bool) -> int:
        consts = dict(HV=hv, GRP=hv // hk, DK=d, BK=d, BKC=wy.K_SLICE, BT=wy.BT, BN=bn, W=16)
        consts |= dict(SGLANG=True, RING=True, DV=d, BV=wy.choose_wy_block_v(d, bn))
        consts |= dict(PREC=wy.WY_DOT_PRECISION, TILED=tiled, RB=wy.TILE_ROWS)
        asm = compile_sm90(
            wy._wy_out_kernel,
            consts,
            ints_32=("N",),
            types={p: "*bf16" for p in bf16},
            options=dict(num_warps=wy.WY_WARPS),
        )
        return asm["shared"]

    widest = wy.wy_block_rows(wy.MAX_WY_NODES)
    assert widest > wy.MAX_ONE_TILE_NODES
    assert shared(widest, True) <= SM90_MAX_SHARED
    assert shared(wy.MAX_ONE_TILE_NODES, False) <= SM90_MAX_SHARED
    assert shared(256, False) > SM90_MAX_SHARED
