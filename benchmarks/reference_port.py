"""A faithful port of the public DDTree reference's host-side tree handling, as a baseline.

The reference (liranringel/ddtree, ``build_ddtree_tree`` and its verify loop) does, per request:
log-softmax + top-K on the device, one device-to-host copy of the ``[L, K]`` ids and log-probs, a
Python ``heapq`` best-first search, a Python-built visibility matrix, a host-to-device copy of the
tree tensors, and after verification a Python walk over the target tokens copied back to the host.
This module reproduces that cost structure so the benchmark can show it beside ours; its outputs
are also a second oracle for the benchmark's correctness check.
"""

from __future__ import annotations

import heapq

import torch


def reference_build(draft_logits: torch.Tensor, budget: int):
    """Per request: top-K on the device, copy to host, heap search, build tensors, copy back."""
    bs, L, V = draft_logits.shape
    K = min(budget, V)
    trees = []
    for b in range(bs):
        logq = torch.log_softmax(draft_logits[b].float(), dim=-1)
        vals, ids = logq.topk(K, dim=-1)
        vals, ids = vals.cpu().tolist(), ids.cpu().tolist()  # the per-step device->host copy
        tokens, parents, depths, scores = [None], [-1], [0], [0.0]
        heap = [(-vals[0][0], 1, 0, 0, 0.0)]  # (-score, depth, rank, parent, parent score)
        while heap and len(tokens) <= budget:
            neg, d, r, p, ps = heapq.heappop(heap)
            n = len(tokens)
            tokens.append(ids[d - 1][r])
            parents.append(p)
            depths.append(d)
            scores.append(-neg)
            if r + 1 < K:
                heapq.heappush(heap, (-(ps + vals[d - 1][r + 1]), d, r + 1, p, ps))
            if d < L:
                heapq.heappush(heap, (-(-neg + vals[d][0]), d + 1, 0, n, -neg))
        n = len(tokens)
        vis = [[False] * n for _ in range(n)]
        for i in range(n):
            if i:
                vis[i][:i] = vis[parents[i]][:i]
            vis[i][i] = True
        dev = draft_logits.device
        trees.append(
            {
                "parents": parents,
                "depths": depths,
                "scores": scores,
                "token_ids": torch.tensor(tokens[1:], device=dev),  # host->device copies
                "mask": torch.tensor(vis, device=dev),
                "children": {(parents[i], tokens[i]): i for i in range(1, n)},
            }
        )
    return trees


def reference_walk(trees, target_tokens: torch.Tensor):
    """Python walk: copy the target tokens to the host, follow matching children from the root."""
    host = target_tokens.cpu().tolist()
    out = []
    for tree, tgt in zip(trees, host):
        cur, path = 0, [0]
        while (cur, tgt[cur]) in tree["children"]:
            cur = tree["children"][(cur, tgt[cur])]
            path.append(cur)
        out.append((path, tgt[cur]))
    return out
