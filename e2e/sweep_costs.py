"""``python -m e2e.sweep_costs``: a budget-by-batch-size cost table from fixed DDTREE load sweeps (CPU).

``e2e/h200_adaptive.sh``'s fixed part sweeps one server per fixed DDTREE budget
(``tiny_pair.py --sweep``, one ``loadtests.sweep`` JSONL per server under ``<out>/sweeps``). For the
adaptive part's ``--speculative-adaptive-config`` this turns each level into the served cost of a
step at that budget and concurrency::

    ms per step = 1000 x C x accept length / output tokens per second

(prefill and scheduling included: what a step costs while serving C streams). A concurrency swept
more than once (``--sweep 1,2,1,2``, as ``loadtests.compare`` reads repeats) costs the median of its
levels. Files of servers other than fixed DDTREE are skipped (an ``+adaptive`` server of an
interleaved run, ``h200_adaptive.sh PARTS=interleaved``, mixes budgets); two files for one budget, or a level
without an accept length, a successful request or a throughput, are refused with one line. Prints the table and writes it in
``docs/adaptive-budget.md``'s format (``--write-config``). With ``--base CONFIG`` the written config
is that one with the sweeps' cells put in (a budget measured again at a concurrency replaces its
cell, a new budget or concurrency is added, the rest and the controller's knobs are kept): a run
of a few fixed budgets at a few concurrencies updates a table without sweeping every budget again.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

from benchmarks.adaptive_budget import cost_table
from e2e.tiny_pair import parse_server


def level_costs(path: str) -> tuple[int, dict[int, float]] | None:
    """(budget, {C: ms per step}) of one DDTREE server's sweep file, or None for other servers."""
    with open(path) as f:
        levels = [json.loads(line) for line in f if line.strip()]
    if not levels:
        raise ValueError(f"{path}: no sweep levels")
    if any("label" not in r or "max_concurrency" not in r for r in levels):
        raise ValueError(
            f"{path}: a level without label or max_concurrency; valid: loadtests.sweep"
        )
    labels = {r["label"] for r in levels}
    if len(labels) != 1:
        raise ValueError(f"{path}: levels of several servers {sorted(labels)}; valid: one server")
    algorithm, budget, mods = parse_server(labels.pop())
    if algorithm != "ddtree" or "adaptive" in mods:  # an adaptive server's steps mix budgets
        return None
    repeats: dict[int, list[float]] = {}
    for r in levels:
        c, acc, tps = r["max_concurrency"], r.get("accept_length"), r.get("output_throughput")
        if r.get("interrupted") or not r.get("completed") or not acc or not tps:
            raise ValueError(
                f"{path}: level C={c} has completed={r.get('completed')}, accept_length={acc}, "
                f"output_throughput={tps}; valid: a finished level with all three"
            )
        repeats.setdefault(int(c), []).append(1000.0 * c * acc / tps)
    return budget, {c: statistics.median(ms) for c, ms in repeats.items()}


def sweep_cost_table(paths: list[str]) -> dict[str, dict[str, float]]:
    """``cost_ms`` of the budget config: {"C": {"budget": ms}} over the DDTREE sweep files
    (``benchmarks.adaptive_budget.cost_table``'s layout and rounding)."""
    by_budget: dict[int, dict[int, float]] = {}
    for path in paths:
        got = level_costs(path)
        if got is None:
            continue
        budget, costs = got
        if budget in by_budget:
            raise ValueError(f"{path}: a second sweep of DDTREE({budget}); valid: one per budget")
        by_budget[budget] = costs
    if not by_budget:
        raise ValueError(f"no DDTREE sweep among {paths}")
    return cost_table({("DDTREE", b): costs for b, costs in by_budget.items()})


def merged_config(base_path: str, table: dict[str, dict[str, float]]) -> dict:
    """The budget config at ``base_path`` with ``table``'s cells put in, validated as the server
    validates it (one-line ``ValueError`` otherwise)."""
    from sglang_spec.plugin.budget import BudgetConfigError, BudgetPolicy

    try:
        with open(base_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"--base {base_path}: cannot read a JSON config ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("cost_ms"), dict):
        raise ValueError(f"--base {base_path}: no cost_ms table; valid: a budget config")
    cost = {c: dict(row) for c, row in config["cost_ms"].items()}
    for c, row in table.items():
        cost.setdefault(c, {}).update(row)
    config["cost_ms"] = {
        c: dict(sorted(row.items(), key=lambda kv: int(kv[0])))
        for c, row in sorted(cost.items(), key=lambda kv: int(kv[0]))
    }
    try:
        BudgetPolicy.from_dict(config, f"--base {base_path} with the sweeps")
    except BudgetConfigError as e:
        raise ValueError(str(e)) from None
    return config


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.sweep_costs", description=__doc__.splitlines()[0]
    )
    ap.add_argument("sweeps", nargs="+", help="loadtests.sweep JSONL files, one per server")
    ap.add_argument("--write-config", help="write {'cost_ms': ...} here")
    ap.add_argument(
        "--base",
        metavar="CONFIG",
        help="write this budget config with the sweeps' cells put in (module docstring)",
    )
    args = ap.parse_args(argv)
    missing = [p for p in args.sweeps if not os.path.isfile(p)]
    if missing:
        ap.error(f"no such sweep file: {missing[0]}")
    try:
        table = sweep_cost_table(args.sweeps)
        config = {"cost_ms": table} if args.base is None else merged_config(args.base, table)
    except ValueError as e:
        print(f"python -m e2e.sweep_costs: {e}", file=sys.stderr)
        return 2
    budgets = sorted({int(b) for row in table.values() for b in row})
    print("| C | " + " | ".join(f"DDTREE({b}) ms/step" for b in budgets) + " |")
    print("|---|" + "---|" * len(budgets))
    for c, row in table.items():
        print(f"| {c} | " + " | ".join(f"{row.get(str(b), '-')}" for b in budgets) + " |")
    if args.write_config:
        with open(args.write_config, "w") as f:
            json.dump(config, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
