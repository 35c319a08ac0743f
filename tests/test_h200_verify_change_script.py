"""``e2e/h200_verify_change.sh`` on the CPU, with stand-ins for the kit's Python and the system
``python3``: it applies the patches first, runs the GPU kernel tests of the tree conv and the tree
recurrence, serves the tiny hybrid pair's DDTREE through the patched tree ReplaySSM (the path the
GDN tree verify changes take) and the 27B servers it is given."""

from __future__ import annotations

import os

from kit_stub import STUB, run_script


def run(tmp_path, **env) -> tuple[int, list[str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(STUB)
    (bin_dir / "python3").chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    return run_script("h200_verify_change.sh", tmp_path, 1, PATH=path, **env)


def test_kernel_tests_tiny_pair_through_the_patched_verify_then_27b(tmp_path):
    rc, calls = run(tmp_path)
    assert rc == 0 and calls[0] == "apply"
    pytest = next(c for c in calls if "-m pytest" in c)
    assert "tests/test_gdn_tree_conv.py" in pytest and "tests/test_gdn_tree_recurrence.py" in pytest
    assert pytest.endswith("-k not interpreter")
    tiny, scale = (c for c in calls if "-m e2e." in c)
    assert "-m e2e.tiny_pair" in tiny and "tiny-pair/hybrid " in tiny
    assert tiny.split("--servers ")[1].split()[0] == "ar+graphs,ddtree64+graphs+patched+replayssm"
    assert "-m e2e.scale" in scale
    servers = scale.split("--servers ")[1].split()
    assert servers == [
        "qwen3.6-27b:ddtree:b=63:acc=4.23:profile=1",
        "qwen3.6-27b:ddtree:b=15:acc=3:stages",
    ]
    args = scale.split()
    assert args[args.index("--time-budget") + 1] == "290"


def test_servers_and_limits_can_be_overridden(tmp_path):
    rc, calls = run(
        tmp_path,
        TINY_SERVERS="ddtree16+graphs+patched+replayssm",
        SCALE_SERVERS="qwen3.5-4b:ar qwen3.5-4b:dflash:acc=3",
        SCALE_LIMIT_S="200",
        SCALE_ARGS="--start-estimate 90 --levels 1,8",
    )
    tiny, scale = (c for c in calls if "-m e2e." in c)
    assert rc == 0 and "--servers ddtree16+graphs+patched+replayssm " in tiny
    assert scale.split("--servers ")[1].split()[:2] == ["qwen3.5-4b:ar", "qwen3.5-4b:dflash:acc=3"]
    args = scale.split()
    assert args[args.index("--time-budget") + 1] == "190"
    # the extra options come after the script's own, so that they win
    assert args[args.index("--start-estimate") + 1] == "90"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--levels"][-1] == "1,8"


def test_e2e_limit_0_leaves_the_tiny_pair_out(tmp_path):
    rc, calls = run(tmp_path, E2E_LIMIT_S="0")
    assert rc == 0 and [c for c in calls if "-m e2e." in c][0].split()[3] == "e2e.scale"
    assert not any("e2e.tiny_pair" in c for c in calls)
