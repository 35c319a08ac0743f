"""The CPU server's built-in engines and the loader of ``--engine module:factory``.

See the engine protocol in :mod:`sglang_spec.serving.cpu_server`. Engine arguments arrive as
``--engine-arg KEY=VALUE`` strings; a factory checks them with :func:`engine_arg` (the validators of
:mod:`sglang_spec.cli_args`) before it loads anything, and refuses a bad one with
:class:`EngineArgumentError`, which ``cpu-server`` prints as one line.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import time
from collections.abc import Callable

from sglang_spec.cli_args import nonneg_float, positive_int


class EngineArgumentError(ValueError):
    """A bad ``--engine`` or ``--engine-arg``: the message names it and what is valid."""


def engine_arg(key: str, value, parse: Callable[[str], object]):
    """``parse(str(value))`` (a :mod:`sglang_spec.cli_args` validator) for ``--engine-arg key=value``."""
    try:
        return parse(str(value))
    except argparse.ArgumentTypeError as e:
        raise EngineArgumentError(f"argument --engine-arg {key}: {e}") from None


class ToyEngine:
    """Deterministic model-free engine for demos: ``k`` tokens per step, ``step_ms`` per step.

    Output token j of a request is byte ``TEXT[(sum(prompt) + j) % len(TEXT)]`` whatever k is, so
    AR (k=1) and "speculative" (k>1) runs produce identical text, as a lossless decoder would.
    """

    TEXT = b"def add(a, b):\n    return a + b\n\n"

    timing = "toy engine: step_ms of sleep per step, no model"

    def __init__(
        self, k: int | str = 1, step_ms: float | str = 0.0, draft_tokens: int | str | None = None
    ):
        self.k = engine_arg("k", k, positive_int)
        self.step_s = engine_arg("step_ms", step_ms, nonneg_float) / 1000.0
        if draft_tokens is not None:
            draft_tokens = engine_arg("draft_tokens", draft_tokens, positive_int)
        self.speculative_algorithm = None if self.k == 1 and draft_tokens is None else "TOY"
        self.num_draft_tokens = draft_tokens or (self.k if self.k > 1 else None)
        self.name = f"toy(k={self.k})"

    def generate(self, input_ids, *, max_new_tokens, **_sampling):
        """Model-free and deterministic: the sampling settings and stop tokens do not apply."""
        base = sum(input_ids)
        j = 0
        while j < max_new_tokens:
            if self.step_s:
                time.sleep(self.step_s)
            n = min(self.k, max_new_tokens - j)
            yield (
                [self.TEXT[(base + j + i) % len(self.TEXT)] for i in range(n)],
                {"num_accepted_drafts": n - 1},
            )
            j += n


class ResultReplayEngine:
    """Adapter for a non-streaming decoder that returns its tokens and per-step stats at the end.

    ``fn(input_ids, max_new_tokens=, temperature=, top_p=, top_k=, seed=, stop_token_ids=)`` must return an
    object with ``tokens`` (generated ids, the prefill token first) and ``steps`` (one per target
    forward after the prefill, each with ``emitted`` and ``accepted``), such as
    ``sglang_spec.reference.generate(target, drafter, ...)`` bound with ``functools.partial``. The
    tokens are then replayed step by step, so counts and acceptance are exact but TTFT/ITL measure the
    replay, not the decoder: use it for demos and correctness, not for latency numbers.
    """

    timing = "decoded whole, then replayed step by step"

    def __init__(
        self,
        fn,
        *,
        speculative_algorithm: str | None = "DDTREE",
        num_draft_tokens: int | None = None,
        name: str = "reference",
        model_path: str | None = None,
    ):
        self.fn, self.speculative_algorithm, self.num_draft_tokens = (
            fn,
            speculative_algorithm,
            num_draft_tokens,
        )
        self.name, self.model_path = name, model_path

    def generate(
        self,
        input_ids,
        *,
        max_new_tokens,
        temperature=0.0,
        top_p=1.0,
        top_k=-1,
        seed=None,
        stop_token_ids=(),
    ):
        res = self.fn(
            list(input_ids),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=0 if seed is None else seed,
            stop_token_ids=list(stop_token_ids),
        )
        tokens = [int(t) for t in res.tokens]
        if not tokens:
            return
        yield tokens[:1], {"verify": False}
        pos = 1
        for st in res.steps:
            chunk = tokens[pos : pos + int(st.emitted)]
            if not chunk:
                break
            yield chunk, {"num_accepted_drafts": int(st.accepted)}
            pos += len(chunk)
        if pos < len(tokens):  # tokens the steps did not account for
            yield tokens[pos:], {"verify": False}


def load_engine(spec: str, engine_args: dict[str, str]):
    """``toy`` or ``package.module:factory``; returns ``factory(**engine_args)``.

    Raises :class:`EngineArgumentError` for a module or factory that cannot be found, or arguments
    that the factory does not take, before calling it.
    """
    if spec == "toy":
        factory = ToyEngine
    else:
        mod, sep, attr = spec.partition(":")
        if not (sep and mod and attr):
            raise EngineArgumentError(
                f"argument --engine: got {spec!r}; valid: 'toy' or 'package.module:factory'"
            )
        try:
            module = importlib.import_module(mod)
        except ImportError as e:
            raise EngineArgumentError(
                f"argument --engine: got {spec!r}; cannot import {mod!r} ({e})"
            ) from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise EngineArgumentError(
                f"argument --engine: got {spec!r}; {mod!r} has no callable {attr!r}"
            )
    try:
        inspect.signature(factory).bind(**engine_args)
    except TypeError:
        params = [
            p.name
            for p in inspect.signature(factory).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        ]
        raise EngineArgumentError(
            f"argument --engine-arg: got {sorted(engine_args)}; valid keys for {spec}: "
            + (", ".join(params) or "none")
        ) from None
    return factory(**engine_args)
