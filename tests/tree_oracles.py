"""Independent oracles for the `sglang_spec.tree` tests.

Everything here is written from the contract in docs/tree-api.md, the DDTree paper
(Algorithm 1, Prop. 2, Lemma 1) and SGLang 0.5.23's own definitions of the EAGLE tree
ABI -- never from the implementation under test.  The oracles are deliberately naive
(enumeration, brute force, Python loops) so that they are easy to trust.

This file is also a script: ``python tests/tree_oracles.py IN.pt OUT.pt`` runs SGLang's own
Triton kernels (under ``TRITON_INTERPRET=1``, on CPU) on cases prepared by the tests and
saves their raw outputs.  It must not import `sglang_spec`, so that SGLang's view of our ABI
is computed without our code in the process.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from itertools import product

import torch

NEG_INF = float("-inf")


# ----------------------------------------------------------------------------------------
# DDTree build oracle: enumerate every prefix
# ----------------------------------------------------------------------------------------


def logq64(draft_logits_row: torch.Tensor) -> torch.Tensor:
    """[L, V] logits -> float64 log-softmax (the draft distribution at every depth)."""
    return torch.log_softmax(draft_logits_row.double(), dim=-1)


def tie_ranks(lq: torch.Tensor) -> torch.Tensor:
    """Rank of each token per depth under the order (logq desc, id asc). [L, V] -> [L, V]."""
    L, V = lq.shape
    ranks = torch.empty(L, V, dtype=torch.long)
    for d in range(L):
        order = sorted(range(V), key=lambda t: (-lq[d, t].item(), t))
        for r, t in enumerate(order):
            ranks[d, t] = r
    return ranks


def enumerate_prefixes(lq: torch.Tensor, allowed=None) -> dict:
    """All token sequences of length 1..L -> score = sum of log-probs (float64).

    ``allowed[d]`` optionally restricts the tokens usable at depth d (a list of ids).
    """
    L, V = lq.shape
    rows = lq.tolist()
    out = {}
    for d in range(1, L + 1):
        pools = [allowed[i] if allowed is not None else range(V) for i in range(d)]
        for seq in product(*pools):
            out[seq] = sum(rows[i][t] for i, t in enumerate(seq))
    return out


def all_prefix_scores(lq: torch.Tensor) -> torch.Tensor:
    """Vectorised version of enumerate_prefixes (scores only), float64 1-D."""
    L, V = lq.shape
    cur = torch.zeros(1, dtype=torch.float64)
    chunks = []
    for d in range(L):
        cur = (cur[:, None] + lq[d][None, :]).reshape(-1)
        chunks.append(cur)
    return torch.cat(chunks)


def oracle_chain(lq: torch.Tensor, allowed=None) -> tuple:
    """The drafter's greedy chain: at every depth the (allowed) token first under (logq desc, id asc)."""
    L, V = lq.shape
    return tuple(
        min(allowed[d] if allowed is not None else range(V), key=lambda t: (-lq[d, t].item(), t))
        for d in range(L)
    )


def oracle_tree(
    lq: torch.Tensor, budget: int, k: int | None = None, allowed=None, include_chain: bool = True
) -> tuple[tuple, torch.Tensor]:
    """What the DDTree of ``budget`` nodes must hold: ``(chain, scores of its other nodes, desc)``.

    The candidates at depth d are ``allowed[d]`` (default: the tokens of rank < k under
    (logq desc, id asc), k defaulting to min(budget, V)). With ``include_chain`` and
    ``budget >= L`` the tree holds the greedy chain (all L of its prefixes) and its other nodes
    are the ``budget - L`` best finite candidate prefixes that are not chain prefixes; otherwise
    chain = () and the nodes are the ``budget`` best finite candidate prefixes. Fewer finite
    candidates than that leave padding.

    Lemma 1 (only ranks < min(B, V) can appear) holds for both, as the chain takes rank 0 at every
    depth: with the default k the restricted answer is checked against the unrestricted one.
    """
    L, V = lq.shape
    k = min(budget, V) if k is None else k
    if allowed is None:
        ranks = tie_ranks(lq)
        allowed = [[t for t in range(V) if ranks[d, t] < k] for d in range(L)]
        lemma1 = k == min(budget, V)
    else:
        lemma1 = False
    chain = oracle_chain(lq, allowed) if include_chain and budget >= L else ()
    in_chain = {chain[:d] for d in range(1, len(chain) + 1)}
    restricted = enumerate_prefixes(lq, allowed)
    others = [s for u, s in restricted.items() if math.isfinite(s) and u not in in_chain]
    rest = torch.sort(torch.tensor(others, dtype=torch.float64), descending=True).values
    rest = rest[: budget - len(chain)]
    if lemma1:  # the same scores without the rank restriction (a check of the oracle itself)
        allscores = all_prefix_scores(lq)
        keep = torch.isfinite(allscores)
        offset = 0
        for d in range(1, L + 1):
            if d <= len(chain):  # drop the chain prefix of depth d (row-major index in its chunk)
                keep[offset + sum(t * V ** (d - 1 - i) for i, t in enumerate(chain[:d]))] = False
            offset += V**d
        best_all = torch.sort(allscores[keep], descending=True).values[: rest.numel()]
        assert torch.allclose(best_all, rest, atol=1e-9), "oracle: Lemma 1 violated?"
    return chain, rest


def path_of(parents_row, i: int) -> list:
    """Node indices from the root (excluded) down to node i (included)."""
    path = []
    guard = 0
    while i > 0:
        path.append(i)
        i = int(parents_row[i])
        guard += 1
        assert guard < 10_000, "cycle in parents"
    assert i == 0, "path does not end at the root"
    return path[::-1]


# ----------------------------------------------------------------------------------------
# Arbitrary valid trees (for layout and walk tests that must not depend on the builder)
# ----------------------------------------------------------------------------------------


def random_tree_fields(
    gen: torch.Generator, bs: int, budget: int, L: int, V: int, allow_padding=True, full=False
) -> dict:
    """Random DraftTree fields obeying the contract: index 0 = root, parent < child, distinct
    sibling tokens, depth <= L, real nodes are [0, num_nodes), padding = (root token, -1, -1, -inf)."""
    N = 1 + budget

    def rint(n):
        return int(torch.randint(n, (1,), generator=gen).item())

    tokens = torch.zeros(bs, N, dtype=torch.long)
    parents = torch.full((bs, N), -1, dtype=torch.long)
    depths = torch.full((bs, N), -1, dtype=torch.long)
    scores = torch.full((bs, N), NEG_INF, dtype=torch.float32)
    num_nodes = torch.zeros(bs, dtype=torch.long)
    for b in range(bs):
        root_tok = rint(V)
        tokens[b, :] = root_tok
        depths[b, 0] = 0
        scores[b, 0] = 0.0
        want = N if (full or not allow_padding) else 1 + rint(N)
        used = {0: set()}  # node -> child tokens already used
        n = 1
        while n < want:
            cands = [p for p in range(n) if depths[b, p] < L and len(used[p]) < V]
            if not cands:
                break
            # bias towards deep chains sometimes, towards bushy trees other times
            p = cands[-1] if rint(3) == 0 else cands[rint(len(cands))]
            free = [t for t in range(V) if t not in used[p]]
            t = free[rint(len(free))]
            used[p].add(t)
            used[n] = set()
            tokens[b, n] = t
            parents[b, n] = p
            depths[b, n] = depths[b, p] + 1
            scores[b, n] = scores[b, p] - float(torch.rand((1,), generator=gen).item()) - 0.01
            n += 1
        num_nodes[b] = n
    return dict(tokens=tokens, parents=parents, depths=depths, scores=scores, num_nodes=num_nodes)


def targets_that_often_match(
    gen: torch.Generator, f: dict, V: int, p_match: float = 0.75
) -> torch.Tensor:
    """Target tokens [bs, N]: at a node with children, with prob p_match pick one child's token."""
    tokens, parents, num_nodes = f["tokens"], f["parents"], f["num_nodes"]
    bs, N = tokens.shape
    tgt = torch.randint(V, (bs, N), generator=gen)
    for b in range(bs):
        for i in range(int(num_nodes[b])):
            kids = [c for c in range(int(num_nodes[b])) if int(parents[b, c]) == i]
            if kids and torch.rand((1,), generator=gen).item() < p_match:
                c = kids[int(torch.randint(len(kids), (1,), generator=gen).item())]
                tgt[b, i] = tokens[b, c]
    return tgt


# ----------------------------------------------------------------------------------------
# Layout oracles (SGLang 0.5.23 definitions)
# ----------------------------------------------------------------------------------------


def oracle_ancestor_mask(parents: torch.Tensor, num_nodes: torch.Tensor) -> torch.Tensor:
    bs, N = parents.shape
    m = torch.zeros(bs, N, N, dtype=torch.bool)
    for b in range(bs):
        for i in range(N):
            m[b, i, i] = True
            if i < int(num_nodes[b]):
                j = int(parents[b, i])
                while j >= 0:
                    m[b, i, j] = True
                    j = int(parents[b, j])
    return m


def oracle_next_pointers(parents: torch.Tensor, num_nodes: torch.Tensor):
    """retrieve_next_token = lowest-index child, retrieve_next_sibling = next higher-index node
    with the same parent (what SGLang's build kernel produces by inserting children from the
    highest index down)."""
    bs, N = parents.shape
    nt = torch.full((bs, N), -1, dtype=torch.long)
    ns = torch.full((bs, N), -1, dtype=torch.long)
    for b in range(bs):
        n = int(num_nodes[b])
        for i in range(n):
            kids = [c for c in range(1, n) if int(parents[b, c]) == i]
            if kids:
                nt[b, i] = kids[0]
                for a, c in zip(kids, kids[1:]):
                    ns[b, a] = c
    return nt, ns


def bitpack_dtype(N: int) -> torch.dtype:
    """SGLang eagle_utils.build_tree_kernel_efficient: [uint8, uint16, uint32][ceil(log2((N+7)//8))]."""
    return [torch.uint8, torch.uint16, torch.uint32][int(math.ceil(math.log2((N + 7) // 8)))]


def oracle_abi(f: dict, seq_lens: torch.Tensor, mode: int) -> dict:
    """The EAGLE tree ABI tensors for a tree, per SGLang 0.5.23.  mode: 0 FULL, 1 QLEN, 2 BITPACK."""
    tokens, parents, depths, num_nodes = f["tokens"], f["parents"], f["depths"], f["num_nodes"]
    bs, N = tokens.shape
    anc = oracle_ancestor_mask(parents, num_nodes)
    pos = seq_lens[:, None].long() + torch.where(depths >= 0, depths, torch.zeros_like(depths))
    nt, ns = oracle_next_pointers(parents, num_nodes)
    if mode == 0:
        rows = []
        for b in range(bs):
            s = int(seq_lens[b])
            blk = torch.cat([torch.ones(N, s, dtype=torch.bool), anc[b]], dim=1)  # [N, s+N]
            rows.append(blk.reshape(-1))
        mask = torch.cat(rows)
    elif mode == 1:
        mask = anc.reshape(-1).clone()
    else:
        assert N <= 32
        vals = torch.zeros(bs * N, dtype=torch.int64)
        flat = anc.reshape(bs * N, N)
        for j in range(N):
            vals |= flat[:, j].long() << j
        # reinterpret as the unsigned type (values < 2**32 fit)
        mask = vals  # compared by integer value
    return dict(
        draft_tokens=tokens.reshape(-1).clone(),
        positions=pos.reshape(-1),
        retrieve_index=(torch.arange(bs)[:, None] * N + torch.arange(N)[None, :]),
        retrieve_next_token=nt,
        retrieve_next_sibling=ns,
        tree_mask=mask,
    )


# ----------------------------------------------------------------------------------------
# Walk oracles
# ----------------------------------------------------------------------------------------


def oracle_walk_greedy(f: dict, target_tokens: torch.Tensor, L: int):
    """Brute force: among all root-to-node paths, the longest one on which every node's token
    equals the target token chosen at its parent.  Returns (accepted [bs, L+1], accept_len, bonus)."""
    tokens, parents, num_nodes = f["tokens"], f["parents"], f["num_nodes"]
    bs, N = tokens.shape
    acc = torch.full((bs, L + 1), -1, dtype=torch.long)
    alen = torch.zeros(bs, dtype=torch.long)
    bonus = torch.zeros(bs, dtype=torch.long)
    for b in range(bs):
        best = []
        for i in range(1, int(num_nodes[b])):
            path = path_of(parents[b], i)
            ok = all(
                int(tokens[b, c]) == int(target_tokens[b, p]) for p, c in zip([0] + path[:-1], path)
            )
            if ok:
                assert len(path) != len(best) or path == best, "two accepted paths of equal length"
                if len(path) > len(best):
                    best = path
        full = [0] + best
        acc[b, : len(full)] = torch.tensor(full)
        alen[b] = len(best)
        bonus[b] = target_tokens[b, full[-1]]
    return acc, alen, bonus


def pointer_walk(next_token, next_sibling, draft_tokens_2d, target_tokens):
    """Walk SGLang's retrieve_next_token / retrieve_next_sibling lists in Python."""
    bs, N = draft_tokens_2d.shape
    paths = []
    for b in range(bs):
        cur, path = 0, [0]
        while True:
            want = int(target_tokens[b, cur])
            c = int(next_token[b, cur])
            found = -1
            steps = 0
            while c != -1:
                steps += 1
                assert steps <= N, "sibling list cycles"
                if int(draft_tokens_2d[b, c]) == want:
                    found = c
                    break
                c = int(next_sibling[b, c])
            if found < 0:
                break
            path.append(found)
            cur = found
            assert len(path) <= N, "child list cycles"
        paths.append(path)
    return paths


# ----------------------------------------------------------------------------------------
# Target sampling distribution oracle
# ----------------------------------------------------------------------------------------


def filtered_probs(
    logits_row: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    order: str = "topk_then_topp",
) -> torch.Tensor:
    """Target distribution after temperature, top-k, top-p, float64, renormalised.

    order="topk_then_topp": SGLang's tree-verify order (softmax(T) -> top_k_renorm ->
    top_p_renorm on the renormalised probs).  order="joint": both filters on the same sorted
    probs (SGLang's torch-native sampler).  Tests pick parameters where the two agree.
    top-p keeps the smallest prefix of the sorted tokens whose mass reaches top_p.
    """
    p = torch.softmax(logits_row.double() / temperature, dim=-1)
    V = p.numel()
    order_ids = sorted(range(V), key=lambda t: (-p[t].item(), t))
    keep = torch.zeros(V, dtype=torch.bool)
    if top_k is not None and top_k > 0:
        topk_ids = order_ids[:top_k]
    else:
        topk_ids = order_ids
    if order == "topk_then_topp":
        mass = sum(p[t].item() for t in topk_ids)
        denom = mass
    else:
        denom = 1.0
    cum = 0.0
    for t in topk_ids:
        if top_p < 1.0 and cum >= top_p * denom:
            break
        keep[t] = True
        cum += p[t].item()
    q = torch.where(keep, p, torch.zeros_like(p))
    return q / q.sum()


# ----------------------------------------------------------------------------------------
# SGLang's own Triton kernels, run in a subprocess under the Triton interpreter
# ----------------------------------------------------------------------------------------


def eagle_encoding(parents_row, depths_row, n: int):
    """Encode a (full) tree of n nodes as EAGLE's (parent_list, selected_index, topk).

    EAGLE scores topk candidates at depth 1 (flat ids 0..topk-1) and topk*topk at every
    later depth d (ids topk + (d-2)*topk^2 + slot*topk + c, where `slot` is the parent's
    position among the topk expanded nodes of depth d-1).  parent_list[1 + (d-2)*topk + slot]
    holds the parent's own flat id, parent_list[0] the root.  With topk = n - 1 every tree fits.
    """
    topk = max(1, n - 1)
    sel = [0] * (n - 1)
    slot = {}
    per_depth = {}
    nkids = {}
    for i in range(1, n):
        d = int(depths_row[i])
        slot[i] = per_depth.get(d, 0)
        per_depth[d] = slot[i] + 1
        p = int(parents_row[i])
        c = nkids.get(p, 0)
        nkids[p] = c + 1
        if d == 1:
            sel[i - 1] = c
        else:
            sel[i - 1] = topk + (d - 2) * topk * topk + slot[p] * topk + c
    max_d = max([int(depths_row[i]) for i in range(n)] + [1])
    plist = [-1] * (topk * max(max_d - 1, 0) + 1)
    for i in range(1, n):
        d = int(depths_row[i])
        if any(int(parents_row[c]) == i for c in range(1, n)):
            plist[1 + (d - 1) * topk + slot[i]] = sel[i - 1]
    return plist, sel, topk, max_d


def run_sglang_subprocess(cases: list, tmpdir) -> list:
    """Run SGLang's kernels on `cases` in a fresh interpreter with TRITON_INTERPRET=1."""
    inp = os.path.join(str(tmpdir), "sglang_in.pt")
    out = os.path.join(str(tmpdir), "sglang_out.pt")
    torch.save(cases, inp)
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "1"
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    r = subprocess.run(
        [sys.executable, os.path.abspath(__file__), inp, out],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if r.returncode != 0:
        raise AssertionError(
            f"SGLang subprocess failed (rc={r.returncode}):\n{r.stdout[-4000:]}\n{r.stderr[-8000:]}"
        )
    return torch.load(out)


SGLANG_KERNELS = {
    # file under site-packages/sglang/          -> Triton kernels taken verbatim from it
    "kernels/ops/speculative/spec_tree.py": (
        "sgl_build_tree_kernel_efficient_triton",
        "verify_tree_greedy_kernel_triton",
    ),
    "kernels/ops/speculative/reconstruct_tree.py": ("_reconstruct_tree_mask_kernel",),
}


def load_sglang_kernels(workdir: str) -> dict:
    """SGLang's own @triton.jit kernels, loaded without importing the `sglang` package.

    Importing `sglang` costs 10-40 s on the CI machine (and its speculative modules import
    sgl_kernel at module level on CPU hosts), so the kernel definitions are cut verbatim out of
    the installed SGLang source files with `ast` (tests/sglang_kernel_gdn.py:load_verbatim) and
    imported from a scratch module.  The launch wrappers are re-stated below from
    `sgl_build_tree_kernel_triton`, `verify_tree_greedy_triton` and
    `reconstruct_indices_from_tree_mask_triton`.
    """
    from sglang_kernel_gdn import load_verbatim

    prelude = "import torch\nimport triton\nimport triton.language as tl\n"
    mod = load_verbatim(SGLANG_KERNELS, prelude, workdir, "sglang_tree_kernels_verbatim")
    return {n: getattr(mod, n) for names in SGLANG_KERNELS.values() for n in names}


def _sglang_main(inp: str, out: str) -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1"
    kernels = load_sglang_kernels(os.path.dirname(out))
    build_k = kernels["sgl_build_tree_kernel_efficient_triton"]
    verify_k = kernels["verify_tree_greedy_kernel_triton"]
    recon_k = kernels["_reconstruct_tree_mask_kernel"]

    cases = torch.load(inp)
    results = []
    for c in cases:
        kind = c["kind"]
        if kind == "verify":
            cand = c["candidates"].long().contiguous()
            bs, N = cand.shape
            D = c["num_speculative_tokens"]
            predicts = torch.full((bs * N,), -7, dtype=torch.int32)
            accept_index = torch.full((bs, D), -1, dtype=torch.int32)
            accept_num = torch.zeros(bs, dtype=torch.int32)
            verify_k[(bs,)](
                predicts,
                accept_index,
                accept_num,
                cand,
                c["retrieve_index"].long().contiguous(),
                c["retrieve_next_token"].long().contiguous(),
                c["retrieve_next_sibling"].long().contiguous(),
                c["target_predict"].long().contiguous(),
                batch_size=bs,
                num_speculative_tokens=D,
                num_draft_tokens=N,
            )
            results.append(
                dict(predicts=predicts, accept_index=accept_index, accept_token_num=accept_num)
            )
        elif kind == "reconstruct":
            bs, N = c["bs"], c["N"]
            pos = torch.full((bs * N,), -7, dtype=torch.long)
            ri = torch.full((bs * N,), -7, dtype=torch.long)
            nt = torch.full((bs * N,), -7, dtype=torch.long)
            ns = torch.full((bs * N,), -7, dtype=torch.long)
            block_n = 1 << max(0, (N - 1).bit_length())  # sglang.srt.utils.next_power_of_2
            recon_k[(bs,)](
                c["tree_mask"].to(torch.bool).contiguous(),
                c["seq_lens"].long().contiguous(),
                pos,
                ri,
                nt,
                ns,
                N,
                block_n,
            )
            results.append(
                dict(
                    positions=pos,
                    retrieve_index=ri.view(bs, N),
                    retrieve_next_token=nt.view(bs, N),
                    retrieve_next_sibling=ns.view(bs, N),
                )
            )
        elif kind == "build":
            bs, N, mode = c["bs"], c["N"], c["mode"]
            seq_lens = c["seq_lens"].long().contiguous()
            # eagle_utils.build_tree_kernel_efficient: the mask starts all True
            if mode == 0:
                tree_mask = torch.full(
                    (int(seq_lens.sum()) * N + N * N * bs,), True, dtype=torch.bool
                )
            else:
                tree_mask = torch.full((N * N * bs,), True, dtype=torch.bool)
            positions = torch.empty(bs * N, dtype=torch.long)
            buf = torch.full((3, bs, N), -1, dtype=torch.long)
            ri, nt, ns = buf
            parent_list = c["parent_list"].long().contiguous()
            selected_index = c["selected_index"].long().contiguous()
            seq_len_prefix_sum = torch.cumsum(seq_lens, dim=0) - seq_lens
            build_k[(bs,)](
                parent_list,
                selected_index,
                seq_lens,
                seq_len_prefix_sum,
                tree_mask,
                positions,
                ri,
                nt,
                ns,
                topk=c["topk"],
                depth=c["depth"],
                draft_token_num=N,
                tree_mask_mode=int(mode),
                batch_size=bs,
                parent_list_stride=parent_list.stride(0),
                selected_index_stride=selected_index.stride(0),
            )
            results.append(
                dict(
                    tree_mask=tree_mask,
                    positions=positions,
                    retrieve_index=ri.clone(),
                    retrieve_next_token=nt.clone(),
                    retrieve_next_sibling=ns.clone(),
                )
            )
        else:
            raise ValueError(kind)
    torch.save(results, out)


if __name__ == "__main__":
    _sglang_main(sys.argv[1], sys.argv[2])
