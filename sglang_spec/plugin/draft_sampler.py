"""DDTREE's draft sampler: the draft LM head, the per-depth top-K and the tree in the drafter's
CUDA graph.

DFlashWorkerV2 folds whatever ``_maybe_build_draft_sampler`` returns into the DFlash drafter's
CUDA graphs: before capturing them it appends a capture hook that calls
``sampler(hidden_states, input_ids)`` at the end of the captured forward
(dflash_worker_v2.py:741-747, ``draft_worker_common.make_draft_sampler_capture_hook``), so every
replay runs it too. DFLASH puts its greedy head there; DDTREE puts
:class:`sglang_spec.tree.StaticDraftTree`, which runs the same :func:`sglang_spec.tree.draft_tree`
as the eager path -- the target's LM head over the block's rows 1..B-1, top-K and log-normaliser
per depth (TP-aware: :func:`sglang_spec.tree.sharded_topk`, one all-gather, here into fixed
buffers), the best-first tree at the server's budget and at every other candidate budget -- into
static buffers sized for the largest captured batch.

``topk_stage`` (worker.py) then takes, per decode step (:func:`step_tree`):

* the draft ran as a CUDA graph: the static tree of the step's budget (with
  ``--speculative-adaptive`` the graph builds every candidate budget's tree from the same top-K,
  so a step at a smaller budget reads its tree as it reads the server's, with no eager rebuild);
* otherwise (eager batches: larger than every captured batch size, or graphs off):
  :func:`sglang_spec.tree.draft_tree` on the drafter's hidden states.

The SGLang tree ABI stays outside the graph (``tree_stage``): its mask goes into the *target*
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
from sglang_spec.tree import DraftHead, DraftTree, StaticDraftTree
from sglang_spec.tree import draft_tree as run_draft_tree
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


def build(worker: Any) -> StaticDraftTree | None:
    """The draft sampler for ``worker``'s drafter graphs (``_maybe_build_draft_sampler``), or None
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
    max_bs = max(graph_bs)
    capacity = math.prod(gathered_shape(max_bs, config.horizon, config.topk_per_depth))
    sampler = StaticDraftTree(
        draft_head(worker, lm_head, gather_capacity=capacity),
        block_size=config.block_size,
        k=config.topk_per_depth,
        temperature=config.tree_temperature,
        budget=config.budget,
        max_bs=max_bs,
        # budget by batch size: every other candidate's tree is built in the graph too
        smaller_budgets=()
        if worker.budgets is None
        else tuple(b for b in worker.budget_configs if b != config.budget),
    )
    logger.info(
        "DDTREE draft head, top-K (K=%d) and tree (budgets %s) folded into the draft CUDA graph "
        "(batch sizes up to %d, all-gather: %s).",
        config.topk_per_depth,
        sorted(sampler.trees),
        max_bs,
        "none" if sampler.head.all_gather is None else "static buffers",
    )
    return sampler


def step_tree(
    worker: Any, hidden: torch.Tensor, root_tokens: torch.Tensor, ran_as_graph: bool
) -> DraftTree:
    """This decode step's tree at ``worker.config``'s budget (module docstring): from the draft
    graph's static outputs when the draft ran as a graph, else from the drafter's hidden states
    ``[bs, B, H]``."""
    config: DDTreeConfig = worker.config
    bs = int(root_tokens.shape[0])
    sampler = adapter.draft_sampler(worker)
    if ran_as_graph and sampler is not None:
        return sampler.outputs(bs, config.budget)[2]
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
