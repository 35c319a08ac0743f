"""Walking a verified tree: greedy (target argmax) and lossless sampling.

Both walks descend from the root while the target's token at the current node equals the token
of one of its children (children of a node carry distinct tokens, so at most one matches). The
emitted tokens are the accepted nodes' tokens followed by the bonus token: the target's token at
the deepest accepted node.

``walk_sample`` draws one token per node from the target distribution (temperature, top-k, top-p)
and walks on those draws. Because the tree is a deterministic function of the draft, each emitted
token is an exact sample from the target given the accepted prefix (shared/notes/ddtree-dflash.md
section 4); no ``min(1, p/q)`` ratio is involved.
"""

from __future__ import annotations

import torch

from .types import DraftTree, WalkResult


def _walk_torch(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    bs, N = tree.tokens.shape
    dev = tree.tokens.device
    rows = torch.arange(bs, device=dev)
    slots = torch.arange(N, device=dev)
    accepted = torch.full((bs, tree.horizon + 1), -1, dtype=torch.long, device=dev)
    accepted[:, 0] = 0
    cur = torch.zeros(bs, dtype=torch.long, device=dev)
    alive = torch.ones(bs, dtype=torch.bool, device=dev)
    for step in range(1, tree.horizon + 1):
        want = target_tokens[rows, cur]
        match = (tree.parents == cur[:, None]) & (tree.tokens == want[:, None]) & alive[:, None]
        found = match.any(dim=1)
        child = torch.where(match, slots, N).amin(dim=1)
        cur = torch.where(found, child, cur)
        accepted[:, step] = torch.where(found, child, -1)
        alive = found
    accept_len = (accepted >= 0).sum(dim=1) - 1
    return WalkResult(accepted, accept_len, target_tokens[rows, cur], target_tokens)


def walk_greedy(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    """Accept the longest root-to-node path whose every token is the target's token at its parent.

    ``target_tokens [bs, N]`` is the target's chosen token at every node (e.g. the argmax).
    """
    if target_tokens.shape != tree.tokens.shape:
        raise ValueError(
            f"target_tokens must be [bs, N] = {tuple(tree.tokens.shape)}; got {tuple(target_tokens.shape)}"
        )
    target_tokens = target_tokens.long()
    if target_tokens.is_cuda:
        from .triton_kernels import tree_walk

        return tree_walk(tree, target_tokens)
    return _walk_torch(tree, target_tokens)


def _as_column(value, bs: int, device, dtype, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, device=device, dtype=dtype)
    if t.dim() == 0:
        t = t.expand(bs)
    if t.shape != (bs,):
        raise ValueError(
            f"{name} must be a scalar or a [bs={bs}] tensor; got shape {tuple(t.shape)}"
        )
    return t.unsqueeze(1)


def sample_target_tokens(
    logits: torch.Tensor, temperature, top_p=1.0, top_k=-1, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One exact draw per row of ``logits [bs, N, V]`` after temperature, top-k and top-p.

    Rows with temperature 0 take the argmax. ``top_k <= 0`` and ``top_p >= 1`` disable those filters.
    Sampling uses the exponential race ``argmax(p / E)``, ``E ~ Exp(1)``, which draws exactly from ``p``.
    """
    bs, N, V = logits.shape
    dev = logits.device
    temp = _as_column(temperature, bs, dev, torch.float32, "temperature")
    top_p = _as_column(top_p, bs, dev, torch.float32, "top_p")
    top_k = _as_column(top_k, bs, dev, torch.long, "top_k")
    if (
        not dev.type == "cuda"
    ):  # value checks read the tensors: only where that costs no device sync
        for name, t, ok, valid in (
            ("temperature", temp, temp >= 0, ">= 0"),
            ("top_p", top_p, (top_p > 0) & (top_p <= 1), "in (0, 1]"),
        ):
            if not bool(ok.all()):
                raise ValueError(f"{name} must be {valid}; got {t.flatten().tolist()}")
    logits = logits.float()
    greedy = logits.argmax(dim=-1)
    scaled = logits / temp.clamp(min=1e-6).unsqueeze(-1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    rank = torch.arange(V, device=dev)
    k = torch.where(top_k > 0, top_k, V).unsqueeze(-1)
    keep = (rank < k) & (probs.cumsum(dim=-1) - probs < top_p.unsqueeze(-1))
    keep[..., 0] = True
    probs = torch.where(keep, probs, 0.0)
    race = probs / torch.empty_like(probs).exponential_(generator=generator)
    sampled = order.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)
    return torch.where(temp == 0, greedy, sampled)


def walk_sample(
    tree: DraftTree,
    target_logits: torch.Tensor,
    temperature,
    top_p=1.0,
    top_k=-1,
    generator: torch.Generator | None = None,
) -> WalkResult:
    """Lossless sampling walk: sample the target at every node, then descend while the sample is a child.

    ``target_logits [bs, N, V]``; ``temperature``, ``top_p``, ``top_k`` are scalars or ``[bs]`` tensors.
    """
    if target_logits.dim() != 3 or target_logits.shape[:2] != tree.tokens.shape:
        raise ValueError(
            f"target_logits must be [bs, N, V] with [bs, N] = {tuple(tree.tokens.shape)}; got {tuple(target_logits.shape)}"
        )
    return walk_greedy(
        tree, sample_target_tokens(target_logits, temperature, top_p, top_k, generator)
    )
