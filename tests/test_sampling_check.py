"""e2e.sampling_check's chi-square of a server's 2nd-token samples against the exact target law.

A fake target with fixed next-token logits stands in for the model: samples drawn from its law
at the test temperature pass, samples from another law fail, with and without an AR server in
the run (without one, the 1st token to condition on comes from the servers' own samples).
"""

from __future__ import annotations

import re
import types

import pytest
import torch

from e2e import sampling_check

V = 8
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])


def _model(ids: torch.Tensor):
    return types.SimpleNamespace(logits=LOGITS.expand(1, ids.shape[1], V).clone())


def _pairs(n: int, probs: torch.Tensor, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    second = torch.multinomial(probs, n, replacement=True, generator=g)
    return [[3, int(t)] for t in second]


def _pvalues(capsys) -> dict[str, float]:
    rows = [
        ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| ") and "bins" in ln
    ]
    return {r.split("|")[1].strip(): float(re.search(r"\| ([0-9.e-]+) \(", r)[1]) for r in rows}


@pytest.mark.parametrize("with_ar", [True, False])
def test_exact_law_passes_and_another_law_fails(capsys, with_ar):
    temperature = 0.7
    exact = (LOGITS / temperature).softmax(-1)
    wrong = LOGITS.softmax(-1)  # the law at T = 1: what a verify ignoring T would sample
    servers = [
        {"label": "ddtree64+graphs", "ok": True, "dist_pairs": _pairs(4000, exact, 1)},
        {"label": "ddtree16", "ok": True, "dist_pairs": _pairs(4000, wrong, 2)},
    ]
    if with_ar:
        servers.insert(0, {"label": "ar+graphs", "ok": True, "dist_pairs": _pairs(4000, exact, 3)})
    sampling_check._pair_test(servers, _model, [1, 2], temperature)
    p = _pvalues(capsys)
    assert p["ddtree64+graphs"] > 1e-3
    assert p["ddtree16"] < 1e-6
    assert ("ar+graphs" in p) == with_ar
