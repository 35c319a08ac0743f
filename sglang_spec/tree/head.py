"""From a drafter block's hidden states to the DDTree: the one function both execution paths call.

:func:`draft_tree` takes the drafter's final hidden states of a block ``[bonus, MASK * (B - 1)]``,
puts rows ``1..D`` (the marginals ``q_1..q_D``; ``D = min(budget, B-1)``, the deepest a best-first
tree of ``budget`` nodes reaches) through the LM head (:class:`DraftHead`: this rank's vocabulary
shard and, under tensor parallelism, the all-gather; :func:`~sglang_spec.tree.sharded_topk` never
gathers the vocabulary), keeps the top-K of each depth with its log-normaliser, and builds the
best-first tree of ``budget`` nodes (:func:`~sglang_spec.tree.build_ddtree_from_topk`). Nothing
reads the device from the host on CUDA.

With CUDA graphs the drafter's graph ends in :class:`StagedDraftBlock` (SGLang's draft-sampler
contract: called with the graph's hidden states and input ids, the bonus token at block position
0), which copies the block into static buffers; :class:`DraftTreeGraphs` then replays, per decode
step, one small graph of the step's budget and (padded) batch size that runs
:class:`StaticDraftTree`, :func:`draft_tree` into static tree buffers. So a step at budget 7 runs
the head over 7 depths with its own K, not the largest candidate's 15 depths and K, and builds
one tree. The serving side (``sglang_spec.plugin.draft_sampler``) builds these from the target's
LM head; without a graph it calls :func:`draft_tree` itself.

Plain torch (Triton on CUDA through the tree build), no serving framework.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import dataclass
from typing import Any

import torch

from .build import build_ddtree_from_topk, check_tree_temperature
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
    """Per-depth top-``k`` of the drafter block ``block_hidden [bs, B, H]`` and the DDTree of
    ``budget`` nodes under ``root_tokens [bs]``.

    Only the depths a tree of ``budget`` nodes can reach go through the head: block rows
    ``1..D``, ``D = min(budget, B - 1)`` (:func:`head_depths`). Returns float32 ``logq [bs, D, k]``
    (log-probabilities under the tree ``temperature``), int64 ``ids [bs, D, k]``
    (:func:`~sglang_spec.tree.sharded_topk`) and the tree (its horizon is ``B - 1``).
    """
    horizon = block_hidden.shape[1] - 1
    logq, ids = sharded_topk(
        block_hidden[:, 1 : 1 + head_depths(budget, horizon), :],
        head.weight,
        head.shard,
        k,
        temperature=temperature,
        all_gather=head.all_gather,
    )
    return logq, ids, build_ddtree_from_topk(logq, ids, budget, root_tokens, horizon=horizon)


def head_depths(budget: int, horizon: int) -> int:
    """The drafter depths whose marginals a tree of ``budget`` nodes can use: a best-first tree
    reaches depth ``budget`` at most, so depths past ``min(budget, horizon)`` are never read."""
    return min(int(budget), int(horizon))


class StagedDraftBlock:
    """Static copies of the drafter block's final hidden states ``[max_bs, B, H]`` and root tokens
    ``[max_bs]``, which the drafter's CUDA graph writes (module docstring). Called with the
    graph's ``hidden_states [bs * B, H]`` and ``input_ids [bs * B]`` (the bonus token is block
    position 0), it writes rows ``[0, bs)``."""

    def __init__(self, *, max_bs: int, block_size: int, hidden_size: int, dtype, device):
        if block_size < 2 or max_bs < 1 or hidden_size < 1:
            raise ValueError(
                f"StagedDraftBlock needs block_size >= 2 and max_bs, hidden_size >= 1; got "
                f"block_size={block_size}, max_bs={max_bs}, hidden_size={hidden_size}"
            )
        self.block_size = int(block_size)
        self.hidden = torch.zeros((max_bs, block_size, hidden_size), dtype=dtype, device=device)
        self.roots = torch.zeros((max_bs,), dtype=torch.int64, device=device)

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> None:
        bs = hidden_states.shape[0] // self.block_size
        self.hidden[:bs].copy_(hidden_states.view(bs, self.block_size, -1))
        self.roots[:bs].copy_(input_ids.view(bs, self.block_size)[:, 0])


class StaticDraftTree:
    """:func:`draft_tree` at one ``budget`` into static tree buffers ``[max_bs, 1 + budget]``, for
    a CUDA graph: a call on ``bs`` requests writes rows ``[0, bs)``. ``head.all_gather`` must be
    capturable when the head is sharded (:class:`~sglang_spec.tree.topk.StaticAllGather`)."""

    def __init__(
        self,
        head: DraftHead,
        *,
        horizon: int,
        k: int,
        temperature: float,
        budget: int,
        max_bs: int,
    ):
        if horizon < 1 or k < 1 or budget < 1 or max_bs < 1:
            raise ValueError(
                f"StaticDraftTree needs horizon, k, budget and max_bs >= 1; got horizon={horizon}, "
                f"k={k}, budget={budget}, max_bs={max_bs}"
            )
        self.head = head
        self.k = int(k)
        self.temperature = check_tree_temperature(temperature)
        self.budget = int(budget)
        self.tree = _tree_buffers(max_bs, self.budget + 1, int(horizon), head.weight.device)

    def __call__(self, block_hidden: torch.Tensor, root_tokens: torch.Tensor) -> None:
        """``block_hidden [bs, B, H]`` and ``root_tokens [bs]`` (B - 1 = the horizon)."""
        bs = block_hidden.shape[0]
        _, _, tree = draft_tree(
            block_hidden,
            root_tokens,
            self.head,
            k=self.k,
            temperature=self.temperature,
            budget=self.budget,
        )
        for f in TREE_FIELDS:
            getattr(self.tree, f)[:bs].copy_(getattr(tree, f))

    def outputs(self, bs: int) -> DraftTree:
        """The last call's tree, its first ``bs`` rows: views of the static buffers (the next call
        overwrites them)."""
        out = self.tree
        return DraftTree(**{f: getattr(out, f)[:bs] for f in TREE_FIELDS}, horizon=out.horizon)


def captured_batch_size(graph_bs: Sequence[int], bs: int) -> int | None:
    """The captured batch size a step of ``bs`` requests replays: the smallest of the ascending
    ``graph_bs`` >= bs, or None past the largest."""
    i = bisect.bisect_left(graph_bs, bs)
    return graph_bs[i] if i < len(graph_bs) else None


def capture_graphs(
    run: Callable[[Any, int], None],
    keys: Iterable[Any],
    graph_bs: list[int],
    capture_scope: Callable[[], ContextManager[tuple[Any, Any]]],
    prepare: Callable[[Any, int], None] | None = None,
) -> dict[tuple[Any, int], torch.cuda.CUDAGraph]:
    """One CUDA graph of ``run(key, bs)`` per key and batch size, largest key and batch first
    so the smaller ones reuse the memory pool. ``capture_scope()`` yields the stream and the
    memory pool to capture with (the serving framework's, so collectives inside are
    capturable). Two eager warm-ups before each capture: they compile the kernels and leave the
    caching allocator steady. ``prepare(key, bs)``, when given, runs before each key and batch
    size's warm-ups, outside the capture (it sets the static inputs the capture runs on)."""
    graphs = {}
    with capture_scope() as (stream, pool):
        for key in sorted(keys, reverse=True):
            for bs in sorted(graph_bs, reverse=True):
                if prepare is not None:
                    prepare(key, bs)
                for _ in range(2):
                    run(key, bs)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    run(key, bs)
                graphs[(key, bs)] = graph
    torch.cuda.synchronize()
    return graphs


class DraftTreeGraphs:
    """One CUDA graph per (budget, batch size) from the staged drafter block to that budget's tree
    (module docstring): a step at budget ``b`` runs only ``b``'s head depths, top-K and tree.

    ``trees`` maps every candidate budget to its :class:`StaticDraftTree` (all on the same head);
    ``graph_bs`` are the batch sizes captured, as the drafter's graphs pad to them. Before
    :meth:`capture` (or off CUDA) :meth:`tree` runs the same functions eagerly on the staged
    block, so the data flow is the same with and without graphs.
    """

    def __init__(
        self, staged: StagedDraftBlock, trees: dict[int, StaticDraftTree], graph_bs: list[int]
    ):
        if not trees or not graph_bs or max(graph_bs) > staged.hidden.shape[0]:
            raise ValueError(
                f"DraftTreeGraphs needs budgets and batch sizes within the staged block's "
                f"{staged.hidden.shape[0]} rows; got budgets {sorted(trees)}, batch sizes "
                f"{sorted(graph_bs)}"
            )
        self.staged = staged
        self.trees = trees
        self.graph_bs = sorted(int(b) for b in set(graph_bs))
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def __call__(self, hidden_states: torch.Tensor, input_ids: torch.Tensor) -> None:
        """The drafter graph's tail: stage the block (:class:`StagedDraftBlock`)."""
        self.staged(hidden_states, input_ids)

    def padded_bs(self, bs: int) -> int:
        """The captured batch size a step of ``bs`` requests replays (:func:`captured_batch_size`);
        past the largest, an error."""
        padded = captured_batch_size(self.graph_bs, bs)
        if padded is None:
            raise ValueError(
                f"batch size {bs} exceeds the largest captured one, {self.graph_bs[-1]}"
            )
        return padded

    def _run(self, budget: int, bs: int) -> None:
        self.trees[budget](self.staged.hidden[:bs], self.staged.roots[:bs])

    def capture(self, capture_scope: Callable[[], ContextManager[tuple[Any, Any]]]) -> None:
        """Capture every (budget, batch size) (:func:`capture_graphs`)."""
        self.graphs.update(capture_graphs(self._run, self.trees, self.graph_bs, capture_scope))

    def tree(self, bs: int, budget: int) -> DraftTree:
        """``budget``'s tree of the staged block's first ``bs`` rows, by graph replay once
        captured (rows past ``bs`` up to the captured size are computed and ignored)."""
        graph = self.graphs.get((budget, self.padded_bs(bs)))
        if graph is None:
            self._run(budget, bs)
        else:
            graph.replay()
        return self.trees[budget].outputs(bs)


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
