"""The Triton kernels of sglang_spec.tree equal the torch implementation, bit for bit.

:func:`check_kernels_match_torch` runs every kernel on ``device`` and the torch path on the CPU on
the same inputs, including drafts with many exact ties (equal and integer logits), so that the
frontier's tie breaking (the lowest slot wins) is compared, with and without the chain. CI has no
GPU: there the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``, which must be set
before Triton is imported, so that check runs in a child process). The interpreter's ``tl.max``
always breaks ties to the left whatever the kernel asks for, so only the compiled run checks the
kernels' own tie breaking: ``python -m pytest tests/test_triton_kernels.py`` on a CUDA machine.
"""

import itertools

import pytest
import torch
from tree_testing import run_under_triton_interpreter


def _cases():
    """(bs, L, V, B, include_chain, logits) covering B < L, B = L, B > L (up to 255, a verify
    width of 256) and exact ties."""
    g = torch.Generator().manual_seed(0)
    cases = []
    shapes = [(3, 4, 7, 10), (2, 1, 3, 5), (4, 6, 50, 33), (1, 15, 100, 64), (2, 3, 2, 9)]
    shapes += [(5, 2, 40, 1), (3, 6, 5, 4), (3, 5, 6, 5)]
    shapes += [(20, 3, 8, 6)]  # more requests than the layout kernel sums per iteration (16)
    shapes += [(2, 15, 200, 127), (1, 15, 300, 255)]  # the widest trees at the tiny pair's L
    for (bs, L, V, B), chain in itertools.product(shapes, (True, False)):
        lg = torch.randn(bs, L, V, generator=g)
        lg[0, :, 1] = float("-inf")  # impossible tokens
        if bs > 1:
            lg[1] = torch.randint(-2, 2, (L, V), generator=g).float()  # ties between prefixes
        if bs > 2:
            lg[2] = 0.0  # all ties
        cases.append((bs, L, V, B, chain, lg))
    return cases


def _check_selection(ref, got, case) -> None:
    tokens, depth, _, parent, score, num = (t.cpu() for t in got)
    for name, a, b in [
        ("tokens", ref.tokens, tokens),
        ("depths", ref.depths, depth),
        ("parents", ref.parents, parent),
        ("scores", ref.scores, score),
        ("num_nodes", ref.num_nodes, num),
    ]:
        assert torch.equal(a, b), (*case, name, a, b)


def check_kernels_match_torch(device: str) -> None:
    """Selection, layout and walk on ``device`` (Triton) equal the CPU torch path, bit for bit."""
    from sglang_spec.tree import build, layout, walk
    from sglang_spec.tree import triton_kernels as tk
    from sglang_spec.tree.types import DraftTree, TreeMaskMode

    def on(t):
        return t.to(device)

    for bs, L, V, B, chain, lg in _cases():
        # the server's K (exact_topk: 1 when B = L with the chain) and the full budget
        for k in sorted({min(build.exact_topk(B, L, chain), V), min(B, V)}):
            logq, ids = build.draft_topk(lg, k)
            roots = torch.arange(bs) + 100
            ref = build.build_ddtree_from_topk(logq, ids, B, roots, include_chain=chain)
            n_chain = build._chain_length(chain, B, L)
            got = tk.ddtree_select(on(logq), on(ids), on(roots), B, n_chain)
            _check_selection(ref, got, (bs, L, V, B, chain, k))
            if B < L:  # only the depths the budget reaches (head.draft_tree): the same tree
                few = tk.ddtree_select(
                    on(logq[:, :B].contiguous()), on(ids[:, :B].contiguous()), on(roots), B, 0
                )
                _check_selection(ref, few, (bs, L, V, B, chain, k, "depths", B))
        if not chain:
            continue  # the layout and walk kernels do not depend on how the tree was chosen
        tokens, depth, _, parent, score, num = (t.cpu() for t in got)
        tree = DraftTree(*(on(t) for t in (tokens, parent, depth, score, num)), horizon=L)
        seq = torch.randint(0, 300, (bs,))
        for mode in [0, 1] + ([2] if B + 1 <= 32 else []):
            c = layout.sglang_tree_abi(ref, seq, mode)
            g = tk.tree_layout(tree, on(seq), TreeMaskMode(mode), int(seq.sum()))
            for f in [
                "draft_tokens",
                "positions",
                "retrieve_index",
                "retrieve_next_token",
                "retrieve_next_sibling",
                "tree_mask",
            ]:
                assert torch.equal(getattr(c, f), getattr(g, f).cpu()), (mode, f)
            # the root-first path table (the GDN tree verify's), narrower than the deepest path
            # (rows of deeper nodes all -1), exact and wider
            for width in (2, L + 1, L + 3):
                c = layout.sglang_tree_abi(ref, seq, mode, path_width=width)
                g = tk.tree_layout(tree, on(seq), TreeMaskMode(mode), int(seq.sum()), None, width)
                assert g.paths.dtype == torch.int32, (mode, width)
                assert torch.equal(c.paths, g.paths.cpu()), (mode, width, c.paths, g.paths)
            assert g.paths is not None and c.tree_mask.numel() > 0
            # into a larger (uint8 for the bool modes, as SGLang's Triton backend keeps it)
            # buffer, no host-side sum: the leading entries are the mask, the rest untouched
            n_mask = c.tree_mask.numel()
            buf = torch.full(
                (n_mask + 50,), 7, dtype=torch.uint8 if mode < 2 else c.tree_mask.dtype
            )
            g = tk.tree_layout(tree, on(seq), TreeMaskMode(mode), None, on(buf))
            got_mask = g.tree_mask.cpu()
            assert torch.equal(got_mask[:n_mask], c.tree_mask.to(got_mask.dtype)), mode
            assert (got_mask[n_mask:] == 7).all(), mode
        for _ in range(3):
            tgt = torch.randint(0, V, (bs, B + 1))
            follow = torch.rand(bs, B + 1) < 0.6
            for b_, i in itertools.product(range(bs), range(1, B + 1)):
                p = int(ref.parents[b_, i])
                if p >= 0 and follow[b_, i]:
                    tgt[b_, p] = ref.tokens[b_, i]
            w1, w2 = walk._walk_torch(ref, tgt), tk.tree_walk(tree, on(tgt))
            for f in ["accepted", "accept_len", "bonus"]:
                assert torch.equal(getattr(w1, f), getattr(w2, f).cpu()), (f, w1, w2)
    # NaN log-probs: the kernel cannot raise without a host sync, so that request gets a root-only
    # tree (with or without the chain).
    logq, ids = build.draft_topk(torch.randn(2, 3, 9), 4)
    logq[1, 2, 0] = float("nan")
    for n_chain in (0, 3):
        got = tk.ddtree_select(on(logq), on(ids), on(torch.tensor([5, 6])), 4, n_chain)
        tokens, depth, _, _, _, num = (t.cpu() for t in got)
        assert num.tolist()[1] == 1 and num.tolist()[0] == 5, num
        assert depth[1].tolist() == [0, -1, -1, -1, -1] and tokens[1].tolist() == [6] * 5


def check_kernels_match_torch_on_cpu() -> None:
    check_kernels_match_torch("cpu")


def test_triton_kernels_match_torch_under_interpreter():
    run_under_triton_interpreter("test_triton_kernels", "check_kernels_match_torch_on_cpu", "OK")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="compiled Triton kernels need CUDA")
def test_triton_kernels_match_torch_on_cuda():
    check_kernels_match_torch("cuda")
