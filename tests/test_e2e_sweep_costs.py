"""e2e.sweep_costs: the adaptive part's cost table from the fixed part's DDTREE sweeps (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from e2e import sweep_costs
from sglang_spec.plugin.config import load_budget_policy

SESSION11 = Path(__file__).parents[1] / "benchmarks/results/e2e_h200/session11/tiny-adaptive"


def _sweep(path: Path, label: str, levels: list[tuple[int, float, float]], **extra) -> str:
    rows = [
        dict(label=label, max_concurrency=c, completed=8, accept_length=a, output_throughput=t)
        | extra
        for c, a, t in levels
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_levels_become_ms_per_step_and_a_config_the_server_loads(tmp_path, capsys):
    d63 = _sweep(tmp_path / "a.jsonl", "ddtree63+graphs", [(1, 7.0, 500.0), (8, 6.0, 1600.0)])
    d15 = _sweep(tmp_path / "b.jsonl", "ddtree15+graphs+patched", [(1, 5.0, 500.0)])
    ar = _sweep(tmp_path / "c.jsonl", "ar+graphs", [(1, 1.0, 300.0)])  # skipped
    # the adaptive server of an interleaved run (its steps mix budgets): skipped too
    adaptive = _sweep(tmp_path / "d.jsonl", "ddtree63+graphs+adaptive", [(1, 9.0, 100.0)])
    out = tmp_path / "cfg.json"
    assert sweep_costs.main([d63, d15, ar, adaptive, "--write-config", str(out)]) == 0
    cfg = json.loads(out.read_text())
    # 1000 x C x accept / tokens per second
    assert cfg == {"cost_ms": {"1": {"15": 10.0, "63": 14.0}, "8": {"63": 30.0}}}
    policy = load_budget_policy(str(out))
    assert policy.budgets == (15, 63) and policy.cost_ms[8] == {63: 30.0}
    assert "| 8 | - | 30.0 |" in capsys.readouterr().out


def test_a_concurrency_swept_several_times_costs_the_median_of_its_levels(tmp_path):
    """Session 19: one pass a level moved the same server by up to 1.8x between sessions, so
    h200_adaptive.sh repeats the levels; the cost is their median, not the last one."""
    path = _sweep(
        tmp_path / "s.jsonl",
        "ddtree15",
        [(1, 5.0, 500.0), (2, 5.0, 1000.0), (1, 5.0, 250.0), (1, 5.0, 1000.0), (2, 5.0, 500.0)],
    )
    budget, costs = sweep_costs.level_costs(path)
    assert budget == 15
    assert costs == {1: 10.0, 2: 15.0}  # C = 1: median of 10, 20, 5; C = 2: of 10 and 20


def test_a_real_sweep_file_of_session_11():
    """The adaptive server's own sweep (label ddtree63+...) read as a DDTREE(63) sweep."""
    budget, costs = sweep_costs.level_costs(str(SESSION11 / "sweep_adaptive.jsonl"))
    assert budget == 63 and sorted(costs) == [1, 2, 4, 8, 16, 32]
    assert costs[1] == pytest.approx(1000 * 6.72 / 683.9, abs=0.05)  # its report's C = 1 row


@pytest.mark.parametrize(
    ("levels", "extra", "message"),
    [
        ([(1, None, 500.0)], {}, r"level C=1 has completed=8, accept_length=None"),
        ([(2, 5.0, 0.0)], {}, r"level C=2 has .*output_throughput=0.0; valid: a finished level"),
        ([(1, 5.0, 500.0)], {"interrupted": True}, r"level C=1 has"),
    ],
)
def test_unfinished_levels_are_refused_in_one_line(tmp_path, capsys, levels, extra, message):
    path = _sweep(tmp_path / "s.jsonl", "ddtree15", levels, **extra)
    assert sweep_costs.main([path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and __import__("re").search(message, err)


def test_two_sweeps_of_one_budget_and_no_ddtree_are_refused(tmp_path, capsys):
    a = _sweep(tmp_path / "a.jsonl", "ddtree15", [(1, 5.0, 500.0)])
    b = _sweep(tmp_path / "b.jsonl", "ddtree15+graphs", [(1, 5.0, 400.0)])
    assert sweep_costs.main([a, b]) == 2
    assert "a second sweep of DDTREE(15)" in capsys.readouterr().err
    ar = _sweep(tmp_path / "c.jsonl", "dflash", [(1, 5.0, 400.0)])
    assert sweep_costs.main([ar]) == 2
    assert "no DDTREE sweep among" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep_costs.main([str(tmp_path / "missing.jsonl")])
    assert "no such sweep file" in capsys.readouterr().err


def test_a_base_config_gets_the_sweeps_cells_and_keeps_the_rest(tmp_path, capsys):
    """--base: a budget measured again at a concurrency replaces that cell, a new budget or
    concurrency is added, every other cell and the controller's knobs stay; the result is what
    the server loads. A base the server would refuse, or no base at all, is refused in one line."""
    base = tmp_path / "base.json"
    base.write_text(
        json.dumps(
            {
                "cost_ms": {"1": {"15": 7.0, "63": 7.5}, "8": {"15": 20.0, "63": 17.0}},
                "hysteresis": 0.1,
            }
        )
    )
    d63 = _sweep(tmp_path / "a.jsonl", "ddtree63+graphs", [(1, 7.0, 1000.0)])
    d255 = _sweep(tmp_path / "b.jsonl", "ddtree255+graphs", [(1, 8.0, 1000.0), (2, 8.0, 2000.0)])
    out = tmp_path / "cfg.json"
    assert sweep_costs.main([d63, d255, "--base", str(base), "--write-config", str(out)]) == 0
    assert json.loads(out.read_text()) == {
        "cost_ms": {
            "1": {"15": 7.0, "63": 7.0, "255": 8.0},
            "2": {"255": 8.0},
            "8": {"15": 20.0, "63": 17.0},
        },
        "hysteresis": 0.1,
    }
    assert load_budget_policy(str(out)).budgets == (15, 63, 255)
    base.write_text(json.dumps({"cost_ms": {"1": {"15": -1.0}}}))
    assert sweep_costs.main([d63, "--base", str(base), "--write-config", str(out)]) == 2
    assert "cost_ms['1']['15']=-1.0 is not valid" in capsys.readouterr().err
    assert sweep_costs.main([d63, "--base", str(tmp_path / "nope.json")]) == 2
    assert "nope.json: cannot read a JSON config" in capsys.readouterr().err
