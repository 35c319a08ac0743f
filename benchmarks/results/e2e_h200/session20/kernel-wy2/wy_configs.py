"""Session 20 ad-hoc: the WY v2 SGLang mode against the fused walk, per kernel and per config."""

import json
import sys
from functools import partial

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.gdn_tree_recurrence import _fused_inputs, _rel_err
from benchmarks.gdn_verify import VOCAB, L, layer_inputs, time_us
from sglang_spec.gdn import tree_paths
from sglang_spec.gdn import triton_tree_wy as wym
from sglang_spec.gdn.sglang_verify import gdn_tree_verify, gdn_tree_verify_wy
from sglang_spec.gdn.triton_tree_wy import tree_wy_scratch
from sglang_spec.tree import build_ddtree

dims = dict(num_k_heads=16, num_v_heads=48, head_k_dim=128, head_v_dim=128)
dev = torch.device("cuda")
CONFIGS = [
    ("tf32x3", 64, 8, 4),
    ("tf32x3", 32, 8, 4),
    ("tf32x3", 32, 4, 4),
    ("tf32x3", 64, 8, 8),
    ("tf32x3", 64, 8, 2),
    ("ieee", 64, 8, 4),
]
rows = []
bad = 0
for bs in (1, 8, 32):
    for n in (16, 64):
        gen = torch.Generator().manual_seed(7)
        c, _, pool = layer_inputs(bs, n, bs + 1, dims, torch.bfloat16, dev, gen)
        conv_out = torch.randn(
            bs * n,
            2 * dims["num_k_heads"] * dims["head_k_dim"] + dims["num_v_heads"] * dims["head_v_dim"],
            generator=gen,
        ).to(dev, torch.bfloat16)
        tree = build_ddtree(
            3 * torch.randn(bs, L, VOCAB, generator=gen), n - 1, torch.zeros(bs).long()
        )
        paths = tree_paths(tree.parents.to(dev), width=L + 1).to(torch.int32).contiguous()
        (fq, fk, fv), ring, rr, scr = _fused_inputs(c, conv_out, bs, n, paths.shape[2], dev)
        wring = tuple(torch.zeros_like(x) for x in ring)
        wscr = tree_wy_scratch(bs, n, dims["num_v_heads"], dev)
        args = (
            fq,
            fk,
            fv,
            c["a"],
            c["b"],
            c["A_log"],
            c["dt_bias"],
            pool,
            c["cache_indices"],
            paths,
        )
        walk = partial(gdn_tree_verify, *args, *scr, ring=ring, ring_rows=rr)
        want = walk().float()
        row = dict(bs=bs, N=n, walk_us=time_us(walk, dev, 50))
        for prec, bv, w, kw in CONFIGS:
            wym.WY_DOT_PRECISION = prec
            wym.KKT_WARPS = kw
            wy = partial(
                gdn_tree_verify_wy, *args, wscr, ring=wring, ring_rows=rr, block_v=bv, num_warps=w
            )
            err = _rel_err(wy(), want, 1e-4, 2.0**-7)
            ring_eq = all(torch.equal(x, y) for x, y in zip(wring, ring))
            key = f"{prec}/BV{bv}/w{w}/k{kw}"
            row[key] = time_us(wy, dev, 50)
            row[key + "_err"] = err
            if err > 1 or not ring_eq:
                bad += 1
                print("CHECK FAILED", bs, n, key, err, ring_eq)
        wym.WY_DOT_PRECISION = "tf32x3"
        wym.KKT_WARPS = 4
        wy = partial(gdn_tree_verify_wy, *args, wscr, ring=wring, ring_rows=rr)
        for _ in range(3):
            walk()
            wy()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                walk()
                wy()
            torch.cuda.synchronize()
        row["kernels_us"] = {
            e.key: e.device_time_total / e.count
            for e in prof.key_averages()
            if e.device_time_total > 0
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
keys = ["walk_us"] + [f"{p}/BV{b}/w{w}/k{kw}" for p, b, w, kw in CONFIGS]
print("| bs | N | " + " | ".join(keys) + " |")
print("|---" * (len(keys) + 2) + "|")
for r in rows:
    print(f"| {r['bs']} | {r['N']} | " + " | ".join(f"{r[k]:.1f}" for k in keys) + " |")
json.dump(rows, open(sys.argv[1], "w"), indent=1)
sys.exit(1 if bad else 0)
