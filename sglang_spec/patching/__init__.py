"""``sglang-spec patch apply | check | revert | manifest | --list``: patches for pinned SGLang.

The patch files live in ``patches/<sglang-version>/`` (unified diffs against that
release's ``sglang/`` tree, listed with their sha256 hashes in ``manifest.json``); see
``patches/README.md`` for what each one does and why a plugin hook cannot. ``--list`` prints the
support matrix (``patches/support.json``): every surveyed SGLang release, supported or not, and why;
``apply`` on a release without a patch set refuses with that reason.

Exit codes: 0 ok (``check``: applied); 1 check failed / not applied / refused;
2 usage error, sglang not found, or unsupported sglang version.
"""

from __future__ import annotations

import argparse
import json
import sys

from sglang_spec.cli_args import Parser, existing_dir
from sglang_spec.patching.core import (  # noqa: F401  (re-exported API)
    APPLIED,
    FOREIGN,
    NOT_APPLIED,
    PARTIAL,
    PatchingError,
    Result,
    apply,
    build_manifest,
    check,
    default_patches_dir,
    detect_version,
    list_matrix,
    locate,
    revert,
    supported_versions,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument(
        "action",
        nargs="?",
        choices=["apply", "check", "revert", "manifest"],
        help="apply: patch the tree (no-op if already applied); check: report "
        "applied / not applied / partially applied / modified by someone else "
        "(exit 0 only if applied); revert: restore the original files byte for byte; "
        "manifest: (maintainers) print manifest.json for the tree's version from "
        "patches/<version>/series and a pristine tree",
    )
    parser.add_argument(
        "--list",
        action="store_true",
        help="print the support matrix: each surveyed SGLang release, supported or not, and why",
    )
    parser.add_argument(
        "--sglang-dir",
        metavar="DIR",
        type=existing_dir,
        default=None,
        help="the directory that CONTAINS the sglang/ package (e.g. site-packages), or the "
        "sglang package directory itself; both are accepted. Default: the sglang that "
        "this Python would import (found without importing it)",
    )
    parser.add_argument(
        "--patches-dir",
        metavar="DIR",
        type=existing_dir,
        default=None,
        help="where the per-version patch sets live (default: $SGLANG_SPEC_PATCHES_DIR, "
        "else patches/ next to the sglang_spec package)",
    )


def run(args: argparse.Namespace) -> int:
    if args.list == (args.action is not None):
        print(
            "sglang-spec patch: give one of --list or an action (apply, check, revert, manifest)",
            file=sys.stderr,
        )
        return 2
    try:
        if args.list:
            result = list_matrix(args.sglang_dir, args.patches_dir)
        elif args.action == "manifest":
            tree = locate(args.sglang_dir)
            version, _ = detect_version(tree)
            patches_dir = args.patches_dir or default_patches_dir()
            print(json.dumps(build_manifest(patches_dir, version, tree), indent=2))
            return 0
        else:
            result = {"apply": apply, "check": check, "revert": revert}[args.action](
                args.sglang_dir, args.patches_dir
            )
    except PatchingError as e:
        print(f"sglang-spec patch {args.action or '--list'}: {e}", file=sys.stderr)
        return e.exit_code
    print("\n".join(result.lines))
    return result.code


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="sglang-spec patch")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
