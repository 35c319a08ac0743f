"""DDTreeWorker: DDTree drafting over DFlashWorkerV2, EAGLE tree verify.

A decode step is one method per stage, called in order by ``_decode_step``
(docs/plugin-design.md §3 has the data flow with the SGLang function used at each stage):

    draft_stage           DFlash drafter, one TARGET_VERIFY pass over [bonus, MASK*(B-1)]; the
                          KV slots of the verify window looked up once for draft and verify
    topk_stage            per-depth top-K through the target LM head over the depths the
                          step's budget reaches, TP-aware (sglang_spec.tree.sharded_topk: never
                          gathers the vocabulary), and build_ddtree_from_topk: a CUDA graph of the
                          step's budget over the block the drafter's graph staged, when it ran as
                          one (plugin.draft_sampler), else here, with the same functions
    tree_stage            sglang_tree_abi -> DDTreeVerifyInput
    verify_stage          eagle_prepare_for_verify (on the draft's KV slots) + target
                          TARGET_VERIFY forward
    walk_stage            greedy: eagle_sample (verify_tree_greedy); T > 0: sample_node_tokens
                          (sglang_spec.tree.sampler, no [bs, N, V] buffers) + verify_tree_greedy;
                          with SGLANG_SIMULATE_ACC_LEN (benchmarks) the tree's best path instead
    commit_stage          mamba/GDN commit at accept_index, bonus, logprobs, KV compaction: by
                          replay of a CUDA graph per (shape, batch size) where one covers the
                          step (plugin.commit_graphs), else eagerly, with the same function
    append_context_stage  drafter context KV from the compacted accepted rows

Budget by batch size (``--speculative-adaptive``, :mod:`sglang_spec.plugin.budget`): each decode
step first asks the controller for the budget of its batch size and switches the target's verify
state (attention backend + CUDA graphs, one per candidate width, built in ``init_cuda_graphs``) and
``self.config`` to it; after the walk of a step the controller measures (``measure``: every step
but those its ``measure_interval`` samples out) it copies the accepted node ids to pinned host
memory (one launch, in stream order), and ``on_verify_complete_cpu`` (called by the scheduler once
the step's accept lengths are on the host) sums there what every budget the step measures would
have accepted and feeds the controller.

With ``SGLANG_DDTREE_STAGE_TIMES`` set, ``stage_times.StageTimer`` wraps each stage method and
writes per-stage host and GPU times; with ``SGLANG_DDTREE_SYNC_CHECK=warn|error`` each decode step
runs under ``torch.cuda.set_sync_debug_mode`` (a step must not make the host wait for the GPU).

SGLang's overlap scheduler (on by default) launches step n + 1 while step n still runs: no stage
reads device values on the host, the tree mask goes into the target backend's VerifyMask buffer
without the host-side lengths (which overlap leaves unset), and the budget measurements queue until
the scheduler reports each step (docs/plugin-design.md §3).

Prefill is DFlash's. DFlashWorkerV2's private members are reached only through
``sglang_spec.plugin.adapter``. Importing this module imports SGLang; only the plug-in's worker
factory does so.
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel
from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2
from sglang.srt.speculative.eagle_utils import (
    eagle_prepare_for_verify,
    eagle_sample,
    verify_tree_greedy_func,
)
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
)
from sglang.srt.utils.async_probe import sanitize_nan_logits

import sglang_spec.plugin.adapter as adapter
import sglang_spec.plugin.draft_sampler as draft_sampler
from sglang_spec.plugin.budget import BudgetController, accepted_tokens_within, host_copy
from sglang_spec.plugin.commit_graphs import CommitGraphs, CommitShape
from sglang_spec.plugin.config import (
    SYNC_WARNING,
    DDTreeConfig,
    load_budget_policy,
    runtime_config,
)
from sglang_spec.plugin.context_graphs import ContextAppendGraphs, append_context
from sglang_spec.plugin.simulate import simulated_acceptance
from sglang_spec.plugin.stage_times import StageTimer
from sglang_spec.plugin.verify_input import DDTreeVerifyInput, verify_input_from_tree
from sglang_spec.tree import DraftTree, TreeMaskMode
from sglang_spec.tree.sampler import SamplingBounds, sample_node_tokens

logger = logging.getLogger("sglang_spec.plugin")

# Hook points this worker relies on, by name (docs/plugin-design.md, "Patches").
REQUIRED_HOOKS = ("H1 DecodeCudaGraphRunner.get_spec_info (sglang_spec.plugin.hooks)",)
# Optional, each for one configuration (patches/README.md; plugin/config.py refuses without them).
REQUIRED_PATCHES = (
    "patches/0.5.23/0001 (P3) dflash_info_v2 reserve 2*max(block, width): only if 2*width < block",
    "patches/<pin>/0002+0003 GDN tree ReplaySSM: only with --enable-linear-replayssm-spec",
)


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [bs, block, H] drafter final hidden states
    root_tokens: torch.Tensor  # [bs] int64: the bonus token of the previous step
    ran_as_graph: bool  # the drafter ran as a CUDA graph, which ran the draft sampler too
    window: torch.Tensor  # [bs, max(block, N)] KV slots (virtual ids) of prefix + arange(...)
    kv_loc_plan: Any  # KVLocPlan of the draft block's window, window[:, :block]


@dataclass
class Verified:
    logits_output: Any  # the target's LogitsProcessorOutput over the tree
    forward_batch: ForwardBatch  # kept alive until the step's outputs are consumed
    can_run_cuda_graph: bool
    grammar_mask: Any  # None without grammar-constrained requests


@dataclass
class Walked:
    predict: torch.Tensor  # [bs*N] target token at every node
    accept_lens: torch.Tensor  # [bs] accepted tokens including the bonus
    accept_index: torch.Tensor  # [bs, L+1] accepted node indices (flat over the batch), -1 padded


@dataclass
class Committed:
    predict: torch.Tensor  # [bs*N] compacted: the accepted path first in each request's window
    new_seq_lens: torch.Tensor  # [bs]
    bonus: torch.Tensor  # [bs]
    prefix_lens: torch.Tensor  # [bs] committed lengths before this step


def _log_budget_switch(bucket: int, old: int | None, new: int, tau: dict[int, float]) -> None:
    """One log line each time a batch-size bucket settles on another budget, with the tau per
    budget (tokens per request per step) that decided it."""
    logger.info(
        "DDTREE budget by batch size: bucket %d runs budget %d (was %s); tau per budget %s.",
        bucket,
        new,
        old,
        {b: round(t, 3) for b, t in sorted(tau.items())},
    )


class DDTreeWorker(DFlashWorkerV2):
    """DDTREE speculative worker (SGLang V2 worker contract; overlap scheduling on by default)."""

    # SGLANG_DDTREE_STAGE_TIMES: set in __init__ when on; it then wraps the stage methods.
    stage_timer: StageTimer | None = None
    # --speculative-adaptive: set in __init__ when on.
    budgets: BudgetController | None = None
    sync_steps = 0  # SGLANG_DDTREE_SYNC_CHECK=warn: decode steps that made the host wait

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self.config = runtime_config()
        # The target's TP group, which shards its lm_head's vocabulary; read here, outside any
        # draft scope (_maybe_build_draft_sampler runs inside one).
        self.head_group = get_parallel().tp_group
        # Undo the global-width leak: DFlashWorkerV2 sized its draft block from
        # speculative_num_draft_tokens, which for DDTREE is the verify width.
        adapter.resize_draft_block(self, self.config.block_size)
        self.speculative_num_draft_tokens = self.config.verify_width
        # draft_window's columns, for the server's width (with budget by batch size the largest)
        self.window_offsets = torch.arange(
            max(self.config.block_size, self.config.verify_width), device=self.device
        )
        why = adapter.unsupported_drafter_head(self)
        if why is not None:
            raise ValueError(f"DDTREE needs a plain DFlash drafter (per-depth marginals): {why}.")
        if self.config.stage_times_path is not None and get_parallel().tp_rank == 0:
            self.stage_timer = StageTimer(self.config.stage_times_path)
            self.stage_timer.instrument(self)
        if self.config.adaptive_config is not None:
            self.init_budgets()
        self.context_append = self.build_context_append()
        self.commit_graphs: CommitGraphs | None = None  # built in init_cuda_graphs
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE worker: %s; hooks=%s; patches expected=%s",
                self.config,
                REQUIRED_HOOKS,
                REQUIRED_PATCHES,
            )

    def alloc_memory_pool(
        self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None
    ):
        """The drafter's pools (DFlash's), then SGLang's KV move capped at launches that do not
        spill (adapter.KV_MOVE_ROWS): the tree compaction moves bs * (L + 1) KV slots per step.
        The scheduler calls this with the target's allocator after allocating the target's
        pools; at __init__ the target's runner has no allocator yet."""
        super().alloc_memory_pool(memory_pool_config, req_to_token_pool, token_to_kv_pool_allocator)
        adapter.cap_kv_move_chunks(token_to_kv_pool_allocator.get_kvcache())

    def prewarm_sampling(self):
        """The generic prewarm (``BaseSpecWorker``'s: the target runner's), not DFLASH's.
        DFLASH rehearses its dense T > 0 chain verify (``[rows, V]`` float32 probabilities, sorted
        for top-p) at the largest verify batch and reserves that peak out of the KV pool; sized by
        DDTREE's verify width it is 4x DFLASH's at budget 63 and ran a Qwen3.5-4B-shaped server out
        of memory at start-up with SGLang's default memory settings (session 14). DDTREE's T > 0
        walk (``sample_node_tokens``, a row kernel) reads the verify logits in place and
        allocates no ``[rows, V]`` buffer, so there is nothing of that size to reserve."""
        return super(DFlashWorkerV2, self).prewarm_sampling()

    def candidate_configs(self) -> list[DDTreeConfig]:
        """The config of every budget this server may run: its own, or under
        ``--speculative-adaptive`` each candidate's (the graphs and warm-ups cover them all)."""
        return [self.config] if self.budgets is None else list(self.budget_configs.values())

    def build_context_append(self):
        """The drafter context append (``append_context_stage``): with decode CUDA graphs on a
        GPU, :class:`ContextAppendGraphs` over every candidate verify width (captured in
        ``init_cuda_graphs``); otherwise the eager :func:`append_context`."""
        append = functools.partial(adapter.append_target_hidden_to_draft_kv, self)
        on_gpu = torch.device(self.device).type == "cuda"
        graph_bs = adapter.decode_cuda_graph_bs() if on_gpu else None
        if not graph_bs:
            return functools.partial(append_context, append)
        return ContextAppendGraphs(
            append,
            widths=[c.verify_width for c in self.candidate_configs()],
            graph_bs=graph_bs,
            feature_size=adapter.target_feature_size(self),
            dtype=self.target_worker.model_runner.dtype,
            device=self.device,
        )

    def init_budgets(self) -> None:
        """Budget by batch size: the controller and every candidate budget's config."""
        policy = load_budget_policy(self.config.adaptive_config)
        self.budgets = BudgetController(
            policy,
            self.config.horizon,
            adapter.decode_cuda_graph_bs(),
            # a simulated tau per budget: each step's path is drawn for the budget that ran
            nested=self.config.simulated_accept_by_budget is None,
            on_switch=_log_budget_switch if get_parallel().tp_rank == 0 else None,
        )
        self.budget_configs = {b: self.config.for_budget(b) for b in self.budgets.budgets}
        self.verify_states: dict[int, adapter.TargetVerifyState] = {}
        # (budget, verify width, host accept_index or None when not measured, requests) of each
        # decode step whose results the scheduler has not processed yet: with overlap scheduling
        # the next step is launched first
        self.measured: deque[tuple[int, int, torch.Tensor | None, int]] = deque()

    def init_cuda_graphs(self):
        """The drafter's graphs (DFlash's, ending in the draft sampler's staging copy), the draft
        sampler's graphs per candidate budget (draft_sampler.capture), then with budget by batch
        size a target verify state per candidate width; the server's (the largest) is the one the
        target captured."""
        super().init_cuda_graphs()
        draft_sampler.capture(self)
        if isinstance(self.context_append, ContextAppendGraphs):
            with adapter.per_layer_kv_append(self):
                self.context_append.capture(adapter.graph_capture_scope)
            if get_parallel().tp_rank == 0:
                logger.info(
                    "DDTREE drafter context append: %d CUDA graphs, widths %s, batch sizes up "
                    "to %d.",
                    len(self.context_append.graphs),
                    self.context_append.widths,
                    self.context_append.graph_bs[-1],
                )
        self.warm_accept_compaction()
        self.commit_graphs = self.build_commit_graphs()
        if self.budgets is None:
            return
        server = self.config.budget
        self.verify_states[server] = adapter.target_verify_state(self, self.config.verify_width)
        graph_bs = self.budgets.cuda_graph_bs
        graphs = {server: graph_bs}
        for b in self.budget_configs:
            if b != server:
                graphs[b] = None if graph_bs is None else self.budgets.cuda_graph_bs_for_budget(b)
                self.verify_states[b] = adapter.build_target_verify_state(self, b + 1, graphs[b])
        self.warm_tree_layouts()
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE budget by batch size: target verify states for budgets (CUDA-graph batch "
                "sizes) %s; cost table (ms per step by batch-size bucket) %s.",
                dict(sorted(graphs.items())),
                self.budgets.policy.cost_ms,
            )

    def commit(self, batch, predict, accept_index, accept_lens, width):
        """The eager commit of a verified tree (``adapter.commit_accepted_path``): what the
        commit graphs capture, and what runs where none covers a step."""
        return adapter.commit_accepted_path(
            self.target_worker,
            self.model_runner.token_to_kv_pool_allocator,
            batch,
            predict,
            accept_index,
            accept_lens,
            width,
        )

    def build_commit_graphs(self) -> CommitGraphs | None:
        """With decode CUDA graphs on a GPU, :class:`CommitGraphs` for every candidate budget's
        (verify width, accept width) at each batch size up to the largest decode graph or the
        running-request cap, whichever is smaller (a batch never exceeds the cap, and patch 0003's
        fold window has a row per request up to it), captured here (after the pools exist: the
        commit writes them). None otherwise: every step commits eagerly. The accept width is what
        the walk produces, ``max_depth + 1`` (under simulated acceptance too:
        ``simulate.simulated_acceptance``)."""
        graph_bs = adapter.decode_cuda_graph_bs()
        if torch.device(self.device).type != "cuda" or not graph_bs:
            return None
        track = adapter.mamba_tracking()
        shapes = [
            CommitShape(c.verify_width, c.max_depth + 1, track) for c in self.candidate_configs()
        ]
        graphs = CommitGraphs(
            self.commit,
            adapter.commit_batch_maker(self.server_args),
            shapes=shapes,
            max_bs=min(max(graph_bs), adapter.max_running_requests(self) or max(graph_bs)),
            device=self.device,
        )
        graphs.capture(adapter.graph_capture_scope)
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE commit: %d CUDA graphs, shapes %s, batch sizes 1 to %d.",
                len(graphs.graphs),
                graphs.shapes,
                graphs.graph_bs[-1],
            )
        return graphs

    def warm_tree_layouts(self) -> None:
        """Lay out a one-request placeholder tree at every candidate budget, so that the tree
        stage's eager Triton layout kernel (one compile per verify width) compiles at start-up and
        not in the first decode step each budget runs (0.3-0.4 s each on the H200, inside a served
        level of the 27B shape in session 23)."""
        vm = self.target_worker.model_runner.attn_backend.verify_mask
        mode = TreeMaskMode.FULL_MASK if vm is None else TreeMaskMode(int(vm.mode))
        seq_lens = torch.ones(1, dtype=torch.int64, device=self.device)
        for config in self.budget_configs.values():
            verify_input_from_tree(
                placeholder_tree(config.verify_width, config.horizon, self.device),
                seq_lens,
                config,
                mask_mode=mode,
                seq_lens_sum=1,
                with_paths=self.server_args.enable_linear_replayssm_spec,
            )

    def warm_accept_compaction(self) -> None:
        """Compile the tree compaction's slot lookups (``adapter.warm_accept_compaction``) for
        every candidate budget and batch size at start-up, not in the first decode step of each
        new (budget, batch-size class): 0.1 s each, inside served levels of the 27B adaptive
        server (sessions 24 and 25). ``accept_index`` is ``max_depth + 1`` wide from the walk,
        ``horizon + 1`` under simulated acceptance (benchmarks)."""
        if torch.device(self.device).type != "cuda":
            return
        shapes = sorted(
            {
                (c.verify_width, d)
                for c in self.candidate_configs()
                for d in (c.max_depth + 1, c.horizon + 1)
            }
        )
        max_bs = adapter.max_running_requests(self) or max(adapter.decode_cuda_graph_bs() or [1])
        adapter.warm_accept_compaction(shapes, max_bs, self.device)

    def select_budget(self, batch_size: int) -> None:
        """Run the next decode step at the budget the controller picks for ``batch_size``."""
        budget = self.budgets.choose(batch_size)
        if budget != self.config.budget:
            adapter.apply_target_verify_state(self, self.verify_states[budget])
            self.config = self.budget_configs[budget]
            self.speculative_num_draft_tokens = self.config.verify_width

    def measure_budgets(self, accept_index: torch.Tensor, batch_size: int) -> None:
        """Queue this step for the controller: when it is to be measured
        (``BudgetController.measure``), its accepted node ids ``[bs, L + 1]``, one copy to pinned
        host memory in stream order (``budget.host_copy``, no sync), which
        ``on_verify_complete_cpu`` sums; otherwise None, which keeps the queue in step with the
        scheduler's reports."""
        host = host_copy(accept_index) if self.budgets.measure else None
        self.measured.append((self.config.budget, self.config.verify_width, host, batch_size))

    def on_verify_complete_cpu(self, num_correct_drafts_per_req, batch_size=0):  # noqa: ARG002 - BaseSpecWorker's signature; the node ids kept by measure_budgets carry more
        """Scheduler hook, once per decode step in launch order, when that step's accept lengths
        are on the host: its accepted node ids, copied before them on the same stream, are too."""
        if self.budgets is None or not self.measured:
            return
        budget, width, accepted, n = self.measured.popleft()
        if n != batch_size:
            raise RuntimeError(
                f"DDTREE budget measurements out of step with the scheduler: a step of {n} "
                f"requests measured, results of {batch_size} reported"
            )
        if accepted is None:
            return
        sums = accepted_tokens_within(accepted.numpy(), width, self.budgets.measured_by(budget))
        self.budgets.observe(budget, sums, n)

    def _maybe_build_draft_sampler(self):
        """The draft LM head, per-depth top-K and tree as CUDA graphs per candidate budget, fed
        by a staging copy at the end of the drafter's graphs (sglang_spec.plugin.draft_sampler;
        DFLASH's in-graph head is argmax-only)."""
        return draft_sampler.build(self)

    # ------------------------------------------------------------------ entry point
    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ):
        if adapter.is_extend(batch):
            prefill = functools.partial(
                super().forward_batch_generation,
                batch,
                on_publish,
                grammar_barrier,
                pp_proxy_tensors,
            )
            if self.stage_timer is None:
                return prefill()
            return self.stage_timer.time_extend(
                len(batch.seq_lens), adapter.extend_tokens(batch), prefill
            )
        if batch.spec_info is None:
            batch.spec_info = DFlashDraftInputV2.create_idle_input(device=self.device)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 on the running batch.")
        if batch.forward_mode.is_idle():
            return self._idle_result(on_publish)
        if batch.seq_lens.is_cuda:
            # overlap: the previous step published it, maybe on another stream
            batch.seq_lens.record_stream(torch.cuda.current_stream(batch.seq_lens.device))
        if self.budgets is not None:
            self.select_budget(len(batch.seq_lens))
        if self.stage_timer is not None:
            self.stage_timer.begin_step(len(batch.seq_lens), self.config.verify_width)
        if self.config.sync_check is None:
            return self._decode_step(batch, draft_input, on_publish, grammar_barrier)
        torch.cuda.set_sync_debug_mode(self.config.sync_check)
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")  # every occurrence, not one per code line
                result = self._decode_step(batch, draft_input, on_publish, grammar_barrier)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        self._report_syncs(caught)
        return result

    def _report_syncs(self, caught: list) -> None:
        """``warn`` mode: one log line per decode step that made the host wait, with how many
        times and where first (Python shows a warning once per code line, which cannot tell one
        sync at start-up from one per step); other warnings are shown as they would have been."""
        syncs = [w for w in caught if SYNC_WARNING in str(w.message)]
        for w in caught:
            if SYNC_WARNING not in str(w.message):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        self.sync_steps += bool(syncs)
        if syncs and get_parallel().tp_rank == 0:
            logger.warning(
                "DDTREE sync check: this decode step %s %d time(s), the first at %s:%d "
                "(%d step(s) so far).",
                SYNC_WARNING,
                len(syncs),
                syncs[0].filename,
                syncs[0].lineno,
                self.sync_steps,
            )

    def _decode_step(self, batch, draft_input, on_publish, grammar_barrier):
        """The stages of one decode step, in order."""
        draft = self.draft_stage(batch, draft_input)
        tree = self.topk_stage(draft)
        verify_input = self.tree_stage(batch, tree)
        verified = self.verify_stage(batch, verify_input, draft, grammar_barrier)
        walked = self.walk_stage(batch, tree, verify_input, verified)
        if self.budgets is not None:
            self.measure_budgets(walked.accept_index, len(batch.seq_lens))
        committed = self.commit_stage(batch, verified, walked, on_publish)
        self.append_context_stage(batch, verified, walked, committed)
        return self._step_result(verified, walked, committed)

    # ----------------------------------------------------------------------- stages
    def draft_stage(self, batch, draft_input) -> DraftOutput:
        """One DFlash drafter pass over [bonus, MASK*(B-1)] at prefix + arange(B); the block's
        K/V land in the (transient) verify window. With the draft sampler (draft_sampler.py) the
        drafter's CUDA graph also stages the block for the tree's graphs.

        The KV slots of prefix + arange(max(B, N)) are looked up once (draft_window) for the
        draft and the verify (verify_write_locs).

        Copy of upstream's draft step (dflash_worker_v2.py:2470-2690, non-compact plain head)
        because DFlashWorkerV2 inlines it in forward_batch_generation, where it ends in argmax
        tokens, and DDTREE needs the drafter's hidden states.
        """
        bs = len(batch.seq_lens)
        block = self.config.block_size
        buf = adapter.draft_block_buffers(self, bs)
        prefix_lens = batch.seq_lens

        buf.block_ids.fill_(adapter.mask_token_id(self))
        buf.block_ids[:, 0].copy_(draft_input.bonus_tokens)
        torch.add(prefix_lens.unsqueeze(1), adapter.block_pos_offsets(self), out=buf.positions)
        window = draft_window(
            batch.req_pool_indices,
            self.model_runner.req_to_token_pool.req_to_token,
            prefix_lens,
            self.window_offsets[: max(block, self.config.verify_width)],
        )
        buf.cache_loc.copy_(window[:, :block])
        emb = adapter.embed_draft_block(self, buf.block_ids)
        positions = buf.positions.reshape(-1)
        out_cache_loc = buf.cache_loc.reshape(-1)

        plan = self.target_worker.model_runner.kv_index_translator.plan(
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            seq_lens_cpu=(
                batch.seq_lens_cpu
                if batch.seq_lens_cpu is not None
                else draft_input.nxt_kv_lens_cpu
            ),
            write_virtual=out_cache_loc,
            read_extent=block,
        )
        seq_lens_cpu = buf.seq_lens_cpu
        if batch.seq_lens_cpu is not None:
            seq_lens_cpu.copy_(batch.seq_lens_cpu)
            seq_lens_cpu.add_(block)
            seq_lens_sum = int(seq_lens_cpu.sum())
        else:
            seq_lens_cpu.copy_(draft_input.nxt_kv_lens_cpu)
            seq_lens_sum = int(draft_input.nxt_kv_lens_sum)

        fb = ForwardBatch(
            forward_mode=ForwardMode.TARGET_VERIFY,
            batch_size=bs,
            input_ids=buf.block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=out_cache_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=emb.view(-1, emb.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=adapter.draft_block_spec_info(self),
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=self.device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(fb, self.draft_model_runner.kv_index_translator)
        with torch.inference_mode(), adapter.draft_tp_context(self):
            out = self.draft_model_runner.forward(fb)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash drafter returned no hidden states.")
        return DraftOutput(
            hidden=hidden[: bs * block].view(bs, block, -1),
            root_tokens=draft_input.bonus_tokens.view(-1).to(torch.int64),
            ran_as_graph=bool(out.can_run_graph),
            window=window,
            kv_loc_plan=plan,
        )

    def topk_stage(self, draft: DraftOutput) -> DraftTree:
        """Per-depth top-K of the drafter marginals q_1..q_D (block rows 1..D, D = min(budget,
        L): the depths a tree of `budget` nodes reaches) through the target LM head, TP-aware
        (never gathers the vocabulary), and the best-first DDTree of `budget` nodes: by the
        replay of the budget's graph when the draft ran as a graph, else computed here
        (draft_sampler.step_tree; the same functions either way)."""
        return draft_sampler.step_tree(self, draft.hidden, draft.root_tokens, draft.ran_as_graph)

    def tree_stage(self, batch, tree: DraftTree) -> DDTreeVerifyInput:
        """The tree's SGLang tree ABI, on the device with no host sync. The mask goes straight
        into the target backend's VerifyMask buffer (which its CUDA graphs read) when the batch
        fits it; only a batch beyond it allocates one, sized from the host-side lengths: exact
        without overlap scheduling, else the reserved upper bound (``nxt_kv_lens_sum``, as DFLASH
        plans its draft with)."""
        vm = self.target_worker.model_runner.attn_backend.verify_mask
        bs, n = tree.tokens.shape
        mask_mode = TreeMaskMode.FULL_MASK if vm is None else TreeMaskMode(int(vm.mode))
        out = vm.buffer if (vm is not None and vm.fits(bs)) else None
        seq_lens_sum = batch.seq_lens_sum
        if seq_lens_sum is None and batch.seq_lens_cpu is not None:
            seq_lens_sum = int(batch.seq_lens_cpu.sum())
        if out is None and seq_lens_sum is None and mask_mode == TreeMaskMode.FULL_MASK:
            bound = int(batch.spec_info.nxt_kv_lens_sum)  # >= sum(seq_lens): over-allocated
            out = torch.empty(bound * n + bs * n * n, dtype=torch.bool, device=tree.tokens.device)
        return verify_input_from_tree(
            tree,
            batch.seq_lens,
            self.config,
            mask_mode=mask_mode,
            seq_lens_sum=seq_lens_sum,
            mask_buffer=out,
            seq_lens_cpu=batch.seq_lens_cpu,
            with_paths=self.server_args.enable_linear_replayssm_spec,
        )

    def verify_stage(
        self, batch, verify_input, draft: DraftOutput, grammar_barrier=None
    ) -> Verified:
        """Target TARGET_VERIFY forward over the tree (eagle_prepare_for_verify), writing the KV
        slots the draft stage looked up (verify_write_locs: no second lookup, and the draft's
        KV plan when the verify writes exactly the draft's window)."""
        verify_input.prepared_out_cache_loc, verify_input.kv_loc_plan = verify_write_locs(
            draft.window, draft.kv_loc_plan, self.config.block_size, self.config.verify_width
        )
        batch.spec_info = verify_input
        fb, can_graph = eagle_prepare_for_verify(
            verify_input, self.model_runner.req_to_token_pool, batch, self.target_worker
        )
        if can_graph:
            # Copies retrieve_* (and patch 0002's tree paths) into the GDN backend's graph
            # buffers and recomputes mask-dependent metadata, on the backends that keep any.
            adapter.refresh_verify_graph_buffers(
                self.model_runner.attn_backend,
                verify_input,
                self.model_runner.decode_cuda_graph_runner.bs,
            )
        grammar_tree = (
            GrammarTree.from_device(
                verify_input.retrieve_next_token,
                verify_input.retrieve_next_sibling,
                verify_input.draft_token.view(verify_input.retrieve_next_token.shape),
            )
            if batch.has_grammar
            else None
        )
        out = self.target_worker.forward_batch_generation(
            batch=None, forward_batch=fb, is_verify=True
        )
        grammar_mask = None
        if batch.has_grammar:
            grammar_mask = build_grammar_vocab_mask(
                reqs=batch.reqs,
                tree=grammar_tree,
                sampling_info=batch.sampling_info,
                device=verify_input.retrieve_next_token.device,
                barrier=grammar_barrier,
            )
        return Verified(out.logits_output, fb, out.can_run_cuda_graph, grammar_mask)

    def walk_stage(self, batch, tree: DraftTree, verify_input, verified: Verified) -> Walked:
        """Greedy / sample-and-walk over the tree, in ``eagle_sample``'s output layout.

        All-greedy batches (and watermarked or SGLANG_SIMULATE_ACC_LEN runs) go through ``eagle_sample``: argmax + verify_tree_greedy_func. Other batches draw
        the target's token at every node with ``sample_node_tokens`` (no ``[bs, N, V]`` copies;
        eagle_sample's T > 0 path allocates several) and walk them with the same
        verify_tree_greedy_func, after eagle_sample's logit edits (NaN, penalties, bias, grammar)."""
        info = batch.sampling_info
        logits = verified.logits_output.next_token_logits
        watermark = self.target_worker.model_runner.watermark_state
        if (
            info.is_all_greedy
            or (watermark is not None and info.has_watermark_candidates)
            or self.config.simulated_accept_len is not None
        ):
            predict, accept_lens, accept_index = eagle_sample(
                verify_input,
                batch,
                verified.logits_output,
                verified.grammar_mask,
                watermark_state=watermark,
            )
        else:
            predict, accept_lens, accept_index = self._sample_and_walk(
                batch, verify_input, logits, verified.grammar_mask
            )
        if self.config.simulated_accept_len is not None:
            # Benchmarks only: keep the length eagle_sample drew (or draw this budget's own),
            # accept along the best path.
            tau = self.config.simulated_accept_here
            if tau is not None:
                drawn = adapter.draw_simulated_accept_len(tau, self.config.max_depth + 1)
                accept_lens = torch.full_like(accept_lens, drawn)
            accept_lens, accept_index = simulated_acceptance(
                tree, accept_lens, self.config.verify_width
            )
        return Walked(predict, accept_lens, accept_index)

    def _sample_and_walk(self, batch, verify_input, logits, grammar_mask):
        """walk_stage at T > 0: eagle_sample's sampling branch with ``sample_node_tokens`` in place
        of its dense softmax / top-k / top-p renorm and target-only tree kernel."""
        info = batch.sampling_info
        bs, n = len(batch.seq_lens), verify_input.draft_token_num
        sanitize_nan_logits(logits, "verify: target model logits")
        if info.acc_additive_penalties is not None:
            logits.add_(torch.repeat_interleave(info.acc_additive_penalties, n, dim=0))
        if info.acc_scaling_penalties is not None:
            apply_scaling_penalties(
                logits, torch.repeat_interleave(info.acc_scaling_penalties, n, dim=0)
            )
        if info.logit_bias is not None:
            logits.add_(torch.repeat_interleave(info.logit_bias, n, dim=0))
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        params = [r.sampling_params for r in batch.reqs]
        bounds = SamplingBounds.of(
            [sp.top_k for sp in params],
            [sp.top_p for sp in params],
            logits.shape[-1],
            top_k_first=info.need_min_p_sampling,
        )
        coins = None if info.sampling_seed is None else adapter.seeded_node_uniforms(batch, n)
        tokens = sample_node_tokens(
            logits,
            info.temperatures,
            info.top_ks,
            info.top_ps,
            info.min_ps if info.need_min_p_sampling else None,
            bounds,
            uniforms=coins,
        )
        predict = torch.zeros(bs * n, dtype=torch.int32, device=logits.device)
        accept_index = torch.full(
            (bs, verify_input.max_tree_depth), -1, dtype=torch.int32, device=logits.device
        )
        num_correct = torch.empty((bs,), dtype=torch.int32, device=logits.device)
        verify_tree_greedy_func(
            predicts=predict,
            accept_index=accept_index,
            accept_token_num=num_correct,
            candidates=verify_input.draft_token.reshape(bs, n),
            retrieve_index=verify_input.retrieve_index,
            retrieve_next_token=verify_input.retrieve_next_token,
            retrieve_next_sibling=verify_input.retrieve_next_sibling,
            target_predict=tokens.view(bs, n),
            topk=verify_input.tree_topk,
        )
        group = get_parallel().tp_group  # DDTREE refuses DP attention (config.py)
        if group.world_size > 1:  # ranks' float sums may differ: rank 0's draws decide
            for t in (predict, accept_index, num_correct):
                group.broadcast(t, src=0)
        return predict, num_correct + 1, accept_index

    def commit_stage(self, batch, verified: Verified, walked: Walked, on_publish) -> Committed:
        """Commit the accepted path: logprobs, then GDN state at the last accepted node, bonus,
        KV compaction (the accepted rows move to the front of each request's window) by graph
        replay where one covers the step (plugin.commit_graphs), and the target hidden rows
        compacted the same way for the drafter's context."""
        n = self.config.verify_width
        prefix_lens = batch.seq_lens
        if batch.return_logprob:  # reads the uncompacted predict
            compute_spec_logprobs(
                batch, verified.logits_output, walked.predict, accept_index=walked.accept_index
            )
        args = (batch, walked.predict, walked.accept_index, walked.accept_lens, n)
        if self.commit_graphs is None:
            new_seq_lens, bonus, predict = self.commit(*args)
        else:
            (new_seq_lens, bonus, predict), _ = self.commit_graphs(*args)
        out = verified.logits_output
        if out.hidden_states is not None:
            out.hidden_states = adapter.compact_accepted_rows(
                out.hidden_states, walked.accept_index, n
            )
        if on_publish is not None:
            on_publish(new_seq_lens)
        return Committed(predict, new_seq_lens, bonus, prefix_lens)

    def append_context_stage(
        self, batch, verified: Verified, walked: Walked, committed: Committed
    ) -> None:
        """Drafter context KV for the accepted path. After compaction the accepted rows (root
        first) lead each request's verify window, both in the target hidden states and in the KV
        slots, so the prefix-valid writer commits rows [0, accept_len) at positions prefix + i.
        A drafter sharing the target allocator (the non-compact DFlash layout DDTREE requires)
        indexes those slots by the target's physical ids. By graph replay where one covers the
        step (context_graphs.py: 5 launches instead of some 20 and SGLang's checks)."""
        hidden = verified.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states (aux capture).")
        prefix_lens = committed.prefix_lens
        bs = int(prefix_lens.shape[0])
        n = self.config.verify_width
        self.context_append(
            hidden[: bs * n],
            batch.out_cache_loc[: bs * n].view(bs, n),
            prefix_lens,
            walked.accept_lens,
        )

    # ---------------------------------------------------------------------- results
    def _step_result(
        self, verified: Verified, walked: Walked, committed: Committed
    ) -> GenerationBatchResult:
        logits_output = verified.logits_output
        logits_output.hidden_states = None  # consumed by append_context_stage
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=committed.predict,
            accept_lens=walked.accept_lens,
            accept_index=walked.accept_index,
            can_run_cuda_graph=verified.can_run_cuda_graph,
            next_draft_input=adapter.next_draft_input(
                self, committed.bonus, committed.new_seq_lens
            ),
            speculative_num_draft_tokens=self.config.verify_width,
            new_seq_lens=committed.new_seq_lens,
            extra_keep_alive_refs=[verified.forward_batch],
        )

    def _idle_result(self, on_publish) -> GenerationBatchResult:
        empty = torch.empty((0,), dtype=torch.int64, device=self.device)
        nxt = adapter.next_draft_input(self, empty, empty)
        if on_publish is not None:
            on_publish(nxt.new_seq_lens)
        return GenerationBatchResult(
            logits_output=None,
            next_token_ids=empty,
            accept_lens=torch.empty((0,), dtype=torch.int32, device=self.device),
            next_draft_input=nxt,
            can_run_cuda_graph=False,
            speculative_num_draft_tokens=self.config.verify_width,
            new_seq_lens=nxt.new_seq_lens,
        )


# ----------------------------------------------------------- the iteration's KV window


def placeholder_tree(width: int, horizon: int, device) -> DraftTree:
    """One request's tree of a root and ``width - 1`` padding slots (what padding looks like in
    DraftTree): a valid input of ``width`` for the layout, whatever the draft."""
    tokens = torch.zeros(1, width, dtype=torch.int64, device=device)
    parents = torch.full_like(tokens, -1)
    depths = torch.full_like(tokens, -1)
    depths[0, 0] = 0
    scores = torch.full((1, width), float("-inf"), device=device)
    scores[0, 0] = 0.0
    num_nodes = torch.ones(1, dtype=torch.int64, device=device)
    return DraftTree(tokens, parents, depths, scores, num_nodes, horizon)


def draft_window(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    prefix_lens: torch.Tensor,
    offsets: torch.Tensor,
) -> torch.Tensor:
    """``[bs, W]`` int64 KV slots (virtual ids, ``req_to_token``'s) of ``prefix + offsets``,
    ``offsets = arange(W)``, ``W = max(block, verify_width)``: the iteration's window, looked up
    once for the draft block (its first ``block`` columns) and the verify (its first
    ``verify_width``). A torch gather, not SGLang's ``assign_extend_cache_locs``: that Triton
    kernel specialises on the batch size's power of two and compiled 18 variants after serving
    started on the 27B adaptive server (session 24), two inside timed levels."""
    cols = prefix_lens.unsqueeze(1) + offsets
    return req_to_token[req_pool_indices.unsqueeze(1), cols].to(torch.int64)


def verify_write_locs(
    window: torch.Tensor, draft_plan: Any, block: int, width: int
) -> tuple[torch.Tensor, Any]:
    """What the verify of ``width`` tokens per request writes, from the draft's ``window``
    (:func:`draft_window`): its ``out_cache_loc`` ``[bs * width]`` -- equal to what
    ``eagle_prepare_for_verify`` would look up (``assign_extend_cache_locs_uniform_func`` over the
    same ``req_to_token`` rows, unchanged since the draft) -- and its KV plan.

    The plan is the draft's when the verify's window is the draft block's (``width == block``,
    as upstream DFLASH shares it: the same write ids, read extent and lengths); otherwise None and
    ``ForwardBatch.init_new`` plans the verify's window (``eagle_prepare_for_verify`` passes no
    write columns, so a plan over another window cannot be bound to it).
    """
    if width == block:
        return draft_plan.write_virtual, draft_plan
    return window[:, :width].reshape(-1), None
