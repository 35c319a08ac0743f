"""A stand-in for ``python -m sglang.launch_server`` that the e2e harness tests launch (``--launcher``).

It serves what the harnesses read from a real server -- the scheduler's capacity line, the GDN state
lines, ``/health``, ``/flush_cache``, ``/server_info``, batched and single ``/generate`` (ids or
text) with SGLang's ``meta_info`` counts, ``/start_profile`` writing a Kineto-like decode trace, and
the DDTREE per-stage file when ``SGLANG_DDTREE_STAGE_TIMES`` is set -- and appends its argv, the
environment it was given and its start time to ``$FAKE_CALLS`` (one JSON line per start), and starts an idle child titled
``sglang::scheduler_TP0``, as SGLang's scheduler process is (its pid in that line). Streaming ``/generate``
(one chunk per step, SGLang's ``data:`` lines), ``/abort_request`` and, with ``--enable-metrics``,
``/metrics`` with the KV and mamba pool gauges serve the no-slots-lost check (``e2e/slots.py``): a
stream holds its prompt + output tokens and one mamba slot; a finished one leaves its tokens and slot
radix-cached (evictable), an aborted one (closed stream or abort_request) frees them. Knobs:
``FAKE_CAP`` (SGLang caps max_running_requests to it), ``FAKE_CRASH=<ALGORITHM>`` (that server dies
at start), ``FAKE_STEP_MS`` (time per decode step), ``FAKE_LEAK=kv|mamba`` (an aborted stream never
returns that pool's slots), ``FAKE_ABORT_TRACEBACK`` (an abort logs a traceback),
``FAKE_PREFILL_MS`` (time per prefill round of a batched ``/generate``, before its steps),
``FAKE_START_S`` (seconds between its "Memory pool end" line and its readiness: the CUDA graph
captures of a real start), ``FAKE_MEMORY_TIMES`` (a file each start appends its pid and the time of
that line to), ``FAKE_FLUSHES`` (a file each ``/flush_cache`` appends the server's and its
scheduler's CPUs to), ``FAKE_START_TRACEBACK`` (a traceback at start-up, as SGLang's post-warm-up ``/freeze_gc`` call logs
on the H200 kit), ``FAKE_START_LINE`` (a line logged at start-up, as a plugin's print); with ``SGLANG_DDTREE_SYNC_CHECK=warn`` a DDTREE server logs torch's sync warning
once. ``/abort_request`` aborts every stream whose rid starts with the given one, as
SGLang 0.5.23's scheduler does. With ``--speculative-adaptive`` the first batch of each size logs
DDTREE's budget switch line for that bucket.
"""

from __future__ import annotations

import gzip
import http.server
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ENV_SEEN = (
    "SGLANG_SIMULATE_ACC_LEN",
    "SGLANG_DDTREE_STAGE_TIMES",
    "SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS",
    "SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS",
    "SGLANG_SPEC_KIT_NORMS",
)
argv = sys.argv[1:]


def flag(name: str, default=None):
    return argv[argv.index(name) + 1] if name in argv else default


ALGORITHM = flag("--speculative-algorithm")
WIDTH = int(flag("--speculative-num-draft-tokens", 16 if ALGORITHM else 1))
ACC = float(os.environ.get("SGLANG_SIMULATE_ACC_LEN", 1))
STEP_S = float(os.environ.get("FAKE_STEP_MS", 2)) / 1000
PREFILL_S = float(os.environ.get("FAKE_PREFILL_MS", 0)) / 1000
PROFILE: dict = {}
LEAK = os.environ.get("FAKE_LEAK", "")
POOL = {"kv_available": 90000, "kv_evictable": 0, "mamba_evictable": 0, "running": 0}
POOL_LOCK = threading.Lock()
LOG_LOCK = threading.Lock()  # the log lines other threads write
ABORTED: set[str] = set()
SWITCHED: set[int] = set()  # the batch sizes whose budget switch line was logged


def metrics() -> str:
    """The pool gauges as SGLang's Prometheus text writes them (plus a per-priority sample)."""
    with POOL_LOCK:
        used_kv = 90000 - POOL["kv_available"] - POOL["kv_evictable"]
        used_mamba = POOL["mamba_total"] - POOL["mamba_available"] - POOL["mamba_evictable"]
        values = {
            "num_running_reqs": POOL["running"],
            "num_queue_reqs": 0,
            "kv_available_tokens": POOL["kv_available"],
            "kv_evictable_tokens": POOL["kv_evictable"],
            "kv_used_tokens": used_kv,
            "mamba_available_tokens": POOL["mamba_available"],
            "mamba_evictable_tokens": POOL["mamba_evictable"],
            "mamba_used_tokens": used_mamba,
        }
    labels = 'model_name="fake",engine_type="unified"'
    lines = []
    for name, v in values.items():
        lines += [f"# TYPE sglang:{name} gauge", f"sglang:{name}{{{labels}}} {float(v)}"]
    lines.append(f'sglang:num_running_reqs{{{labels},priority="1"}} 7.0')
    return "\n".join(lines) + "\n"


def trace(folder: str, prefix: str, steps: int) -> None:
    """Per step: SGLang's 90 µs ``scheduler.run_batch`` host span holding one graph replay (two
    3 ms GEMMs), an ``aten::index`` and one eager 1 ms kernel (Triton launch)."""
    events, corr = [], 0
    for s in range(steps):
        events.append({**_host("scheduler.run_batch", "user_annotation", s, None), "dur": 90})
        corr += 1
        events.append(_host("cudaGraphLaunch", "cuda_runtime", s, corr))
        events += [_gpu("gemm", s, corr, 3000.0), _gpu("gemm", s, corr, 3000.0)]
        events.append({**_host("aten::index", "cpu_op", s, None), "ts": 100 * s + 20})
        corr += 1
        launch = {**_host("cuLaunchKernel", "cuda_driver", s, corr), "ts": 100 * s + 30}
        events += [launch, _gpu("tree", s, corr, 1000.0)]
    Path(folder).mkdir(parents=True, exist_ok=True)
    for stage, evs in (("EXTEND", events[:1]), ("DECODE", events)):
        with gzip.open(Path(folder, f"{prefix}-1.5-TP-0-{stage}.trace.json.gz"), "wt") as f:
            json.dump({"traceEvents": evs}, f)


def _host(name, cat, step, corr):
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "ts": 100 * step,
        "dur": 5,
        "pid": 1,
        "tid": 1,
        "args": {} if corr is None else {"correlation": corr},
    }


def _gpu(name, step, corr, dur):
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "ts": 100 * step + 10,
        "dur": dur,
        "args": {"correlation": corr},
    }


class Handler(http.server.BaseHTTPRequestHandler):
    def _send(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/metrics" and "--enable-metrics" in argv:
            data = metrics().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        if self.path == "/server_info":
            return self._send(200, {"internal_states": [{"avg_spec_accept_length": ACC}]})
        self._send(200 if self.path == "/health" else 404, {})

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/flush_cache":
            if os.environ.get("FAKE_FLUSHES"):  # where its processes run at each level's start
                cpus = {
                    "server": os.sched_getaffinity(0),
                    "sched": os.sched_getaffinity(SCHEDULER.pid),
                }
                with LOG_LOCK, open(os.environ["FAKE_FLUSHES"], "a") as f:
                    f.write(
                        json.dumps({"pid": os.getpid(), **{k: sorted(v) for k, v in cpus.items()}})
                        + "\n"
                    )
            return self._send(200, {})
        if self.path == "/abort_request":
            ABORTED.add(body["rid"])
            return self._send(200, {})
        if self.path == "/generate" and body.get("stream"):
            return self._stream(body)
        if self.path == "/start_profile":
            PROFILE.update(body)
            return self._send(200, {})
        if self.path != "/generate":
            return self._send(404, {})
        batch = isinstance(body.get("input_ids", [None])[0], list)
        prompts = body["input_ids"] if batch else [body.get("input_ids") or body.get("text")]
        n = body["sampling_params"]["max_new_tokens"]
        steps = math.ceil((n - 1) / ACC) if ALGORITHM else n - 1
        time.sleep((PREFILL_S + STEP_S * steps) * math.ceil(len(prompts) / MAX_RUNNING))
        if "--speculative-adaptive" in argv and len(prompts) not in SWITCHED:
            SWITCHED.add(len(prompts))
            with LOG_LOCK:
                print(
                    f"[fake] DDTREE budget by batch size: bucket {len(prompts)} runs budget "
                    f"{WIDTH - 1} (was None); tau per budget {{{WIDTH - 1}: {ACC}}}.",
                    flush=True,
                )
        if stage_file := os.environ.get("SGLANG_DDTREE_STAGE_TIMES"):
            bs = min(len(prompts), MAX_RUNNING)
            with open(stage_file, "a") as f:
                tokens = sum(len(x) for x in prompts)  # the prefill first, 4 GPU ms per prompt
                gpu = {"extend": 4.0 * len(prompts)}
                line = {"phase": "extend", "bs": len(prompts), "tokens": tokens}
                f.write(json.dumps({**line, "host_ms": {"extend": 3.0}, "gpu_ms": gpu}) + "\n")
                for s in range(steps):
                    step = {"draft": 1.0 + s % 2, "verify": 2.0}
                    gpu = {"draft": 0.5, "verify": 10.0 * bs}
                    gap = None if s == 0 else 0.5 * (s % 3)  # GPU ms since the last step
                    line = {"bs": bs, "width": WIDTH, "host_ms": step, "gpu_ms": gpu}
                    f.write(json.dumps({**line, "gpu_between_ms": gap}))
                    f.write("\n")
        min_bs = int(os.environ.get("SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS", 0))
        if PROFILE and len(prompts) >= min_bs:
            trace(PROFILE["output_dir"], PROFILE["profile_prefix"], PROFILE["num_steps"])
            PROFILE.clear()
        meta = {"completion_tokens": n, **({"spec_verify_ct": steps} if ALGORITHM else {})}
        outs = [{"text": "x" * n, "output_ids": [7] * n, "meta_info": meta} for _ in prompts]
        self._send(200, outs if batch else outs[0])

    def _stream(self, body: dict) -> None:
        """One streaming request: a chunk per step until its tokens are out or it is aborted."""
        n = body["sampling_params"]["max_new_tokens"]
        held = len(body["text"]) // 4 + 1 + n  # prompt + output tokens
        with POOL_LOCK:
            POOL["kv_available"] -= held
            POOL["mamba_available"] -= 1
            POOL["running"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        aborted = closed = False
        done = 0
        while done < n and not aborted:
            time.sleep(STEP_S)
            done += 1
            # SGLang's /abort_request matches rids by prefix (scheduler.py: rid.startswith)
            aborted = any(body["rid"].startswith(a) for a in ABORTED)
            reason = {"type": "abort"} if aborted else {"type": "length"} if done == n else None
            chunk = {
                "text": "x" * done,
                "meta_info": {"completion_tokens": done, "finish_reason": reason},
            }
            try:
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):  # the client closed the stream
                aborted = closed = True
        if not closed:
            self.wfile.write(b"data: [DONE]\n\n")
        with POOL_LOCK:
            POOL["running"] -= 1
            if not aborted:  # the radix cache keeps the finished request
                POOL["kv_evictable"] += held
                POOL["mamba_evictable"] += 1
            else:
                POOL["kv_available"] += 0 if LEAK == "kv" else held
                POOL["mamba_available"] += 0 if LEAK == "mamba" else 1
        if aborted and os.environ.get("FAKE_ABORT_TRACEBACK"):
            # one write per traceback: print()'s separate newline write let two handler threads'
            # tracebacks run together on one log line (a flaky slots test)
            with LOG_LOCK:
                sys.stdout.write("Traceback (most recent call last):\n  ValueError: fake abort\n")
                sys.stdout.flush()

    def log_message(self, *args):
        pass


def start_scheduler() -> subprocess.Popen:
    """A process titled as SGLang's scheduler (argv[0], what setproctitle sets) in this server's
    process group, idle until this server is gone: what the harness finds to pin and to watch."""
    code = "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent: time.sleep(0.2)"
    return subprocess.Popen(["sglang::scheduler_TP0", "-c", code], executable=sys.executable)


if __name__ == "__main__":
    SCHEDULER = start_scheduler()
    with open(os.environ["FAKE_CALLS"], "a") as f:
        seen = {k: os.environ[k] for k in ENV_SEEN if k in os.environ}
        record = {"argv": argv, "env": seen, "pid": os.getpid(), "scheduler_pid": SCHEDULER.pid}
        record["t"] = time.time()
        f.write(json.dumps({**record, "cpus": sorted(os.sched_getaffinity(0))}) + "\n")
    if os.environ.get("FAKE_CRASH") == (ALGORITHM or "AR"):
        print("RuntimeError: CUDA out of memory", flush=True)
        sys.exit(3)
    if os.environ.get("SGLANG_DDTREE_SYNC_CHECK") == "warn" and ALGORITHM == "DDTREE":
        print("worker.py:1: UserWarning: called a synchronizing CUDA operation", flush=True)
    if os.environ.get("FAKE_START_TRACEBACK"):
        print("Traceback (most recent call last):\n  ConnectionRefusedError: freeze_gc", flush=True)
    if os.environ.get("FAKE_START_LINE"):
        print(os.environ["FAKE_START_LINE"], flush=True)
    config = json.loads(Path(flag("--model-path"), "config.json").read_text())
    MAX_RUNNING = int(flag("--max-running-requests", 48))
    if config["model_type"] == "qwen3_5_text":
        print("[fake] Mamba Cache is allocated. max_mamba_cache_size: 7, conv_state size: 0.1GB")
    POOL["mamba_total"] = POOL["mamba_available"] = 3 * MAX_RUNNING
    cap = int(os.environ.get("FAKE_CAP", MAX_RUNNING))
    if cap < MAX_RUNNING:
        print(f"[fake] max_running_requests is capped to {cap} by the mamba state cache")
        MAX_RUNNING = cap
    print("[fake] Memory pool end. avail mem=12.50 GB", flush=True)
    if os.environ.get("FAKE_MEMORY_TIMES"):
        with open(os.environ["FAKE_MEMORY_TIMES"], "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "t": time.time()}) + "\n")
    time.sleep(float(os.environ.get("FAKE_START_S", 0)))  # what SGLang does after: CUDA graphs
    print(
        f"[fake] max_total_num_tokens=90000, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        f"max_running_requests={MAX_RUNNING}, context_len=4096, available_gpu_mem=12.50 GB",
        flush=True,
    )
    # a listen backlog for the no-slots-lost check's concurrent streams (the default 5 resets some)
    http.server.ThreadingHTTPServer.request_queue_size = 128
    server = http.server.ThreadingHTTPServer((flag("--host"), int(flag("--port"))), Handler)
    server.serve_forever()
