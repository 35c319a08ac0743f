"""Do a server's T > 0 samples stay in the target's distribution? (offline, CPU, on ``e2e/tiny_pair.py`` output)

For every server in an ``e2e.json`` it scores each sampled completion under the target itself
(float32, same temperature): the mean per-token log-probability of a sample is an unbiased estimate
of the negative entropy rate, so samples drawn exactly from the target at that temperature have the
same expectation whatever the decoding algorithm. A lossy verifier shows up as a shift (toward
greedy: higher log-probability; toward the draft: lower). Prints a table with Welch's t against the
AR server's samples, and, when the run recorded ``--dist-samples``, a chi-square test of each
server's 2nd-token distribution against AR's::

    python -m e2e.sampling_check benchmarks/results/e2e_h200/hybrid_eager.json.xz \
        --target sglang_spec/fixtures/tiny-pair/hybrid --prompts sglang_spec/fixtures/tiny-pair/heldout_prompts.jsonl
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections import Counter

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from e2e.tiny_pair import load_prompts, load_runs


def sample_logprob(model, prompt_ids: list[int], out_ids: list[int], temperature: float) -> float:
    ids = torch.tensor([prompt_ids + out_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float() / temperature
    lp = logits.log_softmax(-1).gather(-1, torch.tensor(out_ids)[:, None]).squeeze(-1)
    return float(lp.mean())


def is_ar(label: str) -> bool:
    return label.split("+")[0] == "ar"


def _pair_test(servers, model, prompt_ids: list[int], temperature: float) -> None:
    """Chi-square tests of each server's 2nd-token distribution given the most common 1st token: against
    the AR server's samples (same bf16 server stack) and against the target's exact float32
    distribution at that temperature (goodness of fit).

    Uses the ``dist_pairs`` that ``e2e/tiny_pair.py --dist-samples N`` records (2-token samples of one
    prompt with distinct seeds); the 2nd token of a speculative server comes out of a tree verify.
    Without an AR server in the run only the test against the exact distribution is made.
    """
    from scipy.stats import chi2_contingency, chisquare

    pairs = {s["label"]: s["dist_pairs"] for s in servers if s.get("ok") and s.get("dist_pairs")}
    if not pairs:
        return
    ar_label = next((label for label in pairs if is_ar(label)), None)
    # the 1st token to condition on: AR's most common, else all servers' (a choice made from 1st
    # tokens only, so the 2nd tokens that follow it still come from the conditional law under test)
    source = pairs[ar_label] if ar_label else [p for ps in pairs.values() for p in ps]
    first = Counter(p[0] for p in source).most_common(1)[0][0]
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + [first]])).logits[0, -1].float() / temperature
    exact = logits.softmax(-1).tolist()
    ar2 = Counter(p[1] for p in pairs[ar_label] if p[0] == first) if ar_label else None
    print(
        f"| server | samples with 1st token {first} | chi-square p vs AR's samples | "
        f"chi-square p vs the exact target distribution (T={temperature}) |"
    )
    print("|---|---|---|---|")
    for label, ps in pairs.items():
        other = Counter(p[1] for p in ps if p[0] == first)
        n = sum(other.values())
        vs_ar = "-"
        if ar2 is not None and label != ar_label:
            keys = sorted(set(ar2) | set(other))
            common = [
                k for k in keys if ar2[k] + other[k] >= 10
            ]  # pool rare tokens: expected counts >= 5
            rows = [
                [ar2[k] for k in common] + [sum(ar2[k] for k in keys if k not in common)],
                [other[k] for k in common] + [sum(other[k] for k in keys if k not in common)],
            ]
            if rows[0][-1] + rows[1][-1] == 0:
                rows = [r[:-1] for r in rows]
            vs_ar = f"{chi2_contingency(rows).pvalue:.3g}"
        big = [k for k, p in enumerate(exact) if n * p >= 5]  # the rest pooled into one bin
        obs = [other[k] for k in big] + [n - sum(other[k] for k in big)]
        exp = [n * exact[k] for k in big] + [n * (1 - sum(exact[k] for k in big))]
        if exp[-1] < 5:  # merge a too-small pooled bin into the last kept one
            obs, exp = obs[:-2] + [obs[-2] + obs[-1]], exp[:-2] + [exp[-2] + exp[-1]]
        gof = chisquare(obs, [e * n / sum(exp) for e in exp]).pvalue
        print(f"| {label} | {n} | {vs_ar} | {gof:.3g} ({len(obs)} bins) |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("e2e_json")
    ap.add_argument("--target", required=True)
    ap.add_argument("--prompts", required=True, help="the JSONL the e2e run used")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument(
        "--dist-temperature", type=float, default=1.0, help="gpu_e2e.py's --dist-temperature"
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.target)
    model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    prompts = load_prompts(args.prompts, args.num_prompts)
    prompt_ids = [tok(p).input_ids for p in prompts]
    scores = {}
    for server in load_runs(args.e2e_json):
        if not server.get("ok"):
            continue
        scores[server["label"]] = [
            sample_logprob(model, prompt_ids[i % len(prompts)], s["output_ids"], args.temperature)
            for i, s in enumerate(server["sampled"])
        ]
    _pair_test(load_runs(args.e2e_json), model, prompt_ids[0], args.dist_temperature)
    ar = next((xs for label, xs in scores.items() if is_ar(label)), None)
    print(
        f"| server | samples | mean log p per token (T={args.temperature}) | std err | Welch t vs AR |"
    )
    print("|---|---|---|---|---|")
    for label, xs in scores.items():
        m, se = statistics.mean(xs), statistics.stdev(xs) / math.sqrt(len(xs))
        t = "-"
        if ar is not None and not is_ar(label):
            se_ar = statistics.stdev(ar) / math.sqrt(len(ar))
            t = f"{(m - statistics.mean(ar)) / math.sqrt(se**2 + se_ar**2):+.2f}"
        print(f"| {label} | {len(xs)} | {m:.3f} | {se:.3f} | {t} |")


if __name__ == "__main__":
    main()
