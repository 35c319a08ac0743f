"""DDTree construction: per-depth top-K of the drafter's marginals, then best-first selection.

DDTree (arXiv 2604.12989, Algorithm 1) keeps the B prefixes with the highest factorised draft
probability ``prod_d q_d(token_d)``; that set is prefix-closed and only the ``K = min(B, V)`` best
tokens of each depth can appear in it. The selection is a best-first search over a frontier that
holds, for every popped node, at most its next sibling and its first child (so at most ``B + 1``
entries).

Chain-inclusive trees (``include_chain=True``, the default): when ``B >= L`` the tree first takes
the drafter's greedy chain -- the rank-0 token of every depth, to depth L, i.e. exactly the chain
DFLASH verifies -- and fills the other ``B - L`` nodes best-first. The factorised objective
understates the chain when the drafter's errors are correlated (right for the whole block or wrong
at its first token), and best-first then spends the budget on shallow siblings; with the chain in
the tree, greedy verification accepts at least as many tokens as DFLASH from the same draft. The
chain is L forced pops: the chain node of depth d sits in frontier slot ``d - 1`` when it is popped,
so it takes slot d of the tree and the order stays topological; the pops that follow are the usual
best-first search over the frontier the chain left, so the other nodes are exactly the ``B - L``
best prefixes outside the chain (the exact-top-B property restricted to what the chain leaves).
When ``B < L`` the chain does not fit and the tree is the plain best-first tree: it maximises the
factorised objective over every prefix-closed set of B prefixes (DDTree Prop. 2), so in expectation
it is at least as good as the chain cut to depth B (one such set), and no budget below L can hold
DFLASH's chain anyway.

Both implementations run batched over requests without host synchronisation:

- :func:`_select_torch`: ``B`` vectorised steps of torch ops (CPU, and any device without Triton);
- ``triton_kernels.ddtree_select``: one Triton program per request (CUDA).

They perform the same float32 operations in the same order and break ties between frontier entries
the same way (the lowest slot wins: ``torch.max``'s documented first maximal index, and
``tl.max(..., return_indices_tie_break_left=True)``). ``tests/test_triton_kernels.py`` checks the
trees are identical, bit for bit, on drafts with many exact ties, under the Triton interpreter on
the CPU and, where CUDA is available, compiled on the GPU.
"""

from __future__ import annotations

import math

import torch

from .types import DraftTree


def _check_budget(budget: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(
            f"budget must be an integer >= 1 (number of draft nodes, root excluded); got {budget!r}"
        )
    return budget


def _check_logits(draft_logits: torch.Tensor) -> None:
    if draft_logits.dim() != 3:
        raise ValueError(
            f"draft_logits must be [bs, L, V] (L = block_size - 1 drafter positions); got shape {tuple(draft_logits.shape)}"
        )
    bs, L, V = draft_logits.shape
    if L < 1 or V < 1:
        raise ValueError(f"draft_logits needs L >= 1 and V >= 1; got L={L}, V={V}")
    if not draft_logits.is_floating_point():
        raise ValueError(f"draft_logits must be floating point; got {draft_logits.dtype}")


def _canonical_order(logq: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order each row by (log-prob descending, token id ascending), so ties never depend on the device."""
    ids_sorted, perm = ids.sort(dim=-1, stable=True)
    logq = logq.gather(-1, perm)
    logq_sorted, perm = logq.sort(dim=-1, descending=True, stable=True)
    return logq_sorted, ids_sorted.gather(-1, perm)


# The tree temperature DDTREE serves with unless told otherwise (the plug-in's
# SGLANG_DDTREE_TREE_TEMPERATURE, the demo, the e2e comparison): measured in
# benchmarks/results/chain_inclusive.md -- with chain-inclusive trees 0.75 matches or beats 1.
DEFAULT_TREE_TEMPERATURE = 0.75


def check_tree_temperature(temperature: float) -> float:
    """The tree temperature must be a finite number > 0 (1 = the drafter's own distribution)."""
    t = float(temperature)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(
            f"tree temperature must be a finite number > 0 (1 = the drafter's distribution, "
            f"< 1 sharpens it); got {temperature!r}"
        )
    return t


def top_logits(
    logits: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of ``x = logits [R, V] / temperature`` in float32, per row: the ``k`` largest values
    (descending; among ties the lowest ids), their int64 ids ``[R, k]`` and ``logsumexp(x)``
    ``[R]``. On CUDA one Triton pass over ``logits`` in their own dtype
    (:func:`~sglang_spec.tree.triton_topk.topk_logsumexp`: ``torch.topk`` and ``torch.logsumexp``
    on a float32 copy took 1.5 ms a step on the 27B shape); elsewhere a stable sort."""
    if logits.is_cuda:
        from .triton_topk import topk_logsumexp

        return topk_logsumexp(logits, k, temperature)
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    vals, ids = x.sort(dim=-1, descending=True, stable=True)
    return vals[:, :k], ids[:, :k], torch.logsumexp(x, dim=-1)


def draft_topk(
    draft_logits: torch.Tensor, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-softmax values and token ids of the ``k`` best tokens at every depth.

    ``draft_logits`` is ``[bs, L, V]``; returns float32 ``logq [bs, L, k]`` and int64 ``ids [bs, L, k]``
    ordered by (logq descending, id ascending). ``temperature`` scores the tree with
    ``log_softmax(logits / temperature)``: the same tokens per depth, but < 1 sharpens each depth's
    distribution, which shifts the best-first budget from siblings toward depth (any tree verifies
    losslessly; it is a tuning knob for drafters whose probabilities understate how often their top
    token is the target's choice). The selection runs on the raw logits (the log-softmax is
    monotone), so only ``[bs, L]`` log-sum-exps are computed over the vocabulary
    (:func:`top_logits`). Among tokens tied at the k-th value the lowest ids are kept, on every
    device.
    """
    _check_logits(draft_logits)
    bs, L, V = draft_logits.shape
    if not 1 <= k <= V:
        raise ValueError(f"k must be in [1, V={V}]; got {k}")
    temperature = check_tree_temperature(temperature)
    vals, ids, lse = top_logits(draft_logits.reshape(bs * L, V), k, temperature)
    return _canonical_order((vals - lse[:, None]).view(bs, L, k), ids.view(bs, L, k))


def merge_sharded_topk(
    vals: torch.Tensor, ids: torch.Tensor, lse: torch.Tensor, k: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge per-shard top-k of a vocabulary-parallel LM head without gathering the vocabulary.

    ``vals [tp, bs, L, k_local]`` are each shard's best raw logits, ``ids`` their *global* token ids,
    ``lse [tp, bs, L]`` each shard's log-sum-exp over its own vocabulary slice. The global
    log-softmax of a token is its logit minus the log-sum-exp of the shard log-sum-exps.
    """
    if vals.shape != ids.shape or vals.dim() != 4 or lse.shape != vals.shape[:3]:
        raise ValueError(
            f"expected vals/ids [tp, bs, L, k] and lse [tp, bs, L]; got {tuple(vals.shape)}, "
            f"{tuple(ids.shape)}, {tuple(lse.shape)}"
        )
    tp, bs, L, kl = vals.shape
    if not 1 <= k <= tp * kl:
        raise ValueError(f"k must be in [1, tp*k_local={tp * kl}]; got {k}")
    total_lse = torch.logsumexp(lse.float(), dim=0)  # [bs, L]
    flat_vals = vals.float().permute(1, 2, 0, 3).reshape(bs, L, tp * kl)
    flat_ids = ids.permute(1, 2, 0, 3).reshape(bs, L, tp * kl)
    logq, flat_ids = _canonical_order(flat_vals - total_lse.unsqueeze(-1), flat_ids)
    return logq[..., :k], flat_ids[..., :k]


def exact_topk(budget: int, horizon: int, include_chain: bool = True) -> int:
    """The fewest ranks per depth K that keep the tree of ``budget`` nodes exact (the tree that
    K = budget gives). A node of rank r enters after its r better siblings (its frontier slot
    passes from rank to rank), and under a chain parent rank 0 is the chain node, so with the
    chain (``budget >= horizon``) no rank exceeds the ``budget - horizon`` nodes outside it:
    ``budget - horizon + 1`` ranks suffice, 1 when the tree is the chain. A plain best-first tree
    needs ``budget``."""
    chain = _chain_length(include_chain, budget, horizon)
    return budget - chain + 1 if chain else budget


def nested_in(budget: int, larger: int, horizon: int) -> bool:
    """Whether the chain-inclusive tree of ``budget`` nodes is the first ``budget + 1`` slots of the
    one of ``larger`` nodes built from the same top-K: ``budget <= larger`` and both contain the
    drafter's chain (``budget >= horizon``) or neither does. Slots are in pop order and the chain is
    popped first when forced, so a smaller tree's pops are the larger one's first pops."""
    return budget <= larger and (budget >= horizon) == (larger >= horizon)


def _chain_length(include_chain: bool, budget: int, horizon: int) -> int:
    """Forced chain pops: the whole chain (L) when asked for and it fits the budget, else none."""
    if not isinstance(include_chain, bool):
        raise ValueError(f"include_chain must be True or False; got {include_chain!r}")
    return horizon if include_chain and budget >= horizon else 0


def _select_torch(logq: torch.Tensor, budget: int, chain: int):
    """Best-first selection of the ``budget`` best prefixes, batched over requests with torch ops.

    The first ``chain`` pops are forced to the rank-0 chain (see the module docstring). Returns per
    node ``(depth, rank, parent, score)`` tensors ``[bs, 1 + budget]`` (root at slot 0, padding with
    depth -1) and ``num_nodes [bs]``.
    """
    bs, L, K = logq.shape
    dev = logq.device
    N, F = budget + 1, budget + 1
    rows = torch.arange(bs, device=dev)
    neg_inf = torch.tensor(float("-inf"), device=dev)
    # Frontier entry = candidate node: its score, its parent's score, depth (1..L), rank, parent slot.
    f_score = torch.full((bs, F), float("-inf"), device=dev)
    f_pscore = torch.zeros((bs, F), device=dev)
    f_depth = torch.ones((bs, F), dtype=torch.long, device=dev)
    f_rank = torch.zeros((bs, F), dtype=torch.long, device=dev)
    f_parent = torch.zeros((bs, F), dtype=torch.long, device=dev)
    f_score[:, 0] = logq[:, 0, 0]
    count = torch.ones(bs, dtype=torch.long, device=dev)  # next free frontier slot

    depth = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    rank = torch.zeros((bs, N), dtype=torch.long, device=dev)
    parent = torch.full((bs, N), -1, dtype=torch.long, device=dev)
    score = torch.full((bs, N), float("-inf"), device=dev)
    depth[:, 0] = 0
    score[:, 0] = 0.0
    logq_flat = logq.reshape(bs, L * K)
    for n in range(1, N):
        if n <= chain:  # the chain node of depth n waits in slot n - 1 (its parent's first child)
            slot = torch.full((bs,), n - 1, dtype=torch.long, device=dev)
            best = f_score[rows, slot]  # a copy (a view would follow the sibling write below)
        else:
            best, slot = f_score.max(dim=1)  # first maximal slot on ties (torch.max contract)
        valid = best > float("-inf")
        d = f_depth[rows, slot]
        r = f_rank[rows, slot]
        depth[:, n] = torch.where(valid, d, -1)
        rank[:, n] = torch.where(valid, r, 0)
        parent[:, n] = torch.where(valid, f_parent[rows, slot], -1)
        score[:, n] = best
        # The popped entry's slot is reused by its next sibling (same parent, rank + 1).
        has_sib = valid & (r + 1 < K)
        sib_logq = logq_flat[rows, ((d - 1) * K + r + 1).clamp(max=L * K - 1)]
        f_score[rows, slot] = torch.where(has_sib, f_pscore[rows, slot] + sib_logq, neg_inf)
        f_rank[rows, slot] = r + 1
        # Its first child (rank 0 at the next depth) takes the next free slot.
        has_child = valid & (d < L)
        child_logq = logq_flat[rows, (d * K).clamp(max=L * K - 1)]
        cslot = count.clamp(max=F - 1)
        f_score[rows, cslot] = torch.where(has_child, best + child_logq, f_score[rows, cslot])
        f_pscore[rows, cslot] = torch.where(has_child, best, f_pscore[rows, cslot])
        f_depth[rows, cslot] = torch.where(has_child, d + 1, f_depth[rows, cslot])
        f_rank[rows, cslot] = torch.where(has_child, 0, f_rank[rows, cslot])
        f_parent[rows, cslot] = torch.where(has_child, n, f_parent[rows, cslot])
        count = count + has_child.long()
    num_nodes = (depth >= 0).sum(dim=1)
    return depth, rank, parent, score, num_nodes


def build_ddtree_from_topk(
    logq: torch.Tensor,
    ids: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    include_chain: bool = True,
    horizon: int | None = None,
) -> DraftTree:
    """Build the DDTree of ``budget`` draft nodes from per-depth top-K log-probs and token ids.

    ``logq``/``ids`` are ``[bs, D, K]`` as returned by :func:`draft_topk` (exact for K >=
    min(:func:`exact_topk`, V)) for the first D depths of the drafter's ``horizon`` L (default:
    D); ``root_tokens [bs]`` are the last verified tokens. D may stop at ``min(budget, L)``,
    the deepest a tree of ``budget`` nodes reaches, and the tree is the same. With
    ``include_chain`` and ``budget >= L`` slots ``1..L`` hold the chain ``ids[:, d, 0]`` (depth
    d + 1 at slot d + 1) and the other ``budget - L`` nodes are the best prefixes outside it;
    otherwise the tree is the plain best-first one (module docstring). Raises ``ValueError`` on
    NaN log-probs when the tensors are on the CPU; on CUDA (no host synchronisation allowed) a
    request whose log-probs contain NaN gets a root-only tree, which verifies losslessly.
    """
    budget = _check_budget(budget)
    if logq.dim() != 3 or ids.shape != logq.shape:
        raise ValueError(
            f"logq and ids must both be [bs, L, K]; got {tuple(logq.shape)} and {tuple(ids.shape)}"
        )
    bs, D, K = logq.shape
    L = D if horizon is None else int(horizon)
    if not min(budget, L) <= D <= L:
        raise ValueError(
            f"logq has {D} depths; a tree of budget={budget} under horizon={L} needs between "
            f"min(budget, horizon)={min(budget, L)} and {L}"
        )
    if root_tokens.shape != (bs,):
        raise ValueError(f"root_tokens must be [bs={bs}]; got shape {tuple(root_tokens.shape)}")
    chain = _chain_length(include_chain, budget, L)
    logq = logq.float().contiguous()
    ids = ids.long().contiguous()
    root_tokens = root_tokens.long().contiguous()  # the Triton kernel reads root b at b
    if logq.is_cuda:
        from .triton_kernels import ddtree_select

        tokens, depth, _, parent, score, num_nodes = ddtree_select(
            logq, ids, root_tokens, budget, chain
        )
    else:
        if torch.isnan(logq).any():
            bad = torch.isnan(logq).flatten(1).any(dim=1).nonzero().flatten().tolist()
            raise ValueError(
                f"draft log-probs contain NaN for request(s) {bad}; the drafter produced invalid logits"
            )
        depth, rank, parent, score, num_nodes = _select_torch(logq, budget, chain)
        flat = (depth - 1).clamp(min=0) * K + rank
        tokens = torch.where(
            depth > 0, ids.reshape(bs, D * K).gather(1, flat), root_tokens[:, None]
        )
    return DraftTree(
        tokens=tokens, parents=parent, depths=depth, scores=score, num_nodes=num_nodes, horizon=L
    )


def build_ddtree(
    draft_logits: torch.Tensor,
    budget: int,
    root_tokens: torch.Tensor,
    temperature: float = 1.0,
    include_chain: bool = True,
) -> DraftTree:
    """Select the ``budget`` highest-scoring draft prefixes from per-depth logits ``[bs, L, V]``.

    Score = sum over depths of the log-softmax (of ``logits / temperature``, see :func:`draft_topk`);
    ranks ``< K = min(exact_topk(budget, L, include_chain), V)`` per depth. ``include_chain``
    (default on): when ``budget >= L`` the tree contains the argmax chain to depth L (what
    :func:`build_chain` verifies; the tree temperature does not move an argmax) at slots
    ``1..L``, the rest best-first; see :func:`build_ddtree_from_topk`. NaN logits raise
    ``ValueError`` on the CPU (see :func:`build_ddtree_from_topk` for CUDA).
    """
    budget = _check_budget(budget)
    _check_logits(draft_logits)
    if not draft_logits.is_cuda and torch.isnan(draft_logits).any():
        bad = torch.isnan(draft_logits).flatten(1).any(dim=1).nonzero().flatten().tolist()
        raise ValueError(
            f"draft_logits contain NaN for request(s) {bad}; the drafter produced invalid logits"
        )
    k = exact_topk(budget, draft_logits.shape[1], include_chain)
    logq, ids = draft_topk(draft_logits, min(k, draft_logits.shape[-1]), temperature)
    return build_ddtree_from_topk(logq, ids, budget, root_tokens, include_chain)


def build_chain(draft_logits: torch.Tensor, root_tokens: torch.Tensor) -> DraftTree:
    """Plain DFlash as a tree: the argmax token of every depth, each the child of the previous one.

    Verifying and walking this chain with the tree code is exactly chain speculative decoding.
    """
    _check_logits(draft_logits)
    bs, L, _ = draft_logits.shape
    dev = draft_logits.device
    logq = draft_logits.float().log_softmax(dim=-1)
    best, tok = logq.max(dim=-1)
    steps = torch.arange(L + 1, device=dev)
    return DraftTree(
        tokens=torch.cat((root_tokens.long()[:, None], tok), dim=1),
        parents=(steps - 1).expand(bs, L + 1).contiguous(),
        depths=steps.expand(bs, L + 1).contiguous(),
        scores=torch.cat((best.new_zeros(bs, 1), best.cumsum(dim=1)), dim=1),
        num_nodes=torch.full((bs,), L + 1, dtype=torch.long, device=dev),
        horizon=L,
    )
