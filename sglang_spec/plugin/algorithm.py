"""The ``DDTREE`` SpeculativeAlgorithm: its spec class, its worker factory and ``register()``.

``register`` is the ``sglang.srt.plugins`` entry point (``sglang_spec.plugin:register``). SGLang
is imported lazily, inside functions.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from sglang_spec.plugin.config import (
    ALGORITHM_NAME,
    ENV_STAGE_TIMES,
    handle_server_args,
    parse_stage_times_path,
    runtime_config,
)

logger = logging.getLogger("sglang_spec.plugin")

_registered = False


def get_num_tokens_per_req_for_target_verify(num_draft_tokens: int, is_draft_worker: bool) -> int:
    """TARGET_VERIFY width: the drafter block for the draft runner, the verify width (1 + budget)
    for the target."""
    if is_draft_worker:
        return runtime_config().block_size
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

        # DFlash family: aux-hidden capture on the target, drafter KV pool sizing, drafter
        # graphs with input_embeds, DFlashDraftInputV2 decode prep (spec_utils.py:1259) and
        # TARGET_VERIFY graphs for the drafter.
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
                device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay
            )

        def build_disagg_draft_input(self, batch, last_tokens_tensor, future_map):  # noqa: ARG002 - SGLang's signature; DDTREE refuses PD disaggregation
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


def worker_factory(server_args: Any):  # noqa: ARG001 - SpeculativeAlgorithm.register's factory signature
    """``SpeculativeAlgorithm.register`` factory: the worker class."""
    from sglang_spec.plugin.worker import DDTreeWorker

    return DDTreeWorker


def register() -> None:
    """Entry point (``sglang.srt.plugins``). Idempotent.

    SGLang's ``load_plugins`` swallows plugin exceptions; log the reason at error level here so a
    broken install is loud, then re-raise.
    """
    global _registered
    if _registered:
        return
    try:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        from sglang.srt.speculative.spec_registry import get_spec

        if get_spec(ALGORITHM_NAME) is None:
            SpeculativeAlgorithm.register(
                ALGORITHM_NAME, supports_overlap=True, spec_class=_make_spec_class()
            )(worker_factory)
        from sglang_spec.plugin.hooks import register_hooks

        register_hooks()
        stage_times = parse_stage_times_path(os.environ.get(ENV_STAGE_TIMES))
        if stage_times is not None:  # profiling: a DFLASH server times its steps too
            from sglang_spec.plugin.stage_times import time_dflash_steps

            time_dflash_steps(stage_times)
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
