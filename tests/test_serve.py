"""``sglang-spec serve``: dry run, health wait, failure log, timeout, Ctrl-C and --then.

SGLang itself is replaced by a small fake launcher (``--launcher``) that serves ``/health`` on 127.0.0.1
and spawns a child process, like SGLang's scheduler subprocesses, so that stopping the whole process
group can be checked.
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sglang_spec.cli_args import Parser
from sglang_spec.serving import launch

REPO = Path(__file__).resolve().parents[1]
CONFIG = "qwen3-8b-dflash"

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, subprocess, sys, time
    argv = sys.argv[1:]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    print("fake sglang starting with", " ".join(argv), flush=True)
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("RuntimeError: boom: CUDA out of memory", flush=True)
        child.kill()
        sys.exit(3)
    if mode == "hang":
        time.sleep(120)
    time.sleep(float(os.environ.get("FAKE_DELAY", "0.5")))

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
        def log_message(self, *a):
            pass

    http.server.HTTPServer((host, port), H).serve_forever()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/status").read_text()
            if "\nState:\tZ" in state:
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_sglang.py"
    script.write_text(FAKE_SERVER)
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    port = _free_port()
    base = [
        CONFIG,
        "--launcher",
        f"{{python}} {script}",
        "--port",
        str(port),
        "--log-file",
        str(tmp_path / "server.log"),
        "--stop-timeout",
        "5",
    ]
    return {"base": base, "pids": pids, "port": port, "log": tmp_path / "server.log"}


def _pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()]


def test_dry_run_prints_the_full_command(capsys):
    assert launch.main([CONFIG, "--dry-run", "--port", "31001", "--", "--disable-cuda-graph"]) == 0
    out = capsys.readouterr().out
    assert "-m sglang.launch_server" in out
    for piece in (
        "--model-path Qwen/Qwen3-8B",
        "--speculative-algorithm DFLASH",
        "--speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16",
        "--speculative-dflash-block-size 16",
        "--host 127.0.0.1",
        "--port 31001",
        "--disable-cuda-graph",
    ):
        assert piece in out, piece
    assert out.index("--port 31001") < out.index("--disable-cuda-graph")


def test_unknown_config_and_stray_flag_are_usage_errors(capsys):
    assert launch.main(["no-such-config"]) == 2
    assert "qwen3-8b-ar" in capsys.readouterr().err  # lists the known configs
    assert launch.main([CONFIG, "--not-an-option"]) == 2


def _parse(argv):
    parser = Parser(prog=launch.PROG)
    launch.add_arguments(parser)
    return parser.parse_args(argv)


def _dry_run(capsys, *argv):
    assert launch.main(list(argv)) == 0
    return capsys.readouterr().out


def test_every_option_has_its_documented_default():
    assert vars(_parse([CONFIG, "--x"])) == {
        "config": [CONFIG, "--x"],  # CONFIG and all after it: run() splits them
        "list": False,
        "dry_run": False,
        "host": "127.0.0.1",
        "port": 30000,
        "timeout": 1800.0,
        "stop_timeout": 30.0,
        "log_file": None,
        "log_tail": 80,
        "follow": False,
        "then": None,
        "launcher": "{python} -m sglang.launch_server",
    }
    assert _parse([]).config == []  # --list needs no CONFIG


def test_options_after_config_keep_the_options_before_it(capsys):
    """``serve --port P --host H CFG --dry-run``: an option after CONFIG must not reset the ones
    given before it to their defaults (it did: the port and host fell back to 30000 and
    127.0.0.1)."""
    args = _parse(["--port", "31001", "--host", "0.0.0.0", "--dry-run"])
    args.extra = ["--timeout", "5"]
    assert launch._split_extra(args) == []
    assert (args.port, args.host, args.dry_run, args.timeout) == (31001, "0.0.0.0", True, 5.0)
    assert (args.stop_timeout, args.log_tail, args.follow) == (30.0, 80, False)
    out = _dry_run(capsys, "--port", "31001", "--host", "0.0.0.0", CONFIG, "--dry-run")
    assert out.endswith("--host 0.0.0.0 \\\n    --port 31001\n")
    out = _dry_run(capsys, "--port", "31001", CONFIG, "--dry-run", "--port", "31002")
    assert out.endswith("--port 31002\n")  # given again after CONFIG: the later one


def test_flags_after_double_dash_go_to_sglang_even_right_after_config(capsys):
    """``serve CFG -- --flag`` (the form server_configs/README.md shows) passes --flag to SGLang;
    it was refused as an unknown option of ours, and ``serve CFG -- --dry-run`` dry-ran."""
    out = _dry_run(capsys, "--dry-run", CONFIG, "--", "--disable-cuda-graph", "--port", "1")
    assert out.endswith("--port 30000 \\\n    --disable-cuda-graph \\\n    --port 1\n")


def test_split_extra_cuts_at_the_first_double_dash():
    args = _parse([])
    args.extra = ["--port", "31002", "--", "--tp", "2", "--", "--dry-run"]
    assert launch._split_extra(args) == ["--tp", "2", "--", "--dry-run"]
    assert args.port == 31002 and args.dry_run is False  # SGLang's, after the first "--"
    args = _parse([])
    args.extra = ["--", "--port", "1"]
    assert launch._split_extra(args) == ["--port", "1"] and args.port == 30000
    args = _parse([])
    args.extra = ["--dry-run", "--follow"]
    assert launch._split_extra(args) == [] and args.dry_run and args.follow
    args.extra = []
    assert launch._split_extra(args) == []
    assert launch._split_extra(argparse.Namespace(extra=None)) == []


def test_an_option_after_config_is_refused_by_the_config_parser(capsys):
    assert launch.main([CONFIG, "--tp", "2"]) == 2
    assert capsys.readouterr().err == (
        "sglang-spec serve CONFIG: error: unrecognized arguments: --tp 2 (see --help)\n"
    )
    assert launch.main([CONFIG, "--port", "0", "--", "--tp", "2"]) == 2
    assert capsys.readouterr().err == (
        "sglang-spec serve CONFIG: error: argument --port: got '0'; valid: an integer from 1 to "
        "65535 (see --help)\n"
    )


def test_help_after_config_exits_0_and_says_where_sglang_flags_go(capsys):
    """It exited 2, as if the help were an error."""
    assert launch.main([CONFIG, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: sglang-spec serve CONFIG [-h]")
    assert out.rstrip().endswith("SGLang flags go after '--'.")


def test_then_runs_after_health_and_stops_the_server(fake, capsys):
    probe = f"{sys.executable} -c \"import os,urllib.request as u; print('health', u.urlopen(os.environ['SGLANG_URL'] + '/health').status)\""
    rc = launch.main([*fake["base"], "--then", probe, "--timeout", "30"])
    assert rc == 0
    captured = capsys.readouterr()
    assert f"READY http://127.0.0.1:{fake['port']}" in captured.out
    server, child = _pids(fake["pids"])
    assert _gone(server) and _gone(child)
    assert "fake sglang starting with" in fake["log"].read_text()
    assert f"--port {fake['port']}" in fake["log"].read_text()


def test_crash_before_health_prints_the_log_tail(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "crash")
    assert launch.main([*fake["base"], "--timeout", "30"]) == 1
    err = capsys.readouterr().err
    assert "exited with code 3" in err
    assert "boom: CUDA out of memory" in err


def test_health_timeout_stops_the_server(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "hang")
    assert launch.main([*fake["base"], "--timeout", "2"]) == 1
    assert "not ready after" in capsys.readouterr().err
    server, child = _pids(fake["pids"])
    assert _gone(server) and _gone(child)


def test_busy_port_is_refused(fake, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", fake["port"]))
        s.listen()
        assert launch.main([*fake["base"], "--timeout", "5"]) == 2
    assert "already in use" in capsys.readouterr().err
    assert not fake["pids"].exists()  # nothing was started


def test_ctrl_c_stops_the_process_group(fake):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_spec.serving.launch", *fake["base"], "--timeout", "30"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        line = proc.stdout.readline()  # blocks until READY (bounded by --timeout) or exit
        assert line.startswith("READY http://127.0.0.1:"), line + proc.stderr.read()
        server, child = _pids(fake["pids"])
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 130
    assert "server stopped" in proc.stderr.read()
    assert _gone(server) and _gone(child)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
def test_a_server_that_ignores_sigint_is_stopped_without_waiting_out_the_grace():
    """A server started from a background job of a non-interactive shell ignores SIGINT (and so
    do the fake servers of a suite run with `&`): the stop goes straight to SIGTERM instead of
    waiting ``grace`` seconds for a SIGINT that never lands."""
    code = "import sys, time; print('up', flush=True); time.sleep(120)"

    def start(ignore_sigint):
        def pre():
            signal.signal(signal.SIGINT, signal.SIG_IGN if ignore_sigint else signal.SIG_DFL)

        proc = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=pre,
        )
        assert proc.stdout.readline() == "up\n"
        return proc

    for ignore_sigint in (True, False):
        proc = start(ignore_sigint)
        try:
            assert launch.ignores_signal(proc.pid, signal.SIGINT) is ignore_sigint
            assert launch.ignores_signal(proc.pid, signal.SIGTERM) is False
            out = io.StringIO()
            t0 = time.monotonic()
            launch.stop_process_group(proc, grace=20, out=out)
            assert time.monotonic() - t0 < 5 and proc.poll() is not None
            assert "escalating" not in out.getvalue()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert launch.ignores_signal(2**22, signal.SIGINT) is False  # no such process
