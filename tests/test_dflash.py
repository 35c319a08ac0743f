"""Tests for sglang_spec.dflash: config validation, z-lab checkpoint layout, and the cached drafting
path against the explicit forward, on tiny random Qwen3 / Qwen3.5 (GDN hybrid) targets (CPU, fp32)."""

import copy
import json
import os
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5ForCausalLM

from sglang_spec.dflash import (
    DFlashDrafter,
    DrafterConfigError,
    DrafterConfigWarning,
    default_target_layer_ids,
    validate_drafter_config,
)

# Most configs here deliberately use ids other than SGLang's default; that warning is tested below.
pytestmark = pytest.mark.filterwarnings("ignore::sglang_spec.dflash.DrafterConfigWarning")

V, H, L, MASK = 300, 64, 4, 299
SPECIAL = {"<|endoftext|>": 280, "<|im_start|>": 281, "<|im_end|>": 282}


def make_target(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=V,
        hidden_size=H,
        intermediate_size=128,
        num_hidden_layers=L,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        bos_token_id=280,
        eos_token_id=282,
        tie_word_embeddings=False,
    )
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**common)).eval()
    cfg = Qwen3_5TextConfig(
        **common,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    )
    return Qwen3_5ForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def targets():
    return {kind: make_target(kind) for kind in ("qwen3", "qwen35")}


def drafter_cfg(**top) -> dict:
    """A z-lab style config (as in make_tiny_variants.py): 1 sliding (window 3) + 1 full layer."""
    cfg = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": 4,
        "dflash_config": {"mask_token_id": MASK, "target_layer_ids": [0, 1, 2]},
        "num_target_layers": L,
        "hidden_size": H,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": V,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 512,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "attention_bias": False,
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 3,
        "use_sliding_window": True,
    }
    cfg.update(top)
    return cfg


def make_drafter(target, cfg=None, seed=1) -> DFlashDrafter:
    torch.manual_seed(seed)
    d = DFlashDrafter.from_config(cfg or drafter_cfg(), target)
    with torch.no_grad():  # norms start at 1; perturb so a wrong weight mapping cannot go unnoticed
        for name, p in d.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.3 * torch.randn_like(p))
    return d.eval()


def tokenizer() -> PreTrainedTokenizerFast:
    vocab = {f"t{i}": i for i in range(280)} | SPECIAL
    tok = Tokenizer(WordLevel(vocab, unk_token="t0"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )


def features(target, drafter, n=12, bs=2, seed=3):
    torch.manual_seed(seed)
    ids = torch.randint(0, 280, (bs, n))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    return drafter.select_features(hs), torch.arange(n).expand(bs, n)


def block(drafter, bonus):
    ids = torch.full((len(bonus), drafter.block_size), MASK)
    ids[:, 0] = bonus
    return ids


# ---- layout / ownership ---------------------------------------------------------------------


def test_state_dict_matches_zlab_layout_and_excludes_target(targets):
    target = targets["qwen3"]
    d = make_drafter(target)
    per_layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
    ]
    expected = {"fc.weight", "hidden_norm.weight", "norm.weight"} | {
        f"layers.{i}.{k}" for i in range(2) for k in per_layer
    }
    sd = d.state_dict()
    assert set(sd) == expected
    assert sd["fc.weight"].shape == (H, 3 * H)
    assert sd["layers.0.self_attn.k_proj.weight"].shape == (2 * 16, H)
    own = {id(p) for p in d.parameters()}
    assert not own & {id(p) for p in target.parameters()}
    assert sum(p.numel() for p in d.parameters()) == sum(v.numel() for v in sd.values())


def test_training_updates_only_drafter(targets):
    target = targets["qwen3"]
    d = make_drafter(target).train()
    f, pos = features(target, d)
    frozen = {k: v.clone() for k, v in target.state_dict().items()}
    opt = torch.optim.SGD(d.parameters(), lr=0.1)
    h = d(
        block(d, torch.tensor([5, 6])),
        torch.full((2, 1), 12) + torch.arange(4),
        d.project_context(f),
        pos,
    )
    d.logits(h).logsumexp(-1).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in d.parameters())
    before = {k: v.clone() for k, v in d.state_dict().items()}
    opt.step()
    target.zero_grad(set_to_none=True)
    assert all(torch.equal(v, target.state_dict()[k]) for k, v in frozen.items())
    assert not any(torch.equal(v, d.state_dict()[k]) for k, v in before.items())


# ---- persistence ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3", "qwen35"])
def test_save_load_roundtrip(targets, kind, tmp_path):
    target = targets[kind]
    d = make_drafter(target)
    d.save_pretrained(tmp_path)
    assert set(load_file(tmp_path / "model.safetensors")) == set(d.state_dict())
    assert json.loads((tmp_path / "config.json").read_text()) == drafter_cfg()
    loaded = DFlashDrafter.from_pretrained(str(tmp_path), target).eval()
    f, pos = features(target, d)
    outs = []
    for m in (d, loaded):
        cache = m.new_cache(2)
        m.append_context(cache, f, pos)
        outs.append(m.draft_logits(cache, torch.tensor([5, 9]), torch.tensor([12, 12])))
    assert torch.equal(outs[0], outs[1])


def zlab_checkpoint(path, cfg, prefix="", drop=None, extra=None, fc_in=3 * H):
    """Write a bf16 checkpoint the way make_tiny_variants.py lays it out."""

    def g(*s):
        return (torch.randn(*s) * 0.02).to(torch.bfloat16)

    sd = {"fc.weight": g(H, fc_in), "hidden_norm.weight": g(H), "norm.weight": g(H)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        sd |= {
            p + "self_attn.q_proj.weight": g(64, H),
            p + "self_attn.k_proj.weight": g(32, H),
            p + "self_attn.v_proj.weight": g(32, H),
            p + "self_attn.o_proj.weight": g(H, 64),
            p + "self_attn.q_norm.weight": g(16),
            p + "self_attn.k_norm.weight": g(16),
            p + "mlp.gate_proj.weight": g(96, H),
            p + "mlp.up_proj.weight": g(96, H),
            p + "mlp.down_proj.weight": g(H, 96),
            p + "input_layernorm.weight": g(H),
            p + "post_attention_layernorm.weight": g(H),
        }
    sd.pop(drop, None)
    sd |= extra or {}
    os.makedirs(path, exist_ok=True)
    save_file({prefix + k: v for k, v in sd.items()}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as fh:
        json.dump(cfg, fh)
    return sd


def test_loads_zlab_bf16_checkpoint_into_target_dtype(targets, tmp_path):
    torch.manual_seed(4)
    sd = zlab_checkpoint(tmp_path, drafter_cfg(), prefix="model.")
    d = DFlashDrafter.from_pretrained(str(tmp_path), targets["qwen3"])
    assert d.fc.weight.dtype == torch.float32
    for k, v in d.state_dict().items():
        assert torch.equal(v, sd[k].float()), k


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            dict(drop="layers.1.mlp.up_proj.weight"),
            "missing weights ['layers.1.mlp.up_proj.weight']",
        ),
        (
            dict(extra={"lm_head.weight": torch.zeros(V, H)}),
            "unexpected weights ['lm_head.weight']",
        ),
        (dict(fc_in=2 * H), "fc.weight has shape (64, 128)"),
    ],
)
def test_checkpoint_mismatch_is_refused(targets, tmp_path, change, needle):
    zlab_checkpoint(tmp_path, drafter_cfg(), **change)
    with pytest.raises(DrafterConfigError) as e:
        DFlashDrafter.from_pretrained(str(tmp_path), targets["qwen3"])
    assert needle in str(e.value)


def test_trained_mask_embedding_is_refused(targets, tmp_path):
    zlab_checkpoint(tmp_path, drafter_cfg())
    torch.save({"embedding": torch.zeros(H), "mask_token_id": MASK}, tmp_path / "mask_embedding.pt")
    with pytest.raises(DrafterConfigError, match="mask_embedding.pt"):
        DFlashDrafter.from_pretrained(str(tmp_path), targets["qwen3"])


# ---- cached path == forward ------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["qwen3", "qwen35"])
@pytest.mark.parametrize("chunks", [[12], [3, 4, 5], [1] * 12])
def test_cached_draft_equals_forward(targets, kind, chunks):
    target = targets[kind]
    d = make_drafter(target)
    f, pos = features(target, d)
    bonus, start = torch.tensor([5, 9]), torch.tensor([12, 12])
    with torch.no_grad():
        q_pos = start[:, None] + torch.arange(4)
        ref = d.logits(d(block(d, bonus), q_pos, d.project_context(f), pos)[:, 1:])
        cache, at = d.new_cache(2), 0
        for n in chunks:
            d.append_context(cache, f[:, at : at + n], pos[:, at : at + n])
            at += n
        before = [k.clone() for k in cache.keys], cache.positions.clone()
        out = d.draft_logits(cache, bonus, start)
    assert out.shape == (2, 3, V)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(before[0], cache.keys)) and torch.equal(
        before[1], cache.positions
    )


def test_crop_then_reappend_and_padding(targets):
    target = targets["qwen3"]
    d = make_drafter(target)
    f, pos = features(target, d)
    with torch.no_grad():
        cache = d.new_cache(2)
        d.append_context(cache, f, pos)
        d.crop_context(cache, 7)
        assert cache.length == 7
        d.append_context(cache, f[:, 7:10], pos[:, 7:10])
        fresh = d.new_cache(2)
        d.append_context(fresh, f[:, :10], pos[:, :10])
        a = d.draft_logits(cache, torch.tensor([1, 2]), torch.tensor([10, 10]))
        torch.testing.assert_close(
            a,
            d.draft_logits(fresh, torch.tensor([1, 2]), torch.tensor([10, 10])),
            atol=1e-6,
            rtol=0,
        )
        # Row 1 has one token less: its last entry is padding (position -1) and must be ignored.
        padded = d.new_cache(2)
        d.append_context(
            padded, f[:, :10], torch.stack([pos[0, :10], torch.tensor([*range(9), -1])])
        )
        b = d.draft_logits(padded, torch.tensor([1, 2]), torch.tensor([10, 9]))
        short = d.new_cache(1)
        d.append_context(short, f[1:, :9], pos[1:, :9])
        torch.testing.assert_close(
            b[1:], d.draft_logits(short, torch.tensor([2]), torch.tensor([9])), atol=1e-5, rtol=0
        )
        torch.testing.assert_close(b[:1], a[:1], atol=1e-6, rtol=0)


def test_training_mask_with_many_anchors_matches_cached_drafts(targets):
    """One forward over a sequence with anchors at 4 and 8 == two separate cached drafts."""
    target = targets["qwen3"]
    d = make_drafter(target)
    f, pos = features(target, d, bs=1)
    seq = torch.randint(0, 280, (1, 12), generator=torch.Generator().manual_seed(5))
    anchors, B = [4, 8], d.block_size
    q_ids = torch.cat([block(d, seq[:, a]) for a in anchors], 1)
    q_pos = torch.cat([a + torch.arange(B) for a in anchors])[None]
    mask = torch.zeros(1, 1, 2 * B, 12 + 2 * B, dtype=torch.bool)
    for j, a in enumerate(anchors):
        mask[0, 0, j * B : (j + 1) * B, :a] = True  # committed context
        mask[0, 0, j * B : (j + 1) * B, 12 + j * B : 12 + (j + 1) * B] = True  # own block
    with torch.no_grad():
        h = d(q_ids, q_pos, d.project_context(f), pos, attention_mask=mask)
        for j, a in enumerate(anchors):
            cache = d.new_cache(1)
            d.append_context(cache, f[:, :a], pos[:, :a])
            ref = d.draft_logits(cache, seq[:, a], torch.tensor([a]))
            torch.testing.assert_close(
                d.logits(h[:, j * B + 1 : (j + 1) * B]), ref, atol=1e-5, rtol=0
            )
        with pytest.raises(ValueError, match="attention_mask must be bool"):
            d(q_ids, q_pos, d.project_context(f), pos, attention_mask=mask.float())


# ---- attention semantics ----------------------------------------------------------------------


def _draft_hidden(d, f, pos, q_ids, start=12):
    with torch.no_grad():
        return d(
            q_ids,
            start + torch.arange(d.block_size).expand(len(q_ids), -1),
            d.project_context(f),
            pos,
        )


def test_sliding_window_is_causal_with_window_left_w_minus_1(targets):
    """All-sliding drafter, window 3: block row i at position s+i sees keys at positions
    s+i-2 .. s+i. So the block depends on ctx position s-2 but not s-3, and row i not on rows > i."""
    target = targets["qwen3"]
    d = make_drafter(target, drafter_cfg(layer_types=["sliding_attention"] * 2))
    f, pos = features(target, d)
    q = block(d, torch.tensor([5, 9]))
    base = _draft_hidden(d, f, pos, q)
    far = f.clone()
    far[:, :10] += 1.0  # positions 0..9 = up to s-3
    assert torch.equal(_draft_hidden(d, far, pos, q), base)
    edge = f.clone()
    edge[:, 10] += 1.0  # position s-2 = 10: inside query 0's window
    changed = (_draft_hidden(d, edge, pos, q) - base).abs().amax(-1)
    assert (changed[:, 0] > 1e-4).all()
    q2 = q.clone()
    q2[:, 2] = 7  # a later block token cannot influence earlier rows
    diff = (_draft_hidden(d, f, pos, q2) - base).abs().amax(-1)
    assert torch.equal(diff[:, :2], torch.zeros(2, 2)) and (diff[:, 2] > 1e-4).all()


def test_full_layer_is_non_causal_and_sees_all_context(targets):
    target = targets["qwen3"]
    d = make_drafter(target, drafter_cfg(layer_types=["full_attention"] * 2))
    f, pos = features(target, d)
    q = block(d, torch.tensor([5, 9]))
    base = _draft_hidden(d, f, pos, q)
    far = f.clone()
    far[:, 0] += 1.0
    assert ((_draft_hidden(d, far, pos, q) - base).abs().amax(-1) > 1e-4).all()
    q2 = q.clone()
    q2[:, 3] = 7  # the last block token is visible to row 0
    assert ((_draft_hidden(d, f, pos, q2) - base)[:, 0].abs().amax(-1) > 1e-4).all()


def test_mixed_layers_window_matters(targets):
    """The sliding+full drafter differs from the same weights run all-full, once ctx exceeds the window."""
    target = targets["qwen3"]
    mixed = make_drafter(target)
    full = make_drafter(target, drafter_cfg(layer_types=["full_attention"] * 2))
    full.load_state_dict(mixed.state_dict())
    f, pos = features(target, mixed)
    q = block(mixed, torch.tensor([5, 9]))
    assert (_draft_hidden(mixed, f, pos, q) - _draft_hidden(full, f, pos, q)).abs().max() > 1e-3


def test_select_features_takes_layer_outputs(targets):
    target = targets["qwen35"]
    d = make_drafter(target)
    ids = torch.randint(0, 280, (1, 5))
    with torch.no_grad():
        hs = target(ids, output_hidden_states=True).hidden_states
    assert torch.equal(d.select_features(hs), torch.cat([hs[1], hs[2], hs[3]], -1))
    with pytest.raises(ValueError, match="expected 5 hidden states"):
        d.select_features(hs[:-1])


def test_rope_variants(targets):
    target = targets["qwen3"]
    f, pos = features(target, make_drafter(target))
    q = block(make_drafter(target), torch.tensor([5, 9]))
    nested = drafter_cfg(rope_parameters={"rope_theta": 10000.0, "rope_type": "default"})
    del nested["rope_theta"]
    yarn = drafter_cfg(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    )
    outs = [
        _draft_hidden(make_drafter(target, c), f, pos, q) for c in (drafter_cfg(), nested, yarn)
    ]
    assert torch.equal(outs[0], outs[1])
    assert (outs[0] - outs[2]).abs().max() > 1e-3
    assert make_drafter(target, yarn)._rotary[0].attention_scaling > 1.0


# ---- config: block size, validation errors, warnings --------------------------------------------


@pytest.mark.parametrize("top, nested, expected", [(6, None, 6), (None, 6, 6), (6, 6, 6)])
def test_block_size_top_level_or_nested(targets, top, nested, expected):
    cfg = drafter_cfg()
    del cfg["block_size"]
    if top is not None:
        cfg["block_size"] = top
    if nested is not None:
        cfg["dflash_config"]["block_size"] = nested
    d = make_drafter(targets["qwen3"], cfg)
    assert d.block_size == expected
    cache = d.new_cache(1)
    d.append_context(cache, torch.randn(1, 3, 3 * H), torch.arange(3)[None])
    assert d.draft_logits(cache, torch.tensor([1]), torch.tensor([3])).shape == (1, expected - 1, V)


def _set(path, value):
    def apply(cfg):
        *parents, leaf = path.split(".")
        node = cfg
        for p in parents:
            node = node[p]
        if value is _DEL:
            del node[leaf]
        else:
            node[leaf] = value

    return apply


_DEL = object()
ERRORS = [
    ("dflash_config.mask_token_id", _DEL, "mask_token_id is missing"),
    (
        "dflash_config.mask_token_id",
        300,
        "mask_token_id=300 is outside the target vocab; valid: [0, 300)",
    ),
    ("dflash_config.mask_token_id", -1, "mask_token_id=-1 is out of range"),
    ("dflash_config.mask_token_id", "299", "mask_token_id='299' must be an integer"),
    ("dflash_config.target_layer_ids", _DEL, "target_layer_ids=None must be a non-empty list"),
    ("dflash_config.target_layer_ids", [], "target_layer_ids=[] must be a non-empty list"),
    (
        "dflash_config.target_layer_ids",
        [0, 1, 1],
        "target_layer_ids=[0, 1, 1] must be unique, strictly increasing",
    ),
    (
        "dflash_config.target_layer_ids",
        [2, 1],
        "target_layer_ids=[2, 1] must be unique, strictly increasing",
    ),
    (
        "dflash_config.target_layer_ids",
        [0, 3],
        "target_layer_ids[1]=3 is out of range; valid: unique, strictly increasing ints in [0, 3)",
    ),
    ("dflash_config.target_layer_ids", [-1, 0], "target_layer_ids[0]=-1 is out of range"),
    ("num_target_layers", 5, "num_target_layers=5 does not match the target's num_hidden_layers=4"),
    ("num_target_layers", _DEL, "num_target_layers is missing"),
    ("block_size", 1, "block_size=1 is out of range; valid: >= 2"),
    ("block_size", _DEL, "block_size is missing"),
    (
        "dflash_config.block_size",
        8,
        "block_size differs between top level (4) and dflash_config (8)",
    ),
    (
        "layer_types",
        ["full_attention"] * 3,
        "layer_types=['full_attention', 'full_attention', 'full_attention'] must be a list with one entry per draft layer (num_hidden_layers=2)",
    ),
    (
        "layer_types",
        ["full_attention", "chunked_attention"],
        "layer_types[1]='chunked_attention' is not supported",
    ),
    ("sliding_window", _DEL, "needs a positive integer sliding_window; got sliding_window=None"),
    ("sliding_window", 0, "needs a positive integer sliding_window; got sliding_window=0"),
    ("use_sliding_window", False, "got sliding_window=3 with use_sliding_window=False"),
    ("hidden_size", 32, "hidden_size=32 does not match the target's hidden_size=64"),
    ("vocab_size", 512, "vocab_size=512 does not match the target's vocab_size=300"),
    ("dflash_config.conv_kernel_size", 2, "dflash_config.conv_kernel_size=2 is not supported"),
    ("is_causal", False, "is_causal=False with sliding_attention layers is not supported"),
    ("hidden_act", "gelu", "hidden_act='gelu' is not supported"),
]


@pytest.mark.parametrize(
    "path, value, needle",
    ERRORS,
    ids=[f"{p}={v if v is not _DEL else 'missing'}" for p, v, _ in ERRORS],
)
def test_validation_errors(targets, path, value, needle):
    cfg = copy.deepcopy(drafter_cfg())
    if path == "hidden_size":  # keep the drafter self-consistent so only the target check can fire
        cfg["head_dim"] = 8
    _set(path, value)(cfg)
    for target in targets.values():
        with pytest.raises(DrafterConfigError) as e:
            validate_drafter_config(cfg, target.config)
        assert needle in str(e.value)
        with pytest.raises(DrafterConfigError):
            DFlashDrafter.from_config(cfg, target)


def test_mask_token_conflicting_with_tokenizer(targets):
    tok = tokenizer()
    tok.add_special_tokens({"mask_token": "<|MASK|>"})  # gets id 283, config says 299
    with pytest.raises(
        DrafterConfigError,
        match=r"mask_token_id=299 conflicts with the tokenizer: mask_token='<\|MASK\|>' has id 283",
    ):
        validate_drafter_config(drafter_cfg(), targets["qwen3"].config, tok)


def _default_ids_cfg(**dflash):
    return drafter_cfg(
        num_hidden_layers=1,
        layer_types=["full_attention"],
        dflash_config={"mask_token_id": MASK, "target_layer_ids": [2]} | dflash,
    )


def test_clean_config_has_no_warnings(targets):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            validate_drafter_config(_default_ids_cfg(), targets["qwen3"].config, tokenizer()) == []
        )


@pytest.mark.parametrize("use_tokenizer", [False, True])
def test_warns_mask_below_first_special(targets, use_tokenizer):
    with pytest.warns(
        DrafterConfigWarning,
        match="mask_token_id=5 lies below the target's first special token id 280",
    ):
        found = validate_drafter_config(
            _default_ids_cfg(mask_token_id=5),
            targets["qwen3"].config,
            tokenizer() if use_tokenizer else None,
        )
    assert len(found) == (2 if use_tokenizer else 1)


def test_warns_mask_is_ordinary_text_token(targets):
    # 285 lies above every special token, yet the tokenizer maps it to plain text "t285".
    tok = tokenizer()
    tok.add_tokens(["w1", "w2", "w3"])  # ordinary added tokens 283..285
    cfg = _default_ids_cfg(mask_token_id=285)
    with pytest.warns(
        DrafterConfigWarning, match="mask_token_id=285 is the ordinary text token 'w3'"
    ):
        validate_drafter_config(cfg, targets["qwen3"].config, tok)


def test_warns_target_layer_ids_not_default(targets):
    with pytest.warns(
        DrafterConfigWarning,
        match=r"target_layer_ids=\[1\] differs from SGLang's evenly-spread default \[2\]",
    ):
        found = validate_drafter_config(
            _default_ids_cfg(target_layer_ids=[1]), targets["qwen3"].config
        )
    assert len(found) == 1


def test_default_target_layer_ids_formula():
    assert default_target_layer_ids(36, 5) == [1, 9, 17, 25, 33]  # Qwen3-8B-DFlash-b16's ids
    assert default_target_layer_ids(4, 1) == [2]
    assert default_target_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert default_target_layer_ids(7, 3) == [1, 2, 4]  # 2.5 rounds to even, as in SGLang
