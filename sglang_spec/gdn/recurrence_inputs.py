"""Input checks shared by the torch core (``tree_recurrence``) and the Triton kernels
(``triton_tree_recurrence``) of the tree gated delta rule, so neither imports the other for them.

Layouts are described in ``tree_recurrence``'s module docstring.
"""

from __future__ import annotations


def check_inputs(q, k, v, g, beta, initial_state) -> None:
    """Validate the shared layout (one-line ``ValueError`` per problem); ``q`` is None for
    ``replay_path_state``."""
    if k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"k must be [bs, N, Hk, K] and v [bs, N, Hv, V]; got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    bs, n, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    if v.shape[:2] != (bs, n):
        raise ValueError(f"v must be [bs={bs}, N={n}, Hv, V]; got {tuple(v.shape)}")
    if q is not None and q.shape != k.shape:
        raise ValueError(f"q must have k's shape {tuple(k.shape)}; got {tuple(q.shape)}")
    if hv % hk:
        raise ValueError(
            f"the {hk} key heads must divide the {hv} value heads (GQA: value head h reads key head h // (Hv // Hk))"
        )
    for name, x in (("g", g), ("beta", beta)):
        if x.shape != (bs, n, hv):
            raise ValueError(f"{name} must be [bs, N, Hv] = {(bs, n, hv)}; got {tuple(x.shape)}")
    if initial_state.shape != (bs, hv, dk, dv):
        raise ValueError(
            f"initial_state must be [bs, Hv, K, V] = {(bs, hv, dk, dv)}; got {tuple(initial_state.shape)}"
        )
    tensors = [x for x in (q, k, v, g, beta, initial_state) if x is not None]
    if any(not x.is_floating_point() for x in tensors):
        raise ValueError(
            f"q, k, v, g, beta and initial_state must be floating point; got {[x.dtype for x in tensors]}"
        )
    if len({x.device for x in tensors}) != 1:
        raise ValueError(
            f"all inputs must be on one device; got {[str(x.device) for x in tensors]}"
        )
