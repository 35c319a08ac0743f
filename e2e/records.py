"""The real-scale harness's result records: schema, the per-level arithmetic, merge and storage.

One record per (server, concurrency level). ``ms_per_step`` is the wall time of the level divided by
the verify steps of its longest request (all requests of a level start together and have the same
length, so the longest one spans the level); an AR "step" is a decode forward
(``completion_tokens - 1``: the first token comes from the prefill, as ``spec_verify_ct`` does not
count it either). ``tokens_per_step`` is SGLang's ``sum(completion_tokens) / sum(spec_verify_ct)``
(1 for AR); ``tokens_per_s`` is the level's output tokens over its wall time. Optional
``prefill_s`` is the wall time of the level's prefill alone (the harness times the same number of
fresh prompts with one new token each), and ``decode_ms_per_step`` the level's wall time without
it over the same steps: a decode step's cost, which ``ms_per_step`` mixes with the prefill spread
over the level's steps (on the 27B shape at C = 8 and tau 3, about 9.5 of 40 ms). ``budget`` is None for
AR / NEXTN / DFLASH; ``width`` is the verify width (1 for AR). Records of several calls merge by
:func:`key`: a later record replaces an earlier one of the same server and level.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REQUIRED = (
    "shape",
    "algorithm",
    "budget",
    "width",
    "concurrency",
    "ms_per_step",
    "tokens_per_s",
    "tokens_per_step",
    "max_running_requests",
    "simulated_accept_len",
    "tp",
)
KEY = ("shape", "algorithm", "budget", "variant", "tp", "simulated_accept_len", "concurrency")


class RecordError(ValueError):
    """A record misses a required field or holds an impossible value."""


def key(rec: dict) -> tuple:
    return tuple(rec.get(k) for k in KEY)


def validate(rec: dict) -> dict:
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise RecordError(f"record {key(rec)} lacks {missing}")
    if rec["algorithm"] == "DDTREE" and not (
        isinstance(rec["budget"], int) and rec["width"] == rec["budget"] + 1
    ):
        raise RecordError(f"DDTREE record {key(rec)}: width must be budget + 1")
    if rec["algorithm"] != "DDTREE" and rec["budget"] is not None:
        raise RecordError(f"{rec['algorithm']} record {key(rec)}: budget must be null")
    for k in ("ms_per_step", "tokens_per_s", "tokens_per_step", "decode_ms_per_step"):
        if k in rec and not (isinstance(rec[k], (int, float)) and rec[k] > 0):
            raise RecordError(f"record {key(rec)}: {k}={rec[k]!r} must be a positive number")
    return rec


def level_metrics(
    metas: list[dict], wall_s: float, speculative: bool, prefill_s: float | None = None
) -> dict:
    """The per-level figures from the ``meta_info`` of each request of one level; with
    ``prefill_s`` (the level's prompts' prefill alone, timed apart) also the decode-only step,
    unless the prefill alone took as long as the whole level."""
    if not metas or wall_s <= 0:
        raise RecordError(
            f"a level needs requests and a positive wall time; got {len(metas)}, {wall_s}"
        )
    tokens = [int(m["completion_tokens"]) for m in metas]
    if speculative:
        steps = [int(m.get("spec_verify_ct") or 0) for m in metas]
        if not all(steps):
            raise RecordError("a speculative server answered without spec_verify_ct")
        tokens_per_step = sum(tokens) / sum(steps)
    else:
        steps = [t - 1 for t in tokens]
        if min(steps) < 1:
            raise RecordError("AR requests need at least 2 output tokens to time a decode step")
        tokens_per_step = 1.0
    out = {
        "ms_per_step": 1000.0 * wall_s / max(steps),
        "tokens_per_s": sum(tokens) / wall_s,
        "tokens_per_step": tokens_per_step,
        "steps": max(steps),
        "completion_tokens": sum(tokens),
        "wall_s": wall_s,
    }
    if prefill_s is not None:
        out["prefill_s"] = prefill_s
        if prefill_s < wall_s:  # else the timing's noise exceeds the decode: no decode figure
            out["decode_ms_per_step"] = 1000.0 * (wall_s - prefill_s) / max(steps)
    return out


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with every record of ``new`` added, replacing an old one of the same key; sorted."""
    by_key = {key(r): r for r in old}
    by_key.update({key(r): r for r in new})
    return sorted(by_key.values(), key=_order)


def _order(rec: dict) -> tuple:
    return tuple((v is None, 0 if v is None else v) for v in key(rec))


def load(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    data = json.loads(p.read_text())
    if not isinstance(data, list):
        raise RecordError(f"{p}: expected a JSON list of records")
    return [validate(r) for r in data]


def save(path: str | Path, records: list[dict]) -> None:
    """Write atomically (a crash mid-write leaves the previous file intact)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(json.dumps(records, indent=1) + "\n")
    os.replace(tmp, p)
