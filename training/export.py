"""Writing the trained fixtures: targets and drafters as bf16 checkpoints, the MTP head's weights
added to the hybrid target's safetensors, and the name mapping SGLang 0.5.23 applies to them
(``sglang_mtp_name``, ``SGLANG_MTP_PARAMS``), which the checks verify."""

from __future__ import annotations

import json
import os
import shutil

import torch

from training.tokenizer import copy_tokenizer


def save_target(model, path, out, extra_cfg):
    """Save a trained target in bf16 (the model goes back to float32) with ``extra_cfg`` merged into
    its config.json, a greedy generation_config.json and the tokenizer."""
    model = model.to(torch.bfloat16)
    model.save_pretrained(path)
    model.to(torch.float32)
    cpath = os.path.join(path, "config.json")
    with open(cpath) as fh:
        c = json.load(fh)
    c.update(extra_cfg)
    c["dtype"] = c["torch_dtype"] = "bfloat16"
    with open(cpath, "w") as fh:
        json.dump(c, fh, indent=2)
    gen = {
        "bos_token_id": c.get("bos_token_id"),
        "eos_token_id": [c["eos_token_id"], c["pad_token_id"]],
        "pad_token_id": c["pad_token_id"],
        "do_sample": False,
    }
    with open(os.path.join(path, "generation_config.json"), "w") as fh:
        json.dump(gen, fh, indent=2)
    copy_tokenizer(out, path)


def save_drafter(drafter, path):
    """Save a trained drafter in bf16 to ``path``, replacing whatever was there."""
    if os.path.isdir(path):
        shutil.rmtree(path)
    drafter.to(torch.bfloat16)
    drafter.save_pretrained(path)


def add_mtp_weights(path, mtp) -> list[str]:
    """Add the MTP head's weights as ``mtp.*`` (bf16) to the target's model.safetensors in ``path``,
    replacing any previous ``mtp.*``; returns the sorted ``mtp.*`` keys."""
    from safetensors.torch import load_file, save_file

    st_path = os.path.join(path, "model.safetensors")
    sd = {k: v for k, v in load_file(st_path).items() if not k.startswith("mtp.")}
    for k, v in mtp.state_dict().items():
        if "rotary_emb" in k:
            continue
        sd["mtp." + k] = v.detach().to(torch.bfloat16).cpu().contiguous()
    save_file(sd, st_path, metadata={"format": "pt"})
    return sorted(k for k in sd if k.startswith("mtp."))


SGLANG_MTP_PARAMS = {  # Qwen3_5ForCausalLMMTP.named_parameters() for a dense 1-layer head
    "fc.weight",
    "pre_fc_norm_embedding.weight",
    "pre_fc_norm_hidden.weight",
    "model.norm.weight",
    "model.layers.0.qkv_proj.weight",
    "model.layers.0.o_proj.weight",
    "model.layers.0.q_norm.weight",
    "model.layers.0.k_norm.weight",
    "model.layers.0.mlp.gate_up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.post_attention_layernorm.weight",
}


def sglang_mtp_name(name):
    """The destination parameter of checkpoint key ``name`` in SGLang 0.5.23
    Qwen3_5ForCausalLMMTP.load_weights (dense, non-expert path), mirrored string for string."""
    name = (
        name.replace("mtp.", "model.").replace("model.fc", "fc").replace("model.pre_fc", "pre_fc")
    )
    name = name.replace(".self_attn", "")
    for param, shard in (
        ("qkv_proj", "q_proj"),
        ("qkv_proj", "k_proj"),
        ("qkv_proj", "v_proj"),
        ("gate_up_proj", "gate_proj"),
        ("gate_up_proj", "up_proj"),
    ):
        if shard in name:
            return name.replace(shard, param)
    return name
