"""``e2e/h200_bar15.sh`` on the CPU, with a stand-in for the kit's Python: each part serves its two
27B servers through e2e.scale with the options the bar needs; a fused part checks the one-launch
norms first and starts no server when they fail; a bad part is refused before anything runs."""

from __future__ import annotations

import pytest
from kit_stub import run_script

from e2e import scale


def _servers(call: str) -> list[str]:
    return call.split("--servers ")[1].split()


@pytest.mark.parametrize(
    "part,want",
    [
        ("fused-spec", [("DDTREE", {"fused-norms"}), ("NEXTN", {"fused-norms"})]),
        ("fused-base", [("AR", {"fused-norms"}), ("DFLASH", {"fused-norms"})]),
        ("torch-spec", [("DDTREE", set()), ("NEXTN", set())]),
    ],
)
def test_each_part_serves_its_servers_with_the_bars_options(tmp_path, part, want):
    rc, calls = run_script("h200_bar15.sh", tmp_path, 1, PART=part)
    assert rc == 0
    fused = part.startswith("fused")
    *check, apply, run = calls
    assert [("-m benchmarks.kit_norms" in c) for c in check] == ([True] if fused else [])
    assert apply == "apply" and "-m e2e.scale" in run
    specs = [scale.parse_spec(s) for s in _servers(run)]
    assert [(s.algorithm, set(s.flags)) for s in specs] == want
    for s in specs:
        if s.algorithm == "DDTREE":
            assert s.adaptive.endswith("adaptive_budget_qwen3.6-27b_7-13-31_wy.json")
            assert s.acc_by_budget == ((7, 3.17), (13, 3.51), (31, 4.01))
            assert s.tree_temperature == 1e-8 and s.profile == (16,)
        elif s.algorithm in ("NEXTN", "DFLASH"):
            assert s.acc == {"NEXTN": 3.1, "DFLASH": 3.0}[s.algorithm]
    args = run.split()
    assert args[args.index("--repeats") + 1] == "3"
    assert args[args.index("--levels") + 1] == "1,2,4,8,16,32"


def test_a_failed_norm_check_starts_no_server(tmp_path):
    rc, calls = run_script(
        "h200_bar15.sh", tmp_path, 1, PART="fused-spec", STUB_FAIL="benchmarks.kit_norms"
    )
    assert rc == 1 and len(calls) == 1 and "-m benchmarks.kit_norms" in calls[0]


@pytest.mark.parametrize("part", ["", "fused"])
def test_a_bad_part_is_refused_before_anything_runs(tmp_path, part):
    rc, calls = run_script("h200_bar15.sh", tmp_path, 1, PART=part)
    assert rc == 2 and calls == []


def test_levels_and_repeats_can_be_narrowed_to_settle_a_level(tmp_path):
    rc, calls = run_script(
        "h200_bar15.sh", tmp_path, 1, PART="fused-spec", LEVELS="8,16", REPEATS="5"
    )
    args = calls[-1].split()
    assert rc == 0 and args[args.index("--levels") + 1] == "8,16"
    assert args[args.index("--repeats") + 1] == "5"
