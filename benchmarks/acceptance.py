"""``python -m benchmarks.acceptance``: tokens per verify step of DFLASH and DDTREE (reference engine).

Greedy decoding of held-out prompts (function signatures + docstrings from standard-library modules
the tiny pairs never saw) with the bundled trained pairs, on the CPU. For every pair and method it
prints SGLang's acceptance length ``completion_tokens / spec_verify_ct`` pooled over the prompts
(``sglang_spec.reference.tokens_per_step``: every returned token, the prefill's first one and an EOS
included, nothing past ``--max-new-tokens``, over the verify steps; AR = 1), SGLang's
``spec_num_correct_drafts / spec_verify_ct`` (accepted drafts per step, counted whole on a last step
cut short), and checks every output is identical to AR's. Generation stops at the tokenizer's EOS,
as an SGLang request without ``ignore_eos`` does. The figures are a property of the pair, not of the
hardware. ``--json PATH`` also writes the rows.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

from sglang_spec.reference.tiny_pair import FIXTURES


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pairs", default="hybrid,qwen3")
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128])
    p.add_argument(
        "--tree-temperatures",
        type=float,
        nargs="+",
        default=[1.0],
        help="DDTREE tree temperatures to try (sglang_spec.tree.draft_topk; 1 = the drafter's own)",
    )
    p.add_argument("--num-prompts", type=int, default=12)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--fixtures", default=str(FIXTURES))
    p.add_argument("--json", help="also write the rows to this JSON file")


def run(args) -> int:
    import torch

    from sglang_spec.reference import generate, tiny_pair, tokens_per_step

    torch.set_num_threads(1)
    rows = []
    for pair in args.pairs.split(","):
        tokenizer, target, drafter = tiny_pair.load_pair(pair, args.fixtures)
        prompts = tiny_pair.heldout_prompts(args.num_prompts, args.fixtures)
        stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        runs = [("ar", 0, 1.0), ("dflash", 0, 1.0)] + [
            ("ddtree", b, tau) for tau in args.tree_temperatures for b in args.budgets
        ]
        ar_tokens = []
        for method, budget, tau in runs:
            t0 = time.perf_counter()
            results = [
                generate(
                    target,
                    drafter,
                    tokenizer(prompt, return_tensors="pt").input_ids,
                    method,
                    budget=budget,
                    tree_temperature=tau,
                    max_new_tokens=args.max_new_tokens,
                    stop_token_ids=stops,
                )
                for prompt in prompts
            ]
            if method == "ar":
                ar_tokens = [r.tokens for r in results]
            steps = sum(len(r.steps) for r in results)
            label = method
            if method == "ddtree":
                label = f"ddtree({budget})" if tau == 1.0 else f"ddtree({budget}, tree T={tau:g})"
            row = {
                "pair": pair,
                "method": label,
                "completion_tokens": sum(len(r.tokens) for r in results),
                "verify_steps": None if method == "ar" else steps,
                "tokens_per_step": tokens_per_step(results),
                "correct_drafts_per_step": None
                if method == "ar"
                else sum(s.accepted for r in results for s in r.steps) / steps,
                "identical_to_ar": sum(r.tokens == a for r, a in zip(results, ar_tokens)),
                "prompts": len(prompts),
                "seconds": time.perf_counter() - t0,
            }
            rows.append(row)
            print(
                f"{pair} {label}: {row['tokens_per_step']:.3f} tokens/step, identical "
                f"{row['identical_to_ar']}/{len(prompts)}, {row['seconds']:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    _print_table(rows, args)
    if args.json:
        write_json(args, rows)
    return 0


def check_pairs_budgets_lengths(args) -> None:
    """The settings every reference-engine benchmark shares, as one-line errors before any model
    loads: known ``--pairs``, ``--budgets`` >= 1, ``--num-prompts`` and ``--max-new-tokens`` >= 1."""
    from sglang_spec.reference.tiny_pair import PAIRS

    for pair in args.pairs.split(","):
        if pair not in PAIRS:
            raise ValueError(f"--pairs: {pair!r} is not one of {sorted(PAIRS)}")
    for b in args.budgets:
        if b < 1:
            raise ValueError(f"--budgets must be >= 1; got {b}")
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        raise ValueError(
            f"--num-prompts and --max-new-tokens must be >= 1; got {args.num_prompts}, "
            f"{args.max_new_tokens}"
        )


def reference_main(argv, prog, doc, add_arguments, check_args, measure, report) -> int:
    """The CLI of a reference-engine benchmark: parse (``add_arguments``), one-line errors for
    bad settings before any model loads (``check_args`` raises ValueError), ``measure(args)``
    with the engine's warnings silenced, ``report(rows, args)``, and ``--json``."""
    from sglang_spec.cli_args import Parser

    p = Parser(prog=prog, description=doc.splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        check_args(args)
    except ValueError as e:
        p.error(str(e))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rows = measure(args)
    report(rows, args)
    if args.json:
        write_json(args, rows)
    return 0


def write_json(args, rows) -> None:
    """``{"settings": the arguments, "rows": rows}`` to ``args.json`` (the fixtures directory
    relative: no machine paths in committed results)."""
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    settings["fixtures"] = os.path.relpath(args.fixtures)
    with open(args.json, "w") as f:
        json.dump({"settings": settings, "rows": rows}, f, indent=1)


def _print_table(rows, args) -> None:
    dflash = {r["pair"]: r["tokens_per_step"] for r in rows if r["method"] == "dflash"}
    print(
        f"# Tokens per verify step, reference engine, greedy, {args.num_prompts} held-out prompts, "
        f"up to {args.max_new_tokens} new tokens, stop at EOS (python -m benchmarks.acceptance)"
    )
    print(
        "| pair | method | completion tokens | verify steps | tokens/step | correct drafts/step "
        "| vs DFLASH | identical to AR |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        steps = "-" if r["verify_steps"] is None else r["verify_steps"]
        drafts = r["correct_drafts_per_step"]
        drafts = "-" if drafts is None else f"{drafts:.3f}"
        ratio = r["tokens_per_step"] / dflash[r["pair"]] if r["pair"] in dflash else float("nan")
        print(
            f"| {r['pair']} | {r['method']} | {r['completion_tokens']} | {steps} "
            f"| {r['tokens_per_step']:.3f} | {drafts} | {ratio:.2f}x "
            f"| {r['identical_to_ar']}/{r['prompts']} |"
        )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.acceptance", description=__doc__.splitlines()[0]
    )
    add_arguments(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
