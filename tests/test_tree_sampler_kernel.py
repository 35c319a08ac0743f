"""The Triton row kernel of the T > 0 node sampler (sglang_spec/tree/triton_sampler.py) against
the torch path of sglang_spec/tree/sampler.py and the exact float64 law.

CI has no GPU: the kernel runs under Triton's CPU interpreter in a child process
(``TRITON_INTERPRET=1`` must be set before Triton is imported); on a CUDA machine the same checks
run compiled. Rows: V = 3000 in tiles of 2048 or 512 (a ragged last tile), float32 and bfloat16
logits, ``-inf`` entries, integer logits (tie groups at every threshold), per-row temperature,
top-k (greedy rows with ``top_k = 1`` among them), top-p, min-p, both top-k/top-p orders, and
rows without top-k whose nucleus is wider than the candidates (the in-kernel bisection).

- Thresholds: the kernel's ``tau`` and kept count equal, exactly, those of ``sampler._thresholds``
  on the weights the interpreter computes (its ``exp`` is numpy's, which differs from torch's in
  the last bit for ~20 % of inputs). Compiled, the kernel's ``exp`` is its own: ``tau`` within
  1e-5 (relative) of the torch path's, the kept counts equal on >= 97 % of the rows.
- Top-p boundary (interpreter only: it needs the kernel's exact weights): ``top_p * mass`` exactly
  the top weight keeps the top token alone.
- Tokens: equal to ``sample_node_tokens``' torch path for the same uniforms, except where ``u``
  lies within 1e-5 (relative) of a boundary of the float64 inverse CDF (summation order differs).
- χ²: the kernel's draws from fixed rows against the exact float64 processed distribution.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import tree_oracles as O
from test_tree_sampler import chi2_check
from tree_testing import run_under_triton_interpreter

from sglang_spec.tree import sampler as S

V = 3000
BIG = 1 << 30  # top_k >= V: no top-k


def _batch(seed: int, rows: int, dtype, integer: bool):
    """Random rows and per-row settings covering every kind of row."""
    g = torch.Generator().manual_seed(seed)
    if integer:
        lg = torch.randint(-6, 3, (rows, V), generator=g).float()
    else:
        scale = torch.tensor([0.3, 1.0, 4.0])[torch.randint(0, 3, (rows, 1), generator=g)]
        lg = torch.randn(rows, V, generator=g) * scale
    lg[::7, ::5] = float("-inf")
    lg = lg.to(dtype)
    temp = 0.5 + torch.rand(rows, generator=g)
    k = torch.tensor([BIG, BIG, 1, 2, 20, 50])[torch.randint(0, 6, (rows,), generator=g)]
    p = torch.tensor([1.0, 0.5, 0.9, 0.97])[torch.randint(0, 4, (rows,), generator=g)]
    mp = torch.tensor([0.0, 0.0, 0.02, 0.3])[torch.randint(0, 4, (rows,), generator=g)]
    u = torch.rand(rows, generator=g)
    return lg, temp, k, p, mp, u


def _interpreter_weights(lg, temp):
    """The weights as the interpreted kernel computes them (float32, numpy's exp)."""
    x = (lg.float() - lg.float().max(-1, keepdim=True).values) / temp[:, None]
    return torch.from_numpy(np.exp(x.numpy()))


def _near_boundary(lg, temp, tau, u) -> torch.Tensor:
    """Rows whose uniform lies within 1e-5 (relative) of a float64 inverse-CDF boundary."""
    w = torch.exp((lg.double() - lg.double().max(-1, keepdim=True).values) / temp[:, None].double())
    w = torch.where(lg.float() > float("-inf"), w, 0.0)
    w64 = torch.where(_torch_weights(lg, temp) >= tau[:, None], w, 0.0)
    cdf = w64.cumsum(-1) / w64.sum(-1, keepdim=True)
    return ((cdf - u[:, None].double()).abs() <= 1e-5 * u[:, None].double()).any(-1)


def _torch_weights(lg, temp):
    w = torch.empty(lg.shape, dtype=torch.float32)
    S._weights_into(w, lg, lg.max(-1).values, temp)
    return w


def check_kernel_matches_torch(device: str) -> None:
    interpreted = device == "cpu"
    runs = [  # (seed, dtype, integer logits, top_k_first, nucleus candidates, tile)
        (0, torch.float32, False, False, 32, 2048),
        (1, torch.bfloat16, False, True, 32, 512),
        (2, torch.float32, True, False, 16, 512),
        (3, torch.bfloat16, True, True, 64, 2048),
    ]
    wide = 0
    for seed, dtype, integer, top_k_first, cands, tile in runs:
        rows = 48
        lg, temp, k, p, mp, u = _batch(seed, rows, dtype, integer)
        bounds = S.SamplingBounds.of(
            k.tolist(), p.tolist(), V, top_k_first=top_k_first, nucleus_candidates=cands
        )
        on = lambda t: t.to(device)  # noqa: E731
        tok, tau, kept = (
            t.cpu()
            for t in S._rows_on_device(
                on(lg), on(temp), on(k), on(p), on(mp), on(u), bounds, block_v=tile
            )
        )
        ref_tok = S.sample_node_tokens(lg, temp, k, p, mp, bounds, uniforms=u)
        greedy = k == 1
        assert torch.equal(tok[greedy], lg[greedy].argmax(-1)), seed
        w = _interpreter_weights(lg, temp) if interpreted else _torch_weights(lg, temp)
        ref_tau = S._thresholds(w, k, p, mp, bounds.candidates(V), bounds)
        ref_kept = (w >= ref_tau[:, None]).sum(-1)
        ng = ~greedy
        if interpreted:
            assert torch.equal(tau[ng], ref_tau[ng]), (seed, tau[ng], ref_tau[ng])
            assert torch.equal(kept[ng].long(), ref_kept[ng]), (seed, kept[ng], ref_kept[ng])
        else:
            torch.testing.assert_close(tau[ng], ref_tau[ng], rtol=1e-5, atol=0)
            assert (kept[ng].long() == ref_kept[ng]).float().mean() > 0.97, seed
        wide += int(((k >= V) & (p < 1) & (ref_kept > cands) & (ref_tau > mp)).sum())
        near = _near_boundary(lg, temp, ref_tau, u) & ng
        assert near.float().mean() < 0.1, f"seed {seed}: {int(near.sum())} rows skipped"
        # compiled, a weight within an ulp of a threshold may be kept on one side only
        compared = ~near & (kept.long() == ref_kept)
        same = ref_tok == tok
        assert bool(same[compared].all()), (seed, (~same & compared).nonzero().flatten().tolist())
    assert wide >= 10, f"only {wide} rows bisected their nucleus"


def check_top_p_reached_exactly_keeps_no_more() -> None:
    """top_p times the mass equal to the top weight exactly (float32, the interpreter's exp): the
    nucleus is the top token alone (``>=``: the smallest top set whose mass reaches top_p)."""
    lg = torch.full((16, V), float("-inf"))
    lg[:, 5], lg[:, 9] = 0.0, -0.7
    temp = torch.ones(16)
    mass = np.float32(1.0) + _interpreter_weights(lg[:1], temp[:1])[0, 9].numpy()
    p = np.float32(1.0) / mass
    while np.float32(p * mass) != 1.0:
        p = np.nextafter(p, np.float32(0.0 if p * mass > 1 else 1.0), dtype=np.float32)
    p = torch.full((16,), float(p))
    bounds = S.SamplingBounds.of([BIG], [float(p[0])], V)
    u = torch.arange(16) / 16
    tok, tau, kept = S._rows_on_device(lg, temp, torch.full((16,), BIG), p, None, u, bounds)
    assert tok.tolist() == [5] * 16 and kept.tolist() == [1] * 16, (tok, kept)


# (temperature, top_k, top_p, min_p, top_k_first, nucleus candidates, draws); no ties in these
# rows. The interpreter runs a program in ~5 ms, ~40 ms with the 30-pass bisection: fewer draws.
CHI2_ROWS = [
    (0.8, BIG, 1.0, 0.0, False, 8, 800),
    (1.3, 12, 0.7, 0.1, True, 8, 800),
    (1.5, BIG, 0.9, 0.05, True, 4, 300),  # nucleus wider than 4 candidates: bisection
]
CHI2_V = 40


def check_kernel_draws_follow_the_exact_law(device: str) -> None:
    g = torch.Generator().manual_seed(7)
    base = torch.randn(len(CHI2_ROWS), CHI2_V, generator=g) * 1.5
    for row, (T, k, p, mp, top_k_first, cands, n) in zip(base, CHI2_ROWS, strict=True):
        lg = row.repeat(n, 1)
        bounds = S.SamplingBounds.of(
            [k], [p], CHI2_V, top_k_first=top_k_first, nucleus_candidates=cands
        )
        on = lambda t: t.to(device)  # noqa: E731
        tok, _, _ = S._rows_on_device(
            on(lg),
            on(torch.full((n,), T)),
            on(torch.full((n,), k)),
            on(torch.full((n,), p)),
            on(torch.full((n,), mp)),
            on(torch.rand(n, generator=g)),
            bounds,
            block_v=64,
        )
        order = "topk_then_topp" if top_k_first else "joint"
        q = O.filtered_probs(row, T, k if k < CHI2_V else -1, p, order=order)
        q = torch.where(q >= mp * q.max(), q, 0.0)
        q = q / q.sum()
        law = {(t,): float(q[t]) for t in range(CHI2_V) if q[t] > 0}
        chi2_check([(t,) for t in tok.cpu().tolist()], law, f"row {T, k, p, mp, top_k_first}")


def check_on_cpu() -> None:
    check_kernel_matches_torch("cpu")
    check_top_p_reached_exactly_keeps_no_more()
    check_kernel_draws_follow_the_exact_law("cpu")


def test_row_kernel_under_interpreter():
    run_under_triton_interpreter("test_tree_sampler_kernel", "check_on_cpu", "OK")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_row_kernel_on_cuda():
    check_kernel_matches_torch("cuda")
    check_kernel_draws_follow_the_exact_law("cuda")
