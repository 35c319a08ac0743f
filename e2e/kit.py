"""What every GPU harness here shares: where SGLang comes from, the plugin, and one server's life.

- **Where SGLang runs.** Through ``shared/sglang-gpu-kit`` on the lent H200 (``source
  .gpu-kit/setup.sh`` exports ``SGLANG_KIT_FLAGS``, ``SGLANG_KIT_SPEC_FLAGS`` and
  ``SGLANG_KIT_PYTHON``), or a stock ``pip install ".[sglang]"`` on any GPU box (no such variables).
- **The plugin.** In the kit the checkout is pip-installed into the kit's site-packages (SGLang finds
  DDTREE by its entry point, which needs the dist-info); a stock install must already have it.
- **Server flags** come from ``server_configs/`` (:func:`config_for`), then the kit's flags, then the
  harness's own layer (paths of built models, CUDA graphs, dummy weights ...), merged as
  flag -> value mappings so a later layer replaces a value instead of repeating the flag
  (:func:`with_args`). The command is built by ``sglang_spec.serving.launch.build_command``.
- **One server** (:class:`Server`): refuses a busy port, starts SGLang in its own process group with
  its output in a log file, waits for ``/health``, and stops the whole group (the launcher's
  helpers), printing the log tail when it fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from sglang_spec.serving.configs import ServerConfig, load_config, resolve_config_path
from sglang_spec.serving.launch import (
    DEFAULT_LAUNCHER,
    build_command,
    health_ok,
    port_in_use,
    stop_process_group,
    tail,
)

REPO = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
SPECULATIVE = ("NEXTN", "EAGLE3", "DFLASH", "DDTREE")
# Loopback calls must never go through an *_proxy of the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class HarnessError(RuntimeError):
    """A bad request to a harness or an environment it cannot run in (one line, no traceback)."""


# ------------------------------------------------------------------------------------ environment
def in_kit() -> bool:
    """True after ``source .gpu-kit/setup.sh`` (the kit's SGLang copy, not a stock install)."""
    return "SGLANG_KIT_FLAGS" in os.environ


def sglang_site() -> Path:
    """The site-packages directory SGLang is imported from (found without importing SGLang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.origin:
        raise HarnessError(
            "SGLang is not importable: source .gpu-kit/setup.sh (lent H200) or "
            "pip install '.[sglang]' (GPU box)"
        )
    return Path(spec.origin).resolve().parents[1]


def _package_digest() -> str:
    """sha256 of what ``pip install .`` installs: ``sglang_spec/`` (paths and bytes) and
    ``pyproject.toml`` (entry points, package data)."""
    h = hashlib.sha256()
    files = [
        p for p in (REPO / "sglang_spec").rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    for path in sorted(files) + [REPO / "pyproject.toml"]:
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


@contextlib.contextmanager
def _site_lock(site: Path):
    """The kit site's install lock: harnesses side by side on one machine (one per GPU) install
    one at a time and never rewrite files a running server imports."""
    with open(site / ".sglang_spec.install-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def install_plugin() -> str:
    """Make SGLang see this checkout's DDTREE plugin; returns what was done.

    In the kit: ``pip install --upgrade --target <kit site> .`` (``--upgrade``: a warm machine keeps
    the previous call's copy, which plain ``--target`` would silently leave in place), unless the
    site already holds this checkout's package (a digest of ``sglang_spec/`` and ``pyproject.toml``
    stamped beside it), under :func:`_site_lock`. On a stock install the
    entry point must already be registered by ``pip install -e '.[sglang]'``.
    """
    if in_kit():
        site = sglang_site()
        digest = _package_digest()
        stamp = site / "sglang_spec.installed-digest"
        with _site_lock(site):
            if stamp.is_file() and stamp.read_text() == digest:
                return f"{REPO} already installed into {site}"
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--no-build-isolation",
                    "--upgrade",
                    "--target",
                    str(site),
                    str(REPO),
                ],
                check=True,
            )
            stamp.write_text(digest)
        return f"installed {REPO} into {site}"
    eps = importlib.metadata.entry_points(group="sglang.srt.plugins")
    if not any(ep.name == "ddtree" for ep in eps):
        raise HarnessError(
            "the DDTREE plugin is not installed for this Python: run pip install -e '.[sglang]' "
            "from the repository root"
        )
    return "plugin entry point already registered"


KIT_NORMS_MODULE = "sglang_spec_kit_norms"


def install_kit_norms() -> str:
    """Install :mod:`e2e.kit_norms` into the kit's site-packages as the SGLang plugin
    ``kit_norms`` (the file as module ``sglang_spec_kit_norms`` and a dist-info with its entry
    point), writing only what differs, under :func:`_site_lock`. Servers started with
    ``SGLANG_SPEC_KIT_NORMS=triton`` then run the stand-in's norms as one launch each; returns
    what was done. Outside the kit a one-line error: a stock SGLang runs sgl-kernel's fused norms."""
    if not in_kit():
        raise HarnessError(
            "fused-norms replaces the GPU kit's torch norms (its sgl_kernel stand-in); a stock "
            "SGLang install runs sgl-kernel's fused norms already: drop the option"
        )
    site = sglang_site()
    info = f"{KIT_NORMS_MODULE}-0.dist-info"
    files = {
        f"{KIT_NORMS_MODULE}.py": (REPO / "e2e" / "kit_norms.py").read_text(),
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: sglang-spec-kit-norms\nVersion: 0\n",
        f"{info}/entry_points.txt": (
            f"[sglang.srt.plugins]\nkit_norms = {KIT_NORMS_MODULE}:register\n"
        ),
    }
    with _site_lock(site):
        written = []
        for name, text in files.items():
            path = site / name
            if not path.is_file() or path.read_text() != text:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                written.append(name)
    if not written:
        return f"kit_norms already installed in {site}"
    return f"kit_norms installed in {site} ({', '.join(written)})"


def kit_norms_env() -> dict[str, str]:
    """The server environment that turns :mod:`e2e.kit_norms` on."""
    from e2e.kit_norms import ENV

    return {ENV: "triton"}


def require_kit_norms(srv: Server) -> None:
    """After a fused-norms server started: a HarnessError unless its log shows that the
    kit_norms plugin replaced the stand-in's norms (else its norms were the torch ones)."""
    from e2e.kit_norms import READY

    if READY not in srv.log_text():
        raise HarnessError(
            f"fused-norms: no {READY!r} line in the server log, so its norms are the stand-in's "
            "torch ones (the kit_norms plugin did not run)"
        )


def apply_patches() -> str:
    """``sglang-spec patch apply`` on the SGLang copy in use (idempotent); returns its report."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sglang_spec.cli",
            "patch",
            "apply",
            "--sglang-dir",
            str(sglang_site()),
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return out.stdout.strip()


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within: SIGTERM (``timeout``, a device call's limit) raises KeyboardInterrupt like Ctrl-C,
    so that ``with Server(...)`` stops its server instead of leaving it to answer the next call."""

    def handler(signum, frame):  # noqa: ARG001 (signal handler signature)
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


# ------------------------------------------------------------------------------------ server args
def parse_flags(argv: list[str]) -> dict:
    """``["--a", "1", "--b", "--c", "x", "y"]`` -> ``{"a": "1", "b": True, "c": ["x", "y"]}``."""
    out: dict = {}
    key = None
    for tok in argv:
        if tok.startswith("--"):
            key = tok[2:]
            out[key] = True
        elif key is None:
            raise HarnessError(f"flag list {argv!r} does not start with a --flag")
        elif out[key] is True:
            out[key] = tok
        else:
            out[key] = [*out[key], tok] if isinstance(out[key], list) else [out[key], tok]
    return out


def server_arg(text: str) -> tuple[str, object]:
    """argparse type of ``--server-arg``: ``FLAG=VALUE``, ``FLAG`` (bare) or ``FLAG=`` (drop it)."""
    name, eq, value = text.partition("=")
    if not name or name.startswith("-"):
        raise argparse.ArgumentTypeError(
            f"--server-arg {text!r}: valid: FLAG=VALUE, FLAG or FLAG= (no leading --)"
        )
    return name, (value or None) if eq else True


def kit_args(speculative: bool) -> dict:
    """The flags the kit requires (empty outside the kit); the draft flags only for speculation."""
    flags = os.environ.get("SGLANG_KIT_FLAGS", "").split()
    if speculative:
        flags += os.environ.get("SGLANG_KIT_SPEC_FLAGS", "").split()
    return parse_flags(flags)


def graph_args(max_bs: int) -> dict:
    """CUDA graphs for decode (and verify) batches up to ``max_bs``; 0 = eager. Prefill graphs
    stay off: the harnesses time decode steps, and capturing them cost the tiny pair's server 47 s
    of a 190 s start on the H200 (session 4)."""
    if max_bs <= 0:
        return {"disable-cuda-graph": True}
    # --cuda-graph-max-bs alone is ambiguous in 0.5.23 (the kit's README).
    return {
        "disable-cuda-graph": False,
        "cuda-graph-max-bs-decode": max_bs,
        "disable-prefill-cuda-graph": True,
    }


def config_for(prefix: str, algorithm: str) -> ServerConfig:
    """The server config ``<prefix><algorithm>`` (e.g. ``qwen3.6-27b-`` + ``dflash``).

    DDTREE configs of one model differ only in their budget, so ``ddtree`` falls back to the
    model's ``<prefix>ddtree-b<budget>`` file of the smallest budget (harnesses set the budget).
    """
    name = f"{prefix}{algorithm.lower()}"
    try:
        return load_config(name)
    except ValueError:
        if algorithm.lower() != "ddtree":
            raise
    folder = resolve_config_path(f"{prefix}ar").parent  # the model's AR config always exists
    stem = Path(name).name
    budgets = sorted(
        (int(m.group(1)), p)
        for p in folder.glob(f"{stem}-b*.yaml")
        if (m := re.fullmatch(rf"{re.escape(stem)}-b(\d+)", p.stem))
    )
    if not budgets:
        raise HarnessError(f"no DDTREE server config {name}.yaml or {name}-b<budget>.yaml")
    return load_config(budgets[0][1])


def with_args(cfg: ServerConfig, *layers: dict, env: dict | None = None) -> ServerConfig:
    """A copy of ``cfg`` whose args are ``cfg.args`` updated by each layer in turn (False drops a
    bare flag, e.g. the kit's ``disable-cuda-graph``), and whose environment adds ``env``."""
    args = dict(cfg.args)
    for layer in layers:
        args.update(layer)
    return dataclasses.replace(cfg, args=args, env={**cfg.env, **(env or {})})


def concurrency_list(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``, an argparse type (a one-line error for anything else)."""
    try:
        levels = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        levels = ()
    if not levels or min(levels) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: valid: positive integers, e.g. 1,2,4")
    return levels


def drafter_block_size(drafter_dir: str | Path) -> int:
    """``block_size`` of a DFlash drafter directory (top level or in ``dflash_config``)."""
    cfg = json.loads((Path(drafter_dir) / "config.json").read_text())
    block = cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size")
    if not block:
        raise HarnessError(f"{drafter_dir}/config.json has no block_size")
    return int(block)


# ------------------------------------------------------------------------------------ HTTP
def _request(url: str, body: dict | list | None) -> urllib.request.Request:
    return urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )


def call(url: str, body: dict | list | None = None, timeout: float = 10.0):
    """GET (no body) or POST JSON to a loopback server; the decoded JSON answer (None if empty), or
    the text of an answer that is not JSON (e.g. ``/metrics``)."""
    with _DIRECT.open(_request(url, body), timeout=timeout) as r:
        raw = r.read()
    try:
        return json.loads(raw) if raw.strip() else None
    except json.JSONDecodeError:
        return raw.decode(errors="replace")


def open_stream(url: str, body: dict, timeout: float = 300.0):
    """POST JSON to a loopback server and return the open response, to read line by line (a
    streaming ``/generate``); closing it ends the request from the client's side."""
    return _DIRECT.open(_request(url, body), timeout=timeout)


# ------------------------------------------------------------------------------------ server log
_SCHED_RE = re.compile(
    r"max_total_num_tokens=(\d+).*?max_running_requests=(\d+).*?context_len=(\d+)"
    r"(?:.*?available_gpu_mem=([\d.]+) GB)?"
)


def parse_server_log(text: str) -> dict:
    """What a server's log says about its capacity: the scheduler's ``max_running_requests`` (after
    any cap), ``max_total_num_tokens``, ``context_len``, available GPU memory, SGLang's lines
    about the GDN state memory ("Mamba Cache is allocated", "... is capped ..."), and DDTREE's
    budget-by-batch-size switches ("... bucket C runs budget B ...", with the tau behind each)."""
    out: dict = {
        "max_running_requests": None,
        "max_total_num_tokens": None,
        "context_len": None,
        "available_gpu_mem_gb": None,
        "mamba_cache_log": [],
        "capped_log": [],
        "budget_switch_log": [],
    }
    for line in text.splitlines():
        if m := _SCHED_RE.search(line):
            out["max_total_num_tokens"] = int(m.group(1))
            out["max_running_requests"] = int(m.group(2))
            out["context_len"] = int(m.group(3))
            if m.group(4):
                out["available_gpu_mem_gb"] = float(m.group(4))
        if "Mamba Cache is allocated" in line:
            out["mamba_cache_log"].append(line[line.index("Mamba Cache") :].strip())
        if "is capped" in line and "max_running_requests" in line:
            out["capped_log"].append(line[line.index("max_running_requests") :].strip())
        if "DDTREE budget by batch size: bucket" in line:
            out["budget_switch_log"].append(line[line.index("bucket") :].strip())
    return out


# ------------------------------------------------------------------------------------ one server
def group_pids(pgid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes of group ``pgid`` that still run (zombies do not count: they hold no GPU
    memory, and a container's PID 1 may never reap them). Linux ``/proc``; elsewhere none."""
    pids = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # the process ended while we looked
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:  # state, ppid, pgrp
            pids.append(int(stat.parent.name))
    return sorted(pids)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (:func:`group_pids`)."""
    return bool(group_pids(pgid))


def port_owners(port: int) -> set[int]:
    """The pids holding a listening TCP socket on ``port`` (Linux ``/proc``; empty where it cannot
    tell: no ``/proc``, or the sockets of other users' processes)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            f = row.split()  # sl, local address, remote address, state, ..., inode (field 9)
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{f[9]}]")
    pids = set()
    if not inodes:
        return pids
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                pids.add(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


SYSFS_CPU = Path("/sys/devices/system/cpu")


def _cpu_list(text: str) -> set[int]:
    """sysfs's CPU list syntax, ``0-3,8,10-11``, as a set of CPU numbers."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def physical_cores(
    sysfs: Path = SYSFS_CPU, cpus: frozenset[int] | None = None
) -> list[frozenset[int]]:
    """The logical CPUs ``cpus`` (default: this process's allowed ones) grouped by physical core (a
    core's hardware threads together, from sysfs's ``thread_siblings_list``; a CPU sysfs says
    nothing about is a core of its own), in the order of their lowest CPU."""
    allowed = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    cores: list[frozenset[int]] = []
    for cpu in allowed:
        try:
            siblings = (sysfs / f"cpu{cpu}/topology/thread_siblings_list").read_text()
            core = frozenset(_cpu_list(siblings))
        except (OSError, ValueError):
            core = frozenset({cpu})
        core &= frozenset(allowed)
        if core not in cores:
            cores.append(core)
    return cores


def cpu_blocks(n: int, sysfs: Path = SYSFS_CPU) -> list[frozenset[int]]:
    """``n`` disjoint sets of this process's allowed logical CPUs, each made of whole physical cores
    (a core's hardware threads together, from sysfs's ``thread_siblings_list``; a CPU sysfs says
    nothing about is a core of its own), the cores dealt out in order, as evenly as they go. For
    pinning servers that share a host (``e2e.tiny_pair --pin-cpus``): the tiny pair's step is the
    host's Python, and session 31 saw its period move 1.8x from one run of steps to the next."""
    cores = physical_cores(sysfs)
    if n < 1 or len(cores) < n:
        cpus = sorted(frozenset().union(*cores))
        raise HarnessError(
            f"{n} CPU blocks asked for, {len(cores)} physical cores allowed "
            f"(CPUs {cpus[0]}-{cpus[-1]}): give at most {len(cores)} blocks"
        )
    size, extra = divmod(len(cores), n)
    blocks, start = [], 0
    for i in range(n):
        stop = start + size + (i < extra)
        blocks.append(frozenset().union(*cores[start:stop]))
        start = stop
    return blocks


SCHEDULER_TITLE = "sglang::scheduler"  # what SGLang's scheduler sets as its title (setproctitle)


def group_titles(pgid: int, proc: Path = Path("/proc")) -> dict[int, str]:
    """{pid: title (argv[0], which setproctitle sets)} of group ``pgid``'s live processes."""
    titles = {}
    for pid in group_pids(pgid, proc):
        try:
            titles[pid] = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")[0].decode()
        except (OSError, UnicodeDecodeError):
            continue
    return titles


def _scheduler_in(titles: dict[int, str]) -> int | None:
    return next((p for p, t in sorted(titles.items()) if t.startswith(SCHEDULER_TITLE)), None)


def scheduler_pid(pgid: int, proc: Path = Path("/proc")) -> int | None:
    """The pid of server group ``pgid``'s scheduler process (titled ``sglang::scheduler``; the
    lowest pid, TP rank 0's, when there are several), whose main thread runs the decode loop;
    None when the group has none."""
    return _scheduler_in(group_titles(pgid, proc))


def move_group(
    pgid: int, cpus: frozenset[int], sysfs: Path = SYSFS_CPU, proc: Path = Path("/proc")
) -> int | None:
    """Every thread of server group ``pgid`` onto the block ``cpus``, then its scheduler onto the
    block's first core alone (:func:`pin_scheduler`, which returns): a running server moved to
    another block (``e2e.tiny_pair --rotate-cpus``)."""
    for pid in group_pids(pgid, proc):
        for task in (proc / str(pid) / "task").glob("[0-9]*"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), cpus)
    return pin_scheduler(pgid, cpus, sysfs, proc)


def pin_scheduler(
    pgid: int, cpus: frozenset[int], sysfs: Path = SYSFS_CPU, proc: Path = Path("/proc")
) -> int | None:
    """Within a server's block ``cpus``: every thread of its scheduler process (the one whose
    title starts with ``sglang::scheduler``: the decode loop, whose Python is the tiny pair's
    step) on the block's first physical core alone, every thread of the group's other processes
    (tokenizer, detokenizer, launcher) on the rest, so that none shares the scheduler's core.
    Returns the scheduler's pid; None (nothing moved) when the block is one core or the group has
    no scheduler."""
    cores = physical_cores(sysfs, cpus)  # not this process's CPUs: the harness has its own block
    if len(cores) < 2:
        return None
    own, rest = cores[0], frozenset().union(*cores[1:])
    titles = group_titles(pgid, proc)
    scheduler = _scheduler_in(titles)
    if scheduler is None:
        return None
    for pid in titles:
        for task in (proc / str(pid) / "task").glob("[0-9]*"):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(int(task.name), own if pid == scheduler else rest)
    return scheduler


MEMORY_SIZED = "Memory pool end"  # SGLang's log line once a server's memory pools are allocated


class ServerFailed(RuntimeError):
    """The server exited or never became healthy (``Server.tail()`` says why)."""


class Server:
    """One SGLang server from a (merged) config: ``with Server(cfg, log) as s: call(s.url + ...)``.

    ``start_s`` is the wall time from launch to a healthy ``/health``. ``launcher`` is the command
    prefix (``{python}`` = this interpreter), as for ``sglang-spec serve --launcher``. ``cpus``
    pins the server's whole process tree to those logical CPUs (:func:`cpu_blocks`), and once
    it is healthy its scheduler to the first physical core of them alone (:func:`pin_scheduler`).
    """

    def __init__(
        self,
        cfg: ServerConfig,
        log_path: str | Path,
        *,
        port: int = 30000,
        start_timeout: float = 300.0,
        stop_timeout: float = 30.0,
        launcher: str = DEFAULT_LAUNCHER,
        log_tail: int = 60,
        cpus: frozenset[int] | None = None,
    ):
        self.cfg, self.log_path, self.port, self.cpus = cfg, Path(log_path), port, cpus
        self.start_timeout, self.stop_timeout, self.log_tail = start_timeout, stop_timeout, log_tail
        self.cmd = build_command(cfg, HOST, port, launcher=launcher)
        self.url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None
        self._t0 = 0.0  # its launch (time.monotonic)
        self.scheduler_pid: int | None = None  # its decode loop's process (scheduler_pid)
        self.scheduler_pinned = False  # on a core of its own (pin_scheduler)

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> float:
        """Launch, then wait until healthy (the whole start; ``launch`` and ``wait_healthy``
        apart overlap several servers' starts: ``e2e.tiny_pair --interleave``)."""
        self.launch()
        return self.wait_healthy()

    def launch(self) -> None:
        if port_in_use(HOST, self.port):  # a server left there would answer for this one
            raise HarnessError(f"port {self.port} is already in use: stop that server first")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.cfg.env}
        self._t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=None if self.cpus is None else self._pin,
            )

    def wait_memory_sized(self) -> None:
        """Until the launched server has sized its memory pools (its log's ``MEMORY_SIZED`` line),
        has exited, is healthy, or ``start_timeout`` has passed since its launch: the next server
        on the GPU may start then. SGLang sizes a server's KV and GDN state pools from the GPU
        memory free when it starts loading and when it profiles, so two servers profiling at once
        would each count the other's memory as free; what a server allocates after its pools (CUDA
        graphs, some hundred MB) only shrinks the next one's pools by as much. A speculative
        server logs the line for its target's pools and, within the second, its drafter's; the
        next server imports SGLang for about 20 s before it measures anything."""
        try:
            while time.monotonic() - self._t0 < self.start_timeout and self.proc.poll() is None:
                if MEMORY_SIZED in self.log_text() or health_ok(self.url + "/health", timeout=1):
                    return
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise

    def wait_healthy(self) -> float:
        """Until the launched server answers ``/health`` (``start_s``: from its launch), then pin its
        scheduler; stops it and raises ``ServerFailed`` when it exits or outlasts ``start_timeout``."""
        try:  # whatever interrupts the wait (SIGTERM of a call's time limit) stops the server
            # A fresh server's first /health runs a generation that may JIT-compile kernels: 60 s.
            while time.monotonic() - self._t0 < self.start_timeout and self.proc.poll() is None:
                if health_ok(self.url + "/health", timeout=60):
                    self._check_listener_is_ours()
                    self.start_s = round(time.monotonic() - self._t0, 1)
                    self.scheduler_pid = scheduler_pid(self.proc.pid)
                    if self.cpus is not None:
                        pinned = pin_scheduler(self.proc.pid, self.cpus)
                        self.scheduler_pinned = pinned is not None
                    return self.start_s
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        why = (
            f"exited with code {self.proc.returncode}"
            if self.proc.poll() is not None
            else f"not healthy after {self.start_timeout:.0f} s"
        )
        self.stop()
        raise ServerFailed(f"{self.cfg.name} {why} (log: {self.log_path})")

    def _pin(self) -> None:
        """In the child before it runs the server: its processes inherit the affinity."""
        os.sched_setaffinity(0, self.cpus)

    def _check_listener_is_ours(self) -> None:
        """A server still loading when the port was checked (left by an interrupted run) may bind it
        first and answer ``/health`` for this one: refuse unless this server's process group holds
        the listening socket (skipped where /proc cannot tell)."""
        owners = port_owners(self.port)
        if owners and not any(_pgid(pid) == self.proc.pid for pid in owners):
            raise HarnessError(
                f"port {self.port} is answered by pid {sorted(owners)}, not by this server "
                f"(process group {self.proc.pid}): stop that server first"
            )

    def stop(self) -> None:
        """Stop the whole process group and wait (<= 30 s) until none of it is left, so that the
        next server finds the port and the GPU memory free."""
        if self.proc is None:
            return
        stop_process_group(self.proc, self.stop_timeout)
        deadline = time.monotonic() + 30
        while group_alive(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.proc = None

    def tail(self) -> str:
        return "".join(tail(self.log_path, self.log_tail))

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def http_error_text(e: Exception) -> str:
    """One line for a failed request (an HTTP error's body says why SGLang refused it)."""
    if isinstance(e, urllib.error.HTTPError):
        return f"HTTP {e.code}: {e.read()[:300].decode(errors='replace')}"
    return f"{type(e).__name__}: {e}"
