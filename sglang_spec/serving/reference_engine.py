"""The reference engine (``sglang_spec.reference.generate``) with a bundled tiny pair, as a CPU-server engine.

``sglang-spec cpu-server --engine sglang_spec.serving.reference_engine:make --engine-arg method=ddtree
--engine-arg budget=64 --tokenizer sglang_spec/fixtures/tiny-pair/hybrid`` serves the trained tiny
pair behind SGLang's HTTP API on the CPU, for demos and for testing the load generator against real
speculative decoding (``loadtests/README.md`` walks through a load test). Decoding happens per
request, then its steps are replayed (see ``ResultReplayEngine``): token counts and acceptance are
exact, latencies are not an engine's. ``/server_info`` reports the target's directory as
``model_path``, so that AR, DFLASH and DDTREE servers of one pair are compared with each other.
"""

from __future__ import annotations

import os
from pathlib import Path

from sglang_spec.cli_args import existing_dir, int_range
from sglang_spec.plugin import MAX_VERIFY_WIDTH
from sglang_spec.reference import METHODS
from sglang_spec.reference.tiny_pair import FIXTURES, PAIRS
from sglang_spec.serving.cpu_server.engines import (
    EngineArgumentError,
    ResultReplayEngine,
    engine_arg,
)


def make(
    pair: str = "hybrid",
    method: str = "ddtree",
    budget: str | int = 64,
    fixtures: str | None = None,
    threads: str | int = 1,
) -> ResultReplayEngine:
    """Load ``pair`` from the fixtures and return an engine decoding with ``method`` (ar / dflash / ddtree)."""
    for key, value, valid in (("pair", pair, sorted(PAIRS)), ("method", method, METHODS)):
        if value not in valid:
            raise EngineArgumentError(
                f"argument --engine-arg {key}: got {value!r}; valid: {', '.join(valid)}"
            )
    budget = engine_arg("budget", budget, int_range(1, MAX_VERIFY_WIDTH - 1))
    threads = engine_arg("threads", threads, int_range(1, os.cpu_count() or 1))
    fixtures = engine_arg("fixtures", fixtures or FIXTURES, existing_dir)

    import torch

    from sglang_spec.reference import generate, tiny_pair

    torch.set_num_threads(threads)
    _, target, drafter = tiny_pair.load_pair(pair, fixtures)
    width = {"ar": None, "dflash": drafter.block_size, "ddtree": budget + 1}[method]

    def decode(input_ids, **sampling):
        ids = torch.tensor([input_ids])
        return generate(target, drafter, ids, method, budget=budget, **sampling)

    return ResultReplayEngine(
        decode,
        speculative_algorithm=None if method == "ar" else method.upper(),
        num_draft_tokens=width,
        name=f"tiny-{pair}-{method}",
        model_path=str(Path(fixtures).resolve() / PAIRS[pair][0]),
    )
