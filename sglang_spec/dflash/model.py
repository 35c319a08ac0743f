"""The DFlash draft model in plain PyTorch, numerically matching SGLang's ``srt/models/dflash.py``.

Qwen3-style pre-norm layers whose attention takes *injected* context K/V: in every layer the keys
and values are ``[k/v_proj(ctx); k/v_proj(block)]`` (k_norm + RoPE at absolute positions on both),
queries come from block rows only. ``ctx = hidden_norm(fc(concat of target hidden states))``.
The drafter borrows the target's input embedding and LM head without owning them.

Two ways to run it: :meth:`DFlashDrafter.forward` (explicit context, custom mask; training and
oracle) and the cached path (:meth:`append_context` once per committed token, then
:meth:`draft_logits` per step), which must agree with ``forward`` to float tolerance.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from glob import glob
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP, Qwen3RMSNorm, Qwen3RotaryEmbedding

from .config import DFlashConfig, DrafterConfigError, validate_drafter_config


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Neox-style RoPE on x [bs, heads, T, d] with cos/sin [bs, T, d]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


@dataclass
class DFlashCache:
    """Per-layer context K/V (after k_norm + RoPE) [bs, kv_heads, C, head_dim] and their positions
    [bs, C]. Entries with a negative position are padding and never attended."""

    keys: list[Tensor]
    values: list[Tensor]
    positions: Tensor

    @property
    def length(self) -> int:
        return self.positions.shape[1]


class _Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        bias = c.attention_bias
        self.q_proj = nn.Linear(c.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, c.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=c.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=c.rms_norm_eps)

    def _heads(self, x: Tensor, n: int) -> Tensor:
        return x.view(*x.shape[:2], n, self.head_dim).transpose(1, 2)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K (k_norm, RoPE) and V of rows x [bs, T, H] -> [bs, kv_heads, T, head_dim] each."""
        k = _rotate(self.k_norm(self._heads(self.k_proj(x), self.kv_heads)), cos, sin)
        return k, self._heads(self.v_proj(x), self.kv_heads)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor
    ) -> Tensor:
        q = _rotate(self.q_norm(self._heads(self.q_proj(x), self.heads)), cos, sin)
        k, v = self.kv(x, cos, sin)
        k, v = torch.cat((ctx_k, k), dim=2), torch.cat((ctx_v, v), dim=2)
        # A query that may see nothing would give NaN (also in backward): let it see everything
        # and zero its output instead.
        seen = mask.any(-1, keepdim=True)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask | ~seen,
            scale=self.head_dim**-0.5,
            enable_gqa=self.heads != self.kv_heads,
        )
        out = out * seen
        return self.o_proj(out.transpose(1, 2).reshape(*x.shape[:2], -1))


class _Layer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.self_attn = _Attention(c)
        self.mlp = Qwen3MLP(c.hf_config)
        self.input_layernorm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """DFlash drafter over a HF target (``Qwen3ForCausalLM``, ``Qwen3_5ForCausalLM``, ...).

    ``state_dict`` keys follow the z-lab checkpoint layout (``fc``, ``hidden_norm``, ``norm``,
    ``layers.N.{self_attn,mlp,input_layernorm,post_attention_layernorm}``). The target's embedding
    and LM head are held outside the module tree: not parameters, not saved, not moved by ``.to``.
    """

    def __init__(self, config: DFlashConfig, target: nn.Module):
        super().__init__()
        c = self.config = config
        self.fc = nn.Linear(len(c.target_layer_ids) * c.hidden_size, c.hidden_size, bias=False)
        self.hidden_norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        self.layers = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = Qwen3RMSNorm(c.hidden_size, eps=c.rms_norm_eps)
        head = getattr(target, "lm_head", None)
        head = target.get_output_embeddings() if head is None else head
        # Tuples keep these out of parameters()/state_dict()/.to(); the rotary module also keeps
        # its inv_freq in float32 whatever dtype the drafter is cast to.
        self._borrowed = (target.get_input_embeddings(), head)
        self._rotary = (Qwen3RotaryEmbedding(c.hf_config),)

    # ---- construction / persistence -------------------------------------------------------

    @classmethod
    def from_config(
        cls,
        cfg: dict,
        target: nn.Module,
        *,
        dtype: torch.dtype | None = None,
        tokenizer: Any = None,
    ) -> DFlashDrafter:
        """Randomly initialised drafter (seed torch first); validated against ``target`` first.
        ``dtype`` defaults to the target embedding's dtype; placed on the target's device."""
        validate_drafter_config(cfg, target.config, tokenizer)
        embed = target.get_input_embeddings().weight
        model = cls(DFlashConfig.from_dict(cfg), target)
        return model.to(device=embed.device, dtype=dtype or embed.dtype)

    @classmethod
    def from_pretrained(
        cls,
        path: str,
        target: nn.Module,
        *,
        dtype: torch.dtype | None = None,
        tokenizer: Any = None,
    ) -> DFlashDrafter:
        """Load ``config.json`` + ``*.safetensors`` from a local directory (no network).

        Every drafter weight must be present with the right shape and no unknown weight may
        remain (a leading ``model.`` prefix is accepted, as SGLang does)."""
        with open(os.path.join(path, "config.json")) as f:
            cfg = json.load(f)
        if os.path.exists(os.path.join(path, "mask_embedding.pt")):
            raise DrafterConfigError(
                "mask_embedding.pt (trained mask row, merged by SGLang) is not supported"
            )
        files = sorted(glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        model = cls.from_config(cfg, target, dtype=dtype, tokenizer=tokenizer)
        weights = {}
        for file in files:
            weights.update({k.removeprefix("model."): v for k, v in load_file(file).items()})
        own = model.state_dict()
        missing, unexpected = (
            sorted(own.keys() - weights.keys()),
            sorted(weights.keys() - own.keys()),
        )
        if missing or unexpected:
            raise DrafterConfigError(
                f"checkpoint {path}: missing weights {missing}, unexpected weights {unexpected}"
            )
        for k, v in weights.items():
            if v.shape != own[k].shape:
                raise DrafterConfigError(
                    f"checkpoint weight {k} has shape {tuple(v.shape)}, "
                    f"config implies {tuple(own[k].shape)}"
                )
        model.load_state_dict(weights)
        return model

    def save_pretrained(self, path: str) -> None:
        """Write ``config.json`` (the dict this drafter was built from) and ``model.safetensors``."""
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "config.json"), "w") as f:
            json.dump(self.config.raw, f, indent=2)
        save_file(
            {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
            os.path.join(path, "model.safetensors"),
        )

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def mask_token_id(self) -> int:
        return self.config.mask_token_id

    @property
    def target_layer_ids(self) -> tuple[int, ...]:
        return self.config.target_layer_ids

    # ---- building blocks ------------------------------------------------------------------

    def select_features(self, hidden_states: tuple[Tensor, ...]) -> Tensor:
        """HF ``output_hidden_states`` tuple -> [bs, T, k*H]: outputs of layers target_layer_ids."""
        expected = self.config.num_target_layers + 1
        if len(hidden_states) != expected:
            raise ValueError(
                f"expected {expected} hidden states (embeddings + each target layer), got {len(hidden_states)}"
            )
        return torch.cat([hidden_states[i + 1] for i in self.target_layer_ids], dim=-1)

    def project_context(self, features: Tensor) -> Tensor:
        """[bs, T, k*H] target features -> [bs, T, H] context rows (fc, then hidden_norm)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def logits(self, hidden: Tensor) -> Tensor:
        head = self._borrowed[1]
        return head(hidden.to(head.weight.dtype))

    def _cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        rotary = self._rotary[0]
        if rotary.inv_freq.device != positions.device:
            rotary.to(positions.device)
        return rotary(self.fc.weight, positions.clamp_min(0))

    def _masks(self, q_pos: Tensor, k_pos: Tensor, base: Tensor | None) -> list[Tensor]:
        """Per-layer bool masks [bs, 1, Q, K]: ``base`` (or all-visible) AND keys with position >= 0,
        AND, for causal layers, key <= query, AND, for sliding layers, query - key <= window - 1
        (SGLang's window_left = sliding_window - 1, dflash_utils.get_dflash_attention_sliding_window_size)."""
        q, k = q_pos[:, None, :, None], k_pos[:, None, None, :]
        visible = k >= 0
        if base is not None:
            visible = visible & base
        kinds = [
            (causal, self.config.layer_window(i))
            for i, causal in enumerate(self.config.layer_causal)
        ]
        by_kind = {}
        for causal, window in set(kinds):
            m = visible & (k <= q) if causal else visible
            by_kind[causal, window] = m & (q - k < window) if window is not None else m
        return [by_kind[kind] for kind in kinds]

    def _run(
        self,
        query_ids: Tensor,
        query_positions: Tensor,
        ctx_kv: list[tuple[Tensor, Tensor]],
        masks: list[Tensor],
    ) -> Tensor:
        x = self._borrowed[0](query_ids).to(self.fc.weight.dtype)
        cos, sin = self._cos_sin(query_positions)
        for layer, (k, v), mask in zip(self.layers, ctx_kv, masks):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    # ---- full forward (training / oracle) ---------------------------------------------------

    def forward(
        self,
        query_ids: Tensor,
        query_positions: Tensor,
        ctx: Tensor,
        ctx_positions: Tensor,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Query rows [bs, Q] attend to projected context ``ctx`` [bs, C, H] and to each other.

        ``attention_mask``: bool [bs or 1, 1, Q, C+Q] (True = may attend; columns ctx then queries),
        or None = everything visible. Layer rules (causal / sliding window by position, padding ctx
        with negative positions) are applied on top. Returns final-normed hidden [bs, Q, H]."""
        bs, n_q = query_ids.shape
        want = (1, n_q, ctx.shape[1] + n_q)
        if attention_mask is not None and (
            attention_mask.dtype != torch.bool
            or attention_mask.shape[1:] != want
            or attention_mask.shape[0] not in (1, bs)
        ):
            raise ValueError(
                f"attention_mask must be bool [{bs} or 1, *{want}], got "
                f"{attention_mask.dtype} {tuple(attention_mask.shape)}"
            )
        cos, sin = self._cos_sin(ctx_positions)
        ctx_kv = [layer.self_attn.kv(ctx, cos, sin) for layer in self.layers]
        masks = self._masks(
            query_positions, torch.cat((ctx_positions, query_positions), 1), attention_mask
        )
        return self._run(query_ids, query_positions, ctx_kv, masks)

    # ---- cached drafting ------------------------------------------------------------------

    def new_cache(self, batch_size: int) -> DFlashCache:
        w = self.fc.weight

        def empty():
            return w.new_zeros(batch_size, self.config.num_key_value_heads, 0, self.config.head_dim)

        return DFlashCache(
            [empty() for _ in self.layers],
            [empty() for _ in self.layers],
            torch.zeros(batch_size, 0, dtype=torch.long, device=w.device),
        )

    def append_context(self, cache: DFlashCache, features: Tensor, positions: Tensor) -> None:
        """Project committed tokens' target features [bs, T, k*H] at ``positions`` [bs, T] into every
        layer's context K/V (once per token). Padding rows: position -1."""
        if features.shape[:2] != positions.shape or positions.shape[0] != cache.positions.shape[0]:
            raise ValueError(
                f"features {tuple(features.shape)} / positions {tuple(positions.shape)} "
                f"do not match a cache of batch {cache.positions.shape[0]}"
            )
        ctx = self.project_context(features)
        cos, sin = self._cos_sin(positions)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.kv(ctx, cos, sin)
            cache.keys[i] = torch.cat((cache.keys[i], k), dim=2)
            cache.values[i] = torch.cat((cache.values[i], v), dim=2)
        cache.positions = torch.cat((cache.positions, positions.to(cache.positions)), dim=1)

    def crop_context(self, cache: DFlashCache, length: int) -> None:
        """Keep the first ``length`` cached context entries."""
        cache.keys = [k[:, :, :length] for k in cache.keys]
        cache.values = [v[:, :, :length] for v in cache.values]
        cache.positions = cache.positions[:, :length]

    def draft_logits(
        self,
        cache: DFlashCache,
        bonus_tokens: Tensor,
        start_positions: Tensor,
        block: int | None = None,
    ) -> Tensor:
        """One draft step: block [bonus, MASK*(B-1)] at start..start+B-1 over all cached context.
        Returns the LM-head logits of block rows 1..B-1 [bs, B-1, V]; the cache is unchanged.
        ``block`` (2..the trained block size, default the trained one) drafts a shorter block: the
        first rows of a block the drafter never saw cut, whose attention (bidirectional within
        the block) no longer sees the positions beyond it."""
        bs = bonus_tokens.shape[0]
        b = self.block_size if block is None else block
        if not 2 <= b <= self.block_size:
            raise ValueError(f"block must be in [2, {self.block_size}] (the drafter's); got {b}")
        ids = torch.full((bs, b), self.mask_token_id, dtype=torch.long, device=bonus_tokens.device)
        ids[:, 0] = bonus_tokens
        pos = start_positions.long()[:, None] + torch.arange(b, device=start_positions.device)
        masks = self._masks(pos, torch.cat((cache.positions, pos), 1), None)
        hidden = self._run(ids, pos, list(zip(cache.keys, cache.values)), masks)
        return self.logits(hidden[:, 1:])
