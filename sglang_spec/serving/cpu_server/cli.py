"""``sglang-spec cpu-server``: serve an engine on the CPU behind SGLang's HTTP API.

Every argument is checked before the engine loads: the flags by their ``type=``, ``--engine`` and
``--engine-arg`` by :func:`load_engine` and the factory (:class:`EngineArgumentError`), the
tokenizer by loading it first; each refusal is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import sys

from aiohttp import web

from sglang_spec.cli_args import Parser, fail, int_range, nonempty, port, usage_error
from sglang_spec.serving.cpu_server.codec import ByteCodec, HFTokenizerCodec
from sglang_spec.serving.cpu_server.engines import EngineArgumentError, load_engine
from sglang_spec.serving.cpu_server.runner import is_loopback
from sglang_spec.serving.cpu_server.server import CPUServer

PROG = "sglang-spec cpu-server"
MAX_RUNNING_REQUESTS = 4096  # engine threads; a CPU demo server needs far fewer


def _engine_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"got {text!r}; valid: KEY=VALUE")
    return key.strip(), value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "CPU demo/test server with SGLang's HTTP API over a pluggable engine "
        "(not a production engine)."
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address")
    parser.add_argument("--port", type=port, default=30000, help="TCP port")
    parser.add_argument(
        "--allow-remote", action="store_true", help="allow binding a non-loopback address"
    )
    parser.add_argument(
        "--engine",
        type=nonempty,
        default="toy",
        help="'toy' or 'package.module:factory', e.g. sglang_spec.serving.reference_engine:make",
    )
    parser.add_argument(
        "--engine-arg",
        action="append",
        type=_engine_arg,
        default=[],
        metavar="KEY=VALUE",
        help="keyword argument for the engine factory (repeatable); toy: k, step_ms, "
        "draft_tokens; reference_engine: pair, method, budget, fixtures, threads",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="HF tokenizer path/name (default: byte codec, no model)"
    )
    parser.add_argument(
        "--model-name", type=nonempty, default=None, help="served model name (default: engine name)"
    )
    parser.add_argument(
        "--max-running-requests",
        type=int_range(1, MAX_RUNNING_REQUESTS),
        default=8,
        help="requests admitted at once (more wait)",
    )
    parser.add_argument(
        "--parallel-steps",
        action="store_true",
        help="run engine steps of different requests concurrently (engine must be thread-safe)",
    )


def run(args: argparse.Namespace) -> int:
    if not is_loopback(args.host) and not args.allow_remote:
        return usage_error(PROG, "--host", args.host, "a loopback address, or pass --allow-remote")
    try:  # the tokenizer first: it is cheaper than most engines
        codec = HFTokenizerCodec(args.tokenizer) if args.tokenizer else ByteCodec()
    except (OSError, ValueError) as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return usage_error(
            PROG, "--tokenizer", args.tokenizer, f"a tokenizer directory or hub name ({reason})"
        )
    try:
        engine = load_engine(args.engine, dict(args.engine_arg))
    except EngineArgumentError as e:
        return fail(PROG, str(e))
    server = CPUServer(
        engine,
        codec,
        model_name=args.model_name or getattr(engine, "name", "cpu-demo"),
        max_running_requests=args.max_running_requests,
        parallel_steps=args.parallel_steps,
    )
    print(
        f"cpu-server: {server.model_name} (speculative={server.spec_algorithm}) on "
        f"http://{args.host}:{args.port} -- CPU demo/test server, not a production engine",
        file=sys.stderr,
        flush=True,
    )
    web.run_app(server.make_app(), host=args.host, port=args.port, access_log=None, print=None)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog=PROG)
    add_arguments(parser)
    return run(parser.parse_args(argv))
