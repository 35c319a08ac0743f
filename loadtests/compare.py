"""Compare sweep runs: a markdown report and PNG plots.

    python -m loadtests.compare results/*.jsonl -o report/ [--ar AR] [--nextn NEXTN] [--title ...]

Reads the level records written by ``loadtests.sweep`` (one JSON line per run x concurrency), groups
them by target model and run label, and writes ``report.md`` plus, per model:
``<model>_throughput.png`` (output tok/s vs concurrency), ``<model>_per_request.png`` (median
per-request tok/s), ``<model>_speedup_ar.png`` and ``<model>_speedup_nextn.png`` (output-throughput
ratio to the AR run and to the chain baseline at the same concurrency), ``<model>_acceptance.png``.
A plot with nothing to show is not written; the report says what is missing instead. A run has
one colour in every plot.

Grouping: by the target model the sweep recorded (``/server_info``'s ``model_path``), compared by
its last path component, so ``Qwen/Qwen3-8B`` and ``/models/Qwen3-8B`` are one model whatever name
each server was given. Baselines per model: AR = the run whose algorithm is AR; chain baseline =
NEXTN, else EAGLE3/EAGLE (Qwen3-8B has no NEXTN head); ``--ar``/``--nextn`` pick labels
explicitly. A model without an AR run gets a warning (and no speed-ups over AR). Repeated records
for the same model, label and concurrency (a sweep over ``1,2,1,2``, or several files) are combined
by their median, and the report adds how far they spread (highest / lowest output throughput), so a
difference between runs can be read against it. Levels that were interrupted are marked ``*``.
Runs served by the CPU demo server (``sglang-spec cpu-server``) are marked: their latencies are not
an engine's.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from sglang_spec.cli_args import Parser, existing_file, nonempty, output_dir, usage_error

PROG = "python -m loadtests.compare"
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
    "median_chunk_gap_ms",
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
        # Set by the CPU demo server (sglang-spec cpu-server): what its latencies measure.
        self.timing = next(
            (
                r["server_info"]["timing"]
                for r in records
                if (r.get("server_info") or {}).get("timing")
            ),
            None,
        )
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
            tps = [r["output_throughput"] for r in rs if r.get("output_throughput")]
            agg["throughput_spread"] = max(tps) / min(tps) if len(tps) > 1 else None
            self.levels[c] = agg

    def get(self, c: int, metric: str):
        lv = self.levels.get(c)
        return None if lv is None else lv.get(metric)

    def acceptance(self, c: int):
        v = self.get(c, "accept_length")
        return v if v is not None else self.get(c, "tokens_per_step")


def model_key(model: str) -> str:
    """The target model's name for grouping: the last component of a hub id or path."""
    return str(model or "unknown").rstrip("/").rsplit("/", 1)[-1] or "unknown"


def group(records: list[dict]) -> dict[str, dict[str, Run]]:
    by = defaultdict(lambda: defaultdict(list))
    for r in records:
        by[model_key(r.get("model"))][str(r.get("label") or r.get("algorithm") or "run")].append(r)
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
def run_colors(labels) -> dict[str, tuple]:
    """One colour per run label, the same in every plot of the report."""
    import matplotlib

    labels = sorted(set(labels))
    cmap = matplotlib.colormaps["tab10" if len(labels) <= 10 else "tab20"]
    return {lab: cmap(i % cmap.N) for i, lab in enumerate(labels)}


def _plot(
    path: Path,
    title: str,
    ylabel: str,
    series: dict[str, list[tuple[int, float]]],
    colors: dict[str, tuple],
    hline: float | None = None,
    ymin: float | None = 0.0,
    note: str | None = None,
) -> None:
    """Lines of ``series`` (label -> non-empty (concurrency, value) points), axes padded so that no
    marker touches the frame, the legend outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 4.6), dpi=110)
    for label, pts in series.items():
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", label=label, color=colors[label])
    values = [v for pts in series.values() for _, v in pts]
    if hline is not None:
        ax.axhline(hline, color="grey", lw=1, ls="--")
        values.append(hline)
    lo, hi = min(values), max(values)
    # Start at ymin (0 tok/s, 1 token per step) unless a point would sit on or near it; leave 8%
    # of the drawn span above the highest point.
    if ymin is not None and lo - ymin > 0.06 * (hi - ymin):
        bottom = ymin
    else:
        bottom = lo - 0.08 * ((hi - lo) or abs(hi) or 1.0)
    ax.set_ylim(bottom, hi + 0.08 * (hi - bottom))
    cs = sorted({c for pts in series.values() for c, _ in pts})
    ax.set_xscale("log", base=2)
    ax.set_xlim(cs[0] / 1.3, cs[-1] * 1.3)
    ax.set_xticks(cs)
    ax.set_xticklabels([str(c) for c in cs])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (closed loop)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if note:
        ax.annotate(
            note,
            (0, 0),
            (0, -38),
            xycoords="axes fraction",
            textcoords="offset points",
            fontsize=7,
            color="dimgrey",
            va="top",
        )
    save_figure(fig, path, bbox_inches="tight")


def save_figure(fig, path: Path, **savefig_kw) -> None:
    """``fig`` as a PNG of 256 colours, closed: they hold these line plots (about 3x smaller than
    RGBA), and the tracked results must fit a device call beside the kit and the compile cache
    (tests/test_packaging.py)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    fig.savefig(path, **savefig_kw)
    plt.close(fig)
    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=256)
    small.save(path, optimize=True)


# ----------------------------------------------------------------------------------------------- markdown
def _fmt(v, spec=".1f", suffix=""):
    return "–" if v is None else f"{format(v, spec)}{suffix}"


def _name(run: Run) -> str:
    """The run's label, with † when its latencies are the CPU demo server's."""
    return f"{run.label} †" if run.timing else run.label


def _spread_cell(run: Run, c: int) -> str:
    """``1.23× (3)``: how far a concurrency's repeated levels differ, and how many there were."""
    spread = run.get(c, "throughput_spread")
    return "–" if spread is None else f"{spread:.2f}× ({run.get(c, 'n_records')})"


def _table(runs: dict[str, Run], cs: list[int], cell) -> list[str]:
    lines = ["| run | " + " | ".join(f"C={c}" for c in cs) + " |", "|---|" + "---:|" * len(cs)]
    for run in runs.values():
        cells = []
        for c in cs:
            v = cell(run, c)
            mark = "*" if run.levels.get(c, {}).get("interrupted") else ""
            cells.append(v + mark)
        lines.append(f"| {_name(run)} | " + " | ".join(cells) + " |")
    return lines


def _series(runs: dict[str, Run], cs: list[int], value, labels=None) -> dict[str, list]:
    """label -> its (concurrency, value) points that have a value; runs without any are left out."""
    out = {}
    for lab in labels if labels is not None else runs:
        pts = [(c, v) for c in cs if (v := value(runs[lab], c)) is not None]
        if pts:
            out[lab] = pts
    return out


def _model_section(
    model: str, runs: dict[str, Run], ar: str | None, nextn: str | None, colors, outdir: Path
) -> list[str]:
    """The report's section for one target model; writes its plots into ``outdir``."""
    md: list[str] = []
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
    reported = sorted({str(r.get("model")) for run in runs.values() for r in run.records})
    md += [
        f"## {model}",
        "",
        "Target model as the servers reported it: " + ", ".join(f"`{m}`" for m in reported) + ".",
        "",
        f"Baselines: AR = `{ar_label or 'none'}`, chain (NEXTN) = `{chain_label or 'none'}`.",
        "",
    ]
    notes = []
    if ar_label is None:
        notes.append(
            f"no AR run for {model}: no speed-up over AR (sweep an AR server of the same "
            "target, or name the baseline with --ar LABEL)"
        )
    if chain_label is None:
        notes.append(f"no NEXTN/EAGLE run for {model}: no speed-up over the chain baseline")
    for note in notes:
        print(f"[compare] warning: {note}", file=sys.stderr)
        md += [f"> **Warning:** {note}.", ""]
    cpu_runs = [run for run in runs.values() if run.timing]
    if cpu_runs:
        by_timing = defaultdict(list)
        for run in cpu_runs:
            by_timing[run.timing].append(f"`{run.label}`")
        md += [
            "> **† CPU demo server** (`sglang-spec cpu-server`): these latencies and throughputs "
            "are not an engine's; token counts and acceptance are exact. "
            + "; ".join(f"{', '.join(labs)}: {t}" for t, labs in by_timing.items())
            + ".",
            "",
        ]
    md += [
        "| run | algorithm | server config | api | prompts | max new tokens | T | records |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for run in runs.values():
        r0 = run.records[0]
        md.append(
            f"| {_name(run)} | {run.algorithm} | {r0.get('server_config') or '–'} | {r0.get('api', '–')} | "
            f"{Path(str(r0.get('dataset_name', '–'))).name} | {r0.get('max_new_tokens', '–')} | "
            f"{r0.get('temperature', '–')} | {len(run.records)} |"
        )
    md += ["", "### Output throughput (tok/s)", ""]
    md += _table(runs, cs, lambda run, c: _fmt(run.get(c, "output_throughput")))
    if any(run.get(c, "throughput_spread") for run in runs.values() for c in cs):
        md += [
            "",
            "### Spread of repeated levels: highest / lowest output throughput (levels)",
            "",
        ]
        md += _table(runs, cs, _spread_cell)
    md += ["", "### Per-request tok/s (median)", ""]
    md += _table(runs, cs, lambda run, c: _fmt(run.get(c, "median_per_request_output_throughput")))
    if ar_label is not None:
        md += ["", f"### Speed-up over AR (`{ar_label}`), output throughput", ""]
        md += _table(runs, cs, lambda run, c: _fmt(ratio(runs, run.label, ar_label, c), ".2f", "×"))
    if chain_label is not None:
        md += ["", f"### Speed-up over NEXTN / chain (`{chain_label}`), output throughput", ""]
        md += _table(
            runs, cs, lambda run, c: _fmt(ratio(runs, run.label, chain_label, c), ".2f", "×")
        )
    if ar_label is not None:
        md += ["", "### Per-request speed-up over AR (median per-request tok/s)", ""]
        md += _table(
            runs,
            cs,
            lambda run, c: _fmt(
                ratio(runs, run.label, ar_label, c, "median_per_request_output_throughput"),
                ".2f",
                "×",
            ),
        )
    md += ["", "### Acceptance: server accept length / per-request tokens per step", ""]
    md += _table(
        runs,
        cs,
        lambda run, c: (
            f"{_fmt(run.get(c, 'accept_length'), '.2f')} / {_fmt(run.get(c, 'tokens_per_step'), '.2f')}"
        ),
    )
    md += [
        "",
        "### Latency and errors",
        "",
        "| run | C | ok | err | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | ITL p50 | ITL p90 | ITL p99 ms | "
        "chunk gap p50 ms | chunk gap p99 ms | E2E p50 s | E2E p99 s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in runs.values():
        for c, lv in run.levels.items():
            md.append(
                f"| {_name(run)} | {c}{'*' if lv['interrupted'] else ''} | {lv['completed']} | {lv['failed']} | "
                f"{_fmt(lv['median_ttft_ms'])} | {_fmt(lv['p99_ttft_ms'])} | {_fmt(lv['median_tpot_ms'], '.2f')} | "
                f"{_fmt(lv['median_itl_ms'], '.2f')} | {_fmt(lv['p90_itl_ms'], '.2f')} | {_fmt(lv['p99_itl_ms'], '.2f')} | "
                f"{_fmt(lv['median_chunk_gap_ms'], '.2f')} | {_fmt(lv['p99_chunk_gap_ms'], '.2f')} | "
                f"{_fmt(None if lv['median_e2e_latency_ms'] is None else lv['median_e2e_latency_ms'] / 1000, '.2f')} | "
                f"{_fmt(None if lv['p99_e2e_latency_ms'] is None else lv['p99_e2e_latency_ms'] / 1000, '.2f')} |"
            )

    timing_note = (
        "† "
        + ", ".join(run.label for run in cpu_runs)
        + ": CPU demo server, not an engine's latencies"
        if cpu_runs
        else None
    )
    others = [lab for lab in runs if lab != ar_label]
    # key -> (title, y label, series, horizontal line, y minimum, note, why it can be empty)
    plots = {
        "throughput": (
            "Output throughput",
            "output tok/s",
            _series(runs, cs, lambda run, c: run.get(c, "output_throughput")),
            None,
            0.0,
            timing_note,
            "no level has an output throughput",
        ),
        "per_request": (
            "Per-request throughput (median)",
            "tok/s per request",
            _series(runs, cs, lambda run, c: run.get(c, "median_per_request_output_throughput")),
            None,
            0.0,
            timing_note,
            "no level has a per-request throughput",
        ),
        "speedup_ar": (
            f"Speed-up over AR (run {ar_label})",
            "× output throughput",
            _series(runs, cs, lambda run, c: ratio(runs, run.label, ar_label, c), others),
            1.0,
            0.0,
            timing_note,
            "no AR run" if ar_label is None else "no run besides the AR baseline",
        ),
        "speedup_nextn": (
            f"Speed-up over NEXTN/chain (run {chain_label})",
            "× output throughput",
            _series(
                runs,
                cs,
                lambda run, c: ratio(runs, run.label, chain_label, c),
                [lab for lab in others if lab != chain_label],
            ),
            1.0,
            0.0,
            timing_note,
            "no NEXTN/EAGLE run"
            if chain_label is None
            else "no run besides the AR and chain baselines",
        ),
        "acceptance": (
            "Acceptance (tokens per verify step)",
            "accept length",
            _series(runs, cs, lambda run, c: run.acceptance(c)),
            None,
            1.0,
            None,
            "no speculative run reported an acceptance",
        ),
    }
    md += ["", "### Plots", ""]
    missing = []
    for key, (ptitle, ylabel, series, hline, ymin, note, why_empty) in plots.items():
        if not series:
            missing.append(f"- no {ptitle.split(' (')[0].lower()} plot: {why_empty}.")
            continue
        fname = f"{s}_{key}.png"
        _plot(outdir / fname, f"{model}: {ptitle}", ylabel, series, colors, hline, ymin, note)
        md.append(f"![{ptitle}]({fname})")
    md += ["", *missing] if missing else []
    md.append("")
    return md


def write_report(
    records: list[dict],
    outdir: Path,
    ar: str | None = None,
    nextn: str | None = None,
    title: str = "Speculative decoding load test",
) -> Path:
    outdir.mkdir(parents=True, exist_ok=True)
    models = group(records)
    colors = run_colors(lab for runs in models.values() for lab in runs)
    md = [
        f"# {title}",
        "",
        f"{len(records)} level records from {len({r['_file'] for r in records})} file(s): "
        + ", ".join(f"`{f}`" for f in sorted({r["_file"] for r in records})),
        "",
        "Output tok/s = successful output tokens / level wall time; per-request tok/s = output tokens / "
        "end-to-end latency (median over requests); speed-ups are output-throughput ratios at equal concurrency; "
        "acceptance = server `avg_spec_accept_length` for the level (after `/flush_cache`), else completion "
        "tokens / `spec_verify_ct`. `*` = level interrupted. Runs are grouped by target model.",
        "",
    ]
    for model, runs in models.items():
        md += _model_section(model, runs, ar, nextn, colors, outdir)
    report = outdir / "report.md"
    report.write_text("\n".join(md) + "\n")
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "runs", nargs="+", type=existing_file, help="JSONL files written by loadtests.sweep"
    )
    p.add_argument(
        "-o", "--output-dir", type=output_dir, default="loadtest_report", help="report directory"
    )
    p.add_argument(
        "--ar",
        type=nonempty,
        default=None,
        help="label of the AR baseline (default: the run with algorithm AR)",
    )
    p.add_argument(
        "--nextn",
        type=nonempty,
        default=None,
        help="label of the chain baseline (default: NEXTN, else EAGLE3)",
    )
    p.add_argument("--title", default="Speculative decoding load test", help="report title")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(p)
    a = p.parse_args(argv)
    records = load_records(a.runs)
    if not records:
        return usage_error(
            PROG, "runs", " ".join(map(str, a.runs)), "JSONL files of loadtests.sweep level records"
        )
    labels = sorted({lab for runs in group(records).values() for lab in runs})
    for flag, label in (("--ar", a.ar), ("--nextn", a.nextn)):
        if label is not None and label not in labels:
            return usage_error(PROG, flag, label, "a run label: " + ", ".join(labels))
    report = write_report(records, a.output_dir, a.ar, a.nextn, a.title)
    print(f"[compare] wrote {report} and {len(list(a.output_dir.glob('*.png')))} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
