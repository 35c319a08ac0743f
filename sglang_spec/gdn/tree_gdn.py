"""Tree-aware Gated-DeltaNet (GDN) verification for a transformers GDN layer, in plain torch.

A draft tree of N slots is verified in one forward. Node ``i`` has parent ``parents[b, i] < i``; node 0 is
the root (parent -1); a slot ``i > 0`` with parent -1 is padding. For every real node the layer output
equals running its root-to-node path token by token through the layer, starting from the committed
cache states:

* conv: the short causal window of node ``i`` holds the mixed-qkv inputs of its ancestors (nearest
  last, node ``i`` itself in the final column), continued by the committed conv state before the root;
* recurrence: node ``i`` starts from its parent's state after the parent's update (the root from the
  committed state); nodes of one depth are updated together, one Python step per tree level.

``gdn_tree_commit`` then picks the accepted node's state and window, which are exactly the states the
layer would hold after sequentially processing the accepted path.

The math mirrors transformers' torch fallbacks (``causal_conv1d_update`` and
``torch_recurrent_gated_delta_rule`` with ``use_qk_l2norm_in_kernel=True``): fp32 recurrence,
l2-normalised q/k (eps 1e-6), q scaled by ``head_k_dim ** -0.5``, q/k heads repeated for GQA.
Supported layers: Qwen3.5 / Qwen3.5-MoE (``in_proj_qkv``/``in_proj_z``/``in_proj_b``/``in_proj_a``)
and Qwen3-Next (fused ``in_proj_qkvz``/``in_proj_ba`` split by ``fix_query_key_value_ordering``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN


@dataclass
class TreeGDNStates:
    """Per-node states of one GDN layer after a tree forward.

    ssm:   [bs, N, num_v_heads, head_k_dim, head_v_dim] fp32, recurrent state after each node's update
           (the transformers ``recurrent_states`` layout).
    conv:  [bs, N, conv_dim, kernel] conv window ending at each node (the ``conv_states`` layout).
    depth: [bs, N] node depth, root 0, padding -1 (padding slots hold zeros).
    """

    ssm: torch.Tensor
    conv: torch.Tensor
    depth: torch.Tensor


def tree_depth(parents: torch.Tensor) -> torch.Tensor:
    """Depth of every node of ``parents`` [bs, N] (root 0, padding -1), by pointer doubling."""
    n = parents.shape[1]
    slot = torch.arange(n, device=parents.device)
    if (parents[:, 0] != -1).any() or (parents >= slot).any():
        raise ValueError("parents must satisfy parents[:, 0] == -1 and parents[b, i] < i")
    valid = (parents >= 0) | (slot == 0)
    if (~valid.gather(1, parents.clamp(min=0)) & (parents >= 0)).any():
        raise ValueError("a padding slot (i > 0, parent -1) cannot be a parent")
    depth = (parents >= 0).long()  # distance from node to `jump`
    jump = parents.clone()
    while (jump >= 0).any():
        has = jump >= 0
        j = jump.clamp(min=0)
        depth = torch.where(has, depth + depth.gather(1, j), depth)
        jump = torch.where(has, jump.gather(1, j), jump)
    return torch.where(valid, depth, -1)


def _conv_window_index(parents: torch.Tensor, kernel: int) -> torch.Tensor:
    """Indices [bs, N, kernel] into ``cat(committed conv columns (kernel), node inputs (N))``.

    Column ``kernel - 1`` is the node itself, column ``kernel - 1 - d`` its d-th ancestor; above the root
    the window continues into the committed conv state (its last column is the token before the root).
    """
    bs, n = parents.shape
    state_cols = torch.arange(kernel, device=parents.device)
    ext_parent = torch.cat(
        [
            (state_cols - 1).clamp(min=0).expand(bs, kernel),
            torch.where(parents >= 0, parents + kernel, kernel - 1),
        ],
        dim=1,
    )
    cols = [torch.arange(kernel, kernel + n, device=parents.device).expand(bs, n)]
    for _ in range(kernel - 1):
        cols.append(ext_parent.gather(1, cols[-1]))
    return torch.stack(cols[::-1], dim=-1)


def _project(layer, hidden: torch.Tensor):
    """Input projections -> (mixed_qkv [bs, N, conv_dim], z [bs, N, Hv, dv], b, a [bs, N, Hv])."""
    bs, n, _ = hidden.shape
    if hasattr(layer, "in_proj_qkvz"):  # Qwen3-Next: per-k-head interleaved fused projections
        q, k, v, z, b, a = layer.fix_query_key_value_ordering(
            layer.in_proj_qkvz(hidden), layer.in_proj_ba(hidden)
        )
        mixed_qkv = torch.cat([x.reshape(bs, n, -1) for x in (q, k, v)], dim=-1)
        return mixed_qkv, z, b, a
    z = layer.in_proj_z(hidden).reshape(bs, n, -1, layer.head_v_dim)
    return layer.in_proj_qkv(hidden), z, layer.in_proj_b(hidden), layer.in_proj_a(hidden)


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _delta_rule_step(state, q, k, v, g, beta):
    """One gated-delta-rule token for a batch of nodes: state [M, Hv, dk, dv], q/k [M, Hv, dk], v [M, Hv, dv]."""
    state = state * g.exp()[..., None, None]
    kv_mem = (state * k.unsqueeze(-1)).sum(dim=-2)
    delta = (v - kv_mem) * beta.unsqueeze(-1)
    state = state + k.unsqueeze(-1) * delta.unsqueeze(-2)
    return state, (state * q.unsqueeze(-1)).sum(dim=-2)


@torch.no_grad()
def gdn_tree_forward(
    layer,
    hidden: torch.Tensor,
    parents: torch.Tensor,
    conv_state: torch.Tensor,
    ssm_state: torch.Tensor,
) -> tuple[torch.Tensor, TreeGDNStates]:
    """Run GDN ``layer`` over a draft tree without touching any cache.

    hidden [bs, N, hidden_size] (the layer input, i.e. after input_layernorm); parents [bs, N] long;
    conv_state [bs, conv_dim, kernel] and ssm_state [bs, Hv, dk, dv]: committed states before the root.
    Returns (out [bs, N, hidden_size], per-node states); padding rows of ``out`` are zero.
    """
    bs, n, _ = hidden.shape
    kernel = layer.conv_kernel_size
    depth = tree_depth(parents)
    valid = depth >= 0

    mixed_qkv, z, b, a = _project(layer, hidden)
    ext = torch.cat([conv_state.transpose(1, 2).to(mixed_qkv.dtype), mixed_qkv], dim=1)
    win = _conv_window_index(parents, kernel)
    windows = ext[torch.arange(bs, device=ext.device)[:, None, None], win].transpose(
        -1, -2
    )  # [bs, N, C, K]
    windows = torch.where(valid[..., None, None], windows, 0)
    conv_dim = windows.shape[2]
    conv_out = F.conv1d(
        windows.reshape(bs * n, conv_dim, kernel).to(layer.conv1d.weight.dtype),
        layer.conv1d.weight,
        layer.conv1d.bias,
        groups=conv_dim,
    )
    conv_out = ACT2FN[layer.activation](conv_out).reshape(bs, n, conv_dim).to(mixed_qkv.dtype)

    query, key, value = torch.split(
        conv_out, [layer.key_dim, layer.key_dim, layer.value_dim], dim=-1
    )
    query = query.reshape(bs, n, -1, layer.head_k_dim)
    key = key.reshape(bs, n, -1, layer.head_k_dim)
    value = value.reshape(bs, n, -1, layer.head_v_dim)
    beta = b.sigmoid()
    g = -layer.A_log.float().exp() * F.softplus(a.float() + layer.dt_bias)
    rep = layer.num_v_heads // layer.num_k_heads
    if rep > 1:
        query = query.repeat_interleave(rep, dim=2)
        key = key.repeat_interleave(rep, dim=2)
    out_dtype = query.dtype
    query, key = _l2norm(query.float()), _l2norm(key.float())
    query = query / (query.shape[-1] ** 0.5)
    value, beta = value.float(), beta.float()

    ssm = hidden.new_zeros((bs, n, *ssm_state.shape[1:]), dtype=torch.float32)
    core = torch.zeros_like(value)
    for d in range(int(depth.max()) + 1):
        bi, ni = (depth == d).nonzero(as_tuple=True)
        init = ssm_state[bi].float() if d == 0 else ssm[bi, parents[bi, ni]]
        step_inputs = (x[bi, ni] for x in (query, key, value, g, beta))
        ssm[bi, ni], core[bi, ni] = _delta_rule_step(init, *step_inputs)

    core = layer.norm(
        core.to(out_dtype).reshape(-1, layer.head_v_dim), z.reshape(-1, layer.head_v_dim)
    )
    out = layer.out_proj(core.reshape(bs, n, -1))
    return out, TreeGDNStates(ssm=ssm, conv=windows, depth=depth)


def gdn_tree_commit(
    states: TreeGDNStates, accepted_node: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """States to store after acceptance: (conv_state [bs, C, K], ssm_state [bs, Hv, dk, dv] fp32).

    ``accepted_node`` [bs] is the deepest accepted node of each row (0 = only the root was accepted);
    the result equals the layer's states after sequentially processing the root-to-node path.
    """
    rows = torch.arange(accepted_node.shape[0], device=accepted_node.device)
    if (states.depth[rows, accepted_node] < 0).any():
        raise ValueError("accepted_node points at a padding slot")
    return states.conv[rows, accepted_node], states.ssm[rows, accepted_node]
