"""Tokens per verify step: real SGLang (``e2e/tiny_pair.py`` output) vs the reference engine, same prompts.

For every speculative server in an ``e2e.json`` whose method the reference engine has (DFLASH,
DDTREE<budget>), it decodes the same prompts greedily with ``sglang_spec.reference`` (float32, CPU,
no stop token, as the e2e requests use ``ignore_eos``) and prints both tokens-per-step figures and
whether the token ids agree; for every prompt where they do not, the first differing position and
the float32 logit gap there between the reference's token (the target's argmax: the engine is
lossless) and the server's, which tells a bf16 near-tie (a gap below ``NEAR_TIE``) from a bug::

    python -m e2e.compare_reference benchmarks/results/e2e_h200/hybrid_eager.json.xz --pair hybrid
"""

from __future__ import annotations

import argparse
import re

import torch

from e2e.tiny_pair import load_prompts, load_runs
from sglang_spec.reference import generate, tiny_pair
from sglang_spec.tree import DEFAULT_TREE_TEMPERATURE

# float32 logit gap under which a bf16 server may pick the other token: bf16 carries ~3 significant
# digits, so logits of magnitude ~10 round by ~0.03 per step and drift by more over a long prefix
NEAR_TIE = 0.1


def first_divergence_gap(target, prompt_ids: torch.Tensor, ref: list[int], got: list[int]):
    """``(t, gap)``: the first position where ``got`` leaves ``ref`` and the float32 logit of the
    reference's token minus the server's there, given the common prefix; None if no token differs."""
    t = next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    if t is None:
        return None
    ids = torch.cat([prompt_ids, torch.tensor([ref[:t]], dtype=prompt_ids.dtype)], dim=1)
    with torch.no_grad():
        logits = target(ids).logits[0, -1].float()
    return t, float(logits[ref[t]] - logits[got[t]])


def run_prompts(path: str | None, num: int) -> list[str]:
    """The prompts of an ``e2e/tiny_pair.py`` run, in its order: the first ``num`` of the JSONL it
    was given (``path``), or of the held-out set."""
    if path is None:
        return tiny_pair.heldout_prompts(num, spread=False)
    return load_prompts(path, num)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("e2e_json")
    ap.add_argument("--pair", choices=sorted(tiny_pair.PAIRS), default="hybrid")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument(
        "--prompts",
        help="the JSONL the run was given (e.g. e2e/h200_tau.sh's); default: the held-out set",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument(
        "--tree-temperature",
        type=float,
        default=DEFAULT_TREE_TEMPERATURE,
        help="the servers' SGLANG_DDTREE_TREE_TEMPERATURE (default: the plug-in's, %(default)s)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok, target, drafter = tiny_pair.load_pair(args.pair)
    prompts = run_prompts(args.prompts, args.num_prompts)
    print(
        "| server | SGLang tokens/step | reference tokens/step | token ids equal | "
        "verify steps on the equal prompts: SGLang / reference |"
    )
    print("|---|---|---|---|---|")
    for server in load_runs(args.e2e_json):
        # labels like ddtree64+graphs+patched+replayssm; a server whose greedy runs finished counts
        # even if a later check of the same server (e.g. no slots lost) failed
        m = re.fullmatch(r"(dflash|ddtree)(\d*)((?:\+[\w-]+)*)", server["label"])
        if m is None or not server.get("greedy"):
            continue
        method, budget = m.group(1), int(m.group(2) or 0)
        sg_tokens = sum(g["meta"]["completion_tokens"] for g in server["greedy"])
        sg_steps = sum(g["meta"]["spec_verify_ct"] for g in server["greedy"])
        emitted = steps = same = 0
        same_steps = [0, 0]
        diverged = []
        for i, (prompt, g) in enumerate(zip(prompts, server["greedy"])):
            ids = tok(prompt, return_tensors="pt").input_ids
            res = generate(
                target,
                drafter,
                ids,
                method,
                budget=budget,
                tree_temperature=args.tree_temperature,
                max_new_tokens=args.max_new_tokens,
            )
            emitted += len(res.tokens)
            steps += len(res.steps)  # like spec_verify_ct, which does not count the prefill forward
            if res.tokens == g["output_ids"]:
                same += 1
                same_steps[0] += g["meta"]["spec_verify_ct"]
                same_steps[1] += len(res.steps)
            else:
                gap = first_divergence_gap(target, ids, res.tokens, g["output_ids"])
                if gap is not None:
                    diverged.append((i, *gap))
        print(
            f"| {server['label']} | {sg_tokens / sg_steps:.2f} | {emitted / steps:.2f} | {same}/{len(prompts)} | "
            f"{same_steps[0]} / {same_steps[1]} |",
            flush=True,
        )
        for i, t, gap in diverged:
            verdict = "near-tie" if gap < NEAR_TIE else "REAL GAP: a bug"
            print(f"  prompt {i}: first difference at token {t}, fp32 gap {gap:.4f} ({verdict})")


if __name__ == "__main__":
    main()
