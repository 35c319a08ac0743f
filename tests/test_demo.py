"""The README's main command, ``sglang-spec demo``, end to end on the bundled hybrid pair (short)."""

from __future__ import annotations

import sglang_spec.reference as reference
from sglang_spec import demo
from sglang_spec.tree import DEFAULT_TREE_TEMPERATURE


def test_demo_decodes_identically_to_ar_at_the_given_tree_temperature(monkeypatch, capsys):
    seen = []
    real = reference.generate

    def recording(*args, **kwargs):
        seen.append((args[3], kwargs.get("tree_temperature")))
        return real(*args, **kwargs)

    monkeypatch.setattr(reference, "generate", recording)
    argv = ["--methods", "ar,ddtree", "--num-prompts", "1", "--max-new-tokens", "12"]
    assert demo.main([*argv, "--budget", "8", "--tree-temperature", "0.5"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| ddtree (budget 8)")]
    assert len(rows) == 1 and rows[0].endswith("| yes |"), out
    assert ("ddtree", 0.5) in seen
    # unset, the demo builds trees at the server's default tree temperature
    assert demo.main([*argv, "--budget", "8"]) == 0
    assert seen[-1] == ("ddtree", DEFAULT_TREE_TEMPERATURE)
