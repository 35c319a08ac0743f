"""Tree-aware Gated-DeltaNet verification (torch reference) for hybrid Qwen3.5 / Qwen3-Next targets.

``tree_gdn`` runs one transformers GDN layer over a draft tree and commits the accepted node's states;
``hf_cache`` reads/writes those states in transformers' hybrid cache and patches a whole model for a
tree verify forward. ``tree_recurrence`` is the recurrence alone without a state per node
(``tree_gated_delta_rule``, ``replay_path_state``; Triton kernels on CUDA in ``triton_tree_recurrence``,
and the blocked-WY solve the patched SGLang verify runs in ``triton_tree_wy``), the core of verifying
a tree with SGLang's ReplaySSM-style caching (docs/gdn-tree-caching.md).
"""

from .hf_cache import GDNTreeVerifier, is_gdn_layer, read_committed_states, write_committed_states
from .tree_gdn import TreeGDNStates, gdn_tree_commit, gdn_tree_forward, tree_depth
from .tree_recurrence import replay_path_state, tree_gated_delta_rule, tree_paths

__all__ = [
    "GDNTreeVerifier",
    "TreeGDNStates",
    "gdn_tree_commit",
    "gdn_tree_forward",
    "is_gdn_layer",
    "read_committed_states",
    "replay_path_state",
    "tree_depth",
    "tree_gated_delta_rule",
    "tree_paths",
    "write_committed_states",
]
