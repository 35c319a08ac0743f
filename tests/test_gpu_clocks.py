"""loadtests.gpu_clocks: the level's GPU clock summary from a fake reader, and the NVML binding
against a fake ``libnvidia-ml`` built here with the C compiler (the real one needs a driver)."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from loadtests import gpu_clocks
from loadtests.gpu_clocks import ClockSampler, GpuSample

CC = shutil.which("cc") or shutil.which("gcc")

# NVML's calls as the binding uses them: SM clock 1410 + 10 per read, 300 W, reasons 0x4 then 0x1,
# utilization 37 % (the memory share beside it 99, so a field read off by one shows)
FAKE_NVML = r"""
static int reads = 0;
int nvmlInit_v2(void) { return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device) {
    if (index != 0) return 2;  /* NVML_ERROR_INVALID_ARGUMENT */
    *device = (void *)0x1234;
    return 0;
}
int nvmlDeviceGetClockInfo(void *device, int type, unsigned int *clock) {
    if (device != (void *)0x1234 || type != 1) return 2;  /* the SM clock of our handle */
    *clock = 1410 + 10 * reads++;
    return 0;
}
int nvmlDeviceGetPowerUsage(void *device, unsigned int *mw) { *mw = 300000; return 0; }
int REASONS(void *device, unsigned long long *reasons) {
    *reasons = reads > 1 ? 0x1ULL : 0x4ULL;
    return 0;
}
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
int nvmlDeviceGetUtilizationRates(void *device, nvmlUtilization_t *u) {
    if (device != (void *)0x1234) return 2;
    u->gpu = 37;
    u->memory = 99;
    return 0;
}
"""


def _fake_nvml(tmp_path, reasons_name: str) -> str:
    src = tmp_path / "nvml.c"
    src.write_text(FAKE_NVML.replace("REASONS", reasons_name))
    lib = tmp_path / f"libfake-nvml-{reasons_name}.so"
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return str(lib)


def test_the_summary_reads_every_sample_of_the_level():
    """Mean, lowest and highest SM clock, mean power, every reason bit seen, the sample count: a
    read at the start and at the end at least; a read that fails ends the sampling and keeps what
    was read; no reader, no summary."""
    values = iter([(1980, 700_000, 0x1, 20), (1410, 300_000, 0x4, 50), (1755, None, None, None)])

    def read():
        try:
            sm, mw, why, util = next(values)
        except StopIteration:
            raise OSError("gone") from None
        return GpuSample(sm, mw, why, util)

    with ClockSampler(read, period=0.01) as s:
        time.sleep(0.2)  # past the three values: the fourth read fails and sampling stops
    assert s.summary() == {
        "sm_mhz_mean": pytest.approx((1980 + 1410 + 1755) / 3, abs=0.1),
        "sm_mhz_min": 1410,
        "sm_mhz_max": 1980,
        "power_w_mean": 500.0,
        "clock_event_reasons": 0x5,  # 0x1 | 0x4
        "util_pct_mean": 35.0,  # the two samples that read it
        "samples": 3,
    }
    n = iter(range(1000))
    with ClockSampler(lambda: GpuSample(1000 + next(n), None, None), period=10.0) as quick:
        pass  # shorter than one period: the start's read and the end's
    assert quick.summary()["samples"] == 2
    assert quick.summary()["power_w_mean"] is None and quick.summary()["util_pct_mean"] is None
    with ClockSampler(None) as none:
        pass
    assert none.summary() is None


def test_no_nvml_no_reader(tmp_path):
    assert gpu_clocks.nvml_reader(lib=str(tmp_path / "libnvidia-ml.so.1")) is None


@pytest.mark.skipif(CC is None, reason="needs a C compiler to build the fake NVML")
@pytest.mark.parametrize(
    "reasons_name",
    ["nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"],
)
def test_the_binding_calls_nvml_as_its_headers_declare(tmp_path, reasons_name):
    """Through a C library with NVML's signatures: the handle of GPU 0 reaches the clock call with
    the SM clock type; clock, power, reasons and the kernel share of the utilization come back
    through their pointers (either name of the reasons call); a GPU index NVML refuses gives no
    reader."""
    lib = _fake_nvml(tmp_path, reasons_name)
    read = gpu_clocks.nvml_reader(0, lib)
    assert read is not None  # its first read (1410) checked the binding
    assert read() == GpuSample(1420, 300_000, 0x1, 37)
    assert read().sm_mhz == 1430
    assert gpu_clocks.nvml_reader(1, lib) is None
