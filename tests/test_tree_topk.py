"""`sglang_spec.tree.topk`: the per-depth top-K through a vocabulary-parallel LM head.

Tensor parallelism is simulated in one process: every rank runs `sharded_topk` on its slice of the
head, with an all-gather that hands back what all ranks passed at the same call.
"""

from __future__ import annotations

import pytest
import torch

from sglang_spec.tree import VocabShard, draft_topk, shard_logits, sharded_topk
from sglang_spec.tree.topk import GATHER_DTYPE, StaticAllGather, gathered_shape

PAD = 1e4  # padding rows hold large garbage: scoring them would change every top-k


def _reference(hidden, weight, k, temperature=1.0):
    """Top-k of the full-vocabulary log_softmax, ordered by (log-prob desc, id asc)."""
    logq = torch.log_softmax((hidden @ weight.T).float() / temperature, dim=-1)
    ids = torch.arange(weight.shape[0]).expand_as(logq)
    # stable sort by id, then by value: ties keep the lower id first
    vals, perm = logq.sort(dim=-1, descending=True, stable=True)
    return vals[..., :k], ids.gather(-1, perm)[..., :k]


def _shard(weight, num_org, tp, added=0, pad_to=None):
    """Split a head of ``num_org`` original + ``added`` rows over ``tp`` ranks, SGLang-style:
    each rank holds its original rows padded to ``pad_to``, then its added rows."""
    org_per, add_per = -(-num_org // tp), -(-added // tp) if added else 0
    pad_to = pad_to or org_per + 1
    shards, weights = [], []
    for r in range(tp):
        o0, o1 = r * org_per, min(num_org, (r + 1) * org_per)
        a0, a1 = num_org + r * add_per, min(num_org + added, num_org + (r + 1) * add_per)
        w = torch.full((pad_to + (a1 - a0), weight.shape[1]), PAD)
        w[: o1 - o0] = weight[o0:o1]
        w[pad_to : pad_to + a1 - a0] = weight[a0:a1]
        weights.append(w)
        shards.append(VocabShard(o0, o1 - o0, pad_to, added_start=a0, num_added=a1 - a0))
    return weights, shards


def _run_tp(hidden, weights, shards, k, temperature=1.0, static_capacity=None):
    """Every rank's result, with an all-gather that stacks what all ranks passed at that call
    (through a :class:`StaticAllGather` of ``static_capacity`` elements when given)."""
    world = len(shards)
    sent = [[] for _ in range(world)]

    def recorder(rank):
        def gather(t):
            sent[rank].append(t.clone())
            return torch.stack([t] * world)

        return wrap(gather)

    def wrap(gather):
        if static_capacity is None:
            return gather

        def gather_into(out, inp):
            out.copy_(gather(inp).reshape(-1))

        return StaticAllGather(gather_into, world, static_capacity, device="cpu")

    for r in range(world):
        sharded_topk(
            hidden, weights[r], shards[r], k, temperature=temperature, all_gather=recorder(r)
        )

    def replay(rank):
        calls = iter(range(len(sent[rank])))

        def gather(t):
            i = next(calls)
            assert torch.equal(t, sent[rank][i])
            return torch.stack([sent[q][i] for q in range(world)])

        return wrap(gather)

    outs = [
        sharded_topk(
            hidden, weights[r], shards[r], k, temperature=temperature, all_gather=replay(r)
        )
        for r in range(world)
    ]
    return outs


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_one_rank_is_draft_topk(temperature):
    torch.manual_seed(0)
    V, H, bs, L, k = 40, 16, 2, 5, 6
    w, hid = torch.randn(V, H), torch.randn(bs, L, H)
    logq, ids = sharded_topk(hid, w, VocabShard.whole(V), k, temperature=temperature)
    ref_logq, ref_ids = draft_topk(hid @ w.T, k, temperature)
    assert torch.equal(logq, ref_logq) and torch.equal(ids, ref_ids)
    exp_logq, exp_ids = _reference(hid, w, k, temperature)
    torch.testing.assert_close(logq, exp_logq, rtol=1e-5, atol=1e-5)
    assert torch.equal(ids, exp_ids)


@pytest.mark.parametrize("tp,added", [(2, 0), (3, 0), (2, 4), (3, 5)])
@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_shards_merge_to_the_full_vocabulary(tp, added, temperature):
    torch.manual_seed(tp * 10 + added)
    num_org, H, bs, L, k = 30, 16, 2, 4, 7
    w = torch.randn(num_org + added, H)
    hid = torch.randn(bs, L, H)
    weights, shards = _shard(w, num_org, tp, added)
    exp_logq, exp_ids = _reference(hid, w, k, temperature)
    for logq, ids in _run_tp(hid, weights, shards, k, temperature):
        torch.testing.assert_close(logq, exp_logq, rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, exp_ids)


def test_shard_smaller_than_k_pads_and_still_merges():
    torch.manual_seed(3)
    num_org, H, bs, L, k = 9, 8, 2, 3, 7  # 3 ranks of 3 real rows each, k = 7 > 3
    w, hid = torch.randn(num_org, H), torch.randn(bs, L, H)
    weights, shards = _shard(w, num_org, tp=3)
    exp_logq, exp_ids = _reference(hid, w, k)
    for logq, ids in _run_tp(hid, weights, shards, k):
        assert logq.shape == ids.shape == (bs, L, k)
        torch.testing.assert_close(logq, exp_logq, rtol=1e-5, atol=1e-5)
        assert torch.equal(ids, exp_ids)


def test_all_gathers_carry_k_entries_per_row_never_the_vocabulary():
    torch.manual_seed(4)
    num_org, H, bs, L, k = 64, 8, 2, 3, 5
    weights, shards = _shard(torch.randn(num_org, H), num_org, tp=2)
    shapes = []

    def gather(t):
        shapes.append(tuple(t.shape))
        return torch.stack([t, t])

    sharded_topk(torch.randn(bs, L, H), weights[0], shards[0], k, all_gather=gather)
    # one collective per call: k values, k ids and the log-sum-exp of each row
    assert shapes == [(bs, L, 2 * k + 1)] == [gathered_shape(bs, L, k)]


def test_shard_logits_drops_padding_and_maps_global_ids():
    torch.manual_seed(5)
    w = torch.randn(10, 4)
    weights, shards = _shard(w, num_org=6, tp=2, added=4, pad_to=4)
    hid = torch.randn(3, 4)
    logits, ids = shard_logits(hid, weights[1], shards[1])
    assert ids.tolist() == [3, 4, 5, 8, 9]
    torch.testing.assert_close(logits, hid @ w[[3, 4, 5, 8, 9]].T)


def _stacking_group(world, calls):
    """all_gather_into_tensor of ``world`` simulated ranks: rank r's input is this rank's + r."""

    def gather_into(out, inp):
        calls.append((out.data_ptr(), inp.data_ptr(), inp.numel()))
        out.copy_(torch.cat([inp + r for r in range(world)]))

    return gather_into


def test_static_all_gather_reuses_its_buffers_up_to_capacity():
    calls = []
    gather = StaticAllGather(_stacking_group(2, calls), world=2, capacity=12, device="cpu")
    for shape in [(2, 3, 2), (1, 2, 3), (2, 3, 2)]:  # fits: the fixed buffers, sliced
        t = torch.randn(shape, dtype=GATHER_DTYPE)
        got = gather(t)
        assert torch.equal(got, torch.stack([t, t + 1]))
        assert got.data_ptr() == gather.out.data_ptr() and calls[-1][:2] == (
            gather.out.data_ptr(),
            gather.local.data_ptr(),
        )
    big = torch.randn(13, dtype=GATHER_DTYPE)  # beyond capacity: fresh buffers, same result
    assert torch.equal(gather(big), torch.stack([big, big + 1]))
    assert gather.out.data_ptr() not in calls[-1][:2] and calls[-1][2] == 13


def test_sharded_topk_through_static_all_gathers_merges_to_the_full_vocabulary():
    torch.manual_seed(6)
    num_org, H, bs, L, k = 30, 16, 3, 4, 5
    w, hid = torch.randn(num_org, H), torch.randn(bs, L, H)
    weights, shards = _shard(w, num_org, tp=2)
    exp_logq, exp_ids = _reference(hid, w, k)
    for capacity in (bs * L * (2 * k + 1), 0):  # the fixed buffers, and fresh ones
        for logq, ids in _run_tp(hid, weights, shards, k, static_capacity=capacity):
            torch.testing.assert_close(logq, exp_logq, rtol=1e-5, atol=1e-5)
            assert torch.equal(ids, exp_ids)


# ----------------------------------------------------------------------------------------
# the Triton top-K and log-sum-exp (CUDA's path of top_logits)
# ----------------------------------------------------------------------------------------


def _top_logits_cases():
    """(logits [R, V], k, temperature, tile width): tiles of fewer than k columns, a partial last
    tile, exact ties across tiles, -inf tokens and a row of them, bf16 logits, rows of more tiles
    than k (where the tiles below the k-th largest tile max are skipped), k = 1 and k = 241."""
    g = torch.Generator().manual_seed(7)
    ties = torch.randint(-2, 2, (4, 37), generator=g).float()
    ties[1] = 0.25  # one value everywhere: the lowest ids win, across every tile
    neginf = torch.randn(3, 29, generator=g)
    neginf[0, torch.rand(29, generator=g) < 0.7] = float("-inf")
    neginf[2] = float("-inf")  # fewer finite tokens than k, and none
    big = torch.randn(2, 1000, generator=g) * 4
    return [
        (torch.randn(5, 50, generator=g), 6, 1.0, 16),
        (ties, 5, 1.0, 8),
        (ties, 12, 0.5, 8),  # k wider than a tile
        (neginf, 4, 1.0, 8),
        (neginf, 9, 1.0, 16),
        (big.to(torch.bfloat16), 17, 0.75, 128),
        (big, 3, 1e-8, 4096),  # one tile; the tree temperature the 27B runs use
        (torch.randn(1, 5, generator=g), 5, 1.0, 4096),  # k = V
        # more tiles than k: only tiles whose max reaches the k-th largest tile max are searched
        (torch.randn(3, 1000, generator=g) * 4, 7, 1.0, 16),
        (torch.randint(-2, 2, (3, 300), generator=g).float(), 5, 1.0, 8),  # ties at that floor
        ((torch.randn(2, 2000, generator=g) * 3).to(torch.bfloat16), 17, 0.75, 32),
        # k = 1: a chain budget's head (budget = L: exact_topk 1), one tile or many, and ties
        (torch.randn(4, 300, generator=g) * 4, 1, 0.75, 16),
        (ties, 1, 1.0, 8),
        (neginf, 1, 1.0, 4096),
        ((torch.randn(2, 700, generator=g) * 3).to(torch.bfloat16), 1, 1e-8, 64),
        # budget 255's exact K at the tiny pair's horizon (255 - 15 + 1): wider than a tile, and
        # the whole of a one-tile row but 59 tokens
        (torch.randn(2, 300, generator=g) * 4, 241, 0.75, 128),
        (torch.randn(1, 300, generator=g) * 4, 241, 0.75, 4096),
    ]


def check_top_logits_kernel(device: str = "cpu") -> None:
    """The Triton kernels on ``device`` (on the CPU: run under TRITON_INTERPRET=1) against the
    torch path of ``top_logits`` on the CPU: values and ids equal, the log-sum-exp to float32
    rounding. On CUDA, ``python -c "import test_tree_topk as t; t.check_top_logits_kernel('cuda')"``
    from tests/ (only there is the division's rounding the GPU's own)."""
    from sglang_spec.tree.build import top_logits
    from sglang_spec.tree.triton_topk import topk_logsumexp

    for logits, k, temperature, tile in _top_logits_cases():
        case = (tuple(logits.shape), logits.dtype, k, temperature, tile)
        vals, ids, lse = (
            t.cpu() for t in topk_logsumexp(logits.to(device), k, temperature, block_v=tile)
        )
        ref_vals, ref_ids, ref_lse = top_logits(logits, k, temperature)
        assert vals.dtype == torch.float32 and ids.dtype == torch.int64, case
        assert torch.equal(ids, ref_ids), (case, ids, ref_ids)
        assert torch.equal(vals, ref_vals), (case, vals, ref_vals)
        torch.testing.assert_close(lse, ref_lse, rtol=1e-6, atol=1e-6, msg=str(case))


def test_top_logits_kernel_matches_torch_under_interpreter():
    from tree_testing import run_under_triton_interpreter

    run_under_triton_interpreter("test_tree_topk", "check_top_logits_kernel", "OK")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_top_logits_kernel_matches_torch_on_cuda():
    check_top_logits_kernel("cuda")
