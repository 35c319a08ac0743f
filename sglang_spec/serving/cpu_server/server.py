"""The CPU server's core: the aiohttp app, the engine step loop and SGLang's accounting.

:class:`CPUServer` owns the engine, the admission limit (``max_running_requests``), the step lock
(one engine step at a time unless ``parallel_steps``) and the counters behind ``meta_info``,
``/server_info`` and ``/flush_cache``. The two generation APIs live in :mod:`.generate_api` and
:mod:`.chat_api` and drive :meth:`CPUServer.steps`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing, contextmanager
from functools import partial
from typing import Any

from aiohttp import web

import sglang_spec.serving.cpu_server.chat_api as chat_api
import sglang_spec.serving.cpu_server.generate_api as generate_api
from sglang_spec.serving.cpu_server.codec import ByteCodec
from sglang_spec.serving.cpu_server.responses import BadRequest

DEFAULT_MAX_NEW_TOKENS = 128


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
        # The target model, reported as /server_info's model_path so that load tests of different
        # engines over one target group together; the served name tells the servers apart.
        self.model_path = getattr(engine, "model_path", None) or model_name
        self.timing = getattr(engine, "timing", None) or "engine steps run by the CPU demo server"
        self.max_running_requests = max(1, int(max_running_requests))
        self.spec_algorithm = getattr(engine, "speculative_algorithm", None)
        self.num_draft_tokens = getattr(engine, "num_draft_tokens", None)
        self._step_lock = None if parallel_steps else threading.Lock()
        self._executor = ThreadPoolExecutor(
            max_workers=self.max_running_requests, thread_name_prefix="engine"
        )
        self.admit: asyncio.Semaphore | None = None
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
        app.router.add_post("/generate", partial(generate_api.handle, self))
        app.router.add_post("/v1/chat/completions", partial(chat_api.handle, self))
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

    async def _on_startup(self, _app):
        self.admit = asyncio.Semaphore(self.max_running_requests)

    async def _on_cleanup(self, _app):
        self._executor.shutdown(wait=False, cancel_futures=True)

    # --- simple endpoints
    async def handle_health(self, _request):
        return web.Response(status=200)

    async def handle_models(self, _request):
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

    async def handle_model_info(self, _request):
        return web.json_response(
            {
                "model_path": self.model_path,
                "tokenizer_path": getattr(self.codec, "name", None),
                "is_generation": True,
            }
        )

    def avg_spec_accept_length(self) -> float | None:
        if self.spec_algorithm is None or self.spec_verify_steps <= 0:
            return None
        return self.spec_accept_tokens / self.spec_verify_steps

    async def handle_server_info(self, _request):
        return web.json_response(
            {
                "model_path": self.model_path,
                "served_model_name": self.model_name,
                "timing": self.timing,
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

    async def handle_flush(self, _request):
        if self.num_running:
            return web.Response(
                status=400, text="Flush cache failed: there are running requests.\n"
            )
        self.spec_accept_tokens = 0
        self.spec_verify_steps = 0
        return web.Response(status=200, text="Cache flushed.\n")

    # --- request parsing
    @staticmethod
    async def read_json(request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"invalid JSON body: {e}") from e
        if not isinstance(body, dict):
            raise BadRequest("body must be a JSON object")
        return body

    def sampling(self, sp: dict, max_new_tokens: Any) -> dict:
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
            raise BadRequest(f"bad sampling parameter: {e}") from e
        if mnt < 0:
            raise BadRequest("max_new_tokens must be >= 0")
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

    async def steps(self, input_ids: list[int], sampling: dict):
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

    async def run_to_end(self, input_ids: list[int], sampling: dict):
        """Drive :meth:`steps` to the request's end: ``(output_ids, finish_reason, stats)``."""
        last = ([], None, None)
        async with aclosing(self.steps(input_ids, sampling)) as steps:
            async for step in steps:
                last = step
        return last

    def meta(self, rid, prompt_len, out, finish, stats, final: bool) -> dict:
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

    def finish_record(self, rid, prompt_len, out, stats, api):
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

    def text(self, ids: list[int], finish) -> str:
        if finish and finish.get("type") == "stop" and finish.get("matched") is not None and ids:
            ids = ids[
                :-1
            ]  # the matched stop token is counted but not shown, like skip_special_tokens
        return self.codec.decode(ids)

    @contextmanager
    def running(self):
        self.num_running += 1
        self.num_requests += 1
        try:
            yield
        finally:
            self.num_running -= 1
