"""``python -m benchmarks.adaptive_budget``: budget by batch size, projected (CPU, no model runs).

What is measured and what is projected:

* measured on the H200 (``--scale``, the real-scale harness's records, ``e2e/scale.py``): ms per
  decode step of the server's shape by algorithm, DDTREE budget and concurrency C. The harness ran
  dummy weights (about one token per step), so these are step costs, not throughputs. Levels where C
  exceeded the server's ``max_running_requests`` ran in rounds and are left out (their ms per step
  is not the cost of one batch of C);
* measured in the reference engine (``--acceptance``, ``benchmarks/chain_inclusive.py``): the tiny
  pair's tokens per verify step tau for DFLASH and each DDTREE budget (chain-inclusive trees, one
  tree temperature);
* projected: the shape's tau per budget = the stated DFLASH tau (``--dflash-tau``, the deployment's
  figure) x the tiny pair's DDTREE(B) / DFLASH ratio; NEXTN's tau is stated (``--nextn-tau``), AR's
  is 1; tokens/s = C x tau / (ms per step). The adaptive row runs the real controller
  (``sglang_spec.plugin.budget.BudgetController``) over ``--steps`` decode steps at each C, fed each
  step's exact mean acceptance (no noise), and counts its exploration and probe steps.

The cost table the adaptive row uses is the one a server would load (``--write-config FILE`` writes
it in ``--speculative-adaptive-config``'s format). Prints a table and writes JSON (``--json``).
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_spec.plugin.budget import BudgetController, BudgetPolicy

BASELINES = ("AR", "NEXTN", "DFLASH")


def step_costs(
    records: list[dict],
    shape: str,
    one_batch: bool = True,
    field: str = "ms_per_step",
    variant: str = "",
) -> dict[tuple[str, int | None], dict[int, float]]:
    """(algorithm, budget) -> {C: ms per step} of ``shape``'s plain one-GPU runs (no simulated
    acceptance, no profiling variant, TP 1), only where all C requests ran in one batch, unless not
    ``one_batch``: then also the levels that ran in rounds (C above the server's
    max_running_requests), whose ms per step (wall time / steps of the longest request) is what
    serving C requests costs per step -- a baseline's served throughput, no budget's step cost.
    ``field`` "decode_ms_per_step" takes each step without the level's prefill, from the records
    whose level timed it (``e2e.records``); the others are left out. ``variant`` "fused-norms"
    takes the servers run with the kit's one-launch norms instead of the plain ones (never both:
    the torch norms' cost grows with a verify's tokens)."""
    costs: dict[tuple[str, int | None], dict[int, float]] = {}
    for r in records:
        if r["shape"] != shape or (r.get("variant") or "") != variant:
            continue
        if r.get("simulated_accept_len") is not None:
            continue
        if field not in r:
            continue
        if (r.get("tp") or 1) != 1:
            continue
        if one_batch and r["concurrency"] > r["max_running_requests"]:
            continue
        key = (r["algorithm"], r["budget"])
        costs.setdefault(key, {})[r["concurrency"]] = float(r[field])
    return costs


def cost_table(
    costs: dict[tuple[str, int | None], dict[int, float]],
) -> dict[str, dict[str, float]]:
    """The DDTREE rows as ``cost_ms`` of the budget config: {"C": {"budget": ms}}."""
    table: dict[int, dict[int, float]] = {}
    for (algo, budget), by_c in costs.items():
        if algo == "DDTREE":
            for c, ms in by_c.items():
                table.setdefault(c, {})[budget] = round(ms, 3)
    return {
        str(c): {str(b): ms for b, ms in sorted(row.items())} for c, row in sorted(table.items())
    }


def tiny_pair_tau(files: list[list[dict]], pair: str, tree_temperature: float) -> dict[str, float]:
    """Pooled tokens per verify step: "DFLASH" and "DDTREE<B>" (chain on, ``tree_temperature``),
    from the rows of one or more ``benchmarks.chain_inclusive`` runs (e.g. budgets 15/31/63 in one,
    3/7 in another). Their ratios are comparable only on the same prompts, so every run's DFLASH
    tau must be the same."""
    tau: dict[str, float] = {}
    for i, rows in enumerate(files):
        for r in rows:
            if r["pair"] != pair:
                continue
            if r["method"] == "dflash":
                name = "DFLASH"
            elif (
                r["method"] == "ddtree" and r["chain"] and r["tree_temperature"] == tree_temperature
            ):
                name = f"DDTREE{r['budget']}"
            else:
                continue
            value = sum(r["completion_tokens"]) / sum(r["verify_steps"])
            if name == "DFLASH" and name in tau and abs(tau[name] - value) > 1e-9:
                raise ValueError(
                    f"--acceptance file {i + 1} has DFLASH tau {value:.4f} for pair {pair!r}, an "
                    f"earlier file {tau[name]:.4f}: the runs used different prompts; valid: runs "
                    "of one prompt set"
                )
            tau[name] = value
    if "DFLASH" not in tau or len(tau) < 2:
        raise ValueError(
            f"--acceptance has no DFLASH and chain-inclusive DDTREE rows for pair {pair!r} at tree "
            f"temperature {tree_temperature}"
        )
    return tau


def simulate(policy: BudgetPolicy, horizon: int, tau: dict[int, float], c: int, steps: int):
    """The controller over ``steps`` decode steps of C requests: (tokens/s, budget it settles on,
    steps per budget)."""
    ctl = BudgetController(policy, horizon)
    tokens = ms = 0.0
    runs: dict[int, int] = {}
    for _ in range(steps):
        b = ctl.choose(c)
        runs[b] = runs.get(b, 0) + 1
        ms += policy.cost_ms[ctl.bucket_of(c)][b]
        tokens += c * tau[b]
        ctl.observe(b, [c * tau[m] for m in ctl.measured_by(b)], c)
    settled = ctl.choose(c)
    return tokens * 1000.0 / ms, settled, runs


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="benchmarks/results/scale_h200.json")
    ap.add_argument("--shape", default="qwen3.6-27b")
    ap.add_argument(
        "--acceptance",
        nargs="+",
        default=[
            "benchmarks/results/chain_inclusive.json",
            "benchmarks/results/chain_inclusive_small_budgets.json",
        ],
        help="benchmarks.chain_inclusive JSON files of one prompt set (their rows are pooled)",
    )
    ap.add_argument("--pair", default="hybrid")
    ap.add_argument("--tree-temperature", type=float, default=0.75)
    ap.add_argument("--horizon", type=int, default=15, help="the shape's drafter L (block - 1)")
    ap.add_argument("--dflash-tau", type=float, default=3.0)
    ap.add_argument("--nextn-tau", type=float, default=3.1)
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--json", help="write the settings and rows here")
    ap.add_argument("--write-config", help="write the DDTREE cost table as a budget config here")
    ap.add_argument(
        "--decode",
        action="store_true",
        help="cost each step without the level's prefill (decode_ms_per_step; only the records "
        "whose levels timed it)",
    )
    ap.add_argument(
        "--variant",
        choices=("", "fused-norms"),
        default="",
        help="the servers' e2e.scale variant: plain (the kit's torch norms) or fused-norms",
    )
    ap.add_argument(
        "--budgets",
        type=int,
        nargs="+",
        help="the candidates (default: every DDTREE budget the records have), e.g. 7 15 31",
    )
    args = ap.parse_args(argv)
    for name in ("dflash_tau", "nextn_tau"):
        if not getattr(args, name) > 0:
            ap.error(f"--{name.replace('_', '-')}={getattr(args, name)} must be > 0")
    if args.steps < 1:
        ap.error(f"--steps={args.steps} must be >= 1")

    records = json.load(open(args.scale))
    field = "decode_ms_per_step" if args.decode else "ms_per_step"
    costs = step_costs(records, args.shape, field=field, variant=args.variant)
    served = step_costs(records, args.shape, one_batch=False, field=field, variant=args.variant)
    if args.budgets:
        have = sorted(b for a, b in costs if a == "DDTREE")
        if not set(args.budgets) <= set(have):
            ap.error(f"--budgets {args.budgets}: valid are budgets with records, {have}")
        costs = {k: v for k, v in costs.items() if k[0] != "DDTREE" or k[1] in args.budgets}
    table = cost_table(costs)
    if not table:
        timed = " whose levels timed their prefill (decode_ms_per_step)" if args.decode else ""
        which = f" of variant {args.variant!r}" if args.variant else ""
        ap.error(f"--scale has no one-batch DDTREE records of shape {args.shape!r}{which}{timed}")
    config = {"cost_ms": table}
    policy = BudgetPolicy.from_dict(config, "cost table")
    if args.write_config:
        with open(args.write_config, "w") as f:
            json.dump(config, f, indent=2)
            f.write("\n")
    try:
        tiny = tiny_pair_tau(
            [json.load(open(f))["rows"] for f in args.acceptance], args.pair, args.tree_temperature
        )
    except ValueError as e:
        ap.error(str(e))
    missing = [b for b in policy.budgets if f"DDTREE{b}" not in tiny]
    if missing:
        ap.error(f"--acceptance has no tau for budgets {missing} (pair {args.pair})")
    scale = args.dflash_tau / tiny["DFLASH"]
    tau = {b: tiny[f"DDTREE{b}"] * scale for b in policy.budgets}
    base_tau = {"AR": 1.0, "NEXTN": args.nextn_tau, "DFLASH": args.dflash_tau}

    levels = sorted(int(c) for c in table)  # the levels DDTREE has a one-batch cost at
    budgets = policy.budgets
    head = ["C"] + [f"DDTREE({b})" for b in budgets] + list(BASELINES)
    head += ["adaptive: budget", "adaptive", "/ best fixed", "/ max(AR, NEXTN, DFLASH)"]
    print(
        f"{args.shape}: projected output tokens/s (tau: DDTREE "
        + ", ".join(f"{b}: {tau[b]:.2f}" for b in budgets)
        + f"; DFLASH {args.dflash_tau}, NEXTN {args.nextn_tau}, AR 1)"
    )
    print("e2e.scale option for these tau: acc=" + "/".join(f"{b}@{tau[b]:.2f}" for b in budgets))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    rows = []
    for c in levels:
        fixed = {
            b: c * tau[b] * 1000.0 / costs[("DDTREE", b)][c]
            for b in budgets
            if c in costs.get(("DDTREE", b), {})
        }
        base = {
            a: c * base_tau[a] * 1000.0 / served[(a, None)][c]
            for a in BASELINES
            if c in served.get((a, None), {})
        }
        rounds = [a for a in base if c not in costs.get((a, None), {})]
        tps, settled, runs = simulate(policy, args.horizon, tau, c, args.steps)
        best_fixed = max(fixed.values())
        best_base = max(base.values()) if base else float("nan")
        rows.append(
            dict(
                concurrency=c,
                fixed_tokens_per_s=fixed,
                baseline_tokens_per_s=base,
                baselines_in_rounds=rounds,
                adaptive_budget=settled,
                adaptive_steps_per_budget=runs,
                adaptive_tokens_per_s=tps,
                adaptive_over_best_fixed=tps / best_fixed,
                adaptive_over_best_baseline=tps / best_base,
            )
        )
        cells = [str(c)] + [f"{fixed[b]:.0f}" if b in fixed else "-" for b in budgets]
        cells += [
            (f"{base[a]:.0f}" + (" (rounds)" if a in rounds else "")) if a in base else "-"
            for a in BASELINES
        ]
        cells += [str(settled), f"{tps:.0f}", f"{tps / best_fixed:.3f}", f"{tps / best_base:.3f}"]
        print("| " + " | ".join(cells) + " |")
    result = dict(
        settings=dict(vars(args), tau=tau, tiny_pair_tau=tiny, cost_ms=table),
        rows=rows,
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return result


if __name__ == "__main__":
    sys.exit(main() and 0)
