"""The drafter stages (``hybrid-dflash``, ``qwen3-dflash``): a DFlash drafter distilled on its saved,
frozen target, on corpus windows and a share ``gen_frac`` of self-generated continuations."""

from __future__ import annotations

import os
import time

import torch

from training.export import save_drafter
from training.loop import train_loop
from training.models import drafter_cfg, drafter_class, load_target
from training.objectives import dflash_batch, dflash_stats
from training.runtime import autocast, log, seed_all
from training.selfgen import self_generated


def run_dflash(kind, S, ids, vocab, data, device, out, seed, hp, args, tok_hf):
    """Train the DFlash drafter of target ``kind`` on its saved, frozen checkpoint in ``out``."""
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

    def step_fn():
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
    save_drafter(drafter, os.path.join(out, f"{kind}-dflash"))
    rec.update(params=n, hp=hp, config=cfg, gamma=gamma, distill=args.distill)
    return rec
