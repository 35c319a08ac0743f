"""``python -m e2e.tiny_pair`` after its move to e2e/: same server flags as before, from server_configs/.

The flags each server name got when they were hard-coded in ``tools/gpu_e2e.py`` are written out
below; the harness now builds them from ``server_configs/tiny-pair/*.yaml`` plus the kit's flags and
must produce exactly those. SGLang's parser accepts them, and a whole run against the fake SGLang of
``tests/e2e_fake_sglang.py`` writes ``e2e.json`` and the summary table.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from e2e import kit, slots, tiny_pair

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "sglang_spec" / "fixtures" / "tiny-pair"
FAKE = Path(__file__).with_name("e2e_fake_sglang.py")
KIT = {
    "SGLANG_KIT_FLAGS": "--attention-backend triton --sampling-backend pytorch --disable-cuda-graph "
    "--grammar-backend none --mem-fraction-static 0.3 --skip-server-warmup",
    "SGLANG_KIT_SPEC_FLAGS": "--speculative-draft-attention-backend triton",
}
# tools/gpu_e2e.py's server_flags() before the move (kit flags + these), for drafter D of block 8
# (not the configs' 16, so that a block size the harness failed to set would show).
OLD_SPEC_FLAGS = {
    "ar": "",
    "nextn": "--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 "
    "--speculative-num-draft-tokens 4 --mamba-radix-cache-strategy extra_buffer",
    "dflash": "--speculative-algorithm DFLASH --speculative-draft-model-path D "
    "--speculative-num-draft-tokens 8",
    "ddtree64": "--speculative-algorithm DDTREE --speculative-draft-model-path D "
    "--speculative-num-draft-tokens 65 --speculative-dflash-block-size 8",
    "ddtree4": "--speculative-algorithm DDTREE --speculative-draft-model-path D "
    "--speculative-num-draft-tokens 5 --speculative-dflash-block-size 8",
}


def _old_flags(name: str, graph_bs: int) -> dict:
    kit_flags = KIT["SGLANG_KIT_FLAGS"].split()
    if graph_bs:
        kit_flags = [f for f in kit_flags if f != "--disable-cuda-graph"]
        kit_flags += ["--cuda-graph-max-bs-decode", str(graph_bs), "--disable-prefill-cuda-graph"]
    spec = KIT["SGLANG_KIT_SPEC_FLAGS"].split() if name != "ar" else []
    return kit.parse_flags(kit_flags + spec + OLD_SPEC_FLAGS[name].split())


@pytest.mark.parametrize("name", list(OLD_SPEC_FLAGS))
@pytest.mark.parametrize("graphs", [False, True])
def test_flags_are_the_hard_coded_ones_of_before(name, graphs, monkeypatch):
    for k, v in KIT.items():
        monkeypatch.setenv(k, v)
    spec = name + ("+graphs" if graphs else "")
    cfg = tiny_pair.server_config(spec, "T", "D", block=8, graph_bs=8)
    cmd = kit.Server(cfg, "/dev/null", port=30000).cmd
    got = kit.parse_flags(cmd[cmd.index("--model-path") :])
    assert got.pop("model-path") == "T"
    assert (got.pop("host"), got.pop("port")) == ("127.0.0.1", "30000")
    assert {k: v for k, v in got.items()} == {
        k: v for k, v in _old_flags(name, 8 if graphs else 0).items()
    }


@pytest.mark.parametrize("path", sorted((REPO / "server_configs" / "tiny-pair").glob("*.yaml")))
def test_tiny_pair_configs_parse_with_sglang(path, monkeypatch, sglang_parse):

    monkeypatch.chdir(REPO)  # the configs' model paths are relative to the repository root
    cfg = tiny_pair.server_config(
        {"ar": "ar", "nextn": "nextn", "dflash": "dflash", "ddtree": "ddtree16"}[path.stem]
        + "+graphs",
        str(PAIR / "hybrid"),
        str(PAIR / "hybrid-dflash"),
        block=16,
        graph_bs=8,
    )
    assert cfg.path == path
    sa = sglang_parse(kit.Server(cfg, "/dev/null").cmd[3:])
    assert sa.speculative_algorithm == (None if path.stem == "ar" else path.stem.upper())
    assert sa.cuda_graph_max_bs_decode == 8


def test_replayssm_server_turns_the_flag_on(sglang_parse, monkeypatch):
    monkeypatch.chdir(REPO)
    for spec, on in (("ddtree64+replayssm+patched", True), ("ddtree64+patched", False)):
        cfg = tiny_pair.server_config(
            spec, str(PAIR / "hybrid"), str(PAIR / "hybrid-dflash"), block=16, graph_bs=0
        )
        sa = sglang_parse(kit.Server(cfg, "/dev/null").cmd[3:])
        assert sa.enable_linear_replayssm_spec is on, spec
        assert sa.speculative_num_draft_tokens == 65


@pytest.fixture
def one_cpu_blocks(monkeypatch):
    """kit.cpu_blocks as --pin-cpus gets it, on any machine: this machine's first CPU, its last, and
    all of them (the harness's block); yields (the CPUs, the block counts asked for) and gives this
    process all its CPUs back afterwards (the harness pins itself to the last block)."""
    cpus = sorted(os.sched_getaffinity(0))
    blocks = [frozenset(cpus[:1]), frozenset(cpus[-1:]), frozenset(cpus)]
    asked = []
    monkeypatch.setattr(kit, "cpu_blocks", lambda n: asked.append(n) or blocks)
    yield cpus, asked
    os.sched_setaffinity(0, cpus)


def test_pin_cpus_pins_each_server_and_the_harness_to_its_own_block(
    tmp_path, monkeypatch, capsys, one_cpu_blocks
):
    """--pin-cpus: server i runs on the i-th of kit.cpu_blocks(servers + 1), its whole process
    tree (the fake records its own affinity), e2e.json says where, and the harness takes the
    last block; without it nothing is pinned."""
    cpus, asked = one_cpu_blocks
    assert _main(tmp_path, monkeypatch, "dflash,ddtree16", "--pin-cpus", "--interleave") == 0
    assert os.sched_getaffinity(0) == set(cpus)  # the last block: all of this machine's
    assert asked == [3]
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["cpus"] for c in calls] == [cpus[:1], cpus[-1:]]
    runs = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["cpus"] for r in runs] == [cpus[:1], cpus[-1:]]
    # one-CPU blocks: no core to spare for the scheduler (kit.pin_scheduler moves nothing)
    assert [r["scheduler_pinned"] for r in runs] == [False, False]
    assert f"pinned: dflash: {cpus[0]}; ddtree16: {cpus[-1]}; harness: " in capsys.readouterr().out
    (tmp_path / "plain").mkdir()
    assert _main(tmp_path / "plain", monkeypatch, "dflash") == 0
    call = json.loads((tmp_path / "plain" / "calls.jsonl").read_text())
    assert (
        call["cpus"] == cpus
        and "cpus" not in json.loads((tmp_path / "plain" / "out" / "e2e.json").read_text())[0]
    )


def test_rotate_cpus_moves_every_server_to_the_next_block_before_each_pass(
    tmp_path, monkeypatch, capsys, one_cpu_blocks
):
    """--rotate-cpus: one sweep a pass of --sweep (a pass starts at each level not above the one
    before), and before pass k server i runs, its whole process group, on the servers' block
    (i + k), and the servers' order at each concurrency is rotated by k (--first-server), each
    record naming its place; e2e.json lists each server's blocks by pass. Without --pin-cpus,
    --interleave and --sweep it is refused before anything starts."""
    cpus, _ = one_cpu_blocks
    first, second = cpus[:1], cpus[-1:]
    flushes = tmp_path / "flushes.jsonl"
    sweep = ("--sweep", "1,2,1,2,1", "--sweep-requests", "1", "--sweep-tokens", "4")
    flags = ("--interleave", "--pin-cpus", "--rotate-cpus", *sweep)
    assert _main(tmp_path, monkeypatch, "dflash,ddtree16", *flags, FAKE_FLUSHES=str(flushes)) == 0
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    seen: dict[int, list] = {c["pid"]: [] for c in calls}
    flushed = list(map(json.loads, flushes.read_text().splitlines()))
    for f in flushed:
        seen[f["pid"]].append((f["server"], f["sched"]))
    # the levels' order, server 0 or 1 (after any check's flushes): C = 1, 2 of pass 1 rotated
    # by one per level, pass 2's one more, pass 3's (C = 1) two more
    server = {c["pid"]: i for i, c in enumerate(calls)}
    assert [server[f["pid"]] for f in flushed[-10:]] == [0, 1, 1, 0, 1, 0, 0, 1, 0, 1]
    want = [[first] * 2 + [second] * 2 + [first], [second] * 2 + [first] * 2 + [second]]
    for call, blocks_wanted in zip(calls, want, strict=True):
        levels = seen[call["pid"]][-5:]  # the sweep's five levels, after any check's flushes
        assert [w for w, _ in levels] == blocks_wanted == [s for _, s in levels]
    runs = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["cpus_by_pass"] for r in runs] == [[first, second, first], [second, first, second]]
    out = capsys.readouterr().out
    assert f"pass 2 (C = 1,2) on CPUs dflash: {second[0]}; ddtree16: {first[0]}" in out
    for name, places in (("dflash.jsonl", [0, 1, 1, 0, 0]), ("ddtree16.jsonl", [1, 0, 0, 1, 1])):
        records = [json.loads(ln) for ln in (tmp_path / "out" / "sweeps" / name).open()]
        assert [r["max_concurrency"] for r in records] == [1, 2, 1, 2, 1]
        assert [r["place"] for r in records] == places
    assert tiny_pair.sweep_passes("1,2,4,1,2,4,4,1") == ["1,2,4", "1,2,4", "4", "1"]
    for extra in (sweep, ("--interleave", *sweep), ("--pin-cpus", "--interleave")):
        assert _main(tmp_path / "refused", monkeypatch, "dflash", "--rotate-cpus", *extra) == 2
        assert "valid with --pin-cpus, --interleave and --sweep" in capsys.readouterr().err
    assert not (tmp_path / "refused" / "calls.jsonl").exists()


@pytest.mark.usefixtures("one_cpu_blocks")
def test_a_time_limit_ends_the_sweep_itself_before_it(tmp_path, monkeypatch, capsys):
    """--time-limit T: the interleaved sweep starts no concurrency later than SWEEP_RESERVE_S
    before T (loadtests.sweep --stop-at), and the run ends on its own: every server checked and
    ok. Here T leaves 1 s past the reserve, gone before the sweep begins: no level runs (with
    --rotate-cpus, no pass), and a roomy T runs them all. Refused without --interleave or at
    most the reserve."""
    sweep = ("--interleave", "--sweep", "1,2", "--sweep-requests", "1", "--sweep-tokens", "4")
    tight = str(tiny_pair.SWEEP_RESERVE_S + 1)
    assert _main(tmp_path, monkeypatch, "ar,dflash", *sweep, "--time-limit", tight) == 0
    runs = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert all(r["ok"] for r in runs) and len(runs[1]["greedy"]) == 2
    assert not list((tmp_path / "out" / "sweeps").glob("*.jsonl"))
    rotated = ("--pin-cpus", "--rotate-cpus", "--time-limit", tight)
    assert _main(tmp_path / "rot", monkeypatch, "ar,dflash", *sweep, *rotated) == 0
    assert "--time-limit: passes 1 on not run" in capsys.readouterr().out
    assert _main(tmp_path / "roomy", monkeypatch, "ar,dflash", *sweep, "--time-limit", "600") == 0
    levels = (tmp_path / "roomy" / "out" / "sweeps" / "dflash.jsonl").read_text().splitlines()
    assert [json.loads(ln)["max_concurrency"] for ln in levels] == [1, 2]
    for extra, message in (
        (("--time-limit", "600"), "valid with --interleave"),
        (("--interleave", "--time-limit", "60"), "give more than 60 s"),
    ):
        assert _main(tmp_path / "refused", monkeypatch, "dflash", *extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "refused" / "calls.jsonl").exists()


def test_sync_warnings_are_recorded(tmp_path, monkeypatch):
    """SGLANG_DDTREE_SYNC_CHECK=warn: torch's warning lines from the server log land in e2e.json
    (a passing server's log is deleted)."""
    assert _main(tmp_path, monkeypatch, "ddtree16", SGLANG_DDTREE_SYNC_CHECK="warn") == 0
    run = json.loads((tmp_path / "out" / "e2e.json").read_text())[0]
    assert run["sync_warnings"] == [
        "worker.py:1: UserWarning: called a synchronizing CUDA operation"
    ]
    monkeypatch.delenv("SGLANG_DDTREE_SYNC_CHECK")
    (tmp_path / "off").mkdir()
    assert _main(tmp_path / "off", monkeypatch, "ddtree16") == 0
    run = json.loads((tmp_path / "off" / "out" / "e2e.json").read_text())[0]
    assert run["sync_warnings"] == []


def test_commit_graph_lines_are_recorded(tmp_path, monkeypatch):
    """A step that missed the commit graphs logs one line (plugin.commit_graphs); e2e.json keeps
    such lines apart from the first 20 DDTREE lines (a passing server's log is deleted)."""
    miss = "DDTREE commit: no CUDA graph for CommitShape(width=64) at batch size 33; eagerly."
    assert _main(tmp_path, monkeypatch, "ddtree16", FAKE_START_LINE=miss) == 0
    run = json.loads((tmp_path / "out" / "e2e.json").read_text())[0]
    assert run["log_commit"] == [miss]
    (tmp_path / "off").mkdir()
    monkeypatch.delenv("FAKE_START_LINE")
    assert _main(tmp_path / "off", monkeypatch, "ddtree16") == 0
    assert json.loads((tmp_path / "off" / "out" / "e2e.json").read_text())[0]["log_commit"] == []


def test_nooverlap_server_turns_overlap_scheduling_off(sglang_parse, monkeypatch):
    monkeypatch.chdir(REPO)
    for spec, off in (("ddtree16+graphs+nooverlap", True), ("ddtree16+graphs", False)):
        cfg = tiny_pair.server_config(
            spec, str(PAIR / "hybrid"), str(PAIR / "hybrid-dflash"), block=16, graph_bs=4
        )
        assert sglang_parse(kit.Server(cfg, "/dev/null").cmd[3:]).disable_overlap_schedule is off


@pytest.mark.parametrize("bad", ["eagle", "ddtree", "ddtree0", "ddtree16+fast", "AR", ""])
def test_unknown_server_names_are_refused(bad):
    with pytest.raises(kit.HarnessError, match="valid: ar, nextn, dflash, ddtree<budget>"):
        tiny_pair.parse_server(bad)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main(tmp_path, monkeypatch, servers, *extra, **env):
    for k in KIT:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FAKE_CALLS", str(tmp_path / "calls.jsonl"))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return tiny_pair.main(
        [
            "--out",
            str(tmp_path / "out"),
            "--target",
            str(PAIR / "hybrid"),
            "--drafter",
            str(PAIR / "hybrid-dflash"),
            "--prompts",
            str(PAIR / "heldout_prompts.jsonl"),
            "--servers",
            servers,
            "--num-prompts",
            "2",
            "--samples",
            "2",
            "--max-new-tokens",
            "5",
            "--port",
            str(_free_port()),
            "--launcher",
            f"{{python}} {FAKE}",
            *extra,
        ]
    )


def test_whole_run_against_a_fake_server(tmp_path, monkeypatch, capsys):
    assert _main(tmp_path, monkeypatch, "ar,ddtree16+graphs", "--server-arg", "tp-size=2") == 0
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["label"] for r in results] == ["ar", "ddtree16+graphs"]
    assert all(r["ok"] for r in results)
    dd = results[1]
    assert [g["meta"]["spec_verify_ct"] for g in dd["greedy"]] == [4, 4]
    assert (
        "--speculative-num-draft-tokens 17" in dd["cmd"]
        and "--cuda-graph-max-bs-decode 8" in dd["cmd"]
    )
    assert all("--tp-size 2" in r["cmd"] for r in results)  # --server-arg reaches every server
    out = capsys.readouterr().out
    assert "| ddtree16+graphs | 2/2 | 2/2 | 1.25 |" in out
    assert not list((tmp_path / "out").glob("server_*.log"))  # successful servers drop their log


def test_stages_time_the_speculative_servers_steps_and_print_them_per_batch_size(
    tmp_path, monkeypatch, capsys
):
    """+stages: the server gets SGLANG_DDTREE_STAGE_TIMES at <out>/stages/<server>.jsonl (the fake
    writes one line per decode step and prefill, as the worker does), summarised per batch size
    into <server>.json and e2e.json and printed as host / GPU ms per stage and their sum; a server
    without it gets no file."""
    assert _main(tmp_path, monkeypatch, "dflash,ddtree16+graphs+stages") == 0
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    stage_file = tmp_path / "out" / "stages" / "ddtree16_graphs_stages.jsonl"
    assert [c["env"].get("SGLANG_DDTREE_STAGE_TIMES") for c in calls] == [None, str(stage_file)]
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert "stages" not in results[0]
    # 2 greedy, 2 concurrent and 2 sampled requests of 5 tokens: 4 steps each (tau 1.25)
    assert results[1]["stages"] == {"steps": 24, "extends": 6, "batch_sizes": ["1"]}
    summary = json.loads(stage_file.with_suffix(".json").read_text())
    assert summary["by_bs"]["1"]["host_ms"] == {"draft": 1.5, "verify": 2.0}
    out = capsys.readouterr().out
    assert "stage times, ddtree16+graphs+stages (median ms per decode step, host / GPU):" in out
    assert "| bs | steps | draft | verify | sum of medians | GPU between | GPU period |" in out
    # the fake's gaps between a request's steps: none before the first, then 0.5, 1.0, 0.0 ms
    assert "| 1 | 24 | 1.500 / 0.500 | 2.000 / 10.000 | 3.500 / 10.500 | 0.500 | 11.000 |" in out
    assert "stage times, dflash " not in out


def test_stage_tables_print_how_far_the_period_moved_between_runs(tmp_path, capsys):
    """After a +stages server's table: the spread of its loop period over runs of steps between
    prefills (e2e.scale.run_periods), as min / median / max and max / min; nothing without it."""
    entry = {"steps": 40, "host_ms": {"step": 3.0}, "gpu_ms": {"step": 3.0}, "gpu_between_ms": 1.0}
    runs = {"runs": 7, "min_steps": 30, "min_ms": 4.0, "median_ms": 5.0, "max_ms": 7.2}
    for slug, periods in (("dflash_stages", runs), ("ddtree63_stages", None)):
        summary = {"by_bs": {"1": entry}, "run_periods": periods}
        (tmp_path / f"{slug}.json").write_text(json.dumps(summary))
    results = [
        {"label": label, "stages": {"steps": 40}} for label in ("dflash+stages", "ddtree63+stages")
    ]
    tiny_pair.print_stage_tables(results, tmp_path)
    out = capsys.readouterr().out
    line = (
        "GPU period per run of >= 30 decode steps between prefills (7 runs): "
        "min 4.000 / median 5.000 / max 7.200 ms, max / min 1.80"
    )
    assert out.count("GPU period per run") == 1 and line in out.split("ddtree63")[0]


def test_profile_traces_decode_steps_of_any_server_and_prints_where_the_host_time_goes(
    tmp_path, monkeypatch, capsys
):
    """+profile: after the checks, SGLang's /start_profile (the steps asked for, by stage) around
    greedy requests of --profile-tokens at each --profile-levels concurrency, with the server's
    decode trace starting at the smallest of them (SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS); the
    trace summarised into <out>/profiles/<server>-C<c>.json (the raw trace deleted) and e2e.json,
    and printed with the host time inside run_batch; a server without +profile is not traced."""
    args = ("--profile-steps", "3", "--profile-tokens", "9")
    assert _main(tmp_path, monkeypatch, "dflash,ar+profile", *args) == 0
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["env"].get("SGLANG_PROFILE_BY_STAGE_DECODE_MIN_BS") for c in calls] == [None, "1"]
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert "profiles" not in results[0]
    assert results[1]["profiles"] == [
        {"concurrency": 1, "status": "ok", "run_batch_ms": pytest.approx(0.09)}
    ]
    summary = json.loads((tmp_path / "out" / "profiles" / "ar_profile-C1.json").read_text())
    assert (summary["server"], summary["concurrency"], summary["steps"]) == ("ar+profile", 1, 3)
    assert summary["graph_launches_per_step"] == 1.0
    assert summary["host_time"]["ops"][0]["op"] == "aten::index"
    assert not list((tmp_path / "out" / "profiles" / "ar_profile-C1").iterdir())
    out = capsys.readouterr().out
    assert "ar+profile at C = 1: 7.00 GPU ms per step over 3 steps" in out
    assert "| after the last graph launch |" in out


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--profile-steps", "0"), "give at least 1 step"),
        (("--profile-steps", "20", "--profile-tokens", "20"), "more tokens than steps"),
    ],
)
def test_profile_sizes_are_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys, flags, message
):
    assert _main(tmp_path, monkeypatch, "ar+profile", *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists()


def test_profile_levels_must_be_positive_concurrencies(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit):
        _main(tmp_path, monkeypatch, "ar+profile", "--profile-levels", "1,0")
    assert "argument --profile-levels: '1,0': valid: positive integers" in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["ar+stages", "nextn+graphs+stages"])
def test_stages_are_refused_for_servers_without_speculative_stages(spec):
    with pytest.raises(kit.HarnessError, match=r"\+stages times dflash and ddtree decode steps"):
        tiny_pair.parse_server(spec)


def test_interleave_keeps_every_server_up_and_runs_one_sweep_over_all_of_them(
    tmp_path, monkeypatch
):
    """--interleave: the servers start on ports --port + i with --sleep-on-idle, each launched
    once the one before has logged its memory pools and before that one is ready (their starts
    overlap), each is checked, then one load test interleaves their levels (each server's JSONL
    names the others), then they stop; a server that fails to start is reported and left out of
    the sweep, the others are still measured."""
    sweep = ("--interleave", "--sweep", "1,2", "--sweep-requests", "1", "--sweep-tokens", "4")
    memory = tmp_path / "memory.jsonl"
    servers = "ar,dflash+stages,ddtree16+graphs"
    assert (
        _main(
            tmp_path, monkeypatch, servers, *sweep, FAKE_START_S="3", FAKE_MEMORY_TIMES=str(memory)
        )
        == 0
    )
    calls = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    ports = [int(c["argv"][c["argv"].index("--port") + 1]) for c in calls]
    assert ports == [ports[0], ports[0] + 1, ports[0] + 2]
    sized = {m["pid"]: m["t"] for m in map(json.loads, memory.read_text().splitlines())}
    for before, after in zip(calls, calls[1:]):
        assert sized[before["pid"]] < after["t"] < sized[before["pid"]] + 3  # not ready yet
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert all(r["start_s"] >= 3 for r in results)  # each from its own launch
    assert all("--sleep-on-idle" in c["argv"] for c in calls)
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["label"] for r in results] == ["ar", "dflash+stages", "ddtree16+graphs"]
    assert all(r["ok"] for r in results) and results[1]["stages"]["steps"] > 0
    assert [g["meta"]["spec_verify_ct"] for g in results[2]["greedy"]] == [4, 4]
    sweeps = tmp_path / "out" / "sweeps"
    for name, others in [
        ("ar", ["dflash+stages", "ddtree16+graphs"]),
        ("dflash_stages", ["ar", "ddtree16+graphs"]),
        ("ddtree16_graphs", ["ar", "dflash+stages"]),
    ]:
        levels = [json.loads(ln) for ln in (sweeps / f"{name}.jsonl").read_text().splitlines()]
        assert [lv["max_concurrency"] for lv in levels] == [1, 2], name
        assert all(lv["interleaved_with"] == others for lv in levels), name
        # the counters of each server's own (idle) scheduler, not the harness's or the sweep's
        assert all(lv["host"]["on_cpu_pct"] < 20 for lv in levels), name
    assert len({c["pid"] for c in calls}) == 3

    (tmp_path / "crash").mkdir()
    servers = "ar,dflash,ddtree16+graphs"
    assert _main(tmp_path / "crash", monkeypatch, servers, *sweep, FAKE_CRASH="DFLASH") == 1
    results = json.loads((tmp_path / "crash" / "out" / "e2e.json").read_text())
    assert [r["ok"] for r in results] == [True, False, True]
    assert "exited with code 3" in results[1]["error"]
    done = sorted(p.name for p in (tmp_path / "crash" / "out" / "sweeps").glob("*.jsonl"))
    assert done == ["ar.jsonl", "ddtree16_graphs.jsonl"]


def test_adaptive_servers_get_the_budget_by_batch_size_flags(
    tmp_path, monkeypatch, capsys, sglang_parse
):
    monkeypatch.chdir(REPO)
    config = str(REPO / "e2e" / "adaptive_budgets_tiny.json")
    cfg = tiny_pair.server_config(
        "ddtree63+graphs+adaptive",
        str(PAIR / "hybrid"),
        str(PAIR / "hybrid-dflash"),
        block=16,
        graph_bs=4,
        adaptive_config=config,
    )
    sa = sglang_parse(kit.Server(cfg, "/dev/null").cmd[3:])
    assert sa.speculative_adaptive and sa.speculative_adaptive_config == config
    plain = tiny_pair.server_config(
        "ddtree63+graphs", str(PAIR / "hybrid"), str(PAIR / "hybrid-dflash"), 16, 4
    )
    assert not sglang_parse(kit.Server(plain, "/dev/null").cmd[3:]).speculative_adaptive
    # what --interleave adds to every server is a flag SGLang takes
    idle = kit.with_args(plain, {"sleep-on-idle": True})
    assert sglang_parse(kit.Server(idle, "/dev/null").cmd[3:]).sleep_on_idle
    with pytest.raises(
        kit.HarnessError, match="\\+adaptive \\(budget by batch size\\) is DDTREE's"
    ):
        tiny_pair.parse_server("dflash+adaptive")
    assert _main(tmp_path, monkeypatch, "ar,ddtree63+adaptive") == 2
    assert "server 'ddtree63+adaptive': +adaptive needs --adaptive-config FILE" in (
        capsys.readouterr().err
    )
    missing = str(tmp_path / "none.json")
    assert _main(tmp_path, monkeypatch, "ddtree63+adaptive", "--adaptive-config", missing) == 2
    assert f"--adaptive-config {missing}: no such file" in capsys.readouterr().err
    assert _main(tmp_path, monkeypatch, "ar,ar", "--interleave") == 2
    assert "--interleave needs distinct servers; got ar,ar" in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists()


@pytest.mark.parametrize("interleave", [False, True])
def test_fusednorms_servers_are_checked_for_the_plugins_line(
    tmp_path, monkeypatch, capsys, interleave
):
    """+fusednorms: the kit_norms plugin is installed into the kit's site before any server, the
    server gets SGLANG_SPEC_KIT_NORMS=triton, and one whose log lacks the plugin's line fails;
    other servers run as before. Outside the kit the option is refused before anything starts."""
    from e2e.kit_norms import READY

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(kit, "sglang_site", lambda: site)
    extra = ["--interleave"] if interleave else []
    servers = "ar+fusednorms,dflash"
    assert _main(tmp_path, monkeypatch, servers, *extra, **KIT) == 1
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["ok"] for r in results] == [False, True]
    assert f"fused-norms: no {READY!r} line" in results[0]["error"]
    started = [json.loads(x) for x in (tmp_path / "calls.jsonl").read_text().splitlines()]
    assert [c["env"].get("SGLANG_SPEC_KIT_NORMS") for c in started] == ["triton", None]
    assert (site / "sglang_spec_kit_norms.py").is_file()
    again = tmp_path / "again"
    assert _main(again, monkeypatch, servers, *extra, **KIT, FAKE_START_LINE=READY) == 0
    capsys.readouterr()
    assert _main(tmp_path / "stock", monkeypatch, servers, *extra) == 2  # not in the kit
    assert "a stock SGLang install runs sgl-kernel's fused norms" in capsys.readouterr().err


def test_a_failed_server_is_reported_and_keeps_its_log(tmp_path, monkeypatch, capsys):
    assert _main(tmp_path, monkeypatch, "ar,dflash", FAKE_CRASH="DFLASH") == 1
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["ok"] for r in results] == [True, False]
    assert "exited with code 3" in results[1]["error"]
    out = capsys.readouterr().out
    assert "| dflash | FAILED |" in out and "CUDA out of memory" in out
    assert (tmp_path / "out" / "server_dflash.log").exists()


@pytest.mark.parametrize("interleave", [False, True])
def test_a_time_limit_while_a_server_stops_keeps_its_record(tmp_path, monkeypatch, interleave):
    """A call's time limit (SIGTERM, raised as KeyboardInterrupt) that strikes while the last
    server stops still leaves that server's checks in e2e.json, marked interrupted, with the
    servers one after another and interleaved."""
    stop = kit.Server.stop

    def stop_then_interrupt(self):
        stop(self)
        if "DFLASH" in " ".join(self.cmd):
            raise KeyboardInterrupt("signal 15")

    monkeypatch.setattr(kit.Server, "stop", stop_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        _main(tmp_path, monkeypatch, "ar,dflash", *(["--interleave"] if interleave else []))
    results = json.loads((tmp_path / "out" / "e2e.json").read_text())
    assert [r["label"] for r in results] == ["ar", "dflash"]
    assert not results[1]["ok"] and results[0]["ok"] is not interleave  # interleaved: all stop last
    assert results[0].get("error") == ("interrupted (signal 15)" if interleave else None)
    assert results[1]["error"] == "interrupted (signal 15)"
    assert len(results[1]["greedy"]) == 2 == len(results[1]["greedy_concurrent"])


def test_cli_refuses_bad_input_before_anything_runs(tmp_path, monkeypatch, capsys):
    assert _main(tmp_path, monkeypatch, "ar,ddtree16+fast") == 2
    assert "unknown server 'ddtree16+fast'" in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists() and not (tmp_path / "out").exists()


def test_sweep_levels_take_the_requests_per_concurrency_given(tmp_path, monkeypatch):
    """--sweep-requests R reaches the load test as R requests per concurrency unit, at least 2R
    per level; the default stays 4 (8)."""
    calls = []
    monkeypatch.setattr(tiny_pair.subprocess, "run", lambda cmd, **_: calls.append(cmd))
    argv = ("--sweep", "1,2", "--sweep-requests", "12", "--sweep-tokens", "512")
    assert _main(tmp_path, monkeypatch, "ar", *argv) == 0
    assert _main(tmp_path, monkeypatch, "ar", "--sweep", "1") == 0
    sweeps = [c for c in calls if "loadtests.sweep" in c]
    assert len(sweeps) == 2 and len(calls) == 4  # each run: its sweep, then the report

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1]

    started = [json.loads(ln) for ln in (tmp_path / "calls.jsonl").read_text().splitlines()]
    # each level records its server's decode loop (loadtests.host_counters): the fake's scheduler
    assert [flag(c, "--watch-pid") for c in sweeps] == [str(r["scheduler_pid"]) for r in started]
    assert all("--cpu-probe" in c for c in sweeps)  # and the host's CPU (loadtests.cpu_probe)
    assert [flag(c, "--requests-per-concurrency") for c in sweeps] == ["12", "4"]
    assert [flag(c, "--min-requests") for c in sweeps] == ["24", "8"]
    assert [flag(c, "--max-new-tokens") for c in sweeps] == ["512", "128"]
    assert flag(sweeps[0], "--concurrency") == "1,2"


@pytest.mark.parametrize(
    ("option", "bad"),
    [("--sweep-requests", "0"), ("--sweep-requests", "-3"), ("--sweep-tokens", "0")],
)
def test_sweep_sizes_below_one_are_refused_before_anything_runs(
    tmp_path, monkeypatch, capsys, option, bad
):
    assert _main(tmp_path, monkeypatch, "ar", "--sweep", "1", option, bad) == 2
    assert f"{option} {bad}: give at least 1" in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists() and not (tmp_path / "out").exists()


def test_agreement_counts_prompt_by_prompt_against_a_longer_baseline():
    """A run of 4 prompts judged against a baseline of 6 (an earlier call's AR server) compares the 4
    it has; session 3's first check printed "NO" for identical outputs because whole lists were
    compared."""
    from e2e.tiny_pair import agreement

    ref = [{"text": t} for t in "abcdef"]
    assert agreement([{"text": t} for t in "abcd"], ref) == "4/4"
    assert agreement([{"text": t} for t in "abXd"], ref) == "3/4"
    assert agreement([{"text": t} for t in "ab"], ref[:1]) == "1/2 (1 without a reference)"
    assert agreement([{"text": "a"}], None) == "-"


SLOTS = ("ddtree16", "--abort-check", "8", "--abort-tokens", "16")
# 10 ms a step: 160 ms a stream, so an abort sent after the 2nd chunk lands mid-stream even on a
# loaded CI core (at the fake's default 2 ms, a parallel test run let one finish first).
SLOW = {"FAKE_STEP_MS": "10"}


def test_no_slots_lost_passes_when_the_pools_come_back(tmp_path, monkeypatch, capsys, sglang_parse):
    """8 streams, 2 aborted mid-stream (one closed, one by /abort_request): the finished ones move
    their slots to the radix cache (evictable), the aborted ones free theirs, so free = available +
    evictable is back to its value before."""
    assert _main(tmp_path, monkeypatch, *SLOTS, **SLOW) == 0
    res = json.loads((tmp_path / "out" / "slots_ddtree16.json").read_text())
    assert res["ok"] and res["problems"] == []
    assert res["aborted"] == {"close": 1, "abort_request": 1}
    by_way = {o["abort"]: o for o in res["streams"]}
    assert by_way["abort_request"]["finish_reason"] == "abort"
    assert by_way["close"]["completion_tokens"] == 2
    assert sum(o["completion_tokens"] == 16 for o in res["streams"]) == 6
    b, a = res["before"], res["after"]
    for pool in ("kv", "mamba"):
        assert a[pool]["free"] == b[pool]["free"] and a[pool]["used"] == 0
    assert a["mamba"]["evictable"] - b["mamba"]["evictable"] == 6  # only the finished ones
    assert a["kv"]["available"] < b["kv"]["available"]
    run = json.loads((tmp_path / "out" / "e2e.json").read_text())[0]
    assert run["slots"]["ok"] and sglang_parse(run["cmd"].split()[2:]).enable_metrics
    out = capsys.readouterr().out
    assert "| mamba | " in out and "**PASS**" in out
    assert not list((tmp_path / "out").glob("server_*.log"))


def test_no_slots_lost_looks_only_at_the_log_of_the_load(tmp_path, monkeypatch):
    """A traceback logged at start-up (SGLang's post-warm-up /freeze_gc on the kit) is not the
    load's: the check passes; one logged during the load fails it (the parametrized test below)."""
    assert _main(tmp_path, monkeypatch, *SLOTS, FAKE_START_TRACEBACK="1", **SLOW) == 0
    res = json.loads((tmp_path / "out" / "slots_ddtree16.json").read_text())
    assert res["ok"] and res["log_errors"] == 0


def test_no_slots_lost_aborts_only_the_aborted_streams_of_many(tmp_path, monkeypatch):
    """48 streams: SGLang's /abort_request aborts by rid PREFIX, so ids like slots-4 / slots-41
    would abort streams the check did not mean to (session 5 on the H200); fixed-width ids do not."""
    many = ("ddtree16", "--abort-check", "48", "--abort-tokens", "64")
    assert _main(tmp_path, monkeypatch, *many, FAKE_STEP_MS="10") == 0
    res = json.loads((tmp_path / "out" / "slots_ddtree16.json").read_text())
    assert res["ok"], res["problems"]
    assert res["aborted"] == {"close": 6, "abort_request": 6}
    assert sum(o["completion_tokens"] == 64 for o in res["streams"]) == 36
    assert slots.rid(4, 48) == "slots-04" and slots.rid(41, 48) == "slots-41"
    assert slots.rid(7, 8) == "slots-7" and slots.rid(100, 101) == "slots-100"


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"FAKE_LEAK": "kv"}, "kv pool: "),
        ({"FAKE_LEAK": "mamba"}, "mamba pool: "),
        ({"FAKE_ABORT_TRACEBACK": "1"}, "log: Traceback (most recent call last)"),
    ],
)
def test_no_slots_lost_fails_on_a_leaked_slot_or_a_traceback(
    tmp_path, monkeypatch, capsys, env, problem
):
    monkeypatch.setattr("e2e.slots.SETTLE_S", 1.0)  # the fake's gauges are never stale
    assert _main(tmp_path, monkeypatch, *SLOTS, **env, **SLOW) == 1
    res = json.loads((tmp_path / "out" / "slots_ddtree16.json").read_text())
    assert not res["ok"]
    assert [p for p in res["problems"] if p.startswith(problem)] == res["problems"]
    assert "**FAIL**" in capsys.readouterr().out
    assert (tmp_path / "out" / "server_ddtree16.log").exists()  # kept for the diagnosis


def test_no_slots_lost_needs_the_metrics_gauges(tmp_path, monkeypatch, capsys):
    assert _main(tmp_path, monkeypatch, *SLOTS, "--server-arg", "enable-metrics=", **SLOW) == 1
    run = json.loads((tmp_path / "out" / "e2e.json").read_text())[0]
    assert "start the server with --enable-metrics" in run["error"]
    assert "| ddtree16 | FAILED |" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--abort-check", "3"), "--abort-check 3: give 0 (off) or at least 4 streams"),
        (("--abort-check", "-1"), "--abort-check -1: give 0 (off) or at least 4 streams"),
        (("--abort-check", "8", "--abort-tokens", "2"), "--abort-tokens 2: give more than 2"),
    ],
)
def test_abort_check_refuses_bad_input(tmp_path, monkeypatch, capsys, flags, message):
    assert _main(tmp_path, monkeypatch, "ddtree16", *flags) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "calls.jsonl").exists()


def test_a_runs_records_load_plain_or_xz_compressed(tmp_path):
    """tiny_pair.load_runs (compare_reference's, sampling_check's and --baseline's reader) takes
    an e2e.json or its .xz, the form the repository keeps results in; load_baseline finds the AR
    server in either, and a broken file is one harness error naming it."""
    import lzma

    runs = [{"label": "dflash+graphs", "ok": True}, {"label": "ar+graphs", "ok": True, "x": 1}]
    plain, packed = tmp_path / "e2e.json", tmp_path / "e2e.json.xz"
    plain.write_text(json.dumps(runs))
    packed.write_bytes(lzma.compress(plain.read_bytes()))
    assert tiny_pair.load_runs(str(plain)) == tiny_pair.load_runs(str(packed)) == runs
    assert tiny_pair.load_baseline(str(packed))["x"] == 1
    kept = Path(__file__).resolve().parents[1] / "benchmarks/results/e2e_h200/hybrid_eager.json.xz"
    assert any(r["label"].startswith("ar") for r in tiny_pair.load_runs(str(kept)))
    (tmp_path / "bad.json.xz").write_bytes(b"not xz")
    with pytest.raises(kit.HarnessError, match="--baseline .*bad.json.xz"):
        tiny_pair.load_baseline(str(tmp_path / "bad.json.xz"))


def test_every_budget_switch_is_recorded_past_the_first_ddtree_lines(tmp_path, monkeypatch):
    """e2e.json keeps the first 20 DDTREE lines; an adaptive server's budget switches come later
    (session 40's records ended with its greedy checks' switches, none of the sweep's), so they are
    kept apart: their count and the last 200 lines. The fake server logs one switch for each batch
    size it first sees."""
    config = str(REPO / "e2e" / "adaptive_budgets_tiny.json")
    start = "\n".join(f"[fake] DDTREE start-up line {i}" for i in range(25))
    assert (
        _main(
            tmp_path,
            monkeypatch,
            "ddtree63+adaptive",
            "--adaptive-config",
            config,
            FAKE_START_LINE=start,
        )
        == 0
    )
    run = json.loads((tmp_path / "out" / "e2e.json").read_text())[0]
    assert not any("runs budget" in ln for ln in run["log_ddtree"])  # cut at 20 start-up lines
    # each request reaches the fake one prompt at a time: one switch, bucket 1
    assert run["budget_switches"] == 1
    assert run["log_budget"] == [
        "[fake] DDTREE budget by batch size: bucket 1 runs budget 63 (was None); tau per budget "
        "{63: 1.0}."
    ]
