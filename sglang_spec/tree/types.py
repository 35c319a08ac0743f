"""Data types shared by the tree build, the layout, the walks and the Triton kernels.

Conventions (batched over requests, ``N = 1 + B`` slots per request, B = budget):
slot 0 is the root (the last verified token), real nodes occupy slots ``[0, num_nodes)`` in an order
where every parent precedes its children, and unused slots are padding with ``parents = depths = -1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch


class TreeMaskMode(IntEnum):
    """SGLang 0.5.23's ``kernels/ops/speculative/spec_tree.py:TreeMaskMode`` (same values)."""

    FULL_MASK = 0  # per request: N rows x (seq_len + N) columns, bool, requests concatenated
    QLEN_ONLY = 1  # per request: N x N bool
    QLEN_ONLY_BITPACKING = 2  # per request: N words (uint8/16/32), bit j of row i = column j


def bitpack_dtype(width: int) -> torch.dtype:
    """Word type of a bit-packed mask row, as SGLang picks it (uint8 / uint16 / uint32 by width)."""
    if not 1 <= width <= 32:
        raise ValueError(
            f"QLEN_ONLY_BITPACKING holds 1 to 32 verify tokens per request; got width {width}"
        )
    bits = 8 if width <= 8 else 16 if width <= 16 else 32
    return {8: torch.uint8, 16: torch.uint16, 32: torch.uint32}[bits]


@dataclass
class DraftTree:
    """A DDTree draft tree for each request of a batch (all tensors ``[bs, N]`` unless noted)."""

    tokens: torch.Tensor  # int64; padding slots repeat the root token
    parents: torch.Tensor  # int64; -1 at the root and at padding
    depths: torch.Tensor  # int64; 0 at the root, -1 at padding
    scores: torch.Tensor  # float32 cumulative draft log-probability; 0 at the root, -inf at padding
    num_nodes: torch.Tensor  # [bs] int64: real nodes including the root
    horizon: int  # L, the deepest possible depth (drafter block size - 1)

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def width(self) -> int:
        """N = 1 + budget: the verify width."""
        return self.tokens.shape[1]


@dataclass
class WalkResult:
    """Outcome of walking a verified tree."""

    accepted: torch.Tensor  # [bs, L+1] int64 node indices, root first, padded with -1
    accept_len: torch.Tensor  # [bs] int64 accepted draft nodes (root excluded)
    bonus: torch.Tensor  # [bs] int64 target token at the deepest accepted node
    target_tokens: torch.Tensor  # [bs, N] int64 the target's token at every node (argmax or sample)


@dataclass
class TreeABI:
    """SGLang 0.5.23's EAGLE tree verify inputs (``EagleVerifyInput`` fields), built from a DraftTree."""

    draft_tokens: torch.Tensor  # [bs*N] int64
    positions: torch.Tensor  # [bs*N] int64: seq_len + depth
    retrieve_index: torch.Tensor  # [bs, N] int64: b*N + i
    retrieve_next_token: torch.Tensor  # [bs, N] int64: lowest-index child or -1
    retrieve_next_sibling: torch.Tensor  # [bs, N] int64: next higher-index sibling or -1
    tree_mask: torch.Tensor  # flat, layout given by mode
    mode: TreeMaskMode
    # [bs, N, W] int32 root-first node paths (-1 padded; rows of padding slots and of nodes deeper
    # than W - 1 all -1), when asked for (``path_width=W``): the GDN tree verify's table
    paths: torch.Tensor | None = None
