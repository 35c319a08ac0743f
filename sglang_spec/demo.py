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
import sys
import time
from pathlib import Path

from sglang_spec.reference.tiny_pair import FIXTURES, PAIRS, heldout_prompts, load_pair


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pair", choices=sorted(PAIRS), default="hybrid", help="which bundled target/drafter pair"
    )
    p.add_argument("--fixtures", type=Path, default=FIXTURES, help="directory of the tiny pairs")
    p.add_argument(
        "--prompt",
        action="append",
        help="a prompt of your own (repeatable); default: held-out prompts",
    )
    p.add_argument(
        "--num-prompts",
        type=int,
        default=3,
        help="held-out prompts to run when no --prompt is given",
    )
    p.add_argument(
        "--methods", default="ar,dflash,ddtree", help="comma-separated subset of ar,dflash,ddtree"
    )
    p.add_argument(
        "--budget",
        type=int,
        default=64,
        help="DDTREE draft nodes per step (verify width = budget + 1)",
    )
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (tiny models run best on 1)"
    )


def run(args) -> int:
    import torch

    from sglang_spec.reference import METHODS, generate

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise SystemExit(f"--methods: unknown {bad or methods}; valid: {', '.join(METHODS)}")
    if args.budget < 1:
        raise SystemExit(f"--budget must be >= 1; got {args.budget}")
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
    p = argparse.ArgumentParser(prog="sglang-spec demo", description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
