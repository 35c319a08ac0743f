"""The exact reference engine: AR, DFLASH (chain) and DDTREE decoding on HF Transformers, batch size 1.

This is the lossless oracle for the SGLang plugin and the engine behind the CPU demo. A speculative
step is five named stages, each timed:

1. :meth:`_Decoder.draft` -- the DFlash drafter's block ``[root, MASK x L]`` over its cached context
   gives per-depth logits ``[1, L, V]``;
2. :meth:`_Decoder.tree` -- ``build_ddtree`` (DDTREE) or ``build_chain`` (DFLASH);
3. :meth:`_Decoder.verify` -- one target forward over the tree: ancestor mask and ``seq_len + depth``
   positions for attention layers, :class:`~sglang_spec.gdn.GDNTreeVerifier` for Gated-DeltaNet
   layers (conv window from ancestors, recurrent state from the parent);
4. :meth:`_Decoder.walk` -- ``walk_greedy`` on the target argmax, or ``walk_sample`` at T > 0;
5. :meth:`_Decoder.commit` -- KV compaction of the accepted path for attention layers, the accepted
   node's GDN states, and drafter context from the target features at the accepted node indices.

Works for transformers' Qwen3 (pure attention) and Qwen3.5-text / Qwen3-Next (GDN hybrid) targets.

Tokens are counted as SGLang counts them: a step's tokens past ``max_new_tokens`` or after a stop
token are discarded (``StepStats.emitted`` counts what was kept), and :func:`tokens_per_step` is
SGLang's ``completion_tokens / spec_verify_ct``.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sglang_spec.gdn import GDNTreeVerifier
from sglang_spec.tree import (
    DraftTree,
    WalkResult,
    ancestor_mask,
    build_chain,
    build_ddtree,
    check_tree_temperature,
    sample_target_tokens,
    tree_positions,
    walk_greedy,
    walk_sample,
)

METHODS = ("ar", "dflash", "ddtree")
STAGES = ("draft", "build", "verify", "walk", "commit")


@dataclass
class StepStats:
    """One decode step (a verify step, or an AR decode forward).

    ``accepted``: drafts the walk accepted (root excluded; SGLang's ``num_correct_drafts``, counted
    whole even past ``max_new_tokens``); ``verified``: nodes the target verified (root included);
    ``emitted``: tokens the step added to the output -- ``accepted + 1`` except on a last step cut
    short by ``max_new_tokens`` or a stop token, whose tokens past the cut are discarded.
    """

    accepted: int
    verified: int
    emitted: int
    seconds: dict[str, float]


@dataclass
class GenerateResult:
    tokens: list[int]  # generated token ids (the prompt excluded), the prefill's token first
    method: str  # one of METHODS
    steps: list[StepStats] = field(default_factory=list)
    prefill_seconds: float = 0.0
    finish_reason: str = "length"  # "length" or "stop"

    @property
    def tokens_per_step(self) -> float:
        """SGLang's ``completion_tokens / spec_verify_ct`` here (see :func:`tokens_per_step`)."""
        return tokens_per_step([self])

    @property
    def depth_histogram(self) -> dict[int, int]:
        """Steps that accepted exactly ``d`` draft tokens."""
        return dict(sorted(Counter(s.accepted for s in self.steps).items()))

    @property
    def stage_seconds(self) -> dict[str, float]:
        return {k: sum(s.seconds.get(k, 0.0) for s in self.steps) for k in STAGES}


def tokens_per_step(results: Sequence[GenerateResult]) -> float:
    """SGLang's acceptance length, pooled: ``sum(completion_tokens) / sum(spec_verify_ct)``.

    ``completion_tokens`` is every token returned -- the prefill's first token and a stop token that
    ended the generation included, nothing past ``max_new_tokens`` -- and ``spec_verify_ct`` the
    verify steps (the prefill forward excluded), as SGLang's ``spec_accept_length``. AR has no
    verify step: its figure is 1.0, one token per decode forward. NaN when no verify step ran.
    """
    if all(r.method == "ar" for r in results):
        return 1.0
    if any(r.method == "ar" for r in results):
        raise ValueError("tokens_per_step pools results of one method; got AR mixed with others")
    steps = sum(len(r.steps) for r in results)
    return sum(len(r.tokens) for r in results) / steps if steps else math.nan


class _Clock:
    def __init__(self):
        self.seconds: dict[str, float] = {}

    def __call__(self, stage: str):
        clock = self

        class _Span:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                clock.seconds[stage] = clock.seconds.get(stage, 0.0) + time.perf_counter() - self.t0

        return _Span()


def _attention_cache_layers(cache):
    """The cache layers that hold attention K/V (transformers' GDN ``LinearAttentionLayer`` has none)."""
    return [layer for layer in cache.layers if hasattr(layer, "keys")]


class _Decoder:
    """State of one generation: the target's cache, the drafter's context cache, the sampler."""

    def __init__(
        self,
        target,
        drafter,
        method,
        budget,
        tree_temperature,
        temperature,
        top_p,
        top_k,
        seed,
        draft_block=None,
    ):
        self.target, self.drafter, self.method, self.budget = target, drafter, method, budget
        self.draft_block = draft_block
        self.tree_temperature = tree_temperature
        self.sampling = (temperature, top_p, top_k)
        self.generator = torch.Generator(device=target.device).manual_seed(seed)
        self.cache = None
        self.dcache = None
        self.seq_len = 0  # tokens whose target KV / state is committed

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:
        """Target token(s) for logits [1, n, V]: argmax at T = 0, else an exact sample."""
        temperature, top_p, top_k = self.sampling
        if temperature == 0:
            return logits.argmax(dim=-1)
        return sample_target_tokens(logits, temperature, top_p, top_k, self.generator)

    def prefill(self, input_ids: torch.Tensor) -> int:
        out = self.target(input_ids, use_cache=True, output_hidden_states=self.drafter is not None)
        self.cache = out.past_key_values
        self.seq_len = input_ids.shape[1]
        if self.drafter is not None:
            self.dcache = self.drafter.new_cache(1)
            features = self.drafter.select_features(out.hidden_states)
            self.drafter.append_context(
                self.dcache, features, torch.arange(self.seq_len, device=input_ids.device)[None]
            )
        return int(self._choose(out.logits[:, -1:])[0, 0])

    def ar_step(self, root: int) -> list[int]:
        ids = torch.tensor([[root]], device=self.target.device)
        out = self.target(ids, past_key_values=self.cache, use_cache=True)
        self.seq_len += 1
        return [int(self._choose(out.logits[:, -1:])[0, 0])]

    # ---- the five stages of a speculative step -------------------------------------------------

    def draft(self, root: int) -> torch.Tensor:
        dev = self.target.device
        return self.drafter.draft_logits(
            self.dcache,
            torch.tensor([root], device=dev),
            torch.tensor([self.seq_len], device=dev),
            self.draft_block,
        )

    def tree(self, draft_logits: torch.Tensor, root: int) -> DraftTree:
        roots = torch.tensor([root], device=draft_logits.device)
        if self.method == "ddtree":
            return build_ddtree(draft_logits, self.budget, roots, self.tree_temperature)
        return build_chain(draft_logits, roots)

    def verify(self, tree: DraftTree):
        """Target forward over the tree; returns (logits [1, N, V], hidden states, GDN verifier)."""
        N = tree.width
        dtype = self.target.dtype
        visible = torch.cat(
            (
                torch.ones(1, N, self.seq_len, dtype=torch.bool, device=tree.tokens.device),
                ancestor_mask(tree),
            ),
            dim=2,
        )
        mask = torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
            ~visible, torch.finfo(dtype).min
        )
        positions = tree_positions(tree, torch.tensor([self.seq_len], device=tree.tokens.device))
        with GDNTreeVerifier(self.target, tree.parents) as gdn:
            out = self.target(
                tree.tokens,
                attention_mask=mask[:, None],
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                output_hidden_states=True,
            )
        return out.logits, out.hidden_states, gdn

    def walk(self, tree: DraftTree, logits: torch.Tensor) -> WalkResult:
        temperature, top_p, top_k = self.sampling
        if temperature == 0:
            return walk_greedy(tree, logits.argmax(dim=-1))
        return walk_sample(tree, logits, temperature, top_p, top_k, self.generator)

    def commit(
        self, tree: DraftTree, walk: WalkResult, hidden_states, gdn: GDNTreeVerifier
    ) -> list[int]:
        path = walk.accepted[0, : int(walk.accept_len[0]) + 1]  # node indices, root first
        keep = torch.cat((torch.arange(self.seq_len, device=path.device), self.seq_len + path))
        for layer in _attention_cache_layers(self.cache):  # KV compaction of the accepted path
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)
        gdn.commit(self.cache, path[-1:])
        features = self.drafter.select_features(hidden_states)[:, path]
        self.drafter.append_context(
            self.dcache,
            features,
            (self.seq_len + torch.arange(len(path), device=path.device))[None],
        )
        self.seq_len += len(path)
        return tree.tokens[0, path[1:]].tolist() + [int(walk.bonus[0])]

    def spec_step(self, root: int, clock: _Clock) -> tuple[list[int], int, int]:
        with clock("draft"):
            draft_logits = self.draft(root)
        with clock("build"):
            tree = self.tree(draft_logits, root)
        with clock("verify"):
            logits, hidden_states, gdn = self.verify(tree)
        with clock("walk"):
            walk = self.walk(tree, logits)
        with clock("commit"):
            emitted = self.commit(tree, walk, hidden_states, gdn)
        return emitted, int(walk.accept_len[0]), int(tree.num_nodes[0])


def _check_args(
    drafter,
    input_ids,
    method,
    budget,
    tree_temperature,
    max_new_tokens,
    temperature,
    top_p,
    top_k,
    draft_block=None,
):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    if method != "ar" and drafter is None:
        raise ValueError(f"method {method!r} needs a DFlash drafter; got drafter=None")
    if method == "ddtree" and (
        isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
    ):
        raise ValueError(f"budget must be an integer >= 1 for ddtree; got {budget!r}")
    check_tree_temperature(tree_temperature)
    if draft_block is not None and drafter is not None:
        trained = drafter.block_size
        if isinstance(draft_block, bool) or not isinstance(draft_block, int):
            raise ValueError(
                f"draft_block must be an integer in [2, {trained}]; got {draft_block!r}"
            )
        if not 2 <= draft_block <= trained:
            raise ValueError(
                f"draft_block must be in [2, {trained}] (the drafter's block); got {draft_block}"
            )
    if input_ids.dim() != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(
            f"input_ids must be [1, T] with T >= 1 (batch size 1); got shape {tuple(input_ids.shape)}"
        )
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1; got {max_new_tokens}")
    if temperature < 0 or not 0 < top_p <= 1:
        raise ValueError(
            f"need temperature >= 0 and 0 < top_p <= 1; got temperature={temperature}, top_p={top_p}"
        )
    if isinstance(top_k, bool) or not isinstance(top_k, int):
        raise ValueError(f"top_k must be an integer (<= 0 disables it); got {top_k!r}")


@torch.inference_mode()
def generate(
    target,
    drafter,
    input_ids: torch.Tensor,
    method: str = "ddtree",
    budget: int = 16,
    tree_temperature: float = 1.0,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = -1,
    seed: int = 0,
    stop_token_ids=(),
    draft_block: int | None = None,
) -> GenerateResult:
    """Generate up to ``max_new_tokens`` tokens after ``input_ids [1, T]`` with ``method``.

    ``ar`` decodes one token per target forward; ``dflash`` verifies the drafter's argmax chain;
    ``ddtree`` verifies the ``budget``-node DDTree, ranked with the drafter's distribution at
    ``tree_temperature`` (``sglang_spec.tree.draft_topk``; the plug-in's
    ``SGLANG_DDTREE_TREE_TEMPERATURE``). All three emit exactly the target's greedy
    tokens at ``temperature = 0`` and exact target samples otherwise. Generation stops after a token
    in ``stop_token_ids`` (which is kept) or at ``max_new_tokens``. ``draft_block`` (2..the
    drafter's block) drafts a shorter block than the drafter was trained with: depths up to
    ``draft_block - 1``, half the drafter's tokens at 8 of 16 (``benchmarks/draft_block.py``).
    """
    _check_args(
        drafter,
        input_ids,
        method,
        budget,
        tree_temperature,
        max_new_tokens,
        temperature,
        top_p,
        top_k,
        draft_block,
    )
    dec = _Decoder(
        target,
        drafter if method != "ar" else None,
        method,
        budget,
        tree_temperature,
        temperature,
        top_p,
        top_k,
        seed,
        draft_block,
    )
    stops = {int(t) for t in stop_token_ids}
    t0 = time.perf_counter()
    tokens = [dec.prefill(input_ids.to(target.device))]
    result = GenerateResult(tokens, method, prefill_seconds=time.perf_counter() - t0)
    while tokens[-1] not in stops and len(tokens) < max_new_tokens:
        clock = _Clock()
        if method == "ar":
            with clock("verify"):
                emitted, accepted, verified = dec.ar_step(tokens[-1]), 0, 1
        else:
            emitted, accepted, verified = dec.spec_step(tokens[-1], clock)
        kept = _kept(emitted, max_new_tokens - len(tokens), stops)
        tokens += kept
        result.steps.append(StepStats(accepted, verified, len(kept), clock.seconds))
    result.finish_reason = "stop" if tokens[-1] in stops else "length"
    return result


def _kept(emitted: list[int], room: int, stops: set[int]) -> list[int]:
    """The prefix of a step's tokens that SGLang keeps: at most ``room``, through the first stop."""
    kept = emitted[:room]
    for i, tok in enumerate(kept):
        if tok in stops:
            return kept[: i + 1]
    return kept
