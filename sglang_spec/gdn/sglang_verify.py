"""The GDN tree verify inside SGLang 0.5.23 (patch 0002, docs/gdn-tree-caching.md §4 rows 4 and 5).

With ``--enable-linear-replayssm-spec`` and a draft tree (patch 0003 makes the pool allocate the
ReplaySSM ring for it), SGLang's GDN backend verifies the tree without per-node recurrent states:
the WY kernels' SGLang mode (``triton_tree_wy``: the tree as one triangular solve, three launches)
read the conv output's q/k/v, the gate inputs ``a``, ``b``, the pool rows
``ssm_states[cache_indices[b]]`` and the request's root-first path table, write the layer's core
output in the activation dtype and each node's raw inputs into the ring, which the commit (patch
0003) replays along the accepted path.

* :func:`gdn_tree_verify_wy` -- the verify the patched backend runs (validated, one-line errors);
* :func:`gdn_tree_verify` -- the same verify by the node-by-node walk
  (``triton_tree_recurrence._tree_kernel`` with ``SGLANG`` and ``RING``, after
  ``_tree_prep_kernel``): same output and ring; the independent Triton form the tests and
  ``benchmarks/gdn_tree_recurrence.py`` compare the WY kernels against (0.31-0.63x its time on the
  H200, ``benchmarks/results/e2e_h200/session20/``);
* :func:`replayssm_tree_verify` -- what the patched ``GDNAttnBackend._replayssm_fold_target_verify``
  calls for a tree;
* :func:`verify_tree_paths` -- the step's path table for the patched verify's tree conv and tree
  kernels (a one-line error when the verify input has none);
* :class:`TreeVerifyTables` -- the per-backend state the patched ``MambaAttnBackendBase`` keeps: the
  CUDA-graph buffers of ``retrieve_tree_paths`` (one per captured batch size, refreshed at replay)
  and the WY scratch per tree width, shared by all layers of a step.

``retrieve_tree_paths`` (``[bs, N, W]`` int32, ``W`` = tree horizon + 1, row i = node i's root-first
path padded with -1) comes from the verify input (``spec_info.retrieve_tree_paths``, set by the
DDTREE plug-in from ``tree_paths(parents, width=W)``). The ring row of request ``b`` is
``intermediate_state_indices[b]``, the row its conv inputs use (``tree_conv``; docs/gdn_shared
contract).
"""

from __future__ import annotations

import torch

from .triton_tree_recurrence import (
    launch_tree_kernel,
    prep_row_width,
)
from .triton_tree_wy import launch_wy_kernels, tree_wy_scratch, wy_scratch_width


def _check_verify_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    paths: torch.Tensor,
    ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    ring_rows: torch.Tensor | None,
) -> tuple[int, int, int, int, int, int]:
    """Validate the tree verify's SGLang tensors but its scratch (one-line ``ValueError`` per
    problem); returns ``(bs, N, Hk, K, Hv, V)``."""
    if paths.dim() != 3 or paths.dtype != torch.int32 or not paths.is_contiguous():
        raise ValueError(
            f"paths must be a contiguous int32 [bs, N, W] table; got {paths.dtype} {tuple(paths.shape)}"
        )
    bs, n, _ = paths.shape
    if q.dim() != 4 or q.shape[1] != bs * n or q.shape[0] != 1:
        raise ValueError(
            f"q must be [1, bs * N = {bs * n}, Hk, K] for paths {tuple(paths.shape)}; got {tuple(q.shape)}"
        )
    hk, dk = q.shape[2:]
    hv, dv = v.shape[2:]
    if k.shape != q.shape or v.shape[:2] != q.shape[:2] or hv % hk:
        raise ValueError(
            f"k must be q's shape {tuple(q.shape)} and v [1, {bs * n}, Hv, V] with Hk={hk} dividing Hv; "
            f"got k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if a.shape != (bs * n, hv) or b.shape != (bs * n, hv):
        raise ValueError(
            f"a and b must be [T, Hv] = {(bs * n, hv)}; got {tuple(a.shape)}, {tuple(b.shape)}"
        )
    if ssm_states.dim() != 4 or ssm_states.shape[1:] != (hv, dv, dk):
        raise ValueError(
            f"ssm_states must be [slots, Hv, V, K] = [slots, {hv}, {dv}, {dk}]; got {tuple(ssm_states.shape)}"
        )
    if cache_indices.shape[0] < bs:
        raise ValueError(f"cache_indices must have >= bs = {bs} rows; got {cache_indices.shape[0]}")
    if (ring is None) != (ring_rows is None):
        raise ValueError("ring and ring_rows go together: give both or neither")
    if ring is not None:
        want = ((hk, dk), (hv, dv), (hv,), (hv,))
        got = [tuple(x.shape[1:2]) + tuple(x.shape[3:]) for x in ring]
        if (
            got != [tuple(w) for w in want]
            or any(x.shape[2] < n or x.stride(-1) != 1 for x in ring)
            or ring_rows.shape[0] < bs
        ):
            raise ValueError(
                "ring must be (rawk [R, Hk, >=N, K], rawv [R, Hv, >=N, V], g [R, Hv, >=N], "
                f"beta [R, Hv, >=N]) with Hk={hk}, K={dk}, Hv={hv}, V={dv}, N={n}, contiguous last "
                f"dims, and ring_rows >= bs = {bs} rows; got {[tuple(x.shape) for x in ring]}, "
                f"ring_rows {tuple(ring_rows.shape)}"
            )
    return bs, n, hk, dk, hv, dv


def _kernel_call(q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, paths, ring, ring_rows):  # noqa: N803
    """What both verify forms hand their launcher: the inputs as ``[bs, N, ...]`` views with the
    pool as ``[slots, Hv, K, V]``, the ``[1, T, Hv, V]`` output in q's dtype, and the SGLang mode
    (gates, scale, pool rows, ring)."""
    bs, n, _ = paths.shape
    hk, dk = q.shape[2:]
    hv, dv = v.shape[2:]
    inputs = (
        q.view(bs, n, hk, dk),
        k.view(bs, n, hk, dk),
        v.view(bs, n, hv, dv),
        a.view(bs, n, hv),
        b.view(bs, n, hv),
        paths,
        ssm_states.transpose(-1, -2),
    )
    o = torch.empty(1, bs * n, hv, dv, dtype=q.dtype, device=q.device)
    mode = dict(
        sglang=(A_log, dt_bias, cache_indices, dk**-0.5),
        ring=None if ring is None else (*ring, ring_rows),
    )
    return inputs, o, mode


def _check_buffer(
    name: str, t: torch.Tensor, rows: int, tail: tuple[int, ...], made_by: str
) -> None:
    """A kernel's float32 work buffer: contiguous ``[>= rows, *tail]``, else one line naming it,
    the shape it needs and the function that makes it."""
    if (
        t.dtype != torch.float32
        or not t.is_contiguous()
        or t.dim() != 1 + len(tail)
        or t.shape[0] < rows
        or tuple(t.shape[1:]) != tail
    ):
        dims = ", ".join(str(d) for d in tail)
        raise ValueError(
            f"{name} must be contiguous float32 [>= {rows}, {dims}] ({made_by}); "
            f"got {t.dtype} {tuple(t.shape)}"
        )


def gdn_tree_verify(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 -- SGLang's parameter name
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    paths: torch.Tensor,
    scratch: torch.Tensor,
    prep: torch.Tensor,
    ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ring_rows: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """The tree verify of one GDN layer on SGLang's tensors: ``o [1, T, Hv, V]`` in ``q``'s dtype.

    ``q, k [1, T, Hk, K]`` and ``v [1, T, Hv, V]`` are the conv output's q/k/v (views with a
    contiguous last dim, as SGLang splits them), ``T = bs * N``; ``a, b [T, Hv]`` the gate inputs;
    ``A_log``, ``dt_bias [Hv]``; ``ssm_states [slots, Hv, V, K]`` the layer's fp32 pool (read only);
    ``cache_indices [>= bs]`` its row per request (< 0: a padding request: zero outputs, no ring
    stores); ``paths [bs, N, W]`` int32; ``scratch`` from :func:`tree_scratch` and ``prep`` from
    :func:`tree_prep_scratch` (``Hk``, ``W``), both with ``>= T`` rows.
    ``ring = (rawk [R, Hk, N', K], rawv [R, Hv, N', V], g [R, Hv, N'], beta [R, Hv, N'])`` with
    ``N' >= N`` and ``ring_rows [>= bs]`` (rows of ``R``) add the ring stores: column i of request
    b's row holds node i's raw ``k``, ``v`` and its ``g``, ``beta`` (fp32).
    """
    bs, n, hk, _, hv, dv = _check_verify_inputs(
        q, k, v, a, b, ssm_states, cache_indices, paths, ring, ring_rows
    )
    width = paths.shape[2]
    _check_buffer("scratch", scratch, bs * n, (hv, dv + 2), "tree_scratch")
    _check_buffer(
        "prep", prep, bs * n, (hk, prep_row_width(width)), f"tree_prep_scratch for W = {width}"
    )
    inputs, o, mode = _kernel_call(
        q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, paths, ring, ring_rows
    )
    launch_tree_kernel(*inputs, scratch, prep, o, **mode, block_v=block_v, num_warps=num_warps)
    return o


def gdn_tree_verify_wy(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,  # noqa: N803 -- SGLang's parameter name
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    paths: torch.Tensor,
    scratch: torch.Tensor,
    ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ring_rows: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """:func:`gdn_tree_verify` by the WY kernels (``triton_tree_wy``), as the patched verify runs
    it: the same arguments, output and ring stores, but one ``scratch`` from ``tree_wy_scratch``
    with ``>= bs`` requests for this ``N`` and ``Hv``; ``block_v`` (a power of two >= 16) and
    ``num_warps`` override the output launch's value tile and warps."""
    bs, n, _, _, hv, _ = _check_verify_inputs(
        q, k, v, a, b, ssm_states, cache_indices, paths, ring, ring_rows
    )
    _check_buffer("scratch", scratch, bs, (hv, wy_scratch_width(n)), f"tree_wy_scratch for N = {n}")
    inputs, o, mode = _kernel_call(
        q, k, v, a, b, A_log, dt_bias, ssm_states, cache_indices, paths, ring, ring_rows
    )
    launch_wy_kernels(*inputs, scratch, o, **mode, block_v=block_v, num_warps=num_warps)
    return o


class TreeVerifyTables:
    """What the patched ``MambaAttnBackendBase`` keeps for the GDN tree verify: the WY kernels'
    scratch per tree width (shared by every layer and step) and, for CUDA graphs, one static
    ``retrieve_tree_paths`` buffer per captured batch size (allocated when that size is captured,
    outside the graph; refreshed from the verify input before each replay)."""

    def __init__(self, num_v_heads: int, device):
        self.num_v_heads = num_v_heads
        self.device = device
        self._scratch: dict[int, torch.Tensor] = {}  # by tree width N
        self._graph_tokens: int | None = None
        self._paths: dict[int, torch.Tensor] = {}

    @classmethod
    def for_backend(cls, topk: int, mamba_pool, device) -> TreeVerifyTables | None:
        """The tables when ``mamba_pool`` runs the GDN tree fold (a GDN pool with the ReplaySSM ring
        of a tree: ``replayssm_spec_fold`` and ``topk > 1``), else None."""
        if (
            topk <= 1
            or mamba_pool is None
            or not getattr(mamba_pool, "replayssm_spec_fold", False)
            or getattr(mamba_pool, "replayssm_is_kda", False)
        ):
            return None
        return cls(mamba_pool.mamba_cache.temporal.shape[2], device)  # [layers, slots, Hv, V, K]

    def init_graphs(self, max_num_tokens: int) -> None:
        """Graphs of up to ``max_num_tokens`` verify tokens follow: a width's scratch is sized for
        them at its first capture, when the width is known (:meth:`graph_paths`), and stays put
        from then on (graphs hold its address)."""
        self._graph_tokens = max_num_tokens
        self._scratch = {}

    def scratch(self, bs: int, n: int) -> torch.Tensor:
        """The WY scratch for ``bs`` trees of ``n`` nodes: width ``n``'s shared one, grown in eager
        mode; with graphs, an eager batch larger than every captured one gets its own (the graphs
        keep the shared one's address)."""
        shared = self._scratch.get(n)
        if shared is not None and shared.shape[0] >= bs:
            return shared
        fresh = tree_wy_scratch(bs, n, self.num_v_heads, self.device)
        if self._graph_tokens is None:
            self._scratch[n] = fresh
        return fresh

    def graph_paths(self, bs: int, spec_info) -> torch.Tensor:
        """The static ``[bs, N, W]`` buffer of graph batch size ``bs`` (``W`` = the verify input's
        ``spec_steps + 1``), with the verify input's ``retrieve_tree_paths`` copied into its first
        rows when it has them (a capture's placeholder has none; padding rows are skipped by the
        kernel through ``cache_indices < 0``)."""
        buf = self._paths.get(bs)
        if buf is None:
            shape = (bs, int(spec_info.draft_token_num), int(spec_info.spec_steps) + 1)
            buf = torch.full(shape, -1, dtype=torch.int32, device=self.device)
            self._paths[bs] = buf
            n = shape[1]
            if self._graph_tokens is not None and n not in self._scratch:  # outside the graph
                self._scratch[n] = tree_wy_scratch(
                    max(bs, self._graph_tokens // n), n, self.num_v_heads, self.device
                )
        paths = getattr(spec_info, "retrieve_tree_paths", None)
        if paths is not None:
            if paths.shape[1:] != buf.shape[1:] or paths.shape[0] > bs:
                raise ValueError(
                    f"retrieve_tree_paths must be [<= {bs}, {buf.shape[1]}, {buf.shape[2]}] (the "
                    f"captured graph's width and horizon + 1); got {tuple(paths.shape)}"
                )
            buf[: paths.shape[0]].copy_(paths)
        return buf


def verify_tree_paths(retrieve_tree_paths: torch.Tensor | None, batch_size: int) -> torch.Tensor:
    """The verify's ``[batch_size, N, W]`` root-first path table (the first rows of
    ``forward_metadata.retrieve_tree_paths``), which the patched verify's tree conv and tree kernel
    read; a one-line error when the verify input has none (e.g. EAGLE's own tree, which does not
    build it)."""
    if retrieve_tree_paths is None:
        raise ValueError(
            "the GDN tree ReplaySSM verify needs spec_info.retrieve_tree_paths ([bs, N, horizon + 1] "
            "int32 root-first node paths, set by the DDTREE plug-in); this verify input has none"
        )
    return retrieve_tree_paths[:batch_size]


def replayssm_tree_verify(
    backend,
    *,
    layer,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    layer_cache,
    ssm_states: torch.Tensor,
    cache_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    retrieve_tree_paths: torch.Tensor | None,
    ring_rows: torch.Tensor,
) -> torch.Tensor:
    """The tree branch of the patched ``GDNAttnBackend._replayssm_fold_target_verify``: the verify
    of one GDN layer over the step's trees, writing the layer's ReplaySSM ring (``layer_cache``'s
    per-layer ``replayssm_*`` views) at request rows ``ring_rows`` (the verify's
    ``intermediate_state_indices``). ``backend.tree_verify`` is its :class:`TreeVerifyTables`."""
    batch_size = query_start_loc.shape[0] - 1
    paths = verify_tree_paths(retrieve_tree_paths, batch_size)
    seq_len = query.shape[1]
    if seq_len != batch_size * paths.shape[1]:
        raise ValueError(
            f"the tree verify needs N = {paths.shape[1]} tokens per request; got "
            f"{seq_len} tokens for {batch_size} requests"
        )
    return gdn_tree_verify_wy(
        query,
        key,
        value,
        a,
        b,
        layer.A_log,
        layer.dt_bias,
        ssm_states,
        cache_indices,
        paths,
        backend.tree_verify.scratch(batch_size, paths.shape[1]),
        ring=(
            layer_cache.replayssm_rawk,
            layer_cache.replayssm_rawv,
            layer_cache.replayssm_g,
            layer_cache.replayssm_beta,
        ),
        ring_rows=ring_rows,
    )
