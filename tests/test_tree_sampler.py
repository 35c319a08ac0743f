"""`sample_node_tokens` (sglang_spec/tree/sampler.py) + the tree walk: lossless at T > 0.

χ² tests of one verify step's whole output (accepted tokens then the bonus) on a depth-2 tree
against the exact distribution computed from the processed per-node target distributions (float64
oracle, tests/tree_oracles.py). Every node has its own peaked distribution (V = 8). Each case states
its power: for every wrong sampler listed in WRONG (temperature ignored, top-k ignored, top-p
ignored, min-p ignored, the other top-k/top-p order, every node drawing from the root's
distribution = a walk ignoring the node's target), the non-central χ² power of the test at
α = 1e-3 with the case's sample count is asserted to exceed 1 - 1e-6 whenever that mistake changes
the case's distribution; the samples are seeded, so the test is deterministic.
"""

from __future__ import annotations

import pytest
import torch
import tree_oracles as O
from scipy.stats import chi2, ncx2

from sglang_spec.tree import DraftTree, walk_greedy
from sglang_spec.tree.sampler import SamplingBounds, sample_node_tokens

V = 8
ALPHA = 1e-3
# root(7) -> 1:tok 0 -> 3:tok 2
#                    -> 4:tok 5
#         -> 2:tok 3 -> 5:tok 0
#                    -> 6:tok 6
TOKENS = [7, 0, 3, 2, 5, 0, 6]
PARENTS = [-1, 0, 0, 1, 1, 2, 2]
DEPTHS = [0, 1, 1, 2, 2, 2, 2]
N = len(TOKENS)
CHILDREN = {i: [j for j in range(N) if PARENTS[j] == i] for i in range(N)}
# Peaked, distinct per-node target logits; each node favours a different token.
LOGITS = torch.tensor(
    [
        [3.0, 0.4, 1.1, 2.2, -0.5, 0.9, 0.0, -1.0],
        [0.2, 1.0, 2.6, -0.4, 1.9, 0.6, -1.2, 0.3],
        [2.3, -0.8, 0.5, 0.1, 1.4, -0.3, 1.8, 0.7],
        [0.6, 2.8, -0.2, 1.2, 0.0, 1.6, -0.9, 0.4],
        [-0.6, 0.3, 1.0, 0.2, 2.7, -0.1, 1.3, 1.7],
        [1.5, 0.1, -0.7, 2.9, 0.8, 1.1, 0.2, -0.4],
        [0.0, 1.2, 0.7, -0.5, 0.3, 2.4, 1.6, -1.1],
    ]
)


def tree(bs: int) -> DraftTree:
    rep = lambda v, dt: torch.tensor([v], dtype=dt).repeat(bs, 1)  # noqa: E731
    return DraftTree(
        tokens=rep(TOKENS, torch.long),
        parents=rep(PARENTS, torch.long),
        depths=rep(DEPTHS, torch.long),
        scores=rep([0.0, -0.3, -1.0, -0.6, -1.1, -1.4, -1.6], torch.float32),
        num_nodes=torch.full((bs,), N, dtype=torch.long),
        horizon=2,
    )


def processed(row, T, k, p, min_p=0.0, order="joint") -> torch.Tensor:
    q = O.filtered_probs(row, T, k if k < V else -1, p, order=order)
    if min_p > 0:
        q = torch.where(q >= min_p * q.max(), q, 0.0)
    return q / q.sum()


def step_distribution(node_probs) -> dict[tuple, float]:
    """Exact law of one step's output (accepted tokens, then the bonus) on the tree."""
    law: dict[tuple, float] = {}

    def visit(node, prefix, prob):
        for tok in range(V):
            q = prob * float(node_probs[node][tok])
            if q == 0.0:
                continue
            child = [c for c in CHILDREN[node] if TOKENS[c] == tok]
            if child:
                visit(child[0], (*prefix, tok), q)
            else:
                law[(*prefix, tok)] = law.get((*prefix, tok), 0.0) + q

    visit(0, (), 1.0)
    return law


def outputs(t: DraftTree, tokens: torch.Tensor) -> list[tuple]:
    res = walk_greedy(t, tokens.view(t.batch_size, N))
    acc = res.accepted.tolist()
    bonus = res.bonus.tolist()
    return [
        tuple(TOKENS[i] for i in a[1:] if i >= 0) + (b,) for a, b in zip(acc, bonus, strict=True)
    ]


def chi2_check(samples: list[tuple], law: dict[tuple, float], what: str) -> None:
    n = len(samples)
    outside = [s for s in samples if s not in law]
    assert not outside, f"{what}: outputs outside the support, e.g. {outside[:3]}"
    keys = sorted(law)
    counts = {k: 0 for k in keys}
    for s in samples:
        counts[s] += 1
    big = [k for k in keys if law[k] * n >= 5]
    obs = [counts[k] for k in big] + [n - sum(counts[k] for k in big)]
    exp = [law[k] * n for k in big] + [n - sum(law[k] * n for k in big)]
    if exp[-1] < 1e-9:
        obs, exp = obs[:-1], exp[:-1]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    pval = chi2.sf(stat, len(obs) - 1)
    assert pval > ALPHA, f"{what}: chi2 p={pval:.2e} over {len(obs)} bins, n={n}"


def power(law: dict[tuple, float], wrong: dict[tuple, float], n: int) -> float:
    """Power at ALPHA of the χ² test (bins of `law`) against samples drawn from `wrong`."""
    if any(k not in law for k in wrong):  # support violations are caught with certainty
        return 1.0
    big = [k for k in law if law[k] * n >= 5]
    rest_p = 1.0 - sum(law[k] for k in big)
    rest_q = 1.0 - sum(wrong.get(k, 0.0) for k in big)
    lam = n * sum((wrong.get(k, 0.0) - law[k]) ** 2 / law[k] for k in big)
    df = len(big) - 1
    if rest_p * n > 1e-9:
        lam += n * (rest_q - rest_p) ** 2 / rest_p
        df += 1
    return float(ncx2.sf(chi2.isf(ALPHA, df), df, lam))


def distance(a: dict, b: dict) -> float:
    return sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def node_laws(T, k, p, min_p, order, nodes=range(N)):
    return [processed(LOGITS[i], T, k, p, min_p, order) for i in nodes]


ORDER = {False: "joint", True: "topk_then_topp"}

# (temperature, top_k, top_p, min_p, top_k_first); V = 8 means "no top-k".
CASES = [
    (0.6, V, 1.0, 0.0, False),
    (1.6, 3, 1.0, 0.0, False),
    (1.0, V, 0.6, 0.0, False),
    (1.3, 4, 0.7, 0.0, False),
    (1.3, 4, 0.7, 0.0, True),
    (1.4, V, 0.9, 0.25, True),
    (0.8, 5, 0.8, 0.15, True),
]


def wrong_laws(T, k, p, min_p, top_k_first) -> dict[str, dict]:
    order, other = ORDER[top_k_first], ORDER[not top_k_first]
    root_everywhere = [processed(LOGITS[0], T, k, p, min_p, order)] * N
    return {
        "temperature ignored": step_distribution(node_laws(1.0, k, p, min_p, order)),
        "top-k ignored": step_distribution(node_laws(T, V, p, min_p, order)),
        "top-p ignored": step_distribution(node_laws(T, k, 1.0, min_p, order)),
        "min-p ignored": step_distribution(node_laws(T, k, p, 0.0, order)),
        "other top-k/top-p order": step_distribution(node_laws(T, k, p, min_p, other)),
        "root's target at every node": step_distribution(root_everywhere),
    }


def draw(bs, T, k, p, min_p, top_k_first, *, seed, candidates=256, dtype=torch.float32):
    logits = LOGITS.to(dtype).repeat(bs, 1)
    bounds = SamplingBounds.of(
        [k] * bs, [p] * bs, V, top_k_first=top_k_first, nucleus_candidates=candidates
    )
    tokens = sample_node_tokens(
        logits,
        torch.full((bs,), T),
        torch.full((bs,), k),
        torch.full((bs,), p),
        torch.full((bs,), min_p) if min_p > 0 else None,
        bounds,
        generator=torch.Generator().manual_seed(seed),
        workspace_bytes=4 * V * 997,  # 997-row blocks: several blocks, a ragged last one
    )
    return tokens


# Candidates 1: rows with top_p < 1 and no top-k decide their nucleus by bisection.
CHI2_RUNS = [(c, 256) for c in CASES] + [(c, 1) for c in CASES if c[1] >= V and c[2] < 1]


@pytest.mark.parametrize(
    "case, candidates",
    CHI2_RUNS,
    ids=lambda v: "T{}-k{}-p{}-minp{}-kfirst{}".format(*v) if isinstance(v, tuple) else f"K{v}",
)
def test_chi2_whole_step_depth_1_and_2(case, candidates):
    T, k, p, min_p, top_k_first = case
    order = ORDER[top_k_first]
    law = step_distribution(node_laws(T, k, p, min_p, order))
    assert any(len(o) == 3 for o in law), "the tree must accept depth 2 with positive probability"
    bs = 12000
    for name, wrong in wrong_laws(*case).items():
        if distance(wrong, law) > 1e-9:
            assert power(law, wrong, bs) > 1 - 1e-6, f"{case}: too few samples to catch {name}"
    t = tree(bs)
    tokens = draw(bs, *case, seed=11, candidates=candidates)
    chi2_check(outputs(t, tokens), law, f"{case} candidates={candidates}")


def test_every_wrong_sampler_is_a_different_law_in_some_case():
    """The mutations of the power claim are real: each one changes some case's distribution."""
    for name in wrong_laws(*CASES[0]):
        assert any(
            distance(wrong_laws(*c)[name], step_distribution(node_laws(*c[:4], ORDER[c[4]]))) > 0.05
            for c in CASES
        ), name


def test_mixed_batch_per_request_parameters_and_greedy_rows():
    """One batch, four kinds of request (greedy = top_k 1, T only, top-k + top-p, top-p only):
    greedy requests get the argmax at every node, the others their own law."""
    kinds = [(1.0, 1, 1.0), (0.7, V, 1.0), (1.5, 3, 0.8), (1.1, V, 0.75)]
    per = 6000
    bs = per * len(kinds)
    T = torch.tensor([kd[0] for kd in kinds]).repeat_interleave(per)
    K = torch.tensor([kd[1] for kd in kinds]).repeat_interleave(per)
    P = torch.tensor([kd[2] for kd in kinds]).repeat_interleave(per)
    bounds = SamplingBounds.of(K.tolist(), P.tolist(), V)
    tokens = sample_node_tokens(
        LOGITS.repeat(bs, 1), T, K, P, None, bounds, generator=torch.Generator().manual_seed(5)
    )
    tokens = tokens.view(bs, N)
    assert torch.equal(tokens[:per], LOGITS.argmax(-1).repeat(per, 1))
    t = tree(bs)
    outs = outputs(t, tokens)
    for i, (Tk, kk, pk) in enumerate(kinds[1:], start=1):
        law = step_distribution(node_laws(Tk, kk, pk, 0.0, "joint"))
        chi2_check(outs[i * per : (i + 1) * per], law, f"request kind {kinds[i]}")


def test_greedy_rows_take_the_first_argmax_of_the_raw_logits():
    # bf16 logits with an exact tie for the maximum, and near-ties that exp() in float32 rounds
    # together: top_k = 1 must still give torch.argmax of the given logits
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(40, 50, generator=g).to(torch.bfloat16)
    logits[::3, 7] = logits[::3].max(-1).values
    logits[1::3, 9] = logits[1::3].max(-1).values + 1e-3
    bs = 10
    bounds = SamplingBounds.of([1] * bs, [1.0] * bs, 50)
    tokens = sample_node_tokens(
        logits,
        torch.full((bs,), 0.3),
        torch.ones(bs, dtype=torch.long),
        torch.ones(bs),
        None,
        bounds,
    )
    assert torch.equal(tokens, logits.argmax(-1))


def test_inverse_cdf_edges_and_read_only_logits():
    """u = 0 picks the first kept token, u just below 1 the last (never a filtered token), and
    the logits are left as they were."""
    logits = torch.tensor([[-1.0, 2.0, float("-inf"), 1.5, 0.5, 3.0, -2.0, 0.0]]).repeat(4, 1)
    before = logits.clone()
    bs = 2
    bounds = SamplingBounds.of([V, 3], [1.0, 1.0], V)
    u = torch.tensor([0.0, 1.0 - 2**-24, 0.0, 1.0 - 2**-24])
    tokens = sample_node_tokens(
        logits, torch.ones(bs), torch.tensor([V, 3]), torch.ones(bs), None, bounds, uniforms=u
    )
    assert tokens.tolist() == [0, 7, 1, 5]  # top-3 = {5, 1, 3}: first 1, last 5
    assert torch.equal(logits, before)


def test_bf16_logits_sample_their_own_law():
    bs = 12000
    case = (0.9, 4, 0.85, 0.0, False)
    tokens = draw(bs, *case, seed=3, dtype=torch.bfloat16)
    laws = [processed(r, 0.9, 4, 0.85) for r in LOGITS.to(torch.bfloat16).float()]
    chi2_check(outputs(tree(bs), tokens), step_distribution(laws), "bf16 logits")


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(temperature=torch.zeros(2)), "temperature must be > 0"),
        (dict(top_k=torch.tensor([0, 3])), "top_k must be >= 1"),
        (dict(top_p=torch.tensor([1.0, 1.5])), r"top_p must be in \(0, 1\]"),
        (dict(min_p=torch.tensor([0.1, -0.1])), r"min_p must be in \[0, 1\]"),
        (dict(top_k=torch.tensor([3, 6])), "bounds.max_top_k=5"),
        (dict(top_p=torch.tensor([0.5, 1.0]), top_k=torch.tensor([V, 2])), "nucleus_search"),
        (dict(temperature=torch.ones(3)), "multiple of the batch size"),
        (dict(uniforms=torch.zeros(3)), r"uniforms must be \[rows=14\]"),
        (dict(uniforms=torch.ones(14)), r"uniforms must be in \[0, 1\)"),
        (dict(workspace_bytes=16), "workspace_bytes must hold one float32 row"),
    ],
)
def test_bad_arguments_are_refused(kw, match):
    args = dict(
        temperature=torch.ones(2),
        top_k=torch.tensor([5, 2]),
        top_p=torch.ones(2),
        min_p=None,
        bounds=SamplingBounds(max_top_k=5, nucleus_search=False),
    )
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        sample_node_tokens(LOGITS.repeat(2, 1), **args)


def test_bounds_of_host_parameters():
    b = SamplingBounds.of([1, 20, 1 << 30, 7], [1.0, 0.9, 1.0, 0.5], 1000)
    assert (b.max_top_k, b.nucleus_search, b.candidates(1000)) == (20, False, 20)
    b = SamplingBounds.of([1 << 30, 3], [0.9, 1.0], 1000, nucleus_candidates=64)
    assert (b.max_top_k, b.nucleus_search, b.candidates(1000)) == (3, True, 64)
    assert SamplingBounds.of([1 << 30], [0.5], 10).candidates(10) == 10
