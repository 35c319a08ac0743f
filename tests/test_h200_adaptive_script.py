"""``e2e/h200_adaptive.sh`` on the CPU, with a stand-in for the kit's Python: the commands it would
run on the H200 (parts, servers, prompts, the chi-square samples) and its verdict on the adaptive
server's log. A device call is too scarce to find a quoting slip in it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exec "$STUB_PY" "$@"; fi
echo "$*" >> "$STUB_CALLS"
if [ "$2" = "e2e.sweep_costs" ]; then  # the table it would write: the base config's
  "$STUB_PY" -c 'import shutil, sys; a = sys.argv; shutil.copy(a[a.index("--base") + 1], a[a.index("--write-config") + 1])' "$@"
  exit "${STUB_COSTS_RC:-0}"
fi
out=$(python3 -c 'import sys; a = sys.argv; print(a[a.index("--out") + 1])' "$@")
mkdir -p "$out" && cp "$STUB_E2E" "$out/e2e.json"
exit "${STUB_RC:-0}"
"""
STATES = (
    "[x] DDTREE budget by batch size: target verify states for budgets (CUDA-graph batch "
    "sizes) {15: [1, 2]}; cost table {}."
)


def run(tmp_path, e2e: list, **env) -> tuple[int, list[str]]:
    stub = tmp_path / "python"
    stub.write_text(STUB)
    stub.chmod(0o755)
    (tmp_path / "e2e.json").write_text(json.dumps(e2e))
    calls = tmp_path / "calls"
    full = {
        **os.environ,
        "SGLANG_KIT_PYTHON": str(stub),
        "STUB_PY": sys.executable,
        "STUB_CALLS": str(calls),
        "STUB_E2E": str(tmp_path / "e2e.json"),
        "OUT": str(tmp_path / "out"),
        **env,
    }
    proc = subprocess.run(
        ["bash", "e2e/h200_adaptive.sh"], cwd=REPO, env=full, capture_output=True, text=True
    )
    return proc.returncode, calls.read_text().splitlines() if calls.exists() else []


def test_fixed_part_serves_every_baseline_and_the_chi_square_samples(tmp_path):
    rc, calls = run(tmp_path, [], PARTS="fixed", DIST_SAMPLES="500")
    assert rc == 0 and len(calls) == 1
    argv = calls[0].split()
    servers = argv[argv.index("--servers") + 1].split(",")
    mods = "+graphs+patched+replayssm"
    assert servers == ["ar+graphs", "dflash+graphs", f"ddtree15{mods}", f"ddtree63{mods}"]
    assert argv[argv.index("--dist-samples") + 1] == "500"
    assert argv[argv.index("--dist-servers") + 1] == f"ar+graphs,ddtree63{mods}"
    assert argv[argv.index("--prompts") + 1].endswith("tiny-pair/heldout_prompts.jsonl")
    assert argv[argv.index("--num-prompts") + 1] == "6"
    rc, calls = run(
        tmp_path, [], PARTS="fixed", PROMPTS="/p/othercode_prompts.jsonl", NUM_PROMPTS="16"
    )
    assert "--dist-samples" not in calls[-1].split() and "/p/othercode_prompts.jsonl" in calls[-1]
    argv = calls[-1].split()
    assert argv[argv.index("--num-prompts") + 1] == "16"


def test_pin_cpus_reaches_every_part(tmp_path):
    """PIN_CPUS=1 passes --pin-cpus to each part's e2e.tiny_pair run; unset, none gets it."""
    e2e = [{"label": "ddtree63+graphs+patched+replayssm", "ok": True, "log_ddtree": [STATES]}]
    rc, calls = run(tmp_path, e2e, PARTS="fixed adaptive", PIN_CPUS="1")
    assert len(calls) == 2 and all("--pin-cpus" in c.split() for c in calls)
    (tmp_path / "unpinned").mkdir()
    rc, calls = run(tmp_path / "unpinned", e2e, PARTS="fixed")
    assert len(calls) == 1 and "--pin-cpus" not in calls[0].split()


@pytest.mark.parametrize("logged", [True, False])
def test_adaptive_part_needs_the_verify_states_line(tmp_path, logged):
    """Session 7's adaptive run was answered by a leftover server and never showed the adaptive
    server's per-width verify states: the script must fail when that line is missing."""
    lines = ["[x] DDTREE resolved: ..."] + ([STATES] if logged else [])
    e2e = [{"label": "ddtree63+graphs+patched+replayssm", "ok": True, "log_ddtree": lines}]
    rc, calls = run(tmp_path, e2e, PARTS="adaptive")
    assert rc == (0 if logged else 1)
    argv = calls[0].split()
    assert "speculative-adaptive" in argv and "--baseline" not in argv  # no fixed part here
    assert argv[argv.index("--servers") + 1] == "ddtree63+graphs+patched+replayssm"


def test_a_fixed_part_cut_by_its_timeout_fails_the_script(tmp_path):
    """Session 17's fixed part hit its timeout after its sweeps (rc 124) and the script still
    exited 0."""
    rc, _ = run(tmp_path, [], PARTS="fixed", STUB_RC="124")
    assert rc == 1
    rc, _ = run(tmp_path, [], PARTS="fixed")
    assert rc == 0


def test_sweep_passes_repeat_the_levels_and_bad_counts_stop_before_any_server(tmp_path):
    rc, calls = run(tmp_path, [], PARTS="fixed", SWEEP="1,4", SWEEP_PASSES="3", SWEEP_TOKENS="512")
    argv = calls[0].split()
    assert rc == 0 and argv[argv.index("--sweep") + 1] == "1,4,1,4,1,4"
    assert argv[argv.index("--sweep-tokens") + 1] == "512"
    rc, calls = run(tmp_path, [], PARTS="fixed")
    argv = calls[-1].split()
    assert argv[argv.index("--sweep") + 1] == "1,2,4,8,16"
    for bad in ("0", "two", "-1"):
        (tmp_path / "calls").unlink(missing_ok=True)
        proc_rc, calls = run(tmp_path, [], PARTS="fixed", SWEEP_PASSES=bad)
        assert proc_rc == 2 and calls == []


@pytest.mark.parametrize(
    "fixed, compared",
    [
        ([{"label": "ar+graphs", "ok": True}, {"label": "dflash+graphs", "ok": True}], True),
        ([{"label": "dflash+graphs", "ok": True}], False),
        ([{"label": "ar+graphs", "ok": False}], False),
    ],
)
def test_the_adaptive_part_compares_with_the_fixed_ar_server_only_when_there_is_one(
    tmp_path, fixed, compared
):
    """Session 22: a fixed part without AR (DFLASH and DDTREE(15)) made the adaptive part's
    --baseline refuse before its server started, losing the call's adaptive run."""
    fixed_e2e = tmp_path / "out/fixed/e2e.json"
    fixed_e2e.parent.mkdir(parents=True)
    fixed_e2e.write_text(json.dumps(fixed))
    e2e = [{"label": "ddtree63+graphs+patched+replayssm", "ok": True, "log_ddtree": [STATES]}]
    rc, calls = run(tmp_path, e2e, PARTS="adaptive")
    argv = calls[0].split()
    assert rc == 0 and ("--baseline" in argv) == compared
    if compared:
        assert argv[argv.index("--baseline") + 1] == str(fixed_e2e)


@pytest.mark.parametrize("logged", [True, False])
def test_interleaved_part_runs_every_server_at_once_and_needs_the_adaptive_ones_states(
    tmp_path, logged
):
    """PARTS=interleaved: one e2e.tiny_pair --interleave run of the fixed servers and the adaptive
    one; only the +adaptive server must log its verify states (the fixed ones never do)."""
    mods = "+graphs+patched+replayssm"
    e2e = [
        {"label": "dflash+graphs", "ok": True, "log_ddtree": []},
        {"label": f"ddtree63{mods}+adaptive", "ok": True, "log_ddtree": [STATES] if logged else []},
    ]
    rc, calls = run(tmp_path, e2e, PARTS="interleaved", ADAPTIVE_CONFIG="/c/costs.json")
    assert rc == (0 if logged else 1) and len(calls) == 2
    assert calls[1].split()[:3] == ["-m", "e2e.tiny_bar", str(tmp_path / "out/interleaved/sweeps")]
    argv = calls[0].split()
    assert "--interleave" in argv and "speculative-adaptive" not in argv
    assert argv[argv.index("--time-limit") + 1] == "555"  # 5 s under INTERLEAVED_LIMIT_S (560)
    assert argv[argv.index("--servers") + 1].split(",") == [
        "ar+graphs",
        "dflash+graphs",
        f"ddtree15{mods}",
        f"ddtree63{mods}",
        f"ddtree63{mods}+adaptive",
    ]
    assert argv[argv.index("--adaptive-config") + 1] == "/c/costs.json"
    rc, calls = run(tmp_path, e2e, PARTS="interleaved", FIXED_SERVERS="dflash+graphs+stages")
    argv = calls[-2].split()
    assert argv[argv.index("--servers") + 1] == f"dflash+graphs+stages,ddtree63{mods}+adaptive"
    assert "--rotate-cpus" not in argv
    rc, calls = run(tmp_path, e2e, PARTS="interleaved", PIN_CPUS="1", ROTATE_CPUS="1")
    argv = calls[-2].split()
    assert "--rotate-cpus" in argv and "--pin-cpus" in argv
    assert argv[argv.index("--adaptive-config") + 1].endswith("e2e/adaptive_budgets_tiny.json")


def test_pack_out_leaves_one_archive_with_everything_the_parts_wrote(tmp_path):
    """PACK_OUT=1: a device call returns at most 8 files, so $OUT ends as all.tar.xz alone, holding
    each part's files (session 38 lost a sweep, the 9th file, to that limit); without it, the
    files stay as written."""
    e2e = [{"label": "ar+graphs", "ok": True}]
    assert run(tmp_path, e2e, PARTS="fixed")[0] == 0
    assert (tmp_path / "out" / "fixed" / "e2e.json").exists()
    rc, _ = run(tmp_path, e2e, PARTS="fixed", PACK_OUT="1")
    assert rc == 0
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["all.tar.xz"]
    with tarfile.open(tmp_path / "out" / "all.tar.xz", "r:xz") as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
    assert {"fixed/e2e.json", "fixed.log"} <= names, names


def test_costs_part_measures_the_configs_candidates_and_the_adaptive_server_runs_that_table(
    tmp_path,
):
    """PARTS="costs interleaved": one fixed DDTREE server per candidate budget of ADAPTIVE_CONFIG,
    rotated like the interleaved part, their sweeps turned into a table on the config, and the
    adaptive server runs that table, not the shipped one (session 40: a table from session 16 sent
    bucket 1 to the chain)."""
    mods = "+graphs+patched+replayssm+fusednorms"
    e2e = [{"label": f"ddtree63{mods}+adaptive", "ok": True, "log_ddtree": [STATES]}]
    config = REPO / "e2e/adaptive_budgets_tiny_h200.json"
    keep = tmp_path / "kept.json"
    rc, calls = run(
        tmp_path,
        e2e,
        PARTS="costs interleaved",
        MODS=mods,
        ADAPTIVE_CONFIG=str(config),
        PIN_CPUS="1",
        ROTATE_CPUS="1",
        COSTS_LIMIT_S="200",
        COSTS_KEEP=str(keep),
    )
    assert rc == 0 and len(calls) == 4, calls
    costs, table, interleaved = (c.split() for c in calls[:3])
    assert costs[costs.index("--out") + 1] == str(tmp_path / "out/costs")
    assert costs[costs.index("--servers") + 1] == f"ddtree15{mods},ddtree63{mods}"
    assert {"--interleave", "--pin-cpus", "--rotate-cpus"} <= set(costs)
    assert 185 <= int(costs[costs.index("--time-limit") + 1]) <= 195  # 5 s under what is left
    assert table[:2] == ["-m", "e2e.sweep_costs"]
    assert table[table.index("--base") + 1] == str(config)
    measured = str(tmp_path / "out/costs/adaptive_config.json")
    assert table[table.index("--write-config") + 1] == measured
    assert interleaved[interleaved.index("--adaptive-config") + 1] == measured
    assert keep.read_text() == config.read_text()  # the stub's table is the base's
    assert 545 <= int(interleaved[interleaved.index("--time-limit") + 1]) <= 555


@pytest.mark.parametrize("failing", ["STUB_RC", "STUB_COSTS_RC"])
def test_without_a_measured_table_the_adaptive_server_does_not_run(tmp_path, failing):
    """A costs part cut by its timeout, or a table sweep_costs refused, fails the script, and the
    interleaved part does not run the stale table it was to replace."""
    rc, calls = run(
        tmp_path,
        [],
        PARTS="costs interleaved",
        ADAPTIVE_CONFIG=str(REPO / "e2e/adaptive_budgets_tiny_h200.json"),
        **{failing: "124"},
    )
    assert rc == 1
    assert not any("--adaptive-config" in c for c in calls), calls
    assert not (tmp_path / "out/costs/adaptive_config.json").exists() or failing == "STUB_COSTS_RC"


def test_costs_part_needs_a_config_to_measure(tmp_path):
    rc, calls = run(tmp_path, [], PARTS="costs")
    assert rc != 0 and calls == []
