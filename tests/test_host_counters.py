"""loadtests.host_counters: the level's host and scheduler-thread counters, from a fake /proc whose
numbers are known and from this machine's own /proc."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtests import host_counters as hc

LINUX = Path("/proc/self/task").is_dir()


def _fake_proc(root: Path, *, cpu: list[int], pid: int, on_cpu: int, delay: int, vol: int,
               invol: int, migrations: int | None, last_cpu: int) -> Path:  # fmt: skip
    root.mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\ncpu0 1 2 3\nintr 5\n")
    task = root / str(pid) / "task" / str(pid)
    task.mkdir(parents=True, exist_ok=True)
    (task / "schedstat").write_text(f"{on_cpu} {delay} 77\n")
    (task / "status").write_text(
        f"Name:\tpython3\nState:\tR (running)\nvoluntary_ctxt_switches:\t{vol}\n"
        f"nonvoluntary_ctxt_switches:\t{invol}\n"
    )
    # a comm with a space and a parenthesis; fields 3..52 after it, field 39 = the last CPU
    rest = [str(i) for i in range(3, 53)]
    rest[39 - 3] = str(last_cpu)
    (task / "stat").write_text(f"{pid} (sglang::sched (x) " + " ".join(rest) + "\n")
    sched = task / "sched"
    if migrations is None:
        sched.unlink(missing_ok=True)
    else:
        sched.write_text(
            f"python3 ({pid}, #threads: 3)\n---\nse.exec_start   :   1.5\n"
            f"se.nr_migrations                             :                   {migrations}\n"
        )
    return root


def test_delta_reads_the_host_split_and_the_threads_counters(tmp_path):
    """Between two snapshots 2 s apart: steal and busy as shares of all CPUs' ticks (idle and
    iowait are the idle part; steal is in the total), the thread's run and wait time over the
    wall time, its switches a second, migrations, and the CPU from stat's field 39."""
    proc = tmp_path / "proc"
    #        user nice sys idle iowait irq softirq steal guest
    cpu0 = [1000, 0, 200, 5000, 100, 0, 0, 50, 999]
    cpu1 = [1300, 0, 300, 5500, 200, 0, 0, 250, 999]  # +1200 ticks: 400 busy, 600 idle, 200 steal
    _fake_proc(proc, cpu=cpu0, pid=42, on_cpu=10**9, delay=10**8, vol=10, invol=3,
               migrations=5, last_cpu=2)  # fmt: skip
    a = hc.snapshot(42, proc)
    _fake_proc(proc, cpu=cpu1, pid=42, on_cpu=10**9 + 15 * 10**8, delay=10**8 + 2 * 10**8,
               vol=30, invol=13, migrations=9, last_cpu=7)  # fmt: skip
    b = hc.snapshot(42, proc)
    b = hc.Snapshot(a.t + 2.0, b.host, b.thread)
    assert hc.delta(a, b) == {
        "wall_s": 2.0,
        "steal_pct": pytest.approx(100 * 200 / 1200, abs=0.01),
        "busy_pct": pytest.approx(100 * (1200 - 600) / 1200, abs=0.01),
        "on_cpu_pct": 75.0,  # 1.5 s of 2 s
        "run_delay_pct": 10.0,  # 0.2 s
        "voluntary_per_s": 10.0,
        "nonvoluntary_per_s": 5.0,
        "migrations": 4,
        "last_cpu": 7,
    }


def test_what_proc_cannot_say_is_none_and_the_rest_stays(tmp_path):
    """No sched file: migrations None, the rest read. No such thread, or no /proc at all: every
    thread counter None (the host's stay where /proc/stat is). Never an exception."""
    proc = tmp_path / "proc"
    cpu = [1, 0, 1, 10, 0, 0, 0, 0]
    _fake_proc(proc, cpu=cpu, pid=7, on_cpu=0, delay=0, vol=0, invol=0, migrations=None,
               last_cpu=0)  # fmt: skip
    a = hc.snapshot(7, proc)
    _fake_proc(proc, cpu=[c + 5 for c in cpu], pid=7, on_cpu=10**9, delay=0, vol=1, invol=0,
               migrations=None, last_cpu=1)  # fmt: skip
    b = hc.snapshot(7, proc)
    b = hc.Snapshot(a.t + 1.0, b.host, b.thread)
    d = hc.delta(a, b)
    assert d["migrations"] is None and d["on_cpu_pct"] == 100.0 and d["last_cpu"] == 1
    gone = hc.delta(hc.snapshot(8, proc), hc.snapshot(8, proc))
    assert [gone[k] for k in ("on_cpu_pct", "run_delay_pct", "migrations", "last_cpu")] == [
        None
    ] * 4
    nothing = hc.delta(hc.snapshot(7, tmp_path / "none"), hc.snapshot(7, tmp_path / "none"))
    assert {k for k, v in nothing.items() if v is not None} == {"wall_s"}
    assert hc.delta(a, a)["steal_pct"] is None  # no ticks between: no share to give
    assert hc.snapshot(None, proc).thread is None


@pytest.mark.skipif(not LINUX, reason="reads this machine's /proc")
def test_a_spinning_thread_is_on_cpu_and_a_sleeping_one_is_not():
    """On this machine's /proc: a child that spins shows most of the wall time on a CPU, one that
    sleeps almost none; the host's shares are percentages."""
    spin = "import time\nt = time.time()\nwhile time.time() - t < 30: pass"
    sleep = "import time; time.sleep(30)"
    seen = {}
    for name, code in (("spin", spin), ("sleep", sleep)):
        child = subprocess.Popen([sys.executable, "-c", code])
        try:
            time.sleep(0.3)  # past the interpreter's start
            a = hc.snapshot(child.pid)
            time.sleep(1.0)
            seen[name] = hc.delta(a, hc.snapshot(child.pid))
        finally:
            child.kill()
            child.wait()
    assert seen["spin"]["on_cpu_pct"] > 40, seen
    assert seen["sleep"]["on_cpu_pct"] < 5, seen
    assert seen["sleep"]["voluntary_per_s"] <= 2, seen  # one sleep: it never woke
    for d in seen.values():
        assert 0 <= d["steal_pct"] <= 100 and 0 <= d["busy_pct"] <= 100
