"""Triton twin of the per-depth top-K and log-sum-exp of :func:`~sglang_spec.tree.build.draft_topk`
(CUDA): the LM head's logits read once, plus the few tiles that hold the top K; no float32 copy.

On the 27B shape at 16 requests the torch path (a float32 copy of the ``[240, 248320]`` logits,
the division by the tree temperature, ``torch.topk``'s radix select and ``torch.logsumexp``) took
1.5 ms of a 36 ms step on the H200 (session 25's kernel trace). Three kernels:

1. per (row, tile of ``BV`` tokens): the tile's max and sum of ``exp(x - max)``;
2. per (row, tile): the row's ``floor``, the K-th largest tile max (the K tiles with the largest
   maxima hold K values at least that large, so the row's top K are all ``>= floor``); a tile
   whose max reaches it (about K of a row's tiles) takes its values ``>= floor``, at most K, by
   rounds of (max, lowest column holding it); the other tiles propose nothing;
3. per row: the top K of the tiles' candidates the same way, and the log-sum-exp from the tiles'
   (max, sum) pairs.

A first version took the top K of every tile (K rounds over each of a row's 61 tiles): 1.1 ms at
K = 17 and 16 requests on the H200, 1.4x the torch path (``benchmarks/draft_step_kernels.py``,
session 25); the floor leaves rounds only where a top-K value can be.

``x = logits / temperature`` in float32 with a correctly rounded division (``div_rn``; torch's CPU
division, while its CUDA division by a scalar multiplies by the reciprocal), so the kept values are
the CPU path's bit for bit. Ties keep the lowest token ids (a tile's candidates are in id order
among equal values and tiles are in id order), as the CPU path's stable sort does; a row's
log-sum-exp sums in another order than ``torch.logsumexp`` and may differ in the last bits.
``tests/test_tree_topk.py`` compares both under the Triton interpreter and on CUDA.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _take(x, cols, avail, NONE: tl.constexpr):
    """The best available value and the lowest column holding it (``NONE`` if none is left)."""
    best = tl.max(tl.where(avail, x, float("-inf")), axis=0)
    at = tl.min(tl.where(avail & (x == best), cols, NONE), axis=0)
    return best, at


@triton.jit
def _tile_x(logits_ptr, stride, temp, r, t, V, BV: tl.constexpr, SCALE: tl.constexpr):
    """Tile ``t`` of row ``r``: its columns, which are inside the vocabulary, and ``x`` there
    (``-inf`` outside)."""
    cols = t * BV + tl.arange(0, BV)
    inside = cols < V
    x = tl.load(logits_ptr + r.to(tl.int64) * stride + cols, mask=inside, other=float("-inf"))
    x = x.to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temp)
    return cols, inside, x


@triton.jit
def _tile_stats_kernel(
    logits_ptr,
    stride,
    temp,
    tile_max_ptr,
    tile_sum_ptr,
    V,
    BV: tl.constexpr,
    SCALE: tl.constexpr,
):
    r = tl.program_id(0)
    t = tl.program_id(1)
    _, _, x = _tile_x(logits_ptr, stride, temp, r, t, V, BV, SCALE)
    peak = tl.max(x, axis=0)
    shift = tl.where(peak == float("-inf"), 0.0, peak)  # an all -inf tile sums to 0, not NaN
    at = r.to(tl.int64) * tl.num_programs(1) + t
    tl.store(tile_max_ptr + at, peak)
    tl.store(tile_sum_ptr + at, tl.sum(tl.exp(x - shift), axis=0))


@triton.jit
def _tile_candidates_kernel(
    logits_ptr,
    stride,
    temp,
    tile_max_ptr,
    cand_val_ptr,
    cand_id_ptr,
    V,
    K: tl.constexpr,
    KB: tl.constexpr,
    TB: tl.constexpr,
    BV: tl.constexpr,
    SCALE: tl.constexpr,
):
    r = tl.program_id(0)
    t = tl.program_id(1)
    tiles = tl.num_programs(1)
    # The row's K-th largest tile max: the K tiles with the largest maxima hold K values at least
    # that large, so every value of the row's top K is too.
    j = tl.arange(0, TB)
    peaks = tl.load(tile_max_ptr + r.to(tl.int64) * tiles + j, mask=j < tiles, other=0.0)
    left = j < tiles
    floor = float("inf")
    for _ in range(K):
        floor, at = _take(peaks, j, left, TB)
        left = left & (j != at)
    ranks = tl.arange(0, KB)
    vals = tl.full([KB], float("-inf"), tl.float32)
    ids = tl.full([KB], V, tl.int32)  # V: no token
    if tl.load(tile_max_ptr + r.to(tl.int64) * tiles + t) >= floor:
        cols, inside, x = _tile_x(logits_ptr, stride, temp, r, t, V, BV, SCALE)
        avail = inside & (x >= floor)
        for i in range(tl.minimum(tl.sum(avail.to(tl.int32), axis=0), K)):
            best, at = _take(x, cols, avail, V)
            vals = tl.where(ranks == i, best, vals)
            ids = tl.where(ranks == i, at, ids)
            avail = avail & (cols != at)
    out = (r.to(tl.int64) * tiles + t) * KB + ranks
    tl.store(cand_val_ptr + out, vals)
    tl.store(cand_id_ptr + out, ids)


@triton.jit
def _merge_kernel(
    cand_val_ptr,
    cand_id_ptr,
    tile_max_ptr,
    tile_sum_ptr,
    val_ptr,
    id_ptr,
    lse_ptr,
    tiles,
    V,
    K: tl.constexpr,
    KB: tl.constexpr,
    CB: tl.constexpr,
    TB: tl.constexpr,
):
    r = tl.program_id(0)
    n = tiles * KB
    j = tl.arange(0, CB)
    base = r.to(tl.int64) * n
    vals = tl.load(cand_val_ptr + base + j, mask=j < n, other=float("-inf"))
    ids = tl.load(cand_id_ptr + base + j, mask=j < n, other=V)
    avail = ids < V
    for i in range(K):
        best, at = _take(vals, j, avail, CB)
        token = tl.sum(tl.where(j == at, ids, 0), axis=0)
        tl.store(val_ptr + r.to(tl.int64) * K + i, best)
        tl.store(id_ptr + r.to(tl.int64) * K + i, token.to(tl.int64))
        avail = avail & (j != at)
    t = tl.arange(0, TB)
    peaks = tl.load(tile_max_ptr + r.to(tl.int64) * tiles + t, mask=t < tiles, other=float("-inf"))
    sums = tl.load(tile_sum_ptr + r.to(tl.int64) * tiles + t, mask=t < tiles, other=0.0)
    top = tl.max(peaks, axis=0)
    shift = tl.where(top == float("-inf"), 0.0, top)
    tl.store(lse_ptr + r, shift + tl.log(tl.sum(sums * tl.exp(peaks - shift), axis=0)))


def topk_logsumexp(
    logits: torch.Tensor, k: int, temperature: float, block_v: int = 4096
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Of ``x = logits [R, V] / temperature`` (float32): per row the ``k`` largest values
    (descending, ties by lowest id), their int64 ids ``[R, k]`` and ``logsumexp(x)`` ``[R]``.
    ``logits`` may be any float dtype; rows must be contiguous."""
    rows, V = logits.shape
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    dev = logits.device
    bv = min(block_v, triton.next_power_of_2(V))
    tiles = triton.cdiv(V, bv)
    kb = triton.next_power_of_2(k)
    cand_val = torch.empty(rows, tiles, kb, dtype=torch.float32, device=dev)
    cand_id = torch.empty(rows, tiles, kb, dtype=torch.int32, device=dev)
    tile_max = torch.empty(rows, tiles, dtype=torch.float32, device=dev)
    tile_sum = torch.empty(rows, tiles, dtype=torch.float32, device=dev)
    vals = torch.empty(rows, k, dtype=torch.float32, device=dev)
    ids = torch.empty(rows, k, dtype=torch.int64, device=dev)
    lse = torch.empty(rows, dtype=torch.float32, device=dev)
    if rows == 0:
        return vals, ids, lse
    tb = triton.next_power_of_2(tiles)
    _tile_stats_kernel[(rows, tiles)](
        logits,
        logits.stride(0),
        float(temperature),
        tile_max,
        tile_sum,
        V,
        BV=bv,
        SCALE=temperature != 1.0,
        num_warps=4,
    )
    _tile_candidates_kernel[(rows, tiles)](
        logits,
        logits.stride(0),
        float(temperature),
        tile_max,
        cand_val,
        cand_id,
        V,
        K=k,
        KB=kb,
        TB=tb,
        BV=bv,
        SCALE=temperature != 1.0,
        num_warps=4,
    )
    _merge_kernel[(rows,)](
        cand_val,
        cand_id,
        tile_max,
        tile_sum,
        vals,
        ids,
        lse,
        tiles,
        V,
        K=k,
        KB=kb,
        CB=triton.next_power_of_2(tiles * kb),
        TB=tb,
        num_warps=4,
    )
    return vals, ids, lse
