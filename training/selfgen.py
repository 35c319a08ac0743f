"""Self-generated training data for the drafters: corpus prefixes continued by the frozen target's
own greedy decoding, the text a drafter meets at inference."""

from __future__ import annotations

import torch

from training.runtime import autocast


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
