"""The ``mtp`` stage: a Qwen3.5 MTP head warm-started from the hybrid target's last (full-attention)
layer, distilled on the frozen target's distribution for token t+2, its weights added to hybrid/."""

from __future__ import annotations

import os

import torch

from training.export import add_mtp_weights
from training.loop import train_loop
from training.models import Qwen35MTP, check_causal, load_target
from training.objectives import soft_ce
from training.runtime import autocast, log, seed_all


def run_mtp(S, data, device, out, seed, hp, args):
    """Train the MTP head on the saved, frozen hybrid target in ``out`` and add it to hybrid/."""
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

    def step_fn():
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
    keys = add_mtp_weights(path, mtp)
    rec.update(params=n, hp=hp, distill=args.distill, keys=keys)
    return rec
