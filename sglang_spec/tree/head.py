"""From a drafter block's hidden states to the DDTree: the one function both execution paths call.

:func:`draft_tree` takes the drafter's final hidden states of a block ``[bonus, MASK * (B - 1)]``,
puts rows ``1..B-1`` (the marginals ``q_1..q_L``) through the LM head (:class:`DraftHead`: this
rank's vocabulary shard and, under tensor parallelism, the all-gather;
:func:`~sglang_spec.tree.sharded_topk` never gathers the vocabulary), keeps the top-K of each depth
with its log-normaliser, and builds the best-first tree of ``budget`` nodes
(:func:`~sglang_spec.tree.build_ddtree_from_topk`). Nothing reads the device from the host on CUDA.

:class:`StaticDraftTree` runs :func:`draft_tree` inside the drafter's CUDA graph: called with the
graph's hidden states and input ids at capture and replay (SGLang's draft-sampler contract: the
bonus token is block position 0 of the input ids), it writes the top-K and the tree into buffers
allocated once for the largest captured batch, of which a replay at batch size ``bs`` writes the
first ``bs`` rows; given smaller budgets too, it writes their trees from the same top-K: a prefix
of a larger one when nested in it (:func:`~sglang_spec.tree.build.nested_in`), else built. The
serving side (``sglang_spec.plugin.draft_sampler``) builds it from the target's LM head and reads
its outputs only after a replay; without a graph it calls :func:`draft_tree` itself.

Plain torch (Triton on CUDA through the tree build), no serving framework.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .build import build_ddtree_from_topk, check_tree_temperature, nested_in
from .topk import AllGather, VocabShard, sharded_topk
from .types import DraftTree


@dataclass(frozen=True)
class DraftHead:
    """The LM head the drafter's marginals go through: this rank's rows of its weight, which
    tokens they are, and the all-gather over the ranks sharing the vocabulary (None on one rank)."""

    weight: torch.Tensor
    shard: VocabShard
    all_gather: AllGather | None = None


def draft_tree(
    block_hidden: torch.Tensor,
    root_tokens: torch.Tensor,
    head: DraftHead,
    *,
    k: int,
    temperature: float,
    budget: int,
) -> tuple[torch.Tensor, torch.Tensor, DraftTree]:
    """Per-depth top-``k`` of the drafter block ``block_hidden [bs, B, H]`` (rows ``1..B-1``)
    and the DDTree of ``budget`` nodes under ``root_tokens [bs]``.

    Returns float32 ``logq [bs, B-1, k]`` (log-probabilities under the tree ``temperature``), int64
    ``ids [bs, B-1, k]`` (:func:`~sglang_spec.tree.sharded_topk`) and the tree.
    """
    logq, ids = sharded_topk(
        block_hidden[:, 1:, :],
        head.weight,
        head.shard,
        k,
        temperature=temperature,
        all_gather=head.all_gather,
    )
    return logq, ids, build_ddtree_from_topk(logq, ids, budget, root_tokens)


class StaticDraftTree:
    """:func:`draft_tree` with static outputs, for a CUDA graph (module docstring).

    ``head.all_gather`` must be capturable when the head is sharded
    (:class:`~sglang_spec.tree.topk.StaticAllGather`). ``smaller_budgets`` (budget by batch size:
    the other candidate budgets, each below ``budget``) get their trees built in the same call
    from the same top-K, so a step at any candidate reads a tree the graph built. Outputs, rows
    ``[0, bs)`` valid after a call on ``bs`` requests: ``logq``, ``ids`` ``[max_bs, B-1, k]``;
    ``trees[b]``, a :class:`DraftTree` of ``[max_bs, 1 + b]`` buffers for every budget ``b``.
    """

    def __init__(
        self,
        head: DraftHead,
        *,
        block_size: int,
        k: int,
        temperature: float,
        budget: int,
        max_bs: int,
        smaller_budgets: tuple[int, ...] = (),
    ):
        if block_size < 2 or k < 1 or budget < 1 or max_bs < 1:
            raise ValueError(
                f"StaticDraftTree needs block_size >= 2 and k, budget, max_bs >= 1; got "
                f"block_size={block_size}, k={k}, budget={budget}, max_bs={max_bs}"
            )
        bad = [b for b in smaller_budgets if not 1 <= b < budget]
        if bad:
            raise ValueError(
                f"StaticDraftTree's smaller_budgets must lie in [1, budget={budget}); got {bad}"
            )
        self.head = head
        self.block_size = int(block_size)
        self.k = int(k)
        self.temperature = check_tree_temperature(temperature)
        self.budget = int(budget)
        dev = head.weight.device
        depths = self.block_size - 1
        self.logq = torch.empty((max_bs, depths, self.k), dtype=torch.float32, device=dev)
        self.ids = torch.empty((max_bs, depths, self.k), dtype=torch.int64, device=dev)
        self.trees = {
            b: _tree_buffers(max_bs, b + 1, depths, dev)
            for b in (self.budget, *sorted({int(b) for b in smaller_budgets}, reverse=True))
        }

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> None:
        """``hidden_states [bs * B, H]`` and ``input_ids [bs * B]`` of the drafter's block pass."""
        bs = hidden_states.shape[0] // self.block_size
        roots = input_ids.view(bs, self.block_size)[:, 0]
        logq, ids, tree = draft_tree(
            hidden_states.view(bs, self.block_size, -1),
            roots,
            self.head,
            k=self.k,
            temperature=self.temperature,
            budget=self.budget,
        )
        self.logq[:bs].copy_(logq)
        self.ids[:bs].copy_(ids)
        horizon = self.block_size - 1
        done: list[int] = []  # budgets written so far, descending
        for b, out in self.trees.items():
            source = next((a for a in done if nested_in(b, a, horizon)), None)
            if source is not None:
                # nested: the first b + 1 slots of a larger tree this call wrote (no second build)
                src = self.trees[source]
                for f in SLOT_FIELDS:
                    getattr(out, f)[:bs].copy_(getattr(src, f)[:bs, : b + 1])
                torch.clamp(src.num_nodes[:bs], max=b + 1, out=out.num_nodes[:bs])
            else:
                # A smaller budget's tree from the same top-K: the server's K covers every smaller
                # budget's exact K, and ranks beyond it are never popped (build_ddtree_from_topk).
                built = tree if b == self.budget else build_ddtree_from_topk(logq, ids, b, roots)
                for f in TREE_FIELDS:
                    getattr(out, f)[:bs].copy_(getattr(built, f))
            done.append(b)

    def outputs(
        self, bs: int, budget: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, DraftTree]:
        """The last call's first ``bs`` rows: ``(logq, ids, tree)`` at ``budget`` (default: the
        sampler's), views of the static buffers (the next call overwrites them)."""
        out = self.trees[self.budget if budget is None else budget]
        tree = DraftTree(**{f: getattr(out, f)[:bs] for f in TREE_FIELDS}, horizon=out.horizon)
        return self.logq[:bs], self.ids[:bs], tree


SLOT_FIELDS = ("tokens", "parents", "depths", "scores")  # [bs, 1 + budget]: one entry per slot
TREE_FIELDS = (*SLOT_FIELDS, "num_nodes")


def _tree_buffers(max_bs: int, width: int, horizon: int, device) -> DraftTree:
    tokens = torch.empty((max_bs, width), dtype=torch.int64, device=device)
    return DraftTree(
        tokens=tokens,
        parents=torch.empty_like(tokens),
        depths=torch.empty_like(tokens),
        scores=torch.empty((max_bs, width), dtype=torch.float32, device=device),
        num_nodes=torch.empty((max_bs,), dtype=torch.int64, device=device),
        horizon=horizon,
    )
