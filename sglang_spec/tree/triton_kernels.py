"""Triton kernels for the DDTree core on CUDA: selection, layout + SGLang ABI, greedy walk.

Each kernel mirrors a torch definition in build.py / layout.py / walk.py (same float32 operations,
same tie-breaking) and is checked against it (tests run them under ``TRITON_INTERPRET=1`` on the
CPU, compiled where CUDA is available; ``benchmarks/tree.py`` on the H200). No kernel reads anything
back to the host. The module imports nothing from the torch definitions it mirrors (only ``types``),
so the lazy imports of it in build.py, layout.py and walk.py close no cycle.

- ``_select_kernel``: one program per request; ``B`` pops over a frontier held in registers
  (at most ``B + 1`` entries: each pop frees its slot for the popped node's next sibling and
  appends at most its first child); the first ``CHAIN`` pops are forced to the greedy chain.
- ``_layout_kernel``: one program per (request, block of rows); ancestors by parent hops.
- ``_walk_kernel``: one program per request; descends level by level with the tree in registers.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .types import DraftTree, TreeABI, TreeMaskMode, WalkResult, bitpack_dtype


@triton.jit
def _select_kernel(
    logq_ptr,
    ids_ptr,
    root_ptr,
    tokens_ptr,
    depth_ptr,
    rank_ptr,
    parent_ptr,
    score_ptr,
    num_nodes_ptr,
    L: tl.constexpr,
    K: tl.constexpr,
    N: tl.constexpr,
    FB: tl.constexpr,
    CHAIN: tl.constexpr,
):
    b = tl.program_id(0)
    base = logq_ptr + b * L * K
    slots = tl.arange(0, FB)
    neg_inf = float("-inf")
    # A request whose log-probs contain NaN gets a root-only tree (verifies losslessly).
    nan_count = 0
    for c in range(0, L * K, 256):
        chunk = c + tl.arange(0, 256)
        vals = tl.load(base + chunk, mask=chunk < L * K, other=0.0)
        nan_count += tl.sum((vals != vals).to(tl.int32), axis=0)
    has_nan = nan_count > 0
    f_score = tl.where(slots == 0, tl.where(has_nan, neg_inf, tl.load(base)), neg_inf)
    f_pscore = tl.zeros([FB], dtype=tl.float32)
    # Packed (depth, rank, parent): depth < 2^6, rank < 2^12, parent < 2^12.
    f_meta = tl.where(slots == 0, 1 << 24, 0)
    o_meta = tl.where(slots == 0, 0, -1)  # per node: packed (depth, rank, parent), -1 = padding
    o_score = tl.where(slots == 0, 0.0, neg_inf)
    count = 1
    for n in range(1, N):
        best, slot = tl.max(
            f_score, axis=0, return_indices=True, return_indices_tie_break_left=True
        )
        if CHAIN > 0:  # pops 1..CHAIN take the chain node of depth n, waiting in slot n - 1
            forced = n <= CHAIN
            slot = tl.where(forced, n - 1, slot)
            best = tl.where(forced, tl.sum(tl.where(slots == n - 1, f_score, 0.0), axis=0), best)
        valid = best > neg_inf
        at = slots == slot
        meta = tl.sum(tl.where(at, f_meta, 0), axis=0)
        pscore = tl.sum(tl.where(at, f_pscore, 0.0), axis=0)
        d = meta >> 24
        r = (meta >> 12) & 4095
        o_meta = tl.where(tl.where(valid, slots == n, False), meta, o_meta)
        o_score = tl.where(slots == n, best, o_score)
        # Next sibling reuses the popped slot; first child takes the next free one.
        has_sib = valid & (r + 1 < K)
        sib = tl.load(base + (d - 1) * K + r + 1, mask=has_sib, other=neg_inf)
        f_score = tl.where(at, tl.where(has_sib, pscore + sib, neg_inf), f_score)
        f_meta = tl.where(at, meta + (1 << 12), f_meta)
        has_child = valid & (d < L)
        child = tl.load(base + d * K, mask=has_child, other=neg_inf)
        new = tl.where(has_child, slots == count, False)
        f_score = tl.where(new, best + child, f_score)
        f_pscore = tl.where(new, best, f_pscore)
        f_meta = tl.where(new, ((d + 1) << 24) | n, f_meta)
        count += has_child.to(tl.int32)
    out = b * N + slots
    in_tree = slots < N
    real = o_meta >= 0
    depth = tl.where(real, o_meta >> 24, -1)
    rank = tl.where(real, (o_meta >> 12) & 4095, 0)
    draft = in_tree & (depth > 0)
    token = tl.load(ids_ptr + b * L * K + (depth - 1) * K + rank, mask=draft, other=0)
    tl.store(tokens_ptr + out, tl.where(draft, token, tl.load(root_ptr + b)), mask=in_tree)
    tl.store(depth_ptr + out, depth, mask=in_tree)
    tl.store(rank_ptr + out, rank, mask=in_tree)
    tl.store(parent_ptr + out, tl.where(real & (slots > 0), o_meta & 4095, -1), mask=in_tree)
    tl.store(score_ptr + out, o_score, mask=in_tree)
    tl.store(num_nodes_ptr + b, tl.sum((real & in_tree).to(tl.int64), axis=0))


def ddtree_select(
    logq: torch.Tensor, ids: torch.Tensor, root_tokens: torch.Tensor, budget: int, chain: int
):
    """Triton twin of ``build._select_torch`` plus the token gather (same outputs, bit for bit).

    ``chain``: forced chain pops (0 or L, ``build._chain_length``). Returns
    ``(tokens, depth, rank, parent, score, num_nodes)``.
    """
    bs, L, K = logq.shape
    N = budget + 1
    if L >= 63 or N > 4095 or K > 4095:
        raise ValueError(
            f"the Triton DDTree selection supports L < 63 and budget, K < 4095; got L={L}, budget={budget}, K={K}"
        )
    dev = logq.device
    depth = torch.empty(bs, N, dtype=torch.long, device=dev)
    rank = torch.empty_like(depth)
    parent = torch.empty_like(depth)
    score = torch.empty(bs, N, dtype=torch.float32, device=dev)
    num_nodes = torch.empty(bs, dtype=torch.long, device=dev)
    tokens = torch.empty_like(depth)
    _select_kernel[(bs,)](
        logq,
        ids,
        root_tokens,
        tokens,
        depth,
        rank,
        parent,
        score,
        num_nodes,
        L=L,
        K=K,
        N=N,
        FB=triton.next_power_of_2(N),
        CHAIN=chain,
        num_warps=1,
    )
    return tokens, depth, rank, parent, score, num_nodes


@triton.jit
def _layout_kernel(
    parents_ptr,
    depths_ptr,
    seq_lens_ptr,
    mask_ptr,
    positions_ptr,
    next_token_ptr,
    next_sibling_ptr,
    retrieve_index_ptr,
    paths_ptr,
    N: tl.constexpr,
    HOPS: tl.constexpr,
    MODE: tl.constexpr,
    BI: tl.constexpr,
    NB: tl.constexpr,
    RB: tl.constexpr,  # requests summed per iteration for the FULL_MASK offset
    PW: tl.constexpr,  # path table width (0: no table)
    PWB: tl.constexpr,
):
    b = tl.program_id(0)
    rows = tl.program_id(1) * BI + tl.arange(0, BI)
    cols = tl.arange(0, NB)
    row_ok = rows < N
    col_ok = cols < N
    par_rows = tl.load(parents_ptr + b * N + rows, mask=row_ok, other=-1)
    par_cols = tl.load(parents_ptr + b * N + cols, mask=col_ok, other=-2)
    depth = tl.load(depths_ptr + b * N + rows, mask=row_ok, other=0)
    seq_len = tl.load(seq_lens_ptr + b)
    # First child: lowest j whose parent is the row; next sibling: lowest j > row with the same parent.
    big = N
    first = tl.min(tl.where(par_cols[None, :] == rows[:, None], cols[None, :], big), axis=1)
    sib_hit = (
        (par_cols[None, :] == par_rows[:, None])
        & (cols[None, :] > rows[:, None])
        & (par_rows[:, None] >= 0)
    )
    nxt = tl.min(tl.where(sib_hit, cols[None, :], big), axis=1)
    out = b * N + rows
    tl.store(next_token_ptr + out, tl.where(first == big, -1, first), mask=row_ok)
    tl.store(next_sibling_ptr + out, tl.where(nxt == big, -1, nxt), mask=row_ok)
    tl.store(retrieve_index_ptr + out, out, mask=row_ok)
    tl.store(positions_ptr + out, seq_len + tl.maximum(depth, 0), mask=row_ok)
    # Ancestor-or-self mask by parent hops (depth <= HOPS); the path table puts the h-th
    # ancestor at column depth - h.
    anc = cols[None, :] == rows[:, None]
    slots = tl.arange(0, PWB)
    up = depth[:, None] - slots[None, :]  # hops from the node to path column t
    path = tl.where(up == 0, rows[:, None].to(tl.int64), -1)
    cur = par_rows
    for h in range(HOPS):
        anc = anc | ((cols[None, :] == cur[:, None]) & (cur[:, None] >= 0))
        path = tl.where((up == h + 1) & (cur[:, None] >= 0), cur[:, None], path)
        cur = tl.load(parents_ptr + b * N + tl.maximum(cur, 0), mask=row_ok & (cur >= 0), other=-1)
    if PW > 0:  # padding slots (depth -1) and nodes deeper than PW - 1 get an all -1 row
        path = tl.where(((depth >= 0) & (depth < PW))[:, None], path, -1)
        tl.store(
            paths_ptr + out[:, None] * PW + slots[None, :],
            path.to(tl.int32),
            mask=row_ok[:, None] & (slots[None, :] < PW),
        )
    if MODE == 2:  # QLEN_ONLY_BITPACKING: bit j of row i
        bits = tl.sum(tl.where(anc & col_ok[None, :], 1 << cols[None, :].to(tl.int64), 0), axis=1)
        tl.store(mask_ptr + out, bits.to(mask_ptr.dtype.element_ty), mask=row_ok)
    else:
        if (
            MODE == 0
        ):  # FULL_MASK: request b's rows hold (seq_len_b + N) columns, requests concatenated
            # A loop over the requests before b, not a [next_pow2(bs)] block: no constexpr
            # depends on the batch size, so one compile per budget serves every batch size (an
            # adaptive server compiled one per (budget, batch-size class) mid-serving).
            before = tl.load(seq_lens_ptr + b) * 0
            for r0 in range(0, b, RB):
                reqs = r0 + tl.arange(0, RB)
                before += tl.sum(tl.load(seq_lens_ptr + reqs, mask=reqs < b, other=0), axis=0)
            row_start = (before + b * N) * N + rows * (seq_len + N)
            for c in range(0, seq_len, 128):  # the verified prefix is visible to every node
                pc = c + tl.arange(0, 128)
                pre = mask_ptr + row_start[:, None] + pc[None, :]
                tl.store(
                    pre,
                    tl.full([BI, 128], 1, tl.int8),
                    mask=row_ok[:, None] & (pc[None, :] < seq_len),
                )
            row_start += seq_len
        else:  # QLEN_ONLY
            row_start = (b * N + rows) * N
        ptrs = mask_ptr + row_start[:, None] + cols[None, :]
        tl.store(ptrs, anc.to(tl.int8), mask=row_ok[:, None] & col_ok[None, :])


def tree_layout(
    tree: DraftTree,
    seq_lens: torch.Tensor,
    mode: TreeMaskMode,
    seq_lens_sum: int | None,
    out: torch.Tensor | None = None,
    path_width: int | None = None,
) -> TreeABI:
    """Triton twin of the CPU path of ``layout.sglang_tree_abi`` (``out``: the mask's buffer,
    ``path_width``: also the root-first path table)."""
    bs, N = tree.tokens.shape
    dev = tree.tokens.device
    positions = torch.empty(bs, N, dtype=torch.long, device=dev)
    first = torch.empty_like(positions)
    nxt = torch.empty_like(positions)
    retrieve_index = torch.empty_like(positions)
    if out is not None:
        mask = out
    elif mode == TreeMaskMode.FULL_MASK:
        mask = torch.empty(seq_lens_sum * N + bs * N * N, dtype=torch.bool, device=dev)
    elif mode == TreeMaskMode.QLEN_ONLY:
        mask = torch.empty(bs * N * N, dtype=torch.bool, device=dev)
    else:
        mask = torch.empty(bs * N, dtype=bitpack_dtype(N), device=dev)
    store_view = mask.view(torch.int8) if mask.dtype in (torch.bool, torch.uint8) else mask
    paths = (
        None
        if path_width is None
        else torch.empty(bs, N, path_width, dtype=torch.int32, device=dev)
    )
    BI = 16 if N > 64 else 32
    _layout_kernel[(bs, triton.cdiv(N, BI))](
        tree.parents,
        tree.depths,
        seq_lens,
        store_view,
        positions,
        first,
        nxt,
        retrieve_index,
        positions if paths is None else paths,  # unread without a table
        N=N,
        HOPS=tree.horizon,
        MODE=int(mode),
        BI=BI,
        NB=triton.next_power_of_2(N),
        RB=16,
        PW=path_width or 0,
        PWB=triton.next_power_of_2(path_width or 1),
    )
    return TreeABI(
        tree.tokens.reshape(-1),
        positions.reshape(-1),
        retrieve_index,
        first,
        nxt,
        mask,
        mode,
        paths,
    )


@triton.jit
def _walk_kernel(
    tokens_ptr,
    parents_ptr,
    target_ptr,
    accepted_ptr,
    accept_len_ptr,
    bonus_ptr,
    N: tl.constexpr,
    L: tl.constexpr,
    NB: tl.constexpr,
    LB: tl.constexpr,
):
    b = tl.program_id(0)
    slots = tl.arange(0, NB)
    ok = slots < N
    tokens = tl.load(tokens_ptr + b * N + slots, mask=ok, other=-1)
    parents = tl.load(parents_ptr + b * N + slots, mask=ok, other=-2)
    target = tl.load(target_ptr + b * N + slots, mask=ok, other=-1)
    steps = tl.arange(0, LB)
    accepted = tl.where(steps == 0, 0, -1)
    cur = 0
    want = tl.sum(tl.where(slots == 0, target, 0), axis=0)
    alive = True
    for step in range(1, L + 1):
        hit = tl.where(alive, (parents == cur) & (tokens == want), False)
        child = tl.min(tl.where(hit, slots, NB), axis=0)
        alive = child < NB
        cur = tl.where(alive, child, cur)
        accepted = tl.where(tl.where(alive, steps == step, False), child, accepted)
        want = tl.sum(tl.where(slots == cur, target, 0), axis=0)
    tl.store(accepted_ptr + b * (L + 1) + steps, accepted, mask=steps < L + 1)
    tl.store(accept_len_ptr + b, tl.sum((accepted >= 0).to(tl.int64), axis=0) - 1)
    tl.store(bonus_ptr + b, want)


def tree_walk(tree: DraftTree, target_tokens: torch.Tensor) -> WalkResult:
    """Triton twin of ``walk._walk_torch``."""
    bs, N = tree.tokens.shape
    L = tree.horizon
    dev = tree.tokens.device
    accepted = torch.empty(bs, L + 1, dtype=torch.long, device=dev)
    accept_len = torch.empty(bs, dtype=torch.long, device=dev)
    bonus = torch.empty(bs, dtype=torch.long, device=dev)
    _walk_kernel[(bs,)](
        tree.tokens,
        tree.parents,
        target_tokens,
        accepted,
        accept_len,
        bonus,
        N=N,
        L=L,
        NB=triton.next_power_of_2(N),
        LB=triton.next_power_of_2(L + 1),
        num_warps=1 if N <= 64 else 4,
    )
    return WalkResult(accepted, accept_len, bonus, target_tokens)
