"""The training corpus: the Python standard library's own sources, split deterministically into
train / validation / held-out modules, encoded into token streams with seeded random windows, and
the held-out signature + docstring prompts."""

from __future__ import annotations

import ast
import os
import sysconfig
import time

import torch

from training.config import EXCLUDE_DIRS, HELDOUT_MODULES, VAL_EVERY
from training.runtime import log


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def corpus_files(max_bytes=None):
    """(train, val, heldout) lists of absolute paths, deterministic (sorted walk)."""
    root = stdlib_root()
    allf = []
    for dp, dns, fns in os.walk(root):
        dns[:] = sorted(d for d in dns if d not in EXCLUDE_DIRS)
        for f in sorted(fns):
            if f.endswith(".py"):
                allf.append(os.path.join(dp, f))
    held = [os.path.join(root, m) for m in HELDOUT_MODULES]
    missing = [p for p in held if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"held-out modules missing from this stdlib: {missing}")
    held_set = set(held)
    rest = [p for p in allf if p not in held_set]
    if max_bytes is not None:  # tiny mode: a prefix of the small files
        out, tot = [], 0
        for p in rest:
            if os.path.getsize(p) > 30_000:
                continue
            out.append(p)
            tot += os.path.getsize(p)
            if tot >= max_bytes:
                break
        rest = out
    val = [p for i, p in enumerate(rest) if i % VAL_EVERY == VAL_EVERY // 2] or rest[-1:]
    vs = set(val)
    train = [p for p in rest if p not in vs]
    return train, val, held


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def encode_stream(tok, texts: list[str], eot: int) -> torch.Tensor:
    ids = []
    for enc in tok.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eot)
    return torch.tensor(ids, dtype=torch.long)


class Data:
    """Token streams (train / val / heldout) and seeded random windows."""

    def __init__(self, tok, ids, files, device, seq_len):
        train, val, held = files
        t = time.time()
        eot = ids["<|endoftext|>"]
        self.train = encode_stream(tok, [read(p) for p in train], eot).to(device)
        self.val = encode_stream(tok, [read(p) for p in val], eot).to(device)
        self.held = encode_stream(tok, [read(p) for p in held], eot).to(device)
        self.device, self.seq_len = device, seq_len
        log(
            f"data: train {len(train)} files {self.train.numel()} tok | val {len(val)} files "
            f"{self.val.numel()} tok | heldout {len(held)} files {self.held.numel()} tok "
            f"({time.time() - t:.1f}s)"
        )

    def windows(self, stream, bs, length, gen):
        starts = torch.randint(0, stream.numel() - length, (bs,), generator=gen)
        idx = starts.to(self.device)[:, None] + torch.arange(length, device=self.device)
        return stream[idx]

    def eval_windows(self, stream, n, length):
        """Deterministic, evenly spaced windows for evaluation."""
        span = stream.numel() - length
        starts = torch.linspace(0, span, n).long().to(self.device)
        return stream[starts[:, None] + torch.arange(length, device=self.device)]


def _dedent(lines: list[str], cut: int) -> str:
    """Dedent by the def's indent only, so that prompt + reference = the source."""
    return "".join(ln[cut:] if ln[:cut].strip() == "" else ln.lstrip() for ln in lines)


def _documented_functions(body, prefix: str, lines: list[str]) -> list[tuple[str, str, str]]:
    """(qualname, signature + docstring, rest of the body) of every public function or method with a
    docstring and a body after it, in source order."""
    found = []
    for node in body:
        if isinstance(node, ast.ClassDef):
            found += _documented_functions(node.body, prefix + node.name + ".", lines)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if not doc or node.name.startswith("_") or not node.body[1:]:
                continue
            ds = node.body[0]
            head = _dedent(lines[node.lineno - 1 : ds.end_lineno], node.col_offset)
            rest = _dedent(lines[ds.end_lineno : node.end_lineno], node.col_offset)
            found.append((prefix + node.name, head, rest))
    return found


def heldout_prompts(files, tok, per_module=5, max_prompt_tokens=320):
    """Signature + docstring prompts (reference: the rest of the body), at most ``per_module`` per
    held-out module, evenly spaced over the file."""
    rows = []
    for path in files:
        src = read(path)
        lines = src.splitlines(keepends=True)
        tree = ast.parse(src)
        cands = _documented_functions(tree.body, "", lines)
        cands = [c for c in cands if len(tok.encode(c[1]).ids) <= max_prompt_tokens]
        if len(cands) > per_module:  # evenly spaced over the file, deterministic
            cands = [
                cands[round(i * (len(cands) - 1) / (per_module - 1))] for i in range(per_module)
            ]
        mod = os.path.basename(path)[:-3]
        for qual, head, body in cands:
            rows.append(
                {
                    "id": f"{mod}:{qual}",
                    "module": mod,
                    "qualname": qual,
                    "prompt": head,
                    "reference": body[:2000],
                    "prompt_tokens": len(tok.encode(head).ids),
                }
            )
    return rows
