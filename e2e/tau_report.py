"""Tokens per verify step prompt by prompt, DDTREE against DFLASH, from ``e2e.tiny_pair`` runs
(issue 15 item 4: tau_DDTREE(63) >= tau_DFLASH on every prompt and >= 1.3x on average, on the
held-out prompts and on another code base's).

The device script (``e2e/h200_tau.sh``) first writes one prompt file holding both sets, each line
tagged with its ``set``, so that one server per algorithm serves both::

    python -m e2e.tau_report --write-prompts $OUT/prompts.jsonl --num-prompts 16

and after the runs, on any machine::

    python -m e2e.tau_report hybrid=RUN1/e2e.json qwen3=RUN2/e2e.json \\
        --prompts RUN/prompts.jsonl [--bar 1.3] [--json tau.json]

A prompt's tau is SGLang's ``completion_tokens / spec_verify_ct`` of its sequential greedy request;
a set's is pooled (sum over sum), as ``e2e.tiny_pair``'s table. For every DDTREE server of a run,
against the run's DFLASH server: the pooled ratio, on how many prompts its tau is at least DFLASH's,
and how many of each server's texts equal the run's AR server's (judge a difference with
``python -m e2e.compare_reference ... --prompts``). Exit status 1 when a run lacks a DFLASH or a
DDTREE server or a server failed, so a broken run is never read as a result.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglang_spec.reference import tiny_pair


def write_prompts(path: str, num: int) -> int:
    """The first ``num`` prompts of each set (the order ``e2e.tiny_pair`` takes them in), tagged."""
    lines = [
        json.dumps({"set": s, "prompt": p})
        for s in tiny_pair.PROMPT_SETS
        for p in tiny_pair.heldout_prompts(num, spread=False, prompt_set=s)
    ]
    Path(path).write_text("\n".join(lines) + "\n")
    return len(lines)


def prompt_sets(path: str) -> list[str]:
    """The ``set`` of every prompt line (``all`` where a line has none)."""
    return [json.loads(ln).get("set", "all") for ln in open(path) if ln.strip()]


def server_taus(server: dict) -> list[tuple[int, int]]:
    """``(completion_tokens, spec_verify_ct)`` per prompt of a server's sequential greedy requests."""
    return [(g["meta"]["completion_tokens"], g["meta"]["spec_verify_ct"]) for g in server["greedy"]]


def pooled(counts: list[tuple[int, int]]) -> float:
    return sum(t for t, _ in counts) / sum(s for _, s in counts)


def compare(pair: str, runs: list[dict], sets: list[str]) -> list[dict]:
    """One row per (DDTREE server, prompt set) of a run: DFLASH's and DDTREE's pooled tau, their
    ratio, the prompts where DDTREE's tau >= DFLASH's, and greedy = AR counts."""
    by = {r["label"].split("+")[0]: r for r in runs}
    failed = [r["label"] for r in runs if not r.get("ok")]
    if failed:
        raise ValueError(f"{pair}: server(s) {', '.join(failed)} failed; rerun them")
    if "dflash" not in by or not any(k.startswith("ddtree") for k in by):
        raise ValueError(f"{pair}: needs a dflash and a ddtree<budget> server, has {sorted(by)}")
    dflash = server_taus(by["dflash"])
    if len(dflash) != len(sets):
        raise ValueError(f"{pair}: {len(dflash)} greedy prompts, the prompt file has {len(sets)}")
    ar = by.get("ar")
    rows = []
    for name, server in by.items():
        if not name.startswith("ddtree"):
            continue
        tree = server_taus(server)
        for s in dict.fromkeys(sets):
            idx = [i for i, x in enumerate(sets) if x == s]
            d, t = [dflash[i] for i in idx], [tree[i] for i in idx]
            per_prompt = [(a[0] / a[1], b[0] / b[1]) for a, b in zip(d, t)]
            row = {
                "pair": pair,
                "set": s,
                "server": server["label"],
                "prompts": len(idx),
                "tau_dflash": pooled(d),
                "tau_ddtree": pooled(t),
                "per_prompt": per_prompt,
                "prompts_ge": sum(b >= a for a, b in per_prompt),
            }
            row["ratio"] = row["tau_ddtree"] / row["tau_dflash"]
            if ar is not None:
                ref = [ar["greedy"][i]["text"] for i in idx]
                for key, srv in (("dflash_eq_ar", by["dflash"]), ("ddtree_eq_ar", server)):
                    row[key] = sum(srv["greedy"][i]["text"] == r for i, r in zip(idx, ref))
            rows.append(row)
    return rows


def table(rows: list[dict], bar: float) -> str:
    out = [
        "| pair | prompts | n | DFLASH tau | DDTREE server | DDTREE tau | ratio | prompts DDTREE >= DFLASH"
        f" | greedy = AR (DFLASH, DDTREE) | ratio >= {bar} and every prompt |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        eq = f"{r['dflash_eq_ar']}, {r['ddtree_eq_ar']}" if "ddtree_eq_ar" in r else "-"
        meets = r["ratio"] >= bar and r["prompts_ge"] == r["prompts"]
        out.append(
            f"| {r['pair']} | {r['set']} | {r['prompts']} | {r['tau_dflash']:.3f} | {r['server']} | "
            f"{r['tau_ddtree']:.3f} | {r['ratio']:.3f}x | {r['prompts_ge']}/{r['prompts']} | {eq} | "
            f"{'yes' if meets else 'no'} |"
        )
    return "\n".join(out)


def per_prompt_table(rows: list[dict]) -> str:
    out = ["| pair | prompts | # | DFLASH | DDTREE |", "|---|---|---|---|---|"]
    for r in rows:
        for i, (a, b) in enumerate(r["per_prompt"]):
            mark = " (<)" if b < a else ""
            out.append(f"| {r['pair']} | {r['set']} | {i} | {a:.2f} | {b:.2f}{mark} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.tau_report", description=__doc__.splitlines()[0]
    )
    ap.add_argument("runs", nargs="*", metavar="PAIR=E2E_JSON")
    ap.add_argument(
        "--prompts", help="the prompt file the runs were given (its `set` field groups)"
    )
    ap.add_argument("--write-prompts", metavar="FILE", help="write both sets' prompts and stop")
    ap.add_argument("--num-prompts", type=int, default=16, help="per set, with --write-prompts")
    ap.add_argument("--bar", type=float, default=1.3, help="issue 15's pooled ratio (1.3)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.write_prompts:
        print(
            f"{write_prompts(args.write_prompts, args.num_prompts)} prompts -> {args.write_prompts}"
        )
        return 0
    if not args.runs or not args.prompts:
        ap.error("give PAIR=E2E_JSON runs and --prompts (or --write-prompts FILE)")
    bad = [r for r in args.runs if "=" not in r]
    if bad:
        ap.error(f"run {bad[0]!r}: expected PAIR=path/to/e2e.json")
    sets = prompt_sets(args.prompts)
    rows = []
    try:
        for spec in args.runs:
            pair, path = spec.split("=", 1)
            rows += compare(pair, json.load(open(path)), sets)
    except (ValueError, OSError, KeyError) as e:
        print(f"python -m e2e.tau_report: {e}", file=sys.stderr)
        return 1
    print(table(rows, args.bar))
    print()
    print(per_prompt_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
