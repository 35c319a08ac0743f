"""``sglang_spec.gdn.tree_recurrence`` (tree gated delta rule without per-node states) against two oracles.

1. An independent per-path recurrence written from the contract (issue 14): for every real node,
   walk its root path in float64 applying ``S = exp(g) S; u = beta (v - S^T k); S = S + k u^T`` and
   read ``o = S^T q`` -- on random trees up to depth 15 and 257 slots, with padding slots anywhere,
   in three head layouts (no GQA, 1 key head : 3 value heads, 2 : 6); fp32 error <= 1e-4.
2. ``sglang_spec.gdn.gdn_tree_forward`` (per-node states) on a tiny transformers Qwen3.5 GDN layer: its
   recurrence inputs are recorded at ``tree_gdn._delta_rule_step`` and fed to ``tree_gated_delta_rule``
   (key heads de-repeated, so the GQA mapping is checked against transformers' ``repeat_interleave``);
   the outputs must match its core outputs, and ``replay_path_state`` over every node's path its
   per-node states.

The Triton kernels run under ``TRITON_INTERPRET=1`` in a child process (Triton reads the variable at
import) against the torch core to 1e-5: a padded GQA tree, a 21-deep chain (path rows longer than the
kernel's 16-slot chunk), value tiles narrower than and not dividing ``V``, ``K`` not a power of two,
strided k/v views of one projection (q contiguous), a wider-than-needed path table; and the path replay.
The same cases, plus a 65-node tree and a root-only tree, check that padding outputs zero.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from sglang_spec.gdn import replay_path_state, tree_gated_delta_rule, tree_gdn, tree_paths

TOL = 1e-4


def random_parents(
    gen: torch.Generator, n_slots: int, max_depth: int, pad: float, extend: float = 0.7
) -> list[int]:
    """A valid parents row of ``n_slots`` slots: each slot is padding with probability ``pad``, else a
    child of an earlier real node of depth < ``max_depth``: with probability ``extend`` the newest
    one (deep paths), else a random one (siblings)."""
    parents, depth = [-1], {0: 0}
    for i in range(1, n_slots):
        if torch.rand(1, generator=gen).item() < pad:
            parents.append(-1)
            continue
        open_ = [j for j in depth if depth[j] < max_depth]
        newest = max(open_)
        p = (
            newest
            if torch.rand(1, generator=gen).item() < extend
            else open_[int(torch.randint(len(open_), (1,), generator=gen))]
        )
        parents.append(p)
        depth[i] = depth[p] + 1
    return parents


def root_path(parents_row: list[int], i: int) -> list[int]:
    path = [i]
    while path[-1] != 0:
        path.append(parents_row[path[-1]])
    return path[::-1]


def recurrence_inputs(gen, bs, n, hk, hv, dk, dv):
    """Inputs as callers hand them over: l2-normalised k, l2-normalised q scaled by dk^-0.5, decays
    exp(g) in ~[0.3, 1], beta in (0, 1), an O(1) initial state."""
    q = F.normalize(torch.randn(bs, n, hk, dk, generator=gen), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(bs, n, hk, dk, generator=gen), dim=-1)
    v = torch.randn(bs, n, hv, dv, generator=gen)
    g = -1.2 * torch.rand(bs, n, hv, generator=gen)
    beta = torch.rand(bs, n, hv, generator=gen)
    s0 = torch.randn(bs, hv, dk, dv, generator=gen)
    return q, k, v, g, beta, s0


def oracle(q, k, v, g, beta, s0, path: list[int], b: int):
    """float64 state after ``path`` and the output of its last node, straight from the contract."""
    hv, grp = v.shape[2], v.shape[2] // k.shape[2]
    state = s0[b].double().clone()
    for t in path:
        for h in range(hv):
            kt = k[b, t, h // grp].double()
            state[h] = torch.exp(g[b, t, h].double()) * state[h]
            u = beta[b, t, h].double() * (v[b, t, h].double() - state[h].T @ kt)
            state[h] = state[h] + torch.outer(kt, u)
    out = torch.stack([state[h].T @ q[b, path[-1], h // grp].double() for h in range(hv)])
    return state, out


def test_tree_paths_table_width_and_validation():
    parents = torch.tensor([[-1, 0, 1, 0, -1, 3, 5], [-1, 0, 0, 2, 3, -1, -1]])
    want = [
        [[0, -1, -1, -1], [0, 1, -1, -1], [0, 1, 2, -1], [0, 3, -1, -1]]
        + [[-1] * 4, [0, 3, 5, -1], [0, 3, 5, 6]],
        [[0, -1, -1, -1], [0, 1, -1, -1], [0, 2, -1, -1], [0, 2, 3, -1]]
        + [[0, 2, 3, 4], [-1] * 4, [-1] * 4],
    ]
    assert tree_paths(parents).tolist() == want
    # a given width reads nothing back: wider pads with -1, narrower turns too-deep nodes into padding
    assert tree_paths(parents, width=6).tolist() == [[r + [-1, -1] for r in row] for row in want]
    narrow = tree_paths(parents, width=3).tolist()
    assert narrow[0][6] == [-1] * 3 and narrow[1][4] == [-1] * 3
    assert narrow[0][5] == [0, 3, 5] and narrow[1][3] == [0, 2, 3]
    for bad in (
        [[-1, 2, 0]],
        [[-1, -1, 1]],
        [[0, 0, 1]],
    ):  # parent after child; child of padding; root
        with pytest.raises(ValueError):
            tree_paths(torch.tensor(bad))
    with pytest.raises(ValueError, match="^width must be >= 1; got 0$"):
        tree_paths(parents, width=0)
    # width 1, the smallest: the roots' paths; every other node is too deep
    assert tree_paths(parents, width=1)[:, :, 0].tolist() == [[0] + [-1] * 6] * 2
    with pytest.raises(ValueError, match="int32/int64"):
        tree_paths(parents.float())


@pytest.mark.parametrize(
    "hk,hv,n_slots,max_depth,pad,extend,seed",
    [
        (2, 2, 40, 15, 0.2, 0.9, 0),  # no GQA, padding between real nodes
        (1, 3, 257, 15, 0.1, 0.7, 1),  # 257 slots, depth 15
        (2, 6, 65, 6, 0.0, 0.3, 2),  # bushy, no padding
        (2, 6, 20, 15, 0.0, 1.0, 3),  # a chain to depth 15, then 4 siblings of its last node
    ],
)
def test_matches_per_path_recurrence(hk, hv, n_slots, max_depth, pad, extend, seed):
    gen = torch.Generator().manual_seed(seed)
    bs, dk, dv = 2, 8, 6
    rows = [random_parents(gen, n_slots, max_depth, pad, extend) for _ in range(bs)]
    parents = torch.tensor(rows)
    q, k, v, g, beta, s0 = recurrence_inputs(gen, bs, n_slots, hk, hv, dk, dv)
    o = tree_gated_delta_rule(q, k, v, g, beta, parents, s0)
    assert o.shape == (bs, n_slots, hv, dv) and o.dtype == torch.float32
    depth_seen = 0
    for b, row in enumerate(rows):
        real = [i for i in range(n_slots) if i == 0 or row[i] >= 0]
        padding = [i for i in range(n_slots) if i not in real]
        assert torch.equal(o[b, padding], torch.zeros_like(o[b, padding]))
        for i in real:
            path = root_path(row, i)
            depth_seen = max(depth_seen, len(path) - 1)
            state, want = oracle(q, k, v, g, beta, s0, path, b)
            torch.testing.assert_close(o[b, i].double(), want, atol=TOL, rtol=0)
        # replay: the deepest node, a random one and the root-only path, in one batched call
        for i in (max(real, key=lambda j: len(root_path(row, j))), real[len(real) // 2], 0):
            path = root_path(row, i)
            table = torch.full((bs, max_depth + 3), -1)
            table[b, : len(path)] = torch.tensor(path)
            other = 1 - b  # the other row replays an empty path: its initial state, bit for bit
            got = replay_path_state(k, v, g, beta, table, s0)
            torch.testing.assert_close(
                got[b].double(), oracle(q, k, v, g, beta, s0, path, b)[0], atol=TOL, rtol=0
            )
            assert torch.equal(got[other], s0[other])
    assert depth_seen == max_depth
    assert o.abs().max() > 0.2  # outputs are O(0.1..1), far above the tolerance


def test_matches_gdn_tree_forward(monkeypatch):
    """Same recurrence inputs as ``gdn_tree_forward`` on a tiny Qwen3.5 GDN layer (2 key heads, 6 value
    heads): outputs equal its core outputs, and each node's path replay equals its per-node state."""
    from transformers import Qwen3_5TextConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

    hk, hv, dk, dv, hidden_size, n = 2, 6, 16, 8, 48, 65
    torch.manual_seed(0)
    cfg = Qwen3_5TextConfig(
        hidden_size=hidden_size,
        num_hidden_layers=1,
        layer_types=["linear_attention"],
        linear_num_key_heads=hk,
        linear_num_value_heads=hv,
        linear_key_head_dim=dk,
        linear_value_head_dim=dv,
        linear_conv_kernel_dim=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        intermediate_size=64,
        vocab_size=32,
    )
    layer = Qwen3_5GatedDeltaNet(cfg, 0).float().eval()
    with torch.no_grad():
        layer.A_log.copy_(torch.empty(hv).uniform_(0.05, 0.6).log())  # decays ~0.5..0.97

    gen = torch.Generator().manual_seed(7)
    rows = [random_parents(gen, n, 15, 0.15, 0.85) for _ in range(2)]
    parents = torch.tensor(rows)
    hidden = torch.randn(2, n, hidden_size, generator=gen)
    conv_state = torch.randn(2, layer.conv_dim, 4, generator=gen)
    ssm_state = 0.5 * torch.randn(2, hv, dk, dv, generator=gen)

    calls = []
    step = tree_gdn._delta_rule_step

    def recording_step(state, *inputs):
        new_state, out = step(state, *inputs)
        calls.append((inputs, out))
        return new_state, out

    monkeypatch.setattr(tree_gdn, "_delta_rule_step", recording_step)
    _, states = tree_gdn.gdn_tree_forward(layer, hidden, parents, conv_state, ssm_state)
    # gdn_tree_forward steps one depth at a time over (depth == d).nonzero(): put the inputs back
    depth = tree_gdn.tree_depth(parents)
    q = torch.zeros(2, n, hv, dk)
    k = torch.zeros(2, n, hv, dk)
    v = torch.zeros(2, n, hv, dv)
    g = torch.zeros(2, n, hv)
    beta = torch.zeros(2, n, hv)
    core = torch.zeros(2, n, hv, dv)
    assert len(calls) == int(depth.max()) + 1 == 16
    for d, ((qd, kd, vd, gd, betad), out) in enumerate(calls):
        b, i = (depth == d).nonzero(as_tuple=True)
        q[b, i], k[b, i], v[b, i], g[b, i], beta[b, i], core[b, i] = qd, kd, vd, gd, betad, out
    grp = hv // hk
    q_k, k_k = q[:, :, ::grp], k[:, :, ::grp]  # transformers repeats each key head grp times
    assert torch.equal(q_k.repeat_interleave(grp, 2), q) and torch.equal(
        k_k.repeat_interleave(grp, 2), k
    )

    o = tree_gated_delta_rule(q_k, k_k, v, g, beta, parents, ssm_state)
    real = depth >= 0
    torch.testing.assert_close(o[real], core[real], atol=TOL, rtol=0)
    assert core[real].abs().max() > 0.1
    paths = tree_paths(parents)
    for i in range(n):
        state = replay_path_state(k_k, v, g, beta, paths[:, i], ssm_state)
        for b in range(2):
            if real[b, i]:
                torch.testing.assert_close(state[b], states.ssm[b, i], atol=TOL, rtol=0)


def test_keeps_every_tensor_on_the_inputs_device():
    """Under a ``meta`` default device CPU inputs give the same CPU paths, outputs and state: no
    tensor is created on the default device (on a GPU server the default is the CPU)."""
    gen = torch.Generator().manual_seed(5)
    parents = torch.tensor([random_parents(gen, 9, 4, 0.2) for _ in range(2)])
    q, k, v, g, beta, s0 = recurrence_inputs(gen, 2, 9, 2, 4, 8, 8)

    def run():
        paths = tree_paths(parents)
        path = paths[:, int(parents[0].argmax())]  # a real node's root path in row 0
        return (
            paths,
            tree_paths(parents, width=3),
            tree_gated_delta_rule(q, k, v, g, beta, parents, s0),
            replay_path_state(k, v, g, beta, path, s0),
        )

    want = run()
    with torch.device("meta"):
        got = run()
    for a, b in zip(want, got, strict=True):
        assert b.device.type == "cpu" and torch.equal(a, b)


def test_bad_inputs_are_refused_with_the_value():
    gen = torch.Generator().manual_seed(0)
    q, k, v, g, beta, s0 = recurrence_inputs(gen, 2, 5, 2, 4, 8, 6)
    parents = torch.tensor([[-1, 0, 0, 1, -1]] * 2)
    args = dict(q=q, k=k, v=v, g=g, beta=beta, parents=parents, initial_state=s0)
    cases = {
        r"^k must be \[bs, N, Hk, K\] and v \[bs, N, Hv, V\]; got k \(2, 5, 2\), v \(2, 5, 4, 6\)$": dict(
            k=k[..., 0]
        ),
        "q must have k's shape": dict(q=q[:, :, :1]),
        "key heads must divide": dict(
            v=torch.zeros(2, 5, 3, 6), g=g[..., :3], beta=beta[..., :3], initial_state=s0[:, :3]
        ),
        r"g must be \[bs, N, Hv\]": dict(g=g[..., :2]),
        r"beta must be \[bs, N, Hv\]": dict(beta=beta[:, :4]),
        r"initial_state must be \[bs, Hv, K, V\]": dict(initial_state=s0.transpose(-1, -2)),
        "floating point": dict(v=v.long()),
        r"parents must be \[bs, N\]": dict(parents=parents[:, :4]),
        r"v must be \[bs=2, N=5": dict(v=v[:, :3]),
    }
    for match, change in cases.items():
        with pytest.raises(ValueError, match=match):
            tree_gated_delta_rule(**{**args, **change})
    with pytest.raises(ValueError, match="padding slot"):
        tree_gated_delta_rule(**{**args, "parents": torch.tensor([[-1, 0, -1, 2, 1]] * 2)})
    for bad in ([0, 5, -1], [0, -1, 2], [0, -2, -1]):  # row 1 bad, row 0 valid
        with pytest.raises(ValueError) as refused:
            replay_path_state(k, v, g, beta, torch.tensor([[0, 1, -1], bad]), s0)
        assert str(refused.value) == (
            "path entries must be node indices in [0, 5) followed only by -1 padding; "
            f"row 1 is {bad}"
        )
    with pytest.raises(ValueError, match="path must be an int32/int64"):
        replay_path_state(k, v, g, beta, torch.tensor([0, 1]), s0)


TRITON_CHILD = textwrap.dedent(
    """
    import torch
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.tree_recurrence import _replay_path_state_torch, _tree_gated_delta_rule_torch
    from sglang_spec.gdn.triton_tree_recurrence import replay_path_state_triton, tree_gated_delta_rule_triton
    from test_gdn_tree_recurrence import random_parents, recurrence_inputs

    def close(a, b, what):
        err = float((a - b).abs().max())
        assert err <= 1e-5, (what, err)
        return err

    gen = torch.Generator().manual_seed(3)
    worst = 0.0
    # (name, parents rows, hk, hv, dk, dv, block_v, extra path columns)
    chain = list(range(-1, 21))  # depth 21: path rows of 22 slots, two 16-slot chunks
    cases = [
        ("gqa_padded_tree", [random_parents(gen, 24, 15, 0.2) for _ in range(2)], 1, 3, 16, 8, None, 0),
        ("deep_chain_wide_table", [chain, [-1] + [0] * 21], 2, 2, 12, 12, 8, 5),
        ("narrow_tiles", [random_parents(gen, 12, 4, 0.0)], 2, 4, 8, 12, 4, 0),
        ("bushy_65", [random_parents(gen, 65, 15, 0.0, extend=0.3)], 2, 4, 16, 24, 16, 0),
        ("root_and_padding", [[-1] * 6], 1, 1, 8, 8, 8, 0),
    ]
    for name, rows, hk, hv, dk, dv, bv, extra in cases:
        parents = torch.tensor(rows)
        bs, n = parents.shape
        q, k, v, g, beta, s0 = recurrence_inputs(gen, bs, n, hk, hv, dk, dv)
        paths = tree_paths(parents)
        want = _tree_gated_delta_rule_torch(q, k, v, g, beta, paths, s0)
        wide = tree_paths(parents, width=paths.shape[2] + extra)
        got = tree_gated_delta_rule_triton(q, k, v, g, beta, wide, s0, block_v=bv)
        worst = max(worst, close(got, want, name))
        padding = (parents < 0) & (torch.arange(n) > 0)
        assert bool((got[padding] == 0).all()), name
        assert float(want.abs().max()) > 0.2, name
        # replay: every node's path; the second half of the batch rows empty
        for i in range(0, n, 3):
            path = paths[:, i].clone()
            path[bs // 2 + 1:] = -1
            want_s = _replay_path_state_torch(k, v, g, beta, path, s0)
            worst = max(worst, close(replay_path_state_triton(k, v, g, beta, path, s0, block_v=bv), want_s, name))

    # strided k/v: views of one [bs, n, (2 hk dk + hv dv)] projection, as SGLang splits mixed_qkv;
    # q contiguous, so that q and k have different strides
    parents = torch.tensor([random_parents(gen, 17, 15, 0.1) for _ in range(3)])
    bs, n = parents.shape
    hk, hv, dk, dv = 2, 4, 16, 8
    q, k, v, g, beta, s0 = recurrence_inputs(gen, bs, n, hk, hv, dk, dv)
    mixed = torch.cat([x.flatten(2) for x in (q, k, v)], dim=-1)
    _, k, v = (
        x.view(bs, n, -1, d)
        for x, d in zip(torch.split(mixed, [hk * dk, hk * dk, hv * dv], dim=-1), (dk, dk, dv))
    )
    assert not (k.is_contiguous() or v.is_contiguous()) and q.stride() != k.stride()
    paths = tree_paths(parents)
    got = tree_gated_delta_rule_triton(q, k, v, g, beta, paths, s0.transpose(-1, -2).contiguous().transpose(-1, -2))
    worst = max(worst, close(got, _tree_gated_delta_rule_torch(q, k, v, g, beta, paths, s0), "strided"))
    print("TRITON_OK", worst)
    """
)


def start_interpreted(script: str) -> subprocess.Popen:
    """Start ``script`` in a child process under ``TRITON_INTERPRET=1`` (Triton reads the variable
    at import), its output captured."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(
        os.environ,
        TRITON_INTERPRET="1",
        PYTHONPATH=os.pathsep.join([os.path.dirname(here), here, os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def check_interpreted(proc: subprocess.Popen, marker: str) -> None:
    """Wait for a child of :func:`start_interpreted`: it must exit 0 having printed ``marker``."""
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and marker in out, out[-3000:] + err[-5000:]


def run_interpreted(script: str, marker: str) -> None:
    """Run ``script`` in a child process under ``TRITON_INTERPRET=1``; it must print ``marker``."""
    check_interpreted(start_interpreted(script), marker)


def test_triton_kernels_match_torch_core_under_interpreter():
    run_interpreted(TRITON_CHILD, "TRITON_OK")


PREP_CHILD = textwrap.dedent(
    """
    import torch
    from sglang_spec.gdn import tree_paths
    from sglang_spec.gdn.triton_tree_recurrence import launch_tree_prep_kernel, tree_prep_scratch
    from test_gdn_tree_recurrence import random_parents

    def sglang_norm(x):  # SGLang's division-form l2-norm, eps 1e-6
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)

    gen = torch.Generator().manual_seed(5)
    worst = 0.0
    chain = list(range(-1, 19))  # depth 19: a path row wider than one 16-slot chunk
    # (name, parents rows, hk, dk, extra path columns, cache_indices or None for the raw mode)
    cases = [
        ("raw_padded_hk2", [random_parents(gen, 14, 6, 0.25) for _ in range(2)], 2, 12, 2, None),
        ("sglang_padreq_hk1", [random_parents(gen, 20, 15, 0.2) for _ in range(3)], 1, 16, 0,
         [4, -1, 0]),
        ("sglang_deep_hk2", [chain, [-1] + [0] * 19], 2, 8, 3, [1, 0]),
    ]
    for name, rows, hk, dk, extra, cache in cases:
        parents = torch.tensor(rows)
        bs, n = parents.shape
        paths = tree_paths(parents, width=tree_paths(parents).shape[2] + extra).to(torch.int32)
        w = paths.shape[2]
        # q, k strided views of one projection, with different strides
        mixed = torch.randn(bs, n, 3 * hk * dk, generator=gen)
        q = mixed[..., : hk * dk].view(bs, n, hk, dk)
        k = mixed[..., 2 * hk * dk :].view(bs, n, hk, dk)
        prep = torch.full((bs * n, hk, 2 * w + 3), float("nan"))
        scale = dk**-0.5
        rows_t = None if cache is None else torch.tensor(cache, dtype=torch.int32)
        launch_tree_prep_kernel(q, k, paths.contiguous(), prep, rows_t, scale)
        got = prep.view(bs, n, hk, 2 * w + 3)

        if cache is None:
            kh, qh = k, q
            inv_k = inv_q = torch.ones(bs, n, hk)
        else:
            kh, qh = sglang_norm(k), sglang_norm(q) * scale
            inv_k = 1 / torch.sqrt((k * k).sum(-1) + 1e-6)
            inv_q = 1 / torch.sqrt((q * q).sum(-1) + 1e-6)
        idx = torch.arange(n).view(1, n, 1)
        anc = (paths >= 0) & (paths != idx)  # [bs, n, w]: the slot holding i itself excluded
        k_anc = kh[torch.arange(bs).view(bs, 1, 1), paths.clamp(min=0).long()]  # [bs, n, w, hk, dk]
        k_anc = k_anc * anc[..., None, None]
        want_kk = torch.einsum("bntha,bnha->bnht", k_anc, kh)
        want_qk = torch.einsum("bntha,bnha->bnht", k_anc, qh)
        want = torch.cat(
            [want_kk, want_qk, (qh * kh).sum(-1, keepdim=True), inv_k[..., None], inv_q[..., None]],
            dim=-1,
        )
        real = torch.ones(bs, dtype=torch.bool) if cache is None else rows_t >= 0
        err = float((got[real] - want[real]).abs().max())
        assert err <= 1e-5, (name, err)
        assert bool(torch.isnan(got[~real]).all()), (name, "a padding request's rows were written")
        assert float(want_kk[real].abs().max()) > 0.3 and float(want_qk[real].abs().max()) > 0.1, name
        worst = max(worst, err)
    print("PREP_OK", worst)
    """
)


def test_prep_kernel_key_products_match_torch_under_interpreter():
    """``_tree_prep_kernel``'s rows (ancestor key products with the node's key and query, ``q.k``,
    inverse norms) against an einsum over the path table: raw and SGLang (l2-norm, scale) modes,
    padding slots, a padding request (rows left unwritten), 1 and 2 key heads, path tables wider
    than the deepest path and than one 16-slot chunk, strided q/k."""
    run_interpreted(PREP_CHILD, "PREP_OK")
