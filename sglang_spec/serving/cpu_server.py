"""CPU demo/test server: an SGLang-compatible HTTP front end over a pluggable engine.

**Not a production engine.** It exists so that the load generator (``loadtests``) can be tested end to
end on CPU, and so that the reference speculative decoder can be demoed behind the same HTTP API that
SGLang serves. Requests run one engine step at a time under a lock (round-robin across requests, like
a batch-1 engine) unless ``--parallel-steps`` is given.

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
  tokens / verify steps since start or the last flush), ``GET|POST /flush_cache`` (resets that
  average; refused with 400 while requests run, as SGLang does), ``GET /v1/models``, ``GET /model_info``.

Engine protocol (duck-typed)::

    class Engine:
        name: str = "..."                          # optional
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
and closes the generator), so an engine may ignore them. Text <-> ids go through a codec: the default
:class:`ByteCodec` (UTF-8 bytes, no model needed) or an HF tokenizer (``--tokenizer PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import ipaddress
import json
import sys
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, contextmanager
from typing import Any

from aiohttp import web

DEFAULT_MAX_NEW_TOKENS = 128


# ----------------------------------------------------------------------------------------------- codecs
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


def _server_error(e: Exception) -> dict:
    """SGLang's body for an engine failure: an HTTP 500 response, or one SSE chunk mid-stream."""
    return {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 500}}


def _bad_request(e: Exception) -> web.Response:
    return web.json_response(
        {"error": {"message": str(e), "type": "invalid_request_error", "code": 400}}, status=400
    )


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _open_sse(request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


async def _close_sse(
    resp: web.StreamResponse, error: Exception | None = None
) -> web.StreamResponse:
    """End a stream as SGLang does: the error chunk (if the engine failed), then ``[DONE]``."""
    if error is not None:
        await resp.write(_sse(_server_error(error)))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


# ----------------------------------------------------------------------------------------------- toy engine
class ToyEngine:
    """Deterministic model-free engine for demos: ``k`` tokens per step, ``step_ms`` per step.

    Output token j of a request is byte ``TEXT[(sum(prompt) + j) % len(TEXT)]`` whatever k is, so
    AR (k=1) and "speculative" (k>1) runs produce identical text, as a lossless decoder would.
    """

    TEXT = b"def add(a, b):\n    return a + b\n\n"

    def __init__(self, k: int = 1, step_ms: float = 0.0, draft_tokens: int | None = None):
        self.k = max(1, int(k))
        self.step_s = float(step_ms) / 1000.0
        self.speculative_algorithm = None if self.k == 1 and draft_tokens is None else "TOY"
        self.num_draft_tokens = (
            int(draft_tokens) if draft_tokens else (self.k if self.k > 1 else None)
        )
        self.name = f"toy(k={self.k})"

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

    def __init__(
        self,
        fn,
        *,
        speculative_algorithm: str | None = "DDTREE",
        num_draft_tokens: int | None = None,
        name: str = "reference",
    ):
        self.fn, self.speculative_algorithm, self.num_draft_tokens, self.name = (
            fn,
            speculative_algorithm,
            num_draft_tokens,
            name,
        )

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


# ----------------------------------------------------------------------------------------------- server
class _BadRequest(Exception):
    pass


class CPUServer:
    """The aiohttp application and its bookkeeping. Use :func:`serve_in_thread` or :func:`run`."""

    def __init__(
        self,
        engine,
        codec=None,
        *,
        model_name: str = "cpu-demo",
        max_running_requests: int = 8,
        parallel_steps: bool = False,
        history: int = 100_000,
    ):
        self.engine = engine
        self.codec = codec or ByteCodec()
        self.model_name = model_name
        self.max_running_requests = max(1, int(max_running_requests))
        self.spec_algorithm = getattr(engine, "speculative_algorithm", None)
        self.num_draft_tokens = getattr(engine, "num_draft_tokens", None)
        self._step_lock = None if parallel_steps else threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_running_requests, thread_name_prefix="engine"
        )
        self._admit: asyncio.Semaphore | None = None
        self.num_running = 0
        self.num_requests = 0
        self.spec_accept_tokens = 0  # since start / last flush (avg_spec_accept_length numerator)
        self.spec_verify_steps = 0
        self.total_completion_tokens = 0  # lifetime, for tests and /server_info
        self.completed: deque[dict] = deque(
            maxlen=history
        )  # per finished request: id, tokens, steps
        self.started = time.time()

    # --- app
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self.handle_generate)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        for path in ("/health", "/health_generate"):
            app.router.add_get(path, self.handle_health)
        app.router.add_get("/server_info", self.handle_server_info)
        app.router.add_get("/get_server_info", self.handle_server_info)
        app.router.add_route("*", "/flush_cache", self.handle_flush)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/model_info", self.handle_model_info)
        app.router.add_get("/get_model_info", self.handle_model_info)
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, app):
        self._admit = asyncio.Semaphore(self.max_running_requests)

    async def _on_cleanup(self, app):
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- simple endpoints
    async def handle_health(self, request):
        return web.Response(status=200)

    async def handle_models(self, request):
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": int(self.started),
                        "owned_by": "sglang-spec",
                    }
                ],
            }
        )

    async def handle_model_info(self, request):
        return web.json_response(
            {
                "model_path": self.model_name,
                "tokenizer_path": getattr(self.codec, "name", None),
                "is_generation": True,
            }
        )

    def avg_spec_accept_length(self) -> float | None:
        if self.spec_algorithm is None or self.spec_verify_steps <= 0:
            return None
        return self.spec_accept_tokens / self.spec_verify_steps

    async def handle_server_info(self, request):
        return web.json_response(
            {
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "speculative_algorithm": self.spec_algorithm,
                "speculative_num_draft_tokens": self.num_draft_tokens,
                "max_running_requests": self.max_running_requests,
                "engine": getattr(self.engine, "name", type(self.engine).__name__),
                "tokenizer": getattr(self.codec, "name", None),
                "internal_states": [
                    {
                        "avg_spec_accept_length": self.avg_spec_accept_length(),
                        "num_running_reqs": self.num_running,
                        "total_requests": self.num_requests,
                        "total_completion_tokens": self.total_completion_tokens,
                    }
                ],
                "version": "sglang-spec cpu demo server (not SGLang)",
                "frontend": "sglang_spec.serving.cpu_server",
                "startup_time": self.started,
            }
        )

    async def handle_flush(self, request):
        if self.num_running:
            return web.Response(
                status=400, text="Flush cache failed: there are running requests.\n"
            )
        self.spec_accept_tokens = 0
        self.spec_verify_steps = 0
        return web.Response(status=200, text="Cache flushed.\n")

    # --- request parsing
    @staticmethod
    async def _json(request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise _BadRequest(f"invalid JSON body: {e}") from e
        if not isinstance(body, dict):
            raise _BadRequest("body must be a JSON object")
        return body

    def _sampling(self, sp: dict, max_new_tokens: Any) -> dict:
        try:
            mnt = int(max_new_tokens if max_new_tokens is not None else DEFAULT_MAX_NEW_TOKENS)
            out = {
                "max_new_tokens": mnt,
                "temperature": float(
                    sp.get("temperature", 1.0) if sp.get("temperature") is not None else 1.0
                ),
                "top_p": float(sp.get("top_p", 1.0) if sp.get("top_p") is not None else 1.0),
                "top_k": int(sp.get("top_k", -1) if sp.get("top_k") is not None else -1),
                "seed": sp.get("sampling_seed", sp.get("seed")),
            }
        except (TypeError, ValueError) as e:
            raise _BadRequest(f"bad sampling parameter: {e}") from e
        if mnt < 0:
            raise _BadRequest("max_new_tokens must be >= 0")
        stops = list(sp.get("stop_token_ids") or [])
        if not sp.get("ignore_eos", False):
            stops += list(getattr(self.codec, "eos_token_ids", []) or [])
        out["stop_token_ids"] = stops
        return out

    # --- the engine loop shared by both APIs
    def _next_step(self, it: Iterator) -> tuple[list[int], dict | None] | None:
        lock = self._step_lock
        if lock is not None:
            with lock:
                return next(it, None)
        return next(it, None)

    async def _run(self, rid: str, input_ids: list[int], sampling: dict):
        """Async generator over engine steps: yields (output_ids_so_far, finish_reason|None, stats)."""
        loop = asyncio.get_running_loop()
        stops = set(sampling["stop_token_ids"])
        mnt = sampling["max_new_tokens"]
        stats = {"verify_ct": 0, "correct": 0, "hist": Counter(), "t0": time.perf_counter()}
        out: list[int] = []
        finish = None
        if mnt == 0:
            yield out, {"type": "length", "length": 0}, stats
            return
        it = iter(
            self.engine.generate(
                list(input_ids),
                max_new_tokens=mnt,
                temperature=sampling["temperature"],
                top_p=sampling["top_p"],
                top_k=sampling["top_k"],
                seed=sampling["seed"],
                stop_token_ids=sorted(stops),
            )
        )
        try:
            while finish is None:  # bounded: every step adds >= 1 token or ends the request
                item = await loop.run_in_executor(self._executor, self._next_step, it)
                if item is None:
                    finish = {"type": "stop", "matched": None}
                    yield out, finish, stats
                    break
                toks, step_stats = item
                toks = [int(t) for t in toks]
                if not toks:
                    raise RuntimeError("engine step committed no tokens")
                step_stats = step_stats or {}
                is_verify = step_stats.get(
                    "verify", True
                )  # False: e.g. the prefill's token, not a verify step
                if is_verify:
                    stats["verify_ct"] += 1
                accepted = step_stats.get("num_accepted_drafts", len(toks) - 1)
                for j, t in enumerate(toks):
                    if t in stops:
                        toks = toks[: j + 1]
                        finish = {"type": "stop", "matched": t}
                        break
                if len(out) + len(toks) >= mnt and finish is None:
                    toks = toks[: mnt - len(out)]
                    finish = {"type": "length", "length": mnt}
                out.extend(toks)
                if is_verify:
                    accepted = max(0, min(int(accepted), len(toks) - 1))
                    stats["correct"] += accepted
                    stats["hist"][accepted] += 1
                if self.spec_algorithm is not None:
                    # SGLang: completion tokens / verify steps, so a prefill token counts in the numerator.
                    self.spec_accept_tokens += len(toks)
                    self.spec_verify_steps += int(is_verify)
                yield out, finish, stats
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                await loop.run_in_executor(self._executor, close)

    def _meta(self, rid, prompt_len, out, finish, stats, final: bool) -> dict:
        meta = {
            "id": rid,
            "finish_reason": finish if final else None,
            "prompt_tokens": prompt_len,
            "completion_tokens": len(out),
            "cached_tokens": 0,
        }
        if final:
            meta["e2e_latency"] = time.perf_counter() - stats["t0"]
            if self.spec_algorithm is not None and stats["verify_ct"] > 0:
                vc = stats["verify_ct"]
                meta["spec_verify_ct"] = vc
                meta["spec_accept_length"] = len(out) / vc
                meta["spec_num_correct_drafts"] = stats["correct"]
                if self.num_draft_tokens and self.num_draft_tokens > 1:
                    proposed = vc * (self.num_draft_tokens - 1)
                    meta["spec_num_proposed_drafts"] = proposed
                    meta["spec_accept_rate"] = stats["correct"] / proposed
                hmax = max(stats["hist"]) if stats["hist"] else 0
                meta["spec_correct_drafts_histogram"] = [
                    stats["hist"].get(i, 0) for i in range(hmax + 1)
                ]
        return meta

    def _finish_record(self, rid, prompt_len, out, stats, api):
        self.total_completion_tokens += len(out)
        self.completed.append(
            {
                "id": rid,
                "api": api,
                "prompt_tokens": prompt_len,
                "completion_tokens": len(out),
                "spec_verify_ct": stats["verify_ct"],
            }
        )

    def _text(self, ids: list[int], finish) -> str:
        if finish and finish.get("type") == "stop" and finish.get("matched") is not None and ids:
            ids = ids[
                :-1
            ]  # the matched stop token is counted but not shown, like skip_special_tokens
        return self.codec.decode(ids)

    @contextmanager
    def _running(self):
        self.num_running += 1
        self.num_requests += 1
        try:
            yield
        finally:
            self.num_running -= 1

    # --- /generate
    async def handle_generate(self, request):
        try:
            body = await self._json(request)
            if isinstance(body.get("text"), list) or (
                body.get("input_ids") and isinstance(body["input_ids"][0], list)
            ):
                raise _BadRequest("batched requests are not supported by the CPU demo server")
            if body.get("input_ids") is not None:
                input_ids = [int(t) for t in body["input_ids"]]
            elif isinstance(body.get("text"), str):
                input_ids = self.codec.encode(body["text"])
            else:
                raise _BadRequest("need 'text' or 'input_ids'")
            sp = body.get("sampling_params") or {}
            sampling = self._sampling(sp, sp.get("max_new_tokens"))
        except (_BadRequest, TypeError, ValueError, IndexError) as e:
            return _bad_request(e)
        rid = str(body.get("rid") or uuid.uuid4().hex)
        async with self._admit:
            with self._running():
                if body.get("stream"):
                    return await self._generate_stream(request, rid, input_ids, sampling)
                return await self._generate_once(rid, input_ids, sampling)

    async def _generate_once(self, rid, input_ids, sampling):
        out, finish, stats = [], None, None
        try:
            async with aclosing(self._run(rid, input_ids, sampling)) as steps:
                async for out, finish, stats in steps:
                    pass
        except Exception as e:  # engine failure -> HTTP 500, the server keeps serving
            return web.json_response(_server_error(e), status=500)
        self._finish_record(rid, len(input_ids), out, stats, "generate")
        return web.json_response(
            {
                "text": self._text(out, finish),
                "output_ids": list(out),
                "meta_info": self._meta(rid, len(input_ids), out, finish, stats, True),
            }
        )

    async def _generate_stream(self, request, rid, input_ids, sampling):
        resp = await _open_sse(request)
        out, stats = [], None
        try:
            async with aclosing(self._run(rid, input_ids, sampling)) as steps:
                async for out, finish, stats in steps:
                    final = finish is not None
                    chunk = {
                        "text": self._text(out, finish),
                        "output_ids": list(out),
                        "meta_info": self._meta(rid, len(input_ids), out, finish, stats, final),
                    }
                    await resp.write(_sse(chunk))
            self._finish_record(rid, len(input_ids), out, stats, "generate")
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # client went away; _run's finally closed the engine generator
        except Exception as e:
            return await _close_sse(resp, e)
        return await _close_sse(resp)

    # --- /v1/chat/completions
    async def handle_chat(self, request):
        try:
            body = await self._json(request)
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("'messages' must be a non-empty list")
            kwargs = body.get("chat_template_kwargs") or {}
            input_ids = (
                self.codec.apply_chat_template(messages, **kwargs)
                if kwargs
                else self.codec.apply_chat_template(messages)
            )
            mnt = body.get("max_completion_tokens", body.get("max_tokens"))
            sampling = self._sampling(body, mnt)
        except (_BadRequest, TypeError, ValueError) as e:
            return _bad_request(e)
        rid = "chatcmpl-" + uuid.uuid4().hex
        async with self._admit:
            with self._running():
                if body.get("stream"):
                    return await self._chat_stream(request, body, rid, input_ids, sampling)
                return await self._chat_once(body, rid, input_ids, sampling)

    @staticmethod
    def _oai_finish(finish) -> str | None:
        if not finish:
            return None
        return "length" if finish.get("type") == "length" else "stop"

    def _spec_details(self, meta: dict) -> dict | None:
        if "spec_verify_ct" not in meta:
            return None
        keys = (
            "spec_accept_rate",
            "spec_accept_length",
            "spec_num_correct_drafts",
            "spec_num_proposed_drafts",
            "spec_verify_ct",
            "spec_correct_drafts_histogram",
        )
        return {k: meta[k] for k in keys if k in meta}

    async def _chat_once(self, body, rid, input_ids, sampling):
        out, finish, stats = [], None, None
        try:
            async with aclosing(self._run(rid, input_ids, sampling)) as steps:
                async for out, finish, stats in steps:
                    pass
        except Exception as e:
            return web.json_response(_server_error(e), status=500)
        self._finish_record(rid, len(input_ids), out, stats, "chat")
        meta = self._meta(rid, len(input_ids), out, finish, stats, True)
        resp = {
            "id": rid,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": self._text(out, finish)},
                    "finish_reason": self._oai_finish(finish),
                    "meta_info": meta,
                }
            ],
            "usage": {
                "prompt_tokens": len(input_ids),
                "completion_tokens": len(out),
                "total_tokens": len(input_ids) + len(out),
            },
        }
        if body.get("return_spec_tokens_details") and self._spec_details(meta):
            resp["sglext"] = {"spec_tokens_details": self._spec_details(meta)}
        return web.json_response(resp)

    async def _chat_stream(self, request, body, rid, input_ids, sampling):
        resp = await _open_sse(request)
        created = int(time.time())

        def chunk(delta=None, finish_reason=None, **extra):
            choices = (
                []
                if delta is None
                else [
                    {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
                ]
            )
            d = {
                "id": rid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model_name,
                "choices": choices,
                **extra,
            }
            return _sse(d)

        opts = body.get("stream_options") or {}
        out, finish, stats, sent = [], None, None, ""
        try:
            await resp.write(chunk({"role": "assistant", "content": ""}))
            async with aclosing(self._run(rid, input_ids, sampling)) as steps:
                async for out, finish, stats in steps:
                    text = self._text(out, finish)
                    delta, sent = text[len(sent) :], text
                    if delta:
                        await resp.write(chunk({"content": delta}))
            self._finish_record(rid, len(input_ids), out, stats, "chat")
            await resp.write(chunk({}, self._oai_finish(finish)))
            meta = self._meta(rid, len(input_ids), out, finish, stats, True)
            details = self._spec_details(meta)
            if body.get("return_spec_tokens_details") and details:
                await resp.write(chunk(None, sglext={"spec_tokens_details": details}))
            if opts.get("include_usage"):
                await resp.write(
                    chunk(
                        None,
                        usage={
                            "prompt_tokens": len(input_ids),
                            "completion_tokens": len(out),
                            "total_tokens": len(input_ids) + len(out),
                        },
                    )
                )
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            return await _close_sse(resp, e)
        return await _close_sse(resp)


# ----------------------------------------------------------------------------------------------- running it
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ThreadedServer:
    """A :class:`CPUServer` on its own event loop in a daemon thread (for tests and notebooks)."""

    def __init__(self, server: CPUServer, host: str = "127.0.0.1", port: int = 0):
        if not is_loopback(host):
            raise ValueError(f"ThreadedServer binds loopback only, not {host!r}")
        self.server, self.host, self.port = server, host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="cpu-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _main(self):
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self):
        self._runner = web.AppRunner(self.server.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("cpu server did not start")
        if self._error:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


@contextmanager
def serve_in_thread(engine, codec=None, host: str = "127.0.0.1", port: int = 0, **kwargs):
    """``with serve_in_thread(engine) as srv: ... srv.url ... srv.server.completed``"""
    ts = ThreadedServer(CPUServer(engine, codec, **kwargs), host, port).start()
    try:
        yield ts
    finally:
        ts.stop()


def load_engine(spec: str, engine_args: dict[str, str]):
    """``toy`` or ``package.module:factory``; ``factory(**engine_args)`` returns an engine."""
    if spec == "toy":
        return ToyEngine(**engine_args)
    if ":" not in spec:
        raise ValueError(f"--engine must be 'toy' or 'module:factory', got {spec!r}")
    mod, _, attr = spec.partition(":")
    return getattr(importlib.import_module(mod), attr)(**engine_args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "CPU demo/test server with SGLang's HTTP API over a pluggable engine (not a production engine)."
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--allow-remote", action="store_true", help="allow binding a non-loopback address"
    )
    parser.add_argument(
        "--engine", default="toy", help="'toy' (default) or 'package.module:factory'"
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the engine factory (repeatable); toy: k, step_ms, draft_tokens",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="HF tokenizer path/name (default: byte codec, no model)"
    )
    parser.add_argument(
        "--model-name", default=None, help="served model name (default: engine name)"
    )
    parser.add_argument("--max-running-requests", type=int, default=8)
    parser.add_argument(
        "--parallel-steps",
        action="store_true",
        help="run engine steps of different requests concurrently (engine must be thread-safe)",
    )


def run(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and not args.allow_remote:
        print(
            f"cpu-server: refusing to bind non-loopback host {args.host!r} without --allow-remote",
            file=sys.stderr,
        )
        return 2
    kw = {}
    for item in args.engine_arg:
        k, sep, v = item.partition("=")
        if not sep:
            print(f"cpu-server: --engine-arg needs KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        kw[k] = v
    engine = load_engine(args.engine, kw)
    codec = HFTokenizerCodec(args.tokenizer) if args.tokenizer else ByteCodec()
    server = CPUServer(
        engine,
        codec,
        model_name=args.model_name or getattr(engine, "name", "cpu-demo"),
        max_running_requests=args.max_running_requests,
        parallel_steps=args.parallel_steps,
    )
    print(
        f"cpu-server: {server.model_name} (speculative={server.spec_algorithm}) on http://{args.host}:{args.port}"
        " -- CPU demo/test server, not a production engine",
        file=sys.stderr,
        flush=True,
    )
    web.run_app(server.make_app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-spec cpu-server")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
