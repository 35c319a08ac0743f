"""``sglang_spec.gdn.triton_tree_wy`` (the GDN tree verify's kernels) under ``TRITON_INTERPRET=1`` (child
processes, as Triton reads the variable at import; the two run side by side).

1. ``tree_gated_delta_rule_wy`` against the torch core of ``tree_gated_delta_rule``, to 1e-5 max
   abs on the outputs. Random trees at N in {1, 5, 16, 17, 64, 65, 130} (one and several 16-row
   blocks; past 64 the output launch's blocks of 64 rows,
   blocks with padding rows past N, padding slots between real nodes), a 64-node chain (every
   earlier node an ancestor: the densest mask, deepest path) and a 64-node star (only the root is
   an ancestor); bs 2, GQA with Hv = 2 Hk; the 27B head dims K = V = 128 (four 32-column K slices,
   four value tiles), and K, V not powers of two; strided q/k views of one projection; a path table
   wider than the deepest path.
2. Its SGLang mode, ``sglang_verify.gdn_tree_verify_wy``, against the walk's,
   ``gdn_tree_verify``, on the same SGLang tensors: random trees at N in {1, 5, 16, 17, 64, 200}
   (200: the tiny hybrid pair's head dims at the widest, BN = 256, the output launch in blocks of
   64 rows) and a batch of a 64-node chain and a 64-node star; bs 3 with request 1 a padding request
   (``cache_indices`` -1); GQA Hv = 3 Hk with 1 and 2 key heads; q/k/v and a/b strided views of one
   projection each; bf16 activations on an fp32 pool, and one fp32-activation case; one, two and (at
   K = V = 128, once) four value tiles; the ring on (two columns wider than the tree) and off; a
   NaN-filled scratch (every part is written before it is read). The outputs are within one
   rounding step of the activation dtype (bf16: 2^-7 relative, the interpreter rounding towards
   zero; fp32: 1e-5 relative; both plus 1e-5) of the walk's and of SGLang's prologue in torch
   followed by the torch core; zeros for the padding request and padded nodes; the pool untouched.
   The ring equals the walk's bit for bit, holds the raw k, v and torch's g, beta (<= 1e-6), and
   the padding request's row, an unused row and the columns past N keep their sentinel.
"""

from __future__ import annotations

import textwrap

import pytest
from test_gdn_tree_recurrence import check_interpreted, start_interpreted

WY_CHILD = textwrap.dedent(
    """
    import torch
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.tree_recurrence import _tree_gated_delta_rule_torch
    from sglang_spec.gdn.triton_tree_wy import tree_gated_delta_rule_wy
    from test_gdn_tree_recurrence import random_parents, recurrence_inputs

    gen = torch.Generator().manual_seed(11)
    bs, hk, hv = 2, 2, 4
    chain = list(range(-1, 63))
    star = [-1] + [0] * 63
    # (name, parents rows, K, V, extra path-table columns, q/k strided views of one projection)
    cases = [
        (f"random_n{n}", [random_parents(gen, n, 15, 0.15) for _ in range(bs)], 32, 24, 0, False)
        for n in (1, 5, 16, 17, 64, 65, 130)
    ]
    cases += [
        ("chain_64", [chain, chain], 16, 16, 0, False),
        ("star_64", [star, star], 16, 16, 0, False),
        ("random_n40_27b_dims", [random_parents(gen, 40, 8, 0.1) for _ in range(bs)], 128, 128, 0,
         False),
        ("random_n33_odd_dims_strided", [random_parents(gen, 33, 15, 0.2) for _ in range(bs)], 20,
         40, 3, True),
    ]
    worst = 0.0
    for name, rows, dk, dv, extra, strided in cases:
        parents = torch.tensor(rows)
        n = parents.shape[1]
        paths = tree_paths(parents, width=tree_paths(parents).shape[2] + extra)
        q, k, v, g, beta, s0 = recurrence_inputs(gen, bs, n, hk, hv, dk, dv)
        if strided:
            mixed = torch.randn(bs, n, 3 * hk * dk, generator=gen) * dk**-0.5
            q = mixed[..., : hk * dk].view(bs, n, hk, dk)
            k = mixed[..., 2 * hk * dk :].view(bs, n, hk, dk)
        want = _tree_gated_delta_rule_torch(q, k, v, g, beta, paths, s0)
        got = tree_gated_delta_rule_wy(q, k, v, g, beta, paths, s0)
        assert got.shape == want.shape and got.dtype == torch.float32, name
        err = float((got - want).abs().max())
        assert err <= 1e-5, (name, err)
        assert float(want.abs().max()) > 0.1, name  # not a vacuous all-zero comparison
        padding = (paths[:, :, 0] < 0)
        assert bool((got[padding] == 0).all()), (name, "padding rows must be zero")
        worst = max(worst, err)
        print(name, err)
    print("WY_OK", worst)
    """
)


SGLANG_CHILD = textwrap.dedent(
    """
    import time
    import torch
    import torch.nn.functional as F
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.sglang_verify import gdn_tree_verify, gdn_tree_verify_wy
    from sglang_spec.gdn.tree_recurrence import _tree_gated_delta_rule_torch
    from sglang_spec.gdn.triton_tree_recurrence import tree_prep_scratch, tree_scratch
    from sglang_spec.gdn.triton_tree_wy import tree_wy_scratch
    from test_gdn_tree_recurrence import random_parents

    SENTINEL = 7.0
    gen = torch.Generator().manual_seed(23)
    chain = list(range(-1, 63))
    star = [-1] + [0] * 63

    def trees(n, bs):
        return [random_parents(gen, n, 15, 0.15) for _ in range(bs)]

    # (name, parents rows, Hk, Hv, K, V, WY block_v, activation dtype, ring); request 1 of each
    # batch is a padding request (cache_indices -1)
    bf16, fp32 = torch.bfloat16, torch.float32
    cases = [
        ("random_n1", trees(1, 3), 2, 6, 16, 16, None, bf16, True),
        ("random_n5", trees(5, 3), 2, 6, 16, 32, 16, bf16, True),
        ("random_n16", trees(16, 3), 1, 3, 16, 16, None, bf16, False),
        ("random_n17", trees(17, 3), 2, 6, 16, 32, 16, bf16, True),
        ("random_n64", trees(64, 3), 1, 3, 16, 16, None, bf16, True),
        ("chain_and_star_64", [chain, star, star], 1, 3, 16, 16, None, bf16, True),
        ("random_n17_fp32", trees(17, 3), 1, 3, 16, 32, 16, fp32, True),
        ("random_n17_27b_dims", trees(17, 3), 1, 3, 128, 128, None, bf16, False),
        # the tiny hybrid pair's GDN dims at a 200-node tree (BN = 256, the widest: MAX_WY_NODES;
        # the output launch in blocks of 64 rows)
        ("random_n200_tiny_dims", trees(200, 3), 1, 2, 64, 64, None, bf16, True),
    ]

    def l2(x):  # SGLang's division-form l2-norm, eps 1e-6
        return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))

    def rel(got, want, rtol):  # max |got - want| / (1e-5 + rtol |want|): <= 1 passes
        got, want = got.float(), want.float()
        return float(((got - want).abs() / (1e-5 + rtol * want.abs())).max())

    def fresh_ring(rows, hk, hv, n, dk, dv, dt):  # two columns wider than the tree
        return (
            torch.full((rows, hk, n + 2, dk), SENTINEL, dtype=dt),
            torch.full((rows, hv, n + 2, dv), SENTINEL, dtype=dt),
            torch.full((rows, hv, n + 2), SENTINEL),
            torch.full((rows, hv, n + 2), SENTINEL),
        )

    cache_indices = torch.tensor([4, -1, 1], dtype=torch.int32)
    ring_rows = torch.tensor([2, 0, 3], dtype=torch.int32)
    for name, rows, hk, hv, dk, dv, block_v, dt, with_ring in cases:
        start = time.time()
        parents = torch.tensor(rows)
        bs, n = parents.shape
        paths = tree_paths(parents, width=int((tree_paths(parents) >= 0).sum(-1).max()) + 1).int()
        t = bs * n
        # the conv output [T, q | k | v] and the a | b projection: strided views, as SGLang's
        mixed = torch.randn(t, 2 * hk * dk + hv * dv, generator=gen).to(dt)
        q, k, v = torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1)
        q, k, v = q.view(1, t, hk, dk), k.view(1, t, hk, dk), v.view(1, t, hv, dv)
        ab = torch.randn(t, 2 * hv, generator=gen).to(dt)
        a, b = ab[:, :hv], ab[:, hv:]
        A_log = torch.randn(hv, generator=gen) * 0.5
        dt_bias = torch.randn(hv, generator=gen)
        pool = torch.randn(6, hv, dv, dk, generator=gen)
        walk_ring, wy_ring = (fresh_ring(4, hk, hv, n, dk, dv, dt) for _ in range(2))
        ring = lambda r: dict(ring=r, ring_rows=ring_rows) if with_ring else {}
        args = (q, k, v, a, b, A_log, dt_bias, pool, cache_indices, paths)
        walk = gdn_tree_verify(
            *args,
            tree_scratch(t, hv, dv, "cpu"),
            tree_prep_scratch(t, hk, paths.shape[2], "cpu"),
            block_v=dv,  # one value tile: the interpreter's time is per program
            **ring(walk_ring),
        )
        scratch = tree_wy_scratch(bs, n, hv, "cpu").fill_(float("nan"))  # written before read
        pool_before = pool.clone()
        got = gdn_tree_verify_wy(*args, scratch, block_v=block_v, **ring(wy_ring))
        assert got.shape == walk.shape == (1, t, hv, dv) and got.dtype == dt, name
        assert torch.equal(pool, pool_before), name
        got, walk = got.view(bs, n, hv, dv), walk.view(bs, n, hv, dv)

        # within one rounding step of the activation dtype of the walk's outputs and of the torch
        # reference's (the interpreter rounds to bf16 towards zero, the GPU to nearest)
        step = 2.0**-7 if dt == bf16 else 1e-5
        vs_walk = rel(got, walk, step)
        assert vs_walk <= 1, (name, "vs walk", vs_walk)
        # SGLang's prologue in torch, then the torch core
        g = -A_log.exp() * F.softplus(a.float() + dt_bias)
        beta = torch.sigmoid(b.float())
        s0 = pool[cache_indices.long().clamp(min=0)].transpose(-1, -2)
        want = _tree_gated_delta_rule_torch(
            l2(q.float().view(bs, n, hk, dk)) * dk**-0.5,
            l2(k.float().view(bs, n, hk, dk)),
            v.float().view(bs, n, hv, dv),
            g.view(bs, n, hv),
            beta.view(bs, n, hv),
            paths,
            s0,
        )
        real = cache_indices >= 0
        vs_torch = rel(got[real], want[real], step)
        assert vs_torch <= 1, (name, "vs torch", vs_torch)
        assert float(want[real].abs().max()) > 0.1, name  # not vacuous
        assert torch.all(got[1] == 0), (name, "the padding request's outputs must be zeros")
        padded = paths[:, :, 0] < 0
        assert torch.all(got[padded] == 0), (name, "padded node rows must be zeros")

        if with_ring:
            for part, x, y in zip(("rawk", "rawv", "g", "beta"), wy_ring, walk_ring):
                assert torch.equal(x, y), (name, "ring", part, float((x.float() - y.float()).abs().max()))
            rawk, rawv, ring_g, ring_beta = wy_ring
            for r in (0, 2):
                row = int(ring_rows[r])
                nodes = slice(r * n, (r + 1) * n)
                assert torch.equal(rawk[row][:, :n], k[0, nodes].transpose(0, 1)), name
                assert torch.equal(rawv[row][:, :n], v[0, nodes].transpose(0, 1)), name
                assert (ring_g[row][:, :n] - g[nodes].T).abs().max() <= 1e-6, (name, "g")
                assert (ring_beta[row][:, :n] - beta[nodes].T).abs().max() <= 1e-6, (name, "beta")
            for part, x in zip(("rawk", "rawv", "g", "beta"), wy_ring):
                untouched = [int(ring_rows[1]), 1]  # the padding request's row, an unused row
                assert torch.all(x[untouched] == SENTINEL), (name, part, "rows written")
                assert torch.all(x[:, :, n:] == SENTINEL), (name, part, "columns past N written")
        print(name, f"vs walk {vs_walk:.3f} vs torch {vs_torch:.3f} ({time.time() - start:.1f} s)")
    print("WY_SGLANG_OK")
    """
)


@pytest.fixture(scope="module")
def children():
    """Both tests' child processes, started together so that two cores run them side by side (the
    interpreter runs on one); a test waits for its own."""
    procs = {"WY_OK": start_interpreted(WY_CHILD), "WY_SGLANG_OK": start_interpreted(SGLANG_CHILD)}
    yield procs
    for proc in procs.values():  # one whose test did not run to its wait
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_wy_kernels_match_torch_core_under_interpreter(children):
    check_interpreted(children["WY_OK"], "WY_OK")


def test_wy_sglang_mode_equals_the_walk_under_interpreter(children):
    check_interpreted(children["WY_SGLANG_OK"], "WY_SGLANG_OK")


def test_trees_past_the_widest_are_refused_before_any_launch():
    """More than ``MAX_WY_NODES`` nodes: one line, before anything launches (the output launch
    would ask for more shared memory than an H200 block has: test_triton_compile_sm90)."""
    import torch

    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.triton_tree_wy import MAX_WY_NODES, launch_wy_kernels, tree_wy_scratch

    n = MAX_WY_NODES + 1
    q = k = torch.zeros(1, n, 1, 16)
    v = torch.zeros(1, n, 1, 16)
    g = beta = torch.zeros(1, n, 1)
    paths = tree_paths(torch.tensor([[-1] + [0] * (n - 1)]))
    with pytest.raises(ValueError, match=f"at most {MAX_WY_NODES} nodes per tree; got N = {n}"):
        launch_wy_kernels(
            q,
            k,
            v,
            g,
            beta,
            paths,
            torch.zeros(1, 1, 16, 16),
            tree_wy_scratch(1, n, 1, "cpu"),
            torch.zeros(n, 1, 16),
        )


def test_one_block_trees_take_the_wider_value_tile():
    """Trees of one 16-row block (budgets up to 15) get 64 value columns a program, wider trees
    32 (the H100's and H200's fastest tiles, module docstring); a head narrower than the tile
    gets its own width rounded up, an override wins."""
    from sglang_spec.gdn.triton_tree_wy import choose_wy_block_v, wy_block_rows

    assert [choose_wy_block_v(128, wy_block_rows(n)) for n in (2, 8, 16, 17, 64)] == [
        64,
        64,
        64,
        32,
        32,
    ]
    assert choose_wy_block_v(32, wy_block_rows(8)) == 32
    assert choose_wy_block_v(8, wy_block_rows(8)) == 16
    assert choose_wy_block_v(128, wy_block_rows(8), override=16) == 16
