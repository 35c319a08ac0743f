"""``POST /generate``: SGLang's native API (cumulative ``text``/``output_ids``, ``meta_info``)."""

from __future__ import annotations

import asyncio
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
        if isinstance(body.get("text"), list) or (
            body.get("input_ids") and isinstance(body["input_ids"][0], list)
        ):
            raise BadRequest("batched requests are not supported by the CPU demo server")
        if body.get("input_ids") is not None:
            input_ids = [int(t) for t in body["input_ids"]]
        elif isinstance(body.get("text"), str):
            input_ids = server.codec.encode(body["text"])
        else:
            raise BadRequest("need 'text' or 'input_ids'")
        sp = body.get("sampling_params") or {}
        sampling = server.sampling(sp, sp.get("max_new_tokens"))
    except (BadRequest, TypeError, ValueError, IndexError) as e:
        return bad_request(e)
    rid = str(body.get("rid") or uuid.uuid4().hex)
    async with server.admit:
        with server.running():
            if body.get("stream"):
                return await _stream(server, request, rid, input_ids, sampling)
            return await _once(server, rid, input_ids, sampling)


async def _once(server, rid, input_ids, sampling):
    try:
        out, finish, stats = await server.run_to_end(input_ids, sampling)
    except Exception as e:  # engine failure -> HTTP 500, the server keeps serving
        return web.json_response(server_error(e), status=500)
    server.finish_record(rid, len(input_ids), out, stats, "generate")
    return web.json_response(
        {
            "text": server.text(out, finish),
            "output_ids": list(out),
            "meta_info": server.meta(rid, len(input_ids), out, finish, stats, True),
        }
    )


async def _stream(server, request, rid, input_ids, sampling):
    resp = await open_sse(request)
    out, stats = [], None
    try:
        async with aclosing(server.steps(input_ids, sampling)) as steps:
            async for out, finish, stats in steps:
                final = finish is not None
                chunk = {
                    "text": server.text(out, finish),
                    "output_ids": list(out),
                    "meta_info": server.meta(rid, len(input_ids), out, finish, stats, final),
                }
                await resp.write(sse(chunk))
        server.finish_record(rid, len(input_ids), out, stats, "generate")
    except (ConnectionResetError, asyncio.CancelledError):
        raise  # client went away; steps()'s finally closed the engine generator
    except Exception as e:
        return await close_sse(resp, e)
    return await close_sse(resp)
