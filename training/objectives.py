"""Training objectives: next-token CE for the targets, soft / hard distillation CE, and the DFlash
training forward (random anchor blocks of a sequence in one masked drafter forward, distilled on the
frozen target's next-token distributions) with its loss and acceptance statistics."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def lm_loss(model, x):
    """Mean next-token cross-entropy of ``model`` on windows x [bs, T+1]."""
    logits = model(input_ids=x[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))


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
    """Position-weighted distillation loss of one DFlash batch and its agreement metrics."""
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
