"""Per-stage timing of DDTREE decode steps, on when ``SGLANG_DDTREE_STAGE_TIMES=/path/file.jsonl``.

A profiling aid (the per-stage table of benchmarks' scale runs), not a serving feature.

The worker (tensor-parallel rank 0) then appends one JSON object per decode step::

    {"bs": int, "width": int, "host_ms": {stage: float}, "gpu_ms": {stage: float}}

for the stages of :data:`STAGES`, in the order they ran. Host time is ``perf_counter`` around each
stage method (its launches, plus any host wait inside it). GPU time comes from a pair of CUDA
events recorded on the current stream around each stage; they are read when the next decode step
begins (or at :meth:`StageTimer.flush`), after the scheduler has synchronised on the step's
outputs, so timing adds no synchronisation inside the measured stages. The last step before the
server stops is not written.

Off (the variable unset), the worker's stage methods are not wrapped at all: no cost.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from typing import Any

import torch

STAGES = ("draft", "topk", "tree", "verify", "walk", "commit", "append_context")


def _cuda_event() -> Any:
    return torch.cuda.Event(enable_timing=True)


class StageTimer:
    """Times the stage methods of one worker, one JSON line per decode step."""

    def __init__(
        self,
        path: str,
        width: int,
        *,
        new_event: Callable[[], Any] = _cuda_event,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self._file = open(path, "a", buffering=1)  # line-buffered, open for the worker's life
        self._width = int(width)
        self._new_event = new_event
        self._clock = clock
        self._bs: int | None = None
        self._stages: dict[str, tuple[float, Any, Any]] = {}

    def instrument(self, worker: Any) -> None:
        """Wrap ``worker.<stage>_stage`` for every stage of :data:`STAGES` (instance attributes)."""
        for name in STAGES:
            attr = f"{name}_stage"
            setattr(worker, attr, self.wrap(name, getattr(worker, attr)))

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start, end = self._new_event(), self._new_event()
            t0 = self._clock()
            start.record()
            try:
                return fn(*args, **kwargs)
            finally:
                end.record()
                self._stages[name] = ((self._clock() - t0) * 1e3, start, end)

        return timed

    def begin_step(self, bs: int) -> None:
        """Write the previous step (its outputs have been synchronised on since) and start one."""
        self.flush()
        self._bs = int(bs)

    def flush(self) -> None:
        if self._bs is None:
            return
        stages, self._stages = self._stages, {}
        bs, self._bs = self._bs, None
        if stages:  # a no-op wait: the scheduler synchronised on this step's outputs
            next(reversed(stages.values()))[2].synchronize()
        record = {
            "bs": bs,
            "width": self._width,
            "host_ms": {n: round(host, 4) for n, (host, _, _) in stages.items()},
            "gpu_ms": {n: round(s.elapsed_time(e), 4) for n, (_, s, e) in stages.items()},
        }
        self._file.write(json.dumps(record) + "\n")
