"""The models the trainer builds: the hybrid (Qwen3.5-text) and Qwen3 target configs and modules,
loading a saved target frozen, the Qwen3.5 MTP head as SGLang runs it (``Qwen35MTP``, its forward on
a target and a causality check), and the DFlash drafter config and class (``--drafter-impl``).
transformers' model modules are imported inside the functions, after ``--gdn-kernels`` is applied."""

from __future__ import annotations

import copy
import importlib

import torch
from torch import nn

from training.config import COMMON


def hybrid_config(S, ids, vocab):
    from transformers import Qwen3_5TextConfig

    h = S["hybrid"]
    n = h["num_hidden_layers"]
    assert n % 4 == 0
    return Qwen3_5TextConfig(
        vocab_size=vocab,
        **h,
        linear_conv_kernel_dim=4,
        layer_types=(["linear_attention"] * 3 + ["full_attention"]) * (n // 4),
        rope_parameters={
            "rope_type": "default",
            "rope_theta": COMMON["rope_theta"],
            "partial_rotary_factor": 0.25,
        },
        max_position_embeddings=COMMON["max_position_embeddings"],
        rms_norm_eps=COMMON["rms_norm_eps"],
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def qwen3_config(S, ids, vocab):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=vocab,
        **S["qwen3"],
        rope_theta=COMMON["rope_theta"],
        max_position_embeddings=COMMON["max_position_embeddings"],
        rms_norm_eps=COMMON["rms_norm_eps"],
        tie_word_embeddings=True,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
    )


def build_target(kind, cfg):
    if kind == "hybrid":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM as cls
    else:
        from transformers import Qwen3ForCausalLM as cls
    m = cls(cfg)
    assert m.lm_head.weight is m.model.embed_tokens.weight, "embeddings not tied"
    return m


def load_target(path, device, dtype):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


class Qwen35MTP(nn.Module):
    """The NEXTN head SGLang's Qwen3_5ForCausalLMMTP runs (srt/models/qwen3_5_mtp.py), in HF modules.

    state_dict keys (prefixed ``mtp.`` in the checkpoint): fc, pre_fc_norm_embedding,
    pre_fc_norm_hidden, layers.0.{self_attn,mlp,input_layernorm,post_attention_layernorm}.*, norm.
    SGLang's load_weights maps mtp.X -> model.X, then model.fc/model.pre_fc* -> fc/pre_fc*,
    drops '.self_attn', and stacks q/k/v and gate/up: every key here has a destination.
    Norms are Qwen3.5's (1 + w) RMSNorm = SGLang's GemmaRMSNorm.
    """

    def __init__(self, tcfg):
        super().__init__()
        from transformers.models.qwen3_5.modeling_qwen3_5 import (
            Qwen3_5DecoderLayer,
            Qwen3_5RMSNorm,
            Qwen3_5TextRotaryEmbedding,
        )

        c = copy.deepcopy(tcfg)
        c.num_hidden_layers = 1
        c.layer_types = ["full_attention"]
        c._attn_implementation = "sdpa"  # causal when no mask is given (checked in check_causal)
        H, eps = c.hidden_size, c.rms_norm_eps
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps=eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps=eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(c, 0)])
        self.norm = Qwen3_5RMSNorm(H, eps=eps)
        self.rotary_emb = Qwen3_5TextRotaryEmbedding(c)  # buffers only, none persistent
        nn.init.normal_(self.fc.weight, std=0.02)

    def forward(self, emb, hidden, position_ids):
        x = torch.cat([self.pre_fc_norm_embedding(emb), self.pre_fc_norm_hidden(hidden)], dim=-1)
        x = self.fc(x)
        # Qwen3.5's rotary is multimodal (3 position rows); transformers 5.17 needs them explicit.
        pe = self.rotary_emb(x, position_ids[None].expand(3, -1, -1))
        x = self.layers[0](
            x, position_embeddings=pe, attention_mask=None, position_ids=position_ids
        )
        return self.norm(x)


def mtp_forward(mtp, target, x):
    """x [bs, T] -> (mtp logits [bs, T-1, V] for tokens 2..T, target logits [bs, T, V])."""
    h = target.model(input_ids=x).last_hidden_state  # final-normed, = SGLang's captured hidden
    tlogits = target.lm_head(h)
    emb = target.model.embed_tokens(x[:, 1:])
    pos = torch.arange(x.shape[1] - 1, device=x.device)[None].expand(x.shape[0], -1)
    out = mtp(emb, h[:, :-1], pos)
    return target.lm_head(out), tlogits


def check_causal(mtp, H, device):
    g = torch.Generator().manual_seed(0)
    e = torch.randn(1, 6, H, generator=g).to(device)
    h = torch.randn(1, 6, H, generator=g).to(device)
    pos = torch.arange(6, device=device)[None]
    with torch.no_grad():
        a = mtp(e, h, pos)
        e2 = e.clone()
        e2[:, 4:] += 1.0
        b = mtp(e2, h, pos)
    assert torch.allclose(a[:, :4].float(), b[:, :4].float(), atol=1e-4), "MTP layer is not causal"
    assert not torch.allclose(a[:, 4:].float(), b[:, 4:].float()), "MTP layer ignores its input"


def drafter_cfg(S, kind, target_cfg, layer_ids, mask_id, vocab):
    d = S["drafter"][kind]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": S["block_size"],
        "dflash_config": {
            "mask_token_id": mask_id,
            "mask_token": "<|MASK|>",
            "target_layer_ids": list(layer_ids),
        },
        "num_target_layers": target_cfg.num_hidden_layers,
        "hidden_size": target_cfg.hidden_size,
        "intermediate_size": d["intermediate_size"],
        "num_hidden_layers": d["num_hidden_layers"],
        "num_attention_heads": d["num_attention_heads"],
        "num_key_value_heads": d["num_key_value_heads"],
        "head_dim": d["head_dim"],
        "vocab_size": vocab,
        "rms_norm_eps": COMMON["rms_norm_eps"],
        "rope_theta": COMMON["rope_theta"],
        "max_position_embeddings": COMMON["max_position_embeddings"],
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "attention_bias": False,
        "layer_types": ["full_attention"] * d["num_hidden_layers"],
    }


def drafter_class(spec: str):
    mod, _, name = spec.partition(":")
    return getattr(importlib.import_module(mod), name)
