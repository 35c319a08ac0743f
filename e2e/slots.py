"""No slots lost (issue 14 item 5): after concurrent streams with a quarter aborted mid-stream, the
server's KV and mamba pools hold as many free slots as before, and its log has no error.

Run through ``python -m e2e.tiny_pair --abort-check N`` (which starts each server with
``--enable-metrics``): :func:`check` against the running server at ``url``

1. reads the pools (:func:`read_pools`) once the server is idle;
2. sends ``n`` concurrent streaming ``/generate`` requests (greedy, ``ignore_eos``, the given
   prompts in turn) and aborts every 4th one after its 2nd chunk, alternately by closing the stream
   (SGLang aborts a request whose client went away) and by ``POST /abort_request`` with its rid;
3. waits for the others, then until the server is idle, and reads the pools again;
4. scans what the server logged from the start of the load to the end of step 3 for tracebacks,
   leak reports and request errors (not the whole log: SGLang's post-warm-up ``/freeze_gc`` call
   logs a connection-refused traceback at start-up on the H200 kit, session 5).

It passes when every aborted request stopped early, every other one produced all its tokens, the
server went idle, each pool's free count (``available + evictable``: a finished request's cached
prefix moves from available to evictable, both reusable) equals its value before, and the log is
clean.

**Where the counts come from.** SGLang 0.5.23 exposes the pools' free counts over HTTP only as the
Prometheus gauges of ``/metrics`` (``sglang:kv_available_tokens``, ``kv_evictable_tokens``,
``kv_used_tokens``, and ``mamba_*`` alike, from the scheduler's ``PoolStats``; ``/server_info``
has none, ``/v1/loads`` has no mamba count). The scheduler publishes them with every logged batch
and, when idle, as soon as its running-request gauge is stale, else every 30 s. A read therefore
counts once the gauges show nothing running or queued and either the counts are the expected ones
or :data:`SETTLE_S` have passed (then they are the idle server's own).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import time
import urllib.error
from pathlib import Path

from e2e import kit

# Longer than SGLang's 30 s idle republish of the gauges.
SETTLE_S = 40.0
ABORT_EVERY = 4  # a quarter of the requests
ABORT_AFTER_CHUNKS = 2
POOLS = ("kv", "mamba")
# SGLang's idle pool check says "memory leak detected!" or "Mem Leak Detected!".
LOG_ERRORS = re.compile(
    r"Traceback \(most recent call last\)|(?i:leak detected)|\[http_server\] Error|CUDA error"
    r"|out of memory|Exception in "
)
_SAMPLE = re.compile(r"^sglang:(\w+)(\{[^}]*\})?\s+(\S+)$")
_PRIORITY = re.compile(r'priority="[^"]')


def parse_metrics(text: str) -> dict:
    """The pool and queue gauges of a ``/metrics`` text: ``{"kv": {"available", "evictable",
    "used", "free"}, "mamba": {...}, "running", "queued"}``. Per-priority samples are left out
    (the totals are the ones without a priority)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if m and not _PRIORITY.search(m.group(2) or ""):
            values[m.group(1)] = values.get(m.group(1), 0.0) + float(m.group(3))
    missing = [
        f"sglang:{p}_{k}_tokens"
        for p in POOLS
        for k in ("available", "evictable", "used")
        if f"{p}_{k}_tokens" not in values
    ]
    if missing:
        raise kit.HarnessError(
            f"/metrics has no {', '.join(missing)}: start the server with --enable-metrics "
            "(SGLang >= 0.5.23)"
        )
    out: dict = {
        "running": int(values.get("num_running_reqs", 0)),
        "queued": int(values.get("num_queue_reqs", 0)),
    }
    for p in POOLS:
        pool = {k: int(values[f"{p}_{k}_tokens"]) for k in ("available", "evictable", "used")}
        out[p] = {**pool, "free": pool["available"] + pool["evictable"]}
    return out


def read_pools(url: str) -> dict:
    """:func:`parse_metrics` of the server's ``/metrics`` now."""
    try:
        text = kit.call(url + "/metrics")
    except urllib.error.HTTPError as e:  # SGLang serves /metrics only with --enable-metrics
        if e.code != 404:
            raise
        text = ""
    return parse_metrics(text if isinstance(text, str) else "")


def idle_pools(url: str, settled, settle_s: float) -> tuple[dict, float]:
    """The pools once the server shows nothing running or queued and ``settled(pools)`` holds, or,
    failing that, as they are ``settle_s`` after the call; and how long that took."""
    t0 = time.monotonic()
    while True:
        pools = read_pools(url)
        waited = time.monotonic() - t0
        idle = pools["running"] == 0 and pools["queued"] == 0
        if (idle and settled(pools)) or waited >= settle_s:
            return pools, round(waited, 1)
        time.sleep(0.5)


def rid(i: int, n: int) -> str:
    """Request id of stream ``i`` of ``n``: fixed width, so no id is a prefix of another. SGLang
    0.5.23's ``/abort_request`` aborts every request whose rid STARTS WITH the given one
    (``scheduler.py`` ``req.rid.startswith(recv_req.rid)``): with ``slots-4`` it also aborted
    ``slots-41`` .. ``slots-49`` (session 5's first H200 run)."""
    return f"slots-{i:0{len(str(n - 1))}d}"


def stream(url: str, rid: str, prompt: str, max_new_tokens: int, abort: str | None) -> dict:
    """One streaming greedy request; ``abort`` = ``"close"`` (close the stream) or
    ``"abort_request"`` (``POST /abort_request``) after its :data:`ABORT_AFTER_CHUNKS`-th chunk."""
    body = {
        "text": prompt,
        "rid": rid,
        "stream": True,
        "sampling_params": {
            "max_new_tokens": max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
    }
    chunks, last, error = 0, {}, None
    pending = abort
    with kit.open_stream(url + "/generate", body) as r:
        for raw in r:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:") :].strip()
            if data == "[DONE]":
                break
            last = json.loads(data)
            if "error" in last:
                error = last["error"]
                break
            chunks += 1
            if pending and chunks == ABORT_AFTER_CHUNKS:
                if pending == "close":
                    break  # leaving the with-block closes the connection
                kit.call(url + "/abort_request", {"rid": rid})
                pending = None  # read on until the server ends the stream
    meta = last.get("meta_info") or {}
    return {
        "rid": rid,
        "abort": abort,
        "chunks": chunks,
        "completion_tokens": meta.get("completion_tokens"),
        "finish_reason": (meta.get("finish_reason") or {}).get("type"),
        "error": error,
    }


def request_problems(outs: list[dict], max_new_tokens: int) -> list[str]:
    """What went wrong with the requests: an aborted one that ran to the end (the abort came too
    late to test anything), another one that stopped short or failed."""
    problems = []
    for o in outs:
        tokens = o["completion_tokens"] or 0
        if o["error"] is not None:
            problems.append(f"{o['rid']}: error {o['error']}")
        elif o["abort"] and tokens >= max_new_tokens:
            problems.append(f"{o['rid']}: finished all {tokens} tokens before its abort")
        elif not o["abort"] and tokens != max_new_tokens:
            problems.append(f"{o['rid']}: {tokens} of {max_new_tokens} tokens")
    return problems


def check(url: str, log_path: str | Path, prompts: list[str], n: int, max_new_tokens: int) -> dict:
    """The whole check against the server at ``url`` logging to ``log_path`` (steps in the module
    docstring); the result has ``ok`` and, when it is false, ``problems``."""
    before, before_wait = idle_pools(url, lambda p: all(p[k]["used"] == 0 for k in POOLS), SETTLE_S)
    ways = ("close", "abort_request")
    jobs = [
        (
            rid(i, n),
            prompts[i % len(prompts)],
            ways[(i // ABORT_EVERY) % 2] if i % ABORT_EVERY == 0 else None,
        )
        for i in range(n)
    ]
    log_start = Path(log_path).stat().st_size
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(lambda j: stream(url, j[0], j[1], max_new_tokens, j[2]), jobs))
    load_s = round(time.monotonic() - t0, 1)
    after, after_wait = idle_pools(
        url, lambda p: all(p[k]["free"] == before[k]["free"] for k in POOLS), SETTLE_S
    )
    with open(log_path, "rb") as f:
        f.seek(log_start)
        log = f.read().decode(errors="replace")
    log_errors = [ln for ln in log.splitlines() if LOG_ERRORS.search(ln)]
    problems = request_problems(outs, max_new_tokens)
    if after["running"] or after["queued"]:
        problems.append(
            f"not idle {after_wait} s after the load: {after['running']} running, "
            f"{after['queued']} queued"
        )
    for p in POOLS:
        if after[p]["free"] != before[p]["free"]:
            problems.append(f"{p} pool: {before[p]['free']} free before, {after[p]['free']} after")
    problems += [f"log: {ln.strip()[:300]}" for ln in log_errors[:20]]
    return {
        "ok": not problems,
        "problems": problems,
        "requests": n,
        "aborted": {w: sum(o["abort"] == w for o in outs) for w in ways},
        "max_new_tokens": max_new_tokens,
        "before": before,
        "after": after,
        "before_wait_s": before_wait,
        "after_wait_s": after_wait,
        "load_s": load_s,
        "log_errors": len(log_errors),
        "streams": outs,
    }


def table(res: dict) -> str:
    """Markdown: each pool's counts before and after, and the verdict with its reasons."""
    rows = [
        "| pool | free before | free after | available before / after | evictable before / after "
        "| used after |",
        "|---|---|---|---|---|---|",
    ]
    b, a = res["before"], res["after"]
    for p in POOLS:
        rows.append(
            f"| {p} | {b[p]['free']} | {a[p]['free']} | {b[p]['available']} / {a[p]['available']} "
            f"| {b[p]['evictable']} / {a[p]['evictable']} | {a[p]['used']} |"
        )
    aborted = ", ".join(f"{k} {v}" for k, v in res["aborted"].items())
    rows.append(
        f"\n{res['requests']} streams of {res['max_new_tokens']} tokens ({aborted} aborted) in "
        f"{res['load_s']} s; idle after {res['after_wait_s']} s; {res['log_errors']} error lines "
        f"in the log: **{'PASS' if res['ok'] else 'FAIL'}**"
    )
    rows += [f"- {p}" for p in res["problems"]]
    return "\n".join(rows)
