"""Budget by batch size (sglang_spec.plugin.budget): the config, the choice, tau, nested trees."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from sglang_spec.plugin.budget import (
    BudgetConfigError,
    BudgetController,
    BudgetPolicy,
    accepted_tokens_within,
)
from sglang_spec.tree import build_ddtree, walk_greedy
from tests.tree_testing import SETTINGS

L = 15  # drafter horizon of the canned shape (block 16)

# A canned cost table shaped like the 27B measurements (benchmarks/results/scale_h200.md): the wide
# tree is cheap alone and expensive in a batch.
TABLE = {
    "cost_ms": {
        "1": {"15": 30.0, "31": 33.0, "63": 40.0},
        "4": {"7": 30.0, "15": 37.0, "31": 60.0},
        "16": {"3": 40.0, "7": 45.0, "15": 60.0},
    },
    "warmup_steps": 1,
    "probe_interval": 0,
    "hysteresis": 0.05,
}
TAU = {3: 1.8, 7: 2.3, 15: 2.6, 31: 3.3, 63: 3.6}  # tokens per step per request


def _controller(table=TABLE, tau=TAU, cuda_graph_bs=None):
    ctl = BudgetController(BudgetPolicy.from_dict(table), horizon=L, cuda_graph_bs=cuda_graph_bs)
    for b, t in tau.items():
        ctl.tau[b] = t
        ctl.evidence[b] = 10
    return ctl


def test_policy_reads_the_documented_format(tmp_path):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(TABLE))
    p = BudgetPolicy.load(str(path))
    assert p.budgets == (3, 7, 15, 31, 63)
    assert p.buckets == (1, 4, 16)
    assert p.cost_ms[4] == {7: 30.0, 15: 37.0, 31: 60.0}
    assert (p.ema_alpha, p.hysteresis, p.warmup_steps, p.probe_interval) == (0.2, 0.05, 1, 0)
    defaults = BudgetPolicy.from_dict({"cost_ms": {"1": {"15": 1}}})
    assert (defaults.ema_alpha, defaults.hysteresis, defaults.warmup_steps) == (0.2, 0.05, 8)
    assert (defaults.probe_interval, defaults.measure_interval) == (64, 4)


def test_buckets_route_to_the_largest_at_or_below_and_prune_graphs():
    p = BudgetPolicy.from_dict(TABLE)
    assert [p.bucket(c) for c in (1, 2, 3, 4, 15, 16, 40)] == [1, 1, 1, 4, 4, 16, 16]
    assert BudgetPolicy.from_dict({"cost_ms": {"2": {"15": 1}}}).bucket(1) == 2  # below: smallest
    graphs = _controller(cuda_graph_bs=[1, 2, 4, 8, 16, 24])
    assert graphs.cuda_graph_bs_for_budget(63) == [1, 2]
    assert graphs.cuda_graph_bs_for_budget(15) == [1, 2, 4, 8, 16, 24]
    assert graphs.cuda_graph_bs_for_budget(3) == [16, 24]
    assert _controller().cuda_graph_bs_for_budget(15) == []  # graphs off
    # a batch pads to its CUDA-graph batch size before routing (the graph it replays)
    ctl = _controller(cuda_graph_bs=[1, 2, 4, 8, 16])
    assert [ctl.bucket_of(c) for c in (3, 9, 17)] == [4, 16, 16]
    assert _controller().bucket_of(3) == 1


@pytest.mark.parametrize(
    ("c", "want"),
    [
        # C=1: 31 -> 3.3/33 = .100, 63 -> 3.6/40 = .090, 15 -> 2.6/30 = .087
        (1, 31),
        (2, 31),
        # C=4: 7 -> 2.3/30 = .0767, 15 -> 2.6/37 = .0703, 31 -> 3.3/60 = .055
        (4, 7),
        (8, 7),
        # C=16: 3 -> 1.8/40 = .045, 7 -> 2.3/45 = .0511, 15 -> 2.6/60 = .0433
        (16, 7),
    ],
)
def test_choice_maximises_expected_throughput(c, want):
    ctl = _controller()
    assert ctl.choose(c) == want
    best = ctl.expected_tokens_per_s(c, want)
    for b in TABLE["cost_ms"][str(ctl.bucket_of(c))]:
        assert ctl.expected_tokens_per_s(c, int(b)) <= best
    assert best == pytest.approx(c * TAU[want] * 1000 / ctl.policy.cost_ms[ctl.bucket_of(c)][want])


# The tiny pair's H200 table (e2e/adaptive_budgets_tiny_h200.json): the chain (15) is dearer
# than 63 at C = 8 and 32, and 15 is nested in 63 (both >= L).
TINY = {
    "cost_ms": {
        "1": {"15": 3.229, "63": 3.42},
        "8": {"15": 6.376, "63": 5.349},
        "32": {"15": 10.306, "63": 9.474},
    }
}


def test_a_budget_nested_in_a_cheaper_one_of_its_bucket_is_no_candidate_there():
    ctl = _controller(TINY, cuda_graph_bs=[1, 2, 4, 8, 16, 32])
    assert ctl.candidates == {1: (15, 63), 8: (63,), 32: (63,)}
    assert ctl.budgets == (15, 63)
    assert ctl.cuda_graph_bs_for_budget(15) == [1, 2, 4]
    assert ctl.cuda_graph_bs_for_budget(63) == [1, 2, 4, 8, 16, 32]
    # nested but not cheaper, or cheaper but not nested (7 < L < 31): both stay
    both = {"cost_ms": {"1": {"15": 3.0, "31": 3.0, "7": 9.0, "63": 2.0}}}
    assert _controller(both).candidates == {1: (7, 63)}
    kept = {"cost_ms": {"1": {"7": 9.0, "15": 3.0, "31": 3.0}}}
    assert _controller(kept).candidates == {1: (7, 15, 31)}
    # without nesting (a simulated tau per budget) nothing is known to dominate
    sim = BudgetController(BudgetPolicy.from_dict(TINY), horizon=L, nested=False)
    assert sim.candidates[8] == (15, 63)
    # a bucket's budget no other bucket keeps needs no config at all
    assert _controller({"cost_ms": {"1": {"15": 4.0, "63": 3.0}}}).budgets == (63,)


@given(
    costs=st.dictionaries(
        st.sampled_from([3, 7, 15, 31, 63]), st.floats(1.0, 50.0), min_size=1, max_size=5
    ),
    taus=st.lists(st.floats(1.0, 17.0), min_size=5, max_size=5),
    c=st.integers(1, 64),
)
@SETTINGS
def test_a_pruned_budget_never_has_the_best_expected_throughput(costs, taus, c):
    """Over every candidate of the bucket, the best expected throughput (ties to the smaller budget,
    as choose breaks them) is always one the pruned set keeps, for any tau in nested order (a
    budget's tau at least that of each budget nested in it)."""
    # ascending tau over ascending budgets: nested order holds
    tau = dict(zip([3, 7, 15, 31, 63], sorted(taus), strict=True))
    table = {"cost_ms": {"1": {str(b): ms for b, ms in costs.items()}}}
    ctl = _controller(table, tau=tau)
    best = max(costs, key=lambda b: (c * tau[b] / costs[b], -b))
    assert best in ctl.candidates[1]


def test_a_bucket_with_one_candidate_runs_it_unmeasured_and_says_so_once():
    calls = []
    ctl = BudgetController(
        BudgetPolicy.from_dict({**TINY, "measure_interval": 1, "probe_interval": 1}),
        horizon=L,
        on_switch=lambda *a: calls.append(a[:3]),
    )
    for _ in range(3):
        assert ctl.choose(8) == 63
        assert not ctl.measure
    assert calls == [(8, None, 63)]
    assert ctl.choose(1) == 63 and ctl.measure  # bucket 1 still warms up 15 and 63 (by 63)


def test_cheaper_cost_flips_the_choice():
    table = json.loads(json.dumps(TABLE))
    table["cost_ms"]["1"]["63"] = 34.0  # 3.6/34 = .106 > 31's .100
    assert _controller(table).choose(1) == 63


def test_hysteresis_keeps_the_budget_until_the_gain_exceeds_it():
    ctl = _controller()
    assert ctl.choose(1) == 31  # 3.3/33 = 0.1
    ctl.tau[63] = 4.1  # 4.1/40 = 0.1025: +2.5 % < 5 %
    assert ctl.choose(1) == 31
    fresh = _controller(tau={**TAU, 63: 4.1})
    assert fresh.choose(1) == 63  # without a current budget the best wins outright
    ctl.tau[63] = 4.3  # 0.1075: +7.5 % > 5 %
    assert ctl.choose(1) == 63
    ctl.tau[63] = 4.0  # 31 is 0.1 vs 0.1: no gain, stay
    assert ctl.choose(1) == 63
    # each bucket keeps its own budget
    assert ctl.choose(4) == 7
    assert ctl.choose(1) == 63


def test_equal_throughput_goes_to_the_smaller_budget_and_an_equal_gain_does_not_switch():
    """Ties in expected throughput go to the cheaper tree; hysteresis h leaves the current budget
    only for a gain of more than h, not of exactly h (0.5 here, so the products are exact)."""
    table = {"cost_ms": {"1": {"7": 20.0, "15": 40.0}}, "warmup_steps": 1, "probe_interval": 0}
    tie = _controller(table, tau={7: 2.0, 15: 4.0})  # 2/20 = 4/40
    assert tie.choose(1) == 7
    ctl = _controller({**table, "hysteresis": 0.5}, tau={7: 2.0, 15: 2.0})
    assert ctl.choose(1) == 7  # 0.1 against 0.05
    ctl.tau[15] = 6.0  # 0.15 = 0.1 x 1.5 exactly: not more than the hysteresis
    assert ctl.choose(1) == 7
    ctl.tau[15] = 6.5
    assert ctl.choose(1) == 15


def test_each_settled_or_changed_choice_is_reported_with_the_tau_behind_it():
    """on_switch (the worker's log line): a bucket's first choice and each change, not the steps
    that keep it, nor exploration or probes."""
    calls = []
    ctl = _controller()
    ctl.on_switch = lambda *a: calls.append(a)
    assert ctl.choose(1) == 31 and ctl.choose(1) == 31
    assert calls == [(1, None, 31, TAU)]
    ctl.tau[63] = 4.3  # 0.1075 against 31's 0.1: past the hysteresis
    assert ctl.choose(1) == 63 and ctl.choose(1) == 63
    assert calls[1:] == [(1, 31, 63, {**TAU, 63: 4.3})]
    assert ctl.choose(4) == 7 and calls[2][:3] == (4, None, 7)
    calls[0][3][31] = 0.0  # a copy: the controller's own tau is untouched
    assert ctl.tau[31] == 3.3 and len(calls) == 3


def test_tau_is_an_ema_of_the_measured_budgets():
    ctl = BudgetController(BudgetPolicy.from_dict({**TABLE, "ema_alpha": 0.25}), horizon=L)
    assert ctl.measured_by(63) == (15, 31, 63)  # >= L: nested in the chain-inclusive tree
    assert ctl.measured_by(7) == (3, 7)  # < L: plain best-first trees, nested among themselves
    assert ctl.measured_by(15) == (15,)
    ctl.observe(63, [8.0, 10.0, 12.0], num_requests=4)
    assert ctl.tau == {15: 2.0, 31: 2.5, 63: 3.0}
    ctl.observe(31, [16.0, 20.0], num_requests=4)
    # 3/4 of the old value + 1/4 of 4.0, 5.0; 63's, left at 3.0 by a step blind to it, is raised
    # to 31's: a tree accepts at least what a tree nested in it does
    assert ctl.tau == {15: 2.5, 31: 3.125, 63: 3.125}
    assert ctl.evidence == {15: 2, 31: 2, 63: 1}
    ctl.observe(7, [1.0, 1.0], num_requests=0)  # an empty step changes nothing
    assert 7 not in ctl.tau
    with pytest.raises(ValueError, match=r"budget 63 measures budgets \[15, 31, 63\]; got 2"):
        ctl.observe(63, [1.0, 2.0], num_requests=1)


def test_a_stale_tau_of_a_larger_nested_budget_follows_the_smaller_ones_up():
    """Session 42 (the tiny pair's measured table): bucket 1 ran the chain (15, blind to 63)
    through repetitive text. Its fresh tau(15) rose past the tau(63) left from before, and bucket 4,
    settled at 63, went to 15 (1.7 % cheaper there) for a step, until 15's own tau fell. On any step
    63's tree accepts at least what 15's does, so tau(63) follows tau(15) up and bucket 4 stays."""
    table = {
        "cost_ms": {"1": {"15": 3.229, "63": 3.42}, "4": {"15": 4.835, "63": 4.919}},
        "warmup_steps": 1,
        "probe_interval": 0,
    }
    ctl = _controller(table, tau={15: 12.0, 63: 14.5})
    assert ctl.measured_by(63) == (15, 63) and ctl.measured_by(15) == (15,)
    assert ctl.choose(4) == 63
    ctl.tau[15] = 14.4  # as 63's steps measured it: the chain is 5.6 % cheaper at C = 1
    assert ctl.choose(1) == 15
    for _ in range(6):  # the chain's own steps, blind to 63, accept 15.5 tokens
        ctl.observe(15, [15.5], 1)
    assert ctl.tau[15] > 15.0 and ctl.tau[63] == ctl.tau[15]
    assert ctl.choose(4) == 63 and ctl.choose(1) == 15
    ctl.observe(15, [1.0], 1)  # the repetition ends: 15 falls, 63 keeps its bound
    assert ctl.tau[15] < 12.5 < ctl.tau[63]
    assert ctl.choose(1) == 63


def test_without_nesting_a_step_measures_only_its_own_budget():
    """nested=False (a simulated tau per budget): every candidate is explored at its own budget
    and keeps the tau its own steps gave."""
    policy = BudgetPolicy.from_dict({**TABLE, "warmup_steps": 1, "probe_interval": 0})
    ctl = BudgetController(policy, horizon=L, nested=False)
    assert [ctl.measured_by(b) for b in (3, 7, 15, 31, 63)] == [(3,), (7,), (15,), (31,), (63,)]
    seen = []
    for _ in range(3):  # bucket 4 = {7, 15, 31}: each explored by a step at itself
        b = ctl.choose(4)
        seen.append(b)
        ctl.observe(b, [4.0 * {7: 3.0, 15: 3.0, 31: 4.0}[b]], 4)
    assert sorted(seen) == [7, 15, 31]
    assert ctl.tau == {7: 3.0, 15: 3.0, 31: 4.0}
    with pytest.raises(ValueError, match=r"budget 31 measures budgets \[31\]; got 2"):
        ctl.observe(31, [1.0, 2.0], num_requests=1)


def test_unmeasured_candidates_are_explored_then_probed():
    policy = BudgetPolicy.from_dict({**TABLE, "warmup_steps": 2, "probe_interval": 4})
    ctl = BudgetController(policy, horizon=L)
    # bucket 4 = {7, 15, 31}: 7 is measured only by a step at 7 (< L), 15 and 31 by 31
    seen = []
    for _ in range(4):
        b = ctl.choose(4)
        seen.append(b)
        ctl.observe(b, [4.0 * (i + 2) for i in range(len(ctl.measured_by(b)))], 4)
    assert seen == [7, 7, 31, 31]
    # now all measured: tau 7 = 2, 15 = 2, 31 = 3 -> 7 (2/30) beats 15 (2/37) and 31 (3/60);
    # a probe at 31 costs 2x a step at 7, so it comes every 4 x 2 = 8 steps, not every 4
    assert [ctl.choose(4) for _ in range(16)] == ([7] * 7 + [31]) * 2


def test_probes_cost_under_one_interval_th_of_the_time_at_any_cost_ratio():
    """A flat probe interval spent 5 % of the 27B's C = 32 throughput probing budget 63 (290 ms a
    step) beside budget 7 (71 ms); the period scales with the probe's cost."""
    table = {"cost_ms": {"1": {"7": 71.2, "15": 99.6, "63": 289.7}}, "warmup_steps": 1}
    ctl = _controller(table, tau={7: 2.6, 15: 3.0, 63: 4.2})
    picks = [ctl.choose(1) for _ in range(64 * 5 * 3)]
    assert picks.count(63) == 3 and picks[64 * 5 - 1] == 63  # every 64 x ceil(289.7 / 71.2) steps
    assert set(picks) == {7, 63}
    cost = {int(b): ms for b, ms in table["cost_ms"]["1"].items()}
    probing = sum(cost[b] for b in picks) / (len(picks) * cost[7]) - 1
    assert 0 < probing < 1 / 64
    # the chosen budget is the largest, which measures 15 but not 7 (< L): the probe is a step at
    # 7, as cheap as the chosen one's, so every 64 x ceil(71.2 / 289.7) = 64 steps
    wide = _controller(table, tau={7: 1.0, 15: 1.0, 63: 9.0})
    assert [wide.choose(1) for _ in range(128)] == ([63] * 63 + [7]) * 2


def test_a_budget_past_the_horizon_still_probes_the_smaller_ones_and_leaves_a_noisy_choice():
    """27B, C = 8, candidates {7, 31} (session 21): a step at 31 (chain-inclusive) does not
    measure 7 (best-first). Warm-up measured 7 at 3.0 where its tau is 3.17, so 31 won by 1 %;
    probing only the largest budget never measured 7 again and the bucket ran 31 for good. Probes
    of 7 bring its tau back and the bucket moves to 7 once the gain passes the hysteresis."""
    table = {"cost_ms": {"8": {"7": 33.9, "31": 44.7}}, "warmup_steps": 1, "probe_interval": 4}
    ctl = BudgetController(BudgetPolicy.from_dict(table), horizon=L)
    assert ctl.measured_by(31) == (31,) and ctl.measured_by(7) == (7,)
    seen = []
    for _ in range(80):
        b = ctl.choose(8)
        seen.append(b)
        ctl.observe(b, [8 * {7: 3.0 if len(seen) == 1 else 3.4, 31: 4.0}[b]], 8)
    # explored (7, then 31), then 31: 8 x 4 / 44.7 = 0.716 beats 8 x 3 / 33.9 = 0.708
    assert seen[:5] == [7, 31, 31, 31, 31]
    # a probe of 7 every 4 x ceil(33.9 / 44.7) = 4 steps moves tau(7) by ema_alpha of each
    # reading, 3.0 -> 3.08 -> 3.144 -> 3.195: 8 x 3.195 / 33.9 = 0.754 passes 0.716 x 1.05 = 0.752
    assert seen[5:14] == ([7] + [31] * 3) * 2 + [7]
    # then 7, with 31 probed every 4 x ceil(44.7 / 33.9) = 8 steps
    assert seen[14:38] == ([7] * 7 + [31]) * 3
    assert ctl.tau[7] > 3.39


def test_probes_take_turns_among_the_candidates_the_chosen_budget_does_not_measure():
    """Without nesting (a simulated tau per budget) a step at 31 measures neither 7 nor 15:
    each probe goes to the one measured longer ago, the larger first when neither was."""
    table = {"cost_ms": {"4": {"7": 30.0, "15": 30.0, "31": 30.0}}, "probe_interval": 2}
    ctl = BudgetController(BudgetPolicy.from_dict(table), horizon=L, nested=False)
    picks = []
    for _ in range(40):
        b = ctl.choose(4)
        picks.append(b)
        ctl.observe(b, [4 * {7: 2.0, 15: 2.5, 31: 4.0}[b]], 4)
    assert picks[:24] == [7] * 8 + [15] * 8 + [31] * 8  # warm-up: 8 steps each
    assert picks[24:32] == [31, 7, 31, 15, 31, 7, 31, 15]  # every 2nd step a probe, in turns


def test_observing_the_largest_budget_measures_the_bucket_at_once():
    ctl = BudgetController(BudgetPolicy.from_dict(TABLE), horizon=L)
    assert ctl.choose(1) == 63
    ctl.observe(63, [2.0, 3.6, 3.6], num_requests=1)
    assert ctl.choose(1) == 31  # 3.6/33 beats 3.6/40 and 2/30


BAD = [
    ([], "the config must be a JSON object; got list"),
    ({"cost": {}}, "unknown key 'cost'; valid keys: cost_ms, ema_alpha"),
    (
        {},
        r'cost_ms=None is not valid; valid: a non-empty object \{"<batch size>": \{"<budget>": '
        r"<ms per step>, \.\.\.\}, \.\.\.\}$",
    ),
    ({"cost_ms": {}}, "cost_ms={} is not valid"),
    ({"cost_ms": {"0": {"15": 1}}}, "batch-size key '0' is not valid; valid: an integer >= 1"),
    ({"cost_ms": {"x": {"15": 1}}}, "batch-size key 'x' is not valid"),
    (
        {"cost_ms": {"1": {}}},
        r"cost_ms\['1'\]=\{\} is not valid; valid: a non-empty object "
        r'\{"<budget>": <ms per step>, \.\.\.\}$',
    ),
    ({"cost_ms": {"1": [15]}}, r"cost_ms\['1'\]=\[15\] is not valid"),
    ({"cost_ms": {"1": {"-3": 1}}}, "budget key '-3' is not valid"),
    ({"cost_ms": {"1": {"15": 0}}}, r"cost_ms\['1'\]\['15'\]=0 is not valid; valid: a number > 0"),
    ({"cost_ms": {"1": {"15": "fast"}}}, r"cost_ms\['1'\]\['15'\]='fast' is not valid"),
    ({"cost_ms": {"1": {"15": True}}}, r"cost_ms\['1'\]\['15'\]=True is not valid"),
    (
        {"cost_ms": {"1": {"15": 1}}, "ema_alpha": 0},
        "ema_alpha=0 is not valid; valid: a number > 0 and <= 1",
    ),
    ({"cost_ms": {"1": {"15": 1}}, "ema_alpha": 1.5}, "ema_alpha=1.5 is not valid"),
    (
        {"cost_ms": {"1": {"15": 1}}, "hysteresis": -0.1},
        "hysteresis=-0.1 is not valid; valid: a number >= 0$",  # no upper bound to name
    ),
    (
        {"cost_ms": {"1": {"15": 1}}, "warmup_steps": 0},
        "warmup_steps=0 is not valid; valid: an integer >= 1",
    ),
    ({"cost_ms": {"1": {"15": 1}}, "warmup_steps": 2.0}, "warmup_steps=2.0 is not valid"),
    ({"cost_ms": {"1": {"15": 1}}, "warmup_steps": True}, "warmup_steps=True is not valid"),
    (
        {"cost_ms": {"1": {"15": 1}}, "probe_interval": -1},
        "probe_interval=-1 is not valid; valid: an integer >= 0",
    ),
    (
        {"cost_ms": {"1": {"15": 1}}, "measure_interval": 0},
        "measure_interval=0 is not valid; valid: an integer >= 1",
    ),
    ({"cost_ms": {"1": {"15": 1}}, "measure_interval": 2.5}, "measure_interval=2.5 is not valid"),
]


@pytest.mark.parametrize(("raw", "msg"), BAD)
def test_bad_configs_are_refused_in_one_line(raw, msg):
    with pytest.raises(BudgetConfigError, match=msg) as e:
        BudgetPolicy.from_dict(raw, "cfg.json")
    assert str(e.value).startswith("cfg.json: ") and "\n" not in str(e.value)


def test_boundary_values_are_accepted():
    p = BudgetPolicy.from_dict(
        {
            "cost_ms": {"1": {"1": 1e-3}},
            "ema_alpha": 1,
            "hysteresis": 0,
            "warmup_steps": 1,
            "probe_interval": 0,
            "measure_interval": 1,
        }
    )
    assert (p.budgets, p.ema_alpha, p.hysteresis, p.probe_interval) == ((1,), 1.0, 0.0, 0)
    assert p.measure_interval == 1


def test_unreadable_files_are_refused_in_one_line(tmp_path):
    with pytest.raises(
        BudgetConfigError, match=r"--speculative-adaptive-config='/nonexistent.json'"
    ):
        BudgetPolicy.load("/nonexistent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  'cost_ms': 1\n}")
    with pytest.raises(
        BudgetConfigError, match=r"cannot read a JSON config \(JSONDecodeError: "
    ) as e:
        BudgetPolicy.load(str(bad))
    assert "\n" not in str(e.value)
    # a readable file with a bad value: the error names the file, as the flag gave it
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"cost_ms": {"1": {"15": -2}}}))
    with pytest.raises(BudgetConfigError) as e:
        BudgetPolicy.load(str(wrong))
    assert str(e.value).startswith(f"--speculative-adaptive-config={str(wrong)!r}: cost_ms['1']")


@SETTINGS
@given(
    seed=st.integers(0, 2**31 - 1),
    horizon=st.integers(2, 6),
    budgets=st.lists(st.integers(1, 24), min_size=2, max_size=4, unique=True),
)
def test_a_step_measures_every_nested_budget_exactly(seed, horizon, budgets):
    """The accepted tokens of the tree cut to b (accepted_tokens_within over the big tree's walk)
    equal those of the b-tree built and walked on its own, for every b measured_by the big one."""
    g = torch.Generator().manual_seed(seed)
    bs, V = 3, 5
    logits = torch.randn(bs, horizon, V, generator=g) * 3
    roots = torch.randint(0, V, (bs,), generator=g)
    # the target's next token is a function of the node's (depth, token); mostly the drafter's argmax
    argmax_next = torch.cat([logits.argmax(-1), roots.unsqueeze(1)], dim=1)  # [bs, L + 1]
    noise = torch.randint(0, V, (bs, horizon + 1, V), generator=g)
    agree = torch.rand(bs, horizon + 1, V, generator=g) < 0.7
    table = torch.where(agree, argmax_next.unsqueeze(-1).expand(-1, -1, V), noise)

    def accepted(tree):
        d = tree.depths.clamp(min=0)
        tgt = table[torch.arange(bs).unsqueeze(1), d, tree.tokens]
        return walk_greedy(tree, tgt)

    big = max(budgets)
    ctl = BudgetController(
        BudgetPolicy.from_dict({"cost_ms": {"1": {str(b): 1.0 for b in budgets}}}), horizon
    )
    tree = build_ddtree(logits, big, roots)
    walk = accepted(tree)
    n = tree.width
    flat = torch.where(walk.accepted >= 0, walk.accepted + torch.arange(bs).unsqueeze(1) * n, -1)
    measured = ctl.measured_by(big)
    sums = accepted_tokens_within(flat.numpy(), n, measured)
    for b, total in zip(measured, sums, strict=True):
        alone = accepted(build_ddtree(logits, b, roots))
        assert total == float((alone.accept_len + 1).sum()), (b, big)


def test_the_benchmark_cost_table_is_a_valid_config_of_one_batch_levels():
    """benchmarks/adaptive_budget.py: a level that ran in rounds (C above max_running_requests)
    is no step cost, nor is a TP = 2 run of the same server; the DDTREE rows form a config the
    server accepts."""
    from benchmarks.adaptive_budget import cost_table, step_costs

    rec = dict(shape="s", variant="", simulated_accept_len=None, max_running_requests=2)
    records = [
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 1, "ms_per_step": 30.0},
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 2, "ms_per_step": 33.0},
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 4, "ms_per_step": 66.0},
        {**rec, "algorithm": "DDTREE", "budget": 63, "concurrency": 1, "ms_per_step": 42.0},
        {
            **rec,
            "algorithm": "DDTREE",
            "budget": 63,
            "concurrency": 1,
            "ms_per_step": 1.0,
            "variant": "stages",
        },
        {**rec, "algorithm": "AR", "budget": None, "concurrency": 1, "ms_per_step": 20.0},
        {**rec, "algorithm": "AR", "budget": None, "concurrency": 1, "ms_per_step": 5.0, "tp": 2},
        {
            **rec,
            "shape": "t",
            "algorithm": "AR",
            "budget": None,
            "concurrency": 2,
            "ms_per_step": 9.0,
        },
    ]
    costs = step_costs(records, "s")
    assert costs == {
        ("DDTREE", 15): {1: 30.0, 2: 33.0},
        ("DDTREE", 63): {1: 42.0},
        ("AR", None): {1: 20.0},
    }
    table = cost_table(costs)
    assert table == {"1": {"15": 30.0, "63": 42.0}, "2": {"15": 33.0}}
    assert BudgetPolicy.from_dict({"cost_ms": table}).budgets == (15, 63)
    # without the prefill: only the levels that timed it, at their decode cost
    records[0]["decode_ms_per_step"] = 27.0
    records[5]["decode_ms_per_step"] = 17.5
    decode = step_costs(records, "s", field="decode_ms_per_step")
    assert decode == {("DDTREE", 15): {1: 27.0}, ("AR", None): {1: 17.5}}
    # the fused-norm servers' costs form their own table, never mixed with the plain ones
    records.append({**records[0], "variant": "fused-norms", "ms_per_step": 24.0})
    assert step_costs(records, "s") == costs
    assert step_costs(records, "s", variant="fused-norms") == {("DDTREE", 15): {1: 24.0}}


def test_the_projection_rows_are_the_levels_ddtree_was_measured_at(tmp_path):
    """Session 7's table has DFLASH at C = 2 and DDTREE only at C = 1 and 8: the projection used to
    take every algorithm's levels and crashed on a C with no DDTREE cost."""
    import json

    from benchmarks.adaptive_budget import main

    rec = dict(shape="s", variant="", simulated_accept_len=None, max_running_requests=64)
    records = [
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 1, "ms_per_step": 27.5},
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 8, "ms_per_step": 37.5},
        {**rec, "algorithm": "DFLASH", "budget": None, "concurrency": 1, "ms_per_step": 26.6},
        {**rec, "algorithm": "DFLASH", "budget": None, "concurrency": 2, "ms_per_step": 27.6},
        {**rec, "algorithm": "DFLASH", "budget": None, "concurrency": 8, "ms_per_step": 39.3},
        {**rec, "algorithm": "DDTREE", "budget": 15, "concurrency": 32, "ms_per_step": 90.0},
        # DFLASH at C = 32 ran in rounds: a served throughput for the baseline column only
        {**rec, "algorithm": "DFLASH", "concurrency": 32, "ms_per_step": 495.4}
        | {"budget": None, "max_running_requests": 10},
    ]
    (tmp_path / "scale.json").write_text(json.dumps(records))
    accept = {
        "rows": [
            dict(pair="p", method="dflash", completion_tokens=[30], verify_steps=[10]),
            dict(
                pair="p",
                method="ddtree",
                chain=True,
                tree_temperature=0.75,
                budget=15,
                completion_tokens=[30],
                verify_steps=[10],
            ),
        ]
    }
    (tmp_path / "acc.json").write_text(json.dumps(accept))
    out = main(
        ["--scale", str(tmp_path / "scale.json"), "--shape", "s", "--pair", "p", "--steps", "50"]
        + ["--acceptance", str(tmp_path / "acc.json")]
    )
    assert [r["concurrency"] for r in out["rows"]] == [1, 8, 32]
    row8, row32 = out["rows"][1:]
    assert row8["baseline_tokens_per_s"]["DFLASH"] == pytest.approx(8 * 3.0 * 1000 / 39.3)
    assert row8["baselines_in_rounds"] == []
    assert row32["baseline_tokens_per_s"]["DFLASH"] == pytest.approx(32 * 3.0 * 1000 / 495.4)
    assert row32["baselines_in_rounds"] == ["DFLASH"]
    assert "32" in out["settings"]["cost_ms"] and "DFLASH" not in str(out["settings"]["cost_ms"])


def test_the_projection_pools_acceptance_runs_of_one_prompt_set(tmp_path, capsys):
    """Budgets 15/31/63 and 3/7 come from two chain_inclusive runs; their ratios to DFLASH are
    comparable only when both ran the same prompts (the same DFLASH tau), else it is refused."""
    import json

    from benchmarks.adaptive_budget import main

    rec = dict(shape="s", variant="", simulated_accept_len=None, max_running_requests=64)
    records = [
        {**rec, "algorithm": "DDTREE", "budget": b, "concurrency": 1, "ms_per_step": ms}
        for b, ms in ((7, 26.0), (15, 28.0))
    ]
    (tmp_path / "scale.json").write_text(json.dumps(records))

    def run(budget, dflash_tokens):
        common = dict(pair="p", verify_steps=[10])
        rows = [dict(common, method="dflash", completion_tokens=[dflash_tokens])]
        rows.append(
            dict(common, method="ddtree", chain=True, tree_temperature=0.75, budget=budget)
            | {"completion_tokens": [budget * 2]}
        )
        path = tmp_path / f"acc{budget}_{dflash_tokens}.json"
        path.write_text(json.dumps({"rows": rows}))
        return str(path)

    argv = ["--scale", str(tmp_path / "scale.json"), "--shape", "s", "--pair", "p", "--steps", "20"]
    out = main(argv + ["--acceptance", run(15, 25), run(7, 25)])
    # tau = 3.0 x DDTREE(B) / DFLASH: 15 -> 3.0 x 3.0 / 2.5, 7 -> 3.0 x 1.4 / 2.5
    assert out["settings"]["tau"] == {7: pytest.approx(1.68), 15: pytest.approx(3.6)}
    with pytest.raises(SystemExit):
        main(argv + ["--acceptance", run(15, 25), run(7, 30)])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "file 2 has DFLASH tau 3.0000" in err and "earlier file 2.5000" in err


def test_the_projection_takes_only_the_budgets_asked_for(tmp_path, capsys):
    """``--budgets 7 15``: the written config and the projection have those candidates only (the
    27B run at simulated tau leaves out 63); a budget without records is refused by name."""
    import json

    from benchmarks.adaptive_budget import main

    rec = dict(shape="s", variant="", simulated_accept_len=None, max_running_requests=64)
    records = [
        {**rec, "algorithm": "DDTREE", "budget": b, "concurrency": 1, "ms_per_step": ms}
        for b, ms in ((7, 26.0), (15, 28.0), (63, 34.0))
    ]
    (tmp_path / "scale.json").write_text(json.dumps(records))
    rows = [dict(pair="p", method="dflash", completion_tokens=[25], verify_steps=[10])]
    rows += [
        dict(pair="p", method="ddtree", chain=True, tree_temperature=0.75, budget=b)
        | {"completion_tokens": [c], "verify_steps": [10]}
        for b, c in ((7, 26), (15, 25), (63, 40))
    ]
    (tmp_path / "acc.json").write_text(json.dumps({"rows": rows}))
    argv = ["--scale", str(tmp_path / "scale.json"), "--shape", "s", "--pair", "p", "--steps", "20"]
    argv += ["--acceptance", str(tmp_path / "acc.json")]
    out = main(argv + ["--budgets", "7", "15", "--write-config", str(tmp_path / "c.json")])
    assert json.loads((tmp_path / "c.json").read_text()) == {
        "cost_ms": {"1": {"7": 26.0, "15": 28.0}}
    }
    assert set(out["settings"]["tau"]) == {7, 15}
    assert "acc=7@3.12/15@3.00" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(argv + ["--budgets", "7", "31"])
    assert (
        "--budgets [7, 31]: valid are budgets with records, [7, 15, 63]" in capsys.readouterr().err
    )


def test_the_host_cost_benchmark_times_valid_walks_and_refuses_bad_sizes(tmp_path):
    """benchmarks.budget_host_cost: its walks are the walk's layout (root first, slots rising,
    -1 padded, each row in its own block of width: slot 0 counts the roots, slot 63 every node);
    it writes a row a batch size, and a bad size is one line naming it."""
    import json

    import numpy as np

    from benchmarks.budget_host_cost import main, walks

    w = walks(5, 64, 16, seed=3)
    for b, row in enumerate(w):
        path = row[row >= 0] - b * 64
        assert path[0] == 0 and np.all(np.diff(path) > 0) and path[-1] < 64
        assert np.all(row[len(path) :] == -1)
    assert accepted_tokens_within(w, 64, [0, 63]) == [5, int((w >= 0).sum())]
    out = tmp_path / "t.json"
    main(["--batch-sizes", "1,3,8", "--repeats", "3", "--json", str(out), "--device", "cpu"])
    table = json.loads(out.read_text())
    rows = table["rows"]
    assert table["device"] == "cpu" and [r["bs"] for r in rows] == [1, 3, 8]
    calls = ("choose", "copy", "sums", "observe")
    for r in rows:
        assert all(r[f"{k}_us"] > 0 for k in calls)
        assert r["total_us"] == pytest.approx(sum(r[f"{k}_us"] for k in calls), abs=0.03)
        # a step at the tiny config's measure_interval (the default, 4): choose, and a quarter of
        # the rest; at bs 8 the bucket has 63 alone (the chain is dearer there): choose only
        measured = (r["total_us"] - r["choose_us"]) * (r["bs"] != 8)
        assert r["per_step_us"] == pytest.approx(r["choose_us"] + measured / 4, abs=0.03)
    assert table["measure_interval"] == 4
    with pytest.raises(SystemExit, match="--batch-sizes '0'"):
        main(["--batch-sizes", "0"])
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="--device cuda: no CUDA device here; valid: cpu"):
            main(["--device", "cuda"])


def test_the_host_copy_is_a_copy_the_sums_read():
    """budget.host_copy: the node ids' values in new host storage (pinned only for a GPU source),
    which accepted_tokens_within reads as it reads the ids."""
    from sglang_spec.plugin.budget import host_copy

    ids = torch.tensor([[0, 3, 9, -1], [64, 70, -1, -1]], dtype=torch.int32)
    host = host_copy(ids)
    assert torch.equal(host, ids) and host.data_ptr() != ids.data_ptr()
    assert host.dtype == ids.dtype and not host.is_pinned()
    ids[0, 1] = 5  # the source moves on (the next step): the copy keeps this step's ids
    assert host[0, 1] == 3
    assert accepted_tokens_within(host.numpy(), 64, [3, 63]) == [3, 5]


def test_a_budget_that_measures_every_candidate_is_measured_one_step_in_measure_interval():
    """A step whose budget measures every candidate of its bucket feeds tau once in
    measure_interval steps (its host copy and sums cost about 2 % of the tiny pair's host-bound
    step, session 40); warm-up steps, probes and a budget blind to some candidate feed it every
    step. Horizon 15: a step at 7 measures 3 and 7 (both below L). Horizon 5: 7 holds the chain and
    3 does not, so 7 is blind to 3 (a probe at 3 every 4 steps)."""

    def steps(horizon: int) -> list[tuple[int, bool]]:
        policy = BudgetPolicy.from_dict(
            {
                "cost_ms": {"1": {"3": 10, "7": 10}},
                "warmup_steps": 1,
                "probe_interval": 4,
                "measure_interval": 3,
            }
        )
        ctl = BudgetController(policy, horizon=horizon)
        out = []
        for _ in range(10):
            b = ctl.choose(1)
            out.append((b, ctl.measure))
            if ctl.measure:  # 3 accepts 2 tokens, 7 accepts 4: 7 is chosen
                ctl.observe(b, [2.0 if m == 3 else 4.0 for m in ctl.measured_by(b)], 1)
        return out

    # warm-up: one step at 7 measures both; then every third step
    assert steps(15) == [(7, True)] + [(7, False), (7, False), (7, True)] * 3
    # warm-up at 3 and 7; 7 is blind to 3: every step measured, probes at 3 included
    assert steps(5) == [(3, True)] + [(7, True)] * 4 + [(3, True)] + [(7, True)] * 3 + [(3, True)]
    every = BudgetController(
        BudgetPolicy.from_dict({"cost_ms": {"1": {"3": 10, "7": 10}}, "measure_interval": 1}),
        horizon=15,
    )
    for _ in range(12):
        assert every.choose(1) == 7
        assert every.measure
        every.observe(7, [2.0, 4.0], 1)
