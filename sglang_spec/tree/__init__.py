"""Framework-free DDTree core: build, layout (SGLang tree ABI) and walks, batched over requests.

Everything here is plain torch (plus Triton kernels on CUDA) and never synchronises the host with
the device on CUDA. The API contract is documented in docs/tree-api.md.
"""

from .build import (
    DEFAULT_TREE_TEMPERATURE,
    build_chain,
    build_ddtree,
    build_ddtree_from_topk,
    check_tree_temperature,
    draft_topk,
    exact_topk,
    merge_sharded_topk,
)
from .head import DraftHead, DraftTreeGraphs, StagedDraftBlock, StaticDraftTree, draft_tree
from .layout import ancestor_mask, sglang_tree_abi, tree_positions
from .topk import StaticAllGather, VocabShard, shard_logits, sharded_topk
from .types import DraftTree, TreeABI, TreeMaskMode, WalkResult, bitpack_dtype
from .walk import sample_target_tokens, walk_greedy, walk_sample

__all__ = [
    "DraftHead",
    "DraftTree",
    "DraftTreeGraphs",
    "StagedDraftBlock",
    "StaticAllGather",
    "StaticDraftTree",
    "TreeABI",
    "TreeMaskMode",
    "VocabShard",
    "WalkResult",
    "ancestor_mask",
    "bitpack_dtype",
    "build_chain",
    "build_ddtree",
    "build_ddtree_from_topk",
    "DEFAULT_TREE_TEMPERATURE",
    "check_tree_temperature",
    "draft_topk",
    "draft_tree",
    "exact_topk",
    "merge_sharded_topk",
    "sample_target_tokens",
    "shard_logits",
    "sharded_topk",
    "sglang_tree_abi",
    "tree_positions",
    "walk_greedy",
    "walk_sample",
]
