"""``SGLANG_SIMULATE_ACC_LEN`` for DDTREE: forced acceptance along the tree's best path (benchmarks only).

SGLang's benchmark knob makes every verify step accept a drawn number of tokens, so that
algorithms can be timed on dummy weights at a stated acceptance; the tokens it emits are
meaningless (a fixed id, 100). Upstream DFLASH and EAGLE honour it, and DDTREE's walk goes through
EAGLE's ``eagle_sample``, which draws the length (``SGLANG_SIMULATE_ACC_METHOD``, clamped to
``1..L+1``) and fills ``predict`` with the fixed id. EAGLE then accepts the first nodes in index
order, which in a DDTree are not a path (node 2 may be node 1's sibling). DDTREE keeps the drawn
length and moves the accepted nodes onto the tree's **best path**: from the root, the
highest-score child at each depth (for a factorised drafter, its greedy chain), clipped to that
path's length. The KV compaction, GDN commit and drafter context then see a real root-to-leaf
path, as in a served step.

Only ``SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed`` is supported: EAGLE's ``real-draft-token`` mode
needs ``speculative_eagle_topk=1`` (``eagle_utils.py:818``), and DDTREE refuses it at start-up.
"""

from __future__ import annotations

import math

import torch

from sglang_spec.tree import DraftTree


def best_path(tree: DraftTree) -> torch.Tensor:
    """Node slots ``[bs, L+1]`` of the path that takes the highest-score child at every depth
    (the lowest slot among equal scores), root first, ``-1`` past its end. No host sync, and a
    fixed number of launches (37 kernel-launching torch ops at L = 15, counted on the CPU;
    :func:`simulated_acceptance` adds 17): each node's parent's best child is found with
    two scatter-reductions, and the nodes whose whole ancestry is best children (the path) by
    pointer doubling, ``ceil(log2(L + 1))`` rounds. (A depth-by-depth walk took some 90 eager
    launches, 0.6 GPU ms per 27B step at C = 1, session 12.)"""
    parents, scores, depths = tree.parents, tree.scores, tree.depths
    bs, n = parents.shape
    horizon = tree.horizon
    dev = parents.device
    slot = torch.arange(n, device=dev).expand(bs, n)
    child = (parents >= 0) & (depths >= 1) & (depths <= horizon)
    up = torch.where(parents >= 0, parents, slot).long()  # the root points to itself
    score = torch.where(child, scores, float("-inf"))
    best_score = torch.full((bs, n), float("-inf"), device=dev, dtype=scores.dtype)
    best_score.scatter_reduce_(1, up, score, "amax")
    tied = child & (score == best_score.gather(1, up))
    best_slot = torch.full((bs, n), n, device=dev, dtype=torch.long)
    best_slot.scatter_reduce_(1, up, torch.where(tied, slot, n), "amin")
    on = (tied & (slot == best_slot.gather(1, up))) | (slot == 0)
    for _ in range(math.ceil(math.log2(horizon + 1))):
        on = on & on.gather(1, up)
        up = up.gather(1, up)
    path = torch.full((bs, horizon + 2), -1, dtype=torch.long, device=dev)
    column = torch.where(on, depths.long(), horizon + 1)  # off-path nodes land in a dropped column
    path.scatter_(1, column, slot)
    return path[:, : horizon + 1]


def simulated_acceptance(
    tree: DraftTree, drawn_lens: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accept_lens [bs], accept_index [bs, D+1])`` in ``eagle_sample``'s layout (``D =
    min(L, width - 1)``, the deepest a tree of this width reaches) for the drawn
    acceptance lengths (tokens per step, the bonus included), along each tree's best path and
    clipped to its length. ``accept_index`` holds flat node ids ``b * width + slot``, ``-1``
    padded; both keep ``drawn_lens``'s dtype."""
    path = best_path(tree)[:, : min(tree.horizon, width - 1) + 1]
    lens = torch.minimum(drawn_lens.to(path.dtype), (path >= 0).sum(dim=1))
    cols = torch.arange(path.shape[1], device=path.device)
    rows = torch.arange(path.shape[0], device=path.device)[:, None] * width
    index = torch.where(cols[None, :] < lens[:, None], rows + path, -1)
    return lens.to(drawn_lens.dtype), index.to(drawn_lens.dtype)
