"""``python -m e2e.scale_bar RESULTS.json --norms torch|fused --adaptive CONFIG``: issue 15's
real-scale bar (CPU).

The bar: on the Qwen3.6-27B shape with the real-scale harness at simulated acceptance, adaptive
DDTREE's output tokens/s >= max(AR, NEXTN, DFLASH) at every C in 1, 2, 4, 8, 16, 32. RESULTS is an
``e2e.scale`` results file (``benchmarks/results/scale_h200.json``, merged by ``e2e.scale_report``).

Which records count:

- **the norms**: ``--norms fused`` reads only servers run with ``fused-norms`` (the kit's RMSNorms as
  one launch each, :mod:`e2e.kit_norms`), ``--norms torch`` only servers without it. The two never
  mix: the torch norms' cost grows with a verify's tokens (session 34);
- **the adaptive server**: its budget config's file stem (``--adaptive``), no other option than
  ``acc=`` per budget and ``tree-temp=``;
- **the baselines**: AR; NEXTN at ``--nextn-acc`` (3.1, the stated MTP tau); DFLASH at
  ``--dflash-acc`` (3.0, the stated DFlash tau). No ``stages``, ``no-overlap`` or other variants:
  those time something else;
- TP 1. A level that any of the four lacks is named and the verdict is refused.

Prints a table (output tokens/s, the best baseline, adaptive over it, and the same ratio from the
decode steps alone where the records carry ``decode_ms_per_step``), writes ``--json``; exits 0 when
the bar is met at every C, 1 when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from e2e import records

SHAPE = "qwen3.6-27b"
LEVELS = (1, 2, 4, 8, 16, 32)
FUSED = "fused-norms"


class BarError(ValueError):
    """What the bar cannot be read from: one line naming it."""


def _variant(rec: dict) -> tuple[set[str], dict[str, str]]:
    """A record's ``variant`` as (flags, {option: value})."""
    flags, values = set(), {}
    for part in filter(None, (rec.get("variant") or "").split("+")):
        name, eq, value = part.partition("=")
        if eq:
            values[name] = value
        else:
            flags.add(part)
    return flags, values


def select(recs: list[dict], norms: str, adaptive: str, nextn_acc: float, dflash_acc: float):
    """{role: {C: record}} for AR, NEXTN, DFLASH and the adaptive server (module docstring)."""
    want_flags = {FUSED} if norms == "fused" else set()
    picked: dict[str, dict[int, dict]] = {r: {} for r in ("AR", "NEXTN", "DFLASH", "adaptive")}
    adaptive_seen = set()
    for rec in recs:
        if rec["shape"] != SHAPE or (rec["tp"] or 1) != 1:
            continue
        flags, values = _variant(rec)
        if flags != want_flags:
            continue
        acc, alg = rec["simulated_accept_len"], rec["algorithm"]
        role = None
        if alg == "DDTREE" and "adaptive" in values:
            adaptive_seen.add(values["adaptive"])
            role = "adaptive" if values["adaptive"] == adaptive else None
        elif not values and alg == "AR" and acc is None:
            role = "AR"
        elif not values and alg == "NEXTN" and acc == nextn_acc:
            role = "NEXTN"
        elif not values and alg == "DFLASH" and acc == dflash_acc:
            role = "DFLASH"
        if role is not None:
            picked[role][rec["concurrency"]] = rec
    if not picked["adaptive"]:
        raise BarError(
            f"no {norms}-norm adaptive DDTREE records of config {adaptive!r} on {SHAPE}; valid: "
            f"{', '.join(sorted(adaptive_seen)) or 'none recorded with these norms'}"
        )
    missing = [f"{role} C = {c}" for role in picked for c in LEVELS if c not in picked[role]]
    if missing:
        raise BarError(f"{norms}-norm records lack {', '.join(missing)}; the bar needs every C")
    return picked


def _decode_rate(rec: dict) -> float | None:
    """Output tokens a second of one request's decode steps alone (no prefill), or None."""
    ms = rec.get("decode_ms_per_step")
    return rec["tokens_per_step"] / ms * rec["concurrency"] * 1000 if ms else None


def verdict(picked: dict[str, dict[int, dict]]) -> list[dict]:
    rows = []
    for c in LEVELS:
        tps = {role: picked[role][c]["tokens_per_s"] for role in picked}
        best = max(("AR", "NEXTN", "DFLASH"), key=lambda r: tps[r])
        decode = {role: _decode_rate(picked[role][c]) for role in ("adaptive", best)}
        rows.append(
            {
                "concurrency": c,
                "tokens_per_s": tps,
                "best_baseline": best,
                "ratio": tps["adaptive"] / tps[best],
                "decode_ratio": (
                    decode["adaptive"] / decode[best] if None not in decode.values() else None
                ),
                "met": tps["adaptive"] >= tps[best],
            }
        )
    return rows


def table(rows: list[dict], norms: str) -> str:
    lines = [
        f"{SHAPE}, {norms} norms: output tokens/s",
        "",
        "| C | AR | NEXTN | DFLASH | adaptive | best baseline | adaptive / best | decode only |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["tokens_per_s"]
        mark = "" if r["met"] else " **miss**"
        dec = "-" if r["decode_ratio"] is None else f"{r['decode_ratio']:.3f}"
        lines.append(
            f"| {r['concurrency']} | {t['AR']:.0f} | {t['NEXTN']:.0f} | {t['DFLASH']:.0f} | "
            f"{t['adaptive']:.0f} | {r['best_baseline']} | {r['ratio']:.3f}{mark} | {dec} |"
        )
    missed = [str(r["concurrency"]) for r in rows if not r["met"]]
    lines.append("")
    lines.append(
        "issue 15 real-scale bar: "
        + (f"missed at C = {', '.join(missed)}" if missed else "met at every C")
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.scale_bar", description=__doc__)
    ap.add_argument("results", type=Path, help="an e2e.scale results JSON")
    ap.add_argument("--norms", choices=("torch", "fused"), required=True)
    ap.add_argument("--adaptive", required=True, help="the adaptive server's budget config stem")
    ap.add_argument("--nextn-acc", type=float, default=3.1)
    ap.add_argument("--dflash-acc", type=float, default=3.0)
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args(argv)
    try:
        if not args.results.is_file():
            raise BarError(f"{args.results}: no such file")
        recs = records.load(args.results)
        picked = select(recs, args.norms, args.adaptive, args.nextn_acc, args.dflash_acc)
    except (BarError, records.RecordError, json.JSONDecodeError) as e:
        print(f"python -m e2e.scale_bar: {e}", file=sys.stderr)
        return 2
    rows = verdict(picked)
    print(table(rows, args.norms))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
