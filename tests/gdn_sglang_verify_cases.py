"""Child process of tests/test_gdn_sglang_verify.py: runs the Triton side under ``TRITON_INTERPRET=1``.

``python tests/gdn_sglang_verify_cases.py PRISTINE_FOLD OUT.pt`` with a patched copy of SGLang
0.5.22 or 0.5.23 first on ``sys.path`` (the parent builds it). Runs on one random case (``make_case``):

* ``ours``: ``sglang_spec.gdn.sglang_verify.gdn_tree_verify_wy`` -- outputs and ring;
* ``sglang_ring``: SGLang's own recurrent kernel (cut verbatim, ``tests/sglang_kernel_gdn.py``) on
  the same tokens as a chain with ``cache_ring=True`` -- the ring it stores per token, which is
  what its fold kernel expects per step;
* ``folds``: SGLang's released fold kernel (``gdn_replayssm_exact_fold_kernel``, loaded from the
  file PRISTINE_FOLD) replaying, per real request, the path to its deepest node and to a random node
  from OUR ring (the path's columns gathered into a chain ring: the released fold reads column t at
  step t);
* ``patched``: the patched ``GDNAttnBackend._replayssm_fold_target_verify`` (imported from the
  copy) on the same tensors, with a fresh ring;
* ``graph_paths``: the patched ``MambaAttnBackendBase.update_verify_buffers_to_fill_after_draft`` on
  a CUDA-graph batch size larger than the verify's.

Everything comes back raw; the parent computes the references and asserts.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from types import SimpleNamespace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(1, HERE)

from sglang_kernel_gdn import load_gdn_kernels  # noqa: E402
from test_gdn_tree_recurrence import random_parents  # noqa: E402

from sglang_spec.gdn import tree_paths  # noqa: E402
from sglang_spec.gdn.sglang_verify import (  # noqa: E402
    TreeVerifyTables,
    gdn_tree_verify_wy,
)
from sglang_spec.gdn.triton_tree_wy import tree_wy_scratch  # noqa: E402

BS, N, HK, HV, DK, DV = 4, 10, 1, 3, 16, 8  # GQA 1:3; request 1 is padding
SLOTS, RING_ROWS, RING_N = 6, 5, N + 2  # the ring is wider than the tree: columns >= N untouched
SENTINEL = 7.0


def make_case(seed: int = 5) -> dict:
    gen = torch.Generator().manual_seed(seed)
    parents = torch.tensor([random_parents(gen, N, 6, 0.15) for _ in range(BS)])
    # conv output [T, q | k | v] and the a | b projection: q/k/v/a/b are strided views of these
    mixed = torch.randn(BS * N, 2 * HK * DK + HV * DV, generator=gen)
    ab = torch.randn(BS * N, 2 * HV, generator=gen)
    return dict(
        parents=parents,
        paths=tree_paths(parents, width=int(tree_depth_max(parents)) + 3).int(),
        mixed=mixed,
        ab=ab,
        A_log=torch.randn(HV, generator=gen) * 0.5,
        dt_bias=torch.randn(HV, generator=gen),
        pool=torch.randn(SLOTS, HV, DV, DK, generator=gen),
        cache_indices=torch.tensor([4, -1, 1, 3], dtype=torch.int32),
        ring_rows=torch.tensor([2, 0, 4, 1], dtype=torch.int32),
        fold_nodes=[random_real_node(gen, row) for row in parents.tolist()],
    )


def random_real_node(gen: torch.Generator, parents_row: list[int]) -> int:
    real = [i for i, p in enumerate(parents_row) if p >= 0]
    return real[int(torch.randint(len(real), (1,), generator=gen))]


def tree_depth_max(parents: torch.Tensor) -> int:
    return int((tree_paths(parents) >= 0).sum(-1).max()) - 1


def split(case: dict):
    """SGLang's views: q, k [1, T, Hk, K], v [1, T, Hv, V], a, b [T, Hv] (all strided)."""
    t = BS * N
    q, k, v = torch.split(case["mixed"], [HK * DK, HK * DK, HV * DV], dim=-1)
    a, b = torch.split(case["ab"], [HV, HV], dim=-1)
    return q.view(1, t, HK, DK), k.view(1, t, HK, DK), v.view(1, t, HV, DV), a, b


def fresh_ring(rows: int) -> dict:
    return dict(
        rawk=torch.full((rows, HK, RING_N, DK), SENTINEL),
        rawv=torch.full((rows, HV, RING_N, DV), SENTINEL),
        g=torch.full((rows, HV, RING_N), SENTINEL),
        beta=torch.full((rows, HV, RING_N), SENTINEL),
    )


def ring_tuple(ring: dict):
    return ring["rawk"], ring["rawv"], ring["g"], ring["beta"]


def run_ours(case: dict) -> dict:
    q, k, v, a, b = split(case)
    assert not (q.is_contiguous() or v.is_contiguous() or a.is_contiguous())
    ring = fresh_ring(RING_ROWS)
    pool = case["pool"].clone()
    o = gdn_tree_verify_wy(
        q,
        k,
        v,
        a,
        b,
        case["A_log"],
        case["dt_bias"],
        pool,
        case["cache_indices"],
        case["paths"],
        tree_wy_scratch(BS, N, HV, "cpu").fill_(float("nan")),  # written before read
        ring=ring_tuple(ring),
        ring_rows=case["ring_rows"],
    )
    return dict(o=o, ring=ring, pool_after=pool)


def run_sglang_ring(case: dict, kern) -> dict:
    """SGLang's verify kernel on the same tokens (a chain per request), storing its ring at the
    mamba slot ``cache_indices[b]``, as its chain fold-every-commit verify does."""
    q, k, v, a, b = split(case)
    ring = fresh_ring(SLOTS)
    kern.fused_sigmoid_gating_delta_rule_update(
        A_log=case["A_log"],
        dt_bias=case["dt_bias"],
        q=q,
        k=k,
        v=v,
        a=a,
        b=b,
        initial_state_source=case["pool"].clone(),
        initial_state_indices=case["cache_indices"],
        cu_seqlens=torch.arange(0, BS * N + 1, N, dtype=torch.int32),
        use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0,
        softplus_threshold=20.0,
        is_kda=False,
        disable_state_update=True,
        cache_ring=True,
        replayssm_rawv=ring["rawv"],
        replayssm_rawk=ring["rawk"],
        replayssm_g=ring["g"],
        replayssm_beta=ring["beta"],
    )
    return ring


# The released fold casts its loop counter with ``t.to(tl.int64)``: a tensor when compiled, a Python
# int under the interpreter, where it fails. ``tl.cast`` is the same cast and runs in both.
INTERPRETER_SHIM = ("phys = t.to(tl.int64)", "phys = tl.cast(t, tl.int64)")


def load_pristine_fold(path: str, workdir: str):
    """The released fold module (its file, with the one interpreter shim applied)."""
    source = open(path).read()
    assert source.count(INTERPRETER_SHIM[0]) == 1
    # Triton reads kernel source from a file
    shimmed = os.path.join(workdir, "pristine_gdn_fold.py")
    with open(shimmed, "w") as f:
        f.write(source.replace(*INTERPRETER_SHIM))
    spec = importlib.util.spec_from_file_location("pristine_gdn_fold", shimmed)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_folds(case: dict, ours: dict, fold) -> list:
    """Per real request and path (deepest node, a random node): SGLang's fold of our ring's path
    columns into the request's pool row."""
    out = []
    ring = ours["ring"]
    for b in range(BS):
        slot, row = int(case["cache_indices"][b]), int(case["ring_rows"][b])
        if slot < 0:
            continue
        paths = case["paths"][b]
        depth = (paths >= 0).sum(-1)
        for node in (int(depth.argmax()), case["fold_nodes"][b]):
            path = [int(x) for x in paths[node] if x >= 0]
            cols = torch.tensor(path)
            chain = {
                "rawk": ring["rawk"][row][:, cols][None, None],  # [layers 1, slots 1, Hk, D, K]
                "rawv": ring["rawv"][row][:, cols][None, None],
                "g": ring["g"][row][:, cols][None, None],
                "beta": ring["beta"][row][:, cols][None, None],
            }
            state = case["pool"][slot][None, None].clone()  # [1, 1, Hv, V, K]
            fold.commit_gdn_replayssm_fold_all_layers(
                checkpoint_state=state,
                rawv_cache=chain["rawv"].contiguous(),
                rawk_cache=chain["rawk"].contiguous(),
                g_cache=chain["g"].contiguous(),
                beta_cache=chain["beta"].contiguous(),
                ssm_state_indices=torch.zeros(1, dtype=torch.int32),
                accept_lens=torch.tensor([len(path)], dtype=torch.int32),
                max_cache_len=len(path),
                num_k_heads=HK,
            )
            out.append(dict(b=b, path=path, state=state[0, 0]))
    return out


def run_patched(case: dict) -> dict:
    """The patched _replayssm_fold_target_verify (from the copy) on a stand-in backend/layer."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    assert "sglang-spec 0002" in open(sys.modules[GDNAttnBackend.__module__].__file__).read()
    backend = GDNAttnBackend.__new__(GDNAttnBackend)
    backend.tree_verify = TreeVerifyTables(HV, "cpu")
    q, k, v, a, b = split(case)
    ring = fresh_ring(RING_ROWS)
    o = backend._replayssm_fold_target_verify(
        layer=SimpleNamespace(A_log=case["A_log"], dt_bias=case["dt_bias"]),
        query=q,
        key=k,
        value=v,
        a=a,
        b=b,
        layer_cache=SimpleNamespace(
            replayssm_rawk=ring["rawk"],
            replayssm_rawv=ring["rawv"],
            replayssm_g=ring["g"],
            replayssm_beta=ring["beta"],
        ),
        ssm_states=case["pool"],
        cache_indices=case["cache_indices"],
        query_start_loc=torch.arange(0, BS * N + 1, N, dtype=torch.int32),
        retrieve_parent_token=case["parents"].clamp(min=0).int(),
        retrieve_tree_paths=case["paths"],
        ring_rows=case["ring_rows"],
    )
    return dict(o=o, ring=ring)


def run_graph_paths(case: dict) -> dict:
    """The patched update_verify_buffers_to_fill_after_draft for graph batch size BS + 2."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    graph_bs, w = BS + 2, case["paths"].shape[2]
    tables = TreeVerifyTables(HV, "cpu")
    placeholder = SimpleNamespace(draft_token_num=N, spec_steps=w - 1, retrieve_tree_paths=None)
    captured = tables.graph_paths(graph_bs, placeholder)  # what the capture's metadata points to
    spec_info = EagleVerifyInput.__new__(EagleVerifyInput)
    spec_info.retrieve_next_token = torch.zeros(BS, N, dtype=torch.int32)
    spec_info.retrieve_next_sibling = torch.zeros(BS, N, dtype=torch.int32)
    spec_info.retrieve_tree_paths = case["paths"]
    fake = SimpleNamespace(
        topk=4,
        tree_verify=tables,
        retrieve_next_token_list=[torch.zeros(i + 1, N, dtype=torch.int32) for i in range(8)],
        retrieve_next_sibling_list=[torch.zeros(i + 1, N, dtype=torch.int32) for i in range(8)],
    )
    MambaAttnBackendBase.update_verify_buffers_to_fill_after_draft(fake, spec_info, graph_bs)
    return dict(
        buffer=captured.clone(), same_buffer=tables.graph_paths(graph_bs, placeholder) is captured
    )


def main(pristine_fold: str, out_path: str) -> None:
    case = make_case()
    with tempfile.TemporaryDirectory() as work:
        kern = load_gdn_kernels(work)
        ours = run_ours(case)
        result = dict(
            case=case,
            ours=ours,
            sglang_ring=run_sglang_ring(case, kern),
            folds=run_folds(case, ours, load_pristine_fold(pristine_fold, work)),
            patched=run_patched(case),
            graph_paths=run_graph_paths(case),
        )
    torch.save(result, out_path)


if __name__ == "__main__":
    main(*sys.argv[1:])
