"""DDTREE's configuration: one frozen :class:`DDTreeConfig` and every check SGLang's arguments pass.

Sources: SGLang's own flags (nothing new on the command line) and environment knobs. SGLang
0.5.23's plug-in API cannot add server arguments (``prepare_server_args`` builds its parser from the
``ServerArgs`` dataclass and ``ServerArgs.from_cli_args`` keeps only its fields), so DDTREE's own
server options are environment variables, read in the launcher and again in the scheduler
processes, which inherit the launcher's environment.

* ``--speculative-algorithm DDTREE``
* ``--speculative-draft-model-path``: the DFlash drafter (required).
* ``--speculative-num-draft-tokens N``: verify width = 1 + budget (default: twice the drafter
  block size, :func:`default_verify_width`).
* ``--speculative-dflash-block-size B``: must equal the drafter config's ``block_size`` when both
  are known.
* ``SGLANG_DDTREE_TOPK=K``: candidates kept per depth, ``1 <= K <= budget`` (default
  ``sglang_spec.tree.exact_topk``: the fewest that keep the best-first tree exact, ``budget - L +
  1`` for a chain-inclusive tree, 1 at budget L, ``budget`` below L). A smaller K shrinks the
  per-depth top-k and its TP all-gather at a possible cost in tree quality.
* ``SGLANG_DDTREE_TREE_TEMPERATURE=tau``: the tree temperature, a server option: finite, ``> 0``
  (default ``sglang_spec.tree.DEFAULT_TREE_TEMPERATURE`` = 0.75). The tree ranks prefixes by
  ``log_softmax(draft_logits / tau)``: lossless for any value (it only chooses which nodes are
  verified); tau < 1 moves budget from siblings to depth (docs/plugin-design.md §2). The default
  is measured (benchmarks/results/chain_inclusive.md, chain-inclusive trees, reference engine,
  greedy, held-out prompts, tokens per verify step at budgets 31 / 63): tau = 0.75 matches or
  beats tau = 1 in all 8 (pair, budget, run) cells, +1 to +4 % -- hybrid pair 3.325 vs 3.241 and
  3.507 = 3.507 (8 prompts), 3.850 vs 3.751 and 4.163 vs 4.129 (16 prompts); Qwen3 pair 2.450 vs
  2.370 and 2.695 vs 2.667, 2.528 vs 2.438 and 2.852 vs 2.738 -- while tau = 0.5 falls below
  tau = 1 on both pairs (hybrid 3.141 / 3.436, Qwen3 2.286 / 2.535).
* ``--speculative-adaptive --speculative-adaptive-config FILE``: budget by batch size
  (:mod:`sglang_spec.plugin.budget`; docs/adaptive-budget.md). SGLang's own flags: SGLang turns
  its EAGLE-only adaptive mode off for DDTREE before the plug-in runs (``_maybe_disable_adaptive``),
  and DDTREE reads the flag as given and runs its own controller. FILE (required) holds the cost
  table and names the candidate budgets; the verify width becomes 1 + the largest
  (``--speculative-num-draft-tokens``, if given, must say so) and sizes every buffer; each
  candidate gets its own target verify graphs. The file is checked here, before any model loads.
* ``SGLANG_SIMULATE_ACC_LEN=n`` (SGLang's own benchmark knob, off unless > 0): every verify step
  accepts a drawn ~n tokens along the tree's best path, whatever the target says. Benchmarks
  only: the output tokens are meaningless (``sglang_spec.plugin.simulate``). Only
  ``SGLANG_SIMULATE_ACC_TOKEN_MODE=fixed`` (the default) is supported.
* ``SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET=B:n,B:n,...`` (with ``SGLANG_SIMULATE_ACC_LEN`` on):
  each candidate budget ``B`` its own drawn ~n tokens per step, drawn as SGLang draws its own
  (``SGLANG_SIMULATE_ACC_METHOD``), so a budget-by-batch-size server is timed at a stated tau per
  budget. Benchmarks only; every budget the server can run must be listed, with
  ``1 <= n <= min(L, B) + 1``.
* ``SGLANG_DDTREE_STAGE_TIMES=/path/file.jsonl``: append per-stage host and GPU times of every
  decode step there (``sglang_spec.plugin.stage_times``; profiling only).
* ``SGLANG_DDTREE_SYNC_CHECK=warn|error``: run every decode step under
  ``torch.cuda.set_sync_debug_mode`` (an error at the first operation that makes the host wait for
  the GPU, or with ``warn`` one log line per step that made any: how many and where first; checking
  only: a step must have none, so that overlap scheduling can hide its host work).

:func:`handle_server_args` runs in the launcher inside SGLang's
``handle_speculative_decoding``, before any model loads: every refusal is a
:class:`DDTreeConfigError` (a ``ValueError``) with one line naming the flag, its value and what is
valid. The scheduler process rebuilds the same :class:`DDTreeConfig` from the resolved spec
(:func:`runtime_config`); :meth:`DDTreeConfig.build` is the one place that reads the environment.
SGLang is imported lazily, inside functions.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import sglang_spec.plugin.adapter as adapter

logger = logging.getLogger("sglang_spec.plugin")

ALGORITHM_NAME = "DDTREE"
ENV_TOPK = "SGLANG_DDTREE_TOPK"
ENV_TREE_TEMPERATURE = "SGLANG_DDTREE_TREE_TEMPERATURE"
ENV_SIMULATE_ACC_LEN = "SGLANG_SIMULATE_ACC_LEN"
ENV_SIMULATE_ACC_TOKEN_MODE = "SGLANG_SIMULATE_ACC_TOKEN_MODE"
ENV_SIMULATE_ACC_BY_BUDGET = "SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET"
ENV_STAGE_TIMES = "SGLANG_DDTREE_STAGE_TIMES"
ENV_SYNC_CHECK = "SGLANG_DDTREE_SYNC_CHECK"
SYNC_CHECK_MODES = ("warn", "error")
# torch.cuda.set_sync_debug_mode("warn")'s message: what the warn mode counts and logs
SYNC_WARNING = "called a synchronizing CUDA operation"

# sglang/kernels/jit/csrc/speculative/tree.cuh:46,182 (build/reconstruct kernels:
# draft_token_num <= 1024). The verify width must stay inside it.
MAX_VERIFY_WIDTH = 1024


# Target attention backends whose TARGET_VERIFY path takes a per-request FULL_MASK custom mask
# (EagleVerifyInput.custom_mask): the list SGLang uses for topk > 1 trees
# (arg_groups/speculative_hook.py:1271).
TREE_MASK_BACKENDS = ("flashinfer", "fa3", "triton")
# The target and drafter attention backend declared when none is given: the one every GPU run of
# DDTREE used (the GPU kit has no FlashInfer or FA3 kernels); the others are unverified.
VERIFIED_BACKEND = "triton"


class DDTreeConfigError(ValueError):
    """A DDTREE server configuration SGLang must refuse before loading models."""


@dataclass(frozen=True)
class DDTreeConfig:
    """The resolved DDTREE settings of one server."""

    block_size: int  # B: the DFlash drafter's block (bonus token + B - 1 masks)
    verify_width: int  # N = 1 + budget: tokens per request in the target's verify pass
    topk_per_depth: int  # K
    tree_temperature: float  # tau
    # SGLANG_SIMULATE_ACC_LEN when on (> 0): forced acceptance for benchmarks, else None
    simulated_accept_len: float | None = None
    # SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET: ((budget, tau), ...) drawn per budget instead
    simulated_accept_by_budget: tuple[tuple[int, float], ...] | None = None
    # SGLANG_DDTREE_STAGE_TIMES: the JSON-lines file per-stage decode times go to, else None
    stage_times_path: str | None = None
    # SGLANG_DDTREE_SYNC_CHECK: torch.cuda.set_sync_debug_mode around decode steps, else None
    sync_check: str | None = None
    # --speculative-adaptive-config when budget by batch size is on, else None
    adaptive_config: str | None = None

    @property
    def budget(self) -> int:
        """Draft nodes per tree, the root excluded."""
        return self.verify_width - 1

    @property
    def horizon(self) -> int:
        """L: the drafter's depths (block rows 1..B-1), so a tree is at most L deep."""
        return self.block_size - 1

    @property
    def max_depth(self) -> int:
        """The deepest a tree of this budget can reach: ``min(L, budget)``. EAGLE's
        ``accept_index`` has ``max_depth + 1`` columns, and its tree compaction
        (``_compact_accept_to_front``) needs that to fit in the verify width."""
        return min(self.horizon, self.budget)

    @property
    def simulated_accept_here(self) -> float | None:
        """This budget's own simulated tau (``SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET``), or None
        when the drawn length is SGLang's (or the simulation is off)."""
        return dict(self.simulated_accept_by_budget or ()).get(self.budget)

    @property
    def eagle_topk(self) -> int:
        """Value for SGLang's ``speculative_eagle_topk``.

        It must be > 1 from startup so the hybrid linear-attention backend runs its tree path (it
        reads topk once, hybrid_linear_attn_backend.py:85) and the graph runner allocates
        retrieve_* buffers; and steps (= 1) * topk must not exceed the verify width so allocation
        sizing stays at the width (mem_cache/allocation_sizing.py:28).
        """
        return max(2, min(self.topk_per_depth, self.verify_width))

    def for_budget(self, budget: int) -> DDTreeConfig:
        """The same server at another candidate budget (budget by batch size): K is capped at
        what keeps that budget's tree exact (``sglang_spec.tree.exact_topk``)."""
        from sglang_spec.tree import exact_topk

        k = min(self.topk_per_depth, exact_topk(budget, self.horizon))
        return replace(self, verify_width=budget + 1, topk_per_depth=k)

    @classmethod
    def build(
        cls,
        *,
        block_size: int,
        verify_width: int,
        environ: Mapping[str, str] | None = None,
        adaptive_config: str | None = None,
    ) -> DDTreeConfig:
        """Check the block and width, read K and tau from the environment, and freeze them."""
        block = check_block_size(block_size)
        width = check_verify_width(verify_width)
        env = os.environ if environ is None else environ
        simulated = parse_simulated_accept_len(
            env.get(ENV_SIMULATE_ACC_LEN), env.get(ENV_SIMULATE_ACC_TOKEN_MODE)
        )
        return cls(
            block_size=block,
            verify_width=width,
            topk_per_depth=parse_topk(env.get(ENV_TOPK), budget=width - 1, horizon=block - 1),
            tree_temperature=parse_tree_temperature(env.get(ENV_TREE_TEMPERATURE)),
            simulated_accept_len=simulated,
            simulated_accept_by_budget=parse_simulated_accept_by_budget(
                env.get(ENV_SIMULATE_ACC_BY_BUDGET), simulated
            ),
            stage_times_path=parse_stage_times_path(env.get(ENV_STAGE_TIMES)),
            sync_check=parse_sync_check(env.get(ENV_SYNC_CHECK)),
            adaptive_config=adaptive_config,
        )

    @classmethod
    def from_spec(cls, spec: Any, environ: Mapping[str, str] | None = None) -> DDTreeConfig:
        """From SGLang's resolved speculative settings (``runtime_context.get_spec()``).

        With budget by batch size the spec's width is 1 + the largest candidate budget, except
        while the worker captures another candidate's verify graphs (it overrides the width
        then): the config is the server's, :meth:`for_budget` that candidate.
        """
        block = getattr(spec, "speculative_dflash_block_size", None)
        width = getattr(spec, "speculative_num_draft_tokens", None)
        if block is None or width is None:
            raise RuntimeError(
                "DDTREE: speculative_dflash_block_size / speculative_num_draft_tokens are unset "
                "in the spec config; handle_server_args did not run for this server."
            )
        path = getattr(spec, "speculative_adaptive_config", None)
        if path is None:
            return cls.build(block_size=int(block), verify_width=int(width), environ=environ)
        budgets = load_budget_policy(path).budgets
        server = cls.build(
            block_size=int(block),
            verify_width=max(budgets) + 1,
            environ=environ,
            adaptive_config=path,
        )
        return server if int(width) == server.verify_width else server.for_budget(int(width) - 1)


def runtime_config() -> DDTreeConfig:
    """The server's DDTreeConfig, in a process where SGLang has published its spec settings."""
    from sglang.srt.runtime_context import get_spec

    return DDTreeConfig.from_spec(get_spec())


# ----------------------------------------------------------------- checks (no SGLang)


def check_draft_model_path(path: str | None) -> None:
    if path is None:
        raise DDTreeConfigError(
            "DDTREE requires --speculative-draft-model-path (a DFlash drafter); none was given."
        )


def check_pp_size(pp_size: int) -> None:
    if int(pp_size) != 1:
        raise DDTreeConfigError(
            f"DDTREE supports only --pp-size 1 (no pipeline parallelism); got --pp-size {pp_size}."
        )


# Boolean server arguments DDTREE refuses when on: (field, why).
REFUSED_SWITCHES = (
    (
        "speculative_use_rejection_sampling",
        "the tree is deterministic; T > 0 already uses lossless sample-and-walk",
    ),
    ("enable_dp_attention", "DP attention is not implemented for DDTREE"),
    ("enable_two_batch_overlap", "two-batch overlap is not implemented for DDTREE"),
    ("enable_pdmux", "PDMux is not implemented for DDTREE"),
    ("enable_multi_layer_eagle", "an EAGLE-only mode"),
    ("enable_linear_replayssm", "a decode-only ring; DDTREE decodes through tree verifies"),
    ("enable_lora", "the drafter borrows the target's LM head unwrapped"),
)


def _flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def check_refused_switches(cfg: Any) -> None:
    for field, why in REFUSED_SWITCHES:
        if getattr(cfg, field, False):
            raise DDTreeConfigError(
                f"DDTREE does not support {_flag(field)} ({why}); run without it."
            )


def check_accept_thresholds(cfg: Any) -> None:
    for field in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        v = getattr(cfg, field, 1.0)
        if v is not None and float(v) != 1.0:
            raise DDTreeConfigError(
                f"DDTREE does not support {_flag(field)}={v}: thresholds below 1 are lossy; "
                "valid: 1.0 (the default)."
            )


def check_draft_window(window: int | None) -> None:
    if window is not None:
        raise DDTreeConfigError(
            f"DDTREE does not support --speculative-draft-window-size={window} (a compact "
            "drafter KV cache); leave it unset."
        )


def check_disaggregation(mode: str | None) -> None:
    if mode not in (None, "null"):
        raise DDTreeConfigError(
            f"DDTREE does not support PD disaggregation: --disaggregation-mode {mode}; "
            "valid: null (the default)."
        )


def check_block_size_flag(flag_block: int | None) -> None:
    if flag_block is not None and int(flag_block) <= 0:
        raise DDTreeConfigError(
            f"--speculative-dflash-block-size={flag_block} must be a positive integer (the "
            "drafter's block size)."
        )


def resolve_block_size(flag_block: int | None, config_block: int | None) -> int:
    """The drafter block: the flag and the drafter config must agree when both are given."""
    if flag_block is not None and config_block is not None and int(flag_block) != config_block:
        raise DDTreeConfigError(
            f"--speculative-dflash-block-size={flag_block} disagrees with the drafter config's "
            f"block_size={config_block}; valid: {config_block} (the drafter was trained for it)."
        )
    block = int(flag_block) if flag_block is not None else config_block
    if block is None:
        raise DDTreeConfigError(
            "DDTREE could not determine the drafter block size: the drafter config has no "
            "block_size; pass --speculative-dflash-block-size B."
        )
    return block


def check_block_size(block: int) -> int:
    if block < 2:
        raise DDTreeConfigError(
            f"DDTREE needs a drafter block size >= 2 (a horizon of at least one depth); got "
            f"block size {block}."
        )
    return block


def check_verify_width(width: int) -> int:
    if width < 2:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={width} leaves no draft node: it is the verify "
            f"width 1 + budget and the budget must be >= 1; valid: 2..{MAX_VERIFY_WIDTH}."
        )
    if width > MAX_VERIFY_WIDTH:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={width} exceeds the tree kernels' limit of "
            f"{MAX_VERIFY_WIDTH} tokens (budget {width - 1} > {MAX_VERIFY_WIDTH - 1}); "
            f"valid: 2..{MAX_VERIFY_WIDTH}."
        )
    return width


def default_verify_width(block: int) -> int:
    """The verify width when ``--speculative-num-draft-tokens`` is not given: ``2 * block``, i.e.
    budget ``2 * block - 1`` = the drafter's greedy chain (L = block - 1 nodes) plus as many
    best-first nodes again. The reference's default, budget L, makes a chain-inclusive tree the
    chain itself: DFLASH's verify at a tree's cost. Measured (benchmarks/results/chain_inclusive.md,
    adaptive_budget.md): at block 16 the tiny pairs make 1.34x (hybrid) and 1.40x (Qwen3) DFLASH's
    tokens per step at budget 31, and a 27B-shaped hybrid's step costs 29.8 ms against budget 15's
    28.1 at one request, 51.5 against 38.4 at 8 (graphs to bs 8): more tokens per second than DFLASH
    at every measured concurrency of the projection. Budget by batch size chooses per batch."""
    return 2 * block


def check_kv_reserve(width: int, block: int, patched: bool) -> None:
    """dflash_info_v2.py:142-147 reserves 2 * speculative_num_draft_tokens KV slots per request
    per decode step, but the draft block writes ``block`` of them (patch P3 lifts this)."""
    if 2 * width < block and not patched:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={width} is too small for drafter block size {block}: "
            "SGLang 0.5.23 reserves 2*speculative_num_draft_tokens KV slots per request per "
            f"decode step (dflash_info_v2.py:147) and the draft block needs {block}; valid: "
            f">= {(block + 1) // 2}, or any width after `sglang-spec patch apply` "
            "(patches/0.5.23/0001, docs/plugin-design.md P3)."
        )


def load_budget_policy(path: str) -> Any:
    """The validated budget-by-batch-size config at ``path`` (a ``budget.BudgetPolicy``)."""
    from sglang_spec.plugin.budget import BudgetConfigError, BudgetPolicy

    try:
        policy = BudgetPolicy.load(path)
    except BudgetConfigError as e:
        raise DDTreeConfigError(str(e)) from None
    for budget in policy.budgets:
        if budget + 1 > MAX_VERIFY_WIDTH:
            raise DDTreeConfigError(
                f"--speculative-adaptive-config={path!r}: budget {budget} exceeds the tree "
                f"kernels' limit of {MAX_VERIFY_WIDTH} verify tokens; valid budgets: "
                f"1..{MAX_VERIFY_WIDTH - 1}."
            )
    return policy


def resolve_adaptive(adaptive: bool, path: str | None, width: int | None) -> int | None:
    """Budget by batch size: the verify width it needs (1 + the largest candidate budget), or
    None when off. ``adaptive`` is ``--speculative-adaptive`` as given on the command line."""
    if not adaptive:
        if path is not None:
            raise DDTreeConfigError(
                f"--speculative-adaptive-config={path!r} is given without --speculative-adaptive; "
                "add --speculative-adaptive to choose the DDTREE budget by batch size, or drop "
                "the config."
            )
        return None
    if path is None:
        raise DDTreeConfigError(
            "DDTREE --speculative-adaptive needs --speculative-adaptive-config FILE: the cost "
            "table of this model's shape and its candidate budgets (docs/adaptive-budget.md)."
        )
    need = max(load_budget_policy(path).budgets) + 1
    if width is not None and int(width) != need:
        raise DDTreeConfigError(
            f"--speculative-num-draft-tokens={width} disagrees with --speculative-adaptive-config="
            f"{path!r}, whose largest budget needs verify width {need}; valid: {need}, or leave "
            "it unset."
        )
    return need


def parse_topk(raw: str | None, *, budget: int, horizon: int) -> int:
    """K per depth from ``SGLANG_DDTREE_TOPK``; unset or empty: the fewest ranks that keep the
    chain-inclusive tree exact (``sglang_spec.tree.exact_topk``: ``budget - L + 1`` from budget
    L on, 1 at budget L where the tree is the chain; ``budget`` below L)."""
    from sglang_spec.tree import exact_topk

    if raw is None or raw.strip() == "":
        return exact_topk(budget, horizon)
    try:
        k = int(raw)
    except ValueError:
        raise DDTreeConfigError(
            f"{ENV_TOPK}={raw!r} is not an integer; it sets K, the candidates kept per depth; "
            f"valid: 1..budget={budget}."
        ) from None
    if not 1 <= k <= budget:
        raise DDTreeConfigError(
            f"{ENV_TOPK}={k} is out of range: a tree of `budget` nodes never uses more than "
            f"`budget` ranks per depth; valid: 1..budget={budget}."
        )
    return k


def parse_tree_temperature(raw: str | None) -> float:
    """tau from ``SGLANG_DDTREE_TREE_TEMPERATURE`` (unset or empty: the default, 0.75)."""
    from sglang_spec.tree import DEFAULT_TREE_TEMPERATURE, check_tree_temperature

    if raw is None or raw.strip() == "":
        return DEFAULT_TREE_TEMPERATURE
    try:
        return check_tree_temperature(float(raw))
    except ValueError:
        raise DDTreeConfigError(
            f"{ENV_TREE_TEMPERATURE}={raw!r} is not valid: the tree temperature must be a finite "
            "number > 0 (1 = the drafter's own distribution, < 1 sharpens it; default "
            f"{DEFAULT_TREE_TEMPERATURE})."
        ) from None


def parse_simulated_accept_len(raw: str | None, token_mode: str | None) -> float | None:
    """SGLang's ``SGLANG_SIMULATE_ACC_LEN`` (off unless > 0), with the token mode DDTREE supports."""
    if raw is None or raw.strip() == "":
        return None
    try:
        n = float(raw)
    except ValueError:
        raise DDTreeConfigError(
            f"{ENV_SIMULATE_ACC_LEN}={raw!r} is not a number; it sets the forced tokens per step "
            "of a benchmark; valid: a number > 0, or <= 0 / unset for off."
        ) from None
    if not n > 0:
        return None
    mode = "fixed" if token_mode is None or token_mode.strip() == "" else token_mode
    if mode != "fixed":
        raise DDTreeConfigError(
            f"{ENV_SIMULATE_ACC_TOKEN_MODE}={mode!r} is not supported by DDTREE (SGLang simulates "
            "real draft tokens for chains only, eagle_utils.py:818); valid: fixed."
        )
    return n


def parse_simulated_accept_by_budget(
    raw: str | None, simulated: float | None
) -> tuple[tuple[int, float], ...] | None:
    """``SGLANG_DDTREE_SIMULATE_ACC_LEN_BY_BUDGET``: ``B:n,B:n,...`` -> ((B, n), ...) sorted by B
    (unset or empty: off). It refines SGLang's simulation, so that must be on."""
    if raw is None or raw.strip() == "":
        return None
    valid = (
        "valid: budget:tau pairs, e.g. 7:3.2,15:3.0 (each budget once, an integer >= 1; "
        "tau a number >= 1)"
    )
    pairs: dict[int, float] = {}
    for item in raw.split(","):
        budget, colon, tau = item.strip().partition(":")
        try:
            b, n = int(budget), float(tau)
        except ValueError:
            b, n = 0, 0.0
        if not colon or b < 1 or not n >= 1 or n == float("inf") or b in pairs:
            raise DDTreeConfigError(f"{ENV_SIMULATE_ACC_BY_BUDGET}={raw!r}: bad {item!r}; {valid}.")
        pairs[b] = n
    if simulated is None:
        raise DDTreeConfigError(
            f"{ENV_SIMULATE_ACC_BY_BUDGET}={raw!r} needs {ENV_SIMULATE_ACC_LEN} > 0 (SGLang's "
            "benchmark simulation, which it refines per budget); valid: set both, or neither."
        )
    return tuple(sorted(pairs.items()))


def check_simulated_budgets(config: DDTreeConfig, budgets: tuple[int, ...]) -> None:
    """Every budget the server can run has its simulated tau, within what its tree can accept
    (``min(L, B) + 1`` tokens, the bonus included)."""
    if config.simulated_accept_by_budget is None:
        return
    taus = dict(config.simulated_accept_by_budget)
    missing = [b for b in budgets if b not in taus]
    if missing:
        raise DDTreeConfigError(
            f"{ENV_SIMULATE_ACC_BY_BUDGET} has no tau for budget(s) {missing}; valid: one for "
            f"every budget the server runs {sorted(budgets)}."
        )
    for b in budgets:
        most = min(config.horizon, b) + 1
        if taus[b] > most:
            raise DDTreeConfigError(
                f"{ENV_SIMULATE_ACC_BY_BUDGET}: tau {taus[b]:g} for budget {b} exceeds the "
                f"{most} tokens a step of that tree can accept; valid: 1..{most}."
            )


def parse_stage_times_path(raw: str | None) -> str | None:
    """The file ``SGLANG_DDTREE_STAGE_TIMES`` names (unset or empty: timing off)."""
    if raw is None or raw.strip() == "":
        return None
    path = os.path.abspath(raw)
    if not os.path.isdir(os.path.dirname(path)) or os.path.isdir(path):
        raise DDTreeConfigError(
            f"{ENV_STAGE_TIMES}={raw!r} cannot be written: valid: a file path in an existing "
            "directory (one JSON line per decode step is appended to it)."
        )
    return path


def parse_sync_check(raw: str | None) -> str | None:
    """``SGLANG_DDTREE_SYNC_CHECK`` (unset or empty: off)."""
    if raw is None or raw.strip() == "":
        return None
    if raw.strip() not in SYNC_CHECK_MODES:
        raise DDTreeConfigError(
            f"{ENV_SYNC_CHECK}={raw!r} is not a mode; valid: {', '.join(SYNC_CHECK_MODES)} "
            "(or unset: off)."
        )
    return raw.strip()


def check_attention_backends(decode: str, prefill: str | None) -> None:
    """Both the decode and the prefill backend (TARGET_VERIFY runs on the prefill-side wrapper of
    hybrid backends) must take a per-request tree mask."""
    valid = ", ".join(TREE_MASK_BACKENDS)
    if decode not in TREE_MASK_BACKENDS:
        raise DDTreeConfigError(
            f"DDTREE tree verify needs an attention backend that takes a per-request tree mask; "
            f"got {decode!r}; valid: {valid}."
        )
    if prefill is not None and prefill not in TREE_MASK_BACKENDS:
        raise DDTreeConfigError(
            f"DDTREE tree verify needs the prefill attention backend to take a per-request tree "
            f"mask too; got --prefill-attention-backend {prefill!r}; valid: {valid}."
        )


def check_page_size(page_size: int | None) -> None:
    if page_size is not None and int(page_size) != 1:
        raise DDTreeConfigError(
            f"DDTREE requires --page-size 1 (accepted tree nodes are compacted token by token in "
            f"the KV cache); got --page-size {page_size}."
        )


def check_unified_memory(enabled: bool) -> None:
    if enabled:
        raise DDTreeConfigError("DDTREE does not support --enable-unified-memory; run without it.")


def check_mamba_track_interval(interval: int | None, width: int) -> None:
    if interval is not None and int(interval) < width:
        raise DDTreeConfigError(
            f"--mamba-track-interval={interval} is below the DDTREE verify width {width}; valid: "
            f">= {width} (hybrid linear-attention targets)."
        )


# ------------------------------------------------------ SGLang-facing resolution


def drafter_block_size(cfg: Any) -> int | None:
    """Block size in the DFlash drafter's config (None if it has none); a clear error if the
    drafter cannot be read or is not a DFlash drafter (DFLASH silently falls back to 16)."""
    import json

    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.utils.hf_transformers_utils import get_config

    path = cfg.speculative_draft_model_path
    try:
        hf = get_config(
            path,
            trust_remote_code=cfg.trust_remote_code,
            revision=cfg.speculative_draft_model_revision,
            model_override_args=json.loads(cfg.json_model_override_args or "{}"),
        )
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise DDTreeConfigError(
            f"DDTREE could not read the DFlash drafter config at "
            f"--speculative-draft-model-path={path!r}: {type(e).__name__}: {e}"
        ) from e
    archs = list(getattr(hf, "architectures", None) or [])
    if archs and not any("DFlash" in a for a in archs):
        raise DDTreeConfigError(
            f"DDTREE needs a DFlash drafter; --speculative-draft-model-path={path!r} declares "
            f"architectures={archs}."
        )
    block = parse_dflash_draft_config(draft_hf_config=hf).resolve_block_size(default=None)
    return None if block is None else int(block)


RESERVE_PATCH = "0001-dflash-v2-reserve-covers-draft-block.patch"  # P3: lifts 2N >= B
# The GDN tree ReplaySSM (docs/gdn-tree-caching.md): 0002 the verify, 0003 the commit and the pool;
# the same file names in every pin's series (patches/0.5.22, patches/0.5.23).
GDN_TREE_PATCHES = ("0002-gdn-tree-replayssm-verify.patch", "0003-gdn-tree-replayssm-commit.patch")


def applied_patches() -> tuple[str, ...]:
    """The patch series ``sglang-spec patch apply`` applied to the installed SGLang; empty when it
    is not (fully) applied or the release has no patch set."""
    from sglang_spec.patching import core

    try:
        tree = core.locate(None)
        ps = core.load_patch_set(core.default_patches_dir(), core.detect_version(tree)[0])
        applied = core.inspect_state(tree, ps).overall == core.APPLIED
    except core.PatchingError:
        return ()
    return tuple(ps.series) if applied else ()


def linear_verify_backend(view: Any) -> str | None:
    """The linear-attention TARGET_VERIFY backend SGLang resolved (arg_groups/attention_hook.py:346):
    the flag, else FlashInfer under a FlashInfer decode backend, else None (Triton)."""
    verify = getattr(view, "linear_attn_verify_backend", None)
    decode = getattr(view, "linear_attn_decode_backend", None) or getattr(
        view, "linear_attn_backend", None
    )
    if verify is None and decode == "flashinfer":
        return "flashinfer"
    return verify


def check_linear_replayssm_spec(
    enabled: bool, applied: tuple[str, ...], verify_backend: str | None, width: int
) -> None:
    """``--enable-linear-replayssm-spec`` (a tree verify without per-node GDN states) needs patches
    0002 and 0003; its refusals for the verify backend and the verify ``width`` (the server's, the
    largest candidate's under budget by batch size) are the patched SGLang's own
    (``sglang_spec.gdn.tree_replayssm``). A KDA target is refused by the patched mamba pool."""
    from sglang_spec.gdn.tree_replayssm import tree_replayssm_refusal

    if not enabled:
        return
    missing = [p for p in GDN_TREE_PATCHES if p not in applied]
    if missing:
        raise DDTreeConfigError(
            "DDTREE with --enable-linear-replayssm-spec needs the GDN tree patches "
            f"{', '.join(missing)} applied to the installed SGLang: run `sglang-spec patch apply` "
            "(sglang 0.5.22 or 0.5.23; docs/gdn-tree-caching.md), or run without the flag."
        )
    why = tree_replayssm_refusal(is_kda=False, verify_backend=verify_backend, width=width)
    if why is not None:
        raise DDTreeConfigError(why)


def handle_server_args(server_args: Any) -> DDTreeConfig:
    """Validate and resolve DDTREE's server arguments; declare the resolved values.

    Runs inside ``arg_groups/speculative_hook.handle_speculative_decoding`` (through
    ``record_foreign_defaults``), before any model is loaded.
    """
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        declare_resolution,
        resolved_view,
        resolving_view,
    )

    record = adapter.real_server_args(server_args)
    cfg = resolving_view(record)
    src = "sglang_spec.plugin.handle_server_args"

    # structural refusals: cheap, before the drafter's config is read
    check_draft_model_path(cfg.speculative_draft_model_path)
    check_pp_size(cfg.pp_size)
    check_refused_switches(cfg)
    check_accept_thresholds(cfg)
    check_draft_window(getattr(cfg, "speculative_draft_window_size", None))
    check_disaggregation(getattr(cfg, "disaggregation_mode", "null"))

    # SGLang has already turned its EAGLE-only adaptive mode off (resolved False): read the flag
    # as given on the command line, on the record.
    adaptive_config = cfg.speculative_adaptive_config
    adaptive_width = resolve_adaptive(
        bool(getattr(record, "speculative_adaptive", False)),
        adaptive_config,
        cfg.speculative_num_draft_tokens,
    )
    flag_block = cfg.speculative_dflash_block_size
    check_block_size_flag(flag_block)
    block = resolve_block_size(flag_block, drafter_block_size(cfg))
    width = adaptive_width or cfg.speculative_num_draft_tokens
    config = DDTreeConfig.build(
        block_size=block,
        verify_width=default_verify_width(block) if width is None else int(width),
    )
    check_simulated_budgets(
        config,
        (config.budget,)
        if adaptive_config is None
        else load_budget_policy(adaptive_config).budgets,
    )
    applied = applied_patches()
    check_kv_reserve(config.verify_width, block, RESERVE_PATCH in applied)

    view = resolved_view(record)
    prefill_backend, decode_backend = attention_backends_of(view)
    if decode_backend is None:
        decode_backend = VERIFIED_BACKEND
        declare_resolution(record, src, attention_backend=VERIFIED_BACKEND)
        logger.warning(
            "DDTREE: no attention backend given; using %r (tree verify needs a per-request mask: "
            "one of %s; %r is the one DDTREE's greedy = AR checks ran with on a GPU).",
            VERIFIED_BACKEND,
            TREE_MASK_BACKENDS,
            VERIFIED_BACKEND,
        )
    check_attention_backends(decode_backend, prefill_backend)
    check_page_size(view.page_size)
    check_unified_memory(getattr(view, "enable_unified_memory", False))
    check_mamba_track_interval(getattr(view, "mamba_track_interval", None), config.verify_width)
    check_linear_replayssm_spec(
        bool(getattr(view, "enable_linear_replayssm_spec", False)),
        applied,
        linear_verify_backend(view),
        config.verify_width,
    )

    # The drafter takes the target's backend when none is given (speculative_hook.py:930). FA3
    # reads SGLang's tree topk (> 1 for DDTREE) and the verify width for every TARGET_VERIFY,
    # which the drafter's block pass (no mask, block-wide) is not; Triton is what it ran with.
    if cfg.speculative_draft_attention_backend is None:
        declare_resolution(record, src, speculative_draft_attention_backend=VERIFIED_BACKEND)
    # DFLASH's own handling on a chain-shaped view: _handle_dflash raises when
    # num_draft_tokens != dflash_block_size, so give it the block for both, then declare the
    # DDTREE values after it.
    declare_resolution(
        record,
        src + ".pre_dflash",
        speculative_num_draft_tokens=block,
        speculative_dflash_block_size=block,
    )
    adapter.handle_dflash(record)
    declare_resolution(
        record,
        src,
        speculative_algorithm=ALGORITHM_NAME,
        speculative_num_draft_tokens=config.verify_width,
        speculative_dflash_block_size=block,
        speculative_num_steps=1,
        speculative_eagle_topk=config.eagle_topk,
        enable_mixed_chunk=False,
    )
    logger.info(
        "DDTREE resolved: block_size=%d (horizon %d), budget=%d%s, verify width=%d, K per depth=%d, "
        "tree temperature=%g, simulated acceptance=%s, attention=%s.",
        block,
        config.horizon,
        config.budget,
        "" if adaptive_config is None else f" (budget by batch size: {adaptive_config})",
        config.verify_width,
        config.topk_per_depth,
        config.tree_temperature,
        config.simulated_accept_len
        if config.simulated_accept_by_budget is None
        else dict(config.simulated_accept_by_budget),
        decode_backend,
    )
    if adaptive_config is None and config.budget == config.horizon:
        logger.info(
            "DDTREE: budget %d = the drafter's horizon, so every tree is the drafter's greedy chain "
            "(what DFLASH verifies); for a tree give --speculative-num-draft-tokens above %d "
            "(e.g. %d).",
            config.budget,
            config.verify_width,
            4 * (config.horizon + 1),
        )
    return config
