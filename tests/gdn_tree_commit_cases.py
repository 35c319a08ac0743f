"""Patch 0003 (the GDN tree ReplaySSM commit side) run inside a patched copy of SGLang 0.5.22 / 0.5.23.

Used by tests/test_gdn_tree_commit.py, which builds the copy (``patched_sglang.patched_copy``: the
release with the project's patch series applied by ``sglang_spec.patching.core.apply``) and runs
this file as a script in a child process with ``TRITON_INTERPRET=1`` and the copy first on
``sys.path``:

    python tests/gdn_tree_commit_cases.py PATCHED_ROOT FOLD_REL UNPATCHED_FOLD_PY OUT.pt REPO

(FOLD_REL: the fold kernel's file under PATCHED_ROOT, ``sglang/kernels/ops/attention/.../
gdn_replayssm_spec_fold.py``.)

It writes OUT.pt, a dict of raw results the test compares (the references are computed by the test,
not here):

* ``tree``: the patched fold (``commit_gdn_replayssm_fold_all_layers``) of random per-node rings over
  accepted tree paths (``accept_index[b, t] = b * N + path[t]``, padded with -1), for several
  requests (one a padding row, ``state_batch_indices = -1``), two layers, GQA 2 : 6 key : value
  heads, K = 16, V = 48 (two value tiles, one masked), ring rows that are not the mamba slots, and
  an extra_buffer track slot keyed by a node of the path; its inputs are saved with it;
* ``commit``: the patched ``commit_gdn_replayssm_fold_after_verify`` on a GDN tree ``MambaPool``'s
  own buffers (random rings, checkpoints, conv states and conv inputs), with a track slot;
* ``chain``: the patched and the unpatched fold of a linear chain (``accept_index = b * N + t``) on
  the same ring (ring row = mamba slot, the only layout the unpatched kernel reads), with a track
  step;
* ``pool``: ``MambaPool`` built for a GDN tree, a GDN chain and a KDA tree with the flag (its
  buffers' shapes, the tree's conv inputs in place of conv windows);
* ``pricing``: ``replayssm_ring_bytes_per_req`` at the Qwen3.6-27B shape;
* ``solve``: the mamba/KV split (``_handle_max_mamba_cache``) for a GDN tree and a chain at the
  27B shape, at budgets where ``--max-running-requests`` binds and where it does not;
* ``hook``: ``handle_linear_attn_backend`` on the tiny hybrid and on a KDA-classified copy of it;
* ``applied``: the patch series the DDTREE plug-in finds applied (``config.applied_patches``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile

import torch

N, HK, HV, K, V, LAYERS = 9, 2, 6, 16, 48, 2


def load_module(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The unpatched fold casts its loop counter with ``t.to(tl.int64)``: a tensor when compiled, a
# Python int under the interpreter, where it fails. ``tl.cast`` is the same cast and runs in both.
INTERPRETER_SHIM = ("phys = t.to(tl.int64)", "phys = tl.cast(t, tl.int64)")


def load_unpatched_fold(path: str):
    """The released fold module, with the one interpreter shim applied to its source."""
    with open(path) as f:
        source = f.read()
    assert source.count(INTERPRETER_SHIM[0]) == 1, "the released fold changed; review the shim"
    shimmed = os.path.join(tempfile.mkdtemp(), "unpatched_fold.py")
    with open(shimmed, "w") as f:
        f.write(source.replace(*INTERPRETER_SHIM))
    return load_module("unpatched_fold", shimmed)


def random_tree(gen: torch.Generator, n: int) -> list[int]:
    """parents of a random topologically ordered tree of n nodes (parents[0] = -1): each node hangs
    under one of the two nodes before it, so trees both branch and go deep."""
    return [-1] + [int(torch.randint(max(0, i - 2), i, (1,), generator=gen)) for i in range(1, n)]


def path_to(parents: list[int], node: int) -> list[int]:
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


def rings(gen: torch.Generator, rows: int) -> dict[str, torch.Tensor]:
    """Random per-node raw inputs in SGLang's ring layout and dtypes (conv dtype bf16 for k, v)."""
    return {
        "rawk": torch.randn(LAYERS, rows, HK, N, K, generator=gen).to(torch.bfloat16),
        "rawv": torch.randn(LAYERS, rows, HV, N, V, generator=gen).to(torch.bfloat16),
        "g": -torch.rand(LAYERS, rows, HV, N, generator=gen) * 0.5,
        "beta": torch.rand(LAYERS, rows, HV, N, generator=gen),
    }


def released_fold_args(ring, state_idx, accept_lens, track_slots, track_steps) -> dict:
    """The arguments of ``commit_gdn_replayssm_fold_all_layers`` the released fold already takes."""
    return dict(
        rawv_cache=ring["rawv"],
        rawk_cache=ring["rawk"],
        g_cache=ring["g"],
        beta_cache=ring["beta"],
        ssm_state_indices=state_idx,
        accept_lens=accept_lens,
        max_cache_len=N,
        num_k_heads=HK,
        mamba_track_indices=track_slots,
        mamba_steps_to_track=track_steps,
    )


def tree_case(fold) -> dict:
    gen = torch.Generator().manual_seed(14)
    slots, rows = 8, 5
    state_idx = torch.tensor([5, 2, -1, 7], dtype=torch.int64)
    ring_idx = torch.tensor([3, 0, 4, 1], dtype=torch.int64)  # request rows != mamba slots
    bs, width = state_idx.numel(), 8  # accept_index columns: max depth + 1
    parents, paths = [], []
    for _ in range(bs):
        par = random_tree(gen, N)
        parents.append(par)
        # the deepest node: a path longer than one step through a branching tree
        depth = [len(path_to(par, i)) for i in range(N)]
        paths.append(path_to(par, max(range(N), key=depth.__getitem__)))
    accept_index = torch.full((bs, width), -1, dtype=torch.int32)
    for b, p in enumerate(paths):
        accept_index[b, : len(p)] = torch.tensor(p, dtype=torch.int32) + b * N
    accept_lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    # extra_buffer: request 0 snapshots at its path's second node, request 1 at none
    track_slots = torch.tensor([6, 1, -1, 0], dtype=torch.int64)
    track_steps = torch.tensor([paths[0][1], -1, -1, paths[3][-1]], dtype=torch.int64)
    ring = rings(gen, rows)
    temporal = torch.randn(LAYERS, slots, HV, V, K, generator=gen) * 0.3
    out = temporal.clone()
    fold.commit_gdn_replayssm_fold_all_layers(
        checkpoint_state=out,
        ring_indices=ring_idx,
        accept_index=accept_index,
        num_draft_tokens=N,
        **released_fold_args(ring, state_idx, accept_lens, track_slots, track_steps),
    )
    return {
        "temporal": temporal,
        "out": out,
        "ring": ring,
        "state_idx": state_idx,
        "ring_idx": ring_idx,
        "paths": paths,
        "parents": parents,
        "track_slots": track_slots,
        "track_steps": track_steps,
    }


def commit_case(fold) -> dict:
    """The patched ``commit_gdn_replayssm_fold_after_verify`` on a GDN tree pool's own buffers:
    the fold of the checkpoint and the conv states rebuilt from the conv inputs (+ the track slot)."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    gen = torch.Generator().manual_seed(16)
    pool = MambaPool(
        size=10,
        spec_state_size=4,
        cache_params=gdn_params(layers=LAYERS, hk=HK, hv=HV, k=K, v=V),
        mamba_layer_ids=list(range(LAYERS)),
        device="cpu",
        speculative_num_draft_tokens=N,
        speculative_eagle_topk=4,
        enable_linear_replayssm_spec=True,
    )
    c = pool.mamba_cache
    ring = rings(gen, c.replayssm_rawk.shape[1])
    for name, value in ring.items():
        getattr(c, f"replayssm_{name}").copy_(value)
    c.temporal.copy_(torch.randn(c.temporal.shape, generator=gen) * 0.3)
    c.conv[0].copy_(torch.randn(c.conv[0].shape, generator=gen))
    c.replayssm_conv_inputs.copy_(torch.randn(c.replayssm_conv_inputs.shape, generator=gen))
    state_idx = torch.tensor([9, 3, 6], dtype=torch.int64)
    bs = state_idx.numel()
    paths = []
    for b in range(bs):
        par = random_tree(gen, N)
        paths.append(path_to(par, [N - 1, 0, 4][b]))
    accept_index = torch.full((bs, N), -1, dtype=torch.int64)
    for b, p in enumerate(paths):
        accept_index[b, : len(p)] = torch.tensor(p) + b * N
    accept_lens = torch.tensor([len(p) for p in paths], dtype=torch.int32)
    track_slots = torch.tensor([8, -1, -1], dtype=torch.int64)
    track_steps = torch.tensor([paths[0][1], -1, -1], dtype=torch.int64)
    before = {"temporal": c.temporal.clone(), "conv": c.conv[0].clone()}
    fold.commit_gdn_replayssm_fold_after_verify(
        spec_state=c,
        state_batch_indices=state_idx,
        accept_lens=accept_lens,
        accept_index=accept_index,
        draft_token_num=N,
        mamba_track_indices=track_slots,
        mamba_steps_to_track=track_steps,
    )
    return {
        "temporal": before["temporal"],
        "conv": before["conv"],
        "out": c.temporal.clone(),
        "conv_out": c.conv[0].clone(),
        "conv_inputs": c.replayssm_conv_inputs.clone(),
        "ring": ring,
        "state_idx": state_idx,
        "ring_idx": torch.arange(bs),
        "paths": paths,
        "track_slots": track_slots,
    }


def chain_case(patched, unpatched) -> dict:
    gen = torch.Generator().manual_seed(15)
    slots = 6
    state_idx = torch.tensor([4, 1, 3], dtype=torch.int64)
    bs = state_idx.numel()
    accept_lens = torch.tensor([N, 1, 5], dtype=torch.int32)
    accept_index = torch.full((bs, N), -1, dtype=torch.int32)
    for b in range(bs):
        accept_index[b, : accept_lens[b]] = torch.arange(int(accept_lens[b])) + b * N
    track_slots = torch.tensor([0, -1, 2], dtype=torch.int64)
    track_steps = torch.tensor([3, -1, 4], dtype=torch.int64)
    ring = rings(gen, slots)
    temporal = torch.randn(LAYERS, slots, HV, V, K, generator=gen) * 0.3
    common = released_fold_args(ring, state_idx, accept_lens, track_slots, track_steps)
    before = temporal.clone()
    unpatched.commit_gdn_replayssm_fold_all_layers(checkpoint_state=before, **common)
    after = temporal.clone()
    patched.commit_gdn_replayssm_fold_all_layers(
        checkpoint_state=after,
        ring_indices=state_idx,
        accept_index=accept_index,
        num_draft_tokens=N,
        **common,
    )
    return {"temporal": temporal, "unpatched": before, "patched": after}


def gdn_params(*, layers: int, hk: int, hv: int, k: int, v: int):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape

    shape = Mamba2StateShape.create(
        tp_world_size=1,
        intermediate_size=hv * v,
        n_groups=hk,
        num_heads=hv,
        head_dim=v,
        state_size=k,
        conv_kernel=4,
    )
    return Mamba2CacheParams(shape=shape, layers=list(range(layers)))


def pool_case() -> dict:
    from sglang.srt.configs.mamba_utils import KimiLinearCacheParams, KimiLinearStateShape
    from sglang.srt.mem_cache.memory_pool import MambaPool

    gdn = gdn_params(layers=3, hk=HK, hv=HV, k=K, v=V)
    out = {}
    for name, topk in (("tree", 4), ("chain", 1)):
        pool = MambaPool(
            size=10,
            spec_state_size=4,
            cache_params=gdn,
            mamba_layer_ids=[0, 1, 2],
            device="cpu",
            speculative_num_draft_tokens=N,
            speculative_eagle_topk=topk,
            enable_linear_replayssm_spec=True,
        )
        c = pool.mamba_cache
        out[name] = {
            "fold": pool.replayssm_spec_fold,
            "shapes": {
                f: None if getattr(c, f) is None else tuple(getattr(c, f).shape)
                for f in (
                    "replayssm_rawk",
                    "replayssm_rawv",
                    "replayssm_g",
                    "replayssm_beta",
                    "replayssm_d",
                    "replayssm_k",
                    "intermediate_ssm",
                )
            },
            "dtypes": {
                f: str(getattr(c, f).dtype)
                for f in ("replayssm_rawk", "replayssm_rawv", "replayssm_g")
                if getattr(c, f) is not None
            },
            "conv_windows": [tuple(w.shape) for w in c.intermediate_conv_window],
            "conv_inputs": None
            if c.replayssm_conv_inputs is None
            else (tuple(c.replayssm_conv_inputs.shape), str(c.replayssm_conv_inputs.dtype)),
            "cursors": pool.replayssm_spec_write_pos is not None,
        }
    kda = KimiLinearCacheParams(
        shape=KimiLinearStateShape.create(tp_world_size=1, num_heads=2, head_dim=16),
        layers=[0],
    )
    try:
        MambaPool(
            size=4,
            spec_state_size=2,
            cache_params=kda,
            mamba_layer_ids=[0],
            device="cpu",
            speculative_num_draft_tokens=4,
            speculative_eagle_topk=4,
            enable_linear_replayssm_spec=True,
            linear_replayssm_cache_len=8,
        )
        out["kda_tree"] = "accepted"
    except ValueError as e:
        out["kda_tree"] = str(e)
    return out


def pricing_case() -> dict:
    # Qwen3.6-27B's GDN layers: 48 layers, 16 key heads, 48 value heads, K = V = 128
    p = gdn_params(layers=48, hk=16, hv=48, k=128, v=128)
    return {
        "per_req": p.mamba_cache_per_req,
        "conv_numel": sum(a * b for a, b in p.shape.conv),
        **{f"tree{n}": p.replayssm_ring_bytes_per_req(record_len=n, tree=True) for n in (65, 17)},
        "chain16": p.replayssm_ring_bytes_per_req(record_len=16),
    }


def solve_case() -> dict:
    """``KVCacheConfigurator._handle_max_mamba_cache`` (the auto-fit branch) for the Qwen3.6-27B
    GDN layers with the flag: a DDTREE(64) tree (topk > 1) and a chain (topk 1), extra_buffer with
    overlap off (4 slots per request), at mamba budgets where ``--max-running-requests`` binds and
    where it does not. Run on a published tiny-hybrid DDTREE server (the plug-in registered, the
    GPU's platform checks answered as on CUDA); the 27B parameters replace the model's."""
    import types

    from patched_sglang import publish_tiny_ddtree
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_context, get_schedule
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sa = publish_tiny_ddtree(
        "--speculative-num-draft-tokens",
        "64",
        "--mem-fraction-static",
        "0.8",
        "--mamba-radix-cache-strategy",
        "extra_buffer",
        "--enable-linear-replayssm-spec",
        # the session-4 server's scheduler (DDTREE's default is on)
        "--disable-overlap-schedule",
    )
    params = gdn_params(layers=48, hk=16, hv=48, k=128, v=128)
    fake = types.SimpleNamespace(
        mambaish_config=types.SimpleNamespace(mamba2_cache_params=params),
        hybrid_gdn_config=object(),
        hybrid_kda_config=None,
        pp_size=1,
        attn_dp_size=1,
        spec_algorithm=SpeculativeAlgorithm.from_string("DDTREE"),
        extra_mamba_cache_bytes_per_req=0,
        fused_entry_bytes=lambda _name: None,
    )
    fake._calculate_mamba_ratio = lambda: KVCacheConfigurator._calculate_mamba_ratio(fake)
    out = {
        "slot": params.mamba_cache_per_req,
        "ratio": fake._calculate_mamba_ratio(),
        "width": int(sa.speculative_num_draft_tokens),
        "tree_row": params.replayssm_ring_bytes_per_req(record_len=64, tree=True),
        "chain_row": params.replayssm_ring_bytes_per_req(
            record_len=int(get_context().config_leaf("linear_replayssm_cache_len"))
        ),
        "cases": [],
    }
    for topk in (63, 1):
        for mrr in (64, 8):
            for rest_gib in (57.647, 72.7):
                get_context().override(
                    "test",
                    max_mamba_cache_size=None,
                    max_running_requests=mrr,
                    speculative_eagle_topk=topk,
                )
                after = KVCacheConfigurator._handle_max_mamba_cache(fake, rest_gib)
                out["cases"].append(
                    {
                        "topk": topk,
                        "mrr": mrr,
                        "rest_gib": rest_gib,
                        "budget": rest_gib
                        * (1 << 30)
                        * get_schedule().mamba_full_memory_ratio
                        / (1 + get_schedule().mamba_full_memory_ratio),
                        "slots": int(get_schedule().max_mamba_cache_size),
                        "after_gib": after,
                    }
                )
    return out


def hook_case(repo: str) -> dict:
    from sglang.srt.arg_groups.attention_hook import handle_linear_attn_backend
    from sglang.srt.server_args import prepare_server_args

    hybrid = os.path.join(repo, "sglang_spec/fixtures/tiny-pair/hybrid")
    kda = tempfile.mkdtemp()
    cfg = json.load(open(os.path.join(hybrid, "config.json")))
    cfg["linear_attn_config"] = {"kda_layers": [1]}  # what SGLang reads to call a model KDA
    with open(os.path.join(kda, "config.json"), "w") as f:
        json.dump(cfg, f)
    out = {}
    for name, model, extra in (
        ("gdn_tree", hybrid, ["--speculative-eagle-topk", "4"]),
        ("gdn_chain", hybrid, ["--speculative-eagle-topk", "1"]),
        ("kda_tree", kda, ["--speculative-eagle-topk", "4"]),
        ("kda_chain", kda, ["--speculative-eagle-topk", "1"]),
        (
            "gdn_tree_flashinfer_verify",
            hybrid,
            ["--speculative-eagle-topk", "4", "--linear-attn-verify-backend", "flashinfer"],
        ),
        ("gdn_tree_no_flag", hybrid, ["--speculative-eagle-topk", "4", "--no-flag"]),
    ):
        flag = [] if "--no-flag" in extra else ["--enable-linear-replayssm-spec"]
        argv = ["--model-path", model, "--device", "cuda", *flag]
        sa = prepare_server_args(argv + [a for a in extra if a != "--no-flag"])
        try:
            handle_linear_attn_backend(sa)
            out[name] = "accepted"
        except ValueError as e:
            out[name] = str(e)
    return out


def applied_case() -> tuple[str, ...]:
    """What the DDTREE plug-in reads of this (patched) SGLang to accept the flag."""
    from sglang_spec.plugin.config import applied_patches

    return applied_patches()


def main(root: str, fold_rel: str, unpatched_fold: str, repo: str, out_path: str) -> None:
    patched = load_module("patched_fold", os.path.join(root, fold_rel))
    unpatched = load_unpatched_fold(unpatched_fold)
    import sglang

    assert sglang.__path__[0].startswith(root), (sglang.__path__, root)
    torch.save(
        {
            "tree": tree_case(patched),
            "commit": commit_case(patched),
            "chain": chain_case(patched, unpatched),
            "pool": pool_case(),
            "pricing": pricing_case(),
            "hook": hook_case(repo),
            "solve": solve_case(),
            "applied": applied_case(),
        },
        out_path,
    )


if __name__ == "__main__":
    assert os.environ.get("TRITON_INTERPRET") == "1", "run under TRITON_INTERPRET=1"
    main(*sys.argv[1:6])
