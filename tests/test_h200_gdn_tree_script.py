"""``e2e/h200_gdn_tree.sh`` on the CPU, with a stand-in for the kit's Python: which harness runs it
starts, on which GPU and port, after the patches and the plug-in are in place. Its two-GPU path
has not run on a device yet (the two-GPU machine was not lent when it was written)."""

from __future__ import annotations

import pytest
from kit_stub import run_script


def run(tmp_path, gpus: int, **env) -> tuple[int, list[str]]:
    return run_script("h200_gdn_tree.sh", tmp_path, gpus, **env)


def _arg(call: str, flag: str) -> str:
    argv = call.split()
    return argv[argv.index(flag) + 1]


def _module(call: str) -> str:
    return _arg(call, "-m")


def test_two_gpus_run_both_parts_side_by_side_after_the_patches(tmp_path):
    rc, calls = run(tmp_path, gpus=2)
    assert rc == 0
    assert calls[0] == "apply"
    runs = {_module(c): c for c in calls[1:]}
    assert sorted(runs) == ["e2e.scale", "e2e.tiny_pair"]
    tiny, scale = runs["e2e.tiny_pair"], runs["e2e.scale"]
    assert tiny.startswith("CUDA=0 ") and scale.startswith("CUDA=1 ")
    assert _arg(tiny, "--port") != _arg(scale, "--port")
    assert _arg(tiny, "--dist-samples") == "1000"
    assert _arg(tiny, "--dist-servers") == "ddtree64+graphs+patched+replayssm"
    assert _arg(tiny, "--servers").split(",") == [
        "ddtree64+graphs+patched+replayssm",
        "ddtree64+patched+replayssm",
    ]
    assert _arg(scale, "--levels") == "1,2,4,8,16,32"
    servers = scale.split("--servers ")[1].split()
    assert servers == ["qwen3.6-27b:ddtree:b=63", "qwen3.6-27b:dflash"]


def test_one_gpu_runs_the_parts_one_after_the_other(tmp_path):
    rc, calls = run(tmp_path, gpus=1)
    assert rc == 0
    assert calls[0] == "apply"
    assert [_module(c) for c in calls[1:]] == ["e2e.tiny_pair", "e2e.scale"]
    assert all(c.startswith("CUDA=unset ") for c in calls[1:])


@pytest.mark.parametrize("parts", ["tiny", "scale"])
def test_one_part(tmp_path, parts):
    rc, calls = run(tmp_path, gpus=2, PARTS=parts)
    assert rc == 0
    assert [_module(c) for c in calls[1:]] == [
        {"tiny": "e2e.tiny_pair", "scale": "e2e.scale"}[parts]
    ]


def test_variants_serve_no_buffer_and_chunked_prefill(tmp_path):
    rc, calls = run(tmp_path, gpus=1, PARTS="variants")
    assert rc == 0
    (call,) = calls[1:]
    args = call.split()
    flags = [args[i + 1] for i, a in enumerate(args) if a == "--server-arg"]
    # SGLang refuses no_buffer with the overlap scheduler (validate_mamba_no_buffer)
    assert flags == [
        "mamba-radix-cache-strategy=no_buffer",
        "chunked-prefill-size=96",
        "disable-overlap-schedule",
    ]
    assert _arg(call, "--abort-check") == "64"


@pytest.mark.parametrize("gpus", [1, 2])
@pytest.mark.parametrize("failing", ["e2e.tiny_pair", "e2e.scale"])
def test_a_failed_part_fails_the_script_and_the_other_still_runs(tmp_path, gpus, failing):
    rc, calls = run(tmp_path, gpus=gpus, STUB_FAIL=failing)
    assert rc == 1
    assert sorted(_module(c) for c in calls[1:]) == ["e2e.scale", "e2e.tiny_pair"]


def test_nothing_serves_when_the_patches_do_not_apply(tmp_path):
    rc, calls = run(tmp_path, gpus=2, STUB_APPLY_RC="1")
    assert rc == 1 and calls == ["apply"]
