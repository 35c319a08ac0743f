"""Tree layout: `ancestor_mask`, `tree_positions`, `sglang_tree_abi`.

Checked against (1) oracles of SGLang 0.5.23's definitions written in tests/tree_oracles.py,
and (2) SGLang's OWN Triton kernels, run on CPU under the Triton interpreter in a subprocess:
  * `sgl_build_tree_kernel_efficient_triton` (EAGLE's ABI builder), fed our trees encoded in
    EAGLE's (parent_list, selected_index) form -> must produce exactly our ABI tensors;
  * `verify_tree_greedy_kernel_triton` (EAGLE's greedy tree walk), fed our ABI -> must give the
    same accepted path and bonus as `walk_greedy` and the brute-force oracle;
  * `reconstruct_indices_from_tree_mask_triton` (NGRAM), fed our QLEN_ONLY mask -> must rebuild
    our positions and retrieve_* pointers.
"""

from __future__ import annotations

import pytest
import torch
import tree_oracles as O
from hypothesis import given
from hypothesis import strategies as st
from tree_testing import SETTINGS, fields, make_tree

from sglang_spec.tree import (
    TreeMaskMode,
    ancestor_mask,
    bitpack_dtype,
    build_ddtree,
    sglang_tree_abi,
    tree_positions,
    walk_greedy,
)

MODES = [TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY, TreeMaskMode.QLEN_ONLY_BITPACKING]


def random_case(seed: int, bs: int, B: int, L: int, V: int, full: bool = False):
    g = torch.Generator().manual_seed(seed)
    f = O.random_tree_fields(g, bs, B, L, V, full=full)
    seq_lens = torch.randint(0, 9, (bs,), generator=g)
    return f, make_tree(f, L), seq_lens


def built_case(seed: int, bs: int, B: int, L: int, V: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(bs, L, V, generator=g)
    roots = torch.randint(V, (bs,), generator=g)
    tree = build_ddtree(x, B, roots)
    seq_lens = torch.randint(1, 9, (bs,), generator=g)
    return fields(tree), tree, seq_lens


def assert_abi_equal(abi, want: dict, mode, N: int, bs: int, seq_lens: torch.Tensor) -> None:
    assert abi.draft_tokens.dtype == torch.int64 and tuple(abi.draft_tokens.shape) == (bs * N,)
    assert abi.positions.dtype == torch.int64 and tuple(abi.positions.shape) == (bs * N,)
    for name in ("retrieve_index", "retrieve_next_token", "retrieve_next_sibling"):
        t = getattr(abi, name)
        assert t.dtype == torch.int64 and tuple(t.shape) == (bs, N), name
    for name in (
        "draft_tokens",
        "positions",
        "retrieve_index",
        "retrieve_next_token",
        "retrieve_next_sibling",
    ):
        assert torch.equal(getattr(abi, name), want[name]), (name, getattr(abi, name), want[name])
    m = abi.tree_mask
    if mode == TreeMaskMode.FULL_MASK:
        assert m.dtype == torch.bool and tuple(m.shape) == (int(seq_lens.sum()) * N + bs * N * N,)
        assert torch.equal(m, want["tree_mask"])
    elif mode == TreeMaskMode.QLEN_ONLY:
        assert m.dtype == torch.bool and tuple(m.shape) == (bs * N * N,)
        assert torch.equal(m, want["tree_mask"])
    else:
        assert m.dtype == O.bitpack_dtype(N), (m.dtype, N)
        assert tuple(m.shape) == (bs * N,)
        assert torch.equal(m.to(torch.int64), want["tree_mask"])


# ----------------------------------------------------------------------------------------
# ancestor_mask / tree_positions
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bs,B,L,V", [(1, 1, 1, 2), (3, 6, 3, 3), (4, 12, 4, 2), (2, 7, 2, 8)])
def test_ancestor_mask_random_trees(bs, B, L, V):
    for seed in range(5):
        f, tree, _ = random_case(seed, bs, B, L, V)
        m = ancestor_mask(tree)
        assert m.dtype == torch.bool and tuple(m.shape) == (bs, B + 1, B + 1)
        assert torch.equal(m, O.oracle_ancestor_mask(f["parents"], f["num_nodes"]))


def test_ancestor_mask_padding_rows_self_only():
    x = torch.tensor([[[0.0, 1.0]]])  # V=2, L=1 -> 2 real draft nodes, budget 4 -> 2 padding slots
    tree = build_ddtree(x, 4, torch.tensor([1]))
    m = ancestor_mask(tree)[0]
    assert int(tree.num_nodes[0]) == 3
    want = torch.eye(5, dtype=torch.bool)
    want[1, 0] = want[2, 0] = True
    assert torch.equal(m, want)


def test_tree_positions():
    for seed in range(4):
        f, tree, seq_lens = random_case(seed, 5, 9, 3, 3)
        pos = tree_positions(tree, seq_lens)
        assert pos.dtype == torch.int64 and tuple(pos.shape) == (5, 10)
        for b in range(5):
            for i in range(10):
                d = int(f["depths"][b, i])
                want = int(seq_lens[b]) + (d if i < int(f["num_nodes"][b]) else 0)
                assert int(pos[b, i]) == want


# ----------------------------------------------------------------------------------------
# sglang_tree_abi vs the oracle
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "bs,B,L,V",
    [(1, 1, 1, 3), (3, 7, 3, 3), (2, 8, 4, 2), (4, 15, 3, 4), (2, 16, 5, 3), (2, 31, 6, 4)],
)
def test_abi_random_trees(mode, bs, B, L, V):
    N = B + 1
    for seed in range(3):
        f, tree, seq_lens = random_case(100 + seed, bs, B, L, V)
        abi = sglang_tree_abi(tree, seq_lens, mode=mode)
        assert_abi_equal(abi, O.oracle_abi(f, seq_lens, int(mode)), mode, N, bs, seq_lens)
        abi2 = sglang_tree_abi(tree, seq_lens, mode=mode, seq_lens_sum=int(seq_lens.sum()))
        assert_abi_equal(abi2, O.oracle_abi(f, seq_lens, int(mode)), mode, N, bs, seq_lens)
        # into a caller's larger buffer (the backend's VerifyMask), no host-side sum
        n = abi.tree_mask.numel()
        dtype = torch.uint8 if abi.tree_mask.dtype == torch.bool else abi.tree_mask.dtype
        out = torch.full((n + 9,), 3, dtype=dtype)
        abi3 = sglang_tree_abi(tree, seq_lens, mode=mode, out=out)
        assert abi3.tree_mask is out and (out[n:] == 3).all()
        assert torch.equal(out[:n], abi.tree_mask.to(dtype))


@pytest.mark.parametrize("mode", MODES)
def test_abi_built_trees(mode):
    for seed, (bs, B, L, V) in enumerate(
        [(2, 5, 3, 4), (3, 10, 4, 3), (1, 20, 3, 6), (2, 6, 1, 3)]
    ):
        f, tree, seq_lens = built_case(seed, bs, B, L, V)
        abi = sglang_tree_abi(tree, seq_lens, mode=mode)
        assert_abi_equal(abi, O.oracle_abi(f, seq_lens, int(mode)), mode, B + 1, bs, seq_lens)


def test_abi_default_mode_is_full_mask():
    f, tree, seq_lens = random_case(5, 2, 6, 3, 3)
    a = sglang_tree_abi(tree, seq_lens)
    b = sglang_tree_abi(tree, seq_lens, mode=TreeMaskMode.FULL_MASK)
    assert torch.equal(a.tree_mask, b.tree_mask)
    assert a.tree_mask.numel() == int(seq_lens.sum()) * 7 + 2 * 49


@pytest.mark.parametrize(
    "N,dtype",
    [
        (2, torch.uint8),
        (8, torch.uint8),
        (9, torch.uint16),
        (16, torch.uint16),
        (17, torch.uint32),
        (32, torch.uint32),
    ],
)
def test_bitpack_dtypes_and_chain_values(N, dtype):
    # a chain: row i sees nodes 0..i -> packed value 2**(i+1) - 1
    x = torch.zeros(1, N - 1, 1)  # V = 1 -> only one prefix per depth, L = N - 1 -> full chain
    tree = build_ddtree(x, N - 1, torch.tensor([0]))
    assert int(tree.num_nodes[0]) == N
    abi = sglang_tree_abi(tree, torch.tensor([3]), mode=TreeMaskMode.QLEN_ONLY_BITPACKING)
    assert abi.tree_mask.dtype == dtype
    assert abi.tree_mask.to(torch.int64).tolist() == [(1 << (i + 1)) - 1 for i in range(N)]


@pytest.mark.parametrize("width,dtype", [(1, torch.uint8), (32, torch.uint32)])
def test_bitpack_dtype_accepts_1_to_32(width, dtype):
    assert bitpack_dtype(width) == dtype


@pytest.mark.parametrize("width", [0, 33])
def test_bitpack_dtype_refuses_outside_1_to_32(width):
    with pytest.raises(ValueError, match=rf"holds 1 to 32 verify tokens .*; got width {width}$"):
        bitpack_dtype(width)


def test_abi_33_nodes_only_bitpacking_refuses():
    # the 32-token limit is the bit-packed word's: the other modes lay out a 33-node tree
    f, tree, seq_lens = random_case(9, 2, 32, 4, 3)
    for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
        abi = sglang_tree_abi(tree, seq_lens, mode=mode)
        assert_abi_equal(abi, O.oracle_abi(f, seq_lens, int(mode)), mode, 33, 2, seq_lens)
    with pytest.raises(ValueError, match="holds 1 to 32 verify tokens .*; got width 33$"):
        sglang_tree_abi(tree, seq_lens, mode=TreeMaskMode.QLEN_ONLY_BITPACKING)


def test_abi_bad_mode_and_seq_lens_messages():
    _, tree, seq_lens = random_case(3, 2, 5, 3, 3)
    with pytest.raises(
        ValueError,
        match=r"^mode must be one of \['FULL_MASK', 'QLEN_ONLY', 'QLEN_ONLY_BITPACKING'\] "
        r"\(0, 1, 2\); got 3$",
    ):
        sglang_tree_abi(tree, seq_lens, mode=3)
    with pytest.raises(ValueError, match=r"^seq_lens must be \[bs=2\]; got shape \(3,\)$"):
        sglang_tree_abi(tree, torch.tensor([1, 2, 3]))


def test_abi_seq_lens_sum_checked_in_full_mask_only():
    _, tree, seq_lens = random_case(4, 2, 5, 3, 3)
    true_sum = int(seq_lens.sum())
    with pytest.raises(
        ValueError,
        match=rf"^seq_lens_sum={true_sum + 1} disagrees with sum\(seq_lens\)={true_sum}$",
    ):
        sglang_tree_abi(tree, seq_lens, mode=TreeMaskMode.FULL_MASK, seq_lens_sum=true_sum + 1)
    # the mask of the other modes has no context part: seq_lens_sum is not read there
    for mode in (TreeMaskMode.QLEN_ONLY, TreeMaskMode.QLEN_ONLY_BITPACKING):
        a = sglang_tree_abi(tree, seq_lens, mode=mode, seq_lens_sum=true_sum + 1)
        assert torch.equal(a.tree_mask, sglang_tree_abi(tree, seq_lens, mode=mode).tree_mask)


@pytest.mark.parametrize("mode", MODES)
def test_abi_tensors_on_the_trees_device_not_the_default(mode):
    _, tree, seq_lens = random_case(6, 2, 6, 3, 3)
    with torch.device("meta"):
        abi = sglang_tree_abi(tree, seq_lens, mode=mode)
    tensors = {k: v for k, v in vars(abi).items() if isinstance(v, torch.Tensor)}
    assert len(tensors) == 6
    for name, t in tensors.items():
        assert t.device == tree.tokens.device, name


@SETTINGS
@given(
    bs=st.integers(1, 8),
    B=st.integers(1, 31),
    L=st.integers(1, 6),
    V=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    mode=st.sampled_from(MODES),
    built=st.booleans(),
)
def test_abi_property(bs, B, L, V, seed, mode, built):
    if built:
        f, tree, seq_lens = built_case(seed, bs, B, L, V)
    else:
        f, tree, seq_lens = random_case(seed, bs, B, L, V)
    abi = sglang_tree_abi(tree, seq_lens, mode=mode)
    assert_abi_equal(abi, O.oracle_abi(f, seq_lens, int(mode)), mode, B + 1, bs, seq_lens)
    assert torch.equal(ancestor_mask(tree), O.oracle_ancestor_mask(f["parents"], f["num_nodes"]))
    assert torch.equal(
        tree_positions(tree, seq_lens), O.oracle_abi(f, seq_lens, 1)["positions"].view(bs, B + 1)
    )


# ----------------------------------------------------------------------------------------
# SGLang's own kernels consume / reproduce our ABI (one subprocess, Triton interpreter)
# ----------------------------------------------------------------------------------------


def _eagle_case(f: dict, seq_lens: torch.Tensor, L: int, mode: int) -> dict:
    bs, N = f["tokens"].shape
    enc = [O.eagle_encoding(f["parents"][b], f["depths"][b], N) for b in range(bs)]
    width = max(len(e[0]) for e in enc)
    plist = torch.full((bs, width), -1, dtype=torch.long)
    for b, e in enumerate(enc):
        plist[b, : len(e[0])] = torch.tensor(e[0])
    sel = torch.tensor([e[1] for e in enc], dtype=torch.long).view(bs, N - 1)
    return dict(
        kind="build",
        bs=bs,
        N=N,
        mode=mode,
        seq_lens=seq_lens,
        parent_list=plist,
        selected_index=sel,
        topk=enc[0][2],
        depth=L,
    )


@pytest.fixture(scope="module")
def sglang_runs(tmp_path_factory):
    """Prepare every case, run SGLang once, return (case meta, sglang output) pairs by group."""
    cases, metas = [], []
    # (a) EAGLE's builder on our full trees, FULL_MASK and QLEN_ONLY (its Triton builder has
    #     no BITPACKING mode; that layout is covered by the eagle.cuh oracle above).
    shapes = [
        (2, 5, 3, 4, "built"),
        (3, 8, 4, 2, "built"),
        (2, 6, 2, 3, "random"),
        (3, 10, 4, 3, "random"),
        (1, 1, 1, 2, "random"),
        (2, 12, 6, 2, "random"),
    ]
    for seed, (bs, B, L, V, how) in enumerate(shapes):
        if how == "built":
            f, tree, seq_lens = built_case(seed, bs, B, L, V)
            if not bool((f["num_nodes"] == B + 1).all()):
                continue
        else:
            f, tree, seq_lens = random_case(seed, bs, B, L, V, full=True)
        assert bool((f["num_nodes"] == B + 1).all())
        for mode in (TreeMaskMode.FULL_MASK, TreeMaskMode.QLEN_ONLY):
            cases.append(_eagle_case(f, seq_lens, L, int(mode)))
            metas.append(("build", tree, seq_lens, mode, f))
    # (b) EAGLE's greedy verify walk on our ABI (full and padded trees) and
    # (c) NGRAM's reconstruction from our QLEN_ONLY mask
    wshapes = [
        (4, 6, 3, 3, "random"),
        (6, 10, 4, 2, "random"),
        (3, 9, 3, 4, "built"),
        (2, 1, 1, 3, "random"),
        (5, 14, 5, 2, "random"),
        (3, 5, 1, 2, "built"),
    ]
    for seed, (bs, B, L, V, how) in enumerate(wshapes):
        if how == "built":
            f, tree, seq_lens = built_case(50 + seed, bs, B, L, V)
        else:
            f, tree, seq_lens = random_case(50 + seed, bs, B, L, V)
        g = torch.Generator().manual_seed(seed)
        tgt = O.targets_that_often_match(g, f, V)
        abi = sglang_tree_abi(tree, seq_lens, mode=TreeMaskMode.QLEN_ONLY)
        cases.append(
            dict(
                kind="verify",
                candidates=abi.draft_tokens.view(bs, B + 1),
                num_speculative_tokens=L + 1,
                retrieve_index=abi.retrieve_index,
                retrieve_next_token=abi.retrieve_next_token,
                retrieve_next_sibling=abi.retrieve_next_sibling,
                target_predict=tgt,
            )
        )
        metas.append(("verify", tree, tgt, L, f))
        cases.append(
            dict(kind="reconstruct", bs=bs, N=B + 1, tree_mask=abi.tree_mask, seq_lens=seq_lens)
        )
        metas.append(("reconstruct", tree, seq_lens, abi, f))
    outs = O.run_sglang_subprocess(cases, tmp_path_factory.mktemp("sglang"))
    assert len(outs) == len(cases)
    return list(zip(metas, outs))


def test_sglang_builder_reproduces_our_abi(sglang_runs):
    n = 0
    for meta, out in sglang_runs:
        if meta[0] != "build":
            continue
        _, tree, seq_lens, mode, f = meta
        ours = sglang_tree_abi(tree, seq_lens, mode=mode)
        for name in (
            "positions",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "tree_mask",
        ):
            assert torch.equal(getattr(ours, name).reshape(-1), out[name].reshape(-1)), (mode, name)
        # and our oracle agrees with SGLang's builder too (validates the oracle)
        want = O.oracle_abi(f, seq_lens, int(mode))
        assert torch.equal(want["tree_mask"], out["tree_mask"])
        n += 1
    assert n >= 8


def test_sglang_verify_walk_on_our_abi(sglang_runs):
    n = 0
    for meta, out in sglang_runs:
        if meta[0] != "verify":
            continue
        _, tree, tgt, L, f = meta
        bs, N = tgt.shape
        res = walk_greedy(tree, tgt)
        o_acc, o_len, o_bonus = O.oracle_walk_greedy(f, tgt, L)
        ai = out["accept_index"].long()
        local = torch.where(ai >= 0, ai - torch.arange(bs)[:, None] * N, ai)
        alen = out["accept_token_num"].long()
        last_global = ai[torch.arange(bs), alen]
        sg_bonus = out["predicts"].long()[last_global]
        assert torch.equal(local, o_acc), (local, o_acc)
        assert torch.equal(alen, o_len)
        assert torch.equal(sg_bonus, o_bonus)
        assert torch.equal(res.accepted, local)
        assert torch.equal(res.accept_len, alen)
        assert torch.equal(res.bonus, sg_bonus)
        # along the accepted path SGLang writes the target token = the next accepted draft token
        for b in range(bs):
            for j in range(int(alen[b])):
                assert int(out["predicts"][int(ai[b, j])]) == int(
                    tree.tokens[b, int(local[b, j + 1])]
                )
        n += 1
    assert n >= 6


def test_sglang_reconstruct_from_our_mask(sglang_runs):
    n = 0
    for meta, out in sglang_runs:
        if meta[0] != "reconstruct":
            continue
        _, tree, seq_lens, abi, f = meta
        assert torch.equal(out["positions"], abi.positions)
        assert torch.equal(out["retrieve_index"], abi.retrieve_index)
        assert torch.equal(out["retrieve_next_token"], abi.retrieve_next_token)
        assert torch.equal(out["retrieve_next_sibling"], abi.retrieve_next_sibling)
        n += 1
    assert n >= 6


@given(seed=st.integers(0, 10_000), bs=st.integers(1, 3), B=st.integers(1, 12), L=st.integers(1, 6))
@SETTINGS
def test_path_table_matches_the_gdn_path_oracle(seed, bs, B, L):
    """``paths`` (``path_width``) equals sglang_spec.gdn.tree_paths, which hops parents instead of
    reading the ancestor mask, on random trees with padding, at widths below, at and above the
    deepest path (a node deeper than the table gets an all -1 row)."""
    from sglang_spec.gdn import tree_paths

    _, tree, seq_lens = random_case(seed, bs, B, L, 20)
    for width in (1, 2, L + 1, L + 3):
        abi = sglang_tree_abi(tree, seq_lens, path_width=width)
        assert abi.paths.dtype == torch.int32 and abi.paths.shape == (bs, B + 1, width)
        assert torch.equal(abi.paths, tree_paths(tree.parents, width=width).int()), width
    assert sglang_tree_abi(tree, seq_lens).paths is None
    with pytest.raises(ValueError, match="path_width must be >= 1"):
        sglang_tree_abi(tree, seq_lens, path_width=0)
