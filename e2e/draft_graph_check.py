"""DDTREE's draft sampler inside a CUDA graph equals the eager path, bit for bit, with no host sync (H200).

Run on the GPU machine (torch + Triton; SGLang is not needed)::

    python -m e2e.draft_graph_check

On the 27B target's shapes (hidden 5120, vocabulary 248320, drafter block 16, bf16 LM head of
random weights) it builds :class:`sglang_spec.tree.StaticDraftTree` -- the object DDTREE's
``_maybe_build_draft_sampler`` hands SGLang, which runs it at the end of the drafter's captured
forward -- for budgets 15 and 63 (K per depth = the budget, the plug-in's default), on one rank
and on two simulated ranks (a capturable all-gather that makes up the second rank's shard from this
one's, so the packed all-gather and the TP merge run inside the graph), and for batch sizes 1 and 8:

1. captures it in a ``torch.cuda.CUDAGraph`` (capture itself fails on any host sync);
2. replays the graph on NEW hidden states and input ids and compares its static outputs (per-depth
   log-probs and ids, tree tokens, parents, depths, scores, node counts) bit for bit with
   :func:`sglang_spec.tree.draft_tree` on the same inputs (the eager path ``topk_stage`` runs), and
   checks the replay gives another tree than the capture's inputs did (no stale outputs); the
   smaller candidate budgets of ``--speculative-adaptive`` (7 and 15 below the budget), built in
   the same graph, equal ``build_ddtree_from_topk`` on the eager top-K;
3. runs one replay and one eager call under ``torch.cuda.set_sync_debug_mode("error")``;
4. times both with CUDA events and prints a table; exits 1 if any check fails.

Takes well under a minute on an H200.
"""

from __future__ import annotations

import itertools
import math
import sys

import torch

from sglang_spec.tree import (
    DraftHead,
    StaticAllGather,
    StaticDraftTree,
    VocabShard,
    build_ddtree_from_topk,
    draft_tree,
)
from sglang_spec.tree.topk import gathered_shape

HIDDEN, VOCAB, BLOCK, TEMPERATURE = 5120, 248320, 16, 0.75
BUDGETS, BATCH_SIZES, ITERS = (15, 63), (1, 8), 20
SMALLER_BUDGETS = (7, 15)  # built in the same graph from the same top-K (--speculative-adaptive)


def _two_rank_gather(k: int):
    """``all_gather_into_tensor`` of two simulated ranks, capturable: rank 0 sends this rank's
    packed top-K (values, ids, log-sum-exp), rank 1 the same rows as another shard would (ids
    shifted past the vocabulary, values and log-sum-exp 0.5 lower), so the TP merge in the graph
    merges two distinct lists."""

    def gather_into(out: torch.Tensor, inp: torch.Tensor) -> None:
        ranks = out.view(2, -1, 2 * k + 1)
        ranks.copy_(inp.view(1, -1, 2 * k + 1).expand(2, -1, -1))
        ranks[1, :, :k].sub_(0.5)
        ranks[1, :, k : 2 * k].add_(VOCAB)
        ranks[1, :, 2 * k].sub_(0.5)

    return gather_into


def _head(weight: torch.Tensor, tp: int, k: int, capacity: int) -> DraftHead:
    if tp == 1:
        return DraftHead(weight, VocabShard.whole(VOCAB))
    gather = StaticAllGather(_two_rank_gather(k), 2, capacity, device=weight.device)
    return DraftHead(weight, VocabShard.whole(VOCAB), gather)


def _inputs(bs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    dev = torch.device("cuda")
    hidden = torch.randn(bs * BLOCK, HIDDEN, device=dev, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (bs * BLOCK,), device=dev, generator=gen)
    return hidden, ids


def _eager(hidden, ids, head, bs, budget):
    return draft_tree(
        hidden.view(bs, BLOCK, -1),
        ids.view(bs, BLOCK)[:, 0].clone(),
        head,
        k=budget,
        temperature=TEMPERATURE,
        budget=budget,
    )


def _tree_fields(tree) -> list[torch.Tensor]:
    return [tree.tokens, tree.parents, tree.depths, tree.scores, tree.num_nodes]


def _flat(out) -> list[torch.Tensor]:
    logq, ids, tree = out
    return [logq, ids, *_tree_fields(tree)]


def _ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / ITERS


def check(tp, budget, bs, weight, gen) -> dict:
    smaller = tuple(b for b in SMALLER_BUDGETS if b < budget)
    sampler = StaticDraftTree(
        _head(weight, tp, budget, math.prod(gathered_shape(bs, BLOCK - 1, budget))),
        block_size=BLOCK,
        k=budget,
        temperature=TEMPERATURE,
        budget=budget,
        max_bs=bs,
        smaller_budgets=smaller,
    )
    static_hidden, static_ids = _inputs(bs, gen)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up: Triton compiles, cuBLAS picks its kernels
        for _ in range(2):
            sampler(static_hidden, static_ids)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sampler(static_hidden, static_ids)
    captured_tokens = _eager(static_hidden, static_ids, sampler.head, bs, budget)[2].tokens

    hidden, ids = _inputs(bs, gen)  # new inputs
    static_hidden.copy_(hidden)
    static_ids.copy_(ids)
    torch.cuda.set_sync_debug_mode("error")
    try:
        graph.replay()
        eager = _eager(hidden, ids, _head(weight, tp, budget, 0), bs, budget)
        roots = ids.view(bs, BLOCK)[:, 0]
        eager_smaller = {b: build_ddtree_from_topk(eager[0], eager[1], b, roots) for b in smaller}
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    got = sampler.outputs(bs)
    exact = all(torch.equal(a, b) for a, b in zip(_flat(got), _flat(eager), strict=True))
    for b, want in eager_smaller.items():  # budget by batch size: the other candidates' trees
        got_b = sampler.outputs(bs, b)[2]
        exact &= all(
            torch.equal(x, y) for x, y in zip(_tree_fields(got_b), _tree_fields(want), strict=True)
        )
    logq_diff = float((got[0] - eager[0]).abs().nan_to_num(0.0).max())  # -inf pads: nan
    fresh = not torch.equal(got[2].tokens, captured_tokens)
    eager_head = _head(weight, tp, budget, 0)
    return {
        "tp": tp,
        "budget": budget,
        "bs": bs,
        "eager_ms": _ms(lambda: _eager(hidden, ids, eager_head, bs, budget)),
        "graph_ms": _ms(graph.replay),
        "exact": exact,
        "logq_diff": logq_diff,
        "fresh": fresh,
        "mean_nodes": float(got[2].num_nodes.float().mean()),
    }


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    print(
        "| TP | budget (K) | bs | eager ms | graph replay ms | bit-exact | max logq diff | fresh "
        "| mean nodes |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ok = True
    for tp, budget, bs in itertools.product((1, 2), BUDGETS, BATCH_SIZES):
        r = check(tp, budget, bs, weight, gen)
        ok &= r["exact"] and r["fresh"]
        tp_label = "1" if tp == 1 else "2 (simulated)"
        print(
            f"| {tp_label} | {budget} ({budget}) | {bs} | {r['eager_ms']:.3f} | "
            f"{r['graph_ms']:.3f} | {r['exact']} | {r['logq_diff']:.2e} | {r['fresh']} | "
            f"{r['mean_nodes']:.1f} |",
            flush=True,
        )
    print("sync debug mode 'error': one replay and one eager call per row, no sync raised")
    print("ALL OK" if ok else "MISMATCH")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
