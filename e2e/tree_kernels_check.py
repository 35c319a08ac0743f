"""SGLang 0.5.23's CUDA tree-verify kernel walks our trees exactly as ``sglang_spec.tree`` does (H200, GPU kit).

Run on the GPU machine after ``source .gpu-kit/setup.sh``::

    $SGLANG_KIT_PYTHON -m e2e.tree_kernels_check

For random drafter logits it builds DDTrees on the GPU (our Triton kernels), lays them out with
``sglang_tree_abi``, draws target tokens that follow the tree part of the way, and runs SGLang's own
``verify_tree_greedy_func`` (the JIT CUDA kernel the DDTREE worker uses through ``eagle_sample``) on
those tensors. It checks accepted node indices, accept lengths and bonus tokens against our
``walk_greedy`` for batch sizes up to 64, budgets up to 256, depth 15, and prints a table.
(On the CPU, tests/test_tree_layout.py does the same with SGLang's Triton version of the kernel.)
"""

from __future__ import annotations

import itertools
import sys

import torch


def main() -> int:
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_func

    from sglang_spec.tree import build_ddtree, sglang_tree_abi, walk_greedy

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    print("| bs | budget | V | trees | mean accepted | all equal |")
    print("|---|---|---|---|---|---|")
    ok = True
    for bs, budget, vocab in itertools.product([1, 8, 64], [16, 64, 256], [32, 151936]):
        L = 15
        logits = torch.randn(bs, L, vocab, device=dev, generator=gen) * 3
        roots = torch.randint(0, vocab, (bs,), device=dev, generator=gen)
        tree = build_ddtree(logits, budget, roots)
        seq_lens = torch.randint(1, 300, (bs,), device=dev, generator=gen)
        abi = sglang_tree_abi(tree, seq_lens, seq_lens_sum=None)
        # Target tokens: follow a node's first child (the ABI's retrieve_next_token) 80% of the
        # time, else a random token.
        first = abi.retrieve_next_token.long()
        tgt = torch.randint(0, vocab, tree.tokens.shape, device=dev, generator=gen)
        follow = (torch.rand(tree.tokens.shape, device=dev, generator=gen) < 0.8) & (first >= 0)
        tgt = torch.where(follow, tree.tokens.gather(1, first.clamp(min=0)), tgt)
        N = tree.width
        predicts = torch.full((bs * N,), -7, dtype=torch.int32, device=dev)
        accept_index = torch.full((bs, L + 1), -1, dtype=torch.int32, device=dev)
        accept_num = torch.zeros(bs, dtype=torch.int32, device=dev)
        verify_tree_greedy_func(
            predicts,
            accept_index,
            accept_num,
            abi.draft_tokens.view(bs, N),
            abi.retrieve_index,
            abi.retrieve_next_token,
            abi.retrieve_next_sibling,
            tgt,
        )
        ours = walk_greedy(tree, tgt)
        rows = torch.arange(bs, device=dev)
        sg_local = torch.where(accept_index >= 0, accept_index.long() - rows[:, None] * N, -1)
        last = sg_local.gather(1, accept_num.long()[:, None]).squeeze(1)
        sg_bonus = predicts.view(bs, N).long().gather(1, last[:, None]).squeeze(1)
        equal = (
            torch.equal(sg_local, ours.accepted)
            and torch.equal(accept_num.long(), ours.accept_len)
            and torch.equal(sg_bonus, ours.bonus)
        )
        ok &= equal
        print(
            f"| {bs} | {budget} | {vocab} | {bs} | {ours.accept_len.float().mean().item():.2f} | {equal} |",
            flush=True,
        )
    print("SGLang's CUDA verify_tree_greedy agrees with walk_greedy:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
