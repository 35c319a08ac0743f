"""Error bodies and server-sent events, written as SGLang writes them."""

from __future__ import annotations

import json

from aiohttp import web


class BadRequest(Exception):
    """A request the server refuses with HTTP 400 (:func:`bad_request`)."""


def server_error(e: Exception) -> dict:
    """SGLang's body for an engine failure: an HTTP 500 response, or one SSE chunk mid-stream."""
    return {"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error", "code": 500}}


def bad_request(e: Exception) -> web.Response:
    return web.json_response(
        {"error": {"message": str(e), "type": "invalid_request_error", "code": 400}}, status=400
    )


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def open_sse(request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await resp.prepare(request)
    return resp


async def close_sse(resp: web.StreamResponse, error: Exception | None = None) -> web.StreamResponse:
    """End a stream as SGLang does: the error chunk (if the engine failed), then ``[DONE]``."""
    if error is not None:
        await resp.write(sse(server_error(error)))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
