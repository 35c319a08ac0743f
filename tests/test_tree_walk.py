"""Tree walks: `walk_greedy` against a brute-force oracle and a Python walk over SGLang's
retrieve_next_token / retrieve_next_sibling pointers; `walk_sample` losslessness by χ² tests
(first emitted token ~ the root's target distribution, second emitted token given the first
~ that child's target distribution) under temperature / top-k / top-p."""

from __future__ import annotations

import pytest
import torch
import tree_oracles as O
from hypothesis import given
from hypothesis import strategies as st
from scipy.stats import chisquare
from tree_testing import SETTINGS, fields, make_tree

from sglang_spec.tree import (
    DraftTree,
    TreeMaskMode,
    WalkResult,
    build_ddtree,
    sample_target_tokens,
    sglang_tree_abi,
    walk_greedy,
    walk_sample,
)

P_MIN = 1e-3


def check_walk(res: WalkResult, f: dict, target_tokens: torch.Tensor, L: int) -> None:
    bs, N = f["tokens"].shape
    assert isinstance(res, WalkResult)
    assert res.accepted.dtype == torch.int64 and tuple(res.accepted.shape) == (bs, L + 1)
    assert res.accept_len.dtype == torch.int64 and tuple(res.accept_len.shape) == (bs,)
    assert res.bonus.dtype == torch.int64 and tuple(res.bonus.shape) == (bs,)
    assert res.target_tokens.dtype == torch.int64 and tuple(res.target_tokens.shape) == (bs, N)
    acc, alen, bonus = O.oracle_walk_greedy(f, target_tokens, L)
    assert torch.equal(res.accepted, acc), (res.accepted, acc)
    assert torch.equal(res.accept_len, alen)
    assert torch.equal(res.bonus, bonus)


def random_case(seed, bs, B, L, V, full=False):
    g = torch.Generator().manual_seed(seed)
    f = O.random_tree_fields(g, bs, B, L, V, full=full)
    tgt = O.targets_that_often_match(g, f, V)
    return f, make_tree(f, L), tgt


# ----------------------------------------------------------------------------------------
# walk_greedy
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bs,B,L,V", [(1, 1, 1, 2), (4, 6, 3, 3), (8, 12, 4, 2), (3, 9, 2, 6), (2, 20, 6, 3)]
)
def test_walk_greedy_random_trees(bs, B, L, V):
    for seed in range(6):
        f, tree, tgt = random_case(seed, bs, B, L, V)
        res = walk_greedy(tree, tgt)
        check_walk(res, f, tgt, L)
        assert torch.equal(res.target_tokens, tgt)


def test_walk_greedy_hand_tree():
    # root(9) -> 1:tok 3 -> 3:tok 5 -> 5:tok 1
    #         -> 2:tok 4 -> 4:tok 5
    tokens = torch.tensor([[9, 3, 4, 5, 5, 1, 9]])
    parents = torch.tensor([[-1, 0, 0, 1, 2, 3, -1]])
    depths = torch.tensor([[0, 1, 1, 2, 2, 3, -1]])
    scores = torch.tensor([[0.0, -1, -2, -3, -4, -5, float("-inf")]])
    tree = DraftTree(
        tokens=tokens,
        parents=parents,
        depths=depths,
        scores=scores,
        num_nodes=torch.tensor([6]),
        horizon=3,
    )
    f = fields(tree)
    cases = [
        # target at nodes 0..6                 accepted          len bonus
        ([4, 0, 5, 0, 7, 0, 0], [0, 2, 4, -1], 2, 7),
        ([3, 5, 0, 1, 0, 8, 0], [0, 1, 3, 5], 3, 8),
        ([3, 2, 0, 0, 0, 0, 0], [0, 1, -1, -1], 1, 2),
        ([9, 0, 0, 0, 0, 0, 0], [0, -1, -1, -1], 0, 9),
        ([4, 5, 6, 1, 0, 0, 0], [0, 2, -1, -1], 1, 6),
    ]
    for tg, acc, alen, bonus in cases:
        tgt = torch.tensor([tg])
        res = walk_greedy(tree, tgt)
        assert res.accepted.tolist() == [acc]
        assert res.accept_len.tolist() == [alen] and res.bonus.tolist() == [bonus]
        check_walk(res, f, tgt, 3)


def test_walk_greedy_ignores_padding_slots():
    # padding slots hold the root token with parent -1: a target equal to the root token must
    # never "accept" a padding slot
    x = torch.tensor([[[0.0, 1.0]]])  # V=2, L=1: 2 real nodes, budget 4 -> 2 padding
    tree = build_ddtree(x, 4, torch.tensor([1]))
    assert int(tree.num_nodes[0]) == 3
    tgt = torch.full((1, 5), 1)
    res = walk_greedy(tree, tgt)
    check_walk(res, fields(tree), tgt, 1)
    node_of_tok1 = [i for i in (1, 2) if int(tree.tokens[0, i]) == 1][0]
    assert res.accepted.tolist() == [[0, node_of_tok1]] and res.bonus.tolist() == [1]


@SETTINGS
@given(
    bs=st.integers(1, 8),
    B=st.integers(1, 24),
    L=st.integers(1, 6),
    V=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    built=st.booleans(),
)
def test_walk_greedy_property_and_pointer_walk(bs, B, L, V, seed, built):
    g = torch.Generator().manual_seed(seed)
    if built:
        x = torch.randn(bs, L, V, generator=g)
        tree = build_ddtree(x, B, torch.randint(V, (bs,), generator=g))
        f = fields(tree)
        tgt = O.targets_that_often_match(g, f, V)
    else:
        f, tree, tgt = random_case(seed, bs, B, L, V)
    res = walk_greedy(tree, tgt)
    check_walk(res, f, tgt, L)
    # SGLang-style pointer walk over our ABI reproduces the oracle's path
    seq_lens = torch.randint(0, 5, (bs,), generator=g)
    abi = sglang_tree_abi(tree, seq_lens, mode=TreeMaskMode.QLEN_ONLY)
    paths = O.pointer_walk(
        abi.retrieve_next_token, abi.retrieve_next_sibling, abi.draft_tokens.view(bs, B + 1), tgt
    )
    acc, alen, _ = O.oracle_walk_greedy(f, tgt, L)
    for b in range(bs):
        assert paths[b] == acc[b, : int(alen[b]) + 1].tolist()


# ----------------------------------------------------------------------------------------
# walk_sample: structure
# ----------------------------------------------------------------------------------------


def test_walk_sample_is_greedy_walk_on_its_samples():
    for seed, (bs, B, L, V) in enumerate([(6, 8, 3, 4), (3, 12, 4, 3), (1, 1, 1, 2), (8, 5, 2, 6)]):
        f, tree, _ = random_case(seed, bs, B, L, V)
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(bs, B + 1, V, generator=g) * 2
        # put mass on the children so that walks go deep
        for b in range(bs):
            for i in range(1, int(f["num_nodes"][b])):
                logits[b, int(f["parents"][b, i]), int(f["tokens"][b, i])] += 2.0
        for kw in (
            dict(temperature=1.0),
            dict(temperature=0.7, top_k=2),
            dict(temperature=1.5, top_p=0.8),
        ):
            res = walk_sample(tree, logits, generator=torch.Generator().manual_seed(seed), **kw)
            check_walk(res, f, res.target_tokens, L)
            real = torch.arange(B + 1)[None, :] < f["num_nodes"][:, None]
            st_ = res.target_tokens[real]
            assert bool(((st_ >= 0) & (st_ < V)).all())
            # same generator seed -> same result
            res2 = walk_sample(
                tree, logits.clone(), generator=torch.Generator().manual_seed(seed), **kw
            )
            assert torch.equal(res.target_tokens[real], res2.target_tokens[real])
            assert torch.equal(res.accepted, res2.accepted) and torch.equal(res.bonus, res2.bonus)


def test_walk_sample_without_generator_runs():
    f, tree, _ = random_case(3, 4, 6, 3, 3)
    logits = torch.randn(4, 7, 3)
    res = walk_sample(tree, logits, 1.0)
    check_walk(res, f, res.target_tokens, 3)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=1.0, top_k=1),
        dict(temperature=0.3, top_k=1),
        dict(temperature=2.0, top_k=1, top_p=0.9),
        dict(temperature=1.0, top_p=1e-6),
    ],
)
def test_walk_sample_degenerate_filters_equal_greedy(kw):
    for seed, (bs, B, L, V) in enumerate([(8, 10, 4, 3), (5, 6, 2, 5), (2, 1, 1, 4)]):
        f, tree, _ = random_case(seed, bs, B, L, V)
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(bs, B + 1, V, generator=g)
        for b in range(bs):  # make the argmax follow the tree often, so that paths are long
            for i in range(1, int(f["num_nodes"][b])):
                if torch.rand((1,), generator=g).item() < 0.6:
                    logits[b, int(f["parents"][b, i]), int(f["tokens"][b, i])] += 4.0
        argmax = logits.argmax(-1)
        res = walk_sample(tree, logits, generator=torch.Generator().manual_seed(seed), **kw)
        greedy = walk_greedy(tree, argmax)
        real = torch.arange(B + 1)[None, :] < f["num_nodes"][:, None]
        assert torch.equal(res.target_tokens[real], argmax[real])
        assert torch.equal(res.accepted, greedy.accepted)
        assert torch.equal(res.accept_len, greedy.accept_len)
        assert torch.equal(res.bonus, greedy.bonus)


def test_temperature_zero_rows_take_the_argmax():
    """``sample_target_tokens``' own greedy rows (T = 0, alone or beside sampled rows)."""
    f, tree, _ = random_case(4, 2, 6, 3, 5)
    logits = torch.randn(2, 7, 5, generator=torch.Generator().manual_seed(4)) * 3
    greedy = walk_greedy(tree, logits.argmax(-1))
    res = walk_sample(tree, logits, 0.0, top_p=0.5, top_k=2)
    assert torch.equal(res.target_tokens, greedy.target_tokens)
    assert torch.equal(res.accepted, greedy.accepted) and torch.equal(res.bonus, greedy.bonus)
    mixed = sample_target_tokens(logits, torch.tensor([1.0, 0.0]))  # top_p and top_k default off
    assert torch.equal(mixed[1], logits[1].argmax(-1))


def test_top_k_zero_is_off_and_top_p_stops_at_the_prefix_reaching_it():
    """``top_k <= 0`` disables top-k (0 as well as -1); top-p keeps the smallest sorted prefix
    whose mass reaches top_p, so a token whose preceding mass equals top_p exactly is out."""
    logits = torch.tensor([0.5, 0.0, -1.0]).expand(1, 256, 3)
    off = sample_target_tokens(logits, 1.0, top_k=-1, generator=_gen())
    assert torch.equal(sample_target_tokens(logits, 1.0, top_k=0, generator=_gen()), off)
    assert 0 < int((off != 0).sum()) < 256  # unfiltered draws leave the argmax
    probs = logits[0, 0].softmax(-1)  # already sorted; the sampler's own float32 arithmetic
    mass_before_second = float((probs.cumsum(-1) - probs)[1])
    only_first = sample_target_tokens(logits, 1.0, top_p=mass_before_second, generator=_gen())
    assert bool((only_first == 0).all())


def test_bad_arguments_are_named():
    """Each refusal names the argument, its value and what is valid; the boundary values pass."""
    f, tree, _ = random_case(0, 2, 4, 2, 5)  # bs 2, N 5
    logits = torch.randn(2, 5, 5)

    def refused(call, message):
        with pytest.raises(ValueError) as bad:
            call()
        assert str(bad.value) == message

    refused(
        lambda: walk_greedy(tree, torch.zeros(2, 4, dtype=torch.long)),
        "target_tokens must be [bs, N] = (2, 5); got (2, 4)",
    )
    for shape in ((2, 5), (2, 4, 5), (1, 5, 5)):  # 2-D with the tree's [bs, N]; a wrong [bs, N]
        refused(
            lambda shape=shape: walk_sample(tree, torch.zeros(shape), 1.0),
            f"target_logits must be [bs, N, V] with [bs, N] = (2, 5); got {shape}",
        )
    for name in ("temperature", "top_p", "top_k"):
        kw = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, name: torch.ones(3)}
        refused(
            lambda kw=kw: walk_sample(tree, logits, **kw),
            f"{name} must be a scalar or a [bs=2] tensor; got shape (3,)",
        )
    for kw, message in (
        (dict(temperature=-0.5), "temperature must be >= 0; got [-0.5, -0.5]"),
        (dict(temperature=torch.tensor([1.0, -1.0])), "temperature must be >= 0; got [1.0, -1.0]"),
        (dict(temperature=1.0, top_p=0.0), "top_p must be in (0, 1]; got [0.0, 0.0]"),
        (dict(temperature=1.0, top_p=1.5), "top_p must be in (0, 1]; got [1.5, 1.5]"),
    ):
        refused(lambda kw=kw: walk_sample(tree, logits, **kw), message)
    for kw in (dict(temperature=0.0), dict(temperature=1.0, top_p=1.0), dict(temperature=1.0)):
        walk_sample(tree, logits, **kw)  # the accepted neighbours (and the default top_p)
    sample_target_tokens(logits, 1.0)


def test_walks_keep_every_tensor_on_the_inputs_device_not_the_default():
    """Under a ``meta`` default device, CPU inputs give the same CPU walk: no tensor is created on
    the default device (on a GPU server the default is the CPU and the inputs are on CUDA)."""
    f, tree, tgt = random_case(2, 3, 6, 3, 4)
    logits = torch.randn(3, 7, 4, generator=torch.Generator().manual_seed(2)) * 3
    kw = dict(temperature=torch.tensor([0.7, 0.0, 1.3]), top_p=0.9, top_k=3)
    want = (walk_greedy(tree, tgt), walk_sample(tree, logits, generator=_gen(), **kw))
    with torch.device("meta"):
        got = (walk_greedy(tree, tgt), walk_sample(tree, logits, generator=_gen(), **kw))
    for w, g in zip(want, got, strict=True):
        for name in ("accepted", "accept_len", "bonus", "target_tokens"):
            a, b = getattr(w, name), getattr(g, name)
            assert b.device.type == "cpu" and torch.equal(a, b), name


def _gen():
    return torch.Generator().manual_seed(0)


def test_walk_sample_respects_support():
    # top_k=2 -> every sampled token is one of the 2 most likely; top_p -> within the nucleus
    bs, B, L, V = 64, 6, 3, 6
    f, tree, _ = random_case(1, bs, B, L, V, full=True)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(bs, B + 1, V, generator=g) * 3
    res = walk_sample(tree, logits, 1.0, top_k=2, generator=g)
    top2 = logits.topk(2, dim=-1).indices
    assert bool((res.target_tokens[..., None] == top2).any(-1).all())
    res = walk_sample(tree, logits, 1.0, top_p=0.5, generator=g)
    for b in range(bs):
        for i in range(B + 1):
            q = O.filtered_probs(logits[b, i], 1.0, -1, 0.5)
            assert q[int(res.target_tokens[b, i])] > 0
    # -inf target logits (e.g. grammar-masked tokens) are never sampled, at any temperature
    banned = torch.rand(bs, B + 1, V, generator=g) < 0.5
    banned[..., 0] = False
    masked = logits.masked_fill(banned, float("-inf"))
    for T in (0.5, 1.0, 3.0):
        res = walk_sample(tree, masked, T, generator=g)
        assert not bool(banned.gather(-1, res.target_tokens[..., None]).any())


# ----------------------------------------------------------------------------------------
# walk_sample: χ² losslessness
# ----------------------------------------------------------------------------------------

V_CHI = 7


def chi_tree(bs: int) -> DraftTree:
    """Fixed tree (V=7, L=3), replicated over bs rows:
    root(tok 6) -> 1:tok 0 -> 4:tok 2 -> 7:tok 1
                           -> 5:tok 0
                -> 2:tok 1 -> 6:tok 3
                -> 3:tok 4
    """
    tok = [6, 0, 1, 4, 2, 0, 3, 1]
    par = [-1, 0, 0, 0, 1, 1, 2, 4]
    dep = [0, 1, 1, 1, 2, 2, 2, 3]
    sc = [0.0, -0.5, -1.0, -2.0, -1.2, -1.5, -2.0, -2.2]
    rep = lambda v, dt: torch.tensor([v], dtype=dt).repeat(bs, 1)  # noqa: E731
    return DraftTree(
        tokens=rep(tok, torch.long),
        parents=rep(par, torch.long),
        depths=rep(dep, torch.long),
        scores=rep(sc, torch.float32),
        num_nodes=torch.full((bs,), 8, dtype=torch.long),
        horizon=3,
    )


def chi_logits() -> torch.Tensor:
    """Target logits per node [8, V]; the root puts a lot of mass on token 0 (= node 1)."""
    x = torch.tensor(
        [
            [2.0, 1.0, 0.2, -0.5, 0.6, -1.0, 0.0],  # root: token 0 (node 1) most likely
            [0.4, 0.1, 1.2, -0.3, 0.8, 0.0, -1.5],  # node 1: token 2 -> node 4, token 0 -> node 5
            [0.05, -0.1, 0.0, 1.0, -1.0, 0.5, 0.3],
            [1.0, 0.1, -1.0, 0.0, 0.5, -0.2, 0.2],
            [0.3, 1.1, -0.2, 0.0, 0.7, -0.8, 0.1],
            [0.0, 0.6, 0.2, 0.1, -0.4, 0.35, 0.9],
            [0.5, -0.5, 0.45, -0.4, 0.55, -0.6, 0.0],
            [0.2, 0.1, 0.0, -0.1, -0.2, -0.3, 1.0],
        ]
    )
    return x


def emitted_tokens(tree: DraftTree, res: WalkResult):
    """First and second emitted token per row (-1 where the row emitted only one)."""
    bs = res.accept_len.shape[0]
    ar = torch.arange(bs)
    acc = res.accepted
    first = torch.where(res.accept_len >= 1, tree.tokens[ar, acc[:, 1].clamp(min=0)], res.bonus)
    second = torch.where(
        res.accept_len >= 2,
        tree.tokens[ar, acc[:, 2].clamp(min=0)],
        torch.where(res.accept_len == 1, res.bonus, torch.full_like(res.bonus, -1)),
    )
    return first, second


def chi2_pvalue(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of samples against probs (tokens outside the support -> 0)."""
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    support = probs > 0
    if float(counts[~support].sum()) > 0:
        return 0.0
    return float(
        chisquare(counts[support].numpy(), (probs[support] * samples.numel()).numpy()).pvalue
    )


def chi2_against(samples: torch.Tensor, probs: torch.Tensor, what: str) -> None:
    n = samples.numel()
    assert n >= 300, f"{what}: only {n} samples"
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    support = probs > 0
    assert float(counts[~support].sum()) == 0.0, (
        f"{what}: sampled outside the support: {counts.tolist()}"
    )
    obs = counts[support].numpy()
    exp = (probs[support] * n).numpy()
    if obs.size == 1:
        return
    p = chisquare(obs, exp).pvalue
    assert p > P_MIN, (
        f"{what}: chi2 p={p:.2e} counts={counts.tolist()} expected={(probs * n).tolist()}"
    )


FILTERS = [
    dict(temperature=1.0, top_k=-1, top_p=1.0),
    dict(temperature=0.6, top_k=-1, top_p=1.0),
    dict(temperature=1.7, top_k=3, top_p=1.0),
    dict(temperature=1.0, top_k=-1, top_p=0.72),
    dict(temperature=1.2, top_k=6, top_p=0.7),
]


@pytest.mark.parametrize(
    "flt", FILTERS, ids=lambda d: f"T{d['temperature']}-k{d['top_k']}-p{d['top_p']}"
)
def test_walk_sample_chi2_first_and_second_token(flt):
    bs = 6000
    tree = chi_tree(bs)
    x = chi_logits()
    logits = x[None].repeat(bs, 1, 1)
    T, k, p = flt["temperature"], flt["top_k"], flt["top_p"]
    for node in (0, 1):
        a = O.filtered_probs(x[node], T, k, p, order="topk_then_topp")
        b = O.filtered_probs(x[node], T, k, p, order="joint")
        assert torch.allclose(a, b), (
            "test parameters must not depend on the top-k/top-p order convention"
        )
    res = walk_sample(
        tree, logits, T, top_p=p, top_k=k, generator=torch.Generator().manual_seed(1234)
    )
    first, second = emitted_tokens(tree, res)
    chi2_against(first, O.filtered_probs(x[0], T, k, p), f"first token {flt}")
    # power check: the same samples must reject the unfiltered T=1 distribution whenever it
    # differs noticeably (so the χ² test above is not trivially passing)
    plain = O.filtered_probs(x[0], 1.0, -1, 1.0)
    want = O.filtered_probs(x[0], T, k, p)
    if float((plain - want).abs().sum()) > 0.1:
        assert chi2_pvalue(first, plain) < P_MIN
    # given that the first emitted token is node 1's token (0), the second ~ node 1's target
    sel = first == 0
    chi2_against(second[sel], O.filtered_probs(x[1], T, k, p), f"second token | first=0 {flt}")
    # given first = node 2's token (1), the second ~ node 2's target
    sel2 = first == 1
    if int(sel2.sum()) >= 300:
        chi2_against(second[sel2], O.filtered_probs(x[2], T, k, p), f"second token | first=1 {flt}")
    # given first = 2 (not a child of the root) the round ends: a single emitted token
    notchild = (first == 2) | (first == 3) | (first == 5) | (first == 6)
    assert bool((second[notchild] == -1).all())
    assert bool((res.accept_len[notchild] == 0).all())


def test_walk_sample_chi2_third_token():
    # P(third | first=0, second=2) = node 4's target distribution
    bs = 20000
    tree = chi_tree(bs)
    x = chi_logits()
    logits = x[None].repeat(bs, 1, 1)
    res = walk_sample(tree, logits, 1.0, generator=torch.Generator().manual_seed(99))
    first, second = emitted_tokens(tree, res)
    sel = (first == 0) & (second == 2)
    ar = torch.arange(bs)
    third = torch.where(
        res.accept_len >= 3, tree.tokens[ar, res.accepted[:, 3].clamp(min=0)], res.bonus
    )
    assert bool((res.accept_len[sel] >= 2).all())
    chi2_against(third[sel], O.filtered_probs(x[4], 1.0, -1, 1.0), "third token | 0, 2")


def test_walk_sample_chi2_per_row_parameters():
    # temperature / top_k / top_p given as [bs] tensors: each half follows its own parameters
    half = 4000
    bs = 2 * half
    tree = chi_tree(bs)
    x = chi_logits()
    logits = x[None].repeat(bs, 1, 1)
    T = torch.tensor([0.5] * half + [2.0] * half)
    K = torch.tensor([-1] * half + [4] * half)
    P = torch.tensor([1.0] * half + [0.9] * half)
    res = walk_sample(tree, logits, T, top_p=P, top_k=K, generator=torch.Generator().manual_seed(7))
    first, second = emitted_tokens(tree, res)
    for lo, t, k, p in ((0, 0.5, -1, 1.0), (half, 2.0, 4, 0.9)):
        rows = slice(lo, lo + half)
        for node in (0, 1):
            assert torch.allclose(
                O.filtered_probs(x[node], t, k, p, order="joint"),
                O.filtered_probs(x[node], t, k, p),
            )
        chi2_against(
            first[rows],
            O.filtered_probs(x[0], t, k, p),
            f"first token rows {lo}+ (T={t},k={k},p={p})",
        )
        f_ = first[rows]
        s_ = second[rows]
        chi2_against(s_[f_ == 0], O.filtered_probs(x[1], t, k, p), f"second token rows {lo}+")


def test_walk_sample_chi2_not_biased_by_draft_scores():
    # Same tree topology and tokens, wildly different draft scores: the output distribution must
    # not change (the tree is deterministic given the draft; the draft probs must not be used
    # as a proposal q in min(1, p/q)).
    bs = 6000
    tree = chi_tree(bs)
    x = chi_logits()
    tree2 = DraftTree(
        tokens=tree.tokens,
        parents=tree.parents,
        depths=tree.depths,
        scores=tree.scores * 10 - 3 * torch.arange(8).float(),
        num_nodes=tree.num_nodes,
        horizon=3,
    )
    tree2.scores[:, 0] = 0.0
    res = walk_sample(
        tree2, x[None].repeat(bs, 1, 1), 1.0, generator=torch.Generator().manual_seed(5)
    )
    first, second = emitted_tokens(tree2, res)
    chi2_against(first, O.filtered_probs(x[0], 1.0, -1, 1.0), "first token, rescored tree")
    chi2_against(
        second[first == 0], O.filtered_probs(x[1], 1.0, -1, 1.0), "second token, rescored tree"
    )
