"""Median timing of a callable: CUDA events on a GPU (GPU time, launch overhead excluded), wall time
on a CPU. Results in microseconds."""

from __future__ import annotations

import statistics
import time

import torch


def median_timer(device: torch.device):
    """``run(fn, repeats) -> median µs`` for ``device`` (one warm-up call first)."""
    if device.type == "cuda":

        def run(fn, repeats):
            fn()
            torch.cuda.synchronize()
            times = []
            for _ in range(repeats):
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            return statistics.median(times)

    else:

        def run(fn, repeats):
            fn()
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            return statistics.median(times)

    return run
