"""``python -m benchmarks.tree_sampler``: the T > 0 node sampler against eagle_sample's dense path.

For every (batch size, verify width N, sampling setting) it times, on random target logits
``[bs*N, V]`` (float32, as SGLang's LogitsProcessor hands them over; V = 248320 by default),
``sample_node_tokens`` (sglang_spec/tree/sampler.py: on CUDA its Triton row kernel,
sglang_spec/tree/triton_sampler.py, plus ``torch.topk`` for the settings with top-k or top-p; on
the CPU the torch path) and, on CUDA, the dense part of SGLang's ``eagle_sample`` that it
replaces: softmax with temperature, ``top_k_renorm_prob``, ``top_p_renorm_prob``, the
``zeros_like`` draft probs and ``tree_speculative_sampling_target_only`` over a chain. Each
column's peak extra memory is ``max_memory_allocated`` above what was allocated before the call
(the logits excluded). Times are medians in ms. Settings: ``T`` (temperature 0.7 only), ``T+k+p``
(0.7, top-k 20, top-p 0.95), ``T+p`` (1.0, top-p 0.95, no top-k: the nucleus search).

Before timing it checks correctness on the device: for each setting, 50k draws (5k on the CPU)
from each of four fixed rows (bfloat16 values, V = 2000: many exact ties) against the exact float64
processed distribution (χ², p > 1e-4 required).
The CPU grid is small (bs 1 4, N 16, V 32000, 2 repeats) and has no eagle_sample column
(its sampling kernel is CUDA only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sglang_spec.tree.sampler import SamplingBounds, sample_node_tokens

ALL = 1 << 30
SETTINGS = {"T": (0.7, ALL, 1.0), "T+k+p": (0.7, 20, 0.95), "T+p": (1.0, ALL, 0.95)}
GRIDS = {"cuda": ([1, 8, 32], [16, 64], 248320, 10), "cpu": ([1, 4], [16], 32000, 2)}


def _params(setting: str, bs: int, dev):
    T, k, p = SETTINGS[setting]
    return (
        torch.full((bs,), T, device=dev),
        torch.full((bs,), k, dtype=torch.int32, device=dev),
        torch.full((bs,), p, device=dev),
    )


def ours(logits, bs, setting):
    T, k, p = _params(setting, bs, logits.device)
    _, k_host, p_host = SETTINGS[setting]
    bounds = SamplingBounds.of([k_host] * bs, [p_host] * bs, logits.shape[-1])
    return sample_node_tokens(logits, T, k, p, None, bounds)


def eagle_dense(logits, bs, setting):
    """eagle_sample's T > 0 branch (eagle_utils.py) on a chain tree."""
    from sglang.kernels.ops.sampling import softmax
    from sglang.kernels.ops.sampling.renorm import top_k_renorm_prob, top_p_renorm_prob
    from sglang.kernels.ops.speculative.sampling import tree_speculative_sampling_target_only

    T, k, p = _params(setting, bs, logits.device)
    n = logits.shape[0] // bs
    dev = logits.device
    probs = softmax(logits, temperatures=T.repeat_interleave(n).view(-1, 1))
    if SETTINGS[setting][1] < ALL:
        probs = top_k_renorm_prob(probs, k.repeat_interleave(n))
    if SETTINGS[setting][2] < 1:
        probs = top_p_renorm_prob(probs, p.repeat_interleave(n))
    probs = probs.reshape(bs, n, -1)
    cand = torch.randint(0, logits.shape[-1], (bs, n), device=dev)
    idx = torch.arange(bs * n, device=dev).view(bs, n)
    nxt = torch.arange(1, n + 1, device=dev).repeat(bs, 1)
    nxt[:, -1] = -1
    sib = torch.full((bs, n), -1, device=dev)
    predict = torch.zeros(bs * n, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, n), -1, dtype=torch.int32, device=dev)
    num = torch.empty(bs, dtype=torch.int32, device=dev)
    tree_speculative_sampling_target_only(
        predicts=predict,
        accept_index=accept_index,
        accept_token_num=num,
        candidates=cand,
        retrive_index=idx,
        retrive_next_token=nxt,
        retrive_next_sibling=sib,
        uniform_samples=torch.rand(bs, n, device=dev),
        uniform_samples_for_final_sampling=torch.rand(bs, device=dev),
        target_probs=probs,
        draft_probs=torch.zeros_like(probs),
    )
    return predict


def exact_law(row: torch.Tensor, T: float, k: int, p: float) -> torch.Tensor:
    """The joint-order processed distribution of one row, float64."""
    q = torch.softmax(row.double() / T, dim=-1)
    srt, order = q.sort(descending=True)
    keep = torch.ones_like(srt, dtype=torch.bool)
    if k < q.numel():
        keep &= srt >= srt[k - 1]
    if p < 1:  # mass strictly above each value (tied values share their first one's)
        _, group, counts = torch.unique_consecutive(srt, return_inverse=True, return_counts=True)
        first = torch.cumsum(counts, 0) - counts
        keep &= (srt.cumsum(0) - srt)[first][group] < p
    out = torch.zeros_like(q)
    out[order[keep]] = srt[keep]
    return out / out.sum()


def check(dev) -> list[dict]:
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(0)
    rows = (torch.randn(4, 2000, generator=g) * 2.5).to(torch.bfloat16)
    reps = 50_000 if dev.type == "cuda" else 5_000
    logits = rows.float().repeat(reps, 1).to(dev)
    results = []
    for setting, (T, k, p) in SETTINGS.items():
        tok = ours(logits, reps, setting).view(reps, 4).cpu()
        for r in range(4):
            law = exact_law(rows[r].float(), T, k, p)
            counts = torch.bincount(tok[:, r], minlength=2000).double()
            support = law > 0
            outside = int(counts[~support].sum())
            big = support & (law * reps >= 5)
            obs = torch.cat([counts[big], counts[support & ~big].sum().view(1)])
            exp = torch.cat([law[big] * reps, (law[support & ~big] * reps).sum().view(1)])
            if float(exp[-1]) < 5:
                obs, exp = obs[:-1], exp[:-1]
            exp = exp * obs.sum() / exp.sum()
            pval = float(chisquare(obs.numpy(), exp.numpy()).pvalue) if outside == 0 else 0.0
            results.append(dict(setting=setting, row=r, pvalue=pval, outside_support=outside))
            if outside or pval < 1e-4:
                raise SystemExit(f"{setting} row {r}: chi2 p={pval:.2e}, {outside} outside")
    return results


def timed(fn, logits, bs, setting, repeats, dev):
    fn(logits, bs, setting)  # warm-up (JIT, allocator)
    times, peaks = [], []
    for _ in range(repeats):
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        fn(logits, bs, setting)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            peaks.append(torch.cuda.max_memory_allocated() - base)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, (max(peaks) / 2**20 if peaks else None)


def main(argv=None) -> None:
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bss, widths, vocab, repeats = GRIDS[dev.type]
    ap = argparse.ArgumentParser(prog="python -m benchmarks.tree_sampler", description=__doc__)
    ap.add_argument("--bs", type=int, nargs="+", default=bss)
    ap.add_argument("--widths", type=int, nargs="+", default=widths)
    ap.add_argument("--vocab", type=int, default=vocab)
    ap.add_argument("--repeats", type=int, default=repeats)
    ap.add_argument("--json", default="tree_sampler.json", help="output file (default %(default)s)")
    args = ap.parse_args(argv)
    for name in ("vocab", "repeats"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1; got {getattr(args, name)}")
    if min(args.bs + args.widths) < 1:
        ap.error(f"--bs and --widths must be >= 1; got {args.bs} {args.widths}")

    checks = check(dev)
    print(
        f"correctness: {len(checks)} chi2 checks passed on {dev.type} (min p = "
        f"{min(c['pvalue'] for c in checks):.3g})"
    )
    g = torch.Generator(device=dev).manual_seed(1)
    rows = []
    head = f"{'bs':>4} {'N':>4} {'setting':>7} | {'ours ms':>8} {'ours MiB':>9} | {'eagle ms':>8} {'eagle MiB':>9}"
    print(head)
    print("-" * len(head))
    for bs in args.bs:
        for n in args.widths:
            logits = torch.randn(bs * n, args.vocab, generator=g, device=dev) * 3
            for setting in SETTINGS:
                o_ms, o_mib = timed(ours, logits, bs, setting, args.repeats, dev)
                e_ms = e_mib = None
                if dev.type == "cuda":
                    e_ms, e_mib = timed(eagle_dense, logits, bs, setting, args.repeats, dev)
                rows.append(
                    dict(
                        bs=bs,
                        N=n,
                        V=args.vocab,
                        setting=setting,
                        ours_ms=o_ms,
                        ours_peak_mib=o_mib,
                        eagle_ms=e_ms,
                        eagle_peak_mib=e_mib,
                    )
                )
                fmt = lambda v, f: "n/a" if v is None else format(v, f)  # noqa: E731
                print(
                    f"{bs:>4} {n:>4} {setting:>7} | {o_ms:>8.3f} {fmt(o_mib, '>9.1f')} | "
                    f"{fmt(e_ms, '>8.3f')} {fmt(e_mib, '>9.1f')}"
                )
            del logits
    with open(args.json, "w") as f:
        json.dump(dict(device=dev.type, checks=checks, rows=rows), f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
