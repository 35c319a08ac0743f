"""The drafter context append as CUDA graphs: one per (verify width, captured batch size).

``append_context_stage`` (worker.py) writes the drafter's K/V of each request's accepted rows
through DFLASH's prefix-valid writer (``adapter.append_target_hidden_to_draft_kv``): the
projection of the target's layer features, per drafter layer a K/V projection, norm and rope,
and the pool stores. Eagerly that is some 20 launches and SGLang's Python checks every decode
step: 0.58 of the tiny pair's 3.6 host ms a step served alone on the H200 (session 30), where the
step is launch-bound. Replayed from a graph it is four copies into static buffers and one launch.

:class:`ContextAppendGraphs` holds the static inputs -- the target features ``[rows, D]``, the
verify window's KV slots, the prefix lengths and the commit lengths -- as flat buffers sized for
the largest captured batch at the widest verify width, so every width's views are contiguous
prefixes of the same memory. Rows past a step's batch size, up to the captured one it replays,
get commit length 0: the writer stores nothing for them. Every capture (and its two eager
warm-ups) runs with commit lengths 0, so nothing is written to the pool at start-up. A step that
no graph covers (graphs off, off CUDA, a batch beyond the largest captured size, a width not
captured) runs the same function eagerly on its own tensors. Nothing here reads the device from
the host; importing this module does not import SGLang.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch

from sglang_spec.tree.head import capture_graphs, captured_batch_size

#: ``append(target_hidden=, cache_loc_2d=, positions=, commit_lens=)``: the prefix-valid writer.
AppendFn = Callable[..., None]


def context_positions(prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
    """``[bs * width]`` int64 positions ``prefix + i`` of each request's verify-window rows."""
    offsets = torch.arange(width, device=prefix_lens.device, dtype=torch.int64)
    return (prefix_lens.to(torch.int64).unsqueeze(1) + offsets).reshape(-1)


def append_context(
    append: AppendFn,
    hidden: torch.Tensor,
    cache_loc_2d: torch.Tensor,
    prefix_lens: torch.Tensor,
    commit_lens: torch.Tensor,
) -> None:
    """The drafter K/V of rows ``[0, commit_lens[b])`` of each request ``b``'s verify window:
    ``hidden`` ``[bs * width, D]`` target features, root first (after the tree compaction),
    ``cache_loc_2d`` ``[bs, width]`` their KV slots, at positions ``prefix_lens[b] + i``."""
    append(
        target_hidden=hidden,
        cache_loc_2d=cache_loc_2d,
        positions=context_positions(prefix_lens, cache_loc_2d.shape[1]),
        commit_lens=commit_lens.to(torch.int32),
    )


class ContextAppendGraphs:
    """:func:`append_context` by graph replay per (width, padded batch size) once captured;
    eager before :meth:`capture`, off CUDA and for what no graph covers (module docstring)."""

    def __init__(
        self,
        append: AppendFn,
        *,
        widths: list[int],
        graph_bs: list[int],
        feature_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        if not widths or not graph_bs or min(widths) < 1 or min(graph_bs) < 1:
            raise ValueError(
                f"ContextAppendGraphs needs widths and batch sizes >= 1; got widths {widths}, "
                f"batch sizes {graph_bs}"
            )
        self.append = append
        self.widths = sorted(set(widths))
        self.graph_bs = sorted(set(graph_bs))
        rows = self.graph_bs[-1] * self.widths[-1]
        self.hidden = torch.zeros(rows, feature_size, dtype=dtype, device=device)
        self.cache_loc = torch.zeros(rows, dtype=torch.int64, device=device)
        self.prefix_lens = torch.zeros(self.graph_bs[-1], dtype=torch.int64, device=device)
        self.commit_lens = torch.zeros(self.graph_bs[-1], dtype=torch.int32, device=device)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}

    def _run_static(self, width: int, bs: int) -> None:
        append_context(
            self.append,
            self.hidden[: bs * width],
            self.cache_loc[: bs * width].view(bs, width),
            self.prefix_lens[:bs],
            self.commit_lens[:bs],
        )

    def capture(self, capture_scope: Callable[[], AbstractContextManager[tuple[Any, Any]]]) -> None:
        """Capture every (width, batch size), widest and largest first
        (``tree.head.capture_graphs``, under ``capture_scope()``'s stream and pool). Commit
        lengths are 0 throughout: the warm-ups and the capture write nothing to the pool."""
        self.commit_lens.zero_()
        self.graphs.update(
            capture_graphs(self._run_static, self.widths, self.graph_bs, capture_scope)
        )

    def __call__(
        self,
        hidden: torch.Tensor,
        cache_loc_2d: torch.Tensor,
        prefix_lens: torch.Tensor,
        commit_lens: torch.Tensor,
    ) -> bool:
        """:func:`append_context` of one decode step; True when a graph replay ran it."""
        bs, width = cache_loc_2d.shape
        padded = captured_batch_size(self.graph_bs, bs)
        graph = None if padded is None else self.graphs.get((width, padded))
        if graph is None:
            append_context(self.append, hidden, cache_loc_2d, prefix_lens, commit_lens)
            return False
        self.hidden[: bs * width].copy_(hidden[: bs * width])
        self.cache_loc[: bs * width].copy_(cache_loc_2d.reshape(-1))
        self.prefix_lens[:bs].copy_(prefix_lens)
        self.commit_lens[:bs].copy_(commit_lens)
        if padded > bs:
            self.commit_lens[bs:padded].zero_()  # padding rows: nothing written
        graph.replay()
        return True
