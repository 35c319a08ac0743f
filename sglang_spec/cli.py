"""The ``sglang-spec`` console script.

Each subcommand lives in its own module, imported only when that subcommand runs, so that
``sglang-spec --help`` stays fast and needs neither SGLang nor a model. A subcommand module
provides ``add_arguments(parser)`` and ``run(args) -> int``; the parser is
:class:`sglang_spec.cli_args.Parser` (defaults in ``--help``, one-line errors with exit code 2),
and the arguments are validated by their ``type=`` before ``run`` loads anything.
"""

from __future__ import annotations

import importlib
import sys

from sglang_spec.cli_args import Parser

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "sglang_spec.demo",
        "AR vs DFLASH vs DDTREE on the bundled tiny pair (CPU, reference engine)",
    ),
    "serve": (
        "sglang_spec.serving.launch",
        "start an SGLang server from server_configs/ and wait for /health",
    ),
    "cpu-server": (
        "sglang_spec.serving.cpu_server.cli",
        "CPU demo/test server with SGLang's HTTP API (not a production engine)",
    ),
    "patch": (
        "sglang_spec.patching",
        "apply / check / revert the patch set for the installed SGLang pin",
    ),
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    return (
        "usage: sglang-spec COMMAND [options]   (sglang-spec COMMAND --help)\n\ncommands:\n"
        + "\n".join(lines)
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name = argv[0]
    if name not in SUBCOMMANDS:
        print(
            f"sglang-spec: unknown command {name!r}; valid: {', '.join(SUBCOMMANDS)}\n\n{_usage()}",
            file=sys.stderr,
        )
        return 2
    module, help_text = SUBCOMMANDS[name]
    mod = importlib.import_module(module)
    parser = Parser(prog=f"sglang-spec {name}", description=help_text)
    mod.add_arguments(parser)
    return int(mod.run(parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
