"""The real-scale shapes (``e2e/shapes.py``) are what the notes measured and what SGLang will load.

Every target and drafter ``config.json`` is parsed by transformers' config classes and by SGLang
0.5.23's own (``ModelConfig`` for the target, its MTP draft and the DFlash drafter; the DFlash
fields through ``parse_dflash_draft_config``), and checked against the drafter validation of this
package. The weight sizes are counted on the meta device: the Qwen3.6-27B shape must come out at the
50.1 GiB target / 3.2 GiB drafter that SGLang reported on the H200 (shared/notes/scale-2026-11-30.md).
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from e2e.shapes import SHAPES, drafter_config, target_config, write_model_dirs
from sglang_spec.dflash import DFlashConfig, DFlashDrafter, validate_drafter_config

# shape: (layers, hidden, heads, kv heads, head_dim, intermediate, vocab, GDN layers, GDN v heads)
EXPECTED = {
    "qwen3.6-27b": (64, 5120, 24, 4, 256, 17408, 248320, 48, 48),
    "qwen3.5-4b": (32, 2560, 16, 4, 256, 9216, 248320, 24, 32),
    "qwen3-8b": (36, 4096, 32, 8, 128, 12288, 151936, 0, 0),
}
GIB = 2**30


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    return {name: write_model_dirs(shape, root) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("name", list(SHAPES))
def test_transformers_reads_the_target(name, dirs):
    target, _ = dirs[name]
    cfg = AutoConfig.from_pretrained(target)
    layers, hidden, heads, kv, hd, inter, vocab, n_gdn, gdn_v = EXPECTED[name]
    assert type(cfg).__name__ == ("Qwen3_5TextConfig" if SHAPES[name].hybrid else "Qwen3Config")
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads) == (
        layers,
        hidden,
        heads,
    )
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.intermediate_size) == (kv, hd, inter)
    assert cfg.vocab_size == vocab
    assert cfg.layer_types.count("linear_attention") == n_gdn
    # The real checkpoints' MTP field (SGLang's NEXTN draft always builds one MTP layer).
    assert getattr(cfg, "mtp_num_hidden_layers", 0) == (1 if SHAPES[name].has_mtp else 0)
    if n_gdn:
        assert cfg.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
        assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (16, gdn_v)
        assert cfg.rope_parameters["rope_theta"] == 1e7
        assert cfg.rope_parameters["partial_rotary_factor"] == 0.25


@pytest.mark.parametrize("name", list(SHAPES))
def test_sglang_reads_target_mtp_and_drafter(name, dirs):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config
    from sglang.srt.utils.hf_transformers.common import get_rope_config

    target, drafter = dirs[name]
    shape = SHAPES[name]
    layers, hidden, *_, n_gdn, gdn_v = EXPECTED[name]
    m = ModelConfig(str(target), trust_remote_code=False, context_length=4096)
    assert m.hf_config.architectures == [
        "Qwen3_5ForCausalLM" if shape.hybrid else "Qwen3ForCausalLM"
    ]
    assert m.num_hidden_layers == layers and m.context_len == 4096
    if shape.hybrid:
        assert type(m.hf_config).__module__ == "sglang.srt.configs.qwen3_5"
        assert len(m.hf_config.linear_layer_ids) == n_gdn
        assert m.hf_config.full_attention_layer_ids == list(range(3, layers, 4))
        assert get_rope_config(m.hf_config)[0] == 1e7
        mtp = ModelConfig(
            str(target), trust_remote_code=False, is_draft_model=True, speculative_algorithm="NEXTN"
        )
        assert mtp.hf_config.architectures == ["Qwen3_5ForCausalLMMTP"]
    d = ModelConfig(
        str(drafter), trust_remote_code=True, is_draft_model=True, speculative_algorithm="DFLASH"
    )
    assert d.hf_config.architectures == ["DFlashDraftModel"] and d.num_hidden_layers == 5
    p = parse_dflash_draft_config(draft_hf_config=d.hf_config)
    assert p.block_size == 16 and p.num_target_layers == layers
    assert p.mask_token_id == shape.mask_token_id < shape.vocab
    assert p.resolve_target_layer_ids(target_num_layers=layers) == p.target_layer_ids


@pytest.mark.parametrize("name", list(SHAPES))
def test_drafter_passes_this_packages_validation(name, dirs):
    target, drafter = dirs[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a suspicious setting (e.g. a mask id among text ids) fails
        found = validate_drafter_config(
            json.loads((drafter / "config.json").read_text()), AutoConfig.from_pretrained(target)
        )
    assert found == []


def _params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_qwen36_27b_weighs_what_sglang_loaded_on_the_h200():
    shape = SHAPES["qwen3.6-27b"]
    cfg = AutoConfig.for_model(**{k: v for k, v in target_config(shape).items()})
    with torch.device("meta"):
        target = AutoModelForCausalLM.from_config(cfg)
        drafter = DFlashDrafter(DFlashConfig.from_dict(drafter_config(shape)), target)
    assert round(2 * _params(target) / GIB, 1) == 50.1  # bf16 bytes, MTP layer not loaded
    assert round(2 * _params(drafter) / GIB, 1) == 3.2  # embedding and LM head are the target's
    assert drafter_config(shape)["dflash_config"]["target_layer_ids"] == [1, 16, 31, 46, 61]
    assert drafter_config(shape)["dflash_config"]["mask_token_id"] == 248077


def test_model_dirs_hold_only_config_json(dirs):
    for target, drafter in dirs.values():
        assert [p.name for p in target.iterdir()] == ["config.json"]
        assert [p.name for p in drafter.iterdir()] == ["config.json"]
