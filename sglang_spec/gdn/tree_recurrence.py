"""Gated-DeltaNet recurrence over a draft tree without a recurrent state per node.

Entry points (framework-free torch on any device; on CUDA they run the Triton kernels of
``triton_tree_recurrence``):

* ``tree_gated_delta_rule(q, k, v, g, beta, parents, initial_state) -> o`` -- the output of every
  tree node, each node seeing only its root-to-node path;
* ``replay_path_state(k, v, g, beta, path, initial_state) -> state`` -- the state after one path's
  updates (the commit of an accepted path).

Semantics, for each real node ``i`` with root-to-node path ``a_0 = 0, ..., a_m = i``: starting from
``S = initial_state``, for each ``t`` on the path ``S = exp(g_t) * S; u = beta_t * (v_t - S^T k_t);
S = S + k_t (x) u``, and ``o_i = S^T q_i`` after node ``i``'s own update. No normalisation or scaling
happens inside (callers l2-normalise q and k and scale q by ``K ** -0.5``); everything is computed
in float32 and returned as float32.

Layouts (GQA as in Qwen3.5 / Qwen3-Next, where 16 key heads serve 48 value heads): ``q, k
[bs, N, Hk, K]``, ``v [bs, N, Hv, V]``, ``g, beta [bs, N, Hv]``, ``initial_state [bs, Hv, K, V]``
(the transformers layout; SGLang's pool stores ``[Hv, V, K]``), ``o [bs, N, Hv, V]``. ``Hk`` must
divide ``Hv``; value head ``h`` reads key head ``h // (Hv // Hk)`` (``repeat_interleave`` of q/k, as
transformers and SGLang's kernels do). ``Hk == Hv`` is the plain ``[bs, N, H, K]`` layout.
``parents [bs, N]``: ``parents[:, 0] = -1`` (the root starts from ``initial_state``), ``parents[b, i]
< i`` for real nodes and ``-1`` for padding slots ``i > 0``, which are returned as zeros.

How, without a ``[K, V]`` state per node (the WY form of the delta rule on a tree): with
``gamma_i`` the sum of ``g`` along node ``i``'s path (``gamma_i - gamma_s <= 0`` for an ancestor
``s``), the state after node ``i`` is ``S_i = exp(gamma_i) S_0 + sum_{s on path(i)}
exp(gamma_i - gamma_s) k_s u_s^T``, so every node needs only its ancestors' update vectors ``u``::

    u_i = beta_i * (v_i - exp(gamma_i) S_0^T k_i - sum_{s < i on path} exp(gamma_i - gamma_s) (k_s.k_i) u_s)
    o_i = exp(gamma_i) S_0^T q_i + sum_{s <= i on path} exp(gamma_i - gamma_s) (k_s.q_i) u_s

This is the chunked causal WY form with the ancestor mask in place of the causal one. Node ``i``'s
ancestors come from ``tree_paths`` (``[bs, N, W]``, root first, ``W`` = the deepest path's length).
Memory beyond inputs and outputs: a few tensors of ``o``'s size (``S_0^T k``, ``S_0^T q`` and the
``u`` vectors), the path table and per-node scalars -- no per-node state. The torch core walks the
tree level by level (one step per depth, one inner step per ancestor); the Triton kernel runs one
program per (request, value head, value tile), holds its ``[K, BV]`` tile of ``S_0`` in registers
and visits the nodes in index order.
"""

from __future__ import annotations

import torch

from .recurrence_inputs import check_inputs
from .tree_gdn import tree_depth


def tree_paths(parents: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """Root-first path of every node: ``[bs, N, width]`` int64, ``paths[b, i, t]`` the node at depth
    ``t`` on node ``i``'s root path (``paths[b, i, depth_i] = i``), ``-1`` beyond it and on padding rows.

    Without ``width``, ``parents`` is validated (raising ``ValueError``) and ``width`` is the deepest
    path's length (both read back from the device). With ``width`` nothing is read back (CUDA-graph
    safe): ``parents`` must be valid, and a node deeper than ``width - 1`` gets a padding row.
    """
    if parents.dim() != 2 or parents.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"parents must be an int32/int64 [bs, N] tensor; got {parents.dtype} {tuple(parents.shape)}"
        )
    parents = parents.long()
    bs, n = parents.shape
    if width is None:
        width = int(tree_depth(parents).max()) + 1
    elif width < 1:
        raise ValueError(f"width must be >= 1; got {width}")
    slot = torch.arange(n, device=parents.device)
    real = (parents >= 0) | (slot == 0)
    # hops[j] = the j-th ancestor of every node (-1 above the root)
    hops = [torch.where(real, slot, -1)]
    for _ in range(width):
        up = hops[-1]
        hops.append(torch.where(up >= 0, parents.gather(1, up.clamp(min=0)), -1))
    too_deep = hops.pop() >= 0
    hops = torch.stack(hops, -1)  # [bs, N, width]: hops[..., j] = j-th ancestor
    depth = (hops >= 0).sum(-1) - 1
    real &= ~too_deep
    j = depth.unsqueeze(-1) - torch.arange(width, device=parents.device)  # path slot t <- hop d - t
    ok = real.unsqueeze(-1) & (j >= 0)
    return torch.where(ok, hops.gather(2, j.clamp(min=0)), -1)


def tree_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    parents: torch.Tensor,
    initial_state: torch.Tensor,
) -> torch.Tensor:
    """Gated delta rule over the tree ``parents``: ``o [bs, N, Hv, V]`` float32 (module docstring).

    Validates ``parents`` (reading it back from the device); the Triton kernel behind it on CUDA,
    ``triton_tree_recurrence.tree_gated_delta_rule_triton``, takes a ``tree_paths`` table built
    once per verify step instead and reads nothing back.
    """
    check_inputs(q, k, v, g, beta, initial_state)
    if parents.shape != k.shape[:2]:
        raise ValueError(
            f"parents must be [bs, N] = {tuple(k.shape[:2])}; got {tuple(parents.shape)}"
        )
    if parents.device != k.device:
        raise ValueError(f"parents must be on {k.device}; got {parents.device}")
    paths = tree_paths(parents)
    if k.is_cuda:
        from .triton_tree_recurrence import tree_gated_delta_rule_triton

        return tree_gated_delta_rule_triton(q, k, v, g, beta, paths, initial_state)
    return _tree_gated_delta_rule_torch(q, k, v, g, beta, paths, initial_state)


def _tree_gated_delta_rule_torch(q, k, v, g, beta, paths, initial_state) -> torch.Tensor:
    """The torch core of ``tree_gated_delta_rule`` on a ``tree_paths`` table, level by level."""
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2:]
    grp = hv // hk
    # grouped head layout: value head h = (h // grp, h % grp), so key head h // grp broadcasts
    q, k = q.float(), k.float()
    v = v.float().view(bs, n, hk, grp, dv)
    g, beta = (x.float().view(bs, n, hk, grp) for x in (g, beta))
    s0 = initial_state.float().view(bs, hk, grp, dk, dv)
    s0k = torch.einsum("bnhk,bhgkv->bnhgv", k, s0)
    s0q = torch.einsum("bnhk,bhgkv->bnhgv", q, s0)

    rows = torch.arange(bs, device=k.device)[:, None]
    on_path = paths >= 0
    node_at = paths.clamp(min=0)
    gamma = torch.zeros_like(g)  # sum of g along each node's path
    for t in range(paths.shape[2]):
        gamma += torch.where(on_path[:, :, t, None, None], g[rows, node_at[:, :, t]], 0.0)
    depth = on_path.sum(-1) - 1

    u = torch.zeros_like(v)
    o = torch.zeros_like(v)
    for d in range(paths.shape[2]):
        b, i = (depth == d).nonzero(as_tuple=True)
        ki, qi, gam = k[b, i], q[b, i], gamma[b, i]
        corr_u = torch.zeros_like(v[b, i])
        corr_o = torch.zeros_like(corr_u)
        for t in range(d):  # the proper ancestors, root first
            a = paths[b, i, t]
            w = torch.exp(gam - gamma[b, a])[..., None]  # [m, Hk, G, 1]
            ua = u[b, a]
            corr_u += w * (ki * k[b, a]).sum(-1)[:, :, None, None] * ua
            corr_o += w * (qi * k[b, a]).sum(-1)[:, :, None, None] * ua
        decay = torch.exp(gam)[..., None]
        ui = beta[b, i][..., None] * (v[b, i] - decay * s0k[b, i] - corr_u)
        u[b, i] = ui
        o[b, i] = decay * s0q[b, i] + corr_o + (qi * ki).sum(-1)[:, :, None, None] * ui
    return o.view(bs, n, hv, dv)


def replay_path_state(
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    path: torch.Tensor,
    initial_state: torch.Tensor,
) -> torch.Tensor:
    """The state ``[bs, Hv, K, V]`` float32 after applying the updates of ``path``'s nodes in order.

    ``path [bs, D]`` holds node indices into the ``N`` axis of ``k, v, g, beta``, root first, padded
    with ``-1`` at the end (a row of ``-1`` returns ``initial_state``). Layouts as in the module
    docstring. On CUDA this runs ``triton_tree_recurrence.replay_path_state_triton``.
    """
    check_inputs(None, k, v, g, beta, initial_state)
    bs, n = k.shape[:2]
    if path.dim() != 2 or path.shape[0] != bs or path.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"path must be an int32/int64 [bs={bs}, D] tensor; got {path.dtype} {tuple(path.shape)}"
        )
    if path.device != k.device:
        raise ValueError(f"path must be on {k.device}; got {path.device}")
    path = path.long()
    padding = path < 0
    bad = ((path >= n) | (path < -1)).any(1) | (padding[:, :-1] & ~padding[:, 1:]).any(1)
    if bad.any():
        b = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"path entries must be node indices in [0, {n}) followed only by -1 padding; "
            f"row {b} is {path[b].tolist()}"
        )
    if k.is_cuda:
        from .triton_tree_recurrence import replay_path_state_triton

        return replay_path_state_triton(k, v, g, beta, path, initial_state)
    return _replay_path_state_torch(k, v, g, beta, path, initial_state)


def _replay_path_state_torch(k, v, g, beta, path, initial_state) -> torch.Tensor:
    """The torch core of ``replay_path_state``: one recurrent step per path slot; a padding slot is an
    identity step (no decay, ``beta = 0``)."""
    bs, _, hk, dk = k.shape
    hv, dv = v.shape[2:]
    grp = hv // hk
    rows = torch.arange(bs, device=k.device)
    state = initial_state.float().view(bs, hk, grp, dk, dv).clone()
    for t in range(path.shape[1]):
        node, real = path[:, t].clamp(min=0), (path[:, t] >= 0)[:, None, None]
        kt = k[rows, node].float()[:, :, None, :, None]  # [bs, Hk, 1, K, 1]
        vt = v[rows, node].float().view(bs, hk, grp, 1, dv)
        gt = torch.where(real, g[rows, node].float().view(bs, hk, grp), 0.0)
        bt = torch.where(real, beta[rows, node].float().view(bs, hk, grp), 0.0)
        state = state * torch.exp(gt)[..., None, None]
        u = bt[..., None, None] * (vt - (state * kt).sum(-2, keepdim=True))
        state = state + kt * u
    return state.view(bs, hv, dk, dv)
