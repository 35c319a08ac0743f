"""``python -m benchmarks.tree``: time the DDTree core against the reference port.

For every (batch size, budget) it times, on random drafter logits ``[bs, L, V]``:
the vocabulary top-K (``draft_topk``), the build (``build_ddtree_from_topk``), the layout with
SGLang's ABI in FULL_MASK mode (``sglang_tree_abi``) and the greedy walk (``walk_greedy``), and the
reference port's host-side build (which includes its own top-K) and walk
(``benchmarks/reference_port.py``). Our build is timed as the plug-in runs it (chain-inclusive). "b+l+w" is build + layout + walk (the cost beyond the top-K);
"ours total" adds the top-K and compares with "ref total". On CUDA, "b+l+w graph" is the same
three stages replayed from one CUDA graph: the GPU time without Python's launch overhead, which is
what a captured decode step pays; the eager columns include that overhead. Before timing it checks
that our tree without the chain selects the same scores as the reference port (plain DDTree) and
that both walks agree; on CUDA it also checks the Triton kernels against the torch implementation,
with and without the chain. Times are medians, in µs.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

import torch

from benchmarks.reference_port import reference_build, reference_walk
from benchmarks.timing import median_timer
from sglang_spec.tree import build_ddtree_from_topk, draft_topk, sglang_tree_abi, walk_greedy
from sglang_spec.tree.build import _chain_length, _select_torch
from sglang_spec.tree.layout import _child_links, ancestor_mask
from sglang_spec.tree.walk import _walk_torch


def _targets_following_tree(tree, vocab: int, gen: torch.Generator) -> torch.Tensor:
    """Target tokens that agree with the tree along its best-scored branch about 70% of the time."""
    bs, N = tree.tokens.shape
    tgt = torch.randint(0, vocab, (bs, N), generator=gen, device="cpu").to(tree.tokens.device)
    first, _ = _child_links(tree.parents)
    child_tok = tree.tokens.gather(1, first.clamp(min=0))
    follow = (torch.rand(bs, N, generator=gen, device="cpu") < 0.7).to(tree.tokens.device) & (
        first >= 0
    )
    return torch.where(follow, child_tok, tgt)


def check(logits, budget, seq_lens, gen) -> None:
    """Our tree/walk agree with the reference port (and, on CUDA, Triton with torch)."""
    bs, L, V = logits.shape
    logq, ids = draft_topk(logits, min(budget, V))
    roots = torch.zeros(bs, dtype=torch.long, device=logits.device)
    # The reference port is plain DDTree: compare it with the tree without the chain.
    tree = build_ddtree_from_topk(logq, ids, budget, roots, include_chain=False)
    ref = reference_build(logits, budget)
    for b in range(bs):
        ours = sorted(tree.scores[b, : int(tree.num_nodes[b])].tolist())
        theirs = sorted(ref[b]["scores"])
        if len(ours) != len(theirs) or max(abs(x - y) for x, y in zip(ours, theirs)) > 1e-4:
            raise AssertionError(f"request {b}: tree scores differ from the reference port")
        n = int(tree.num_nodes[b])
        if (
            not torch.equal(ancestor_mask(tree)[b, :n, :n].cpu(), ref[b]["mask"].cpu())
            and ours == theirs
        ):
            # Same score multiset but different order is legal only under exact ties.
            if len(set(ours)) == len(ours):
                raise AssertionError(f"request {b}: ancestor mask differs from the reference port")
    tgt = _targets_following_tree(tree, V, gen)
    walk = walk_greedy(tree, tgt)
    if logits.is_cuda:
        for include_chain in (False, True):
            t = build_ddtree_from_topk(logq, ids, budget, roots, include_chain)
            cpu_sel = _select_torch(logq, budget, _chain_length(include_chain, budget, L))
            if not all(
                torch.equal(a.cpu(), b.cpu())
                for a, b in zip(cpu_sel, (t.depths, None, t.parents, t.scores, t.num_nodes))
                if b is not None
            ):
                raise AssertionError("Triton selection differs from the torch selection")
        w2 = _walk_torch(tree, tgt)
        if not (torch.equal(w2.accepted, walk.accepted) and torch.equal(w2.bonus, walk.bonus)):
            raise AssertionError("Triton walk differs from the torch walk")
    ref_walk = reference_walk(ref, tgt) if _same_order(tree, ref) else None
    if ref_walk is not None:
        for b, (path, bonus) in enumerate(ref_walk):
            got = [i for i in walk.accepted[b].tolist() if i >= 0]
            if got != path or int(walk.bonus[b]) != bonus:
                raise AssertionError(
                    f"request {b}: walk {got}/{int(walk.bonus[b])} != reference {path}/{bonus}"
                )
    sglang_tree_abi(tree, seq_lens, seq_lens_sum=int(seq_lens.sum()))


def _graph_time(logq, ids, budget, roots, seq_lens, seq_sum, tgt, timer, repeats) -> float:
    """GPU time of build + layout + walk replayed from one CUDA graph (no Python launch overhead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles kernels) off the capture
        tree = build_ddtree_from_topk(logq, ids, budget, roots)
        walk_greedy(tree, tgt)
        sglang_tree_abi(tree, seq_lens, seq_lens_sum=seq_sum)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree = build_ddtree_from_topk(logq, ids, budget, roots)
        sglang_tree_abi(tree, seq_lens, seq_lens_sum=seq_sum)
        walk_greedy(tree, tgt)
    return timer(graph.replay, repeats)


def _same_order(tree, ref) -> bool:
    return all(
        tree.parents[b, : len(r["parents"])].tolist() == r["parents"] for b, r in enumerate(ref)
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bs", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    p.add_argument("--depth", type=int, default=15, help="L = drafter block size - 1")
    p.add_argument("--vocab", type=int, default=151936, help="V (Qwen vocabulary by default)")
    p.add_argument(
        "--seq-len", type=int, default=512, help="verified length per request (FULL_MASK prefix)"
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="timed repeats per cell (default 50 on CUDA, 5 on CPU)",
    )
    p.add_argument(
        "--ref-max-bs",
        type=int,
        default=64,
        help="skip the (slow) reference port above this batch size",
    )


def run(args) -> int:
    dev = torch.device(args.device)
    repeats = args.repeats or (50 if dev.type == "cuda" else 5)
    timer = median_timer(dev)
    gen = torch.Generator().manual_seed(0)
    name = (
        torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"CPU ({torch.get_num_threads()} threads)"
    )
    print(
        f"# DDTree core on {name}, torch {torch.__version__}; L={args.depth}, V={args.vocab}, "
        f"seq_len={args.seq_len}, median of {repeats} (µs)"
    )
    cols = [
        "bs",
        "B",
        "topk",
        "build",
        "layout+abi",
        "walk",
        "b+l+w",
        "ours total",
        "ref build",
        "ref walk",
        "ref total",
        "ref/ours",
    ]
    if dev.type == "cuda":
        cols.insert(7, "b+l+w graph")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for bs in args.bs:
        logits = torch.randn(bs, args.depth, args.vocab, generator=gen).to(dev) * 3
        seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=dev)
        roots = torch.zeros(bs, dtype=torch.long, device=dev)
        for budget in args.budgets:
            K = min(budget, args.vocab)
            check(logits[: min(bs, 8)], budget, seq_lens[: min(bs, 8)], gen)
            logq, ids = draft_topk(logits, K)
            tree = build_ddtree_from_topk(logq, ids, budget, roots)
            tgt = _targets_following_tree(tree, args.vocab, gen)
            t_topk = timer(partial(draft_topk, logits, K), repeats)
            t_build = timer(partial(build_ddtree_from_topk, logq, ids, budget, roots), repeats)
            seq_sum = bs * args.seq_len
            t_layout = timer(
                partial(sglang_tree_abi, tree, seq_lens, seq_lens_sum=seq_sum), repeats
            )
            t_walk = timer(partial(walk_greedy, tree, tgt), repeats)
            ours = t_build + t_layout + t_walk
            row = [bs, budget, t_topk, t_build, t_layout, t_walk, ours, t_topk + ours]
            if dev.type == "cuda":
                row.insert(
                    7, _graph_time(logq, ids, budget, roots, seq_lens, seq_sum, tgt, timer, repeats)
                )
            if bs <= args.ref_max_bs:
                ref_trees = reference_build(logits, budget)
                r_build = timer(partial(reference_build, logits, budget), max(3, repeats // 10))
                r_walk = timer(partial(reference_walk, ref_trees, tgt), max(3, repeats // 10))
                # The reference's build includes its own top-K, so it compares with our total.
                r_total = r_build + r_walk
                row += [r_build, r_walk, r_total, r_total / (t_topk + ours)]
            else:
                row += ["-"] * 4
            print(
                "| "
                + " | ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in row)
                + " |",
                flush=True,
            )
    print(
        "checks passed: tree scores = reference port, walks agree"
        + (", Triton = torch" if dev.type == "cuda" else "")
    )
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.tree", description=__doc__.splitlines()[0]
    )
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
