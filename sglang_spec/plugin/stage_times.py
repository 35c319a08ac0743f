"""Per-stage timing of DDTREE decode steps, on when ``SGLANG_DDTREE_STAGE_TIMES=/path/file.jsonl``.

A profiling aid (the per-stage table of benchmarks' scale runs), not a serving feature.

The worker (tensor-parallel rank 0) then appends one JSON object per decode step::

    {"bs": int, "width": int, "host_ms": {stage: float}, "gpu_ms": {stage: float},
     "gpu_between_ms": float | null}

for the stages of :data:`STAGES`, in the order they ran; ``width`` is the verify width the step ran
at (with budget by batch size it changes from step to step). A prefill (extend) batch is one line
too, timed as one stage::

    {"phase": "extend", "bs": int, "tokens": int, "host_ms": {"extend": float},
     "gpu_ms": {"extend": float}, "gpu_between_ms": float | null}

(``bs`` new requests, ``tokens`` prompt tokens computed), so that the per-request cost a level's
ms per step also carries (its prefill, the drafter's context) is measured beside the decode steps.

Host time is ``perf_counter`` around each stage method (its launches, plus any host wait inside
it). GPU time comes from a pair of CUDA events recorded on the current stream around each stage.
``gpu_between_ms`` is the GPU time from the end of the previous timed step or prefill to the start
of this one: the scheduler's own work in between, and any time the GPU waited for the host (null
for the first record). A step is written once its last event has completed, checked without waiting
(``Event.query``) when a later decode step begins, so timing adds no synchronisation, also under
SGLang's overlap scheduler (which launches the next step before the previous one has finished);
:meth:`StageTimer.flush` waits for and writes what is left. Steps still running when the server
stops are not written.

The same timer times a whole DFLASH decode step as one stage, ``step``, and its prefills as
DDTREE's (:func:`time_dflash_steps`), so that one server run compares the two algorithms' GPU time
per step, per prefill and between them.

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
        *,
        new_event: Callable[[], Any] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self._file = open(path, "a", buffering=1)  # line-buffered, open for the worker's life
        self._new_event = new_event or _cuda_event
        self._clock = clock
        self._step: dict[str, Any] | None = None  # the record's head fields of the step being timed
        self._stages: dict[str, tuple[float, Any, Any]] = {}
        # (head, stages) of the steps begun but not yet written, oldest first
        self._pending: deque[tuple[dict[str, Any], dict[str, tuple[float, Any, Any]]]] = deque()
        self._last_end: Any = None  # the end event of the last step written

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

    def begin_step(self, bs: int, width: int) -> None:
        """Write the earlier steps that have finished on the device, then start one of ``bs``
        requests at verify width ``width``."""
        self._begin({"bs": int(bs), "width": int(width)})

    def time_extend(self, bs: int, tokens: int, call: Callable[[], Any]) -> Any:
        """Run ``call`` (a prefill batch of ``bs`` new requests, ``tokens`` prompt tokens) timed as
        one stage, ``extend``; return what it returns."""
        self._begin({"phase": "extend", "bs": int(bs), "tokens": int(tokens)})
        try:
            return self.wrap("extend", call)()
        finally:
            self._close_step()

    def _begin(self, head: dict[str, Any]) -> None:
        self._close_step()
        self._write(wait=False)
        self._step = head

    def flush(self) -> None:
        """Wait for and write every step timed so far."""
        self._close_step()
        self._write(wait=True)

    def _close_step(self) -> None:
        if self._step is not None:
            self._pending.append((self._step, self._stages))
        self._step, self._stages = None, {}

    def _write(self, *, wait: bool) -> None:
        while self._pending:
            head, stages = self._pending[0]
            if stages:
                last_end = next(reversed(stages.values()))[2]
                if wait:
                    last_end.synchronize()
                elif not last_end.query():
                    return  # still running (overlap): later
            self._pending.popleft()
            if not stages:
                continue
            first_start = next(iter(stages.values()))[1]
            between = None if self._last_end is None else self._last_end.elapsed_time(first_start)
            self._last_end = next(reversed(stages.values()))[2]
            record = {
                **head,
                "host_ms": {n: round(host, 4) for n, (host, _, _) in stages.items()},
                "gpu_ms": {n: round(s.elapsed_time(e), 4) for n, (_, s, e) in stages.items()},
                "gpu_between_ms": None if between is None else round(between, 4),
            }
            self._file.write(json.dumps(record) + "\n")


def time_dflash_steps(path: str) -> None:
    """Time every DFLASH decode step as one stage, ``step``, and every prefill as ``extend``
    (``SGLANG_DDTREE_STAGE_TIMES`` on a DFLASH server; the plug-in's ``register`` calls this):
    upstream's worker runs its step in one method, so the whole step is the finest split available
    without copying it."""
    import sglang_spec.plugin.adapter as adapter

    timers: dict[int, StageTimer] = {}

    def timed_step(worker: Any, batch: Any, call: Callable[[], Any]) -> Any:
        from sglang.srt.runtime_context import get_parallel

        if get_parallel().tp_rank != 0:  # one file line per step, as DDTREE's timer writes
            return call()
        timer = timers.get(id(worker))
        if timer is None:
            timer = timers[id(worker)] = StageTimer(path)
        if adapter.is_extend(batch):
            return timer.time_extend(len(batch.seq_lens), adapter.extend_tokens(batch), call)
        timer.begin_step(len(batch.seq_lens), adapter.dflash_block_size(worker))
        return timer.wrap("step", call)()

    adapter.wrap_dflash_steps(timed_step)
