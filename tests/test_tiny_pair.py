"""The bundled trained tiny pairs load offline and decode losslessly with real acceptance.

``sglang_spec/fixtures/tiny-pair`` (trained by ``python -m training`` on the H200): a Qwen3.5-text
hybrid target (with an MTP head for SGLang's NEXTN) and a Qwen3 target, each with a DFlash drafter
of block 16. Greedy DFLASH and DDTREE must reproduce AR exactly on held-out prompts, and the
trained drafters must be accepted as often as measured (a count, not a timing: floors 5 % below the
deterministic float32 values).
"""

import os

import pytest
import torch
from safetensors import safe_open

from loadtests.prompts import load_prompts
from sglang_spec.reference import engine, generate, tokens_per_step
from sglang_spec.reference.tiny_pair import FIXTURES as ROOT
from sglang_spec.reference.tiny_pair import heldout_prompts, load_pair
from sglang_spec.tree import build_ddtree

PROMPTS = heldout_prompts()
NEW = 48


@pytest.fixture(scope="module", params=["hybrid", "qwen3"])
def pair(request):
    os.environ["HF_HUB_OFFLINE"] = "1"
    return (request.param, *load_pair(request.param))


def test_fixtures_are_small_and_complete():
    total = sum(f.stat().st_size for f in ROOT.rglob("*") if f.is_file())
    assert total <= 20 * 1024 * 1024, (
        f"fixtures are {total / 2**20:.2f} MiB; the H200 run can carry 20 MB"
    )
    with safe_open(str(ROOT / "hybrid" / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert any(k.startswith("mtp.") for k in keys), (
        "the hybrid target must carry its MTP head for NEXTN"
    )
    assert len(PROMPTS) >= 30 and len(set(PROMPTS)) == len(PROMPTS)
    assert load_prompts("heldout") == PROMPTS  # the load generator's "heldout" set is this file
    assert heldout_prompts(3) == PROMPTS[:: len(PROMPTS) // 3][:3]  # spread over the modules
    assert heldout_prompts(3, spread=False) == PROMPTS[:3]
    assert heldout_prompts(len(PROMPTS)) == PROMPTS


def test_othercode_prompts_come_from_another_code_base():
    """The ``othercode`` set is click's documented functions (``python -m training.prompts
    --package click``), none of them from the training corpus (the stdlib)."""
    import json

    other = heldout_prompts(prompt_set="othercode")
    assert len(other) >= 30 and not set(other) & set(PROMPTS)
    rows = [json.loads(x) for x in (ROOT / "othercode_prompts.jsonl").read_text().splitlines()]
    assert {r["source"] for r in rows} == {"click 8.5.1 (BSD-3-Clause)"}
    assert (ROOT / "othercode_prompts.LICENSE").read_text().startswith("Copyright 2014 Pallets")
    with pytest.raises(ValueError, match="prompt set 'nope'; valid: heldout, othercode"):
        heldout_prompts(prompt_set="nope")


def test_training_prompts_extracts_a_packages_documented_functions(tmp_path, monkeypatch):
    """``python -m training.prompts`` on a package it is given: signature + docstring prompts of
    its public documented functions, the package, version and licence in every row; one-line
    refusals for a module and for a package without distribution metadata."""
    import json

    from training.prompts import main

    pkg = tmp_path / "site" / "demopkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "ops.py").write_text(
        'def add(a, b):\n    """Add two numbers."""\n    return a + b\n\n\n'
        'def _hidden(a):\n    """Private."""\n    return a\n\n\n'
        "def bare(a):\n    return a\n"
    )
    meta = tmp_path / "site" / "demopkg-1.2.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(
        "Metadata-Version: 2.4\nName: demopkg\nVersion: 1.2\nLicense-Expression: MIT\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    out = tmp_path / "p.jsonl"
    assert main(["--package", "demopkg", "--out", str(out)]) == 0
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["id"] == "ops:add" and row["source"] == "demopkg 1.2 (MIT)"
    assert row["prompt"] == 'def add(a, b):\n    """Add two numbers."""\n'
    assert row["reference"] == "    return a + b\n"
    with pytest.raises(SystemExit, match="'textwrap': not an installed package"):
        main(["--package", "textwrap", "--out", str(tmp_path / "q.jsonl")])  # a single module
    with pytest.raises(SystemExit, match="'json': no distribution metadata"):
        main(["--package", "json", "--out", str(tmp_path / "q.jsonl")])  # the stdlib's


def test_loader_names_a_bad_pair_or_directory(tmp_path):
    with pytest.raises(ValueError, match=r"pair must be one of \['hybrid', 'qwen3'\]; got 'nope'"):
        load_pair("nope")
    (tmp_path / "hybrid").mkdir()
    (tmp_path / "hybrid" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="hybrid-dflash.*must hold hybrid, hybrid-dflash/"):
        load_pair("hybrid", tmp_path)


def test_pair_loads_offline(pair):
    kind, tokenizer, target, drafter = pair
    assert drafter.block_size == 16 and drafter.mask_token_id == tokenizer.convert_tokens_to_ids(
        "<|MASK|>"
    )
    expected = "Qwen3_5ForCausalLM" if kind == "hybrid" else "Qwen3ForCausalLM"
    assert type(target).__name__ == expected
    assert target.dtype == torch.float32  # stored in bf16; decoded in float32 (deterministic)


# Tokens per verify step (SGLang's completion_tokens / spec_verify_ct), measured in float32 on this
# CPU, where decoding is deterministic. Floors sit 5 % below, room for float differences between
# CPUs and tight enough that a real regression fails (e.g. drafter context positions shifted by one
# at commit: hybrid DFLASH 1.97 -> 1.69, DDTREE(64) 2.94 -> 2.44; qwen3 DFLASH 1.78 -> 1.62).
FLOOR = 0.95
MEASURED = {  # 3 held-out prompts (PROMPTS[::15][:3]) x NEW tokens; DDTREE(64) chain-inclusive
    "hybrid": {"dflash": 1.973, "ddtree": 3.200},
    "qwen3": {"dflash": 1.778, "ddtree": 2.717},
}
# DDTREE(12) on PROMPTS[15] x NEW tokens, at tree temperature 1 and 0.5. A budget below the drafter
# horizon L = 15, where the tree is plain best-first (no chain inside, sglang_spec.tree.build), so the
# temperature alone decides its shape.
TREE_T_BUDGET = 12
MEASURED_TREE_T = {
    "hybrid": {1.0: 3.692, 0.5: 6.000},
    "qwen3": {1.0: 2.286, 0.5: 1.920},
}


def test_greedy_equals_ar_and_drafts_are_accepted(pair):
    kind, tokenizer, target, drafter = pair
    prompts = PROMPTS[::15][:3]  # three different held-out modules
    results = {"dflash": [], "ddtree": []}
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        ar = generate(target, drafter, ids, "ar", max_new_tokens=NEW)
        for method in results:
            out = generate(target, drafter, ids, method, budget=64, max_new_tokens=NEW)
            assert out.tokens == ar.tokens, (kind, method, prompt[:40])
            results[method].append(out)
    rate = {method: tokens_per_step(results[method]) for method in results}
    for method, measured in MEASURED[kind].items():
        assert rate[method] >= FLOOR * measured, (kind, method, rate, measured)
    assert rate["ddtree"] > rate["dflash"], (kind, rate)


def test_tree_temperature_reshapes_the_tree_not_the_output(pair, monkeypatch):
    """A tree temperature < 1 moves the budget from siblings to depth; the output stays AR's.

    The trees the engine verifies must get deeper (a spy on ``build_ddtree`` records each tree's
    deepest node) and acceptance must move as measured: up on the hybrid pair, whose drafter is
    under-confident for greedy verification, down on the qwen3 pair (``acceptance_tiny_pair.md``).
    """
    kind, tokenizer, target, drafter = pair
    deepest = []

    def spy(*args, **kwargs):
        tree = build_ddtree(*args, **kwargs)
        deepest.append(int(tree.depths.max()))
        return tree

    monkeypatch.setattr(engine, "build_ddtree", spy)
    ids = tokenizer(PROMPTS[15], return_tensors="pt").input_ids
    ar = generate(target, drafter, ids, "ar", max_new_tokens=NEW)
    depth, rate = {}, {}
    for tau in (1.0, 0.5):
        deepest.clear()
        out = generate(
            target,
            drafter,
            ids,
            "ddtree",
            budget=TREE_T_BUDGET,
            tree_temperature=tau,
            max_new_tokens=NEW,
        )
        assert out.tokens == ar.tokens, (kind, tau)
        assert len(deepest) == len(out.steps), "every step must build its tree with build_ddtree"
        depth[tau], rate[tau] = sum(deepest) / len(deepest), out.tokens_per_step
        assert rate[tau] >= FLOOR * MEASURED_TREE_T[kind][tau], (kind, tau, rate)
    assert depth[0.5] > 1.5 * depth[1.0], (kind, depth)  # measured: 2.8 -> 6.3, 2.1 -> 4.0
    if kind == "hybrid":
        assert rate[0.5] > 1.5 * rate[1.0], rate
    else:
        assert rate[0.5] < rate[1.0], rate
    with pytest.raises(ValueError, match="tree temperature must be a finite number > 0"):
        generate(target, drafter, ids, "ddtree", budget=16, tree_temperature=0.0, max_new_tokens=4)
