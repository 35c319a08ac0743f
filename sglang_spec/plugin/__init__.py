"""SGLang 0.5.23 plug-in: the ``DDTREE`` speculative algorithm.

DDTree drafting over a DFlash drafter (one block-diffusion pass, top-K per
depth, best-first tree of ``budget`` nodes) verified with SGLang's EAGLE tree
verify.  Entry point: ``sglang.srt.plugins: ddtree = sglang_spec.plugin:register``.

Only this package imports sglang, and only lazily (inside functions), so the
rest of ``sglang_spec`` stays importable without it.

Flags (all upstream SGLang flags; nothing new on the command line):

* ``--speculative-algorithm DDTREE``
* ``--speculative-draft-model-path``: the DFlash drafter (required).
* ``--speculative-num-draft-tokens N``: verify width = 1 + budget (default:
  the drafter block size, i.e. budget = block - 1, the reference default).
* ``--speculative-dflash-block-size B``: must equal the drafter config's
  ``block_size`` when both are known.

Extra knob (environment, validated at startup, documented in
docs/plugin-design.md):

* ``SGLANG_DDTREE_TOPK``: K, the number of candidates kept per depth
  (1 <= K <= budget; default ``budget``, the value that makes the
  best-first tree optimal).  Smaller K shrinks the per-depth top-k and its
  TP all-gather at a possible cost in tree quality.
* ``SGLANG_DDTREE_TREE_TEMPERATURE``: tau > 0 (default 1).  The best-first
  tree ranks prefixes by ``log_softmax(draft_logits / tau)``: same tokens per
  depth, but tau < 1 moves budget from siblings to depth.  Lossless for any
  value (it only chooses which nodes are verified); it helps drafters whose
  probabilities understate how often their top token is the target's greedy
  choice (soft-distilled drafters on repetitive text: the tiny hybrid pair's
  DDTREE(64) goes from 4.09 to 5.50 tokens/step at tau 0.5 in the reference
  engine, benchmarks/results/acceptance_tiny_pair.md).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

logger = logging.getLogger("sglang_spec.plugin")

ALGORITHM_NAME = "DDTREE"

# sglang/kernels/jit/csrc/speculative/tree.cuh:46,182 (build/reconstruct
# kernels: draft_token_num <= 1024).  The verify width must stay inside it.
MAX_VERIFY_WIDTH = 1024

# Target attention backends whose TARGET_VERIFY path takes a per-request
# FULL_MASK custom mask (EagleVerifyInput.custom_mask): the same list SGLang
# uses for topk>1 trees (arg_groups/speculative_hook.py:1271).
TREE_MASK_BACKENDS = ("flashinfer", "fa3", "triton")

ENV_TOPK = "SGLANG_DDTREE_TOPK"
ENV_TREE_TEMPERATURE = "SGLANG_DDTREE_TREE_TEMPERATURE"

_registered = False


class DDTreeConfigError(ValueError):
    """A DDTREE server configuration SGLang must refuse before loading models."""


# --------------------------------------------------------------------------
# Pure helpers (no sglang import)
# --------------------------------------------------------------------------


def parse_topk_env(budget: int, environ: dict | None = None) -> int:
    """K per depth from ``SGLANG_DDTREE_TOPK`` (default: budget)."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_TOPK)
    if raw is None or raw.strip() == "":
        return budget
    try:
        k = int(raw)
    except ValueError:
        raise DDTreeConfigError(
            f"{ENV_TOPK}={raw!r} is not an integer; it sets K, the candidates "
            f"kept per depth (1..budget={budget})."
        ) from None
    if k < 1 or k > budget:
        raise DDTreeConfigError(
            f"{ENV_TOPK}={k} is out of range: K must be in [1, budget={budget}] "
            "(a tree of `budget` nodes never uses more than `budget` ranks per depth)."
        )
    return k


def parse_tree_temperature_env(environ: dict | None = None) -> float:
    """tau from ``SGLANG_DDTREE_TREE_TEMPERATURE`` (default 1.0)."""
    from sglang_spec.tree import check_tree_temperature

    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_TREE_TEMPERATURE)
    if raw is None or raw.strip() == "":
        return 1.0
    try:
        return check_tree_temperature(float(raw))
    except ValueError:
        raise DDTreeConfigError(
            f"{ENV_TREE_TEMPERATURE}={raw!r} is not valid: the tree temperature must be a finite "
            "number > 0 (1 = the drafter's own distribution, < 1 sharpens it)."
        ) from None


def eagle_topk_for(k: int, budget: int) -> int:
    """Value for SGLang's ``speculative_eagle_topk``.

    It must be > 1 from startup so the hybrid linear-attention backend runs
    its tree path (it reads topk once, hybrid_linear_attn_backend.py:85) and
    the graph runner allocates retrieve_* buffers; and steps(=1)*topk must
    not exceed the verify width so allocation sizing stays at the width
    (mem_cache/allocation_sizing.py:28).
    """
    return max(2, min(k, budget + 1))


def _real_record(server_args: Any) -> Any:
    """The ServerArgs record behind SGLang's plug-in stand-in (_ForeignDefaults)."""
    from sglang.srt.arg_groups.model_override_base import (
        ResolvingConfig,
        record_of,
    )

    if type(server_args).__name__ == "_ForeignDefaults":
        cfg = object.__getattribute__(server_args, "_cfg")
        if isinstance(cfg, ResolvingConfig):
            return record_of(cfg)
    return server_args


def _load_drafter_block_size(cfg: Any) -> int | None:
    """Block size of the DFlash drafter config; raises a clear error if the
    drafter cannot be read (DFLASH silently falls back to 16 there)."""
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
            f"DDTREE needs a DFlash drafter; {path!r} declares architectures={archs}."
        )
    parsed = parse_dflash_draft_config(draft_hf_config=hf)
    return parsed.resolve_block_size(default=None)


# --------------------------------------------------------------------------
# Server-argument handling (called by handle_speculative_decoding)
# --------------------------------------------------------------------------


def reserve_patch_applied() -> bool:
    """True when ``sglang-spec patch apply`` patched the installed SGLang (it lifts the 2N >= block limit)."""
    from sglang_spec.patching.core import APPLIED, PatchingError, installed_state

    try:
        return installed_state() == APPLIED
    except PatchingError:
        return False


def handle_server_args(server_args: Any) -> None:
    """Validate and resolve DDTREE settings; declare the resolved values.

    Runs inside ``arg_groups/speculative_hook.handle_speculative_decoding``
    (via ``record_foreign_defaults``), before any model is loaded.  Every
    refusal is a ``DDTreeConfigError`` (a ``ValueError``).
    """
    from sglang.srt.arg_groups.overrides import (
        attention_backends_of,
        declare_resolution,
        resolved_view,
        resolving_view,
    )
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    record = _real_record(server_args)
    cfg = resolving_view(record)
    src = "sglang_spec.plugin.handle_server_args"

    # ---- structural refusals (cheap, before touching the drafter) -------
    if cfg.speculative_draft_model_path is None:
        raise DDTreeConfigError(
            "DDTREE requires --speculative-draft-model-path (the DFlash drafter)."
        )
    if int(cfg.pp_size) != 1:
        raise DDTreeConfigError(
            f"DDTREE supports only pipeline parallel size 1 (got --pp-size {cfg.pp_size})."
        )
    _refuse_unsupported_features(cfg)

    # ---- drafter block size ---------------------------------------------
    config_block = _load_drafter_block_size(cfg)
    flag_block = cfg.speculative_dflash_block_size
    if flag_block is not None and int(flag_block) <= 0:
        raise DDTreeConfigError(
            f"--speculative-dflash-block-size must be positive, got {flag_block}."
        )
    if flag_block is not None and config_block is not None and int(flag_block) != int(config_block):
        raise DDTreeConfigError(
            f"--speculative-dflash-block-size={flag_block} disagrees with the drafter "
            f"config block_size={config_block}; the drafter was trained for its own "
            "block size."
        )
    block = int(flag_block) if flag_block is not None else config_block
    if block is None:
        raise DDTreeConfigError(
            "DDTREE could not determine the drafter block size: the drafter config has "
            "no block_size; pass --speculative-dflash-block-size."
        )
    if block < 2:
        raise DDTreeConfigError(f"DDTREE needs a drafter block size >= 2, got {block}.")

    # ---- verify width / budget --------------------------------------------
    width = cfg.speculative_num_draft_tokens
    width = block if width is None else int(width)
    budget = width - 1
    if budget < 1:
        raise DDTreeConfigError(
            f"DDTREE budget must be >= 1: --speculative-num-draft-tokens={width} "
            "is the verify width = 1 + budget."
        )
    if width > MAX_VERIFY_WIDTH:
        raise DDTreeConfigError(
            f"DDTREE verify width {width} (budget {budget}) exceeds the tree kernels' "
            f"limit of {MAX_VERIFY_WIDTH} tokens (budget <= {MAX_VERIFY_WIDTH - 1})."
        )
    if 2 * width < block and not reserve_patch_applied():
        # dflash_info_v2.py:142-147 reserves 2*speculative_num_draft_tokens KV
        # slots per request, but the draft block writes `block` of them.
        raise DDTreeConfigError(
            f"DDTREE verify width {width} is too small for drafter block size {block}: "
            "SGLang 0.5.23 reserves 2*speculative_num_draft_tokens KV slots per request "
            "per decode step (dflash_info_v2.py:147) and the draft block needs "
            f"{block}; use --speculative-num-draft-tokens >= {(block + 1) // 2}, or run "
            "`sglang-spec patch apply` (patches/0.5.23/0001, docs/plugin-design.md P3)."
        )
    k = parse_topk_env(budget)
    parse_tree_temperature_env()  # refuse a bad value before any model loads

    # ---- attention backend / memory layout ---------------------------------
    view = resolved_view(record)
    _, decode_backend = attention_backends_of(view)
    prefill_backend, _ = attention_backends_of(view)
    if decode_backend is None:
        decode_backend = "flashinfer"
        declare_resolution(record, src, attention_backend="flashinfer")
        logger.warning(
            "DDTREE: no attention backend given; using 'flashinfer' (tree verify "
            "needs a per-request mask: one of %s).",
            TREE_MASK_BACKENDS,
        )
    if decode_backend not in TREE_MASK_BACKENDS:
        raise DDTreeConfigError(
            f"DDTREE tree verify needs an attention backend that takes a per-request "
            f"tree mask ({', '.join(TREE_MASK_BACKENDS)}); got {decode_backend!r}."
        )
    if prefill_backend is not None and prefill_backend not in TREE_MASK_BACKENDS:
        # TARGET_VERIFY runs on the prefill-side wrapper of hybrid backends.
        raise DDTreeConfigError(
            f"DDTREE tree verify needs the prefill attention backend to take a tree "
            f"mask too ({', '.join(TREE_MASK_BACKENDS)}); got {prefill_backend!r}."
        )
    page_size = view.page_size
    if page_size is not None and int(page_size) != 1:
        raise DDTreeConfigError(
            f"DDTREE requires --page-size 1 (got {page_size}): accepted tree nodes are "
            "compacted token by token in the KV cache."
        )
    if getattr(view, "enable_unified_memory", False):
        raise DDTreeConfigError("DDTREE does not support --enable-unified-memory.")
    interval = getattr(view, "mamba_track_interval", None)
    if interval is not None and int(interval) < width:
        raise DDTreeConfigError(
            f"--mamba-track-interval ({interval}) must be >= the DDTREE verify width "
            f"({width}) for hybrid linear-attention targets."
        )

    # ---- DFLASH's own handling, with a chain-shaped view ------------------
    # _handle_dflash raises when num_draft_tokens != dflash_block_size; give
    # it the block for both, then declare the DDTREE values after it.
    declare_resolution(
        record,
        src + ".pre_dflash",
        speculative_num_draft_tokens=block,
        speculative_dflash_block_size=block,
    )
    _handle_dflash(record)

    declare_resolution(
        record,
        src,
        speculative_algorithm=ALGORITHM_NAME,
        speculative_num_draft_tokens=width,
        speculative_dflash_block_size=block,
        speculative_num_steps=1,
        speculative_eagle_topk=eagle_topk_for(k, budget),
        disable_overlap_schedule=True,
        enable_mixed_chunk=False,
    )
    logger.info(
        "DDTREE resolved: block_size=%d (horizon %d), budget=%d, verify width=%d, "
        "K per depth=%d, attention=%s.",
        block,
        block - 1,
        budget,
        width,
        k,
        decode_backend,
    )


def _refuse_unsupported_features(cfg: Any) -> None:
    def bad(msg: str) -> None:
        raise DDTreeConfigError(f"DDTREE does not support {msg}.")

    if getattr(cfg, "speculative_use_rejection_sampling", False):
        bad(
            "--speculative-use-rejection-sampling (the tree is deterministic; "
            "T>0 uses lossless sample-and-walk)"
        )
    if getattr(cfg, "speculative_use_block_verification", False):
        bad("--speculative-use-block-verification")
    for name in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
        v = getattr(cfg, name, 1.0)
        if v is not None and float(v) != 1.0:
            bad(f"--{name.replace('_', '-')}={v} (thresholds below 1 are lossy)")
    if getattr(cfg, "speculative_adaptive", False):
        bad("--speculative-adaptive")
    if getattr(cfg, "speculative_draft_window_size", None) is not None:
        bad("--speculative-draft-window-size (compact drafter KV cache)")
    if getattr(cfg, "enable_dp_attention", False):
        bad("--enable-dp-attention")
    mode = getattr(cfg, "disaggregation_mode", "null")
    if mode not in (None, "null"):
        bad(f"PD disaggregation (--disaggregation-mode {mode})")
    if getattr(cfg, "enable_two_batch_overlap", False):
        bad("--enable-two-batch-overlap")
    if getattr(cfg, "enable_pdmux", False):
        bad("--enable-pdmux")
    if getattr(cfg, "enable_multi_layer_eagle", False):
        bad("--enable-multi-layer-eagle")
    for name in ("enable_linear_replayssm_spec", "enable_linear_replayssm"):
        if getattr(cfg, name, False):
            # ReplaySSM commit is chain-only (commit_mamba_states_after_verify).
            bad(f"--{name.replace('_', '-')} (chain-only GDN commit)")
    if getattr(cfg, "enable_lora", False):
        bad("--enable-lora (the drafter borrows the target head unwrapped)")


# --------------------------------------------------------------------------
# SGLang-facing objects (built lazily: sglang is imported only here)
# --------------------------------------------------------------------------


def _spec_block_size() -> int:
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    block = getattr(spec, "speculative_dflash_block_size", None)
    if block is None:
        raise RuntimeError(
            "DDTREE: speculative_dflash_block_size is unset in the spec config; "
            "handle_server_args did not run in this process."
        )
    return int(block)


def get_num_tokens_per_req_for_target_verify(num_draft_tokens: int, is_draft_worker: bool) -> int:
    """TARGET_VERIFY width: the drafter block for the draft runner, the
    verify width (1 + budget) for the target."""
    if is_draft_worker:
        return _spec_block_size()
    return int(num_draft_tokens)


def resolve_max_speculative_num_draft_tokens(server_args: Any) -> int | None:
    """Largest TARGET_VERIFY width either runner uses: max(block, 1 + budget)."""
    from sglang.srt.arg_groups.overrides import resolving_view

    cfg = resolving_view(server_args)
    width = cfg.speculative_num_draft_tokens
    if width is None:
        return None
    block = cfg.speculative_dflash_block_size
    return max(int(width), int(block) if block is not None else 0)


def _make_spec_class():
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import CustomSpecAlgo

    dflash = SpeculativeAlgorithm.DFLASH

    class DDTreeSpecAlgo(CustomSpecAlgo):
        """DDTREE: DFlash family for the drafter plumbing, EAGLE tree ABI for verify."""

        # DFlash family: aux-hidden capture on the target, drafter KV pool
        # sizing, drafter graphs with input_embeds, DFlashDraftInputV2 decode
        # prep (spec_utils.py:1259) and TARGET_VERIFY graphs for the drafter.
        def is_dflash(self) -> bool:
            return True

        def is_dflash_family(self) -> bool:
            return True

        def supports_target_verify_for_draft(self) -> bool:
            return True

        def supports_prefill_shared_read_done(self) -> bool:
            return dflash.supports_prefill_shared_read_done()

        def supports_mixed_chunk(self) -> bool:
            return False

        def supports_ragged_verify(self) -> bool:
            return False

        def supports_grammar_overlap(self) -> bool:
            return False

        def has_draft_kv(self) -> bool:
            return True

        # Called unconditionally by the scheduler; absent on CustomSpecAlgo.
        def need_topk(self) -> bool:
            return False

        def carries_draft_hidden_states(self) -> bool:
            return False

        def create_future_map(
            self,
            device,
            req_to_token_pool,
            needs_cpu_seq_lens: bool = True,
            needs_confidence_relay: bool = False,
        ):
            from sglang.srt.managers.overlap_utils import FutureMap

            return FutureMap(
                device,
                self,
                req_to_token_pool,
                needs_cpu_seq_lens,
                needs_confidence_relay,
            )

        def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):
            return None

        def handle_server_args(self, server_args) -> None:
            handle_server_args(server_args)

        def resolve_max_speculative_num_draft_tokens(self, server_args):
            return resolve_max_speculative_num_draft_tokens(server_args)

        def get_num_tokens_per_req_for_target_verify(
            self, num_draft_tokens: int, is_draft_worker: bool
        ) -> int:
            return get_num_tokens_per_req_for_target_verify(num_draft_tokens, is_draft_worker)

        def get_platform_worker_cls(self):
            return None

    return DDTreeSpecAlgo


def worker_factory(server_args: Any):
    """``SpeculativeAlgorithm.register`` factory: the worker class."""
    from sglang_spec.plugin.worker import DDTreeWorker

    return DDTreeWorker


def register() -> None:
    """Entry point (``sglang.srt.plugins``).  Idempotent.

    SGLang's ``load_plugins`` swallows plugin exceptions; log the reason at
    error level here so a broken install is loud, then re-raise.
    """
    global _registered
    if _registered:
        return
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_registry import get_spec

        if get_spec(ALGORITHM_NAME) is None:
            SpeculativeAlgorithm.register(
                ALGORITHM_NAME,
                supports_overlap=False,
                spec_class=_make_spec_class(),
            )(worker_factory)
        from sglang_spec.plugin.hooks import register_hooks

        register_hooks()
        _registered = True
        logger.info("sglang_spec: registered speculative algorithm %s.", ALGORITHM_NAME)
    except Exception as e:
        logger.error(
            "sglang_spec: FAILED to register speculative algorithm %s: %s: %s. "
            "'--speculative-algorithm %s' will be rejected as unknown.",
            ALGORITHM_NAME,
            type(e).__name__,
            e,
            ALGORITHM_NAME,
            exc_info=True,
        )
        raise
