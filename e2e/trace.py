"""A torch-profiler trace of a few decode steps (SGLang's ``/start_profile``), read offline on a CPU.

``python -m e2e.trace TRACE.trace.json.gz --steps N`` prints the top GPU kernels by time (the rest
summed in one row) and says whether the steps replay CUDA graphs; ``--vs OTHER`` also sets the host
time inside ``run_batch`` against another trace's, operator by operator (``host_delta``);
``--sequence`` lists one step's launches in host order with their operators (``launch_sequence``);
``--window START,END`` the median GPU time between two kernel landmarks inside graph replays
(``kernel_windows``).

Every GPU activity in a Kineto trace carries the ``correlation`` id of the host call that launched
it: a kernel whose launch is ``cudaGraphLaunch`` ran inside a replayed graph, one launched by
``cudaLaunchKernel`` / ``cuLaunchKernel`` (Triton) ran eagerly. The verdict
``verify_graph_replayed`` needs (a) at least one graph launch per step and (b) graph-launched work
holding the majority of the steps' GPU time: for a real-scale target the verify forward (all target
layers at the verify width) is by far the largest part of a step, so a verify that ran eagerly --
graphs only for the drafter's few layers -- cannot pass (b), while the eager work around a replayed
verify (top-K, tree build, walk, commit) can stay a minority.

Per captured CUDA graph (``graphs``; the verify's and the drafter's differ in how many GPU
activities one replay runs): replays per step, GPU ms per replay (the kernel sum), the replay's
span (first start to last end: what the step pays, gaps included, overlaps once) and its top kernels.

Where the eager launches come from (``eager_sites``): each eager kernel launch is charged to the
outermost host operator (a ``cpu_op`` event, e.g. ``aten::index_put_``) running on its thread when
it was launched, or, launched outside any operator (a Triton kernel called from Python), to the
kernel itself; per site, the launches and their kernels' GPU time per step.

Where the host's time goes (``host_spans``): SGLang's own annotations of its scheduler loop and
worker (``user_annotation`` events: ``scheduler.run_batch``, ``scheduler.process_batch_result``,
``step[DRAFT bs=16]``, ...), each with its spans per step and median milliseconds. A launch-bound
step (the tiny pair's) is as long as its host's run_batch; a GPU-bound one waits for the GPU in
process_batch_result.

What a launch-bound step's host does inside ``scheduler.run_batch`` (``host_time``), median over the
run_batch spans with the most common number of CUDA-graph launches (the others, e.g. the span the
profiler's stop synchronises in, are not decode steps like the rest):

* ``segments``: the span cut at its CUDA-graph launches (a DDTREE step: the drafter's graph, the
  draft tree's, the target verify's), each piece's host ms and the eager launches in it, and each
  graph launch's own host ms. Only spans with the most common number of graph launches count, so
  the pieces line up: "after the last graph launch" of a DDTREE step is its walk and commit.
* ``ops``: the outermost host operators (``aten::index``, ...) inside the spans, summed by name
  (ms and calls per span); ``launch_calls_ms``: CUDA runtime / driver calls outside every operator
  (Triton kernels launched from Python, graph launches); ``python_ms``: the rest of the span, the
  framework's own Python.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
GRAPH_LAUNCHES = ("cudaGraphLaunch", "cuGraphLaunch")
KERNEL_LAUNCHES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
)


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a (gzipped) chrome trace."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def _outermost_ops(events: list[dict]) -> dict[tuple, tuple[list[float], list[tuple]]]:
    """Per (pid, tid): the host operators not nested in another, as (sorted starts, [(start, end,
    name)]) -- disjoint intervals, so one bisection finds the one around a time."""
    by_thread: dict[tuple, list[tuple]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op" and e.get("ph") == "X" and "ts" in e:
            start = float(e["ts"])
            by_thread[e.get("pid"), e.get("tid")].append(
                (start, start + float(e.get("dur", 0.0)), e.get("name", "?"))
            )
    out = {}
    for thread, ops in by_thread.items():
        ops.sort(key=lambda o: (o[0], -o[1]))
        outer: list[tuple] = []
        for op in ops:
            if not outer or op[0] >= outer[-1][1]:
                outer.append(op)
        out[thread] = ([o[0] for o in outer], outer)
    return out


def _enclosing_op(call: dict, outer: dict) -> str | None:
    """The outermost host operator (:func:`_outermost_ops`) running on ``call``'s thread when it
    started, None outside every operator."""
    starts, ops = outer.get((call.get("pid"), call.get("tid")), ([], []))
    if "ts" in call and starts:
        t = float(call["ts"])
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and ops[i][0] <= t <= ops[i][1]:
            return ops[i][2]
    return None


def _launch_site(launch: dict, outer: dict, kernel: str) -> str:
    return _enclosing_op(launch, outer) or f"(no operator) {kernel}"


def summarize(events: list[dict], steps: int, top: int = 15) -> dict:
    """Per-step GPU time split by origin (graph replay or eager launch), launch counts, the top
    GPU activities by total time, and the graph-replay verdict (see the module docstring)."""
    if steps < 1:
        raise ValueError(f"steps={steps} must be >= 1")
    host = _host_calls(events)
    launches = {}  # correlation id -> its eager kernel launch event
    graph_launches = eager_launches = 0
    for e in events:
        if e.get("cat") in CUDA_CALLS:
            name = e.get("name", "")
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None and name in KERNEL_LAUNCHES:
                launches[corr] = e
            graph_launches += name in GRAPH_LAUNCHES
            eager_launches += name in KERNEL_LAUNCHES
    outer = _outermost_ops(events)
    sites: dict[str, dict] = defaultdict(lambda: {"launches": 0, "ms": 0.0})
    by_name: dict[str, dict] = defaultdict(lambda: {"ms": 0.0, "count": 0, "graph_ms": 0.0})
    total = {"graph": 0.0, "eager": 0.0}
    for e in events:
        if e.get("cat") not in GPU_CATEGORIES or e.get("ph") != "X":
            continue
        ms = float(e.get("dur", 0.0)) / 1000.0
        corr = (e.get("args") or {}).get("correlation")
        origin = "graph" if host.get(corr) in GRAPH_LAUNCHES else "eager"
        total[origin] += ms
        launch = launches.get(corr)
        if launch is not None and e.get("cat") == "kernel":
            site = sites[_launch_site(launch, outer, e.get("name", "?"))]
            site["launches"] += 1
            site["ms"] += ms
        row = by_name[e.get("name", "?")]
        row["ms"] += ms
        row["count"] += 1
        row["graph_ms"] += ms if origin == "graph" else 0.0
    gpu_ms = total["graph"] + total["eager"]
    graph_share = total["graph"] / gpu_ms if gpu_ms else 0.0
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1]["ms"])
    ranked, rest = ranked[:top], [row for _, row in ranked[top:]]
    rest_ms = sum(row["ms"] for row in rest)
    return {
        "steps": steps,
        "gpu_ms_per_step": gpu_ms / steps,
        "graph_ms_per_step": total["graph"] / steps,
        "eager_ms_per_step": total["eager"] / steps,
        "graph_share": graph_share,
        "graph_launches_per_step": graph_launches / steps,
        "eager_launches_per_step": eager_launches / steps,
        "verify_graph_replayed": graph_launches >= steps and graph_share > 0.5,
        "top_kernels": [
            {
                "name": name,
                "ms_per_step": row["ms"] / steps,
                "calls_per_step": row["count"] / steps,
                "share": row["ms"] / gpu_ms if gpu_ms else 0.0,
                "in_graph": row["graph_ms"] / row["ms"] if row["ms"] else 0.0,
            }
            for name, row in ranked
        ],
        # the kernels below the top ones, summed: a step's gap can hide in many small kernels
        # (session 23's C = 16 traces: 7.5 against 3.8 GPU ms a step outside the top 15)
        "other_kernels": {
            "kernels": len(rest),
            "ms_per_step": rest_ms / steps,
            "calls_per_step": sum(row["count"] for row in rest) / steps,
            "share": rest_ms / gpu_ms if gpu_ms else 0.0,
        },
        "eager_sites": [
            {
                "site": name,
                "launches_per_step": row["launches"] / steps,
                "gpu_ms_per_step": row["ms"] / steps,
            }
            for name, row in sorted(sites.items(), key=lambda kv: -kv[1]["launches"])[:top]
        ],
        "graphs": _graphs(_graph_replays(events, host), steps),
        "host_spans": _host_spans(events, steps),
        "host_time": host_time(events, top=top),
    }


def _host_spans(events: list[dict], steps: int) -> list[dict]:
    """SGLang's host annotations (module docstring), in the order of first appearance: per name,
    spans per step and median ms."""
    spans: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("ph") == "X" and "dur" in e:
            spans.setdefault(e.get("name", "?"), []).append(float(e["dur"]) / 1000.0)
    return [
        {"name": name, "per_step": len(ms) / steps, "median_ms": statistics.median(ms)}
        for name, ms in spans.items()
    ]


RUN_BATCH = "scheduler.run_batch"
CUDA_CALLS = ("cuda_runtime", "cuda_driver")
LAUNCHES = (*KERNEL_LAUNCHES, "cudaMemcpyAsync", "cudaMemsetAsync")


def host_time(events: list[dict], top: int | None = 15) -> dict | None:
    """Where the host's time goes inside SGLang's ``scheduler.run_batch`` spans (module
    docstring), or None for a trace without them; ``top`` operators (None: all)."""
    usual = _usual_spans(events)
    if usual is None:
        return None
    spans, same, _, _ = usual
    modal = len(same[0]["graph_ms"])
    segments = []
    for i in range(modal + 1):
        where = "before the first graph launch" if i == 0 else f"after graph launch {i}"
        if i == modal and modal:
            where = "after the last graph launch"
        segments.append(
            {
                "segment": where if modal else "the whole span (no graph launch)",
                "median_ms": statistics.median(p["segment_ms"][i] for p in same),
                "launches": statistics.median(p["segment_launches"][i] for p in same),
            }
        )
        if i < modal:
            segments.append(
                {
                    "segment": f"graph launch {i + 1}",
                    "median_ms": statistics.median(p["graph_ms"][i] for p in same),
                    "launches": 1,
                }
            )
    n = len(same)
    ops: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for p in same:
        for name, (ms, count) in p["ops"].items():
            ops[name][0] += ms
            ops[name][1] += count
    ranked = sorted(ops.items(), key=lambda kv: -kv[1][0])
    return {
        "spans": len(spans),
        "spans_used": n,
        "median_ms": statistics.median(p["ms"] for p in same),
        "segments": segments,
        "ops_ms": statistics.median(p["ops_ms"] for p in same),
        "launch_calls_ms": statistics.median(p["loose_ms"] for p in same),
        "python_ms": statistics.median(p["python_ms"] for p in same),
        "ops": [
            {"op": name, "ms_per_span": ms / n, "calls_per_span": count / n}
            for name, (ms, count) in ranked[:top]
        ],
    }


def _usual_spans(events: list[dict]) -> tuple[list, list[dict], list[dict], dict] | None:
    """The ``run_batch`` spans, the :func:`_span_host_time` of those with the most common number
    of graph launches (with their spans under ``"span"``), the CUDA calls on the spans' threads in
    time order and their outermost operators; None for a trace without such spans."""
    spans = [
        e
        for e in events
        if e.get("cat") == "user_annotation" and e.get("name") == RUN_BATCH and "dur" in e
    ]
    if not spans or any("ts" not in e for e in spans):
        return None
    threads = {(e.get("pid"), e.get("tid")) for e in spans}
    calls = sorted(
        (e for e in events if e.get("cat") in CUDA_CALLS and "ts" in e and _on(e, threads)),
        key=lambda e: float(e["ts"]),
    )
    outer = _outermost_ops([e for e in events if _on(e, threads)])
    per_span = [{**_span_host_time(span, calls, outer), "span": span} for span in spans]
    modal = statistics.mode(len(p["graph_ms"]) for p in per_span)
    return spans, [p for p in per_span if len(p["graph_ms"]) == modal], calls, outer


def launch_sequence(events: list[dict]) -> list[dict] | None:
    """One decode step's launches in host order, to name the code behind a launch-bound step's
    pieces (session 28 read the 27B step's 159 launches after its verify graph this way: the
    simulated walk, the torch conv commit, the tree compaction, the drafter's context): of the
    ``run_batch`` spans with the usual number of graph launches, the one of median length; per
    kernel launch, copy, memset and graph launch, its start in ms from the span's, the CUDA call,
    the outermost host operator around it (``-``: none, e.g. a Triton launch from Python) and what
    it ran on the GPU (a graph launch: its first kernel and how many activities it replayed).
    None for a trace without ``run_batch`` spans."""
    usual = _usual_spans(events)
    if usual is None:
        return None
    _, same, calls, outer = usual
    span = sorted(same, key=lambda p: p["ms"])[(len(same) - 1) // 2]["span"]
    t0, t1 = float(span["ts"]), float(span["ts"]) + float(span["dur"])
    thread = (span.get("pid"), span.get("tid"))
    ran: dict = defaultdict(list)  # correlation id -> its GPU activities, (start, name)
    for e in events:
        if e.get("cat") in GPU_CATEGORIES:
            ran[(e.get("args") or {}).get("correlation")].append(
                (float(e.get("ts", 0.0)), e.get("name", "?"))
            )
    out = []
    for c in calls:
        t = float(c["ts"])
        if not (t0 <= t <= t1 and _on(c, {thread})):
            continue
        name = c.get("name", "")
        if name not in LAUNCHES and name not in GRAPH_LAUNCHES:
            continue
        gpu = sorted(ran.get((c.get("args") or {}).get("correlation"), []))
        what = gpu[0][1] if gpu else "?"
        if name in GRAPH_LAUNCHES:
            what = f"CUDA graph of {len(gpu)} activities, first {what}"
        out.append(
            {
                "ms": (t - t0) / 1000.0,
                "call": name,
                "operator": _enclosing_op(c, outer) or "-",
                "ran": what,
            }
        )
    return out


def sequence_markdown(seq: list[dict]) -> str:
    """:func:`launch_sequence` as a table."""
    lines = ["| ms | CUDA call | host operator | ran |", "|---|---|---|---|"]
    for r in seq:
        lines.append(
            f"| {r['ms']:.3f} | {r['call']} | `{_short(r['operator'])}` | `{_short(r['ran'])}` |"
        )
    return "\n".join(lines)


def _on(e: dict, threads: set) -> bool:
    return (e.get("pid"), e.get("tid")) in threads


def _span_host_time(span: dict, calls: list[dict], outer: dict) -> dict:
    """One run_batch span: its pieces between graph launches, its outermost operators by name,
    the CUDA calls outside them and the rest."""
    t0 = float(span["ts"])
    t1 = t0 + float(span["dur"])
    thread = (span.get("pid"), span.get("tid"))
    inside = [c for c in calls if t0 <= float(c["ts"]) <= t1 and _on(c, {thread})]
    segment_ms, segment_launches, graph_ms = [], [], []
    start, launches = t0, 0
    for c in inside:
        if c.get("name") in GRAPH_LAUNCHES:
            segment_ms.append((float(c["ts"]) - start) / 1000.0)
            segment_launches.append(launches)
            graph_ms.append(float(c.get("dur", 0.0)) / 1000.0)
            start, launches = float(c["ts"]) + float(c.get("dur", 0.0)), 0
        elif c.get("name") in LAUNCHES:
            launches += 1
    segment_ms.append((t1 - start) / 1000.0)
    segment_launches.append(launches)
    starts, ops = outer.get(thread, ([], []))
    lo, hi = bisect.bisect_left(starts, t0), bisect.bisect_right(starts, t1)
    by_name: dict[str, list] = defaultdict(lambda: [0.0, 0])
    ops_us = 0.0
    for begin, end, name in ops[lo:hi]:
        us = min(end, t1) - begin
        by_name[name][0] += us / 1000.0
        by_name[name][1] += 1
        ops_us += us
    loose_us = sum(float(c.get("dur", 0.0)) for c in inside if _enclosing_op(c, outer) is None)
    return {
        "ms": (t1 - t0) / 1000.0,
        "segment_ms": segment_ms,
        "segment_launches": segment_launches,
        "graph_ms": graph_ms,
        "ops": by_name,
        "ops_ms": ops_us / 1000.0,
        "loose_ms": loose_us / 1000.0,
        "python_ms": (t1 - t0 - ops_us - loose_us) / 1000.0,
    }


def _host_calls(events: list[dict]) -> dict:
    """Correlation id -> the name of the CUDA runtime / driver call that launched its work."""
    return {
        corr: e.get("name", "")
        for e in events
        if e.get("cat") in CUDA_CALLS
        and (corr := (e.get("args") or {}).get("correlation")) is not None
    }


def _graph_replays(events: list[dict], host: dict) -> dict:
    """The GPU activities each replayed CUDA graph ran, by its launch's correlation id (``host``:
    :func:`_host_calls`), in trace order."""
    replays: dict = defaultdict(list)
    for e in events:
        if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X":
            corr = (e.get("args") or {}).get("correlation")
            if host.get(corr) in GRAPH_LAUNCHES:
                replays[corr].append(e)
    return replays


def _graphs(replays: dict, steps: int, top: int = 8) -> list[dict]:
    """Per captured CUDA graph, told apart by how many GPU activities one replay runs (a decode
    step replays the verify's and the drafter's, which differ), in the order of their first
    replay: replays per step, GPU ms and activities per replay, and its top kernels. Session 25
    found budget 7's C = 16 gap to NEXTN this way: the verify graphs within 0.5 ms, the draft
    graph 1.6 ms dearer.

    ``span_ms_per_replay`` (median, None without timestamps) is the replay's wall time on the
    GPU, first start to last end: what a step pays. The kernel sum leaves out the gaps between
    kernels and counts twice the time kernels overlap, as SGLang's GDN kernels do under
    programmatic dependent launch, each waiting inside its predecessor's tail (session 31:
    budget 7's verify graph summed 28.54 ms and spanned 29.58, NEXTN's summed 28.03 and spanned
    28.00, so only the spans compare)."""
    by_size: dict[int, list[list]] = {}
    for corr in sorted(replays):  # correlation ids count launches in order
        by_size.setdefault(len(replays[corr]), []).append(replays[corr])
    out = []
    for size, runs in by_size.items():
        kernels: dict[str, float] = defaultdict(float)
        for run in runs:
            for e in run:
                kernels[e.get("name", "?")] += float(e.get("dur", 0.0)) / 1000.0 / len(runs)
        spans = [_span_ms(run) for run in runs]
        out.append(
            {
                "activities_per_replay": size,
                "replays_per_step": len(runs) / steps,
                "ms_per_replay": sum(kernels.values()),
                "span_ms_per_replay": (
                    None if None in spans else statistics.median(spans)  # type: ignore[type-var]
                ),
                "top_kernels": [
                    {"name": name, "ms_per_replay": ms}
                    for name, ms in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]
                ],
            }
        )
    return out


def _span_ms(run: list[dict]) -> float | None:
    """One graph replay's first start to last end, ms; None when an activity has no timestamp."""
    if any(e.get("ts") is None for e in run):
        return None
    end = max(e["ts"] + e.get("dur", 0.0) for e in run)
    return (end - min(e["ts"] for e in run)) / 1000.0


def kernel_windows(events: list[dict], start: str, end: str) -> dict | None:
    """The GPU time from each kernel whose name starts with ``start`` ending to the next kernel
    after it whose name starts with ``end`` starting, inside replayed CUDA graphs: how long the
    work between two landmarks of a layer takes, gaps and overlaps counted once (session 31:
    the GDN core, from ``fused_qkvzba_split`` to ``_layer_norm_fwd``, 86.6 us a layer for budget
    7's width-8 verify at C = 16 against 75.4 for NEXTN's width 4). ``{"windows", "median_ms"}``,
    or None when no window closes."""
    windows = []
    for run in _graph_replays(events, _host_calls(events)).values():
        opened = None
        for e in sorted(run, key=lambda e: e["ts"]):
            if opened is not None and e["name"].startswith(end):
                windows.append((e["ts"] - opened) / 1000.0)
                opened = None
            if e["name"].startswith(start):
                opened = e["ts"] + e["dur"]
    if not windows:
        return None
    return {"windows": len(windows), "median_ms": statistics.median(windows)}


def _short(name: str) -> str:
    """A kernel or operator name cut to 80 characters for a table cell."""
    return name if len(name) <= 80 else name[:77] + "..."


def markdown(summary: dict) -> str:
    s = summary
    head = (
        f"{s.get('server', 'trace')}"
        + (f" at C = {s['concurrency']}" if "concurrency" in s else "")
        + f": {s['gpu_ms_per_step']:.2f} GPU ms per step over {s['steps']} steps, "
        f"{100 * s['graph_share']:.0f}% of it in replayed CUDA graphs "
        f"({s['graph_launches_per_step']:.1f} graph launches, "
        f"{s['eager_launches_per_step']:.1f} eager kernel launches per step); "
        f"verify replays a CUDA graph: {'yes' if s['verify_graph_replayed'] else 'NO'}"
    )
    rows = [
        "| kernel | GPU ms/step | calls/step | share | in graphs |",
        "|---|---|---|---|---|",
    ]
    for k in s["top_kernels"]:
        rows.append(
            f"| `{_short(k['name'])}` | {k['ms_per_step']:.3f} | {k['calls_per_step']:.1f} | "
            f"{100 * k['share']:.1f}% | {100 * k['in_graph']:.0f}% |"
        )
    other = s.get("other_kernels")  # summaries written before session 24 lack it
    if other and other["kernels"]:
        rows.append(
            f"| ({other['kernels']} other kernels) | {other['ms_per_step']:.3f} | "
            f"{other['calls_per_step']:.1f} | {100 * other['share']:.1f}% | |"
        )
    sites = [
        "| eager launches from | launches/step | GPU ms/step |",
        "|---|---|---|",
    ]
    for site in s.get("eager_sites", []):
        sites.append(
            f"| `{_short(site['site'])}` | {site['launches_per_step']:.1f} | "
            f"{site['gpu_ms_per_step']:.3f} |"
        )
    graphs = [
        "| CUDA graph (activities per replay) | replays/step | GPU ms per replay | span ms per replay | its top kernels (ms) |",
        "|---|---|---|---|---|",
    ]
    for g in s.get("graphs", []):  # summaries written before session 25 lack it
        tops = ", ".join(
            f"`{_short(k['name'])[:40]}` {k['ms_per_replay']:.3f}" for k in g["top_kernels"][:4]
        )
        span = g.get("span_ms_per_replay")  # summaries written before session 31 lack it
        graphs.append(
            f"| {g['activities_per_replay']} | {g['replays_per_step']:.1f} | "
            f"{g['ms_per_replay']:.3f} | {'-' if span is None else f'{span:.3f}'} | {tops} |"
        )
    host = ["| host span (SGLang annotation) | per step | median ms |", "|---|---|---|"]
    for h in s.get("host_spans", []):  # summaries written before session 26 lack it
        host.append(f"| `{_short(h['name'])}` | {h['per_step']:.1f} | {h['median_ms']:.3f} |")
    tables = [[head], rows] + ([graphs] if len(graphs) > 2 else []) + [sites]
    tables += [host] if len(host) > 2 else []
    tables += _host_time_tables(s.get("host_time"))  # summaries before session 27 lack it
    return "\n\n".join("\n".join(t) for t in tables)


def _host_time_tables(h: dict | None) -> list[list[str]]:
    if not h:
        return []
    head = (
        f"Host time inside `{RUN_BATCH}`, {h['spans_used']} of its {h['spans']} spans (those with "
        f"the usual number of graph launches), medians: {h['median_ms']:.3f} ms a span = host "
        f"operators {h['ops_ms']:.3f} + CUDA calls outside them {h['launch_calls_ms']:.3f} + the "
        f"rest (Python) {h['python_ms']:.3f} ms"
    )
    segments = [
        "| piece of the span | median host ms | eager launches |",
        "|---|---|---|",
    ]
    for seg in h["segments"]:
        segments.append(f"| {seg['segment']} | {seg['median_ms']:.3f} | {seg['launches']:g} |")
    ops = ["| host operator | ms per span | calls per span |", "|---|---|---|"]
    for op in h["ops"]:
        ops.append(
            f"| `{_short(op['op'])}` | {op['ms_per_span']:.3f} | {op['calls_per_span']:.1f} |"
        )
    return [[head], segments, ops]


def record_decode_trace(
    url: str,
    folder: Path,
    prefix: str,
    steps: int,
    run: Callable[[], object],
    *,
    meta: dict | None = None,
    wait_s: float = 120.0,
    keep: bool = False,
    top: int = 40,
) -> dict | None:
    """A torch-profiler trace of ``steps`` decode batches of the server at ``url``: SGLang's
    ``/start_profile`` by stage into ``folder`` (files named ``prefix``...), then ``run()`` (the
    requests to trace), then, once the DECODE trace is written (the export can lag the requests; at
    most ``wait_s`` seconds), its :func:`summarize` (``top`` kernels: a step's gap can sit below the
    top 15, session 23) with ``meta`` (e.g. the server and concurrency) written to
    ``<folder>.json`` and returned; None when no complete trace came.
    The folder's files are deleted afterwards, the trace itself kept with ``keep``. The server
    starts the decode trace at its first batch of at least ``SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS``
    requests (an environment variable of the server)."""
    from e2e import kit

    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    kit.call(
        url + "/start_profile",
        {
            "output_dir": str(folder),
            "num_steps": steps,
            "activities": ["CPU", "GPU"],
            "profile_by_stage": True,
            "with_stack": False,
            "record_shapes": False,
            "profile_prefix": prefix,
        },
        timeout=60,
    )
    run()
    deadline = time.monotonic() + wait_s
    events = path = None
    while events is None and time.monotonic() < deadline:
        for path in sorted(folder.glob("*DECODE*.trace.json*")):
            try:
                events = load_events(path)
                break
            except (OSError, EOFError, ValueError):  # still being written
                events = None
        if events is None:
            time.sleep(1.0)
    if events is None:
        return None
    summary = {**summarize(events, steps, top=top), **(meta or {}), "trace": path.name}
    Path(f"{folder}.json").write_text(json.dumps(summary, indent=1))
    for f in folder.iterdir():
        if not (keep and f == path):
            f.unlink()
    return summary


def host_delta(a: dict, b: dict, top: int = 15) -> dict:
    """Two traces' :func:`host_time` (all operators) side by side, ``a`` against ``b``: the span
    and its parts, the pieces between graph launches where both have the same pieces, and the
    ``top`` operators by how much more host time a span of ``a`` spends in them (both ways)."""
    totals = {
        key: (a[key], b[key]) for key in ("median_ms", "ops_ms", "launch_calls_ms", "python_ms")
    }
    pieces = None
    if [x["segment"] for x in a["segments"]] == [x["segment"] for x in b["segments"]]:
        pieces = [
            {"segment": x["segment"], "a_ms": x["median_ms"], "b_ms": y["median_ms"]}
            for x, y in zip(a["segments"], b["segments"], strict=True)
        ]
    ops_a = {o["op"]: o for o in a["ops"]}
    ops_b = {o["op"]: o for o in b["ops"]}
    rows = []
    for name in ops_a.keys() | ops_b.keys():
        x, y = ops_a.get(name, {}), ops_b.get(name, {})
        rows.append(
            {
                "op": name,
                "a_ms": x.get("ms_per_span", 0.0),
                "b_ms": y.get("ms_per_span", 0.0),
                "a_calls": x.get("calls_per_span", 0.0),
                "b_calls": y.get("calls_per_span", 0.0),
            }
        )
    rows.sort(key=lambda r: (-abs(r["a_ms"] - r["b_ms"]), r["op"]))
    return {"totals": totals, "pieces": pieces, "ops": rows[:top]}


def delta_markdown(d: dict, a: str, b: str) -> str:
    """:func:`host_delta`'s tables, the traces named ``a`` and ``b`` above them, A and B in them."""
    t = d["totals"]
    lines = [
        f"Host time inside `{RUN_BATCH}`, A = `{a}` against B = `{b}` (medians, ms a span):",
        "",
        "| part | A | B | A - B |",
        "|---|---|---|---|",
    ]
    names = {"median_ms": "the span", "ops_ms": "host operators"}
    names |= {"launch_calls_ms": "CUDA calls outside them", "python_ms": "the rest (Python)"}
    for key, (x, y) in t.items():
        lines.append(f"| {names[key]} | {x:.3f} | {y:.3f} | {x - y:+.3f} |")
    for piece in d["pieces"] or []:
        x, y = piece["a_ms"], piece["b_ms"]
        lines.append(f"| {piece['segment']} | {x:.3f} | {y:.3f} | {x - y:+.3f} |")
    lines += ["", "| host operator | A ms (calls) | B ms (calls) | A - B |"]
    lines.append("|---|---|---|---|")
    for r in d["ops"]:
        lines.append(
            f"| `{_short(r['op'])}` | {r['a_ms']:.3f} ({r['a_calls']:.1f}) | "
            f"{r['b_ms']:.3f} ({r['b_calls']:.1f}) | {r['a_ms'] - r['b_ms']:+.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m e2e.trace", description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path, help="a *.trace.json[.gz] written by SGLang's profiler")
    ap.add_argument("--steps", type=int, required=True, help="decode steps the trace holds")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument(
        "--vs",
        type=Path,
        metavar="TRACE",
        help="also compare the host time inside run_batch with this trace's, operator by operator "
        "(e.g. a DDTREE step against DFLASH's: where its extra milliseconds go)",
    )
    ap.add_argument(
        "--sequence",
        action="store_true",
        help="also list one decode step's launches in host order, each with its host operator "
        "and what it ran (launch_sequence): which code a piece's launches come from",
    )
    ap.add_argument(
        "--window",
        metavar="START,END",
        help="also the median GPU time, inside graph replays, from the end of each kernel named "
        "START... to the start of the next kernel named END... (kernel_windows), e.g. "
        "fused_qkvzba_split,_layer_norm_fwd for a GDN layer's core",
    )
    args = ap.parse_args(argv)
    if args.window is not None and len(args.window.split(",")) != 2:
        print(
            f"python -m e2e.trace: --window {args.window!r}: give START,END (two kernel-name "
            "prefixes)",
            file=sys.stderr,
        )
        return 2
    for path in (args.trace, args.vs):
        if path is not None and not path.is_file():
            print(f"python -m e2e.trace: no such file {path}", file=sys.stderr)
            return 2
    if args.steps < 1 or args.top < 1:
        print("python -m e2e.trace: --steps and --top must be >= 1", file=sys.stderr)
        return 2
    events = load_events(args.trace)
    print(markdown(summarize(events, args.steps, args.top)))
    if args.window is not None:
        start, end = args.window.split(",")
        w = kernel_windows(events, start, end)
        print(
            f"\nwindow {start} -> {end}: "
            + (
                "none closes"
                if w is None
                else f"{w['windows']} windows, median {w['median_ms']:.4f} ms"
            )
        )
    if args.sequence:
        seq = launch_sequence(events)
        if seq is None:
            print(
                f"python -m e2e.trace: no {RUN_BATCH} spans in {args.trace}; "
                "valid: a trace of SGLang's scheduler",
                file=sys.stderr,
            )
            return 2
        print()
        print(sequence_markdown(seq))
    if args.vs is not None:
        a, b = host_time(events, top=None), host_time(load_events(args.vs), top=None)
        if a is None or b is None:
            print(
                f"python -m e2e.trace: no {RUN_BATCH} spans in "
                f"{args.trace if a is None else args.vs}; valid: a trace of SGLang's scheduler",
                file=sys.stderr,
            )
            return 2
        print()
        print(delta_markdown(host_delta(a, b, args.top), args.trace.name, args.vs.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
