"""DDTREE's draft-sampler graphs equal the eager path, bit for bit, with no host sync (H200).

Run on the GPU machine (torch + Triton; SGLang is not needed)::

    python -m e2e.draft_graph_check [--json OUT.json]

On the 27B target's shapes (hidden 5120, vocabulary 248320, drafter block 16, bf16 LM head of
random weights) it builds what DDTREE's ``_maybe_build_draft_sampler`` hands SGLang,
:class:`sglang_spec.tree.DraftTreeGraphs` -- the staging copy the drafter's graph ends in, and one
graph per (budget, batch size) running :func:`sglang_spec.tree.draft_tree` at that budget -- for
the 27B adaptive server's candidates {7, 13, 31} and the chain budget 15 (K per depth: each
budget's exact K, 7 / 13 / 1 / 17, as ``DDTreeConfig.for_budget`` gives), on one rank and on two simulated ranks (a capturable
all-gather that makes up the second rank's shard from this one's, so the packed all-gather and
the TP merge run inside the graphs), captured for batch sizes 1, 8 and 16:

1. captures every graph (capture itself fails on any host sync), on its own stream and pool;
2. stages NEW hidden states and input ids through the staging hook, replays each budget's graph at
   batch sizes 1, 5 (padded to 8), 8 and 16 and compares the tree (tokens, parents, depths,
   scores, node counts) bit for bit with :func:`sglang_spec.tree.draft_tree` on the same inputs
   (what ``topk_stage`` runs eagerly), and checks that it differs from the capture inputs' tree
   (no stale outputs);
3. runs the replays and the eager calls under ``torch.cuda.set_sync_debug_mode("error")``;
4. times each budget's replay at batch size 16 with CUDA events against budget 31's: before this
   design the one draft graph paid at least budget 31's head (15 depths at K = 17) and built every
   candidate's tree at every step, whatever the budget; prints a table, writes ``--json``, exits 1
   if any check fails.

Takes well under a minute on an H200.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import sys

import torch

from sglang_spec.tree import (
    DraftHead,
    DraftTreeGraphs,
    StagedDraftBlock,
    StaticAllGather,
    StaticDraftTree,
    VocabShard,
    draft_tree,
    exact_topk,
)
from sglang_spec.tree.head import head_depths
from sglang_spec.tree.topk import gathered_shape

HIDDEN, VOCAB, BLOCK, TEMPERATURE = 5120, 248320, 16, 0.75
BUDGETS, GRAPH_BS, CHECK_BS, ITERS = (7, 13, 15, 31), (1, 8, 16), (1, 5, 8, 16), 20
HORIZON = BLOCK - 1
TREE_FIELDS = ("tokens", "parents", "depths", "scores", "num_nodes")


def _k(budget: int) -> int:
    return exact_topk(budget, HORIZON)


def _two_rank_gather():
    """``all_gather_into_tensor`` of two simulated ranks, capturable: rank 0 sends this rank's
    packed top-K (values, ids, log-sum-exp; ``gather_into.k`` per row, set by :class:`_KGather`),
    rank 1 the same rows as another shard would (ids shifted past the vocabulary, values and
    log-sum-exp 0.5 lower), so the TP merge in the graph merges two distinct lists."""

    def gather_into(out: torch.Tensor, inp: torch.Tensor) -> None:
        k = gather_into.k
        ranks = out.view(2, -1, 2 * k + 1)
        ranks.copy_(inp.view(1, -1, 2 * k + 1).expand(2, -1, -1))
        ranks[1, :, :k].sub_(0.5)
        ranks[1, :, k : 2 * k].add_(VOCAB)
        ranks[1, :, 2 * k].sub_(0.5)

    return gather_into


class _KGather(StaticAllGather):
    """Tells the simulated collective each call's K (its packed row is ``2K + 1`` wide); a real
    collective does not need it."""

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        self.gather_into.k = (t.shape[-1] - 1) // 2
        return super().__call__(t)


def _head(weight: torch.Tensor, tp: int, capacity: int) -> DraftHead:
    if tp == 1:
        return DraftHead(weight, VocabShard.whole(VOCAB))
    gather = _KGather(_two_rank_gather(), 2, capacity, weight.device)
    return DraftHead(weight, VocabShard.whole(VOCAB), gather)


def _inputs(bs: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    dev = torch.device("cuda")
    hidden = torch.randn(bs * BLOCK, HIDDEN, device=dev, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, VOCAB, (bs * BLOCK,), device=dev, generator=gen)
    return hidden, ids


def _eager(hidden, ids, head, bs, budget):
    return draft_tree(
        hidden.view(-1, BLOCK, HIDDEN)[:bs],
        ids.view(-1, BLOCK)[:bs, 0].clone(),
        head,
        k=_k(budget),
        temperature=TEMPERATURE,
        budget=budget,
    )[2]


@contextlib.contextmanager
def _capture_scope():
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield stream, torch.cuda.graph_pool_handle()
    torch.cuda.current_stream().wait_stream(stream)


def _ms(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(ITERS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / ITERS


def check(tp: int, weight: torch.Tensor, gen: torch.Generator) -> list[dict]:
    max_bs = max(GRAPH_BS)
    capacity = max(
        math.prod(gathered_shape(max_bs, head_depths(b, HORIZON), _k(b))) for b in BUDGETS
    )
    head = _head(weight, tp, capacity)
    staged = StagedDraftBlock(
        max_bs=max_bs, block_size=BLOCK, hidden_size=HIDDEN, dtype=weight.dtype, device="cuda"
    )
    trees = {
        b: StaticDraftTree(
            head, horizon=HORIZON, k=_k(b), temperature=TEMPERATURE, budget=b, max_bs=max_bs
        )
        for b in BUDGETS
    }
    graphs = DraftTreeGraphs(staged, trees, list(GRAPH_BS))
    cap_hidden, cap_ids = _inputs(max_bs, gen)  # the capture's inputs
    graphs(cap_hidden, cap_ids)
    captured = {b: _eager(cap_hidden, cap_ids, head, max_bs, b) for b in BUDGETS}
    graphs.capture(_capture_scope)

    hidden, ids = _inputs(max_bs, gen)  # new inputs, through the drafter graph's staging hook
    eager_head = _head(weight, tp, 0)
    pairs = {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        graphs(hidden, ids)
        for budget, bs in itertools.product(BUDGETS, CHECK_BS):
            got = graphs.tree(bs, budget)  # views: the next replay overwrites them
            got = [getattr(got, f).clone() for f in TREE_FIELDS]
            pairs[budget, bs] = got, _eager(hidden, ids, eager_head, bs, budget)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    rows = []
    for (budget, bs), (got, want) in pairs.items():
        rows.append(
            {
                "tp": tp,
                "budget": budget,
                "k": _k(budget),
                "head_depths": head_depths(budget, HORIZON),
                "bs": bs,
                "replayed_bs": graphs.padded_bs(bs),
                "exact": all(
                    torch.equal(g, getattr(want, f)) for g, f in zip(got, TREE_FIELDS, strict=True)
                ),
                "fresh": not torch.equal(got[0], captured[budget].tokens[:bs]),
                "mean_nodes": float(got[4].float().mean()),
            }
        )
    for budget in BUDGETS:
        ms = _ms(lambda b=budget: graphs.tree(max_bs, b))
        for r in rows:
            if r["budget"] == budget:
                r["replay_ms_bs16"] = ms
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs CUDA", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    rows = [r for tp in (1, 2) for r in check(tp, weight, gen)]
    print(
        "| TP | budget (K, head depths) | bs (replayed) | bit-exact | fresh | mean nodes "
        "| replay ms at bs 16 | / budget 31's |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ok = True
    for r in rows:
        ok &= r["exact"] and r["fresh"]
        full = next(
            x["replay_ms_bs16"] for x in rows if x["tp"] == r["tp"] and x["budget"] == max(BUDGETS)
        )
        tp_label = "1" if r["tp"] == 1 else "2 (simulated)"
        print(
            f"| {tp_label} | {r['budget']} ({r['k']}, {r['head_depths']}) | {r['bs']} "
            f"({r['replayed_bs']}) | {r['exact']} | {r['fresh']} | {r['mean_nodes']:.1f} | "
            f"{r['replay_ms_bs16']:.3f} | {r['replay_ms_bs16'] / full:.2f} |",
            flush=True,
        )
    print("sync debug mode 'error': staging, every replay and every eager call; no sync raised")
    print("ALL OK" if ok else "MISMATCH")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
