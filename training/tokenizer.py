"""The fixtures' tokenizer: a byte-level BPE trained on the corpus with the ChatML specials
(``<|endoftext|> <|im_start|> <|im_end|> <|MASK|>``), saved as a transformers fast tokenizer; loading
it back and copying it next to each checkpoint."""

from __future__ import annotations

import json
import os
import shutil

from training.config import CHAT_TEMPLATE, SPECIALS


def train_tokenizer(out_dir: str, texts: list[str], vocab: int) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer, length=len(texts))
    os.makedirs(out_dir, exist_ok=True)
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    added = {
        str(i): {
            "content": s,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for s, i in ids.items()
    }
    extra = ["<|im_start|>", "<|im_end|>", "<|MASK|>"]
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": extra,
        "model_max_length": 2048,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as fh:
        json.dump(cfg, fh, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as fh:
        json.dump(
            {
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "additional_special_tokens": extra,
            },
            fh,
            indent=2,
        )
    return {"vocab_size": tok.get_vocab_size(), "special_ids": ids}


def load_tokenizer(out: str):
    from tokenizers import Tokenizer

    path = os.path.join(out, "tokenizer", "tokenizer.json")
    if not os.path.exists(path):
        raise SystemExit(f"{path} missing: run --stage tokenizer first (same --out)")
    tok = Tokenizer.from_file(path)
    return tok, {s: tok.token_to_id(s) for s in SPECIALS}


def copy_tokenizer(out: str, dst: str) -> None:
    for f in os.listdir(os.path.join(out, "tokenizer")):
        shutil.copy(os.path.join(out, "tokenizer", f), dst)
