"""DDTreeWorker: DDTree drafting over DFlashWorkerV2, EAGLE tree verify.

Decode step (one named method per stage; docs/plugin-design.md has the data
flow with the SGLang function used at each stage):

    draft_stage   DFlash drafter, one TARGET_VERIFY pass over [bonus, MASK*(B-1)]
    topk_stage    TP-aware top-K per depth (local top-k + logsumexp per vocab
                  shard, all-gather of K values per row, merge_sharded_topk)
    tree_stage    build_ddtree_from_topk + sglang_tree_abi -> DDTreeVerifyInput
    verify_stage  eagle_prepare_for_verify + target TARGET_VERIFY forward
    walk_stage    eagle_sample (verify_tree_greedy / target-only tree sampling)
    commit_stage  mamba/GDN commit at accept_index, bonus, KV compaction,
                  drafter context KV from the compacted accepted rows

Importing this module imports SGLang (DFlashWorkerV2); only the plug-in's
worker factory does so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
    enable_num_token_non_padded,
)
from sglang.srt.runtime_context import get_parallel, get_spec
from sglang.srt.speculative.dflash_info_v2 import DFlashDraftInputV2
from sglang.srt.speculative.dflash_worker_v2 import (
    DFlashWorkerV2,
    _resolve_dflash_embedding_module,
)
from sglang.srt.speculative.draft_worker_common import (
    build_block_pos_offsets,
    make_draft_block_spec_info,
)
from sglang.srt.speculative.eagle_info import EagleVerifyInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

logger = logging.getLogger("sglang_spec.plugin")

# Hook points this worker relies on, by name (docs/plugin-design.md, "Patches").
REQUIRED_HOOKS = ("H1 DecodeCudaGraphRunner.get_spec_info (sglang_spec.plugin.hooks)",)
# Optional: needed only for a verify width below half the drafter block (patches/README.md).
REQUIRED_PATCHES = (
    "patches/0.5.23/0001 (P3) dflash_info_v2 reserve 2*max(block, width): only if 2*width < block",
)


@dataclass
class DDTreeVerifyInput(EagleVerifyInput):
    """EAGLE tree verify input for an irregular DDTree.

    Subclasses EagleVerifyInput so that SGLang's attention backends, the
    hybrid linear-attention backend (update_verify_buffers_to_fill_after_draft
    and graph replay refresh retrieve_* only for EagleVerifyInput instances)
    and eagle_sample treat it as a tree.  ``spec_steps`` holds the drafter
    horizon L, so ``max_tree_depth = L + 1`` bounds the accept_index width.
    """

    @property
    def tree_topk(self) -> int:
        # Irregular tree (no fixed per-level branching), as NgramVerifyInput.
        return -1


def _shard_info(lm_head) -> tuple[int, int, int, int, int]:
    shard = getattr(lm_head, "shard_indices", None)
    if shard is None:
        n = int(lm_head.weight.shape[0])
        return n, n, 0, 0, 0
    return (
        int(shard.num_org_elements),
        int(shard.num_org_elements_padded),
        int(shard.num_added_elements),
        int(shard.org_vocab_start_index),
        int(shard.added_vocab_start_index),
    )


def local_vocab_logits(hidden: torch.Tensor, lm_head) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of this rank's vocabulary shard and their global token ids.

    Padding rows of the shard are dropped; never materialises other shards.
    Returns (logits [T, V_local] fp32, ids [V_local] int64).
    """
    weight = lm_head.weight
    num_org, num_org_padded, num_added, org_start, added_start = _shard_info(lm_head)
    hs = hidden if hidden.dtype == weight.dtype else hidden.to(weight.dtype)
    parts, ids = [], []
    if num_org > 0:
        parts.append(torch.matmul(hs, weight[:num_org].T))
        ids.append(torch.arange(num_org, device=hidden.device) + org_start)
    if num_added > 0:
        parts.append(torch.matmul(hs, weight[num_org_padded : num_org_padded + num_added].T))
        ids.append(torch.arange(num_added, device=hidden.device) + added_start)
    if not parts:
        return (
            torch.full((hs.shape[0], 1), float("-inf"), device=hidden.device),
            torch.zeros(1, dtype=torch.int64, device=hidden.device),
        )
    logits = torch.cat(parts, dim=-1).float() if len(parts) > 1 else parts[0].float()
    return logits, torch.cat(ids) if len(ids) > 1 else ids[0]


def sharded_topk(
    hidden: torch.Tensor, lm_head, k: int, tp_group=None, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k log-probabilities of the target head, TP-aware.

    hidden: [bs, L, H]; the log-probs are those of ``logits / temperature``
    (``sglang_spec.tree.draft_topk``'s tree temperature).  Each rank takes top-k and logsumexp over its own
    vocabulary shard; only [tp, bs, L, k] values/ids and [tp, bs, L] lse are
    all-gathered, then ``sglang_spec.tree.merge_sharded_topk`` merges them.
    Returns (logq [bs, L, k] fp32, ids [bs, L, k] int64).
    """
    from sglang_spec.tree import merge_sharded_topk

    bs, L, H = hidden.shape
    logits, vocab_ids = local_vocab_logits(hidden.reshape(bs * L, H), lm_head)
    if temperature != 1.0:
        logits = logits / temperature
    k_local = min(k, logits.shape[-1])
    vals, idx = torch.topk(logits, k_local, dim=-1)
    ids = vocab_ids[idx]
    if k_local < k:  # a shard smaller than k: pad with impossible entries
        pad = k - k_local
        vals = torch.cat([vals, vals.new_full((vals.shape[0], pad), float("-inf"))], -1)
        ids = torch.cat([ids, ids.new_zeros((ids.shape[0], pad))], -1)
    lse = torch.logsumexp(logits, dim=-1)
    vals = vals.view(1, bs, L, k)
    ids = ids.view(1, bs, L, k)
    lse = lse.view(1, bs, L)
    world = 1 if tp_group is None else int(tp_group.world_size)
    if world > 1:
        g_vals = vals.new_empty((world, bs, L, k))
        g_ids = ids.new_empty((world, bs, L, k))
        g_lse = lse.new_empty((world, bs, L))
        tp_group.all_gather_into_tensor(g_vals.view(-1), vals.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_ids.view(-1), ids.contiguous().view(-1))
        tp_group.all_gather_into_tensor(g_lse.view(-1), lse.contiguous().view(-1))
        vals, ids, lse = g_vals, g_ids, g_lse
    return merge_sharded_topk(vals, ids, lse, k)


def build_verify_input(
    tree,
    seq_lens: torch.Tensor,
    *,
    horizon: int,
    eagle_topk: int,
    mask_mode=None,
    seq_lens_sum: int | None = None,
    mask_buffer: torch.Tensor | None = None,
    seq_lens_cpu: torch.Tensor | None = None,
) -> DDTreeVerifyInput:
    """SGLang tree ABI of a DraftTree, packed into a DDTreeVerifyInput.

    With ``mask_buffer`` (the target backend's VerifyMask buffer, captured by
    CUDA graphs) the mask is written in place, as build_eagle_verify_input does.
    """
    from sglang_spec.tree import TreeMaskMode, sglang_tree_abi

    mode = TreeMaskMode.FULL_MASK if mask_mode is None else TreeMaskMode(int(mask_mode))
    abi = sglang_tree_abi(tree, seq_lens, mode=mode, seq_lens_sum=seq_lens_sum)
    n = int(tree.tokens.shape[1])
    mask = abi.tree_mask
    if mask_buffer is not None and mask_buffer.numel() >= mask.numel():
        mask_buffer[: mask.numel()].copy_(mask.view(-1).to(mask_buffer.dtype))
        mask = mask_buffer
    return DDTreeVerifyInput(
        draft_token=abi.draft_tokens,
        custom_mask=mask,
        positions=abi.positions,
        retrieve_index=abi.retrieve_index,
        retrieve_next_token=abi.retrieve_next_token,
        retrieve_next_sibling=abi.retrieve_next_sibling,
        retrieve_cum_len=None,
        spec_steps=int(horizon),
        topk=int(eagle_topk),
        draft_token_num=n,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=seq_lens_cpu,
    )


@dataclass
class DraftOutput:
    hidden: torch.Tensor  # [bs, block, H] drafter final hidden states
    root_tokens: torch.Tensor  # [bs] the bonus token of the previous step
    prefix_lens: torch.Tensor  # [bs] committed lengths before this step


class DDTreeWorker(DFlashWorkerV2):
    """DDTREE speculative worker (SGLang V2 worker contract, overlap off)."""

    def __init__(self, server_args, gpu_id, nccl_port, target_worker):
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        self._ddtree_configure()

    # ------------------------------------------------------------------ setup
    def _ddtree_configure(self) -> None:
        """Undo the global-width leak: DFlashWorkerV2 takes block_size from
        speculative_num_draft_tokens (dflash_worker_v2.py:507-523), which for
        DDTREE is the verify width 1 + budget."""
        from sglang_spec.plugin import parse_topk_env, parse_tree_temperature_env

        spec = get_spec()
        self.block_size = int(spec.speculative_dflash_block_size)
        self.verify_width = int(spec.speculative_num_draft_tokens)
        self.budget = self.verify_width - 1
        self.horizon = self.block_size - 1
        self.topk_per_depth = parse_topk_env(self.budget)
        self.tree_temperature = parse_tree_temperature_env()
        self.eagle_topk = int(spec.speculative_eagle_topk)
        self.draft_model.set_block_size(self.block_size)
        self.speculative_num_draft_tokens = self.verify_width
        self._block_pos_offsets = build_block_pos_offsets(
            length=self.block_size, device=self.device
        )
        self._draft_block_spec_info = make_draft_block_spec_info(
            draft_token_num=self.block_size, device=self.device
        )
        # Buffers sized off the old block width are rebuilt lazily.
        self._draft_block_ids_buf = None
        self._draft_block_positions_buf = None
        self._draft_block_tokens_buf = None
        self._draft_verify_out_cache_loc_buf = None
        self._draft_block_end_buf = None
        self._draft_seq_lens_cpu_buf = None
        if self.selector is not None or self.lilicorr is not None or self._is_domino:
            raise ValueError(
                "DDTREE needs a plain DFlash drafter (per-depth marginals); selector, "
                "LiLiCorr and Domino heads are not supported."
            )
        if self.use_compact_draft_cache:
            raise ValueError("DDTREE does not support a compact drafter KV cache.")
        if get_parallel().tp_rank == 0:
            logger.info(
                "DDTREE worker: block=%d horizon=%d budget=%d width=%d K=%d tree temperature=%g; "
                "hooks=%s; patches expected=%s",
                self.block_size,
                self.horizon,
                self.budget,
                self.verify_width,
                self.topk_per_depth,
                self.tree_temperature,
                REQUIRED_HOOKS,
                REQUIRED_PATCHES,
            )

    def _maybe_build_draft_sampler(self):
        # The in-graph DFlash head is argmax-only; DDTREE needs top-K per
        # depth, computed eagerly in topk_stage from the graph's hidden states.
        return None

    # ------------------------------------------------------------ entry point
    def forward_batch_generation(
        self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None
    ):
        from sglang.srt.managers.utils import GenerationBatchResult

        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            # Prefill is DFlash's: target extend + drafter context KV.
            return super().forward_batch_generation(
                batch, on_publish, grammar_barrier, pp_proxy_tensors
            )
        if batch.spec_info is None:
            batch.spec_info = DFlashDraftInputV2.create_idle_input(device=self.device)
        draft_input = batch.spec_info
        if not isinstance(draft_input, DFlashDraftInputV2):
            raise RuntimeError("DDTREE expected DFlashDraftInputV2 on the running batch.")
        if batch.forward_mode.is_idle():
            empty = torch.empty((0,), dtype=torch.int64, device=self.device)
            nxt = self._make_next_draft_input_decode(bonus_tokens=empty, new_seq_lens=empty)
            if on_publish is not None:
                on_publish(nxt.new_seq_lens)
            return GenerationBatchResult(
                logits_output=None,
                next_token_ids=empty,
                accept_lens=torch.empty((0,), dtype=torch.int32, device=self.device),
                next_draft_input=nxt,
                can_run_cuda_graph=False,
                speculative_num_draft_tokens=self.verify_width,
                new_seq_lens=nxt.new_seq_lens,
            )

        draft = self.draft_stage(batch, draft_input)
        logq, ids = self.topk_stage(draft.hidden)
        verify_input = self.tree_stage(batch, logq, ids, draft.root_tokens)
        logits_output, verify_fb, can_graph, grammar_mask = self.verify_stage(
            batch, verify_input, grammar_barrier
        )
        predict, accept_lens, accept_index = self.walk_stage(
            batch, verify_input, logits_output, grammar_mask
        )
        return self.commit_stage(
            batch,
            verify_input,
            logits_output,
            predict,
            accept_lens,
            accept_index,
            can_run_cuda_graph=can_graph,
            verify_forward_batch=verify_fb,
            on_publish=on_publish,
        )

    # ----------------------------------------------------------------- stages
    def draft_stage(self, batch, draft_input) -> DraftOutput:
        """One DFlash drafter pass over [bonus, MASK*(B-1)] at prefix+arange(B).

        Same as DFlashWorkerV2.forward_batch_generation step 1 (non-compact,
        plain head), except it returns the drafter hidden states instead of
        argmax tokens.  The block's K/V land in the (transient) verify window.
        """
        from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
        from sglang.srt.lora.layers import unwrap_lora_layer

        bs = len(batch.seq_lens)
        block = self.block_size
        device = self.device
        target_model = self.target_worker.model_runner.model
        embed_module = unwrap_lora_layer(
            _resolve_dflash_embedding_module(self.draft_model, target_model)
        )
        self._ensure_draft_block_buffers(bs)
        block_ids = self._draft_block_ids_buf[:bs]
        positions_2d = self._draft_block_positions_buf[:bs]
        cache_loc_2d = self._draft_verify_out_cache_loc_buf[:bs]
        prefix_lens = batch.seq_lens

        block_ids.fill_(int(self._mask_token_id))
        block_ids[:, 0].copy_(draft_input.bonus_tokens)
        torch.add(prefix_lens.unsqueeze(1), self._block_pos_offsets, out=positions_2d)
        cache_loc = assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=self.model_runner.req_to_token_pool.req_to_token,
            start_offset=prefix_lens,
            end_offset=prefix_lens + block,
            batch_size=bs,
            draft_token_num=block,
            device=device,
        )
        cache_loc_2d.copy_(cache_loc.view(bs, block))

        if self._full_embed_gpu is not None:
            emb = torch.nn.functional.embedding(block_ids, self._full_embed_gpu)
        else:
            emb = embed_module(block_ids)
        if self._noise_embed_scale != 1.0:
            emb = emb * self._noise_embed_scale
        positions = positions_2d.reshape(-1)
        out_cache_loc = cache_loc_2d.reshape(-1)

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
        seq_lens_cpu = self._draft_seq_lens_cpu_buf[:bs]
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
            input_ids=block_ids.flatten(),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=prefix_lens,
            out_cache_loc=out_cache_loc,
            seq_lens_sum=seq_lens_sum,
            seq_lens_cpu=seq_lens_cpu,
            positions=positions,
            input_embeds=emb.view(-1, emb.shape[-1]),
            spec_algorithm=SpeculativeAlgorithm.DFLASH,
            spec_info=self._draft_block_spec_info,
            capture_hidden_mode=CaptureHiddenMode.NULL,
            num_token_non_padded=(
                torch.full((), bs * block, dtype=torch.int32, device=device)
                if enable_num_token_non_padded()
                else None
            ),
            global_num_token_non_padded_cpu=bs * block,
            can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
        )
        plan.bind(fb, self.draft_model_runner.kv_index_translator)
        from sglang.srt.speculative.spec_utils import draft_tp_context

        with torch.inference_mode(), draft_tp_context(self.draft_parallel_layout):
            out = self.draft_model_runner.forward(fb)
        hidden = out.logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTREE: the DFlash drafter returned no hidden states.")
        return DraftOutput(
            hidden=hidden[: bs * block].view(bs, block, -1),
            root_tokens=draft_input.bonus_tokens.view(-1).to(torch.int64),
            prefix_lens=prefix_lens,
        )

    def topk_stage(self, draft_hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-depth top-K of the drafter marginals q_1..q_L (block rows 1..B-1)
        through the target LM head, TP-aware (never gathers the vocabulary)."""
        from sglang.srt.lora.layers import unwrap_lora_layer
        from sglang.srt.speculative.spec_utils import draft_tp_context

        lm_head = unwrap_lora_layer(getattr(self.target_worker.model_runner.model, "lm_head", None))
        if lm_head is None or not hasattr(lm_head, "weight"):
            raise RuntimeError("DDTREE needs a dense target lm_head.")
        tp_group = get_parallel().tp_group if hasattr(lm_head, "shard_indices") else None
        with draft_tp_context(self.draft_parallel_layout):
            return sharded_topk(
                draft_hidden[:, 1:, :],
                lm_head,
                self.topk_per_depth,
                tp_group,
                self.tree_temperature,
            )

    def tree_stage(self, batch, logq, ids, root_tokens) -> DDTreeVerifyInput:
        """Best-first DDTree of `budget` nodes and its SGLang tree ABI, on the
        device with no host sync (mask sized from the host-side seq_lens_sum)."""
        from sglang_spec.tree import build_ddtree_from_topk

        tree = build_ddtree_from_topk(logq, ids, self.budget, root_tokens)
        backend = self.target_worker.model_runner.attn_backend
        vm = backend.verify_mask
        bs = int(batch.seq_lens.shape[0])
        mode = None if vm is None else vm.mode
        buf = vm.buffer if (vm is not None and vm.fits(bs)) else None
        seq_lens_sum = batch.seq_lens_sum
        if seq_lens_sum is None and batch.seq_lens_cpu is not None:
            seq_lens_sum = int(batch.seq_lens_cpu.sum())
        vi = build_verify_input(
            tree,
            batch.seq_lens,
            horizon=self.horizon,
            eagle_topk=self.eagle_topk,
            mask_mode=mode,
            seq_lens_sum=seq_lens_sum,
            mask_buffer=buf,
            seq_lens_cpu=batch.seq_lens_cpu,
        )
        self._last_tree = tree
        return vi

    def verify_stage(self, batch, verify_input, grammar_barrier=None):
        """Target TARGET_VERIFY forward over the tree (eagle_prepare_for_verify)."""
        from sglang.srt.speculative.eagle_utils import eagle_prepare_for_verify
        from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

        batch.spec_info = verify_input
        fb, can_graph = eagle_prepare_for_verify(
            verify_input, self.model_runner.req_to_token_pool, batch, self.target_worker
        )
        if can_graph:
            # Copies retrieve_* into the hybrid backend's graph buffers
            # (EagleVerifyInput only) and recomputes mask-dependent metadata.
            self.model_runner.attn_backend.update_verify_buffers_to_fill_after_draft(
                verify_input, self.model_runner.decode_cuda_graph_runner.bs
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
        self._last_target_out = out
        return out.logits_output, fb, out.can_run_cuda_graph, grammar_mask

    def walk_stage(self, batch, verify_input, logits_output, grammar_mask=None):
        """Greedy / sample-and-walk over the tree (eagle_sample): greedy ->
        verify_tree_greedy_func; T>0 -> tree_speculative_sampling_target_only
        with draft_probs=0 and thresholds 1 (lossless for a deterministic tree)."""
        from sglang.srt.speculative.eagle_utils import eagle_sample

        return eagle_sample(
            verify_input,
            batch,
            logits_output,
            grammar_mask,
            watermark_state=self.target_worker.model_runner.watermark_state,
        )

    def commit_stage(
        self,
        batch,
        verify_input,
        logits_output,
        predict,
        accept_lens,
        accept_index,
        *,
        can_run_cuda_graph: bool,
        verify_forward_batch=None,
        on_publish=None,
    ):
        """Commit the accepted path: GDN state at the last accepted node,
        bonus, logprobs, KV compaction, drafter context KV."""
        from sglang.kernels.ops.speculative.eagle import prepare_verify_commit_outputs
        from sglang.srt.layers.logprob_processor import compute_spec_logprobs
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.speculative.eagle_worker_common import _finalize_accept_tree_path
        from sglang.srt.speculative.spec_utils import commit_mamba_states_after_verify

        bs = int(batch.seq_lens.shape[0])
        n = self.verify_width
        prefix_lens = batch.seq_lens
        new_seq_lens, bonus = prepare_verify_commit_outputs(
            predict, accept_index, accept_lens, batch.seq_lens
        )
        # Tree-aware: steps = accept_index[b, len-1] - b*n; reads the
        # pre-verify batch.seq_lens for the track interval.
        commit_mamba_states_after_verify(self.target_worker, batch, accept_lens, accept_index, n)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)
        # KV move + predict / hidden-state compaction to the window front.
        predict = _finalize_accept_tree_path(
            batch,
            accept_index,
            accept_lens,
            predict,
            logits_output,
            bs,
            token_to_kv_pool_allocator=self.model_runner.token_to_kv_pool_allocator,
            num_draft_tokens=n,
        )
        if on_publish is not None:
            on_publish(new_seq_lens)
        self.append_context_stage(batch, logits_output.hidden_states, prefix_lens, accept_lens)
        logits_output.hidden_states = None
        nxt = self._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=predict,
            accept_lens=accept_lens,
            accept_index=accept_index,
            can_run_cuda_graph=can_run_cuda_graph,
            next_draft_input=nxt,
            speculative_num_draft_tokens=n,
            new_seq_lens=new_seq_lens,
            extra_keep_alive_refs=[verify_forward_batch],
        )

    def append_context_stage(self, batch, hidden, prefix_lens, accept_lens) -> None:
        """Drafter context KV for the accepted path.  After compaction the
        accepted rows (root first) lead each request's verify window, both in
        the target hidden states and in the KV slots, so the prefix-valid
        writer commits rows [0, accept_len) at positions prefix + i."""
        if hidden is None:
            raise RuntimeError("DDTREE verify requires target hidden states (aux capture).")
        bs = int(prefix_lens.shape[0])
        n = self.verify_width
        cache_loc = batch.out_cache_loc[: bs * n]
        positions = (
            prefix_lens.to(torch.int64).unsqueeze(1)
            + torch.arange(n, device=prefix_lens.device, dtype=torch.int64)
        ).reshape(-1)
        draft_ids = self._draft_cache_loc(cache_loc)
        self._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=hidden[: bs * n],
            cache_loc=draft_ids,
            cache_loc_2d=draft_ids.view(bs, n),
            positions=positions,
            commit_lens=accept_lens.to(torch.int32),
        )

    def _draft_cache_loc(self, target_cache_loc: torch.Tensor) -> torch.Tensor:
        """Verify-window slots as the drafter pool indexes them.  A drafter
        sharing the target allocator (the non-compact DFlash layout DDTREE
        requires) uses the target's physical ids."""
        return target_cache_loc
