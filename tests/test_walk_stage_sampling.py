"""DDTreeWorker.walk_stage at T > 0 on the CPU: eagle_sample's logit edits (logit bias, additive
and scaling penalties, grammar mask) reach the per-node draws, per-request parameters and greedy
requests are honoured, seeded requests draw from their seed, and the draws are walked in
eagle_sample's layout. SGLang's verify_tree_greedy_func has no CPU kernel, so the test walks with
a Python walk over the same retrieve pointers (tests/tree_oracles.py:pointer_walk)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import tree_oracles as O

from sglang_spec.plugin.config import DDTreeConfig
from sglang_spec.tree import DraftTree, TreeMaskMode, sglang_tree_abi

V = 6
TOKENS = [4, 0, 1, 2]  # root -> 1:tok 0 -> 3:tok 2, root -> 2:tok 1
PARENTS = [-1, 0, 0, 1]
N = 4


def _verify_input(bs):
    rep = lambda v: torch.tensor([v]).repeat(bs, 1)  # noqa: E731
    tree = DraftTree(
        tokens=rep(TOKENS),
        parents=rep(PARENTS),
        depths=rep([0, 1, 1, 2]),
        scores=rep([0.0, -1.0, -2.0, -1.5]).float(),
        num_nodes=torch.full((bs,), N),
        horizon=2,
    )
    abi = sglang_tree_abi(tree, torch.full((bs,), 10), TreeMaskMode.FULL_MASK)
    return SimpleNamespace(
        draft_token=abi.draft_tokens,
        retrieve_index=abi.retrieve_index,
        retrieve_next_token=abi.retrieve_next_token,
        retrieve_next_sibling=abi.retrieve_next_sibling,
        draft_token_num=N,
        max_tree_depth=3,
        tree_topk=4,
    )


def _python_verify_tree_greedy(**kw):
    """verify_tree_greedy_func's outputs, computed by the pointer walk (records the kwargs)."""
    predicts, accept_index, num = kw["predicts"], kw["accept_index"], kw["accept_token_num"]
    cand, target = kw["candidates"], kw["target_predict"]
    paths = O.pointer_walk(kw["retrieve_next_token"], kw["retrieve_next_sibling"], cand, target)
    for b, path in enumerate(paths):
        rows = kw["retrieve_index"][b, path]
        accept_index[b, : len(path)] = rows.to(torch.int32)
        num[b] = len(path) - 1
        predicts[rows] = torch.cat([cand[b, path[1:]], target[b, path[-1:]]]).to(torch.int32)
    _python_verify_tree_greedy.seen = kw
    return predicts, accept_index, num


@pytest.fixture
def worker(monkeypatch):
    from sglang_spec.plugin import worker as worker_mod

    monkeypatch.setattr(worker_mod, "verify_tree_greedy_func", _python_verify_tree_greedy)
    group = SimpleNamespace(world_size=1)
    monkeypatch.setattr(worker_mod, "get_parallel", lambda: SimpleNamespace(tp_group=group))
    w = object.__new__(worker_mod.DDTreeWorker)
    w.config = DDTreeConfig(block_size=3, verify_width=N, topk_per_depth=2, tree_temperature=1.0)
    w._target_worker = SimpleNamespace(model_runner=SimpleNamespace(watermark_state=None))
    return w


def _batch(temps, top_ks, top_ps, **info):
    bs = len(temps)
    sampling_info = SimpleNamespace(
        is_all_greedy=False,
        has_watermark_candidates=False,
        temperatures=torch.tensor(temps).view(-1, 1),
        top_ks=torch.tensor(top_ks, dtype=torch.int32),
        top_ps=torch.tensor(top_ps),
        min_ps=torch.zeros(bs),
        need_min_p_sampling=False,
        sampling_seed=None,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
    )
    sampling_info.__dict__.update(info)
    reqs = [
        SimpleNamespace(sampling_params=SimpleNamespace(top_k=k, top_p=p))
        for k, p in zip(top_ks, top_ps, strict=True)
    ]
    return SimpleNamespace(sampling_info=sampling_info, reqs=reqs, seq_lens=torch.arange(bs) + 10)


def _walk(worker, batch, logits, grammar_mask=None):
    bs = len(batch.reqs)
    verified = SimpleNamespace(
        logits_output=SimpleNamespace(next_token_logits=logits), grammar_mask=grammar_mask
    )
    walked = worker.walk_stage(batch, None, _verify_input(bs), verified)
    return walked, _python_verify_tree_greedy.seen["target_predict"]


ALL = 1 << 30


def test_logit_edits_reach_the_draws_and_the_walk_layout(worker):
    bs = 4
    logits = torch.zeros(bs * N, V)
    bias = torch.zeros(bs, V)
    bias[:, 0] = 50.0  # every node draws token 0: root -> node 1; node 1 draws 0: not a child
    batch = _batch([1.0] * bs, [ALL] * bs, [1.0] * bs, logit_bias=bias)
    walked, drawn = _walk(worker, batch, logits)
    assert drawn.tolist() == [[0] * N] * bs
    assert walked.accept_lens.tolist() == [2] * bs
    assert walked.accept_index.tolist() == [[b * N, b * N + 1, -1] for b in range(bs)]
    assert walked.predict.view(bs, N)[:, :2].tolist() == [[0, 0]] * bs

    # token 0 (additive penalty -100), token 1 (scaling penalty 1e6 divides its positive logit)
    # and token 5 (grammar-masked) lead the raw logits: each edit is needed for every draw to be 3
    logits = torch.zeros(bs * N, V)
    logits[:, 0] = 20.0
    logits[:, 1] = 30.0
    logits[:, 3] = 4.0
    logits[:, 5] = 9.0
    add = torch.zeros(bs, V)
    add[:, 0] = -100.0
    scale = torch.ones(bs, V)
    scale[:, 1] = 1e6
    mask = SimpleNamespace(apply=lambda lg: lg[:, 5].fill_(float("-inf")))
    batch = _batch(
        [0.05] * bs,
        [ALL] * bs,
        [1.0] * bs,
        acc_additive_penalties=add,
        acc_scaling_penalties=scale,
    )
    walked, drawn = _walk(worker, batch, logits, mask)
    assert drawn.tolist() == [[3] * N] * bs
    assert walked.accept_lens.tolist() == [1] * bs


def test_per_request_parameters_greedy_requests_and_seeds(worker):
    g = torch.Generator().manual_seed(0)
    bs = 6
    logits = torch.randn(bs * N, V, generator=g)
    # request 0 greedy (top_k 1), request 1 top-k 2, the others top-p 0.5 without top-k
    top_ks, top_ps = [1, 2, ALL, ALL, ALL, ALL], [1.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    batch = _batch([1.0, 0.7, 1.3, 1.3, 1.3, 1.3], top_ks, top_ps)
    draws = [_walk(worker, batch, logits.clone())[1] for _ in range(40)]
    rows = logits.view(bs, N, V)
    assert all(torch.equal(d[0], rows[0].argmax(-1)) for d in draws)
    for b, (k, p, T) in enumerate(zip(top_ks, top_ps, [1.0, 0.7, 1.3, 1.3, 1.3, 1.3], strict=True)):
        for i in range(N):
            allowed = O.filtered_probs(rows[b, i], T, k if k < ALL else -1, p, order="joint") > 0
            assert all(bool(allowed[int(d[b, i])]) for d in draws), (b, i)
    assert any(not torch.equal(draws[0], d) for d in draws[1:])  # unseeded: fresh draws


def test_seeded_requests_draw_with_their_seed_coins(worker, monkeypatch):
    """With sampling seeds the node uniforms are eagle_sample's seeded verify coins (SGLang's
    murmur hash has no CPU kernel: the adapter call is replaced by fixed coins here)."""
    from sglang_spec.plugin import adapter

    bs = 3
    logits = torch.randn(bs * N, V, generator=torch.Generator().manual_seed(1))
    coins = torch.tensor([0.0, 1.0 - 2**-24] * (bs * N // 2))
    seen = []
    monkeypatch.setattr(
        adapter, "seeded_node_uniforms", lambda b, width: seen.append((b, width)) or coins
    )
    batch = _batch([1.0] * bs, [2] * bs, [1.0] * bs, sampling_seed=torch.arange(bs))
    drawn = _walk(worker, batch, logits)[1].reshape(-1)
    top2 = logits.topk(2, dim=-1).indices.sort(dim=-1).values  # u=0: lower id, u~1: higher id
    assert seen == [(batch, N)]
    assert drawn.tolist() == [int(top2[r, r % 2]) for r in range(bs * N)]
