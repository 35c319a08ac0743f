"""Every user-facing command refuses a bad argument with one line, exit code 2, before loading anything.

Each case runs a command's ``main(argv)`` in-process with one bad value (zero, negative, huge, empty,
wrong type, missing file, unknown name) and checks: exit code 2, exactly one line on stderr that
names the flag and the value, and nothing heavy started -- loading a model, starting a server or
launching SGLang raises in these tests. Two cases run the console command in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import draft_block
from benchmarks import tree as bench_tree
from loadtests import compare, sweep
from sglang_spec import cli
from sglang_spec.cli_args import Parser
from sglang_spec.reference import tiny_pair

REPO = Path(__file__).resolve().parents[1]
RECORD = {"max_concurrency": 1, "output_throughput": 10.0, "label": "AR", "algorithm": "AR"}
REFERENCE = "sglang_spec.serving.reference_engine:make"


def _sg(*argv):
    return cli.main, list(argv)


# (id, entry point, argv, flag named in the error, value named in the error); "{tmp}" is a
# directory holding run.jsonl (one level record), empty.jsonl and a sub-directory adir/.
CASES = [
    # sglang-spec demo: the issue's list, then the other classes of input
    ("demo-max-new-tokens-0", *_sg("demo", "--max-new-tokens", "0"), "--max-new-tokens", "0"),
    ("demo-temperature-neg", *_sg("demo", "--temperature", "-1"), "--temperature", "-1"),
    ("demo-temperature-nan", *_sg("demo", "--temperature", "nan"), "--temperature", "nan"),
    ("demo-prompt-empty", *_sg("demo", "--prompt", ""), "--prompt", ""),
    ("demo-num-prompts-0", *_sg("demo", "--num-prompts", "0"), "--num-prompts", "0"),
    ("demo-num-prompts-huge", *_sg("demo", "--num-prompts", "1000"), "--num-prompts", "1000"),
    ("demo-threads-0", *_sg("demo", "--threads", "0"), "--threads", "0"),
    ("demo-threads-huge", *_sg("demo", "--threads", "100000"), "--threads", "100000"),
    ("demo-budget-huge", *_sg("demo", "--budget", "100000"), "--budget", "100000"),
    ("demo-budget-0", *_sg("demo", "--budget", "0"), "--budget", "0"),
    ("demo-budget-type", *_sg("demo", "--budget", "lots"), "--budget", "lots"),
    ("demo-max-new-huge", *_sg("demo", "--max-new-tokens", "100000"), "--max-new-tokens", "100000"),
    ("demo-top-p", *_sg("demo", "--top-p", "1.5"), "--top-p", "1.5"),
    ("demo-seed-neg", *_sg("demo", "--seed", "-1"), "--seed", "-1"),
    ("demo-methods-unknown", *_sg("demo", "--methods", "ar,eagle"), "--methods", "ar,eagle"),
    ("demo-methods-empty", *_sg("demo", "--methods", ","), "--methods", ","),
    ("demo-pair", *_sg("demo", "--pair", "llama"), "--pair", "llama"),
    ("demo-fixtures-missing", *_sg("demo", "--fixtures", "/no/such/dir"), "--fixtures", "/no/such/dir"),
    ("demo-fixtures-empty", *_sg("demo", "--fixtures", "{tmp}/adir"), "--fixtures", "adir"),
    # sglang-spec cpu-server
    ("cpu-engine-module", *_sg("cpu-server", "--engine", "nosuch.module:make"), "--engine", "nosuch.module:make"),
    ("cpu-engine-attr", *_sg("cpu-server", "--engine", "sglang_spec.serving.reference_engine:nope"), "--engine", "nope"),
    ("cpu-engine-form", *_sg("cpu-server", "--engine", "nosuch"), "--engine", "nosuch"),
    ("cpu-engine-empty", *_sg("cpu-server", "--engine", ""), "--engine", ""),
    ("cpu-method", *_sg("cpu-server", "--engine", REFERENCE, "--engine-arg", "method=foo"), "--engine-arg method", "foo"),
    ("cpu-budget-huge", *_sg("cpu-server", "--engine", REFERENCE, "--engine-arg", "budget=100000"), "--engine-arg budget", "100000"),
    ("cpu-pair", *_sg("cpu-server", "--engine", REFERENCE, "--engine-arg", "pair=llama"), "--engine-arg pair", "llama"),
    ("cpu-fixtures", *_sg("cpu-server", "--engine", REFERENCE, "--engine-arg", "fixtures=/no/dir"), "--engine-arg fixtures", "/no/dir"),
    ("cpu-toy-k-0", *_sg("cpu-server", "--engine-arg", "k=0"), "--engine-arg k", "0"),
    ("cpu-toy-step-neg", *_sg("cpu-server", "--engine-arg", "step_ms=-5"), "--engine-arg step_ms", "-5"),
    ("cpu-unknown-key", *_sg("cpu-server", "--engine-arg", "speed=9"), "--engine-arg", "speed"),
    ("cpu-engine-arg-form", *_sg("cpu-server", "--engine-arg", "k"), "--engine-arg", "k"),
    ("cpu-port-0", *_sg("cpu-server", "--port", "0"), "--port", "0"),
    ("cpu-port-huge", *_sg("cpu-server", "--port", "70000"), "--port", "70000"),
    ("cpu-max-running-0", *_sg("cpu-server", "--max-running-requests", "0"), "--max-running-requests", "0"),
    ("cpu-max-running-huge", *_sg("cpu-server", "--max-running-requests", "100000000"), "--max-running-requests", "100000000"),
    ("cpu-model-name-empty", *_sg("cpu-server", "--model-name", " "), "--model-name", " "),
    ("cpu-host-remote", *_sg("cpu-server", "--host", "10.11.12.13"), "--host", "10.11.12.13"),
    ("cpu-tokenizer-missing", *_sg("cpu-server", "--tokenizer", "{tmp}/adir"), "--tokenizer", "adir"),
    # sglang-spec serve
    ("serve-config", *_sg("serve", "no-such-config"), "CONFIG", "no-such-config"),
    ("serve-port-0", *_sg("serve", "--port", "0", "qwen3-8b-ar"), "--port", "0"),
    ("serve-port-after-config", *_sg("serve", "qwen3-8b-ar", "--port", "99999"), "--port", "99999"),
    ("serve-timeout-0", *_sg("serve", "--timeout", "0", "qwen3-8b-ar"), "--timeout", "0"),
    ("serve-stop-timeout-type", *_sg("serve", "--stop-timeout", "soon", "qwen3-8b-ar"), "--stop-timeout", "soon"),
    ("serve-log-tail-neg", *_sg("serve", "--log-tail", "-1", "qwen3-8b-ar"), "--log-tail", "-1"),
    ("serve-log-file-dir", *_sg("serve", "--log-file", "{tmp}/adir", "qwen3-8b-ar"), "--log-file", "adir"),
    ("serve-launcher-empty", *_sg("serve", "--launcher", "", "qwen3-8b-ar"), "--launcher", ""),
    ("serve-host-empty", *_sg("serve", "--host", " ", "qwen3-8b-ar"), "--host", " "),
    ("serve-launcher-missing", *_sg("serve", "--launcher", "/no/such/python -m x", "qwen3-8b-ar"), "--launcher", "/no/such/python -m x"),
    ("serve-then-empty", *_sg("serve", "qwen3-8b-ar", "--then", ""), "--then", ""),
    # sglang-spec patch
    ("patch-action", *_sg("patch", "bogus"), "action", "bogus"),
    ("patch-sglang-dir", *_sg("patch", "check", "--sglang-dir", "/no/such/dir"), "--sglang-dir", "/no/such/dir"),
    ("patch-patches-dir", *_sg("patch", "check", "--patches-dir", "/no/such/dir"), "--patches-dir", "/no/such/dir"),
    # python -m benchmarks.draft_block
    ("draft-block-1", draft_block.main, ["--blocks", "16", "1"], "--blocks", "1"),
    ("draft-block-pair", draft_block.main, ["--pairs", "llama"], "--pairs", "llama"),
    ("draft-block-prompts", draft_block.main, ["--prompt-sets", "poems"], "--prompt-sets", "poems"),
    ("draft-block-budget-0", draft_block.main, ["--budgets", "0"], "--budgets", "0"),
    ("draft-block-tree-temp", draft_block.main, ["--tree-temperature", "0"], "temperature", "0"),
    # python -m loadtests.sweep
    ("sweep-concurrency-0", sweep.main, ["--concurrency", "1,0"], "--concurrency", "1,0"),
    ("sweep-concurrency-type", sweep.main, ["--concurrency", "1,x"], "--concurrency", "1,x"),
    ("sweep-concurrency-huge", sweep.main, ["--concurrency", "1000000"], "--concurrency", "1000000"),
    ("sweep-concurrency-empty", sweep.main, ["--concurrency", ""], "--concurrency", ""),
    ("sweep-num-requests-0", sweep.main, ["--num-requests", "0"], "--num-requests", "0"),
    ("sweep-max-new-neg", sweep.main, ["--max-new-tokens", "-1"], "--max-new-tokens", "-1"),
    ("sweep-temperature-neg", sweep.main, ["--temperature", "-0.5"], "--temperature", "-0.5"),
    ("sweep-top-p-0", sweep.main, ["--top-p", "0"], "--top-p", "0"),
    ("sweep-timeout-0", sweep.main, ["--request-timeout", "0"], "--request-timeout", "0"),
    ("sweep-duration-inf", sweep.main, ["--duration", "inf"], "--duration", "inf"),
    ("sweep-warmup-neg", sweep.main, ["--warmup", "-1"], "--warmup", "-1"),
    ("sweep-prompts-missing", sweep.main, ["--prompts", "/no/such.jsonl"], "--prompts", "/no/such.jsonl"),
    ("sweep-prompts-empty", sweep.main, ["--prompts", ""], "--prompts", ""),
    ("sweep-prompts-no-records", sweep.main, ["--prompts", "{tmp}/empty.jsonl"], "--prompts", "empty.jsonl"),
    ("sweep-num-prompts-huge", sweep.main, ["--prompts", "heldout", "--num-prompts", "1000"], "--num-prompts", "1000"),
    ("sweep-template", sweep.main, ["--prompt-template", "{question}"], "--prompt-template", "{question}"),
    ("sweep-template-missing", sweep.main, ["--prompt-template", "answer:"], "--prompt-template", "answer:"),
    ("sweep-chat-kwargs", sweep.main, ["--chat-template-kwargs", "[1]"], "--chat-template-kwargs", "[1]"),
    ("sweep-humaneval-path", sweep.main, ["--humaneval-path", "/no/he.jsonl"], "--humaneval-path", "/no/he.jsonl"),
    ("sweep-output-dir", sweep.main, ["--output", "{tmp}/adir"], "--output", "adir"),
    ("sweep-url-scheme", sweep.main, ["--base-url", "ftp://127.0.0.1/"], "--base-url", "ftp://127.0.0.1/"),
    ("sweep-url-remote", sweep.main, ["--base-url", "http://10.1.2.3:30000"], "--base-url", "http://10.1.2.3:30000"),
    # python -m loadtests.compare
    ("compare-missing", compare.main, ["/no/run.jsonl"], "runs", "/no/run.jsonl"),
    ("compare-no-records", compare.main, ["{tmp}/empty.jsonl"], "runs", "empty.jsonl"),
    ("compare-output-file", compare.main, ["{tmp}/run.jsonl", "-o", "{tmp}/run.jsonl"], "--output-dir", "run.jsonl"),
    ("compare-ar-label", compare.main, ["{tmp}/run.jsonl", "--ar", "NOPE"], "--ar", "NOPE"),
    # python -m benchmarks.tree
    ("tree-budget-huge", bench_tree.main, ["--budgets", "100000"], "--budgets", "100000"),
    ("tree-budget-0", bench_tree.main, ["--budgets", "16", "0"], "--budgets", "0"),
    ("tree-bs-type", bench_tree.main, ["--bs", "eight"], "--bs", "eight"),
    ("tree-depth-0", bench_tree.main, ["--depth", "0"], "--depth", "0"),
    ("tree-vocab-1", bench_tree.main, ["--vocab", "1"], "--vocab", "1"),
    ("tree-repeats-neg", bench_tree.main, ["--repeats", "-3"], "--repeats", "-3"),
    ("tree-device", bench_tree.main, ["--device", "tpu"], "--device", "tpu"),
    ("tree-logits-huge", bench_tree.main, ["--device", "cpu", "--bs", "64", "--vocab", "16000000"], "--vocab", "16000000"),
]  # fmt: skip


@pytest.fixture
def _nothing_heavy(monkeypatch):
    """Loading a model, serving, launching SGLang or building a tree fails the test."""
    import sglang_spec.tree
    from sglang_spec import demo
    from sglang_spec.serving import launch
    from sglang_spec.serving.cpu_server import cli as cpu_cli

    def boom(*_args, **_kwargs):
        raise AssertionError("started heavy work before the arguments were checked")

    monkeypatch.setattr(tiny_pair, "load_pair", boom)
    monkeypatch.setattr(demo, "load_pair", boom)
    monkeypatch.setattr(cpu_cli.web, "run_app", boom)
    monkeypatch.setattr(launch.subprocess, "Popen", boom)
    monkeypatch.setattr(sglang_spec.tree, "draft_topk", boom)


@pytest.mark.usefixtures("_nothing_heavy")
@pytest.mark.parametrize(
    ("case", "main", "argv", "flag", "value"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_argument_is_one_line_and_exit_2(case, main, argv, flag, value, tmp_path, capsys):
    (tmp_path / "run.jsonl").write_text(json.dumps(RECORD) + "\n")
    (tmp_path / "empty.jsonl").write_text("\n")
    (tmp_path / "adir").mkdir()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2, (case, rc, err)
    assert len(lines) == 1, (case, err)
    assert flag in lines[0] and repr(value)[1:-1] in lines[0], (case, lines[0])
    assert "Traceback" not in err + out


def test_console_command_answers_in_one_line_without_loading_torch():
    probe = (
        "import sys; from sglang_spec.cli import main; "
        "rc = main(['cpu-server', '--engine', 'nosuch.module:make', '--port', '30999']); "
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; sys.exit(rc)"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip() == (
        "sglang-spec cpu-server: error: argument --engine: got 'nosuch.module:make'; "
        "cannot import 'nosuch.module' (No module named 'nosuch') (see --help)"
    )


def test_demo_budget_from_the_issue_in_a_subprocess():
    p = subprocess.run(
        [sys.executable, "-m", "sglang_spec.cli", "demo", "--budget", "100000"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip() == (
        "sglang-spec demo: error: argument --budget: got '100000'; valid: an integer from 1 to "
        "1023 (see --help)"
    )


def _commands():
    from sglang_spec import demo, patching
    from sglang_spec.serving import launch
    from sglang_spec.serving.cpu_server import cli as cpu_cli

    return {
        "sglang-spec demo": demo.add_arguments,
        "sglang-spec cpu-server": cpu_cli.add_arguments,
        "sglang-spec serve": launch.add_arguments,
        "sglang-spec patch": patching.add_arguments,
        "python -m loadtests.sweep": sweep.add_arguments,
        "python -m loadtests.compare": compare.add_arguments,
        "python -m benchmarks.tree": bench_tree.add_arguments,
    }


@pytest.mark.parametrize("prog", list(_commands()))
def test_help_states_every_default(prog, monkeypatch):
    # wide enough that a long default (a path under a directory named like wt-mut) is not
    # broken at a hyphen, which the check below would miss
    monkeypatch.setenv("COLUMNS", "1000")
    parser = Parser(prog=prog)
    _commands()[prog](parser)
    text = " ".join(parser.format_help().split())
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{prog} {action.option_strings[-1]} has no help"
        default = action.default
        if default is None or default is False or default == [] or default == argparse.SUPPRESS:
            continue  # nothing to state, or (for None) the help says what happens instead
        assert f"(default: {default})" in text or "default" in action.help, (
            f"{prog} {action.option_strings[-1]}: default {default!r} not in --help"
        )
