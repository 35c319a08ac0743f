"""Real-scale step cost: AR / NEXTN / DFLASH / DDTREE servers of real model shapes, no weights.

One command, on the lent H200 (the GPU kit) or any GPU box with a stock SGLang 0.5.23 install::

    source .gpu-kit/setup.sh && $SGLANG_KIT_PYTHON -m e2e.scale --out $OUT --time-budget 540 \\
        --servers qwen3.6-27b:ar qwen3.6-27b:dflash qwen3.6-27b:ddtree:b=15
    python -m e2e.scale --out runs/scale --servers qwen3-8b:ar qwen3-8b:ddtree:b=63   # stock box

For every server it writes the shape's target and DFlash drafter directories (``config.json`` only,
:mod:`e2e.shapes`), builds the server from the model's ``server_configs/`` file for the algorithm
plus the kit's flags and this harness's layer (``--load-format dummy --skip-tokenizer-init``, the
built paths, CUDA graphs for decode batches up to ``--graph-bs``, the memory flags a big model
needs), starts it through the project's launcher helpers (:mod:`e2e.kit`), and runs closed-loop
levels: at each concurrency C, C requests of distinct random 512-token id prompts start together,
128 new tokens each, greedy, ``ignore_eos``; after each, C fresh prompts with one new token each
time the prefill alone, so a record has the decode step's cost without it
(``decode_ms_per_step``) beside the served one. One record per level goes to ``<out>/scale.json`` the
moment the level ends (:mod:`e2e.records` defines the fields), so a crash or a device time-out keeps
what finished; ``<out>/run.json`` says what ran, what was skipped and why (and an adaptive DDTREE
server's budget switch lines); ``<out>/logs/`` holds the server logs. ``python -m e2e.scale_report
RESULTS.json <out> ...`` merges runs and writes the tables and the plot. ``--repeats R`` runs each
level R times and keeps the median: at C = 1 a level is one request, whose prefill (134-171 ms on
the 27B shape with prefill graphs off, session 16) moves its ms per step by a few percent from run
to run, so compare algorithms at small C with ``--repeats 5``.

A server is ``SHAPE:ALGORITHM[:OPTION...]``; shapes ``qwen3.6-27b``, ``qwen3.5-4b``, ``qwen3-8b``;
algorithms ``ar``, ``nextn`` (hybrids: their MTP layer), ``dflash``, ``ddtree`` (needs
``b=BUDGET``); options ``b=BUDGET``, ``acc=TAU`` (``SGLANG_SIMULATE_ACC_LEN=TAU``: tokens per verify
step forced, a benchmark knob; not for AR), for DDTREE also ``acc=B@TAU/B@TAU...`` (a tau per
budget, ``SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET``, with the largest as SGLang's knob),
``adaptive=FILE`` (DDTREE budget by batch size: ``--speculative-adaptive`` with FILE as its config;
the budget is the file's largest, ``b=`` may be left out), ``tree-temp=T`` (DDTREE's tree
temperature, ``SGLANG_DDTREE_TREE_TEMPERATURE``; with ``acc=`` on dummy weights see below),
``tp=N``, ``no-overlap`` (``--disable-overlap-schedule``), ``fused-norms`` (kit only: the
``sgl_kernel`` stand-in's torch RMSNorms as one Triton launch each, :mod:`e2e.kit_norms`; a server
whose log lacks the plugin's line fails), ``no-replayssm`` (hybrid DDTREE without
``--enable-linear-replayssm-spec``: SGLang's per-node GDN states, the verify path DFLASH uses, for a
like-for-like step comparison), ``replayssm`` (hybrid NEXTN with SGLang's own linear
``--enable-linear-replayssm-spec``: its capacity without per-draft-token GDN states; SGLang 0.5.23
refuses the flag for DFLASH on GDN models, "requires a KDA model"), ``stages``
(``SGLANG_DDTREE_STAGE_TIMES``: DDTREE's per-stage step times, DFLASH's whole step as one stage,
both with the GPU time between steps; summarised per batch size), ``profile=C[,C...]`` (after the
levels, a torch-profiler trace of ``--profile-steps`` decode steps at each C, summarised by
:mod:`e2e.trace`: top kernels, whether the step replays CUDA graphs, which host operators the eager
launches come from; the trace starts at the first
decode batch of at least the smallest of these C, so each C's prompts must fit one prefill batch:
C x 512 tokens <= SGLang's chunked prefill size).

Budgets below the drafter's horizon at a stated tau: with dummy weights the drafter's distributions
are flat (SGLang draws every weight from U(-1e-3, 1e-3)), so best-first selection spends a budget of
7 on depth-1 siblings, and the simulated path, the tree's best path clipped to its depth, cannot
reach the stated tau (session 12: the adaptive server never chose budget 7). ``tree-temp=1e-8``
sharpens the drafter's log-probabilities so far that the tree takes the drafter's argmax chain
first, as a trained drafter's peaked distribution would. The verify width, and so the size of every
kernel but the GDN tree kernel (whose work grows with node depth), does not depend on the shape:
a chain is the costly end of the shapes a budget can take.

Time: ``--time-budget`` seconds for the whole command. A server starts only if its start (the latest
start of its shape seen in this call, else ``--start-estimate``) and a first level fit; a level runs
only if its estimate (the previous level's wall time x C / previous C) fits; the rest is listed as
skipped. ``--resume FILE`` skips the levels FILE already has, so calls of a few servers each add up
to one result set. A level that would need more than ``--max-waves`` rounds of requests because the
server caps its running requests (the GDN state memory) is skipped as well.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import random
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from e2e import kit, records
from e2e.scale_report import level_tables, stage_key
from e2e.shapes import SHAPES, Shape, write_model_dirs
from sglang_spec.plugin import MAX_VERIFY_WIDTH
from sglang_spec.serving.configs import ServerConfig
from sglang_spec.serving.launch import DEFAULT_LAUNCHER

LEVELS = (1, 2, 4, 8, 16, 32)
ALGORITHMS = ("ar", "nextn", "dflash", "ddtree")
FLAG_OPTIONS = {"fused-norms", "no-overlap", "no-replayssm", "replayssm", "stages"}
VALUE_OPTIONS = {"b", "acc", "tp", "profile", "adaptive", "tree-temp"}
# What a big model with dummy weights needs beside its server config (shared/notes/scale-*.md):
# no checkpoint, no tokenizer (requests carry ids), no prefill graphs (their capture ran out of
# memory beside 50 GB of weights), room for the KV pool and the GDN state, a short context.
DUMMY_MODEL_ARGS = {
    "load-format": "dummy",
    "skip-tokenizer-init": True,
    "disable-prefill-cuda-graph": True,
    "mem-fraction-static": 0.8,
    "context-length": 4096,
}
PROMPT_ID_RANGE = (1000, 150000)  # ordinary token ids in every shape's vocabulary


@dataclass(frozen=True)
class ServerSpec:
    shape: Shape
    algorithm: str  # AR | NEXTN | DFLASH | DDTREE
    budget: int | None = None
    acc: float | None = None
    tp: int | None = None
    flags: tuple[str, ...] = ()  # sorted FLAG_OPTIONS
    profile: tuple[int, ...] = ()
    acc_by_budget: tuple[tuple[int, float], ...] = ()  # acc=B@TAU/...; then acc = the largest TAU
    adaptive: str | None = None  # adaptive=FILE: the budget config's path
    tree_temperature: float | None = None  # tree-temp=T (DDTREE)

    @property
    def speculative(self) -> bool:
        return self.algorithm in kit.SPECULATIVE

    @property
    def acc_text(self) -> str | None:
        if self.acc_by_budget:
            return "/".join(f"{b}@{t:g}" for b, t in self.acc_by_budget)
        return None if self.acc is None else f"{self.acc:g}"

    @property
    def variant(self) -> str:
        parts = list(self.flags)
        parts += [f"adaptive={Path(self.adaptive).stem}"] if self.adaptive else []
        parts += [f"acc={self.acc_text}"] if self.acc_by_budget else []
        parts += [f"tree-temp={self.tree_temperature:g}"] if self.tree_temperature else []
        return "+".join(parts)

    @property
    def label(self) -> str:
        parts = [self.shape.name, self.algorithm.lower()]
        parts += [f"b={self.budget}"] if self.budget is not None else []
        parts += [f"acc={self.acc_text}"] if self.acc is not None else []
        parts += [f"adaptive={Path(self.adaptive).stem}"] if self.adaptive else []
        parts += [f"tp={self.tp}"] if self.tp is not None else []
        parts += [f"tree-temp={self.tree_temperature:g}"] if self.tree_temperature else []
        return ":".join(parts + list(self.flags))

    @property
    def slug(self) -> str:
        """``label`` as a file name."""
        return self.label.replace(":", "_").replace("=", "").replace("/", "_")


def parse_spec(text: str) -> ServerSpec:
    """``SHAPE:ALGORITHM[:OPTION...]`` -> ServerSpec; a one-line error for anything else."""
    shape_name, _, rest = text.partition(":")
    if shape_name not in SHAPES:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: unknown shape {shape_name!r}; valid: {', '.join(SHAPES)}"
        )
    shape = SHAPES[shape_name]
    algorithm, *options = rest.split(":") if rest else [""]
    if algorithm not in ALGORITHMS:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: algorithm {algorithm!r} is not one of {', '.join(ALGORITHMS)}"
        )
    if algorithm == "nextn" and not shape.has_mtp:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: {shape.name} has no MTP layer, so no NEXTN; valid: ar, dflash, ddtree"
        )
    values: dict[str, str] = {}
    flags: set[str] = set()
    for opt in options:
        name, eq, value = opt.partition("=")
        if eq and name in VALUE_OPTIONS and name not in values:
            values[name] = value
        elif not eq and opt in FLAG_OPTIONS:
            flags.add(opt)
        else:
            raise argparse.ArgumentTypeError(
                f"server {text!r}: bad option {opt!r}; valid: b=BUDGET, acc=TAU or "
                f"acc=B@TAU/B@TAU..., tp=N, profile=C[,C], adaptive=FILE, tree-temp=T, "
                f"{', '.join(sorted(FLAG_OPTIONS))} (each once)"
            )
    acc_by_budget = _acc_by_budget(text, values.get("acc"))
    if acc_by_budget:
        values["acc"] = str(max(t for _, t in acc_by_budget))
    adaptive, budget = _adaptive(text, values.get("adaptive"), _number(text, values, "b", int, 1))
    spec = ServerSpec(
        shape=shape,
        algorithm=algorithm.upper(),
        budget=budget,
        acc=_number(text, values, "acc", float, 1.0),
        tp=_number(text, values, "tp", int, 1),
        flags=tuple(sorted(flags)),
        profile=_profile_levels(text, values.get("profile")),
        acc_by_budget=acc_by_budget,
        adaptive=adaptive,
        tree_temperature=_tree_temperature(text, values.get("tree-temp")),
    )
    if (acc_by_budget or adaptive or spec.tree_temperature) and spec.algorithm != "DDTREE":
        raise argparse.ArgumentTypeError(
            f"server {text!r}: acc=B@TAU/..., adaptive= and tree-temp= apply to ddtree only"
        )
    max_budget = 255 if shape.hybrid else MAX_VERIFY_WIDTH - 1
    if spec.algorithm == "DDTREE" and spec.budget is None:
        raise argparse.ArgumentTypeError(f"server {text!r}: ddtree needs b=BUDGET, e.g. b=15")
    if spec.algorithm == "DDTREE" and spec.budget > max_budget:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: b={spec.budget} is too large; valid: 1..{max_budget}"
            + (" (the hybrids' extra_buffer needs verify width <= 256)" if shape.hybrid else "")
        )
    if spec.algorithm != "DDTREE" and spec.budget is not None:
        raise argparse.ArgumentTypeError(f"server {text!r}: b= applies to ddtree only")
    if spec.acc is not None and not spec.speculative:
        raise argparse.ArgumentTypeError(f"server {text!r}: acc= applies to speculative servers")
    if "replayssm" in flags and not (shape.hybrid and spec.algorithm == "NEXTN"):
        raise argparse.ArgumentTypeError(
            f"server {text!r}: replayssm applies to nextn on hybrid shapes (SGLang 0.5.23 allows "
            "it for DFLASH on KDA models only; hybrid ddtree has it by default, no-replayssm)"
        )
    if "stages" in flags and spec.algorithm not in ("DDTREE", "DFLASH"):
        raise argparse.ArgumentTypeError(f"server {text!r}: stages applies to ddtree and dflash")
    return spec


def _acc_by_budget(text: str, value: str | None) -> tuple[tuple[int, float], ...]:
    """``acc=B@TAU/B@TAU...`` -> ((B, TAU), ...) sorted by B; () for ``acc=TAU`` or none."""
    if value is None or "@" not in value:
        return ()
    pairs: dict[int, float] = {}
    for item in value.split("/"):
        b, at, t = item.partition("@")
        try:
            budget, tau = int(b), float(t)
        except ValueError:
            budget, tau = 0, 0.0
        if not at or budget < 1 or not 1 <= tau < math.inf or budget in pairs:
            raise argparse.ArgumentTypeError(
                f"server {text!r}: acc={value!r}: bad {item!r}; valid: BUDGET@TAU pairs joined by "
                "/, e.g. acc=7@3.2/15@3 (each budget once, TAU >= 1)"
            )
        pairs[budget] = tau
    return tuple(sorted(pairs.items()))


def _adaptive(text: str, value: str | None, budget: int | None) -> tuple[str | None, int | None]:
    """``adaptive=FILE`` -> (its absolute path, the server's budget: the file's largest, which a
    given ``b=`` must equal); (None, budget) without it."""
    if value is None:
        return None, budget
    from sglang_spec.plugin.config import load_budget_policy

    try:
        largest = max(load_budget_policy(value).budgets)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"server {text!r}: adaptive=: {e}") from None
    if budget is not None and budget != largest:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: b={budget} disagrees with adaptive={value}, whose largest budget "
            f"is {largest}; valid: b={largest} or no b="
        )
    return str(Path(value).resolve()), largest


def _tree_temperature(text: str, value: str | None) -> float | None:
    """``tree-temp=T`` -> T, checked as the server checks SGLANG_DDTREE_TREE_TEMPERATURE."""
    if value is None:
        return None
    from sglang_spec.plugin.config import parse_tree_temperature

    try:
        return parse_tree_temperature(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"server {text!r}: tree-temp=: {e}") from None


def _number(text: str, values: dict, name: str, kind: type, lo: float):
    if name not in values:
        return None
    try:
        v = kind(values[name])
    except ValueError:
        v = None
    if v is None or v < lo or (kind is float and not math.isfinite(v)):
        raise argparse.ArgumentTypeError(
            f"server {text!r}: {name}={values[name]!r} must be a {kind.__name__} >= {lo:g}"
        )
    return v


def _profile_levels(text: str, value: str | None) -> tuple[int, ...]:
    if value is None:
        return ()
    try:
        levels = tuple(int(x) for x in value.split(","))
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(
            f"server {text!r}: profile={value!r} must list concurrencies >= 1, e.g. profile=1,8"
        )
    return levels


def _positive(kind: type):
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            v = None
        if v is None or v <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive {kind.__name__}")
        return v

    return parse


# ------------------------------------------------------------------------------------ server config
def server_config(
    spec: ServerSpec, target: Path, drafter: Path, args: argparse.Namespace, out: Path
) -> ServerConfig:
    """The model's server config for the algorithm, with the kit's flags, the dummy-weight layer,
    the built paths, the budget / TP / options of ``spec`` and ``--server-arg`` on top."""
    cfg = kit.config_for(spec.shape.config_prefix, spec.algorithm)
    ours: dict = {**DUMMY_MODEL_ARGS, "model-path": str(target)}
    if "speculative-draft-model-path" in cfg.args:
        ours["speculative-draft-model-path"] = str(drafter)
    ours.update(kit.graph_args(args.graph_bs))
    ours["max-running-requests"] = args.max_running_requests
    if spec.budget is not None:
        ours["speculative-num-draft-tokens"] = spec.budget + 1
    if spec.tp is not None:
        ours["tp-size"] = spec.tp
    if "no-overlap" in spec.flags:
        ours["disable-overlap-schedule"] = True
    if "no-replayssm" in spec.flags:
        ours["enable-linear-replayssm-spec"] = False
    if "replayssm" in spec.flags:
        ours["enable-linear-replayssm-spec"] = True
    if spec.adaptive is not None:
        ours["speculative-adaptive"] = True
        ours["speculative-adaptive-config"] = spec.adaptive
    # SGLang logs each Triton compilation after start-up that took at least this long (default
    # 1 s): the ones that land inside a timed level show in the server's log
    env = {"SGLANG_TRITON_SLOW_COMPILE_THRESHOLD_SECS": "0.05"}
    if spec.acc is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = f"{spec.acc:g}"
    if spec.acc_by_budget:
        env["SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET"] = ",".join(
            f"{b}:{t:g}" for b, t in spec.acc_by_budget
        )
    if spec.tree_temperature is not None:
        env["SGLANG_DDTREE_TREE_TEMPERATURE"] = f"{spec.tree_temperature:g}"
    if "stages" in spec.flags:
        env["SGLANG_DDTREE_STAGE_TIMES"] = str((out / "stages" / f"{spec.slug}.jsonl").resolve())
    if spec.profile:  # a decode trace starts at the first batch of at least this many requests
        env["SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS"] = str(min(spec.profile))
    if "fused-norms" in spec.flags:
        env.update(kit.kit_norms_env())
    return kit.with_args(
        cfg, kit.kit_args(spec.speculative), ours, dict(args.server_arg or []), env=env
    )


def verify_width(cfg: ServerConfig, spec: ServerSpec, drafter: Path) -> int:
    if not spec.speculative:
        return 1
    n = cfg.args.get("speculative-num-draft-tokens")
    return int(n) if n is not None else kit.drafter_block_size(drafter)


# ------------------------------------------------------------------------------------ requests
def prompts(n: int, seed: tuple, length: int) -> list[list[int]]:
    """``n`` distinct random id prompts (no shared prefix, so no radix-cache hits between them)."""
    rng = random.Random(repr(seed))
    return [[rng.randrange(*PROMPT_ID_RANGE) for _ in range(length)] for _ in range(n)]


def generate(url: str, ids: list[list[int]], new_tokens: int, timeout: float) -> list[dict]:
    """One batched ``/generate`` (SGLang schedules its requests together); their ``meta_info``."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True},
    }
    out = kit.call(url + "/generate", body, timeout=timeout)
    if not isinstance(out, list) or len(out) != len(ids):
        raise kit.HarnessError(f"/generate answered {type(out).__name__}, not {len(ids)} results")
    return [o["meta_info"] for o in out]


def flush(url: str) -> None:
    try:
        kit.call(url + "/flush_cache", {}, timeout=60)
    except OSError as e:  # a failed flush only costs memory; the prompts never share a prefix
        print(f"[scale] /flush_cache failed: {kit.http_error_text(e)}", flush=True)


# ------------------------------------------------------------------------------------ the run
def expected_start(seen: dict[str, float], shape: str, default: float) -> tuple[float, str]:
    """How long the next server of ``shape`` will take to start, and where that figure comes from.

    The latest start of the same shape in this call, not the slowest: a fresh device machine's first
    server compiles the JIT and Triton kernels that later starts find cached (session 18: DDTREE's
    cold 27B start took 159 s, and DFLASH, which would have started in about 60 s, was skipped
    with 165 s left). Another shape's start says nothing about this one's weights."""
    if shape in seen:
        return seen[shape], f"the latest {shape} start seen"
    return default, "--start-estimate"


class Run:
    """One call: the servers in order under one wall-clock budget, results written as they come."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.t0 = time.monotonic()
        self.deadline = self.t0 + args.time_budget
        self.out = Path(args.out)
        self.results = self.out / "scale.json"
        self.done = {records.key(r) for f in args.resume or [] for r in records.load(f)}
        self.done |= {records.key(r) for r in records.load(self.results)}
        self.starts: dict[str, float] = {}  # shape -> its latest server start in this call, s
        self.log: dict = {
            "started": _dt.datetime.now().isoformat(timespec="seconds"),
            "time_budget_s": args.time_budget,
            "argv": sys.argv[1:],
            "servers": [],
        }
        self.env = {
            "gpu": _gpu_name(),
            "sglang_version": _version("sglang"),
            "kit": kit.in_kit(),
        }

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def level_key(self, spec: ServerSpec, c: int) -> tuple:
        return records.key(self.base_record(spec, c))

    def base_record(self, spec: ServerSpec, c: int) -> dict:
        return {
            "shape": spec.shape.name,
            "algorithm": spec.algorithm,
            "budget": spec.budget,
            "variant": spec.variant,
            "tp": spec.tp or 1,
            "simulated_accept_len": spec.acc,
            "concurrency": c,
        }

    def profiled(self, spec: ServerSpec, c: int) -> bool:
        """A summary of this profile exists in this run or beside a ``--resume`` results file
        (``python -m e2e.scale_report`` copies them to ``<results>/profiles/``)."""
        name = f"{spec.slug}-C{c}.json"
        folders = [self.out] + [Path(f).with_suffix("") for f in self.args.resume or []]
        return any((d / "profiles" / name).exists() for d in folders)

    def write_log(self) -> None:
        self.log["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "run.json").write_text(json.dumps(self.log, indent=1) + "\n")

    def run(self, specs: list[ServerSpec]) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        if any("fused-norms" in s.flags for s in specs):
            print(f"[scale] {kit.install_kit_norms()}", flush=True)
        if any(s.algorithm == "DDTREE" for s in specs):
            print(f"[scale] plugin: {kit.install_plugin()}", flush=True)
        ok = True
        for spec in specs:
            entry = {"server": spec.label, "status": "pending", "skipped_levels": []}
            self.log["servers"].append(entry)
            ok &= self.server(spec, entry)
            self.write_log()
        return 0 if ok else 1

    def server(self, spec: ServerSpec, entry: dict) -> bool:
        args = self.args
        todo = [c for c in args.levels if self.level_key(spec, c) not in self.done]
        to_profile = [c for c in spec.profile if not self.profiled(spec, c)]
        if not todo and not to_profile:
            entry["status"] = "done earlier"
            return True
        reserve = args.reserve
        start, source = expected_start(self.starts, spec.shape.name, args.start_estimate)
        need = start + args.first_level_estimate + reserve
        if self.remaining() < need:
            entry["status"] = (
                f"skipped: {self.remaining():.0f} s left of the time budget; a start ({start:.0f} s,"
                f" {source}), a first level and the reserve need {need:.0f}"
            )
            entry["skipped_levels"] = [
                {"concurrency": c, "why": "server not started"} for c in todo
            ]
            print(f"[scale] {spec.label}: {entry['status']}", flush=True)
            return True
        target, drafter = write_model_dirs(spec.shape, args.models_dir)
        if "stages" in spec.flags:  # the worker appends its step times there
            (self.out / "stages").mkdir(exist_ok=True)
        cfg = server_config(spec, target, drafter, args, self.out)
        width = verify_width(cfg, spec, drafter)
        log_path = self.out / "logs" / f"{spec.slug}.log"
        srv = kit.Server(
            cfg,
            log_path,
            port=args.port,
            start_timeout=min(args.start_timeout, self.remaining() - reserve),
            stop_timeout=10,
            launcher=args.launcher,
        )
        entry["command"] = " ".join(srv.cmd)
        entry["env"] = dict(cfg.env)
        print(f"[scale] === {spec.label}: {entry['command']}", flush=True)
        try:
            with srv:
                self.starts[spec.shape.name] = srv.start_s
                if "fused-norms" in spec.flags:
                    kit.require_kit_norms(srv)
                info = kit.parse_server_log(srv.log_text())
                entry.update(status="running", start_s=srv.start_s, **info)
                print(
                    f"[scale] {spec.label}: healthy in {srv.start_s} s, max_running_requests "
                    f"{info['max_running_requests']}",
                    flush=True,
                )
                self.warmup(srv.url, todo, info, spec)
                server_fields = {
                    "width": width,
                    "max_running_requests": info["max_running_requests"],
                    "server": spec.label,
                    "server_config": cfg.name,
                    "start_s": srv.start_s,
                    "cuda_graph_max_bs": args.graph_bs,
                    "mamba_cache_log": info["mamba_cache_log"],
                    "capped_log": info["capped_log"],
                    "max_total_num_tokens": info["max_total_num_tokens"],
                    **self.env,
                }
                self.levels(spec, srv.url, todo, server_fields, entry)
                entry["profiles"] = [self.profile(spec, srv.url, info, c) for c in to_profile]
                # what budget each batch-size bucket ran, and why (adaptive DDTREE servers)
                entry["budget_switch_log"] = kit.parse_server_log(srv.log_text())[
                    "budget_switch_log"
                ]
            entry["status"] = "finished"
            return True
        except (kit.ServerFailed, kit.HarnessError, OSError, records.RecordError) as e:
            entry["status"] = f"failed: {kit.http_error_text(e)}"
            entry["log_tail"] = srv.tail().splitlines()
            print(
                f"[scale] {spec.label} {entry['status']}; log tail:\n{srv.tail()}",
                flush=True,
            )
            return False
        finally:
            if "stages" in spec.flags:
                entry["stages"] = summarize_stage_file(self.out / "stages", spec.slug)

    def warmup(self, url: str, todo: list[int], info: dict, spec: ServerSpec) -> None:
        """JIT compilation and first-use allocations before anything is timed, at every level's
        batch size: Triton specialises kernels on integer arguments (1, multiples of 16), so a
        batch size first seen inside a timed level would time its compilation (session 9: the
        27B DDTREE's C = 2 level cost 45 ms per step, C = 4 33 ms, with only 1 and 32 warmed).

        8 new tokens a request, a few steps; an adaptive DDTREE server gets the level's length:
        its controller explores every candidate budget first and then picks one per batch-size
        bucket, and each (budget, batch size) it runs first inside a timed level would time that
        exploration and its compilations (session 22: with 8-token warm-ups its C = 1 level
        served 54 tokens/s at 74 ms per step, where the same choice served 128 at 31 ms)."""
        cap = info["max_running_requests"] or max(todo or [1])
        tokens = self.args.new_tokens if spec.adaptive else 8
        for count in sorted({1} | {min(c, cap) for c in todo}):
            ids = prompts(count, ("warmup", count), self.args.prompt_len)
            generate(url, ids, tokens, min(300.0, self.remaining() - self.args.reserve))

    def levels(self, spec, url, todo, server_fields, entry) -> None:
        args, prev = self.args, None
        mrr = server_fields["max_running_requests"] or max(todo)
        for i, c in enumerate(todo):
            waves = math.ceil(c / mrr)
            est = prev[1] * c / prev[0] if prev else args.first_level_estimate
            why = None
            if waves > args.max_waves:
                why = f"{waves} rounds of requests (max_running_requests {mrr} < C = {c})"
            elif est > self.remaining() - args.reserve:
                why = f"estimated {est:.0f} s, {self.remaining():.0f} s left"
            if why:
                entry["skipped_levels"] += [{"concurrency": x, "why": why} for x in todo[i:]]
                print(f"[scale] {spec.label}: skipping C >= {c}: {why}", flush=True)
                return
            runs, spent = [], 0.0
            for r in range(args.repeats):
                metas, wall = self.timed_level(url, c, ("level", c, r), args.new_tokens)
                # the same prefill alone: C fresh prompts, one new token each (no decode step)
                _, prefill = self.timed_level(url, c, ("prefill", c, r), 1)
                runs.append(records.level_metrics(metas, wall, spec.speculative, prefill))
                spent += wall + prefill
            best = sorted(runs, key=lambda m: m["ms_per_step"])[len(runs) // 2]  # the median run
            rec = records.validate(
                {
                    **self.base_record(spec, c),
                    **server_fields,
                    **best,
                    "ms_per_step_runs": [round(m["ms_per_step"], 3) for m in runs],
                    "requests": c,
                    "prompt_len": args.prompt_len,
                    "max_new_tokens": args.new_tokens,
                    "timestamp": _dt.datetime.now().isoformat(timespec="seconds"),
                }
            )
            records.save(self.results, records.merge(records.load(self.results), [rec]))
            self.done.add(records.key(rec))
            prev = (c, spent)
            decode = (
                f"{rec['decode_ms_per_step']:.1f} without the prefill"
                if "decode_ms_per_step" in rec
                else "no decode time: the prefill alone took as long as the level"
            )
            print(
                f"[scale] {spec.label} C={c}: {rec['ms_per_step']:.1f} ms/step ({decode}, "
                f"prefill {rec['prefill_s']:.3f} s), {rec['tokens_per_s']:.0f} tok/s, "
                f"{rec['tokens_per_step']:.2f} tok/step",
                flush=True,
            )
            self.write_log()

    def timed_level(self, url: str, c: int, seed: tuple, new_tokens: int) -> tuple[list, float]:
        """``c`` fresh prompts (``seed``) sent at once on a flushed cache: their ``meta_info``
        and the wall seconds until the last one finished."""
        flush(url)
        ids = prompts(c, seed, self.args.prompt_len)
        t = time.monotonic()
        metas = generate(url, ids, new_tokens, self.remaining() - self.args.reserve)
        return metas, time.monotonic() - t

    def profile(self, spec: ServerSpec, url: str, info: dict, c: int) -> dict:
        """A torch-profiler trace of a few decode steps at concurrency ``c``, summarised; the
        outcome (a failure here does not fail the server: its levels are measured)."""
        steps = self.args.profile_steps
        mrr = info["max_running_requests"] or c
        decode_steps = (self.args.new_tokens - 1) / (spec.acc or 1.0)
        why = None
        if c > mrr:
            why = f"C = {c} > max_running_requests {mrr}"
        elif decode_steps < steps + 1:
            why = f"{decode_steps:.0f} decode steps < --profile-steps + 1"
        elif self.remaining() - self.args.reserve < self.args.profile_estimate:
            why = (
                f"{self.remaining():.0f} s left, --profile-estimate {self.args.profile_estimate:g}"
            )
        if why:
            return {"concurrency": c, "status": f"skipped: {why}"}
        try:
            summary = self.trace_level(spec, url, c, steps)
        except (OSError, kit.HarnessError) as e:
            return {"concurrency": c, "status": f"failed: {kit.http_error_text(e)}"}
        if summary is None:
            return {"concurrency": c, "status": "failed: no complete decode trace written"}
        return {
            "concurrency": c,
            "status": "ok",
            "verify_graph_replayed": summary["verify_graph_replayed"],
        }

    def trace_level(self, spec: ServerSpec, url: str, c: int, steps: int) -> dict | None:
        """A decode trace (:func:`e2e.trace.record_decode_trace`) of one level of C requests,
        summarised into ``profiles/<slug>-C<c>.json``."""
        from e2e import trace

        def level() -> None:
            flush(url)
            ids = prompts(c, ("profile", c), self.args.prompt_len)
            generate(url, ids, self.args.new_tokens, self.remaining() - self.args.reserve)

        summary = trace.record_decode_trace(
            url,
            self.out / "profiles" / f"{spec.slug}-C{c}",
            spec.slug,
            steps,
            level,
            meta={"server": spec.label, "concurrency": c},
            wait_s=min(120.0, max(self.remaining() - self.args.reserve, 5)),
            keep=self.args.keep_traces,
        )
        if summary is not None:
            print(trace.markdown(summary), flush=True)
        return summary


# ------------------------------------------------------------------------------------ stage times
def summarize_stage_file(folder: Path, slug: str) -> dict | None:
    """``<folder>/<slug>.jsonl`` (one decode step or prefill per line, as the worker appends with
    ``SGLANG_DDTREE_STAGE_TIMES``) -> ``<folder>/<slug>.json``: per batch size, the decode step
    count and the median host and GPU milliseconds of each stage (``by_bs``), and the same of the
    prefills (``extends_by_bs``, with their median prompt tokens)."""
    raw = folder / f"{slug}.jsonl"
    if not raw.exists():
        return None
    lines = [json.loads(line) for line in raw.read_text().splitlines() if line.strip()]
    steps = [r for r in lines if r.get("phase") != "extend"]
    extends = [r for r in lines if r.get("phase") == "extend"]
    summary = {
        "server_slug": slug,
        "by_bs": stage_medians(steps),
        "extends_by_bs": extend_medians(extends),
        "run_periods": run_periods(lines),
    }
    (folder / f"{slug}.json").write_text(json.dumps(summary, indent=1) + "\n")
    return {
        "steps": len(steps),
        "extends": len(extends),
        "batch_sizes": sorted(summary["by_bs"], key=stage_key),
    }


def stage_medians(steps: list[dict]) -> dict:
    """Per batch size (key ``"bs"``), or per batch size and verify width (``"bs:width"``) where
    steps of one batch size ran at several widths (budget by batch size, its probes): the step
    count and the median host and GPU ms of each stage."""
    groups: dict[tuple[int, int | None], list[dict]] = {}
    for s in steps:
        groups.setdefault((int(s["bs"]), s.get("width")), []).append(s)
    widths = Counter(bs for bs, _ in groups)  # how many verify widths each batch size ran at
    out = {}
    for (bs, width), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        entry = {"steps": len(rows), "width": width}
        between = [r["gpu_between_ms"] for r in rows if r.get("gpu_between_ms") is not None]
        entry["gpu_between_ms"] = statistics.median(between) if between else None
        for kind in ("host_ms", "gpu_ms"):
            stages = list(dict.fromkeys(k for r in rows for k in r.get(kind, {})))
            entry[kind] = {
                st: statistics.median(r[kind][st] for r in rows if st in r.get(kind, {}))
                for st in stages
            }
        out[str(bs) if widths[bs] == 1 else f"{bs}:{width}"] = entry
    return out


MIN_RUN_STEPS = 30  # a run shorter than this is a check's few requests, not a load level's


def run_periods(lines: list[dict], min_steps: int = MIN_RUN_STEPS) -> dict | None:
    """How far the decode loop's period moves from one run of steps to the next: a run is the
    decode steps between two prefills (one batch of requests), its period the median over its
    steps of GPU ms (stages summed) + the GPU time before the step (steps without it, the first
    after an idle spell, are left out). Over the runs of at least ``min_steps`` steps: their
    count and the min / median / max of their periods; None without such a run. Session 31:
    the tiny pair's runs moved 1.8x (two modes about 1.5x apart), so a load level of one or two
    runs carries that spread whole."""
    runs: list[list[float]] = [[]]
    for r in lines:
        if r.get("phase") == "extend":
            runs.append([])
        elif r.get("gpu_between_ms") is not None:
            runs[-1].append(sum(r["gpu_ms"].values()) + r["gpu_between_ms"])
    periods = [statistics.median(run) for run in runs if len(run) >= min_steps]
    if not periods:
        return None
    return {
        "runs": len(periods),
        "min_steps": min_steps,
        "min_ms": min(periods),
        "median_ms": statistics.median(periods),
        "max_ms": max(periods),
    }


def extend_medians(extends: list[dict]) -> dict:
    """Per batch size (new requests) of the prefills: their count, median prompt tokens, and the
    median host and GPU ms of the prefill and of the GPU time before it."""
    groups: dict[int, list[dict]] = {}
    for r in extends:
        groups.setdefault(int(r["bs"]), []).append(r)
    out = {}
    for bs, rows in sorted(groups.items()):
        between = [r["gpu_between_ms"] for r in rows if r.get("gpu_between_ms") is not None]
        out[str(bs)] = {
            "extends": len(rows),
            "tokens": statistics.median(r["tokens"] for r in rows),
            "host_ms": statistics.median(r["host_ms"]["extend"] for r in rows),
            "gpu_ms": statistics.median(r["gpu_ms"]["extend"] for r in rows),
            "gpu_between_ms": statistics.median(between) if between else None,
        }
    return out


# ------------------------------------------------------------------------------------ environment
def _gpu_name() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return f"{len(lines)}x {lines[0]}" if out.returncode == 0 and lines else None


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m e2e.scale",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument(
        "--servers",
        nargs="+",
        type=parse_spec,
        required=True,
        metavar="SPEC",
        help="SHAPE:ALGORITHM[:OPTION...] in the order to run, e.g. qwen3.6-27b:ddtree:b=15:acc=4 "
        "(shapes, algorithms and options: the module docstring / e2e/README.md)",
    )
    ap.add_argument("--out", required=True, help="run directory (scale.json, run.json, logs/)")
    ap.add_argument("--resume", nargs="*", help="results JSON files whose levels are not re-run")
    ap.add_argument(
        "--levels", type=kit.concurrency_list, default=LEVELS, help="concurrencies, e.g. 1,2,4"
    )
    ap.add_argument("--prompt-len", type=_positive(int), default=512)
    ap.add_argument("--new-tokens", type=_positive(int), default=128)
    ap.add_argument("--repeats", type=_positive(int), default=1, help="runs per level (median)")
    ap.add_argument("--time-budget", type=_positive(float), default=540.0, help="seconds")
    ap.add_argument("--reserve", type=_positive(float), default=25.0, help="s kept to stop")
    ap.add_argument(
        "--start-estimate", type=_positive(float), default=150.0, help="s, a server start"
    )
    ap.add_argument("--first-level-estimate", type=_positive(float), default=20.0, help="s")
    ap.add_argument("--start-timeout", type=_positive(float), default=300.0)
    ap.add_argument(
        "--max-waves", type=_positive(int), default=4, help="skip levels needing more rounds"
    )
    ap.add_argument("--graph-bs", type=int, default=32, help="CUDA graphs up to this batch; 0 off")
    ap.add_argument("--max-running-requests", type=_positive(int), default=32)
    ap.add_argument(
        "--server-arg",
        action="append",
        type=kit.server_arg,
        metavar="FLAG=VALUE",
        help="SGLang flag for every server, over everything else (FLAG= drops one), e.g. "
        "mamba-radix-cache-strategy=no_buffer",
    )
    ap.add_argument("--profile-steps", type=_positive(int), default=5)
    ap.add_argument(
        "--profile-estimate", type=_positive(float), default=60.0, help="s, one profiled level"
    )
    ap.add_argument("--keep-traces", action="store_true", help="keep the raw decode traces")
    ap.add_argument("--models-dir", default="/tmp/e2e-models", help="where config dirs are written")
    ap.add_argument("--port", type=_positive(int), default=30000)
    ap.add_argument("--launcher", default=DEFAULT_LAUNCHER, help="{python} = this interpreter")
    args = ap.parse_args(argv)
    try:
        run = Run(args)
    except (kit.HarnessError, records.RecordError) as e:
        print(f"python -m e2e.scale: {e}", file=sys.stderr)
        return 2
    try:
        with kit.sigterm_as_interrupt():
            return run.run(args.servers)
    except kit.HarnessError as e:
        print(f"python -m e2e.scale: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        run.log["interrupted"] = True
        print("[scale] interrupted; the levels that finished are in scale.json", flush=True)
        return 130
    finally:
        run.write_log()
        _print_table(run.results)


def _print_table(path: Path) -> None:
    if path.exists():
        print(level_tables(records.load(path)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
