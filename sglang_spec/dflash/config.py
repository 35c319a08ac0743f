"""DFlash drafter config: parse a z-lab ``config.json`` dict and validate it against the target.

Parsing mirrors how SGLang 0.5.23 reads the checkpoint (``srt/speculative/dflash_utils.py``
``parse_dflash_draft_config`` on a transformers ``Qwen3Config``), but is stricter: every field
that would silently cut acceptance (mask id, capture layers, block size, window) is required and
range-checked, and DFlash variants this module does not implement are refused, not ignored.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from numbers import Integral
from typing import Any

from transformers import Qwen3Config

FULL, SLIDING = "full_attention", "sliding_attention"
DEFAULT_MASK_TOKEN = "<|MASK|>"  # SGLang's DEFAULT_DFLASH_MASK_TOKEN

# Features of other DFlash variants (DFlash2, Domino, MiMo, Gemma-norm drafts): present in
# SGLang, not implemented here. key -> value meaning "feature off".
_UNSUPPORTED_NESTED = {
    "conv_kernel_size": 0,
    "conv_group_size": 0,
    "selector_rank": 0,
    "selector_top_k": 0,
    "output_multiplier": 1.0,
    "final_logit_softcapping": 0.0,
    "projector_type": None,
    "attention_sink_bias": False,
    "attention_value_scale": None,
    "input_embedding_scale": 1.0,
}
_UNSUPPORTED_TOP = {
    "use_gemma_norm": False,
    "has_embed_tokens": False,
    "partial_rotary_factor": 1.0,
    "rope_is_neox_style": True,
    "is_neox_style": True,
    "projector_type": None,
}


class DrafterConfigError(ValueError):
    """The drafter config cannot be used with this target (would decode wrongly)."""


class DrafterConfigWarning(UserWarning):
    """The drafter config is legal but suspicious."""


def _int(value: Any, field: str, *, lo: int, hi: int | None = None, rng: str = "") -> int:
    """``value`` as an int in [lo, hi) (hi=None: unbounded), else DrafterConfigError naming ``field``."""
    rng = rng or (f"[{lo}, {hi})" if hi is not None else f">= {lo}")
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise DrafterConfigError(f"{field}={value!r} must be an integer in {rng}")
    if value < lo or (hi is not None and value >= hi):
        raise DrafterConfigError(f"{field}={value!r} is out of range; valid: {rng}")
    return int(value)


def _one_of(cfg: dict, nested: dict, key: str) -> Any:
    """A field that may sit at top level or inside ``dflash_config``; both present must agree."""
    top, sub = cfg.get(key), nested.get(key)
    if top is not None and sub is not None and top != sub:
        raise DrafterConfigError(
            f"{key} differs between top level ({top!r}) and dflash_config ({sub!r}); "
            "SGLang uses the dflash_config value, other runtimes the top-level one -- make them equal"
        )
    return sub if sub is not None else top


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The ids SGLang computes when a checkpoint has none (``dflash_utils.build_target_layer_ids``).

    One draft layer: the middle target layer. Otherwise ``num_draft_layers`` points spread evenly
    over [1, num_target_layers - 3], rounded with Python's ``round``.
    """
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    lo, hi = 1, num_target_layers - 3
    return [
        int(round(lo + i * (hi - lo) / (num_draft_layers - 1))) for i in range(num_draft_layers)
    ]


@dataclass(frozen=True)
class DFlashConfig:
    """Resolved drafter hyper-parameters; ``raw`` is the config.json dict it came from."""

    raw: dict
    block_size: int
    mask_token_id: int
    mask_token: str
    target_layer_ids: tuple[int, ...]
    num_target_layers: int
    vocab_size: int | None
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int
    rms_norm_eps: float
    attention_bias: bool
    layer_types: tuple[str, ...]
    sliding_window: int | None  # HF convention: the window includes the query token
    layer_causal: tuple[bool, ...]  # per layer: keys must not be after the query
    hf_config: Qwen3Config  # what transformers / SGLang build from ``raw`` (rope, MLP)

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == SLIDING else None

    @classmethod
    def from_dict(cls, cfg: dict) -> DFlashConfig:
        """Parse and check the drafter's own fields (no target needed)."""
        if not isinstance(cfg, dict):
            raise DrafterConfigError(f"config must be a dict, got {type(cfg).__name__}")
        nested = cfg.get("dflash_config") or {}
        if not isinstance(nested, dict):
            raise DrafterConfigError(f"dflash_config={nested!r} must be a dict")
        archs = cfg.get("architectures")
        if archs is not None and "DFlashDraftModel" not in archs:
            raise DrafterConfigError(f"architectures={archs!r} must include 'DFlashDraftModel'")
        for src, table, where in (
            (nested, _UNSUPPORTED_NESTED, "dflash_config."),
            (cfg, _UNSUPPORTED_TOP, ""),
        ):
            for key, off in table.items():
                if src.get(key) not in (off, None):
                    raise DrafterConfigError(
                        f"{where}{key}={src[key]!r} is not supported (only {off!r}): this drafter "
                        "implements plain DFlash, and ignoring the field would mis-draft"
                    )

        block = _one_of(cfg, nested, "block_size")
        if block is None:
            raise DrafterConfigError(
                "block_size is missing (top level or dflash_config); valid: integer >= 2"
            )
        block = _int(block, "block_size", lo=2)

        mask_id = _one_of(cfg, nested, "mask_token_id")
        if mask_id is None:
            raise DrafterConfigError(
                "dflash_config.mask_token_id is missing; valid: an id in [0, target vocab)"
            )
        mask_id = _int(mask_id, "dflash_config.mask_token_id", lo=0)
        mask_token = nested.get("mask_token", cfg.get("mask_token")) or DEFAULT_MASK_TOKEN

        n_target = _one_of(cfg, nested, "num_target_layers")
        if n_target is None:
            raise DrafterConfigError(
                "num_target_layers is missing; valid: the target's num_hidden_layers"
            )
        n_target = _int(n_target, "num_target_layers", lo=2)

        ids = _one_of(cfg, nested, "target_layer_ids")
        # Bound: SGLang captures the input of layer id+1 (qwen3.py set_dflash_layers_to_capture:
        # layers_to_capture = [id + 1]; the capture loop only visits layers < num_layers), and
        # qwen3_5_text.py set_dflash_layers_to_capture requires sorted unique ids with
        # 0 <= id < num_layers - 1. Features are concatenated in layer order, so order matters too.
        rng = f"unique, strictly increasing ints in [0, {n_target - 1})"
        if not isinstance(ids, (list, tuple)) or not ids:
            raise DrafterConfigError(
                f"dflash_config.target_layer_ids={ids!r} must be a non-empty list of {rng}"
            )
        for i, v in enumerate(ids):
            _int(v, f"dflash_config.target_layer_ids[{i}]", lo=0, hi=n_target - 1, rng=rng)
        if any(a >= b for a, b in zip(ids, ids[1:])):
            raise DrafterConfigError(f"dflash_config.target_layer_ids={list(ids)!r} must be {rng}")

        hidden = _int(cfg.get("hidden_size"), "hidden_size", lo=1)
        heads = _int(cfg.get("num_attention_heads"), "num_attention_heads", lo=1)
        kv_heads = _int(cfg.get("num_key_value_heads", heads), "num_key_value_heads", lo=1)
        if heads % kv_heads:
            raise DrafterConfigError(
                f"num_key_value_heads={kv_heads} must divide num_attention_heads={heads}"
            )
        head_dim = _int(cfg.get("head_dim", hidden // heads), "head_dim", lo=2)
        if head_dim % 2:
            raise DrafterConfigError(f"head_dim={head_dim} must be even (RoPE rotates halves)")
        inter = _int(cfg.get("intermediate_size"), "intermediate_size", lo=1)
        layers = _int(cfg.get("num_hidden_layers"), "num_hidden_layers", lo=1)
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        if cfg.get("hidden_act", "silu") != "silu":
            raise DrafterConfigError(
                f"hidden_act={cfg['hidden_act']!r} is not supported; valid: 'silu'"
            )
        vocab = cfg.get("vocab_size")
        if vocab is not None:
            vocab = _int(vocab, "vocab_size", lo=1)

        types = cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, (list, tuple)) or len(types) != layers:
                raise DrafterConfigError(
                    f"layer_types={types!r} must be a list with one entry per draft layer "
                    f"(num_hidden_layers={layers})"
                )
            for i, t in enumerate(types):
                if t not in (FULL, SLIDING):
                    raise DrafterConfigError(
                        f"layer_types[{i}]={t!r} is not supported; valid: {FULL!r}, {SLIDING!r}"
                    )
        try:
            # SGLang loads the draft config through transformers' Qwen3Config; take layer_types,
            # sliding_window and rope exactly as it resolves them (e.g. it drops sliding_window
            # unless use_sliding_window is true).
            hf = Qwen3Config.from_dict({k: v for k, v in cfg.items() if k != "dflash_config"})
        except Exception as e:  # transformers' own validation (rope parameters, ...)
            raise DrafterConfigError(f"transformers Qwen3Config rejects this config: {e}") from e
        for key in ("rope_dim", "mrope_section"):
            if key in (hf.rope_parameters or {}):
                raise DrafterConfigError(
                    f"rope_parameters.{key}={hf.rope_parameters[key]!r} is not supported"
                )
        types = tuple(hf.layer_types)
        window = hf.sliding_window
        if SLIDING in types and (
            cfg.get("sliding_window") is None
            or window is None
            or isinstance(window, bool)
            or not isinstance(window, Integral)
            or window < 1
        ):
            raise DrafterConfigError(
                f"layer_types[{types.index(SLIDING)}]={SLIDING!r} needs a positive integer sliding_window; "
                f"got sliding_window={cfg.get('sliding_window')!r} with use_sliding_window="
                f"{cfg.get('use_sliding_window')!r} (transformers/SGLang drop the window unless "
                "use_sliding_window is true)"
            )
        # SGLang (models/dflash.py _get_dflash_attention_type): explicit is_causal applies to every
        # layer; otherwise full layers are ENCODER_ONLY (non-causal), sliding ones DECODER (causal).
        is_causal = cfg.get("is_causal")
        if is_causal is False and SLIDING in types:
            raise DrafterConfigError(
                "is_causal=False with sliding_attention layers is not supported: the bidirectional "
                "window semantics differ between SGLang and the z-lab reference"
            )
        causal = tuple(t == SLIDING if is_causal is None else bool(is_causal) for t in types)
        return cls(
            raw=cfg,
            block_size=block,
            mask_token_id=mask_id,
            mask_token=mask_token,
            target_layer_ids=tuple(int(v) for v in ids),
            num_target_layers=n_target,
            vocab_size=vocab,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=inter,
            num_hidden_layers=layers,
            rms_norm_eps=eps,
            attention_bias=bool(cfg.get("attention_bias", False)),
            layer_types=types,
            sliding_window=int(window) if SLIDING in types else None,
            layer_causal=causal,
            hf_config=hf,
        )


def _target_text_config(target_config: Any) -> Any:
    get = getattr(target_config, "get_text_config", None)
    return get() if callable(get) else target_config


def _special_ids(target_config: Any, tokenizer: Any) -> set[int]:
    """Ids the target treats as special: bos/eos/pad from its config, and the tokenizer's special
    tokens (including added special tokens) when a tokenizer is given."""
    ids: set[int] = set()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = getattr(target_config, key, None)
        ids.update(int(x) for x in (v if isinstance(v, (list, tuple)) else [v]) if x is not None)
    if tokenizer is not None:
        ids.update(int(i) for i in tokenizer.all_special_ids)
        ids.update(
            int(i) for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
        )
    return ids


def validate_drafter_config(cfg: dict, target_config: Any, tokenizer: Any = None) -> list[str]:
    """Check a drafter ``config.json`` dict against the target's HF config (and tokenizer).

    Raises DrafterConfigError for configs that would decode wrongly; returns (and emits as
    DrafterConfigWarning) messages for legal but suspicious settings.
    """
    c = DFlashConfig.from_dict(cfg)
    t = _target_text_config(target_config)
    t_layers, t_hidden, t_vocab = int(t.num_hidden_layers), int(t.hidden_size), int(t.vocab_size)
    if c.num_target_layers != t_layers:
        raise DrafterConfigError(
            f"num_target_layers={c.num_target_layers} does not match the target's num_hidden_layers={t_layers}"
        )
    if c.hidden_size != t_hidden:
        raise DrafterConfigError(
            f"hidden_size={c.hidden_size} does not match the target's hidden_size={t_hidden}"
        )
    if c.vocab_size is not None and c.vocab_size != t_vocab:
        raise DrafterConfigError(
            f"vocab_size={c.vocab_size} does not match the target's vocab_size={t_vocab}: "
            "the drafter was trained for a different target"
        )
    if c.mask_token_id >= t_vocab:
        raise DrafterConfigError(
            f"dflash_config.mask_token_id={c.mask_token_id} is outside the target vocab; valid: [0, {t_vocab})"
        )
    if tokenizer is not None:  # as SGLang's DFlash worker _resolve_mask_token_id does
        vocab_id = tokenizer.get_vocab().get(c.mask_token)
        if vocab_id is not None and int(vocab_id) != c.mask_token_id:
            raise DrafterConfigError(
                f"dflash_config.mask_token_id={c.mask_token_id} conflicts with the tokenizer: "
                f"mask_token={c.mask_token!r} has id {vocab_id}"
            )

    found = []
    special = _special_ids(t, tokenizer)
    if special and c.mask_token_id < min(special):
        found.append(
            f"dflash_config.mask_token_id={c.mask_token_id} lies below the target's first special "
            f"token id {min(special)}: it is probably an ordinary text token"
        )
    if (
        tokenizer is not None
        and c.mask_token_id < len(tokenizer)
        and c.mask_token_id not in special
    ):
        tok = tokenizer.convert_ids_to_tokens(c.mask_token_id)
        found.append(
            f"dflash_config.mask_token_id={c.mask_token_id} is the ordinary text token {tok!r} "
            "of the target tokenizer, not a dedicated mask token"
        )
    default = default_target_layer_ids(c.num_target_layers, c.num_hidden_layers)
    if list(c.target_layer_ids) != default:
        found.append(
            f"dflash_config.target_layer_ids={list(c.target_layer_ids)} differs from SGLang's "
            f"evenly-spread default {default} (dflash_utils.build_target_layer_ids); the config "
            "value is used -- check it matches how the drafter was trained"
        )
    for msg in found:
        warnings.warn(msg, DrafterConfigWarning, stacklevel=2)
    return found
