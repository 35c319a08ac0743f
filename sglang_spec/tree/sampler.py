"""The target's token at every tree node for T > 0 verify, without dense ``[rows, V]`` copies.

:func:`sample_node_tokens` draws one token per row of the verify logits ``[bs*N, V]`` (any float
dtype, untouched) from the row's processed target distribution, with SGLang's per-request
``temperature``, ``top_k``, ``top_p`` and ``min_p``. Walking the tree on these tokens (descend into
the child whose token equals the draw, else stop: the draw is the bonus) is DDTree's target-only
verification, lossless because the tree is a deterministic function of the draft
(shared/notes/ddtree-dflash.md section 4).

The processed distribution is SGLang's non-speculative sampler's (flashinfer backend), stated as
thresholds on the row weights ``w = exp((l - max l) / T)`` (so ``max w = 1``): keep
``{w >= tau}``, ``tau = max(tau_k, tau_p, tau_min)``, and draw ``j`` with probability
``w_j / sum of kept w``:

- ``tau_k``: the ``top_k``-th largest ``w`` (``top_k >= V`` keeps all; ties at it are kept);
- ``tau_p``: the largest ``t`` with ``sum(w >= t) >= top_p * Z`` (flashinfer's top-p renorm: the
  smallest set of top tokens whose mass reaches ``top_p``, ties kept). ``Z`` is the whole row's
  mass (``"joint"`` order, SGLang's sampler without min-p) or, with ``top_k_first``, the top-k
  set's mass (top-k renorm, then top-p renorm: SGLang's sampler when a batch uses min-p, and
  SGLang's own tree verify ``eagle_sample`` always);
- ``tau_min = min_p``: ``min_p`` times the largest kept probability, which is always ``w = 1``.

Rows with ``top_k == 1`` (SGLang's encoding of greedy requests) take the argmax of the raw logits.

On CUDA every row is one program of the Triton kernel in ``triton_sampler.py``, which reads the
raw logits in tiles and writes only ``O(rows)``: a pass for the row max (the token of greedy rows),
one for the row mass when ``top_p < 1``, the nucleus bisection's passes when a row needs it, one
for the kept mass and one inverse-CDF pass that stops at the token's tile. ``tau_k`` and ``tau_p``
come from the row's top ``K`` logits (``torch.topk`` on the raw logits, ``K`` from host-side
:class:`SamplingBounds`; the weights are monotone in the logits): exact for every row with a
finite ``top_k`` (its nucleus lies inside its top-k set) and for a ``top_p`` whose nucleus fits in
``K``; a row without top-k whose nucleus is wider (a flat distribution) gets ``tau_p`` by bisection
on the float32 bit pattern of the weights (30 masked sums over the row, exact), only in that row's
program. The kernel's running sums are in another order than torch's ``cumsum``, so a draw can
differ from the CPU path's only where ``u * Z`` lies within float rounding of a boundary.

On the CPU (the reference) rows are processed in blocks through one float32 workspace of at most
``workspace_bytes`` (about ``2 x`` that at peak, plus ``O(rows)``), whatever the batch: the weights
of a block are computed in place, thresholded in place, turned into their running sum in place, and
the token is the inverse CDF of one uniform per row (``searchsorted``), with the same thresholds
(the bisection: 30 masked sums over the block, run for a block only when :class:`SamplingBounds`
says such a row may exist). Nothing is read back to the host; argument values are checked only on
the CPU (on CUDA that would sync).

Float32 caveat shared with every sampler (flashinfer's included): a token whose weight is below
``2^-24`` of the running sum before it is never drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

# Bit pattern of float32 1.0 (the largest weight) plus one: the bisection's exclusive upper end.
_ABOVE_ONE_BITS = 0x3F800001
_BISECTION_STEPS = (_ABOVE_ONE_BITS - 1).bit_length()  # 30: hi - lo reaches 1


@dataclass(frozen=True)
class SamplingBounds:
    """Host-side facts about a batch's sampling parameters (no device read needed).

    ``max_top_k``: at least every row's ``top_k`` below the vocabulary size (0 if none);
    ``nucleus_search``: some row has ``top_p < 1`` and no top-k (``top_k >= V``);
    ``top_k_first``: top-p renormalises after top-k (SGLang's order when the batch uses min-p);
    ``nucleus_candidates``: top weights scanned for the nucleus of rows without top-k before the
    bisection decides it.
    """

    max_top_k: int
    nucleus_search: bool
    top_k_first: bool = False
    nucleus_candidates: int = 256

    @classmethod
    def of(
        cls,
        top_ks: Sequence[int],
        top_ps: Sequence[float],
        vocab_size: int,
        top_k_first: bool = False,
        nucleus_candidates: int = 256,
    ) -> SamplingBounds:
        """Bounds of per-request ``top_ks`` / ``top_ps`` (host values, e.g. SGLang's
        ``req.sampling_params``)."""
        finite = [k for k in top_ks if k < vocab_size]
        search = any(p < 1.0 and k >= vocab_size for k, p in zip(top_ks, top_ps, strict=True))
        return cls(max(finite, default=0), search, top_k_first, nucleus_candidates)

    def candidates(self, vocab_size: int) -> int:
        k = max(self.max_top_k, self.nucleus_candidates if self.nucleus_search else 0)
        return min(k, vocab_size)


def _per_row(value: torch.Tensor, bs: int, rows: int, name: str, dtype) -> torch.Tensor:
    t = value.reshape(-1)
    if t.numel() != bs:
        raise ValueError(
            f"{name} must hold one value per request (bs={bs}); got {tuple(value.shape)}"
        )
    return t.to(device=value.device, dtype=dtype).repeat_interleave(rows // bs)


def _check_values(temp, top_k, top_p, min_p, bounds: SamplingBounds, V: int) -> None:
    for name, t, ok, valid in (
        ("temperature", temp, temp > 0, "> 0 (greedy requests have top_k = 1)"),
        ("top_k", top_k, top_k >= 1, ">= 1 (>= the vocabulary size disables it)"),
        ("top_p", top_p, (top_p > 0) & (top_p <= 1), "in (0, 1]"),
        ("min_p", min_p, (min_p >= 0) & (min_p <= 1), "in [0, 1]"),
    ):
        if not bool(ok.all()):
            raise ValueError(f"{name} must be {valid}; got {t.tolist()}")
    finite = top_k < V
    if bool((top_k[finite] > bounds.max_top_k).any()):
        raise ValueError(
            f"bounds.max_top_k={bounds.max_top_k} is below a row's top_k {top_k.tolist()}"
        )
    if bool(((top_p < 1) & ~finite).any()) and not bounds.nucleus_search:
        raise ValueError("a row has top_p < 1 without top-k: bounds.nucleus_search must be True")


def sample_node_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    bounds: SamplingBounds,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    workspace_bytes: int = 128 << 20,
) -> torch.Tensor:
    """One exact draw per row of ``logits [bs*N, V]``: ``[bs*N]`` int64 token ids.

    ``temperature``, ``top_k``, ``top_p``, ``min_p`` (``None``: no min-p) hold one value per
    request (``[bs]`` or SGLang's ``[bs, 1]``), applied to that request's ``N`` consecutive rows.
    ``uniforms [bs*N]`` in ``[0, 1)`` (e.g. seeded coins) drive the inverse CDF; by default they
    are drawn with ``generator``. ``logits`` is only read. ``workspace_bytes`` bounds the CPU
    path's workspace (the CUDA kernel needs none).
    """
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"logits must be a float [rows, V] tensor; got {logits.dtype} {tuple(logits.shape)}"
        )
    rows, V = logits.shape
    bs = temperature.numel()
    if bs == 0 or rows % bs:
        raise ValueError(f"logits rows ({rows}) must be a multiple of the batch size ({bs})")
    if workspace_bytes < 4 * V:
        raise ValueError(
            f"workspace_bytes must hold one float32 row (>= {4 * V}); got {workspace_bytes}"
        )
    dev = logits.device
    temp = _per_row(temperature, bs, rows, "temperature", torch.float32)
    k = _per_row(top_k, bs, rows, "top_k", torch.long)
    p = _per_row(top_p, bs, rows, "top_p", torch.float32)
    mp = None if min_p is None else _per_row(min_p, bs, rows, "min_p", torch.float32)
    if dev.type == "cpu":
        _check_values(temp, k, p, torch.zeros(1) if mp is None else mp, bounds, V)
    if uniforms is None:
        uniforms = torch.rand(rows, generator=generator, device=dev)
    elif uniforms.shape != (rows,):
        raise ValueError(f"uniforms must be [rows={rows}]; got {tuple(uniforms.shape)}")
    elif dev.type == "cpu" and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError(f"uniforms must be in [0, 1); got {uniforms.tolist()}")

    if logits.is_cuda:
        return _rows_on_device(logits, temp, k, p, mp, uniforms, bounds)[0]
    K = bounds.candidates(V)
    block = min(rows, workspace_bytes // (4 * V))
    work = torch.empty(block, V, dtype=torch.float32, device=dev)
    out = torch.empty(rows, dtype=torch.long, device=dev)
    for s in range(0, rows, block):
        e = min(rows, s + block)
        out[s:e] = _sample_block(
            logits[s:e],
            work[: e - s],
            temp[s:e],
            k[s:e],
            p[s:e],
            None if mp is None else mp[s:e],
            uniforms[s:e],
            K,
            bounds,
        )
    return out


def _sample_block(lg, w, temp, k, p, mp, u, K: int, bounds: SamplingBounds) -> torch.Tensor:
    peak, argmax = lg.max(dim=-1)
    _weights_into(w, lg, peak, temp)
    tau = _thresholds(w, k, p, mp, K, bounds)
    w.masked_fill_(w < tau[:, None], 0.0)
    w.cumsum_(dim=-1)
    # The kept mass is >= 1 (the top weight is 1) and u <= 1 - 2^-24, so u * kept < kept in
    # float32: the first running sum above it is a kept token's (its weight is > 0).
    x = u * w[:, -1]
    token = torch.searchsorted(w, x[:, None], right=True).squeeze(1)
    return torch.where(k == 1, argmax, token)


def _weights_into(w, lg, peak, temp) -> None:
    """``w = exp((lg - peak) / temp)`` in float32 (``peak``: the row max; the kernel's order)."""
    w.copy_(lg)
    w.sub_(peak.float()[:, None]).div_(temp[:, None]).exp_()


def _thresholds(w, k, p, mp, K: int, bounds: SamplingBounds) -> torch.Tensor:
    """Per row ``tau = max(tau_k, tau_p, min_p)`` of the weights ``w [n, V]`` (module docstring)."""
    n, V = w.shape
    finite = k < V
    tau = torch.zeros(n, dtype=torch.float32, device=w.device)
    if K > 0:
        top = torch.topk(w, K, dim=-1, sorted=True).values  # [n, K] descending
        kk = torch.where(finite, k.clamp(max=K), K)
        tau_k = torch.where(finite, top.gather(1, (kk - 1)[:, None]).squeeze(1), 0.0)
        mass = w.sum(dim=-1)
        if bounds.top_k_first and bounds.max_top_k > 0:
            in_top_k = torch.where(w >= tau_k[:, None], w, 0.0).sum(dim=-1)
            mass = torch.where(finite, in_top_k, mass)
        target = p * mass
        ranks = torch.arange(K, device=w.device)
        cum = torch.where(ranks[None, :] < kk[:, None], top, 0.0).cumsum(dim=-1)
        reached = cum >= target[:, None]
        first = reached.to(torch.int8).argmax(dim=-1, keepdim=True)
        tau_p = torch.where(reached[:, -1] & (p < 1), top.gather(1, first).squeeze(1), 0.0)
        if bounds.nucleus_search:
            wide = ~finite & ~reached[:, -1] & (p < 1)
            tau_p = torch.where(wide, _nucleus_bisection(w, target), tau_p)
        tau = torch.maximum(tau_k, tau_p)
    if mp is not None:
        tau = torch.maximum(tau, mp)
    return tau


def _rows_on_device(logits, temp, k, p, mp, u, bounds: SamplingBounds, block_v: int = 2048):
    """The Triton row kernel (triton_sampler.py) on every row: ``(token, tau, kept)``."""
    from .triton_sampler import row_sample

    return row_sample(
        logits,
        temp,
        k,
        p,
        mp,
        u,
        bounds.candidates(logits.shape[1]),
        bounds.top_k_first and bounds.max_top_k > 0,
        bounds.nucleus_search,
        _ABOVE_ONE_BITS,
        _BISECTION_STEPS,
        block_v,
    )


def _nucleus_bisection(w: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per row, the largest float32 ``t`` with ``sum(w[w >= t]) >= target`` (``w`` in
    ``[0, 1]``, ``0 < target <= sum(w)``), found on the bit patterns (monotone for ``t >= 0``)."""
    n = w.shape[0]
    lo = torch.zeros(n, dtype=torch.int32, device=w.device)  # sum(w >= 0) = sum(w) >= target
    hi = torch.full((n,), _ABOVE_ONE_BITS, dtype=torch.int32, device=w.device)  # nothing > 1
    for _ in range(_BISECTION_STEPS):
        mid = lo + (hi - lo) // 2
        t = mid.view(torch.float32)
        ok = torch.where(w >= t[:, None], w, 0.0).sum(dim=-1) >= target
        lo = torch.where(ok, mid, lo)
        hi = torch.where(ok, hi, mid)
    return lo.view(torch.float32)
