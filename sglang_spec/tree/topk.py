"""Per-depth top-K of the drafter through a vocabulary-parallel LM head, without gathering the vocabulary.

Under tensor parallelism each rank holds a slice of the LM head's rows (:class:`VocabShard`). Each
rank takes its own top-k and log-sum-exp, only its ``[bs, L, k]`` values and ids and ``[bs, L]``
log-sum-exps are all-gathered (one collective, packed: :func:`gathered_shape`), and
:func:`~sglang_spec.tree.merge_sharded_topk` merges them into the top-k of the full
``log_softmax``. With one rank (no all-gather) this is exactly
:func:`~sglang_spec.tree.draft_topk` on the shard's logits.

Plain torch: the caller passes the all-gather as a callable, so nothing here knows a serving
framework's process groups; :class:`StaticAllGather` wraps a group's ``all_gather_into_tensor``
so that a CUDA graph can capture it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .build import check_tree_temperature, draft_topk, merge_sharded_topk, top_logits

# local tensor [*shape] -> [world, *shape], ranks in order
AllGather = Callable[[torch.Tensor], torch.Tensor]
# What sharded_topk all-gathers: float32 values and log-sum-exps and int64 ids below 2**53, exactly.
GATHER_DTYPE = torch.float64


@dataclass(frozen=True)
class VocabShard:
    """Which rows of an LM head's weight this rank holds, and their global token ids.

    The weight holds ``num_org_padded`` rows for the original vocabulary (the first ``num_org``
    are real, ids ``org_start + i``), then ``num_added`` rows for added tokens (ids
    ``added_start + i``); padding rows are never scored.
    """

    org_start: int
    num_org: int
    num_org_padded: int
    added_start: int = 0
    num_added: int = 0

    @classmethod
    def whole(cls, vocab_size: int) -> VocabShard:
        """An unsharded head of ``vocab_size`` rows."""
        return cls(org_start=0, num_org=vocab_size, num_org_padded=vocab_size)


def shard_logits(
    hidden: torch.Tensor, weight: torch.Tensor, shard: VocabShard
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits ``[T, V_local]`` (the weight's dtype) of this rank's real vocabulary rows and their
    global ids ``[V_local]``.

    ``hidden`` is ``[T, H]``. Padding rows are dropped; other ranks' rows are never materialised.
    No float32 copy: :func:`~sglang_spec.tree.build.top_logits` upcasts as it reads.
    """
    hs = hidden if hidden.dtype == weight.dtype else hidden.to(weight.dtype)
    dev = hidden.device
    parts, ids = [], []
    if shard.num_org > 0:
        parts.append(torch.matmul(hs, weight[: shard.num_org].T))
        ids.append(torch.arange(shard.num_org, device=dev) + shard.org_start)
    if shard.num_added > 0:
        rows = weight[shard.num_org_padded : shard.num_org_padded + shard.num_added]
        parts.append(torch.matmul(hs, rows.T))
        ids.append(torch.arange(shard.num_added, device=dev) + shard.added_start)
    if not parts:  # a rank whose slice is all padding proposes nothing
        return (
            torch.full((hs.shape[0], 1), float("-inf"), device=dev),
            torch.zeros(1, dtype=torch.int64, device=dev),
        )
    if len(parts) == 1:  # torch.cat would copy the logits
        return parts[0], ids[0]
    return torch.cat(parts, dim=-1), torch.cat(ids)


def _pad_to(t: torch.Tensor, k: int, value: float) -> torch.Tensor:
    """Pad the last dimension to ``k`` entries (a shard smaller than ``k``)."""
    if t.shape[-1] == k:
        return t
    return torch.cat([t, t.new_full((*t.shape[:-1], k - t.shape[-1]), value)], dim=-1)


def sharded_topk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    shard: VocabShard,
    k: int,
    *,
    temperature: float = 1.0,
    all_gather: AllGather | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of ``log_softmax(hidden @ W.T / temperature)`` over the whole vocabulary, per row.

    ``hidden`` is ``[bs, L, H]``; returns float32 ``logq [bs, L, k]`` and int64 global ``ids
    [bs, L, k]`` in :func:`~sglang_spec.tree.draft_topk`'s order (log-prob descending, id
    ascending). ``all_gather`` is ``None`` for one rank. Under tensor parallelism
    :func:`~sglang_spec.tree.draft_topk` cannot serve as the per-shard step: the merge needs each
    shard's raw top values and its own log-sum-exp, not shard-normalised log-probabilities.
    A shard with fewer than ``k`` real rows pads its list with ``-inf`` entries.
    """
    temperature = check_tree_temperature(temperature)
    bs, L, H = hidden.shape
    logits, vocab_ids = shard_logits(hidden.reshape(bs * L, H), weight, shard)
    k_local = min(k, logits.shape[-1])
    if all_gather is None:
        logq, idx = draft_topk(logits.view(bs, L, -1), k_local, temperature)
        return _pad_to(logq, k, float("-inf")), _pad_to(vocab_ids[idx], k, 0)
    vals, idx, lse = top_logits(logits, k_local, temperature)
    vals = _pad_to(vals, k, float("-inf")).view(bs, L, k)
    ids = _pad_to(vocab_ids[idx], k, 0).view(bs, L, k)
    lse = lse.view(bs, L, 1)
    # One collective: values, ids and log-sum-exp packed in one tensor (gathered_shape).
    packed = (vals.to(GATHER_DTYPE), ids.to(GATHER_DTYPE), lse.to(GATHER_DTYPE))
    gathered = all_gather(torch.cat(packed, dim=-1))
    return merge_sharded_topk(
        gathered[..., :k].float(), gathered[..., k : 2 * k].long(), gathered[..., 2 * k].float(), k
    )


def gathered_shape(bs: int, depths: int, k: int) -> tuple[int, int, int]:
    """Shape of the one tensor (dtype :data:`GATHER_DTYPE`) each rank passes to
    :func:`sharded_topk`'s all-gather: per row its ``k`` values, ``k`` ids and log-sum-exp."""
    return (bs, depths, 2 * k + 1)


class StaticAllGather:
    """An :data:`AllGather` through buffers allocated once, which a CUDA graph can capture.

    A captured collective reads and writes the addresses it was captured with, so the rank's
    input is copied into a fixed buffer and the result lands in another, both sized for
    ``capacity`` elements (of :data:`GATHER_DTYPE`) per rank and sliced to each call's size. A
    larger call (an eager batch beyond every captured size) or another dtype gets fresh buffers.
    The result is a view of the fixed buffer: consume it before the next call.
    ``gather_into(out, inp)`` is a process group's ``all_gather_into_tensor`` (``out`` holds the
    ranks' inputs in rank order).
    """

    def __init__(
        self,
        gather_into: Callable[[torch.Tensor, torch.Tensor], None],
        world: int,
        capacity: int,
        device: torch.device | str,
    ):
        self.gather_into = gather_into
        self.world = int(world)
        self.local = torch.empty(capacity, dtype=GATHER_DTYPE, device=device)
        self.out = torch.empty(self.world * capacity, dtype=GATHER_DTYPE, device=device)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        n = t.numel()
        if n <= self.local.numel() and t.dtype == GATHER_DTYPE:
            local, out = self.local[:n], self.out[: self.world * n]
            local.copy_(t.reshape(-1))
        else:
            local, out = t.contiguous().view(-1), t.new_empty(self.world * n)
        self.gather_into(out, local)
        return out.view(self.world, *t.shape)
