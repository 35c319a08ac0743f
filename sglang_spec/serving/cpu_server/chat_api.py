"""``POST /v1/chat/completions``: OpenAI chat, streaming or not, with SGLang's extensions."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing

from aiohttp import web

from sglang_spec.serving.cpu_server.responses import (
    BadRequest,
    bad_request,
    close_sse,
    open_sse,
    server_error,
    sse,
)


async def handle(server, request):
    try:
        body = await server.read_json(request)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list")
        kwargs = body.get("chat_template_kwargs") or {}
        input_ids = (
            server.codec.apply_chat_template(messages, **kwargs)
            if kwargs
            else server.codec.apply_chat_template(messages)
        )
        mnt = body.get("max_completion_tokens", body.get("max_tokens"))
        sampling = server.sampling(body, mnt)
    except (BadRequest, TypeError, ValueError) as e:
        return bad_request(e)
    rid = "chatcmpl-" + uuid.uuid4().hex
    async with server.admit:
        with server.running():
            if body.get("stream"):
                return await _stream(server, request, body, rid, input_ids, sampling)
            return await _once(server, body, rid, input_ids, sampling)


def _oai_finish(finish) -> str | None:
    if not finish:
        return None
    return "length" if finish.get("type") == "length" else "stop"


def _spec_details(meta: dict) -> dict | None:
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


async def _once(server, body, rid, input_ids, sampling):
    try:
        out, finish, stats = await server.run_to_end(input_ids, sampling)
    except Exception as e:
        return web.json_response(server_error(e), status=500)
    server.finish_record(rid, len(input_ids), out, stats, "chat")
    meta = server.meta(rid, len(input_ids), out, finish, stats, True)
    resp = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": server.model_name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": server.text(out, finish)},
                "finish_reason": _oai_finish(finish),
                "meta_info": meta,
            }
        ],
        "usage": {
            "prompt_tokens": len(input_ids),
            "completion_tokens": len(out),
            "total_tokens": len(input_ids) + len(out),
        },
    }
    if body.get("return_spec_tokens_details") and _spec_details(meta):
        resp["sglext"] = {"spec_tokens_details": _spec_details(meta)}
    return web.json_response(resp)


async def _stream(server, request, body, rid, input_ids, sampling):
    resp = await open_sse(request)
    created = int(time.time())

    def chunk(delta=None, finish_reason=None, **extra):
        choices = (
            []
            if delta is None
            else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
        )
        d = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": server.model_name,
            "choices": choices,
            **extra,
        }
        return sse(d)

    opts = body.get("stream_options") or {}
    out, finish, stats, sent = [], None, None, ""
    try:
        await resp.write(chunk({"role": "assistant", "content": ""}))
        async with aclosing(server.steps(input_ids, sampling)) as steps:
            async for step in steps:
                out, finish, stats = step
                text = server.text(out, finish)
                delta, sent = text[len(sent) :], text
                if delta:
                    await resp.write(chunk({"content": delta}))
        server.finish_record(rid, len(input_ids), out, stats, "chat")
        await resp.write(chunk({}, _oai_finish(finish)))
        meta = server.meta(rid, len(input_ids), out, finish, stats, True)
        details = _spec_details(meta)
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
        return await close_sse(resp, e)
    return await close_sse(resp)
