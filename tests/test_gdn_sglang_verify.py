"""Patch 0002 (GDN tree ReplaySSM, verify side) and its kernels (``gdn_tree_verify_wy``), on the CPU.

``gdn_sglang_verify_cases.py`` runs in a child process under ``TRITON_INTERPRET=1`` with a patched
copy of each pin that carries the patch (the installed SGLang 0.5.23, the 0.5.22 wheel;
``patched_sglang.py``) first on ``sys.path`` and returns raw results on one random case: 4 requests of a 10-slot tree (padding slots, depth <= 6), request 1 a
padding request (``cache_indices = -1``), GQA 1:3, q/k/v and a/b strided views of one projection
each, a value dim (8) narrower than the value tile, a NaN-filled scratch, a path table two columns
wider than the deepest path and a ring two columns wider than the tree. Checked here:

* the WY kernels' SGLang mode = SGLang's gating + division-form l2-norm + ``K^-0.5`` scale in torch,
  then ``tree_gated_delta_rule`` (the torch core) from the pool rows ``cache_indices[b]``
  (<= 1e-5); zero outputs for padding slots and the padding request; the pool untouched;
* its ring = the ring SGLang's own recurrent kernel stores for the same tokens, bit for bit (raw
  pre-norm k per key head, raw v, g, beta), at row ``ring_rows[b]``, columns 0..N-1 only, and the
  padding request's row untouched;
* SGLang's released fold kernel replaying a path from that ring = ``replay_path_state`` on the
  path (<= 1e-5): the ring holds what the fold expects per step;
* the patched ``_replayssm_fold_target_verify`` returns the WY kernels' outputs and ring, bit for
  bit; a verify input without ``retrieve_tree_paths``, the walk's key-product rows and the WY
  scratch of another shape are refused in one line;
* the patched ``update_verify_buffers_to_fill_after_draft`` copies the verify input's paths into
  the captured graph buffer (same address), and ``TreeVerifyTables`` keeps its scratch's and its
  key-product rows' addresses once graphs exist (the rows sized at the first capture).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from patched_sglang import GDN_TREE_PINS, gdn_fold, patched_copy, run_cases

from sglang_spec.gdn import replay_path_state, tree_gated_delta_rule
from sglang_spec.gdn.sglang_verify import (
    TreeVerifyTables,
    gdn_tree_verify,
    gdn_tree_verify_wy,
    replayssm_tree_verify,
)
from sglang_spec.gdn.triton_tree_recurrence import tree_prep_scratch, tree_scratch
from sglang_spec.gdn.triton_tree_wy import launch_wy_kernels, tree_wy_scratch, wy_scratch_width

TOL = 1e-5


@pytest.fixture(scope="module", params=GDN_TREE_PINS)
def results(request, tmp_path_factory):
    root = patched_copy(tmp_path_factory.mktemp(f"patched_sglang_{request.param}"), request.param)
    return run_cases(
        root, "gdn_sglang_verify_cases.py", str(root / "pristine" / gdn_fold(request.param))
    )


def reference_inputs(case):
    """SGLang's kernel prologue in torch: gates, division-form l2-norm, scale; states [Hv, K, V]."""
    bs, n = case["parents"].shape
    hk, dk = 1, 16
    hv = case["A_log"].shape[0]
    mixed, ab = case["mixed"], case["ab"]
    q, k, v = torch.split(mixed, [hk * dk, hk * dk, mixed.shape[1] - 2 * hk * dk], dim=-1)
    q, k = (x.reshape(bs, n, hk, dk) for x in (q, k))
    v = v.reshape(bs, n, hv, -1)
    a, b = (x.reshape(bs, n, hv) for x in torch.split(ab, [hv, hv], dim=-1))

    def l2(x):
        return x * (1.0 / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6))

    g = -case["A_log"].exp() * F.softplus(a + case["dt_bias"])
    beta = torch.sigmoid(b)
    s0 = case["pool"][case["cache_indices"].long().clamp(min=0)].transpose(-1, -2)
    return l2(q) * dk**-0.5, l2(k), v, g, beta, s0, (q, k, v)


def real_requests(case):
    return [b for b in range(case["parents"].shape[0]) if int(case["cache_indices"][b]) >= 0]


def test_kernel_equals_sglang_prologue_plus_tree_core(results):
    case, ours = results["case"], results["ours"]
    q, k, v, g, beta, s0, _ = reference_inputs(case)
    bs, n = case["parents"].shape
    want = tree_gated_delta_rule(q, k, v, g, beta, case["parents"], s0)
    o = ours["o"].view(bs, n, *ours["o"].shape[2:])
    real_slot = (case["parents"] >= 0) | (torch.arange(n) == 0)
    checked = 0
    for b in real_requests(case):
        err = (o[b][real_slot[b]] - want[b][real_slot[b]]).abs().max()
        assert err <= TOL, (b, float(err))
        assert float(want[b].abs().max()) > 0.1  # not vacuous
        assert torch.all(o[b][~real_slot[b]] == 0)  # padding slots
        checked += 1
    assert checked == 3 and int((~real_slot[real_requests(case)]).sum()) > 0
    assert torch.all(o[1] == 0)  # the padding request
    assert torch.equal(ours["pool_after"], case["pool"])  # the verify never writes the checkpoint


def test_ring_is_what_sglangs_verify_kernel_stores(results):
    case, ring, sg = results["case"], results["ours"]["ring"], results["sglang_ring"]
    n = case["parents"].shape[1]
    _, _, _, g, beta, _, (_, k_raw, v_raw) = reference_inputs(case)
    for b in real_requests(case):
        row, slot = int(case["ring_rows"][b]), int(case["cache_indices"][b])
        for name in ("rawk", "rawv", "g", "beta"):
            assert torch.equal(
                ring[name][row][..., :n, :] if name.startswith("raw") else ring[name][row][:, :n],
                sg[name][slot][..., :n, :] if name.startswith("raw") else sg[name][slot][:, :n],
            ), (b, name)
        # and what that is: raw k, raw v, the torch gates (to float rounding)
        assert torch.equal(ring["rawk"][row][:, :n], k_raw[b].transpose(0, 1))
        assert torch.equal(ring["rawv"][row][:, :n], v_raw[b].transpose(0, 1))
        assert (ring["g"][row][:, :n] - g[b].T).abs().max() <= 1e-6
        assert (ring["beta"][row][:, :n] - beta[b].T).abs().max() <= 1e-6
        # columns past the tree untouched
        assert torch.all(ring["rawv"][row][:, n:] == 7.0) and torch.all(
            ring["g"][row][:, n:] == 7.0
        )
    # the padding request's row (ring_rows[1]) and the unused row 3: untouched
    for row in (int(case["ring_rows"][1]), 3):
        for name in ("rawk", "rawv", "g", "beta"):
            assert torch.all(ring[name][row] == 7.0), (row, name)


def test_sglang_fold_of_the_ring_replays_the_path(results):
    case = results["case"]
    q, k, v, g, beta, s0, _ = reference_inputs(case)
    folds = results["folds"]
    assert len(folds) == 6 and max(len(f["path"]) for f in folds) >= 4
    for f in folds:
        b, path = f["b"], f["path"]
        want = replay_path_state(
            k[b : b + 1],
            v[b : b + 1],
            g[b : b + 1],
            beta[b : b + 1],
            torch.tensor([path]),
            s0[b : b + 1],
        )[0]
        got = f["state"].transpose(-1, -2)  # SGLang's [Hv, V, K]
        assert (got - want).abs().max() <= TOL, (b, path)
        assert (want - s0[b]).abs().max() > 0.05  # the path moved the state


def test_patched_backend_runs_the_tree_kernel(results):
    ours, patched = results["ours"], results["patched"]
    assert torch.equal(patched["o"], ours["o"])
    for name in ("rawk", "rawv", "g", "beta"):
        assert torch.equal(patched["ring"][name], ours["ring"][name]), name


def test_graph_buffer_takes_the_verify_inputs_paths(results):
    case, got = results["case"], results["graph_paths"]
    bs = case["paths"].shape[0]
    assert got["same_buffer"]
    assert torch.equal(got["buffer"][:bs], case["paths"])
    assert torch.all(got["buffer"][bs:] == -1)


def test_tree_verify_tables():
    tables = TreeVerifyTables(3, "cpu")
    small = tables.scratch(5, 17)  # 17 nodes: 32 rows of the solve
    assert small.shape == (5, 3, wy_scratch_width(17)) == (5, 3, 32 * 68)
    assert tables.scratch(4, 17) is small
    grown = tables.scratch(6, 17)  # eager: grown, then shared
    assert grown.shape[0] == 6 and tables.scratch(5, 17) is grown
    other = tables.scratch(2, 5)  # another width: its own scratch, the first one kept
    assert other.shape == (2, 3, wy_scratch_width(5)) and tables.scratch(6, 17) is grown
    tables.init_graphs(40)  # graphs of up to 40 tokens: sized at the first capture of a width
    spec = SimpleNamespace(draft_token_num=5, spec_steps=3, retrieve_tree_paths=None)
    buf = tables.graph_paths(2, spec)
    assert buf.shape == (2, 5, 4) and torch.all(buf == -1)
    shared = tables.scratch(2, 5)
    assert shared.shape == (8, 3, wy_scratch_width(5)) and tables.scratch(8, 5) is shared
    eager = tables.scratch(9, 5)  # larger than every graph: its own, the shared one stays
    assert eager.shape[0] == 9 and tables.scratch(9, 5) is not eager
    assert tables.scratch(3, 5) is shared
    spec.draft_token_num = 10  # a second width (adaptive budgets): its own graph scratch
    tables.graph_paths(1, spec)
    assert tables.scratch(1, 10).shape == (4, 3, wy_scratch_width(10))
    assert tables.scratch(4, 10) is tables.scratch(1, 10) and tables.scratch(8, 5) is shared
    spec.draft_token_num = 5
    spec.retrieve_tree_paths = torch.zeros(1, 5, 3, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"retrieve_tree_paths must be \[<= 2, 5, 4\]"):
        tables.graph_paths(2, spec)
    pool = SimpleNamespace(
        replayssm_spec_fold=True,
        replayssm_is_kda=False,
        mamba_cache=SimpleNamespace(
            temporal=torch.empty(2, 4, 3, 8, 16), replayssm_rawk=torch.empty(2, 4, 1, 5, 16)
        ),
    )
    made = TreeVerifyTables.for_backend(4, pool, "cpu")
    assert made.num_v_heads == 3
    assert TreeVerifyTables.for_backend(1, pool, "cpu") is None  # a chain
    assert (
        TreeVerifyTables.for_backend(
            4, SimpleNamespace(**{**vars(pool), "replayssm_is_kda": True}), "cpu"
        )
        is None
    )
    assert (
        TreeVerifyTables.for_backend(
            4, SimpleNamespace(**{**vars(pool), "replayssm_spec_fold": False}), "cpu"
        )
        is None
    )


def test_tree_verify_without_paths_is_refused():
    with pytest.raises(ValueError, match="needs spec_info.retrieve_tree_paths"):
        replayssm_tree_verify(
            None,
            layer=None,
            query=torch.empty(1, 4, 1, 2),
            key=None,
            value=None,
            a=None,
            b=None,
            layer_cache=None,
            ssm_states=None,
            cache_indices=None,
            query_start_loc=torch.tensor([0, 4]),
            retrieve_tree_paths=None,
            ring_rows=None,
        )


def test_verify_tree_paths_gives_the_batchs_rows_or_refuses_none():
    """The patched verify's tree conv takes its path table from here, before the tree kernel: a
    verify input without one (EAGLE's own tree) gets the one-line error, not a TypeError."""
    from sglang_spec.gdn.sglang_verify import verify_tree_paths

    graph_buffer = torch.arange(4 * 3 * 2, dtype=torch.int32).view(4, 3, 2)
    assert torch.equal(verify_tree_paths(graph_buffer, 2), graph_buffer[:2])
    with pytest.raises(ValueError, match="needs spec_info.retrieve_tree_paths"):
        verify_tree_paths(None, 2)


def zero_verify_args(bs, n, w, hk, hv, dk, dv) -> tuple:
    """Zero SGLang tensors of a verify of ``bs`` trees of ``n`` nodes (path width ``w``): the
    verify functions' arguments up to the path table."""
    qk = torch.zeros(1, bs * n, hk, dk)
    return (
        qk,
        qk,
        torch.zeros(1, bs * n, hv, dv),
        torch.zeros(bs * n, hv),
        torch.zeros(bs * n, hv),
        torch.zeros(hv),
        torch.zeros(hv),
        torch.zeros(bs, hv, dv, dk),
        torch.zeros(bs, dtype=torch.int32),
        torch.zeros(bs, n, w, dtype=torch.int32),
    )


def test_tree_verify_refuses_prep_rows_of_another_shape():
    """The key-product rows must match the path table's width and the key heads; checked before
    any launch, in one line naming both shapes."""
    bs, n, w, hk, hv, dk, dv = 2, 3, 4, 1, 3, 8, 4
    args = (*zero_verify_args(bs, n, w, hk, hv, dk, dv), tree_scratch(bs * n, hv, dv, "cpu"))
    for prep in (
        tree_prep_scratch(bs * n, hk, w + 1, "cpu"),  # another width
        tree_prep_scratch(bs * n, hk + 1, w, "cpu"),  # another key head count
        tree_prep_scratch(bs * n - 1, hk, w, "cpu"),  # too few rows
    ):
        with pytest.raises(ValueError, match=r"prep must be contiguous float32 \[>= 6, 1, 11\]"):
            gdn_tree_verify(*args, prep)


def test_wy_verify_refuses_a_scratch_of_another_shape():
    """The WY scratch must fit the tree's N and the value heads; checked before any launch, in one
    line naming both shapes. The ring stores need the SGLang mode."""
    bs, n, w, hk, hv, dk, dv = 2, 17, 4, 1, 3, 16, 16
    args = zero_verify_args(bs, n, w, hk, hv, dk, dv)
    for scratch in (
        tree_wy_scratch(bs, 16, hv, "cpu"),  # one 16-row block too few
        tree_wy_scratch(bs, n, hv + 1, "cpu"),
        tree_wy_scratch(bs - 1, n, hv, "cpu"),
        tree_wy_scratch(bs, n, hv, "cpu").double(),
    ):
        with pytest.raises(
            ValueError, match=r"scratch must be contiguous float32 \[>= 2, 3, 2176\]"
        ):
            gdn_tree_verify_wy(*args, scratch)
    q = args[0].view(bs, n, hk, dk)
    with pytest.raises(ValueError, match="the ring stores are the SGLang mode's"):
        launch_wy_kernels(
            q,
            q,
            *args[2:5],
            args[9],
            args[7],
            tree_wy_scratch(bs, n, hv, "cpu"),
            args[2],
            ring=(q,) * 5,
        )
