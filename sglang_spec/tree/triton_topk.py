"""Triton twin of the per-depth top-K and log-sum-exp of :func:`~sglang_spec.tree.build.draft_topk`
(CUDA): one read of the LM head's logits, no float32 copy of them.

On the 27B shape at 16 requests the torch path (a float32 copy of the ``[240, 248320]`` logits,
the division by the tree temperature, ``torch.topk``'s radix select and ``torch.logsumexp``) took
1.5 ms of a 36 ms step on the H200 (session 25's kernel trace), 30 times what reading the bf16
logits once costs. Two kernels:

1. per (row, tile of ``BV`` tokens): the tile's max and sum of ``exp(x - max)``, and its top ``K``
   by ``K`` rounds of (max, lowest column holding it), each taken out of the running;
2. per row: the top ``K`` of the tiles' candidates the same way, and the log-sum-exp from the
   tiles' (max, sum) pairs.

``x = logits / temperature`` in float32 with a correctly rounded division (``div_rn``, what torch
computes), so the kept values are the torch path's bit for bit. Ties keep the lowest token ids
(the tiles' candidates are in id order within a tile and tiles are in id order), as the CPU path's
stable sort does; a row's log-sum-exp sums in another order than ``torch.logsumexp`` and may differ
in the last bits. ``tests/test_tree_topk.py`` compares both under the Triton interpreter.
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
def _tile_topk_kernel(
    logits_ptr,
    stride,
    temp,
    cand_val_ptr,
    cand_id_ptr,
    tile_max_ptr,
    tile_sum_ptr,
    V,
    K: tl.constexpr,
    KB: tl.constexpr,
    BV: tl.constexpr,
    SCALE: tl.constexpr,
):
    r = tl.program_id(0)
    t = tl.program_id(1)
    tiles = tl.num_programs(1)
    cols = t * BV + tl.arange(0, BV)
    inside = cols < V
    x = tl.load(logits_ptr + r.to(tl.int64) * stride + cols, mask=inside, other=float("-inf"))
    x = x.to(tl.float32)
    if SCALE:
        x = tl.math.div_rn(x, temp)
    peak = tl.max(x, axis=0)
    shift = tl.where(peak == float("-inf"), 0.0, peak)  # an all -inf tile sums to 0, not NaN
    total = tl.sum(tl.exp(x - shift), axis=0)
    ranks = tl.arange(0, KB)
    vals = tl.full([KB], float("-inf"), tl.float32)
    ids = tl.full([KB], V, tl.int32)  # V: no token (a tile with fewer than K columns)
    avail = inside
    for i in range(K):
        best, at = _take(x, cols, avail, V)
        vals = tl.where(ranks == i, best, vals)
        ids = tl.where(ranks == i, at, ids)
        avail = avail & (cols != at)
    out = (r.to(tl.int64) * tiles + t) * KB + ranks
    tl.store(cand_val_ptr + out, vals)
    tl.store(cand_id_ptr + out, ids)
    tl.store(tile_max_ptr + r.to(tl.int64) * tiles + t, shift)
    tl.store(tile_sum_ptr + r.to(tl.int64) * tiles + t, total)


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
    _tile_topk_kernel[(rows, tiles)](
        logits,
        logits.stride(0),
        float(temperature),
        cand_val,
        cand_id,
        tile_max,
        tile_sum,
        V,
        K=k,
        KB=kb,
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
        TB=triton.next_power_of_2(tiles),
        num_warps=4,
    )
    return vals, ids, lse
