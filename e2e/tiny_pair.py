"""End-to-end check of the DDTREE plugin with real SGLang 0.5.23 on the lent H200 (through the GPU kit).

Run on the GPU machine from the repo root, after ``source .gpu-kit/setup.sh``::

    $SGLANG_KIT_PYTHON -m e2e.tiny_pair --out $OUT [--target DIR --drafter DIR] [--servers ar,dflash,ddtree16,...]

It installs this package into the kit's site (so SGLang's plugin entry point finds DDTREE), then for
each server spec launches ``python -m sglang.launch_server``, waits for ``/health``, sends greedy
requests one by one and then concurrently, plus sampled requests (T > 0), and stops the server.
With ``--sweep 1,2,4,...`` it also load-tests each server (``loadtests.sweep``) and writes the
comparison report and plots (``loadtests.compare``) under ``<out>/report``.
It writes ``e2e.json`` (texts, token ids, meta_info per request) and prints a table: for every
server, whether its greedy output is identical to the AR server's, tokens per verify step
(``completion_tokens / spec_verify_ct``), the acceptance histogram, and the wall time. Without
``--target`` it builds the kit's tiny random Qwen3.5-hybrid target and random DFlash drafter.
A failing server prints its log tail and the run continues with the next one.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import glob
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

PY = os.environ.get("SGLANG_KIT_PYTHON", sys.executable)
PORT = 30000
DEFAULT_PROMPTS = [
    "def fibonacci(n):",
    'import os\n\ndef list_python_files(root):\n    """Return every .py file under root."""\n',
    "class Stack:\n    def __init__(self):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "for i in range(10):\n    print(",
    'def merge_sorted(a, b):\n    """Merge two sorted lists."""\n',
]


def call(path, body=None, timeout=10.0):
    req = urllib.request.Request(
        f"http://127.0.0.1:{PORT}{path}",
        data=json.dumps(body).encode() if body else None,
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


def generate(prompt, max_new_tokens, temperature=0.0, seed=None):
    params = {"max_new_tokens": max_new_tokens, "temperature": temperature, "ignore_eos": True}
    if seed is not None:
        params["sampling_seed"] = seed
    out = call(
        "/generate",
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


def server_flags(spec: str, drafter: str, block: int, graph_bs: int) -> list[str]:
    """Launch flags for one server name; graph_bs > 0 captures CUDA graphs for decode batches up to it."""
    kit = os.environ["SGLANG_KIT_FLAGS"].split()
    if graph_bs:
        kit = [f for f in kit if f != "--disable-cuda-graph"] + [
            "--cuda-graph-max-bs-decode",
            str(graph_bs),
        ]
    spec_flags = os.environ["SGLANG_KIT_SPEC_FLAGS"].split()
    if spec == "ar":
        return kit
    if spec == "nextn":
        return (
            kit
            + spec_flags
            + [
                "--speculative-algorithm",
                "NEXTN",
                "--speculative-num-steps",
                "3",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "4",
                "--mamba-radix-cache-strategy",
                "extra_buffer",
            ]
        )
    if spec == "dflash":
        return (
            kit
            + spec_flags
            + [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                drafter,
                "--speculative-num-draft-tokens",
                str(block),
            ]
        )
    if spec.startswith("ddtree"):
        budget = int(spec[len("ddtree") :])
        return (
            kit
            + spec_flags
            + [
                "--speculative-algorithm",
                "DDTREE",
                "--speculative-draft-model-path",
                drafter,
                "--speculative-num-draft-tokens",
                str(budget + 1),
                "--speculative-dflash-block-size",
                str(block),
            ]
        )
    raise SystemExit(
        f"unknown server spec {spec!r}; valid: ar, nextn, dflash, ddtree<budget>, each with "
        f"optional +graphs and +patched"
    )


def apply_patches(site: str) -> str:
    """``sglang-spec patch apply`` on the kit's SGLang (idempotent); returns its report."""
    out = subprocess.run(
        [PY, "-m", "sglang_spec.cli", "patch", "apply", "--sglang-dir", site],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def run_server(label, target, flags, prompts, args, log_dir):
    cmd = [
        PY,
        "-m",
        "sglang.launch_server",
        "--model-path",
        target,
        "--port",
        str(PORT),
        "--host",
        "127.0.0.1",
        *flags,
    ]
    try:  # a server left on the port would silently answer for this one
        call("/health", timeout=2)
        raise SystemExit(f"port {PORT} already serves something: stop it before testing {label}")
    except OSError:
        pass
    log_path = os.path.join(log_dir, f"server_{label.replace('+', '_')}.log")
    log = open(log_path, "w")
    t0 = time.time()
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    res = {"label": label, "cmd": " ".join(cmd), "ok": False}
    try:
        while time.time() - t0 < args.start_timeout and p.poll() is None:
            try:  # a fresh server's first /health runs a generation that may JIT-compile kernels for seconds
                call("/health", timeout=60)
                break
            except Exception:
                time.sleep(2)
        if p.poll() is not None or time.time() - t0 >= args.start_timeout:
            raise RuntimeError("server did not become healthy")
        res["start_s"] = round(time.time() - t0, 1)
        exercise(res, prompts, args, label)
        res["ok"] = True
    except Exception as e:  # noqa: BLE001
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    log.close()
    lines = open(log_path, errors="replace").read().splitlines()
    res["log_ddtree"] = [
        ln for ln in lines if "DDTREE" in ln or "ddtree" in ln or "sglang_spec" in ln
    ][:20]
    if not res["ok"]:
        print(
            f"--- {label} FAILED ({res.get('error')}); log tail:\n"
            + "\n".join(lines[-args.log_tail :]),
            flush=True,
        )
    else:  # only failed servers keep their log (the device returns few files)
        os.remove(log_path)
    return res


def exercise(res, prompts, args, label):
    """Greedy requests one by one and concurrently, sampled requests, optional distribution samples and
    load-test sweep against the server on PORT; results go into ``res``."""
    t1 = time.time()
    res["greedy"] = [generate(pr, args.max_new_tokens) for pr in prompts]
    res["greedy_s"] = round(time.time() - t1, 2)
    with cf.ThreadPoolExecutor(len(prompts)) as ex:
        res["greedy_concurrent"] = list(
            ex.map(lambda pr: generate(pr, args.max_new_tokens), prompts)
        )
    with cf.ThreadPoolExecutor(8) as ex:
        res["sampled"] = list(
            ex.map(
                lambda i: generate(prompts[i % len(prompts)], args.max_new_tokens, 0.8, i),
                range(args.samples),
            )
        )
    if args.dist_samples and label in args.dist_servers.split(","):
        # (1st, 2nd) token pairs of one prompt: the 2nd comes from a verify step
        with cf.ThreadPoolExecutor(32) as ex:
            outs = list(
                ex.map(
                    lambda i: generate(prompts[0], 2, args.dist_temperature, 10_000 + i),
                    range(args.dist_samples),
                )
            )
        res["dist_pairs"] = [o["output_ids"] for o in outs]
    if args.sweep:  # closed-loop load test of this server (loadtests/), one JSONL per server
        os.makedirs(os.path.join(args.out, "sweeps"), exist_ok=True)
        subprocess.run(
            [
                PY,
                "-m",
                "loadtests.sweep",
                "--base-url",
                f"http://127.0.0.1:{PORT}",
                "--api",
                "generate",
                "--prompts",
                args.prompts or "heldout",
                "--concurrency",
                args.sweep,
                "--requests-per-concurrency",
                "4",
                "--min-requests",
                "8",
                "--max-new-tokens",
                "128",
                "--ignore-eos",
                "--label",
                label,
                "--no-progress",
                "--output",
                os.path.join(args.out, "sweeps", f"{label.replace('+', '_')}.jsonl"),
            ],
            check=True,
        )
    try:
        res["server_info_accept"] = call("/server_info")["internal_states"][0].get(
            "avg_spec_accept_length"
        )
    except Exception as e:  # noqa: BLE001
        res["server_info_accept"] = f"{type(e).__name__}"


def summarize(results, baseline=None):
    """Markdown table; "= AR" compares with this run's first AR server, else with ``baseline``'s."""
    base = next((r for r in results if r["label"].startswith("ar") and r["ok"]), baseline)
    rows = []
    for r in results:
        if not r["ok"]:
            rows.append(f"| {r['label']} | FAILED | | | | | |")
            continue
        same = (
            "-"
            if base is None
            else (
                "yes"
                if [g["text"] for g in r["greedy"]] == [g["text"] for g in base["greedy"]]
                else "NO"
            )
        )
        same_c = (
            "-"
            if base is None
            else (
                "yes"
                if [g["text"] for g in r["greedy_concurrent"]]
                == [g["text"] for g in base["greedy"]]
                else "NO"
            )
        )
        toks = sum(g["meta"]["completion_tokens"] for g in r["greedy"])
        steps = sum(g["meta"]["spec_verify_ct"] or 0 for g in r["greedy"])
        tps = f"{toks / steps:.2f}" if steps else "1.00"
        hist = [g["meta"]["spec_correct_drafts_histogram"] for g in r["greedy"]]
        hsum = [sum(x) for x in zip(*[h for h in hist if h])] if any(hist) else "-"
        sampled_ok = all(s["meta"]["completion_tokens"] > 0 for s in r["sampled"])
        rows.append(
            f"| {r['label']} | {same} | {same_c} | {tps} | {r['greedy_s']} | {hsum} | {sampled_ok} |"
        )
    print(
        "| server | greedy = AR | concurrent = AR | tokens/step | greedy wall s | accepted-drafts histogram | T=0.8 ran |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
        "--baseline",
        help="e2e.json of an earlier run whose AR server's greedy texts serve as "
        "reference when this run has no AR server",
    )
    ap.add_argument("--start-timeout", type=float, default=300)
    ap.add_argument("--log-tail", type=int, default=60)
    args = ap.parse_args()
    baseline = None
    if args.baseline:
        baseline = next(
            (r for r in json.load(open(args.baseline)) if r["label"].startswith("ar") and r["ok"]),
            None,
        )
        if baseline is None:
            raise SystemExit(
                f"--baseline {args.baseline}: no successful AR server in that run to compare with"
            )
    os.makedirs(args.out, exist_ok=True)
    site = "/tmp/gpukit/site"
    subprocess.run(
        [
            PY,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            site,
            ".",
        ],
        check=True,
    )
    if args.target is None:
        kit = ".gpu-kit/smoke"
        subprocess.run(
            [PY, f"{kit}/make_tiny_qwen3.py", "/tmp/tiny-qwen3"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        subprocess.run(
            [PY, f"{kit}/make_tiny_variants.py", "/tmp/tiny-qwen3"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        args.target, args.drafter = "/tmp/tiny-qwen35", "/tmp/tiny-dflash-q35"
    block = (
        json.load(open(os.path.join(args.drafter, "config.json"))).get("block_size")
        or json.load(open(os.path.join(args.drafter, "config.json")))["dflash_config"]["block_size"]
    )
    if args.prompts:
        prompts = [json.loads(ln)["prompt"] for ln in open(args.prompts) if ln.strip()][
            : args.num_prompts
        ]
    else:
        prompts = DEFAULT_PROMPTS[: args.num_prompts]
    results = []
    for spec in args.servers.split(","):
        name, *mods = spec.split("+")
        if set(mods) - {"graphs", "patched"}:
            raise SystemExit(f"unknown modifier in {spec!r}: valid are +graphs and +patched")
        print(f"=== {spec}", flush=True)
        patch_report = (
            apply_patches(site) if "patched" in mods else None
        )  # stays applied for later servers
        flags = server_flags(name, args.drafter, block, args.graph_bs if "graphs" in mods else 0)
        results.append(run_server(spec, args.target, flags, prompts, args, args.out))
        if patch_report:
            results[-1]["patch_apply"] = patch_report
        json.dump(results, open(os.path.join(args.out, "e2e.json"), "w"), indent=1)
    summarize(results, baseline)
    if args.sweep:
        sweeps = sorted(glob.glob(os.path.join(args.out, "sweeps", "*.jsonl")))
        subprocess.run(
            [PY, "-m", "loadtests.compare", *sweeps, "-o", os.path.join(args.out, "report")],
            check=False,
        )


if __name__ == "__main__":
    main()
