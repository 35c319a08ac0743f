"""``DDTreeVerifyInput``: SGLang's EAGLE tree verify input, for an irregular DDTree.

One constructor, :meth:`DDTreeVerifyInput.create`, serves both callers (as vLLM's
``SpecDecodeMetadata`` has ``make_dummy`` beside its builder): the worker builds it from a tree's
SGLang ABI every decode step (:func:`verify_input_from_tree`), and the CUDA-graph hook builds the
placeholder a target graph is captured with (no ABI: the ``retrieve_*`` buffers are filled at
replay). Importing this module imports SGLang.

Both also carry, when the server runs the GDN tree ReplaySSM (``--enable-linear-replayssm-spec``),
``retrieve_tree_paths`` (``[bs, N, D + 1]`` int32 with ``D = min(L, budget)`` =
``spec_steps``, the width of the backend's per-bs graph buffer; node ``i``'s root-first path of
node indices, ``-1`` padded), which the GDN tree ReplaySSM verify of patch 0002 reads
(docs/gdn-tree-caching.md §4, row 5). A step's table comes from the tree layout (the ABI's
``paths``, written by its one kernel on CUDA); the capture placeholder's is a valid tree of the
graph's shape (every node a child of the root: :func:`placeholder_paths`), since the graph buffers
are filled at replay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.eagle_info import EagleVerifyInput

from sglang_spec.gdn import tree_paths
from sglang_spec.plugin.config import DDTreeConfig
from sglang_spec.tree import DraftTree, TreeABI, TreeMaskMode, sglang_tree_abi


@dataclass
class DDTreeVerifyInput(EagleVerifyInput):
    """EAGLE tree verify input for an irregular DDTree.

    Subclasses EagleVerifyInput so that SGLang's attention backends, the hybrid linear-attention
    backend (update_verify_buffers_to_fill_after_draft and graph replay refresh retrieve_* only
    for EagleVerifyInput instances) and eagle_sample treat it as a tree. ``spec_steps`` holds the
    deepest a tree can reach, ``min(L, budget)``, so ``max_tree_depth = spec_steps + 1`` is the
    accept_index width and never exceeds the verify width.
    """

    # [bs, N, L + 1] int32 root-first node paths (-1 padded), for the GDN tree verify (0002).
    retrieve_tree_paths: torch.Tensor | None = None

    @property
    def tree_topk(self) -> int:
        # Irregular tree (no fixed per-level branching), as NgramVerifyInput.
        return -1

    @classmethod
    def create(
        cls,
        config: DDTreeConfig,
        *,
        width: int,
        custom_mask: torch.Tensor | None,
        abi: TreeABI | None = None,
        paths: torch.Tensor | None = None,
        seq_lens_sum: int | None = None,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> DDTreeVerifyInput:
        """The verify input of a tree (``abi``), or without ``abi`` the placeholder a target CUDA
        graph captures (``custom_mask`` = the graph's mask buffer). ``paths`` is the
        ``retrieve_tree_paths`` table, if any (see the module docstring). ``width`` is the tokens
        per request of the verify pass."""
        return cls(
            draft_token=None if abi is None else abi.draft_tokens,
            custom_mask=custom_mask,
            positions=None if abi is None else abi.positions,
            retrieve_index=None if abi is None else abi.retrieve_index,
            retrieve_next_token=None if abi is None else abi.retrieve_next_token,
            retrieve_next_sibling=None if abi is None else abi.retrieve_next_sibling,
            retrieve_cum_len=None,
            spec_steps=config.max_depth,
            topk=config.eagle_topk,
            draft_token_num=int(width),
            capture_hidden_mode=CaptureHiddenMode.FULL,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            retrieve_tree_paths=paths,
        )


def placeholder_paths(
    config: DDTreeConfig, bs: int, width: int, device: torch.device | str
) -> torch.Tensor:
    """The ``retrieve_tree_paths`` a target graph of ``bs`` requests captures with: the table of
    the tree whose nodes are all children of the root."""
    parents = torch.zeros((bs, width), dtype=torch.int64, device=device)
    parents[:, 0] = -1
    return tree_paths(parents, width=config.max_depth + 1).to(torch.int32)


def verify_input_from_tree(
    tree: DraftTree,
    seq_lens: torch.Tensor,
    config: DDTreeConfig,
    *,
    mask_mode: int | None = None,
    seq_lens_sum: int | None = None,
    mask_buffer: torch.Tensor | None = None,
    seq_lens_cpu: torch.Tensor | None = None,
    with_paths: bool = False,
) -> DDTreeVerifyInput:
    """The SGLang tree ABI of ``tree``, packed into a DDTreeVerifyInput.

    With ``mask_buffer`` (the target backend's VerifyMask buffer, which CUDA graphs capture; the
    caller passes it only when ``VerifyMask.fits`` the batch) the mask is written straight into it,
    as ``build_eagle_verify_input`` does, and ``seq_lens_sum`` is not needed (SGLang's overlap
    scheduler leaves it unset). ``with_paths`` adds ``retrieve_tree_paths``, which only the GDN
    tree ReplaySSM verify reads.
    """
    mode = TreeMaskMode.FULL_MASK if mask_mode is None else TreeMaskMode(int(mask_mode))
    abi = sglang_tree_abi(
        tree,
        seq_lens,
        mode=mode,
        seq_lens_sum=seq_lens_sum,
        out=mask_buffer,
        path_width=config.max_depth + 1 if with_paths else None,
    )
    return DDTreeVerifyInput.create(
        config,
        width=int(tree.tokens.shape[1]),
        custom_mask=abi.tree_mask,
        abi=abi,
        paths=abi.paths,
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=seq_lens_cpu,
    )
