"""The training loop every stage shares: AdamW (decay on matrices, not embeddings or norms), linear
warm-up then cosine LR to 10%, gradient clipping, averaged metric logs, periodic evaluation, and the
time box: the step rate is measured after warm-up and the step count cut to fit (recorded)."""

from __future__ import annotations

import math
import time

import torch

from training.runtime import log, sync


def make_optimizer(params, lr, device):
    named = [(n, p) for n, p in params if p.requires_grad]
    decay = [p for n, p in named if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in named if not (p.ndim >= 2 and "embed" not in n)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if device.type == "cuda" else {}
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8, **kw)


def train_loop(name, params, step_fn, hp, device, S, eval_fn=None):
    """Run ``hp['steps']`` AdamW steps of step_fn() -> (loss, metrics dict of tensors).

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
        loss, metrics = step_fn()
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
