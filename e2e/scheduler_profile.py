"""``python -m e2e.scheduler_profile DIR [--e2e E2E_JSON] [--top N] [--only REGEX]``: where the schedulers' host
time goes, from the folded stacks ``e2e/profile_schedulers.sh`` writes (py-spy's raw format, one
``port<N>.txt`` per server, or ``port<N>.txt.xz`` as the repository keeps them), and how the
servers differ.

For each function (name, file) the inclusive share: the fraction of a server's samples with that
function anywhere on the stack (recursion counted once). The tiny pair's step is host-bound, so a
share times the server's step time is that function's time a step. With ``--e2e`` (plain or .xz)
the servers are named by their labels (``e2e.json``'s ``cmd`` holds each server's ``--port``). The table lists the
functions whose share differs most between the first server and each other one, by default the
adaptive DDTREE server against the fixed DDTREE(63) when both are there; ``--only`` keeps the
functions whose ``name (file)`` matches a regular expression (``budget|measure`` for the adaptive
server's own calls).
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from e2e.tiny_pair import load_runs, read_text

FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]*)(?::\d+)?\)$")


def read_folded(path: Path) -> tuple[Counter, int]:
    """(inclusive samples per ``func (file)``, total samples) of one py-spy raw file."""
    inclusive: Counter = Counter()
    total = 0
    for line in read_text(path).splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        names = set()
        for frame in stack.split(";"):
            m = FRAME.match(frame)
            names.add(f"{m['func']} ({Path(m['file']).name})" if m else frame)
        for name in names:
            inclusive[name] += n
    return inclusive, total


def port_labels(e2e: Path) -> dict[str, str]:
    """``port<N>`` -> the label of the server e2e.json ran on port N."""
    out = {}
    for r in load_runs(str(e2e)):
        m = re.search(r"--port[ =](\d+)", r.get("cmd", ""))
        if m:
            out[f"port{m[1]}"] = r["label"]
    return out


def order(names: list[str]) -> list[str]:
    """The adaptive DDTREE server first, the fixed DDTREE one next, then the rest."""

    def rank(n: str) -> int:
        if "adaptive" in n:
            return 0
        return 1 if n.startswith("ddtree") else 2

    return sorted(names, key=lambda n: (rank(n), n))


def table(
    profiles: dict[str, tuple[Counter, int]], top: int, only: re.Pattern | None = None
) -> str:
    names = order(list(profiles))
    first, rest = names[0], names[1:]
    shares = {n: {f: c / max(t, 1) for f, c in inc.items()} for n, (inc, t) in profiles.items()}
    diff = Counter()
    for f in set().union(*(shares[n] for n in names)):
        if only is not None and not only.search(f):
            continue
        a = shares[first].get(f, 0.0)
        diff[f] = max((abs(a - shares[o].get(f, 0.0)) for o in rest), default=a)
    head = ["function (file)", *(f"{n} ({profiles[n][1]} samples)" for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f, _ in diff.most_common(top):
        cells = [f"{100 * shares[n].get(f, 0.0):.1f} %" for n in names]
        lines.append(f"| {f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="the folder of port<N>.txt files")
    ap.add_argument("--e2e", type=Path, help="e2e.json of the run, to name the servers")
    ap.add_argument("--top", type=int, default=30, help="rows (default 30)")
    ap.add_argument("--only", help="a regular expression the rows' 'name (file)' must match")
    args = ap.parse_args(argv)
    files = sorted([*args.dir.glob("port*.txt"), *args.dir.glob("port*.txt.xz")])
    if not files:
        raise SystemExit(
            f"{args.dir}: no port<N>.txt files; valid: e2e/profile_schedulers.sh's $OUT/pyspy"
        )
    if args.top < 1:
        raise SystemExit(f"--top {args.top}: give a number >= 1")
    try:
        only = re.compile(args.only) if args.only is not None else None
    except re.error as e:
        raise SystemExit(f"--only {args.only!r}: not a regular expression ({e})") from None
    labels = port_labels(args.e2e) if args.e2e else {}
    stems = [f.name.split(".")[0] for f in files]
    profiles = {labels.get(s, s): read_folded(f) for s, f in zip(stems, files, strict=True)}
    print(
        "Inclusive share of each scheduler's samples (py-spy, idle left out), the functions "
        "that differ most from the first server's:"
    )
    print(table(profiles, args.top, only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
