"""How fast this host's CPU runs Python during a load test: a fixed piece of CPython work, timed
ten times a second in a process of its own.

Session 38 found the tiny pair's decode step moving between about 4 and 6.3 ms from one sweep
level to the next, for every server, with the GPU's clock at its maximum and the decode loop
pinned, never waiting for a CPU and on one 97-98 % of the time (``loadtests/host_counters.py``,
``loadtests/gpu_clocks.py``). Left to tell apart: a CPU that itself runs slower at times (a VM's
neighbours, its turbo) and something in the server's loop. The decode loop is CPython, so the
probe times CPython: :func:`unit` (:data:`WORK` additions and multiplications, 1.7 ms on the CPU machine) once
every ``period`` s, sleeping between (so it takes some 1 % of one CPU), and prints each unit's
time. A slower CPU shows as slower units in the same seconds.

``loadtests.sweep --cpu-probe`` runs it through the whole sweep (:class:`CpuProbe`) and records
each level's ``cpu_probe``: the units timed within the level, their median, lowest and highest
(ms). The probe runs on the sweep's CPUs (``e2e.tiny_pair --pin-cpus``: the harness's block, not
a server's).

Run alone: ``python loadtests/cpu_probe.py [--period S] [--work N]`` prints
``<CLOCK_MONOTONIC s> <unit ms>`` lines until stopped. Standard library only, so the file runs as
a script from anywhere.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

WORK = 20_000  # loop iterations a unit
START_S = 10.0  # the longest CpuProbe waits for the probe's first unit


def unit(work: int = WORK) -> int:
    """The timed work: pure CPython integer arithmetic, as an interpreter-bound loop does."""
    x = 0
    for i in range(work):
        x += i * i
    return x


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--period", type=float, default=0.1, help="seconds from one unit to the next")
    ap.add_argument("--work", type=int, default=WORK, help="loop iterations a unit")
    args = ap.parse_args(argv)
    try:
        while True:
            t0 = time.perf_counter()
            unit(args.work)
            ms = (time.perf_counter() - t0) * 1000.0
            print(f"{time.monotonic():.6f} {ms:.4f}", flush=True)
            time.sleep(max(0.0, args.period - ms / 1000.0))
    except (KeyboardInterrupt, BrokenPipeError):
        return 0


class CpuProbe:
    """``with CpuProbe() as p: ...``: the probe process runs for the block; a thread collects its
    ``(monotonic s, unit ms)`` samples, and ``p.window(t0, t1)`` summarises those timed within
    ``[t0, t1]`` (``time.monotonic()``, one clock for every process of the host)."""

    def __init__(self, period: float = 0.1, work: int = WORK):
        self.cmd = [sys.executable, str(Path(__file__).resolve())]
        self.cmd += ["--period", str(period), "--work", str(work)]
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None
        self._first = threading.Event()

    def _collect(self) -> None:
        for line in self._proc.stdout:
            t, ms = line.split()
            self.samples.append((float(t), float(ms)))
            self._first.set()

    def __enter__(self) -> CpuProbe:
        """Starts the probe and waits (up to ``START_S``) for its first unit, so that the first
        level is probed from its start and not only after the interpreter has come up."""
        self._proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        self._thread = threading.Thread(target=self._collect, daemon=True)
        self._thread.start()
        self._first.wait(START_S)
        return self

    @property
    def pid(self) -> int:
        """The probe process's pid (running within the block)."""
        return self._proc.pid

    def __exit__(self, *exc) -> None:
        self._proc.kill()
        self._proc.wait()
        self._thread.join()

    def window(self, t0: float, t1: float) -> dict | None:
        """The units timed within ``[t0, t1]``: their median, lowest and highest time (ms) and
        their count; None when none was."""
        ms = [m for t, m in self.samples if t0 <= t <= t1]
        if not ms:
            return None
        return {
            "unit_ms_median": round(statistics.median(ms), 4),
            "unit_ms_min": round(min(ms), 4),
            "unit_ms_max": round(max(ms), 4),
            "samples": len(ms),
        }


if __name__ == "__main__":
    sys.exit(main())
