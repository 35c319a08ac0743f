"""``python -m benchmarks.draft_step_kernels``: the two Triton kernels that replaced torch ops in a
DDTREE step on the Qwen3.6-27B shape, against those ops, on CUDA.

Session 25's kernel trace of budget 7 at 16 requests (benchmarks/results/e2e_h200/session25) put
1.5 ms of a 36 ms step on the draft head's per-depth top-K (a float32 copy of the ``[bs * 15,
248320]`` logits, the division by the tree temperature, ``torch.topk``, ``torch.logsumexp``) and
0.5 ms on the GDN commit's conv states (a gather and an index-put of ``[48, bs, 3, 10240]``
windows, twice with the extra_buffer track slot). Columns:

* ``topk``: ``sglang_spec.tree.build.top_logits`` (CUDA: ``triton_topk.topk_logsumexp``) against
  the torch ops session 24's code ran (``torch_topk`` below), on bf16 logits of ``rows = bs * 15``
  draft positions, K and tree temperature as the 27B servers run them (K = 7 at budget 7, 17 for
  the adaptive {7, 13, 31} server; T = 1e-8 and 0.75);
* ``conv commit``: ``sglang_spec.gdn.tree_conv.commit_conv_states`` (CUDA: one Triton launch)
  against ``commit_conv_states_torch``, 48 layers, verify width 8, with the track snapshot.

Before timing, each case checks the kernel against the torch result (top-K ids and values equal to
the CPU path's, log-sum-exp to 1e-5 relative; conv states equal in every slot the requests own). Times are CUDA
event medians in µs. ``--json`` writes the rows.
"""

from __future__ import annotations

import argparse
import functools
import json

import torch

from benchmarks.timing import median_timer
from sglang_spec.gdn.tree_conv import commit_conv_states, commit_conv_states_torch
from sglang_spec.tree.build import top_logits

VOCAB = 248320
DEPTHS = 15  # block 16
LAYERS, CHANNELS, STATE_LEN, WIDTH = 48, 10240, 3, 8


def torch_topk(logits: torch.Tensor, k: int, temperature: float):
    """The draft head's top-K as session 24's code ran it on CUDA."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    vals, ids = x.topk(k, dim=-1)
    return vals, ids, torch.logsumexp(x, dim=-1)


def topk_rows(dev, bss, repeats) -> list[dict]:
    run = median_timer(dev)
    out = []
    for bs in bss:
        logits = (torch.randn(bs * DEPTHS, VOCAB, device=dev) * 3).to(torch.bfloat16)
        for k, temperature in ((7, 1e-8), (17, 1e-8), (17, 0.75)):
            vals, ids, lse = top_logits(logits, k, temperature)
            # against the CPU path (a stable sort, true division: torch's CUDA division by a
            # scalar multiplies by its reciprocal, one rounding more)
            ref_vals, ref_ids, ref_lse = top_logits(logits.cpu(), k, temperature)
            assert torch.equal(vals.cpu(), ref_vals), (bs, k, temperature)
            assert torch.equal(ids.cpu(), ref_ids), (bs, k, temperature)
            torch.testing.assert_close(lse.cpu(), ref_lse, rtol=1e-5, atol=1e-5)
            row = {
                "kernel": "topk",
                "bs": bs,
                "rows": bs * DEPTHS,
                "k": k,
                "temperature": temperature,
                "ours_us": run(functools.partial(top_logits, logits, k, temperature), repeats),
                "torch_us": run(functools.partial(torch_topk, logits, k, temperature), repeats),
            }
            out.append(row)
    return out


def conv_rows(dev, bss, repeats) -> list[dict]:
    run = median_timer(dev)
    g = torch.Generator(device=dev).manual_seed(0)
    out = []
    for bs in bss:
        slots_total = 2 * bs + 2
        conv = torch.randn(LAYERS, slots_total, STATE_LEN, CHANNELS, device=dev, generator=g)
        conv = conv.to(torch.bfloat16).transpose(2, 3)  # channels contiguous, as SGLang's pool
        inputs = torch.randn(LAYERS, bs, STATE_LEN + WIDTH, CHANNELS, device=dev, generator=g).to(
            torch.bfloat16
        )
        slots = torch.arange(1, bs + 1, device=dev)
        rows = torch.arange(bs, device=dev)
        lens = torch.randint(1, WIDTH + 1, (bs,), device=dev, generator=g).to(torch.int32)
        # a chain of nodes 0..len-1 per request: b * WIDTH + t, -1 padded
        t = torch.arange(WIDTH, device=dev)
        index = torch.where(t < lens[:, None], rows[:, None] * WIDTH + t, -1).to(torch.int32)
        track_slots = slots + bs
        track_nodes = torch.where(lens > 2, 1, -1).to(torch.int64)
        args = (inputs, slots, rows, index, lens, WIDTH, track_slots, track_nodes)
        want, got = conv.clone(), conv.clone()
        commit_conv_states_torch(want, *args)
        commit_conv_states(got, *args)
        assert torch.equal(got[:, 1:], want[:, 1:]), bs
        out.append(
            {
                "kernel": "conv commit",
                "bs": bs,
                "layers": LAYERS,
                "channels": CHANNELS,
                "ours_us": run(functools.partial(commit_conv_states, got, *args), repeats),
                "torch_us": run(functools.partial(commit_conv_states_torch, want, *args), repeats),
            }
        )
    return out


def markdown(rows: list[dict]) -> str:
    lines = [
        "| kernel | bs | k | T | ours µs | torch µs | torch / ours |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['kernel']} | {r['bs']} | {r.get('k', '')} | {r.get('temperature', '')} | "
            f"{r['ours_us']:.1f} | {r['torch_us']:.1f} | {r['torch_us'] / r['ours_us']:.1f}x |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 16, 32])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.draft_step_kernels times CUDA kernels: no CUDA device here")
    dev = torch.device("cuda")
    rows = topk_rows(dev, args.bs, args.repeats) + conv_rows(dev, args.bs, args.repeats)
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
