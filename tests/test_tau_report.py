"""e2e.tau_report: DDTREE's tokens per verify step against DFLASH's per prompt and per prompt set
(issue 15 item 4), and e2e/h200_tau.sh's commands with a stand-in for the kit's Python."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import tau_report
from sglang_spec.reference import tiny_pair

REPO = Path(__file__).resolve().parents[1]


def _server(label, counts, texts=None, ok=True):
    texts = texts or [f"t{i}" for i in range(len(counts))]
    greedy = [
        {"text": x, "meta": {"completion_tokens": t, "spec_verify_ct": s}}
        for (t, s), x in zip(counts, texts)
    ]
    return {"label": label, "ok": ok, "greedy": greedy}


SETS = ["heldout", "heldout", "othercode", "othercode"]
RUN = [
    _server("ar+graphs", [(64, 0)] * 4),
    _server("dflash+graphs", [(64, 16), (64, 16), (64, 8), (64, 16)], ["t0", "t1", "t2", "x"]),
    _server(
        "ddtree63+graphs+patched", [(64, 8), (64, 16), (64, 16), (64, 8)], ["t0", "y", "t2", "t3"]
    ),
]


def test_pooled_ratio_prompts_at_or_above_dflash_and_greedy_counts_per_set():
    rows = tau_report.compare("hybrid", RUN, SETS)
    assert [(r["set"], r["server"]) for r in rows] == [
        ("heldout", "ddtree63+graphs+patched"),
        ("othercode", "ddtree63+graphs+patched"),
    ]
    held, other = rows
    # pooled: 128 tokens over 32 steps (DFLASH) against 128 over 24 (DDTREE); prompt 1 ties
    assert held["tau_dflash"] == pytest.approx(4.0) and held["tau_ddtree"] == pytest.approx(
        128 / 24
    )
    assert held["ratio"] == pytest.approx(4 / 3) and held["prompts_ge"] == 2
    # othercode: prompt 2 is below DFLASH (4 < 8), prompt 3 above
    assert other["per_prompt"] == [(8.0, 4.0), (4.0, 8.0)] and other["prompts_ge"] == 1
    assert other["ratio"] == pytest.approx((128 / 24) / (128 / 24))
    assert (held["dflash_eq_ar"], held["ddtree_eq_ar"]) == (2, 1)
    assert (other["dflash_eq_ar"], other["ddtree_eq_ar"]) == (1, 2)
    text = tau_report.table(rows, 1.3)
    assert (
        "| hybrid | heldout | 2 | 4.000 | ddtree63+graphs+patched | 5.333 | 1.333x | 2/2 | 2, 1 | yes |"
        in text
    )
    assert text.splitlines()[-1].endswith("| 1/2 | 1, 2 | no |")  # ratio 1.0 and a prompt below
    # a pooled ratio over the bar does not excuse a prompt below DFLASH
    assert tau_report.table(rows, 0.9).splitlines()[-1].endswith("| 1/2 | 1, 2 | no |")
    assert "| hybrid | othercode | 0 | 8.00 | 4.00 (<) |" in tau_report.per_prompt_table(rows)


def test_without_ar_no_greedy_counts():
    rows = tau_report.compare("qwen3", RUN[1:], SETS)
    assert "ddtree_eq_ar" not in rows[0] and "| - |" in tau_report.table(rows, 1.3)


@pytest.mark.parametrize(
    "runs, sets, message",
    [
        ([RUN[0], RUN[2]], SETS, "needs a dflash and a ddtree"),
        (RUN[:2], SETS, "needs a dflash and a ddtree"),
        ([*RUN[:2], {**RUN[2], "ok": False}], SETS, r"ddtree63\+graphs\+patched failed"),
        (RUN, SETS[:3], "4 greedy prompts, the prompt file has 3"),
    ],
)
def test_a_broken_run_is_an_error_not_a_result(runs, sets, message):
    with pytest.raises(ValueError, match=message):
        tau_report.compare("hybrid", runs, sets)


def test_cli_writes_rows_and_fails_on_a_broken_run(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"set": s, "prompt": "p"}) + "\n" for s in SETS))
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(RUN))
    bad.write_text(json.dumps(RUN[:2]))
    out = tmp_path / "tau.json"
    assert tau_report.main([f"hybrid={good}", "--prompts", str(prompts), "--json", str(out)]) == 0
    assert [r["set"] for r in json.loads(out.read_text())] == ["heldout", "othercode"]
    assert tau_report.main([f"hybrid={good}", f"qwen3={bad}", "--prompts", str(prompts)]) == 1
    assert "qwen3: needs a dflash" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tau_report.main([str(good), "--prompts", str(prompts)])
    assert "expected PAIR=path/to/e2e.json" in capsys.readouterr().err


def test_written_prompts_are_the_first_of_each_set_in_run_order(tmp_path):
    f = tmp_path / "p.jsonl"
    assert tau_report.main(["--write-prompts", str(f), "--num-prompts", "3"]) == 0
    lines = [json.loads(ln) for ln in f.read_text().splitlines()]
    assert [x["set"] for x in lines] == ["heldout"] * 3 + ["othercode"] * 3
    assert [x["prompt"] for x in lines[3:]] == tiny_pair.heldout_prompts(
        3, spread=False, prompt_set="othercode"
    )
    assert [x["prompt"] for x in lines[:3]] == tiny_pair.heldout_prompts(3, spread=False)


STUB = """#!/usr/bin/env bash
if [ "$1" = "-c" ] || [ "$2" = "e2e.tau_report" ]; then exec "$REAL_PY" "$@"; fi
echo "$*" >> "$STUB_CALLS"
out=$(python3 -c 'import sys; a = sys.argv; print(a[a.index("--out") + 1])' "$@")
mkdir -p "$out" && cp "$STUB_E2E" "$out/e2e.json"
"""


def _script_env(tmp_path, run: list[dict], n: int, **extra) -> dict:
    """e2e/h200_tau.sh's environment with the stub kit Python answering every server with ``run``."""
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (tmp_path / "e2e.json").write_text(json.dumps(run))
    return {
        **os.environ,
        "SGLANG_KIT_PYTHON": str(stub),
        "REAL_PY": sys.executable,
        "STUB_CALLS": str(tmp_path / "calls"),
        "STUB_E2E": str(tmp_path / "e2e.json"),
        "OUT": str(tmp_path / "out"),
        "NUM_PROMPTS": str(n),
        "PYTHONPATH": str(REPO),
        **extra,
    }


def _run_script(env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "e2e/h200_tau.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_device_script_serves_both_sets_per_pair_and_reports(tmp_path):
    n = 2
    sets = ["heldout"] * n + ["othercode"] * n
    run = [_server(s["label"], [(64, 8)] * 2 * n) for s in RUN]
    env = _script_env(tmp_path, run, n)
    calls, out = tmp_path / "calls", tmp_path / "out"
    proc = _run_script(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    argvs = [c.split() for c in calls.read_text().splitlines()]
    assert [a[a.index("--target") + 1].rsplit("/", 1)[1] for a in argvs] == ["hybrid", "qwen3"]
    servers = [a[a.index("--servers") + 1] for a in argvs]
    assert servers == [
        "dflash+graphs,ddtree63+graphs+patched+replayssm,ar+graphs",
        "dflash+graphs,ddtree63+graphs+patched,ar+graphs",
    ]
    for a in argvs:
        assert a[a.index("--prompts") + 1] == str(out / "prompts.jsonl")
        assert a[a.index("--num-prompts") + 1] == str(2 * n)
        assert a[a.index("--samples") + 1] == "0"
        assert a[a.index("--max-new-tokens") + 1] == "64"
    assert [
        json.loads(ln)["set"] for ln in (out / "prompts.jsonl").read_text().splitlines()
    ] == sets
    rows = json.loads((out / "tau.json").read_text())
    assert [(r["pair"], r["set"]) for r in rows] == [
        ("hybrid", "heldout"),
        ("hybrid", "othercode"),
        ("qwen3", "heldout"),
        ("qwen3", "othercode"),
    ]
    # a failed server makes the call fail
    (tmp_path / "e2e.json").write_text(json.dumps([*run[:2], {**run[2], "ok": False}]))
    proc = _run_script(env)
    assert proc.returncode == 1 and "failed; rerun them" in proc.stderr


def test_device_script_takes_the_request_length_and_can_leave_ar_out(tmp_path):
    """Session 19 measured the hybrid pair's tau at 256 tokens without AR (the reference engine
    judged the outputs): MAX_NEW_TOKENS reaches the greedy requests, SKIP_AR drops the AR server."""
    run = [_server(s["label"], [(256, 20)] * 2) for s in RUN[1:]]
    env = _script_env(tmp_path, run, 1, PAIRS="hybrid", MAX_NEW_TOKENS="256", SKIP_AR="1")
    proc = _run_script(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (argv,) = [c.split() for c in (tmp_path / "calls").read_text().splitlines()]
    assert argv[argv.index("--servers") + 1] == "dflash+graphs,ddtree63+graphs+patched+replayssm"
    assert argv[argv.index("--max-new-tokens") + 1] == "256"
