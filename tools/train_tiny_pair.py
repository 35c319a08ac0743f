#!/usr/bin/env python3
"""Train tiny, *learned* target/drafter fixtures on the Python standard library's own sources.

Outputs (``--out DIR``, bf16, < 20 MB in all):

    tokenizer/       byte-level BPE (tokenizer.json, tokenizer_config.json with a ChatML template,
                     special_tokens_map.json); specials <|endoftext|> <|im_start|> <|im_end|> <|MASK|>
    hybrid/          Qwen3_5ForCausalLM (Qwen3.5-text, layer_types [lin,lin,lin,full]*2, tied
                     embeddings) + an MTP head stored as ``mtp.*`` in the same model.safetensors
                     (the layout SGLang 0.5.23's Qwen3_5ForCausalLMMTP loads for NEXTN)
    hybrid-dflash/   DFlash drafter (z-lab layout) trained on the hybrid target's hidden states
    qwen3/           Qwen3ForCausalLM, pure attention, tied embeddings
    qwen3-dflash/    DFlash drafter for qwen3/
    heldout_prompts.jsonl   signature+docstring prompts from the held-out stdlib modules
    train_config.json       every setting, versions, step counts, losses (merged across stages)

Stages (``--stage a+b+c``; components run in the fixed order below, whatever order is given):
    tokenizer      train the BPE tokenizer, write heldout_prompts.jsonl
    hybrid         train the hybrid target
    mtp            train the MTP head on the (saved, bf16, frozen) hybrid target; add it to hybrid/
    hybrid-dflash  train the DFlash drafter for the hybrid target
    qwen3          train the Qwen3 target
    qwen3-dflash   train the DFlash drafter for the Qwen3 target
    all            everything
Every invocation ends with reload checks of whatever exists in --out and prints the total size.

Recommended H200 split (each < ~8 min): ``tokenizer+hybrid``, ``hybrid-dflash+mtp``,
``qwen3+qwen3-dflash``. The shipped drafters were retrained on the shipped targets with
``bash benchmarks/h200_train_drafters.sh 320 HG:hybrid-dflash: ...`` (several variants side by side,
``--set PATH=JSON`` overrides; benchmarks/results/drafter_variants_h200.md); the defaults below are
the winners. Step counts are fixed (reproducible); each training has a time box and
is shortened only if the steps/s measured after warm-up says it would not fit (recorded as
``shrunk`` in train_config.json). ``--time-budget-s`` rescales the boxes of this invocation.

Objectives
    targets   next-token CE on random 512-token windows of the stdlib stream, AdamW, cosine LR,
              bf16 autocast (fp32 master weights); saved in bf16.
    DFlash    target frozen (bf16, as saved). Per sequence ``anchors`` random anchor positions a;
              block [x_a, MASK*(B-1)] at positions a..a+B-1 attends to the projected target
              features of tokens < a and to its whole block (bidirectional); all blocks of a
              sequence go through one forward via the attention mask. Rows k=1..B-1 are
              distilled on the *target's* next-token distribution at position a+k-1 (soft CE =
              forward KL up to a constant, ``--distill soft``; ``hard`` = CE on the target argmax),
              weighted exp(-(k-1)/gamma). Soft labels keep the draft marginals calibrated, which
              DDTree's best-first tree uses; the argmax agreement (= greedy acceptance) is logged.
              A share ``gen_frac`` of the batches are self-generated: corpus prefixes continued
              by the target's own greedy decoding (anchors in the continuation only), the text a
              drafter meets at inference (the DFlash recipe trains on target-generated answers).
    MTP       row t gets fc([pre_fc_norm_embedding(E x_{t+1}); pre_fc_norm_hidden(h_t)]) with h_t
              the target's final-normed last hidden state (what SGLang passes as
              spec_info.hidden_states), one causal full-attention Qwen3.5 decoder layer at position
              t, mtp.norm, the tied LM head; distilled on the target's distribution for token t+2.
"""

from __future__ import annotations

import argparse
import ast
import copy
import importlib
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time

import torch
import torch.nn.functional as F
from torch import nn

# `python tools/train_tiny_pair.py` puts tools/ (not the repo root) on sys.path; the drafter lives
# in the repo's sglang_spec package, which need not be pip-installed on the GPU machine.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(_REPO, "sglang_spec")) and _REPO not in sys.path:
    sys.path.insert(0, _REPO)

SCRIPT_VERSION = 1
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# Held out of tokenizer and LM training; all exist as top-level modules in CPython 3.11 and 3.12.
HELDOUT_MODULES = [
    "textwrap.py",
    "fractions.py",
    "statistics.py",
    "difflib.py",
    "shlex.py",
    "calendar.py",
    "colorsys.py",
    "heapq.py",
    "graphlib.py",
    "pprint.py",
]
# test/tests/idlelib/site-packages as asked; encodings (charmap tables) and pydoc_data (one big
# docs string) are data, not code.
EXCLUDE_DIRS = [
    "test",
    "tests",
    "idlelib",
    "site-packages",
    "__pycache__",
    "encodings",
    "pydoc_data",
]
VAL_EVERY = 40  # every 40th training file (sorted order) is the in-distribution validation set

COMPONENTS = ["tokenizer", "hybrid", "mtp", "hybrid-dflash", "qwen3", "qwen3-dflash"]

# ----------------------------------------------------------------------------------------------
# Sizes. "full" is what the H200 trains (total bf16 < 20 MB); "tiny" is the CPU smoke mode.
# ----------------------------------------------------------------------------------------------
FULL = {
    "vocab": 4096,
    "seq_len": 512,
    "tok_max_bytes": None,
    "hybrid": dict(
        hidden_size=256,
        intermediate_size=384,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=64,
        linear_value_head_dim=64,
    ),
    "qwen3": dict(
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    ),
    # hybrid drafter: 2 layers and features up to layer 6 (the deepest SGLang allows for 8 layers) beat
    # 1 layer / [1, 3, 5] in benchmarks/results/drafter_variants_h200.md; the qwen3 drafter stays small
    # to keep the fixtures under 20 MB.
    "drafter": {
        "hybrid": dict(
            num_hidden_layers=2,
            intermediate_size=384,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
        ),
        "qwen3": dict(
            num_hidden_layers=1,
            intermediate_size=256,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
        ),
    },
    "hybrid_layer_ids": [2, 4, 6],
    "qwen3_layer_ids": [0, 2],
    "block_size": 16,
    # per training: steps, batch size, peak LR, warm-up steps, time box (s)
    "train": {
        "hybrid": dict(steps=1200, bs=32, lr=2e-3, warmup=100, box=330),
        "mtp": dict(steps=1200, bs=32, lr=1.5e-3, warmup=60, box=170),
        "hybrid-dflash": dict(
            steps=4000,
            bs=64,
            lr=3e-3,
            warmup=80,
            box=330,
            anchors=32,
            gen_frac=0.75,
            gen_seqs=4096,
            gen_new=320,
        ),
        "qwen3": dict(steps=1500, bs=32, lr=2e-3, warmup=100, box=200),
        # self-generated data did not help the qwen3 drafter (DFLASH 1.56 vs 1.72 tokens/step)
        "qwen3-dflash": dict(
            steps=4000,
            bs=64,
            lr=2e-3,
            warmup=80,
            box=330,
            anchors=32,
            gen_frac=0.0,
            gen_seqs=4096,
            gen_new=320,
        ),
    },
    "log_every": 50,
    "eval_every": 400,
    "eval_batches": 4,
}
TINY = {
    "vocab": 512,
    "seq_len": 64,
    "tok_max_bytes": 200_000,
    "hybrid": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
    ),
    "qwen3": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
    ),
    "drafter": {
        k: dict(
            num_hidden_layers=1,
            intermediate_size=128,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
        )
        for k in ("hybrid", "qwen3")
    },
    "hybrid_layer_ids": [1, 3, 5],
    "qwen3_layer_ids": [0, 2],
    "block_size": 8,
    "train": {
        "hybrid": dict(steps=4, bs=4, lr=3e-3, warmup=2, box=60),
        "mtp": dict(steps=3, bs=4, lr=3e-3, warmup=1, box=60),
        "hybrid-dflash": dict(
            steps=3,
            bs=4,
            lr=3e-3,
            warmup=1,
            box=60,
            anchors=4,
            gen_frac=0.5,
            gen_seqs=8,
            gen_new=32,
        ),
        "qwen3": dict(steps=4, bs=4, lr=3e-3, warmup=2, box=60),
        "qwen3-dflash": dict(
            steps=3,
            bs=4,
            lr=3e-3,
            warmup=1,
            box=60,
            anchors=4,
            gen_frac=0.5,
            gen_seqs=8,
            gen_new=32,
        ),
    },
    "log_every": 2,
    "eval_every": 1000,
    "eval_batches": 1,
}
COMMON = dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048)

T0 = time.time()


def log(msg: str) -> None:
    print(f"[{time.time() - T0:7.1f}s] {msg}", flush=True)


def seed_all(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device, enabled=True):
    return torch.autocast(
        device_type=device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda"
    )


# ----------------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------------
def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def corpus_files(max_bytes=None):
    """(train, val, heldout) lists of absolute paths, deterministic (sorted walk)."""
    root = stdlib_root()
    allf = []
    for dp, dns, fns in os.walk(root):
        dns[:] = sorted(d for d in dns if d not in EXCLUDE_DIRS)
        for f in sorted(fns):
            if f.endswith(".py"):
                allf.append(os.path.join(dp, f))
    held = [os.path.join(root, m) for m in HELDOUT_MODULES]
    missing = [p for p in held if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"held-out modules missing from this stdlib: {missing}")
    held_set = set(held)
    rest = [p for p in allf if p not in held_set]
    if max_bytes is not None:  # tiny mode: a prefix of the small files
        out, tot = [], 0
        for p in rest:
            if os.path.getsize(p) > 30_000:
                continue
            out.append(p)
            tot += os.path.getsize(p)
            if tot >= max_bytes:
                break
        rest = out
    val = [p for i, p in enumerate(rest) if i % VAL_EVERY == VAL_EVERY // 2] or rest[-1:]
    vs = set(val)
    train = [p for p in rest if p not in vs]
    return train, val, held


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------
def train_tokenizer(out_dir: str, texts: list[str], vocab: int) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s, i in ids.items()
    }
    extra = ["<|im_start|>", "<|im_end|>", "<|MASK|>"]
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": extra,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as fh:
        json.dump(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": extra,
            },
            fh,
            indent=2,
        )
    return {"vocab_size": tok.get_vocab_size(), "special_ids": ids}


def load_tokenizer(out: str):
    from tokenizers import Tokenizer

    path = os.path.join(out, "tokenizer", "tokenizer.json")
    if not os.path.exists(path):
        raise SystemExit(f"{path} missing: run --stage tokenizer first (same --out)")
    tok = Tokenizer.from_file(path)
    return tok, {s: tok.token_to_id(s) for s in SPECIALS}


def copy_tokenizer(out: str, dst: str) -> None:
    for f in os.listdir(os.path.join(out, "tokenizer")):
        shutil.copy(os.path.join(out, "tokenizer", f), dst)


def encode_stream(tok, texts: list[str], eot: int) -> torch.Tensor:
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


class Data:
    """Token streams (train / val / heldout) and seeded random windows."""

    def __init__(self, tok, ids, files, device, seq_len):
        train, val, held = files
        t = time.time()
        eot = ids["<|endoftext|>"]
        self.train = encode_stream(tok, [read(p) for p in train], eot).to(device)
        self.val = encode_stream(tok, [read(p) for p in val], eot).to(device)
        self.held = encode_stream(tok, [read(p) for p in held], eot).to(device)
        self.device, self.seq_len = device, seq_len
        log(
            f"data: train {len(train)} files {self.train.numel()} tok | val {len(val)} files "
            f"{self.val.numel()} tok | heldout {len(held)} files {self.held.numel()} tok "
            f"({time.time() - t:.1f}s)"
        )

    def windows(self, stream, bs, length, gen):
        starts = torch.randint(0, stream.numel() - length, (bs,), generator=gen)
        idx = starts.to(self.device)[:, None] + torch.arange(length, device=self.device)
        return stream[idx]

    def eval_windows(self, stream, n, length):
        """Deterministic, evenly spaced windows for evaluation."""
        span = stream.numel() - length
        starts = torch.linspace(0, span, n).long().to(self.device)
        return stream[starts[:, None] + torch.arange(length, device=self.device)]


# ----------------------------------------------------------------------------------------------
# Held-out prompts
# ----------------------------------------------------------------------------------------------
def heldout_prompts(files, tok, per_module=5, max_prompt_tokens=320):
    rows = []
    for path in files:
        src = read(path)
        lines = src.splitlines(keepends=True)
        tree = ast.parse(src)
        cands = []

        def visit(body, prefix):
            for node in body:
                if isinstance(node, ast.ClassDef):
                    visit(node.body, prefix + node.name + ".")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    doc = ast.get_docstring(node)
                    if not doc or node.name.startswith("_") or not node.body[1:]:
                        continue
                    ds = node.body[0]
                    cut = (
                        node.col_offset
                    )  # dedent by the def's indent only: prompt + reference = source
                    strip = lambda ls: "".join(
                        ln[cut:] if ln[:cut].strip() == "" else ln.lstrip() for ln in ls
                    )
                    head = strip(lines[node.lineno - 1 : ds.end_lineno])
                    body = strip(lines[ds.end_lineno : node.end_lineno])
                    cands.append((prefix + node.name, head, body))

        visit(tree.body, "")
        cands = [c for c in cands if len(tok.encode(c[1]).ids) <= max_prompt_tokens]
        if len(cands) > per_module:  # evenly spaced over the file, deterministic
            cands = [
                cands[round(i * (len(cands) - 1) / (per_module - 1))] for i in range(per_module)
            ]
        mod = os.path.basename(path)[:-3]
        for qual, head, body in cands:
            rows.append(
                {
                    "id": f"{mod}:{qual}",
                    "module": mod,
                    "qualname": qual,
                    "prompt": head,
                    "reference": body[:2000],
                    "prompt_tokens": len(tok.encode(head).ids),
                }
            )
    return rows


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
def hybrid_config(S, ids, vocab):
    from transformers import Qwen3_5TextConfig

    h = S["hybrid"]
    n = h["num_hidden_layers"]
    assert n % 4 == 0
    return Qwen3_5TextConfig(
        vocab_size=vocab,
        **h,
        linear_conv_kernel_dim=4,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (n // 4),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": COMMON["rope_theta"],
            "partial_rotary_factor": 0.25,
        },
        max_position_embeddings=COMMON["max_position_embeddings"],
        rms_norm_eps=COMMON["rms_norm_eps"],
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def qwen3_config(S, ids, vocab):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        **S["qwen3"],
        rope_theta=COMMON["rope_theta"],
        max_position_embeddings=COMMON["max_position_embeddings"],
        rms_norm_eps=COMMON["rms_norm_eps"],
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def build_target(kind, cfg):
    if kind == "hybrid":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as cls
    else:
        from transformers import Qwen3ForCausalLM as cls
    m = cls(cfg)
    assert m.lm_head.weight is m.model.embed_tokens.weight, "embeddings not tied"
    return m


def load_target(path, device, dtype):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


class Qwen35MTP(nn.Module):
    """The NEXTN head SGLang's Qwen3_5ForCausalLMMTP runs (srt/models/qwen3_5_mtp.py), in HF modules.

    state_dict keys (prefixed ``mtp.`` in the checkpoint): fc, pre_fc_norm_embedding,
    pre_fc_norm_hidden, layers.0.{self_attn,mlp,input_layernorm,post_attention_layernorm}.*, norm.
    SGLang's load_weights maps mtp.X -> model.X, then model.fc/model.pre_fc* -> fc/pre_fc*,
    drops '.self_attn', and stacks q/k/v and gate/up: every key here has a destination.
    Norms are Qwen3.5's (1 + w) RMSNorm = SGLang's GemmaRMSNorm.
    """

    def __init__(self, tcfg):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        c = copy.deepcopy(tcfg)
        c.num_hidden_layers = 1
        c.layer_types = ["full_attention"]
        c._attn_implementation = "sdpa"  # causal when no mask is given (checked in check_causal)
        H, eps = c.hidden_size, c.rms_norm_eps
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        self.norm = Qwen3_5RMSNorm(H, eps=eps)
        self.rotary_emb = Qwen3_5TextRotaryEmbedding(c)  # buffers only, none persistent
        nn.init.normal_(self.fc.weight, std=0.02)

    def forward(self, emb, hidden, position_ids):
        x = torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        # Qwen3.5's rotary is multimodal (3 position rows); transformers 5.17 needs them explicit.
        pe = self.rotary_emb(x, position_ids[None].expand(3, -1, -1))
        x = self.layers[0](
            x, position_embeddings=pe, attention_mask=None, position_ids=position_ids
        )
        return self.norm(x)


def mtp_forward(mtp, target, x):
    """x [bs, T] -> (mtp logits [bs, T-1, V] for tokens 2..T, target logits [bs, T, V])."""
    h = target.model(input_ids=x).last_hidden_state  # final-normed, = SGLang's captured hidden
    tlogits = target.lm_head(h)
    emb = target.model.embed_tokens(x[:, 1:])
    pos = torch.arange(x.shape[1] - 1, device=x.device)[None].expand(x.shape[0], -1)
    out = mtp(emb, h[:, :-1], pos)
    return target.lm_head(out), tlogits


def check_causal(mtp, H, device):
    g = torch.Generator().manual_seed(0)
    e = torch.randn(1, 6, H, generator=g).to(device)
    h = torch.randn(1, 6, H, generator=g).to(device)
    pos = torch.arange(6, device=device)[None]
    with torch.no_grad():
        a = mtp(e, h, pos)
        e2 = e.clone()
        e2[:, 4:] += 1.0
        b = mtp(e2, h, pos)
    assert torch.allclose(a[:, :4].float(), b[:, :4].float(), atol=1e-4), "MTP layer is not causal"
    assert not torch.allclose(a[:, 4:].float(), b[:, 4:].float()), "MTP layer ignores its input"


def drafter_cfg(S, kind, target_cfg, layer_ids, mask_id, vocab):
    d = S["drafter"][kind]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": S["block_size"],
        "dflash_config": {
            "mask_token_id": mask_id,
            "mask_token": "<|MASK|>",
            "target_layer_ids": list(layer_ids),
        },
        "num_target_layers": target_cfg.num_hidden_layers,
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": d["intermediate_size"],
        "num_hidden_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_key_value_heads"],
        "head_dim": d["head_dim"],
        "vocab_size": vocab,
        "rms_norm_eps": COMMON["rms_norm_eps"],
        "rope_theta": COMMON["rope_theta"],
        "max_position_embeddings": COMMON["max_position_embeddings"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "layer_types": ["full_attention"] * d["num_hidden_layers"],
    }


def drafter_class(spec: str):
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)


# ----------------------------------------------------------------------------------------------
# Training loop
# ----------------------------------------------------------------------------------------------
def make_optimizer(params, lr, device):
    named = [(n, p) for n, p in params if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def train_loop(name, params, step_fn, hp, device, S, eval_fn=None):
    """Run ``hp['steps']`` AdamW steps of step_fn(step) -> (loss, metrics dict of tensors).

    Cosine LR to 10% after linear warm-up. The step rate is measured over steps 10..30 and again over
    100..300 (other jobs sharing the GPU may start late); whenever the steps would not fit the time
    box, the step count is cut to fit (recorded)."""
    opt = make_optimizer(params, hp["lr"], device)
    trainable = [p for _, p in params if p.requires_grad]
    total, warm = hp["steps"], hp["warmup"]
    box = hp["box"]
    rec = {"steps_planned": total, "shrunk": False, "log": []}

    def lr_at(s):
        if s < warm:
            return hp["lr"] * (s + 1) / warm
        prog = min(1.0, (s - warm) / max(1, total - warm))
        return hp["lr"] * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * prog)))

    t_start = time.time()
    t_cal = {}
    windows = {30: 10, 300: 100}  # calibration end step -> start step
    step = 0
    acc = {}
    n_acc = 0
    while step < total:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        loss, metrics = step_fn(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        opt.step()
        step += 1
        metrics = dict(metrics, loss=loss.detach(), gnorm=gn.detach())
        for k, v in metrics.items():
            acc[k] = acc.get(k, 0) + v.float()
        n_acc += 1
        if step in windows.values():
            sync(device)
            t_cal[step] = time.time()
        if step in windows and total > step:
            sync(device)
            rate = (step - windows[step]) / (time.time() - t_cal[windows[step]])
            elapsed = time.time() - t_start
            eta = (total - step) / rate
            log(
                f"{name}: {rate:.2f} steps/s over steps {windows[step]}..{step}; ETA {eta:.0f}s for {total} "
                f"steps (box {box:.0f}s)"
            )
            if elapsed + eta > box:
                new_total = max(step + 1, int(step + (box - elapsed) * rate * 0.95))
                log(
                    f"{name}: WARNING shrinking steps {total} -> {new_total} to fit the {box:.0f}s box"
                )
                total, rec["shrunk"] = new_total, True
        if step % S["log_every"] == 0 or step == total:
            vals = {k: (v / n_acc).item() for k, v in acc.items()}
            acc, n_acc = {}, 0
            el = time.time() - t_start
            msg = " ".join(f"{k} {v:.4f}" for k, v in vals.items())
            log(
                f"{name} step {step}/{total} lr {lr_at(step - 1):.2e} {msg} ({el:.0f}s, {step / el:.2f} it/s)"
            )
            rec["log"].append(dict(step=step, **{k: round(v, 5) for k, v in vals.items()}))
            if el > 1.1 * box and step < total:
                log(f"{name}: WARNING past 1.1x the time box; stopping at step {step}")
                rec["stopped_early"] = True
                break
        if eval_fn is not None and step % S["eval_every"] == 0 and step < total:
            log(f"{name} eval @ {step}: {eval_fn()}")
    rec.update(
        steps_run=step, steps_final_schedule=total, train_seconds=round(time.time() - t_start, 1)
    )
    rec["final"] = rec["log"][-1] if rec["log"] else {}
    return rec


# ----------------------------------------------------------------------------------------------
# Components
# ----------------------------------------------------------------------------------------------
def lm_loss(model, x):
    logits = model(input_ids=x[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


@torch.no_grad()
def eval_lm(model, data, S, device):
    model.eval()
    out = {}
    for name, stream in (("val", data.val), ("heldout", data.held)):
        x = data.eval_windows(stream, S["eval_batches"] * 8, S["seq_len"] + 1)
        tot = 0.0
        for i in range(0, x.shape[0], 8):
            with autocast(device):
                tot += lm_loss(model, x[i : i + 8]).item()
        out[name] = round(tot / (x.shape[0] / 8), 4)
    model.train()
    return out


def save_target(model, path, out, extra_cfg):
    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    model.to(torch.float32)
    cpath = os.path.join(path, "config.json")
    with open(cpath) as fh:
        c = json.load(fh)
    c.update(extra_cfg)
    c["dtype"] = c["torch_dtype"] = "bfloat16"
    with open(cpath, "w") as fh:
        json.dump(c, fh, indent=2)
    gen = {
        "bos_token_id": c.get("bos_token_id"),
        "eos_token_id": [c["eos_token_id"], c["pad_token_id"]],
        "pad_token_id": c["pad_token_id"],
        "do_sample": False,
    }
    with open(os.path.join(path, "generation_config.json"), "w") as fh:
        json.dump(gen, fh, indent=2)
    copy_tokenizer(out, path)


def run_target(kind, S, ids, vocab, data, device, out, seed, hp):
    seed_all(seed)
    cfg = hybrid_config(S, ids, vocab) if kind == "hybrid" else qwen3_config(S, ids, vocab)
    model = build_target(kind, cfg).to(device)
    model.train()
    n = sum(p.numel() for p in model.parameters())
    log(
        f"{kind}: {type(model).__name__} {n / 1e6:.2f}M params (tied), layer_types "
        f"{getattr(cfg, 'layer_types', None)}"
    )
    gen = torch.Generator().manual_seed(seed)
    T = S["seq_len"]

    def step_fn(step):
        x = data.windows(data.train, hp["bs"], T + 1, gen)
        with autocast(device):
            return lm_loss(model, x), {}

    rec = train_loop(
        kind,
        list(model.named_parameters()),
        step_fn,
        hp,
        device,
        S,
        eval_fn=lambda: eval_lm(model, data, S, device),
    )
    rec["eval"] = eval_lm(model, data, S, device)
    log(f"{kind}: final eval (CE nats/token) {rec['eval']}")
    path = os.path.join(out, kind)
    extra = {"architectures": [type(model).__name__]}
    if kind == "hybrid":
        # SGLang derives layer types from full_attention_interval; Qwen3.5 checkpoints declare
        # their (single) MTP layer here. mtp.* weights are added by the mtp stage.
        extra.update(
            full_attention_interval=4, mtp_num_hidden_layers=1, mtp_use_dedicated_embeddings=False
        )
    save_target(model, path, out, extra)
    rec.update(params=n, hp=hp, config=json.load(open(os.path.join(path, "config.json"))))
    return rec


def soft_ce(student_logits, teacher_logits, mode):
    """Per-row CE of student vs teacher next-token distribution (soft) or argmax (hard)."""
    lp = F.log_softmax(student_logits.float(), dim=-1)
    if mode == "hard":
        return -lp.gather(-1, teacher_logits.argmax(-1, keepdim=True)).squeeze(-1)
    return -(F.softmax(teacher_logits.float(), dim=-1) * lp).sum(-1)


def dflash_batch(drafter, target, x, anchors, B, gen, mask_id, lo=1):
    """One DFlash training forward on x [bs, T], anchors drawn from positions >= lo. Returns (draft
    logits [bs, m, B-1, V], teacher logits [bs, m, B-1, V], data labels [bs, m, B-1])."""
    bs, T = x.shape
    dev = x.device
    with torch.no_grad():
        o = target(input_ids=x, output_hidden_states=True)
        feats = drafter.select_features(o.hidden_states)
        tlog = o.logits
    ctx = drafter.project_context(feats)  # [bs, T, H]
    # anchors a in [lo, T-B] (lo >= 1: context non-empty), labels a+1..a+B-1 inside the window
    a = (
        torch.rand(bs, T - B - lo + 1, generator=gen).argsort(dim=1)[:, :anchors] + lo
    )  # [bs, m], unique per row
    a = a.to(dev)
    m = a.shape[1]
    ar = torch.arange(B, device=dev)
    qpos = (a[:, :, None] + ar).reshape(bs, m * B)
    qids = torch.full((bs, m, B), mask_id, dtype=torch.long, device=dev)
    qids[:, :, 0] = x.gather(1, a)
    qids = qids.reshape(bs, m * B)
    ctx_pos = torch.arange(T, device=dev)[None].expand(bs, T)
    see_ctx = torch.arange(T, device=dev)[None, None, None, :] < a[:, :, None, None]  # [bs,m,1,T]
    see_ctx = see_ctx.expand(bs, m, B, T).reshape(bs, m * B, T)
    blk = torch.arange(m, device=dev).repeat_interleave(B)
    see_blk = (blk[:, None] == blk[None, :])[None].expand(bs, -1, -1)
    mask = torch.cat([see_ctx, see_blk], dim=-1)[:, None]  # [bs,1,Q,T+Q]
    hidden = drafter(qids, qpos, ctx, ctx_pos, attention_mask=mask)
    hidden = hidden.view(bs, m, B, -1)[:, :, 1:]
    dlog = drafter.logits(hidden)  # [bs, m, B-1, V]
    lab_pos = (a[:, :, None] + ar[1:]).reshape(bs, -1)  # positions a+1..a+B-1
    tl = tlog.gather(1, (lab_pos - 1)[:, :, None].expand(-1, -1, tlog.shape[-1])).view(
        bs, m, B - 1, -1
    )
    data_lab = x.gather(1, lab_pos).view(bs, m, B - 1)
    return dlog, tl, data_lab


def dflash_stats(dlog, tl, data_lab, weights, mode):
    ce = soft_ce(dlog, tl, mode)  # [bs, m, B-1]
    loss = (ce * weights).sum(-1).mean() / weights.sum()
    hit = (dlog.argmax(-1) == tl.argmax(-1)).float()  # agreement with the target's greedy token
    tau = 1 + hit.cumprod(-1).sum(-1).mean()  # teacher-forced greedy acceptance length
    return loss, {
        "acc1": hit[..., 0].mean(),
        "acc_all": hit.mean(),
        "tau_tf": tau,
        "data_acc1": (dlog[..., 0, :].argmax(-1) == data_lab[..., 0]).float().mean(),
    }


@torch.no_grad()
def self_generated(target, data, stream, n, prefix, new, gen, bs=512):
    """[n, prefix + new] windows: ``prefix`` tokens of ``stream`` at random offsets, then the frozen
    target's own greedy continuation (KV / GDN cache, batched, no stop at EOS). At inference the drafter
    proposes continuations of exactly such text, the target's greedy output, whose statistics (repeats,
    the target's habits) the corpus alone does not show."""
    rows = []
    for i in range(0, n, bs):
        x = data.windows(stream, min(bs, n - i), prefix, gen)
        with autocast(x.device):
            o = target(input_ids=x, use_cache=True)
            toks = [x, o.logits[:, -1:].argmax(-1)]
            for _ in range(new - 1):
                o = target(input_ids=toks[-1], past_key_values=o.past_key_values, use_cache=True)
                toks.append(o.logits[:, -1:].argmax(-1))
        rows.append(torch.cat(toks, dim=1))
    return torch.cat(rows)


def run_dflash(kind, S, ids, vocab, data, device, out, seed, hp, args, tok_hf):
    seed_all(seed)
    tdtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_target(os.path.join(out, kind), device, tdtype)
    layer_ids = S["hybrid_layer_ids"] if kind == "hybrid" else S["qwen3_layer_ids"]
    cfg = drafter_cfg(S, kind, target.config, layer_ids, ids["<|MASK|>"], vocab)
    Drafter = drafter_class(args.drafter_impl)
    drafter = Drafter.from_config(cfg, target, dtype=torch.float32, tokenizer=tok_hf)
    drafter.train()
    n = sum(p.numel() for p in drafter.parameters())
    B = cfg["block_size"]
    gamma = 7.0 if B >= 16 else 4.0
    weights = torch.exp(-torch.arange(B - 1, device=device, dtype=torch.float32) / gamma)
    log(
        f"{kind}-dflash: {n / 1e6:.2f}M params, block {B}, gamma {gamma}, target_layer_ids {layer_ids}, "
        f"{hp['anchors']} anchors/seq, distill {args.distill}"
    )
    gen = torch.Generator().manual_seed(seed)
    T = S["seq_len"]
    # Self-generated share: a fraction ``gen_frac`` of the batches are corpus prefixes continued by
    # the target itself, with anchors only in the continuation (see self_generated).
    P = T - hp["gen_new"]
    sg = {}
    if hp["gen_frac"] > 0:
        t = time.time()
        sg["train"] = self_generated(
            target, data, data.train, hp["gen_seqs"], P, hp["gen_new"], gen
        )
        sg["heldout"] = self_generated(
            target,
            data,
            data.held,
            S["eval_batches"] * 8,
            P,
            hp["gen_new"],
            torch.Generator().manual_seed(4321),
        )
        log(
            f"{kind}-dflash: self-generated {sg['train'].shape[0]} x ({P} corpus + {hp['gen_new']} greedy) "
            f"training windows in {time.time() - t:.0f}s; sample: "
            f"{tok_hf.decode(sg['train'][0, P - 24 : P + 40].tolist())!r}"
        )

    def step_fn(step):
        if sg and torch.rand((), generator=gen).item() < hp["gen_frac"]:
            x = sg["train"][
                torch.randint(0, sg["train"].shape[0], (hp["bs"],), generator=gen).to(device)
            ]
            lo = P
        else:
            x, lo = data.windows(data.train, hp["bs"], T, gen), 1
        with autocast(device):
            dlog, tl, dl = dflash_batch(
                drafter, target, x, hp["anchors"], B, gen, ids["<|MASK|>"], lo
            )
            return dflash_stats(dlog, tl, dl, weights, args.distill)

    @torch.no_grad()
    def eval_fn():
        drafter.eval()
        res = {}
        g = torch.Generator().manual_seed(1234)
        sets = [
            ("val", data.eval_windows(data.val, S["eval_batches"] * 8, T), 1),
            ("heldout", data.eval_windows(data.held, S["eval_batches"] * 8, T), 1),
        ]
        if sg:
            sets.append(("heldout_generated", sg["heldout"], P))
        for name, x, lo in sets:
            st = {}
            for i in range(0, x.shape[0], 8):
                with autocast(device):
                    dlog, tl, dl = dflash_batch(
                        drafter, target, x[i : i + 8], hp["anchors"], B, g, ids["<|MASK|>"], lo
                    )
                    loss, m = dflash_stats(dlog, tl, dl, weights, args.distill)
                    hit = (dlog.argmax(-1) == tl.argmax(-1)).float().mean((0, 1))
                for k, v in dict(m, loss=loss, hit=hit).items():
                    st[k] = st.get(k, 0) + v.float() / (x.shape[0] / 8)
            res[name] = {
                k: (round(v.item(), 4) if v.numel() == 1 else [round(t, 3) for t in v.tolist()])
                for k, v in st.items()
            }
        drafter.train()
        return res

    rec = train_loop(
        f"{kind}-dflash", list(drafter.named_parameters()), step_fn, hp, device, S, eval_fn=eval_fn
    )
    rec["eval"] = eval_fn()
    log(
        f"{kind}-dflash: final eval (hit = per-position greedy agreement k=1..{B - 1}) {rec['eval']}"
    )
    path = os.path.join(out, f"{kind}-dflash")
    if os.path.isdir(path):
        shutil.rmtree(path)
    drafter.to(torch.bfloat16)
    drafter.save_pretrained(path)
    rec.update(params=n, hp=hp, config=cfg, gamma=gamma, distill=args.distill)
    return rec


def run_mtp(S, ids, vocab, data, device, out, seed, hp, args):
    from safetensors.torch import load_file, save_file

    seed_all(seed)
    path = os.path.join(out, "hybrid")
    tdtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = load_target(path, device, tdtype)
    mtp = Qwen35MTP(target.config)
    # warm start: the decoder layer and final norm from the target's last (full-attention) layer
    last = target.model.layers[-1]
    assert target.config.layer_types[-1] == "full_attention", (
        "the hybrid's last layer must be full attention"
    )
    mtp.layers[0].load_state_dict({k: v.float() for k, v in last.state_dict().items()})
    mtp.norm.load_state_dict({k: v.float() for k, v in target.model.norm.state_dict().items()})
    mtp = mtp.to(device=device, dtype=torch.float32)
    check_causal(mtp, target.config.hidden_size, device)
    mtp.train()
    n = sum(p.numel() for p in mtp.parameters())
    log(
        f"mtp: {n / 1e6:.2f}M params (1 full-attention layer, warm-started from target layer "
        f"{len(target.model.layers) - 1}), distill {args.distill}"
    )
    gen = torch.Generator().manual_seed(seed)
    T = S["seq_len"]

    def stats(x):
        with torch.no_grad():
            h = target.model(input_ids=x).last_hidden_state
            tlog = target.lm_head(h)
        emb = target.model.embed_tokens(x[:, 1:])
        pos = torch.arange(T - 1, device=device)[None].expand(x.shape[0], -1)
        lg = target.lm_head(mtp(emb, h[:, :-1], pos))  # row t predicts token t+2
        tl = tlog[:, 1:]
        loss = soft_ce(lg, tl, args.distill).mean()
        hit = (lg.argmax(-1) == tl.argmax(-1)).float().mean()
        dacc = (lg[:, :-1].argmax(-1) == x[:, 2:]).float().mean()
        return loss, {"acc": hit, "data_acc": dacc}

    def step_fn(step):
        x = data.windows(data.train, hp["bs"], T, gen)
        with autocast(device):
            return stats(x)

    @torch.no_grad()
    def eval_fn():
        mtp.eval()
        res = {}
        for name, stream in (("val", data.val), ("heldout", data.held)):
            x = data.eval_windows(stream, S["eval_batches"] * 8, T)
            st = {}
            for i in range(0, x.shape[0], 8):
                with autocast(device):
                    loss, m = stats(x[i : i + 8])
                for k, v in dict(m, loss=loss).items():
                    st[k] = st.get(k, 0) + v.item() / (x.shape[0] / 8)
            res[name] = {k: round(v, 4) for k, v in st.items()}
        mtp.train()
        return res

    rec = train_loop("mtp", list(mtp.named_parameters()), step_fn, hp, device, S, eval_fn=eval_fn)
    rec["eval"] = eval_fn()
    log(f"mtp: final eval (acc = agreement with the target's greedy token t+2) {rec['eval']}")
    # add mtp.* to the target's safetensors (replacing any previous mtp.*)
    st_path = os.path.join(path, "model.safetensors")
    sd = {k: v for k, v in load_file(st_path).items() if not k.startswith("mtp.")}
    for k, v in mtp.state_dict().items():
        if "rotary_emb" in k:
            continue
        sd["mtp." + k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(sd, st_path, metadata={"format": "pt"})
    rec.update(
        params=n, hp=hp, distill=args.distill, keys=sorted(k for k in sd if k.startswith("mtp."))
    )
    return rec


# ----------------------------------------------------------------------------------------------
# Checks
# ----------------------------------------------------------------------------------------------
SGLANG_MTP_PARAMS = {  # Qwen3_5ForCausalLMMTP.named_parameters() for a dense 1-layer head
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "model.norm.weight",
    "model.layers.0.qkv_proj.weight",
    "model.layers.0.o_proj.weight",
    "model.layers.0.q_norm.weight",
    "model.layers.0.k_norm.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
}


def sglang_mtp_name(name):
    """The destination parameter of checkpoint key ``name`` in SGLang 0.5.23
    Qwen3_5ForCausalLMMTP.load_weights (dense, non-expert path), mirrored string for string."""
    name = (
        name.replace("mtp.", "model.").replace("model.fc", "fc").replace("model.pre_fc", "pre_fc")
    )
    name = name.replace(".self_attn", "")
    for param, shard in (
        ("qkv_proj", "q_proj"),
        ("qkv_proj", "k_proj"),
        ("qkv_proj", "v_proj"),
        ("gate_up_proj", "gate_proj"),
        ("gate_up_proj", "up_proj"),
    ):
        if shard in name:
            return name.replace(shard, param)
    return name


def check_outputs(out, device, args):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results = {}
    tdir = os.path.join(out, "tokenizer")
    if os.path.isdir(tdir):
        tok = AutoTokenizer.from_pretrained(tdir)
        text = tok.apply_chat_template(
            [{"role": "user", "content": "def f(x):\n    return x"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text, "tokenizer round trip"
        assert tok.convert_tokens_to_ids("<|MASK|>") == tok.get_vocab()["<|MASK|>"]
        results["tokenizer"] = {
            "class": type(tok).__name__,
            "len": len(tok),
            "eos": tok.eos_token_id,
            "mask_id": tok.convert_tokens_to_ids("<|MASK|>"),
        }
        log(f"check tokenizer: {results['tokenizer']}")
    for kind in ("hybrid", "qwen3"):
        path = os.path.join(out, kind)
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            continue
        tok = AutoTokenizer.from_pretrained(path)
        m, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        assert not info["missing_keys"], f"{kind}: missing keys {info['missing_keys']}"
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), (
            f"{kind}: lm_head not tied"
        )
        with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
            keys = list(f.keys())
            dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
        mtp_keys = sorted(k for k in keys if k.startswith("mtp."))
        r = {
            "class": type(m).__name__,
            "unexpected_reported": sorted(info["unexpected_keys"]),
            "safetensors_dtypes": sorted(dtypes),
            "mtp_keys": len(mtp_keys),
        }
        x = torch.tensor([tok("def add(a, b):\n    return")["input_ids"]])
        with torch.no_grad():
            lg = m(input_ids=x).logits.float()
        assert torch.isfinite(lg).all()
        r["greedy_next"] = tok.decode(lg[0, -1].argmax().item())
        if mtp_keys:
            dest = {sglang_mtp_name(k) for k in mtp_keys}
            assert dest == SGLANG_MTP_PARAMS, (
                f"mtp keys map to {sorted(dest ^ SGLANG_MTP_PARAMS)} in SGLang"
            )
            mtp = Qwen35MTP(m.config)
            with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
                sd = {k[4:]: f.get_tensor(k).float() for k in mtp_keys}
            mtp.load_state_dict(sd, strict=True)
            with torch.no_grad():
                m.float()
                mlog, tlog = mtp_forward(mtp, m, x)
            r["mtp_reload"] = (
                "ok (strict; SGLang name mapping covers every Qwen3_5ForCausalLMMTP param)"
            )
        results[kind] = r
        log(f"check {kind}: {r}")
        dpath = os.path.join(out, f"{kind}-dflash")
        if os.path.exists(os.path.join(dpath, "model.safetensors")):
            Drafter = drafter_class(args.drafter_impl)
            m = m.float()
            d = Drafter.from_pretrained(dpath, m, dtype=torch.float32, tokenizer=tok)
            cfg = json.load(open(os.path.join(dpath, "config.json")))
            with safe_open(os.path.join(dpath, "model.safetensors"), "pt") as f:
                ddt = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
            n = x.shape[1]
            B = cfg["block_size"]
            with torch.no_grad():
                o = m(input_ids=x, output_hidden_states=True)
                ctx = d.project_context(d.select_features(o.hidden_states))
                q = torch.full((1, B), cfg["dflash_config"]["mask_token_id"])
                q[0, 0] = o.logits[0, -1].argmax()
                h = d(q, torch.arange(n, n + B)[None], ctx, torch.arange(n)[None])
                draft = d.logits(h[:, 1:]).argmax(-1)[0].tolist()
            rd = {
                "params": sum(p.numel() for p in d.parameters()),
                "safetensors_dtypes": sorted(ddt),
                "block_size": B,
                "draft": tok.decode([q[0, 0].item()] + draft),
            }
            results[f"{kind}-dflash"] = rd
            log(f"check {kind}-dflash: {rd}")
    total = 0
    for dp, _, fns in os.walk(out):
        total += sum(os.path.getsize(os.path.join(dp, f)) for f in fns)
    results["total_bytes"] = total
    log(f"output size: {total / 1e6:.2f} MB ({total} bytes) in {out}")
    if total > 20_000_000:
        log("WARNING: output exceeds 20 MB")
    return results


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------
def versions():
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


def parse_stages(s):
    parts = set()
    for p in s.replace(",", "+").split("+"):
        p = p.strip()
        if not p:
            continue
        if p == "all":
            parts.update(COMPONENTS)
        elif p in COMPONENTS:
            parts.add(p)
        else:
            raise SystemExit(f"unknown stage {p!r}; valid: {COMPONENTS + ['all']}")
    return [c for c in COMPONENTS if c in parts]


def apply_override(S: dict, item: str) -> None:
    """``a.b.c=JSON`` -> S["a"]["b"]["c"] = value; the key must already exist (no typos slip through)."""
    path, sep, raw = item.partition("=")
    if not sep or not path:
        raise SystemExit(f"--set {item!r}: expected PATH=JSON, e.g. drafter.num_hidden_layers=2")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        raise SystemExit(
            f'--set {item!r}: {raw!r} is not JSON (numbers, [lists], "strings")'
        ) from None
    node, keys = S, path.split(".")
    for i, k in enumerate(keys):
        if not isinstance(node, dict) or k not in node:
            valid = sorted(node) if isinstance(node, dict) else []
            raise SystemExit(
                f"--set {item!r}: no setting {'.'.join(keys[: i + 1])!r}; valid here: {valid}"
            )
        if i == len(keys) - 1:
            node[k] = value
        node = node[k]


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
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
    S = copy.deepcopy(TINY if args.tiny else FULL)
    if args.seq_len:
        S["seq_len"] = args.seq_len
    for item in args.set:
        apply_override(S, item)
    for k, hp in S["train"].items():
        if args.bs:
            hp["bs"] = args.bs
        hp["steps"] = max(2, int(round(hp["steps"] * args.steps_scale)))
        hp["box"] = hp["box"] * max(args.steps_scale, 0.05)
    train_stages = [c for c in stages if c != "tokenizer"]
    if args.time_budget_s is not None and train_stages:
        fixed = 60.0 + 20.0 * len(train_stages) + (60.0 if "tokenizer" in stages else 0.0)
        avail = max(30.0, args.time_budget_s - fixed)
        want = sum(S["train"][c]["box"] for c in train_stages)
        f = min(1.0, avail / want)
        for c in train_stages:
            S["train"][c]["box"] *= f
        log(f"time budget {args.time_budget_s:.0f}s: training boxes scaled by {f:.2f}")

    os.makedirs(args.out, exist_ok=True)
    cfg_path = os.path.join(args.out, "train_config.json")
    record = json.load(open(cfg_path)) if os.path.exists(cfg_path) else {}
    record.setdefault("stages", {})
    record.update(
        script="tools/train_tiny_pair.py",
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
                rec = run_mtp(S, ids, vocab, data, device, args.out, seeds[c], hp, args)
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
        record["checks"] = check_outputs(args.out, torch.device("cpu"), args)
        with open(cfg_path, "w") as fh:
            json.dump(record, fh, indent=2, default=str)
    log(f"done ({time.time() - T0:.0f}s total)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
