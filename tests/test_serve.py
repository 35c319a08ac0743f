"""``sglang-spec serve``: dry run, health wait, failure log, timeout, Ctrl-C and --then.

SGLang itself is replaced by a small fake launcher (``--launcher``) that serves ``/health`` on 127.0.0.1
and spawns a child process, like SGLang's scheduler subprocesses, so that stopping the whole process
group can be checked.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import io
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from sglang_spec.cli_args import Parser
from sglang_spec.serving import launch
from sglang_spec.serving.configs import list_configs, load_config

REPO = Path(__file__).resolve().parents[1]
# the launcher's stop reads /proc/<pid>/status (does the server ignore SIGINT?), and so do these
# tests' checks that a process is gone: Linux only (CI and the dev box are Linux)
needs_proc = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads /proc (Linux)"
)
CONFIG = "qwen3-8b-dflash"

FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, subprocess, sys, time
    # a server dies on SIGINT, also when the suite runs from a background job (`&`), whose children
    # inherit SIGINT ignored; FAKE_SIGINT=handle: it outlives SIGINT (handled, not ignored)
    if os.environ.get("FAKE_SIGINT") == "handle":
        signal.signal(signal.SIGINT, lambda *a: None)
    else:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    argv = sys.argv[1:]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with open(os.environ["FAKE_PIDS"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    print("fake sglang starting with", " ".join(argv), flush=True)
    print("config env:", os.environ.get("SERVE_TEST_ENV"), flush=True)
    mode = os.environ.get("FAKE_MODE", "ok")
    if mode == "crash":
        print("RuntimeError: boom: CUDA out of memory", file=sys.stderr, flush=True)
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

    server = http.server.HTTPServer((host, port), H)
    if mode == "exit":  # healthy once, then gone
        server.handle_request()
        sys.exit(5)
    server.serve_forever()
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
    return {
        "base": base,
        "pids": pids,
        "port": port,
        "log": tmp_path / "server.log",
        "script": script,
    }


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


def test_printed_command_is_what_a_shell_runs():
    """The --dry-run output, copied into a shell, runs exactly the command: environment first,
    each flag with its values on a line, everything quoted."""
    cmd = ["/opt/my python/bin/python", "-m", "sglang.launch_server", "--model-path", "Q/Q3"]
    cmd += ["--json", '{"a": 1}', "--flag", "--list", "x", "y z", "--port", "30000"]
    text = launch.format_command(cmd, {"A": "1", "B": "x y"})
    assert text == (
        "A=1 B='x y' '/opt/my python/bin/python' -m sglang.launch_server \\\n"
        "    --model-path Q/Q3 \\\n"
        "    --json '{\"a\": 1}' \\\n"
        "    --flag \\\n"
        "    --list x 'y z' \\\n"
        "    --port 30000"
    )
    assert shlex.split(text.replace("\\\n", "")) == ["A=1", "B=x y", *cmd]
    assert launch.format_command(["python3", "-V"], {}) == "python3 -V"  # no flags, no env
    assert launch.format_command(["python3", "--x"], {}) == "python3 \\\n    --x"


def test_build_command_puts_config_host_port_then_extra():
    cfg = load_config(CONFIG)
    cmd = launch.build_command(cfg, "::", 31003, ["--tp", "2"], "env 'A B=1' {python}/x -m s")
    assert cmd == [
        "env", "A B=1", f"{sys.executable}/x", "-m", "s",
        *cfg.argv(), "--host", "::", "--port", "31003", "--tp", "2",
    ]  # fmt: skip
    assert launch.build_command(cfg, "h", 1)[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert launch.build_command(cfg, "h", 1)[-4:] == ["--host", "h", "--port", "1"]


@pytest.mark.parametrize(
    ("host", "probe"),
    [("0.0.0.0", "127.0.0.1"), ("", "127.0.0.1"), ("::", "127.0.0.1"), ("127.0.0.1", "127.0.0.1")]
    + [("localhost", "localhost"), ("10.1.2.3", "10.1.2.3"), ("::1", "::1")],
)
def test_a_wildcard_bind_address_is_probed_on_loopback(host, probe):
    assert launch._probe_host(host) == probe


def test_port_in_use_probes_loopback_for_a_wildcard_host():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        busy = s.getsockname()[1]
        assert launch.port_in_use("127.0.0.1", busy) and launch.port_in_use("0.0.0.0", busy)
    assert not launch.port_in_use("127.0.0.1", _free_port())


def test_list_prints_every_config_name(capsys):
    assert launch.main(["--list"]) == 0
    assert capsys.readouterr().out.split() == [p.stem for p in list_configs()]


def test_list_after_config_lists_instead_of_starting_the_server(capsys, monkeypatch):
    """`serve CFG --list` is the same request as `serve --list` (session 15's review found the
    option parsed after CONFIG, ignored, and the server started)."""

    def refuse(*_args, **_kwargs):
        raise AssertionError("a server was started")

    monkeypatch.setattr(launch.subprocess, "Popen", refuse)
    assert launch.main(["qwen3-8b-ar", "--list"]) == 0
    assert capsys.readouterr().out.split() == [p.stem for p in list_configs()]


def test_no_config_is_a_usage_error(capsys):
    assert launch.main([]) == 2
    assert capsys.readouterr().err == (
        "sglang-spec serve: error: a CONFIG is required (--list shows them) (see --help)\n"
    )


def test_tail_reads_the_last_lines_of_any_bytes(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"one\ntwo\n\xff three\nfour")
    assert launch.tail(log, 2) == ["\ufffd three\n", "four"]
    assert launch.tail(log, 0) == []
    assert launch.tail(tmp_path / "missing", 5) == []


def test_print_tail_frames_the_last_lines(tmp_path, capsys):
    log = tmp_path / "log"
    log.write_text("a\nb\nc")
    launch._print_tail(log, 2)
    assert capsys.readouterr().err == (
        f"[serve] ---- last 2 lines of {log} ----\nb\nc\n[serve] ---- end of log ----\n"
    )


def test_follower_echoes_only_what_was_added(tmp_path, capsys):
    log = tmp_path / "log"
    follower = launch._Follower(log)
    follower.pump()  # no file yet
    log.write_bytes(b"first \xff\n")
    follower.pump()
    with open(log, "a") as f:
        f.write("second\n")
    follower.pump()
    assert capsys.readouterr().out == "first \ufffd\nsecond\n"


def test_progress_rewrites_a_tty_line_and_prints_a_pipe_every_10_s(monkeypatch, capsys):
    clock = iter([10.0, 15.0, 20.0, 50.0])
    monkeypatch.setattr(launch.time, "monotonic", lambda: next(clock))
    state = {}
    for msg in ("a", "b", "c"):  # at 10 s (the first at once), 15 s and 20 s
        launch._progress(msg, False, state)
    assert capsys.readouterr().err == "a\nc\n" and state == {"last": 20.0}
    launch._progress("x" * 200, True, state)
    assert capsys.readouterr().err == "\r\033[K" + "x" * 160 and state == {"last": 20.0}


def test_help_names_the_command_and_says_what_it_does(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as e:
        launch.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "usage: sglang-spec serve [options] [CONFIG [options] [-- SGLANG_FLAGS ...]]\n\n"
        "``sglang-spec serve CONFIG``: start an SGLang server from a ``server_configs/`` YAML file.\n"
    )


def test_bad_config_and_option_errors_name_the_command(capsys):
    assert launch.main(["no-such-config"]) == 2
    assert capsys.readouterr().err.startswith(
        "sglang-spec serve: error: argument CONFIG: no server config 'no-such-config'; known: "
    )
    with pytest.raises(SystemExit):
        launch.main(["--port", "0", CONFIG])
    assert capsys.readouterr().err.startswith("sglang-spec serve: error: argument --port: ")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 503)
        self.end_headers()

    def log_message(self, *_args):
        pass


def test_health_ok_only_for_200_and_never_hangs():
    server = http.server.HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert launch.health_ok(url + "/health") is True
        assert launch.health_ok(url + "/other") is False  # 503
    finally:
        server.shutdown()
        server.server_close()
    assert launch.health_ok(f"http://127.0.0.1:{_free_port()}/health") is False  # refused
    assert launch.health_ok("not a url") is False
    with socket.socket() as mute:  # accepts the connection, never answers
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        result = []
        probe = threading.Thread(
            target=lambda: result.append(
                launch.health_ok(f"http://127.0.0.1:{mute.getsockname()[1]}/health", 0.2)
            ),
            daemon=True,
        )
        probe.start()
        probe.join(20)
        assert result == [False]  # gave up after its timeout


def test_ignores_signal_is_false_where_it_cannot_tell(monkeypatch):
    class NoSigIgn:
        def __init__(self, _path):
            pass

        def read_text(self):
            return "Name:\tx\nSigBlk:\t0000000000000002\n"

    monkeypatch.setattr(launch, "Path", NoSigIgn)
    assert launch.ignores_signal(1, signal.SIGINT) is False


@needs_proc
def test_stop_escalates_from_sigint_to_sigterm_to_sigkill():
    """A server that outlives SIGINT and SIGTERM (handled, not ignored) is killed after ``grace``
    seconds each; each escalation is reported, and the server's exit status returned."""
    code = (
        "import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: None); "
        "signal.signal(signal.SIGTERM, lambda *a: None); print('up', flush=True); time.sleep(120)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout.readline() == "up\n"
        out = io.StringIO()
        t0 = time.monotonic()
        assert launch.stop_process_group(proc, grace=0.2, out=out) == -signal.SIGKILL
        assert time.monotonic() - t0 < 5
        assert out.getvalue() == (
            "[serve] server still running after SIGINT; escalating\n"
            "[serve] server still running after SIGTERM; escalating\n"
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_then_runs_after_health_and_stops_the_server(fake, tmp_path, capfd):
    """The whole transcript of a --then run: what is printed where, the config's environment in
    the server, $SGLANG_URL in CMD, and --then's exit code as ours."""
    config = tmp_path / "with-env.yaml"
    text = (REPO / "server_configs" / f"{CONFIG}.yaml").read_text()
    config.write_text(text + "env:\n  SERVE_TEST_ENV: from the config\n")
    probe = f"{sys.executable} -c \"import os,urllib.request as u; print('health', u.urlopen(os.environ['SGLANG_URL'] + '/health').status)\"; exit 7"
    rc = launch.main([str(config), *fake["base"][1:], "--then", probe, "--timeout", "30"])
    assert rc == 7
    out, err = capfd.readouterr()
    url = f"http://127.0.0.1:{fake['port']}"
    assert out == f"READY {url}\nhealth 200\n"  # no server log on stdout without --follow
    server, child = _pids(fake["pids"])
    cmd = launch.build_command(
        load_config(config), "127.0.0.1", fake["port"], [], f"{{python}} {fake['script']}"
    )
    waiting = [line for line in err.splitlines() if line.startswith("[serve] waiting for ")]
    assert waiting[0].startswith(f"[serve] waiting for {url}/health |     0s  ")  # at once
    lines = [line for line in err.splitlines() if line not in waiting]
    assert lines[:4] == [
        "[serve] qwen3-8b-dflash (DFLASH, Qwen/Qwen3-8B)",
        f"[serve] command: {shlex.join(cmd)}",
        f"[serve] log: {fake['log']}",
        f"[serve] pid {server}",
    ]
    assert re.fullmatch(rf"\[serve\] ready: {url} \((\d+\.\d)s\)", lines[4])
    assert float(re.search(r"\((.*)s\)", lines[4])[1]) < 30  # seconds since start, not a clock
    assert lines[5:] == [
        f"[serve] running: {probe}",
        "[serve] --then exited with 7; stopping the server",
        "[serve] server stopped (exit -2)",  # SIGINT first
    ]
    assert _gone(server) and _gone(child)
    log = fake["log"].read_text()
    assert "fake sglang starting with" in log and f"--port {fake['port']}" in log
    assert "config env: from the config" in log


def test_crash_before_health_prints_the_log_tail(fake, tmp_path, monkeypatch, capsys):
    """The server's stderr goes to the log too; --log-tail lines of it are shown; the log's
    directories are created."""
    monkeypatch.setenv("FAKE_MODE", "crash")
    log = tmp_path / "a" / "b" / "server.log"
    argv = [*fake["base"], "--timeout", "30", "--log-file", str(log), "--log-tail", "1"]
    assert launch.main(argv) == 1
    err = capsys.readouterr().err
    assert err.endswith(
        "[serve] server exited with code 3 before becoming healthy\n"
        f"[serve] ---- last 1 lines of {log} ----\n"
        "RuntimeError: boom: CUDA out of memory\n"
        "[serve] ---- end of log ----\n"
        "[serve] server stopped (exit 3)\n"
    )


def test_default_log_file_is_named_by_config_and_start_time(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "crash")
    monkeypatch.chdir(tmp_path)
    base = [a for a in fake["base"] if a != str(fake["log"])]
    base.remove("--log-file")
    assert launch.main([*base, "--timeout", "30"]) == 1
    (log,) = (tmp_path / "serve_logs").iterdir()
    assert re.fullmatch(rf"{CONFIG}-20\d{{6}}-\d{{6}}\.log", log.name), log.name
    assert "boom" in log.read_text()


def test_health_timeout_stops_the_server(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "hang")
    assert launch.main([*fake["base"], "--timeout", "2"]) == 1
    out, err = capsys.readouterr()
    assert "[serve] /health not ready after 2s; stopping the server\n" in err
    assert out == ""  # the log is echoed with --follow only
    server, child = _pids(fake["pids"])
    assert _gone(server) and _gone(child)


@needs_proc
@pytest.mark.parametrize(
    "mode,extra,rc,said",
    [
        (
            "hang",
            ["--timeout", "2"],
            1,
            "[serve] /health not ready after 2s; stopping the server\n",
        ),
        ("ok", ["--timeout", "30", "--then", "true"], 0, "[serve] --then exited with 0"),
    ],
)
def test_run_stops_a_server_that_outlives_sigint_after_stop_timeout(
    fake, monkeypatch, mode, extra, rc, said
):
    """--stop-timeout reaches both stops of run (after a health timeout; after --then, in its
    finally): a server that handles SIGINT is sent SIGTERM --stop-timeout seconds after it, and
    serve returns (no grace would wait for ever). In a child process: run() installs signal
    handlers, which only the main thread may."""
    monkeypatch.setenv("FAKE_MODE", mode)
    monkeypatch.setenv("FAKE_SIGINT", "handle")
    argv = [*fake["base"], *extra, "--stop-timeout", "1"]
    code = "import sys; from sglang_spec.serving import launch; sys.exit(launch.main(sys.argv[1:]))"
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, *argv],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=40,
        )
        assert proc.returncode == rc and time.monotonic() - t0 < 35, proc.stderr
        assert said in proc.stderr
        assert "[serve] server still running after SIGINT; escalating\n" in proc.stderr
        assert "server still running after SIGTERM" not in proc.stderr  # SIGTERM was enough
        server, child = _pids(fake["pids"])
        assert _gone(server) and _gone(child)
    finally:
        for pid in _pids(fake["pids"]) if fake["pids"].exists() else ():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_waiting_shows_a_spinner_on_a_tty_and_follow_echoes_the_log(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    # 6 s for 5 frames about 0.5 s apart: slack for a loaded 2-core CI box
    assert launch.main([*fake["base"], "--timeout", "6", "--follow"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("fake sglang starting with")  # --follow
    url = f"http://127.0.0.1:{fake['port']}"
    frames = re.findall(
        rf"\r\033\[K\[serve\] waiting for {url}/health (.) +(\d+)s  ([^\r\n]*)", err
    )
    assert [f[0] for f in frames[:5]] == ["|", "/", "-", "\\", "|"]  # the 5th wraps around
    assert all(int(f[1]) <= 30 for f in frames)  # seconds since start
    assert frames[-1][2] == "config env: None"  # the log's last line
    assert "\n[serve] /health not ready after 6s" in err  # the spinner line is ended


def test_a_server_that_exits_after_becoming_healthy_is_reported(fake, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_MODE", "exit")
    assert launch.main([*fake["base"], "--timeout", "30", "--log-tail", "1"]) == 1
    out, err = capsys.readouterr()
    assert out == f"READY http://127.0.0.1:{fake['port']}\n"
    assert (
        "[serve] server exited with code 5\n"
        f"[serve] ---- last 1 lines of {fake['log']} ----\n"
        "config env: None\n"
        "[serve] ---- end of log ----\n"
    ) in err


def test_ctrl_c_in_process_returns_130(fake, monkeypatch, capsys):
    """Ctrl-C while the server runs: 130, the server stopped (SIGINT first)."""
    monkeypatch.setenv("FAKE_MODE", "hang")
    monkeypatch.setattr(launch, "health_ok", lambda _url: True)

    sleep = time.sleep

    def interrupt_once(_seconds):  # the first sleep is the wait loop's; later ones are the stop's
        monkeypatch.setattr(launch.time, "sleep", sleep)
        raise KeyboardInterrupt

    monkeypatch.setattr(launch.time, "sleep", interrupt_once)
    assert launch.main([*fake["base"], "--timeout", "30"]) == 130
    err = capsys.readouterr().err
    assert re.search(
        r"s\)\n\n\[serve\] interrupted; stopping the server\n\[serve\] server stopped \(exit -?\d+\)\n$",
        err,
    )


def test_busy_port_is_refused(fake, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", fake["port"]))
        s.listen()
        assert launch.main([*fake["base"], "--timeout", "5"]) == 2
    assert capsys.readouterr().err == (
        f"sglang-spec serve: error: argument --port: got '{fake['port']}'; valid: a free port "
        "(this one is already in use: stop that server) (see --help)\n"
    )
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
        # a suite started from a background job (`&`) ignores SIGINT, and so would the launcher
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
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


@needs_proc
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
            rc = launch.stop_process_group(proc, grace=20, out=out)
            assert time.monotonic() - t0 < 5 and proc.poll() is not None
            assert rc == (-signal.SIGTERM if ignore_sigint else -signal.SIGINT)
            assert "escalating" not in out.getvalue()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert launch.ignores_signal(2**22, signal.SIGINT) is False  # no such process
