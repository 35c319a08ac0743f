"""``sglang-spec demo``: AR vs DFLASH vs DDTREE with the reference engine on the bundled tiny pair (CPU).

Loads the trained tiny target + DFlash drafter shipped in ``sglang_spec/fixtures/tiny-pair`` (the
Qwen3.5 GDN hybrid by default), decodes a few held-out prompts (function signatures + docstrings
from standard-library modules the pair never saw) with each method, and prints tokens per target
forward, wall time, speed-up over AR and whether the output is identical to AR's.

On a CPU the wall-time speed-up of speculative decoding is small or below 1: verifying a tree of 65
tokens costs a tiny model far more than one token does. Tokens per step is the figure that carries
over to a GPU server; the identical-to-AR column is the losslessness check.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from sglang_spec.cli_args import (
    Parser,
    csv_choices,
    existing_dir,
    int_range,
    nonempty,
    nonneg_float,
    positive_float,
    positive_int,
    probability,
    usage_error,
)
from sglang_spec.plugin import MAX_VERIFY_WIDTH
from sglang_spec.reference import METHODS
from sglang_spec.reference.tiny_pair import FIXTURES, PAIRS, heldout_prompts, load_pair
from sglang_spec.tree import DEFAULT_TREE_TEMPERATURE

PROG = "sglang-spec demo"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pair", choices=sorted(PAIRS), default="hybrid", help="which bundled target/drafter pair"
    )
    p.add_argument(
        "--fixtures", type=existing_dir, default=FIXTURES, help="directory of the tiny pairs"
    )
    p.add_argument(
        "--prompt",
        action="append",
        type=nonempty,
        help="a prompt of your own (repeatable); default: held-out prompts",
    )
    p.add_argument(
        "--num-prompts",
        type=positive_int,
        default=3,
        help="held-out prompts to run when no --prompt is given",
    )
    p.add_argument(
        "--methods",
        type=csv_choices(METHODS),
        default=",".join(METHODS),
        help="comma-separated subset of " + ",".join(METHODS),
    )
    p.add_argument(
        "--budget",
        type=int_range(1, MAX_VERIFY_WIDTH - 1),
        default=64,
        help="DDTREE draft nodes per step (verify width = budget + 1)",
    )
    p.add_argument(
        "--tree-temperature",
        type=positive_float,
        default=DEFAULT_TREE_TEMPERATURE,
        help="DDTREE ranks its tree by the drafter's distribution at this temperature (the "
        "server's SGLANG_DDTREE_TREE_TEMPERATURE default; lossless at any value)",
    )
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=64,
        help="tokens to generate per prompt (at most the target's context length)",
    )
    p.add_argument(
        "--temperature", type=nonneg_float, default=0.0, help="sampling temperature (0 = greedy)"
    )
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass")
    p.add_argument("--top-k", type=int_range(), default=-1, help="top-k sampling (<= 0: off)")
    p.add_argument(
        "--seed", type=int_range(0, 2**32 - 1), default=0, help="sampling seed of prompt 1"
    )
    p.add_argument(
        "--threads",
        type=int_range(1, os.cpu_count() or 1),
        default=1,
        help="torch CPU threads (tiny models run best on 1)",
    )


def check_fixtures(args) -> int:
    """0 if the pair is in ``--fixtures`` and the requests fit it, else the one-line error's 2."""
    target_dir = Path(args.fixtures) / PAIRS[args.pair][0]
    missing = [
        n for n in PAIRS[args.pair] if not (Path(args.fixtures) / n / "config.json").is_file()
    ]
    if missing:
        return usage_error(
            PROG, "--fixtures", args.fixtures, f"a directory holding {', '.join(PAIRS[args.pair])}/"
        )
    context = json.loads((target_dir / "config.json").read_text()).get("max_position_embeddings")
    if context and args.max_new_tokens >= context:
        return usage_error(
            PROG,
            "--max-new-tokens",
            args.max_new_tokens,
            f"1 to {context - 1} (the {args.pair} target's context)",
        )
    if not args.prompt:
        available = len(heldout_prompts(None, args.fixtures))
        if args.num_prompts > available:
            return usage_error(
                PROG, "--num-prompts", args.num_prompts, f"1 to {available} (held-out prompts)"
            )
    return 0


def run(args) -> int:
    if check_fixtures(args):
        return 2
    import torch

    from sglang_spec.reference import generate

    methods = args.methods
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer, target, drafter = load_pair(args.pair, args.fixtures)
    prompts = args.prompt or heldout_prompts(args.num_prompts, args.fixtures)
    print(
        f"loaded the {args.pair} pair from {args.fixtures} in {time.perf_counter() - t0:.1f}s "
        f"(drafter block {drafter.block_size}); {len(prompts)} prompt(s), {args.max_new_tokens} new tokens, "
        f"T={args.temperature}",
        flush=True,
    )
    stops = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    totals = {m: {"results": [], "seconds": 0.0, "same": 0} for m in methods}
    reference: dict[int, list[int]] = {}
    outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
    for i, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        for m in methods:
            start = time.perf_counter()
            res = generate(
                target,
                drafter,
                ids,
                m,
                budget=args.budget,
                tree_temperature=args.tree_temperature,
                max_new_tokens=args.max_new_tokens,
                temperature=args.temperature,
                top_p=args.top_p,
                top_k=args.top_k,
                seed=args.seed + i,
                stop_token_ids=stops,
            )
            secs = time.perf_counter() - start
            t = totals[m]
            t["results"].append(res)
            t["seconds"] += secs
            if m == "ar":
                reference[i] = res.tokens
            t["same"] += reference.get(i) == res.tokens
            outputs[m].append(res.tokens)
            print(
                f"[{i + 1}/{len(prompts)}] {m:>6}: {len(res.tokens)} tokens, {res.tokens_per_step:.2f} tokens/step, "
                f"{secs:.1f}s",
                flush=True,
            )
    _report(methods, totals, reference, len(prompts), args)
    first = methods[-1]
    print(
        f"\nprompt 1:\n{prompts[0]}\n--- {first} continuation:\n{tokenizer.decode(outputs[first][0])}"
    )
    return 0


def _report(methods, totals, reference, n, args) -> None:
    from sglang_spec.reference import tokens_per_step  # SGLang's completion_tokens / spec_verify_ct

    ar_secs = totals["ar"]["seconds"] if "ar" in totals else None
    print("\n| method | tokens/step | wall s | speed-up vs AR | identical to AR |")
    print("|---|---|---|---|---|")
    for m in methods:
        t = totals[m]
        label = f"ddtree (budget {args.budget})" if m == "ddtree" else m
        speed = f"{ar_secs / t['seconds']:.2f}x" if ar_secs else "-"
        if not reference:
            same = "- (AR not run)"
        elif args.temperature > 0 and m != "ar":
            same = "n/a (sampled: equal in distribution)"
        else:
            same = "yes" if t["same"] == n else f"NO ({t['same']}/{n})"
        print(
            f"| {label} | {tokens_per_step(t['results']):.2f} | {t['seconds']:.1f} | {speed} | {same} |"
        )


def main(argv=None) -> int:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
