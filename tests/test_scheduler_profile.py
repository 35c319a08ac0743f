"""e2e.scheduler_profile: inclusive shares from py-spy's folded stacks, servers named from
e2e.json, the adaptive server first and the fixed DDTREE one next; and e2e/profile_schedulers.sh finds a scheduler's
port and refuses bad input before it waits."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from e2e import scheduler_profile as sp

ROOT = Path(__file__).resolve().parents[1]

FIXED = (
    "run (s.py:1);forward_batch_generation (worker.py:430);_decode_step (worker.py:470) 6\n"
    "run (s.py:1);process_batch_result (b.py:9) 4\n"
)
ADAPTIVE = (
    "run (s.py:1);forward_batch_generation (worker.py:430);_decode_step (worker.py:470) 6\n"
    "run (s.py:1);forward_batch_generation (worker.py:430);select_budget (worker.py:380) 2\n"
    "run (s.py:1);process_batch_result (b.py:9);on_verify_complete_cpu (worker.py:394) 1\n"
    "run (s.py:1);process_batch_result (b.py:9) 1\n"
    # recursion: counted once per sample
    "run (s.py:1);f (r.py:2);f (r.py:2) 2\n"
)


def test_inclusive_shares_count_each_function_once_per_sample(tmp_path):
    p = tmp_path / "port1.txt"
    p.write_text(ADAPTIVE)
    inc, total = sp.read_folded(p)
    assert total == 12
    assert inc["run (s.py)"] == 12
    assert inc["forward_batch_generation (worker.py)"] == 8
    assert inc["process_batch_result (b.py)"] == 2
    assert inc["f (r.py)"] == 2  # two frames, one sample set of 2


def test_the_table_names_servers_by_port_and_puts_adaptive_first(tmp_path, capsys):
    d = tmp_path / "pyspy"
    d.mkdir()
    (d / "port30001.txt").write_text(FIXED)
    (d / "port30002.txt").write_text(ADAPTIVE)
    (d / "port30003.txt").write_text(FIXED)
    e2e = tmp_path / "e2e.json"
    e2e.write_text(
        json.dumps(
            [
                {"label": "ddtree63+graphs", "cmd": "python -m sglang.launch_server --port 30001"},
                {"label": "ddtree63+graphs+adaptive", "cmd": "x --port=30002 --y"},
                {"label": "ar+graphs", "cmd": "x --port 30003"},
            ]
        )
    )
    assert sp.main([str(d), "--e2e", str(e2e), "--top", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out[1]
    assert (
        head.index("ddtree63+graphs+adaptive (12 samples)")
        < head.index("ddtree63+graphs (10 samples)")
        < head.index("ar+graphs (10 samples)")
    )
    rows = out[3:]
    assert len(rows) == 3
    # largest difference first: process_batch_result 2/12 vs 4/10; then select_budget and f
    # (2/12 vs 0); _decode_step (6/12 vs 6/10) is fourth and left out
    assert rows[0].startswith("| process_batch_result (b.py) | 16.7 % | 40.0 % | 40.0 % |")
    assert any(r.startswith("| select_budget (worker.py) | 16.7 % | 0.0 % | 0.0 % |") for r in rows)
    assert not any("_decode_step" in r for r in rows)


def test_an_empty_folder_or_a_bad_top_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="no port<N>.txt"):
        sp.main([str(tmp_path)])
    (tmp_path / "port1.txt").write_text(FIXED)
    with pytest.raises(SystemExit, match="--top 0"):
        sp.main([str(tmp_path), "--top", "0"])


def _script(env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(ROOT / "e2e/profile_schedulers.sh")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_script_refuses_bad_input_before_waiting(tmp_path):
    r = _script({"OUT": str(tmp_path), "DELAY_S": "soon", "PYSPY": sys.executable})
    assert r.returncode == 2 and "DELAY_S=soon" in r.stderr
    r = _script({"OUT": str(tmp_path), "DELAY_S": "600", "PYSPY": str(tmp_path / "none")})
    assert r.returncode == 2 and "not an executable py-spy" in r.stderr


def test_the_script_samples_each_scheduler_into_its_servers_port(tmp_path):
    """A stand-in py-spy records its arguments; a process titled sglang::scheduler whose parent
    was started with --port 30007 is found and named by that port."""
    fake = tmp_path / "py-spy"
    fake.write_text(
        '#!/bin/bash\nout=""\nwhile [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done\necho "f (x.py:1) 3" > "$out"\n'
    )
    fake.chmod(0o755)
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.run(['bash', '-c', "
            "'exec -a sglang::scheduler sleep 20'])",
            "--port",
            "30007",
        ]
    )
    try:
        for _ in range(100):  # until the child has its title (other tests may run fake schedulers)
            if subprocess.run(["pgrep", "-f", "^sglang::scheduler 20"], capture_output=True).stdout:
                break
            subprocess.run(["sleep", "0.05"])
        r = _script({"OUT": str(tmp_path), "DELAY_S": "0", "DURATION_S": "1", "PYSPY": str(fake)})
    finally:
        subprocess.run(["pkill", "-f", "^sglang::scheduler 20"])
        parent.wait(timeout=10)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "pyspy/port30007.txt").read_text() == "f (x.py:1) 3\n"


def test_compressed_profiles_and_a_filter(tmp_path, capsys):
    """The repository keeps profiles and e2e.json as .xz; --only keeps the matching functions and a
    bad expression is one line naming it."""
    import lzma

    (tmp_path / "port30002.txt.xz").write_bytes(lzma.compress(ADAPTIVE.encode()))
    (tmp_path / "port30001.txt").write_text(FIXED)
    e2e = tmp_path / "e2e.json.xz"
    e2e.write_bytes(
        lzma.compress(json.dumps([{"label": "ddtree63+adaptive", "cmd": "--port 30002"}]).encode())
    )
    assert sp.main([str(tmp_path), "--e2e", str(e2e), "--only", "budget|verify_complete"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "ddtree63+adaptive (12 samples)" in out[1] and "port30001 (10 samples)" in out[1]
    assert [r.split(" |")[0] for r in out[3:]] == [
        "| select_budget (worker.py)",
        "| on_verify_complete_cpu (worker.py)",
    ]
    with pytest.raises(SystemExit, match=r"--only '\(': not a regular expression"):
        sp.main([str(tmp_path), "--only", "("])
