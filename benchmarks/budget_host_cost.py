"""``python -m benchmarks.budget_host_cost``: the host time a ``--speculative-adaptive`` DDTREE
server adds to each decode step (no model runs; on the GPU when there is one).

Per decode step the worker asks the controller for the step's budget (``BudgetController.choose``)
and, for a step the controller measures (``BudgetController.measure``: every step but those
``measure_interval`` samples out while the bucket's budget measures every candidate), queues a host copy of the step's accepted node ids (``budget.host_copy``: pinned memory, a
non-blocking copy), and, once they are on the host, sums them per measured budget
(``accepted_tokens_within``) and feeds the sums to the moving averages (``observe``). A fixed
budget does none of this. On the tiny pair the step is host-bound (about 3.5 ms at bs 1 on an
H100), so this host time is step time: sessions 39-40 measured the adaptive server's steps 2-5 %
longer than the fixed DDTREE(63)'s at the same budget (``e2e.tiny_bar``'s step rates), and in
session 40 py-spy put about 2.4 % of its scheduler's samples in these calls
(``e2e/profile_schedulers.sh``), 2-4 times what their timing in a loop says (the loop runs them
warm). This times the four calls at each batch size on random walks of the tiny server's shape
(verify width 64, accept width 16, the controller of ``e2e/adaptive_budgets_tiny_h200.json``), the
copy from ``--device`` (default: cuda when there is one) and the rest on the host as the scheduler
runs them, and prints a table of median host microseconds, with the mean a step at the config's
``measure_interval`` where the bucket's budget measures every candidate (the tiny pair's 63 does:
choose every step, the rest on one step in the interval), or choose alone where the bucket has one
candidate left (bs 8 and 32 of that config: nothing to measure); ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np
import torch

from benchmarks.timing import median_timer
from sglang_spec.plugin.budget import (
    BudgetController,
    BudgetPolicy,
    accepted_tokens_within,
    host_copy,
)

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "e2e/adaptive_budgets_tiny_h200.json"


def walks(bs: int, width: int, accept_width: int, seed: int = 0) -> np.ndarray:
    """``[bs, accept_width]`` flat accepted node ids as the walk leaves them: per request a path of
    increasing slots from the root, -1 padded."""
    rng = np.random.default_rng(seed)
    out = np.full((bs, accept_width), -1, dtype=np.int32)
    for b in range(bs):
        n = int(rng.integers(1, accept_width + 1))
        slots = np.sort(rng.choice(np.arange(1, width), n - 1, replace=False))
        out[b, :n] = np.concatenate([[0], slots]) + b * width
    return out


def time_batch(
    policy: BudgetPolicy, bs: int, repeats: int, device: torch.device
) -> dict[str, float]:
    """Median host µs of each call of one adaptive decode step at batch size ``bs``, on a step run
    at the largest budget (it measures every nested candidate); the node ids copied from
    ``device`` (the GPU's copies are queued, not waited for: the host's part of them)."""
    run = median_timer(torch.device("cpu"))
    width, accept_width = 64, 16
    ctl = BudgetController(policy, accept_width - 1, list(range(1, 33)))
    accepted = walks(bs, width, accept_width)
    on_device = torch.from_numpy(accepted).to(device)
    host = host_copy(on_device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    budget = max(policy.budgets)
    limits = ctl.measured_by(budget)
    sums = accepted_tokens_within(host.numpy(), width, limits)
    t = {
        "choose": run(lambda: ctl.choose(bs), repeats),
        "copy": run(lambda: host_copy(on_device), repeats),
        "sums": run(lambda: accepted_tokens_within(host.numpy(), width, limits), repeats),
        "observe": run(lambda: ctl.observe(budget, sums, bs), repeats),
    }
    t["total"] = sum(t.values())
    # a bucket left with one candidate (the chain dearer than 63 at bs 8 and 32) measures nothing
    measured = len(ctl.candidates[ctl.bucket_of(bs)]) > 1
    t["per_step"] = t["choose"] + measured * (t["total"] - t["choose"]) / policy.measure_interval
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--json", help="write the table here")
    ap.add_argument(
        "--device",
        default="cuda" if torch.cuda.is_available() else "cpu",
        choices=("cpu", "cuda"),
        help="where the accepted node ids are copied from (default: cuda when there is one)",
    )
    args = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in args.batch_sizes.split(",")]
    except ValueError:
        raise SystemExit(
            f"--batch-sizes {args.batch_sizes!r}: give whole numbers, e.g. 1,2,4"
        ) from None
    if not sizes or min(sizes) < 1 or args.repeats < 1:
        raise SystemExit(
            f"--batch-sizes {args.batch_sizes!r} / --repeats {args.repeats}: give sizes >= 1 "
            "and repeats >= 1"
        )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here; valid: cpu")
    device = torch.device(args.device)
    policy = BudgetPolicy.load(str(CONFIG))
    rows = []
    calls = ("choose", "copy", "sums", "observe", "total", "per_step")
    print(
        f"host µs per adaptive decode step, node ids copied from {device.type} (per_step: at "
        f"measure_interval {policy.measure_interval}):"
    )
    print("| bs | " + " | ".join(f"{k} µs" for k in calls) + " |")
    print("|---|" + "---|" * len(calls))
    for bs in sizes:
        t = time_batch(policy, bs, args.repeats, device)
        rows.append({"bs": bs, **{f"{k}_us": round(v, 2) for k, v in t.items()}})
        print(f"| {bs} | " + " | ".join(f"{t[k]:.1f}" for k in calls) + " |")
    if args.json:
        out = {
            "config": CONFIG.name,
            "device": device.type,
            "measure_interval": policy.measure_interval,
            "rows": rows,
        }
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
