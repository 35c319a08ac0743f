"""Tree layout for verification: ancestor masks, positions, and SGLang 0.5.23's tree ABI.

The verify forward of a tree needs, per node, the position ``seq_len + depth`` and an attention
mask over the prefix plus the node's ancestors-or-self. SGLang's EAGLE verify path
(``EagleVerifyInput``, ``verify_tree_greedy_func``, the GDN tree kernels) additionally reads the
tree as first-child / next-sibling links; :func:`sglang_tree_abi` produces all of it, in the three
mask layouts of ``TreeMaskMode`` (see shared/notes/sglang-0.5.23.md, "EAGLE tree ABI").

On CUDA one Triton program per (request, block of rows) writes every output; on the CPU the same
definitions are evaluated with torch ops.
"""

from __future__ import annotations

import torch

from .types import DraftTree, TreeABI, TreeMaskMode, bitpack_dtype


def ancestor_mask(tree: DraftTree) -> torch.Tensor:
    """``[bs, N, N]`` bool: ``mask[b, i, j]`` is True when node j is an ancestor of node i or i itself.

    Padding rows see only themselves.
    """
    bs, N = tree.parents.shape
    idx = torch.arange(N, device=tree.parents.device).expand(bs, N)
    mask = torch.zeros(bs, N, N, dtype=torch.bool, device=tree.parents.device)
    mask.scatter_(2, idx.unsqueeze(-1), True)
    cur = tree.parents
    for _ in range(tree.horizon):  # depth <= horizon, so horizon parent hops reach the root
        mask.scatter_(2, torch.where(cur >= 0, cur, idx).unsqueeze(-1), True)
        cur = torch.where(cur >= 0, tree.parents.gather(1, cur.clamp(min=0)), cur)
    return mask


def tree_positions(tree: DraftTree, seq_lens: torch.Tensor) -> torch.Tensor:
    """``[bs, N]`` int64 positions ``seq_len + depth`` (padding slots at ``seq_len``)."""
    return seq_lens.long().unsqueeze(1) + tree.depths.clamp(min=0)


def _child_links(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """First child (lowest index) and next sibling (next higher index) of every node, -1 if none."""
    bs, N = parents.shape
    j = torch.arange(N, device=parents.device)
    big = torch.full((), N, device=parents.device, dtype=torch.long)
    is_child = parents.unsqueeze(1) == j.view(1, N, 1)  # [b, i, j]: j's parent is i
    first = torch.where(is_child, j.view(1, 1, N), big).amin(dim=2)
    same_parent = (parents.unsqueeze(1) == parents.unsqueeze(2)) & (parents.unsqueeze(2) >= 0)
    later = j.view(1, 1, N) > j.view(1, N, 1)
    nxt = torch.where(same_parent & later, j.view(1, 1, N), big).amin(dim=2)
    return torch.where(first == N, -1, first), torch.where(nxt == N, -1, nxt)


def _root_paths(mask: torch.Tensor, depths: torch.Tensor, width: int) -> torch.Tensor:
    """``[bs, N, width]`` int32: column ``t`` of row ``i`` is the ancestor-or-self of node ``i`` at
    depth ``t`` (``mask`` from :func:`ancestor_mask`), -1 beyond node ``i``'s depth; rows of
    padding slots and of nodes deeper than ``width - 1`` are all -1."""
    t = torch.arange(width, device=mask.device)
    hit = mask.unsqueeze(2) & (depths.unsqueeze(1).unsqueeze(2) == t.view(1, 1, width, 1))
    row_ok = ((depths >= 0) & (depths < width)).unsqueeze(-1)
    return torch.where(hit.any(-1) & row_ok, hit.int().argmax(-1), -1).to(torch.int32)


def _pack_rows(mask: torch.Tensor) -> torch.Tensor:
    bs, N, _ = mask.shape
    weights = torch.ones(N, dtype=torch.int64, device=mask.device) << torch.arange(
        N, device=mask.device
    )
    return (mask.long() * weights).sum(dim=-1).reshape(bs * N).to(bitpack_dtype(N))


def sglang_tree_abi(
    tree: DraftTree,
    seq_lens: torch.Tensor,
    mode: TreeMaskMode | int = TreeMaskMode.FULL_MASK,
    seq_lens_sum: int | None = None,
    out: torch.Tensor | None = None,
    path_width: int | None = None,
) -> TreeABI:
    """SGLang 0.5.23 EAGLE tree-verify inputs for ``tree`` (see :class:`TreeABI`).

    ``seq_lens [bs]`` are the verified lengths (the root sits at position ``seq_len``). For
    ``FULL_MASK`` the flat mask has ``sum_b N * (seq_len_b + N)`` entries; pass ``seq_lens_sum``
    (SGLang's batch keeps it on the host) to avoid a device-to-host read of ``seq_lens.sum()``.

    ``out`` (a flat buffer, e.g. the target backend's ``VerifyMask`` buffer, which CUDA graphs
    capture) receives the mask in its leading entries and is returned as ``tree_mask``; then no
    ``seq_lens_sum`` is needed, which is what lets SGLang's overlap scheduler skip the host copy of
    the lengths. The caller guarantees it is large enough (``VerifyMask.fits``: sized for
    ``max_context_len``); the CPU path checks it.

    ``path_width`` adds ``paths`` (``[bs, N, path_width]`` int32 root-first node paths, the GDN tree
    verify's table), written by the same kernel on CUDA.
    """
    try:
        mode = TreeMaskMode(int(mode))
    except ValueError:
        raise ValueError(
            f"mode must be one of {[m.name for m in TreeMaskMode]} (0, 1, 2); got {mode!r}"
        ) from None
    bs, N = tree.tokens.shape
    if seq_lens.shape != (bs,):
        raise ValueError(f"seq_lens must be [bs={bs}]; got shape {tuple(seq_lens.shape)}")
    # SGLang's Triton backend keeps its VerifyMask buffer as uint8, the others as bool
    dtypes = (
        (bitpack_dtype(N),)
        if mode == TreeMaskMode.QLEN_ONLY_BITPACKING
        else (torch.bool, torch.uint8)
    )
    if out is not None and (out.dtype not in dtypes or out.dim() != 1):
        raise ValueError(
            f"out must be a flat buffer of {' or '.join(map(str, dtypes))} for {mode.name}; "
            f"got {out.dtype} of shape {tuple(out.shape)}"
        )
    if path_width is not None and path_width < 1:
        raise ValueError(f"path_width must be >= 1 (the deepest path's length); got {path_width}")
    if mode == TreeMaskMode.FULL_MASK and seq_lens_sum is None and out is None:
        seq_lens_sum = int(seq_lens.sum())
    if tree.tokens.is_cuda:
        from .triton_kernels import tree_layout

        return tree_layout(tree, seq_lens.long(), mode, seq_lens_sum, out, path_width)
    seq_lens = seq_lens.long()
    dev = tree.tokens.device
    first, nxt = _child_links(tree.parents)
    mask = ancestor_mask(tree)
    if mode == TreeMaskMode.QLEN_ONLY:
        flat_mask = mask.reshape(-1)
    elif mode == TreeMaskMode.QLEN_ONLY_BITPACKING:
        flat_mask = _pack_rows(mask)
    else:
        flat_mask = torch.cat(
            [
                torch.cat([mask.new_ones(N, int(seq_lens[b])), mask[b]], dim=1).reshape(-1)
                for b in range(bs)
            ]
        )
        if out is None and flat_mask.numel() != seq_lens_sum * N + bs * N * N:
            raise ValueError(
                f"seq_lens_sum={seq_lens_sum} disagrees with sum(seq_lens)={int(seq_lens.sum())}"
            )
    if out is not None:
        if out.numel() < flat_mask.numel():
            raise ValueError(
                f"out holds {out.numel()} mask entries; this batch's {mode.name} mask needs "
                f"{flat_mask.numel()}"
            )
        out[: flat_mask.numel()].copy_(flat_mask)
        flat_mask = out
    return TreeABI(
        draft_tokens=tree.tokens.reshape(-1),
        positions=tree_positions(tree, seq_lens).reshape(-1),
        retrieve_index=torch.arange(bs * N, device=dev).view(bs, N),
        retrieve_next_token=first,
        retrieve_next_sibling=nxt,
        tree_mask=flat_mask,
        mode=mode,
        paths=None if path_width is None else _root_paths(mask, tree.depths, path_width),
    )
