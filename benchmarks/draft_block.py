"""``python -m benchmarks.draft_block``: tokens per verify step when the drafter drafts a shorter
block than it was trained with (CPU, reference engine, the bundled tiny pairs).

On the 27B shape at 16 requests the DFlash drafter's five layers, its LM-head rows and their top-K
take about 2.5 of budget 7's 4.9 draft-graph ms (session 25's traces,
benchmarks/results/e2e_h200/session25). They scale with the block's tokens: a block of 8
drafts depths 1..7 for half of that. A budget of 7 or 13 never uses depths past 7 or 13, but with a
shorter block the positions it does draft no longer see the ones cut (the drafter's attention is
bidirectional within a block), so the acceptance can move either way. This measures it.
For every pair, prompt set and draft block it decodes the prompts greedily with DFLASH (the chain
of the block) and DDTREE at each budget (chain-inclusive from budget >= block - 1, tree temperature
``--tree-temperature``), checks every output is identical to AR's, and prints SGLang's
``completion_tokens / spec_verify_ct`` pooled over the prompts. ``--json`` writes the per-prompt
counts. The figures are a property of the pairs, not of the hardware.
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.acceptance import check_pairs_budgets_lengths, reference_main
from benchmarks.chain_inclusive import result_row, tau_of
from sglang_spec.reference.tiny_pair import FIXTURES, PROMPT_SETS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", default="hybrid,qwen3", help="comma-separated: hybrid, qwen3")
    p.add_argument("--prompt-sets", default="heldout,othercode", help=", ".join(PROMPT_SETS))
    p.add_argument("--blocks", type=int, nargs="+", default=[16, 8], help="draft blocks")
    p.add_argument("--budgets", type=int, nargs="+", default=[7, 13, 15])
    p.add_argument("--tree-temperature", type=float, default=0.75)
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--fixtures", default=str(FIXTURES))
    p.add_argument("--json", help="also write the settings and per-prompt counts to this file")


def check_args(args) -> None:
    """One-line errors for bad settings, before any model loads."""
    from sglang_spec.tree import check_tree_temperature

    check_pairs_budgets_lengths(args)
    for s in args.prompt_sets.split(","):
        if s not in PROMPT_SETS:
            raise ValueError(f"--prompt-sets: {s!r} is not one of {list(PROMPT_SETS)}")
    if min(args.blocks) < 2:
        raise ValueError(f"--blocks must be >= 2 (a root and one draft); got {args.blocks}")
    check_tree_temperature(args.tree_temperature)


def decode(loaded, inputs, args, method, budget=1, block=None) -> list:
    """Greedy ``method`` on every prompt of ``inputs`` with ``loaded = (target, drafter, stops)``,
    drafting blocks of ``block`` (None: the drafter's own)."""
    from sglang_spec.reference import generate

    target, drafter, stops = loaded
    return [
        generate(
            target,
            drafter,
            ids,
            method,
            budget=budget,
            tree_temperature=args.tree_temperature,
            max_new_tokens=args.max_new_tokens,
            stop_token_ids=stops,
            draft_block=block,
        )
        for ids in inputs
    ]


def measure(args) -> list[dict]:
    import torch

    from sglang_spec.reference import tiny_pair

    torch.set_num_threads(1)
    rows = []
    for pair in args.pairs.split(","):
        tokenizer, target, drafter = tiny_pair.load_pair(pair, args.fixtures)
        if max(args.blocks) > drafter.block_size:
            raise ValueError(
                f"--blocks: {max(args.blocks)} is longer than the {pair} drafter's block "
                f"{drafter.block_size}"
            )
        stops = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        for prompt_set in args.prompt_sets.split(","):
            prompts = tiny_pair.heldout_prompts(
                args.num_prompts, args.fixtures, prompt_set=prompt_set
            )
            inputs = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]

            loaded = (target, drafter, stops)
            ar = [r.tokens for r in decode(loaded, inputs, args, "ar")]
            for block in args.blocks:
                for method, budget in [("dflash", 0)] + [("ddtree", b) for b in args.budgets]:
                    t0 = time.perf_counter()
                    results = decode(loaded, inputs, args, method, budget or 1, block)
                    row = result_row(
                        results,
                        ar,
                        time.perf_counter() - t0,
                        pair=pair,
                        prompt_set=prompt_set,
                        block=block,
                        method=method,
                        budget=budget,
                    )
                    rows.append(row)
                    name = method if method == "dflash" else f"ddtree({budget})"
                    print(
                        f"{pair} {prompt_set} block {block} {name}: {tau_of(row):.3f} tokens/step",
                        file=sys.stderr,
                        flush=True,
                    )
    return rows


def print_table(rows: list[dict], args) -> None:
    print(
        f"# Tokens per verify step by draft block (SGLang's completion_tokens / spec_verify_ct, "
        f"pooled), reference engine, greedy, {args.num_prompts} prompts per set, up to "
        f"{args.max_new_tokens} new tokens, tree T = {args.tree_temperature:g} "
        f"(python -m benchmarks.draft_block)\n"
    )
    cols = ["DFLASH"] + [f"B={b}" for b in args.budgets]
    print("| pair | prompts | draft block | " + " | ".join(cols) + " | identical to AR |")
    print("|---|---|---|" + "---|" * len(cols) + "---|")
    full = max(args.blocks)
    for pair in args.pairs.split(","):
        for prompt_set in args.prompt_sets.split(","):
            here = [r for r in rows if r["pair"] == pair and r["prompt_set"] == prompt_set]
            by = {(r["block"], r["budget"]): r for r in here}
            for block in args.blocks:
                cells = []
                for budget in [0, *args.budgets]:
                    tau = tau_of(by[block, budget])
                    ratio = tau / tau_of(by[full, budget])
                    cells.append(f"{tau:.3f}" + ("" if block == full else f" ({ratio:.2f}x)"))
                mine = [r for r in here if r["block"] == block]
                same = sum(sum(r["identical_to_ar"]) for r in mine)
                total = sum(len(r["identical_to_ar"]) for r in mine)
                print(
                    f"| {pair} | {prompt_set} | {block} | "
                    + " | ".join(cells)
                    + f" | {same}/{total} |"
                )
    print(f"\n(x): against draft block {full} in the same column.")


def main(argv=None) -> int:
    return reference_main(
        argv,
        "python -m benchmarks.draft_block",
        __doc__,
        add_arguments,
        check_args,
        measure,
        print_table,
    )


if __name__ == "__main__":
    sys.exit(main())
