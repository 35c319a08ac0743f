"""Bridge between tree GDN verification and transformers' hybrid cache (transformers 5.19).

A Qwen3.5 / Qwen3-Next model builds ``DynamicCache(config=...)``; each ``linear_attention`` layer is a
``transformers.cache_utils.LinearAttentionLayer`` at ``cache.layers[layer_idx]`` holding one state
(state_idx 0) in dicts:

* ``conv_states[0]``      [bs, conv_dim, conv_kernel_size]: the last ``kernel`` mixed-qkv inputs
  (pre-conv), oldest first; ``conv_kernel_size[0]`` is the kernel. With ``record_past`` active the
  tensor may be longer; only its last ``kernel`` columns are the live window.
* ``recurrent_states[0]`` [bs, num_v_heads, head_k_dim, head_v_dim], fp32.
* ``has_previous_state[0]`` is True once a prefill has run.

(SGLang's MambaPool stores conv as [conv_dim, kernel - 1] and the SSM state transposed, [Hv, dv, dk].)

``GDNTreeVerifier`` lets a reference engine run the whole HF model over a tree: while active, every GDN
layer runs ``gdn_tree_forward`` from the cache's committed states instead of its own forward (the
cache's linear-attention states are left untouched), and ``commit`` writes the accepted node's states.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from .tree_gdn import TreeGDNStates, gdn_tree_commit, gdn_tree_forward


def _linear_layer(cache, layer_idx: int) -> LinearAttentionCacheLayerMixin:
    layer = cache.layers[layer_idx]
    if not isinstance(layer, LinearAttentionCacheLayerMixin) or not layer.has_previous_state[0]:
        raise ValueError(
            f"cache layer {layer_idx} is not a linear-attention layer with prefilled state"
        )
    return layer


def read_committed_states(cache, layer_idx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv_state [bs, C, K], ssm_state [bs, Hv, dk, dv]) committed in ``cache`` for GDN layer ``layer_idx``."""
    layer = _linear_layer(cache, layer_idx)
    return layer.conv_states[0][..., -layer.conv_kernel_size[0] :], layer.recurrent_states[0]


def write_committed_states(
    cache, layer_idx: int, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> None:
    """Store committed states into ``cache`` in place (keeps the buffers' addresses and dtypes)."""
    layer = _linear_layer(cache, layer_idx)
    if layer.conv_states[0].shape == conv_state.shape:
        layer.conv_states[0].copy_(conv_state)
    else:  # a record_past buffer longer than the kernel: the committed window replaces it
        layer.conv_states[0] = conv_state.to(layer.conv_states[0].dtype).clone()
    layer.recurrent_states[0].copy_(ssm_state)


def is_gdn_layer(module: torch.nn.Module) -> bool:
    """True for the GDN layers ``gdn_tree_forward`` supports (Qwen3.5, Qwen3.5-MoE, Qwen3-Next)."""
    return hasattr(module, "A_log") and (
        hasattr(module, "in_proj_qkv") or hasattr(module, "in_proj_qkvz")
    )


class GDNTreeVerifier:
    """Context manager that makes every GDN layer of ``model`` tree-aware for one verify forward.

    ``parents`` [bs, N] describes the tree of the forward's N input tokens. Inside the ``with`` block
    each GDN layer reads its committed states from the ``cache_params`` it is called with and records
    its per-node ``TreeGDNStates`` in ``self.states[layer_idx]``. Attention layers are not touched: the
    caller passes the ancestor mask and positions, and trims their KV cache after acceptance. The 2-D
    padding mask HF hands to linear layers is ignored: padding slots are described by ``parents``.
    """

    def __init__(self, model: torch.nn.Module, parents: torch.Tensor):
        self.layers = [m for m in model.modules() if is_gdn_layer(m)]
        self.parents = parents
        self.states: dict[int, TreeGDNStates] = {}

    def __enter__(self) -> GDNTreeVerifier:
        for layer in self.layers:
            layer.forward = self._tree_forward(layer)
        return self

    def __exit__(self, *exc) -> None:
        for layer in self.layers:
            del layer.forward

    def _tree_forward(self, layer):
        def forward(hidden_states, cache_params=None, attention_mask=None, **kwargs):  # noqa: ARG001 (HF GatedDeltaNet.forward signature; a tree has no padding mask)
            conv_state, ssm_state = read_committed_states(cache_params, layer.layer_idx)
            out, states = gdn_tree_forward(
                layer, hidden_states, self.parents, conv_state, ssm_state
            )
            self.states[layer.layer_idx] = states
            return out

        return forward

    def commit(self, cache, accepted_node: torch.Tensor) -> None:
        """Write every recorded layer's accepted-node states (``accepted_node`` [bs]) into ``cache``."""
        for layer_idx, states in self.states.items():
            write_committed_states(cache, layer_idx, *gdn_tree_commit(states, accepted_node))
