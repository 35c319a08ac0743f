"""``python -m benchmarks.acceptance``: tokens per target forward of DFLASH and DDTREE (reference engine).

Greedy decoding of held-out prompts (function signatures + docstrings from standard-library modules
the tiny pairs never saw) with the bundled trained pairs, on the CPU. For every pair and method it
prints the mean tokens committed per verify step (accepted drafts + the bonus token, i.e. SGLang's
``completion_tokens / spec_verify_ct``), the mean accepted drafts, and checks every output is
identical to AR's. The figures are a property of the pair, not of the hardware.
"""

from __future__ import annotations

import argparse
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


def run(args) -> int:
    import torch

    from sglang_spec.reference import generate, tiny_pair

    torch.set_num_threads(1)
    rows = []
    for pair in args.pairs.split(","):
        tokenizer, target, drafter = tiny_pair.load_pair(pair, args.fixtures)
        prompts = tiny_pair.heldout_prompts(args.num_prompts, args.fixtures)
        runs = [("ar", 0, 1.0), ("dflash", 0, 1.0)] + [
            ("ddtree", b, tau) for tau in args.tree_temperatures for b in args.budgets
        ]
        ar_tokens = []
        for method, budget, tau in runs:
            t0 = time.perf_counter()
            emitted = steps = accepted = 0
            same = 0
            for i, prompt in enumerate(prompts):
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                res = generate(
                    target,
                    drafter,
                    ids,
                    method,
                    budget=budget,
                    tree_temperature=tau,
                    max_new_tokens=args.max_new_tokens,
                )
                emitted += sum(s.emitted for s in res.steps)
                steps += len(res.steps)
                accepted += sum(s.accepted for s in res.steps)
                if method == "ar":
                    ar_tokens.append(res.tokens)
                same += res.tokens == ar_tokens[i]
            label = method
            if method == "ddtree":
                label = f"ddtree({budget})" if tau == 1.0 else f"ddtree({budget}, tree T={tau:g})"
            row = (
                pair,
                label,
                emitted / steps,
                accepted / steps,
                f"{same}/{len(prompts)}",
                time.perf_counter() - t0,
            )
            rows.append(row)
            print(
                f"{pair} {label}: {row[2]:.3f} tokens/step, identical {row[4]}, {row[5]:.0f}s",
                file=sys.stderr,
                flush=True,
            )
    dflash = {r[0]: r[2] for r in rows if r[1] == "dflash"}
    print(
        f"# Tokens per verify step, reference engine, greedy, {args.num_prompts} held-out prompts x "
        f"{args.max_new_tokens} new tokens (python -m benchmarks.acceptance)"
    )
    print("| pair | method | tokens/step | accepted drafts/step | vs DFLASH | identical to AR |")
    print("|---|---|---|---|---|---|")
    for pair, label, tps, acc, same, _ in rows:
        print(f"| {pair} | {label} | {tps:.3f} | {acc:.3f} | {tps / dflash[pair]:.2f}x | {same} |")
    return 0


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
