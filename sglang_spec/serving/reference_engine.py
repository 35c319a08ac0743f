"""The reference engine (``sglang_spec.reference.generate``) with a bundled tiny pair, as a CPU-server engine.

``sglang-spec cpu-server --engine sglang_spec.serving.reference_engine:make --engine-arg method=ddtree
--engine-arg budget=64 --tokenizer sglang_spec/fixtures/tiny-pair/hybrid`` serves the trained tiny
pair behind SGLang's HTTP API on the CPU, for demos and for testing the load generator against real
speculative decoding. Decoding happens per request, then its steps are replayed (see
``ResultReplayEngine``): token counts and acceptance are exact, latencies are not an engine's.
"""

from __future__ import annotations

from sglang_spec.reference.tiny_pair import FIXTURES
from sglang_spec.serving.cpu_server import ResultReplayEngine


def make(
    pair: str = "hybrid",
    method: str = "ddtree",
    budget: str | int = 64,
    fixtures: str | None = None,
    threads: str | int = 1,
) -> ResultReplayEngine:
    """Load ``pair`` from the fixtures and return an engine decoding with ``method`` (ar / dflash / ddtree)."""
    import torch

    from sglang_spec.reference import METHODS, generate, tiny_pair

    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    budget = int(budget)
    torch.set_num_threads(int(threads))
    _, target, drafter = tiny_pair.load_pair(pair, fixtures or FIXTURES)
    width = {"ar": None, "dflash": drafter.block_size, "ddtree": budget + 1}[method]

    def decode(input_ids, **sampling):
        ids = torch.tensor([input_ids])
        return generate(target, drafter, ids, method, budget=budget, **sampling)

    return ResultReplayEngine(
        decode,
        speculative_algorithm=None if method == "ar" else method.upper(),
        num_draft_tokens=width,
        name=f"tiny-{pair}-{method}",
    )
