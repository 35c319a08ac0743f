"""Prompts from another code base than the training corpus (``python -m training.prompts``).

The tiny pair learned the Python standard library; its held-out prompts come from held-out stdlib
modules (``--stage tokenizer``). Issue 15 also measures acceptance on code the pair never saw in
any form: signature + docstring prompts (the same extraction, ``corpus.heldout_prompts``) from an
installed third-party package, written as a JSONL beside the fixtures::

    python -m training.prompts --package click --out sglang_spec/fixtures/tiny-pair/othercode_prompts.jsonl

Each row gets ``source`` (the package, its version and licence, from its metadata).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
from pathlib import Path

from training.corpus import heldout_prompts
from training.tokenizer import load_tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "sglang_spec" / "fixtures" / "tiny-pair"


def package_files(package: str) -> list[str]:
    """The package's ``.py`` files, sorted (a deterministic prompt order)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"--package {package!r}: not an installed package (a directory of modules)"
        )
    root = spec.submodule_search_locations[0]
    return sorted(
        os.path.join(dp, f) for dp, _, fns in os.walk(root) for f in fns if f.endswith(".py")
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--package", required=True, help="an installed pure-Python package, e.g. click")
    ap.add_argument("--out", required=True, help="the JSONL to write")
    ap.add_argument("--per-module", type=int, default=3)
    ap.add_argument("--fixtures", default=str(FIXTURES), help="where tokenizer/ is")
    args = ap.parse_args(argv)
    if args.per_module < 2:
        ap.error(f"--per-module={args.per_module} must be >= 2")
    files = package_files(args.package)
    try:
        meta = importlib.metadata.metadata(args.package)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(
            f"--package {args.package!r}: no distribution metadata (version, licence)"
        ) from None
    licence = meta.get("License-Expression") or meta.get("License") or "unknown"
    source = f"{args.package} {meta['Version']} ({licence})"
    tok, _ = load_tokenizer(args.fixtures)
    rows = heldout_prompts(files, tok, per_module=args.per_module)
    if not rows:
        raise SystemExit(f"--package {args.package!r}: no documented public functions found")
    with open(args.out, "w") as fh:
        for r in rows:
            fh.write(json.dumps({**r, "source": source}) + "\n")
    print(f"{args.out}: {len(rows)} prompts from {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
