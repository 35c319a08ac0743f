"""One streaming request against SGLang's ``/generate`` or ``/v1/chat/completions``, timed.

Timing follows ``sglang.benchmark.serving``: ``ttft`` = request sent -> first chunk with tokens,
``latency`` = request sent -> end of stream, ``itl`` = gaps between token-carrying chunks, where a
``/generate`` chunk of n new tokens contributes n entries of gap/n (SGLang's convention, which hides
the burstiness of speculative decoding). The raw gaps are kept in ``chunk_gaps`` so a P99 chunk gap can
be reported separately. Failures (HTTP errors, SSE ``error`` chunks, timeouts, disconnects) are
returned as ``success=False`` with ``error`` set; they never raise.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

GENERATE = "generate"
CHAT = "chat"
BACKEND_NAMES = {GENERATE: "sglang", CHAT: "sglang-oai-chat"}  # bench_serving's --backend values
PATHS = {GENERATE: "/generate", CHAT: "/v1/chat/completions"}
MAX_SSE_BUFFER = 64 * 1024 * 1024  # a single SSE event larger than this is an error, not a hang


@dataclass
class RequestResult:
    # Field names as in sglang.benchmark.serving.RequestFuncOutput where they overlap.
    prompt_len: int = 0
    output_len: int = 0
    ttft: float = 0.0
    latency: float = 0.0
    itl: list[float] = field(default_factory=list)
    generated_text: str = ""
    success: bool = False
    error: str = ""
    start_time: float = 0.0
    spec_accept_length: float = 0.0
    # Ours.
    index: int = -1
    prompt_index: int = -1
    spec_verify_ct: int = 0
    chunk_gaps: list[float] = field(default_factory=list)
    num_chunks: int = 0
    finish_reason: Any = None
    server_e2e_latency: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class RequestSpec:
    api: str
    base_url: str
    prompt: str
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    ignore_eos: bool = False
    stream: bool = True
    model: str = "default"
    chat_template_kwargs: dict | None = None
    extra_body: dict | None = None
    timeout: float = 600.0
    keep_text: bool = False


def build_payload(spec: RequestSpec) -> dict:
    if spec.api == GENERATE:
        sp = {
            "max_new_tokens": spec.max_new_tokens,
            "temperature": spec.temperature,
            "ignore_eos": spec.ignore_eos,
        }
        if spec.top_p < 1.0:
            sp["top_p"] = spec.top_p
        body = {"text": spec.prompt, "sampling_params": sp, "stream": spec.stream}
    elif spec.api == CHAT:
        body = {
            "model": spec.model,
            "messages": [{"role": "user", "content": spec.prompt}],
            "max_completion_tokens": spec.max_new_tokens,
            "temperature": spec.temperature,
            "stream": spec.stream,
            "ignore_eos": spec.ignore_eos,
            "return_spec_tokens_details": True,
        }
        if spec.stream:
            body["stream_options"] = {"include_usage": True}
        if spec.top_p < 1.0:
            body["top_p"] = spec.top_p
        if spec.chat_template_kwargs:
            body["chat_template_kwargs"] = spec.chat_template_kwargs
    else:
        raise ValueError(f"unknown api {spec.api!r}")
    body.update(spec.extra_body or {})
    return body


async def iter_sse(response: aiohttp.ClientResponse):
    """Yield each ``data:`` payload (bytes) of an SSE stream; tolerant of chunking and bare JSON lines."""
    buf = b""
    async for chunk in response.content.iter_any():
        buf += chunk
        if len(buf) > MAX_SSE_BUFFER:
            raise ValueError("SSE event exceeds buffer limit")
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line, buf = buf[:nl].strip(), buf[nl + 1 :]
            if not line or line.startswith(b":") or line.startswith(b"event:"):
                continue
            yield line[5:].strip() if line.startswith(b"data:") else line
    line = buf.strip()
    if line:
        yield line[5:].strip() if line.startswith(b"data:") else line


def _error_text(data: dict) -> str | None:
    err = data.get("error")
    if err is None:
        return None
    if isinstance(err, dict):
        return f"server error {err.get('code', '')}: {err.get('message', err)}"
    return f"server error: {err}"


async def send_request(
    session: aiohttp.ClientSession, spec: RequestSpec, prompt_len: int = 0
) -> RequestResult:
    out = RequestResult(prompt_len=prompt_len)
    try:
        await asyncio.wait_for(_send(session, spec, out), timeout=spec.timeout)
    except TimeoutError:
        out.success, out.error = False, f"timeout after {spec.timeout:g}s"
    except asyncio.CancelledError:
        raise
    except Exception as e:  # connection refused/reset, bad JSON, ... counted, never fatal
        out.success, out.error = False, f"{type(e).__name__}: {e}"
    if not out.success:
        out.latency = out.latency or (
            time.perf_counter() - out.start_time if out.start_time else 0.0
        )
    if not spec.keep_text:
        out.generated_text = ""
    return out


async def _send(session: aiohttp.ClientSession, spec: RequestSpec, out: RequestResult) -> None:
    url = spec.base_url.rstrip("/") + PATHS[spec.api]
    payload = build_payload(spec)
    st = time.perf_counter()
    out.start_time = st
    async with session.post(url, json=payload) as resp:
        if resp.status != 200:
            body = (await resp.text())[:500]
            out.error = f"HTTP {resp.status}: {body}"
            out.latency = time.perf_counter() - st
            return
        if not spec.stream:
            data = await resp.json(content_type=None)
            out.latency = out.ttft = time.perf_counter() - st
            if (err := _error_text(data)) is not None:
                out.error = err
                return
            _absorb_final(spec.api, data, out)
            out.success = True
            return
        if spec.api == GENERATE:
            await _stream_generate(resp, st, out)
        else:
            await _stream_chat(resp, st, out)


def _absorb_final(api: str, data: dict, out: RequestResult) -> None:
    if api == GENERATE:
        meta = data.get("meta_info") or {}
        out.generated_text = data.get("text", "")
        _absorb_meta(meta, out)
    else:
        choice = (data.get("choices") or [{}])[0]
        out.generated_text = (choice.get("message") or {}).get("content") or ""
        out.finish_reason = choice.get("finish_reason")
        out.output_len = (data.get("usage") or {}).get("completion_tokens", 0)
        out.prompt_len = int((data.get("usage") or {}).get("prompt_tokens") or out.prompt_len)
        _absorb_spec(
            ((data.get("sglext") or {}).get("spec_tokens_details"))
            or choice.get("meta_info")
            or {},
            out,
        )


def _absorb_meta(meta: dict, out: RequestResult) -> None:
    if meta.get("prompt_tokens"):
        out.prompt_len = int(
            meta["prompt_tokens"]
        )  # the server's count, as bench_serving records it
    if "completion_tokens" in meta:
        out.output_len = int(meta["completion_tokens"])
    if meta.get("finish_reason") is not None:
        out.finish_reason = meta["finish_reason"]
    if meta.get("e2e_latency") is not None:
        out.server_e2e_latency = float(meta["e2e_latency"])
    _absorb_spec(meta, out)


def _absorb_spec(d: dict, out: RequestResult) -> None:
    if d.get("spec_verify_ct"):
        out.spec_verify_ct = int(d["spec_verify_ct"])
    if d.get("spec_accept_length"):
        out.spec_accept_length = float(d["spec_accept_length"])


async def _stream_generate(resp, st: float, out: RequestResult) -> None:
    last_ts, last_len = st, 0
    done = False
    async for data_bytes in iter_sse(resp):
        if data_bytes == b"[DONE]":
            done = True
            break
        data = json.loads(data_bytes)
        if (err := _error_text(data)) is not None:
            out.error = err
            out.latency = time.perf_counter() - st
            return
        now = time.perf_counter()
        meta = data.get("meta_info") or {}
        n = int(meta.get("completion_tokens", len(data.get("output_ids") or [])))
        _absorb_meta(meta, out)
        out.generated_text = data.get("text", out.generated_text)
        new = n - last_len
        if new <= 0:
            continue
        out.num_chunks += 1
        if last_len == 0:
            out.ttft = now - st
        else:
            gap = now - last_ts
            out.chunk_gaps.append(gap)
            out.itl.extend([gap / new] * new)
        last_ts, last_len = now, n
    out.latency = time.perf_counter() - st
    out.output_len = last_len
    if not done:
        out.error = "stream ended without [DONE]"
        return
    out.success = True


async def _stream_chat(resp, st: float, out: RequestResult) -> None:
    last_ts = st
    got_first = False
    done = False
    usage_tokens = None
    async for data_bytes in iter_sse(resp):
        if data_bytes == b"[DONE]":
            done = True
            break
        data = json.loads(data_bytes)
        if (err := _error_text(data)) is not None:
            out.error = err
            out.latency = time.perf_counter() - st
            return
        now = time.perf_counter()
        if data.get("usage"):
            usage_tokens = data["usage"].get("completion_tokens", usage_tokens)
            out.prompt_len = int(data["usage"].get("prompt_tokens") or out.prompt_len)
        if data.get("sglext"):
            details = data["sglext"].get("spec_tokens_details")
            if isinstance(details, list):
                details = details[0] if details else {}
            _absorb_spec(details or {}, out)
        for choice in data.get("choices") or []:
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
            if not piece:
                continue
            out.generated_text += piece
            out.num_chunks += 1
            if not got_first:
                out.ttft = now - st
                got_first = True
            else:
                gap = now - last_ts
                out.chunk_gaps.append(gap)
                out.itl.append(gap)  # per chunk, as bench_serving does for chat streams
            last_ts = now
    out.latency = time.perf_counter() - st
    if not done:
        out.error = "stream ended without [DONE]"
        return
    if usage_tokens is None:
        out.error = (
            "no usage chunk (server ignored stream_options.include_usage); token count unknown"
        )
        return
    out.output_len = int(usage_tokens)
    out.success = True
