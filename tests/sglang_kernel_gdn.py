"""SGLang 0.5.23's own Triton GDN tree-verify kernels, run on CPU under the Triton interpreter (or on a GPU).

Used by tests/test_sglang_gdn_kernels.py; benchmarks/gdn_verify.py reuses its verify plumbing
(:func:`verify_conv`, :func:`verify_recurrent`) with the kernels of the real ``sglang`` package. Like
``tests/tree_oracles.py`` (``load_sglang_kernels``), the kernel code is cut verbatim out of the installed
SGLang source files (found with ``importlib.util.find_spec``, which does not import the package: the
site-packages copy here, the GPU kit's ``PYTHONPATH`` copy on the GPU machine) with ``ast`` and imported
from a scratch module, so the ``sglang`` package (slow to import on CPU, and some modules import
sgl_kernel) is never imported. Where SGLang's launch wrapper itself runs on CPU it is cut verbatim too;
only the names those files import from ``sglang`` are replaced by stubs (``_PRELUDE``):

* ``kernels/ops/mamba/causal_conv1d_triton.py``: ``_causal_conv1d_update_kernel`` and its wrapper
  ``causal_conv1d_update`` (verbatim; ``is_arch_support_pdl`` -> False: PDL only adds
  ``gdc_wait``/``gdc_launch_dependents`` scheduling, no numerics);
* ``kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py``: the kernel
  ``fused_sigmoid_gating_delta_rule_update_kernel``, its helpers and the wrapper
  ``fused_sigmoid_gating_delta_rule_update`` with ``_select_recurrent_launch_config`` (verbatim; the
  device predicates ``_is_hip/_is_sm90/...`` are False, so the value tile is ``min(next_pow2(dv), 32)``
  unless a case overrides the launch config; on CPU the wrapper picks the ``(NK, NV, N*HV)`` grid);
* ``kernels/ops/mamba/mamba_state_scatter_triton.py``: ``fused_commit_track_indices`` (+ kernel) verbatim,
  and the commit scatter kernels ``_fused_mamba_state_scatter_with_mask_kernel`` /
  ``_fused_conv_window_scatter_with_mask_kernel`` (their wrappers refuse non-CUDA tensors, so the launch
  lines are re-stated in ``_scatter``).

``run_case`` reproduces the TARGET_VERIFY plumbing of ``srt/layers/attention/linear/gdn_backend.py``
(``forward_extend``: the ``causal_conv1d_update`` call at :1047, the q/k/v split at :1095 and the
``kernel_dispatcher.target_verify`` call at :1147 -> ``TritonGDNKernel.target_verify`` in
``linear/kernels/gdn_triton.py:217``; :func:`verify_conv` / :func:`verify_recurrent`), the buffer shapes of
``mem_cache/memory_pool.py`` (dense conv-window layout, used for topk > 1) and the commit of
``speculative/spec_utils.py:commit_mamba_states_after_verify`` ->
``mamba_state_scatter_triton.scatter_mamba_states_after_mtp_verify``.

As a script, ``python tests/sglang_kernel_gdn.py IN.pt OUT.pt DEVICE`` runs every case of IN.pt and saves
the raw results (on the CPU); it imports neither ``sglang`` nor ``sglang_spec``. DEVICE ``cpu`` runs under
``TRITON_INTERPRET=1``; ``cuda`` (``TRITON_INTERPRET`` unset) moves the cases to the GPU and runs the same
verbatim kernels and launch code compiled by Triton -- with the same stubs, so no PDL and the generic value
tile (the H200's BV=4 only where a case asks for it), and on CUDA the recurrent wrapper launches its
``(NV, N, HV)`` grid instead of the CPU's ``(NK, NV, N*HV)``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import textwrap

import torch

SGLANG_GDN_SOURCES = {
    # file under site-packages/sglang/ -> top-level names (functions or assignments) cut verbatim
    "kernels/ops/mamba/causal_conv1d_triton.py": (
        "PAD_SLOT_ID",
        "_causal_conv1d_update_kernel",
        "causal_conv1d_update",
    ),
    "kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py": (
        "_select_recurrent_launch_config",
        "_EX2_APPROX_FTZ_F32",
        "_LG2_APPROX_FTZ_F32",
        "_UNARY_F32_REGISTERS",
        "_ex2_approx_ftz_f32",
        "_lg2_approx_ftz_f32",
        "_cutedsl_exp",
        "_cutedsl_qk_sum_squares",
        "fused_sigmoid_gating_delta_rule_update_kernel",
        "fused_sigmoid_gating_delta_rule_update",
    ),
    "kernels/ops/mamba/mamba_state_scatter_triton.py": (
        "_fused_mamba_state_scatter_with_mask_kernel",
        "_fused_conv_window_scatter_with_mask_kernel",
        "_fused_commit_track_indices_kernel",
        "fused_commit_track_indices",
    ),
}

# Stand-ins for what those files import from `sglang` (a CPU host: no PDL, no HIP/SM90 special tiles; kept on
# CUDA too, where they only pick the launch configuration: PDL scheduling and the default value tile).
_PRELUDE = '''\
from typing import List, Optional, Union

import torch
import triton
import triton.language as tl


def is_arch_support_pdl():
    return False


_is_hip = False
_is_gfx95 = False
_is_sm90 = False
_is_sm103 = False
_is_sm107 = False
'''


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")  # locates the package without importing it
    assert spec is not None and spec.origin, "sglang is not installed in this environment"
    return os.path.dirname(spec.origin)


def cut_source(rel: str, names) -> dict:
    """Source text of the top-level functions (with decorators) / assignments ``names`` of SGLang file ``rel``."""
    path = os.path.join(sglang_root(), rel)
    if not os.path.exists(path):  # 0.5.22 keeps the linear-attention kernels under attention/fla/
        path = os.path.join(sglang_root(), rel.replace("/attention/linear/", "/attention/fla/"))
    src = open(path).read()
    lines = src.splitlines()
    found = {}
    for node in ast.parse(src).body:
        if isinstance(node, ast.FunctionDef):
            name, start = node.name, min([d.lineno for d in node.decorator_list] + [node.lineno])
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name, start = node.targets[0].id, node.lineno
        else:
            continue
        if name in names:
            found[name] = textwrap.dedent("\n".join(lines[start - 1 : node.end_lineno]))
    missing = set(names) - set(found)
    assert not missing, f"SGLang source {rel} lacks {sorted(missing)}"
    return found


def load_verbatim(sources: dict, prelude: str, workdir: str, name: str):
    """Scratch module ``name`` (written in ``workdir``: Triton reads kernel source from a real file)
    holding ``prelude`` and, verbatim, the SGLang code ``sources`` lists ({file under sglang/: names})."""
    parts = [prelude]
    for rel, names in sources.items():
        found = cut_source(rel, names)
        parts.append(f"# ---- verbatim from sglang/{rel}")
        parts.extend(found[n] + "\n\n" for n in names)
    path = os.path.join(workdir, f"{name}.py")
    with open(path, "w") as fh:
        fh.write("\n".join(parts))
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_gdn_kernels(workdir: str):
    """Scratch module holding the verbatim SGLang code listed in ``SGLANG_GDN_SOURCES``."""
    return load_verbatim(SGLANG_GDN_SOURCES, _PRELUDE, workdir, "sglang_gdn_kernels_verbatim")


def _scatter(mod, dst, src, dst_indices, steps, conv: bool) -> None:
    """Launch lines of ``fused_mamba_state_scatter_with_mask`` / ``fused_conv_window_scatter_with_mask``
    (mamba_state_scatter_triton.py:312 / :487), whose CUDA-only guards keep them off the CPU (on CUDA these
    same re-stated lines launch the same verbatim kernels).
    dst [layers, slots, ...]; src [layers, rows, steps, ...]; scratch row of request i is i."""
    total = steps.shape[0]
    dst_indices = dst_indices.to(torch.int32).contiguous()
    steps = steps.to(torch.int32).contiguous()
    src_rows = torch.arange(total, dtype=torch.int32, device=steps.device)  # _prepare_src_rows(None, steps)
    block = 1024
    if conv:
        elem = dst.shape[2] * dst.shape[3]
        grid = (total, dst.shape[0], triton_cdiv(elem, block))
        mod._fused_conv_window_scatter_with_mask_kernel[grid](
            src, dst, dst_indices, steps, src_rows, elem, dst.shape[3],
            src.stride(0), src.stride(1), src.stride(2), src.stride(3), src.stride(4),
            dst.stride(0), dst.stride(1), src.shape[1], src.shape[2], dst.shape[1], BLOCK_SIZE=block,
        )
    else:
        elem = dst.numel() // (dst.shape[0] * dst.shape[1])
        assert src.is_contiguous()
        grid = (total, dst.shape[0], triton_cdiv(elem, block))
        mod._fused_mamba_state_scatter_with_mask_kernel[grid](
            src, dst, dst_indices, steps, src_rows, elem,
            src.stride(0), src.stride(1), src.stride(2), dst.stride(0), dst.stride(1),
            src.shape[1], src.shape[2], dst.shape[1], BLOCK_SIZE=block,
        )


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def verify_conv(kern, c: dict, conv_states, intermediate_conv_window, intermediate_state_indices,
                retrieve_parent_token) -> torch.Tensor:
    """``causal_conv1d_update`` of one GDN layer's TARGET_VERIFY (``gdn_backend.py:1041-1060``), output
    ``[bs*N, C]``. ``kern`` holds SGLang's kernels (this file's verbatim module or the real ``sglang``);
    ``c`` the layer's inputs (see :func:`run_case`). Tree mode (topk > 1) when ``retrieve_parent_token``
    (``[bs, N]`` int64, written here) is given: ``c``'s ``retrieve_next_token``/``retrieve_next_sibling``
    go in too; chain mode (topk <= 1) passes all three as None (``hybrid_linear_attn_backend.py:298``)."""
    T = c["mixed_qkv"].shape[0]
    bs = c["cache_indices"].shape[0]
    tree = retrieve_parent_token is not None
    processed = kern.causal_conv1d_update(
        c["mixed_qkv"].view(bs, T // bs, -1).transpose(1, 2),
        conv_states,
        c["conv_weight"],
        None,  # Qwen3.5 / Qwen3-Next conv1d has no bias
        "silu",
        conv_state_indices=c["cache_indices"],
        intermediate_conv_window=intermediate_conv_window,
        intermediate_state_indices=intermediate_state_indices[:bs],
        retrieve_next_token=c["retrieve_next_token"] if tree else None,
        retrieve_next_sibling=c["retrieve_next_sibling"] if tree else None,
        retrieve_parent_token=retrieve_parent_token,
    )
    return processed.transpose(1, 2).reshape(T, -1)


def verify_recurrent(kern, c: dict, conv_out, ssm_states, query_start_loc, intermediate_ssm,
                     intermediate_state_indices, retrieve_parent_token) -> torch.Tensor:
    """The q/k/v split of ``conv_out`` (``gdn_backend.py:1095``, strided; ``c["contiguous_qkv"]``: the
    ``fused_qkv_split_gdn_prefill`` layout) and ``TritonGDNKernel.target_verify``
    (``linear/kernels/gdn_triton.py:217``, called at ``gdn_backend.py:1147``); core output
    ``[1, bs*N, HV, dv]``. Tree mode iff ``retrieve_parent_token`` is given (as in :func:`verify_conv`)."""
    T = conv_out.shape[0]
    H, HV, dk, dv = c["num_k_heads"], c["num_v_heads"], c["head_k_dim"], c["head_v_dim"]
    query, key, value = torch.split(conv_out, [H * dk, H * dk, HV * dv], dim=-1)
    query = query.view(1, T, H, dk)
    key = key.view(1, T, H, dk)
    value = value.view(1, T, HV, dv)
    if c.get("contiguous_qkv"):  # the fused_qkv_split_gdn_prefill layout (CUDA, non-strided route)
        query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    return kern.fused_sigmoid_gating_delta_rule_update(
        A_log=c["A_log"],
        dt_bias=c["dt_bias"],
        q=query,
        k=key,
        v=value,
        a=c["a"],
        b=c["b"],
        initial_state_source=ssm_states,
        initial_state_indices=c["cache_indices"],
        cu_seqlens=query_start_loc,
        use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0,
        softplus_threshold=20.0,
        is_kda=False,
        disable_state_update=True,
        intermediate_states_buffer=intermediate_ssm,
        intermediate_state_indices=intermediate_state_indices,
        cache_steps=T // c["cache_indices"].shape[0],
        retrieve_parent_token=retrieve_parent_token,
    )


def run_case(mod, c: dict) -> dict:
    """One TARGET_VERIFY forward of one GDN layer for ``bs`` requests of ``N`` tree slots each, on the
    device the case's tensors are on.

    Inputs (all fp32 unless noted): ``mixed_qkv [bs*N, C]``, ``a``/``b [bs*N, HV]`` (the layer's input
    projections, as Qwen3.5 hands them to ``RadixLinearAttention``), ``conv_weight [C, K]``, ``A_log``,
    ``dt_bias [HV]``, the pools ``conv_pool [P, C, K-1]`` / ``ssm_pool [P, HV, dv, dk]``, ``cache_indices
    [bs]`` int32, ``retrieve_next_token``/``retrieve_next_sibling [bs, N]`` int64, ``accepts``: a list of
    ``(accept_index [bs, D], accept_lens [bs])`` as the tree walk returns them (flat ``b*N + node``).
    """
    dev = c["mixed_qkv"].device
    T, C = c["mixed_qkv"].shape
    bs, N = c["retrieve_next_token"].shape
    HV, dk, dv = c["num_v_heads"], c["head_k_dim"], c["head_v_dim"]
    assert T == bs * N
    conv_pool = c["conv_pool"].clone()
    ssm_pool = c["ssm_pool"].clone()
    P = conv_pool.shape[0]
    cache_indices = c["cache_indices"]
    # MambaPool.SpeculativeState (memory_pool.py:883, dense conv-window layout for topk > 1), one layer;
    # NaN so that any entry the kernels should have written but did not shows up.
    intermediate_ssm = torch.full((P + 1, N, HV, dv, dk), float("nan"), device=dev)
    intermediate_conv_window = torch.full((P + 1, N, C, conv_pool.shape[2]), float("nan"), device=dev)
    # request row i owns scratch row i
    intermediate_state_indices = torch.arange(bs, dtype=torch.int32, device=dev)
    # hybrid_linear_attn_backend.py:298
    retrieve_parent_token = torch.full_like(c["retrieve_next_token"], -7)  # torch.empty_like in SGLang
    query_start_loc = torch.arange(0, T + 1, N, dtype=torch.int32, device=dev)

    conv_out = verify_conv(mod, c, conv_pool, intermediate_conv_window, intermediate_state_indices,
                           retrieve_parent_token)
    conv_pool_after_verify = conv_pool.clone()

    saved_cfg = mod._select_recurrent_launch_config
    if c.get("value_tile"):  # emulate the H200 verify tile (BV=4, gdn_backend on SM90 picks it for k=v=128)
        mod._select_recurrent_launch_config = lambda *a, **k: (c["value_tile"], 1)
    try:
        core = verify_recurrent(mod, c, conv_out, ssm_pool, query_start_loc, intermediate_ssm,
                                intermediate_state_indices, retrieve_parent_token)
    finally:
        mod._select_recurrent_launch_config = saved_cfg
    ssm_pool_after_verify = ssm_pool.clone()

    commits = []
    for accept_index, accept_lens in c["accepts"]:
        # spec_utils._verify_commit_step_indices, CUDA branch (no mamba tracking)
        steps, track = mod.fused_commit_track_indices(
            accept_index.to(torch.int64), accept_lens.to(torch.int32), None, N, 0
        )
        conv_dst, ssm_dst = conv_pool_after_verify.clone(), ssm_pool_after_verify.clone()
        # scatter_mamba_states_after_mtp_verify: ssm then conv, dst rows = cache_indices
        _scatter(mod, ssm_dst.unsqueeze(0), intermediate_ssm.unsqueeze(0), cache_indices, steps, conv=False)
        _scatter(mod, conv_dst.unsqueeze(0), intermediate_conv_window.unsqueeze(0), cache_indices, steps, conv=True)
        commits.append(dict(steps=steps.clone(), track=track, conv_pool=conv_dst, ssm_pool=ssm_dst))

    return dict(
        conv_out=conv_out.view(bs, N, C).clone(),
        retrieve_parent_token=retrieve_parent_token.clone(),
        intermediate_conv_window=intermediate_conv_window[:bs].clone(),
        intermediate_ssm=intermediate_ssm[:bs].clone(),
        core=core.view(bs, N, HV, dv).clone(),
        conv_pool_after_verify=conv_pool_after_verify,
        ssm_pool_after_verify=ssm_pool_after_verify,
        commits=commits,
    )


def _to(obj, device):
    """``obj`` (nested dicts / lists / tuples of tensors and plain values) with every tensor on ``device``."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def run_sglang_gdn_subprocess(cases: dict, tmpdir, device: str = "cpu") -> dict:
    """Run ``cases`` ({name: case}) through SGLang's kernels in a fresh interpreter: on ``cpu`` under the
    Triton interpreter (``TRITON_INTERPRET=1``), on ``cuda`` compiled by Triton for the GPU. Results come
    back on the CPU."""
    inp = os.path.join(str(tmpdir), "sglang_gdn_in.pt")
    out = os.path.join(str(tmpdir), "sglang_gdn_out.pt")
    torch.save(cases, inp)
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), inp, out, device], env=env,
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise AssertionError(
            f"SGLang GDN subprocess failed (rc={r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
        )
    return torch.load(out)


def _main(inp: str, out: str, device: str) -> None:
    assert device in ("cpu", "cuda"), device
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    assert interpreted == (device == "cpu"), "TRITON_INTERPRET=1 on cpu only"
    torch.set_num_threads(1)
    mod = load_gdn_kernels(os.path.dirname(out))
    cases = _to(torch.load(inp), device)
    torch.save(_to({name: run_case(mod, c) for name, c in cases.items()}, "cpu"), out)


if __name__ == "__main__":
    _main(*sys.argv[1:])
