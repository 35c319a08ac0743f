"""The ``sglang-spec`` console script.

Each subcommand lives in its own module, imported only when that subcommand runs, so that
``sglang-spec --help`` stays fast and needs neither SGLang nor a model. A subcommand module
provides ``add_arguments(parser)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "bench-tree": ("sglang_spec.bench.tree", "time DDTree build / layout / walk against the reference port"),
    "serve": ("sglang_spec.serving.launch", "start an SGLang server from server_configs/ and wait for /health"),
    "cpu-server": ("sglang_spec.serving.cpu_server", "CPU demo/test server with SGLang's HTTP API (not a production engine)"),
    "patch": ("sglang_spec.patching", "apply / check / revert the patch set for the installed SGLang pin"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-spec", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        p.set_defaults(_module=module)
    # Parse the subcommand name first, then let its module declare its own options.
    args, rest = parser.parse_known_args(argv)
    mod = importlib.import_module(args._module)
    sub_parser = argparse.ArgumentParser(prog=f"sglang-spec {args.command}")
    mod.add_arguments(sub_parser)
    return int(mod.run(sub_parser.parse_args(rest)) or 0)


if __name__ == "__main__":
    sys.exit(main())
