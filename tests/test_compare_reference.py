"""e2e.compare_reference's judge of a greedy difference: the float32 logit gap at the first
differing token, given the common prefix (a fake target whose logits depend on the last id)."""

from __future__ import annotations

import types

import torch

from e2e.compare_reference import first_divergence_gap, run_prompts
from sglang_spec.reference import tiny_pair


def _target(ids: torch.Tensor):
    last = int(ids[0, -1])
    logits = torch.zeros(1, ids.shape[1], 6)
    logits[0, -1] = torch.arange(6, dtype=torch.float32) * 0.01 * (last + 1)
    return types.SimpleNamespace(logits=logits)


def test_gap_at_the_first_difference_given_the_common_prefix():
    prompt = torch.tensor([[3, 1]])
    ref, got = [5, 4, 5, 2], [5, 4, 3, 2]
    t, gap = first_divergence_gap(_target, prompt, ref, got)
    # position 2, prefix ... 5, 4: logits 0.05 * id; reference 5, server 3
    assert t == 2
    assert abs(gap - 0.05 * (5 - 3)) < 1e-6
    assert first_divergence_gap(_target, prompt, ref, list(ref)) is None


def test_run_prompts_follow_the_file_the_run_was_given(tmp_path):
    """e2e/h200_tau.sh's runs take a tagged file of both sets: judging them against the held-out
    set would compare other prompts' decodes."""
    f = tmp_path / "prompts.jsonl"
    f.write_text('{"set": "othercode", "prompt": "def a():"}\n\n{"set": "x", "prompt": "b ="}\n')
    assert run_prompts(str(f), 5) == ["def a():", "b ="]
    assert run_prompts(str(f), 1) == ["def a():"]
    assert run_prompts(None, 3) == tiny_pair.heldout_prompts(3, spread=False)
