"""``python -m e2e.tiny_bar SWEEPS_DIR...``: issue 15's tiny-pair load-sweep bar (CPU).

The bar: adaptive DDTREE's output tokens/s >= DFLASH's and >= AR's at every concurrency C, and
within 5 % of the best fixed DDTREE budget's. ``SWEEPS_DIR`` is an ``e2e.tiny_pair`` run's
``sweeps/`` folder (one ``loadtests.sweep`` JSONL per server; the servers named as
``tiny_pair`` names them: ``ar...``, ``dflash...``, ``ddtree<budget>...`` and one
``ddtree<budget>...+adaptive``), from ``e2e/h200_adaptive.sh PARTS=interleaved``, whose levels
alternate between the servers, or from runs of one server after another; several folders when
the servers ran in several calls (session 32: four servers one after another outran one call;
``CALL1,CALL2`` names one run's folders), or when the same servers ran again: their passes are
pooled, run after run (``load_runs``). A run of the fixed and adaptive DDTREE servers alone (no
AR, no DFLASH: twice the passes of a four-server run in a call's time) judges the 5 % criterion
alone and its verdict line says so (:func:`judged`). Two
servers at the same budget have differed by up to 7 % in step time (sessions 35 and 36, adaptive
against the fixed DDTREE(63)), and in both of session 36's runs the one started first on a fresh
machine was the slower, so the 5 % criterion is read from two runs with the servers in opposite
orders.

A concurrency swept P times (``SWEEP_PASSES``) has P levels per server; the k-th level of every
server at C is pass k. Each ratio is taken within a pass (servers measured seconds apart in an
interleaved run) and the verdict reads the median over the passes, with their lowest and highest
beside it: a drifting machine moved one server's level by up to 1.4x between passes (session 25),
which ratios of per-server medians taken minutes apart would carry. Beside each median, the
interval that holds the median of the passes' law with >= 90 % (:func:`median_interval`, from the
order statistics: no assumption on the noise's shape) says whether the passes can tell at all:
``held`` (the interval at or above the floor), ``missed`` (below) or ``open`` (across it). Session
38 measured one configuration twice in one run at 0.67-1.47x level by level, so a few passes
leave a 5 % floor open; the verdict's exit code reads the medians.

Why a ratio is what it is: where the sweep records carry them (``loadtests.sweep`` since session
11), a second table gives every server's tokens per verify step and median chunk gap (ms between a
streaming request's chunks: one decode step at a time), medians over the passes, and the adaptive
server's ratio over DFLASH and over the best fixed budget split into the two: tokens per step
(which budget it ran, and the probes) times the step rate (the inverse ratio of chunk gaps: what its
steps cost). The product leaves out the prefills, so it only approximates the tokens/s ratio. On
the launch-bound tiny pair a miss from the step rate is host time, one from tokens per step the
budget choice. (Session 25's sweeps, read this way: at C = 1 DDTREE(63)'s chunk gap was 7.4 ms,
DFLASH's 5.2 and AR's 2.3; 1.19x DFLASH's tokens per step at 0.66x its step rate.)

Why a step took what it took: where the levels carry host counters (``loadtests.sweep
--watch-pid``, which ``e2e.tiny_pair`` passes since session 37), a third table gives, pass by
pass, each server's chunk gap beside its decode loop's time on a CPU and waiting for one, the
host's steal share, the GPU's SM clock and kernel share, and the CPU probe's unit time
(``--cpu-probe``). Waiting says contention, steal the hypervisor, a lower SM clock a GPU that
slowed down, a slower probe unit a slower CPU. The loop's time on a CPU follows the gap whatever
the cause (it spins on the GPU; session 38: 97-98 % of every level, while the gaps of every
server moved between 4.0 and 6.3 ms at C = 1).

Whether a server's place in a concurrency's order moves its level: where the levels name it
(``place``, ``loadtests.sweep`` since session 42, whose passes at one C all ran the servers in one
order until ``--first-server`` rotated it by the pass), a last table gives each server's levels
over its own median at that C, by place, pooled over C: below 1 at place 0, say, a server that
runs slower first.

A pass in which some server's level did not complete (0 tokens/s or ``interrupted``: a pass cut by
a time-out) is left out at that C (``skipped_passes``).

Prints the tables and the verdict, writes ``--json``; exits 0 when the bar is met at every C, 1
when not, 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

from e2e import kit
from e2e.tiny_pair import parse_server, read_text

NEAR_BEST = 0.95  # the bar: within 5 % of the best fixed budget
FLOORS = {"dflash": 1.0, "ar": 1.0, "best_fixed": NEAR_BEST}  # adaptive over each, at least
COVERAGE = 0.9  # of each median's interval (median_interval)
STEP_FIELDS = ("tokens_per_step", "median_chunk_gap_ms")  # the second table's, when recorded


def load_runs(*runs: Sequence[Path]) -> dict[str, dict[int, list[dict]]]:
    """{server label: {C: [level record of pass 1, 2, ...]}} from every JSONL in the folders of
    ``runs``, each run the ``sweeps/`` folders of its calls (``RUN_A,RUN_B`` on the command line:
    its servers split over calls, each in one folder). Several runs: either the same servers in
    every run (repeated runs, say one run's servers started in the reverse order of the other's:
    each run's passes follow the previous run's, so the k-th pass of every server is from one run),
    or one folder a run and each server in one of them (a bar split over calls, named one by
    one)."""
    loaded = [_load_run(folders) for folders in runs]
    held = [set(run) for run in loaded]
    split = all(len(f) == 1 for f in runs) and sum(map(len, held)) == len(set().union(*held))
    if not split and any(h != held[0] for h in held):
        raise kit.HarnessError(
            f"runs {' '.join(','.join(map(str, f)) for f in runs)} hold servers "
            f"{' / '.join(str(sorted(h)) for h in held)}; valid: each server in one folder (a bar "
            "split over calls; one run's folders may be joined by commas) or the same servers in "
            "every run (repeated runs)"
        )
    pooled: dict[str, dict[int, list[dict]]] = {}
    for run in loaded:  # run after run
        for label, by_c in run.items():
            for c, levels in by_c.items():
                pooled.setdefault(label, {}).setdefault(c, []).extend(levels)
    return pooled


def _load_run(folders: Sequence[Path]) -> dict[str, dict[int, list[dict]]]:
    """One run: its servers' levels from ``folders``, one file a server in all of them
    (``.jsonl``, or ``.jsonl.xz`` as the repository keeps them)."""
    run: dict[str, dict[int, list[dict]]] = {}
    for folder in folders:
        # the servers' order: by file name
        for path in sorted([*folder.glob("*.jsonl"), *folder.glob("*.jsonl.xz")]):
            levels = [json.loads(ln) for ln in read_text(path).splitlines() if ln.strip()]
            labels = {lv.get("label") for lv in levels}
            if len(labels) != 1 or None in labels:
                raise kit.HarnessError(
                    f"{path}: levels of {sorted(map(str, labels))}; valid: one server"
                )
            label = labels.pop()
            if label in run:
                where = ",".join(map(str, folders))
                raise kit.HarnessError(f"{path}: a second file of server {label!r} in {where}")
            by_c = run[label] = {}
            for lv in levels:
                by_c.setdefault(int(lv["max_concurrency"]), []).append(lv)
    return run


def roles(labels: list[str]) -> tuple[str | None, str | None, str, list[str]]:
    """(AR, DFLASH, adaptive, [fixed DDTREE]) server labels, AR and DFLASH None when the run has
    none (it then judges only the criteria it has servers for: :func:`judged`); one line naming
    what is missing, or that some servers ran ``+fusednorms`` and others not."""
    fused = {label for label in labels if "fusednorms" in parse_server(label)[2]}
    if fused and fused != set(labels):
        raise kit.HarnessError(
            f"servers {sorted(labels)}: only {sorted(fused)} ran +fusednorms; valid: every "
            "server with the kit's torch norms or every one with the fused ones (the norms' cost "
            "grows with a verify's tokens, so mixed runs do not compare)"
        )
    ar, dflash, adaptive, fixed = [], [], [], []
    for label in labels:
        algorithm, _budget, mods = parse_server(label)
        if algorithm == "ar":
            ar.append(label)
        elif algorithm == "dflash":
            dflash.append(label)
        elif algorithm == "ddtree":
            (adaptive if "adaptive" in mods else fixed).append(label)
    if len(ar) > 1 or len(dflash) > 1 or len(adaptive) != 1 or not fixed:
        raise kit.HarnessError(
            f"servers {sorted(labels)}: the bar needs one +adaptive DDTREE server, at least one "
            f"fixed DDTREE server and at most one AR and one DFLASH; got AR {ar}, DFLASH "
            f"{dflash}, adaptive {adaptive}, fixed {fixed}"
        )
    return (ar or [None])[0], (dflash or [None])[0], adaptive[0], fixed


def judged(ar: str | None, dflash: str | None) -> dict[str, float]:
    """The criteria a run judges, with their floors: within 5 % of the best fixed budget always,
    >= DFLASH and >= AR where it ran them (a run of the fixed and adaptive DDTREE servers alone
    has twice the passes of one with all four in the same time, for the 5 % criterion alone)."""
    present = {"dflash": dflash, "ar": ar, "best_fixed": True}
    return {key: floor for key, floor in FLOORS.items() if present[key]}


def complete(level: dict) -> bool:
    """A level that ran to its end: a pass cut by a time-out records 0 tokens/s or
    ``interrupted``."""
    return float(level.get("output_throughput") or 0) > 0 and not level.get("interrupted")


def verdict(runs: dict[str, dict[int, list[dict]]]) -> list[dict]:
    """Per C: every server's median tokens/s and the adaptive server's per-pass ratios (median,
    lowest, highest) over DFLASH, AR and the pass's best fixed budget, and whether the bar holds;
    with the step fields recorded, ``steps`` (module docstring). Only the passes in which every
    server's level completed count (``skipped_passes``: the others)."""
    ar, dflash, adaptive, fixed = roles(list(runs))
    servers = tuple(s for s in (ar, dflash, *fixed, adaptive) if s is not None)
    floors = judged(ar, dflash)
    rows = []
    for c in sorted(runs[adaptive]):
        ran = min(len(runs[s].get(c, [])) for s in runs)
        kept = [k for k in range(ran) if all(complete(runs[s][c][k]) for s in servers)]
        if not kept:
            raise kit.HarnessError(
                f"C = {c}: no pass in which every server's level completed; valid: a run whose "
                "servers all finished a level at every C"
            )
        passes = [{s: runs[s][c][k] for s in servers} for k in kept]
        per_pass = []
        for lv in passes:
            a = float(lv[adaptive]["output_throughput"])
            best = max(fixed, key=lambda f: float(lv[f]["output_throughput"]))
            others = {"dflash": dflash, "ar": ar, "best_fixed": best}
            per_pass.append(
                {
                    "best": best,
                    **{key: a / float(lv[others[key]]["output_throughput"]) for key in floors},
                }
            )
        ratios = {key: _ratio([p[key] for p in per_pass], floor) for key, floor in floors.items()}
        row = {
            "concurrency": c,
            "passes": len(kept),
            "skipped_passes": ran - len(kept),
            "tokens_per_s": {
                s: statistics.median(float(lv[s]["output_throughput"]) for lv in passes)
                for s in servers
            },
            "adaptive_over": ratios,
            "met": all(q["median"] >= floors[key] for key, q in ratios.items()),
            "resolved": _resolved([q["resolved"] for q in ratios.values()]),
        }
        steps = [{s: step_values(lv[s], s == ar) for s in servers} for lv in passes]
        if all(v is not None for st in steps for v in st.values()):
            row["steps"] = _steps(steps, servers, adaptive, dflash, per_pass)
        host = {s: [host_values(lv[s]) for lv in passes] for s in servers}
        if all(v is not None for per in host.values() for v in per):
            row["host"] = host
        rows.append(row)
    return rows


def median_interval(values: Sequence[float], coverage: float = COVERAGE) -> tuple:
    """(low, high, its coverage): the narrowest interval between order statistics
    ``[x_(j), x_(n+1-j)]`` that holds the median of whatever law the values are drawn from with
    probability >= ``coverage`` (``1 - 2 P(B < j)``, B ~ Binomial(n, 1/2): the count of values
    below the median), no assumption on that law; with too few values for ``coverage`` the
    widest one, the lowest to the highest value, and the coverage it has (4 values: 87.5 %)."""
    xs, n = sorted(values), len(values)
    j, below = 1, 0.5**n  # below: P(B < j)
    while j < (n + 1) // 2:
        nxt = below + math.comb(n, j) * 0.5**n  # P(B < j + 1)
        if 1 - 2 * nxt < coverage:
            break
        j, below = j + 1, nxt
    return xs[j - 1], xs[n - j], 1 - 2 * below


def _ratio(values: list[float], floor: float) -> dict:
    """A ratio's passes read against its floor: median, lowest, highest, the median's interval
    (:func:`median_interval`) and whether that interval lies at or above the floor (``held``),
    below it (``missed``) or across it (``open``: these passes cannot tell)."""
    low, high, coverage = median_interval(values)
    return {
        "median": statistics.median(values),
        "low": min(values),
        "high": max(values),
        "interval": [low, high],
        "coverage": coverage,
        "resolved": "held" if low >= floor else "missed" if high < floor else "open",
    }


def _resolved(states: list[str]) -> str:
    return "missed" if "missed" in states else "open" if "open" in states else "held"


def step_values(level: dict, ar: bool) -> tuple[float, float] | None:
    """A level's (tokens per step, median chunk gap), or None when it did not record them (an AR
    server's records carry no tokens per step: one)."""
    tau, gap = (level.get(f) for f in STEP_FIELDS)
    if tau is None and ar:
        tau = 1.0
    return (float(tau), float(gap)) if tau and gap else None


def host_values(level: dict) -> dict | None:
    """A level's step as its scheduler spent it (``loadtests.host_counters``, recorded with
    ``--watch-pid``): the median chunk gap (ms), the decode loop's time on a CPU and waiting for
    one, per chunk gap (its shares of the level's wall time times the gap), the host's steal
    share (%), where NVML read them (``loadtests/gpu_clocks.py``) the GPU's mean SM clock (MHz)
    and kernel share (%), and where the sweep probed the CPU (``loadtests/cpu_probe.py``) the
    median time of its unit of CPython work (ms); each of the last three None where not recorded;
    None without the host counters."""
    host, gap = level.get("host") or {}, level.get("median_chunk_gap_ms")
    if host.get("on_cpu_pct") is None or host.get("steal_pct") is None or not gap:
        return None
    gpu, probe = level.get("gpu") or {}, level.get("cpu_probe") or {}
    return {
        "chunk_gap_ms": float(gap),
        "cpu_ms": host["on_cpu_pct"] / 100.0 * float(gap),
        "runq_ms": host["run_delay_pct"] / 100.0 * float(gap),
        "steal_pct": host["steal_pct"],
        "sm_mhz": gpu.get("sm_mhz_mean"),
        "gpu_busy_pct": gpu.get("util_pct_mean"),
        "probe_ms": probe.get("unit_ms_median"),
    }


def _steps(steps: list[dict], servers, adaptive: str, dflash: str, per_pass) -> dict:
    """Medians over the passes (``steps``: per pass, each server's :func:`step_values`) of each
    server's tokens per step and chunk gap, and of the adaptive server's ratios over DFLASH and
    over each pass's best fixed budget as (tokens per step, step rate) factors."""

    def split(others: list[str]) -> dict:  # the server compared with, pass by pass
        pairs = [(st[adaptive], st[o]) for st, o in zip(steps, others, strict=True)]
        return {
            "tokens_per_step": statistics.median(a[0] / o[0] for a, o in pairs),
            "step_rate": statistics.median(o[1] / a[1] for a, o in pairs),
        }

    return {
        "per_server": {
            s: {f: statistics.median(st[s][i] for st in steps) for i, f in enumerate(STEP_FIELDS)}
            for s in servers
        },
        **({"adaptive_over_dflash": split([dflash] * len(steps))} if dflash else {}),
        "adaptive_over_best_fixed": split([p["best"] for p in per_pass]),
    }


def place_effect(runs: dict[str, dict[int, list[dict]]]) -> dict[str, dict[int, list[float]]]:
    """{server: {place: [its complete levels' tokens/s over its median at their C]}}, from the
    levels that name their place in the concurrency's order; empty when none does."""
    out: dict[str, dict[int, list[float]]] = {}
    for label, by_c in runs.items():
        for levels in by_c.values():
            done = [lv for lv in levels if complete(lv)]
            placed = [lv for lv in done if "place" in lv]
            if not placed:
                continue
            mid = statistics.median(float(lv["output_throughput"]) for lv in done)
            for lv in placed:
                share = float(lv["output_throughput"]) / mid
                out.setdefault(label, {}).setdefault(int(lv["place"]), []).append(share)
    return out


def _place_markdown(places: dict[str, dict[int, list[float]]]) -> list[str]:
    if not places:
        return []
    count = 1 + max(p for by_place in places.values() for p in by_place)
    lines = _captioned_head(
        "Each server's levels over its own median at their C, by its place in the concurrency's "
        "order (0: first), pooled over C: median (levels):",
        ["server", *(f"place {p}" for p in range(count))],
    )
    for label, by_place in places.items():
        cells = [label]
        for p in range(count):
            got = by_place.get(p)
            cells.append(f"{statistics.median(got):.3f} ({len(got)})" if got else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


NAMES = {"dflash": "DFLASH", "ar": "AR", "best_fixed": "best fixed"}  # a criterion's column


def markdown(rows: list[dict], places: dict[str, dict[int, list[float]]] | None = None) -> str:
    servers = list(rows[0]["tokens_per_s"])
    criteria = list(rows[0]["adaptive_over"])  # judged (:func:`judged`), in FLOORS' order
    head = ["C", "passes", *servers, *(f"adaptive / {NAMES[key]}" for key in criteria)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cut = r.get("skipped_passes")
        cells = [str(r["concurrency"]), f"{r['passes']}" + (f" ({cut} cut)" if cut else "")]
        cells += [f"{r['tokens_per_s'][s]:.0f}" for s in servers]
        for key in criteria:
            floor, q = FLOORS[key], r["adaptive_over"][key]
            mark = "" if q["median"] >= floor else " **miss**"
            lo, hi = q["interval"]
            cells.append(
                f"{q['median']:.3f}{mark} [{lo:.2f}, {hi:.2f}: {q['resolved']}] "
                f"({q['low']:.2f}-{q['high']:.2f})"
            )
        lines.append("| " + " | ".join(cells) + " |")
    lines += _steps_markdown(rows, servers)
    lines += _host_markdown(rows, servers)
    lines += _place_markdown(places or {})
    missed = [r["concurrency"] for r in rows if not r["met"]]
    unjudged = [NAMES[key] for key in FLOORS if key not in criteria]
    bar = "issue 15 tiny bar" + (
        f" (within 5 % of the best fixed budget only: no {' or '.join(unjudged)} server in this "
        "run)"
        if unjudged
        else ""
    )
    lines.append("")
    lines.append(
        f"{bar}: met at every C"
        if not missed
        else f"{bar}: missed at C = {', '.join(map(str, missed))}"
    )
    coverage = min(q["coverage"] for r in rows for q in r["adaptive_over"].values())
    by_state = {
        state: [str(r["concurrency"]) for r in rows if r["resolved"] == state]
        for state in ("held", "open", "missed")
    }
    lines.append(
        f"the medians' intervals (>= {100 * coverage:.1f} % each): "
        + "; ".join(f"{state} at C = {', '.join(cs)}" for state, cs in by_state.items() if cs)
    )
    return "\n".join(lines)


def _captioned_head(caption: str, head: list[str]) -> list[str]:
    """A further table's first lines: a blank line, its caption, a blank line, its header."""
    return ["", caption, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]


def _steps_markdown(rows: list[dict], servers: list[str]) -> list[str]:
    if not any("steps" in r for r in rows):
        return []
    split = next(r["steps"] for r in rows if "steps" in r)
    ratios = [key for key in ("dflash", "best_fixed") if f"adaptive_over_{key}" in split]
    lines = _captioned_head(
        "Tokens per verify step / median chunk gap (ms), medians of the passes; the adaptive "
        "server's ratios as (tokens per step) x (step rate: the other's chunk gap over its own), "
        "prefills left out:",
        ["C", *servers, *(f"adaptive / {NAMES[key]}" for key in ratios)],
    )
    for r in rows:
        if "steps" not in r:
            continue
        st = r["steps"]
        cells = [str(r["concurrency"])]
        for s in servers:
            e = st["per_server"][s]
            cells.append(f"{e['tokens_per_step']:.2f} / {e['median_chunk_gap_ms']:.2f}")
        for key in ratios:
            q = st[f"adaptive_over_{key}"]
            cells.append(f"{q['tokens_per_step']:.3f} x {q['step_rate']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _host_markdown(rows: list[dict], servers: list[str]) -> list[str]:
    if not any("host" in r for r in rows):
        return []
    passes = max(r["passes"] for r in rows if "host" in r)
    head = ["server", "C", *(f"pass {k + 1}" for k in range(passes))]
    lines = _captioned_head(
        "Each pass's median chunk gap (ms) and, within it, the decode loop's time on a CPU and "
        "waiting for one (ms, from its shares of the level's wall time), the host's steal "
        "share (loadtests/host_counters.py), the GPU's mean SM clock and kernel share where NVML "
        "read them (loadtests/gpu_clocks.py) and the median time of the CPU probe's unit of "
        "CPython work where the sweep ran it (loadtests/cpu_probe.py):",
        head,
    )
    for s in servers:
        for r in rows:
            if "host" not in r:
                continue
            cells = [s, str(r["concurrency"])]
            for h in r["host"][s]:
                sm = "" if h["sm_mhz"] is None else f"; SM {h['sm_mhz']:.0f} MHz"
                busy = "" if h["gpu_busy_pct"] is None else f", busy {h['gpu_busy_pct']:.0f} %"
                probe = "" if h["probe_ms"] is None else f"; probe {h['probe_ms']:.3f} ms"
                cells.append(
                    f"{h['chunk_gap_ms']:.2f} (cpu {h['cpu_ms']:.2f}, runq {h['runq_ms']:.2f}; "
                    f"steal {h['steal_pct']:.1f} %{sm}{busy}{probe})"
                )
            cells += [""] * (len(head) - len(cells))
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.tiny_bar", description=__doc__.splitlines()[0])
    ap.add_argument(
        "sweeps",
        type=lambda text: tuple(Path(p) for p in text.split(",")),
        nargs="+",
        help="e2e.tiny_pair runs' sweeps/ folders, a run's calls joined by commas (CALL1,CALL2: "
        "its servers split over them); several runs of the same servers: their passes pooled",
    )
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args(argv)
    try:
        folders = [folder for run in args.sweeps for folder in run]
        for folder in folders:
            if not folder.is_dir():
                raise kit.HarnessError(f"{folder}: no such folder (an e2e.tiny_pair --out/sweeps)")
        runs = load_runs(*args.sweeps)
        if not runs:
            raise kit.HarnessError(f"{' '.join(map(str, folders))}: no sweep JSONL files")
        rows = verdict(runs)
    except (kit.HarnessError, KeyError, ValueError) as e:
        print(f"python -m e2e.tiny_bar: {e}", file=sys.stderr)
        return 2
    print(markdown(rows, place_effect(runs)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["met"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
