"""The commit stage as CUDA graphs: one per (verify width, accept width, batch size).

``commit_stage`` (worker.py) commits a step's accepted path through SGLang's post-verify
functions (``adapter.commit_accepted_path``): the bonus token and new lengths, the GDN/mamba state
at the last accepted node (with patch 0003 the fold of the accepted path, the conv states, the
extra_buffer track snapshot), the accepted KV slots moved to the front of each request's window,
and the compacted ``predict``. Eagerly that is some 25 launches and SGLang's Python every decode
step: 0.97 of the tiny pair's 3.9 host ms a step on an H100 with one-launch norms (session 35,
``SGLANG_DDTREE_STAGE_TIMES``), where the step is launch-bound. Replayed from a graph it is a few
copies into static buffers, one launch and three small clones.

:class:`CommitGraphs` holds the static inputs -- ``predict``, ``accept_index``, ``accept_lens``
and the batch fields the commit reads (``seq_lens``, ``req_pool_indices``, ``out_cache_loc``,
``mamba_track_indices``) -- as flat buffers sized for the largest batch at the widest shape. The
commit writes to the pools of the requests it names, so a graph never runs padded: there is one
per exact batch size (a padding row would commit into whichever request holds its slot). Every
warm-up and capture commits one accepted token (the root) of request row 0 into KV slot 0 with
no track slot: at start-up nothing is served, and slot 0 is SGLang's dummy slot, which its own
graph captures write.

A step that no graph covers (graphs off, off CUDA, a batch beyond the largest captured size, a
shape not captured, a step whose track indices are present where the capture's were not or the
reverse) runs the same function eagerly on the batch itself; after capture, each (shape, batch
size) that does is logged once (``DDTREE commit: no CUDA graph ...``, which ``e2e.tiny_pair`` keeps
as ``log_commit``), so a server whose steps all miss the graphs cannot pass for one that replays
them. The outputs of a replay are cloned:
the next replay of the same graph overwrites its outputs while the scheduler may still read the
step's (overlap scheduling). Nothing here reads the device from the host; importing this module
does not import SGLang.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from sglang_spec.tree.head import capture_graphs

logger = logging.getLogger("sglang_spec.plugin")

#: ``commit(batch, predict, accept_index, accept_lens, width) -> (new_seq_lens, bonus, predict)``:
#: ``batch`` is the scheduler's or ``make_batch``'s over the static buffers.
CommitFn = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, order=True)
class CommitShape:
    """What a graph is specialised to besides the batch size: the verify width, the accepted
    positions' width (``accept_index.shape[1]``) and whether the step has track indices."""

    width: int
    accept_width: int
    track: bool


class CommitGraphs:
    """``commit`` by graph replay per (shape, exact batch size) once captured; eager before
    :meth:`capture`, and for what no graph covers (module docstring).

    ``make_batch(seq_lens=, req_pool_indices=, out_cache_loc=, mamba_track_indices=)`` makes
    what ``commit`` takes as its batch from those fields as views of the static buffers (the
    adapter adds the fields that are constant for a server)."""

    def __init__(
        self,
        commit: CommitFn,
        make_batch: Callable[..., Any],
        *,
        shapes: list[CommitShape],
        max_bs: int,
        device: torch.device | str,
    ):
        if not shapes or max_bs < 1 or min(min(s.width, s.accept_width) for s in shapes) < 1:
            raise ValueError(
                f"CommitGraphs needs shapes and a batch size >= 1; got shapes {shapes}, "
                f"max_bs {max_bs}"
            )
        self.commit = commit
        self.make_batch = make_batch
        self.shapes = sorted(set(shapes))
        self.graph_bs = list(range(1, max_bs + 1))
        width = max(s.width for s in self.shapes)
        accept_width = max(s.accept_width for s in self.shapes)
        i32, i64 = dict(dtype=torch.int32, device=device), dict(dtype=torch.int64, device=device)
        self.predict = torch.zeros(max_bs * width, **i32)
        self.accept_index = torch.zeros(max_bs * accept_width, **i32)
        self.accept_lens = torch.zeros(max_bs, **i32)
        self.seq_lens = torch.zeros(max_bs, **i64)
        self.req_pool_indices = torch.zeros(max_bs, **i64)
        self.out_cache_loc = torch.zeros(max_bs * width, **i64)
        self.track_indices = torch.zeros(max_bs, **i64)
        self.graphs: dict[tuple[CommitShape, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[CommitShape, int], tuple[torch.Tensor, ...]] = {}
        # (shape, batch size) of the eager commits after capture, each logged once: a server
        # whose steps all miss the graphs would otherwise look like one that replays them
        self.missed: set[tuple[CommitShape, int]] = set()

    def _static(self, shape: CommitShape, bs: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        batch = self.make_batch(
            seq_lens=self.seq_lens[:bs],
            req_pool_indices=self.req_pool_indices[:bs],
            out_cache_loc=self.out_cache_loc[: bs * shape.width],
            mamba_track_indices=self.track_indices[:bs] if shape.track else None,
        )
        accept_index = self.accept_index[: bs * shape.accept_width].view(bs, shape.accept_width)
        return batch, self.predict[: bs * shape.width], accept_index

    def _run_static(self, shape: CommitShape, bs: int) -> None:
        batch, predict, accept_index = self._static(shape, bs)
        self.outputs[(shape, bs)] = self.commit(
            batch, predict, accept_index, self.accept_lens[:bs], shape.width
        )

    def _fill_harmless(self, shape: CommitShape, bs: int) -> None:
        """The inputs every warm-up and capture of (``shape``, ``bs``) runs on: request row b
        accepts its root only (node b * width), request row 0, KV slot 0, sequence length 1, no
        track slot (-1)."""
        self.predict.zero_()
        self.accept_index.fill_(-1)
        rows = self.accept_index[: bs * shape.accept_width].view(bs, shape.accept_width)
        rows[:, 0] = torch.arange(bs, dtype=torch.int32, device=rows.device) * shape.width
        self.accept_lens.fill_(1)
        self.seq_lens.fill_(1)
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.track_indices.fill_(-1)

    def capture(self, capture_scope: Callable[[], AbstractContextManager[tuple[Any, Any]]]) -> None:
        """Capture every (shape, batch size), widest and largest first
        (``tree.head.capture_graphs``, under ``capture_scope()``'s stream and pool), on the
        inputs of :meth:`_fill_harmless`, set outside each capture."""
        self.graphs.update(
            capture_graphs(
                self._run_static,
                self.shapes,
                self.graph_bs,
                capture_scope,
                prepare=self._fill_harmless,
            )
        )

    def __call__(
        self,
        batch: Any,
        predict: torch.Tensor,
        accept_index: torch.Tensor,
        accept_lens: torch.Tensor,
        width: int,
    ) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor], bool]:
        """The commit of one decode step, ``(new_seq_lens, bonus, predict)``, and True when a
        graph replay ran it."""
        bs, accept_width = accept_index.shape
        track = batch.mamba_track_indices
        shape = CommitShape(width, accept_width, track is not None)
        graph = self.graphs.get((shape, bs))
        if graph is None or batch.out_cache_loc.numel() < bs * width:
            if self.graphs and (shape, bs) not in self.missed:
                self.missed.add((shape, bs))
                logger.warning(
                    "DDTREE commit: no CUDA graph for %s at batch size %d (%d verify slots); "
                    "such steps commit eagerly.",
                    shape,
                    bs,
                    batch.out_cache_loc.numel(),
                )
            return self.commit(batch, predict, accept_index, accept_lens, width), False
        self.predict[: bs * width].copy_(predict[: bs * width])
        self.accept_index[: bs * accept_width].copy_(accept_index.reshape(-1))
        self.accept_lens[:bs].copy_(accept_lens)
        self.seq_lens[:bs].copy_(batch.seq_lens)
        self.req_pool_indices[:bs].copy_(batch.req_pool_indices)
        self.out_cache_loc[: bs * width].copy_(batch.out_cache_loc[: bs * width])
        if track is not None:
            self.track_indices[:bs].copy_(track)
        graph.replay()
        new_seq_lens, bonus, compacted = self.outputs[(shape, bs)]
        return (new_seq_lens.clone(), bonus.clone(), compacted.clone()), True
