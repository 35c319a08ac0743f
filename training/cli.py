"""The trainer's command line (``python -m training``): the flags, the stage order and per-stage
seeds, train_config.json (merged across invocations, dependants of a retrained target marked
stale) and the closing reload checks."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
import time

import torch

import training
from training.checks import check_outputs
from training.config import (
    COMPONENTS,
    EXCLUDE_DIRS,
    HELDOUT_MODULES,
    SCRIPT_VERSION,
    VAL_EVERY,
    parse_stages,
    settings,
)
from training.corpus import Data, corpus_files, heldout_prompts, read, stdlib_root
from training.runtime import T0, log
from training.tokenizer import load_tokenizer, train_tokenizer
from training.train_dflash import run_dflash
from training.train_mtp import run_mtp
from training.train_target import run_target


def versions():
    """Versions of everything that shapes the result (Python, torch, transformers, tokenizers, CUDA,
    GPU, the stdlib used as corpus, whether fla / causal-conv1d are importable)."""
    import tokenizers
    import transformers

    v = {
        "python": sys.version.split()[0],
        "python_full": sys.version,
        "platform": platform.platform(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "stdlib": stdlib_root(),
        "cuda": torch.version.cuda,
    }
    if torch.cuda.is_available():
        v["gpu"] = torch.cuda.get_device_name(0)
    # transformers binds Qwen3.5's GDN / conv to these packages when importable, else to its
    # reference torch code (see --gdn-kernels)
    for pkg in ("fla", "causal_conv1d"):
        try:
            v[f"{pkg}_importable"] = importlib.util.find_spec(pkg) is not None
        except (ImportError, ValueError):
            v[f"{pkg}_importable"] = False
    return v


def main(argv=None):
    """Parse the command line, run the chosen stages in their fixed order, record every setting,
    result and version in train_config.json, then run the reload checks; returns 0."""
    ap = argparse.ArgumentParser(
        prog="python -m training",
        description=training.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--stage", default="all", help="'+'-joined components or 'all': " + ", ".join(COMPONENTS)
    )
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument(
        "--tiny", action="store_true", help="tiny sizes, a few steps, corpus subset (smoke test)"
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--time-budget-s",
        type=float,
        default=None,
        help="scale the time boxes of this invocation's trainings to fit this many seconds",
    )
    ap.add_argument(
        "--steps-scale", type=float, default=1.0, help="multiply every step count (and time box)"
    )
    ap.add_argument("--bs", type=int, default=None, help="override every batch size (debugging)")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=JSON",
        help="override one size or hyper-parameter, e.g. drafter.num_hidden_layers=2, "
        "hybrid_layer_ids=[2,4,6], train.hybrid-dflash.lr=3e-3 (recorded in train_config.json)",
    )
    ap.add_argument(
        "--seq-len", type=int, default=None, help="override the sequence length (debugging)"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--distill", choices=["soft", "hard"], default="soft")
    ap.add_argument(
        "--drafter-impl", default="sglang_spec.dflash:DFlashDrafter", help="module:Class"
    )
    ap.add_argument(
        "--gdn-kernels",
        choices=["torch", "auto"],
        default="torch",
        help="torch (default): transformers' reference PyTorch GDN/conv paths even if "
        "flash-linear-attention / causal-conv1d are installed (no Triton JIT, no version "
        "risk); auto: let transformers pick them up",
    )
    ap.add_argument("--no-check", action="store_true")
    args = ap.parse_args(argv)

    stages = parse_stages(args.stage)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if args.gdn_kernels == "torch" and device.type == "cuda":
        # transformers resolves these optional packages when modeling_qwen3_5 is first imported
        # (not yet: models are imported lazily); a None entry makes the import fail -> torch path.
        for pkg in ("fla", "causal_conv1d"):
            if pkg not in sys.modules:
                sys.modules[pkg] = None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif args.tiny:
        torch.set_num_threads(1)  # tiny ops: threads only add contention
    if args.threads:
        torch.set_num_threads(args.threads)
    S = settings(args, stages)
    train_stages = [c for c in stages if c != "tokenizer"]

    os.makedirs(args.out, exist_ok=True)
    cfg_path = os.path.join(args.out, "train_config.json")
    record = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    record.setdefault("stages", {})
    record.update(
        script="python -m training",
        script_version=SCRIPT_VERSION,
        seed=args.seed,
        mode="tiny" if args.tiny else "full",
        heldout_modules=HELDOUT_MODULES,
        exclude_dirs=EXCLUDE_DIRS,
        val_every=VAL_EVERY,
        gdn_kernels=args.gdn_kernels,
        distill=args.distill,
        sizes={
            k: S[k]
            for k in (
                "vocab",
                "seq_len",
                "hybrid",
                "qwen3",
                "drafter",
                "hybrid_layer_ids",
                "qwen3_layer_ids",
                "block_size",
            )
        },
    )
    ver = versions()
    log(f"stages {stages} on {device}; {ver}")
    files = corpus_files(S["tok_max_bytes"])

    if "tokenizer" in stages:
        t = time.time()
        texts = [read(p) for p in files[0] + files[1]]
        info = train_tokenizer(os.path.join(args.out, "tokenizer"), texts, S["vocab"])
        info.update(
            files=len(texts),
            bytes=sum(len(s.encode("utf-8")) for s in texts),
            seconds=round(time.time() - t, 1),
        )
        log(f"tokenizer: {info}")
        tok, ids = load_tokenizer(args.out)
        prompts = heldout_prompts(files[2], tok)
        with open(os.path.join(args.out, "heldout_prompts.jsonl"), "w") as fh:
            for r in prompts:
                fh.write(json.dumps(r) + "\n")
        log(f"heldout_prompts.jsonl: {len(prompts)} prompts from {len(files[2])} modules")
        record["stages"]["tokenizer"] = dict(info, versions=ver, heldout_prompts=len(prompts))

    if train_stages:
        from transformers import AutoTokenizer

        tok, ids = load_tokenizer(args.out)
        tok_hf = AutoTokenizer.from_pretrained(os.path.join(args.out, "tokenizer"))
        vocab = tok.get_vocab_size()
        data = Data(tok, ids, files, device, S["seq_len"])
        corpus = {
            "train_tokens": data.train.numel(),
            "val_tokens": data.val.numel(),
            "heldout_tokens": data.held.numel(),
            "train_files": len(files[0]),
            "val_files": len(files[1]),
        }
        seeds = {c: args.seed + 1000 * (i + 1) for i, c in enumerate(COMPONENTS)}
        for c in train_stages:
            hp = S["train"][c]
            t = time.time()
            log(f"==== {c}: {hp}")
            if c in ("hybrid", "qwen3"):
                rec = run_target(c, S, ids, vocab, data, device, args.out, seeds[c], hp)
            elif c == "mtp":
                rec = run_mtp(S, data, device, args.out, seeds[c], hp, args)
            else:
                rec = run_dflash(
                    c.split("-")[0],
                    S,
                    ids,
                    vocab,
                    data,
                    device,
                    args.out,
                    seeds[c],
                    hp,
                    args,
                    tok_hf,
                )
            rec.update(
                seed=seeds[c],
                corpus=corpus,
                versions=ver,
                seconds=round(time.time() - t, 1),
                argv=sys.argv[1:] if argv is None else argv,
            )
            if c == "hybrid":  # a retrained hybrid invalidates its MTP head and drafter
                for dep in ("mtp", "hybrid-dflash"):
                    if dep in record["stages"] and dep not in train_stages:
                        record["stages"][dep]["stale"] = True
            if (
                c == "qwen3"
                and "qwen3-dflash" in record["stages"]
                and "qwen3-dflash" not in train_stages
            ):
                record["stages"]["qwen3-dflash"]["stale"] = True
            record["stages"][c] = rec
            with open(cfg_path, "w") as fh:
                json.dump(record, fh, indent=2, default=str)
            log(f"==== {c} done in {time.time() - t:.0f}s")
            if device.type == "cuda":
                torch.cuda.empty_cache()

    with open(cfg_path, "w") as fh:
        json.dump(record, fh, indent=2, default=str)
    if not args.no_check:
        record["checks"] = check_outputs(args.out, args)
        with open(cfg_path, "w") as fh:
            json.dump(record, fh, indent=2, default=str)
    log(f"done ({time.time() - T0:.0f}s total)")
    return 0
