"""The real-scale records, the trace analysis and the report writer, on canned data (CPU only)."""

from __future__ import annotations

import json

import pytest

from e2e import records, scale_report, trace


def _rec(algorithm="AR", c=1, budget=None, ms=20.0, **kw):
    width = {"AR": 1, "NEXTN": 4, "DFLASH": 16}.get(algorithm, (budget or 0) + 1)
    base = {
        "shape": "qwen3.6-27b",
        "algorithm": algorithm,
        "budget": budget,
        "variant": "",
        "tp": 1,
        "simulated_accept_len": None,
        "concurrency": c,
        "width": width,
        "ms_per_step": ms,
        "tokens_per_s": 1000.0 * c / ms,
        "tokens_per_step": 1.0,
        "max_running_requests": 8,
        "cuda_graph_max_bs": 8,
        "start_s": 100.0,
    }
    return {**base, **kw}


# ------------------------------------------------------------------------------------ records
def test_level_metrics_speculative():
    metas = [
        {"completion_tokens": 128, "spec_verify_ct": 40},
        {"completion_tokens": 128, "spec_verify_ct": 50},
    ]
    m = records.level_metrics(metas, 2.0, speculative=True)
    assert m["ms_per_step"] == pytest.approx(2000 / 50)  # the longest request spans the level
    assert m["tokens_per_s"] == pytest.approx(256 / 2.0)
    assert m["tokens_per_step"] == pytest.approx(256 / 90)
    assert (m["steps"], m["completion_tokens"]) == (50, 256)


def test_level_metrics_ar_counts_decode_forwards():
    m = records.level_metrics([{"completion_tokens": 128}] * 4, 1.27, speculative=False)
    assert m["ms_per_step"] == pytest.approx(10.0) and m["steps"] == 127
    assert m["tokens_per_step"] == 1.0


@pytest.mark.parametrize(
    ("metas", "wall", "spec", "says"),
    [
        ([], 1.0, False, "needs requests"),
        ([{"completion_tokens": 5}], 0.0, False, "positive wall time"),
        ([{"completion_tokens": 5, "spec_verify_ct": 0}], 1.0, True, "without spec_verify_ct"),
        ([{"completion_tokens": 5}], 1.0, True, "without spec_verify_ct"),
        ([{"completion_tokens": 1}], 1.0, False, "at least 2 output tokens"),
    ],
)
def test_level_metrics_refuses(metas, wall, spec, says):
    with pytest.raises(records.RecordError, match=says):
        records.level_metrics(metas, wall, spec)


def test_validate():
    records.validate(_rec("DDTREE", budget=15))
    for bad, says in (
        ({k: v for k, v in _rec().items() if k != "tp"}, "lacks \\['tp'\\]"),
        (_rec("DDTREE", budget=15, width=15), "width must be budget \\+ 1"),
        (_rec("DFLASH", budget=15, width=16), "budget must be null"),
        ({**_rec(), "ms_per_step": 0.0}, "ms_per_step=0.0 must be a positive number"),
    ):
        with pytest.raises(records.RecordError, match=says):
            records.validate(bad)


def test_merge_replaces_the_same_server_and_level_only():
    old = [_rec(c=1, ms=10), _rec(c=2, ms=11), _rec("DDTREE", c=1, budget=15, ms=30)]
    new = [
        _rec(c=2, ms=99),
        _rec("DDTREE", c=1, budget=63, ms=40),
        _rec("DDTREE", c=1, budget=15, ms=31, simulated_accept_len=3.0),
        _rec(c=1, ms=12, variant="no-overlap"),
    ]
    merged = records.merge(old, new)
    assert len(merged) == 6
    by = {records.key(r): r["ms_per_step"] for r in merged}
    assert by[records.key(_rec(c=2))] == 99  # replaced
    assert by[records.key(_rec(c=1))] == 10  # kept
    assert by[records.key(_rec("DDTREE", c=1, budget=15))] == 30  # another τ is another server
    assert merged == records.merge(list(reversed(old)), new)  # sorted, whatever the input order


def test_save_and_load_round_trip(tmp_path):
    path = tmp_path / "a" / "r.json"
    records.save(path, [_rec()])
    assert records.load(path) == [_rec()] and not list(path.parent.glob("*.tmp"))
    assert records.load(tmp_path / "missing.json") == []
    (tmp_path / "bad.json").write_text('{"a": 1}')
    with pytest.raises(records.RecordError, match="expected a JSON list"):
        records.load(tmp_path / "bad.json")


# ------------------------------------------------------------------------------------ traces
def _ev(cat, name, corr, dur=None):
    """A Kineto trace event: a host call (no ``dur``) or a GPU activity of ``dur`` microseconds."""
    e = {"ph": "X", "cat": cat, "name": name, "args": {"correlation": corr}}
    return e if dur is None else {**e, "dur": dur}


def _events(steps, graph_ms, eager_ms, graph_launch="cudaGraphLaunch"):
    """Per step: one graph launch (a GEMM of ``graph_ms``), two eager Triton launches of
    ``eager_ms / 2`` each, a 0.1 ms device-to-host copy, and a flow event."""
    ev, corr = [], 0
    for _ in range(steps):
        corr += 1
        ev += [
            _ev("cuda_runtime", graph_launch, corr),
            _ev("kernel", "gemm", corr, 1000 * graph_ms),
        ]
        for name in ("topk", "tree"):
            corr += 1
            ev += [
                _ev("cuda_driver", "cuLaunchKernel", corr),
                _ev("kernel", name, corr, 500 * eager_ms),
            ]
        corr += 1
        ev += [
            _ev("cuda_runtime", "cudaMemcpyAsync", corr),
            _ev("gpu_memcpy", "Memcpy DtoH", corr, 100),
        ]
        ev.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr})  # flow events are ignored
    return ev


def test_trace_splits_graph_and_eager_time():
    s = trace.summarize(_events(4, graph_ms=20.0, eager_ms=2.0), steps=4)
    assert s["gpu_ms_per_step"] == pytest.approx(22.1)
    assert s["graph_ms_per_step"] == pytest.approx(20.0)
    assert s["eager_ms_per_step"] == pytest.approx(2.1)
    assert (s["graph_launches_per_step"], s["eager_launches_per_step"]) == (1.0, 2.0)
    assert s["verify_graph_replayed"] is True
    top = s["top_kernels"]
    assert [k["name"] for k in top] == ["gemm", "topk", "tree", "Memcpy DtoH"]
    assert top[0]["in_graph"] == 1.0 and top[1]["in_graph"] == 0.0
    assert top[0]["share"] == pytest.approx(20.0 / 22.1) and top[1]["calls_per_step"] == 1.0
    assert "verify replays a CUDA graph: yes" in trace.markdown(s)
    assert s["other_kernels"]["kernels"] == 0 and "other kernels" not in trace.markdown(s)


def test_trace_sums_the_kernels_below_the_top():
    """With ``top`` = 2 the table still accounts for the whole step: the other two kernels'
    time and calls in one row."""
    s = trace.summarize(_events(4, graph_ms=20.0, eager_ms=2.0), steps=4, top=2)
    assert [k["name"] for k in s["top_kernels"]] == ["gemm", "topk"]
    other = s["other_kernels"]
    assert other["kernels"] == 2 and other["calls_per_step"] == 2.0
    assert other["ms_per_step"] == pytest.approx(1.1) and other["share"] == pytest.approx(
        1.1 / 22.1
    )
    assert "| (2 other kernels) | 1.100 | 2.0 | 5.0% | |" in trace.markdown(s)


def test_trace_flags_an_eager_verify():
    # Graphs only for a small draft, the big verify eager: most GPU time outside graphs.
    s = trace.summarize(_events(4, graph_ms=2.0, eager_ms=20.0), steps=4)
    assert s[
        "verify_graph_replayed"
    ] is False and "verify replays a CUDA graph: NO" in trace.markdown(s)
    # No graph launch at all.
    s = trace.summarize(_events(4, graph_ms=20.0, eager_ms=2.0, graph_launch="cudaLaunchKernel"), 4)
    assert s["graph_share"] == 0.0 and s["verify_graph_replayed"] is False
    # Fewer graph launches than steps: not every step replayed.
    s = trace.summarize(_events(2, graph_ms=20.0, eager_ms=2.0), steps=4)
    assert s["verify_graph_replayed"] is False


def test_trace_charges_each_eager_launch_to_its_outermost_host_operator():
    """eager_sites: a launch inside nested operators goes to the outermost one of its thread; one
    outside every operator (a Triton kernel called from Python), or on a thread without operators,
    to its kernel; graph launches are not eager launches."""

    def op(name, ts, dur, tid=1):
        return {
            "ph": "X",
            "cat": "cpu_op",
            "name": name,
            "ts": ts,
            "dur": dur,
            "pid": 0,
            "tid": tid,
        }

    def launch(api, corr, ts, kernel, us, tid=1):
        host = {**_ev("cuda_runtime", api, corr), "ts": ts, "pid": 0, "tid": tid}
        return [host, _ev("kernel", kernel, corr, us)]

    ev = [op("aten::index_put_", 0, 100), op("aten::copy_", 10, 20), op("aten::add", 200, 10)]
    ev += launch("cudaLaunchKernel", 1, 15, "copy_kernel", 4)  # nested: the outer operator
    ev += launch("cudaLaunchKernel", 2, 50, "scatter_kernel", 6)
    ev += launch("cudaLaunchKernel", 3, 205, "add_kernel", 2)
    ev += launch("cuLaunchKernel", 4, 300, "ddtree_select", 10)  # between operators
    ev += launch("cuLaunchKernel", 5, 20, "ddtree_select", 10, tid=2)  # a thread without any
    ev += launch("cudaGraphLaunch", 6, 400, "gemm", 1000)
    s = trace.summarize(ev, steps=2)
    assert s["eager_launches_per_step"] == 2.5
    sites = {x["site"]: (x["launches_per_step"], x["gpu_ms_per_step"]) for x in s["eager_sites"]}
    assert sites == {
        "aten::index_put_": (1.0, pytest.approx(0.005)),
        "(no operator) ddtree_select": (1.0, pytest.approx(0.01)),
        "aten::add": (0.5, pytest.approx(0.001)),
    }
    assert [x["site"] for x in s["eager_sites"]][2] == "aten::add"  # by launches, most first
    assert "| `aten::index_put_` | 1.0 | 0.005 |" in trace.markdown(s)


def test_trace_splits_time_by_cuda_graph():
    """graphs: each captured graph (told apart by the activities one replay runs) with its replays
    per step, GPU ms per replay and top kernels, in the order of first replay; eager work is in
    none of them."""
    ev, corr = [], 0
    for _ in range(3):  # a step: a draft graph (2 kernels), a verify graph (3), one eager launch
        for graph in (
            [("mlp", 1000), ("topk", 500)],
            [("gemm", 8000), ("attn", 2000), ("gemm", 8000)],
        ):
            corr += 1
            ev.append(_ev("cuda_runtime", "cudaGraphLaunch", corr))
            ev += [_ev("kernel", name, corr, us) for name, us in graph]
        corr += 1
        ev += [_ev("cuda_driver", "cuLaunchKernel", corr), _ev("kernel", "commit", corr, 700)]
    s = trace.summarize(ev, steps=3)
    draft, verify = s["graphs"]
    assert (draft["activities_per_replay"], draft["replays_per_step"]) == (2, 1.0)
    assert draft["ms_per_replay"] == pytest.approx(1.5)
    assert [k["name"] for k in draft["top_kernels"]] == ["mlp", "topk"]
    assert verify["activities_per_replay"] == 3 and verify["ms_per_replay"] == pytest.approx(18.0)
    assert verify["top_kernels"][0] == {"name": "gemm", "ms_per_replay": pytest.approx(16.0)}
    assert verify["span_ms_per_replay"] is None  # these events carry no timestamps
    assert "| 3 | 1.0 | 18.000 | - | `gemm` 16.000, `attn` 2.000 |" in trace.markdown(s)


def test_trace_graph_span_counts_gaps_and_overlaps_once():
    """span_ms_per_replay: first start to last end of each replay, median over replays. A replay
    whose kernels leave gaps spans more than its kernel sum; one whose kernels overlap (a
    dependent launched into its predecessor's tail) spans less."""
    ev, corr = [], 0
    for gap_us in (100, 300, 200):  # three replays of one graph: kernels of 1000 + 2000 us
        corr += 1
        t0 = corr * 100_000
        ev.append(_ev("cuda_runtime", "cudaGraphLaunch", corr))
        ev += [
            {**_ev("kernel", "a", corr, 1000), "ts": t0},
            {**_ev("kernel", "b", corr, 2000), "ts": t0 + 1000 + gap_us},
        ]
    corr += 1  # another graph: b starts 400 us before a ends, c inside b
    ev.append(_ev("cuda_runtime", "cudaGraphLaunch", corr))
    ev += [
        {**_ev("kernel", "a", corr, 1000), "ts": 0},
        {**_ev("kernel", "b", corr, 2000), "ts": 600},
        {**_ev("kernel", "c", corr, 500), "ts": 700},
    ]
    s = trace.summarize(ev, steps=1)
    gapped, overlapped = s["graphs"]
    assert gapped["ms_per_replay"] == pytest.approx(3.0)
    assert gapped["span_ms_per_replay"] == pytest.approx(3.2)  # median gap 0.2 ms
    assert overlapped["ms_per_replay"] == pytest.approx(3.5)
    assert overlapped["span_ms_per_replay"] == pytest.approx(2.6)
    assert "| 2 | 3.0 | 3.000 | 3.200 |" in trace.markdown(s)


def test_trace_kernel_windows_time_the_work_between_two_landmarks_in_graphs():
    """kernel_windows: from a START kernel's end to the next END kernel's start, inside graph
    replays only (an eager pair does not count, nor a window that never closes); the median."""

    def k(name, corr, ts, us):
        return {**_ev("kernel", name, corr, us), "ts": ts}

    ev = [_ev("cuda_runtime", "cudaGraphLaunch", 1), _ev("cuda_runtime", "cudaGraphLaunch", 2)]
    ev += [k("split_a", 1, 0, 10), k("conv", 1, 12, 20), k("norm_x", 1, 40, 5)]  # 30 us
    ev += [k("split_a", 1, 50, 10), k("norm_x", 1, 100, 5)]  # 40 us
    ev += [k("split_a", 2, 0, 10), k("norm_x", 2, 60, 5), k("split_a", 2, 70, 5)]  # 50; unclosed
    ev += [_ev("cuda_driver", "cuLaunchKernel", 3), k("split_a", 3, 0, 1), k("norm_x", 3, 2, 1)]
    assert trace.kernel_windows(ev, "split", "norm") == {"windows": 3, "median_ms": 0.04}
    assert trace.kernel_windows(ev, "split", "absent") is None


def test_trace_window_flag_needs_two_prefixes(tmp_path, capsys):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _events(1, 1.0, 1.0)}))
    assert trace.main([str(path), "--steps", "1", "--window", "split"]) == 2
    assert "--window 'split': give START,END" in capsys.readouterr().err


def test_trace_reports_sglangs_host_spans_per_step():
    """host_spans: every user annotation name in order of first appearance, its spans per step
    and median ms; GPU-side annotations and instant events are not host spans."""
    ev = _events(2, 20.0, 2.0)
    for run_batch_us in (13000, 15000):
        ev += [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "scheduler.run_batch",
                "dur": run_batch_us,
            },
            {"ph": "X", "cat": "user_annotation", "name": "step[DRAFT bs=16]", "dur": 1300},
            {"ph": "X", "cat": "gpu_user_annotation", "name": "step[DRAFT bs=16]", "dur": 9000},
            {"ph": "i", "cat": "user_annotation", "name": "marker"},
        ]
    ev.append({"ph": "X", "cat": "user_annotation", "name": "step[DRAFT bs=16]", "dur": 2300})
    s = trace.summarize(ev, steps=2)
    assert s["host_spans"] == [
        {"name": "scheduler.run_batch", "per_step": 1.0, "median_ms": pytest.approx(14.0)},
        {"name": "step[DRAFT bs=16]", "per_step": 1.5, "median_ms": pytest.approx(1.3)},
    ]
    md = trace.markdown(s)
    assert "| `scheduler.run_batch` | 1.0 | 14.000 |" in md
    assert "| `step[DRAFT bs=16]` | 1.5 | 1.300 |" in md
    assert "host span" not in trace.markdown(trace.summarize(_events(2, 20.0, 2.0), steps=2))


def _host_step(t0, *, graphs, tid=1):
    """One ``scheduler.run_batch`` span at ``t0`` µs of 1000 µs on thread ``tid``: an
    ``aten::index`` (100 µs, with a nested ``aten::copy_`` and one kernel launch of 5 µs inside),
    then per graph a 20 µs graph launch followed by an ``aten::add`` (60 µs, one launch of 5 µs),
    then a Triton launch outside every operator (30 µs); a 2 µs event query before the graphs."""

    def x(cat, name, ts, dur, corr=None):
        e = {"ph": "X", "cat": cat, "name": name, "ts": t0 + ts, "dur": dur, "pid": 0, "tid": tid}
        return e if corr is None else {**e, "args": {"correlation": corr}}

    ev = [
        x("user_annotation", "scheduler.run_batch", 0, 1000),
        x("cpu_op", "aten::index", 10, 100),
        x("cpu_op", "aten::copy_", 20, 30),
        x("cuda_runtime", "cudaLaunchKernel", 25, 5, corr=1),
        x("cuda_runtime", "cudaEventQuery", 150, 2),  # a CUDA call, not a launch
    ]
    t = 200
    for _ in range(graphs):
        ev += [
            x("cuda_runtime", "cudaGraphLaunch", t, 20, corr=2),
            x("cpu_op", "aten::add", t + 40, 60),
            x("cuda_runtime", "cudaLaunchKernel", t + 50, 5, corr=3),
        ]
        t += 200
    ev.append(x("cuda_driver", "cuLaunchKernelEx", 900, 30, corr=4))
    return ev


def test_host_time_cuts_run_batch_at_its_graph_launches_and_sums_its_operators():
    """host_time: over the run_batch spans with the usual number of graph launches (a span with
    another count is left out), the pieces between graph launches with their eager launches, each
    graph launch's host ms, the outermost operators by name (nested ones not again), the CUDA calls
    outside operators, and the rest."""
    ev = _host_step(0, graphs=2) + _host_step(5000, graphs=2) + _host_step(10000, graphs=0)
    ev += _host_step(0, graphs=1, tid=7)  # another thread's spans are its own
    h = trace.host_time(ev)
    assert (h["spans"], h["spans_used"]) == (4, 2)
    assert [(x["segment"], x["median_ms"], x["launches"]) for x in h["segments"]] == [
        ("before the first graph launch", pytest.approx(0.2), 1),
        ("graph launch 1", pytest.approx(0.02), 1),
        ("after graph launch 1", pytest.approx(0.18), 1),
        ("graph launch 2", pytest.approx(0.02), 1),
        ("after the last graph launch", pytest.approx(0.58), 2),
    ]
    assert h["ops"] == [
        {"op": "aten::add", "ms_per_span": pytest.approx(0.12), "calls_per_span": 2.0},
        {"op": "aten::index", "ms_per_span": pytest.approx(0.1), "calls_per_span": 1.0},
    ]
    assert h["ops_ms"] == pytest.approx(0.22)
    assert h["launch_calls_ms"] == pytest.approx(0.072)  # the graph and Triton launches, the query
    assert h["python_ms"] == pytest.approx(1.0 - 0.22 - 0.072)
    md = trace.markdown(trace.summarize(ev, steps=2))
    assert "| after the last graph launch | 0.580 | 2 |" in md
    assert "| `aten::add` | 0.120 | 2.0 |" in md
    assert (
        "= host operators 0.220 + CUDA calls outside them 0.072 + the rest (Python) 0.708 ms" in md
    )
    assert trace.host_time(_events(2, 20.0, 2.0)) is None


def test_launch_sequence_lists_the_median_steps_launches_with_their_operators(tmp_path, capsys):
    """--sequence: of the spans with the usual number of graph launches, the one of median length
    (here the 1200 us one, not the 1000 or 1400 us ones, nor the span with one graph); each launch
    in host order with its outermost operator (the nested aten::copy_ is not it), ``-`` outside
    every operator, and what it ran (a graph launch: its first activity by start and how many);
    a CUDA call that launches nothing (the event query) is not listed."""
    import gzip

    def step(t0, dur, graphs=2):
        """_host_step with correlation ids of its own (both its graph launches share one)."""
        ev = _host_step(t0, graphs=graphs)
        ev[0] = {**ev[0], "dur": dur}
        for e in ev:
            if "args" in e:
                e["args"] = {"correlation": t0 + e["args"]["correlation"]}
        gpu = {1: ["index_kernel"], 2: ["gemm_b", "gemm_a"], 3: ["add_kernel"], 4: ["_triton"]}
        for corr, names in gpu.items():
            for k, name in enumerate(names):
                start = t0 + 2000 - 10 * k  # gemm_a starts first
                ev.append({**_ev("kernel", name, t0 + corr, 5), "ts": start})
        return ev

    ev = step(0, 1000) + step(5000, 1400) + step(10000, 1200) + step(20000, 1300, graphs=1)
    copy = {"ph": "X", "ts": 10950, "dur": 3, "pid": 0, "tid": 1}  # the median span's alone
    ev += [
        {**_ev("cuda_runtime", "cudaMemcpyAsync", 99), **copy},
        {**_ev("gpu_memcpy", "Memcpy DtoH", 99, 2), "ts": 12000},
    ]
    seq = trace.launch_sequence(ev)
    assert [(r["ms"], r["call"], r["operator"], r["ran"]) for r in seq] == [
        (pytest.approx(0.025), "cudaLaunchKernel", "aten::index", "index_kernel"),
        (
            pytest.approx(0.2),
            "cudaGraphLaunch",
            "-",
            "CUDA graph of 2 activities, first gemm_a",
        ),
        (pytest.approx(0.25), "cudaLaunchKernel", "aten::add", "add_kernel"),
        (pytest.approx(0.4), "cudaGraphLaunch", "-", "CUDA graph of 2 activities, first gemm_a"),
        (pytest.approx(0.45), "cudaLaunchKernel", "aten::add", "add_kernel"),
        (pytest.approx(0.9), "cuLaunchKernelEx", "-", "_triton"),
        (pytest.approx(0.95), "cudaMemcpyAsync", "-", "Memcpy DtoH"),
    ]
    assert trace.launch_sequence(_events(2, 20.0, 2.0)) is None
    path = tmp_path / "a-TP-0-DECODE.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    assert trace.main([str(path), "--steps", "3", "--sequence"]) == 0
    assert "| 0.900 | cuLaunchKernelEx | `-` | `_triton` |" in capsys.readouterr().out
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"traceEvents": _events(2, 20.0, 2.0)}))
    assert trace.main([str(bare), "--steps", "2", "--sequence"]) == 2
    assert "no scheduler.run_batch spans in" in capsys.readouterr().err


def test_host_delta_sets_two_traces_host_time_side_by_side(tmp_path, capsys):
    """--vs: the span and its parts, the pieces between graph launches when both traces have the
    same ones, and the operators by how much more time a span of A spends in them (an operator
    only one trace has counts as 0 in the other), A - B."""
    import gzip

    a = _host_step(0, graphs=2) + _host_step(5000, graphs=2)
    b = [e for e in a if e.get("name") != "aten::add"]  # B: no aten::add, but an aten::abs
    b += [{**e, "name": "aten::abs", "ts": e["ts"] + 900, "dur": 10} for e in b[1:2]]
    b += [{**e, "name": "aten::abs", "ts": e["ts"] + 5900, "dur": 10} for e in b[1:2]]
    d = trace.host_delta(trace.host_time(a, top=None), trace.host_time(b, top=None))
    assert d["totals"]["ops_ms"] == (pytest.approx(0.22), pytest.approx(0.11))
    # without the operator around them, B's two 5 us launches are CUDA calls outside operators
    assert d["totals"]["launch_calls_ms"] == (pytest.approx(0.072), pytest.approx(0.082))
    assert d["totals"]["python_ms"][1] == pytest.approx(1.0 - 0.11 - 0.082)
    assert [p["segment"] for p in d["pieces"]][-1] == "after the last graph launch"
    assert d["ops"][0] == {
        "op": "aten::add",
        "a_ms": pytest.approx(0.12),
        "b_ms": 0.0,
        "a_calls": 2.0,
        "b_calls": 0.0,
    }
    # by the size of the difference, not by name: aten::abs (B only, 0.01) before aten::index (0)
    assert [r["op"] for r in d["ops"]] == ["aten::add", "aten::abs", "aten::index"]
    assert d["ops"][2]["a_ms"] == d["ops"][2]["b_ms"]
    one_graph = trace.host_time(_host_step(0, graphs=1), top=None)
    assert trace.host_delta(trace.host_time(a, top=None), one_graph)["pieces"] is None
    paths = []
    for name, ev in (("a-TP-0-DECODE.trace.json.gz", a), ("b-TP-0-DECODE.trace.json.gz", b)):
        paths.append(tmp_path / name)
        with gzip.open(paths[-1], "wt") as f:
            json.dump({"traceEvents": ev}, f)
    assert trace.main([str(paths[0]), "--steps", "2", "--vs", str(paths[1])]) == 0
    out = capsys.readouterr().out
    assert "A = `a-TP-0-DECODE.trace.json.gz` against B = `b-TP-0-DECODE.trace.json.gz`" in out
    assert "| host operators | 0.220 | 0.110 | +0.110 |" in out
    assert "| `aten::add` | 0.120 (2.0) | 0.000 (0.0) | +0.120 |" in out
    assert trace.main([str(paths[0]), "--steps", "2", "--vs", str(tmp_path / "nope")]) == 2
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"traceEvents": _events(2, 20.0, 2.0)}))
    assert trace.main([str(paths[0]), "--steps", "2", "--vs", str(bare)]) == 2
    assert "no scheduler.run_batch spans in" in capsys.readouterr().err


def test_trace_cli(tmp_path, capsys):
    import gzip

    path = tmp_path / "x-TP-0-DECODE.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": _events(3, 20.0, 2.0)}, f)
    assert trace.main([str(path), "--steps", "3"]) == 0
    assert "| `gemm` | 20.000 | 1.0 |" in capsys.readouterr().out
    assert trace.main([str(tmp_path / "nope.json"), "--steps", "3"]) == 2
    assert trace.main([str(path), "--steps", "0"]) == 2


# ------------------------------------------------------------------------------------ report
CANNED = [
    _rec("AR", 1, ms=19.8),
    _rec("AR", 8, ms=25.6),
    _rec("DFLASH", 1, ms=26.8, tokens_per_step=1.06),
    _rec("DFLASH", 8, ms=56.8, tokens_per_step=1.06),
    _rec(
        "DDTREE",
        1,
        budget=63,
        ms=39.9,
        max_running_requests=1,
        capped_log=["max_running_requests is capped to 1 by the mamba state cache"],
    ),
    _rec("DDTREE", 8, budget=63, ms=311.0, max_running_requests=1),
    _rec("DDTREE", 1, budget=15, ms=35.0, simulated_accept_len=4.05, tokens_per_step=4.05),
    _rec(
        "NEXTN", 2, ms=47.3, mamba_cache_log=["Mamba Cache is allocated. max_mamba_cache_size: 24"]
    ),
    # a record from before the harness wrote its graph batch size
    {k: v for k, v in _rec("AR", 1, ms=9.0, shape="qwen3-8b").items() if k != "cuda_graph_max_bs"},
]


def test_level_tables_on_canned_records():
    md = scale_report.level_tables([records.validate(r) for r in CANNED])
    lines = md.splitlines()
    ms = lines[lines.index("### qwen3.6-27b: ms per step") :]
    rows = [ln for ln in ms if ln.startswith("| ")][1:6]
    assert rows == [
        "| AR | 1 | 8 | 8 | 100.0 | 1.00 | 19.8 | - | 25.6 |",
        "| NEXTN | 4 | 8 | 8 | 100.0 | 1.00 | - | 47.3 | - |",
        "| DFLASH | 16 | 8 | 8 | 100.0 | 1.06 | 26.8 | - | 56.8 |",
        "| DDTREE(15) [τ 4.05 sim.] | 16 | 8 | 8 | 100.0 | 4.05 | 35.0 | - | - |",
        "| DDTREE(63) | 64 | 1 | 8 | 100.0 | 1.00 | 39.9 | - | 311.0 |",
    ]
    tps = lines[lines.index("### qwen3.6-27b: output tokens/s") :]
    assert "| AR | 1 | 8 | 8 | 100.0 | 1.00 | 51 | - | 312 |" in tps
    assert "### qwen3-8b: ms per step" in lines
    assert "| AR | 1 | 8 | - | 100.0 | 1.00 | 9.0 |" in lines
    assert not any("decode ms per step" in ln for ln in lines)  # no record timed its prefill


def test_the_decode_table_lists_the_levels_that_timed_their_prefill():
    timed = [
        {**r, "prefill_s": 0.4, "decode_ms_per_step": round(r["ms_per_step"] - 3.0, 3)}
        for r in CANNED[:2]  # AR at C = 1 and 8
    ]
    md = scale_report.level_tables([records.validate(r) for r in timed + CANNED[2:]])
    lines = md.splitlines()
    title = "### qwen3.6-27b: decode ms per step (the level's prefill, timed alone, taken out)"
    decode = lines[lines.index(title) :]
    rows = [ln for ln in decode[3:] if ln.startswith("| ")]
    assert rows[0] == "| AR | 1 | 8 | 8 | 100.0 | 1.00 | 16.8 | - | 22.6 |"
    assert len(rows) == 1  # the other servers' levels did not time it


def test_server_name_of_an_adaptive_server_at_a_tau_per_budget():
    """Its variant names each budget's tau; the record's simulated_accept_len (SGLang's knob, the
    largest tau) is not shown as the server's tau."""
    variant = "adaptive=a27b+acc=7@3.17/63@4.23"
    rec = _rec("DDTREE", 1, budget=63, ms=30.0, simulated_accept_len=4.23, variant=variant)
    assert scale_report.server_name(rec) == f"DDTREE(63) [{variant}]"


def test_stage_table_marks_a_missing_stage_and_prints_the_run_spread():
    """stage_table, the one rendering of a stages summary: a stage a batch size lacks is "-" (not
    a zero that reads as free), the period is GPU sum + between, and the run-to-run spread of the
    period follows the table when the summary has it."""
    summary = {
        "by_bs": {
            "2": {
                "steps": 5,
                "host_ms": {"draft": 1.0, "verify": 2.0},
                "gpu_ms": {"draft": 1.5, "verify": 3.0},
                "gpu_between_ms": 0.5,
            },
            "1": {"steps": 4, "host_ms": {"verify": 2.0}, "gpu_ms": {"verify": 2.5}},
        },
        "run_periods": {"runs": 4, "min_steps": 30, "min_ms": 4.0, "median_ms": 5.0, "max_ms": 6.0},
    }
    lines = scale_report.stage_table(summary, "T").splitlines()
    assert lines[:4] == [
        "T",
        "",
        "| bs | steps | draft | verify | sum of medians | GPU between | GPU period |",
        "|---|---|---|---|---|---|---|",
    ]
    assert lines[4:6] == [
        "| 1 | 4 | - | 2.000 / 2.500 | 2.000 / 2.500 | - | - |",
        "| 2 | 5 | 1.000 / 1.500 | 2.000 / 3.000 | 3.000 / 4.500 | 0.500 | 5.000 |",
    ]
    assert lines[-1] == (
        "GPU period per run of >= 30 decode steps between prefills (4 runs): "
        "min 4.000 / median 5.000 / max 6.000 ms, max / min 1.50"
    )
    assert "GPU period per run" not in scale_report.stage_table(
        {**summary, "run_periods": None}, "T"
    )


def test_report_cli_merges_runs_and_writes_md_and_png(tmp_path):
    run1, run2 = tmp_path / "run1", tmp_path / "run2"
    records.save(run1 / "scale.json", CANNED[:4])
    records.save(run2 / "scale.json", [*CANNED[4:], _rec("AR", 8, ms=24.0)])
    (run2 / "stages").mkdir()
    (run2 / "stages" / "x_ddtree_b15.json").write_text(
        json.dumps(
            {
                "server_slug": "x_ddtree_b15",
                "by_bs": {
                    "8": {
                        "steps": 120,
                        "width": 16,
                        "host_ms": {"draft": 1.5, "verify": 2.0},
                        "gpu_ms": {"draft": 3.0, "verify": 30.0},
                        "gpu_between_ms": 1.25,
                    },
                    "1": {
                        "steps": 130,
                        "width": 16,
                        "host_ms": {"draft": 1.0, "verify": 1.0},
                        "gpu_ms": {"draft": 2.0, "verify": 20.0},
                    },
                },
                "extends_by_bs": {
                    "8": {
                        "extends": 2,
                        "tokens": 4096,
                        "host_ms": 5.5,
                        "gpu_ms": 120.25,
                        "gpu_between_ms": None,
                    },
                    "1": {
                        "extends": 3,
                        "tokens": 512,
                        "host_ms": 4.0,
                        "gpu_ms": 60.0,
                        "gpu_between_ms": 0.5,
                    },
                },
            }
        )
    )
    (run2 / "profiles").mkdir()
    prof = trace.summarize(_events(5, 20.0, 2.0), 5)
    (run2 / "profiles" / "x-C8.json").write_text(
        json.dumps({**prof, "server": "x", "concurrency": 8})
    )
    results = tmp_path / "res" / "scale_h200.json"

    assert scale_report.main([str(results), str(run1), str(run2)]) == 0
    merged = records.load(results)
    assert len(merged) == len(CANNED)  # run2's AR C=8 replaced run1's
    assert (
        next(r for r in merged if r["algorithm"] == "AR" and r["concurrency"] == 8)["ms_per_step"]
        == 24.0
    )
    md = results.with_suffix(".md").read_text()
    assert "| AR | 1 | 8 | 8 | 100.0 | 1.00 | 19.8 | - | 24.0 |" in md
    assert "max_running_requests is capped to 1" in md and "Mamba Cache is allocated" in md
    # bs sorted numerically; the GPU time between steps and the period where the summary has it
    assert "| 1 | 130 | 1.000 / 2.000 | 1.000 / 20.000 | 2.000 / 22.000 | - | - |" in md
    assert "| 8 | 120 | 1.500 / 3.000 | 2.000 / 30.000 | 3.500 / 33.000 | 1.250 | 34.250 |" in md
    # the prefills, under the decode steps, by new requests sorted numerically
    assert "| 1 | 3 | 512 | 4.000 | 60.000 | 0.500 |\n| 8 | 2 | 4096 | 5.500 | 120.250 | - |" in md
    assert "x at C = 8: 22.10 GPU ms per step" in md
    png = results.with_suffix(".png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (results.with_suffix("") / "stages" / "x_ddtree_b15.json").exists()

    # Re-running with no new run rewrites the report from the merged file alone.
    results.with_suffix(".md").unlink()
    assert scale_report.main([str(results)]) == 0
    assert "DDTREE(63)" in results.with_suffix(".md").read_text()


def test_report_cli_refuses_bad_input(tmp_path, capsys):
    assert scale_report.main([str(tmp_path / "r.txt")]) == 2
    assert scale_report.main([str(tmp_path / "r.json"), str(tmp_path / "no-run")]) == 2
    assert scale_report.main([str(tmp_path / "r.json")]) == 2  # nothing to report
    err = capsys.readouterr().err
    assert "must end in .json" in err and "no scale.json in" in err and "holds no records" in err
