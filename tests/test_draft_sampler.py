"""The DDTREE draft sampler (issue 13 items 2 and 3, issue 15's budget-by-batch-size cost), on the CPU.

* :func:`sglang_spec.tree.draft_tree` puts only the depths a tree of ``budget`` nodes reaches
  through the head (rows past ``min(budget, L)`` are never read) and gives the tree of all L
  depths;
* :class:`sglang_spec.tree.StagedDraftBlock` (the drafter graph's tail) and
  :class:`sglang_spec.tree.StaticDraftTree` (what each head graph runs) give exactly what the eager
  path gives, on one rank and on two simulated ranks, write only the first ``bs`` rows of their
  static buffers, and a second call with other inputs gives fresh results;
* :class:`sglang_spec.tree.DraftTreeGraphs` captures one graph per (budget, batch size), largest
  first, two warm-ups before each, and a step replays the graph of its budget at its padded batch
  size (checked with a stand-in for ``torch.cuda``'s graphs);
* ``draft_sampler.step_tree`` (``topk_stage``) takes the graphs' tree of the step's budget only
  when the draft ran as a graph with a sampler, and runs the eager path otherwise;
  ``draft_sampler.build`` sizes the sampler for the largest graph batch and gives each candidate
  budget its own K;
* the verify reuses the draft's KV-slot lookup: checked against SGLang's own
  ``assign_extend_cache_locs_uniform_func`` (what ``eagle_prepare_for_verify`` would compute) and
  ``window_read_extent`` (the read extent of the plan ``ForwardBatch.init_new`` would build), in a
  child process running SGLang's Triton kernels under the interpreter.

The compiled CUDA-graph capture and replay are checked on the H200 by ``e2e/draft_graph_check.py``.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from tree_testing import run_under_triton_interpreter

from sglang_spec.plugin.config import DDTreeConfig
from sglang_spec.tree import (
    DraftHead,
    DraftTreeGraphs,
    StagedDraftBlock,
    StaticAllGather,
    StaticDraftTree,
    VocabShard,
    build_ddtree_from_topk,
    draft_topk,
    draft_tree,
)
from sglang_spec.tree.topk import gathered_shape

V, H, BLOCK, K, BUDGET, MAX_BS = 50, 12, 5, 6, 9, 4
L = BLOCK - 1
TREE_FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes")


def _inputs(bs, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bs * BLOCK, H, generator=g)
    input_ids = torch.randint(0, V, (bs * BLOCK,), generator=g)
    return hidden, input_ids


def _assert_same_tree(tree, want):
    for f in TREE_FIELDS:
        assert torch.equal(getattr(tree, f), getattr(want, f)), f
    assert tree.horizon == want.horizon == L


def _eager(hidden, input_ids, head, budget=BUDGET, k=K):
    bs = hidden.shape[0] // BLOCK
    return draft_tree(
        hidden.view(bs, BLOCK, -1),
        input_ids.view(bs, BLOCK)[:, 0],
        head,
        k=k,
        temperature=0.75,
        budget=budget,
    )[2]


def _staged(dtype=torch.float32):
    return StagedDraftBlock(
        max_bs=MAX_BS, block_size=BLOCK, hidden_size=H, dtype=dtype, device="cpu"
    )


def _static(head, budget=BUDGET, k=K):
    return StaticDraftTree(head, horizon=L, k=k, temperature=0.75, budget=budget, max_bs=MAX_BS)


def _run_static(tree, hidden, input_ids):
    """What a head graph does: the staged block through one budget's tree."""
    staged = _staged(hidden.dtype)
    staged(hidden, input_ids)
    bs = hidden.shape[0] // BLOCK
    tree(staged.hidden[:bs], staged.roots[:bs])
    return tree.outputs(bs)


@pytest.mark.parametrize("bs, budget", [(1, BUDGET), (2, BUDGET), (3, 2), (4, 3), (4, 1)])
def test_one_rank_static_tree_equals_the_eager_path_and_all_depths(bs, budget):
    torch.manual_seed(bs)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    hidden, input_ids = _inputs(bs, seed=bs)
    got = _run_static(_static(head, budget), hidden, input_ids)
    _assert_same_tree(got, _eager(hidden, input_ids, head, budget))
    # the drafter's marginals are block rows 1..B-1 (all L of them here); the bonus token is the
    # root
    block = hidden.view(bs, BLOCK, H)
    logq, ids = draft_topk(block[:, 1:] @ head.weight.T, K, 0.75)
    roots = input_ids.view(bs, BLOCK)[:, 0]
    _assert_same_tree(got, build_ddtree_from_topk(logq, ids, budget, roots))


@pytest.mark.parametrize("budget", [1, 2, 3])
def test_the_head_reads_only_the_depths_the_budget_reaches(budget):
    """Block rows past min(budget, L) never reach the head: NaN there changes nothing (on the CPU
    NaN log-probs raise, so a head over every row would fail here), and at budget L they do."""
    torch.manual_seed(20 + budget)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    hidden, input_ids = _inputs(3, seed=budget)
    poisoned = hidden.clone().view(3, BLOCK, H)
    poisoned[:, 1 + budget :] = float("nan")
    poisoned = poisoned.view(-1, H)
    want = _eager(hidden, input_ids, head, budget)
    _assert_same_tree(_eager(poisoned, input_ids, head, budget), want)
    with pytest.raises(ValueError, match="NaN"):
        _eager(poisoned, input_ids, head, budget=L)


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


@pytest.mark.parametrize("bs, budget", [(1, BUDGET), (3, BUDGET), (4, BUDGET), (3, 2)])
def test_two_rank_static_tree_equals_the_eager_path_and_the_whole_vocabulary(bs, budget):
    """Rank 1 of two: the static tree (static all-gather buffers) and the eager path (fresh
    buffers) see the same collective, give the same bits, and the whole head's tree."""
    torch.manual_seed(10 + bs)
    weight = torch.randn(V, H)
    hidden, input_ids = _inputs(bs, seed=10 + bs)
    capacity = math.prod(gathered_shape(MAX_BS, L, K))
    ranks = _TwoRanks(weight)
    for r in range(2):  # each rank sends its packed shard top-K once
        _eager(hidden, input_ids, ranks.head(r, 0), budget)
    ranks.recording = False
    got = _run_static(_static(ranks.head(1, capacity), budget), hidden, input_ids)
    _assert_same_tree(got, _eager(hidden, input_ids, ranks.head(1, 0), budget))
    whole = _eager(hidden, input_ids, DraftHead(weight, VocabShard.whole(V)), budget)
    assert torch.equal(got.tokens, whole.tokens) and torch.equal(got.parents, whole.parents)
    torch.testing.assert_close(got.scores, whole.scores, rtol=1e-5, atol=1e-5)


def test_a_call_writes_only_its_batch_rows_and_the_next_call_gives_fresh_results():
    torch.manual_seed(5)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    staged, tree = _staged(), _static(head)
    bufs = [staged.hidden, staged.roots, *(getattr(tree.tree, f) for f in TREE_FIELDS)]
    for b in bufs:
        b.fill_(-7)
    first = _inputs(2, seed=1)
    staged(*first)
    tree(staged.hidden[:2], staged.roots[:2])
    for b in bufs:  # a replay at bs 2 of graphs captured for MAX_BS rows
        assert (b[2:] == -7).all() and not (b[:2] == -7).all()
    _assert_same_tree(tree.outputs(2), _eager(*first, head))
    second = _inputs(3, seed=2)
    staged(*second)
    tree(staged.hidden[:3], staged.roots[:3])
    want = _eager(*second, head)
    _assert_same_tree(tree.outputs(3), want)
    assert not torch.equal(want.tokens[:2], _eager(*first, head).tokens)


def test_bad_sizes_are_refused():
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    with pytest.raises(ValueError, match="block_size >= 2.*got block_size=1, max_bs=2"):
        StagedDraftBlock(max_bs=2, block_size=1, hidden_size=H, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="horizon, k, budget and max_bs >= 1; got horizon=4, k=0"):
        StaticDraftTree(head, horizon=4, k=0, temperature=1.0, budget=3, max_bs=2)
    with pytest.raises(ValueError, match=r"within the staged block's 4 rows; got budgets \[9\], "):
        DraftTreeGraphs(_staged(), {BUDGET: _static(head)}, [1, 8])
    with pytest.raises(ValueError, match="got budgets \\[\\], batch sizes \\[1\\]"):
        DraftTreeGraphs(_staged(), {}, [1])


# ------------------------------------------------------- the per-budget graphs


def _graphs(head, budgets=(2, 3, BUDGET), graph_bs=(1, 2, 4)):
    """The adaptive server's sampler: each budget with its exact K (DDTreeConfig.for_budget)."""
    trees = {b: _static(head, b, SERVER.for_budget(b).topk_per_depth) for b in budgets}
    return DraftTreeGraphs(_staged(), trees, list(graph_bs))


def test_every_budget_reads_its_own_tree_of_the_staged_block():
    torch.manual_seed(3)
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    graphs = _graphs(head)
    assert [graphs.padded_bs(b) for b in (1, 2, 3, 4)] == [1, 2, 4, 4]
    with pytest.raises(ValueError, match="batch size 5 exceeds the largest captured one, 4"):
        graphs.padded_bs(5)
    for bs, seed in [(3, 1), (2, 2)]:
        hidden, input_ids = _inputs(bs, seed)
        graphs(hidden, input_ids)  # the drafter graph's tail
        for budget in (2, 3, BUDGET):
            k = SERVER.for_budget(budget).topk_per_depth
            got = graphs.tree(bs, budget)
            assert got.width == budget + 1 and got.batch_size == bs
            assert got.tokens.data_ptr() == graphs.trees[budget].tree.tokens.data_ptr()
            _assert_same_tree(got, _eager(hidden, input_ids, head, budget, k))


class _FakeGraphs:
    """Stands in for torch.cuda's CUDAGraph, graph() and synchronize(): records each capture's
    (budget, batch size) and each replay."""

    def __init__(self, monkeypatch, graphs):
        self.runs, self.captured, self.replays, self.capturing = [], [], [], None
        fake = self

        class Graph:
            def replay(self):
                fake.replays.append(self.key)

        @contextlib.contextmanager
        def graph(g, pool=None, stream=None):
            assert (pool, stream) == ("pool", "stream")
            fake.capturing = g
            yield
            fake.capturing = None

        real_run = graphs._run

        def run(budget, bs):
            if self.capturing is not None:
                self.capturing.key = (budget, bs)
                self.captured.append((budget, bs))
            else:
                self.runs.append((budget, bs))
            real_run(budget, bs)

        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
        monkeypatch.setattr(graphs, "_run", run)

    @staticmethod
    @contextlib.contextmanager
    def scope():
        yield "stream", "pool"


def test_capture_takes_every_budget_and_batch_size_largest_first_and_steps_replay_them(
    monkeypatch,
):
    head = DraftHead(torch.randn(V, H), VocabShard.whole(V))
    graphs = _graphs(head)
    fake = _FakeGraphs(monkeypatch, graphs)
    graphs.capture(fake.scope)
    order = [(b, bs) for b in (BUDGET, 3, 2) for bs in (4, 2, 1)]
    assert fake.captured == order and sorted(graphs.graphs) == sorted(order)
    assert fake.runs == [key for key in order for _ in range(2)]  # two warm-ups before each
    fake.runs.clear()
    for bs, budget in [(3, 2), (1, BUDGET), (4, 3)]:
        graphs.tree(bs, budget)
    assert fake.replays == [(2, 4), (BUDGET, 1), (3, 4)] and fake.runs == []


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


def test_step_tree_reads_the_graphs_tree_only_after_a_graph_replay():
    """The drafter's graph staged block X; the step's hidden states are Y. A graph replay (with a
    sampler) gives X's tree at the step's budget from that budget's graph; an eager draft, or a
    graph without a sampler, Y's."""
    from sglang_spec.plugin import draft_sampler

    torch.manual_seed(7)
    lm_head = SimpleNamespace(weight=torch.randn(V, H))
    head = DraftHead(lm_head.weight, VocabShard.whole(V))
    sampler = _graphs(head)
    bs = 3
    x, x_ids = _inputs(bs, seed=3)
    y, _ = _inputs(bs, seed=4)
    sampler(x, x_ids)
    roots = x_ids.view(bs, BLOCK)[:, 0]
    hidden_y = y.view(bs, BLOCK, H)
    worker = _worker(sampler, SERVER, lm_head)
    for budget in (2, 3, BUDGET):
        worker.config = SERVER.for_budget(budget)
        tree = draft_sampler.step_tree(worker, hidden_y, roots, ran_as_graph=True)
        assert tree.tokens.data_ptr() == sampler.trees[budget].tree.tokens.data_ptr()  # no copy
        _assert_same_tree(tree, _eager(x, x_ids, head, budget, worker.config.topk_per_depth))

    worker.config = SERVER
    y_ids = torch.cat([roots[:, None], x_ids.view(bs, BLOCK)[:, 1:]], 1).reshape(-1)
    eager_y = _eager(y, y_ids, head)
    for ran, s in [(False, sampler), (True, None)]:
        worker._draft_sampler = s
        _assert_same_tree(
            draft_sampler.step_tree(worker, hidden_y, roots, ran_as_graph=ran), eager_y
        )


def test_step_tree_without_a_dense_head_says_so():
    from sglang_spec.plugin import draft_sampler

    worker = _worker(None, SERVER, lm_head=SimpleNamespace())
    with pytest.raises(RuntimeError, match="dense target lm_head"):
        draft_sampler.step_tree(worker, torch.zeros(1, BLOCK, H), torch.zeros(1), False)


def test_build_sizes_the_sampler_for_the_largest_graph_batch_and_each_budget(monkeypatch):
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
    assert sampler.graph_bs == [1, 2, 4, 8] and list(sampler.trees) == [BUDGET]
    tree = sampler.trees[BUDGET]
    assert (tree.k, tree.budget, tree.temperature) == (K, BUDGET, 0.75)
    assert tree.tree.tokens.shape == (8, BUDGET + 1) and tree.tree.horizon == L
    assert sampler.staged.hidden.shape == (8, BLOCK, H) and sampler.staged.roots.shape == (8,)
    assert tree.head.shard == VocabShard(25, 25, 25)
    gather = tree.head.all_gather
    assert gather.local.numel() == 8 * L * (2 * K + 1) and gather.world == 2
    # budget by batch size: every candidate's tree at its own K, one head and gather buffer
    # sized for the largest (budget 2: 2 depths at K 2; budget 3: 3 at 3; 9: 4 at 6)
    configs = {b: SERVER.for_budget(b) for b in (2, 3, BUDGET)}
    worker.budgets, worker.budget_configs = object(), configs
    sampler = draft_sampler.build(worker)
    assert {b: t.k for b, t in sampler.trees.items()} == {2: 2, 3: 3, BUDGET: K}
    heads = {id(t.head) for t in sampler.trees.values()}
    assert len(heads) == 1
    assert sampler.trees[2].head.all_gather.local.numel() == 8 * L * (2 * K + 1)
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: None)
    assert draft_sampler.build(worker) is None
    monkeypatch.setattr(adapter, "decode_cuda_graph_bs", lambda: [1, 2])
    assert draft_sampler.build(_worker(None, SERVER, lm_head=SimpleNamespace())) is None


def test_capture_runs_only_with_a_sampler_on_cuda(monkeypatch):
    from sglang_spec.plugin import adapter, draft_sampler

    scopes = []
    fake = SimpleNamespace(
        staged=SimpleNamespace(hidden=SimpleNamespace(device=torch.device("cuda"))),
        capture=scopes.append,
        graphs={},
        trees={
            7: SimpleNamespace(tree=SimpleNamespace(horizon=15), k=7, head=DraftHead(None, None))
        },
        graph_bs=[1],
    )
    monkeypatch.setattr(draft_sampler.logger, "info", lambda *_: None)
    draft_sampler.capture(_worker(fake, SERVER, None))
    assert scopes == [adapter.graph_capture_scope]
    draft_sampler.capture(_worker(None, SERVER, None))  # no sampler: nothing
    fake.staged.hidden.device = torch.device("cpu")
    draft_sampler.capture(_worker(fake, SERVER, None))  # off CUDA: nothing
    assert scopes == [adapter.graph_capture_scope]


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
