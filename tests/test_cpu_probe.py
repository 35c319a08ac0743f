"""loadtests.cpu_probe: the probe's samples, summarised per window, and that a CPU which gives
the probe less time shows as slower units."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import pytest

from loadtests import cpu_probe
from loadtests.cpu_probe import CpuProbe


def test_a_window_summarises_only_the_units_timed_within_it():
    p = CpuProbe()  # not started: samples given by hand
    p.samples = [(10.0, 1.0), (10.1, 3.0), (10.2, 2.0), (10.3, 9.0)]
    assert p.window(10.05, 10.25) == {
        "unit_ms_median": 2.5,
        "unit_ms_min": 2.0,
        "unit_ms_max": 3.0,
        "samples": 2,
    }
    assert p.window(10.0, 10.0)["samples"] == 1  # both ends belong to the window
    assert p.window(11.0, 12.0) is None


def test_the_probe_process_times_its_units_on_the_callers_clock():
    """Run as the sweep runs it: units every period, stamped with CLOCK_MONOTONIC (the clock the
    sweep's level bounds use), each one's time positive and, at the median, shorter than the period;
    the first unit is in when the block begins; the process is gone after it."""
    t0 = time.monotonic()
    with CpuProbe(period=0.02) as p:
        assert p.samples  # its first unit was in before the block began
        time.sleep(0.5)
        pid = p.pid
    t1 = time.monotonic()
    assert len(p.samples) >= 5
    assert all(t0 < t < t1 and ms > 0 for t, ms in p.samples)
    assert statistics.median(ms for _, ms in p.samples) < 20.0  # the unit, not the period
    gaps = [b[0] - a[0] for a, b in zip(p.samples, p.samples[1:])]
    assert statistics.median(gaps) == pytest.approx(0.02, abs=0.015)
    assert p.window(t0, t1)["samples"] == len(p.samples)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")
def test_units_slow_down_when_their_cpu_is_shared():
    """The probe and three spinning processes on one CPU: the probe gets about a quarter of it,
    and its units (back to back, no sleep, so the scheduler cannot favour it as a sleeper) take
    several times as long as alone on that CPU."""
    cpu = min(os.sched_getaffinity(0))
    spin = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"
    with CpuProbe(period=0.0, work=5 * cpu_probe.WORK) as p:
        os.sched_setaffinity(p.pid, {cpu})
        time.sleep(0.8)
        alone = [ms for _, ms in p.samples[2:]]
        spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
        try:
            for s in spinners:
                os.sched_setaffinity(s.pid, {cpu})
            n = len(p.samples)
            time.sleep(1.5)
            shared = [ms for _, ms in p.samples[n + 1 :]]
        finally:
            for s in spinners:
                s.kill()
                s.wait()
    assert len(alone) >= 3 and len(shared) >= 3, (alone, shared)
    assert statistics.median(shared) > 2.0 * statistics.median(alone), (alone, shared)
