"""The DDTREE draft sampler (issue 13 items 2 and 3), on the CPU.

* :class:`sglang_spec.tree.StaticDraftTree` (what the drafter's CUDA graph runs) gives exactly what
  the eager path (:func:`sglang_spec.tree.draft_tree`) gives, on one rank and on two simulated
  ranks, writes only the first ``bs`` rows of its static buffers, and a second call with other
  inputs gives fresh results;
* ``draft_sampler.step_tree`` (``topk_stage``) takes the static outputs only when the draft ran as
  a graph with a sampler, rebuilds the tree from the static top-K at another budget, and runs the
  eager path otherwise; ``draft_sampler.build`` sizes the sampler for the largest graph batch;
* the verify reuses the draft's KV-slot lookup: checked against SGLang's own
  ``assign_extend_cache_locs_uniform_func`` (what ``eagle_prepare_for_verify`` would compute) and
  ``window_read_extent`` (the read extent of the plan ``ForwardBatch.init_new`` would build), in a
  child process running SGLang's Triton kernels under the interpreter.

The compiled CUDA-graph capture and replay are checked on the H200 by ``e2e/draft_graph_check.py``.
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from tree_testing import run_under_triton_interpreter

from sglang_spec.plugin.config import DDTreeConfig
from sglang_spec.tree import (
    DraftHead,
    StaticAllGather,
    StaticDraftTree,
    VocabShard,
    build_ddtree_from_topk,
    draft_topk,
    draft_tree,
)
from sglang_spec.tree.topk import gathered_shape

V, H, BLOCK, K, BUDGET, MAX_BS = 50, 12, 5, 6, 9, 4
TREE_FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes")


def _inputs(bs, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs * BLOCK, H, generator=g)
    input_ids = torch.randint(0, V, (bs * BLOCK,), generator=g)
    return hidden, input_ids


def _assert_same(got, want):
    (logq, ids, tree), (w_logq, w_ids, w_tree) = got, want
    assert torch.equal(logq, w_logq) and torch.equal(ids, w_ids)
    for f in TREE_FIELDS:
        assert torch.equal(getattr(tree, f), getattr(w_tree, f)), f
    assert tree.horizon == w_tree.horizon == BLOCK - 1


def _eager(hidden, input_ids, head, budget=BUDGET, k=K):
    bs = hidden.shape[0] // BLOCK
    return draft_tree(
        hidden.view(bs, BLOCK, -1),
        input_ids.view(bs, BLOCK)[:, 0],
        head,
        k=k,
        temperature=0.75,
        budget=budget,
    )


def _sampler(head, smaller_budgets=()):
    return StaticDraftTree(
        head,
        block_size=BLOCK,
        k=K,
        temperature=0.75,
        budget=BUDGET,
        max_bs=MAX_BS,
        smaller_budgets=smaller_budgets,
    )


@pytest.mark.parametrize("bs", [1, 2, 3, 4])
def test_one_rank_sampler_equals_the_eager_path(bs):
    torch.manual_seed(bs)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    sampler = _sampler(head)
    hidden, input_ids = _inputs(bs, seed=bs)
    sampler(hidden, input_ids)
    got = sampler.outputs(bs)
    _assert_same(got, _eager(hidden, input_ids, head))
    # the drafter's marginals are block rows 1..B-1; the bonus token is the root
    block = hidden.view(bs, BLOCK, H)
    logq, ids = draft_topk(block[:, 1:] @ head.weight.T, K, 0.75)
    roots = input_ids.view(bs, BLOCK)[:, 0]
    _assert_same(got, (logq, ids, build_ddtree_from_topk(logq, ids, BUDGET, roots)))


class _TwoRanks:
    """Two simulated ranks of a vocabulary-parallel head: each rank's all_gather_into_tensor
    returns what both ranks pass at the same call, recorded by a first pass of both ranks."""

    def __init__(self, weight):
        half = V // 2
        self.weights = [weight[:half], weight[half:]]
        self.shards = [VocabShard(0, half, half), VocabShard(half, V - half, V - half)]
        self.sent = [[], []]
        self.recording = True

    def gather_into(self, rank):
        calls = iter(range(10**6))

        def gather_into(out, inp):
            if self.recording:
                self.sent[rank].append(inp.clone())
                out.copy_(torch.cat([inp, inp]))
            else:
                i = next(calls)
                assert torch.equal(inp, self.sent[rank][i])
                out.copy_(torch.cat([self.sent[0][i], self.sent[1][i]]))

        return gather_into

    def head(self, rank, capacity):
        gather = StaticAllGather(self.gather_into(rank), 2, capacity, device="cpu")
        return DraftHead(self.weights[rank], self.shards[rank], gather)


@pytest.mark.parametrize("bs", [1, 3, 4])
def test_two_rank_sampler_equals_the_eager_path_and_the_whole_vocabulary(bs):
    """Rank 1 of two: the sampler (static all-gather buffers) and the eager path (fresh
    buffers) see the same collective, give the same bits, and the whole head's top-K ids."""
    torch.manual_seed(10 + bs)
    weight = torch.randn(V, H)
    hidden, input_ids = _inputs(bs, seed=10 + bs)
    capacity = math.prod(gathered_shape(MAX_BS, BLOCK - 1, K))
    ranks = _TwoRanks(weight)
    for r in range(2):  # each rank sends its packed shard top-K once
        _eager(hidden, input_ids, ranks.head(r, 0))
    ranks.recording = False
    sampler = _sampler(ranks.head(1, capacity))
    sampler(hidden, input_ids)
    got = sampler.outputs(bs)
    _assert_same(got, _eager(hidden, input_ids, ranks.head(1, 0)))
    whole = _eager(hidden, input_ids, DraftHead(weight, VocabShard.whole(V)))
    assert torch.equal(got[1], whole[1])
    torch.testing.assert_close(got[0], whole[0], rtol=1e-5, atol=1e-5)


def test_a_call_writes_only_its_batch_rows_and_the_next_call_gives_fresh_results():
    torch.manual_seed(5)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    sampler = _sampler(head)
    bufs = [sampler.logq, sampler.ids, *(getattr(sampler.trees[BUDGET], f) for f in TREE_FIELDS)]
    for b in bufs:
        b.fill_(-7)
    first = _inputs(2, seed=1)
    sampler(*first)
    for b in bufs:  # a replay at bs 2 of a graph captured for MAX_BS rows
        assert (b[2:] == -7).all() and not (b[:2] == -7).all()
    _assert_same(sampler.outputs(2), _eager(*first, head))
    second = _inputs(3, seed=2)
    sampler(*second)
    want = _eager(*second, head)
    _assert_same(sampler.outputs(3), want)
    assert not torch.equal(want[2].tokens[:2], _eager(*first, head)[2].tokens)


def test_sampler_refuses_bad_sizes():
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    with pytest.raises(ValueError, match="block_size >= 2.*got block_size=1, k=6"):
        StaticDraftTree(head, block_size=1, k=6, temperature=1.0, budget=3, max_bs=2)
    with pytest.raises(
        ValueError, match=r"smaller_budgets must lie in \[1, budget=3\); got \[3, 0\]"
    ):
        StaticDraftTree(
            head, block_size=4, k=6, temperature=1.0, budget=3, max_bs=2, smaller_budgets=(2, 3, 0)
        )


# ------------------------------------------------------------------ the worker's side


def _worker(sampler, config, lm_head):
    from sglang_spec.plugin.worker import DDTreeWorker

    worker = object.__new__(DDTreeWorker)
    worker.config = config
    worker._draft_sampler = sampler  # what DFlashWorkerV2.init_cuda_graphs keeps
    worker.head_group = SimpleNamespace(world_size=1)
    worker.draft_parallel_layout = SimpleNamespace(tp_group=None)  # no draft TP scope
    worker._target_worker = SimpleNamespace(  # BaseSpecWorker.target_worker's storage
        model_runner=SimpleNamespace(model=SimpleNamespace(lm_head=lm_head))
    )
    return worker


SERVER = DDTreeConfig(
    block_size=BLOCK, verify_width=BUDGET + 1, topk_per_depth=K, tree_temperature=0.75
)


def test_step_tree_reads_the_static_outputs_only_after_a_graph_replay():
    """The sampler holds the tree of the graph's inputs X; the step's hidden states are Y. A
    graph replay (with a sampler) gives X's tree as the static buffers' views, at another budget
    X's tree rebuilt from the static top-K; an eager draft, or a graph without a sampler, Y's."""
    from sglang_spec.plugin import draft_sampler

    torch.manual_seed(7)
    lm_head = SimpleNamespace(weight=torch.randn(V, H))
    head = DraftHead(lm_head.weight, VocabShard.whole(V))
    sampler = _sampler(head)
    bs = 3
    x, x_ids = _inputs(bs, seed=3)
    y, _ = _inputs(bs, seed=4)
    sampler(x, x_ids)
    roots = x_ids.view(bs, BLOCK)[:, 0]
    hidden_y = y.view(bs, BLOCK, H)
    worker = _worker(sampler, SERVER, lm_head)

    tree = draft_sampler.step_tree(worker, hidden_y, roots, ran_as_graph=True)
    _assert_same((sampler.logq[:bs], sampler.ids[:bs], tree), _eager(x, x_ids, head))
    assert tree.tokens.data_ptr() == sampler.trees[BUDGET].tokens.data_ptr()  # no copy

    y_ids = torch.cat([roots[:, None], x_ids.view(bs, BLOCK)[:, 1:]], 1).reshape(-1)
    eager_y = _eager(y, y_ids, head)[2]
    for ran, s in [(False, sampler), (True, None)]:
        worker._draft_sampler = s
        tree = draft_sampler.step_tree(worker, hidden_y, roots, ran_as_graph=ran)
        for f in TREE_FIELDS:
            assert torch.equal(getattr(tree, f), getattr(eager_y, f)), (ran, f)

    # --speculative-adaptive: every candidate's tree comes from the graph (its K = exact_topk
    # ranks of the server's top-K give the same tree), read without a copy or a rebuild
    # (L = 4: 5 is sliced from the server's 9, 3 is built, 2 is sliced from 3)
    sampler = _sampler(head, smaller_budgets=(5, 3, 2))
    sampler(x, x_ids)
    worker._draft_sampler = sampler
    for budget in (2, 3, 5):
        worker.config = SERVER.for_budget(budget)
        tree = draft_sampler.step_tree(worker, hidden_y, roots, ran_as_graph=True)
        want = _eager(x, x_ids, head, budget=budget, k=min(K, budget))[2]
        assert tree.width == budget + 1
        assert tree.tokens.data_ptr() == sampler.trees[budget].tokens.data_ptr()
        for f in TREE_FIELDS:
            assert torch.equal(getattr(tree, f), getattr(want, f)), (budget, f)


def test_smaller_budgets_trees_follow_each_call_and_the_server_tree_is_unchanged():
    """A second call at another batch size rewrites every budget's rows from its own inputs; the
    server budget's tree is the one a sampler without smaller budgets builds."""
    torch.manual_seed(11)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    sampler, plain = _sampler(head, smaller_budgets=(4,)), _sampler(head)
    assert sorted(sampler.trees) == [4, BUDGET]
    for bs, seed in [(2, 1), (3, 2)]:
        hidden, input_ids = _inputs(bs, seed=seed)
        sampler(hidden, input_ids)
        plain(hidden, input_ids)
        _assert_same(sampler.outputs(bs), plain.outputs(bs))
        got, want = sampler.outputs(bs, 4)[2], _eager(hidden, input_ids, head, budget=4, k=4)[2]
        assert got.width == 5 and got.batch_size == bs
        for f in TREE_FIELDS:
            assert torch.equal(getattr(got, f), getattr(want, f)), (bs, f)


def test_step_tree_without_a_dense_head_says_so():
    from sglang_spec.plugin import draft_sampler

    worker = _worker(None, SERVER, lm_head=SimpleNamespace())
    with pytest.raises(RuntimeError, match="dense target lm_head"):
        draft_sampler.step_tree(worker, torch.zeros(1, BLOCK, H), torch.zeros(1), False)


def test_build_sizes_the_sampler_for_the_largest_graph_batch(monkeypatch):
    from sglang_spec.plugin import adapter, draft_sampler

    class Group:
        world_size = 2

        def all_gather_into_tensor(self, *_):
            raise AssertionError("not called at build time")

    shard = SimpleNamespace(
        org_vocab_start_index=25,
        num_org_elements=25,
        num_org_elements_padded=25,
        added_vocab_start_index=0,
        num_added_elements=0,
    )
    lm_head = SimpleNamespace(weight=torch.randn(25, H), shard_indices=shard)
    worker = _worker(None, SERVER, lm_head)
    worker.head_group = Group()
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2, 8, 4])
    sampler = draft_sampler.build(worker)
    assert (sampler.block_size, sampler.k, sampler.budget, sampler.temperature) == (
        BLOCK,
        K,
        BUDGET,
        0.75,
    )
    assert list(sampler.trees) == [BUDGET]
    assert sampler.trees[BUDGET].tokens.shape == (8, BUDGET + 1)
    assert sampler.logq.shape == (8, BLOCK - 1, K)
    assert sampler.head.shard == VocabShard(25, 25, 25)
    gather = sampler.head.all_gather
    assert gather.local.numel() == 8 * (BLOCK - 1) * (2 * K + 1) and gather.world == 2
    worker.budgets, worker.budget_configs = object(), {3: None, BUDGET: None, 5: None}
    assert sorted(draft_sampler.build(worker).trees) == [3, 5, BUDGET]  # every candidate's tree
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: None)
    assert draft_sampler.build(worker) is None
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2])
    assert draft_sampler.build(_worker(None, SERVER, lm_head=SimpleNamespace())) is None


# -------------------------------------------------- item 3: the verify's KV slots


def check_verify_reuses_the_draft_lookup() -> None:
    """Run in a child process with TRITON_INTERPRET=1: SGLang's cache-location kernels on CPU
    tensors (the Triton path its wrappers take on CUDA)."""
    import sglang.kernels.ops.speculative.cache_locs as cache_locs
    from sglang.srt.mem_cache.kv_loc_plan import window_read_extent
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_spec.plugin.worker import draft_window, verify_write_locs

    cache_locs._is_cuda = True
    g = torch.Generator().manual_seed(0)
    req_to_token = torch.randperm(6 * 200, generator=g).view(6, 200).to(torch.int32)
    block = 16
    for bs, width in itertools.product([1, 3], [4, 16, 64]):
        pool = torch.randperm(6, generator=g)[:bs]
        prefix = torch.randint(0, 100, (bs,), generator=g)
        window = draft_window(pool, req_to_token, prefix, torch.arange(max(block, width)))
        assert window.dtype == torch.int64 and window.shape == (bs, max(block, width))
        plan = SimpleNamespace(write_virtual=window[:, :block].reshape(-1), read_extent=block)
        locs, verify_plan = verify_write_locs(window, plan, block, width)
        want = cache_locs.assign_extend_cache_locs_uniform_func(
            req_pool_indices=pool,
            req_to_token=req_to_token,
            start_offset=prefix,
            batch_size=bs,
            draft_token_num=width,
            device="cpu",
        )
        assert torch.equal(locs, want), (bs, width)
        if width == block:  # the draft's plan: what init_new would plan for this verify
            assert verify_plan is plan and locs is plan.write_virtual
            spec = SimpleNamespace(draft_token_num=width)
            extent = window_read_extent(ForwardMode.TARGET_VERIFY, spec, locs, bs)
            assert plan.read_extent == extent
        else:
            assert verify_plan is None


def test_verify_reuses_the_draft_lookup_under_the_triton_interpreter():
    run_under_triton_interpreter(
        "test_draft_sampler", "check_verify_reuses_the_draft_lookup", "VERIFY_LOCS_OK"
    )
