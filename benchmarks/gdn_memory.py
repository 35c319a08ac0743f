"""What SGLang would choose for the GDN state pools of the Qwen3.6-27B shape on an H200, on the CPU.

For each server (DFLASH width 16 with and without ``--enable-linear-replayssm-spec``; DDTREE(63)
unpatched, with patches 0002+0003 as they were at ``--baseline-rev``, and with this checkout's
series, whose tree keeps conv inputs instead of per-node conv windows: docs/gdn-tree-caching.md §7)
and each memory setting (the session-3/4 settings ``--mem-fraction-static
0.8`` with ``--max-running-requests`` 8 or 64, and SGLang's defaults: neither flag) this prints
``max_mamba_cache_size``, the state slots per request, ``max_running_requests`` and the KV token
capacity, and writes them as JSON.

How: the server arguments are the real-scale harness's own (``e2e.scale.server_config``: the
server config, the dummy-weight layer, decode graphs up to bs 8, ``--server-arg`` drops for the
defaults), resolved by SGLang's own pipeline (``ServerArgs.resolve_once``, the DDTREE plug-in
registered) with the GPU's capacity set to an H200's, then published; the mamba/KV split is
SGLang's own ``KVCacheConfigurator._handle_max_mamba_cache``, ``_calculate_mamba_ratio`` and
``resolve_max_num_reqs``, run in a child process whose ``sglang`` is the installed release or a
patched copy (``tests/patched_sglang.patched_copy``). With the DDTREE overlap scheduler on (the
``overlap`` column: True / False; None = as the server resolves it, on for both since DDTREE
supports SGLang's overlap scheduler) the resolved ``disable_overlap_schedule`` is overridden before
the solve, which is what the ratio reads; the sessions-3/4 DDTREE servers ran with it off.

What is not SGLang's code, and how it was checked:

* the memory left after the weights, ``total_rest_memory = mfs * P - weights - other``, which
  SGLang measures on the GPU: ``REST_AT_0_8_GIB`` is inverted from the DFLASH run of
  benchmarks/results/scale_h200.md (``max_mamba_cache_size`` 41 and 386734 KV tokens: the mamba
  memory SGLang's solve charges at 41 slots plus the KV pool; the servers with a drafter load the
  same 53.3 GB of weights), and ``P`` (free memory before the weights load) is what makes the
  session-4 log add up: 37.12 GiB free at verify-graph capture = 0.2 P + the 9.40 GiB the baseline
  priced but did not allocate (42 request rows) => P = 138.6 GiB (a lower bound: anything
  allocated in between raises it, at most to the H200's 140.4 GiB, which adds <= 0.2 GiB to the
  rest at the default fraction);
* the KV bytes per token: 16 full-attention layers x 4 KV heads x 256 x 2 (K, V) x 2 B = 64 KiB,
  plus, for the DFlash drafter's own KV, 5 layers x 8 KV heads x 128 x 2 x 2 B = 20 KiB.

The ``measured`` column holds the H200 figures (scale_h200.md, session4/gdn-tree/README.md); the
script exits 1 when a validation row does not reproduce them.

    python -m benchmarks.gdn_memory [--json benchmarks/results/gdn_memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = "qwen3.6-27b"
H200_MIB = (
    143771  # torch.cuda.mem_get_info total of an H200 (what get_device_memory_capacity reads)
)
P_GIB = 138.6  # free GPU memory before the weights load (module docstring)
REST_AT_0_8_GIB = 57.647  # total_rest_memory at --mem-fraction-static 0.8 (module docstring)
GIB = 1 << 30
BASELINE_REV = "a996744"  # main before this branch priced the tree's request rows jointly

# (label, algorithm, budget, flag, tree): tree = which SGLang the child imports
SERVERS = {
    "dflash": ("DFLASH", "dflash", None, False, "installed"),
    "dflash+replayssm": (
        "DFLASH --enable-linear-replayssm-spec",
        "dflash",
        None,
        True,
        "installed",
    ),
    "ddtree63": ("DDTREE(63), unpatched", "ddtree", 63, False, "installed"),
    "ddtree63+baseline": ("DDTREE(63), 0002+0003 at baseline", "ddtree", 63, True, "baseline"),
    "ddtree63+patched": ("DDTREE(63), 0002+0003 (this branch)", "ddtree", 63, True, "branch"),
    "ddtree15": ("DDTREE(15), unpatched", "ddtree", 15, False, "installed"),
}
# (label, --mem-fraction-static, --max-running-requests, --mamba-full-memory-ratio); None = SGLang's
# default
SETTINGS = {
    "s3": ("mfs 0.8, mrr 8 (session 3)", 0.8, 8, None),
    "s4": ("mfs 0.8, mrr 64 (session 4)", 0.8, 64, None),
    "default": ("defaults", None, None, None),
    "default+mfr1.5": ("defaults, --mamba-full-memory-ratio 1.5", None, None, 1.5),
}
# (server, settings, overlap) -> the H200's figures: max_mamba_cache_size, max_running_requests,
# KV tokens (benchmarks/results/scale_h200.md; session4/gdn-tree/README.md and its .loglines)
MEASURED = {
    ("dflash", "s3", None): (41, 8, 386734),
    ("ddtree63", "s3", False): (7, 1, 476220),
    ("ddtree15", "s3", False): (34, 8, 399262),
    ("ddtree63+baseline", "s4", False): (88, 22, 378782),
}
SCENARIOS = [
    *MEASURED,
    *[("dflash", s, None) for s in ("s4", "default")],
    *[("dflash+replayssm", s, None) for s in ("s3", "s4", "default")],
    ("ddtree63", "default", None),
    ("ddtree63+baseline", "s4", True),
    *[("ddtree63+baseline", "default", o) for o in (False, True)],
    *[(v, s, o) for v in ("ddtree63+patched",) for s in ("s4", "default") for o in (False, True)],
    *[(v, "default+mfr1.5", True) for v in ("dflash+replayssm", "ddtree63+patched")],
]


# ------------------------------------------------------------------------------------ child
def _child(scenarios: list[dict], out: str) -> None:
    """Resolve and solve each scenario with the ``sglang`` first on ``sys.path``."""
    import types

    import sglang.srt.arg_groups.mamba_hook as mamba_hook
    import sglang.srt.arg_groups.memory_hook as memory_hook
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.mem_cache import kv_cache_configurator as kvc
    from sglang.srt.runtime_context import get_context, get_schedule
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from e2e import scale
    from e2e.shapes import DRAFT_LAYERS, SHAPES, write_model_dirs
    from sglang_spec.plugin.algorithm import register

    # an H200 where SGLang asks the device (resolution only; nothing is allocated)
    memory_hook.get_device_memory_capacity = lambda device=None: H200_MIB  # noqa: ARG005
    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True
    register()
    shape = SHAPES[SHAPE]
    models = tempfile.mkdtemp(prefix="gdn_memory_")
    target, drafter = write_model_dirs(shape, models)
    results = []
    for sc in scenarios:
        _, algorithm, budget, flag, _ = SERVERS[sc["server"]]
        _, mfs, mrr, mfr = SETTINGS[sc["settings"]]
        spec = scale.ServerSpec(shape=shape, algorithm=algorithm.upper(), budget=budget)
        server_arg = [
            ("enable-linear-replayssm-spec", True if flag else None),
            ("mem-fraction-static", mfs),
            ("max-running-requests", mrr),
            ("mamba-full-memory-ratio", mfr),
        ]
        ns = argparse.Namespace(graph_bs=8, max_running_requests=64, server_arg=server_arg)
        cfg = scale.server_config(spec, target, drafter, ns, Path(models))
        sa = prepare_server_args(["--device", "cuda", *cfg.argv()])
        sa.resolve_once()
        get_context().set_server_args(sa)
        if sc["overlap"] is not None:
            get_context().override("gdn_memory", disable_overlap_schedule=not sc["overlap"])
        mc = ModelConfig.from_server_args(sa)
        sched = get_schedule()
        fake = types.SimpleNamespace(
            mambaish_config=kvc.mambaish_config(mc),
            hybrid_gdn_config=kvc.hybrid_gdn_config(mc),
            hybrid_kda_config=kvc.hybrid_kda_config(mc),
            pp_size=1,
            attn_dp_size=1,
            spec_algorithm=SpeculativeAlgorithm.from_string(sa.speculative_algorithm),
            extra_mamba_cache_bytes_per_req=0,
            fused_entry_bytes=lambda _name: None,
            model_config=mc,
        )
        fake._calculate_mamba_ratio = lambda f=fake: kvc.KVCacheConfigurator._calculate_mamba_ratio(
            f
        )
        mfs_resolved = float(sched.mem_fraction_static)
        rest = REST_AT_0_8_GIB + (mfs_resolved - 0.8) * P_GIB
        requested = sched.max_running_requests
        after = kvc.KVCacheConfigurator._handle_max_mamba_cache(fake, rest)
        cell = (
            len(fake.mambaish_config.full_attention_layer_ids)
            * 2
            * shape.kv_heads
            * (shape.head_dim * 2)
            + DRAFT_LAYERS * 2 * shape.draft_kv_heads * shape.draft_head_dim * 2
        )
        tokens = int(after * GIB) // cell
        running = kvc.KVCacheConfigurator.resolve_max_num_reqs(fake, tokens)
        params = fake.mambaish_config.mamba2_cache_params
        results.append(
            {
                **sc,
                "mem_fraction_static": mfs_resolved,
                "max_running_requests_asked": requested,
                "overlap_schedule": not sched.disable_overlap_schedule,
                "mamba_radix_cache_strategy": sa.mamba_radix_cache_strategy,
                "slots_per_request": fake._calculate_mamba_ratio(),
                "mamba_full_memory_ratio": float(sched.mamba_full_memory_ratio),
                "total_rest_gib": rest,
                "mamba_budget_gib": rest
                * sched.mamba_full_memory_ratio
                / (1 + sched.mamba_full_memory_ratio),
                "slot_bytes": params.mamba_cache_per_req,
                "request_row_bytes": params.replayssm_ring_bytes_per_req(
                    record_len=int(sa.speculative_num_draft_tokens or 0), tree=True
                )
                if flag and algorithm == "ddtree"
                else 0,
                "max_mamba_cache_size": int(sched.max_mamba_cache_size),
                "max_running_requests": int(running),
                "kv_tokens": tokens,
                "kv_bytes_per_token": cell,
            }
        )
        get_context().override("gdn_memory", max_mamba_cache_size=None)
    Path(out).write_text(json.dumps(results))


# ------------------------------------------------------------------------------------ parent
def sglang_roots(workdir: Path, baseline_rev: str) -> dict[str, tuple[str, str | None]]:
    """``tree -> (root, patches dir)``: ``installed`` (no copy), ``branch`` (this checkout's
    series applied to a copy of the installed release) and ``baseline`` (the series of
    ``baseline_rev``, read with git; the plug-in is pointed at it to see it applied)."""
    sys.path.insert(0, str(REPO / "tests"))
    from patched_sglang import patched_copy

    from sglang_spec.patching import core

    version = core.detect_version(core.locate(None))[0]
    baseline_patches = workdir / "baseline_patches"
    listing = subprocess.run(
        ["git", "-C", str(REPO), "ls-tree", "--name-only", f"{baseline_rev}:patches/{version}"],
        capture_output=True,
        text=True,
    )
    if listing.returncode != 0:
        raise SystemExit(
            f"gdn_memory: --baseline-rev {baseline_rev!r} has no patches/{version}/ in this "
            f"repository's history ({listing.stderr.strip()}); valid: a commit of this repository"
        )
    (baseline_patches / version).mkdir(parents=True)
    for name in listing.stdout.split():
        blob = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{baseline_rev}:patches/{version}/{name}"],
            capture_output=True,
            check=True,
        ).stdout
        (baseline_patches / version / name).write_bytes(blob)
    (workdir / "branch").mkdir()
    (workdir / "baseline").mkdir()
    return {
        "installed": ("", None),
        "branch": (str(patched_copy(workdir / "branch", version)), None),
        "baseline": (
            str(patched_copy(workdir / "baseline", version, baseline_patches)),
            str(baseline_patches),
        ),
    }


def run_child(root: str, patches: str | None, scenarios: list[dict], workdir: Path) -> list[dict]:
    out = workdir / f"out_{abs(hash(root))}.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, str(REPO)) if p))
    if patches is not None:
        env["SGLANG_SPEC_PATCHES_DIR"] = patches
    r = subprocess.run(
        [sys.executable, "-m", "benchmarks.gdn_memory", "--child", json.dumps(scenarios), str(out)],
        env=env,
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if r.returncode != 0:
        raise SystemExit(
            f"gdn_memory: the child for {root or 'installed'} failed:\n{r.stderr[-3000:]}"
        )
    return json.loads(out.read_text())


def solve(baseline_rev: str = BASELINE_REV) -> list[dict]:
    """Every scenario's row, in ``SCENARIOS`` order, with ``measured`` where the H200 ran it."""
    scenarios = [{"server": s, "settings": st, "overlap": o} for s, st, o in SCENARIOS]
    with tempfile.TemporaryDirectory(prefix="gdn_memory_") as tmp:
        workdir = Path(tmp)
        roots = sglang_roots(workdir, baseline_rev)
        by_tree: dict[str, list[dict]] = {}
        for sc in scenarios:
            by_tree.setdefault(SERVERS[sc["server"]][4], []).append(sc)
        rows = {}
        for tree, group in by_tree.items():
            for row in run_child(*roots[tree], group, workdir):
                rows[(row["server"], row["settings"], row["overlap"])] = row
    out = []
    for key in SCENARIOS:
        row = rows[key]
        m = MEASURED.get(key)
        row["measured"] = (
            None
            if m is None
            else {"max_mamba_cache_size": m[0], "max_running_requests": m[1], "kv_tokens": m[2]}
        )
        out.append(row)
    return out


def validation_errors(rows: list[dict]) -> list[str]:
    """Rows whose prediction misses the H200's figures: the slot and request counts exactly, the
    KV tokens within 0.5 % (the drafters' weights differ by nothing, the CUDA context by little)."""
    errors = []
    for r in rows:
        m = r["measured"]
        if m is None:
            continue
        for key in ("max_mamba_cache_size", "max_running_requests"):
            if r[key] != m[key]:
                errors.append(f"{r['server']} {r['settings']}: {key} {r[key]} != measured {m[key]}")
        if abs(r["kv_tokens"] - m["kv_tokens"]) > 0.005 * m["kv_tokens"]:
            errors.append(
                f"{r['server']} {r['settings']}: kv_tokens {r['kv_tokens']} vs measured "
                f"{m['kv_tokens']} (> 0.5 %)"
            )
    return errors


def print_table(rows: list[dict]) -> None:
    print(
        f"# {SHAPE} on an H200: SGLang's GDN state sizing (python -m benchmarks.gdn_memory; "
        f"rest at mfs 0.8 = {REST_AT_0_8_GIB} GiB, P = {P_GIB} GiB)"
    )
    print(
        "| server | settings | overlap | slots/req | mfs | mrr asked | mamba budget GiB | "
        "request row MB | max_mamba_cache_size | max_running_requests | KV tokens | measured |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        m = r["measured"]
        measured = (
            "-"
            if m is None
            else f"{m['max_mamba_cache_size']} / {m['max_running_requests']} / {m['kv_tokens']}"
        )
        print(
            f"| {SERVERS[r['server']][0]} | {SETTINGS[r['settings']][0]} | "
            f"{'on' if r['overlap_schedule'] else 'off'} | {r['slots_per_request']} | "
            f"{r['mem_fraction_static']:.3f} | {r['max_running_requests_asked']} | "
            f"{r['mamba_budget_gib']:.2f} | {r['request_row_bytes'] / 1e6:.1f} | "
            f"{r['max_mamba_cache_size']} | **{r['max_running_requests']}** | {r['kv_tokens']} | "
            f"{measured} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/gdn_memory.json"))
    ap.add_argument(
        "--baseline-rev",
        default=BASELINE_REV,
        help="git commit whose patch series is the 'baseline' (default: main before this change)",
    )
    ap.add_argument("--child", nargs=2, metavar=("SCENARIOS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(json.loads(args.child[0]), args.child[1])
        return 0
    rows = solve(args.baseline_rev)
    print_table(rows)
    errors = validation_errors(rows)
    Path(args.json).write_text(
        json.dumps(
            {
                "settings": {
                    "shape": SHAPE,
                    "h200_mib": H200_MIB,
                    "p_gib": P_GIB,
                    "rest_at_0_8_gib": REST_AT_0_8_GIB,
                    "baseline_rev": args.baseline_rev,
                },
                "rows": rows,
                "validation_errors": errors,
            },
            indent=1,
        )
    )
    for e in errors:
        print(f"VALIDATION: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
