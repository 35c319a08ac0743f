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
that both walks agree; on CUDA it also checks the Triton kernels against the torch implementation
(the same calls on the CPU), with and without the chain.
Times are medians, in µs; "ref / ours" is a ratio.

The default grid is the full one on CUDA (bs 1 8 32 64 x budgets 16 32 64 128 256, about a
minute on the H200) and a small one on the CPU (bs 1 4 x budgets 16 64, 3 repeats: under a
minute); ``--bs``/``--budgets``/``--repeats`` choose another.
"""

from __future__ import annotations

import argparse
import sys
from functools import partial

from sglang_spec.cli_args import Parser, int_range, nonneg_int, positive_int, usage_error
from sglang_spec.plugin import MAX_VERIFY_WIDTH

PROG = "python -m benchmarks.tree"
# device type -> (batch sizes, budgets, timed repeats per cell)
GRIDS = {"cuda": ([1, 8, 32, 64], [16, 32, 64, 128, 256], 50), "cpu": ([1, 4], [16, 64], 3)}
MAX_LOGITS = 2**31  # elements of the random drafter logits [bs, L, V] (8 GiB of float32)


def _targets_following_tree(tree, vocab: int, gen):
    """Target tokens that agree with the tree along its best-scored branch about 70% of the time."""
    import torch

    from sglang_spec.tree import TreeMaskMode, sglang_tree_abi

    bs, N = tree.tokens.shape
    tgt = torch.randint(0, vocab, (bs, N), generator=gen, device="cpu").to(tree.tokens.device)
    # SGLang's retrieve_next_token: every node's first child, -1 if none.
    seq_lens = torch.zeros(bs, dtype=torch.long, device=tree.tokens.device)
    first = sglang_tree_abi(tree, seq_lens, TreeMaskMode.QLEN_ONLY).retrieve_next_token
    child_tok = tree.tokens.gather(1, first.clamp(min=0))
    follow = (torch.rand(bs, N, generator=gen, device="cpu") < 0.7).to(tree.tokens.device) & (
        first >= 0
    )
    return torch.where(follow, child_tok, tgt)


def check(logits, budget, seq_lens, gen) -> None:
    """Our tree/walk agree with the reference port (and, on CUDA, Triton with torch on the CPU)."""
    import torch

    from benchmarks.reference_port import reference_build, reference_walk
    from sglang_spec.tree import (
        ancestor_mask,
        build_ddtree_from_topk,
        draft_topk,
        sglang_tree_abi,
        walk_greedy,
    )

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
    if logits.is_cuda:  # the same calls on CPU tensors run the torch implementation
        gpu = {False: tree, True: build_ddtree_from_topk(logq, ids, budget, roots, True)}
        cpu = {
            chain: build_ddtree_from_topk(logq.cpu(), ids.cpu(), budget, roots.cpu(), chain)
            for chain in gpu
        }
        for chain in gpu:
            for name in ("tokens", "depths", "parents", "scores", "num_nodes"):
                if not torch.equal(getattr(cpu[chain], name), getattr(gpu[chain], name).cpu()):
                    raise AssertionError(
                        f"Triton selection differs from the torch selection: {name} "
                        f"(include_chain={chain})"
                    )
        w2 = walk_greedy(cpu[False], tgt.cpu())
        if not (
            torch.equal(w2.accepted, walk.accepted.cpu())
            and torch.equal(w2.bonus, walk.bonus.cpu())
        ):
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
    import torch

    from sglang_spec.tree import build_ddtree_from_topk, sglang_tree_abi, walk_greedy

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


def _grid_help(what: str, i: int) -> str:
    """``what (default: <cuda value> on cuda, <cpu value> on cpu)`` for column ``i`` of GRIDS."""
    cuda, cpu = (
        " ".join(map(str, v)) if isinstance(v, list) else v
        for v in (GRIDS["cuda"][i], GRIDS["cpu"][i])
    )
    return f"{what} (default: {cuda} on cuda, {cpu} on cpu)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto = cuda if available, else cpu",
    )
    p.add_argument(
        "--bs",
        type=int_range(1, 4096),
        nargs="+",
        help=_grid_help("batch sizes", 0),
    )
    p.add_argument(
        "--budgets",
        type=int_range(1, MAX_VERIFY_WIDTH - 1),
        nargs="+",
        help=_grid_help("draft nodes per tree", 1),
    )
    p.add_argument("--depth", type=int_range(1, 256), default=15, help="L = drafter block size - 1")
    p.add_argument(
        "--vocab",
        type=int_range(2, 2**24),
        default=151936,
        help="V, the vocabulary size (151936: Qwen's)",
    )
    p.add_argument(
        "--seq-len",
        type=int_range(0, 1 << 20),
        default=512,
        help="verified length per request (FULL_MASK prefix)",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help=_grid_help("timed repeats per cell", 2),
    )
    p.add_argument(
        "--ref-max-bs",
        type=nonneg_int,
        default=64,
        help="skip the (slow) reference port above this batch size",
    )


def run(args) -> int:
    if args.device == "auto":  # the grid needs the device: resolve it first (imports torch)
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    grid_bs, grid_budgets, grid_repeats = GRIDS[args.device]
    bs_list, budgets = args.bs or grid_bs, args.budgets or grid_budgets
    repeats = args.repeats or grid_repeats
    if max(bs_list) * args.depth * args.vocab > MAX_LOGITS:
        return usage_error(
            PROG,
            "--vocab",
            args.vocab,
            f"--bs x --depth x --vocab <= {MAX_LOGITS} logits "
            f"(got {max(bs_list)} x {args.depth} x {args.vocab})",
        )
    import torch

    from benchmarks.reference_port import reference_build, reference_walk
    from benchmarks.timing import median_timer
    from sglang_spec.tree import build_ddtree_from_topk, draft_topk, sglang_tree_abi, walk_greedy

    if args.device == "cuda" and not torch.cuda.is_available():
        return usage_error(PROG, "--device", "cuda", "cpu (this machine has no CUDA device)")
    dev = torch.device(args.device)
    timer = median_timer(dev)
    gen = torch.Generator().manual_seed(0)
    name = (
        torch.cuda.get_device_name(dev)
        if dev.type == "cuda"
        else f"CPU ({torch.get_num_threads()} threads)"
    )
    print(
        f"# DDTree core on {name}, torch {torch.__version__}; L={args.depth}, V={args.vocab}, "
        f"seq_len={args.seq_len}; times in µs (median of {repeats}), ref / ours = ratio"
    )
    cols = [
        "bs",
        "budget",
        "top-K µs",
        "build µs",
        "layout+abi µs",
        "walk µs",
        "b+l+w µs",
        "ours total µs",
        "ref build µs",
        "ref walk µs",
        "ref total µs",
        "ref / ours",
    ]
    if dev.type == "cuda":
        cols.insert(7, "b+l+w graph µs")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---:|" * len(cols))
    for bs in bs_list:
        logits = torch.randn(bs, args.depth, args.vocab, generator=gen).to(dev) * 3
        seq_lens = torch.full((bs,), args.seq_len, dtype=torch.long, device=dev)
        roots = torch.zeros(bs, dtype=torch.long, device=dev)
        for budget in budgets:
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
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
