"""``python -m e2e.tiny_bar SWEEPS_DIR``: issue 15's tiny-pair load-sweep bar from one run (CPU).

The bar: adaptive DDTREE's output tokens/s >= DFLASH's and >= AR's at every concurrency C, and
within 5 % of the best fixed DDTREE budget's. ``SWEEPS_DIR`` is an ``e2e.tiny_pair`` run's
``sweeps/`` folder (one ``loadtests.sweep`` JSONL per server; the servers named as
``tiny_pair`` names them: ``ar...``, ``dflash...``, ``ddtree<budget>...`` and one
``ddtree<budget>...+adaptive``), best from ``e2e/h200_adaptive.sh PARTS=interleaved``, whose
levels alternate between the servers.

A concurrency swept P times (``SWEEP_PASSES``) has P levels per server; the k-th level of every
server at C is pass k. Each ratio is taken within a pass (servers measured seconds apart in an
interleaved run) and the verdict reads the median over the passes, with their lowest and highest
beside it: a drifting machine moved one server's level by up to 1.4x between passes (session 25),
which ratios of per-server medians taken minutes apart would carry.

Prints the table and the verdict, writes ``--json``; exits 0 when the bar is met at every C, 1
when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from e2e import kit
from e2e.tiny_pair import parse_server

NEAR_BEST = 0.95  # the bar: within 5 % of the best fixed budget


def load_runs(folder: Path) -> dict[str, dict[int, list[float]]]:
    """{server label: {C: [output tokens/s of pass 1, 2, ...]}} from every JSONL in ``folder``."""
    runs: dict[str, dict[int, list[float]]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        levels = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
        labels = {lv.get("label") for lv in levels}
        if len(labels) != 1 or None in labels:
            raise kit.HarnessError(
                f"{path}: levels of {sorted(map(str, labels))}; valid: one server"
            )
        label = labels.pop()
        if label in runs:
            raise kit.HarnessError(f"{path}: a second file of server {label!r}")
        by_c: dict[int, list[float]] = {}
        for lv in levels:
            by_c.setdefault(int(lv["max_concurrency"]), []).append(float(lv["output_throughput"]))
        runs[label] = by_c
    return runs


def roles(labels: list[str]) -> tuple[str, str, str, list[str]]:
    """(AR, DFLASH, adaptive, [fixed DDTREE]) server labels; one line naming what is missing."""
    ar, dflash, adaptive, fixed = [], [], [], []
    for label in labels:
        algorithm, _budget, mods = parse_server(label)
        if algorithm == "ar":
            ar.append(label)
        elif algorithm == "dflash":
            dflash.append(label)
        elif algorithm == "ddtree":
            (adaptive if "adaptive" in mods else fixed).append(label)
    if len(ar) != 1 or len(dflash) != 1 or len(adaptive) != 1 or not fixed:
        raise kit.HarnessError(
            f"servers {sorted(labels)}: the bar needs one AR, one DFLASH, one +adaptive DDTREE "
            f"and at least one fixed DDTREE server; got AR {ar}, DFLASH {dflash}, adaptive "
            f"{adaptive}, fixed {fixed}"
        )
    return ar[0], dflash[0], adaptive[0], fixed


def verdict(runs: dict[str, dict[int, list[float]]]) -> list[dict]:
    """Per C: every server's median tokens/s and the adaptive server's per-pass ratios (median,
    lowest, highest) over DFLASH, AR and the pass's best fixed budget, and whether the bar holds."""
    ar, dflash, adaptive, fixed = roles(list(runs))
    rows = []
    for c in sorted(runs[adaptive]):
        passes = min(len(runs[s].get(c, [])) for s in runs)
        if passes == 0:
            raise kit.HarnessError(f"C = {c}: a server has no level there; valid: every server")
        per_pass = []
        for k in range(passes):
            a = runs[adaptive][c][k]
            best = max(runs[f][c][k] for f in fixed)
            per_pass.append(
                {"dflash": a / runs[dflash][c][k], "ar": a / runs[ar][c][k], "best_fixed": a / best}
            )
        ratios = {
            key: {
                "median": statistics.median(p[key] for p in per_pass),
                "low": min(p[key] for p in per_pass),
                "high": max(p[key] for p in per_pass),
            }
            for key in ("dflash", "ar", "best_fixed")
        }
        rows.append(
            {
                "concurrency": c,
                "passes": passes,
                "tokens_per_s": {
                    s: statistics.median(runs[s][c][:passes])
                    for s in (ar, dflash, *fixed, adaptive)
                },
                "adaptive_over": ratios,
                "met": ratios["dflash"]["median"] >= 1.0
                and ratios["ar"]["median"] >= 1.0
                and ratios["best_fixed"]["median"] >= NEAR_BEST,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    servers = list(rows[0]["tokens_per_s"])
    head = ["C", "passes", *servers, "adaptive / DFLASH", "adaptive / AR", "adaptive / best fixed"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [str(r["concurrency"]), str(r["passes"])]
        cells += [f"{r['tokens_per_s'][s]:.0f}" for s in servers]
        for key, floor in (("dflash", 1.0), ("ar", 1.0), ("best_fixed", NEAR_BEST)):
            q = r["adaptive_over"][key]
            mark = "" if q["median"] >= floor else " **miss**"
            cells.append(f"{q['median']:.3f} ({q['low']:.2f}-{q['high']:.2f}){mark}")
        lines.append("| " + " | ".join(cells) + " |")
    missed = [r["concurrency"] for r in rows if not r["met"]]
    lines.append("")
    lines.append(
        "issue 15 tiny bar: met at every C"
        if not missed
        else f"issue 15 tiny bar: missed at C = {', '.join(map(str, missed))}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.tiny_bar", description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", type=Path, help="an e2e.tiny_pair run's sweeps/ folder")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    try:
        if not args.sweeps.is_dir():
            raise kit.HarnessError(f"{args.sweeps}: no such folder (an e2e.tiny_pair --out/sweeps)")
        runs = load_runs(args.sweeps)
        if not runs:
            raise kit.HarnessError(f"{args.sweeps}: no sweep JSONL files")
        rows = verdict(runs)
    except (kit.HarnessError, KeyError, ValueError) as e:
        print(f"python -m e2e.tiny_bar: {e}", file=sys.stderr)
        return 2
    print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
