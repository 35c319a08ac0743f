"""End-to-end smoke test of the fixture trainer ``python -m training`` (--tiny --device cpu): every
stage runs, and every output reloads (tokenizer, both targets via transformers, the MTP weights under
SGLang's names, both drafters via DFlashDrafter.from_pretrained). Checks plumbing, not quality."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from training import cli, config, corpus, export, models

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("tiny_pair"))
    threads = torch.get_num_threads()
    try:
        assert cli.main(["--out", d, "--device", "cpu", "--tiny", "--stage", "all"]) == 0
    finally:
        torch.set_num_threads(threads)
    return d


def test_heldout_modules_not_trained():
    train, val, held = corpus.corpus_files()
    names = {os.path.relpath(p, corpus.stdlib_root()) for p in train + val}
    assert len(held) == len(config.HELDOUT_MODULES) >= 8
    assert not names & set(config.HELDOUT_MODULES)
    assert not any(part in config.EXCLUDE_DIRS for n in names for part in n.split(os.sep)[:-1])


def test_layout_and_record(out):
    for sub in ("tokenizer", "hybrid", "hybrid-dflash", "qwen3", "qwen3-dflash"):
        assert os.path.isdir(os.path.join(out, sub)), sub
    rec = json.load(open(os.path.join(out, "train_config.json")))
    assert rec["seed"] == 1234 and rec["heldout_modules"] == config.HELDOUT_MODULES
    for stage in config.COMPONENTS:
        assert stage in rec["stages"], stage
    for stage in ("hybrid", "mtp", "hybrid-dflash", "qwen3", "qwen3-dflash"):
        s = rec["stages"][stage]
        assert s["steps_run"] == s["steps_planned"] and not s.get("stale")
        assert all(v == v for v in s["final"].values())  # no NaN
    assert rec["stages"]["tokenizer"]["versions"]["python"]
    assert rec["checks"]["total_bytes"] < 20_000_000
    prompts = [json.loads(line) for line in open(os.path.join(out, "heldout_prompts.jsonl"))]
    assert 30 <= len(prompts) <= 60
    assert {p["module"] + ".py" for p in prompts} <= set(config.HELDOUT_MODULES)
    assert all(p["prompt"].startswith(("def ", "async def ")) for p in prompts)
    assert any("." in p["qualname"] for p in prompts)  # methods too, not only functions
    for p in prompts:  # a module-level function's prompt + reference is its source text
        if "." not in p["qualname"]:
            src = open(os.path.join(corpus.stdlib_root(), p["module"] + ".py")).read()
            assert p["prompt"] + p["reference"] in src, p["id"]


def test_reload_transformers(out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.join(out, "hybrid"))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.startswith("<|im_start|>user\nhi<|im_end|>") and text.endswith(
        "<|im_start|>assistant\n"
    )
    mask = tok.convert_tokens_to_ids("<|MASK|>")
    assert mask in tok.all_special_ids
    for kind, cls in (("hybrid", "Qwen3_5ForCausalLM"), ("qwen3", "Qwen3ForCausalLM")):
        m, info = AutoModelForCausalLM.from_pretrained(
            os.path.join(out, kind), output_loading_info=True
        )
        assert type(m).__name__ == cls and not info["missing_keys"]
        assert m.config.tie_word_embeddings and m.dtype == torch.bfloat16
        ids = torch.tensor([tok("def f(x):\n    return x")["input_ids"]])
        with torch.no_grad():
            assert torch.isfinite(m(input_ids=ids).logits.float()).all()
    cfg = json.load(open(os.path.join(out, "hybrid", "config.json")))
    assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + [
        "linear_attention"
    ] * 3 + ["full_attention"]
    assert cfg["full_attention_interval"] == 4 and cfg["mtp_num_hidden_layers"] == 1


def test_mtp_weights_in_sglang_layout(out):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    path = os.path.join(out, "hybrid")
    with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
        keys = [k for k in f.keys() if k.startswith("mtp.")]
        sd = {k[len("mtp.") :]: f.get_tensor(k).float() for k in keys}
    assert {export.sglang_mtp_name(k) for k in keys} == export.SGLANG_MTP_PARAMS
    target = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    mtp = models.Qwen35MTP(target.config)
    mtp.load_state_dict(sd, strict=True)
    models.check_causal(mtp, target.config.hidden_size, torch.device("cpu"))
    x = torch.randint(4, target.config.vocab_size, (1, 12))
    with torch.no_grad():
        lg, tl = models.mtp_forward(mtp, target, x)
    assert lg.shape == (1, 11, target.config.vocab_size) and torch.isfinite(lg).all()


def test_reload_drafters(out):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_spec.dflash import DFlashDrafter

    for kind in ("hybrid", "qwen3"):
        target = AutoModelForCausalLM.from_pretrained(os.path.join(out, kind), dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(os.path.join(out, kind))
        d = DFlashDrafter.from_pretrained(
            os.path.join(out, f"{kind}-dflash"), target, tokenizer=tok
        )
        assert d.mask_token_id == tok.convert_tokens_to_ids("<|MASK|>")
        assert max(d.target_layer_ids) < target.config.num_hidden_layers - 1
        x = torch.tensor([tok("def g(a, b):\n    return a + b\n")["input_ids"]])
        n, B = x.shape[1], d.block_size
        with torch.no_grad():
            o = target(input_ids=x, output_hidden_states=True)
            ctx = d.project_context(d.select_features(o.hidden_states))
            q = torch.full((1, B), d.mask_token_id)
            q[0, 0] = o.logits[0, -1].argmax()
            h = d(q, torch.arange(n, n + B)[None], ctx, torch.arange(n)[None])
            assert torch.isfinite(d.logits(h)).all()


def test_entry_point_rejects_unknown_stage_before_work(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run(
        [sys.executable, "-m", "training", "--out", str(out), "--stage", "tokenizer+nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1 and "unknown stage 'nope'" in r.stderr, r.stderr
    assert not out.exists()


def test_set_overrides_existing_keys_only():
    S = copy.deepcopy(config.TINY)
    config.apply_override(S, "train.hybrid-dflash.lr=0.01")
    config.apply_override(S, "hybrid_layer_ids=[0, 2]")
    assert S["train"]["hybrid-dflash"]["lr"] == 0.01 and S["hybrid_layer_ids"] == [0, 2]
    with pytest.raises(SystemExit, match="no setting 'train.hybrid-dflash.lrr'"):
        config.apply_override(S, "train.hybrid-dflash.lrr=1")
    with pytest.raises(SystemExit, match="is not JSON"):
        config.apply_override(S, "block_size=eight")
