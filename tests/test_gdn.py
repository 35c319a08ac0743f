"""Tree GDN verification (sglang_spec.gdn) against transformers' own GDN layers as the oracle.

Tiny random Qwen3.5 and Qwen3-Next models (CPU, fp32) are prefilled through HF to get realistic caches.
Per layer, every tree node's output and states must equal transformers' layer run token by token along
the node's root path (a cache copy per node), and the accepted node's commit must equal one chunked
layer call over its whole path. A whole-model check runs the patched model over a tree with an
ancestor mask and compares logits and committed cache states with per-path sequential model runs.
"""

import copy
import random

import pytest
import torch
from transformers import (
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from sglang_spec.gdn import (
    GDNTreeVerifier,
    gdn_tree_commit,
    gdn_tree_forward,
    read_committed_states,
    tree_depth,
    write_committed_states,
)

ATOL = 1e-5
HIDDEN = 64
VOCAB = 128
# 3 linear : 1 full, with the attention layer before the last GDN layers so the tree mask feeds them
LAYER_TYPES = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
LINEAR_LAYERS = [i for i, t in enumerate(LAYER_TYPES) if t == "linear_attention"]
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=HIDDEN,
    intermediate_size=96,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # GQA: q/k heads repeated twice
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    initializer_range=0.1,
)


def _build(family: str):
    torch.manual_seed(0)
    if family == "qwen3_5":
        model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**COMMON))
    else:
        config = Qwen3NextConfig(
            **COMMON,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
        model = Qwen3NextForCausalLM(config)
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def _single_thread():
    """These tiny ops run fastest on one thread; oversubscribed intra-op threads made the suite 5x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def model(request):
    return _build(request.param)


def _prefill(model, ids: torch.Tensor):
    with torch.no_grad():
        return model(ids, use_cache=True).past_key_values


def _random_parents(rng: random.Random, kind: str, n_slots: int) -> list[int]:
    """Parents of a tree padded to n_slots (padding: parent -1 beyond the real nodes)."""
    if kind == "chain":
        parents = [-1] + list(range(min(n_slots, 16) - 1))  # depth 15
    elif kind == "star":
        parents = [-1] + [0] * (rng.randint(9, 12))
    else:  # random tree over most of the budget: half the nodes extend the newest node, depth <= 15
        parents, depth = [-1], [0]
        for i in range(1, rng.randint(n_slots // 2, n_slots)):
            extend = rng.random() < 0.5 and depth[i - 1] < 15
            p = i - 1 if extend else rng.choice([j for j in range(i) if depth[j] < 15])
            parents.append(p)
            depth.append(depth[p] + 1)
    return parents + [-1] * (n_slots - len(parents))


def _paths(parents: list[int]) -> dict[int, list[int]]:
    paths = {0: [0]}
    for i in range(1, len(parents)):
        if parents[i] >= 0:
            paths[i] = paths[parents[i]] + [i]
    return paths


def test_tree_depth_and_validation():
    parents = torch.tensor([[-1, 0, 1, 0, 3, -1], [-1, 0, 0, 0, 2, 4]])
    assert tree_depth(parents).tolist() == [[0, 1, 2, 1, 2, -1], [0, 1, 1, 1, 2, 3]]
    assert tree_depth(torch.tensor([[-1, -1, 0]])).tolist() == [[0, -1, 1]]  # padding, then a child
    order = "^parents must satisfy parents\\[:, 0\\] == -1 and parents\\[b, i\\] < i$"
    for bad in ([[-1, 2, 0]], [[-1, 1]], [[0, 0]]):  # parent after child; own parent; root's parent
        with pytest.raises(ValueError, match=order):
            tree_depth(torch.tensor(bad))
    with pytest.raises(
        ValueError, match="^a padding slot \\(i > 0, parent -1\\) cannot be a parent$"
    ):
        tree_depth(torch.tensor([[-1, -1, 1]]))  # child of a padding slot


def test_padding_rows_and_commit_of_padding(model):
    layer = model.model.layers[LINEAR_LAYERS[0]].linear_attn
    conv, ssm = read_committed_states(
        _prefill(model, torch.randint(0, VOCAB, (1, 5))), LINEAR_LAYERS[0]
    )
    out, states = gdn_tree_forward(
        layer, torch.randn(1, 5, HIDDEN), torch.tensor([[-1, 0, 0, -1, -1]]), conv, ssm
    )
    assert out[0, :3].abs().amin(-1).gt(0).all() and torch.equal(out[0, 3:], torch.zeros(2, HIDDEN))
    with pytest.raises(ValueError, match="^accepted_node points at a padding slot$"):
        gdn_tree_commit(states, torch.tensor([3]))


def test_tree_forward_keeps_every_tensor_on_the_inputs_device(model):
    """Under a ``meta`` default device the CPU layer gives the same CPU outputs, states and commit:
    no tensor is created on the default device (on a GPU server the default is the CPU and the
    inputs are on CUDA)."""
    layer = model.model.layers[LINEAR_LAYERS[0]].linear_attn
    conv, ssm = read_committed_states(
        _prefill(model, torch.randint(0, VOCAB, (2, 5))), LINEAR_LAYERS[0]
    )
    parents = torch.tensor([[-1, 0, 1, 0, -1], [-1, 0, 0, 2, 3]])
    hidden, accepted = torch.randn(2, 5, HIDDEN), torch.tensor([2, 4])
    out, states = gdn_tree_forward(layer, hidden, parents, conv, ssm)
    want = (out, states.conv, states.ssm, states.depth, *gdn_tree_commit(states, accepted))
    with torch.device("meta"):
        out, states = gdn_tree_forward(layer, hidden, parents, conv, ssm)
        got = (out, states.conv, states.ssm, states.depth, *gdn_tree_commit(states, accepted))
    for a, b in zip(want, got, strict=True):
        assert b.device.type == "cpu" and torch.equal(a, b)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_layer_tree_matches_sequential_paths(model, seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    n_slots = [24, 64, 40][seed]
    kinds = [["chain", "star"], ["random", "random"], ["star", "random"]][seed]
    trees = [_random_parents(rng, kind, n_slots) for kind in kinds]
    prompts = [
        torch.randint(0, VOCAB, (1, rng.randint(2, 9))) for _ in trees
    ]  # some shorter than the conv kernel
    caches = [_prefill(model, ids) for ids in prompts]
    parents = torch.tensor(trees)
    hidden = torch.randn(len(trees), n_slots, HIDDEN)
    layers = {li: model.model.layers[li].linear_attn for li in LINEAR_LAYERS}
    results = {}
    for li, layer in layers.items():
        conv0, ssm0 = (torch.cat(x) for x in zip(*(read_committed_states(c, li) for c in caches)))
        results[li] = gdn_tree_forward(layer, hidden, parents, conv0, ssm0)

    accepted = []
    for r, tree in enumerate(trees):
        paths = _paths(tree)
        node_cache = {}  # HF cache after running the node's root path token by token through every GDN layer
        for i in paths:
            cache = node_cache[i] = copy.deepcopy(caches[r] if i == 0 else node_cache[tree[i]])
            for li, layer in layers.items():
                with torch.no_grad():
                    ref = layer(hidden[r : r + 1, i : i + 1], cache_params=cache)
                out, states = results[li]
                torch.testing.assert_close(out[r, i], ref[0, 0], atol=ATOL, rtol=0)
                ref_conv, ref_ssm = read_committed_states(cache, li)
                torch.testing.assert_close(states.conv[r, i], ref_conv[0], atol=ATOL, rtol=0)
                torch.testing.assert_close(states.ssm[r, i], ref_ssm[0], atol=ATOL, rtol=0)
        padding = [i for i in range(n_slots) if i not in paths]
        for out, _ in results.values():
            assert torch.equal(out[r, padding], torch.zeros_like(out[r, padding]))
            assert out[r].abs().max() > 0.1  # non-trivial magnitudes
        # a deep or random accepted node: one chunked HF call over its whole path gives the same outputs and states
        node = rng.choice(
            sorted(paths, key=lambda i: -len(paths[i]))[:3] + [rng.choice(list(paths))]
        )
        accepted.append(node)
        cache = copy.deepcopy(caches[r])
        for li, layer in layers.items():
            with torch.no_grad():
                ref = layer(hidden[r : r + 1, paths[node]], cache_params=cache)
            out, states = results[li]
            torch.testing.assert_close(out[r, paths[node]], ref[0], atol=ATOL, rtol=0)
            want_conv, want_ssm = read_committed_states(cache, li)
            torch.testing.assert_close(states.conv[r, node], want_conv[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(states.ssm[r, node], want_ssm[0], atol=ATOL, rtol=0)
    for _out, states in results.values():  # the batched commit picks each row's own node
        conv, ssm = gdn_tree_commit(states, torch.tensor(accepted))
        assert torch.equal(conv, states.conv[range(len(trees)), accepted])
        assert torch.equal(ssm, states.ssm[range(len(trees)), accepted])


def _tree_mask(parents: list[list[int]], prefix: int) -> torch.Tensor:
    """Additive [bs, 1, N, prefix + N] mask: prefix plus ancestors-or-self (padding sees prefix + self)."""
    bs, n = len(parents), len(parents[0])
    allow = torch.zeros(bs, n, prefix + n, dtype=torch.bool)
    allow[:, :, :prefix] = True
    for r, tree in enumerate(parents):
        for i in range(n):
            allow[r, i, prefix + i] = True
            j = tree[i]
            while j >= 0:
                allow[r, i, prefix + j] = True
                j = tree[j]
    return torch.zeros(allow.shape).masked_fill(~allow, torch.finfo(torch.float32).min)[:, None]


def test_model_tree_verify_and_commit(model):
    rng = random.Random(7)
    torch.manual_seed(7)
    prefix, n_slots = 6, 20
    trees = [_random_parents(rng, "random", n_slots), _random_parents(rng, "star", n_slots)]
    prompt = torch.randint(0, VOCAB, (len(trees), prefix))
    tokens = torch.randint(0, VOCAB, (len(trees), n_slots))
    parents = torch.tensor(trees)
    positions = prefix + tree_depth(parents).clamp(min=0)

    cache = _prefill(model, prompt)
    committed = {li: [t.clone() for t in read_committed_states(cache, li)] for li in LINEAR_LAYERS}
    with GDNTreeVerifier(model, parents) as verifier, torch.no_grad():
        logits = model(
            tokens,
            attention_mask=_tree_mask(trees, prefix),
            position_ids=positions,
            past_key_values=cache,
        ).logits
    assert sorted(verifier.states) == LINEAR_LAYERS
    assert "forward" not in vars(model.model.layers[0].linear_attn)  # patch removed on exit
    for li in LINEAR_LAYERS:  # the verify forward left the committed GDN states untouched
        for got, want in zip(read_committed_states(cache, li), committed[li]):
            assert torch.equal(got, want)

    accepted, want_states = [], []
    for r, tree in enumerate(trees):
        paths = _paths(tree)
        row_cache = _prefill(model, prompt[r : r + 1])
        for leaf in set(paths) - set(tree):
            with torch.no_grad():
                ref = model(
                    tokens[r : r + 1, paths[leaf]], past_key_values=copy.deepcopy(row_cache)
                ).logits
            torch.testing.assert_close(logits[r, paths[leaf]], ref[0], atol=ATOL, rtol=0)
        accepted.append(rng.choice(list(paths)))
        with torch.no_grad():
            model(tokens[r : r + 1, paths[accepted[-1]]], past_key_values=row_cache)
        want_states.append({li: read_committed_states(row_cache, li) for li in LINEAR_LAYERS})

    verifier.commit(cache, torch.tensor(accepted))
    for r, want in enumerate(want_states):
        for li in LINEAR_LAYERS:
            for got, ref in zip(read_committed_states(cache, li), want[li]):
                torch.testing.assert_close(got[r], ref[0], atol=ATOL, rtol=0)


def test_write_committed_states_in_place(model):
    cache = _prefill(model, torch.randint(0, VOCAB, (2, 5)))
    li = LINEAR_LAYERS[0]
    conv, ssm = read_committed_states(cache, li)
    conv_ptr, ssm_ptr = conv.data_ptr(), ssm.data_ptr()
    new_conv, new_ssm = torch.randn_like(conv), torch.randn_like(ssm)
    write_committed_states(cache, li, new_conv, new_ssm)
    conv, ssm = read_committed_states(cache, li)
    assert torch.equal(conv, new_conv) and torch.equal(ssm, new_ssm)
    assert (conv.data_ptr(), ssm.data_ptr()) == (conv_ptr, ssm_ptr)
    with pytest.raises(ValueError):
        read_committed_states(cache, LAYER_TYPES.index("full_attention"))
    # a record_past buffer longer than the kernel: the committed window replaces it, in its dtype
    layer = cache.layers[li]
    layer.conv_states[0] = torch.zeros(2, conv.shape[1], conv.shape[2] + 3, dtype=torch.float64)
    write_committed_states(cache, li, new_conv, new_ssm)
    assert layer.conv_states[0].dtype == torch.float64
    assert torch.equal(layer.conv_states[0], new_conv.double())
