"""Reload checks run at the end of every invocation on whatever exists in --out: the tokenizer, both
targets, the MTP head (SGLang's parameter names and a strict reload) and both drafters (one draft
block each), plus the fixtures' total size (20 MB limit)."""

from __future__ import annotations

import json
import os

import torch

from training.export import SGLANG_MTP_PARAMS, sglang_mtp_name
from training.models import Qwen35MTP, drafter_class, mtp_forward
from training.runtime import log


def check_outputs(out, args):
    """Reload everything in ``out`` on the CPU (tokenizer round trip, targets through transformers, the
    MTP weights under SGLang's names and strictly into ``Qwen35MTP``, drafters through
    ``--drafter-impl``) and measure the total size; returns the results recorded as ``checks``."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    results = {}
    tdir = os.path.join(out, "tokenizer")
    if os.path.isdir(tdir):
        tok = AutoTokenizer.from_pretrained(tdir)
        text = tok.apply_chat_template(
            [{"role": "user", "content": "def f(x):\n    return x"}],
            tokenize=False,
            add_generation_prompt=True,
        )
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text, "tokenizer round trip"
        assert tok.convert_tokens_to_ids("<|MASK|>") == tok.get_vocab()["<|MASK|>"]
        results["tokenizer"] = {
            "class": type(tok).__name__,
            "len": len(tok),
            "eos": tok.eos_token_id,
            "mask_id": tok.convert_tokens_to_ids("<|MASK|>"),
        }
        log(f"check tokenizer: {results['tokenizer']}")
    for kind in ("hybrid", "qwen3"):
        path = os.path.join(out, kind)
        if not os.path.exists(os.path.join(path, "model.safetensors")):
            continue
        tok = AutoTokenizer.from_pretrained(path)
        m, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
        assert not info["missing_keys"], f"{kind}: missing keys {info['missing_keys']}"
        assert m.lm_head.weight.data_ptr() == m.model.embed_tokens.weight.data_ptr(), (
            f"{kind}: lm_head not tied"
        )
        with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
            keys = list(f.keys())
            dtypes = {str(f.get_slice(k).get_dtype()) for k in keys}
        mtp_keys = sorted(k for k in keys if k.startswith("mtp."))
        r = {
            "class": type(m).__name__,
            "unexpected_reported": sorted(info["unexpected_keys"]),
            "safetensors_dtypes": sorted(dtypes),
            "mtp_keys": len(mtp_keys),
        }
        x = torch.tensor([tok("def add(a, b):\n    return")["input_ids"]])
        with torch.no_grad():
            lg = m(input_ids=x).logits.float()
        assert torch.isfinite(lg).all()
        r["greedy_next"] = tok.decode(lg[0, -1].argmax().item())
        if mtp_keys:
            dest = {sglang_mtp_name(k) for k in mtp_keys}
            assert dest == SGLANG_MTP_PARAMS, (
                f"mtp keys map to {sorted(dest ^ SGLANG_MTP_PARAMS)} in SGLang"
            )
            mtp = Qwen35MTP(m.config)
            with safe_open(os.path.join(path, "model.safetensors"), "pt") as f:
                sd = {k[4:]: f.get_tensor(k).float() for k in mtp_keys}
            mtp.load_state_dict(sd, strict=True)
            with torch.no_grad():
                m.float()
                mlog, tlog = mtp_forward(mtp, m, x)
            r["mtp_reload"] = (
                "ok (strict; SGLang name mapping covers every Qwen3_5ForCausalLMMTP param)"
            )
        results[kind] = r
        log(f"check {kind}: {r}")
        dpath = os.path.join(out, f"{kind}-dflash")
        if os.path.exists(os.path.join(dpath, "model.safetensors")):
            Drafter = drafter_class(args.drafter_impl)
            m = m.float()
            d = Drafter.from_pretrained(dpath, m, dtype=torch.float32, tokenizer=tok)
            cfg = json.load(open(os.path.join(dpath, "config.json")))
            with safe_open(os.path.join(dpath, "model.safetensors"), "pt") as f:
                ddt = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
            n = x.shape[1]
            B = cfg["block_size"]
            with torch.no_grad():
                o = m(input_ids=x, output_hidden_states=True)
                ctx = d.project_context(d.select_features(o.hidden_states))
                q = torch.full((1, B), cfg["dflash_config"]["mask_token_id"])
                q[0, 0] = o.logits[0, -1].argmax()
                h = d(q, torch.arange(n, n + B)[None], ctx, torch.arange(n)[None])
                draft = d.logits(h[:, 1:]).argmax(-1)[0].tolist()
            rd = {
                "params": sum(p.numel() for p in d.parameters()),
                "safetensors_dtypes": sorted(ddt),
                "block_size": B,
                "draft": tok.decode([q[0, 0].item()] + draft),
            }
            results[f"{kind}-dflash"] = rd
            log(f"check {kind}-dflash: {rd}")
    total = 0
    for dp, _, fns in os.walk(out):
        total += sum(os.path.getsize(os.path.join(dp, f)) for f in fns)
    results["total_bytes"] = total
    log(f"output size: {total / 1e6:.2f} MB ({total} bytes) in {out}")
    if total > 20_000_000:
        log("WARNING: output exceeds 20 MB")
    return results
