"""Host counters around a load-test level: did the machine, or the server's scheduler, move?

The tiny pair's decode step is the scheduler's Python launching kernels, so its period follows the
host: in session 37 the same DDTREE(63) server's step at C = 1 sat at 4.2-4.4 ms or at 6.0-6.5 ms,
pass after pass, with the same tokens a step. These counters, read from ``/proc`` before and after
each level (``loadtests.sweep`` records them as the level's ``host``), tell the candidate causes
apart:

- ``steal_pct``: the share of all CPUs' time the hypervisor gave to someone else (a VM's vCPUs
  waiting), from ``/proc/stat``; ``busy_pct`` the share not idle;
- for one thread, the server's decode loop (the scheduler process's main thread,
  ``--watch-pid``), from ``/proc/PID/task/PID/``:
  ``on_cpu_pct`` (time it ran, over the level's wall time; ``schedstat``), ``run_delay_pct`` (time
  it was ready and waited for a CPU; ``schedstat``), its voluntary and involuntary context switches
  a second (``status``), its migrations between CPUs (``sched``'s ``se.nr_migrations``, where the
  kernel has it) and the CPU it ran on last (``stat``).

Contention shows as ``run_delay_pct`` or involuntary switches, a busy hypervisor as
``steal_pct``. A slower CPU does not show here: SGLang's decode loop never sleeps (it computes or
spins on the GPU), so it is on a CPU 97-98 % of every level, fast or slow (session 38);
``loadtests/cpu_probe.py`` times the CPU itself. Every counter is None where ``/proc`` cannot say
(not Linux, the thread gone): the level goes on without it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
THREAD_FIELDS = (  # delta's counters of the watched thread, in its output's order
    "on_cpu_pct",
    "run_delay_pct",
    "voluntary_per_s",
    "nonvoluntary_per_s",
    "migrations",
    "last_cpu",
)


@dataclass(frozen=True)
class HostCpu:
    """``/proc/stat``'s ``cpu`` line in clock ticks, summed over every CPU."""

    total: int
    idle: int  # idle + iowait
    steal: int


@dataclass(frozen=True)
class ThreadCounters:
    on_cpu_ns: int
    run_delay_ns: int
    voluntary: int
    nonvoluntary: int
    migrations: int | None  # se.nr_migrations: only with the kernel's scheduler debug files
    last_cpu: int


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.monotonic()
    host: HostCpu | None
    thread: ThreadCounters | None


def read_host(proc: Path = PROC) -> HostCpu | None:
    try:
        line = (proc / "stat").read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    name, *ticks = line.split()
    if name != "cpu" or len(ticks) < 8:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, ticks[:8])
    total = user + nice + system + idle + iowait + irq + softirq + steal  # guest is in user
    return HostCpu(total=total, idle=idle + iowait, steal=steal)


def read_thread(pid: int, proc: Path = PROC) -> ThreadCounters | None:
    """The counters of process ``pid``'s main thread (its task ``pid``)."""
    task = proc / str(pid) / "task" / str(pid)
    try:
        on_cpu, delay = map(int, (task / "schedstat").read_text().split()[:2])
        status = dict(
            ln.split(":", 1) for ln in (task / "status").read_text().splitlines() if ":" in ln
        )
        # stat: "pid (comm) state ..." -- comm may hold spaces and parentheses; field 39 is the CPU
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        last_cpu = int(fields[39 - 3])
        voluntary = int(status["voluntary_ctxt_switches"])
        nonvoluntary = int(status["nonvoluntary_ctxt_switches"])
    except (OSError, ValueError, IndexError, KeyError):
        return None
    return ThreadCounters(on_cpu, delay, voluntary, nonvoluntary, _migrations(task), last_cpu)


def _migrations(task: Path) -> int | None:
    try:
        lines = (task / "sched").read_text().splitlines()
    except OSError:
        return None
    for ln in lines:
        key, _, value = ln.partition(":")
        if key.strip() == "se.nr_migrations":
            return int(value)
    return None


def snapshot(pid: int | None = None, proc: Path = PROC) -> Snapshot:
    return Snapshot(
        time.monotonic(), read_host(proc), None if pid is None else read_thread(pid, proc)
    )


def delta(before: Snapshot, after: Snapshot) -> dict:
    """The level's counters (module docstring), rounded; None for any the snapshots lack."""
    wall = after.t - before.t
    out: dict = {"wall_s": round(wall, 3), "steal_pct": None, "busy_pct": None}
    a, b = before.host, after.host
    if a is not None and b is not None and b.total > a.total:
        total = b.total - a.total
        out["steal_pct"] = round(100.0 * (b.steal - a.steal) / total, 2)
        out["busy_pct"] = round(100.0 * (total - (b.idle - a.idle)) / total, 2)
    out |= dict.fromkeys(THREAD_FIELDS)
    x, y = before.thread, after.thread
    if x is None or y is None or wall <= 0:
        return out
    out["on_cpu_pct"] = round(100.0 * (y.on_cpu_ns - x.on_cpu_ns) / 1e9 / wall, 2)
    out["run_delay_pct"] = round(100.0 * (y.run_delay_ns - x.run_delay_ns) / 1e9 / wall, 2)
    out["voluntary_per_s"] = round((y.voluntary - x.voluntary) / wall, 1)
    out["nonvoluntary_per_s"] = round((y.nonvoluntary - x.nonvoluntary) / wall, 1)
    if x.migrations is not None and y.migrations is not None:
        out["migrations"] = y.migrations - x.migrations
    out["last_cpu"] = y.last_cpu
    return out
