"""Per-stage timing of DDTREE decode steps, on when ``SGLANG_DDTREE_STAGE_TIMES=/path/file.jsonl``.

A profiling aid (the per-stage table of benchmarks' scale runs), not a serving feature.

The worker (tensor-parallel rank 0) then appends one JSON object per decode step::

    {"bs": int, "width": int, "host_ms": {stage: float}, "gpu_ms": {stage: float}}

for the stages of :data:`STAGES`, in the order they ran. Host time is ``perf_counter`` around each
stage method (its launches, plus any host wait inside it). GPU time comes from a pair of CUDA
events recorded on the current stream around each stage. A step is written once its last event
has completed, checked without waiting (``Event.query``) when a later decode step begins, so
timing adds no synchronisation, also under SGLang's overlap scheduler (which launches the next
step before the previous one has finished); :meth:`StageTimer.flush` waits for and writes what is
left. Steps still running when the server stops are not written.

Off (the variable unset), the worker's stage methods are not wrapped at all: no cost.
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
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
        # (bs, stages) of the steps begun but not yet written, oldest first
        self._pending: deque[tuple[int, dict[str, tuple[float, Any, Any]]]] = deque()

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
        """Write the earlier steps that have finished on the device, then start one."""
        self._close_step()
        self._write(wait=False)
        self._bs = int(bs)

    def flush(self) -> None:
        """Wait for and write every step timed so far."""
        self._close_step()
        self._write(wait=True)

    def _close_step(self) -> None:
        if self._bs is not None:
            self._pending.append((self._bs, self._stages))
        self._bs, self._stages = None, {}

    def _write(self, *, wait: bool) -> None:
        while self._pending:
            bs, stages = self._pending[0]
            if stages:
                last_end = next(reversed(stages.values()))[2]
                if wait:
                    last_end.synchronize()
                elif not last_end.query():
                    return  # still running (overlap): later
            self._pending.popleft()
            record = {
                "bs": bs,
                "width": self._width,
                "host_ms": {n: round(host, 4) for n, (host, _, _) in stages.items()},
                "gpu_ms": {n: round(s.elapsed_time(e), 4) for n, (_, s, e) in stages.items()},
            }
            self._file.write(json.dumps(record) + "\n")
