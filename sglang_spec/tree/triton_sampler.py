"""Triton twin of the row passes of ``sampler._sample_block`` (CUDA): one program per row.

The program reads the row's raw logits in tiles of ``BV`` and writes nothing of size ``V``:

1. the row max (the weights' scale) and its first index (the token of greedy rows, which stop here);
2. if ``top_p < 1``: the row mass (and, with ``TOP_K_FIRST``, the top-k set's mass);
   ``tau_k`` and ``tau_p`` come from the row's top ``K`` logits (``torch.topk`` on the raw logits,
   done by the caller: the weights are a monotone function of the logits, so their top ``K`` are
   the weights of the top ``K`` logits); a row without top-k whose nucleus is wider than ``K``
   bisects ``tau_p`` on the float32 bit patterns (``STEPS`` passes, each a masked sum);
3. the kept mass ``Z = sum(w >= tau)``;
4. the inverse CDF: the first index whose running kept sum exceeds ``u * Z`` (``searchsorted(...,
   right=True)``), the last kept index if float rounding leaves ``u * Z`` above the final running
   sum. This pass stops at the tile holding the token.

The weights ``exp((l - max l) / T)`` are computed with the same float32 operations in every pass,
so ties stay ties and ``tau`` is one of the row's own weights (or ``min_p``). Besides the token the
program writes ``tau`` and the number of kept tokens (``O(rows)``; the tests compare them with the
torch path). The module imports nothing from sampler.py (which imports it lazily): no cycle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _logits(row_ptr, stride_v, cols, V):
    return tl.load(row_ptr + cols * stride_v, mask=cols < V, other=float("-inf")).to(tl.float32)


@triton.jit
def _weights(row_ptr, stride_v, cols, V, peak, temp):
    return tl.exp((_logits(row_ptr, stride_v, cols, V) - peak) / temp)


@triton.jit
def _row_sample_kernel(
    logits_ptr,
    stride,
    stride_v,
    temp_ptr,
    k_ptr,
    p_ptr,
    mp_ptr,
    u_ptr,
    cand_ptr,
    token_ptr,
    tau_ptr,
    kept_ptr,
    V,
    K: tl.constexpr,
    KB: tl.constexpr,
    BV: tl.constexpr,
    HAS_MIN_P: tl.constexpr,
    TOP_K_FIRST: tl.constexpr,
    SEARCH: tl.constexpr,
    ABOVE_ONE: tl.constexpr,
    STEPS: tl.constexpr,
):
    r = tl.program_id(0)
    row = logits_ptr + r.to(tl.int64) * stride
    lanes = tl.arange(0, BV)
    # Pass 1: the max and its first index (per lane the first strict maximum, then the lowest).
    best = tl.full([BV], float("-inf"), tl.float32)
    best_at = tl.zeros([BV], tl.int32)
    for off in range(0, V, BV):
        cols = off + lanes
        lg = _logits(row, stride_v, cols, V)
        up = lg > best
        best = tl.where(up, lg, best)
        best_at = tl.where(up, cols, best_at)
    peak = tl.max(best, axis=0)
    argmax = tl.min(tl.where(best == peak, best_at, V), axis=0)
    k = tl.load(k_ptr + r)
    if k == 1:  # greedy: the first argmax of the raw logits
        tl.store(token_ptr + r, argmax.to(tl.int64))
    else:
        temp = tl.load(temp_ptr + r)
        p = tl.load(p_ptr + r)
        finite = k < V
        tau_k = 0.0
        tau_p = 0.0
        if K > 0:
            ranks = tl.arange(0, KB)
            c = tl.load(cand_ptr + r.to(tl.int64) * K + ranks, mask=ranks < K, other=float("-inf"))
            cw = tl.exp((c.to(tl.float32) - peak) / temp)  # descending
            kk = tl.where(finite, tl.minimum(k, K), K).to(tl.int32)
            tau_k = tl.where(finite, tl.sum(tl.where(ranks == kk - 1, cw, 0.0), axis=0), 0.0)
            if p < 1:
                # Pass 2: the mass top-p is a fraction of.
                total = 0.0
                in_top_k = 0.0
                for off in range(0, V, BV):
                    w = _weights(row, stride_v, off + lanes, V, peak, temp)
                    total += tl.sum(w, axis=0)
                    if TOP_K_FIRST:
                        in_top_k += tl.sum(tl.where(w >= tau_k, w, 0.0), axis=0)
                mass = total
                if TOP_K_FIRST:
                    mass = tl.where(finite, in_top_k, total)
                target = p * mass
                cum = tl.cumsum(tl.where(ranks < kk, cw, 0.0), axis=0)
                reached = (cum >= target) & (ranks < K)
                first = tl.min(tl.where(reached, ranks, KB), axis=0)
                tau_p = tl.sum(tl.where(ranks == first, cw, 0.0), axis=0)  # 0 if none reached
                if SEARCH:
                    if (k >= V) & (first == KB):  # the nucleus is wider than the K candidates
                        lo = tl.full([], 0, tl.int32)  # sum(w >= 0) = the row mass >= target
                        hi = tl.full([], ABOVE_ONE, tl.int32)  # no weight exceeds 1
                        for _ in range(STEPS):
                            mid = lo + (hi - lo) // 2
                            t = mid.to(tl.float32, bitcast=True)
                            s = 0.0
                            for off in range(0, V, BV):
                                w = _weights(row, stride_v, off + lanes, V, peak, temp)
                                s += tl.sum(tl.where(w >= t, w, 0.0), axis=0)
                            ok = s >= target
                            lo = tl.where(ok, mid, lo)
                            hi = tl.where(ok, hi, mid)
                        tau_p = lo.to(tl.float32, bitcast=True)
        tau = tl.maximum(tau_k, tau_p)
        if HAS_MIN_P:
            tau = tl.maximum(tau, tl.load(mp_ptr + r))
        # Pass 3: the kept mass and count.
        z = 0.0
        n_kept = 0
        for off in range(0, V, BV):
            cols = off + lanes
            w = _weights(row, stride_v, cols, V, peak, temp)
            keep = (w >= tau) & (cols < V)
            z += tl.sum(tl.where(keep, w, 0.0), axis=0)
            n_kept += tl.sum(keep.to(tl.int32), axis=0)
        # Pass 4: the inverse CDF, stopping at the tile that holds the token.
        x = tl.load(u_ptr + r) * z
        run = 0.0
        last = 0
        token = V
        off = 0
        while (token == V) & (off < V):
            cols = off + lanes
            w = _weights(row, stride_v, cols, V, peak, temp)
            keep = (w >= tau) & (cols < V)
            kw = tl.where(keep, w, 0.0)
            hit = ((tl.cumsum(kw, axis=0) + run) > x) & keep
            token = tl.min(tl.where(hit, cols, V), axis=0)
            last = tl.maximum(last, tl.max(tl.where(keep, cols, 0), axis=0))
            run += tl.sum(kw, axis=0)
            off += BV
        token = tl.where(token == V, last, token)
        tl.store(token_ptr + r, token.to(tl.int64))
        tl.store(tau_ptr + r, tau)
        tl.store(kept_ptr + r, n_kept)


def row_sample(
    logits: torch.Tensor,
    temp: torch.Tensor,
    k: torch.Tensor,
    p: torch.Tensor,
    mp: torch.Tensor | None,
    u: torch.Tensor,
    K: int,
    top_k_first: bool,
    search: bool,
    above_one_bits: int,
    steps: int,
    block_v: int = 2048,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One draw per row of ``logits [rows, V]`` (per-row ``temp``, ``k``, ``p``, ``mp``, ``u``):
    ``(token int64, tau float32, kept int32)``, each ``[rows]`` (``tau`` and ``kept`` are
    left unwritten on greedy rows). ``K``: top logits per row that
    decide ``tau_k`` / ``tau_p`` (``sampler.SamplingBounds.candidates``); ``block_v``: the tile
    width (a power of two)."""
    rows, V = logits.shape
    dev = logits.device
    cand = torch.topk(logits, K, dim=-1, sorted=True).values if K > 0 else logits
    token = torch.empty(rows, dtype=torch.long, device=dev)
    tau = torch.empty(rows, dtype=torch.float32, device=dev)
    kept = torch.empty(rows, dtype=torch.int32, device=dev)
    _row_sample_kernel[(rows,)](
        logits,
        logits.stride(0),
        logits.stride(1),
        temp,
        k,
        p,
        temp if mp is None else mp,
        u,
        cand,
        token,
        tau,
        kept,
        V,
        K=K,
        KB=triton.next_power_of_2(max(K, 1)),
        BV=min(block_v, triton.next_power_of_2(V)),
        HAS_MIN_P=mp is not None,
        TOP_K_FIRST=top_k_first,
        SEARCH=search,
        ABOVE_ONE=above_one_bits,
        STEPS=steps,
        num_warps=8,
    )
    return token, tau, kept
