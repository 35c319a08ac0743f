"""End-to-end check of the DDTREE plugin with real SGLang 0.5.23 on the lent H200 (through the GPU kit).

Run on the GPU machine from the repo root, after ``source .gpu-kit/setup.sh``::

    $SGLANG_KIT_PYTHON -m e2e.tiny_pair --out $OUT [--target DIR --drafter DIR] [--servers ar,dflash,ddtree16,...]

A server is ``ar``, ``nextn``, ``dflash`` or ``ddtree<budget>``, optionally ``+graphs`` (CUDA graphs
for decode batches up to ``--graph-bs``; otherwise eager), ``+patched`` (``sglang-spec patch
apply`` on SGLang first; stays applied for later servers), ``+replayssm``
(``--enable-linear-replayssm-spec``), ``+nooverlap`` (``--disable-overlap-schedule``) and, for
``dflash`` and ``ddtree`` servers, ``+stages`` (``SGLANG_DDTREE_STAGE_TIMES``: every decode step's
host and GPU milliseconds, per stage for DDTREE and as one stage for DFLASH, into
``<out>/stages/<server>.jsonl``, summarised per batch size into ``<out>/stages/<server>.json``
and a printed table: where a launch-bound step spends its host time), ``+profile`` (after the
checks, a torch-profiler trace of ``--profile-steps`` decode steps at each concurrency of
``--profile-levels``, greedy requests of ``--profile-tokens`` tokens, summarised by
:mod:`e2e.trace` into ``<out>/profiles/<server>-C<c>.json`` and printed: the GPU kernels, the eager
launches by host operator and the host time inside SGLang's ``run_batch`` by piece and operator,
for any algorithm, so DFLASH's step and DDTREE's can be read side by side), and for ``ddtree``
servers ``+adaptive`` (``--speculative-adaptive`` with ``--adaptive-config FILE``: budget by batch
size); ``+fusednorms`` on any server runs the kit's torch RMSNorms as one Triton launch each
(:mod:`e2e.kit_norms`, ``e2e.scale``'s ``fused-norms``; a server whose log lacks the plugin's line
fails). Its flags
come from ``server_configs/tiny-pair/<algorithm>.yaml`` with the target / drafter paths, the budget and the
drafter's block size set here, and the GPU kit's flags when run through the kit (:mod:`e2e.kit`).
It installs this checkout's plugin where SGLang finds it, then for each server starts SGLang, waits
for ``/health``, sends greedy requests one by one and then concurrently, plus sampled requests
(T > 0), and stops the server.
With ``--sweep 1,2,4,...`` it also load-tests each server (``loadtests.sweep``) and writes the
comparison report and plots (``loadtests.compare``) under ``<out>/report``.
With ``--interleave`` every server stays up at once (on ports ``--port`` + i, with
``--sleep-on-idle``; every ``+patched`` applied before the first starts; each launched as soon as
the one before has sized its memory pools, so that their starts overlap), each is checked in
turn, and ONE load test interleaves their levels (``loadtests.sweep`` with a ``--base-url`` per
server): a launch-bound tiny server's level moved by up to 1.4x between passes
a minute apart (session 25), so servers measured one after the other cannot be told apart within
5 %, and interleaved ones can. With ``--pin-cpus`` each server's processes run on a block of whole
physical cores of their own, its scheduler on the block's first core alone once it is up
(``kit.pin_scheduler``), and the harness (with its load test) on the last block
(``kit.cpu_blocks``): session 31's stage timer saw every server's loop period move 1.8x between
runs of steps, the host's Python slowing as a whole, which no level interleaving averages out.
``--rotate-cpus`` then moves every server to the next server's block before each pass of the
sweep (``kit.move_group``), so that a slower core weighs on every server alike, and rotates the
servers' order at every concurrency by one more (``loadtests.sweep --first-server``), so that no
server always runs first, or last, at some concurrency.
With ``--abort-check N`` it ends each server's exercise with the no-slots-lost check of
:mod:`e2e.slots` (N concurrent streams, a quarter aborted mid-stream, the KV and mamba pools' free
counts before = after, a clean log; the servers get ``--enable-metrics``), prints its table, writes
``<out>/slots_<server>.json`` and keeps the server's log when it fails.
It writes ``e2e.json`` (texts, token ids, meta_info per request) and prints a table: for every
server, whether its greedy output is identical to the AR server's, tokens per verify step
(``completion_tokens / spec_verify_ct``), the acceptance histogram, and the wall time. Without
``--target`` it builds the kit's tiny random Qwen3.5-hybrid target and random DFlash drafter.
A failing server prints its log tail and the run continues with the next one (exit code 1);
SIGTERM (``timeout``) stops the running server, and ``e2e.json`` keeps the servers that finished.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import glob
import json
import lzma
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from e2e import kit, slots
from e2e.scale import summarize_stage_file
from e2e.scale_report import stage_table
from sglang_spec.plugin.config import ENV_STAGE_TIMES, SYNC_WARNING
from sglang_spec.serving.configs import ServerConfig
from sglang_spec.serving.launch import DEFAULT_LAUNCHER

CONFIGS = "tiny-pair/"  # server_configs/tiny-pair/<algorithm>.yaml
# --time-limit: the sweep starts no concurrency later than this before the limit, leaving time for
# one concurrency's levels (the tiny pair's longest, AR at C = 32, took 5 s a server in session 39),
# the abort checks, stopping the servers (11 s for four) and the results
SWEEP_RESERVE_S = 60.0
DEFAULT_PROMPTS = [
    "def fibonacci(n):",
    'import os\n\ndef list_python_files(root):\n    """Return every .py file under root."""\n',
    "class Stack:\n    def __init__(self):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "for i in range(10):\n    print(",
    'def merge_sorted(a, b):\n    """Merge two sorted lists."""\n',
]


def generate(url, prompt, max_new_tokens, temperature=0.0, seed=None):
    params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": True}
    if seed is not None:
        params["sampling_seed"] = seed
    out = kit.call(
        url + "/generate",
        {"text": prompt, "sampling_params": params, "return_logprob": False},
        timeout=300,
    )
    m = out["meta_info"]
    return {
        "text": out["text"],
        "output_ids": out.get("output_ids"),
        "meta": {
            k: m.get(k)
            for k in (
                "completion_tokens",
                "spec_verify_ct",
                "spec_accept_length",
                "spec_num_correct_drafts",
                "spec_correct_drafts_histogram",
                "e2e_latency",
            )
        },
    }


def parse_server(spec: str) -> tuple[str, int | None, set[str]]:
    """``ddtree64+graphs`` -> ("ddtree", 64, {"graphs"}); a one-line error for anything else."""
    name, *mods = spec.split("+")
    m = re.fullmatch(r"(ar|nextn|dflash)|ddtree([1-9]\d*)", name)
    if m is None or set(mods) - {
        "graphs",
        "patched",
        "replayssm",
        "nooverlap",
        "stages",
        "profile",
        "adaptive",
        "fusednorms",
    }:
        raise kit.HarnessError(
            f"unknown server {spec!r}; valid: ar, nextn, dflash, ddtree<budget>, each with "
            "optional +graphs, +patched, +replayssm, +nooverlap, +profile, +fusednorms, "
            "(dflash, ddtree) +stages and (ddtree) +adaptive"
        )
    algorithm = m.group(1) or "ddtree"
    if "stages" in mods and algorithm not in ("dflash", "ddtree"):
        raise kit.HarnessError(
            f"server {spec!r}: +stages times dflash and ddtree decode steps, not {algorithm}'s"
        )
    if "adaptive" in mods and algorithm != "ddtree":
        raise kit.HarnessError(
            f"server {spec!r}: +adaptive (budget by batch size) is DDTREE's, not {algorithm}'s"
        )
    return (algorithm, int(m.group(2)) if m.group(2) else None, set(mods))


def server_config(
    spec: str,
    target: str,
    drafter: str,
    block: int,
    graph_bs: int,
    extra: dict | None = None,
    adaptive_config: str | None = None,
) -> ServerConfig:
    """The tiny pair's config for the algorithm with the paths, budget, block size and CUDA-graph
    setting of this server, under the kit's flags (graph_bs: decode batches up to it, 0 = eager),
    with ``+adaptive`` the budget by batch size of ``adaptive_config``, and ``extra``
    (``--server-arg``) over everything."""
    algorithm, budget, mods = parse_server(spec)
    cfg = kit.config_for(CONFIGS, algorithm)
    ours: dict = {"model-path": target}
    if algorithm == "dflash":
        ours.update(
            {"speculative-draft-model-path": drafter, "speculative-num-draft-tokens": block}
        )
    if algorithm == "ddtree":
        ours.update(
            {
                "speculative-draft-model-path": drafter,
                "speculative-num-draft-tokens": budget + 1,
                "speculative-dflash-block-size": block,
            }
        )
    if "replayssm" in mods:  # GDN tree ReplaySSM (patches 0002/0003: combine with +patched)
        ours["enable-linear-replayssm-spec"] = True
    if "nooverlap" in mods:
        ours["disable-overlap-schedule"] = True
    if "adaptive" in mods:
        if adaptive_config is None:
            raise kit.HarnessError(f"server {spec!r}: +adaptive needs --adaptive-config FILE")
        ours["speculative-adaptive"] = True
        ours["speculative-adaptive-config"] = adaptive_config
    graphs = kit.graph_args(graph_bs if "graphs" in mods else 0)
    speculative = cfg.algorithm in kit.SPECULATIVE
    return kit.with_args(cfg, kit.kit_args(speculative), ours, graphs, extra or {})


def run_server(label, cfg, prompts, args, results: list[dict], index: int = 0) -> dict:
    """Start ``label``'s server (the ``index``-th), exercise it (checks, load test, abort check)
    and stop it. Its record joins ``results`` first, so that what ran stays in it when the call's
    time limit interrupts (session 32: a limit that struck while the last server stopped lost
    that server's greedy checks)."""
    srv = _server(label, cfg, args, args.port, index)
    res = {"label": label, "cmd": " ".join(srv.cmd), "ok": False}
    results.append(res)
    try:
        with srv:
            res["start_s"] = srv.start_s
            res.update(_pinned(srv))
            if "fusednorms" in parse_server(label)[2]:
                kit.require_kit_norms(srv)
            check(res, srv, prompts, args)
            if args.sweep:
                load_test([(label, srv)], args)
            read_server_info(res, srv)
            abort_check(res, srv, prompts, args)
        res["ok"] = True
    except HARNESS_ERRORS as e:
        res["error"] = kit.http_error_text(e)
    except KeyboardInterrupt as e:  # the call's time limit (kit.sigterm_as_interrupt)
        res["error"] = f"interrupted ({e})"
        finish(res, srv, args)
        raise
    finish(res, srv, args)
    return res


def run_interleaved(
    servers: list[tuple[str, ServerConfig]], prompts, args, results: list[dict]
) -> None:
    """``--interleave``: every server up at once (each launched once the one before has sized its
    memory pools, ``kit.Server.wait_memory_sized``, so that their starts overlap: four tiny-pair
    servers one after another took 365 s of a 600 s call in session 38; ports ``--port`` + i;
    ``--sleep-on-idle``), each checked in turn once healthy,
    then ONE load test over all of them with their levels interleaved (``loadtests.sweep`` with a
    ``--base-url`` per server), then the abort checks, then all stopped. Each server's record
    joins ``results`` as it starts (what ran stays there when the call's time limit interrupts)."""
    running = []
    try:
        _interleave(servers, prompts, args, results, running)
    except KeyboardInterrupt as e:  # the call's time limit (kit.sigterm_as_interrupt)
        for res in results:  # none stopped cleanly (run_server's ok is after its stop, too)
            res["ok"] = False
            res.setdefault("error", f"interrupted ({e})")
        raise
    for res, srv in running:  # after every server stopped: their whole logs
        finish(res, srv, args)


def _interleave(servers, prompts, args, results: list[dict], running: list) -> None:
    with contextlib.ExitStack() as stack:
        launched = []
        for i, (label, cfg) in enumerate(servers):  # each launched once the last has its memory
            print(
                f"=== {label} (port {args.port + i}, kept up for the interleaved sweep)", flush=True
            )
            cfg = kit.with_args(cfg, {"sleep-on-idle": True})
            srv = _server(label, cfg, args, args.port + i, i)
            res = {"label": label, "cmd": " ".join(srv.cmd), "ok": False}
            results.append(res)
            try:
                srv.launch()
                stack.callback(srv.stop)
                srv.wait_memory_sized()
                launched.append((res, srv))
            except HARNESS_ERRORS as e:
                res["error"] = kit.http_error_text(e)
                finish(res, srv, args)
        for res, srv in launched:
            try:
                res["start_s"] = srv.wait_healthy()
                res.update(_pinned(srv))
                if "fusednorms" in parse_server(res["label"])[2]:
                    kit.require_kit_norms(srv)
                check(res, srv, prompts, args)
                running.append((res, srv))
            except HARNESS_ERRORS as e:
                res["error"] = kit.http_error_text(e)
                finish(res, srv, args)
        try:
            if args.sweep and running:
                moved = load_test([(res["label"], srv) for res, srv in running], args)
                for (res, _), blocks in zip(running, moved or []):
                    res["cpus_by_pass"] = blocks
        except HARNESS_ERRORS as e:
            for res, _ in running:
                res["error"] = f"interleaved load test: {kit.http_error_text(e)}"
        for res, srv in running:
            if "error" in res:
                continue
            try:
                read_server_info(res, srv)
                abort_check(res, srv, prompts, args)
                res["ok"] = True
            except HARNESS_ERRORS as e:
                res["error"] = kit.http_error_text(e)


HARNESS_ERRORS = (
    kit.ServerFailed,
    kit.HarnessError,
    OSError,
    KeyError,
    TypeError,
    ValueError,
    subprocess.CalledProcessError,
)


def _server(label: str, cfg: ServerConfig, args, port: int, index: int) -> kit.Server:
    return kit.Server(
        cfg,
        Path(args.out) / f"server_{_slug(label)}.log",
        port=port,
        start_timeout=args.start_timeout,
        launcher=args.launcher,
        log_tail=args.log_tail,
        cpus=args.cpu_blocks[index] if args.cpu_blocks else None,
    )


def _cpus_text(cpus: frozenset[int]) -> str:
    return ",".join(map(str, sorted(cpus)))


def _pinned(srv: kit.Server) -> dict:
    """For e2e.json, when ``--pin-cpus`` pinned the server: its block (``cpus``) and whether its
    scheduler got a core of its own (``scheduler_pinned``, kit.pin_scheduler); else nothing."""
    if srv.cpus is None:
        return {}
    return {"cpus": sorted(srv.cpus), "scheduler_pinned": srv.scheduler_pinned}


def finish(res: dict, srv: kit.Server, args) -> None:
    """The server's DDTREE log lines, commit-graph lines, budget switches (the count and the last
    200) and sync warnings into ``res``; its log tail printed when it failed; its log deleted when
    it passed (the device returns few files)."""
    lines = srv.log_text().splitlines()
    res["log_ddtree"] = [
        ln for ln in lines if "DDTREE" in ln or "ddtree" in ln or "sglang_spec" in ln
    ][:20]
    # SGLANG_DDTREE_SYNC_CHECK=warn: torch's warning at each synchronizing operation of a step
    res["sync_warnings"] = [ln for ln in lines if SYNC_WARNING in ln][:20]
    # the commit graphs' capture line and each (shape, batch size) whose steps missed them
    # (plugin.commit_graphs), whatever number of DDTREE lines came before
    res["log_commit"] = [ln for ln in lines if "DDTREE commit:" in ln][:20]
    # --speculative-adaptive: every budget switch (plugin.worker._log_budget_switch), not only
    # those among the first 20 DDTREE lines (session 40's ended with the greedy checks' switches)
    switches = [ln for ln in lines if "DDTREE budget by batch size: bucket" in ln]
    res["budget_switches"] = len(switches)
    res["log_budget"] = switches[-200:]
    if not res["ok"]:
        print(
            f"--- {res['label']} FAILED ({res.get('error')}); log tail:\n"
            + "\n".join(lines[-args.log_tail :]),
            flush=True,
        )
    elif res.get("slots", {}).get("ok") is not False:  # failed slot checks keep their log
        srv.log_path.unlink()


def check(res, srv, prompts, args):
    """Greedy requests one by one and concurrently, sampled requests and optional distribution
    samples against the running server ``srv``; results go into ``res``."""
    url, label = srv.url, res["label"]
    t1 = time.time()
    res["greedy"] = [generate(url, pr, args.max_new_tokens) for pr in prompts]
    res["greedy_s"] = round(time.time() - t1, 2)
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        res["greedy_concurrent"] = list(
            ex.map(lambda pr: generate(url, pr, args.max_new_tokens), prompts)
        )
    with cf.ThreadPoolExecutor(8) as ex:
        res["sampled"] = list(
            ex.map(
                lambda i: generate(url, prompts[i % len(prompts)], args.max_new_tokens, 0.8, i),
                range(args.samples),
            )
        )
    if args.dist_samples and label in args.dist_servers.split(","):
        # (1st, 2nd) token pairs of one prompt: the 2nd comes from a verify step
        with cf.ThreadPoolExecutor(32) as ex:
            outs = list(
                ex.map(
                    lambda i: generate(url, prompts[0], 2, args.dist_temperature, 10_000 + i),
                    range(args.dist_samples),
                )
            )
        res["dist_pairs"] = [o["output_ids"] for o in outs]
    if "profile" in parse_server(label)[2]:
        res["profiles"] = [profile(srv, label, prompts, c, args) for c in args.profile_levels]


def profile(srv: kit.Server, label: str, prompts: list[str], c: int, args) -> dict:
    """``+profile``: a decode trace at concurrency ``c`` (:func:`e2e.trace.record_decode_trace`),
    ``c`` greedy requests of ``--profile-tokens`` tokens at once, summarised into
    ``<out>/profiles/<server>-C<c>.json`` and printed; the outcome."""
    from e2e import trace

    def level() -> None:
        with cf.ThreadPoolExecutor(c) as ex:
            list(
                ex.map(
                    lambda i: generate(srv.url, prompts[i % len(prompts)], args.profile_tokens),
                    range(c),
                )
            )

    summary = trace.record_decode_trace(
        srv.url,
        Path(args.out, "profiles", f"{_slug(label)}-C{c}"),
        _slug(label),
        args.profile_steps,
        level,
        meta={"server": label, "concurrency": c},
        keep=args.keep_traces,
    )
    if summary is None:
        return {"concurrency": c, "status": "failed: no complete decode trace written"}
    print(trace.markdown(summary), flush=True)
    return {"concurrency": c, "status": "ok", "run_batch_ms": summary["host_time"]["median_ms"]}


def load_test(servers: list[tuple[str, kit.Server]], args) -> list[list[list[int]]] | None:
    """Closed-loop load test (loadtests/), one JSONL per server under ``<out>/sweeps``; several
    servers: one sweep with their levels interleaved. Each level records the host's counters and
    those of its server's decode loop (``--watch-pid``, loadtests/host_counters.py) when every
    server's scheduler was found, and the time of a fixed piece of CPython work on the harness's
    CPUs (``--cpu-probe``, loadtests/cpu_probe.py). With ``--rotate-cpus`` one sweep a pass of
    ``--sweep`` (:func:`sweep_passes`), each server moved before it to the block ``passes`` further
    on among the servers' blocks (``kit.move_group``) and the servers' order at each concurrency
    rotated by the pass's index (``--first-server``: one sweep's order at a concurrency is fixed);
    returns each server's blocks, pass by pass (None without rotation)."""
    os.makedirs(os.path.join(args.out, "sweeps"), exist_ok=True)
    watch = all(srv.scheduler_pid is not None for _, srv in servers)
    each = []
    for label, srv in servers:
        each += ["--base-url", srv.url, "--label", label, "--output"]
        each.append(os.path.join(args.out, "sweeps", f"{_slug(label)}.jsonl"))
        each += ["--watch-pid", str(srv.scheduler_pid)] if watch else []
    sweep = [
        sys.executable,
        "-m",
        "loadtests.sweep",
        *each,
        "--api",
        "generate",
        "--prompts",
        args.prompts or "heldout",
        "--requests-per-concurrency",
        str(args.sweep_requests),
        "--min-requests",
        str(2 * args.sweep_requests),
        "--max-new-tokens",
        str(args.sweep_tokens),
        "--ignore-eos",
        "--no-progress",
        "--cpu-probe",
    ]
    if args.stop_at is not None:
        sweep += ["--stop-at", f"{args.stop_at:.1f}"]
    if not args.rotate_cpus:
        subprocess.run([*sweep, "--concurrency", args.sweep], check=True)
        return None
    blocks = args.cpu_blocks[:-1]  # the servers' (the last is the harness's)
    moved: list[list[list[int]]] = [[] for _ in servers]
    for k, levels in enumerate(sweep_passes(args.sweep)):
        if args.stop_at is not None and time.time() >= args.stop_at:
            print(f"--time-limit: passes {k + 1} on not run", flush=True)
            break
        where = []
        for (label, srv), visited in zip(servers, moved):
            block = blocks[(blocks.index(srv.cpus) + k) % len(blocks)]
            kit.move_group(srv.proc.pid, block)
            visited.append(sorted(block))
            where.append(f"{label}: {_cpus_text(block)}")
        print(f"pass {k + 1} (C = {levels}) on CPUs {'; '.join(where)}", flush=True)
        subprocess.run([*sweep, "--concurrency", levels, "--first-server", str(k)], check=True)
    return moved


def sweep_passes(levels: str) -> list[str]:
    """``--sweep``'s passes: a new one starts at each level not above the one before
    (``1,2,4,1,2,4`` -> ``1,2,4`` twice, as e2e/h200_adaptive.sh's SWEEP_PASSES repeats SWEEP)."""
    passes: list[list[str]] = []
    last = None
    for c in levels.split(","):
        if last is None or int(c) <= last:
            passes.append([])
        passes[-1].append(c)
        last = int(c)
    return [",".join(p) for p in passes]


def read_server_info(res, srv) -> None:
    try:
        res["server_info_accept"] = kit.call(srv.url + "/server_info")["internal_states"][0].get(
            "avg_spec_accept_length"
        )
    except (OSError, KeyError, IndexError, TypeError) as e:
        res["server_info_accept"] = f"{type(e).__name__}"


def abort_check(res, srv, prompts, args) -> None:
    """``--abort-check``: last, as it waits for an idle server and judges the log since its
    start."""
    if not args.abort_check:
        return
    label = res["label"]
    res["slots"] = slots.check(srv.url, srv.log_path, prompts, args.abort_check, args.abort_tokens)
    Path(args.out, f"slots_{_slug(label)}.json").write_text(json.dumps(res["slots"], indent=1))
    print(f"no slots lost, {label}:\n{slots.table(res['slots'])}", flush=True)


def agreement(outputs: list[dict], reference: list[dict] | None) -> str:
    """``"k/n"``: how many of ``outputs`` have the text of the reference output for the same prompt
    (``reference`` may cover more prompts, e.g. an earlier run's baseline); ``-`` without one."""
    if reference is None:
        return "-"
    pairs = list(zip(outputs, reference))
    same = sum(o["text"] == r["text"] for o, r in pairs)
    missing = len(outputs) - len(pairs)
    return f"{same}/{len(outputs)}" + (f" ({missing} without a reference)" if missing else "")


def _slug(spec: str) -> str:
    return spec.replace("+", "_")


def print_stage_tables(results: list[dict], stage_dir: Path) -> None:
    """For every ``+stages`` server, its summary (``<stage_dir>/<server>.json``) as
    ``e2e.scale_report.stage_table`` renders it: per batch size the median host and GPU ms of each
    stage, the GPU time between steps and the loop's period, and how far the period moved between
    runs of steps."""
    for r in results:
        if r.get("stages"):
            summary = json.loads((stage_dir / f"{_slug(r['label'])}.json").read_text())
            title = f"stage times, {r['label']} (median ms per decode step, host / GPU):"
            print("\n" + stage_table(summary, title))


def summarize(results, baseline=None):
    """Markdown table; "= AR" compares with this run's first AR server, else with ``baseline``'s,
    prompt by prompt (k of n identical)."""
    base = next((r for r in results if r["label"].startswith("ar") and r["ok"]), baseline)
    reference = None if base is None else base["greedy"]
    rows = []
    for r in results:
        if not r["ok"]:
            rows.append(f"| {r['label']} | FAILED | | | | | |")
            continue
        same = agreement(r["greedy"], reference)
        same_c = agreement(r["greedy_concurrent"], reference)
        toks = sum(g["meta"]["completion_tokens"] for g in r["greedy"])
        steps = sum(g["meta"]["spec_verify_ct"] or 0 for g in r["greedy"])
        tps = f"{toks / steps:.2f}" if steps else "1.00"
        hist = [g["meta"]["spec_correct_drafts_histogram"] for g in r["greedy"]]
        hsum = [sum(x) for x in zip(*[h for h in hist if h])] if any(hist) else "-"
        sampled_ok = (
            all(s["meta"]["completion_tokens"] > 0 for s in r["sampled"]) if r["sampled"] else "-"
        )
        rows.append(
            f"| {r['label']} | {same} | {same_c} | {tps} | {r['greedy_s']} | {hsum} | {sampled_ok} |"
        )
    print(
        "| server | greedy = AR | concurrent = AR | tokens/step | greedy wall s | accepted-drafts histogram | T=0.8 ran |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.tiny_pair", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/e2e"))
    ap.add_argument(
        "--target", help="target model dir (default: the kit's tiny random Qwen3.5 hybrid)"
    )
    ap.add_argument(
        "--drafter", help="DFlash drafter dir (default: the kit's random drafter for it)"
    )
    ap.add_argument("--prompts", help="JSONL with a 'prompt' field (default: a few code prompts)")
    ap.add_argument("--servers", default="ar,dflash,ddtree16,ddtree64")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument(
        "--dist-samples",
        type=int,
        default=0,
        help="also sample this many 2-token completions of the first prompt (T = --dist-temperature) "
        "for a distribution test (e2e/sampling_check.py)",
    )
    ap.add_argument("--dist-temperature", type=float, default=1.0)
    ap.add_argument(
        "--dist-servers",
        default="ar,ar+graphs,ddtree64,ddtree64+graphs",
        help="comma-separated server specs that get the --dist-samples requests",
    )
    ap.add_argument(
        "--graph-bs",
        type=int,
        default=8,
        help="--cuda-graph-max-bs-decode for +graphs servers (cover the sweep's concurrency)",
    )
    ap.add_argument(
        "--sweep",
        default="",
        metavar="C_LIST",
        help="also run a load-test sweep at these concurrencies (e.g. 1,2,4,8,16,32) against each "
        "server, then write <out>/report (python -m loadtests.compare)",
    )
    ap.add_argument(
        "--sweep-requests",
        type=int,
        default=4,
        metavar="R",
        help="requests per concurrency unit of each sweep level (C x R, at least 2 x R; default "
        "4: short levels, noisy at C <= 2)",
    )
    ap.add_argument(
        "--sweep-tokens",
        type=int,
        default=128,
        metavar="T",
        help="output tokens per sweep request (default 128; on the tiny pair a prefill costs about "
        "ten decode steps, so short requests make a speculative server's sweep prefill-bound)",
    )
    ap.add_argument(
        "--baseline",
        help="e2e.json of an earlier run whose AR server's greedy texts serve as "
        "reference when this run has no AR server",
    )
    ap.add_argument(
        "--abort-check",
        type=int,
        default=0,
        metavar="N",
        help="end each server with the no-slots-lost check (e2e/slots.py): N concurrent streams, "
        "a quarter aborted mid-stream, pool free counts before = after, no errors in the log",
    )
    ap.add_argument(
        "--abort-tokens",
        type=int,
        default=128,
        help="max_new_tokens of the --abort-check streams (long enough to abort mid-stream)",
    )
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--log-tail", type=int, default=60)
    ap.add_argument(
        "--server-arg",
        action="append",
        type=kit.server_arg,
        metavar="FLAG=VALUE",
        help="SGLang flag for every server, over everything else (FLAG= drops one), e.g. tp-size=2",
    )
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="keep every server up at once (ports --port + i) and run ONE load test with their "
        "levels interleaved (loadtests.sweep, a --base-url per server): servers compared within "
        "seconds of each other, not minutes",
    )
    ap.add_argument(
        "--pin-cpus",
        action="store_true",
        help="pin server i to the i-th of (servers + 1) disjoint blocks of whole physical cores "
        "(its scheduler to the block's first core alone) and this harness (and its load test) to "
        "the last: no server's scheduler shares a core with another process, and none migrates",
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="this run's limit from its start (a device call's time left, as `timeout` gets "
        f"it): its sweep starts no concurrency later than {SWEEP_RESERVE_S:.0f} s before it "
        "(loadtests.sweep --stop-at), so that the run stops its servers and writes its results "
        "itself instead of being killed mid-pass",
    )
    ap.add_argument(
        "--rotate-cpus",
        action="store_true",
        help="with --pin-cpus, --interleave and --sweep: before each pass of --sweep (a new one "
        "starts at each level not above the last) move server i to the block (i + pass) among "
        "the servers' blocks, so that every server runs on every block and one slower core "
        "weighs on all alike (session 39: the adaptive server sat on the same block in both runs)",
    )
    ap.add_argument(
        "--adaptive-config",
        help="--speculative-adaptive-config FILE of the +adaptive servers (budget by batch size)",
    )
    ap.add_argument(
        "--profile-levels",
        type=kit.concurrency_list,
        default=(1,),
        metavar="C_LIST",
        help="+profile servers: trace decode steps at each of these concurrencies (default 1)",
    )
    ap.add_argument(
        "--profile-steps",
        type=int,
        default=20,
        help="+profile servers: decode steps per trace (default 20)",
    )
    ap.add_argument(
        "--profile-tokens",
        type=int,
        default=512,
        help="+profile servers: new tokens per traced request; a request must outlast the traced "
        "steps (default 512: at most 16 tokens per step on the tiny pair, so 31 steps or more)",
    )
    ap.add_argument(
        "--keep-traces",
        action="store_true",
        help="+profile servers: keep each raw trace beside its summary (several MB each)",
    )
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument(
        "--launcher", default=DEFAULT_LAUNCHER, help="server command prefix ({python} = this one)"
    )
    started = time.time()  # --time-limit counts from here
    args = ap.parse_args(argv)
    try:
        specs = args.servers.split(",")
        for spec in specs:
            if "adaptive" in parse_server(spec)[2] and args.adaptive_config is None:
                raise kit.HarnessError(f"server {spec!r}: +adaptive needs --adaptive-config FILE")
        if args.adaptive_config is not None and not os.path.isfile(args.adaptive_config):
            raise kit.HarnessError(f"--adaptive-config {args.adaptive_config}: no such file")
        if args.time_limit is not None and not args.interleave:
            raise kit.HarnessError(
                f"--time-limit {args.time_limit:g} ends the one interleaved sweep; valid with "
                "--interleave"
            )
        if args.time_limit is not None and args.time_limit <= SWEEP_RESERVE_S:
            raise kit.HarnessError(
                f"--time-limit {args.time_limit:g}: give more than {SWEEP_RESERVE_S:.0f} s (the "
                "sweep stops that long before it)"
            )
        args.stop_at = (
            None if args.time_limit is None else started + args.time_limit - SWEEP_RESERVE_S
        )
        if args.rotate_cpus and not (args.pin_cpus and args.interleave and args.sweep):
            raise kit.HarnessError(
                "--rotate-cpus moves pinned servers between the passes of an interleaved sweep; "
                "valid with --pin-cpus, --interleave and --sweep"
            )
        if args.interleave and len(set(specs)) < len(specs):
            raise kit.HarnessError(f"--interleave needs distinct servers; got {args.servers}")
        if args.abort_check < 0 or (args.abort_check and args.abort_check < slots.ABORT_EVERY):
            raise kit.HarnessError(
                f"--abort-check {args.abort_check}: give 0 (off) or at least "
                f"{slots.ABORT_EVERY} streams (a quarter of them are aborted)"
            )
        if args.profile_steps < 1 or args.profile_tokens <= args.profile_steps:
            raise kit.HarnessError(
                f"--profile-steps {args.profile_steps} / --profile-tokens {args.profile_tokens}: "
                "give at least 1 step and more tokens than steps (a request must outlast them)"
            )
        if args.sweep_tokens < 1:
            raise kit.HarnessError(
                f"--sweep-tokens {args.sweep_tokens}: give at least 1 output token per request"
            )
        if args.sweep_requests < 1:
            raise kit.HarnessError(
                f"--sweep-requests {args.sweep_requests}: give at least 1 request per "
                "concurrency unit"
            )
        if args.abort_tokens <= slots.ABORT_AFTER_CHUNKS:
            raise kit.HarnessError(
                f"--abort-tokens {args.abort_tokens}: give more than {slots.ABORT_AFTER_CHUNKS} "
                "(the aborts come after that many chunks)"
            )
        baseline = load_baseline(args.baseline) if args.baseline else None
        if args.target is None:
            args.target, args.drafter = build_kit_pair()
        if args.drafter is None:
            raise kit.HarnessError("--target needs --drafter (the DFlash drafter for it)")
        block = kit.drafter_block_size(args.drafter)
        args.cpu_blocks = kit.cpu_blocks(len(specs) + 1) if args.pin_cpus else None
        os.makedirs(args.out, exist_ok=True)
        if any("fusednorms" in parse_server(spec)[2] for spec in specs):
            print(kit.install_kit_norms(), flush=True)
        print(f"plugin: {kit.install_plugin()}", flush=True)
    except kit.HarnessError as e:
        print(f"python -m e2e.tiny_pair: {e}", file=sys.stderr)
        return 2
    if args.cpu_blocks:
        os.sched_setaffinity(0, args.cpu_blocks[-1])  # the load test's subprocess inherits it
        blocks = [f"{spec}: {_cpus_text(b)}" for spec, b in zip(specs, args.cpu_blocks)]
        print(
            f"pinned: {'; '.join(blocks)}; harness: {_cpus_text(args.cpu_blocks[-1])}", flush=True
        )
    if args.prompts:
        prompts = load_prompts(args.prompts, args.num_prompts)
    else:
        prompts = DEFAULT_PROMPTS[: args.num_prompts]

    def config(spec: str) -> ServerConfig:
        # the slots check reads the pools from /metrics
        metrics = {"enable-metrics": True} if args.abort_check else {}
        extra = {**metrics, **dict(args.server_arg or [])}
        cfg = server_config(
            spec, args.target, args.drafter, block, args.graph_bs, extra, args.adaptive_config
        )
        mods = parse_server(spec)[2]
        if "profile" in mods:  # the decode trace starts at the first batch this large
            cfg = kit.with_args(
                cfg, env={"SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS": str(min(args.profile_levels))}
            )
        if "fusednorms" in mods:
            cfg = kit.with_args(cfg, env=kit.kit_norms_env())
        if "stages" not in mods:
            return cfg
        stage_dir = Path(args.out, "stages")
        stage_dir.mkdir(exist_ok=True)
        stage_file = (stage_dir / f"{_slug(spec)}.jsonl").resolve()
        return kit.with_args(cfg, env={ENV_STAGE_TIMES: str(stage_file)})

    def patch(spec: str) -> dict | None:
        # +patched: `sglang-spec patch apply` before the server; it stays applied for later ones
        return kit.apply_patches() if "patched" in parse_server(spec)[2] else None

    def annotate(res: dict, spec: str, patch_report: dict | None) -> None:
        if patch_report:
            res["patch_apply"] = patch_report
        if "stages" in parse_server(spec)[2]:
            res["stages"] = summarize_stage_file(Path(args.out, "stages"), _slug(spec))

    results: list[dict] = []
    with kit.sigterm_as_interrupt():  # a timed-out call stops its servers (Server.__exit__)
        try:
            if args.interleave:  # every server runs at once: the patches go on before any starts
                reports = [patch(spec) for spec in specs]
                run_interleaved([(spec, config(spec)) for spec in specs], prompts, args, results)
                for res, spec, report in zip(results, specs, reports, strict=True):
                    annotate(res, spec, report)
            for i, spec in enumerate([] if args.interleave else specs):
                print(f"=== {spec}", flush=True)
                report = patch(spec)
                annotate(run_server(spec, config(spec), prompts, args, results, i), spec, report)
                Path(args.out, "e2e.json").write_text(json.dumps(results, indent=1))
        finally:  # an interrupted server's record too
            Path(args.out, "e2e.json").write_text(json.dumps(results, indent=1))
    summarize(results, baseline)
    print_stage_tables(results, Path(args.out, "stages"))
    if args.sweep:
        sweeps = sorted(glob.glob(os.path.join(args.out, "sweeps", "*.jsonl")))
        subprocess.run(
            [
                sys.executable,
                "-m",
                "loadtests.compare",
                *sweeps,
                "-o",
                os.path.join(args.out, "report"),
            ],
            check=False,
        )
    return 0 if all(r["ok"] and r.get("slots", {}).get("ok", True) for r in results) else 1


def load_prompts(path: str, num: int) -> list[str]:
    """The first ``num`` prompts of a JSONL with a ``prompt`` field, in file order: what a run given
    ``--prompts path --num-prompts num`` sends, and so what its judges on the CPU must decode."""
    return [json.loads(ln)["prompt"] for ln in open(path) if ln.strip()][:num]


def read_text(path: str | Path) -> str:
    """A results file's text, plain or xz-compressed (``.xz``: the results kept in the repository,
    which a device call carries, are compressed)."""
    raw = Path(path).read_bytes()
    return (lzma.decompress(raw) if str(path).endswith(".xz") else raw).decode()


def load_runs(path: str) -> list[dict]:
    """A run's server records (its ``e2e.json`` or ``e2e.json.xz``, :func:`read_text`)."""
    return json.loads(read_text(path))


def load_baseline(path: str) -> dict:
    """The successful AR server of an earlier run's ``e2e.json``."""
    try:
        runs = load_runs(path)
    except (OSError, lzma.LZMAError, json.JSONDecodeError) as e:
        raise kit.HarnessError(f"--baseline {path}: {e}") from None
    base = next((r for r in runs if r["label"].startswith("ar") and r["ok"]), None)
    if base is None:
        raise kit.HarnessError(
            f"--baseline {path}: no successful AR server in that run to compare with"
        )
    return base


def build_kit_pair() -> tuple[str, str]:
    """The GPU kit's tiny random Qwen3.5-hybrid target and DFlash drafter (its smoke scripts)."""
    smoke = kit.REPO / ".gpu-kit" / "smoke"
    if not smoke.is_dir():
        raise kit.HarnessError(
            "no --target given and no .gpu-kit/smoke to build the kit's tiny pair: pass "
            "--target/--drafter or run bash ../shared/sglang-gpu-kit/prepare.sh"
        )
    for script in ("make_tiny_qwen3.py", "make_tiny_variants.py"):
        subprocess.run(
            [sys.executable, str(smoke / script), "/tmp/tiny-qwen3"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return "/tmp/tiny-qwen35", "/tmp/tiny-dflash-q35"


if __name__ == "__main__":
    sys.exit(main())
