"""Tree-aware Gated-DeltaNet verification (torch reference) for hybrid Qwen3.5 / Qwen3-Next targets.

``tree_gdn`` runs one transformers GDN layer over a draft tree and commits the accepted node's states;
``hf_cache`` reads/writes those states in transformers' hybrid cache and patches a whole model for a
tree verify forward.
"""

from .hf_cache import GDNTreeVerifier, is_gdn_layer, read_committed_states, write_committed_states
from .tree_gdn import TreeGDNStates, gdn_tree_commit, gdn_tree_forward, tree_depth

__all__ = [
    "GDNTreeVerifier",
    "TreeGDNStates",
    "gdn_tree_commit",
    "gdn_tree_forward",
    "is_gdn_layer",
    "read_committed_states",
    "tree_depth",
    "write_committed_states",
]
