"""Load-test sweep (C = 1, 2, 4) against the CPU server running the reference engine on the trained tiny pair.

AR vs DDTREE(64) behind SGLang's HTTP API: the token counts the load generator reports match what
the server produced, DDTREE's acceptance is above 1 both per request (spec_verify_ct) and from
/server_info, both decoders produce the same greedy text, and the comparison report and plots are
written. The two servers keep their default (different) names; both report the pair's target as
model_path, so the report compares them in one section, marked as CPU-server timings.
"""

import json

from loadtests import compare, sweep
from sglang_spec.reference.tiny_pair import FIXTURES, heldout_prompts
from sglang_spec.serving.cpu_server import HFTokenizerCodec, serve_in_thread
from sglang_spec.serving.reference_engine import make


def test_ar_vs_ddtree_sweep_on_the_tiny_pair(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in heldout_prompts(4)))
    codec = HFTokenizerCodec(str(FIXTURES / "hybrid"))
    files, texts = [], {}
    for label, method in (("AR", "ar"), ("DDTREE-64", "ddtree")):
        out = tmp_path / f"{label}.jsonl"
        engine = make(method=method)
        with serve_in_thread(engine, codec, model_name=engine.name) as srv:
            rc = sweep.main(
                [
                    "--base-url",
                    srv.url,
                    "--prompts",
                    str(prompts),
                    "--output",
                    str(out),
                    "--no-progress",
                    "--concurrency",
                    "1,2,4",
                    "--num-requests",
                    "4",
                    "--max-new-tokens",
                    "24",
                    "--ignore-eos",
                    "--label",
                    label,
                    "--warmup",
                    "0",
                    "--keep-text",
                ]
            )
            assert rc == 0
            served = list(srv.server.completed)
        levels = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["max_concurrency"] for r in levels] == [1, 2, 4]
        assert sorted(x for r in levels for x in r["output_lens"]) == sorted(
            s["completion_tokens"] for s in served
        )
        assert all(r["completed"] == 4 and r["failed"] == 0 for r in levels)
        assert {r["model"] for r in levels} == {str(FIXTURES.resolve() / "hybrid")}
        if method == "ddtree":
            assert all(r["tokens_per_step"] > 1.2 and r["accept_length"] > 1.2 for r in levels), (
                levels
            )
        else:
            assert all(r["tokens_per_step"] is None for r in levels)
        texts[label] = sorted(t for r in levels for t in r["generated_texts"])
        files.append(out)
    assert texts["AR"] == texts["DDTREE-64"]  # greedy: lossless behind the HTTP API too
    report = tmp_path / "report"
    assert compare.main([str(f) for f in files] + ["-o", str(report)]) == 0
    md = (report / "report.md").read_text()
    assert [line for line in md.splitlines() if line.startswith("## ")] == ["## hybrid"]
    assert "| DDTREE-64 † |" in md and "### Speed-up over AR (`AR`)" in md
    assert sorted(p.name.split("_", 1)[1] for p in report.glob("*.png")) == [
        "acceptance.png",
        "per_request.png",
        "speedup_ar.png",
        "throughput.png",
    ]
