"""Budget by batch size: the DDTree budget (verify width) a decode step runs at, per batch size.

A tree pays for every node it verifies. At one request the verify pass is memory-bound and a wide
tree is nearly free; at many it is compute-bound and a wide tree costs more than its extra accepted
tokens (SGLang #19952; the vLLM port measured budget optima 16 -> 8 -> 4 at batch 2/4/16). So for a
running batch of C requests :class:`BudgetController` runs the candidate budget B that maximises the
expected throughput

    C * tau(B) / t(C, B)

* ``t(C, B)``: milliseconds per decode step of the server's shape at batch size C and budget B, from
  a cost table (the config file below; ``benchmarks/adaptive_budget.py --write-config`` makes one
  from the real-scale harness's records, ``benchmarks/results/scale_h200.json``);
* ``tau(B)``: accepted tokens per request per step (the bonus token included, SGLang's
  ``accept_lens``), an exponential moving average tracked online per budget.

Only DDTREE's own modules use this one; it imports no SGLang.

Config file (JSON; for DDTREE, the file ``--speculative-adaptive-config`` names)::

    {
      "cost_ms": {"1": {"15": 29.2, "63": 42.0}, "2": {"15": 33.3}, "8": {"15": 43.0}},
      "ema_alpha": 0.2,
      "hysteresis": 0.05,
      "warmup_steps": 8,
      "probe_interval": 64,
      "measure_interval": 4
    }

* ``cost_ms`` (required): batch-size bucket -> {candidate budget: ms per decode step}. A running
  batch (padded to its CUDA-graph batch size when graphs are on, as SGLang's adaptive EAGLE does)
  uses the largest bucket <= its size, the smallest bucket below that; the bucket's budgets are
  its candidates and each runs with its own captured verify graphs, less any nested in a strictly
  cheaper one of the bucket (it never accepts more, so no tau makes it the choice; a bucket left
  with one candidate runs it and measures nothing, as a fixed budget does). The candidate budgets
  of the server are the union over the buckets.
* ``ema_alpha`` (default 0.2, in (0, 1]): weight of the newest measured step in tau's moving
  average.
* ``hysteresis`` (default 0.05, >= 0): a bucket leaves its budget only for one whose expected
  throughput is higher by more than this fraction, so noise in tau does not flap the width.
* ``warmup_steps`` (default 8, >= 1): steps of evidence each candidate needs before the choice
  trusts its tau; until then the bucket runs the budget that measures it.
* ``probe_interval`` (default 64, >= 0; 0 = never): once the bucket has chosen, a probe keeps
  the tau of the candidates the chosen budget's steps do not measure fresh: one step at the
  largest budget that measures the least recently measured of them, every ``probe_interval x
  ceil(t(probe) / t(chosen))`` steps. The period grows with the probe's cost, so probing costs
  under 1 / probe_interval of the bucket's time at any batch size (at a flat interval, a 27B
  probe of budget 63 at C = 32, 4x the chosen budget 7's step, cost 5 % of the throughput). A
  chosen budget that measures every candidate needs no probe. Probing only the largest budget
  would leave a chosen budget at or above the horizon L blind to the candidates below L (whose
  best-first trees a chain-inclusive tree does not contain), so one noisy warm-up estimate would
  fix the choice for good (the 27B shape at C = 8 ran budget 31 at 595 tokens/s that way, where 7
  served 622).
* ``measure_interval`` (default 4, >= 1; 1 = every step): while a bucket runs a budget that
  measures every candidate of the bucket, one step in ``measure_interval`` feeds tau; warm-up
  steps, and every step of a bucket whose budget is blind to some candidate (its probes
  included), always do. Measuring a step costs its host copy and its sums per budget, about 2 %
  of the tiny pair's host-bound step on an H100 (py-spy, session 40: the adaptive server's steps
  were 2-5 % slower than the fixed DDTREE(63)'s at the same budget, with every server on every CPU
  block in turn), where a fixed budget pays nothing. Sampling a budget that measures every
  candidate only delays a switch (the moving average follows every fourth step); a blind one must
  see its own tau fall at once, since the switch back to the budget it cannot measure waits on
  that (the tiny pair at C = 1 runs budget 15, the chain, through repetitive text, where it
  accepts as much as 63 and costs less, and must leave it when the repetition ends).

Measuring tau: DDTree trees are nested. Slots are in selection order (best-first, the
chain-inclusive tree's chain first), so the tree of budget b is the first ``b + 1`` slots of the
tree of a budget B >= b built from the same draft, provided both contain the chain (b >= L) or
neither does (B < L), L being the drafter horizon. Verification walks down the target's tokens and
slot indices grow along every path, so the tree of budget b accepts exactly the accepted nodes of
the B-tree whose slot is <= b (for greedy verification; for sampling, in distribution).
:func:`accepted_tokens_within` computes that (the worker runs it on the host copy of a step's
accepted node ids), and one step at B updates tau of every candidate it measures
(:meth:`BudgetController.measured_by`), not only B's. For the same reason a budget's tau is kept
at least that of every candidate nested in it: a larger budget's tau, left behind by steps blind
to it, follows a smaller one's up.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from sglang_spec.tree.build import nested_in
from sglang_spec.tree.head import captured_batch_size

CONFIG_KEYS = (
    "cost_ms",
    "ema_alpha",
    "hysteresis",
    "warmup_steps",
    "probe_interval",
    "measure_interval",
)


class BudgetConfigError(ValueError):
    """A budget-by-batch-size config that must be refused (one line: the value and what is valid)."""


def _int_key(raw: str, what: str, where: str) -> int:
    if not (isinstance(raw, str) and raw.isdigit() and int(raw) >= 1):
        raise BudgetConfigError(
            f"{where}: {what} key {raw!r} is not valid; valid: an integer >= 1 written as a string"
        )
    return int(raw)


def _number(raw: Any, name: str, where: str, lo: float, hi: float, lo_open: bool) -> float:
    ok = (
        isinstance(raw, int | float)
        and not isinstance(raw, bool)
        and math.isfinite(raw)
        and (raw > lo if lo_open else raw >= lo)
        and raw <= hi
    )
    if not ok:
        bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi == math.inf else f" and <= {hi:g}")
        raise BudgetConfigError(f"{where}: {name}={raw!r} is not valid; valid: a number {bound}")
    return float(raw)


def _count(raw: Any, name: str, where: str, lo: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < lo:
        raise BudgetConfigError(f"{where}: {name}={raw!r} is not valid; valid: an integer >= {lo}")
    return raw


@dataclass(frozen=True)
class BudgetPolicy:
    """A validated config: the cost table and the controller's knobs."""

    cost_ms: dict[int, dict[int, float]]  # bucket (batch size) -> {budget: ms per decode step}
    ema_alpha: float = 0.2
    hysteresis: float = 0.05
    warmup_steps: int = 8
    probe_interval: int = 64
    measure_interval: int = 4

    @classmethod
    def from_dict(cls, raw: Any, where: str = "budget config") -> BudgetPolicy:
        """Validate ``raw`` (parsed JSON); ``where`` names its source in every error."""
        if not isinstance(raw, dict):
            raise BudgetConfigError(
                f"{where}: the config must be a JSON object; got {type(raw).__name__}"
            )
        unknown = sorted(set(raw) - set(CONFIG_KEYS))
        if unknown:
            raise BudgetConfigError(
                f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(CONFIG_KEYS)}"
            )
        table = raw.get("cost_ms")
        if not isinstance(table, dict) or not table:
            raise BudgetConfigError(
                f"{where}: cost_ms={table!r} is not valid; valid: a non-empty object "
                '{"<batch size>": {"<budget>": <ms per step>, ...}, ...}'
            )
        cost: dict[int, dict[int, float]] = {}
        for bucket_raw, row in table.items():
            bucket = _int_key(bucket_raw, "cost_ms batch-size", where)
            if not isinstance(row, dict) or not row:
                raise BudgetConfigError(
                    f"{where}: cost_ms[{bucket_raw!r}]={row!r} is not valid; valid: a non-empty "
                    'object {"<budget>": <ms per step>, ...}'
                )
            cost[bucket] = dict(
                sorted(
                    (
                        _int_key(b, "budget", where),
                        _number(ms, f"cost_ms[{bucket_raw!r}][{b!r}]", where, 0, math.inf, True),
                    )
                    for b, ms in row.items()
                )
            )
        return cls(
            cost_ms=dict(sorted(cost.items())),
            ema_alpha=_number(raw.get("ema_alpha", 0.2), "ema_alpha", where, 0.0, 1.0, True),
            hysteresis=_number(
                raw.get("hysteresis", 0.05), "hysteresis", where, 0.0, math.inf, False
            ),
            warmup_steps=_count(raw.get("warmup_steps", 8), "warmup_steps", where, 1),
            probe_interval=_count(raw.get("probe_interval", 64), "probe_interval", where, 0),
            measure_interval=_count(raw.get("measure_interval", 4), "measure_interval", where, 1),
        )

    @classmethod
    def load(cls, path: str) -> BudgetPolicy:
        """Read and validate the JSON file at ``path``."""
        where = f"--speculative-adaptive-config={path!r}"
        try:
            with open(path) as f:
                raw = json.load(f)
        except (OSError, ValueError) as e:
            raise BudgetConfigError(
                f"{where}: cannot read a JSON config ({type(e).__name__}: {e})"
            ) from None
        return cls.from_dict(raw, where)

    @property
    def budgets(self) -> tuple[int, ...]:
        """Every candidate budget of the server, ascending."""
        return tuple(sorted({b for row in self.cost_ms.values() for b in row}))

    @property
    def buckets(self) -> tuple[int, ...]:
        return tuple(self.cost_ms)

    def bucket(self, batch_size: int) -> int:
        """The bucket of a (padded) batch size: the largest <= it, else the smallest."""
        buckets = self.buckets
        return buckets[max(0, bisect.bisect_right(buckets, batch_size) - 1)]


class BudgetController:
    """Chooses the budget of each decode step and tracks tau per budget (module docstring).

    ``horizon`` is the drafter's L (it decides which budgets a step measures);
    ``cuda_graph_bs`` the server's CUDA-graph batch sizes (None: graphs off), to which a batch is
    padded before its bucket is looked up. ``nested=False`` makes a step measure only its own
    budget: under a simulated tau per budget (benchmarks), the accepted path is drawn for the
    budget that ran and says nothing of the trees nested in it. ``on_switch(bucket, old, new,
    tau)`` is called whenever a bucket settles on a budget (``old`` None the first time) with a
    copy of the tau per budget that decided it, e.g. for a log line. After each :meth:`choose`,
    ``measure`` says whether that step is to be measured (:meth:`observe`) or only run.
    """

    def __init__(
        self,
        policy: BudgetPolicy,
        horizon: int,
        cuda_graph_bs: Sequence[int] | None = None,
        nested: bool = True,
        on_switch: Callable[[int, int | None, int, dict[int, float]], None] | None = None,
    ):
        self.policy = policy
        self.horizon = int(horizon)
        self.nested = nested
        self.on_switch = on_switch
        self.cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None
        self.tau: dict[int, float] = {}  # budget -> EMA of accepted tokens per request per step
        self.evidence: dict[int, int] = {}  # budget -> steps that measured it
        self._measured_at: dict[int, int] = {}  # budget -> the observed step that last measured it
        self._observed = 0  # observed (non-empty) steps
        self._current: dict[int, int] = {}  # bucket -> budget it runs outside exploration
        self._since_probe: dict[int, int] = {}  # bucket -> steps since its last probe
        self.measure = True  # whether the step choose() picked last is to be measured
        self._since_measure = 0  # steps chosen since the last one measured
        # measured_by of every candidate, asked several times a step: computed once
        self._measured = {b: self._nested_candidates(b) for b in policy.budgets}
        # bucket -> the candidates that can win there, ascending (:meth:`_can_win`)
        self.candidates = {k: self._can_win(row) for k, row in policy.cost_ms.items()}

    # -------------------------------------------------------------------------- routing
    def bucket_of(self, batch_size: int) -> int:
        padded = None
        if self.cuda_graph_bs is not None:
            padded = captured_batch_size(self.cuda_graph_bs, batch_size)
        return self.policy.bucket(batch_size if padded is None else padded)

    def measured_by(self, budget: int) -> tuple[int, ...]:
        """The candidate budgets one step at ``budget`` measures (nested trees), ascending."""
        known = self._measured.get(budget)
        return known if known is not None else self._nested_candidates(budget)

    def _nested_candidates(self, budget: int) -> tuple[int, ...]:
        if not self.nested:
            return (budget,)
        return tuple(b for b in self.policy.budgets if nested_in(b, budget, self.horizon))

    def _can_win(self, costs: dict[int, float]) -> tuple[int, ...]:
        """The budgets of a bucket's ``costs`` that some tau could make its choice: not those nested
        in a strictly cheaper one of the bucket, whose tau is never below theirs. The tiny pair's
        H200 table prices the chain (15) above 63 at C = 8 and 32, so there the adaptive server
        runs 63 as the fixed server does, measuring nothing and capturing no graphs for 15."""
        return tuple(
            b
            for b in sorted(costs)
            if not any(
                b != big and b in self.measured_by(big) and costs[big] < costs[b] for big in costs
            )
        )

    @property
    def budgets(self) -> tuple[int, ...]:
        """Every budget some bucket may run, ascending: the policy's, less those no bucket keeps."""
        return tuple(sorted({b for row in self.candidates.values() for b in row}))

    def cuda_graph_bs_for_budget(self, budget: int) -> list[int]:
        """The CUDA-graph batch sizes whose bucket keeps ``budget`` as a candidate: the verify
        graphs that width needs (the others could never be replayed at it)."""
        return [
            bs
            for bs in self.cuda_graph_bs or ()
            if budget in self.candidates[self.policy.bucket(bs)]
        ]

    def _measuring_budget(self, bucket: int, want: int) -> int:
        """The largest candidate of ``bucket`` whose step measures budget ``want``."""
        return max(b for b in self.candidates[bucket] if want in self.measured_by(b))

    # --------------------------------------------------------------------------- choice
    def expected_tokens_per_s(self, batch_size: int, budget: int) -> float:
        """C * tau(B) / t(C, B) in tokens per second (tau must be known)."""
        ms = self.policy.cost_ms[self.bucket_of(batch_size)][budget]
        return batch_size * self.tau[budget] * 1000.0 / ms

    def choose(self, batch_size: int) -> int:
        """The budget of the next decode step of ``batch_size`` requests (once the bucket has
        chosen, counts the step toward its next probe), and in ``measure`` whether to measure it:
        warm-up steps, the steps of a bucket whose budget is blind to some candidate (probes
        included), and one step in ``measure_interval`` of the others."""
        bucket = self.bucket_of(batch_size)
        candidates = self.candidates[bucket]
        if len(candidates) == 1:  # nothing to choose, so nothing to measure
            self.measure = False
            if bucket not in self._current:
                self._settle(bucket, None, candidates[0])
            return candidates[0]
        unsure = [b for b in candidates if self.evidence.get(b, 0) < self.policy.warmup_steps]
        if unsure:
            self._measure_next(forced=True)
            return self._measuring_budget(bucket, unsure[0])
        best = max(candidates, key=lambda b: (self.expected_tokens_per_s(batch_size, b), -b))
        current = self._current.get(bucket)
        if current is None or (
            best != current
            and self.expected_tokens_per_s(batch_size, best)
            > self.expected_tokens_per_s(batch_size, current) * (1.0 + self.policy.hysteresis)
        ):
            current = self._settle(bucket, current, best)
        # the candidates current's steps do not measure: a budget blind to some is measured every
        # step (its probes too: only such a budget has them)
        blind = [b for b in candidates if b not in self.measured_by(current)]
        self._measure_next(forced=bool(blind))
        return self._probe_or(bucket, current, blind)

    def _settle(self, bucket: int, old: int | None, new: int) -> int:
        """Make ``new`` the budget ``bucket`` runs (and say so through ``on_switch``)."""
        if self.on_switch is not None:
            self.on_switch(bucket, old, new, dict(self.tau))
        self._current[bucket] = new
        return new

    def _measure_next(self, forced: bool) -> None:
        """Set ``measure`` for the step just chosen: ``forced``, or ``measure_interval`` steps
        since the last measured one."""
        self._since_measure += 1
        self.measure = forced or self._since_measure >= self.policy.measure_interval
        if self.measure:
            self._since_measure = 0

    def _probe_or(self, bucket: int, current: int, blind: list[int]) -> int:
        """The probe when one is due, else ``current`` (module docstring: the probe is the largest
        budget that measures the least recently measured of ``blind``, the candidates ``current``
        does not measure; its period is ``probe_interval`` steps scaled by its cost over
        ``current``'s)."""
        interval = self.policy.probe_interval
        if not interval or not blind:
            return current
        stalest = min(blind, key=lambda b: (self._measured_at.get(b, -1), -b))
        probe = self._measuring_budget(bucket, stalest)
        costs = self.policy.cost_ms[bucket]
        since = self._since_probe.get(bucket, 0) + 1
        if since < interval * math.ceil(costs[probe] / costs[current]):
            self._since_probe[bucket] = since
            return current
        self._since_probe[bucket] = 0
        return probe

    # ---------------------------------------------------------------------- observation
    def observe(self, budget: int, accepted_sums: Sequence[float], num_requests: int) -> None:
        """Feed one decode step run at ``budget``: ``accepted_sums[i]`` is the batch's accepted
        tokens (bonus included) had the tree been cut to ``measured_by(budget)[i]``."""
        measured = self.measured_by(budget)
        if len(accepted_sums) != len(measured):
            raise ValueError(
                f"a step at budget {budget} measures budgets {list(measured)}; got "
                f"{len(accepted_sums)} sums"
            )
        if num_requests <= 0:
            return
        a = self.policy.ema_alpha
        self._observed += 1
        for b, total in zip(measured, accepted_sums, strict=True):
            x = float(total) / num_requests
            self.tau[b] = x if b not in self.tau else (1.0 - a) * self.tau[b] + a * x
            self.evidence[b] = self.evidence.get(b, 0) + 1
            self._measured_at[b] = self._observed
        self._keep_nested_order()

    def _keep_nested_order(self) -> None:
        """Raise each budget's tau to the largest of the candidates nested in it: on any step a
        tree accepts at least what a tree nested in it accepts, so a smaller budget's tau above a
        larger one's means the larger one's is stale, left by steps blind to it (a bucket at the
        chain, 15, cannot measure 63; session 42: its fresh tau(15) of 15.5 beside a stale
        tau(63) of 14.2 sent another bucket to 15 for one step, whose own tau then fell)."""
        for big in self.tau:
            for small in self.measured_by(big):
                if self.tau.get(small, 0.0) > self.tau[big]:
                    self.tau[big] = self.tau[small]


def host_copy(accept_index: torch.Tensor) -> torch.Tensor:
    """A host copy of one decode step's accepted node ids, queued in stream order: into pinned
    memory without a sync when they are on the GPU, to be read once the scheduler has the step's
    results (``DDTreeWorker.on_verify_complete_cpu``, :func:`accepted_tokens_within`). Summing
    them per measured budget on the device took about ten launches a step."""
    host = torch.empty(
        accept_index.shape, dtype=accept_index.dtype, pin_memory=accept_index.is_cuda
    )
    return host.copy_(accept_index, non_blocking=True)


def accepted_tokens_within(accept_index, width: int, limits: Sequence[int]) -> list[int]:
    """Per budget b in ``limits``, the batch's accepted tokens (root/bonus included) whose tree
    slot is <= b.

    ``accept_index [bs, D]`` is a host array (numpy, or anything ``numpy.asarray`` takes without a
    copy, such as a CPU tensor) of SGLang's flat accepted node ids (``request * width + slot``, root
    first, -1 padded): the worker sums the host copy of each step's ids once the scheduler has them
    (``DDTreeWorker.on_verify_complete_cpu``). On arrays this small numpy takes a fraction of
    torch's per-op overhead, and the adaptive server pays this every decode step
    (``benchmarks.budget_host_cost``).
    """
    import numpy as np

    ids = np.asarray(accept_index)
    slots = (ids - np.arange(ids.shape[0])[:, None] * width)[ids >= 0]
    return np.searchsorted(np.sort(slots), limits, side="right").tolist()
