"""The GPU's clocks during a load-test level, sampled through NVML (the driver's
``libnvidia-ml.so.1``, by ctypes: no Python package needed).

A launch-bound step (the tiny pair's) runs many short kernels with the GPU mostly idle between
them, and a GPU that lowers its SM clock under such a light load makes every kernel slower. With
the host's counters (``loadtests/host_counters.py``) this tells a slow host from a slow GPU:
``loadtests.sweep`` records each level's ``gpu`` -- the SM clock's mean, lowest and highest (MHz),
the mean power draw (W), every clock-event (throttle) reason seen (NVML's bit mask), the mean
share of time a kernel was running (``util_pct_mean``, NVML's utilization over its own sample
period: a level whose steps slowed on the host shows a lower share, one slowed on the GPU the
same or a higher one) and the number of samples -- or None where there is no NVML (the CPU
machine, CI).

GPU 0 in NVML's order: the one GPU of the lent machines.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass

NVML_CLOCK_SM = 1


class _Utilization(ctypes.Structure):  # nvmlUtilization_t
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


@dataclass(frozen=True)
class GpuSample:
    sm_mhz: int
    power_mw: int | None
    reasons: int | None  # NVML's clocks event (throttle) reasons, a bit mask
    util_pct: int | None = None  # % of NVML's last sample period with a kernel running


def nvml_reader(index: int = 0, lib: str = "libnvidia-ml.so.1") -> Callable[[], GpuSample] | None:
    """A function reading GPU ``index``'s :class:`GpuSample`, or None when NVML cannot be loaded
    or initialised (no driver)."""
    try:
        nvml = ctypes.CDLL(lib)
        if nvml.nvmlInit_v2() != 0:
            return None
        handle = ctypes.c_void_p()
        if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    # the newer name first (NVML 12.x renamed throttle reasons to clocks event reasons)
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
    )

    def read() -> GpuSample:
        sm, power, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        util = _Utilization()
        if nvml.nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(sm)) != 0:
            raise OSError("nvmlDeviceGetClockInfo failed")
        got_power = nvml.nvmlDeviceGetPowerUsage(handle, ctypes.byref(power)) == 0
        got_reasons = reasons_fn is not None and reasons_fn(handle, ctypes.byref(reasons)) == 0
        got_util = nvml.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(util)) == 0
        return GpuSample(
            sm.value,
            power.value if got_power else None,
            reasons.value if got_reasons else None,
            util.gpu if got_util else None,
        )

    try:
        read()
    except OSError:
        return None
    return read


class ClockSampler:
    """``with ClockSampler(read) as s: <level>``; then ``s.summary()``. A thread calls ``read``
    every ``period`` s (and once at the start and at the end); a read that fails ends the
    sampling, keeping what was read. ``read`` None (no NVML): ``summary()`` is None."""

    def __init__(self, read: Callable[[], GpuSample] | None, period: float = 0.1):
        self.read, self.period = read, period
        self.samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> bool:
        try:
            self.samples.append(self.read())
        except OSError:
            return False
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.period) and self._sample():
            pass

    def __enter__(self) -> ClockSampler:
        if self.read is not None and self._sample():
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        sm = [s.sm_mhz for s in self.samples]
        power = [s.power_mw for s in self.samples if s.power_mw is not None]
        reasons = [s.reasons for s in self.samples if s.reasons is not None]
        util = [s.util_pct for s in self.samples if s.util_pct is not None]
        any_reason = 0
        for r in reasons:
            any_reason |= r
        return {
            "sm_mhz_mean": round(statistics.fmean(sm), 1),
            "sm_mhz_min": min(sm),
            "sm_mhz_max": max(sm),
            "power_w_mean": round(statistics.fmean(power) / 1000.0, 1) if power else None,
            "clock_event_reasons": any_reason if reasons else None,
            "util_pct_mean": round(statistics.fmean(util), 1) if util else None,
            "samples": len(sm),
        }
