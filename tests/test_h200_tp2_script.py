"""``e2e/h200_tp2.sh`` on the CPU, with a stand-in for the kit's Python: it refuses a one-GPU
machine, serves the tiny Qwen3 pair and the 27B shape at TP = 2 with NCCL's NVLink multicast off,
applies the patches before the 27B servers and resumes from the committed records."""

from __future__ import annotations

from kit_stub import run_script


def run(tmp_path, gpus: int) -> tuple[int, list[str]]:
    return run_script("h200_tp2.sh", tmp_path, gpus)


def _server_args(call: str) -> list[str]:
    args = call.split()
    return [args[i + 1] for i, a in enumerate(args) if a == "--server-arg"]


def test_one_gpu_is_refused_before_anything_runs(tmp_path):
    rc, calls = run(tmp_path, gpus=1)
    assert rc == 2 and calls == []


def test_two_gpus_serve_both_parts_at_tp_2(tmp_path):
    rc, calls = run(tmp_path, gpus=2)
    assert rc == 0
    tiny, apply, scale = calls
    assert "-m e2e.tiny_pair" in tiny and apply == "apply" and "-m e2e.scale" in scale
    assert all(" NVLS=0 " in c for c in (tiny, scale))
    assert "tiny-pair/qwen3 " in tiny  # the hybrid's one GDN key head cannot be split in two
    assert _server_args(tiny) == ["tp-size=2", "disable-custom-all-reduce"]
    assert "disable-custom-all-reduce" in _server_args(scale)
    args = scale.split()
    assert args[args.index("--resume") + 1] == "benchmarks/results/scale_h200.json"
    servers = scale.split("--servers ")[1].split()
    assert servers and all(s.startswith("qwen3.6-27b:") and s.endswith(":tp=2") for s in servers)
