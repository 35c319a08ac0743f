"""The Triton kernels of sglang_spec.tree equal the torch implementation, bit for bit.

CI has no GPU, so the kernels run under Triton's CPU interpreter (``TRITON_INTERPRET=1``), which
must be set before Triton is imported: the checks run in a child process.
"""

import os
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import itertools, torch
    from sglang_spec.tree import build, layout, walk, triton_kernels as tk
    from sglang_spec.tree.types import TreeMaskMode

    torch.manual_seed(0)
    cases = [(3, 4, 7, 10), (2, 1, 3, 5), (4, 6, 50, 33), (1, 15, 100, 64), (2, 3, 2, 9), (5, 2, 40, 1)]
    for bs, L, V, B in cases:
        lg = torch.randn(bs, L, V)
        lg[0, :, 1] = float("-inf")          # impossible tokens
        if bs > 2:
            lg[2] = 0.0                      # all ties
        logq, ids = build.draft_topk(lg, min(B, V))
        roots = torch.arange(bs) + 100
        ref = build.build_ddtree_from_topk(logq, ids, B, roots)
        tokens, depth, _, parent, score, num = tk.ddtree_select(logq, ids, roots, B)
        for name, a, b in [("tokens", ref.tokens, tokens), ("depths", ref.depths, depth),
                           ("parents", ref.parents, parent), ("scores", ref.scores, score),
                           ("num_nodes", ref.num_nodes, num)]:
            assert torch.equal(a, b), (bs, L, V, B, name, a, b)
        seq = torch.randint(0, 300, (bs,))
        for mode in [0, 1] + ([2] if B + 1 <= 32 else []):
            c = layout.sglang_tree_abi(ref, seq, mode)
            g = tk.tree_layout(ref, seq, TreeMaskMode(mode), int(seq.sum()))
            for f in ["draft_tokens", "positions", "retrieve_index", "retrieve_next_token",
                      "retrieve_next_sibling", "tree_mask"]:
                assert torch.equal(getattr(c, f), getattr(g, f)), (mode, f)
        for trial in range(3):
            tgt = torch.randint(0, V, (bs, B + 1))
            follow = torch.rand(bs, B + 1) < 0.6
            for b_, i in itertools.product(range(bs), range(1, B + 1)):
                p = int(ref.parents[b_, i])
                if p >= 0 and follow[b_, i]:
                    tgt[b_, p] = ref.tokens[b_, i]
            w1, w2 = walk._walk_torch(ref, tgt), tk.tree_walk(ref, tgt)
            for f in ["accepted", "accept_len", "bonus"]:
                assert torch.equal(getattr(w1, f), getattr(w2, f)), (f, getattr(w1, f), getattr(w2, f))
    # NaN log-probs: the kernel cannot raise without a host sync, so that request gets a root-only tree.
    logq, ids = build.draft_topk(torch.randn(2, 3, 9), 4)
    logq[1, 2, 0] = float("nan")
    tokens, depth, _, parent, score, num = tk.ddtree_select(logq, ids, torch.tensor([5, 6]), 4)
    assert num.tolist()[1] == 1 and num.tolist()[0] == 5, num
    assert depth[1].tolist() == [0, -1, -1, -1, -1] and tokens[1].tolist() == [6] * 5
    print("TRITON_OK")
    """
)


def test_triton_kernels_match_torch_under_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and "TRITON_OK" in proc.stdout, (
        proc.stdout[-3000:] + proc.stderr[-5000:]
    )
