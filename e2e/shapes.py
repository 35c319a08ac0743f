"""Real-scale model shapes without weights: ``config.json`` directories for targets and drafters.

SGLang serves them with ``--load-format dummy --skip-tokenizer-init`` (random weights, requests of
token ids), so a GPU box measures the cost of a real deployment's step with no model download.
Dummy weights accept almost nothing: each verify step yields one token unless the server is told to
simulate acceptance (``SGLANG_SIMULATE_ACC_LEN``).

Values (shared/notes/scale-2026-11-30.md): the Qwen3.6-27B and Qwen3.5-4B text configs (Gated-
DeltaNet hybrids, full attention every 4th layer, one MTP layer) and Qwen3-8B (attention only), each
with a 5-layer DFlash drafter of the target's width at block 16 whose target layers are SGLang's
default spread. Field names follow transformers' ``Qwen3_5TextConfig`` / ``Qwen3Config`` and SGLang's
``configs/qwen3_5.py``; ``tests/test_e2e_shapes.py`` parses every file with both. Ids that only a
tokenizer would give meaning (eos, the drafter's mask token) are placeholders above the ordinary
vocabulary: requests use ``ignore_eos`` and ids, never text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

BLOCK_SIZE = 16
DRAFT_LAYERS = 5


@dataclass(frozen=True)
class Shape:
    name: str  # also the server_configs/ prefix: <name>-ar.yaml, <name>-dflash.yaml, ...
    hybrid: bool  # Gated-DeltaNet layers (Qwen3.5/3.6) or attention only
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float
    max_position: int
    tie_embeddings: bool
    eos_token_id: int
    mask_token_id: int  # the drafter's mask token
    draft_heads: int
    draft_kv_heads: int
    draft_head_dim: int
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_head_dim: int = 128
    mtp_layers: int = 0

    @property
    def has_mtp(self) -> bool:
        """NEXTN (the model's own MTP layer) applies."""
        return self.mtp_layers > 0

    @property
    def config_prefix(self) -> str:
        return f"{self.name}-"


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape(
            name="qwen3.6-27b",
            hybrid=True,
            layers=64,
            hidden=5120,
            heads=24,
            kv_heads=4,
            head_dim=256,
            intermediate=17408,
            vocab=248320,
            rope_theta=1e7,
            max_position=262144,
            tie_embeddings=False,
            eos_token_id=248044,
            mask_token_id=248077,
            draft_heads=32,
            draft_kv_heads=8,
            draft_head_dim=128,
            linear_key_heads=16,
            linear_value_heads=48,
            mtp_layers=1,
        ),
        Shape(
            name="qwen3.5-4b",
            hybrid=True,
            layers=32,
            hidden=2560,
            heads=16,
            kv_heads=4,
            head_dim=256,
            intermediate=9216,
            vocab=248320,
            rope_theta=1e7,
            max_position=262144,
            tie_embeddings=True,
            eos_token_id=248044,
            mask_token_id=248077,
            draft_heads=32,
            draft_kv_heads=8,
            draft_head_dim=128,
            linear_key_heads=16,
            linear_value_heads=32,
            mtp_layers=1,
        ),
        Shape(
            name="qwen3-8b",
            hybrid=False,
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            intermediate=12288,
            vocab=151936,
            rope_theta=1e6,
            max_position=40960,
            tie_embeddings=False,
            eos_token_id=151645,
            mask_token_id=151669,
            draft_heads=32,
            draft_kv_heads=8,
            draft_head_dim=128,
        ),
    )
}


def target_config(shape: Shape) -> dict:
    """The target's ``config.json``."""
    common = {
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": shape.max_position,
        "tie_word_embeddings": shape.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "eos_token_id": shape.eos_token_id,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    if not shape.hybrid:
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **common,
            "rope_parameters": {"rope_type": "default", "rope_theta": shape.rope_theta},
            "layer_types": ["full_attention"] * shape.layers,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": shape.layers,
        }
    interval = 4  # [linear x3, full] repeated
    return {
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        **common,
        "attn_output_gate": True,
        "partial_rotary_factor": 0.25,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": shape.rope_theta,
            "partial_rotary_factor": 0.25,
        },
        "full_attention_interval": interval,
        "layer_types": [
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(shape.layers)
        ],
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": shape.linear_head_dim,
        "linear_value_head_dim": shape.linear_head_dim,
        "linear_num_key_heads": shape.linear_key_heads,
        "linear_num_value_heads": shape.linear_value_heads,
        "mtp_num_hidden_layers": shape.mtp_layers,
        "mtp_use_dedicated_embeddings": False,
    }


def drafter_config(shape: Shape) -> dict:
    """The matching DFlash drafter's ``config.json`` (z-lab layout: Qwen3 layers, block 16)."""
    from sglang_spec.dflash.config import default_target_layer_ids  # torch: not for --help

    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": BLOCK_SIZE,
        "dflash_config": {
            "mask_token_id": shape.mask_token_id,
            "target_layer_ids": default_target_layer_ids(shape.layers, DRAFT_LAYERS),
        },
        "num_target_layers": shape.layers,
        "vocab_size": shape.vocab,
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": DRAFT_LAYERS,
        "num_attention_heads": shape.draft_heads,
        "num_key_value_heads": shape.draft_kv_heads,
        "head_dim": shape.draft_head_dim,
        "layer_types": ["full_attention"] * DRAFT_LAYERS,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": shape.rope_theta,
        "max_position_embeddings": shape.max_position,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def write_model_dirs(shape: Shape, root: str | Path) -> tuple[Path, Path]:
    """``<root>/<name>/target`` and ``<root>/<name>/drafter``, each holding only ``config.json``."""
    base = Path(root) / shape.name
    dirs = (base / "target", base / "drafter")
    for d, cfg in zip(dirs, (target_config(shape), drafter_config(shape))):
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    return dirs
