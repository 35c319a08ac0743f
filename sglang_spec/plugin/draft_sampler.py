"""DDTREE's draft sampler: the draft LM head, the per-depth top-K and the tree as CUDA graphs.

DFlashWorkerV2 folds whatever ``_maybe_build_draft_sampler`` returns into the DFlash drafter's
CUDA graphs: before capturing them it appends a capture hook that calls
``sampler(hidden_states, input_ids)`` at the end of the captured forward
(dflash_worker_v2.py:741-747, ``draft_worker_common.make_draft_sampler_capture_hook``), so every
replay runs it too. DFLASH puts its greedy head there. DDTREE puts only
:class:`sglang_spec.tree.StagedDraftBlock` there (two copies: the block's hidden states and its
root tokens into static buffers) and captures, right after the drafter's graphs
(:func:`capture`), its own :class:`sglang_spec.tree.DraftTreeGraphs`: one graph per candidate
budget and captured batch size running :func:`sglang_spec.tree.draft_tree` -- the target's LM
head over the block rows that budget's tree can reach (``1..min(budget, B-1)``), top-K and
log-normaliser per depth at that budget's K (TP-aware: :func:`sglang_spec.tree.sharded_topk`, one
all-gather, here into fixed buffers), the best-first tree -- into static buffers sized for the
largest captured batch. With ``--speculative-adaptive`` a step at budget 7 so pays for 7 depths
at K = 7 and one tree, not for the largest candidate's (on the 27B shape, budget 31: 15 depths at
K = 17 and three trees, sessions 24-25).

``topk_stage`` (worker.py) then takes, per decode step (:func:`step_tree`):

* the draft ran as a CUDA graph: the replay of the step's (budget, padded batch size) graph over
  the staged block;
* otherwise (eager batches: larger than every captured batch size, or graphs off):
  :func:`sglang_spec.tree.draft_tree` on the drafter's hidden states.

The SGLang tree ABI stays outside the graphs (``tree_stage``): its mask goes into the *target*
backend's verify-mask buffer. Nothing here reads the device from the host. Importing this module
does not import SGLang.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch

import sglang_spec.plugin.adapter as adapter
from sglang_spec.plugin.config import DDTreeConfig
from sglang_spec.tree import (
    DraftHead,
    DraftTree,
    DraftTreeGraphs,
    StagedDraftBlock,
    StaticDraftTree,
)
from sglang_spec.tree import draft_tree as run_draft_tree
from sglang_spec.tree.head import head_depths
from sglang_spec.tree.topk import gathered_shape

logger = logging.getLogger("sglang_spec.plugin")


def target_lm_head(worker: Any) -> Any:
    """The target model's LM head, whose rows score the drafter's marginals, or None when it has
    no dense weight (a quantized head)."""
    from sglang.srt.lora.layers import unwrap_lora_layer

    lm_head = unwrap_lora_layer(getattr(worker.target_worker.model_runner.model, "lm_head", None))
    if lm_head is None or not hasattr(lm_head, "weight"):
        return None
    return lm_head


def draft_head(worker: Any, lm_head: Any, *, gather_capacity: int = 0) -> DraftHead:
    """``lm_head`` as this rank holds it, with the all-gather over ``worker.head_group`` (the
    target's TP group) through fixed buffers of ``gather_capacity`` elements per rank."""
    return DraftHead(
        weight=lm_head.weight,
        shard=adapter.vocab_shard(lm_head),
        all_gather=adapter.tp_all_gather(lm_head, worker.head_group, capacity=gather_capacity),
    )


def build(worker: Any) -> DraftTreeGraphs | None:
    """The draft sampler for ``worker``'s drafter graphs (``_maybe_build_draft_sampler``): the
    staging hook and the per-budget trees, graphs not yet captured (:func:`capture`); or None
    (logged) when the head stays eager."""
    graph_bs = adapter.decode_cuda_graph_bs()
    lm_head = target_lm_head(worker)
    reason = (
        "decode CUDA graphs are off"
        if not graph_bs
        else "the target lm_head has no dense weight"
        if lm_head is None
        else None
    )
    if reason is not None:
        logger.info("DDTREE draft head, top-K and tree kept eager: %s.", reason)
        return None
    config: DDTreeConfig = worker.config
    configs = {config.budget: config} if worker.budgets is None else worker.budget_configs
    max_bs = max(graph_bs)
    capacity = max(
        math.prod(gathered_shape(max_bs, head_depths(c.budget, c.horizon), c.topk_per_depth))
        for c in configs.values()
    )
    head = draft_head(worker, lm_head, gather_capacity=capacity)
    staged = StagedDraftBlock(
        max_bs=max_bs,
        block_size=config.block_size,
        hidden_size=head.weight.shape[1],
        dtype=head.weight.dtype,
        device=head.weight.device,
    )
    trees = {
        b: StaticDraftTree(
            head,
            horizon=c.horizon,
            k=c.topk_per_depth,
            temperature=c.tree_temperature,
            budget=b,
            max_bs=max_bs,
        )
        for b, c in sorted(configs.items())
    }
    return DraftTreeGraphs(staged, trees, graph_bs)


def capture(worker: Any) -> None:
    """Capture the draft sampler's per-budget graphs (after the drafter's, which stage the block
    they read), under SGLang's capture context and memory pool (``adapter.graph_capture_scope``).
    Nothing to do without a sampler or off CUDA."""
    sampler = adapter.draft_sampler(worker)
    if sampler is None or sampler.staged.hidden.device.type != "cuda":
        return
    sampler.capture(adapter.graph_capture_scope)
    logger.info(
        "DDTREE draft head, top-K and tree: %d CUDA graphs, budgets (head depths, K) %s, batch "
        "sizes up to %d, all-gather: %s.",
        len(sampler.graphs),
        {b: (head_depths(b, t.tree.horizon), t.k) for b, t in sorted(sampler.trees.items())},
        sampler.graph_bs[-1],
        "none" if next(iter(sampler.trees.values())).head.all_gather is None else "static buffers",
    )


def step_tree(
    worker: Any, hidden: torch.Tensor, root_tokens: torch.Tensor, ran_as_graph: bool
) -> DraftTree:
    """This decode step's tree at ``worker.config``'s budget (module docstring): by the replay of
    its head graph over the block the drafter's graph staged when the draft ran as a graph, else
    from the drafter's hidden states ``[bs, B, H]``."""
    config: DDTreeConfig = worker.config
    bs = int(root_tokens.shape[0])
    sampler = adapter.draft_sampler(worker)
    if ran_as_graph and sampler is not None:
        return sampler.tree(bs, config.budget)
    lm_head = target_lm_head(worker)
    if lm_head is None:
        raise RuntimeError("DDTREE needs a dense target lm_head.")
    head = draft_head(worker, lm_head)
    with adapter.draft_tp_context(worker):
        _, _, tree = run_draft_tree(
            hidden,
            root_tokens,
            head,
            k=config.topk_per_depth,
            temperature=config.tree_temperature,
            budget=config.budget,
        )
    return tree
