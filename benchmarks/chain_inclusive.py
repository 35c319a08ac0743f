"""``python -m benchmarks.chain_inclusive``: tokens per verify step of chain-inclusive DDTrees (CPU).

Issue 15, items 3 and 4 on the tiny pairs, in the exact reference engine: for DFLASH and for DDTREE at
every budget, with the drafter's greedy chain in the tree or not (``include_chain``,
``sglang_spec.tree.build_ddtree``) and at every tree temperature, greedy decoding of the held-out
prompts (``tiny_pair.heldout_prompts``, spread over the held-out modules) of both bundled pairs.

A step's figure is SGLang's ``completion_tokens / spec_verify_ct``: every token the request returns
(the prefill's first one included, nothing past ``--max-new-tokens``, an EOS ends the request and
counts) over its verify steps; the table pools it over the prompts (sum over sum) and also counts
the prompts on which DDTREE at the largest budget makes at least DFLASH's figure. Every output is
checked to be identical to AR's (all methods are lossless). ``--json`` writes the per-prompt counts.
The figures are a property of the pairs, not of the hardware.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import time
from unittest import mock

from benchmarks.acceptance import check_pairs_budgets_lengths, reference_main
from sglang_spec.reference.tiny_pair import FIXTURES, PROMPT_SETS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", default="hybrid,qwen3", help="comma-separated: hybrid, qwen3")
    p.add_argument("--budgets", type=int, nargs="+", default=[15, 31, 63])
    p.add_argument("--tree-temperatures", type=float, nargs="+", default=[1.0, 0.75, 0.5])
    p.add_argument(
        "--chain",
        choices=["both", "on", "off"],
        default="both",
        help="DDTREE rows with the drafter's chain in the tree, without it, or both",
    )
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument(
        "--prompt-set",
        choices=PROMPT_SETS,
        default="heldout",
        help="held-out stdlib modules, or click (a code base the pairs never saw)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--fixtures", default=str(FIXTURES))
    p.add_argument("--json", help="also write the settings and per-prompt counts to this file")


def check_args(args) -> None:
    """One-line errors for bad settings, before any model loads."""
    from sglang_spec.tree import check_tree_temperature

    check_pairs_budgets_lengths(args)
    for t in args.tree_temperatures:
        check_tree_temperature(t)


@contextlib.contextmanager
def tree_builder(include_chain: bool):
    """The reference engine builds with ``build_ddtree``'s default (the chain on) and has no
    ``include_chain`` argument: for the rows without the chain, swap the function it calls."""
    from sglang_spec.reference import engine
    from sglang_spec.tree import build_ddtree

    with mock.patch.object(
        engine, "build_ddtree", functools.partial(build_ddtree, include_chain=include_chain)
    ):
        yield


def chain_settings(args) -> tuple[bool, ...]:
    return {"both": (True, False), "on": (True,), "off": (False,)}[args.chain]


def runs(args) -> list[dict]:
    """AR, DFLASH, then DDTREE for every (tree temperature, chain, budget)."""
    out = [dict(method="ar"), dict(method="dflash")]
    for tau in args.tree_temperatures:
        for chain in chain_settings(args):
            for b in args.budgets:
                out.append(dict(method="ddtree", budget=b, tree_temperature=tau, chain=chain))
    return out


def measure(args) -> list[dict]:
    import torch

    from sglang_spec.reference import generate, tiny_pair

    torch.set_num_threads(1)
    rows = []
    for pair in args.pairs.split(","):
        tokenizer, target, drafter = tiny_pair.load_pair(pair, args.fixtures)
        prompts = tiny_pair.heldout_prompts(
            args.num_prompts, args.fixtures, prompt_set=args.prompt_set
        )
        stops = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        inputs = [tokenizer(p, return_tensors="pt").input_ids for p in prompts]
        ar_tokens = None
        for run in runs(args):
            t0 = time.perf_counter()
            with tree_builder(run.get("chain", True)):
                results = [
                    generate(
                        target,
                        drafter,
                        ids,
                        run["method"],
                        budget=run.get("budget", 1),
                        tree_temperature=run.get("tree_temperature", 1.0),
                        max_new_tokens=args.max_new_tokens,
                        stop_token_ids=stops,
                    )
                    for ids in inputs
                ]
            if run["method"] == "ar":
                ar_tokens = [r.tokens for r in results]
            row = result_row(results, ar_tokens, time.perf_counter() - t0, pair=pair, **run)
            rows.append(row)
            print(f"{label(row)}: {tau_of(row):.3f} tokens/step", file=sys.stderr, flush=True)
    return rows


def result_row(results: list, ar_tokens: list, seconds: float, **fields) -> dict:
    """One run's record: ``fields`` and, per prompt, the tokens, verify steps and whether they
    equal AR's (what :func:`tau_of` reads)."""
    return dict(
        **fields,
        completion_tokens=[len(r.tokens) for r in results],
        verify_steps=[len(r.steps) for r in results],
        identical_to_ar=[r.tokens == a for r, a in zip(results, ar_tokens)],
        seconds=seconds,
    )


def tau_of(row: dict, prompt: int | None = None) -> float:
    """SGLang's completion_tokens / spec_verify_ct, pooled over the prompts or for one prompt."""
    if prompt is not None:
        return row["completion_tokens"][prompt] / max(1, row["verify_steps"][prompt])
    return sum(row["completion_tokens"]) / max(1, sum(row["verify_steps"]))


def label(row: dict) -> str:
    if row["method"] != "ddtree":
        return f"{row['pair']} {row['method']}"
    chain = "chain" if row["chain"] else "no chain"
    return f"{row['pair']} ddtree({row['budget']}, T={row['tree_temperature']:g}, {chain})"


def print_tables(rows: list[dict], args) -> None:
    top = max(args.budgets)
    print(
        f"# Tokens per verify step (SGLang's completion_tokens / spec_verify_ct, pooled), reference "
        f"engine, greedy, {args.num_prompts} prompts ({args.prompt_set}), up to "
        f"{args.max_new_tokens} new "
        f"tokens, stop at EOS (python -m benchmarks.chain_inclusive)\n"
    )
    cols = [f"B={b}" for b in args.budgets]
    print(
        "| pair | tree T | chain | "
        + " | ".join(cols)
        + f" | DFLASH | B={top} / DFLASH | prompts with τ(B={top}) ≥ τ_DFLASH | identical to AR |"
    )
    print("|---|---|---|" + "---|" * len(cols) + "---|---|---|---|")
    for pair in args.pairs.split(","):
        mine = [r for r in rows if r["pair"] == pair]
        dflash = next(r for r in mine if r["method"] == "dflash")
        n = len(dflash["verify_steps"])
        for tau in args.tree_temperatures:
            for chain in chain_settings(args):
                cells = {
                    r["budget"]: r
                    for r in mine
                    if r["method"] == "ddtree"
                    and r["tree_temperature"] == tau
                    and r["chain"] == chain
                }
                wins = sum(tau_of(cells[top], i) >= tau_of(dflash, i) for i in range(n))
                same = sum(sum(r["identical_to_ar"]) for r in [dflash, *cells.values()])
                print(
                    f"| {pair} | {tau:g} | {'on' if chain else 'off'} | "
                    + " | ".join(f"{tau_of(cells[b]):.3f}" for b in args.budgets)
                    + f" | {tau_of(dflash):.3f} | {tau_of(cells[top]) / tau_of(dflash):.2f}x "
                    + f"| {wins}/{n} | {same}/{n * (1 + len(cells))} |"
                )
    print(f"\n## Per prompt: τ_DFLASH and τ_DDTREE(B={top}) (tree T, chain)\n")
    keys = [(t, c) for t in args.tree_temperatures for c in chain_settings(args)]
    print(
        "| pair | prompt | DFLASH | "
        + " | ".join(f"T={t:g} {'chain' if c else 'no chain'}" for t, c in keys)
        + " |"
    )
    print("|---|---|---|" + "---|" * len(keys))
    for pair in args.pairs.split(","):
        mine = [r for r in rows if r["pair"] == pair]
        dflash = next(r for r in mine if r["method"] == "dflash")
        for i in range(len(dflash["verify_steps"])):
            cells = []
            for t, c in keys:
                r = next(
                    r
                    for r in mine
                    if r["method"] == "ddtree"
                    and r["budget"] == top
                    and r["tree_temperature"] == t
                    and r["chain"] == c
                )
                mark = "" if tau_of(r, i) >= tau_of(dflash, i) else " (<)"
                cells.append(f"{tau_of(r, i):.2f}{mark}")
            print(f"| {pair} | {i} | {tau_of(dflash, i):.2f} | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    return reference_main(
        argv,
        "python -m benchmarks.chain_inclusive",
        __doc__,
        add_arguments,
        check_args,
        measure,
        print_tables,
    )


if __name__ == "__main__":
    sys.exit(main())
