"""``sglang-spec serve CONFIG``: start an SGLang server from a ``server_configs/`` YAML file.

Builds ``python -m sglang.launch_server <config args> --host H --port P [extra args]``, starts it in its
own process group with its output in a log file, waits for ``GET /health`` (progress indicator,
timeout), prints the log tail if the server dies or never becomes healthy, and on Ctrl-C (or SIGTERM)
stops the whole process group: SIGINT, then SIGTERM, then SIGKILL after ``--stop-timeout``.

``--dry-run`` only prints the command. ``--then CMD`` runs a command once the server is healthy (for
example a load-test sweep) and stops the server when it finishes. Extra SGLang flags go after ``--``.

Only the standard library is used here (plus PyYAML to read the config), so neither SGLang nor torch
is imported in this process.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from sglang_spec.cli_args import (
    Parser,
    fail,
    nonempty,
    nonneg_int,
    output_file,
    port,
    positive_float,
    usage_error,
)
from sglang_spec.serving.configs import ConfigError, list_configs, load_config

PROG = "sglang-spec serve"

DEFAULT_LAUNCHER = "{python} -m sglang.launch_server"
_SPINNER = "|/-\\"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # One REMAINDER positional for CONFIG and what follows it: a positional of its own would
    # swallow a "--" right after CONFIG (argparse), and `serve CFG -- --flag` would then read
    # --flag as ours. run() splits it into args.config and args.extra.
    parser.usage = "%(prog)s [options] [CONFIG [options] [-- SGLANG_FLAGS ...]]"
    parser.add_argument(
        "config",
        nargs=argparse.REMAINDER,
        metavar="CONFIG [options] [-- SGLANG_FLAGS ...]",
        help="a config name in server_configs/ (e.g. qwen3-8b-dflash) or a YAML path; "
        "then our options, then '--' and extra flags appended to the SGLang command",
    )
    _add_options(parser)


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--list", action="store_true", help="list the known configs and exit")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the command (and environment) and exit"
    )
    parser.add_argument(
        "--host", type=nonempty, default="127.0.0.1", help="bind address passed to SGLang"
    )
    parser.add_argument("--port", type=port, default=30000, help="port passed to SGLang")
    parser.add_argument(
        "--timeout", type=positive_float, default=1800.0, help="seconds to wait for /health"
    )
    parser.add_argument(
        "--stop-timeout",
        type=positive_float,
        default=30.0,
        help="grace seconds per stop signal",
    )
    parser.add_argument(
        "--log-file",
        type=output_file,
        default=None,
        help="server log (default: serve_logs/<name>-<time>.log)",
    )
    parser.add_argument(
        "--log-tail", type=nonneg_int, default=80, help="log lines shown on failure"
    )
    parser.add_argument("--follow", action="store_true", help="echo the server log while it runs")
    parser.add_argument(
        "--then",
        type=nonempty,
        default=None,
        metavar="CMD",
        help="once healthy, run CMD (bash -c; $SGLANG_URL is set), then stop the server; exit with its code",
    )
    parser.add_argument(
        "--launcher",
        type=nonempty,
        default=DEFAULT_LAUNCHER,
        help="command prefix ({python} = this interpreter)",
    )


def build_command(
    cfg, host: str, port: int, extra: list[str] | None = None, launcher: str = DEFAULT_LAUNCHER
) -> list[str]:
    prefix = [part.replace("{python}", sys.executable) for part in shlex.split(launcher)]
    return [*prefix, *cfg.argv(), "--host", host, "--port", str(port), *(extra or [])]


def format_command(cmd: list[str], env: dict[str, str]) -> str:
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    body = " \\\n    ".join(_pairs(cmd))
    return f"{env_part} {body}" if env_part else body


def _pairs(cmd: list[str]) -> list[str]:
    """Group ``--flag value`` pairs for a readable multi-line command."""
    out: list[str] = []
    i = 0
    head = []
    while i < len(cmd) and not cmd[i].startswith("--"):
        head.append(shlex.quote(cmd[i]))
        i += 1
    out.append(" ".join(head))
    while i < len(cmd):
        group = [shlex.quote(cmd[i])]
        i += 1
        while i < len(cmd) and not cmd[i].startswith("--"):
            group.append(shlex.quote(cmd[i]))
            i += 1
        out.append(" ".join(group))
    return out


def _split_extra(args: argparse.Namespace) -> list[str]:
    """Everything after CONFIG arrives in ``args.extra``: our own options up to ``--``, SGLang flags after it.

    Our options given after CONFIG are parsed here (and update ``args``), so ``serve CFG --dry-run`` works;
    anything that is not ours must come after ``--``.
    """
    extra = list(args.extra or [])
    if "--" in extra:
        cut = extra.index("--")
        ours, theirs = extra[:cut], extra[cut + 1 :]
    else:
        ours, theirs = extra, []
    if ours:
        p = Parser(prog=f"{PROG} CONFIG", epilog="SGLang flags go after '--'.")
        _add_options(p)
        p.parse_args(ours, namespace=args)  # keeps what was set before CONFIG unless given again
    return theirs


def _probe_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((_probe_host(host), port)) == 0


_DIRECT = urllib.request.build_opener(
    urllib.request.ProxyHandler({})
)  # never route loopback via *_proxy


def health_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with _DIRECT.open(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tail(path: Path, n: int) -> list[str]:
    try:
        with open(path, errors="replace") as f:
            return list(deque(f, maxlen=n))
    except OSError:
        return []


class _Stop(Exception):
    """Raised from the SIGTERM handler so that SIGTERM is handled like Ctrl-C."""


def ignores_signal(pid: int, sig: int) -> bool:
    """Whether process ``pid`` ignores ``sig`` (Linux ``/proc/<pid>/status`` SigIgn; False where
    it cannot tell). A server started from a background job of a non-interactive shell ignores
    SIGINT, and so does everything it starts."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) >> (int(sig) - 1) & 1)
    return False


def stop_process_group(proc: subprocess.Popen, grace: float, out=sys.stderr) -> int | None:
    """SIGINT (unless the server ignores it), then SIGTERM, then SIGKILL to the server's process
    group; each waits up to ``grace`` s."""
    if proc.poll() is not None:
        return proc.returncode
    first = () if ignores_signal(proc.pid, signal.SIGINT) else (signal.SIGINT,)
    for sig in (*first, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=grace if sig != signal.SIGKILL else 10)
            break
        except subprocess.TimeoutExpired:
            print(
                f"[serve] server still running after {signal.Signals(sig).name}; escalating",
                file=out,
            )
    # Children that ignored the leader's exit (e.g. scheduler subprocesses) share the group.
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return proc.returncode


def _progress(msg: str, tty: bool, state: dict) -> None:
    now = time.monotonic()
    if tty:
        sys.stderr.write("\r\033[K" + msg[:160])
        sys.stderr.flush()
    elif now - state.get("last", 0.0) >= 10.0:
        print(msg, file=sys.stderr, flush=True)
        state["last"] = now


def _print_tail(log: Path, n: int) -> None:
    lines = tail(log, n)
    print(f"[serve] ---- last {len(lines)} lines of {log} ----", file=sys.stderr)
    for line in lines:
        sys.stderr.write(line if line.endswith("\n") else line + "\n")
    print("[serve] ---- end of log ----", file=sys.stderr, flush=True)


class _Follower:
    def __init__(self, path: Path):
        self.path, self.pos = path, 0

    def pump(self) -> None:
        try:
            with open(self.path, errors="replace") as f:
                f.seek(self.pos)
                chunk = f.read(1 << 20)
                self.pos = f.tell()
        except OSError:
            return
        if chunk:
            sys.stdout.write(chunk)
            sys.stdout.flush()


def _list() -> int:
    for p in list_configs():
        print(p.stem)
    return 0


def run(args: argparse.Namespace) -> int:
    rest = list(args.config or [])
    args.config, args.extra = (rest[0], rest[1:]) if rest else (None, [])
    if args.list:
        return _list()
    if not args.config:
        return fail(PROG, "a CONFIG is required (--list shows them)")
    try:
        cfg = load_config(args.config)
    except ConfigError as e:
        return fail(PROG, f"argument CONFIG: {e}")
    try:
        extra = _split_extra(args)
    except SystemExit as e:  # argparse error (2) or --help (0) in the options after CONFIG
        return 2 if e.code is None else int(e.code)
    if args.list:  # given after CONFIG
        return _list()
    cmd = build_command(cfg, args.host, args.port, extra, args.launcher)
    if args.dry_run:
        print(format_command(cmd, cfg.env))
        return 0
    if shutil.which(cmd[0]) is None:
        return usage_error(
            PROG,
            "--launcher",
            args.launcher,
            "a command prefix whose program exists on this machine",
        )

    if port_in_use(args.host, args.port):
        return usage_error(
            PROG, "--port", args.port, "a free port (this one is already in use: stop that server)"
        )

    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_path = Path(args.log_file or f"serve_logs/{cfg.name}-{stamp}.log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    url = f"http://{_probe_host(args.host)}:{args.port}"
    env = {**os.environ, **cfg.env}

    print(f"[serve] {cfg.name} ({cfg.algorithm}, {cfg.model})", file=sys.stderr)
    print(f"[serve] command: {shlex.join(cmd)}", file=sys.stderr)
    print(f"[serve] log: {log_path}", file=sys.stderr, flush=True)

    old_term = signal.getsignal(signal.SIGTERM)

    def _on_term(signum, frame):  # noqa: ARG001
        raise _Stop()

    signal.signal(signal.SIGTERM, _on_term)
    log_f = open(log_path, "ab")
    proc = None
    follower = _Follower(log_path) if args.follow else None
    try:
        proc = subprocess.Popen(
            cmd,
            stdout=log_f,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        print(f"[serve] pid {proc.pid}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        deadline = t0 + args.timeout
        tty = sys.stderr.isatty()
        state: dict = {}
        i = 0
        ready = False
        while time.monotonic() < deadline:  # bounded by --timeout
            if proc.poll() is not None:
                break
            if health_ok(url + "/health"):
                ready = True
                break
            if follower:
                follower.pump()
            last = (tail(log_path, 1) or [""])[0].strip()
            _progress(
                f"[serve] waiting for {url}/health {_SPINNER[i % 4]} {time.monotonic() - t0:5.0f}s  {last}",
                tty,
                state,
            )
            i += 1
            time.sleep(0.5)
        if tty:
            sys.stderr.write("\n")
        if not ready:
            if proc.poll() is not None:
                print(
                    f"[serve] server exited with code {proc.returncode} before becoming healthy",
                    file=sys.stderr,
                )
            else:
                print(
                    f"[serve] /health not ready after {args.timeout:.0f}s; stopping the server",
                    file=sys.stderr,
                )
                stop_process_group(proc, args.stop_timeout)
            _print_tail(log_path, args.log_tail)
            return 1

        print(f"[serve] ready: {url} ({time.monotonic() - t0:.1f}s)", file=sys.stderr, flush=True)
        print(f"READY {url}", flush=True)
        if args.then:
            then_env = {**os.environ, "SGLANG_URL": url}
            print(f"[serve] running: {args.then}", file=sys.stderr, flush=True)
            rc = subprocess.call(["bash", "-c", args.then], env=then_env)
            print(
                f"[serve] --then exited with {rc}; stopping the server", file=sys.stderr, flush=True
            )
            return rc
        while proc.poll() is None:  # until Ctrl-C / SIGTERM or the server exits
            if follower:
                follower.pump()
            time.sleep(0.5)
        print(f"[serve] server exited with code {proc.returncode}", file=sys.stderr)
        _print_tail(log_path, args.log_tail)
        return 1
    except (KeyboardInterrupt, _Stop):
        print("\n[serve] interrupted; stopping the server", file=sys.stderr, flush=True)
        return 130
    finally:
        if proc is not None:
            rc = stop_process_group(proc, args.stop_timeout)
            print(f"[serve] server stopped (exit {rc})", file=sys.stderr, flush=True)
        log_f.close()
        signal.signal(signal.SIGTERM, old_term)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
