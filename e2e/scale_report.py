"""Merge real-scale runs and write their report (CPU): a markdown table and a plot beside the JSON.

    python -m e2e.scale_report benchmarks/results/scale_h200.json [RUN_DIR ...]

Each RUN_DIR is an ``--out`` of ``python -m e2e.scale``: its ``scale.json`` records are merged into
RESULTS (a later record replaces an earlier one of the same server and level), and its per-stage
summaries (``stages/*.json``) and profile summaries (``profiles/*.json``) are copied into the folder
``<RESULTS without .json>/``. Then ``RESULTS.md`` gets, per shape, ms per step and output tokens/s
against concurrency C for every server (with its verify width, simulated acceptance, the running
requests SGLang allowed and its start time) and, where the levels timed their prefill apart, the
decode step without it; the GDN state lines of the server logs, the per-stage
step times (median per stage and batch size) and the profile summaries; ``RESULTS.png`` plots ms
per step and tokens/s against C, one line per server, one row per shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from e2e import records
from e2e.trace import markdown as profile_markdown
from loadtests.compare import save_figure

ALGORITHM_ORDER = ("AR", "NEXTN", "EAGLE3", "DFLASH", "DDTREE")


def server_order(rec: dict) -> tuple:
    alg = rec["algorithm"]
    return (
        ALGORITHM_ORDER.index(alg) if alg in ALGORITHM_ORDER else len(ALGORITHM_ORDER),
        rec["budget"] or 0,
        rec.get("variant") or "",
        rec["tp"] or 1,
        rec["simulated_accept_len"] or 0.0,
    )


def server_name(rec: dict) -> str:
    name = rec["algorithm"] + (f"({rec['budget']})" if rec["budget"] is not None else "")
    extras = [rec["variant"]] if rec.get("variant") else []
    extras += [f"TP {rec['tp']}"] if (rec["tp"] or 1) > 1 else []
    per_budget = "acc=" in (rec.get("variant") or "")  # the variant names each budget's tau
    if rec["simulated_accept_len"] and not per_budget:
        extras += [f"τ {rec['simulated_accept_len']:g} sim."]
    return name + (f" [{', '.join(extras)}]" if extras else "")


def _servers(recs: list[dict]) -> dict[str, list[dict]]:
    """Records of one shape grouped per server, servers in display order, levels by C."""
    groups: dict[str, list[dict]] = {}
    for r in sorted(recs, key=lambda r: (server_order(r), r["concurrency"])):
        groups.setdefault(server_name(r), []).append(r)
    return groups


def level_tables(recs: list[dict]) -> str:
    """Per shape: ms per step and output tokens/s against C, one row per server; and, for the
    servers whose levels timed their prefill apart, the decode step without it."""
    out = []
    for shape in sorted({r["shape"] for r in recs}):
        groups = _servers([r for r in recs if r["shape"] == shape])
        levels = sorted({r["concurrency"] for g in groups.values() for r in g})
        head = "| server | width | max running | graphs to bs | start s | tok/step (C=1) |"
        cols = "".join(f" C={c} |" for c in levels)
        for title, field, fmt in (
            ("ms per step", "ms_per_step", "{:.1f}"),
            ("output tokens/s", "tokens_per_s", "{:.0f}"),
            (
                "decode ms per step (the level's prefill, timed alone, taken out)",
                "decode_ms_per_step",
                "{:.1f}",
            ),
        ):
            timed = {n: rs for n, rs in groups.items() if any(field in r for r in rs)}
            if not timed:
                continue
            out += [f"### {shape}: {title}", "", head + cols, "|---" * (6 + len(levels)) + "|"]
            for name, rows in timed.items():
                by_c = {r["concurrency"]: r for r in rows if field in r}
                first = rows[0]
                tps = by_c[min(by_c)]["tokens_per_step"]
                cells = "".join(
                    f" {fmt.format(by_c[c][field])} |" if c in by_c else " - |" for c in levels
                )
                out.append(
                    f"| {name} | {first['width']} | {first['max_running_requests']} | "
                    f"{first.get('cuda_graph_max_bs', '-')} | {first.get('start_s', '-')} | "
                    f"{tps:.2f} |{cells}"
                )
            out.append("")
    return "\n".join(out)


def log_notes(recs: list[dict]) -> str:
    """The GDN state lines SGLang logged, once per server."""
    out = []
    seen = set()
    for r in sorted(recs, key=lambda r: (r["shape"], server_order(r))):
        lines = tuple(r.get("mamba_cache_log") or ()) + tuple(r.get("capped_log") or ())
        name = f"{r['shape']} {server_name(r)}"
        if lines and name not in seen:
            seen.add(name)
            out.append(f"- {name}: " + " / ".join(f"`{ln}`" for ln in lines))
    return "\n".join(out)


def stage_key(key: str) -> tuple[int, int]:
    """Sort key of the stage summaries' keys (``e2e.scale.stage_medians``): ``"bs"`` or
    ``"bs:width"``, by batch size, then width."""
    bs, _, width = key.partition(":")
    return int(bs), int(width or 0)


def stage_table(summary: dict, title: str) -> str:
    """One stages summary (``e2e.scale.summarize_stage_file``'s JSON) under ``title``, the one
    rendering the tiny pair's harness prints and this report writes: per batch size (and width,
    numerically) the decode steps, the median host / GPU ms of each stage ("-" where a batch
    size lacks it) and of their sum, the median GPU time between steps and the loop's period
    (GPU sum + between: what a load test's chunk gaps measure from outside; session 30 told a
    dearer step from a slower gap between steps so); how far that period moved from one run of
    steps between prefills to another (``e2e.scale.run_periods``); then the prefills."""
    by_bs = summary["by_bs"]
    stages = list(
        dict.fromkeys(st for e in by_bs.values() for k in ("host_ms", "gpu_ms") for st in e[k])
    )
    out = [
        title,
        "",
        "| bs | steps | " + " | ".join(stages) + " | sum of medians | GPU between | GPU period |",
        "|---" * (len(stages) + 5) + "|",
    ]
    for bs, e in sorted(by_bs.items(), key=lambda kv: stage_key(kv[0])):
        cells = [
            f"{e['host_ms'][st]:.3f} / {e['gpu_ms'][st]:.3f}"
            if st in e["host_ms"] and st in e["gpu_ms"]
            else "-"
            for st in stages
        ]
        host, gpu = sum(e["host_ms"].values()), sum(e["gpu_ms"].values())
        between = e.get("gpu_between_ms")
        gap = "- | -" if between is None else f"{between:.3f} | {gpu + between:.3f}"
        out.append(
            f"| {bs} | {e['steps']} | " + " | ".join(cells) + f" | {host:.3f} / {gpu:.3f} | {gap} |"
        )
    runs = summary.get("run_periods")  # summaries written before session 31 lack it
    if runs:
        out += [
            "",
            f"GPU period per run of >= {runs['min_steps']} decode steps between prefills "
            f"({runs['runs']} runs): min {runs['min_ms']:.3f} / median {runs['median_ms']:.3f} / "
            f"max {runs['max_ms']:.3f} ms, max / min {runs['max_ms'] / runs['min_ms']:.2f}",
        ]
    if summary.get("extends_by_bs"):
        out += [
            "",
            "Prefills (medians per prefill batch):",
            "",
            "| new requests | prefills | prompt tokens | host ms | GPU ms | GPU ms before it |",
            "|---|---|---|---|---|---|",
        ]
        for bs, e in sorted(summary["extends_by_bs"].items(), key=lambda kv: int(kv[0])):
            gap = "-" if e["gpu_between_ms"] is None else f"{e['gpu_between_ms']:.3f}"
            out.append(
                f"| {bs} | {e['extends']} | {e['tokens']:g} | {e['host_ms']:.3f} | "
                f"{e['gpu_ms']:.3f} | {gap} |"
            )
    return "\n".join(out)


def stage_tables(folder: Path) -> str:
    """Every stages summary of ``folder`` (``stages/*.json``) as a :func:`stage_table`."""
    out = []
    for f in sorted(folder.glob("*.json")):
        data = json.loads(f.read_text())
        title = f"### Stages of {data['server_slug']} (median ms per decode step, host / GPU)"
        out += [stage_table(data, title), ""]
    return "\n".join(out)


def report(recs: list[dict], extras: Path | None) -> str:
    parts = [
        "# Real-scale step cost (generated by `python -m e2e.scale_report`; do not edit)",
        "",
        "ms per step = level wall time / verify steps of its longest request (AR: decode steps); "
        "each level sends C requests of distinct 512-token id prompts at once, 128 new tokens, "
        "greedy, ignore_eos. `max running` is SGLang's max_running_requests after any cap: a level "
        "with C above it runs in rounds. `graphs to bs`: decode CUDA graphs up to this batch "
        "size, larger batches run eagerly. τ sim. = SGLANG_SIMULATE_ACC_LEN. Levels measured "
        "before 2026-12-01 12:40 UTC warmed only batch size 1 and the largest level's: a batch size "
        "first seen in a timed level timed Triton's compilation too (27B DDTREE(7): C = 2 cost "
        "45.1 ms per step, 27.5 ms once warmed).",
        "",
        level_tables(recs),
    ]
    notes = log_notes(recs)
    if notes:
        parts += ["## GDN state memory (server logs)", "", notes, ""]
    if extras is not None and (extras / "stages").is_dir():
        parts += ["## Per-stage step times", "", stage_tables(extras / "stages")]
    if extras is not None and (extras / "profiles").is_dir():
        profiles = sorted((extras / "profiles").glob("*.json"))
        if profiles:
            parts += ["## Profiles", ""]
            for f in profiles:
                parts += [profile_markdown(json.loads(f.read_text())), ""]
    return "\n".join(parts).rstrip() + "\n"


def plot(recs: list[dict], path: Path) -> None:
    """ms per step (log scale: ratios read directly) and tokens/s against C; one colour per server
    across all shapes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, NullLocator, ScalarFormatter

    shapes = sorted({r["shape"] for r in recs})
    names = list(_servers(recs))
    colours = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colour = {n: colours(i % colours.N) for i, n in enumerate(names)}
    fig, axes = plt.subplots(
        len(shapes), 2, figsize=(13, 4.2 * len(shapes)), squeeze=False, constrained_layout=True
    )
    for row, shape in zip(axes, shapes):
        groups = _servers([r for r in recs if r["shape"] == shape])
        levels = sorted({r["concurrency"] for g in groups.values() for r in g})
        for name, rows in groups.items():
            cs = [r["concurrency"] for r in rows]
            for ax, field in zip(row, ("ms_per_step", "tokens_per_s")):
                ax.plot(cs, [r[field] for r in rows], marker="o", label=name, color=colour[name])
        for ax, ylabel in zip(row, ("ms per step", "output tokens/s")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(levels)
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xlabel("concurrency C")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{shape}: {ylabel}")
            ax.grid(True, alpha=0.3)
        row[0].set_yscale("log")
        row[0].yaxis.set_major_formatter(FormatStrFormatter("%g"))
        row[0].yaxis.set_minor_formatter(FormatStrFormatter("%g"))
        row[1].set_ylim(bottom=0)
        row[1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    save_figure(fig, path, dpi=110)


def merge_runs(results: Path, run_dirs: list[Path]) -> list[dict]:
    """Merge each run's records into ``results`` and copy its stage / profile summaries."""
    recs = records.load(results)
    extras = results.with_suffix("")
    for d in run_dirs:
        recs = records.merge(recs, records.load(d / "scale.json"))
        for kind in ("stages", "profiles"):
            for f in sorted((d / kind).glob("*.json")) if (d / kind).is_dir() else []:
                (extras / kind).mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, extras / kind / f.name)
    records.save(results, recs)
    return recs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.scale_report", description=__doc__.split("\n")[0]
    )
    ap.add_argument("results", type=Path, help="the merged results JSON (created if missing)")
    ap.add_argument("runs", nargs="*", type=Path, help="run directories of python -m e2e.scale")
    args = ap.parse_args(argv)
    if args.results.suffix != ".json":
        print(f"python -m e2e.scale_report: {args.results} must end in .json", file=sys.stderr)
        return 2
    bad = [d for d in args.runs if not (d / "scale.json").is_file()]
    if bad:
        print(f"python -m e2e.scale_report: no scale.json in {bad[0]}", file=sys.stderr)
        return 2
    try:
        recs = merge_runs(args.results, args.runs)
    except (records.RecordError, json.JSONDecodeError) as e:
        print(f"python -m e2e.scale_report: {e}", file=sys.stderr)
        return 2
    if not recs:
        print(f"python -m e2e.scale_report: {args.results} holds no records", file=sys.stderr)
        return 2
    extras = args.results.with_suffix("")
    args.results.with_suffix(".md").write_text(report(recs, extras if extras.is_dir() else None))
    plot(recs, args.results.with_suffix(".png"))
    print(f"wrote {args.results.with_suffix('.md')} and {args.results.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
