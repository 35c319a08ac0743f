"""Every SGLang internal the DDTREE plug-in relies on, named in one place.

SGLang has no stable API for a speculative algorithm living outside its tree, so the plug-in leans
on three kinds of internals:

* **private** functions and private members of SGLang objects (``DFlashWorkerV2``'s draft-block
  buffers and helpers, the argument-resolution stand-in's record, EAGLE's tree compaction): the
  rest of the plug-in reaches them only through the functions below;
* **hook targets**: dotted paths that ``HookRegistry`` patches (:data:`GET_SPEC_INFO_TARGET`);
* the **public** SGLang names the plug-in imports, the members it reads on SGLang objects, and
  the methods it overrides.

:data:`EXPECTED` holds, for every pinned SGLang version, what the plug-in expects of each of them
(present; for a callable its parameters). :func:`missing_internals` checks the installed SGLang
against it, and ``tests/test_adapter.py`` runs that check in CI, so an upstream rename fails with
the internal's name and the SGLang version instead of crashing a server. A second pin is one more
entry of :data:`EXPECTED` (copy the last one and edit what changed), and an internal a pin has
in another form is absorbed by one function here that decides by what the worker has
(:func:`draft_tp_context`: 0.5.22's ``draft_owns_attention`` or 0.5.23's ``draft_parallel_layout``).

Nothing here imports SGLang at module import time.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from sglang_spec.tree.topk import AllGather, StaticAllGather, VocabShard

# ------------------------------------------------------------------ expectations (data)


@dataclass(frozen=True)
class Sig:
    """A callable whose ``inspect.signature`` parameters are exactly ``params``, in order."""

    params: tuple[str, ...]


@dataclass(frozen=True)
class Kw:
    """A callable (a dataclass constructor, usually) accepting at least these keyword parameters."""

    params: tuple[str, ...]


@dataclass(frozen=True)
class Member:
    """An attribute the class defines, declares, or assigns on ``self`` in one of its methods."""


@dataclass(frozen=True)
class Exists:
    """Importable (a class the plug-in subclasses or tests with ``isinstance``, an enum member)."""


Expectation = Sig | Kw | Member | Exists

# HookRegistry AROUND hook (hooks.py): the target runner's CUDA-graph capture spec_info.
GET_SPEC_INFO_TARGET = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info"
)

# DFlashWorkerV2 methods DDTreeWorker overrides (the only private upstream names it may define).
OVERRIDES = ("_maybe_build_draft_sampler",)

_DRAFT_BLOCK_BUFFERS = (
    "_draft_block_ids_buf",
    "_draft_block_positions_buf",
    "_draft_block_tokens_buf",
    "_draft_verify_out_cache_loc_buf",
    "_draft_block_end_buf",
    "_draft_seq_lens_cpu_buf",
)

_W = "sglang.srt.speculative.dflash_worker_v2:DFlashWorkerV2"
_FBI = "sglang.srt.model_executor.forward_batch_info"
_SPEC_UTILS = "sglang.srt.speculative.spec_utils"
_OVERRIDES_MOD = "sglang.srt.arg_groups.overrides"
_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner"

# Keys are "module:qualified.name"; every `from sglang... import X` in sglang_spec/plugin must
# appear here (tests/test_adapter.py checks that too).
_POOL = "sglang.srt.model_executor.runner_utils.pool"
_FILL_FRONT = "sglang.kernels.ops.speculative.cache_locs:fill_front_out_cache_loc_func"
_SGLANG_0_5_23: dict[str, Expectation] = {
    # --- server-argument resolution (config.py)
    f"{_OVERRIDES_MOD}:resolving_view": Sig(("server_args",)),
    f"{_OVERRIDES_MOD}:resolved_view": Sig(("server_args",)),
    f"{_OVERRIDES_MOD}:declare_resolution": Sig(("server_args", "source", "fields")),
    f"{_OVERRIDES_MOD}:attention_backends_of": Sig(("cfg",)),
    f"{_OVERRIDES_MOD}:_ForeignDefaults": Exists(),
    f"{_OVERRIDES_MOD}:_ForeignDefaults._cfg": Member(),
    "sglang.srt.arg_groups.model_override_base:record_of": Sig(("view",)),
    "sglang.srt.arg_groups.model_override_base:ResolvingConfig": Exists(),
    "sglang.srt.arg_groups.speculative_hook:_handle_dflash": Sig(("server_args",)),
    "sglang.srt.utils.hf_transformers_utils:get_config": Sig(
        (
            "model",
            "trust_remote_code",
            "revision",
            "model_override_args",
            "model_config_parser",
            "kwargs",
        )
    ),
    "sglang.srt.speculative.dflash_utils:parse_dflash_draft_config": Sig(("draft_hf_config",)),
    "sglang.srt.speculative.dflash_utils:DFlashDraftConfig.resolve_block_size": Sig(
        ("self", "default")
    ),
    # --- registration (algorithm.py, hooks.py)
    "sglang.srt.speculative.spec_info:SpeculativeAlgorithm": Exists(),
    "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.DFLASH": Exists(),
    "sglang.srt.speculative.spec_info:SpeculativeAlgorithm.register": Sig(
        ("name", "supports_overlap", "validate_server_args", "spec_class")
    ),
    "sglang.srt.speculative.spec_registry:CustomSpecAlgo": Exists(),
    "sglang.srt.speculative.spec_registry:get_spec": Sig(("name",)),
    "sglang.srt.managers.overlap_utils:FutureMap": Sig(
        ("device", "spec_algo", "req_to_token_pool", "needs_cpu_seq_lens", "needs_confidence_relay")
    ),
    "sglang.srt.runtime_context:get_spec": Sig(()),
    "sglang.srt.runtime_context:get_parallel": Sig(()),
    "sglang.srt.plugins.hook_registry:HookRegistry": Exists(),
    "sglang.srt.plugins.hook_registry:HookType": Exists(),
    "sglang.srt.plugins.hook_registry:HookRegistry.register": Sig(
        ("target", "hook", "hook_type", "source")
    ),
    "sglang.srt.plugins.hook_registry:HookType.AROUND": Exists(),
    f"{_RUNNER}.get_spec_info": Sig(("self", "num_tokens")),
    f"{_RUNNER}.model_runner": Member(),
    f"{_RUNNER}.buffers": Member(),
    f"{_RUNNER}.captured_req_width": Member(),
    # --- the verify input (verify_input.py)
    "sglang.srt.speculative.eagle_info:EagleVerifyInput": Kw(
        (
            "draft_token",
            "custom_mask",
            "positions",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "retrieve_cum_len",
            "spec_steps",
            "topk",
            "draft_token_num",
            "capture_hidden_mode",
            "seq_lens_sum",
            "seq_lens_cpu",
        )
    ),
    f"{_FBI}:CaptureHiddenMode": Exists(),
    # --- the worker (worker.py) and DFlashWorkerV2's private state
    _W: Exists(),
    f"{_W}.__init__": Sig(("self", "server_args", "gpu_id", "nccl_port", "target_worker")),
    f"{_W}.forward_batch_generation": Sig(
        ("self", "batch", "on_publish", "grammar_barrier", "pp_proxy_tensors")
    ),
    f"{_W}._maybe_build_draft_sampler": Sig(("self",)),
    f"{_W}._ensure_draft_block_buffers": Sig(("self", "bs")),
    f"{_W}._make_next_draft_input_decode": Sig(("self", "bonus_tokens", "new_seq_lens")),
    f"{_W}._append_target_hidden_to_draft_kv_by_loc": Sig(
        (
            "self",
            "target_hidden",
            "cache_loc",
            "positions",
            "cache_loc_2d",
            "commit_lens",
            "extend_lens",
        )
    ),
    **{f"{_W}.{name}": Member() for name in _DRAFT_BLOCK_BUFFERS},
    f"{_W}._use_fused_kv_materialize": Member(),
    # the target features the drafter projects: num_context_features x hidden_size columns
    "sglang.srt.models.dflash:DFlashDraftModel.num_context_features": Member(),
    "sglang.srt.models.dflash:DFlashDraftModel.config": Member(),
    f"{_W}._block_pos_offsets": Member(),
    f"{_W}._draft_block_spec_info": Member(),
    f"{_W}._mask_token_id": Member(),
    f"{_W}._full_embed_gpu": Member(),
    f"{_W}._noise_embed_scale": Member(),
    f"{_W}._is_domino": Member(),
    f"{_W}.selector": Member(),
    f"{_W}.lilicorr": Member(),
    f"{_W}.use_compact_draft_cache": Member(),
    f"{_W}.block_size": Member(),
    f"{_W}.speculative_num_draft_tokens": Member(),
    f"{_W}.draft_model": Member(),
    f"{_W}.draft_model_runner": Member(),
    f"{_W}.draft_parallel_layout": Member(),
    f"{_W}._draft_sampler": Member(),
    "sglang.srt.model_executor.model_runner:ModelRunnerOutput.can_run_graph": Member(),
    "sglang.srt.speculative.dflash_worker_v2:_resolve_dflash_embedding_module": Sig(
        ("draft_model", "target_model")
    ),
    "sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2": Exists(),
    "sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2.create_idle_input": Sig(("device",)),
    "sglang.srt.speculative.draft_worker_common:build_block_pos_offsets": Sig(("length", "device")),
    "sglang.srt.speculative.draft_worker_common:make_draft_block_spec_info": Sig(
        ("draft_token_num", "device")
    ),
    f"{_FBI}:ForwardBatch": Kw(
        (
            "forward_mode",
            "batch_size",
            "input_ids",
            "req_pool_indices",
            "seq_lens",
            "out_cache_loc",
            "seq_lens_sum",
            "seq_lens_cpu",
            "positions",
            "input_embeds",
            "spec_algorithm",
            "spec_info",
            "capture_hidden_mode",
            "num_token_non_padded",
            "global_num_token_non_padded_cpu",
            "can_run_decode_cuda_graph",
        )
    ),
    f"{_FBI}:ForwardMode": Exists(),
    f"{_FBI}:ForwardMode.TARGET_VERIFY": Exists(),
    f"{_FBI}:enable_num_token_non_padded": Sig(()),
    "sglang.srt.managers.utils:GenerationBatchResult": Kw(
        (
            "logits_output",
            "next_token_ids",
            "accept_lens",
            "accept_index",
            "can_run_cuda_graph",
            "next_draft_input",
            "speculative_num_draft_tokens",
            "new_seq_lens",
            "extra_keep_alive_refs",
        )
    ),
    "sglang.srt.lora.layers:unwrap_lora_layer": Sig(("module",)),
    f"{_SPEC_UTILS}:draft_tp_context": Sig(("layout",)),
    f"{_SPEC_UTILS}:GrammarTree": Exists(),
    f"{_SPEC_UTILS}:SIMULATE_ACC_METHOD": Exists(),
    f"{_SPEC_UTILS}:sample_simulated_acc_len": Sig(
        ("simulate_acc_len", "simulate_acc_method", "max_len")
    ),
    f"{_SPEC_UTILS}:GrammarTree.from_device": Sig(
        ("retrieve_next_token", "retrieve_next_sibling", "draft_token")
    ),
    f"{_SPEC_UTILS}:build_grammar_vocab_mask": Sig(
        ("reqs", "tree", "sampling_info", "device", "barrier")
    ),
    f"{_SPEC_UTILS}:commit_mamba_states_after_verify": Sig(
        (
            "target_worker",
            "batch",
            "accept_lens",
            "accept_index",
            "draft_token_num",
            "prepared_step_indices",
        )
    ),
    "sglang.srt.speculative.eagle_utils:eagle_prepare_for_verify": Sig(
        ("verify_input", "req_to_token_pool", "batch", "target_worker")
    ),
    "sglang.srt.speculative.eagle_utils:eagle_sample": Sig(
        (
            "verify_input",
            "batch",
            "logits_output",
            "grammar_mask",
            "uno_target_max_top_k",
            "watermark_state",
            "watermark_full_mask",
        )
    ),
    # --- walk_stage at T > 0 (eagle_sample's sampling branch around sample_node_tokens)
    "sglang.srt.speculative.eagle_utils:_seeded_verify_coins": Sig(
        ("sampling_seed", "seq_lens", "draft_token_num", "device")
    ),
    "sglang.srt.speculative.eagle_utils:verify_tree_greedy_func": Sig(
        (
            "predicts",
            "accept_index",
            "accept_token_num",
            "candidates",
            "retrieve_index",
            "retrieve_next_token",
            "retrieve_next_sibling",
            "target_predict",
            "topk",
        )
    ),
    "sglang.srt.sampling.penaltylib.repetition_penalty:apply_scaling_penalties": Sig(
        ("logits", "scaling_penalties")
    ),
    "sglang.srt.utils.async_probe:sanitize_nan_logits": Sig(("logits", "msg")),
    **{
        f"sglang.srt.sampling.sampling_batch_info:SamplingBatchInfo.{f}": Member()
        for f in (
            "is_all_greedy",
            "temperatures",
            "top_ks",
            "top_ps",
            "min_ps",
            "need_min_p_sampling",
            "sampling_seed",
            "acc_additive_penalties",
            "acc_scaling_penalties",
            "logit_bias",
            "has_watermark_candidates",
        )
    },
    **{
        f"sglang.srt.sampling.sampling_params:SamplingParams.{f}": Member()
        for f in ("top_k", "top_p")
    },
    "sglang.srt.distributed.parallel_state:GroupCoordinator.broadcast": Sig(
        ("self", "input_", "src")
    ),
    "sglang.kernels.ops.speculative.eagle:prepare_verify_commit_outputs": Sig(
        (
            "predict",
            "accept_index",
            "accept_lens",
            "seq_lens",
            "num_draft_tokens",
            "mamba_track_interval",
        )
    ),
    "sglang.srt.layers.logprob_processor:compute_spec_logprobs": Sig(
        ("batch", "logits_output", "predict", "accept_index", "chain_stride")
    ),
    "sglang.srt.speculative.eagle_worker_common:_compact_accept_to_front": Sig(
        ("x", "accept_index", "bs", "num_draft_tokens")
    ),
    f"{_SPEC_UTILS}:move_accept_tokens_to_target_kvcache": Sig(
        ("batch", "accept_index", "num_correct_drafts", "token_to_kv_pool_allocator")
    ),
    f"{_FBI}:ForwardMode.DECODE": Exists(),
    # --- the tree compaction's slot lookups and the batch sizes they see (warm_accept_compaction)
    _FILL_FRONT: Sig(("num_front", "out_cache_loc", "front_out_cache_loc")),
    "sglang.kernels.ops.speculative.eagle:fill_accept_out_cache_loc_func": Sig(
        ("accept_index", "out_cache_loc", "accept_out_cache_loc", "size")
    ),
    "sglang.srt.model_executor.model_runner:ModelRunner.max_running_requests": Member(),
    # --- the target KV pool's tiled KV-move kernel (cap_kv_move_chunks)
    "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool._kv_copy_config": Member(),
    "sglang.srt.mem_cache.memory_pool:MHATokenToKVPool.move_kv_cache": Sig(
        ("self", "tgt_loc", "src_loc")
    ),
    "sglang.srt.mem_cache.memory_pool:HybridLinearKVPool.full_kv_pool": Member(),
    "sglang.srt.mem_cache.allocator.base:BaseTokenToKVPoolAllocator.get_kvcache": Sig(("self",)),
    # --- SGLang objects the worker reads and calls (public members)
    **{
        f"sglang.srt.managers.schedule_batch:ScheduleBatch.{f}": Member()
        for f in (
            "forward_mode",
            "is_extend_in_batch",
            "extend_lens",
            "spec_info",
            "seq_lens",
            "seq_lens_cpu",
            "seq_lens_sum",
            "req_pool_indices",
            "out_cache_loc",
            "can_run_decode_cuda_graph",
            "has_grammar",
            "reqs",
            "sampling_info",
            "return_logprob",
            "tree_cache",
            "mamba_track_indices",
        )
    },
    **{
        f"sglang.srt.speculative.dflash_info_v2:DFlashDraftInputV2.{f}": Member()
        for f in ("bonus_tokens", "new_seq_lens", "nxt_kv_lens_cpu", "nxt_kv_lens_sum")
    },
    **{
        f"sglang.srt.model_executor.model_runner:ModelRunner.{f}": Member()
        for f in (
            "model",
            "kv_index_translator",
            "attn_backend",
            "decode_cuda_graph_runner",
            "req_to_token_pool",
            "token_to_kv_pool_allocator",
            "watermark_state",
            "dtype",
        )
    },
    "sglang.srt.model_executor.model_runner:ModelRunner.forward": Kw(("forward_batch",)),
    f"{_RUNNER}.bs": Member(),
    "sglang.srt.managers.tp_worker:TpModelWorker.forward_batch_generation": Kw(
        ("batch", "forward_batch", "is_verify")
    ),
    "sglang.srt.mem_cache.kv_index_translator:KVIndexTranslator.plan": Kw(
        ("req_pool_indices", "seq_lens", "seq_lens_cpu", "write_virtual", "read_extent")
    ),
    "sglang.srt.mem_cache.kv_loc_plan:KVLocPlan.bind": Sig(("self", "batch", "reader", "cols")),
    "sglang.srt.layers.attention.base_attn_backend:AttentionBackend.verify_mask": Member(),
    "sglang.srt.layers.attention.base_attn_backend:AttentionBackend"
    ".update_verify_buffers_to_fill_after_draft": Sig(("self", "spec_info", "cuda_graph_bs")),
    "sglang.srt.layers.attention.hybrid_linear_attn_backend:HybridLinearAttnBackend"
    ".attn_backend_list": Member(),
    "sglang.srt.layers.attention.verify_mask:VerifyMask.buffer": Member(),
    "sglang.srt.layers.attention.verify_mask:VerifyMask.mode": Member(),
    "sglang.srt.layers.attention.verify_mask:VerifyMask.fits": Sig(("self", "bs")),
    "sglang.srt.layers.logits_processor:LogitsProcessorOutput.hidden_states": Member(),
    "sglang.srt.models.dflash:DFlashDraftModel.set_block_size": Sig(("self", "block_size")),
    # --- the vocabulary-parallel LM head (topk_stage) and the TP group
    "sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding.shard_indices": Member(),
    **{
        f"sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbeddingShardIndices.{f}": (
            Member()
        )
        for f in (
            "org_vocab_start_index",
            "num_org_elements",
            "num_org_elements_padded",
            "added_vocab_start_index",
            "num_added_elements",
        )
    },
    "sglang.srt.distributed.parallel_state:GroupCoordinator.all_gather_into_tensor": Sig(
        ("self", "output", "input")
    ),
    "sglang.srt.distributed.parallel_state:GroupCoordinator.world_size": Member(),
    # --- budget by batch size (worker.py): per-width target verify states, as upstream's
    # adaptive EAGLE builds them (eagle_worker_v2.py:1777 build_adaptive_runtime_state, :1909)
    "sglang.srt.speculative.base_spec_worker:BaseSpecWorker.on_verify_complete_cpu": Sig(
        ("self", "num_correct_drafts_per_req", "batch_size")
    ),
    f"{_W}.init_cuda_graphs": Sig(("self",)),
    # worker.prewarm_sampling skips DFLASH's dense-sampler rehearsal for the generic one
    f"{_W}.prewarm_sampling": Sig(("self",)),
    "sglang.srt.speculative.base_spec_worker:BaseSpecWorker.prewarm_sampling": Sig(("self",)),
    "sglang.srt.runtime_context:get_context": Sig(()),
    "sglang.srt.runtime_context:get_exec": Sig(()),
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner:DecodeCudaGraphRunner": Kw(
        ("model_runner", "attn_backend", "speculative_num_steps", "speculative_num_draft_tokens")
    ),
    "sglang.srt.runtime_context:RuntimeContext.override": Sig(("self", "source", "fields")),
    "sglang.srt.model_executor.cuda_graph_config:check_cuda_graph_backend": Sig(
        ("phase", "backend")
    ),
    "sglang.srt.model_executor.cuda_graph_config:Phase": Exists(),
    "sglang.srt.model_executor.cuda_graph_config:Backend": Exists(),
    "sglang.srt.model_executor.cuda_graph_config:Phase.DECODE": Exists(),
    "sglang.srt.model_executor.cuda_graph_config:Backend.DISABLED": Exists(),
    # the resolved capture list (get_exec().graph.cuda_graph_config.decode.bs)
    "sglang.srt.model_executor.cuda_graph_config:CudaGraphConfig.decode": Member(),
    "sglang.srt.model_executor.cuda_graph_config:PhaseConfig.bs": Member(),
    "sglang.srt.model_executor.model_runner:ModelRunner._get_attention_backend": Sig(
        ("self", "init_new_workspace")
    ),
    "sglang.srt.model_executor.model_runner:ModelRunner.init_new_workspace": Member(),
    # --- the draft sampler's own graphs (draft_sampler.capture): SGLang's capture context
    "sglang.srt.distributed.parallel_state:graph_capture": Sig(("stream",)),
    "sglang.srt.distributed.parallel_state:GraphCaptureContext.stream": Member(),
    f"{_POOL}:get_or_create_global_graph_memory_pool": Sig(("device_module",)),
    f"{_POOL}:get_or_create_global_graph_capture_stream": Sig(()),
}

# 0.5.22 differs from 0.5.23 in how the drafter's TP placement is held and entered (the needs
# sglang_spec.patching.survey.ADAPTED records; tests/test_adapter.py keeps them equal): a bool
# ``draft_owns_attention`` (dflash_worker_v2.py:414) instead of a resolved
# ``DraftParallelLayout``, and ``draft_tp_context(owns_attention)`` (spec_utils.py:766);
# :func:`draft_tp_context` absorbs both. And its tree compaction has no
# ``fill_front_out_cache_loc_func``, which :func:`warm_accept_compaction` then leaves out.
_SGLANG_0_5_22: dict[str, Expectation] = {
    **{
        k: v
        for k, v in _SGLANG_0_5_23.items()
        if k not in (f"{_W}.draft_parallel_layout", _FILL_FRONT)
    },
    f"{_W}.draft_owns_attention": Member(),
    f"{_SPEC_UTILS}:draft_tp_context": Sig(("owns_attention",)),
    # its compaction looks the targets up in req_to_token with this kernel itself (no
    # width-dependent variant): warm_accept_compaction skips the front lookup there
    "sglang.kernels.ops.speculative.cache_locs:assign_extend_cache_locs": Exists(),
}

# SGLang version -> what the plug-in expects of it.
EXPECTED: dict[str, dict[str, Expectation]] = {"0.5.22": _SGLANG_0_5_22, "0.5.23": _SGLANG_0_5_23}


# ------------------------------------------------------------------------------- checks


def installed_sglang_version() -> str:
    import sglang

    return str(sglang.__version__)


def _resolve(key: str) -> Any:
    module, _, qualname = key.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


@functools.cache
def _assigned_on_self(cls: type) -> frozenset[str]:
    """Names a class's own methods assign on ``self`` (instance attributes)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return frozenset()
    names = set()
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign | ast.AugAssign)
            else []
        )
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                names.add(t.attr)
    return frozenset(names)


def _has_member(cls: type, name: str) -> bool:
    for klass in cls.__mro__:
        if klass is object:
            continue
        if name in vars(klass) or name in getattr(klass, "__annotations__", {}):
            return True
        if name in _assigned_on_self(klass) or name in getattr(klass, "__slots__", ()):
            return True
    return False


def _problem(key: str, want: Expectation) -> str | None:
    """Why ``key`` does not meet ``want`` in the installed SGLang, or None."""
    if isinstance(want, Member):
        owner_key, _, name = key.rpartition(".")
        try:
            owner = _resolve(owner_key)
        except (ImportError, AttributeError) as e:
            return f"{owner_key} is missing ({type(e).__name__}: {e})"
        if not _has_member(owner, name):
            return f"{key} is missing: {owner.__name__} no longer defines or assigns {name!r}"
        return None
    try:
        obj = _resolve(key)
    except (ImportError, AttributeError) as e:
        return f"{key} is missing ({type(e).__name__}: {e})"
    if isinstance(want, Exists):
        return None
    try:
        have = tuple(inspect.signature(obj).parameters)
    except (TypeError, ValueError) as e:
        return f"{key} has no inspectable signature ({e})"
    if isinstance(want, Sig) and have != want.params:
        return f"{key} has parameters {have}, expected {want.params}"
    if isinstance(want, Kw) and (absent := [p for p in want.params if p not in have]):
        return f"{key} no longer accepts {absent} (has {have})"
    return None


def missing_internals(version: str | None = None) -> list[str]:
    """One line per expectation the installed SGLang does not meet (empty when all hold).

    ``version`` selects the expectations (default: the installed SGLang's version); a version
    with no entry in :data:`EXPECTED` is itself reported.
    """
    installed = installed_sglang_version()
    version = installed if version is None else version
    if version not in EXPECTED:
        return [
            f"SGLang {version} is not a pinned version of the DDTREE plug-in "
            f"(pinned: {', '.join(sorted(EXPECTED))}); add its internals to "
            "sglang_spec.plugin.adapter.EXPECTED"
        ]
    problems = (_problem(key, want) for key, want in EXPECTED[version].items())
    return [f"SGLang {installed}: {p}" for p in problems if p is not None]


# ------------------------------------------- per-width target verify states (worker.py)


@dataclass
class TargetVerifyState:
    """What the target's verify pass at one width needs: an attention backend sized for it and
    its CUDA graphs (None: eager, when graphs are off or no batch size of this width has any)."""

    width: int
    attn_backend: Any
    graph_runner: Any


def target_verify_state(worker: Any, width: int) -> TargetVerifyState:
    """The target's current verify state (at start-up: the one captured for the server's width)."""
    mr = worker.target_worker.model_runner
    return TargetVerifyState(width, mr.attn_backend, mr.decode_cuda_graph_runner)


def apply_target_verify_state(worker: Any, state: TargetVerifyState) -> None:
    """Make ``state`` the target's: its verify passes then run at ``state.width``."""
    mr = worker.target_worker.model_runner
    mr.attn_backend = state.attn_backend
    mr.decode_cuda_graph_runner = state.graph_runner


def refresh_verify_graph_buffers(attn_backend: Any, spec_info: Any, cuda_graph_bs: int) -> None:
    """``update_verify_buffers_to_fill_after_draft`` on every target attention backend that
    implements it: the GDN backend's retrieve_* and tree-path graph buffers, the mask-dependent
    metadata of backends that keep some. The hybrid backend forwards the call to each child, and
    the base class raises NotImplementedError, which FlashInfer and FA3 keep (they read the tree
    mask at replay), so a hybrid target on either would fail its first graph verify; its children
    are called one by one here, and a backend without its own method is skipped."""
    children = getattr(attn_backend, "attn_backend_list", None)
    if children is not None:
        for child in children:
            refresh_verify_graph_buffers(child, spec_info, cuda_graph_bs)
    elif _keeps_verify_buffers(type(attn_backend)):
        attn_backend.update_verify_buffers_to_fill_after_draft(spec_info, cuda_graph_bs)


@functools.cache
def _keeps_verify_buffers(cls: type) -> bool:
    """Whether ``cls`` has its own ``update_verify_buffers_to_fill_after_draft`` (decided once per
    class, not in every decode step)."""
    base = _resolve("sglang.srt.layers.attention.base_attn_backend:AttentionBackend")
    return (
        cls.update_verify_buffers_to_fill_after_draft
        is not base.update_verify_buffers_to_fill_after_draft
    )


def decode_cuda_graph_bs() -> list[int] | None:
    """The server's decode CUDA-graph batch sizes, None when decode graphs are off: the resolved
    ``cuda_graph_config.decode.bs`` that the graph runners capture (base_cuda_graph_runner.py
    ``get_batch_sizes_to_capture``), as upstream DFLASH sizes its draft sampler; not the
    ``--cuda-graph-bs`` input leaf ``cuda_graph_bs_decode``, which is None unless given."""
    from sglang.srt.model_executor.cuda_graph_config import (
        Backend,
        Phase,
        check_cuda_graph_backend,
    )
    from sglang.srt.runtime_context import get_exec

    if check_cuda_graph_backend(Phase.DECODE, Backend.DISABLED):
        return None
    return sorted(get_exec().graph.cuda_graph_config.decode.bs)


@contextlib.contextmanager
def verify_capture_config(width: int, cuda_graph_bs: list[int] | None) -> Iterator[None]:
    """SGLang's resolved config as a target verify state of ``width`` is built under it: the spec's
    verify width and, for a non-empty ``cuda_graph_bs``, the decode batch sizes the graph runner
    captures (``cuda_graph_config.decode.bs``; not the ``--cuda-graph-bs`` input leaf
    ``cuda_graph_bs_decode``, which the runner never reads). Restored on exit."""
    from sglang.srt.runtime_context import get_context, get_exec, get_spec

    ctx = get_context()
    graph_config = get_exec().graph.cuda_graph_config
    saved = {
        "speculative_num_draft_tokens": get_spec().speculative_num_draft_tokens,
        "cuda_graph_config": graph_config,
    }
    override: dict[str, Any] = {"speculative_num_draft_tokens": width}
    if cuda_graph_bs:
        override["cuda_graph_config"] = dataclasses.replace(
            graph_config, decode=dataclasses.replace(graph_config.decode, bs=list(cuda_graph_bs))
        )
    ctx.override("sglang_spec.ddtree.budget_capture", **override)
    try:
        yield
    finally:
        ctx.override("sglang_spec.ddtree.budget_restore", **saved)


def build_target_verify_state(
    worker: Any, width: int, cuda_graph_bs: list[int] | None
) -> TargetVerifyState:
    """A target verify state for ``width``, as upstream's adaptive EAGLE builds one per step count
    (eagle_worker_v2.py:1777 ``build_adaptive_runtime_state``, target side, and :1909
    ``_override_worker_state``): under :func:`verify_capture_config`, a new attention backend on a
    new workspace and a ``DecodeCudaGraphRunner`` capturing ``cuda_graph_bs`` (None: graphs off;
    empty: this width runs eagerly). The DFlash drafter's block does not depend on the verify
    width, so its graphs are shared."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    mr = worker.target_worker.model_runner
    with verify_capture_config(width, cuda_graph_bs):
        workspace = mr.init_new_workspace
        try:
            backend = mr._get_attention_backend(init_new_workspace=True)
        finally:
            mr.init_new_workspace = workspace
        runner = None
        if cuda_graph_bs:
            runner = DecodeCudaGraphRunner(
                mr,
                attn_backend=backend,
                speculative_num_steps=1,
                speculative_num_draft_tokens=width,
            )
    return TargetVerifyState(width, backend, runner)


# ------------------------------------------------------ server arguments (config.py)


def real_server_args(server_args: Any) -> Any:
    """The ServerArgs record behind SGLang's plug-in stand-in (``overrides._ForeignDefaults``),
    which ``declare_resolution`` needs; anything else is returned as is."""
    from sglang.srt.arg_groups.model_override_base import ResolvingConfig, record_of
    from sglang.srt.arg_groups.overrides import _ForeignDefaults

    if isinstance(server_args, _ForeignDefaults):
        cfg = object.__getattribute__(server_args, "_cfg")
        if isinstance(cfg, ResolvingConfig):
            return record_of(cfg)
    return server_args


def handle_dflash(record: Any) -> None:
    """Upstream DFLASH's own argument handling (device check, drafter attention backend,
    max_running_requests), run on a chain-shaped view of the DDTREE record."""
    from sglang.srt.arg_groups.speculative_hook import _handle_dflash

    _handle_dflash(record)


# --------------------------------------------- DFlashWorkerV2's private state (worker.py)


@dataclass
class DraftBlockBuffers:
    """DFlashWorkerV2's per-batch draft-block buffers, sliced to the batch."""

    block_ids: torch.Tensor  # [bs, block]
    positions: torch.Tensor  # [bs, block]
    cache_loc: torch.Tensor  # [bs, block]
    seq_lens_cpu: torch.Tensor  # [bs] (host)


def resize_draft_block(worker: Any, block_size: int) -> None:
    """Size DFlashWorkerV2's draft-block state for ``block_size``.

    DFlashWorkerV2.__init__ takes its block from ``speculative_num_draft_tokens``
    (dflash_worker_v2.py:507-523), which for DDTREE is the verify width 1 + budget; the position
    offsets and the block's spec info are rebuilt, the buffers sized from the old block dropped
    (``_ensure_draft_block_buffers`` rebuilds them on first use).
    """
    from sglang.srt.speculative.draft_worker_common import (
        build_block_pos_offsets,
        make_draft_block_spec_info,
    )

    worker.block_size = block_size
    worker.draft_model.set_block_size(block_size)
    worker._block_pos_offsets = build_block_pos_offsets(length=block_size, device=worker.device)
    worker._draft_block_spec_info = make_draft_block_spec_info(
        draft_token_num=block_size, device=worker.device
    )
    for name in _DRAFT_BLOCK_BUFFERS:
        setattr(worker, name, None)


def draft_tp_context(worker: Any) -> Any:
    """The context the drafter's work runs in (its TP placement), entered as the worker's own
    SGLang release enters it: 0.5.23 resolves a ``draft_parallel_layout``, 0.5.22 keeps the bool
    ``draft_owns_attention``; ``spec_utils.draft_tp_context`` takes whichever its release has."""
    from sglang.srt.speculative.spec_utils import draft_tp_context as enter

    if hasattr(worker, "draft_parallel_layout"):
        return enter(worker.draft_parallel_layout)
    return enter(worker.draft_owns_attention)


def unsupported_drafter_head(worker: Any) -> str | None:
    """Why the worker's DFlash drafter has no plain per-depth head DDTREE can read, or None."""
    if worker.selector is not None or worker.lilicorr is not None or worker._is_domino:
        return "selector, LiLiCorr and Domino heads are not supported"
    if worker.use_compact_draft_cache:
        return "a compact drafter KV cache is not supported"
    return None


def is_extend(batch: Any) -> bool:
    """A prefill batch, or a mixed one with extends in it (the worker's extend path)."""
    return bool(batch.forward_mode.is_extend() or batch.is_extend_in_batch)


def extend_tokens(batch: Any) -> int:
    """Prompt tokens a prefill batch computes (its cached prefixes not counted)."""
    return int(sum(batch.extend_lens or ()))


def wrap_dflash_steps(timed: Any) -> None:
    """Send every upstream DFLASH decode step and prefill (``DFlashWorkerV2.forward_batch_generation``
    of a plain DFLASH worker on a decode or an extend batch, not an idle one; DDTREE's worker
    overrides the method) through ``timed(worker, batch, call)``, which must return ``call()``.
    Idempotent; profiling only (``stage_times.time_dflash_steps``)."""
    from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

    original = DFlashWorkerV2.forward_batch_generation
    if getattr(original, "sglang_spec_timed", False):
        return

    @functools.wraps(original)
    def forward_batch_generation(self, batch, *args, **kwargs):
        def call():
            return original(self, batch, *args, **kwargs)

        plain = type(self) is DFlashWorkerV2
        return timed(self, batch, call) if plain and not batch.forward_mode.is_idle() else call()

    forward_batch_generation.sglang_spec_timed = True
    DFlashWorkerV2.forward_batch_generation = forward_batch_generation


def dflash_block_size(worker: Any) -> int:
    return int(worker.block_size)


def draft_block_buffers(worker: Any, bs: int) -> DraftBlockBuffers:
    worker._ensure_draft_block_buffers(bs)
    return DraftBlockBuffers(
        block_ids=worker._draft_block_ids_buf[:bs],
        positions=worker._draft_block_positions_buf[:bs],
        cache_loc=worker._draft_verify_out_cache_loc_buf[:bs],
        seq_lens_cpu=worker._draft_seq_lens_cpu_buf[:bs],
    )


def block_pos_offsets(worker: Any) -> torch.Tensor:
    """``arange(block)``, the draft block's positions after the prefix."""
    return worker._block_pos_offsets


def draft_block_spec_info(worker: Any) -> Any:
    """The spec info the drafter's TARGET_VERIFY pass (and its CUDA graphs) run with."""
    return worker._draft_block_spec_info


def mask_token_id(worker: Any) -> int:
    return int(worker._mask_token_id)


def embed_draft_block(worker: Any, block_ids: torch.Tensor) -> torch.Tensor:
    """The drafter's input embedding of ``[bonus, MASK, ...]`` rows, as DFLASH computes it."""
    if worker._full_embed_gpu is not None:
        emb = torch.nn.functional.embedding(block_ids, worker._full_embed_gpu)
    else:
        from sglang.srt.lora.layers import unwrap_lora_layer
        from sglang.srt.speculative.dflash_worker_v2 import _resolve_dflash_embedding_module

        target_model = worker.target_worker.model_runner.model
        emb = unwrap_lora_layer(_resolve_dflash_embedding_module(worker.draft_model, target_model))(
            block_ids
        )
    if worker._noise_embed_scale != 1.0:
        emb = emb * worker._noise_embed_scale
    return emb


def next_draft_input(worker: Any, bonus_tokens: torch.Tensor, new_seq_lens: torch.Tensor) -> Any:
    """The DFlashDraftInputV2 the next decode step starts from."""
    return worker._make_next_draft_input_decode(
        bonus_tokens=bonus_tokens, new_seq_lens=new_seq_lens
    )


def append_target_hidden_to_draft_kv(
    worker: Any,
    *,
    target_hidden: torch.Tensor,
    cache_loc_2d: torch.Tensor,
    positions: torch.Tensor,
    commit_lens: torch.Tensor,
) -> None:
    """DFLASH's prefix-valid writer: drafter K/V of rows ``[0, commit_len)`` of each request."""
    worker._append_target_hidden_to_draft_kv_by_loc(
        target_hidden=target_hidden,
        cache_loc=cache_loc_2d.reshape(-1),
        cache_loc_2d=cache_loc_2d,
        positions=positions,
        commit_lens=commit_lens,
    )


@contextlib.contextmanager
def per_layer_kv_append(worker: Any) -> Iterator[None]:
    """DFLASH's prefix-valid writer through its per-layer path, not its fused helper
    (``FusedKVMaterializeHelper``), while the drafter context append is captured: the helper
    keeps a projection workspace that it replaces by a larger one when a call brings more rows
    (any prefill does), which would leave a captured graph writing freed memory. The per-layer
    path's tensors come from the graph's own pool."""
    saved = worker._use_fused_kv_materialize
    worker._use_fused_kv_materialize = False
    try:
        yield
    finally:
        worker._use_fused_kv_materialize = saved


def target_feature_size(worker: Any) -> int:
    """Columns of the target features the drafter projects (``DFlashDraftModel.fc``'s input):
    its context layers x the hidden size."""
    model = worker.draft_model
    return int(model.num_context_features) * int(model.config.hidden_size)


# ------------------------------------------------------------- EAGLE's verify coins


def seeded_node_uniforms(batch: Any, width: int) -> torch.Tensor:
    """``[bs * width]`` uniforms in ``[0, 1)`` for the tree's nodes from the requests' sampling
    seeds: eagle_sample's seeded verify coins (murmur hash of seed, seq_len, node column)."""
    from sglang.srt.speculative.eagle_utils import _seeded_verify_coins

    coins, _ = _seeded_verify_coins(
        sampling_seed=batch.sampling_info.sampling_seed,
        seq_lens=batch.seq_lens,
        draft_token_num=width,
        device=batch.seq_lens.device,
    )
    return coins.reshape(-1)


# ------------------------------------------------------------- EAGLE's tree commit


@dataclass
class CommitBatch:
    """The ``ScheduleBatch`` fields SGLang's post-verify commit reads
    (``commit_mamba_states_after_verify`` with ``_verify_commit_step_indices``,
    ``move_accept_tokens_to_target_kvcache``): what a commit graph passes in place of the
    scheduler's batch, its tensors the graph's static buffers (plugin.commit_graphs)."""

    forward_mode: Any
    tree_cache: Any  # only its page_size is read (the mamba track interval)
    seq_lens: torch.Tensor
    req_pool_indices: torch.Tensor
    out_cache_loc: torch.Tensor
    mamba_track_indices: torch.Tensor | None


def commit_batch_maker(server_args: Any) -> Callable[..., CommitBatch]:
    """``make_batch`` for ``plugin.commit_graphs``: a decode batch over a commit graph's static
    tensors (``seq_lens``, ``req_pool_indices``, ``out_cache_loc``, ``mamba_track_indices``), its
    ``tree_cache.page_size`` the page the scheduler's radix tree allocates on -- the resolved
    ``--page-size`` (``resolved_view``): the raw record's is None when the flag is unset, and the
    commit's mamba track grid (``mamba_track_grid``) needs the number."""
    from types import SimpleNamespace

    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    tree_cache = SimpleNamespace(page_size=resolved_view(server_args).page_size)

    def make(**tensors: torch.Tensor | None) -> CommitBatch:
        return CommitBatch(forward_mode=ForwardMode.DECODE, tree_cache=tree_cache, **tensors)

    return make


def mamba_tracking() -> bool:
    """Whether verify batches carry mamba track indices (``--mamba-radix-cache-strategy
    extra_buffer``: ``prepare_mamba_track_for_verify`` sets them before every verify)."""
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().mamba.enable_mamba_extra_buffer)


def commit_accepted_path(
    target_worker: Any,
    allocator: Any,
    batch: Any,
    predict: torch.Tensor,
    accept_index: torch.Tensor,
    accept_lens: torch.Tensor,
    num_draft_tokens: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The commit of a verified tree, as EAGLE's tree verify commits (``run_eagle_verify`` with
    ``_finalize_accept_tree_path``), less the hidden rows (:func:`compact_accepted_rows`):
    the new lengths and bonus tokens, the mamba/GDN state at the last accepted node, the accepted
    path's KV slots moved to the front of each request's window, and ``predict`` compacted so.
    Returns ``(new_seq_lens, bonus, predict)``. No host sync; capturable (plugin.commit_graphs)."""
    from sglang.kernels.ops.speculative.eagle import prepare_verify_commit_outputs
    from sglang.srt.speculative.spec_utils import (
        commit_mamba_states_after_verify,
        move_accept_tokens_to_target_kvcache,
    )

    new_seq_lens, bonus = prepare_verify_commit_outputs(
        predict, accept_index, accept_lens, batch.seq_lens
    )
    # Tree-aware: steps = accept_index[b, len-1] - b*n; reads the pre-verify batch.seq_lens for
    # the track interval.
    commit_mamba_states_after_verify(
        target_worker, batch, accept_lens, accept_index, num_draft_tokens
    )
    move_accept_tokens_to_target_kvcache(batch, accept_index, accept_lens - 1, allocator)
    return new_seq_lens, bonus, compact_accepted_rows(predict, accept_index, num_draft_tokens)


def compact_accepted_rows(
    x: torch.Tensor, accept_index: torch.Tensor, num_draft_tokens: int
) -> torch.Tensor:
    """EAGLE's tree compaction of node-indexed rows (``[bs * num_draft_tokens, ...]``): each
    request's accepted path first in its window (``_compact_accept_to_front``)."""
    from sglang.srt.speculative.eagle_worker_common import _compact_accept_to_front

    bs = accept_index.shape[0]
    return _compact_accept_to_front(x, accept_index, bs, num_draft_tokens=num_draft_tokens)


# Rows per launch of SGLang's tiled KV-move kernel. Its tile is [rows, bytes] with a 64-bit pointer
# per element: compiled for sm_90 at the 27B shape's 2 KB rows, 128 rows keep a 136-byte stack
# frame, 256 rows (SGLang's cap at that row size) spill to a 7440-byte one -- about 2 GB of local
# memory at launch on an H200. A DDTREE(63) server at default memory (0.5 GB free) died with CUDA
# out of memory launching it, in the warm-up step after bs 8: 16 requests move 16 x 16 = 256 slots.
# (Session 10. Session 11 served the tiny pair with the cap up to C = 32; whether it removes the
# 27B crash is not measured yet.)
KV_MOVE_ROWS = 128


def cap_kv_move_chunks(kv_cache: Any, rows: int = KV_MOVE_ROWS) -> bool:
    """Make SGLang's KV-move (the tree compaction of ``commit_accepted_path``) copy at most
    ``rows`` slots per launch of its tiled kernel, and launch it on slot 0 onto itself (as SGLang's
    pool warms its own) for every specialization a move can hit (:func:`kv_move_warm_counts`), so
    each is compiled at start-up, not in a decode step (session 23's 27B server compiled one inside
    a served level, 0.16 s).
    ``kv_cache`` is the allocator's ``get_kvcache()``; a hybrid pool's full-attention pool is the
    one that moves. Returns False, changing nothing, for a pool without the tiled copy (HND
    layouts, native moves)."""
    pool = getattr(kv_cache, "full_kv_pool", kv_cache)
    config = getattr(pool, "_kv_copy_config", None)
    if config is None:
        return False
    config["num_locs_upper"] = min(int(config.get("num_locs_upper", rows)), rows)
    for n in kv_move_warm_counts(config["num_locs_upper"]):
        slot0 = torch.zeros(n, dtype=torch.int64, device=pool.device)
        pool.move_kv_cache(slot0, slot0)
    return True


def kv_move_warm_counts(cap: int) -> list[int]:
    """Slot counts, one per compiled variant of SGLang's tiled KV move for moves of 1..``cap``
    slots: the launch passes ``next_power_of_2(n)`` as a constexpr, and Triton specialises the
    runtime ``n`` as 1, a multiple of 16, or any other value; each (power of two, class) pair that
    some ``n`` reaches gets its smallest ``n``."""
    counts = []
    for upper in (1 << k for k in range(max(cap, 1).bit_length())):
        if upper > cap:
            break
        reach = range(upper // 2 + 1, upper + 1)
        for cls in ("one", "x16", "other"):
            hits = [
                n for n in reach if cls == ("one" if n == 1 else "x16" if n % 16 == 0 else "other")
            ]
            if hits:
                counts.append(hits[0])
    return sorted(counts)


def accept_compaction_variants(
    shapes: list[tuple[int, int]], max_bs: int
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """One batch size per compiled variant of the tree compaction's two slot lookups, for
    requests verifying ``(width, accept width)`` trees (one pair per candidate budget) in batches
    of 1..``max_bs``: ``fill_front_out_cache_loc_func`` (SGLang's ``assign_extend_cache_locs``
    kernel) takes the width and ``next_power_of_2(bs)`` as constexprs,
    ``fill_accept_out_cache_loc_func`` takes ``next_power_of_2(bs * accept width)``. Returns the
    ``(width, bs)`` and ``(accept width, bs)`` pairs to launch, the smallest ``bs`` of each."""
    front, accept = {}, {}
    for width, depth in shapes:
        for bs in range(1, max_bs + 1):
            front.setdefault((width, 1 << (bs - 1).bit_length()), (width, bs))
            accept.setdefault(1 << (bs * depth - 1).bit_length(), (depth, bs))
    return sorted(front.values()), sorted(accept.values())


def warm_accept_compaction(shapes: list[tuple[int, int]], max_bs: int, device: Any) -> int:
    """Launch every variant :func:`accept_compaction_variants` lists once, on scratch tensors
    (nothing of the pools is read or written), so that each compiles at start-up: inside a
    decode step each new (budget, batch-size class) compiled one, 0.1 s, inside the 27B adaptive
    server's timed levels (sessions 24 and 25). Returns the launches."""
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc_func

    front, accept = accept_compaction_variants(shapes, max_bs)
    try:
        from sglang.kernels.ops.speculative.cache_locs import fill_front_out_cache_loc_func
    except ImportError:  # 0.5.22: its compaction reads req_to_token, no width-dependent lookup
        front = []
    for width, bs in front:  # the dtypes of move_accept_tokens_to_target_kvcache's arguments
        fill_front_out_cache_loc_func(
            torch.ones(bs, dtype=torch.int32, device=device),
            torch.zeros(bs * width, dtype=torch.int64, device=device),
            torch.zeros(bs * width, dtype=torch.int64, device=device),
        )
    for depth, bs in accept:
        fill_accept_out_cache_loc_func(
            torch.full((bs, depth), -1, dtype=torch.int32, device=device),
            torch.zeros(bs * depth, dtype=torch.int64, device=device),
            torch.zeros(bs * depth, dtype=torch.int64, device=device),
            bs * depth,
        )
    return len(front) + len(accept)


def max_running_requests(worker: Any) -> int | None:
    """The target runner's cap on running requests (None before the scheduler sets it)."""
    return worker.target_worker.model_runner.max_running_requests


def draw_simulated_accept_len(tau: float, max_len: int) -> int:
    """One step's simulated acceptance length in ``1..max_len`` around ``tau``, drawn as SGLang
    draws its ``SGLANG_SIMULATE_ACC_LEN`` (``spec_utils.sample_simulated_acc_len`` with its
    ``SIMULATE_ACC_METHOD``), on the host."""
    from sglang.srt.speculative.spec_utils import SIMULATE_ACC_METHOD, sample_simulated_acc_len

    return int(sample_simulated_acc_len(tau, SIMULATE_ACC_METHOD, max_len))


# ----------------------------------------------- the target LM head under tensor parallelism


def vocab_shard(lm_head: Any) -> VocabShard:
    """This rank's rows of a (vocabulary-parallel) LM head, as :mod:`sglang_spec.tree.topk` takes them."""
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        return VocabShard.whole(int(lm_head.weight.shape[0]))
    return VocabShard(
        org_start=int(shard.org_vocab_start_index),
        num_org=int(shard.num_org_elements),
        num_org_padded=int(shard.num_org_elements_padded),
        added_start=int(shard.added_vocab_start_index),
        num_added=int(shard.num_added_elements),
    )


def tp_all_gather(lm_head: Any, group: Any, *, capacity: int = 0) -> AllGather | None:
    """All-gather over ``group``, the tensor-parallel group that shards ``lm_head``'s vocabulary
    (None on one rank): a :class:`~sglang_spec.tree.topk.StaticAllGather` over
    ``all_gather_into_tensor`` with fixed buffers of ``capacity`` elements per rank, which a CUDA
    graph can capture (0: fresh buffers every call)."""
    if getattr(lm_head, "shard_indices", None) is None:
        return None
    world = int(group.world_size)
    if world == 1:
        return None
    return StaticAllGather(group.all_gather_into_tensor, world, capacity, lm_head.weight.device)


# ------------------------------------------------- the draft sampler hook (draft_sampler.py)


@contextlib.contextmanager
def graph_capture_scope() -> Iterator[tuple[Any, Any]]:
    """SGLang's CUDA-graph capture context, as its own runners capture
    (row_bucket_graph_runner.py ``_record``): ``graph_capture`` on the shared capture stream, which
    enables the graph-mode collectives (PyNccl) of the TP group, and the shared graph memory pool.
    Yields ``(stream, pool)``."""
    from sglang.srt.distributed.parallel_state import graph_capture
    from sglang.srt.model_executor.runner_utils.pool import (
        get_or_create_global_graph_capture_stream,
        get_or_create_global_graph_memory_pool,
    )

    pool = get_or_create_global_graph_memory_pool(torch.cuda)
    with graph_capture(stream=get_or_create_global_graph_capture_stream()) as ctx:
        yield ctx.stream, pool
    torch.cuda.current_stream().wait_stream(ctx.stream)


def draft_sampler(worker: Any) -> Any:
    """What ``_maybe_build_draft_sampler`` returned when DFlashWorkerV2 captured the drafter's
    CUDA graphs (None: no graphs, or the head kept eager); replays of those graphs run it."""
    return worker._draft_sampler
