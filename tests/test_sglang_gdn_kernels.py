"""SGLang 0.5.23's own Triton GDN tree-verify kernels (CPU interpreter, or a GPU) vs ``sglang_spec.gdn``.

Device: ``SGLANG_SPEC_KERNEL_DEVICE=cpu`` (default) runs SGLang's kernels on CPU under the Triton
interpreter; ``SGLANG_SPEC_KERNEL_DEVICE=cuda`` compiles them with Triton for the GPU (the case tensors go
to the GPU, the results come back to the CPU, the assertions and tolerances are the same; skipped without
CUDA). The reference side always runs on the CPU. Only the cases of the selected tests go to the kernels:
on a GPU leave out ``ddtree_b256``, whose N = 257 tree conv kernel (Triton unrolls its loop over N) took
~17 min to compile for sm_90 on a 2-core CPU here, against ~1 min for N = 65::

    source .gpu-kit/setup.sh
    SGLANG_SPEC_KERNEL_DEVICE=cuda $SGLANG_KIT_PYTHON -m pytest -q tests/test_sglang_gdn_kernels.py -k "not ddtree_b256"

What runs on the SGLang side (``tests/sglang_kernel_gdn.py``, a subprocess, with ``TRITON_INTERPRET=1`` on
CPU; kernels and, where they run on CPU, their launch wrappers are cut verbatim from the installed SGLang):
the TARGET_VERIFY path of ``layers/attention/linear/gdn_backend.py`` for topk > 1 --
``causal_conv1d_update`` in tree mode (derives ``retrieve_parent_token`` from ``retrieve_next_token`` /
``retrieve_next_sibling``, convolves every node over its ancestor window, stores per-node conv windows),
then ``fused_sigmoid_gating_delta_rule_update(disable_state_update=True, intermediate_states_buffer,
cache_steps=N, retrieve_parent_token)`` on the strided q/k/v split of the conv output -- and the commit
(``fused_commit_track_indices`` + the conv/SSM scatter kernels) for several accepted nodes.

Apples-to-apples input: both sides get the same pre-kernel tensors, computed once with the tiny
transformers Qwen3.5 GDN layer's own weights: ``mixed_qkv = in_proj_qkv(h)``, ``b = in_proj_b(h)``,
``a = in_proj_a(h)`` (what SGLang's Qwen3.5 model hands the backend: ``[q | k | v]`` in checkpoint order),
the conv weight ``[C, K]``, ``A_log`` and ``dt_bias``. Our reference ``gdn_tree_forward`` recomputes the
same projections itself from the hidden states, so it is fed the hidden states plus the same committed
states. Layouts are converted explicitly: SGLang's conv pool holds the last ``K-1`` columns of our
``[C, K]`` window, its SSM pool and intermediate states are ``[Hv, dv, dk]`` (ours ``[Hv, dk, dv]``).

Compared per case, on every real (non-padding) node: the derived parent table (exact), the stored conv
windows (exact: they are copies), the conv outputs (vs ``silu(sum(window * w))`` of the reference
window), the per-node SSM states, the core outputs (the reference's input to ``layer.norm``, captured
with a hook) and the layer outputs (``out_proj(norm(core, z))``); then the committed pool rows for the
deepest node, a random node, the last real node and the root against ``gdn_tree_commit``, plus the
kernels' side effects on the pools. Tolerance: ``rtol=1e-4, atol=1e-5`` in fp32: both sides are fp32 but
sum in different orders (l2-norm, ``k^T S``, ``S q``) and use different exp/log code (approximate PTX on a
GPU); the observed error (CPU interpreter) is <= 5e-7 absolute on O(1) values after 15 recurrent steps,
and a test checks that the wrong-parent (chain) reading of the same slots differs by far more than the
tolerance, so the comparison is not vacuous.

Trees: ``build_ddtree`` (L = 15) on random logits with budgets 16, 64 and 256 (N = 257: one row reaches
depth 15, the other has 16 children at the root), one of them with padding (a single finite token per
depth); plus hand-made rows in one batch: a star with 12 root children, a depth-15 chain and a bushy
full tree (9 + 9 children), the first two padded, with Qwen3.5's real head dims 128 (conv_dim 512: two
of the conv kernel's 256-wide feature blocks; four BV=32 value tiles per head). One case runs the
recurrent kernel with the value tile BV=4 that SGLang picks on H200 for k=v=128 verify (here 4 tiles of
dv=16), one with contiguous q/k/v instead of the strided split. Small heads elsewhere keep the
interpreter fast; one q/k head serves two v heads (GQA) throughout.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from sglang_kernel_gdn import run_sglang_gdn_subprocess
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from sglang_spec.gdn import gdn_tree_commit, gdn_tree_forward, tree_depth, tree_paths
from sglang_spec.gdn.tree_conv import (
    commit_conv_states,
    conv_inputs_buffer,
    save_conv_inputs,
    tree_conv,
)
from sglang_spec.gdn.tree_gdn import _conv_window_index
from sglang_spec.tree import DraftTree, TreeMaskMode, build_ddtree, sglang_tree_abi

DEVICE = os.environ.get("SGLANG_SPEC_KERNEL_DEVICE", "cpu")
assert DEVICE in ("cpu", "cuda"), f"SGLANG_SPEC_KERNEL_DEVICE must be cpu or cuda, not {DEVICE!r}"
RTOL, ATOL = 1e-4, 1e-5
L = 15
HIDDEN, H, HV, KERNEL = 32, 1, 2, 4  # GQA: the q/k head serves both v heads
# head dims: "small" keeps the interpreter fast (conv_dim 64, one conv feature block, one value tile);
# "wide" is Qwen3.5's real 128 (conv_dim 512 = two 256-wide conv feature blocks, four BV=32 value tiles)
HEAD_DIMS = {"small": (16, 16), "wide": (128, 128)}
POOL = 5  # mamba pool slots; requests use a scattered subset


def _layer(dk: int, dv: int) -> Qwen3_5GatedDeltaNet:
    cfg = Qwen3_5TextConfig(
        hidden_size=HIDDEN,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=H,
        linear_num_value_heads=HV,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=KERNEL,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=64,
    )
    torch.manual_seed(0)
    layer = Qwen3_5GatedDeltaNet(cfg, 0).float().eval()
    with torch.no_grad():
        # mild decay (exp(g) ~ 0.5..0.97) so a node's state really depends on its whole ancestry
        layer.A_log.copy_(torch.empty(HV).uniform_(0.05, 0.6).log())
        layer.dt_bias.copy_(torch.randn(HV) * 0.3)
        layer.norm.weight.copy_(1 + 0.1 * torch.randn(dv))
    return layer


def _tree_from_parents(rows: list[list[int]], n: int) -> DraftTree:
    parents = torch.full((len(rows), n), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        parents[b, : len(row)] = torch.tensor(row)
    depths = tree_depth(parents)
    valid = depths >= 0
    return DraftTree(
        tokens=torch.where(valid, torch.arange(n).expand_as(parents), 0),
        parents=parents,
        depths=depths,
        scores=torch.where(valid, -depths.float(), float("-inf")),
        num_nodes=valid.sum(1),
        horizon=L,
    )


def _ddtree(kinds: tuple[str, ...], budget: int, seed: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    V = 16
    rows = []
    for kind in kinds:
        x = torch.randn(L, V, generator=g)
        if kind == "peaked":  # one likely token per depth: deep trees
            x = 0.5 * x
            x[:, 0] += 4.0
        elif kind == "flat":  # bushy, shallow
            x = 0.3 * x
        elif kind == "mixed":
            x[:, 0] += 2.5
        elif kind == "sparse":  # one finite token per depth: a 15-chain, the rest padding
            x = torch.full((L, V), float("-inf"))
            x[:, 3] = 0.0
        rows.append(x)
    return build_ddtree(torch.stack(rows), budget, torch.arange(len(kinds)) + 1)


def _hand_made() -> DraftTree:
    n = 21
    star = [-1] + [0] * 12  # 12 children at the root, 8 padding slots
    chain = [-1] + list(range(15))  # depth 15, 5 padding slots
    bushy = [-1] + [0] * 9 + [2] * 9 + [10, 10]  # 9 root children, 9 children under node 2, full
    return _tree_from_parents([star, chain, bushy], n)


CASES = {
    # name: (tree factory, head dims, cache slots of the requests, extra launch options)
    "ddtree_b16_bv4": (
        lambda: _ddtree(("peaked", "mixed"), 16, 1),
        "small",
        [3, 0],
        {"value_tile": 4},
    ),
    "ddtree_b64_padding": (
        lambda: _ddtree(("mixed", "sparse"), 64, 2),
        "small",
        [1, 4],
        {"contiguous_qkv": True},
    ),
    "ddtree_b256": (lambda: _ddtree(("peaked", "flat"), 256, 3), "small", [2, 3], {}),
    "hand_star_chain_bushy_wide": (_hand_made, "wide", [4, 0, 2], {}),
}


def _path(parents_row: torch.Tensor, node: int) -> list[int]:
    path = [node]
    while path[-1] > 0:
        path.append(int(parents_row[path[-1]]))
    return path[::-1]


def _accepts(tree: DraftTree, gen: torch.Generator) -> list[torch.Tensor]:
    """Accepted nodes [bs] to commit: the deepest node, a random real node, the last real node (usually a
    late sibling), the root only."""
    deepest = tree.depths.argmax(dim=1)
    rand = torch.stack([torch.randint(int(n), (1,), generator=gen)[0] for n in tree.num_nodes])
    return [deepest, rand, tree.num_nodes - 1, torch.zeros_like(deepest)]


def _accept_abi(tree: DraftTree, nodes: torch.Tensor):
    """SGLang's (accept_index [bs, L+1] flat b*N + node along the accepted path, accept_lens [bs])."""
    bs, n = tree.parents.shape
    index = torch.full((bs, L + 1), -1, dtype=torch.long)
    lens = torch.zeros(bs, dtype=torch.int32)
    for b in range(bs):
        path = _path(tree.parents[b], int(nodes[b]))
        index[b, : len(path)] = torch.tensor(path) + b * n
        lens[b] = len(path)
    return index, lens


def _chain_parents(tree: DraftTree) -> torch.Tensor:
    """The slots read as a chain (what a tree verify with a stale or missing parent table computes)."""
    n = tree.parents.shape[1]
    chain = torch.arange(n).expand_as(tree.parents) - 1
    return torch.where(tree.depths >= 0, chain, -1)


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("SGLANG_SPEC_KERNEL_DEVICE=cuda but torch.cuda.is_available() is False")
    layers = {k: _layer(*dims) for k, dims in HEAD_DIMS.items()}
    gen = torch.Generator().manual_seed(1234)
    sg_cases, refs = {}, {}
    for name, (make_tree, dims, slots, opts) in CASES.items():
        layer, (dk, dv) = layers[dims], HEAD_DIMS[dims]
        C = layer.conv_dim
        tree = make_tree()
        bs, n = tree.parents.shape
        abi = sglang_tree_abi(tree, torch.full((bs,), 10), mode=TreeMaskMode.QLEN_ONLY)
        hidden = torch.randn(bs, n, HIDDEN, generator=gen)
        conv_state = torch.randn(bs, C, KERNEL, generator=gen)
        ssm_state = 0.5 * torch.randn(bs, HV, dk, dv, generator=gen)
        # pools: junk everywhere, the committed states at the requests' slots (SGLang layouts)
        conv_pool = 100 + torch.randn(POOL, C, KERNEL - 1, generator=gen)
        ssm_pool = 100 + torch.randn(POOL, HV, dv, dk, generator=gen)
        cache_indices = torch.tensor(slots, dtype=torch.int32)
        conv_pool[cache_indices.long()] = conv_state[..., 1:]
        ssm_pool[cache_indices.long()] = ssm_state.transpose(-1, -2)
        accepted = _accepts(tree, gen)
        with torch.no_grad():
            flat = hidden.reshape(bs * n, HIDDEN)
            sg_cases[name] = dict(
                mixed_qkv=layer.in_proj_qkv(flat),
                a=layer.in_proj_a(flat),
                b=layer.in_proj_b(flat),
                conv_weight=layer.conv1d.weight.view(C, KERNEL),
                A_log=layer.A_log.detach().clone(),
                dt_bias=layer.dt_bias.detach().clone(),
                conv_pool=conv_pool,
                ssm_pool=ssm_pool,
                cache_indices=cache_indices,
                retrieve_next_token=abi.retrieve_next_token,
                retrieve_next_sibling=abi.retrieve_next_sibling,
                num_k_heads=H,
                num_v_heads=HV,
                head_k_dim=dk,
                head_v_dim=dv,
                accepts=[_accept_abi(tree, nodes) for nodes in accepted],
                **opts,
            )

        captured = {}
        hook = layer.norm.register_forward_hook(
            lambda _m, args, _out, captured=captured: captured.__setitem__("core", args[0])
        )
        try:
            out, states = gdn_tree_forward(layer, hidden, tree.parents, conv_state, ssm_state)
            core = captured.pop("core").reshape(bs, n, HV, dv)
            _, chain_states = gdn_tree_forward(
                layer, hidden, _chain_parents(tree), conv_state, ssm_state
            )
            chain_core = captured.pop("core").reshape(bs, n, HV, dv)
        finally:
            hook.remove()
        refs[name] = dict(
            tree=tree,
            out=out,
            states=states,
            core=core,
            chain_core=chain_core,
            chain_ssm=chain_states.ssm,
            accepted=accepted,
            layer=layer,
            hidden=hidden,
            dv=dv,
        )
    # Only the cases of the selected tests go to the kernels: `-k "not ddtree_b256"` spares a GPU run the
    # ~17 min Triton needed (2-core CPU here) to compile the tree conv kernel, unrolled over N, for N = 257.
    selected = {
        item.callspec.params["name"]
        for item in request.session.items
        if item.module is request.module
        and hasattr(item, "callspec")
        and "name" in item.callspec.params
    }
    sg = run_sglang_gdn_subprocess(
        {name: c for name, c in sg_cases.items() if name in selected},
        tmp_path_factory.mktemp("sglang_gdn"),
        DEVICE,
    )
    return {name: (sg_cases[name], sg[name], refs[name]) for name in sg}


def test_tree_shapes_cover_ddtree_sizes():
    """The cases really contain what the kernels must handle: N = 257, depth 15, > 8 children, padding."""
    trees = {name: make() for name, (make, *_) in CASES.items()}
    widths, depths, fanouts, padded = [], [], [], []
    for t in trees.values():
        for b in range(t.batch_size):
            n = int(t.num_nodes[b])
            widths.append(t.width)
            depths.append(int(t.depths[b].max()))
            fanouts.append(
                int(torch.bincount(t.parents[b, 1:n], minlength=n).max()) if n > 1 else 0
            )
            padded.append(n < t.width)
    assert max(widths) == 257
    assert max(depths) == 15 and trees["ddtree_b256"].depths.max() == 15
    assert max(fanouts) >= 12 and int(torch.bincount(trees["ddtree_b256"].parents[1, 1:]).max()) > 8
    assert sum(padded) >= 3
    assert _layer(*HEAD_DIMS["wide"]).conv_dim > 256  # > BLOCK_N of _causal_conv1d_update_kernel


@pytest.mark.parametrize("name", list(CASES))
def test_parent_table_and_conv_windows(results, name):
    """causal_conv1d_update derives exactly our parents and stores each node's ancestor window."""
    c, sg, ref = results[name]
    tree = ref["tree"]
    valid = tree.depths >= 0
    # every slot is written; real nodes get their parent, the root and padding slots 0 (the kernel's default)
    want_parent = torch.where(valid & (tree.parents >= 0), tree.parents, 0)
    assert torch.equal(sg["retrieve_parent_token"], want_parent)
    # SGLang keeps the last K-1 columns of the window (node itself last); pure copies -> bit-exact
    assert not sg["intermediate_conv_window"][valid].isnan().any()
    assert torch.equal(sg["intermediate_conv_window"][valid], ref["states"].conv[valid][..., 1:])


@pytest.mark.parametrize("name", list(CASES))
def test_conv_outputs(results, name):
    c, sg, ref = results[name]
    valid = ref["tree"].depths >= 0
    windows = ref["states"].conv[valid]  # [M, C, K]
    want = F.silu((windows * c["conv_weight"]).sum(-1))
    torch.testing.assert_close(sg["conv_out"][valid], want, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_tree_conv_equals_sglangs_tree_conv_kernel(results, name):
    """sglang_spec.gdn.tree_conv.tree_conv, which patch 0002 runs in place of SGLang's tree-mode
    causal_conv1d_update, gives that kernel's outputs on every real node: the same float32 sums in
    the same order, from the pre-verify pool and the root-first paths; the last bit may differ
    through SiLU's exp (numpy's in the interpreter, torch's here)."""
    c, sg, ref = results[name]
    tree = ref["tree"]
    bs, n = tree.parents.shape
    paths = tree_paths(tree.parents).to(torch.int32)
    got = tree_conv(
        c["mixed_qkv"], c["conv_pool"], c["conv_weight"], None, True, c["cache_indices"], paths
    )
    valid = tree.depths >= 0
    torch.testing.assert_close(
        got.view(bs, n, -1)[valid], sg["conv_out"][valid], rtol=2.5e-7, atol=1.2e-7
    )


@pytest.mark.parametrize("name", list(CASES))
def test_intermediate_ssm_states_and_outputs(results, name):
    c, sg, ref = results[name]
    valid = ref["tree"].depths >= 0
    sg_ssm = sg["intermediate_ssm"].transpose(-1, -2)  # [bs, N, Hv, dv, dk] -> [bs, N, Hv, dk, dv]
    torch.testing.assert_close(sg_ssm[valid], ref["states"].ssm[valid], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(sg["core"][valid], ref["core"][valid], rtol=RTOL, atol=ATOL)
    # the layer output SGLang's core yields through the layer's gated norm and out_proj
    layer, dv, (bs, n) = ref["layer"], ref["dv"], ref["tree"].parents.shape
    with torch.no_grad():
        z = layer.in_proj_z(ref["hidden"]).reshape(-1, dv)
        out = layer.out_proj(layer.norm(sg["core"].reshape(-1, dv), z).reshape(bs, n, -1))
    torch.testing.assert_close(out[valid], ref["out"][valid], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", list(CASES))
def test_comparison_is_sensitive_to_tree_structure(results, name):
    """Reading the same slots as a chain (wrong parents) is far outside the tolerance: not vacuous."""
    c, sg, ref = results[name]
    valid = ref["tree"].depths >= 0
    diff = (sg["core"][valid] - ref["chain_core"][valid]).abs().max()
    ssm_diff = (
        (sg["intermediate_ssm"].transpose(-1, -2)[valid] - ref["chain_ssm"][valid]).abs().max()
    )
    assert diff > 1000 * ATOL and ssm_diff > 1000 * ATOL


@pytest.mark.parametrize("name", list(CASES))
def test_commit_takes_the_accepted_nodes_state(results, name):
    """Commit step = accepted node; the scattered pool rows equal gdn_tree_commit (other slots untouched)."""
    c, sg, ref = results[name]
    slots = c["cache_indices"].long()
    others = torch.ones(POOL, dtype=torch.bool)
    others[slots] = False
    assert len(sg["commits"]) == len(ref["accepted"]) == 4
    for nodes, commit in zip(ref["accepted"], sg["commits"]):
        assert torch.equal(commit["steps"], nodes) and commit["track"] is None
        conv, ssm = gdn_tree_commit(ref["states"], nodes)
        assert torch.equal(commit["conv_pool"][slots], conv[..., 1:])
        torch.testing.assert_close(
            commit["ssm_pool"][slots].transpose(-1, -2), ssm, rtol=RTOL, atol=ATOL
        )
        assert torch.equal(commit["conv_pool"][others], c["conv_pool"][others])
        assert torch.equal(commit["ssm_pool"][others], c["ssm_pool"][others])


@pytest.mark.parametrize("name", list(CASES))
def test_conv_inputs_commit_equals_sglangs_window_scatter(results, name):
    """The GDN tree ReplaySSM's conv half (sglang_spec.gdn.tree_conv, patches 0002/0003): the conv
    inputs saved before SGLang's conv kernel give every node SGLang's own stored conv window, and
    the commit from them gives the pool SGLang's window scatter gave, bit for bit, every slot."""
    c, sg, ref = results[name]
    bs, n = ref["tree"].parents.shape
    slots = c["cache_indices"]
    rows = torch.arange(bs)
    inputs = conv_inputs_buffer(
        (c["mixed_qkv"].shape[1], KERNEL - 1), 1, bs + 1, n, torch.float32, "cpu"
    )
    save_conv_inputs(inputs[0], c["conv_pool"], slots, rows, c["mixed_qkv"])
    index = _conv_window_index(ref["tree"].parents, KERNEL - 1)  # [bs, N, K - 1] into a row
    windows = inputs[0, torch.arange(bs)[:, None, None], index].transpose(-1, -2)
    valid = ref["tree"].depths >= 0
    assert torch.equal(windows[valid], sg["intermediate_conv_window"][valid])
    for (accept_index, accept_lens), commit in zip(c["accepts"], sg["commits"]):
        pool = sg["conv_pool_after_verify"].clone()[None]
        commit_conv_states(pool, inputs, slots, rows, accept_index, accept_lens, n)
        assert torch.equal(pool[0], commit["conv_pool"])


@pytest.mark.parametrize("name", list(CASES))
def test_verify_side_effects_on_the_pools(results, name):
    """disable_state_update leaves the SSM pool alone; the conv kernel does NOT leave the conv pool alone:
    it shifts the last K-1 *slot* inputs (a chain view, meaningless for a tree) into the request's row,
    so the commit scatter after every tree verify is mandatory."""
    c, sg, ref = results[name]
    bs, n = ref["tree"].parents.shape
    assert torch.equal(sg["ssm_pool_after_verify"], c["ssm_pool"])
    slots = c["cache_indices"].long()
    last_slots = c["mixed_qkv"].view(bs, n, -1)[:, n - (KERNEL - 1) :].transpose(1, 2)
    assert torch.equal(sg["conv_pool_after_verify"][slots], last_slots)
    others = torch.ones(POOL, dtype=torch.bool)
    others[slots] = False
    assert torch.equal(sg["conv_pool_after_verify"][others], c["conv_pool"][others])
