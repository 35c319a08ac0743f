"""``sglang_spec.gdn.triton_tree_wy`` (the blocked-WY candidate) against the torch core of
``tree_gated_delta_rule`` under ``TRITON_INTERPRET=1`` (a child process: Triton reads the variable at
import), to 1e-5 max abs on the outputs.

Random trees at N in {1, 5, 16, 17, 64} (one and several 16-row blocks, blocks with padding rows
past N, padding slots between real nodes), a 64-node chain (every earlier node an ancestor: the
densest mask, deepest path) and a 64-node star (only the root is an ancestor); bs 2, GQA with
Hv = 2 Hk; the 27B head dims K = V = 128 (four 32-column K slices, two value tiles), and K, V not
powers of two; strided q/k views of one projection; a path table wider than the deepest path.
"""

from __future__ import annotations

import textwrap

from test_gdn_tree_recurrence import run_interpreted

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
        for n in (1, 5, 16, 17, 64)
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


def test_wy_kernels_match_torch_core_under_interpreter():
    run_interpreted(WY_CHILD, "WY_OK")
