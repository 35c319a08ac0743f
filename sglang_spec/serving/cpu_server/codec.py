"""Text <-> token ids for the CPU server: UTF-8 bytes (no model) or a Hugging Face tokenizer."""

from __future__ import annotations

from typing import Any


class ByteCodec:
    """Tokenizer-free codec: token id = one UTF-8 byte (vocabulary 256). Lossless for any text."""

    name = "bytes"
    vocab_size = 256
    eos_token_ids: list[int] = []

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i & 0xFF for i in ids).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict]) -> list[int]:
        text = "".join(
            f"{m.get('role', 'user')}: {_content_text(m.get('content'))}\n" for m in messages
        )
        return self.encode(text + "assistant: ")


class HFTokenizerCodec:
    """A Hugging Face tokenizer (``transformers`` imported lazily); chat via its chat template."""

    def __init__(self, path: str, chat_template_kwargs: dict | None = None):
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(path)
        self.name = path
        self.vocab_size = len(self.tok)
        eos = self.tok.eos_token_id
        self.eos_token_ids = [eos] if isinstance(eos, int) else list(eos or [])
        self.chat_template_kwargs = chat_template_kwargs or {}

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def apply_chat_template(self, messages: list[dict], **kwargs) -> list[int]:
        msgs = [
            {"role": m.get("role", "user"), "content": _content_text(m.get("content"))}
            for m in messages
        ]
        out = self.tok.apply_chat_template(
            msgs,
            add_generation_prompt=True,
            tokenize=True,
            **{**self.chat_template_kwargs, **kwargs},
        )
        # transformers 5 returns a BatchEncoding (a mapping that is not a dict) for tokenize=True
        return list(out["input_ids"] if hasattr(out, "keys") else out)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)
