"""Per-level summary of request results, named as ``sglang.benchmark.serving`` names them where they overlap.

Conventions (docs: shared/notes/anchors.md section 8):
- TTFT: request sent -> first token; TPOT: (latency - ttft) / (output_len - 1) per request, then averaged;
- ITL: SGLang-style per-token spread of chunk gaps; ``*_chunk_gap_ms`` are the raw gaps between chunks;
- ``output_throughput``: successful output tokens / level wall time; per-request tok/s: output_len / latency;
- acceptance: ``accept_length`` = the server's ``avg_spec_accept_length`` for the level (reset by
  ``/flush_cache`` before it); ``tokens_per_step`` = sum(output_len) / sum(spec_verify_ct) over the
  requests that reported a verify count; ``mean_spec_accept_length`` = mean of the per-request values.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from loadtests.client import RequestResult


def _stats(
    prefix: str, values_s: list[float], unit_scale: float = 1000.0, suffix: str = "_ms"
) -> dict:
    out = {}
    arr = np.asarray(values_s, dtype=float) * unit_scale
    for name, fn in (("mean", np.mean), ("median", np.median), ("std", np.std)):
        out[f"{name}_{prefix}{suffix}"] = float(fn(arr)) if arr.size else None
    for p in (90, 95, 99):
        out[f"p{p}_{prefix}{suffix}"] = float(np.percentile(arr, p)) if arr.size else None
    return out


def summarize(results: list[RequestResult], duration: float) -> dict:
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output_lens = [r.output_len if r.success else 0 for r in results]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_len for r in ok)
    dur = max(duration, 1e-9)

    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    gaps = [x for r in ok for x in r.chunk_gaps]
    per_req_tps = [r.output_len / r.latency for r in ok if r.latency > 0]
    decode_tps = [
        (r.output_len - 1) / (r.latency - r.ttft)
        for r in ok
        if r.output_len > 1 and r.latency > r.ttft
    ]

    spec = [r for r in ok if r.spec_verify_ct > 0]
    tokens_per_step = (
        (sum(r.output_len for r in spec) / sum(r.spec_verify_ct for r in spec)) if spec else None
    )

    s = {
        "completed": len(ok),
        "failed": len(failed),
        "duration": duration,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "input_throughput": total_in / dur,
        "output_throughput": total_out / dur,
        "total_throughput": (total_in + total_out) / dur,
        **_stats("ttft", [r.ttft for r in ok]),
        **_stats("tpot", tpots),
        **_stats("itl", itls),
        **_stats("e2e_latency", [r.latency for r in ok]),
        **_stats("chunk_gap", gaps),
        **_stats("per_request_output_throughput", per_req_tps, unit_scale=1.0, suffix=""),
        **_stats("per_request_decode_throughput", decode_tps, unit_scale=1.0, suffix=""),
        "concurrency": sum(r.latency for r in ok) / dur,  # bench_serving: mean in-flight requests
        "tokens_per_step": tokens_per_step,
        "mean_spec_accept_length": float(np.mean([r.spec_accept_length for r in spec]))
        if spec
        else None,
        "spec_requests": len(spec),
        "error_types": dict(Counter(_error_kind(r.error) for r in failed)),
        # Per-request arrays, as bench_serving writes them.
        "input_lens": [r.prompt_len for r in results],
        "output_lens": output_lens,
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "errors": [r.error for r in results],
        # Ours.
        "e2e_latencies": [r.latency for r in results],
        "spec_verify_cts": [r.spec_verify_ct for r in results],
        "chunk_gaps": [r.chunk_gaps for r in results],
        "prompt_indices": [r.prompt_index for r in results],
    }
    return s


def _error_kind(err: str) -> str:
    if not err:
        return "unknown"
    head = err.split(":", 1)[0]
    if head.startswith("HTTP "):
        return head
    if head.startswith("timeout"):
        return "timeout"
    return head[:60]
