"""DDTree construction (`draft_topk`, `merge_sharded_topk`, `build_ddtree*`) against an
oracle that enumerates every prefix (tests/tree_oracles.py).

-inf semantics (decision, see the -inf tests): a token whose draft logit is -inf has draft
probability 0, so every prefix through it has score -inf.  Such prefixes are impossible and
must never become real nodes; if fewer than B finite prefixes exist, the remaining slots are
padding (parents = depths = -1, scores = -inf) and num_nodes counts only finite ones.  A real
node therefore always has a finite score.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
import tree_oracles as O
from hypothesis import given
from hypothesis import strategies as st
from tree_testing import SETTINGS

from sglang_spec.tree import (
    DraftTree,
    build_chain,
    build_ddtree,
    build_ddtree_from_topk,
    draft_topk,
    exact_topk,
    merge_sharded_topk,
    walk_greedy,
)
from sglang_spec.tree.build import nested_in

ATOL = 2e-4


def make_logits(seed: int, bs: int, L: int, V: int, style: str = "normal") -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if style == "normal":
        x = torch.randn(bs, L, V, generator=g) * 2.0
    elif style == "ints":  # many exact ties
        x = torch.randint(-2, 2, (bs, L, V), generator=g).float()
    elif style == "equal":
        x = torch.full((bs, L, V), 0.5)
    elif style == "neginf":
        x = torch.randn(bs, L, V, generator=g) * 2.0
        kill = torch.rand(bs, L, V, generator=g) < 0.4
        # keep at least one finite token per depth (an all -inf row is not a distribution)
        keep = torch.randint(V, (bs, L), generator=g)
        kill.scatter_(-1, keep[..., None], False)
        x = x.masked_fill(kill, float("-inf"))
    else:
        raise ValueError(style)
    return x


def check_tree(
    tree: DraftTree,
    logits: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    k: int | None = None,
    topk_ids: torch.Tensor | None = None,
    include_chain: bool = True,
) -> None:
    """Every contract property of a DDTree built from `logits` ([bs, L, V])."""
    bs, L, V = logits.shape
    N = 1 + budget
    for name in ("tokens", "parents", "depths", "scores"):
        t = getattr(tree, name)
        assert tuple(t.shape) == (bs, N), (name, tuple(t.shape))
    assert tree.tokens.dtype == torch.int64 and tree.parents.dtype == torch.int64
    assert tree.depths.dtype == torch.int64 and tree.scores.dtype == torch.float32
    assert tuple(tree.num_nodes.shape) == (bs,) and tree.num_nodes.dtype == torch.int64
    assert tree.horizon == L

    kk = min(budget, V) if k is None else k
    for b in range(bs):
        lq = O.logq64(logits[b])
        n = int(tree.num_nodes[b])
        # restricted to the given candidate ids per depth, or to ranks < kk
        allowed = None if topk_ids is None else [topk_ids[b, d].tolist() for d in range(L)]
        chain, best = O.oracle_tree(lq, budget, kk, allowed, include_chain)
        # number of real nodes
        want = 1 + len(chain) + best.numel()
        assert n == want, f"row {b}: num_nodes={n}, oracle says {want}"
        # root
        assert int(tree.tokens[b, 0]) == int(root_tokens[b])
        assert int(tree.parents[b, 0]) == -1 and int(tree.depths[b, 0]) == 0
        assert float(tree.scores[b, 0]) == 0.0
        # padding
        for i in range(n, N):
            assert int(tree.parents[b, i]) == -1, f"padding parent row {b} slot {i}"
            assert int(tree.depths[b, i]) == -1, f"padding depth row {b} slot {i}"
            assert float(tree.scores[b, i]) == float("-inf"), f"padding score row {b} slot {i}"
            assert int(tree.tokens[b, i]) == int(root_tokens[b]), f"padding token row {b} slot {i}"
        # real nodes
        prefixes = []
        for i in range(1, n):
            p = int(tree.parents[b, i])
            assert 0 <= p < i, f"row {b} node {i}: parent {p} not in [0, {i})"
            assert int(tree.depths[b, i]) == int(tree.depths[b, p]) + 1
            d = int(tree.depths[b, i])
            assert 1 <= d <= L
            path = O.path_of(tree.parents[b], i)
            toks = tuple(int(tree.tokens[b, j]) for j in path)
            assert all(0 <= t < V for t in toks)
            assert toks not in prefixes, (
                f"row {b}: prefix {toks} appears twice (siblings share a token)"
            )
            prefixes.append(toks)
            s = sum(lq[dd, t].item() for dd, t in enumerate(toks))
            assert math.isfinite(s), (
                f"row {b} node {i}: impossible prefix {toks} (score -inf) selected"
            )
            assert abs(float(tree.scores[b, i]) - s) <= ATOL * max(1.0, abs(s)), (
                f"row {b} node {i}: score {float(tree.scores[b, i])} != recomputed {s} for {toks}"
            )
            if topk_ids is None:
                # Lemma 1: only ranks < K can appear.  Ranks under (logq desc, id asc).
                for dd, t in enumerate(toks):
                    strictly_better = int((lq[dd] > lq[dd, t] + 1e-9).sum())
                    assert strictly_better < kk, (
                        f"row {b}: token {t} at depth {dd + 1} outside top-{kk}"
                    )
            else:
                for dd, t in enumerate(toks):
                    assert t in set(topk_ids[b, dd].tolist())
        # the chain, in depth order, at slots 1..L
        want_chain = [chain[:d] for d in range(1, len(chain) + 1)]
        assert prefixes[: len(chain)] == want_chain, (
            f"row {b}: slots 1..{len(chain)} hold {prefixes[: len(chain)]}, chain {chain}"
        )
        # the other nodes, best first: exactly the oracle's best scores
        rest = tree.scores[b, 1 + len(chain) : n].double()
        got = torch.sort(rest, descending=True).values
        assert torch.equal(rest, got), f"row {b}: non-chain nodes not best-first: {rest.tolist()}"
        assert torch.allclose(got, best, atol=ATOL, rtol=1e-5), (
            f"row {b}: scores {got.tolist()} vs oracle {best.tolist()}"
        )


def assert_same_tree(a: DraftTree, b: DraftTree, exact_scores: bool = True) -> None:
    for name in ("tokens", "parents", "depths", "num_nodes"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    if exact_scores:
        assert torch.equal(a.scores, b.scores)
    else:
        assert torch.allclose(a.scores, b.scores, atol=1e-5)
    assert a.horizon == b.horizon


def oracle_topk(x: torch.Tensor, k: int):
    """Reference top-k per depth: (float64 log-softmax values, ids) ordered by (logq desc, id asc)."""
    bs, L, V = x.shape
    vals = torch.empty(bs, L, k, dtype=torch.float64)
    ids = torch.empty(bs, L, k, dtype=torch.long)
    for b in range(bs):
        lq = O.logq64(x[b])
        for d in range(L):
            want = sorted(range(V), key=lambda t: (-lq[d, t].item(), t))[:k]
            ids[b, d] = torch.tensor(want)
            vals[b, d] = lq[d, want]
    return vals, ids


def assert_topk_equal(
    logq: torch.Tensor, ids: torch.Tensor, ref_vals: torch.Tensor, ref_ids: torch.Tensor
) -> None:
    assert logq.dtype == torch.float32 and ids.dtype == torch.int64
    assert tuple(logq.shape) == tuple(ref_vals.shape) and tuple(ids.shape) == tuple(ref_ids.shape)
    assert torch.equal(ids, ref_ids), (ids, ref_ids)
    fin = torch.isfinite(ref_vals)
    assert torch.equal(torch.isfinite(logq), fin)
    assert torch.allclose(logq[fin].double(), ref_vals[fin], atol=1e-5)


# ----------------------------------------------------------------------------------------
# draft_topk
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", ["normal", "ints", "equal", "neginf"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_draft_topk_matches_full_sort(style, k):
    bs, L, V = 3, 4, 6
    x = make_logits(11 + k, bs, L, V, style)
    logq, ids = draft_topk(x, k)
    assert_topk_equal(logq, ids, *oracle_topk(x, k))


def test_draft_topk_ties_sorted_by_id():
    # vocabulary 8 with the same logit everywhere except one winner: ties among ids 0..7 \ {5}
    x = torch.zeros(1, 2, 8)
    x[0, 0, 5] = 1.0
    x[0, 1] = torch.tensor([3.0, 1.0, 3.0, 1.0, 3.0, 1.0, 3.0, 1.0])
    _, ids = draft_topk(x, 4)
    assert ids[0, 0].tolist() == [5, 0, 1, 2]
    assert ids[0, 1].tolist() == [0, 2, 4, 6]
    # a real vocabulary size, where torch's unstable CPU sort does reorder ties: the CPU keeps
    # the lowest ids among the tokens tied at the k-th value
    x = torch.randint(0, 3, (2, 3, 4096), generator=torch.Generator().manual_seed(3)).float()
    _, ids = draft_topk(x, 64)
    for b in range(2):
        for d in range(3):
            assert ids[b, d].tolist() == (x[b, d] == 2).nonzero().flatten()[:64].tolist()


# ----------------------------------------------------------------------------------------
# merge_sharded_topk
# ----------------------------------------------------------------------------------------


def shard_inputs(x: torch.Tensor, tp: int, k: int, shuffle_gen: torch.Generator | None = None):
    """Emulate vocab-parallel TP: shard s owns a contiguous id range; it reports its local top-k
    raw logits (ties -> lower id), their GLOBAL ids and its local logsumexp."""
    bs, L, V = x.shape
    assert V % tp == 0
    w = V // tp
    vals, ids, lse = [], [], []
    for s in range(tp):
        part = x[..., s * w : (s + 1) * w]
        v = torch.empty(bs, L, k)
        i = torch.empty(bs, L, k, dtype=torch.long)
        for b in range(bs):
            for d in range(L):
                order = sorted(range(w), key=lambda t: (-part[b, d, t].item(), t))[:k]
                if shuffle_gen is not None:
                    perm = torch.randperm(k, generator=shuffle_gen).tolist()
                    order = [order[j] for j in perm]
                v[b, d] = part[b, d, order]
                i[b, d] = torch.tensor(order) + s * w
        vals.append(v)
        ids.append(i)
        lse.append(torch.logsumexp(part, dim=-1))
    return torch.stack(vals), torch.stack(ids), torch.stack(lse)


@pytest.mark.parametrize("tp", [2, 3, 4])
@pytest.mark.parametrize("style", ["normal", "ints", "neginf"])
def test_merge_sharded_topk_equals_unsharded(tp, style):
    bs, L, V, k = 2, 3, 12, 3
    x = make_logits(100 + tp, bs, L, V, style)
    vals, ids, lse = shard_inputs(x, tp, k)
    m_logq, m_ids = merge_sharded_topk(vals, ids, lse, k)
    # the merged result is the unsharded top-k (compared with the reference, not with draft_topk,
    # so that a draft_topk bug is not reported as a merge bug)
    assert_topk_equal(m_logq, m_ids, *oracle_topk(x, k))


def test_merge_sharded_topk_unsorted_shard_lists():
    # local top-k lists are sets; their internal order must not matter
    bs, L, V, k = 2, 2, 12, 3
    x = make_logits(7, bs, L, V, "normal")
    g = torch.Generator().manual_seed(3)
    vals, ids, lse = shard_inputs(x, 3, k, shuffle_gen=g)
    m_logq, m_ids = merge_sharded_topk(vals, ids, lse, k)
    assert_topk_equal(m_logq, m_ids, *oracle_topk(x, k))


def test_merge_sharded_topk_k_up_to_tp_times_k_local():
    # k ranges over [1, tp * k_local]: at the top every gathered entry is returned, in order
    bs, L, V, kl = 2, 2, 6, 3
    x = make_logits(31, bs, L, V, "normal")
    vals, ids, lse = shard_inputs(x, 2, kl)
    m_logq, m_ids = merge_sharded_topk(vals, ids, lse, 2 * kl)
    assert_topk_equal(m_logq, m_ids, *oracle_topk(x, 2 * kl))
    for k in (0, 2 * kl + 1):
        with pytest.raises(ValueError, match=rf"^k must be in \[1, tp\*k_local=6\]; got {k}$"):
            merge_sharded_topk(vals, ids, lse, k)


def test_merge_sharded_topk_refuses_each_bad_shape_alone():
    vals, ids, lse = shard_inputs(
        make_logits(32, 2, 2, 6, "normal"), 2, 3
    )  # [2, 2, 2, 3], [2, 2, 2]
    cases = [
        (vals, ids[..., :2], lse, "(2, 2, 2, 3), (2, 2, 2, 2), (2, 2, 2)"),  # ids differ
        (vals[0], ids[0], torch.zeros(2, 2, 3), "(2, 2, 3), (2, 2, 3), (2, 2, 3)"),  # not 4-d
        (vals, ids, lse[:, :, :1], "(2, 2, 2, 3), (2, 2, 2, 3), (2, 2, 1)"),  # lse differs
    ]
    for v, i, s, shapes in cases:
        with pytest.raises(ValueError) as e:
            merge_sharded_topk(v, i, s, 2)
        assert str(e.value) == (
            f"expected vals/ids [tp, bs, L, k] and lse [tp, bs, L]; got {shapes}"
        )


def test_merge_sharded_then_build_equals_build():
    bs, L, V, B = 2, 3, 8, 6
    x = make_logits(21, bs, L, V)
    k = min(B, V // 2)  # shard-local k cannot exceed the shard width
    vals, ids, lse = shard_inputs(x, 2, k)
    m_logq, m_ids = merge_sharded_topk(vals, ids, lse, k)
    roots = torch.tensor([1, 4])
    t_merged = build_ddtree_from_topk(m_logq, m_ids, B, roots)
    check_tree(t_merged, x, B, roots, topk_ids=m_ids)
    f_logq, f_ids = draft_topk(x, k)
    # merged log-probs may differ from log_softmax in the last bits (vals - lse), so scores
    # are compared with a tolerance; normal logits have no near-ties that could reorder nodes
    assert_same_tree(t_merged, build_ddtree_from_topk(f_logq, f_ids, B, roots), exact_scores=False)


# ----------------------------------------------------------------------------------------
# build_ddtree: fixed cases
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bs,L,V,B,style",
    [
        (1, 1, 4, 1, "normal"),  # B = 1
        (1, 1, 4, 3, "normal"),  # L = 1
        (2, 3, 3, 8, "normal"),  # V < B
        (3, 4, 2, 9, "normal"),  # V = 2, deep
        (8, 3, 5, 7, "normal"),  # bs = 8, different logits per request
        (4, 3, 4, 10, "ints"),  # exact ties
        (2, 3, 4, 6, "equal"),  # all equal
        (4, 3, 5, 9, "neginf"),  # impossible tokens
        (2, 4, 5, 20, "normal"),
    ],
)
def test_build_matches_prefix_oracle(bs, L, V, B, style):
    x = make_logits(1000 + bs * 31 + L * 7 + V * 3 + B, bs, L, V, style)
    roots = torch.arange(bs) % V
    tree = build_ddtree(x, B, roots)
    check_tree(tree, x, B, roots)


def test_build_padding_when_too_few_prefixes():
    # V = 2, L = 1: only 2 prefixes exist, budget 5 -> 2 real draft nodes + root, 3 padding slots
    x = torch.tensor([[[0.3, -0.2]], [[-1.0, 2.0]]])
    roots = torch.tensor([7, 9])
    tree = build_ddtree(x, 5, roots)
    check_tree(tree, x, 5, roots)
    assert tree.num_nodes.tolist() == [3, 3]
    assert tree.parents[:, 3:].eq(-1).all() and tree.depths[:, 3:].eq(-1).all()
    assert torch.isneginf(tree.scores[:, 3:]).all()
    assert tree.tokens[0, 3:].eq(7).all() and tree.tokens[1, 3:].eq(9).all()
    assert sorted(tree.tokens[0, 1:3].tolist()) == [0, 1]
    # V = 2, L = 2: 2 + 4 = 6 prefixes, budget 8 -> 6 real
    x2 = torch.randn(1, 2, 2, generator=torch.Generator().manual_seed(0))
    t2 = build_ddtree(x2, 8, torch.tensor([0]))
    check_tree(t2, x2, 8, torch.tensor([0]))
    assert t2.num_nodes.tolist() == [7]


def test_build_full_tree_exact_small_case():
    # L=2, V=3, B=4 with hand-checkable log-probs
    p1 = torch.tensor([0.6, 0.3, 0.1])
    p2 = torch.tensor([0.5, 0.4, 0.1])
    x = torch.stack([p1.log(), p2.log()])[None]
    tree = build_ddtree(x, 4, torch.tensor([2]))
    # prefixes by prob: (0)=.6, (0,0)=.30, (1)=.3, (0,1)=.24, (1,0)=.15 ...
    # the top-4 set is {(0), (0,0), (1), (0,1)}; (0,0) and (1) tie at 0.30 exactly in reals,
    # so compare the set of prefixes only
    n = int(tree.num_nodes[0])
    assert n == 5
    got = {
        tuple(int(tree.tokens[0, j]) for j in O.path_of(tree.parents[0], i)) for i in range(1, n)
    }
    assert got == {(0,), (0, 0), (1,), (0, 1)}


def test_build_equal_logits_breadth_first_and_low_ids():
    # all logits equal: each depth-d prefix has score -d log V, so with B = V + 2 the plain tree is
    # the whole first level plus 2 second-level nodes, all tokens in the top-K = min(B,V) ranks.
    bs, L, V, B = 2, 3, 4, 6
    x = torch.zeros(bs, L, V)
    tree = build_ddtree(x, B, torch.tensor([0, 1]), include_chain=False)
    check_tree(tree, x, B, torch.tensor([0, 1]), include_chain=False)
    # with the chain: (0), (0, 0), (0, 0, 0) -- the lowest id wins every tie -- then the first level
    chained = build_ddtree(x, B, torch.tensor([0, 1]))
    check_tree(chained, x, B, torch.tensor([0, 1]))
    for b in range(bs):
        d = tree.depths[b, 1:].tolist()
        assert sorted(d) == [1, 1, 1, 1, 2, 2]
        assert chained.depths[b, 1:].tolist() == [1, 2, 3, 1, 1, 1]
        assert chained.tokens[b, 1:].tolist() == [0, 0, 0, 1, 2, 3]
    # V > B with exact ties: K = B = 2, the tie among 5 equal tokens goes to the lowest ids
    x2 = torch.zeros(1, 2, 5)
    t2 = build_ddtree(x2, 2, torch.tensor([3]), include_chain=False)
    check_tree(t2, x2, 2, torch.tensor([3]), include_chain=False)
    assert sorted(t2.tokens[0, 1:].tolist()) == [0, 1]


def test_build_neginf_tokens_never_selected():
    # depth 1: only tokens 1 and 3 possible; depth 2: only token 0 possible -> 2 + 2 = 4 finite prefixes
    x = torch.full((1, 2, 4), float("-inf"))
    x[0, 0, 1] = 0.0
    x[0, 0, 3] = 1.0
    x[0, 1, 0] = 5.0
    roots = torch.tensor([2])
    tree = build_ddtree(x, 7, roots)
    check_tree(tree, x, 7, roots)
    assert int(tree.num_nodes[0]) == 5
    assert torch.isfinite(tree.scores[0, :5]).all()
    real = {
        tuple(int(tree.tokens[0, j]) for j in O.path_of(tree.parents[0], i)) for i in range(1, 5)
    }
    assert real == {(3,), (1,), (3, 0), (1, 0)}
    # a budget smaller than the finite count: still no -inf node
    t2 = build_ddtree(x, 3, roots)
    check_tree(t2, x, 3, roots)
    assert int(t2.num_nodes[0]) == 4 and torch.isfinite(t2.scores[0]).all()


def test_build_nan_logits_raise():
    """Both entry points name the requests whose logits (or log-probs) hold NaN."""
    x = torch.randn(3, 3, 4)
    x[1, 2, 0] = x[2, 0, 3] = float("nan")
    roots = torch.tensor([0, 0, 0])
    with pytest.raises(ValueError) as bad:
        build_ddtree(x, 4, roots)
    assert str(bad.value) == (
        "draft_logits contain NaN for request(s) [1, 2]; the drafter produced invalid logits"
    )
    logq, ids = draft_topk(torch.randn(3, 3, 4), 4)
    logq[2, 1, 0] = float("nan")
    with pytest.raises(ValueError) as bad:
        build_ddtree_from_topk(logq, ids, 4, roots)
    assert str(bad.value) == (
        "draft log-probs contain NaN for request(s) [2]; the drafter produced invalid logits"
    )


def test_build_keeps_every_tensor_on_the_logits_device_not_the_default():
    """Under a ``meta`` default device CPU logits give the same CPU trees (plain, chain-inclusive
    and the chain): no tensor is created on the default device (on a GPU server the default is the
    CPU and the logits are on CUDA)."""
    x, roots = make_logits(9, 3, 4, 6), torch.tensor([1, 2, 3])

    def build():
        return [
            build_ddtree(x, 9, roots, include_chain=False),
            build_ddtree(x, 9, roots, temperature=0.5),
            build_chain(x, roots),
        ]

    want = build()
    with torch.device("meta"):
        got = build()
    for w, g in zip(want, got, strict=True):
        for name in ("tokens", "parents", "depths", "scores", "num_nodes"):
            assert getattr(g, name).device.type == "cpu", name
        assert_same_tree(w, g)


@pytest.mark.parametrize("budget", [0, -1, True, 2.5, "3"])
def test_build_bad_budget_raises(budget):
    x = torch.randn(1, 2, 4)
    message = (
        f"budget must be an integer >= 1 (number of draft nodes, root excluded); got {budget!r}"
    )
    with pytest.raises(ValueError) as bad:
        build_ddtree(x, budget, torch.tensor([0]))
    assert str(bad.value) == message
    logq, ids = draft_topk(x, 2)
    with pytest.raises(ValueError) as bad:
        build_ddtree_from_topk(logq, ids, budget, torch.tensor([0]))
    assert str(bad.value) == message


def test_build_refuses_root_tokens_of_another_batch():
    logq, ids = draft_topk(torch.randn(2, 2, 4), 2)
    with pytest.raises(ValueError) as bad:
        build_ddtree_from_topk(logq, ids, 3, torch.tensor([0, 1, 2]))
    assert str(bad.value) == "root_tokens must be [bs=2]; got shape (3,)"


def assert_batch_is_per_row(tree: DraftTree, x, budget, roots, **kw) -> None:
    """Every request's tree depends on its own logits only: the batched build equals per-row builds."""
    for b in range(x.shape[0]):
        tb = build_ddtree(x[b : b + 1].clone(), budget, roots[b : b + 1].clone(), **kw)
        for name in ("tokens", "parents", "depths", "num_nodes"):
            assert torch.equal(getattr(tb, name)[0], getattr(tree, name)[b]), (b, name)
        assert torch.allclose(tb.scores[0], tree.scores[b], atol=1e-6), b


@pytest.mark.parametrize("include_chain", [True, False])
def test_build_deterministic_and_batch_independent(include_chain):
    bs, L, V, B = 6, 3, 5, 9
    for style in ("normal", "ints", "equal"):
        x = make_logits(77, bs, L, V, style)
        roots = torch.tensor([0, 1, 2, 3, 4, 0])
        t1 = build_ddtree(x, B, roots, include_chain=include_chain)
        t2 = build_ddtree(x.clone(), B, roots.clone(), include_chain=include_chain)
        assert_same_tree(t1, t2)
        assert_batch_is_per_row(t1, x, B, roots, include_chain=include_chain)


def test_build_from_topk_equals_build():
    bs, L, V, B = 3, 3, 6, 4
    x = make_logits(5, bs, L, V)
    roots = torch.tensor([5, 0, 3])
    logq, ids = draft_topk(x, min(B, V))
    assert_same_tree(build_ddtree_from_topk(logq, ids, B, roots), build_ddtree(x, B, roots))


def test_build_from_topk_with_small_k():
    # k = 2 candidates per depth, budget 5: the tree is the 5 best prefixes over those ids only
    bs, L, V, B = 2, 3, 6, 5
    x = make_logits(9, bs, L, V)
    roots = torch.tensor([1, 2])
    logq, ids = draft_topk(x, 2)
    tree = build_ddtree_from_topk(logq, ids, B, roots)
    check_tree(tree, x, B, roots, topk_ids=ids)
    # k = 1 is a chain of length min(B, L)
    logq1, ids1 = draft_topk(x, 1)
    chain = build_ddtree_from_topk(logq1, ids1, B, roots)
    check_tree(chain, x, B, roots, topk_ids=ids1)
    assert chain.num_nodes.tolist() == [1 + L, 1 + L]
    for b in range(bs):
        assert chain.depths[b, 1 : 1 + L].tolist() == list(range(1, L + 1))
        assert chain.tokens[b, 1 : 1 + L].tolist() == ids1[b, :, 0].tolist()


@pytest.mark.parametrize("extra", [0, 1, 4])
def test_exact_topk_is_enough_and_no_more(extra):
    """The chain-inclusive tree of budget L + extra needs extra + 1 ranks per depth, and exactly
    that many: here every node outside the chain is a depth-1 sibling of the chain's first node
    (the flat deeper depths price their children below the ranks 1..extra of depth 1)."""
    L, V = 3, 8
    B = L + extra
    x = torch.zeros(1, L, V)
    x[0, 0, : extra + 1] = torch.tensor([10.0 - 0.1 * r for r in range(extra + 1)])
    roots = torch.tensor([7])
    k = exact_topk(B, L)
    assert k == extra + 1
    full = build_ddtree_from_topk(*draft_topk(x, B), B, roots)
    assert_same_tree(build_ddtree_from_topk(*draft_topk(x, k), B, roots), full)
    assert_same_tree(build_ddtree(x, B, roots), full)
    assert sorted(full.tokens[0, 1 + L :].tolist()) == list(range(1, extra + 1))
    if k > 1:
        short = build_ddtree_from_topk(*draft_topk(x, k - 1), B, roots)
        assert short.tokens[0].tolist() != full.tokens[0].tolist()


def test_exact_topk_without_the_chain_is_the_budget():
    assert exact_topk(10, 15) == 10  # budget below the horizon: plain best-first
    assert exact_topk(15, 15) == 1  # the chain alone
    assert exact_topk(63, 15) == 49
    assert exact_topk(63, 15, include_chain=False) == 63


# ----------------------------------------------------------------------------------------
# build_ddtree: property-based
# ----------------------------------------------------------------------------------------


@SETTINGS
@given(
    bs=st.integers(1, 4),
    L=st.integers(1, 5),
    V=st.integers(1, 6),
    budgets=st.lists(st.integers(1, 24), min_size=2, max_size=2, unique=True),
    seed=st.integers(0, 2**31 - 1),
    style=st.sampled_from(["normal", "ints", "equal", "neginf"]),
)
def test_nested_trees_are_prefixes_and_the_others_are_not_said_to_be(
    bs, L, V, budgets, seed, style
):
    """nested_in(b, B, L) (how a step at budget B measures what budget b would have accepted,
    plugin.budget): the b-tree built alone is exactly the first b + 1 slots of the B-tree, padding included, with num_nodes capped
    at b + 1. When it says no, the two straddle the horizon (one forces the chain, one does not)."""
    b, B = sorted(budgets)
    x = make_logits(seed, bs, L, V, style)
    roots = torch.randint(V, (bs,), generator=torch.Generator().manual_seed(seed + 1))
    small, big = build_ddtree(x, b, roots), build_ddtree(x, B, roots)
    assert not nested_in(B, b, L)  # never a larger tree in a smaller one
    if not nested_in(b, B, L):
        assert b < L <= B
        return
    for f in ("tokens", "parents", "depths", "scores"):
        assert torch.equal(getattr(small, f), getattr(big, f)[:, : b + 1]), f
    assert torch.equal(small.num_nodes, big.num_nodes.clamp(max=b + 1))


@SETTINGS
@given(
    bs=st.integers(1, 4),
    L=st.integers(1, 6),
    V=st.integers(1, 6),
    B=st.integers(1, 12),
    extra=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
    style=st.sampled_from(["normal", "ints", "equal", "neginf"]),
    include_chain=st.booleans(),
)
def test_only_the_depths_the_budget_reaches_give_the_same_tree(
    bs, L, V, B, extra, seed, style, include_chain
):
    """A tree of B nodes is at most min(B, L) deep, so the top-K of depths 1..D for any D from
    min(B, L) to L (head.draft_tree puts only min(B, L) through the LM head) gives the tree of all
    L depths, horizon L included, with or without the chain."""
    x = make_logits(seed, bs, L, V, style)
    roots = torch.randint(V, (bs,), generator=torch.Generator().manual_seed(seed + 1))
    logq, ids = draft_topk(x, min(exact_topk(B, L, include_chain), V))
    full = build_ddtree_from_topk(logq, ids, B, roots, include_chain)
    D = min(min(B, L) + extra, L)
    few = build_ddtree_from_topk(logq[:, :D], ids[:, :D], B, roots, include_chain, horizon=L)
    assert_same_tree(few, full)
    assert few.horizon == full.horizon == L


@pytest.mark.parametrize(
    "D, B, L, bad",
    [
        (2, 3, 4, "logq has 2 depths; a tree of budget=3 under horizon=4 needs between min"),
        (3, 5, 4, "needs between min\\(budget, horizon\\)=4 and 4"),
        (5, 9, 4, "logq has 5 depths"),
    ],
)
def test_too_few_or_too_many_depths_are_refused(D, B, L, bad):
    logq, ids = draft_topk(make_logits(0, 1, D, 5), 3)
    with pytest.raises(ValueError, match=bad):
        build_ddtree_from_topk(logq, ids, B, torch.tensor([0]), horizon=L)


@SETTINGS
@given(
    bs=st.integers(1, 8),
    L=st.integers(1, 4),
    V=st.integers(1, 6),
    B=st.integers(1, 24),
    seed=st.integers(0, 2**31 - 1),
    style=st.sampled_from(["normal", "normal", "ints", "equal", "neginf"]),
    include_chain=st.booleans(),
)
def test_build_property(bs, L, V, B, seed, style, include_chain):
    x = make_logits(seed, bs, L, V, style)
    roots = torch.randint(V, (bs,), generator=torch.Generator().manual_seed(seed + 1))
    tree = build_ddtree(x, B, roots, include_chain=include_chain)
    check_tree(tree, x, B, roots, include_chain=include_chain)
    again = build_ddtree(x.clone(), B, roots.clone(), include_chain=include_chain)
    assert_same_tree(tree, again)
    assert_batch_is_per_row(tree, x, B, roots, include_chain=include_chain)


@SETTINGS
@given(
    bs=st.integers(1, 3),
    L=st.integers(1, 3),
    tp=st.sampled_from([2, 3, 4]),
    w=st.integers(1, 4),
    k=st.integers(1, 4),
    seed=st.integers(0, 2**31 - 1),
    style=st.sampled_from(["normal", "ints", "neginf"]),
)
def test_merge_property(bs, L, tp, w, k, seed, style):
    k = min(k, w)
    V = tp * w
    x = make_logits(seed, bs, L, V, style)
    vals, ids, lse = shard_inputs(x, tp, k)
    m_logq, m_ids = merge_sharded_topk(vals, ids, lse, k)
    assert_topk_equal(m_logq, m_ids, *oracle_topk(x, k))


# ---------------------------------------------------------------------------------------------
# tree temperature
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tau", [0.5, 2.0])
def test_tree_temperature_scores_the_scaled_logits(tau):
    x = make_logits(4242, 3, 4, 6, "normal")
    roots = torch.arange(3)
    tree = build_ddtree(x, 10, roots, temperature=tau)
    check_tree(tree, x / tau, 10, roots)  # the oracle on logits / tau
    logq, ids = draft_topk(x, 6, temperature=tau)
    ref_logq, ref_ids = draft_topk(x / tau, 6)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(logq, ref_logq)


def test_tree_temperature_moves_budget_to_depth():
    # q = (0.6, 0.4) at both depths, budget 2: at T = 1 the sibling (0.4) beats the grandchild
    # (0.36); at T = 0.5 the sharpened q = (0.69, 0.31) puts the grandchild (0.48) first.
    p = torch.tensor([0.6, 0.4]).log()
    x = torch.stack([p, p])[None]
    roots = torch.tensor([5])
    # (plain trees: with the chain, budget 2 = L would be the chain at any temperature)
    flat = build_ddtree(x, 2, roots, include_chain=False)
    deep = build_ddtree(x, 2, roots, temperature=0.5, include_chain=False)
    assert flat.depths[0].tolist() == [0, 1, 1] and flat.tokens[0].tolist() == [5, 0, 1]
    assert deep.depths[0].tolist() == [0, 1, 2] and deep.tokens[0].tolist() == [5, 0, 0]


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_tree_temperature_raises(tau):
    x = torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="tree temperature must be a finite number > 0"):
        build_ddtree(x, 4, torch.tensor([0]), temperature=tau)


# ---------------------------------------------------------------------------------------------
# chain-inclusive trees
# ---------------------------------------------------------------------------------------------
def greedy_target(seed: int, lq: torch.Tensor, p_chain: float, p_second: float):
    """A target's greedy token after every draft prefix, as a fixed function of the prefix.

    After a prefix of depth d it picks the drafter's best token of depth d + 1 with probability
    ``p_chain``, its second best with ``p_second``, else a uniform token (draws seeded by the
    prefix, so every tree sees the same target). ``lq`` [L, V] are the draft log-probs.
    """
    L, V = lq.shape
    ranked = [sorted(range(V), key=lambda t: (-lq[d, t].item(), t)) for d in range(L)]

    def target(prefix: tuple) -> int:
        rng = random.Random(f"{seed}/{prefix}")
        u, d = rng.random(), len(prefix)
        if d < L and u < p_chain:
            return ranked[d][0]
        if d < L and V > 1 and u < p_chain + p_second:
            return ranked[d][1]
        return rng.randrange(V)

    return target


def walk_with(tree: DraftTree, targets) -> tuple[torch.Tensor, list]:
    """walk_greedy with the target token at every real node given by ``targets[b](prefix)``."""
    tgt = tree.tokens.clone()
    for b in range(tree.batch_size):
        for i in range(int(tree.num_nodes[b])):
            path = O.path_of(tree.parents[b], i) if i else []
            tgt[b, i] = targets[b](tuple(int(tree.tokens[b, j]) for j in path))
    walk = walk_greedy(tree, tgt)
    emitted = [
        [int(tree.tokens[b, j]) for j in walk.accepted[b, 1 : 1 + int(walk.accept_len[b])]]
        + [int(walk.bonus[b])]
        for b in range(tree.batch_size)
    ]
    return walk.accept_len, emitted


@SETTINGS
@given(
    bs=st.integers(1, 4),
    L=st.integers(1, 6),
    V=st.integers(2, 5),
    extra=st.integers(0, 8),
    seed=st.integers(0, 2**31 - 1),
    style=st.sampled_from(["normal", "ints", "equal", "neginf"]),
    p_chain=st.sampled_from([0.5, 0.8, 0.95, 1.0]),
)
def test_chain_tree_accepts_at_least_the_chain(bs, L, V, extra, seed, style, p_chain):
    """Greedy verification of the chain-inclusive tree (B = L + extra) accepts at least as many
    tokens as DFLASH's chain from the same draft, for any target, and emits the target's greedy
    tokens (lossless); the plain tree of the same budget has no such guarantee."""
    x = make_logits(seed, bs, L, V, style)
    roots = torch.zeros(bs, dtype=torch.long)
    targets = [
        greedy_target(seed + b, O.logq64(x[b]), p_chain, 0.6 * (1 - p_chain)) for b in range(bs)
    ]
    tree_len, tree_out = walk_with(build_ddtree(x, L + extra, roots), targets)
    chain_len, chain_out = walk_with(build_chain(x, roots), targets)
    assert (tree_len >= chain_len).all(), (tree_len, chain_len)
    for b in range(bs):
        # DFLASH's accepted length, from the oracle's chain: its longest prefix the target agrees with
        chain = O.oracle_chain(O.logq64(x[b]))
        agree = 0
        while agree < L and chain[agree] == targets[b](chain[:agree]):
            agree += 1
        assert int(chain_len[b]) == agree, (b, int(chain_len[b]), agree)
        rollout = []
        for _ in range(len(tree_out[b])):
            rollout.append(targets[b](tuple(rollout)))
        assert tree_out[b] == rollout, (b, tree_out[b], rollout)
        assert chain_out[b] == rollout[: len(chain_out[b])]


def test_chain_tree_beats_plain_tree_on_a_deep_target():
    # q = (0.5, 0.3, 0.2) at every depth, budget 4 = L + 1. The plain tree is (0), (1), (0, 0), (2):
    # depth 2 at most. The chain-inclusive tree is (0), (0, 0), (0, 0, 0), then the best prefix
    # outside the chain, (1). A target that continues 0, 0, 0 accepts 3 drafts from the chain
    # tree, 2 from the plain one.
    p = torch.tensor([0.5, 0.3, 0.2]).log()
    x = torch.stack([p, p, p])[None]
    roots = torch.tensor([7])
    plain = build_ddtree(x, 4, roots, include_chain=False)
    chained = build_ddtree(x, 4, roots)
    assert plain.tokens[0].tolist() == [7, 0, 1, 0, 2] and plain.depths[0].tolist() == [
        0,
        1,
        1,
        2,
        1,
    ]
    assert chained.tokens[0].tolist() == [7, 0, 0, 0, 1]
    assert chained.parents[0].tolist() == [-1, 0, 1, 2, 0]
    zeros = [lambda _prefix: 0]
    assert walk_with(plain, zeros)[0].tolist() == [2]
    assert walk_with(chained, zeros)[0].tolist() == [3]


@pytest.mark.parametrize("L,B", [(4, 1), (4, 3), (5, 4), (3, 3), (3, 4)])
def test_chain_only_when_it_fits(L, B):
    """B < L: the chain does not fit and the tree is the plain best-first one; B >= L: slots 1..L
    hold build_chain's tokens, each the child of the previous slot."""
    x = make_logits(31 * L + B, 3, L, 6, "normal")
    roots = torch.tensor([1, 2, 3])
    chained = build_ddtree(x, B, roots)
    plain = build_ddtree(x, B, roots, include_chain=False)
    if B < L:
        assert_same_tree(chained, plain)
        return
    chain = build_chain(x, roots)
    assert torch.equal(chained.tokens[:, : L + 1], chain.tokens)
    assert torch.equal(chained.parents[:, : L + 1], chain.parents)
    assert torch.equal(chained.depths[:, : L + 1], chain.depths)
    torch.testing.assert_close(chained.scores[:, : L + 1], chain.scores)


@pytest.mark.parametrize("flag", [1, None, "yes"])
def test_bad_include_chain_raises(flag):
    x = torch.randn(1, 2, 4)
    with pytest.raises(ValueError, match="include_chain must be True or False"):
        build_ddtree(x, 4, torch.tensor([0]), include_chain=flag)
