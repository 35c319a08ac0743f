"""The bundled trained tiny pairs (``sglang_spec/fixtures/tiny-pair``): loading and held-out prompts.

Library code for the demo, the CPU server's reference engine, benchmarks and tests; errors are
exceptions (``ValueError`` for an unknown pair, ``FileNotFoundError`` for a missing model), never
``SystemExit``.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "tiny-pair"
PAIRS = {"hybrid": ("hybrid", "hybrid-dflash"), "qwen3": ("qwen3", "qwen3-dflash")}


def load_pair(pair: str = "hybrid", fixtures: Path = FIXTURES):
    """(tokenizer, float32 target, DFlash drafter) of a bundled pair, loaded offline."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_spec.dflash import DFlashDrafter, DrafterConfigWarning

    if pair not in PAIRS:
        raise ValueError(f"pair must be one of {sorted(PAIRS)}; got {pair!r}")
    fixtures = Path(fixtures)
    target_dir, drafter_dir = (fixtures / name for name in PAIRS[pair])
    for path in (target_dir, drafter_dir):
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"no model at {path}: the fixtures directory must hold {', '.join(PAIRS[pair])}/"
            )
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    with warnings.catch_warnings():
        # The pair's layer ids differ from SGLang's evenly-spread default on purpose (they are explicit).
        warnings.simplefilter("ignore", DrafterConfigWarning)
        drafter = DFlashDrafter.from_pretrained(str(drafter_dir), target, tokenizer=tokenizer)
    return tokenizer, target, drafter


#: The bundled prompt sets: held-out stdlib modules (``heldout``), and a code base the pair never
#: saw (``othercode``: click, written by ``python -m training.prompts``).
PROMPT_SETS = ("heldout", "othercode")


def heldout_prompts(
    num: int | None = None, fixtures: Path = FIXTURES, spread: bool = True, prompt_set="heldout"
) -> list[str]:
    """Prompts the pair was not trained on: ``num`` of them spread over the set's modules (or the
    first ``num``), from ``<prompt_set>_prompts.jsonl``."""
    if prompt_set not in PROMPT_SETS:
        raise ValueError(f"prompt set {prompt_set!r}; valid: {', '.join(PROMPT_SETS)}")
    path = Path(fixtures) / f"{prompt_set}_prompts.jsonl"
    prompts = [json.loads(line)["prompt"] for line in path.read_text().splitlines() if line.strip()]
    if num is None:
        return prompts
    step = max(1, len(prompts) // max(1, num)) if spread else 1
    return prompts[::step][:num]
