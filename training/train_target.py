"""The target stages (``hybrid``, ``qwen3``): next-token training from scratch on the corpus, evaluated
on validation and held-out windows, saved in bf16 with the config keys SGLang needs."""

from __future__ import annotations

import json
import os

import torch

from training.export import save_target
from training.loop import train_loop
from training.models import build_target, hybrid_config, qwen3_config
from training.objectives import lm_loss
from training.runtime import autocast, log, seed_all


@torch.no_grad()
def eval_lm(model, data, S, device):
    """CE (nats/token) on evenly spaced validation and held-out windows."""
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


def run_target(kind, S, ids, vocab, data, device, out, seed, hp):
    """Train target ``kind`` (hybrid or qwen3) from scratch and save it to ``out``/kind."""
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

    def step_fn():
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
