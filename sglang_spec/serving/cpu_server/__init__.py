"""CPU demo/test server: an SGLang-compatible HTTP front end over a pluggable engine.

**Not a production engine.** It exists so that the load generator (``loadtests``) can be tested end to
end on CPU, and so that the reference speculative decoder can be demoed behind the same HTTP API that
SGLang serves. Requests run one engine step at a time under a lock (round-robin across requests, like
a batch-1 engine) unless ``--parallel-steps`` is given.

Modules, one job each:

- :mod:`.codec` -- text <-> token ids: :class:`ByteCodec` (UTF-8 bytes, no model) or an HF tokenizer.
- :mod:`.engines` -- the engine protocol's two built-in engines (:class:`ToyEngine`,
  :class:`ResultReplayEngine`) and :func:`load_engine` for ``--engine module:factory``.
- :mod:`.server` -- :class:`CPUServer`: the aiohttp app, the engine step loop, SGLang's accounting
  (``meta_info``, ``/server_info``, ``/flush_cache``).
- :mod:`.generate_api`, :mod:`.chat_api` -- ``POST /generate`` and ``POST /v1/chat/completions``.
- :mod:`.responses` -- error bodies and server-sent events as SGLang writes them.
- :mod:`.runner` -- :func:`serve_in_thread` (tests, notebooks) and the loopback check.
- :mod:`.cli` -- ``sglang-spec cpu-server`` (also ``python -m sglang_spec.serving.cpu_server``).

Endpoints (request and response fields as SGLang 0.5.23 names them):

- ``POST /generate`` -- ``{"text" | "input_ids", "sampling_params": {...}, "stream": bool, "rid"}``.
  Non-streaming returns ``{"text", "output_ids", "meta_info"}``; streaming sends ``data: {...}\\n\\n``
  chunks with cumulative ``text``/``output_ids`` and then ``data: [DONE]``. ``meta_info`` has ``id``,
  ``finish_reason`` (``{"type": "length", "length": n}`` / ``{"type": "stop", "matched": id}``),
  ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, and on the final chunk ``e2e_latency``
  and, for speculative engines, ``spec_verify_ct``, ``spec_accept_length`` (= completion_tokens /
  spec_verify_ct, bonus included), ``spec_num_correct_drafts``, ``spec_correct_drafts_histogram`` and,
  when the engine declares ``num_draft_tokens``, ``spec_num_proposed_drafts``/``spec_accept_rate``.
- ``POST /v1/chat/completions`` -- OpenAI chat, streaming or not; ``stream_options.include_usage``
  adds a usage chunk and ``return_spec_tokens_details`` an ``sglext.spec_tokens_details`` chunk.
- ``GET /health``, ``GET /server_info`` (``internal_states[0].avg_spec_accept_length``: accepted
  tokens / verify steps since start or the last flush; ``model_path``: the engine's target model;
  ``timing``: why the latencies are not an engine's), ``GET|POST /flush_cache`` (resets that
  average; refused with 400 while requests run, as SGLang does), ``GET /v1/models``, ``GET /model_info``.

Engine protocol (duck-typed)::

    class Engine:
        name: str = "..."                          # optional
        model_path: str | None = None              # optional; the target model, for /server_info
        timing: str | None = None                  # optional; what the latencies measure
        speculative_algorithm: str | None = None   # optional; None -> autoregressive (no spec_* fields)
        num_draft_tokens: int | None = None        # optional; verify width, for spec_accept_rate
        def generate(self, input_ids: list[int], *, max_new_tokens: int, temperature: float,
                     top_p: float, top_k: int, seed: int | None,
                     stop_token_ids: list[int]) -> Iterator[tuple[list[int], dict | None]]:
            # one item per target forward (verify step): the tokens committed by that step (bonus
            # included) and optional step stats, e.g. {"num_accepted_drafts": 3}. An item with
            # {"verify": False} (e.g. the token sampled at prefill) adds tokens without a verify step,
            # as SGLang counts spec_verify_ct.

The server enforces ``max_new_tokens`` and the stop tokens itself (it truncates a step that overshoots
and closes the generator), so an engine may ignore them. An engine factory refuses a bad
``--engine-arg`` with :class:`EngineArgumentError` before it loads anything.
"""

from sglang_spec.serving.cpu_server.codec import ByteCodec, HFTokenizerCodec
from sglang_spec.serving.cpu_server.engines import (
    EngineArgumentError,
    ResultReplayEngine,
    ToyEngine,
    load_engine,
)
from sglang_spec.serving.cpu_server.runner import ThreadedServer, is_loopback, serve_in_thread
from sglang_spec.serving.cpu_server.server import CPUServer

__all__ = [
    "ByteCodec",
    "CPUServer",
    "EngineArgumentError",
    "HFTokenizerCodec",
    "ResultReplayEngine",
    "ThreadedServer",
    "ToyEngine",
    "is_loopback",
    "load_engine",
    "serve_in_thread",
]
