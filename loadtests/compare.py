"""Compare sweep runs: a markdown report and PNG plots.

    python -m loadtests.compare results/*.jsonl -o report/ [--ar AR] [--nextn NEXTN] [--title ...]

Reads the level records written by ``loadtests.sweep`` (one JSON line per run x concurrency), groups
them by model and run label, and writes ``report.md`` plus, per model:
``<model>_throughput.png`` (output tok/s vs concurrency), ``<model>_per_request.png`` (median
per-request tok/s), ``<model>_speedup_ar.png`` and ``<model>_speedup_nextn.png`` (output-throughput
ratio to the AR run and to the chain baseline at the same concurrency), ``<model>_acceptance.png``.

Baselines per model: AR = the run whose algorithm is AR; chain baseline = NEXTN, else EAGLE3/EAGLE
(Qwen3-8B has no NEXTN head); ``--ar``/``--nextn`` pick labels explicitly. Repeated records for the
same model, label and concurrency are combined by their median. Levels that were interrupted are
marked ``*``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

CHAIN_ALGORITHMS = ("NEXTN", "EAGLE3", "EAGLE")
METRICS = (
    "output_throughput",
    "median_per_request_output_throughput",
    "accept_length",
    "tokens_per_step",
    "mean_spec_accept_length",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "median_itl_ms",
    "p90_itl_ms",
    "p99_itl_ms",
    "p99_chunk_gap_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "request_throughput",
)


def load_records(paths: list[str]) -> list[dict]:
    recs = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    print(f"[compare] {path}:{n}: skipped, invalid JSON ({e})", file=sys.stderr)
                    continue
                if "max_concurrency" not in r or "output_throughput" not in r:
                    print(
                        f"[compare] {path}:{n}: skipped, not a sweep level record", file=sys.stderr
                    )
                    continue
                r["_file"] = str(path)
                recs.append(r)
    return recs


class Run:
    """One label of one model: per-concurrency medians over its records."""

    def __init__(self, label: str, records: list[dict]):
        self.label = label
        self.records = records
        self.algorithm = str(records[0].get("algorithm") or "?").upper()
        self.levels: dict[int, dict] = {}
        by_c = defaultdict(list)
        for r in records:
            by_c[int(r["max_concurrency"])].append(r)
        for c, rs in sorted(by_c.items()):
            agg = {
                "n_records": len(rs),
                "interrupted": any(r.get("interrupted") for r in rs),
                "completed": sum(r.get("completed", 0) for r in rs),
                "failed": sum(r.get("failed", 0) for r in rs),
            }
            for m in METRICS:
                vals = [r[m] for r in rs if isinstance(r.get(m), (int, float))]
                agg[m] = statistics.median(vals) if vals else None
            self.levels[c] = agg

    def get(self, c: int, metric: str):
        lv = self.levels.get(c)
        return None if lv is None else lv.get(metric)

    def acceptance(self, c: int):
        v = self.get(c, "accept_length")
        return v if v is not None else self.get(c, "tokens_per_step")


def group(records: list[dict]) -> dict[str, dict[str, Run]]:
    by = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[str(r.get("model") or "unknown")][
            str(r.get("label") or r.get("algorithm") or "run")
        ].append(r)
    return {m: {lab: Run(lab, rs) for lab, rs in labs.items()} for m, labs in by.items()}


def pick_baselines(
    runs: dict[str, Run], ar: str | None, nextn: str | None
) -> tuple[str | None, str | None]:
    ar_label = (
        ar if ar in runs else next((lab for lab, r in runs.items() if r.algorithm == "AR"), None)
    )
    chain = nextn if nextn in runs else None
    if chain is None:
        for alg in CHAIN_ALGORITHMS:
            chain = next((lab for lab, r in runs.items() if r.algorithm == alg), None)
            if chain:
                break
    return ar_label, chain


def ratio(
    runs: dict[str, Run], label: str, base: str | None, c: int, metric: str = "output_throughput"
):
    if base is None or base not in runs:
        return None
    a, b = runs[label].get(c, metric), runs[base].get(c, metric)
    if a is None or not b:
        return None
    return a / b


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "model"


# ----------------------------------------------------------------------------------------------- plots
def _plot(
    path: Path,
    title: str,
    ylabel: str,
    series: dict[str, list[tuple[int, float]]],
    hline: float | None = None,
    ymin: float | None = 0.0,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    plotted = 0
    for label, pts in series.items():
        pts = [(c, v) for c, v in pts if v is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=label)
        plotted += 1
    if hline is not None:
        ax.axhline(hline, color="grey", lw=1, ls="--")
    ax.set_xscale("log", base=2)
    if ymin is not None and plotted:
        ax.set_ylim(bottom=ymin)
    all_c = sorted({c for pts in series.values() for c, v in pts if v is not None})
    if all_c:
        ax.set_xticks(all_c)
        ax.set_xticklabels([str(c) for c in all_c])
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


# ----------------------------------------------------------------------------------------------- markdown
def _fmt(v, spec=".1f", suffix=""):
    return "–" if v is None else f"{format(v, spec)}{suffix}"


def _table(runs: dict[str, Run], cs: list[int], cell) -> list[str]:
    lines = ["| run | " + " | ".join(f"C={c}" for c in cs) + " |", "|---|" + "---:|" * len(cs)]
    for label, run in runs.items():
        cells = []
        for c in cs:
            v = cell(label, run, c)
            mark = "*" if run.levels.get(c, {}).get("interrupted") else ""
            cells.append(v + mark)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def write_report(
    records: list[dict],
    outdir: Path,
    ar: str | None = None,
    nextn: str | None = None,
    title: str = "Speculative decoding load test",
) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    models = group(records)
    md = [
        f"# {title}",
        "",
        f"{len(records)} level records from {len({r['_file'] for r in records})} file(s): "
        + ", ".join(f"`{f}`" for f in sorted({r["_file"] for r in records})),
        "",
        "Output tok/s = successful output tokens / level wall time; per-request tok/s = output tokens / "
        "end-to-end latency (median over requests); speed-ups are output-throughput ratios at equal concurrency; "
        "acceptance = server `avg_spec_accept_length` for the level (after `/flush_cache`), else completion "
        "tokens / `spec_verify_ct`. `*` = level interrupted.",
        "",
    ]
    for model, runs in models.items():
        runs = dict(
            sorted(
                runs.items(),
                key=lambda kv: (
                    kv[1].algorithm != "AR",
                    kv[1].algorithm not in CHAIN_ALGORITHMS,
                    kv[0],
                ),
            )
        )
        ar_label, chain_label = pick_baselines(runs, ar, nextn)
        cs = sorted({c for r in runs.values() for c in r.levels})
        s = slug(model)
        md += [
            f"## {model}",
            "",
            f"Baselines: AR = `{ar_label or 'none'}`, chain (NEXTN) = `{chain_label or 'none'}`.",
            "",
            "| run | algorithm | server config | api | prompts | max new tokens | T | records |",
            "|---|---|---|---|---|---:|---:|---:|",
        ]
        for label, run in runs.items():
            r0 = run.records[0]
            md.append(
                f"| {label} | {run.algorithm} | {r0.get('server_config') or '–'} | {r0.get('api', '–')} | "
                f"{Path(str(r0.get('dataset_name', '–'))).name} | {r0.get('max_new_tokens', '–')} | "
                f"{r0.get('temperature', '–')} | {len(run.records)} |"
            )
        md += ["", "### Output throughput (tok/s)", ""]
        md += _table(runs, cs, lambda lab, run, c: _fmt(run.get(c, "output_throughput")))
        md += ["", "### Per-request tok/s (median)", ""]
        md += _table(
            runs, cs, lambda lab, run, c: _fmt(run.get(c, "median_per_request_output_throughput"))
        )
        md += ["", f"### Speed-up over AR (`{ar_label or 'none'}`), output throughput", ""]
        md += _table(runs, cs, lambda lab, run, c: _fmt(ratio(runs, lab, ar_label, c), ".2f", "×"))
        md += [
            "",
            f"### Speed-up over NEXTN / chain (`{chain_label or 'none'}`), output throughput",
            "",
        ]
        md += _table(
            runs, cs, lambda lab, run, c: _fmt(ratio(runs, lab, chain_label, c), ".2f", "×")
        )
        md += ["", "### Per-request speed-up over AR (median per-request tok/s)", ""]
        md += _table(
            runs,
            cs,
            lambda lab, run, c: _fmt(
                ratio(runs, lab, ar_label, c, "median_per_request_output_throughput"), ".2f", "×"
            ),
        )
        md += ["", "### Acceptance: server accept length / per-request tokens per step", ""]
        md += _table(
            runs,
            cs,
            lambda lab, run, c: (
                f"{_fmt(run.get(c, 'accept_length'), '.2f')} / {_fmt(run.get(c, 'tokens_per_step'), '.2f')}"
            ),
        )
        md += [
            "",
            "### Latency and errors",
            "",
            "| run | C | ok | err | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p50 | ITL p90 | ITL p99 ms | "
            "chunk gap p99 ms | E2E p50 s | E2E p99 s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, run in runs.items():
            for c, lv in run.levels.items():
                md.append(
                    f"| {label} | {c}{'*' if lv['interrupted'] else ''} | {lv['completed']} | {lv['failed']} | "
                    f"{_fmt(lv['median_ttft_ms'])} | {_fmt(lv['p99_ttft_ms'])} | {_fmt(lv['median_tpot_ms'], '.2f')} | "
                    f"{_fmt(lv['median_itl_ms'], '.2f')} | {_fmt(lv['p90_itl_ms'], '.2f')} | {_fmt(lv['p99_itl_ms'], '.2f')} | "
                    f"{_fmt(lv['p99_chunk_gap_ms'], '.2f')} | "
                    f"{_fmt(None if lv['median_e2e_latency_ms'] is None else lv['median_e2e_latency_ms'] / 1000, '.2f')} | "
                    f"{_fmt(None if lv['p99_e2e_latency_ms'] is None else lv['p99_e2e_latency_ms'] / 1000, '.2f')} |"
                )

        plots = {
            "throughput": (
                "Output throughput",
                "output tok/s",
                {lab: [(c, r.get(c, "output_throughput")) for c in cs] for lab, r in runs.items()},
                None,
            ),
            "per_request": (
                "Per-request throughput (median)",
                "tok/s per request",
                {
                    lab: [(c, r.get(c, "median_per_request_output_throughput")) for c in cs]
                    for lab, r in runs.items()
                },
                None,
            ),
            "speedup_ar": (
                f"Speed-up over AR (run {ar_label or 'none'})",
                "× output throughput",
                {
                    lab: [(c, ratio(runs, lab, ar_label, c)) for c in cs]
                    for lab in runs
                    if lab != ar_label
                },
                1.0,
            ),
            "speedup_nextn": (
                f"Speed-up over NEXTN/chain (run {chain_label or 'none'})",
                "× output throughput",
                {
                    lab: [(c, ratio(runs, lab, chain_label, c)) for c in cs]
                    for lab in runs
                    if lab not in (chain_label, ar_label)
                },
                1.0,
            ),
            "acceptance": (
                "Acceptance (tokens per verify step)",
                "accept length",
                {
                    lab: [(c, r.acceptance(c)) for c in cs]
                    for lab, r in runs.items()
                    if r.algorithm != "AR"
                },
                None,
            ),
        }
        md += ["", "### Plots", ""]
        for key, (ptitle, ylabel, series, hline) in plots.items():
            fname = f"{s}_{key}.png"
            _plot(
                outdir / fname,
                f"{model}: {ptitle}",
                ylabel,
                series,
                hline,
                ymin=1.0 if key == "acceptance" else 0.0,
            )
            md.append(f"![{ptitle}]({fname})")
        md.append("")
    report = outdir / "report.md"
    report.write_text("\n".join(md) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.compare", description=__doc__.splitlines()[0]
    )
    p.add_argument("runs", nargs="+", help="JSONL files written by loadtests.sweep")
    p.add_argument("-o", "--output-dir", default="loadtest_report")
    p.add_argument(
        "--ar", default=None, help="label of the AR baseline (default: the run with algorithm AR)"
    )
    p.add_argument(
        "--nextn", default=None, help="label of the chain baseline (default: NEXTN, else EAGLE3)"
    )
    p.add_argument("--title", default="Speculative decoding load test")
    a = p.parse_args(argv)
    missing = [r for r in a.runs if not Path(r).is_file()]
    if missing:
        print(f"[compare] missing: {', '.join(missing)}", file=sys.stderr)
        return 2
    records = load_records(a.runs)
    if not records:
        print("[compare] no level records found", file=sys.stderr)
        return 1
    report = write_report(records, Path(a.output_dir), a.ar, a.nextn, a.title)
    print(f"[compare] wrote {report} and {len(list(Path(a.output_dir).glob('*.png')))} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
