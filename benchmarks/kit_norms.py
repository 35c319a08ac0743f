"""The GPU kit's RMSNorms: its ``sgl_kernel`` stand-in's torch ops against ``e2e.kit_norms``'s one
Triton launch each (what ``e2e.scale``'s ``fused-norms`` serves).

Run where the kit's stand-in is importable (the lent GPU, after ``source .gpu-kit/setup.sh``)::

    $SGLANG_KIT_PYTHON benchmarks/kit_norms.py --json $OUT/kit_norms.json

For each of the four norms (``rmsnorm``, ``fused_add_rmsnorm``, ``gemma_rmsnorm``,
``gemma_fused_add_rmsnorm``) at rows x width cells of the servers (the Qwen3.6-27B shape's hidden
5120 at 1, 16, 128 and 512 rows: a decode of 1 request, C = 16 NEXTN or DDTREE(7) verifies, C = 32
budget 15; its attention q/k heads, 256 wide, at 16 x 8 heads; the tiny pair's hidden 256), µs per
call of each form, medians of CUDA-graph replays of ``CALLS`` calls (``benchmarks.gdn_verify.time_us``).

Check, every cell (a failure makes the script exit 1 after the table): the Triton form against the
stand-in itself (the oracle the fused-norm servers replace) on the same random bf16 inputs: the
output within one bf16 rounding step (|diff| <= 2^-7 |x| + 1e-6); a fused form's residual
(the rounded sum) equal. ``--device cpu`` (with ``TRITON_INTERPRET=1``) runs one small cell, a
smoke run for the tests, where the residual may be one step off (the interpreter's bf16 cast
truncates).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if (
    _REPO not in sys.path
):  # `python benchmarks/...` puts benchmarks/, not the repo root, on sys.path
    sys.path.insert(0, _REPO)

NAMES = ("rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm")
CELLS = [(1, 5120), (16, 5120), (128, 5120), (512, 5120), (128, 256), (16, 256)]
SMOKE_CELLS = [(3, 96)]


def _stand_in():
    """The kit's sgl_kernel stand-in, or a one-line error naming what this found instead."""
    try:
        import sgl_kernel
    except ImportError:
        sys.exit(
            "benchmarks/kit_norms.py: no sgl_kernel here; run it after source .gpu-kit/setup.sh"
        )
    if not getattr(sgl_kernel, "IS_PY_SHIM", False):
        sys.exit(f"benchmarks/kit_norms.py: {sgl_kernel.__file__} is not the kit's stand-in")
    return sgl_kernel


def _inputs(rows: int, width: int, device, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    x, r = (torch.randn(rows, width, generator=gen).bfloat16().to(device) for _ in range(2))
    w = (torch.randn(width, generator=gen) * 0.3).bfloat16().to(device)
    return x, r, w


def _run(fn, name: str, x, r, w) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``name`` by ``fn`` on copies of the inputs: (output, residual or None)."""
    xi, ri = x.clone(), r.clone()
    if "fused_add" in name:
        fn(xi, ri, w, 1e-6)
        return xi, ri
    return fn(xi, w, 1e-6), None


def _steps(got: torch.Tensor, want: torch.Tensor) -> float:
    """Max |diff| in bf16 rounding steps of ``want`` (2^-7 |x| + 1e-6)."""
    from benchmarks.gdn_tree_recurrence import BF16_STEP, _rel_err

    return _rel_err(got, want, 1e-6, BF16_STEP)


def check_cell(ours, theirs, name: str, x, r, w, exact_residual: bool) -> dict:
    """The Triton form against the stand-in on one cell. The residual must be equal where the
    kernel runs compiled; Triton's CPU interpreter casts to bf16 by truncation, one step off."""
    got, got_r = _run(getattr(ours, name), name, x, r, w)
    want, want_r = _run(getattr(theirs, name), name, x, r, w)
    out = {"out_err": _steps(got, want), "residual_equal": None}
    ok = out["out_err"] <= 1
    if got_r is not None:
        out["residual_equal"] = bool(torch.equal(got_r, want_r))
        ok &= out["residual_equal"] if exact_residual else _steps(got_r, want_r) <= 1
    out["ok"] = ok
    return out


def _time(fn, name: str, x, r, w, reps: int) -> float:
    """µs per call of ``fn`` on scratch copies (the fused forms work in place)."""
    from benchmarks.gdn_verify import time_us

    xi, ri = x.clone(), r.clone()
    if "fused_add" in name:
        return time_us(lambda: fn(xi, ri, w, 1e-6), x.device, reps)
    return time_us(lambda: fn(xi, w, 1e-6), x.device, reps)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python benchmarks/kit_norms.py", description=__doc__)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--reps", type=int, default=50, help="timed graph replays per cell")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    theirs = _stand_in()
    from e2e import kit_norms as ours

    gen = torch.Generator().manual_seed(0)
    rows, failed = [], 0
    print(
        "| norm | rows | width | stand-in µs | Triton µs | ratio | out err (<= 1) | residual equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n_rows, width in SMOKE_CELLS if device.type == "cpu" else CELLS:
        x, r, w = _inputs(n_rows, width, device, gen)
        for name in NAMES:
            row = {"norm": name, "rows": n_rows, "width": width}
            row |= check_cell(ours, theirs, name, x, r, w, exact_residual=device.type == "cuda")
            failed += not row["ok"]
            if device.type == "cuda":
                row["stand_in_us"] = _time(getattr(theirs, name), name, x, r, w, args.reps)
                row["triton_us"] = _time(getattr(ours, name), name, x, r, w, args.reps)
            rows.append(row)
            t, s = row.get("triton_us"), row.get("stand_in_us")
            times = (f"{s:.1f}", f"{t:.1f}", f"{s / t:.1f}x") if t else ("-", "-", "-")
            print(
                f"| {name} | {n_rows} | {width} | {' | '.join(times)} | {row['out_err']:.2f} | "
                f"{'-' if row['residual_equal'] is None else row['residual_equal']} |"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "rows": rows}, f, indent=1)
    if failed:
        print(f"{failed} cell(s) failed the check against the stand-in", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
